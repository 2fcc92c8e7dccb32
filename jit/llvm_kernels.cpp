#include "jit/llvm_kernels.h"

#include <algorithm>
#include <cstdio>

#include "tilejit/error.h"

namespace tilejit::jit {
namespace {

namespace lb = codegen::llvm_backend;

std::unique_ptr<Kernel> adopt(lb::LlvmKernel&& lk) {
  auto k = std::make_unique<Kernel>();
  k->backend = "llvm";
  k->entry_ptr = lk.entry;
  // The function's own bytes: the perf map must not claim the code placed after it.
  k->size = lk.code_size;
  k->keepalive = std::move(lk.keepalive);
  return k;
}

}  // namespace

std::string llvm_host_key(const std::string& key) {
  const lb::HostTarget& h = lb::host_target();
  uint64_t hash = 1469598103934665603ull;  // FNV-1a of the feature string
  for (char c : h.features) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return key + ";llvm_cpu=" + h.cpu + ";llvm_features=" + hex;
}

KernelRecipe llvm_kernel_recipe(std::string symbol, std::function<lb::LlvmKernel()> compile) {
  KernelRecipe r;
  const bool named = !symbol.empty();
  r.compile = [named, compile = std::move(compile)] {
    lb::LlvmKernel lk = compile();
    BuiltKernel b;
    if (!named) {
      b.payload.assign(lk.name.begin(), lk.name.end());
      b.payload.push_back('\n');
    }
    b.payload.insert(b.payload.end(), lk.object_file.begin(), lk.object_file.end());
    b.kernel = adopt(std::move(lk));
    return b;
  };
  r.load = [symbol = std::move(symbol)](std::vector<uint8_t> payload) {
    if (!symbol.empty()) return adopt(lb::load_object_file(symbol, std::move(payload)));
    const auto nl = std::find(payload.begin(), payload.end(), uint8_t{'\n'});
    if (nl == payload.end()) throw Error("llvm kernel payload without its symbol name");
    const std::string name(payload.begin(), nl);
    return adopt(lb::load_object_file(name, std::vector<uint8_t>(nl + 1, payload.end())));
  };
  return r;
}

}  // namespace tilejit::jit
