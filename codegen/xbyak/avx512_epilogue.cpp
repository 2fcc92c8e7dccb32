#include "codegen/xbyak/avx512_epilogue.h"

namespace tilejit::codegen::xbyak {
namespace {
constexpr uint32_t kSignMask = 0x80000000u;
constexpr uint32_t kAbsMask = 0x7fffffffu;
// exp's argument clamp from above: past ln(FLT_MAX) (88.72), below the point
// where n = round(x·log2 e) would leave [−126, 128]; e^x is +Inf there.
constexpr float kExpOverflowArg = 89.0f;
}  // namespace

void Avx512Epilogue::exp_inplace(JitGenerator& g, const Xbyak::Zmm& v, const Xbyak::Zmm& n,
                                 const Xbyak::Zmm& r) {
  // exp(x) = 2^n · p(r), n = round(x·log2 e), r = x − n·ln 2 (Cody–Waite split
  // so r is exact enough), p a degree-6 Taylor polynomial (|r| ≤ ln2/2 gives a
  // truncation error below 1.2e-7); vscalefps applies 2^n without bit tricks
  // and saturates to 0 / inf instead of wrapping. The upper clamp lies past
  // ln(FLT_MAX) = 88.72 so that e^x overflows to +Inf there, as it should: a
  // finite cap made silu(−2.5e38) = x / (1 + e^88.4) ≈ −1 instead of −0. The
  // lower one keeps 2^n normal (e^x ≥ FLT_MIN, never a denormal).
  g.vminps(v, v, g.bcst(kExpOverflowArg));
  g.vmaxps(v, v, g.bcst(-87.3365447505531f));
  g.vmulps(n, v, g.bcst(1.44269504088896341f));
  g.vrndscaleps(n, n, 0);  // round to nearest even
  g.vmovaps(r, v);
  g.vfnmadd231ps(r, n, g.bcst(0.693359375f));
  g.vfnmadd231ps(r, n, g.bcst(-2.12194440e-4f));
  g.vbroadcastss(v, g.f32_const(1.0f / 720));
  g.vfmadd213ps(v, r, g.bcst(1.0f / 120));
  g.vfmadd213ps(v, r, g.bcst(1.0f / 24));
  g.vfmadd213ps(v, r, g.bcst(1.0f / 6));
  g.vfmadd213ps(v, r, g.bcst(0.5f));
  g.vfmadd213ps(v, r, g.bcst(1.0f));
  g.vfmadd213ps(v, r, g.bcst(1.0f));
  g.vscalefps(v, v, n);
}

void Avx512Epilogue::activation(const Xbyak::Zmm& x) {
  auto& g = g_;
  const auto &t0 = t_[0], &t1 = t_[1], &t2 = t_[2], &t3 = t_[3];
  switch (d_.act) {
    case Activation::none:
      return;
    case Activation::relu:
    case Activation::relu2:
      // max(0, x) with x as vmaxps's second operand, which it returns when
      // either is NaN (relu(NaN) = NaN, IEEE propagation) and for two zeros
      // (relu(−0) = −0), as the reference's v < 0 ? 0 : v. relu2 then rounds
      // the square once.
      g.vxorps(t0, t0, t0);
      g.vmaxps(x, t0, x);
      if (d_.act == Activation::relu2) g.vmulps(x, x, x);
      return;
    case Activation::silu:
      // x · sigmoid(x) = x / (1 + e^{-x})
      g.vxorps(t0, x, g.bcst_u32(kSignMask));
      exp_inplace(g, t0, t1, t2);
      g.vaddps(t0, t0, g.bcst(1.0f));
      g.vdivps(x, x, t0);
      return;
    case Activation::gelu_tanh:
      // 0.5·x·(1 + tanh(u)) = x · sigmoid(2u), u = √(2/π)·(x + 0.044715·x³)
      g.vmulps(t0, x, x);
      g.vmulps(t0, t0, g.bcst(static_cast<float>(2 * 0.7978845608028654 * 0.044715)));
      g.vaddps(t0, t0, g.bcst(static_cast<float>(2 * 0.7978845608028654)));
      g.vmulps(t0, t0, x);
      g.vxorps(t0, t0, g.bcst_u32(kSignMask));
      exp_inplace(g, t0, t1, t2);
      g.vaddps(t0, t0, g.bcst(1.0f));
      g.vdivps(x, x, t0);
      return;
    case Activation::gelu_erf: {
      // 0.5·x·(1 + erf(x/√2)); erf by Abramowitz–Stegun 7.1.26 (|error| ≤ 1.5e-7):
      // erf(z) = 1 − t·(a1 + t·(a2 + … + t·a5))·e^{−z²}, t = 1/(1 + p·z), z ≥ 0.
      g.vandps(t0, x, g.bcst_u32(kAbsMask));
      g.vmulps(t0, t0, g.bcst(0.70710678118654752f));  // z = |x|/√2
      g.vmulps(t1, t0, g.bcst(0.3275911f));
      g.vaddps(t1, t1, g.bcst(1.0f));
      g.vbroadcastss(t2, g.f32_const(1.0f));
      g.vdivps(t1, t2, t1);  // t
      g.vbroadcastss(t2, g.f32_const(1.061405429f));
      g.vfmadd213ps(t2, t1, g.bcst(-1.453152027f));
      g.vfmadd213ps(t2, t1, g.bcst(1.421413741f));
      g.vfmadd213ps(t2, t1, g.bcst(-0.284496736f));
      g.vfmadd213ps(t2, t1, g.bcst(0.254829592f));
      g.vmulps(t2, t2, t1);  // poly(t)
      g.vmulps(t0, t0, t0);
      g.vxorps(t0, t0, g.bcst_u32(kSignMask));  // −z²
      exp_inplace(g, t0, t1, t3);
      g.vmulps(t2, t2, t0);  // q = 1 − erf(z)
      g.vxorps(t2, t2, g.bcst_u32(kSignMask));
      g.vaddps(t2, t2, g.bcst(1.0f));  // erf(|x|/√2)
      g.vandps(t1, x, g.bcst_u32(kSignMask));
      g.vxorps(t2, t2, t1);  // erf(x/√2), odd in x
      g.vaddps(t2, t2, g.bcst(1.0f));
      // (0.5·x)·(1 + erf): the halving first (exact), so x near FLT_MAX does
      // not overflow in x·2 before it.
      g.vmulps(x, x, g.bcst(0.5f));
      g.vmulps(x, x, t2);
      return;
    }
  }
}

void Avx512Epilogue::add_inputs(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& bias,
                                const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row) {
  auto& g = g_;
  if (d_.accumulate) {
    if (tail != nullptr)
      g.vaddps(acc | *tail, acc, g.ptr[acc_in_row + col_vec * 64]);
    else
      g.vaddps(acc, acc, g.ptr[acc_in_row + col_vec * 64]);
  }
  add_bias(acc, col_vec, bias, tail);
}

void Avx512Epilogue::add_bias(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& bias,
                              const Xbyak::Opmask* tail) {
  auto& g = g_;
  // Masked memory operands suppress faults on masked-off lanes, so the bias
  // and C tails are never read or written past column N.
  switch (d_.bias) {
    case BiasKind::none:
      break;
    case BiasKind::f32:
      if (tail != nullptr)
        g.vaddps(acc | *tail, acc, g.ptr[bias + col_vec * 64]);
      else
        g.vaddps(acc, acc, g.ptr[bias + col_vec * 64]);
      break;
    case BiasKind::bf16:
      if (tail != nullptr)
        g.vpmovzxwd(t_[0] | *tail | Xbyak::util::T_z, g.ptr[bias + col_vec * 32]);
      else
        g.vpmovzxwd(t_[0], g.ptr[bias + col_vec * 32]);
      g.vpslld(t_[0], t_[0], 16);
      g.vaddps(acc, acc, t_[0]);
      break;
  }
}

void Avx512Epilogue::store(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& c_row,
                           const Xbyak::Opmask* tail) {
  auto& g = g_;
  if (d_.out != DType::bf16) {  // f32, or the raw sums of an int8 kernel (i32)
    if (tail != nullptr)
      g.vmovups(g.ptr[c_row + col_vec * 64] | *tail, acc);
    else
      g.vmovups(g.ptr[c_row + col_vec * 64], acc);
  } else {
    const Xbyak::Ymm y(acc.getIdx());
    g.vcvtneps2bf16(y, acc);  // round to nearest even
    if (tail != nullptr)
      g.vmovdqu16(g.ptr[c_row + col_vec * 32] | *tail, y);
    else
      g.vmovdqu16(g.ptr[c_row + col_vec * 32], y);
  }
}

void Avx512Epilogue::apply_and_store(const Xbyak::Zmm& acc, int col_vec, const Xbyak::Reg64& c_row,
                                     const Xbyak::Reg64& bias, const Xbyak::Opmask* tail,
                                     const Xbyak::Reg64& acc_in_row) {
  add_inputs(acc, col_vec, bias, tail, acc_in_row);
  activation(acc);
  store(acc, col_vec, c_row, tail);
}

void Avx512Epilogue::int8_scale(const Xbyak::Zmm& acc, int col_vec, int row, const Int8Regs& q,
                                const Xbyak::Opmask* tail, const Xbyak::Reg64& acc_in_row) {
  auto& g = g_;
  if (d_.accumulate) {
    if (tail != nullptr)
      g.vpaddd(acc | *tail, acc, g.ptr[acc_in_row + col_vec * 64]);
    else
      g.vpaddd(acc, acc, g.ptr[acc_in_row + col_vec * 64]);
  }
  if (d_.out == DType::i32) return;
  const Xbyak::Zmm& t = t_[0];
  g.vpbroadcastd(t, g.dword[q.a_zero + row * 4]);
  g.vpmulld(t, t, g.ptr[q.b_comp + col_vec * 64]);
  g.vpsubd(acc, acc, t);  // exact int32: acc − a_zero·b_comp
  g.vcvtdq2ps(acc, acc);  // round to nearest even (exact below 2^24)
  g.vmulps(acc, acc, g.ptr_b[q.a_scale + row * 4]);
  g.vmulps(acc, acc, g.ptr[q.b_scale + col_vec * 64]);
}

void Avx512Epilogue::apply_int8_and_store(const Xbyak::Zmm& acc, int col_vec, int row,
                                          const Int8Regs& q, const Xbyak::Reg64& c_row,
                                          const Xbyak::Reg64& bias, const Xbyak::Opmask* tail,
                                          const Xbyak::Reg64& acc_in_row) {
  int8_scale(acc, col_vec, row, q, tail, acc_in_row);
  if (d_.out != DType::i32) {
    add_bias(acc, col_vec, bias, tail);
    activation(acc);
  }
  store(acc, col_vec, c_row, tail);
}

void Avx512Epilogue::glu(const Xbyak::Zmm& gate, const Xbyak::Zmm& up) {
  auto& g = g_;
  switch (d_.glu) {
    case Glu::none:
      break;
    case Glu::act_mul:
      activation(gate);
      g.vmulps(gate, gate, up);
      break;
    case Glu::clamped_swiglu: {
      const auto &t0 = t_[0], &t1 = t_[1], &t2 = t_[2];
      // The limits in a register as the first source: vminps / vmaxps
      // return the second source when one is NaN, so a NaN gate or up stays
      // NaN (docs/reliability.md, "NaN and Inf") instead of becoming ±limit.
      g.vbroadcastss(t1, g.f32_const(d_.glu_limit));
      g.vminps(gate, t1, gate);
      g.vminps(up, t1, up);
      g.vbroadcastss(t1, g.f32_const(-d_.glu_limit));
      g.vmaxps(up, t1, up);
      // g·σ(alpha·g) = g / (1 + e^{−alpha·g})
      g.vmulps(t0, gate, g.bcst(-d_.glu_alpha));
      exp_inplace(g, t0, t1, t2);
      g.vaddps(t0, t0, g.bcst(1.0f));
      g.vdivps(gate, gate, t0);
      g.vaddps(up, up, g.bcst(1.0f));
      g.vmulps(gate, gate, up);
      break;
    }
  }
}

void Avx512Epilogue::apply_glu_and_store(const Xbyak::Zmm& gate, const Xbyak::Zmm& up, int out_vec,
                                         const Xbyak::Reg64& c_row, const Xbyak::Reg64& bias,
                                         const Xbyak::Opmask* tail,
                                         const Xbyak::Reg64& acc_in_row) {
  // The inputs cover the padded 64-column block: no masks.
  add_inputs(gate, out_vec, bias, nullptr, acc_in_row);
  add_inputs(up, out_vec + 2, bias, nullptr, acc_in_row);
  glu(gate, up);
  store(gate, out_vec, c_row, tail);
}

void Avx512Epilogue::apply_int8_glu_and_store(const Xbyak::Zmm& gate, const Xbyak::Zmm& up,
                                              int out_vec, int row, const Int8Regs& q,
                                              const Xbyak::Reg64& c_row, const Xbyak::Reg64& bias,
                                              const Xbyak::Opmask* tail,
                                              const Xbyak::Reg64& acc_in_row) {
  // The inputs cover the padded 64-column block: no masks.
  int8_scale(gate, out_vec, row, q, nullptr, acc_in_row);
  add_bias(gate, out_vec, bias, nullptr);
  int8_scale(up, out_vec + 2, row, q, nullptr, acc_in_row);
  add_bias(up, out_vec + 2, bias, nullptr);
  glu(gate, up);
  store(gate, out_vec, c_row, tail);
}

}  // namespace tilejit::codegen::xbyak
