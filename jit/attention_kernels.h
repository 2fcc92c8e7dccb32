// The attention engine's JIT-emitted glue (the online-softmax step, the
// block finish, the Qᵀ pack and the V transpose of codegen/llvm/llvm_softmax.h) through the
// process-wide compile-once cache, keyed on the descriptor and the LLVM target.
#pragma once

#include "codegen/llvm/llvm_softmax.h"
#include "jit/kernel.h"

namespace tilejit::jit {

// True when this tilejit was built with LLVM, so softmax_step_kernel can work.
bool have_softmax_step_kernel();

// Both throw tilejit::Error when built without LLVM or when LLVM cannot target the host.
const Kernel& softmax_step_kernel(const codegen::llvm_backend::SoftmaxStepDesc& d);
const Kernel& softmax_finish_kernel();
const Kernel& softmax_pack_q_kernel();
const Kernel& softmax_transpose_v_kernel();

}  // namespace tilejit::jit
