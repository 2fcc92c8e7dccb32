#include "ops/attention_decode_kernel.h"

#include <array>
#include <atomic>

#include "jit/llvm_kernels.h"

namespace tilejit::ops {

#ifdef TILEJIT_HAVE_LLVM
namespace lb = codegen::llvm_backend;

bool have_decode_attention_kernel() {
  return true;
}

const jit::Kernel& decode_attention_kernel(const lb::DecodeAttentionDesc& d) {
  // A few descriptors serve a whole model: they are found again in a small
  // lock-free table, without building the name and hashing the host key
  // (~1 µs, a tenth of a short decode call). Kernels are never evicted from
  // the cache, so the pointers stay valid; entries are never freed.
  struct Entry {
    lb::DecodeAttentionDesc desc;
    const jit::Kernel* kernel;
  };
  static std::array<std::atomic<const Entry*>, 32> table{};
  for (auto& slot : table) {
    const Entry* e = slot.load(std::memory_order_acquire);
    if (e == nullptr) break;
    if (e->desc == d) return *e->kernel;
  }
  const std::string name = d.name();
  const jit::Kernel& k =
      jit::llvm_kernel(name, name, [&] { return lb::compile_llvm_decode_attention(d); });
  auto* fresh = new Entry{d, &k};
  for (auto& slot : table) {
    const Entry* expected = nullptr;
    if (slot.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return k;
    if (expected->desc == d) break;  // another thread published it first
  }
  delete fresh;  // table full or already there: the cache lookup stays the path
  return k;
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
