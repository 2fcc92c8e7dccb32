#include "ops/attention_decode_kernel.h"

#include <cstdio>

#include "jit/kernel_cache.h"

namespace tilejit::ops {

#ifdef TILEJIT_HAVE_LLVM
namespace {
namespace lb = codegen::llvm_backend;

std::unique_ptr<jit::Kernel> adopt(lb::LlvmKernel&& lk) {
  auto k = std::make_unique<jit::Kernel>();
  k->backend = "llvm";
  k->entry_ptr = lk.entry;
  k->size = lk.object_file.size();
  k->keepalive = std::move(lk.keepalive);
  return k;
}

// The name spells the whole descriptor; the code is compiled for exactly this
// host's CPU and features, so they join the key (as for RoPE and brgemm).
std::string key_of(const std::string& name) {
  const lb::HostTarget& h = lb::host_target();
  uint64_t hash = 1469598103934665603ull;  // FNV-1a of the feature string
  for (char c : h.features) hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211ull;
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return name + ";llvm_cpu=" + h.cpu + ";llvm_features=" + hex;
}

}  // namespace

bool have_decode_attention_kernel() {
  return true;
}

const jit::Kernel& decode_attention_kernel(const lb::DecodeAttentionDesc& d) {
  const std::string name = d.name();
  jit::KernelRecipe r;
  r.compile = [&] {
    lb::LlvmKernel lk = lb::compile_llvm_decode_attention(d);
    jit::BuiltKernel b;
    b.payload = lk.object_file;
    b.kernel = adopt(std::move(lk));
    return b;
  };
  r.load = [name](std::vector<uint8_t> object) {
    return adopt(lb::load_object_file(name, std::move(object)));
  };
  return jit::KernelCache::global().get(key_of(name), name, r);
}
#else
bool have_decode_attention_kernel() {
  return false;
}

const jit::Kernel& decode_attention_kernel(const codegen::llvm_backend::DecodeAttentionDesc&) {
  throw Error("decode_attention: the JIT kernel needs a tilejit built with LLVM");
}
#endif

}  // namespace tilejit::ops
