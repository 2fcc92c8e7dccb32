// The LLVM decode-attention kernel of a descriptor through the process-wide
// compile-once cache (jit/kernel_cache.h), keyed on the descriptor and the
// LLVM target.
#pragma once

#include "codegen/llvm/llvm_decode_attention.h"
#include "jit/kernel.h"

namespace tilejit::ops {

// True when this tilejit was built with LLVM (else decode_attention_kernel throws).
bool have_decode_attention_kernel();

// Throws tilejit::Error when this tilejit was built without LLVM.
const jit::Kernel& decode_attention_kernel(const codegen::llvm_backend::DecodeAttentionDesc& d);

}  // namespace tilejit::ops
