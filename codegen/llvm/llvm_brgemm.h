// The batch-reduce GEMM micro-kernel (codegen/brgemm_desc.h) compiled by LLVM:
// the same `void f(const BrgemmArgs*)` ABI and semantics as the Xbyak AVX-512
// kernel, portable to any x86-64 with AVX2 + FMA (AVX-512 used where present).
// LLVM-free: the rest of the project includes this header.
#pragma once

#include <string>

#include "codegen/brgemm_desc.h"
#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

// How the bf16 dot products are computed.
//  - fma:    bf16 pairs widened to f32 (zero-extend + shift), two llvm.fma on
//            <16 x float> per k-pair. Runs on any AVX2 + FMA host.
//  - dpbf16: llvm.x86.avx512bf16.dpbf16ps.512, one per k-pair (2x the FLOPs
//            per instruction); only on hosts with AVX512-BF16.
//  - best:   dpbf16 where the host has it, else fma.
enum class BrgemmDot { best, fma, dpbf16 };

struct LlvmBrgemmOptions {
  BrgemmDot dot = BrgemmDot::best;
  OptLevel opt = OptLevel::kernel;
};

// d.name() with the ISA part spelled "llvm" (d.isa itself is ignored), e.g.
// "brgemm_llvm_bf16_f32acc_m7n64k4096_biasf32_silu_bf16out".
std::string llvm_brgemm_name(const BrgemmDesc& d);

// Compiles the micro-kernel for `d` on the host; entry is a BrgemmFn. Throws
// tilejit::Error for a descriptor out of the contract (mr outside [1, 32], nr
// outside [1, 64], kb < 0, b_row_bytes too small for nr or not a multiple of
// 4, out neither f32 nor bf16) or for dpbf16 on a host without AVX512-BF16.
LlvmKernel compile_llvm_brgemm(const BrgemmDesc& d, const LlvmBrgemmOptions& options = {});

}  // namespace tilejit::codegen::llvm_backend
