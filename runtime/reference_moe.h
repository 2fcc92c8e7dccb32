// The scalar reference of tilejit::fused_experts: the oracle of tests/moe_test.
// Written for clarity, on the UNPACKED expert weights, in double, sharing no
// code with the JIT paths or with the library's own scalar fallback
// (ops/moe.cpp reads the packed layouts in fp32).
//
//   out[t] = rsf · Σ_j w[t, j] · (bf16(glu(x_t·W13_gate_eᵀ + b13_gate_e,
//                                          x_t·W13_up_eᵀ + b13_up_e)) · W2_eᵀ + b2_e)
//          + s[t] · bf16(glu(x_t·W13sᵀ)) · W2sᵀ              (shared expert, if any;
//                                                             s = shared_weights or 1)
//
// with e = ids[t, j], rsf = routed_scaling_factor. One rounding is mirrored on
// purpose: the intermediate activation glu(gate, up) is rounded to bf16 before
// the down projection, because the kernels store it as bf16 (it is the A
// operand of the down GEMM); without it the oracle would disagree with every
// correct implementation by up to one bf16 ulp per intermediate element.
// Everything else is exact products summed in double; out is rounded once to
// f32.
//
// Optionally it also sums, per output, the ingredients of an error bound (see
// abs_sum / act_term below), so a test can bound a kernel's fp32 arithmetic
// without a second pass over the weights.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/reference_gemm.h"
#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// The gated activation glu(gate, up).
struct ReferenceGlu {
  Activation act = Activation::silu;  // silu or gelu_tanh / gelu_erf: act(gate)·up
  // false: a non-gated MLP (ExpertProj::up): w13 holds I up rows per expert,
  // b13 I entries, and the activation is act(up); the point below then has
  // gate = the up pre-activation and up = 1 exactly (no error).
  bool gated = true;
  bool clamped_swiglu = false;  // GPT-OSS: g = min(gate, limit), u = clamp(up, ±limit)
  double alpha = 1.702;         //          out = g·σ(alpha·g)·(u + 1)
  double limit = 7.0;
};

inline double reference_glu(const ReferenceGlu& a, double gate, double up) {
  if (a.clamped_swiglu) {
    const double g = std::min(gate, a.limit);
    const double u = std::clamp(up, -a.limit, a.limit);
    return g / (1.0 + std::exp(-a.alpha * g)) * (u + 1.0);
  }
  return reference_activation(a.act, gate) * up;
}

// What the reference saw when it formed one intermediate activation.
struct MoeActPoint {
  double gate = 0, up = 0;          // pre-activations, b13 included
  double gate_abs = 0, up_abs = 0;  // Σ_h |x_h·w_h| + |b13|: the scale of their rounding error
  double act = 0;                   // reference_glu(gate, up)
  double act_bf16 = 0;              // act rounded to bf16: what the down projection reads
};

struct ReferenceMoeArgs {
  int64_t t = 0, h = 0, i = 0, e = 0, k = 0;  // tokens, hidden, intermediate, experts, top-k
  const uint16_t* hidden = nullptr;           // [T, H] bf16, row stride ld_hidden
  int64_t ld_hidden = 0;
  // [E, 2I, H] bf16, contiguous: per expert I gate rows, I up rows; [E, I, H]
  // when !glu.gated (as b13 [E, I], w13s [shared_i, H]).
  const uint16_t* w13 = nullptr;
  const uint16_t* w2 = nullptr;         // [E, H, I] bf16, contiguous
  const float* topk_weights = nullptr;  // [T, k], row stride ld_weights
  int64_t ld_weights = 0;
  const int32_t* topk_ids = nullptr;  // [T, k] in [0, E) (the caller checks), row stride ld_ids
  int64_t ld_ids = 0;
  ReferenceGlu glu;
  const float* b13 = nullptr;  // [E, 2I] or null
  const float* b2 = nullptr;   // [E, H] or null
  double routed_scaling_factor = 1.0;
  // Shared expert (weight shared_weights[t] or 1, no bias, not scaled by
  // rsf), or null.
  int64_t shared_i = 0;
  const uint16_t* w13s = nullptr;         // [2·shared_i, H]
  const uint16_t* w2s = nullptr;          // [H, shared_i]
  const float* shared_weights = nullptr;  // [T] (indexed like the rows of hidden) or null
  float* out = nullptr;                   // [T, H] f32, row stride ld_out
  int64_t ld_out = 0;

  // Optional error-bound ingredients, [T, H] each, row stride ld_out:
  //  abs_sum[t, h]  = Σ over the experts of |rsf·w| · (Σ_i |a_i·W2[h, i]| + |b2[h]|)
  //                   (|s[t]| for the shared one): the scale of the rounding error
  //                   of the down projections and of the weighted sum;
  //  act_term[t, h] = Σ over the experts of |rsf·w| · Σ_i act_slack(point_i)·|W2[h, i]|:
  //                   what a kernel's own bf16 activations, each at most
  //                   act_slack away from the reference's, can move the output.
  double* abs_sum = nullptr;
  double* act_term = nullptr;
  std::function<double(const MoeActPoint&)> act_slack;  // required with act_term
};

namespace reference_moe_detail {

// One expert on one token, added with weight `scale` into y[H] (and into the
// bound rows when asked).
inline void expert(const ReferenceMoeArgs& a, const std::vector<double>& x, int64_t I,
                   const uint16_t* w13, const uint16_t* w2, const float* b13, const float* b2,
                   double scale, double* y, double* abs_sum, double* act_term) {
  const int64_t H = a.h;
  std::vector<double> act(static_cast<size_t>(I)), slack(static_cast<size_t>(I), 0.0);
  for (int64_t i = 0; i < I; ++i) {
    const uint16_t* wg = w13 + i * H;
    MoeActPoint p;
    if (!a.glu.gated) {  // act(up): the up row's sum in gate, an exact 1 in up
      for (int64_t hh = 0; hh < H; ++hh) {
        const double pu = x[hh] * double(bf16_to_f32(wg[hh]));
        p.gate += pu;
        p.gate_abs += std::fabs(pu);
      }
      if (b13 != nullptr) p.gate += b13[i], p.gate_abs += std::fabs(b13[i]);
      p.up = 1;
    } else {
      const uint16_t* wu = w13 + (I + i) * H;
      for (int64_t hh = 0; hh < H; ++hh) {
        const double pg = x[hh] * double(bf16_to_f32(wg[hh]));
        const double pu = x[hh] * double(bf16_to_f32(wu[hh]));
        p.gate += pg, p.up += pu;
        p.gate_abs += std::fabs(pg), p.up_abs += std::fabs(pu);
      }
      if (b13 != nullptr) {
        p.gate += b13[i], p.up += b13[I + i];
        p.gate_abs += std::fabs(b13[i]), p.up_abs += std::fabs(b13[I + i]);
      }
    }
    p.act = reference_glu(a.glu, p.gate, p.up);
    p.act_bf16 = bf16_to_f32(f32_to_bf16(static_cast<float>(p.act)));
    act[i] = p.act_bf16;
    if (act_term != nullptr) slack[i] = a.act_slack(p);
  }
  const double s = std::fabs(scale);
  for (int64_t hh = 0; hh < H; ++hh) {
    const uint16_t* wr = w2 + hh * I;
    double acc = 0, mag = 0, sl = 0;
    for (int64_t i = 0; i < I; ++i) {
      const double w = bf16_to_f32(wr[i]);
      const double prod = act[i] * w;
      acc += prod;
      mag += std::fabs(prod);
      sl += slack[i] * std::fabs(w);
    }
    if (b2 != nullptr) acc += b2[hh], mag += std::fabs(b2[hh]);
    y[hh] += scale * acc;
    if (abs_sum != nullptr) abs_sum[hh] += s * mag;
    if (act_term != nullptr) act_term[hh] += s * sl;
  }
}

}  // namespace reference_moe_detail

inline void reference_moe(const ReferenceMoeArgs& a) {
  const int64_t H = a.h, I = a.i;
  std::vector<double> x(static_cast<size_t>(H)), y(static_cast<size_t>(H));
  for (int64_t t = 0; t < a.t; ++t) {
    for (int64_t hh = 0; hh < H; ++hh) x[hh] = bf16_to_f32(a.hidden[t * a.ld_hidden + hh]);
    std::fill(y.begin(), y.end(), 0.0);
    double* abs_sum = a.abs_sum != nullptr ? a.abs_sum + t * a.ld_out : nullptr;
    double* act_term = a.act_term != nullptr ? a.act_term + t * a.ld_out : nullptr;
    if (abs_sum != nullptr) std::fill(abs_sum, abs_sum + H, 0.0);
    if (act_term != nullptr) std::fill(act_term, act_term + H, 0.0);
    for (int64_t j = 0; j < a.k; ++j) {
      const int64_t e = a.topk_ids[t * a.ld_ids + j];
      const double w = a.routed_scaling_factor * double(a.topk_weights[t * a.ld_weights + j]);
      const int64_t rows13 = a.glu.gated ? 2 * I : I;
      reference_moe_detail::expert(a, x, I, a.w13 + e * rows13 * H, a.w2 + e * H * I,
                                   a.b13 != nullptr ? a.b13 + e * rows13 : nullptr,
                                   a.b2 != nullptr ? a.b2 + e * H : nullptr, w, y.data(), abs_sum,
                                   act_term);
    }
    if (a.w13s != nullptr)
      reference_moe_detail::expert(a, x, a.shared_i, a.w13s, a.w2s, nullptr, nullptr,
                                   a.shared_weights ? double(a.shared_weights[t]) : 1.0, y.data(),
                                   abs_sum, act_term);
    for (int64_t hh = 0; hh < H; ++hh) a.out[t * a.ld_out + hh] = static_cast<float>(y[hh]);
  }
}

}  // namespace tilejit::runtime
