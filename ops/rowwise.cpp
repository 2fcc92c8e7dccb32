// tilejit's row-wise ops (rms_norm, fused_add_rms_norm, layer_norm,
// fused_add_layer_norm, rms_norm_gated, act_and_mul): argument checks,
// then the LLVM row-wise kernel (llvm, avx512 and amx paths: LLVM emits
// AVX-512 code on such hosts) or the scalar reference, over chunks of rows
// on the thread pool. Semantics: docs/rowwise.md.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "ir/activation.h"
#include "jit/registry.h"
#include "ops/element_access.h"
#include "ops/rowwise_desc.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/api_guard.h"
#include "runtime/isa.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_rowwise.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit {

namespace lb = codegen::llvm_backend;

namespace ops {

lb::RowwiseDesc norm_desc(lb::RowOp op, const NormOptions& opt, DType x, DType res,
                          std::optional<DType> weight, DType out, int64_t h,
                          std::optional<DType> bias) {
  lb::RowwiseDesc d;
  d.op = op;
  d.x = x;
  if (lb::adds_residual(op)) d.res = res;
  d.out = out;
  d.h = h;
  d.weight = weight.has_value();
  if (weight) d.w = *weight;
  d.plus_one = opt.weight_plus_one;
  d.bias = bias.has_value();
  if (bias) d.b = *bias;
  return d;
}

lb::RowwiseDesc gated_norm_desc(const GatedNormOptions& opt, DType x, DType gate,
                                std::optional<DType> weight, DType out, int64_t h) {
  lb::RowwiseDesc d = norm_desc(lb::RowOp::gated_rms_norm, opt.norm, x, x, weight, out, h);
  d.g = gate;
  d.act = opt.act;
  d.gate_first = !opt.norm_before_gate;
  return d;
}

lb::RowwiseDesc glu_desc(const GluOptions& opt, DType x, DType out, int64_t d) {
  lb::RowwiseDesc k;
  k.op = lb::RowOp::glu;
  k.x = x;
  k.out = out;
  k.h = d;
  k.weight = false;
  k.glu = opt.clamped_swiglu ? codegen::Glu::clamped_swiglu : codegen::Glu::act_mul;
  k.act = opt.clamped_swiglu ? Activation::none : opt.act;
  k.alpha = opt.clamped_swiglu ? opt.swiglu_alpha : 0;
  k.limit = opt.clamped_swiglu ? opt.swiglu_limit : 0;
  k.interleaved = opt.rows == GluRows::interleaved;
  return k;
}

}  // namespace ops

namespace {

using ops::shape_str;

constexpr size_t kMaxRank = 4;

// A [..., n] operand: its leading dims (the rows, any strides) and n. Rank
// 1..4, f32 or bf16, the last dim contiguous.
struct Rows {
  std::vector<int64_t> shape, strides;  // leading dims ([] for rank 1: one row)
  int64_t n = 0;
};

Rows rows_of(const char* op, const char* arg, const TensorView& t) {
  const size_t rank = t.shape.size();
  if (rank < 1 || rank > kMaxRank)
    throw Error(fmt::format("{}: {} has rank {} (shape {}); allowed: 1 .. {} ([..., h])", op, arg,
                            rank, shape_str(t.shape), kMaxRank));
  ops::check_view(op, arg, t, rank);
  ops::check_dtype(op, arg, t, {DType::f32, DType::bf16});
  Rows r;
  r.n = t.shape.back();
  if (t.strides.back() != 1 && r.n > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: the last dim contiguous (stride 1)",
                            op, arg, shape_str(t.strides)));
  r.shape.assign(t.shape.begin(), t.shape.end() - 1);
  r.strides.assign(t.strides.begin(), t.strides.end() - 1);
  return r;
}

// The operands' leading dims, coalesced where every operand allows it
// (PyTorch's TensorIterator rule: dim i folds into dim i + 1 when each
// operand's stride[i] = stride[i + 1]·shape[i + 1]; dims of size 1 drop).
// The kernel walks the innermost dim's rows with each operand's stride; the
// outer dims (a Q/K-norm over q = qkv[:, :Hq·D].view(T, Hq, D): T outer of
// stride qkv_width, Hq inner of stride D) are walked here. Contiguous or
// padded 2-D rows coalesce into one dim: one kernel call per task.
struct RowPlan {
  std::vector<int64_t> shape;                 // at least one dim
  std::vector<std::vector<int64_t>> strides;  // [operand][dim]
  int64_t rows = 0;                           // the product (0: nothing to do)
};

RowPlan plan_rows(const std::vector<const Rows*>& ops_rows) {
  RowPlan p;
  const std::vector<int64_t>& shape = ops_rows.front()->shape;  // checked equal for all
  p.strides.resize(ops_rows.size());
  p.rows = 1;
  for (int64_t d : shape) p.rows *= d;  // out's elements (called after its checks), or 0
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    const bool fold = !p.shape.empty() && [&] {
      for (size_t k = 0; k < ops_rows.size(); ++k)
        if (p.strides[k].back() != ops_rows[k]->strides[i] * shape[i]) return false;
      return true;
    }();
    if (fold) {
      p.shape.back() *= shape[i];
      for (size_t k = 0; k < ops_rows.size(); ++k) p.strides[k].back() = ops_rows[k]->strides[i];
      continue;
    }
    p.shape.push_back(shape[i]);
    for (size_t k = 0; k < ops_rows.size(); ++k) p.strides[k].push_back(ops_rows[k]->strides[i]);
  }
  if (p.shape.empty()) {  // one row
    p.shape.push_back(1);
    for (auto& st : p.strides) st.push_back(0);
  }
  return p;
}

void check_same_rows(const char* op, const char* arg, const TensorView& t, const char* of,
                     const TensorView& x, int64_t n) {
  std::vector<int64_t> want(x.shape.begin(), x.shape.end() - 1);
  want.push_back(n);
  if (t.shape != want)
    throw Error(fmt::format("{}: {} has shape {}; allowed: {} (the rows of {})", op, arg,
                            shape_str(t.shape), shape_str(want), of));
}

// out may be x itself (in place: each chunk is read before it is written),
// otherwise it shares no byte with x.
bool same_view(const TensorView& a, const TensorView& b) {
  return a.data == b.data && a.dtype == b.dtype && a.shape == b.shape && a.strides == b.strides;
}

// A norm's weight or bias: [h] f32 or bf16, contiguous, or none.
void check_vector(const char* op, const char* arg, const TensorView* w, int64_t h) {
  if (w == nullptr) return;
  ops::check_view(op, arg, *w, 1);
  ops::check_dtype(op, arg, *w, {DType::f32, DType::bf16});
  if (w->shape[0] != h)
    throw Error(
        fmt::format("{}: {} has shape {}; allowed: [h] = [{}]", op, arg, shape_str(w->shape), h));
  if (w->strides[0] != 1 && h > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: contiguous ([1])", op, arg,
                            shape_str(w->strides)));
}

void check_eps(const char* op, float eps) {
  if (!(eps >= std::numeric_limits<float>::denorm_min()) || !std::isfinite(eps))
    throw Error(fmt::format("{}: eps={}; allowed: finite, >= {} (the smallest positive float)", op,
                            eps, std::numeric_limits<float>::denorm_min()));
}

// The call, checked: the public op's name, the kernel descriptor and the
// rows of x, residual (the add norms), out and gate (the gated norm), in
// that operand order.
struct RowCall {
  const char* op = "";
  lb::RowwiseDesc desc;
  RowPlan plan;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;
  float eps = 0;
};
enum Operand { kX = 0, kRes = 1, kOut = 2, kGate = 3 };

// Element offsets of flat row r in each operand (0 for one the op lacks).
std::array<int64_t, 4> row_offsets(const RowCall& c, int64_t r) {
  std::array<int64_t, 4> o{};
  const RowPlan& p = c.plan;
  for (size_t d = p.shape.size(); d-- > 0;) {
    const int64_t i = r % p.shape[d];
    r /= p.shape[d];
    for (size_t k = 0; k < p.strides.size(); ++k) o[k] += i * p.strides[k][d];
  }
  return o;
}

// Rows per task, within one run of the innermost dim: a few tasks per
// thread (the machine is shared, dynamic claiming evens it out), but none
// under 128 K elements moved (~13 µs of rms_norm on one core here): waking
// and joining a pool thread cost more than that on this VM (rms_norm at
// T 16, H 4096 took 13.9 µs on 2 threads in 4 tasks against 6.6 µs on one).
int64_t rows_per_task(const RowCall& c, int64_t n) {
  constexpr int64_t kMinElements = 131072;
  const int64_t tasks = std::max<int64_t>(1, 4 * runtime::num_threads());
  const int64_t by_threads = (c.plan.rows + tasks - 1) / tasks;
  const int64_t by_work = (kMinElements + n - 1) / n;
  return std::clamp<int64_t>(std::max(by_threads, by_work), 1, c.plan.shape.back());
}

std::string shapes_line(const RowCall& c) {
  const lb::RowwiseDesc& d = c.desc;
  std::string s =
      fmt::format("rows={} h={} x={} out={}", c.plan.rows, d.h, dtype_name(d.x), dtype_name(d.out));
  if (lb::adds_residual(d.op)) s += fmt::format(" residual={}", dtype_name(d.res));
  if (d.op == lb::RowOp::gated_rms_norm) s += fmt::format(" gate={}", dtype_name(d.g));
  return s;
}

// Called only in a build with LLVM (the kernels are LLVM's).
void run_jit(const RowCall& c, Isa path, const TensorView& x, const TensorView* residual,
             const TensorView& out, const TensorView* gate) {
  const auto fn = jit::get(c.desc).entry<lb::RowwiseFn>();
  // Tasks: chunks of the innermost dim's rows, for each index of the outer dims.
  const int64_t inner = c.plan.shape.back(), outer = c.plan.rows / inner;
  const int64_t chunk = rows_per_task(c, c.desc.op == lb::RowOp::glu ? 3 * c.desc.h : c.desc.h);
  const int64_t per_outer = (inner + chunk - 1) / chunk;
  ops::log_call(c.op, path, [&] {
    return ops::CallLine{shapes_line(c), fmt::format("kernel={} tasks={} chunk={}", c.desc.name(),
                                                     outer * per_outer, chunk)};
  });
  const auto at = [](const TensorView& t, int64_t offset) {
    return static_cast<char*>(t.data) + offset * (dtype_bits(t.dtype) / 8);
  };
  const auto& st = c.plan.strides;
  runtime::parallel_for(outer * per_outer, [&](int64_t i) {
    const int64_t first = (i % per_outer) * chunk;
    const auto off = row_offsets(c, (i / per_outer) * inner + first);
    lb::RowwiseArgs a{};
    a.x = at(x, off[kX]);
    a.residual = residual ? at(*residual, off[kRes]) : nullptr;
    a.weight = c.weight ? c.weight->data : nullptr;
    a.bias = c.bias ? c.bias->data : nullptr;
    a.gate = gate ? at(*gate, off[kGate]) : nullptr;
    a.gate_stride = st[kGate].back();
    a.out = at(out, off[kOut]);
    a.rows = std::min(chunk, inner - first);
    a.x_stride = st[kX].back();
    a.res_stride = st[kRes].back();
    a.out_stride = st[kOut].back();
    a.eps = c.eps;
    fn(&a);
  });
}

// The scalar path: the references, one row at a time.
void run_scalar(const RowCall& c, Isa path, const TensorView& x, const TensorView* residual,
                const TensorView& out, const TensorView* gate, const runtime::ReferenceGlu& glu) {
  ops::log_call(c.op, path, [&] { return ops::CallLine{shapes_line(c), "plan=reference"}; });
  const lb::RowwiseDesc& d = c.desc;
  runtime::parallel_for(c.plan.rows, [&](int64_t r) {
    const auto off = row_offsets(c, r);
    const int64_t xb = off[kX], ob = off[kOut];
    if (d.op == lb::RowOp::glu) {
      for (int64_t i = 0; i < d.h; ++i) {
        const int64_t g = d.interleaved ? 2 * i : i, u = d.interleaved ? 2 * i + 1 : d.h + i;
        ops::store_element(out, ob + i,
                           runtime::reference_glu(glu, ops::load_element(x, xb + g),
                                                  ops::load_element(x, xb + u)));
      }
      return;
    }
    const auto act_gate = [&](int64_t i) -> double {
      return runtime::reference_gate(d.act, ops::load_element(*gate, off[kGate] + i));
    };
    std::vector<double> v(d.h);
    for (int64_t i = 0; i < d.h; ++i) {
      if (!lb::adds_residual(d.op)) {
        v[i] = ops::load_element(x, xb + i);
        if (d.gate_first)
          v[i] =
              runtime::reference_gated_value(d.act, v[i], ops::load_element(*gate, off[kGate] + i));
        continue;
      }
      const int64_t rb = off[kRes] + i;
      const float sum = runtime::reference_residual_sum(
          static_cast<float>(ops::load_element(x, xb + i)),
          static_cast<float>(ops::load_element(*residual, rb)), [&](float s) {
            return d.res == DType::f32 ? s : runtime::bf16_to_f32(runtime::f32_to_bf16(s));
          });
      ops::store_element(*residual, rb, sum);
      v[i] = sum;
    }
    const auto weight = [&](int64_t i) {
      return c.weight ? ops::load_element(*c.weight, i) + (d.plus_one ? 1.0 : 0.0) : 1.0;
    };
    if (lb::centres_rows(d.op)) {
      const runtime::ReferenceMoments m = runtime::reference_moments(v.data(), d.h, c.eps);
      for (int64_t i = 0; i < d.h; ++i)
        ops::store_element(out, ob + i,
                           runtime::reference_layer_norm_value(
                               v[i], m, weight(i), c.bias ? ops::load_element(*c.bias, i) : 0.0));
      return;
    }
    const double rstd = runtime::reference_rstd(v.data(), d.h, c.eps);
    const bool gate_after = d.op == lb::RowOp::gated_rms_norm && !d.gate_first;
    for (int64_t i = 0; i < d.h; ++i)
      ops::store_element(
          out, ob + i,
          runtime::reference_norm_value(v[i], rstd, weight(i)) * (gate_after ? act_gate(i) : 1.0));
  });
}

void run(const RowCall& c, const TensorView& x, const TensorView* residual, const TensorView& out,
         const TensorView* gate = nullptr, const runtime::ReferenceGlu& glu = {}) {
  if (c.plan.rows == 0) return;
  const Isa path = runtime::active_isa();
  if (path != Isa::scalar) {
    if (jit::family_built(jit::Family::rowwise)) return run_jit(c, path, x, residual, out, gate);
    static std::once_flag logged;
    runtime::log_fallback_once(logged,
                               "the row-wise ops (norms, act_and_mul): no row-wise kernel in this "
                               "build (no LLVM): reference");
  }
  run_scalar(c, path, x, residual, out, gate, glu);
}

// A norm's operands: residual for the add norms, bias for the layer norms,
// gate for the gated norm (null where the op has none).
struct NormOperands {
  const TensorView* residual = nullptr;
  const TensorView* weight = nullptr;
  const TensorView* bias = nullptr;
  const TensorView* gate = nullptr;
};

// The norms' checks, then the kernel descriptor `desc_of(h)` makes.
template <class DescOf>
RowCall check_norm(const char* op, const TensorView& x, const NormOperands& o,
                   const TensorView& out, const NormOptions& opt, DescOf desc_of) {
  RowCall c;
  c.op = op;
  const Rows xr = rows_of(op, "x", x);
  const int64_t h = xr.n;
  if (h < 1)
    throw Error(fmt::format("{}: x has shape {}; allowed: h >= 1", op, shape_str(x.shape)));
  const Rows outr = rows_of(op, "out", out);
  check_same_rows(op, "out", out, "x", x, h);
  check_vector(op, "weight", o.weight, h);
  check_vector(op, "bias", o.bias, h);
  check_eps(op, opt.eps);
  if (o.weight == nullptr && opt.weight_plus_one)
    throw Error(fmt::format("{}: weight_plus_one=true without a weight; allowed: a weight", op));
  c.weight = o.weight;
  c.bias = o.bias;
  c.eps = opt.eps;
  c.desc = desc_of(h);
  // Written: the residual and out; read only: x, the gate, the weight and
  // the bias (which may share memory with each other).
  Rows resr, gater;
  if (o.residual) {
    resr = rows_of(op, "residual", *o.residual);
    check_same_rows(op, "residual", *o.residual, "x", x, h);
    ops::check_output(op, "residual", *o.residual,
                      {{"x", &x}, {"out", &out}, {"weight", o.weight}, {"bias", o.bias}});
  }
  if (o.gate) {
    gater = rows_of(op, "gate", *o.gate);
    check_same_rows(op, "gate", *o.gate, "x", x, h);
  }
  if (same_view(out, x))
    ops::check_output(op, "out", out, {{"weight", o.weight}, {"bias", o.bias}, {"gate", o.gate}});
  else
    ops::check_output(op, "out", out,
                      {{"x", &x}, {"weight", o.weight}, {"bias", o.bias}, {"gate", o.gate}});
  // After out's checks: a writable out bounds the rows' product (< 2^56).
  c.plan = plan_rows({&xr, o.residual ? &resr : &xr, &outr, o.gate ? &gater : &xr});
  return c;
}

std::optional<DType> dtype_of(const TensorView* t) {
  return t ? std::optional(t->dtype) : std::nullopt;
}

// rms_norm and the layer norms (a residual for the add forms).
void plain_norm(const char* op, lb::RowOp kind, const TensorView& x, const TensorView* residual,
                const TensorView* weight, const TensorView* bias, const TensorView& out,
                const NormOptions& opt) {
  NormOperands o;
  o.residual = residual;
  o.weight = weight;
  o.bias = bias;
  const RowCall c = check_norm(op, x, o, out, opt, [&](int64_t h) {
    return ops::norm_desc(kind, opt, x.dtype, residual ? residual->dtype : DType::bf16,
                          dtype_of(weight), out.dtype, h, dtype_of(bias));
  });
  run(c, x, residual, out);
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView* weight, const TensorView& out,
              const NormOptions& opt) {
  runtime::api_guard("rms_norm", [&] {
    plain_norm("rms_norm", lb::RowOp::rms_norm, x, nullptr, weight, nullptr, out, opt);
  });
}

void fused_add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight,
                        const TensorView& out, const NormOptions& opt) {
  runtime::api_guard("fused_add_rms_norm", [&] {
    plain_norm("fused_add_rms_norm", lb::RowOp::add_rms_norm, x, &residual, weight, nullptr, out,
               opt);
  });
}

void layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias,
                const TensorView& out, const NormOptions& opt) {
  runtime::api_guard("layer_norm", [&] {
    plain_norm("layer_norm", lb::RowOp::layer_norm, x, nullptr, weight, bias, out, opt);
  });
}

void fused_add_layer_norm(const TensorView& x, const TensorView& residual, const TensorView* weight,
                          const TensorView* bias, const TensorView& out, const NormOptions& opt) {
  runtime::api_guard("fused_add_layer_norm", [&] {
    plain_norm("fused_add_layer_norm", lb::RowOp::add_layer_norm, x, &residual, weight, bias, out,
               opt);
  });
}

void rms_norm_gated(const TensorView& x, const TensorView& gate, const TensorView* weight,
                    const TensorView& out, const GatedNormOptions& opt) {
  constexpr const char* kOp = "rms_norm_gated";
  runtime::api_guard(kOp, [&] {
    ir::check_activation(kOp, opt.act);
    NormOperands o;
    o.weight = weight;
    o.gate = &gate;
    const RowCall c = check_norm(kOp, x, o, out, opt.norm, [&](int64_t h) {
      return ops::gated_norm_desc(opt, x.dtype, gate.dtype, dtype_of(weight), out.dtype, h);
    });
    run(c, x, nullptr, out, &gate);
  });
}

void act_and_mul(const TensorView& x, const TensorView& out, const GluOptions& opt) {
  constexpr const char* kOp = "act_and_mul";
  runtime::api_guard(kOp, [&] {
    RowCall c;
    c.op = kOp;
    const Rows xr = rows_of(kOp, "x", x);
    if (xr.n < 2 || xr.n % 2)
      throw Error(fmt::format("{}: x has shape {}; allowed: [..., 2·d] with d >= 1 (gate and up)",
                              kOp, shape_str(x.shape)));
    const int64_t d = xr.n / 2;
    const Rows outr = rows_of(kOp, "out", out);
    check_same_rows(kOp, "out", out, "x", x, d);
    ops::check_output(kOp, "out", out, {{"x", &x}});
    // After out's checks: a writable out bounds the rows' product (< 2^56).
    c.plan = plan_rows({&xr, &xr, &outr, &xr});
    if (!opt.clamped_swiglu) ir::check_activation(kOp, opt.act);  // else act is unused
    if (opt.rows != GluRows::halves && opt.rows != GluRows::interleaved)
      throw Error(fmt::format("{}: rows=GluRows({}); allowed: halves, interleaved", kOp,
                              static_cast<int>(opt.rows)));
    runtime::ReferenceGlu glu;
    glu.act = opt.act;
    glu.clamped_swiglu = opt.clamped_swiglu;
    if (opt.clamped_swiglu) {
      ops::check_finite(kOp, "swiglu_alpha", opt.swiglu_alpha);
      ops::check_finite(kOp, "swiglu_limit", opt.swiglu_limit);
      if (!(opt.swiglu_limit > 0))
        throw Error(fmt::format("{}: swiglu_limit={}; allowed: > 0", kOp, opt.swiglu_limit));
      glu.alpha = opt.swiglu_alpha;
      glu.limit = opt.swiglu_limit;
    }
    c.desc = ops::glu_desc(opt, x.dtype, out.dtype, d);
    run(c, x, nullptr, out, nullptr, glu);
  });
}

}  // namespace tilejit
