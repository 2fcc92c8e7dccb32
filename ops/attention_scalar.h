// The scalar path of the attention operators (runtime::active_isa() ==
// Isa::scalar): one (sequence, query head) through the double-precision
// reference of runtime/reference_attention.h.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "ops/attention_engine.h"
#include "runtime/bf16.h"
#include "runtime/reference_attention.h"

namespace tilejit::ops::attn {

// q rows at q0 + i·q_stride, out rows at out0 + i·out_stride (bf16).
inline void scalar_head(const Params& p, int64_t head, int64_t tq, int64_t tk, const uint16_t* q0,
                        int64_t q_stride, const RowSource& k, const RowSource& v, uint16_t* out0,
                        int64_t out_stride) {
  runtime::ReferenceAttentionHead h;
  h.tq = tq;
  h.tk = tk;
  h.d = p.d;
  h.dv = p.dv;
  h.sm_scale = p.scale;
  h.causal = p.causal;
  h.window_left = p.window_left;
  h.window_right = p.window_right;
  h.softcap = p.softcap;
  h.has_sink = p.sinks != nullptr;
  if (p.sinks) h.sink = p.sinks[head * p.sinks_stride];
  if (p.slopes) h.alibi_slope = p.slopes[head * p.slopes_stride];
  h.q_at = [&](int64_t i, int64_t c) { return double(runtime::bf16_to_f32(q0[i * q_stride + c])); };
  h.k_at = [&](int64_t j, int64_t c) { return double(runtime::bf16_to_f32(k.row(j)[c])); };
  h.v_at = [&](int64_t j, int64_t c) {
    return double(runtime::bf16_to_f32(v.row(j)[c])) * double(p.v_scale);
  };
  h.out = [&](int64_t i, int64_t c, double x) {
    out0[i * out_stride + c] = runtime::f32_to_bf16(static_cast<float>(x));
  };
  runtime::reference_attention_head(h);
}

// Scale 1 for every key (scalar_row's default).
struct UnitScale {
  double operator()(int64_t) const { return 1.0; }
};

// One query row over keys [0, tk) whose rows come from key_row(j) / value_row(j),
// in double, honouring the row's tree mask (extend with a tree mask has
// per-key visibility the reference's interval rule cannot express). Key j's
// K and V values are its rows' times key_scale(j) / value_scale(j) (extend
// over an fp8 cache: the cached keys' scales, 1 for k_new / v_new).
template <class KeyRow, class ValueRow, class KeyScale = UnitScale, class ValueScale = UnitScale>
void scalar_row(const Params& p, const QueryRow& row, int64_t tk, KeyRow key_row,
                ValueRow value_row, uint16_t* out, KeyScale key_scale = {},
                ValueScale value_scale = {}) {
  int64_t lo = 0, hi = -1;
  visible_keys(p, row.i_pos, tk, lo, hi);
  const double slope = p.slopes ? p.slopes[row.head * p.slopes_stride] : 0.0;
  std::vector<double> s(static_cast<size_t>(std::max<int64_t>(0, hi - lo + 1)));
  std::vector<double> acc(static_cast<size_t>(p.dv), 0.0);
  double mx = p.sinks ? double(p.sinks[row.head * p.sinks_stride])
                      : -std::numeric_limits<double>::infinity();
  auto visible = [&](int64_t j) {
    return row.mask == nullptr || j < row.mask_first ||
           row.mask[(j - row.mask_first) * row.mask_stride] != 0;
  };
  bool any = false;
  for (int64_t j = lo; j <= hi; ++j) {
    if (!visible(j)) continue;
    const uint16_t* k = key_row(j);
    double dot = 0;
    for (int64_t c = 0; c < p.d; ++c)
      dot += double(runtime::bf16_to_f32(row.q[c])) * double(runtime::bf16_to_f32(k[c]));
    double x = dot * key_scale(j) * p.scale;
    if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
    x += slope * static_cast<double>(j - row.i_pos);
    s[j - lo] = x;
    mx = std::max(mx, x);
    any = true;
  }
  // NaN and ±Inf as runtime/reference_attention.h: every visible score −inf
  // (mx = −inf) is a row that sees no key.
  const double shift = mx == -std::numeric_limits<double>::infinity() ? 0.0 : mx;
  if (any) {
    double denom = p.sinks ? std::exp(double(p.sinks[row.head * p.sinks_stride]) - shift) : 0.0;
    for (int64_t j = lo; j <= hi; ++j) {
      if (!visible(j)) continue;
      const double w = std::exp(s[j - lo] - shift);
      denom += w;
      const uint16_t* v = value_row(j);
      const double vs = value_scale(j);
      for (int64_t c = 0; c < p.dv; ++c) acc[c] += w * vs * double(runtime::bf16_to_f32(v[c]));
    }
    for (auto& a : acc) a = denom == 0 ? 0.0 : a / denom * double(p.v_scale);
  }
  for (int64_t c = 0; c < p.dv; ++c) out[c] = runtime::f32_to_bf16(static_cast<float>(acc[c]));
}

// True when the bf16 row holds a NaN or an infinity: |x| ≥ 0x7f80 (exponent
// bits all ones). A signed 16-bit max of |x| (non-negative as int16), which
// GCC turns into pand + pmaxsw per 8 elements even at the SSE2 baseline.
inline bool nonfinite_bf16(const uint16_t* x, int64_t n) {
  int16_t mag = 0;
  for (int64_t i = 0; i < n; ++i) mag = std::max(mag, static_cast<int16_t>(x[i] & 0x7fffu));
  return mag >= 0x7f80;
}

// The NaN/Inf rule of the JIT paths (docs/reliability.md, "NaN and Inf"):
// they may turn a non-finite input into a NaN where IEEE arithmetic would not
// (the P·V GEMM multiplies a weight of 0 by the V row of a key that the
// row's mask hides but its key block holds, 0·NaN = NaN; 2^(−inf) is NaN in
// the unmasked softmax loop, which skips its clamp for speed), but never turn
// one into a finite value. So an output row holding a NaN or an Inf — rare,
// and found by one pass over the output — is recomputed by the reference,
// which decides: recompute(r) rewrites out_rows[r]. The hot loops stay as they
// were.
template <class Recompute>
void repair_nonfinite(const std::vector<uint16_t*>& out_rows, int64_t dv, Recompute recompute) {
  for (size_t r = 0; r < out_rows.size(); ++r)
    if (nonfinite_bf16(out_rows[r], dv)) recompute(r);
}

}  // namespace tilejit::ops::attn
