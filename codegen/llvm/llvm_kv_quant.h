// The kv_quant kernel compiled by LLVM (KvQuantArgs' contract,
// codegen/kv_quant_desc.h): store_kv's bf16 -> e4m3 cache rows, for the llvm
// path (AVX-512 or AVX2 hosts).
// LLVM-free: the rest of the project includes this header.
#pragma once

#include "codegen/kv_quant_desc.h"
#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

// `void f(const KvQuantArgs*)`, named desc.name() (isa should be llvm).
LlvmKernel compile_llvm_kv_quant(const codegen::KvQuantDesc& d, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
