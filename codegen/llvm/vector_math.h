// Vector arithmetic in LLVM IR shared by the LLVM kernels: the activations
// (formulas and constants of the Xbyak epilogue, codegen/xbyak/avx512_epilogue.cpp,
// so both paths round alike), exp, and the bf16 / f16 / fp8 conversions.
//
// Everything is plain IR on <L x float> / <L x iN> values (llvm.fma,
// llvm.minnum/maxnum, llvm.rint, integer bit operations): no target
// intrinsics and no calls, so it lowers on any x86-64 (and AVX-512 where the
// function allows it), and never needs libm at link time.
// Includes LLVM headers: for .cpp files of codegen/llvm/ only.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include "tilejit/tilejit.h"

namespace tilejit::codegen::llvm_backend {

class VectorMath {
 public:
  VectorMath(llvm::IRBuilder<>& b, unsigned lanes) : b_(b), lanes_(lanes) {}

  unsigned lanes() const { return lanes_; }
  llvm::Type* f32v() const;
  llvm::Type* i32v() const;
  llvm::Type* i16v() const;
  llvm::Value* f32(float v) const;     // splat constant
  llvm::Value* i32(uint32_t v) const;  // splat constant
  llvm::Value* splat(llvm::Value* scalar) const;
  // <L x i1>: lanes l with l < n (n an i64, any value: <= 0 none, >= L all),
  // the mask of a row's tail chunk for masked loads and stores.
  llvm::Value* lane_mask(llvm::Value* n) const;
  llvm::Value* fma(llvm::Value* a, llvm::Value* b, llvm::Value* c) const;  // a·b + c, one rounding

  // exp(x), x clamped to [-87.34, 88.38]: Cody–Waite reduction, degree-6
  // polynomial, scaling by 2^n through the exponent bits in two exact steps
  // (n can be 128, which one step cannot encode). Max rel. error ~2e-7.
  // exp(NaN) is NaN.
  llvm::Value* exp(llvm::Value* x) const;
  // relu, silu = x/(1+e^-x), gelu_tanh = x/(1+e^{-2u}), gelu_erf by
  // Abramowitz–Stegun 7.1.26, relu2 = relu(x)·relu(x); none returns x.
  llvm::Value* activation(Activation act, llvm::Value* x) const;
  // The gated functions of a GLU (the MoE gate/up epilogue, act_and_mul):
  // act(g)·u, or GPT-OSS's clamped SwiGLU g' = min(g, limit), u' = clamp(u,
  // ±limit), g'·σ(alpha·g')·(u' + 1). The clamps are compare + select with the
  // value as the fall-through, so a NaN gate or up stays NaN (minnum / maxnum
  // would return the limit).
  llvm::Value* act_mul(Activation act, llvm::Value* g, llvm::Value* u) const;
  llvm::Value* clamped_swiglu(llvm::Value* g, llvm::Value* u, float alpha, float limit) const;

  // <L x i1>: the lanes of v (<L x float>, L = 16) holding an f32 subnormal,
  // by vfpclassps (an AVX-512 host only): the vcvtne*2bf16 instructions read
  // those as zero, so a kernel that rounds with them takes f32_to_bf16 for a
  // vector with one, and every host rounds alike.
  llvm::Value* subnormal_lanes(llvm::Value* v) const;
  // bf16 bits (<L x i16>) -> f32, exact.
  llvm::Value* bf16_to_f32(llvm::Value* bits) const;
  // f32 -> bf16 bits, round to nearest even; NaN stays a quiet NaN.
  llvm::Value* f32_to_bf16(llvm::Value* x) const;
  // f16 bits -> f32, exact (subnormals, inf, NaN included).
  llvm::Value* f16_to_f32(llvm::Value* bits) const;
  // f32 -> f16 bits, round to nearest even, overflow to inf, NaN quiet.
  llvm::Value* f32_to_f16(llvm::Value* x) const;
  // fp8 e4m3 (OCP "FN": no inf, S.1111.111 is NaN) bits (<L x i8>) -> f32, exact.
  llvm::Value* f8e4m3_to_f32(llvm::Value* bits) const;
  // MXFP4 e8m0 exponents (<L x i8>, 0..254) -> the f32 scales 2^(e − 127):
  // e << 23, and 2^-127 (the subnormal 0x00400000) for e = 0.
  llvm::Value* e8m0_to_f32(llvm::Value* bits) const;

 private:
  llvm::Value* as_f32(llvm::Value* v) const;
  llvm::Value* as_i32(llvm::Value* v) const;

  llvm::IRBuilder<>& b_;
  unsigned lanes_;
};

}  // namespace tilejit::codegen::llvm_backend
