// Checking an operator program: one reference per call, on the operands that
// call read (OperatorRunner::check).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <tuple>

#include "ir/printer.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_quant.h"
#include "runtime/reference_rope.h"
#include "runtime/thread_pool.h"
#include "tools/program/operator_runner.h"
#include "tools/program/reference_rows.h"

namespace tilejit::tools {
namespace {

constexpr double kU = runtime::kF32Unit;

int64_t int_at(const HostTensor& t, int64_t i) {
  return t.dtype == DType::i64 ? t.data<int64_t>()[i] : int64_t{t.data<int32_t>()[i]};
}

// Reference values and per-element bounds of one call's result, laid out
// like the result.
struct Expected {
  std::vector<double> ref, tol;
  std::string tolerance;  // the formula, for the report
};

// Bound of tests/rope_test.cpp, with mag = |x·cos| + |x'·sin|: f32 2⁻²²·mag
// (the product and the fma rounded, doubled for headroom); bf16 one bf16 ulp
// 2⁻⁷·|ref| + 2⁻²¹·mag. Elements past rotary_dim must be bit-exact.
Expected rope_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& pos,
                       const HostTensor& cs) {
  const int64_t t = q.shape[0], h = q.shape[1], d = q.shape[2];
  const int64_t rot = c.rope.rotary_dim ? c.rope.rotary_dim : d;
  const int64_t p = cs.shape[0];
  for (int64_t i = 0; i < t; ++i)
    if (int_at(pos, i) < 0 || int_at(pos, i) >= p)
      throw Error(fmt::format("check: positions[{}] = {} is outside the cache's [0, {})", i,
                              int_at(pos, i), p));
  Expected e;
  e.ref.resize(static_cast<size_t>(q.numel()));
  e.tol.resize(e.ref.size());
  const bool f32 = q.dtype == DType::f32;
  runtime::ReferenceRope r;
  r.neox = c.rope.style == RopeStyle::neox;
  r.rotary_dim = rot;
  runtime::parallel_for(t, [&](int64_t tok) {
    const int64_t at = int_at(pos, tok);
    const auto cache = [&](int64_t, int64_t col) {
      return double(cs.data<float>()[at * rot + col]);
    };
    std::vector<double> in(d), out(d), mag(d);
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t base = (tok * h + hh) * d;
      for (int64_t i = 0; i < d; ++i) in[i] = q.at(base + i);
      runtime::reference_rope_head(r, d, in.data(), out.data(), cache, mag.data());
      for (int64_t i = 0; i < d; ++i) {
        e.ref[base + i] = out[i];
        e.tol[base + i] = i >= rot ? 0.0 : runtime::rope_output_bound(q.dtype, mag[i], out[i]);
      }
    }
  });
  e.tolerance = f32 ? "f32: 2⁻²²·(|x·cos| + |x'·sin|); exact past rotary_dim"
                    : "bf16: 2⁻⁷·|ref| + 2⁻²¹·(|x·cos| + |x'·sin|); exact past rotary_dim";
  return e;
}

// One attention sequence as the reference reads it: tq query rows over tk
// keys of Hq query heads sharing Hkv kv heads; elements by accessor (a
// paged cache, fp8 codes times their scale).
struct AttnSeq {
  int64_t tq = 0, tk = 0, hq = 0, hkv = 0, d = 0, dv = 0;
  std::function<double(int64_t h, int64_t i, int64_t col)> q;
  std::function<double(int64_t g, int64_t j, int64_t col)> k, v;
  // Where out[i][h][col] goes in the result.
  std::function<int64_t(int64_t h, int64_t i, int64_t col)> out_at;
  // AttentionOptions' per-head sinks and ALiBi slopes [Hq], or null.
  const float* sinks = nullptr;
  const float* alibi_slopes = nullptr;
};

constexpr const char* kAttentionTolerance =
    "2⁻⁷·max|v| + 2⁻⁸·|ref| + 5·δ·max|v|, δ = (D+2)·2⁻²⁴·sm_scale·‖q_i‖₁·max|k| (fp32 scores) "
    "+ 2·2⁻²⁴·|alibi_slope|·S (the fp32 ALiBi term)";

// Bound of tests/attention_test.cpp, 2⁻⁷·max|v| + 2⁻⁸·|ref| (P rounded to
// bf16 before P·v, the bf16 output, headroom for fp32 exp and sums), plus
// what fp32 score errors can do with inputs larger than the tests': a score
// off by δ moves each softmax weight by a factor e^{±2δ}, the output by
// ≤ 5δ·max|v| (δ small), with δ ≤ (D+2)·u·sm_scale·‖q_i‖₁·max|k| for query
// row i (softcap is 1-Lipschitz). max|k|, max|v| over what the call may read.
void attention_rows(const OperatorCall& c, const AttnSeq& a, double max_k, double max_v,
                    Expected& e) {
  const int64_t group = a.hq / a.hkv;
  const double scale = sm_scale_of(c, a.d);
  runtime::parallel_for(a.hq, [&](int64_t h) {
    const int64_t g = h / group;
    runtime::ReferenceAttentionHead r;
    r.tq = a.tq;
    r.tk = a.tk;
    r.d = a.d;
    r.dv = a.dv;
    r.sm_scale = scale;
    r.causal = c.attention.causal;
    r.window_left = c.attention.window_left;
    r.window_right = c.attention.window_right;
    r.softcap = c.attention.softcap;
    if (a.sinks != nullptr) r.has_sink = true, r.sink = a.sinks[h];
    if (a.alibi_slopes != nullptr) r.alibi_slope = a.alibi_slopes[h];
    r.q_at = [&](int64_t i, int64_t col) { return a.q(h, i, col); };
    r.k_at = [&](int64_t j, int64_t col) { return a.k(g, j, col); };
    r.v_at = [&](int64_t j, int64_t col) { return a.v(g, j, col); };
    std::vector<double> delta(static_cast<size_t>(a.tq));  // per query row: the score bound
    for (int64_t i = 0; i < a.tq; ++i) {
      double q1 = 0;
      for (int64_t cc = 0; cc < a.d; ++cc) q1 += std::fabs(a.q(h, i, cc));
      // + the ALiBi term slope·(j − i) rounded in fp32 and added to the score.
      delta[i] = double(a.d + 2) * kU * scale * q1 * max_k +
                 2 * kU * std::fabs(r.alibi_slope) * double(a.tk);
    }
    r.out = [&](int64_t i, int64_t col, double val) {
      const int64_t at = a.out_at(h, i, col);
      e.ref[at] = val;
      e.tol[at] = runtime::attention_output_bound(max_v, val) + 5 * delta[i] * max_v;
    };
    runtime::reference_attention_head(r);
  });
  e.tolerance = kAttentionTolerance;
}

Expected attention_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& k,
                            const HostTensor& v, const float* sinks, const float* alibi_slopes) {
  AttnSeq a;
  a.sinks = sinks;
  a.alibi_slopes = alibi_slopes;
  a.tq = q.shape[0], a.hq = q.shape[1], a.d = q.shape[2];
  a.tk = k.shape[0], a.hkv = k.shape[1], a.dv = v.shape[2];
  a.q = [&](int64_t h, int64_t i, int64_t col) { return q.at((i * a.hq + h) * a.d + col); };
  a.k = [&](int64_t g, int64_t j, int64_t col) { return k.at((j * a.hkv + g) * a.d + col); };
  a.v = [&](int64_t g, int64_t j, int64_t col) { return v.at((j * a.hkv + g) * a.dv + col); };
  a.out_at = [&](int64_t h, int64_t i, int64_t col) { return (i * a.hq + h) * a.dv + col; };
  double max_v = 0, max_k = 0;
  for (int64_t i = 0; i < v.numel(); ++i) max_v = std::max(max_v, std::fabs(v.at(i)));
  for (int64_t i = 0; i < k.numel(); ++i) max_k = std::max(max_k, std::fabs(k.at(i)));
  Expected e;
  e.ref.assign(static_cast<size_t>(a.tq * a.hq * a.dv), 0.0);
  e.tol.assign(e.ref.size(), 0.0);
  attention_rows(c, a, max_k, max_v, e);
  return e;
}

// decode_attention: sequence b's one query row (its last position) over keys
// 0 .. seq_lens[b] − 1, key j in cache block block_table[b][j / block_size]
// at row j % block_size; an fp8 cache (f8e4m3, f8e5m2) read as code · scale,
// exactly as the call reads it (every e4m3 or e5m2 value times a float scale
// is exact in double).
Expected decode_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& kc,
                         const HostTensor& vc, const HostTensor& table, const HostTensor& lens,
                         const float* sinks, const float* alibi_slopes) {
  const int64_t b = q.shape[0], hq = q.shape[1], d = q.shape[2];
  const int64_t nb = kc.shape[0], bs = kc.shape[1], hkv = kc.shape[2], dv = vc.shape[3];
  const int64_t mb = table.shape[1];
  const bool fp8 = runtime::fp8_format_of(kc.dtype) != nullptr;
  const KvCacheScales& sc = c.attention.kv_scales;
  auto cache_at = [&](const HostTensor& t, double scale, int64_t i) {
    return fp8 ? t.at(i) * scale : t.at(i);
  };
  Expected e;
  e.ref.assign(static_cast<size_t>(b * hq * dv), 0.0);
  e.tol.assign(e.ref.size(), 0.0);
  for (int64_t s = 0; s < b; ++s) {
    const int64_t len = int_at(lens, s);
    if (len < 1 || len > mb * bs)
      throw Error(fmt::format("check: seq_lens[{}] = {}; allowed: 1 .. {} (block table row)", s,
                              len, mb * bs));
    std::vector<int64_t> row(static_cast<size_t>(len));  // key j's row in the cache
    double max_k = 0, max_v = 0;
    for (int64_t j = 0; j < len; ++j) {
      const int64_t blk = int_at(table, s * mb + j / bs);
      if (blk < 0 || blk >= nb)
        throw Error(fmt::format("check: block_table[{}][{}] = {}; allowed: 0 .. {}", s, j / bs, blk,
                                nb - 1));
      row[j] = blk * bs + j % bs;
      for (int64_t i = 0; i < hkv * d; ++i)
        max_k = std::max(max_k, std::fabs(cache_at(kc, sc.k_scale, row[j] * hkv * d + i)));
      for (int64_t i = 0; i < hkv * dv; ++i)
        max_v = std::max(max_v, std::fabs(cache_at(vc, sc.v_scale, row[j] * hkv * dv + i)));
    }
    AttnSeq a;
    a.tq = 1, a.tk = len, a.hq = hq, a.hkv = hkv, a.d = d, a.dv = dv;
    a.sinks = sinks;
    a.alibi_slopes = alibi_slopes;
    a.q = [&](int64_t h, int64_t, int64_t col) { return q.at((s * hq + h) * d + col); };
    a.k = [&](int64_t g, int64_t j, int64_t col) {
      return cache_at(kc, sc.k_scale, (row[j] * hkv + g) * d + col);
    };
    a.v = [&](int64_t g, int64_t j, int64_t col) {
      return cache_at(vc, sc.v_scale, (row[j] * hkv + g) * dv + col);
    };
    a.out_at = [&](int64_t h, int64_t, int64_t col) { return (s * hq + h) * dv + col; };
    attention_rows(c, a, max_k, max_v, e);
  }
  return e;
}

// One expert's w13 [2I, cols] from GPT-OSS's interleaved rows (gate i at
// row 2i, up i at 2i + 1) to the halves order the oracle reads (the I gate
// rows, then the I up rows); as given when the rows are already halves.
template <class T>
void w13_to_halves(GluRows rows, T* w, int64_t inter, int64_t cols) {
  if (rows == GluRows::halves) return;
  const std::vector<T> src(w, w + 2 * inter * cols);
  for (int64_t i = 0; i < inter; ++i) {
    std::copy_n(src.data() + (2 * i) * cols, cols, w + i * cols);
    std::copy_n(src.data() + (2 * i + 1) * cols, cols, w + (inter + i) * cols);
  }
}

// A moe call's MoeOptions tensors as the oracles read them: b13 and the
// shared expert's w13 in the halves order, the shared expert's size, and the
// number of terms of each token's weighted sum (top_k, + 1 with a shared
// expert) for the fp32 sum bound.
struct MoeExtras {
  std::vector<float> b13;  // [E, 2I] halves order, or empty
  const float* b2 = nullptr;
  std::vector<uint16_t> w13s;  // [2·Is, H] halves order, or empty
  const uint16_t* w2s = nullptr;
  int64_t shared_i = 0;
  const float* shared_weights = nullptr;  // [T] or null
  int64_t sum_terms(int64_t k) const { return k + (w2s != nullptr ? 1 : 0); }
};

// tensor(id): the call's value of a named operand.
template <class Tensor>
MoeExtras moe_extras(const OperatorCall& c, int64_t e_count, int64_t inter, Tensor tensor) {
  MoeExtras x;
  const MoeOperands& mo = c.moe_operands;
  if (mo.b13 >= 0) {
    const HostTensor& b = tensor(mo.b13);
    x.b13.assign(b.data<float>(), b.data<float>() + b.numel());
    if (c.gated)  // non-gated: [E, I], in order already
      for (int64_t e = 0; e < e_count; ++e)
        w13_to_halves(c.glu_rows, x.b13.data() + e * 2 * inter, inter, 1);
  }
  if (mo.b2 >= 0) x.b2 = tensor(mo.b2).template data<float>();
  if (mo.shared()) {
    const HostTensor& s13 = tensor(mo.shared_w13);
    x.shared_i = c.gated ? s13.shape[0] / 2 : s13.shape[0];
    x.w13s.assign(s13.data<uint16_t>(), s13.data<uint16_t>() + s13.numel());
    if (c.gated) w13_to_halves(c.glu_rows, x.w13s.data(), x.shared_i, s13.shape[1]);
    x.w2s = tensor(mo.shared_w2).template data<uint16_t>();
  }
  if (mo.shared_weights >= 0) x.shared_weights = tensor(mo.shared_weights).template data<float>();
  return x;
}

// Bound of tests/moe_test.cpp (see its header for the derivation;
// runtime/reference_error_bounds.h computes it), with its fp32 sums bounded
// by fp32_sum_ulps(n)·u·Σ|t| instead of 8·u·Σ|t|, so that it holds for inputs of
// any sign, not only for zero-mean random ones:
//  1. gate and up: εg = fp32_sum_ulps(H)·u·Σ|x·w|, εu likewise;
//  2.-3. glu(gate, up) in fp32 and the bf16 slack of the activation:
//     runtime::moe_act_slack, pushed through |W2| and the routing weights
//     into act_term;
//  4.-5. down projection and weighted sum, (fp32_sum_ulps(I) + fp32_sum_ulps(k+1))·u·
//     (Σ|terms| + act_term), and the output rounding: runtime::moe_output_bound.
Expected moe_expected(const OperatorCall& c, const HostTensor& hidden, const HostTensor& w13,
                      const HostTensor& w2, const HostTensor& tw, const HostTensor& ti,
                      const MoeExtras& extras, DType out_dtype) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1];
  const int64_t e_count = w13.shape[0], inter = w2.shape[2], k = tw.shape[1];
  for (int64_t i = 0; i < ti.numel(); ++i)
    if (ti.data<int32_t>()[i] < 0 || ti.data<int32_t>()[i] >= e_count)
      throw Error(fmt::format("check: topk_ids[{}, {}] = {} is outside [0, {})", i / k, i % k,
                              ti.data<int32_t>()[i], e_count));
  // The gate / up rows in the oracle's halves order.
  std::vector<uint16_t> w13h(w13.data<uint16_t>(), w13.data<uint16_t>() + w13.numel());
  if (c.gated)  // non-gated: [E, I, H], the up rows in order
    for (int64_t e = 0; e < e_count; ++e)
      w13_to_halves(c.glu_rows, w13h.data() + e * 2 * inter * h, inter, h);
  runtime::ReferenceGlu glu;
  glu.gated = c.gated;
  glu.act = c.moe.act;
  glu.clamped_swiglu = c.moe.clamped_swiglu;
  glu.alpha = c.moe.swiglu_alpha;
  glu.limit = c.moe.swiglu_limit;
  const double eps_h = runtime::fp32_sum_ulps(h) * kU;
  const auto act_slack = [&](const runtime::MoeActPoint& p) {
    return runtime::moe_act_slack(glu, p, eps_h);
  };
  std::vector<float> out(static_cast<size_t>(t * h));
  std::vector<double> abs_sum(out.size()), act_term(out.size());
  runtime::parallel_for(t, [&](int64_t tok) {
    runtime::ReferenceMoeArgs a;
    a.h = h;
    a.i = inter;
    a.e = e_count;
    a.k = k;
    moe_token_args(a, hidden.data<uint16_t>(), w13h.data(), w2.data<uint16_t>(), tw.data<float>(),
                   ti.data<int32_t>(), tok, out.data() + tok * h);
    a.glu = glu;
    a.routed_scaling_factor = c.moe.routed_scaling_factor;
    a.b13 = extras.b13.empty() ? nullptr : extras.b13.data();
    a.b2 = extras.b2;
    if (extras.w2s != nullptr) {
      a.shared_i = extras.shared_i;
      a.w13s = extras.w13s.data();
      a.w2s = extras.w2s;
      if (extras.shared_weights != nullptr) a.shared_weights = extras.shared_weights + tok;
    }
    a.abs_sum = abs_sum.data() + tok * h;
    a.act_term = act_term.data() + tok * h;
    a.act_slack = act_slack;
    runtime::reference_moe(a);
  });
  Expected e;
  e.ref.resize(out.size());
  e.tol.resize(out.size());
  const double eps_out = (runtime::fp32_sum_ulps(std::max(inter, extras.shared_i)) +
                          runtime::fp32_sum_ulps(extras.sum_terms(k) + 1)) *
                         kU;
  for (size_t i = 0; i < out.size(); ++i) {
    const double ref = out[i];
    e.ref[i] = ref;
    e.tol[i] = runtime::moe_output_bound(out_dtype, abs_sum[i], act_term[i], eps_out, ref);
  }
  e.tolerance = fmt::format(
      "bf16 out: 2⁻⁸·(|ref| + tol) + tol, tol = fp32 sums of n terms at min(n+2, 6·√(n/3))·"
      "2⁻²⁴·Σ|terms| (H={}, I={}, top_k={}) + the bf16 activations' rounding slack through "
      "|W2| (tests/moe_test.cpp)",
      h, inter, k);
  return e;
}

// Quantized experts (docs/ir.md "Quantized experts"): the oracle of
// tests/moe_quant_test.cpp on the exact dequantized weights (dequantize_exact,
// the gemm check's decoding, per expert), with a bound that holds on every
// route an expert's GEMMs take (ops/moe_quant.h), following the route as
// the test does (ops::quant_gemm_fused on the expert's routed rows: the
// fused decode kernel, int8 and the scalar path read the exact weights, the
// dequant route the weights rounded once to bf16):
//  - gate/up sums within fp32_sum_ulps(H)·u·Σ|x·mag| (mag = |w|, or for int4
//    on the fused route that kernel's terms, (q + z + 32)·|s|);
//  - int8, and int4 experts on the W4A8 route (ops::w4a8_route, their routed
//    rows as M; exact weights): x and the bf16 activation row as the kernels quantize them
//    (runtime::reference_act_quant_row: the oracle reads (q − z)·s); an
//    activation with slack may take the code one step s_a further, and if
//    it can set the row's scale (its max, or min for dynamic_asym), every
//    code may: s_a·Σ|W2| + 2⁻⁷·Σ|a·W2| (moe_quant_test's rule);
//  - the activation slack (moe_act_slack), the down projection's weights as
//    for gate/up, pushed through |W2| and the routing weights; then
//    moe_output_bound as for bf16 experts.
Expected moe_quant_expected(const ir::Function& f, const OperatorCall& c, const TensorMap& inputs,
                            const HostTensor& hidden, const HostTensor& tw, const HostTensor& ti,
                            const MoeExtras& extras, DType out_dtype) {
  const MoeQuant& mq = c.moe_quant;
  const int64_t t = hidden.shape[0], h = hidden.shape[1], k = tw.shape[1];
  const ir::TensorType& w2t = f.value(operand(f, c, 2)).type;
  const int64_t e_count = w2t.dims.at(0).value, inter = w2t.dims.at(2).value;
  for (int64_t i = 0; i < ti.numel(); ++i)
    if (ti.data<int32_t>()[i] < 0 || ti.data<int32_t>()[i] >= e_count)
      throw Error(fmt::format("check: topk_ids[{}, {}] = {} is outside [0, {})", i / k, i % k,
                              ti.data<int32_t>()[i], e_count));
  const bool int8 = mq.format == WeightFormat::int8;
  const bool asym = c.moe.act_quant == ActQuant::dynamic_asym;
  // The exact weights and their term magnitudes, per expert.
  const int64_t g13 = c.gated ? 2 : 1;  // w13 rows per intermediate unit
  const size_t n13 = static_cast<size_t>(g13 * inter * h), n2 = static_cast<size_t>(h * inter);
  std::vector<double> w13(n13 * e_count), m13(w13.size()), w2(n2 * e_count), m2(w2.size());
  // The route of each expert's GEMMs (tests/moe_quant_test.cpp: the library's
  // one rule, ops::quant_gemm_fused, on the expert's routed rows).
  std::vector<int64_t> rows(static_cast<size_t>(e_count), 0);
  for (int64_t i = 0; i < ti.numel(); ++i) ++rows[ti.data<int32_t>()[i]];
  const Isa isa = cpu_info().isa;
  // Per expert: its inputs quantized per token (int8, or int4 on the W4A8
  // route: ops::w4a8_route, the rows routed to it as M), its weights exact.
  std::vector<char> quant(static_cast<size_t>(e_count));
  for (int64_t e = 0; e < e_count; ++e)
    quant[e] = int8 || ops::w4a8_route(mq.format, h, c.moe.int4_route, isa, rows[e], "check");
  runtime::parallel_for(e_count, [&](int64_t e) {
    dequantize_exact(expert_matrix(f, c, inputs, 0, e), w13.data() + e * n13, m13.data() + e * n13);
    if (c.gated) {
      w13_to_halves(c.glu_rows, w13.data() + e * n13, inter, h);
      w13_to_halves(c.glu_rows, m13.data() + e * n13, inter, h);
    }
    dequantize_exact(expert_matrix(f, c, inputs, 1, e), w2.data() + e * n2, m2.data() + e * n2);
    if (quant[e] || isa == Isa::scalar || ops::quant_gemm_fused(isa, rows[e])) return;
    // The dequant route: the weights rounded once to bf16, bf16(f32(v·s)).
    for (auto [w, m, n] : {std::tuple{w13.data() + e * n13, m13.data() + e * n13, n13},
                           {w2.data() + e * n2, m2.data() + e * n2, n2}})
      for (size_t i = 0; i < n; ++i) {
        w[i] = runtime::bf16_to_f32(runtime::f32_to_bf16(static_cast<float>(w[i])));
        m[i] = std::fabs(w[i]);
      }
  });
  const double eps_h = runtime::fp32_sum_ulps(h) * kU;
  runtime::ReferenceGlu glu;
  glu.gated = c.gated;
  glu.act = c.moe.act;
  glu.clamped_swiglu = c.moe.clamped_swiglu;
  glu.alpha = c.moe.swiglu_alpha;
  glu.limit = c.moe.swiglu_limit;
  const runtime::ActQuantRule rule =
      asym ? runtime::ActQuantRule::asym : runtime::ActQuantRule::sym;
  Expected ex;
  ex.ref.assign(static_cast<size_t>(t * h), 0.0);
  ex.tol.assign(ex.ref.size(), 0.0);
  const double eps_out = (runtime::fp32_sum_ulps(std::max(inter, extras.shared_i)) +
                          runtime::fp32_sum_ulps(extras.sum_terms(k) + 1)) *
                         kU;
  runtime::parallel_for(t, [&](int64_t tok) {
    const uint16_t* xr = hidden.data<uint16_t>() + tok * h;
    // The token's row as bf16 values, and as the kernels quantize it.
    std::vector<double> xb(static_cast<size_t>(h)), xq(xb.size()), y(xb.size(), 0.0),
        abs_sum(xb.size(), 0.0), act_term(xb.size(), 0.0);
    for (int64_t i = 0; i < h; ++i) xb[i] = runtime::bf16_to_f32(xr[i]);
    {
      std::vector<uint8_t> q(static_cast<size_t>(h));
      float sx = 1;
      int32_t zx = 0;
      runtime::reference_act_quant_row(rule, xr, h, h, 1, 1, 128, q.data(), &sx, &zx);
      for (int64_t i = 0; i < h; ++i) xq[i] = double(int(q[i]) - zx) * sx;
    }
    std::vector<double> a(static_cast<size_t>(inter)), slack(a.size());
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = ti.data<int32_t>()[tok * k + j];
      const std::vector<double>& x = quant[e] ? xq : xb;
      const double scale = double(c.moe.routed_scaling_factor) * tw.data<float>()[tok * k + j];
      const double* wg = w13.data() + e * n13;
      const double* mg = m13.data() + e * n13;
      const float* b13 = extras.b13.empty() ? nullptr : extras.b13.data() + e * g13 * inter;
      for (int64_t i = 0; i < inter; ++i) {
        runtime::MoeActPoint p;
        if (!c.gated) {  // act(up): the sum in gate, an exact 1 in up (runtime/reference_moe.h)
          for (int64_t hh = 0; hh < h; ++hh) {
            p.gate += x[hh] * wg[i * h + hh];
            p.gate_abs += std::fabs(x[hh]) * mg[i * h + hh];
          }
          if (b13 != nullptr) p.gate += b13[i], p.gate_abs += std::fabs(b13[i]);
          p.up = 1;
        }
        for (int64_t hh = 0; hh < h && c.gated; ++hh) {
          const double tg = x[hh] * wg[i * h + hh], tu = x[hh] * wg[(inter + i) * h + hh];
          p.gate += tg, p.up += tu;
          p.gate_abs += std::fabs(x[hh]) * mg[i * h + hh];
          p.up_abs += std::fabs(x[hh]) * mg[(inter + i) * h + hh];
        }
        if (b13 != nullptr && c.gated) {  // added in f32 by the kernels' epilogue
          p.gate += b13[i], p.up += b13[inter + i];
          p.gate_abs += std::fabs(b13[i]), p.up_abs += std::fabs(b13[inter + i]);
        }
        p.act = runtime::reference_glu(glu, p.gate, p.up);
        p.act_bf16 = runtime::bf16_to_f32(runtime::f32_to_bf16(static_cast<float>(p.act)));
        a[i] = p.act_bf16;
        slack[i] = runtime::moe_act_slack(glu, p, eps_h);
      }
      // int8: the kernels quantize their bf16 row again, as the oracle does
      // here; where an element has slack its code may be one step off, and
      // every code and the scale if the scale-setting element has.
      double step = 0;
      bool row_shift = false;
      if (quant[e]) {
        std::vector<uint16_t> ab(static_cast<size_t>(inter));
        for (int64_t i = 0; i < inter; ++i) ab[i] = runtime::f32_to_bf16(static_cast<float>(a[i]));
        std::vector<uint8_t> q(static_cast<size_t>(inter));
        float sa = 1;
        int32_t za = 0;
        runtime::reference_act_quant_row(rule, ab.data(), inter, inter, 1, 1, 128, q.data(), &sa,
                                         &za);
        double amax = 0, amin = 0;
        for (int64_t i = 0; i < inter; ++i) {
          amax = std::max(amax, asym ? a[i] : std::fabs(a[i]));
          amin = std::min(amin, a[i]);
        }
        for (int64_t i = 0; i < inter; ++i) {
          if (slack[i] > 0)
            row_shift = row_shift || (asym ? a[i] + slack[i] >= amax || a[i] - slack[i] <= amin
                                           : std::fabs(a[i]) + slack[i] >= amax);
          a[i] = double(int(q[i]) - za) * sa;
          if (slack[i] > 0) slack[i] += sa;
        }
        step = sa;
      }
      const double* wd = w2.data() + e * n2;
      const double* md = m2.data() + e * n2;
      const double s = std::fabs(scale);
      for (int64_t hh = 0; hh < h; ++hh) {
        double acc = 0, mag = 0, term = 0, wabs = 0;
        for (int64_t i = 0; i < inter; ++i) {
          const double w = wd[hh * inter + i];
          acc += a[i] * w;
          mag += std::fabs(a[i]) * md[hh * inter + i];
          term += slack[i] * std::fabs(w);
          wabs += std::fabs(w);
        }
        if (row_shift) term = step * wabs + std::ldexp(mag, -7);
        if (extras.b2 != nullptr) {
          const double b = extras.b2[e * h + hh];
          acc += b, mag += std::fabs(b);
        }
        y[hh] += scale * acc;
        abs_sum[hh] += s * mag;
        act_term[hh] += s * term;
      }
    }
    // The bf16 shared expert on the bf16 row (never quantized: its GEMMs are
    // bf16), the bf16 oracle's own term.
    if (extras.w2s != nullptr) {
      runtime::ReferenceMoeArgs sa;
      sa.h = h;
      sa.glu = glu;
      sa.act_slack = [&](const runtime::MoeActPoint& p) {
        return runtime::moe_act_slack(glu, p, eps_h);
      };
      runtime::reference_moe_detail::expert(
          sa, xb, extras.shared_i, extras.w13s.data(), extras.w2s, nullptr, nullptr,
          extras.shared_weights != nullptr ? double(extras.shared_weights[tok]) : 1.0, y.data(),
          abs_sum.data(), act_term.data());
    }
    for (int64_t hh = 0; hh < h; ++hh) {
      const double ref = static_cast<float>(y[hh]);
      ex.ref[tok * h + hh] = ref;
      ex.tol[tok * h + hh] =
          runtime::moe_output_bound(out_dtype, abs_sum[hh], act_term[hh], eps_out, ref);
    }
  });
  ex.tolerance = fmt::format(
      "the bf16 experts' bound (bf16 out: 2⁻⁸·(|ref| + tol) + tol, fp32 sums of n terms at "
      "min(n+2, 6·√(n/3))·2⁻²⁴·Σ|terms|, H={}, I={}, top_k={}) on the exact {} weights{}{} "
      "(tests/moe_quant_test.cpp's oracle; a bound for every route)",
      h, inter, k, weight_format_name(mq.format),
      int8 ? ", x and the activation row quantized as the kernels do, + one code step where an "
             "activation has slack"
           : ", rounded to bf16 for the experts on the dequant route (ops::quant_gemm_fused "
             "on their routed rows); for int4 experts on the W4A8 route (ops::w4a8_route on "
             "their routed rows) x and the activation row quantized as the kernels do, + one "
             "code step where an activation has slack",
      is_int4(mq.format) ? ", int4 terms at (q + z + 32)·|s| (the fused decode kernel)" : "");
  return ex;
}

// Adds one call's comparison to the report.
void compare(CheckReport& rep, const std::string& value_name, const HostTensor& got,
             const Expected& e) {
  for (int64_t i = 0; i < got.numel(); ++i)
    if (rep.add(got.at(i), e.ref[i], e.tol[i])) {
      rep.worst_index = unflatten(i, got.shape);
      rep.worst_value = value_name;
    }
}

}  // namespace

CheckReport OperatorRunner::check(const TensorMap& outputs) const {
  if (!bound_) throw Error("OperatorRunner::check: bind() first");
  CheckReport rep;
  std::vector<std::string> refs, tols;
  for (const OperatorCall& c : prog_.calls) {
    const ir::Op& op = op_of(f_, c);
    auto in = [&](size_t i) -> const HostTensor& { return value(op.operands.at(i), outputs); };
    // A named per-head f32 operand's values, or null when absent.
    auto head_vector = [&](int id) -> const float* {
      return id >= 0 ? value(id, outputs).data<float>() : nullptr;
    };
    const HostTensor& got = value(op.result, outputs);
    Expected e;
    const char* ref = "";
    switch (c.kind) {
      case ir::OpKind::rope:
        e = rope_expected(c, in(0), in(1), in(2));
        ref = "runtime/reference_rope.h";
        break;
      case ir::OpKind::attention:
        e = attention_expected(c, in(0), in(1), in(2), head_vector(c.attention_operands.sinks),
                               head_vector(c.attention_operands.alibi_slopes));
        ref = "runtime/reference_attention.h";
        break;
      case ir::OpKind::decode_attention:
        e = decode_expected(c, in(0), in(1), in(2), in(3), in(4),
                            head_vector(c.attention_operands.sinks),
                            head_vector(c.attention_operands.alibi_slopes));
        ref = "runtime/reference_attention.h over the cache rows of the block table";
        break;
      default: {
        // I from the IR type (static: the moe rule), not the stored tensor,
        // whose last dim holds code bytes for MXFP4 (two codes each).
        const int64_t inter = f_.value(op.operands.at(2)).type.dims.at(2).value;
        const MoeExtras x =
            moe_extras(c, in(2).shape.at(0), inter,
                       [&](int id) -> const HostTensor& { return value(id, outputs); });
        if (c.moe_quant.quantized()) {
          e = moe_quant_expected(f_, c, *inputs_, in(0), in(3), in(4), x, got.dtype);
          ref = "runtime/reference_moe.h's oracle on the exact dequantized experts";
        } else {
          e = moe_expected(c, in(0), in(1), in(2), in(3), in(4), x, got.dtype);
          ref = "runtime/reference_moe.h";
        }
        break;
      }
    }
    const std::string& name = f_.value(op.result).name;
    compare(rep, "%" + name, got, e);
    refs.push_back(fmt::format("{} for %{}", ref, name));
    tols.push_back(prog_.calls.size() == 1
                       ? e.tolerance
                       : fmt::format("%{} ({}): {}", name, ir::name(op.kind), e.tolerance));
  }
  rep.reference = fmt::format("{}, in double{}", fmt::join(refs, ", "),
                              prog_.calls.size() > 1
                                  ? "; each call on the operands it read, so each op is held to "
                                    "its own bound"
                                  : "");
  rep.tolerance = fmt::format("{}", fmt::join(tols, "\n               "));
  return rep;
}

}  // namespace tilejit::tools
