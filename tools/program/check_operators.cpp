// Checking an operator program: one reference per call, on the operands that
// call read (OperatorRunner::check).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ir/printer.h"
#include "runtime/bf16.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_rope.h"
#include "runtime/thread_pool.h"
#include "tools/program/operator_runner.h"
#include "tools/program/reference_rows.h"

namespace tilejit::tools {
namespace {

constexpr double kU = runtime::kF32Unit;

double real_at(const HostTensor& t, int64_t i) {
  return t.dtype == DType::bf16 ? double(runtime::bf16_to_f32(t.data<uint16_t>()[i]))
                                : double(t.data<float>()[i]);
}

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
      for (int64_t i = 0; i < d; ++i) in[i] = real_at(q, base + i);
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

// Bound of tests/attention_test.cpp, 2⁻⁷·max|v| + 2⁻⁸·|ref| (P rounded to
// bf16 before P·v, the bf16 output, headroom for fp32 exp and sums), plus
// what fp32 score errors can do with inputs larger than the tests': a score
// off by δ moves each softmax weight by a factor e^{±2δ}, the output by
// ≤ 5δ·max|v| (δ small), with δ ≤ (D+2)·u·sm_scale·‖q_i‖₁·max|k| for query
// row i (softcap is 1-Lipschitz).
Expected attention_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& k,
                            const HostTensor& v) {
  const int64_t t = q.shape[0], hq = q.shape[1], d = q.shape[2];
  const int64_t s = k.shape[0], hkv = k.shape[1], dv = v.shape[2];
  const int64_t group = hq / hkv;
  const double scale = sm_scale_of(c, d);
  double max_v = 0, max_k = 0;
  for (int64_t i = 0; i < v.numel(); ++i) max_v = std::max(max_v, std::fabs(real_at(v, i)));
  for (int64_t i = 0; i < k.numel(); ++i) max_k = std::max(max_k, std::fabs(real_at(k, i)));
  Expected e;
  e.ref.assign(static_cast<size_t>(t * hq * dv), 0.0);
  e.tol.assign(e.ref.size(), 0.0);
  runtime::parallel_for(hq, [&](int64_t h) {
    const int64_t g = h / group;
    runtime::ReferenceAttentionHead r;
    r.tq = t;
    r.tk = s;
    r.d = d;
    r.dv = dv;
    r.sm_scale = scale;
    r.causal = c.attention.causal;
    r.window_left = c.attention.window_left;
    r.window_right = c.attention.window_right;
    r.softcap = c.attention.softcap;
    r.q_at = [&](int64_t i, int64_t col) { return real_at(q, (i * hq + h) * d + col); };
    r.k_at = [&](int64_t j, int64_t col) { return real_at(k, (j * hkv + g) * d + col); };
    r.v_at = [&](int64_t j, int64_t col) { return real_at(v, (j * hkv + g) * dv + col); };
    std::vector<double> delta(static_cast<size_t>(t));  // per query row: the score bound
    for (int64_t i = 0; i < t; ++i) {
      double q1 = 0;
      for (int64_t cc = 0; cc < d; ++cc) q1 += std::fabs(real_at(q, (i * hq + h) * d + cc));
      delta[i] = double(d + 2) * kU * scale * q1 * max_k;
    }
    r.out = [&](int64_t i, int64_t col, double val) {
      const int64_t at = (i * hq + h) * dv + col;
      e.ref[at] = val;
      e.tol[at] = runtime::attention_output_bound(max_v, val) + 5 * delta[i] * max_v;
    };
    runtime::reference_attention_head(r);
  });
  e.tolerance = "2⁻⁷·max|v| + 2⁻⁸·|ref| + 5·(D+2)·2⁻²⁴·sm_scale·‖q_i‖₁·max|k|·max|v| (fp32 scores)";
  return e;
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
                      DType out_dtype) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1];
  const int64_t e_count = w13.shape[0], inter = w2.shape[2], k = tw.shape[1];
  for (int64_t i = 0; i < ti.numel(); ++i)
    if (ti.data<int32_t>()[i] < 0 || ti.data<int32_t>()[i] >= e_count)
      throw Error(fmt::format("check: topk_ids[{}, {}] = {} is outside [0, {})", i / k, i % k,
                              ti.data<int32_t>()[i], e_count));
  runtime::ReferenceGlu glu;
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
    moe_token_args(a, hidden.data<uint16_t>(), w13.data<uint16_t>(), w2.data<uint16_t>(),
                   tw.data<float>(), ti.data<int32_t>(), tok, out.data() + tok * h);
    a.glu = glu;
    a.routed_scaling_factor = c.moe.routed_scaling_factor;
    a.abs_sum = abs_sum.data() + tok * h;
    a.act_term = act_term.data() + tok * h;
    a.act_slack = act_slack;
    runtime::reference_moe(a);
  });
  Expected e;
  e.ref.resize(out.size());
  e.tol.resize(out.size());
  const double eps_out = (runtime::fp32_sum_ulps(inter) + runtime::fp32_sum_ulps(k + 1)) * kU;
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

// Adds one call's comparison to the report.
void compare(CheckReport& rep, const std::string& value_name, const HostTensor& got,
             const Expected& e) {
  for (int64_t i = 0; i < got.numel(); ++i)
    if (rep.add(real_at(got, i), e.ref[i], e.tol[i])) {
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
    const HostTensor& got = value(op.result, outputs);
    Expected e;
    const char* ref = "";
    switch (c.kind) {
      case ir::OpKind::rope:
        e = rope_expected(c, in(0), in(1), in(2));
        ref = "runtime/reference_rope.h";
        break;
      case ir::OpKind::attention:
        e = attention_expected(c, in(0), in(1), in(2));
        ref = "runtime/reference_attention.h";
        break;
      default:
        e = moe_expected(c, in(0), in(1), in(2), in(3), in(4), got.dtype);
        ref = "runtime/reference_moe.h";
        break;
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
