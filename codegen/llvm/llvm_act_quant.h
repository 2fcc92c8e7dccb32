// The act_quant kernel compiled by LLVM (ActQuantArgs' contract,
// codegen/quant_desc.h): bf16 activation rows -> u8 codes with a per-row
// scale and zero point, for the llvm path (AVX-512 or AVX2 hosts).
// LLVM-free: the rest of the project includes this header.
#pragma once

#include "codegen/llvm/llvm_jit.h"
#include "codegen/quant_desc.h"

namespace tilejit::codegen::llvm_backend {

// `void f(const ActQuantArgs*)`, named desc.name() (isa should be llvm).
LlvmKernel compile_llvm_act_quant(const codegen::ActQuantDesc& d, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
