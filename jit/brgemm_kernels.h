// Compiled batch-reduce GEMM micro-kernels, by descriptor (through the cache).
#pragma once

#include "codegen/brgemm_desc.h"
#include "jit/kernel.h"

namespace tilejit::jit {

// Emits with the Xbyak emitter of desc.isa (AMX or AVX-512); Error for scalar.
const Kernel& brgemm_kernel(const codegen::BrgemmDesc& desc);

}  // namespace tilejit::jit
