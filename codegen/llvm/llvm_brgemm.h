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
//  - best:   dpbf16 where the host has it, else fma (int8: vpdpbusd, else imul).
// The int8 (u8 × i8 → i32) kernel's, exact either way:
//  - vpdpbusd: llvm.x86.avx512.vpdpbusd.512 per k-quad, or the .256 form
//            twice on a host with AVX-VNNI only; needs one of the two.
//  - imul:   the bytes widened (u8 zero-, i8 sign-extended to i32) and
//            multiplied and added in i32. Runs on any AVX2 host.
enum class BrgemmDot { best, fma, dpbf16, vpdpbusd, imul };

struct LlvmBrgemmOptions {
  BrgemmDot dot = BrgemmDot::best;
  OptLevel opt = OptLevel::kernel;
};

// d.name() with the ISA part spelled "llvm" (d.isa itself is ignored), e.g.
// "brgemm_llvm_bf16_f32acc_m7n64k4096_biasf32_silu_bf16out".
std::string llvm_brgemm_name(const BrgemmDesc& d);

// Compiles the micro-kernel for `d` on the host; entry is a BrgemmFn. Takes
// bf16 × bf16 → f32 and u8 × i8 → i32 (W8A8: B in the Int8Layout, kb a
// multiple of 4, row-major A of lda bytes; out i32 stores the raw sums, f32 /
// bf16 apply BrgemmArgs' scaled epilogue, with a GLU too). Throws tilejit::Error
// for a descriptor out of the contract (mr outside [1, 32], nr outside
// [1, 64], kb < 0, other dtypes, b_row_bytes too small for nr or not a multiple of 4,
// out neither f32 nor bf16 (nor i32 for int8, which then allows no bias,
// activation or GLU)), for a dot product of the other dtype or for one the
// host lacks (dpbf16 without AVX512-BF16, vpdpbusd without VNNI).
LlvmKernel compile_llvm_brgemm(const BrgemmDesc& d, const LlvmBrgemmOptions& options = {});

}  // namespace tilejit::codegen::llvm_backend
