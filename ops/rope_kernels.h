// The RoPE kernel of a descriptor through the process-wide compile-once cache
// (jit/kernel_cache.h), keyed on the descriptor and the LLVM target.
#pragma once

#include "codegen/llvm/llvm_rope.h"
#include "jit/kernel.h"

namespace tilejit::ops {

// Throws tilejit::Error when this tilejit was built without LLVM.
const jit::Kernel& rope_kernel(const codegen::llvm_backend::RopeDesc& d);

}  // namespace tilejit::ops
