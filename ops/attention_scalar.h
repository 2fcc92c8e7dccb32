// The scalar path of the attention operators (runtime::active_isa() ==
// Isa::scalar): one (sequence, query head) through the double-precision
// reference of runtime/reference_attention.h.
#pragma once

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
  h.v_at = [&](int64_t j, int64_t c) { return double(runtime::bf16_to_f32(v.row(j)[c])); };
  h.out = [&](int64_t i, int64_t c, double x) {
    out0[i * out_stride + c] = runtime::f32_to_bf16(static_cast<float>(x));
  };
  runtime::reference_attention_head(h);
}

}  // namespace tilejit::ops::attn
