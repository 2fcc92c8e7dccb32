#include "jit/llvm_kernels.h"

#include <cstdio>

#include "jit/kernel_cache.h"

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

const Kernel& llvm_kernel(const std::string& key, const std::string& name,
                          const std::function<lb::LlvmKernel()>& compile) {
  KernelRecipe r;
  r.compile = [&] {
    lb::LlvmKernel lk = compile();
    BuiltKernel b;
    b.payload = lk.object_file;
    b.kernel = adopt(std::move(lk));
    return b;
  };
  r.load = [&name](std::vector<uint8_t> object) {
    return adopt(lb::load_object_file(name, std::move(object)));
  };
  return KernelCache::global().get(llvm_host_key(key), name, r);
}

}  // namespace tilejit::jit
