#include "jit/attention_kernels.h"

#include "tilejit/error.h"

#ifdef TILEJIT_HAVE_LLVM
#include "jit/llvm_kernels.h"
#endif

namespace tilejit::jit {

#ifdef TILEJIT_HAVE_LLVM
namespace lb = codegen::llvm_backend;

bool have_softmax_step_kernel() {
  return true;
}

const Kernel& softmax_step_kernel(const lb::SoftmaxStepDesc& d) {
  const std::string name = d.name();
  return llvm_kernel(name, name, [&] { return lb::compile_llvm_softmax_step(d); });
}

const Kernel& softmax_finish_kernel() {
  return llvm_kernel(lb::kSoftmaxFinishName, lb::kSoftmaxFinishName,
                     [] { return lb::compile_llvm_softmax_finish(); });
}

const Kernel& softmax_pack_q_kernel() {
  return llvm_kernel(lb::kSoftmaxPackQName, lb::kSoftmaxPackQName,
                     [] { return lb::compile_llvm_softmax_pack_q(); });
}

const Kernel& softmax_transpose_v_kernel() {
  return llvm_kernel(lb::kSoftmaxTransposeVName, lb::kSoftmaxTransposeVName,
                     [] { return lb::compile_llvm_softmax_transpose_v(); });
}
#else
bool have_softmax_step_kernel() {
  return false;
}

const Kernel& softmax_step_kernel(const codegen::llvm_backend::SoftmaxStepDesc&) {
  throw Error("attention: the JIT softmax step needs a tilejit built with LLVM");
}

const Kernel& softmax_finish_kernel() {
  throw Error("attention: the JIT block finish needs a tilejit built with LLVM");
}

const Kernel& softmax_pack_q_kernel() {
  throw Error("attention: the JIT Qᵀ pack needs a tilejit built with LLVM");
}

const Kernel& softmax_transpose_v_kernel() {
  throw Error("attention: the JIT V transpose needs a tilejit built with LLVM");
}
#endif

}  // namespace tilejit::jit
