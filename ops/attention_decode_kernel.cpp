#include "ops/attention_decode_kernel.h"

#include "jit/llvm_kernels.h"

namespace tilejit::ops {

#ifdef TILEJIT_HAVE_LLVM
namespace lb = codegen::llvm_backend;

bool have_decode_attention_kernel() {
  return true;
}

const jit::Kernel& decode_attention_kernel(const lb::DecodeAttentionDesc& d) {
  const std::string name = d.name();
  return jit::llvm_kernel(name, name, [&] { return lb::compile_llvm_decode_attention(d); });
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
