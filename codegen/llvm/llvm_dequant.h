// The dequantization kernel of the weight-quantized GEMMs (codegen/quant_desc.h:
// DequantDesc, DequantArgs) compiled by LLVM: fp8 e4m3 or int4 codes of
// packed k-pair rows -> the bf16 packed rows the bf16 brgemm kernels read,
// bit-identical to runtime::reference_dequant_row (runtime/reference_quant.h).
// Portable to any x86-64 with AVX2 (16 columns a vector with AVX-512, 8
// without). LLVM-free: the rest of the project includes this header.
#pragma once

#include <string>

#include "codegen/llvm/llvm_jit.h"
#include "codegen/quant_desc.h"

namespace tilejit::codegen::llvm_backend {

// d.name() with the ISA part spelled "llvm" (d.isa itself is ignored), e.g.
// "dequant_llvm_u4_zp".
std::string llvm_dequant_name(const DequantDesc& d);

// Compiles the kernel for `d` on the host; entry is a DequantFn. Throws
// tilejit::Error for a descriptor out of the contract (code neither f8e4m3
// nor u4, zeros with fp8 codes) or a host without AVX2 + FMA.
LlvmKernel compile_llvm_dequant(const DequantDesc& d, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
