// How far a kernel's result may be from the scalar references next to this
// header (reference_gemm.h, reference_moe.h), and why: the one error model the
// tests, `tilejit run --check` (the tool's program runner) and the llama layer
// job compare against. Everything is in double, per output; each bound says
// why it is what it is.
//
//   tol = gemm_output_bound(act, out, K, Σ|x·w|, |bias|, pre, ref);
//   ok  = std::fabs(got - ref) <= tol;
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/bf16.h"
#include "runtime/reference_moe.h"
#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// fp32 unit roundoff u: one rounding of an fp32 operation moves a value by at
// most u·|value|.
inline constexpr double kF32Unit = 1.0 / (1 << 24);

// The JIT evaluates exp (degree-6 polynomial, rel. error ~2e-7) and erf
// (Abramowitz–Stegun 7.1.26, abs. error 1.5e-7) in fp32; an activation built
// on them stays within kVectorMathError·max(1, |x|) of exact at input x.
inline constexpr double kVectorMathError = 4e-6;

// How much an activation can stretch an error of its input: its largest slope.
// silu: x·σ(x) has slope ≤ 1.0998; the gelus ≤ 1.129; relu and none 1.
// relu2 has no such constant (slope 2x): NaN, so that a bound built on it
// fails every comparison; bounds take activation_error below instead.
inline double activation_lipschitz(Activation act) {
  switch (act) {
    case Activation::none:
    case Activation::relu:
      return 1.0;
    case Activation::silu:
      return 1.1;
    case Activation::gelu_tanh:
    case Activation::gelu_erf:
      return 1.13;
    case Activation::relu2:
      return std::nan("");
  }
  return 1.0;
}

// How far act moves when its input moves by at most `err` from `pre`: L·err
// for the Lipschitz activations; relu2 (relu(x)², relu 1-Lipschitz, then
// |a'² − a²| = |a' − a|·|a' + a|) at most (2·|pre| + err)·err. A bound made of
// several input errors E_i stretched one call each needs (Σ E_i)² ≤ the sum
// of the calls' quadratic terms: with 3·err instead of err, Cauchy–Schwarz
// ((Σ E_i)² ≤ 3·Σ E_i² for up to three) covers the three sources the
// quantized bounds add (dot product, weight rounding, activation codes).
inline double activation_error(Activation act, double pre, double err) {
  if (act == Activation::relu2) return (2 * std::fabs(pre) + 3 * err) * err;
  return activation_lipschitz(act) * err;
}

// activation_error's factor for messages: the Lipschitz constant ("1.1"),
// or relu2's "2·|pre| + 3·e" (one home for the constants: activation_lipschitz).
inline std::string activation_slope_text(Activation act) {
  if (act == Activation::relu2) return "2·|pre| + 3·e (relu2; e the error it multiplies)";
  return fmt::format("{:g}", activation_lipschitz(act));  // fmt: not the host's LC_NUMERIC
}

// The error the vector math adds to act(x): none and relu are exact, relu2
// rounds its square once (u·x²); the others are kVectorMathError·max(1, |x|).
inline double activation_math_error(Activation act, double x) {
  if (act == Activation::none || act == Activation::relu) return 0;
  if (act == Activation::relu2) return kF32Unit * x * x;
  return kVectorMathError * std::max(1.0, std::fabs(x));
}

// fp8 and int4 weights are dequantized to bf16 before the dot product
// (codegen/quant_desc.h): each w moves by at most 2⁻⁸·|w| (bf16 round to
// nearest even; the f32 product before it adds 2⁻²⁴), so against the exact
// dequantized weights an output moves by at most that times Σ|x·w| more,
// through the activation.
inline double dequant_weight_bound(Activation act, double sum_abs, double pre) {
  return activation_error(act, pre, (std::ldexp(1.0, -8) + std::ldexp(1.0, -23)) * sum_abs);
}

// The W8A8 epilogue (codegen/brgemm_desc.h): the int32 sum t is exact; float(t),
// the two scale multiplies and the bias add are four f32 roundings of values
// at most |pre| + |bias| (pre = t·s_x·s_w), moved through the activation, then
// the reference's own rounding and, for bf16 out, one bf16 ulp.
inline double int8_output_bound(Activation act, DType out, double pre_abs, double bias_abs,
                                double pre, double v) {
  double tol = activation_error(act, pre, 4 * kF32Unit * (pre_abs + bias_abs));
  tol += activation_math_error(act, pre) + kF32Unit * std::fabs(v);
  if (out == DType::bf16) tol = tol * (1 + std::ldexp(1.0, -8)) + std::ldexp(std::fabs(v), -7);
  return tol;
}

// W4A8 (int4 weights, int8 activations): per scale group g the exact int32
// sum S_g (float(S_g) exact below 2^24, one rounding above), scaled by s_x
// and s_g (two roundings) and added to the f32 sum of the earlier groups
// (one), then the bias (one): within (G + 4)·u·Σ_g|S_g·s_x·s_g| + u·|bias|
// of the exact W4A8 value; the activation and the bf16 output as
// int8_output_bound.
inline double w4a8_output_bound(Activation act, DType out, int64_t groups, double pre_abs,
                                double bias_abs, double pre, double v) {
  double tol = activation_error(
      act, pre, (static_cast<double>(groups) + 4) * kF32Unit * pre_abs + kF32Unit * bias_abs);
  tol += activation_math_error(act, pre) + kF32Unit * std::fabs(v);
  if (out == DType::bf16) tol = tol * (1 + std::ldexp(1.0, -8)) + std::ldexp(std::fabs(v), -7);
  return tol;
}
// What quantizing x per row moves a W4A8 output by, against the same GEMM on
// the bf16 x: each x_k is within half a code, s_x/2, of its code's value
// (plus the f32 rounding of x·(1/s_x): we allow 0.51·s_x), times |w_k|.
inline double w4a8_activation_bound(Activation act, double s_x, double w_abs, double pre) {
  return activation_error(act, pre, 0.51 * s_x * w_abs);
}

// Dot product. Products of two bf16 values are exact in fp32; vdpbf16ps /
// tdpbf16ps (and the LLVM FMAs) then add them into fp32 accumulators with one
// rounding per addition, in whatever order the blocking (k-split
// accumulators, tiles) chooses. Any summation order of K terms plus the final
// bias addition is within (K+1)·u·Σ|x·w| + u·|bias| of the exact value; we
// allow (K+2)·u·Σ|x·w| + u·|bias|, with Σ|x·w| computed per output in double.
inline double dot_bound(int64_t k, double sum_abs, double bias_abs = 0) {
  return (static_cast<double>(k) + 2) * kF32Unit * sum_abs + kF32Unit * bias_abs;
}

// One bf16 ulp of v, ≤ 2⁻⁷·|v|: where both sides round nearly equal fp32
// values to bf16, the roundings may fall on either side of a boundary.
inline double bf16_ulp_bound(double v) {
  return std::ldexp(std::fabs(v), -7);
}

// The error bound of one gemm output y[i, j] against reference_gemm (double
// accumulation, rounded once to fp32): the dot product through the
// activation (its Lipschitz constant), the activation's vector math at the
// pre-activation `pre`, the reference's own rounding to fp32 (u·|v|, v the
// reference result), and for a bf16 output one bf16 ulp on top of the fp32
// bound (itself scaled by 1 + 2⁻⁸ since the JIT rounds its own, slightly
// perturbed, value).
inline double gemm_output_bound(Activation act, DType out, int64_t k, double sum_abs,
                                double bias_abs, double pre, double v) {
  double tol = activation_error(act, pre, dot_bound(k, sum_abs, bias_abs));
  tol += activation_math_error(act, pre);
  tol += kF32Unit * std::fabs(v);
  if (out == DType::bf16) tol = tol * (1 + std::ldexp(1.0, -8)) + bf16_ulp_bound(v);
  return tol;
}

// The fused W4A16 / W8A16 decode kernel (codegen/xbyak/quant_brgemm.cpp)
// against the exact dequantized weights, for one output y[r][c] =
// act(Σ_g s_g·Σ_{k∈g} a_k·(q_k − z_g) + bias). No weight is rounded: the
// codes become exact small numbers (int4: 16 + q on the table-free path of
// full 64-column blocks, else q or q − 8; fp8: the e4m3 value × 2⁻⁸) and
// a_k·w_k is exact in f32 (8-bit × ≤ 5-bit significands). The f32 error
// then comes from
//  - the per-group sums acc_g (vdpbf16ps or fma: one rounding per term) and
//    the fold: every term a·w·s passes through at most K + 2 roundings,
//    ≤ (K+2)·u·Σ_k |a_k|·|w_k|·|s|;
//  - the Σa sums of the group (exact bf16 terms) and their fma with the
//    exact integer (16 + z), z or z·s: ≤ (K+2)·u·Σ_k |a_k|·|z'|·|s| with z'
//    the offset subtracted (16 + z, z or 8);
//  - the scale fmas' own roundings and the bias add (≤ 2·u·Σ|terms| + u·|bias|);
//    the fp8 ×2⁸ is exact;
// in all within (K+4)·u·(sum_abs + offset_abs) + u·|bias|, sum_abs =
// Σ_k |a_k|·(|q_k| + |z|)·|s| (q the code value: int4 q, fp8 the e4m3 value,
// z = 0; z = 8 for int4 without zero points) and offset_abs the part the
// int4 offset of 16 adds: Σ_k |a_k|·32·|s| (|16 + q| + |16 + z| = 32 + q + z;
// cancelled exactly in the real sum, not in the rounding error). Without
// zero points 32 ≤ 4·(|q| + 8), so offset_abs ≤ 4·sum_abs there; with zero
// points a caller passing 0 relies on the (K+4) chain count being far above
// the real one (≤ k-pairs per group + groups + 4). The result moves through
// the activation's Lipschitz constant, plus its vector math, the
// reference's own f32 rounding and, for bf16 out, one bf16 ulp (as
// gemm_output_bound). It assumes no f32 subnormal partial result (vdpbf16ps
// flushes them): the terms a·w (fp8: a·e4m3·2⁻⁸) are 0 or ≥ 2⁻¹²⁶ in
// magnitude, i.e. nonzero activations above ~2⁻¹⁰⁸.
inline double quant_brgemm_output_bound(Activation act, DType out, int64_t k, double sum_abs,
                                        double bias_abs, double pre, double v,
                                        double offset_abs = 0) {
  double tol = activation_error(
      act, pre,
      (static_cast<double>(k) + 4) * kF32Unit * (sum_abs + offset_abs) + kF32Unit * bias_abs);
  tol += activation_math_error(act, pre);
  tol += kF32Unit * std::fabs(v);
  if (out == DType::bf16) tol = tol * (1 + std::ldexp(1.0, -8)) + bf16_ulp_bound(v);
  return tol;
}

// The error of an n-term fp32 sum of terms of any sign, in units of
// u·Σ|terms|: the worst case (n + 2, as the gemm bound uses) or, when
// smaller, six standard deviations of the probabilistic model of Higham &
// Mary (2019): independent zero-mean rounding errors give rms ≤ u·√(Σ_k S_k²/3)
// ≤ u·√(n/3)·Σ|t| since every partial sum |S_k| ≤ Σ|t|. (tests/moe_test.cpp
// allows 8·u·Σ|t| instead, which relies on its zero-mean random inputs.)
inline double fp32_sum_ulps(int64_t n) {
  return std::min(double(n + 2), 6.0 * std::sqrt(double(n) / 3.0));
}

// ---- attention and RoPE --------------------------------------------------------

// One attention output against reference_attention: scores are fp32 sums of
// exact bf16 products; the softmax weights P are rounded to bf16 (relative
// error ≤ 2⁻⁹ each) before P·V, which moves the output by at most
// 2⁻⁹·max|v|; the output itself is rounded to bf16 (2⁻⁹·|ref|). The bound
// leaves 4× / 2× headroom over those for fp32 exp and summation:
// 2⁻⁷·max|v| + 2⁻⁸·|ref|, max|v| over the values the row reads.
inline double attention_output_bound(double max_v, double ref) {
  return std::ldexp(max_v, -7) + std::ldexp(std::fabs(ref), -8);
}

// One rotated element against reference_rope, mag = |x·cos| + |x'·sin| (x'
// the pair partner; the reference reports it). f32: the kernel rounds the
// product x'·sin (≤ 2⁻²⁴·|x'·sin|) and then the fma (≤ 2⁻²⁴·mag): 2⁻²³·mag in
// all, doubled for headroom (inputs and cache values are exact in both).
// bf16: one bf16 ulp of the result (rounding the f32 value costs at most half
// of one) plus the f32 error above, doubled again: 2⁻⁷·|ref| + 2⁻²¹·mag.
inline double rope_output_bound(DType out, double mag, double ref) {
  if (out == DType::f32) return std::ldexp(mag, -22);
  return bf16_ulp_bound(ref) + std::ldexp(mag, -21);
}

// ---- fused_experts (derivation: tests/moe_test.cpp's header) ----------------

// Steps 2 and 3 of the MoE bound, for one intermediate activation whose
// fp32 gate and up sums are within eps_sum·Σ|x·w| (eps_sum in absolute
// units, e.g. 8·u): glu(gate, up) in fp32 moves by εg through the gated
// function (activation_error: its Lipschitz constant, 1.1 for silu and
// σ-swiglu, 1.13 for gelu, the clamps 1-Lipschitz; relu2's slope grows with
// |gate|) times |up|, εu times |act(gate)|, the vectorised exp/erf/tanh
// approximations (activation_math_error, kVectorMathError·max(1, |gate|)
// relative to |up|, times max(1, α) for swiglu since exp sees α·gate) and a few fp32
// roundings of the product: εa (moe_act_error), doubled for headroom. The
// kernel's bf16 activation then lies between bf16(a − εa) and bf16(a + εa)
// (rounding is monotone): the slack (moe_act_slack) is the larger distance of
// those from the reference's bf16(a), zero unless a sits within εa of a
// rounding midpoint.
// Not inlined: inlined into tools/program/check_operators.cpp it made GCC 12
// report a false -Wfree-nonheap-object on a vector of the caller.
[[gnu::noinline]] inline double moe_act_error(const ReferenceGlu& glu, const MoeActPoint& p,
                                              double eps_sum) {
  const double eg = eps_sum * p.gate_abs;
  const double eu = eps_sum * p.up_abs;
  // df: how far act(gate) moves for εg; math: its vector math's own error.
  double df, math, f, mult, g;
  if (glu.clamped_swiglu) {
    // d/dg g·σ(α·g) = h(α·g) with h(y) = σ(y) + y·σ'(y) ≤ 1.0998, for any α.
    g = std::min(p.gate, glu.limit);
    df = 1.1 * eg;
    math = kVectorMathError * std::max(1.0, std::fabs(g)) * std::max(1.0, glu.alpha);
    f = g / (1 + std::exp(-glu.alpha * g));
    mult = std::clamp(p.up, -glu.limit, glu.limit) + 1;
  } else {
    g = p.gate;
    df = activation_error(glu.act, g, eg);
    math = activation_math_error(glu.act, g);
    f = reference_activation(glu.act, g);
    mult = p.up;
  }
  const double m = std::fabs(mult) + eu;
  const double ea = df * m + (std::fabs(f) + df) * eu + math * m + 4 * kF32Unit * std::fabs(p.act);
  return 2 * ea;
}

// The final rounding of a row-wise op's f32 value to a bf16 out (half a bf16 ulp
// of the kernel's value, 2⁻⁸ of it, and the smallest bf16 subnormal's half).
inline double rowwise_out_rounding(DType out, double ref, double tol) {
  if (out == DType::bf16) tol += std::ldexp(std::fabs(ref) + tol, -8) + 0x1p-134;
  return tol;
}

// act_and_mul (docs/rowwise.md): glu(gate, up) of exact inputs in f32 with
// the epilogue's vector math, moe_act_error's terms with no input error,
// then for bf16 out the final rounding (half a bf16 ulp of the f32 value:
// 2⁻⁸ of it, rigorous) and the smallest bf16 subnormal's half.
inline double glu_output_bound(const ReferenceGlu& glu, double gate, double up, DType out,
                               double ref) {
  MoeActPoint p;
  p.gate = gate;
  p.up = up;
  p.act = ref;
  return rowwise_out_rounding(out, ref, moe_act_error(glu, p, 0) + 0x1p-147);
}

// rms_norm (docs/rowwise.md), against ref = v·rstd·w in double with the
// kernel's v (the input, or the stored residual): Σ v² in f32 blocks of 8
// squares per lane (≤ 7 roundings of positive terms: 7·2⁻²⁴ of the sum, half
// of that in rstd), rstd rounded to f32, v·rstd, ·w and (1 + w) one f32
// rounding each: 7.5 units, 8 for the bound, plus the smallest f32 subnormal
// a product may round by, four times; a bf16 out then rounds once more
// (2⁻⁸ of its f32 value).
inline double rms_norm_output_bound(DType out, double ref) {
  return rowwise_out_rounding(out, ref, 8 * kF32Unit * std::fabs(ref) + 0x1p-147);
}

// layer_norm (docs/rowwise.md): what the bound needs of a row of the
// kernel's v (the input, or the stored residual), in double.
struct LayerNormRow {
  double mean = 0, var = 0, rstd = 0;
  double mean_abs = 0;  // Σ|v| / h
  double mean_sq = 0;   // Σv² / h
  double dev_abs = 0;   // Σ|v - mean| / h
};
inline LayerNormRow layer_norm_row(const double* v, int64_t h, double eps) {
  LayerNormRow r;
  const double n = static_cast<double>(h);
  for (int64_t i = 0; i < h; ++i) {
    r.mean += v[i];
    r.mean_abs += std::fabs(v[i]);
    r.mean_sq += v[i] * v[i];
  }
  r.mean /= n;
  r.mean_abs /= n;
  r.mean_sq /= n;
  for (int64_t i = 0; i < h; ++i) {
    r.var += (v[i] - r.mean) * (v[i] - r.mean);
    r.dev_abs += std::fabs(v[i] - r.mean);
  }
  r.var /= n;
  r.dev_abs /= n;
  r.rstd = 1.0 / std::sqrt(r.var + eps);
  return r;
}
// Against ref = (v - mean)·rstd·w + b, dev = v - mean. With u = 2⁻²⁴, the
// kernel's two ways to var and the centred value, the larger error taken:
//  - both: m, the f32 mean: Σv in f32 blocks (7 roundings: 7u of Σ|v|)
//    rounded once more: δ = |m - mean| ≤ 8u·mean_abs;
//  - one pass (taken where Σv²/h ≤ 2·var, computed; 2.01 with the sums'
//    errors): var = Σv²/h - mean² within 7u·Σv²/h + 14u·|mean|·mean_abs
//    + 49u²·mean_abs², the centred value v - m within δ(1 + u) + u·|dev|;
//  - corrected two-pass: d = v - m (one rounding), Σd in blocks (7u of
//    Σ|d|): c = Σd/h in f32 is mean - m within 9u·(dev_abs + δ); the
//    centred value d - c is dev within 9u·(dev_abs + δ) + 2u·(|dev| + δ);
//    var = (Σd² - (Σd)²/h)/h: Σd² within 9u (d's rounding squared, the
//    blocks), the correction within 16u·δ·(dev_abs + δ) + 64u²·(dev_abs +
//    δ)²: var within 9u·(var + δ²) + those;
//  - rstd then moves by ½·E/(var + eps) and its rounding to f32, u;
//  - ·rstd, ·w (and 1 + w), + b: 3 roundings of their values.
// With eps, h and the values exact, the double path (rows an f32 sum
// could not hold) is within this too.
inline double layer_norm_output_bound(const LayerNormRow& r, double eps, DType out, double dev,
                                      double w, double b, double ref) {
  const double u = kF32Unit;
  const double delta = 8 * u * r.mean_abs;
  const double a = r.dev_abs + delta;
  double e = 9 * u * a + 2 * u * (std::fabs(dev) + delta);
  double var_err = 9 * u * (r.var + delta * delta) + 16 * u * delta * a + 64 * u * u * a * a;
  if (r.mean_sq <= 2.01 * r.var) {
    e = std::max(e, delta * (1 + u) + u * std::fabs(dev));
    var_err = std::max(var_err, 7 * u * r.mean_sq + 14 * u * std::fabs(r.mean) * r.mean_abs +
                                    49 * u * u * r.mean_abs * r.mean_abs);
  }
  const double rel = 0.5 * var_err / (r.var + eps) + 2 * u;
  const double scaled = std::fabs(dev) * r.rstd * std::fabs(w);
  const double tol = std::fabs(w) * r.rstd * e * (1 + rel) + scaled * (rel + 3 * u) +
                     u * (std::fabs(b) + std::fabs(ref)) + 0x1p-147 * 4;
  return rowwise_out_rounding(out, ref, tol);
}

// rms_norm_gated, the norm before the gate: out = n·a, n = v·rstd·w within
// rms_norm_output_bound's 8 units, a = act(gate) within its vector math's
// error, one more f32 rounding for the product.
inline double gated_norm_output_bound(Activation act, double gate, DType out, double n,
                                      double ref) {
  const double a = reference_activation(act, gate);
  const double tol = 9 * kF32Unit * std::fabs(n * a) +
                     std::fabs(n) * activation_math_error(act, gate) * (1 + 8 * kF32Unit) +
                     0x1p-147 * 5;
  return rowwise_out_rounding(out, ref, tol);
}

// rms_norm_gated with the gate first: v_i = x_i·act(g_i) in f32 carries
// e_i = |x_i|·activation_math_error(act, g_i) + u·|v_i| (gate_first_value_error);
// the kernel's Σv² then moves by ≤ Σ(2|v_i| + e_i)·e_i, its rstd by half of
// that over Σv² + h·eps (gate_first_rstd_error, relative); out_i = v_i·rstd·w
// by |w|·rstd·e_i and |ref|·rel on top of rms_norm_output_bound's 8 units.
inline double gate_first_value_error(Activation act, double x, double gate) {
  return std::fabs(x) * activation_math_error(act, gate) +
         kF32Unit * std::fabs(x * reference_activation(act, gate));
}
inline double gate_first_rstd_error(const double* v, const double* e, int64_t h, double eps) {
  double sq = 0, moved = 0;
  for (int64_t i = 0; i < h; ++i) {
    sq += v[i] * v[i];
    moved += (2 * std::fabs(v[i]) + e[i]) * e[i];
  }
  return 0.5 * moved / (sq + static_cast<double>(h) * eps);
}
inline double gate_first_output_bound(DType out, double e, double rstd, double w, double rel,
                                      double ref) {
  const double tol = 8 * kF32Unit * std::fabs(ref) + std::fabs(w) * rstd * e * (1 + rel) +
                     std::fabs(ref) * rel + 0x1p-147 * 4;
  return rowwise_out_rounding(out, ref, tol);
}

inline double moe_act_slack(const ReferenceGlu& glu, const MoeActPoint& p, double eps_sum) {
  const double ea = moe_act_error(glu, p, eps_sum);
  auto round_bf16 = [](double v) {
    return double(bf16_to_f32(f32_to_bf16(static_cast<float>(v))));
  };
  return std::max(std::fabs(round_bf16(p.act + ea) - p.act_bf16),
                  std::fabs(round_bf16(p.act - ea) - p.act_bf16));
}

// Steps 4 and 5: the down projection and the weighted sum, whose fp32 sums
// are within eps_out·(Σ|terms| + act_term) (act_term: the step-3 slack pushed
// through |W2| and the routing weights, as reference_moe reports it); an f32
// output adds the reference's own f32 rounding (u·|ref|), a bf16 one half a
// bf16 ulp of the kernel's value, ≤ 2⁻⁸·(|ref| + tol) (rigorous).
inline double moe_output_bound(DType out, double abs_sum, double act_term, double eps_out,
                               double ref) {
  const double tol = act_term + eps_out * (abs_sum + act_term);
  if (out == DType::f32) return tol + kF32Unit * std::fabs(ref);
  return tol * (1 + std::ldexp(1.0, -8)) + std::ldexp(1.0, -8) * std::fabs(ref) +
         kF32Unit * std::fabs(ref);
}

}  // namespace tilejit::runtime
