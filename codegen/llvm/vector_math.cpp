#include "codegen/llvm/vector_math.h"

#include <llvm/IR/IntrinsicsX86.h>

#include <llvm/IR/Intrinsics.h>

#include <vector>

namespace tilejit::codegen::llvm_backend {
namespace {
constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kAbsMask = 0x7fffffffu;
}  // namespace

llvm::Type* VectorMath::f32v() const {
  return llvm::FixedVectorType::get(b_.getFloatTy(), lanes_);
}
llvm::Type* VectorMath::i32v() const {
  return llvm::FixedVectorType::get(b_.getInt32Ty(), lanes_);
}
llvm::Type* VectorMath::i16v() const {
  return llvm::FixedVectorType::get(b_.getInt16Ty(), lanes_);
}
llvm::Value* VectorMath::f32(float v) const {
  return llvm::ConstantFP::get(f32v(), static_cast<double>(v));
}
llvm::Value* VectorMath::i32(uint32_t v) const {
  return llvm::ConstantInt::get(i32v(), v);
}
llvm::Value* VectorMath::splat(llvm::Value* scalar) const {
  return b_.CreateVectorSplat(lanes_, scalar);
}
llvm::Value* VectorMath::lane_mask(llvm::Value* n) const {
  std::vector<llvm::Constant*> iota;
  for (unsigned l = 0; l < lanes_; ++l) iota.push_back(b_.getInt64(l));
  return b_.CreateICmpSLT(llvm::ConstantVector::get(iota), b_.CreateVectorSplat(lanes_, n));
}
llvm::Value* VectorMath::as_f32(llvm::Value* v) const {
  return b_.CreateBitCast(v, f32v());
}
llvm::Value* VectorMath::as_i32(llvm::Value* v) const {
  return b_.CreateBitCast(v, i32v());
}

llvm::Value* VectorMath::fma(llvm::Value* a, llvm::Value* b, llvm::Value* c) const {
  return b_.CreateIntrinsic(llvm::Intrinsic::fma, {a->getType()}, {a, b, c});
}

llvm::Value* VectorMath::exp(llvm::Value* x) const {
  auto& b = b_;
  // min/max as compare + select, one vminps/vmaxps each, with x as the
  // operand x86 returns when one is NaN: exp(NaN) is NaN (an attention score
  // or softcap argument that is NaN must not become a finite weight). The
  // upper clamp lies past ln(FLT_MAX) = 88.72 so that e^x overflows to +Inf
  // there (a finite cap made silu(−2.5e38) ≈ −1 instead of −0) and n stays
  // ≤ 128; the lower one keeps 2^n normal.
  x = b.CreateSelect(b.CreateFCmpOGT(x, f32(89.0f)), f32(89.0f), x);
  x = b.CreateSelect(b.CreateFCmpOLT(x, f32(-87.3365447505531f)), f32(-87.3365447505531f), x);
  llvm::Value* n = b.CreateFMul(x, f32(1.44269504088896341f));
  n = b.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, n);
  llvm::Value* neg_n = b.CreateFNeg(n);
  llvm::Value* r = fma(neg_n, f32(0.693359375f), x);  // Cody–Waite: ln 2 = hi + lo
  r = fma(neg_n, f32(-2.12194440e-4f), r);
  llvm::Value* p = f32(1.0f / 720);
  for (float c : {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f}) p = fma(p, r, f32(c));
  // 2^n with n in [-126, 128]: two factors 2^n1 · 2^n2, n1 = n >> 1, each a
  // normal float built from its exponent bits; both products are exact
  // except for a final underflow, which rounds once (like vscalefps).
  // fptosi of a NaN n is poison in LLVM IR; frozen, it is some integer, and
  // p (NaN then) keeps the result NaN.
  llvm::Value* ni = b.CreateFreeze(b.CreateFPToSI(n, i32v()));
  llvm::Value* n1 = b.CreateAShr(ni, i32(1));
  llvm::Value* n2 = b.CreateSub(ni, n1);
  auto pow2 = [&](llvm::Value* e) {
    return as_f32(b.CreateShl(b.CreateAdd(e, i32(127)), i32(23)));
  };
  return b.CreateFMul(b.CreateFMul(p, pow2(n1)), pow2(n2));
}

llvm::Value* VectorMath::act_mul(Activation act, llvm::Value* g, llvm::Value* u) const {
  return b_.CreateFMul(activation(act, g), u);
}

llvm::Value* VectorMath::clamped_swiglu(llvm::Value* g, llvm::Value* u, float alpha,
                                        float limit) const {
  auto& b = b_;
  llvm::Value* lim = f32(limit);
  llvm::Value* nlim = f32(-limit);
  g = b.CreateSelect(b.CreateFCmpOGT(g, lim), lim, g);
  u = b.CreateSelect(b.CreateFCmpOGT(u, lim), lim, u);
  u = b.CreateSelect(b.CreateFCmpOLT(u, nlim), nlim, u);
  // g·σ(alpha·g) = g / (1 + e^{−alpha·g})
  llvm::Value* e = exp(b.CreateFMul(g, f32(-alpha)));
  llvm::Value* v = b.CreateFDiv(g, b.CreateFAdd(e, f32(1.0f)));
  return b.CreateFMul(v, b.CreateFAdd(u, f32(1.0f)));
}

llvm::Value* VectorMath::activation(Activation act, llvm::Value* x) const {
  auto& b = b_;
  auto neg = [&](llvm::Value* v) { return as_f32(b.CreateXor(as_i32(v), i32(kSignMask))); };
  switch (act) {
    case Activation::none:
      return x;
    // x < 0 ? 0 : x: NaN propagates and −0 stays −0 (the reference's rule).
    case Activation::relu:
      return b.CreateSelect(b.CreateFCmpOLT(x, f32(0.0f)), f32(0.0f), x);
    case Activation::relu2: {
      llvm::Value* r = b.CreateSelect(b.CreateFCmpOLT(x, f32(0.0f)), f32(0.0f), x);
      return b.CreateFMul(r, r);
    }
    case Activation::silu: {
      // x · sigmoid(x) = x / (1 + e^{-x})
      llvm::Value* e = exp(neg(x));
      return b.CreateFDiv(x, b.CreateFAdd(e, f32(1.0f)));
    }
    case Activation::gelu_tanh: {
      // 0.5·x·(1 + tanh(u)) = x · sigmoid(2u), u = √(2/π)·(x + 0.044715·x³)
      llvm::Value* t = b.CreateFMul(x, x);
      t = b.CreateFMul(t, f32(static_cast<float>(2 * 0.7978845608028654 * 0.044715)));
      t = b.CreateFAdd(t, f32(static_cast<float>(2 * 0.7978845608028654)));
      t = b.CreateFMul(t, x);
      llvm::Value* e = exp(neg(t));
      return b.CreateFDiv(x, b.CreateFAdd(e, f32(1.0f)));
    }
    case Activation::gelu_erf: {
      // 0.5·x·(1 + erf(x/√2)); erf(z) = 1 − t·(a1 + t·(a2 + … + t·a5))·e^{−z²},
      // t = 1/(1 + p·z), z = |x|/√2 ≥ 0 (|error| ≤ 1.5e-7), odd in x.
      llvm::Value* z =
          b.CreateFMul(as_f32(b.CreateAnd(as_i32(x), i32(kAbsMask))), f32(0.70710678118654752f));
      llvm::Value* t = b.CreateFAdd(b.CreateFMul(z, f32(0.3275911f)), f32(1.0f));
      t = b.CreateFDiv(f32(1.0f), t);
      llvm::Value* q = f32(1.061405429f);
      for (float c : {-1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f})
        q = fma(q, t, f32(c));
      q = b.CreateFMul(q, t);
      llvm::Value* e = exp(neg(b.CreateFMul(z, z)));
      q = b.CreateFMul(q, e);                              // 1 − erf(z)
      llvm::Value* erf = b.CreateFAdd(neg(q), f32(1.0f));  // erf(|x|/√2)
      llvm::Value* sign = b.CreateAnd(as_i32(x), i32(kSignMask));
      erf = as_f32(b.CreateXor(as_i32(erf), sign));
      // (0.5·x)·(1 + erf): the halving first (exact), so x near FLT_MAX does
      // not overflow in x·2 before it.
      return b.CreateFMul(b.CreateFMul(x, f32(0.5f)), b.CreateFAdd(erf, f32(1.0f)));
    }
  }
  return x;
}

llvm::Value* VectorMath::subnormal_lanes(llvm::Value* v) const {
  constexpr int kFpclassDenormal = 0x20;  // vfpclassps category: subnormal, either sign
  return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_fpclass_ps_512, {},
                            {v, b_.getInt32(kFpclassDenormal)});
}

llvm::Value* VectorMath::bf16_to_f32(llvm::Value* bits) const {
  return as_f32(b_.CreateShl(b_.CreateZExt(bits, i32v()), i32(16)));
}

llvm::Value* VectorMath::f32_to_bf16(llvm::Value* x) const {
  auto& b = b_;
  llvm::Value* u = as_i32(x);
  llvm::Value* hi = b.CreateLShr(u, i32(16));
  llvm::Value* rounded =
      b.CreateLShr(b.CreateAdd(u, b.CreateAdd(i32(0x7fff), b.CreateAnd(hi, i32(1)))), i32(16));
  llvm::Value* nan = b.CreateICmpUGT(b.CreateAnd(u, i32(kAbsMask)), i32(0x7f800000));
  llvm::Value* r = b.CreateSelect(nan, b.CreateOr(hi, i32(0x40)), rounded);
  return b.CreateTrunc(r, i16v());
}

llvm::Value* VectorMath::f16_to_f32(llvm::Value* bits) const {
  // Integer/float bit manipulation (as in the FP16 library), not fpext: that
  // needs F16C or a runtime call on hosts without it.
  auto& b = b_;
  llvm::Value* w = b.CreateShl(b.CreateZExt(bits, i32v()), i32(16));
  llvm::Value* sign = b.CreateAnd(w, i32(kSignMask));
  llvm::Value* two_w = b.CreateAdd(w, w);
  // Normal, inf and NaN: move the exponent into place, rebias by 2^-112.
  llvm::Value* normalized = b.CreateFMul(
      as_f32(b.CreateAdd(b.CreateLShr(two_w, i32(4)), i32(0xE0u << 23))), f32(0x1.0p-112f));
  // Subnormal: mantissa as the low bits of 0.5·2^k, minus 0.5.
  llvm::Value* denormalized =
      b.CreateFSub(as_f32(b.CreateOr(b.CreateLShr(two_w, i32(17)), i32(126u << 23))), f32(0.5f));
  llvm::Value* is_denormal = b.CreateICmpULT(two_w, i32(1u << 27));
  llvm::Value* mag = b.CreateSelect(is_denormal, as_i32(denormalized), as_i32(normalized));
  return as_f32(b.CreateOr(sign, mag));
}

llvm::Value* VectorMath::f32_to_f16(llvm::Value* x) const {
  auto& b = b_;
  // Scaling |x| up by 2^112 and down by 2^-110 makes overflow become inf and
  // lets the float adder do the mantissa rounding (round to nearest even);
  // the bias term aligns the rounding point with f16's (FP16 library method).
  llvm::Value* w = as_i32(x);
  llvm::Value* absx = as_f32(b.CreateAnd(w, i32(kAbsMask)));
  llvm::Value* base = b.CreateFMul(b.CreateFMul(absx, f32(0x1.0p+112f)), f32(0x1.0p-110f));
  llvm::Value* shl1_w = b.CreateAdd(w, w);
  llvm::Value* sign = b.CreateAnd(w, i32(kSignMask));
  llvm::Value* bias = b.CreateAnd(shl1_w, i32(0xFF000000u));
  bias = b.CreateSelect(b.CreateICmpULT(bias, i32(0x71000000u)), i32(0x71000000u), bias);
  base = b.CreateFAdd(as_f32(b.CreateAdd(b.CreateLShr(bias, i32(1)), i32(0x07800000u))), base);
  llvm::Value* bits = as_i32(base);
  llvm::Value* exp_bits = b.CreateAnd(b.CreateLShr(bits, i32(13)), i32(0x00007C00u));
  llvm::Value* mantissa_bits = b.CreateAnd(bits, i32(0x00000FFFu));
  llvm::Value* nonsign = b.CreateAdd(exp_bits, mantissa_bits);
  llvm::Value* nan = b.CreateICmpUGT(shl1_w, i32(0xFF000000u));
  llvm::Value* r =
      b.CreateOr(b.CreateLShr(sign, i32(16)), b.CreateSelect(nan, i32(0x7E00u), nonsign));
  return b.CreateTrunc(r, i16v());
}

llvm::Value* VectorMath::f8e4m3_to_f32(llvm::Value* bits) const {
  auto& b = b_;
  llvm::Value* v = b.CreateZExt(bits, i32v());
  llvm::Value* mag = b.CreateAnd(v, i32(0x7f));
  // The 7 magnitude bits placed at f32's exponent/mantissa boundary, the
  // exponent rebiased by 120: 2^(e−7)·(1 + m/8) for e ≥ 1, exactly. For
  // e = 0 (m·2^−9) the rebias is 121 and 2^−6 is taken off: 2^−6·(1 + m/8) −
  // 2^−6, exact. Integer arithmetic and a subtraction of normal numbers only:
  // a form that multiplied the f32 subnormal m·2^−129 by 2^120 read 0 for
  // every subnormal code when the caller had MXCSR.DAZ set.
  llvm::Value* sub = b.CreateICmpULT(mag, i32(8));
  llvm::Value* bias = b.CreateSelect(sub, i32(121u << 23), i32(120u << 23));
  llvm::Value* f = as_f32(b.CreateAdd(b.CreateShl(mag, i32(20)), bias));
  f = b.CreateFSub(f, b.CreateSelect(sub, f32(0x1.0p-6f), f32(0.0f)));
  f = b.CreateSelect(b.CreateICmpEQ(mag, i32(0x7f)), as_f32(i32(0x7fc00000u)), f);
  llvm::Value* sign = b.CreateShl(b.CreateAnd(v, i32(0x80)), i32(24));
  return as_f32(b.CreateOr(as_i32(f), sign));
}

llvm::Value* VectorMath::e8m0_to_f32(llvm::Value* bits) const {
  llvm::Value* e = b_.CreateZExt(bits, i32v());
  llvm::Value* f = b_.CreateShl(e, i32(23));
  return as_f32(b_.CreateSelect(b_.CreateICmpEQ(e, i32(0)), i32(0x00400000u), f));
}

}  // namespace tilejit::codegen::llvm_backend
