// tilejit::rms_norm, fused_add_rms_norm and act_and_mul: argument checks,
// then the LLVM row-wise kernel (llvm, avx512 and amx paths: LLVM emits
// AVX-512 code on such hosts) or the scalar reference, over chunks of rows
// on the thread pool. Semantics: docs/rowwise.md.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <vector>

#include "jit/registry.h"
#include "ops/element_access.h"
#include "ops/rowwise_desc.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/api_guard.h"
#include "runtime/isa.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_rowwise.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit {

namespace lb = codegen::llvm_backend;

namespace ops {

lb::RowwiseDesc norm_desc(const NormOptions& opt, bool residual, DType x, DType res,
                          std::optional<DType> weight, DType out, int64_t h) {
  lb::RowwiseDesc d;
  d.op = residual ? lb::RowOp::add_rms_norm : lb::RowOp::rms_norm;
  d.x = x;
  if (residual) d.res = res;
  d.out = out;
  d.h = h;
  d.weight = weight.has_value();
  if (weight) d.w = *weight;
  d.plus_one = opt.weight_plus_one;
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

// A [..., n] operand as rows of n: the leading dims must collapse into one
// row stride (any stride on a dim of size 1).
struct Rows {
  int64_t rows = 0, n = 0, stride = 0;
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
  r.rows = 1;
  for (size_t i = 0; i + 1 < rank; ++i)
    if (t.shape[i] == 0) {
      r.rows = 0;  // empty: nothing to check or to do
      r.stride = r.n;
      return r;
    }
  // The row stride: the innermost leading dim of size > 1 sets it, each outer
  // one of size > 1 must step over the ones inside it. Checked before the
  // product, which the view's checked extent then bounds (< 2^57).
  int64_t span = 0;  // elements the inner leading dims cover, once one is set
  for (size_t i = rank - 1; i-- > 0;) {
    if (t.shape[i] == 1) continue;
    if (span == 0) {
      r.stride = t.strides[i];
      if (r.stride < r.n)
        throw Error(
            fmt::format("{}: {} has strides {} with shape {}; allowed: rows of {} "
                        "elements that do not overlap (row stride >= {})",
                        op, arg, shape_str(t.strides), shape_str(t.shape), r.n, r.n));
      span = t.shape[i] * t.strides[i];
    } else {
      if (t.strides[i] != span)
        throw Error(
            fmt::format("{}: {} has strides {} with shape {}; allowed: leading dims "
                        "that collapse into rows (dim {} stride {})",
                        op, arg, shape_str(t.strides), shape_str(t.shape), i, span));
      span *= t.shape[i];
    }
    r.rows *= t.shape[i];
  }
  if (span == 0) r.stride = r.n;  // one row, or none
  return r;
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

void check_weight(const char* op, const TensorView* w, int64_t h) {
  if (w == nullptr) return;
  ops::check_view(op, "weight", *w, 1);
  ops::check_dtype(op, "weight", *w, {DType::f32, DType::bf16});
  if (w->shape[0] != h)
    throw Error(
        fmt::format("{}: weight has shape {}; allowed: [h] = [{}]", op, shape_str(w->shape), h));
  if (w->strides[0] != 1 && h > 1)
    throw Error(fmt::format("{}: weight has strides {}; allowed: contiguous ([1])", op,
                            shape_str(w->strides)));
}

void check_eps(const char* op, float eps) {
  if (!(eps >= std::numeric_limits<float>::denorm_min()) || !std::isfinite(eps))
    throw Error(fmt::format("{}: eps={}; allowed: finite, >= {} (the smallest positive float)", op,
                            eps, std::numeric_limits<float>::denorm_min()));
}

// The call, checked: the kernel descriptor and the operands as rows.
struct RowCall {
  lb::RowwiseDesc desc;
  Rows x, res, out;
  const TensorView* weight = nullptr;
  float eps = 0;
};

// Chunks of rows per task: a few per thread (the machine is shared, dynamic
// claiming evens it out), but no task under ~16 K elements, whose pool
// hand-off would cost more than its rows (a decode token is one task).
int64_t rows_per_task(const RowCall& c) {
  constexpr int64_t kMinElements = 16384;
  const int64_t tasks = std::max<int64_t>(1, 4 * runtime::num_threads());
  const int64_t by_threads = (c.x.rows + tasks - 1) / tasks;
  const int64_t by_work = (kMinElements + c.x.n - 1) / c.x.n;
  return std::max<int64_t>(1, std::max(by_threads, by_work));
}

std::string shapes_line(const RowCall& c) {
  return fmt::format("rows={} h={} x={} out={}{}", c.x.rows, c.desc.h, dtype_name(c.desc.x),
                     dtype_name(c.desc.out),
                     c.desc.op == lb::RowOp::add_rms_norm
                         ? fmt::format(" residual={}", dtype_name(c.desc.res))
                         : std::string());
}

const char* op_name(lb::RowOp op) {
  switch (op) {
    case lb::RowOp::rms_norm:
      return "rms_norm";
    case lb::RowOp::add_rms_norm:
      return "fused_add_rms_norm";
    case lb::RowOp::glu:
      return "act_and_mul";
  }
  return "?";
}

// Called only in a build with LLVM (the kernels are LLVM's).
void run_jit(const RowCall& c, Isa path, const TensorView& x, const TensorView* residual,
             const TensorView& out) {
  const auto fn = jit::get(c.desc).entry<lb::RowwiseFn>();
  const int64_t chunk = rows_per_task(c), chunks = (c.x.rows + chunk - 1) / chunk;
  ops::log_call(op_name(c.desc.op), path, [&] {
    return ops::CallLine{shapes_line(c),
                         fmt::format("kernel={} tasks={} chunk={}", c.desc.name(), chunks, chunk)};
  });
  const auto at = [](const TensorView& t, int64_t stride, int64_t r0) {
    return static_cast<char*>(t.data) + r0 * stride * (dtype_bits(t.dtype) / 8);
  };
  runtime::parallel_for(chunks, [&](int64_t i) {
    const int64_t r0 = i * chunk;
    lb::RowwiseArgs a{};
    a.x = at(x, c.x.stride, r0);
    a.residual = residual ? at(*residual, c.res.stride, r0) : nullptr;
    a.weight = c.weight ? c.weight->data : nullptr;
    a.out = at(out, c.out.stride, r0);
    a.rows = std::min(chunk, c.x.rows - r0);
    a.x_stride = c.x.stride;
    a.res_stride = c.res.stride;
    a.out_stride = c.out.stride;
    a.eps = c.eps;
    fn(&a);
  });
}

// The scalar path: the references, one row at a time.
void run_scalar(const RowCall& c, Isa path, const TensorView& x, const TensorView* residual,
                const TensorView& out, const runtime::ReferenceGlu& glu) {
  ops::log_call(op_name(c.desc.op), path, [&] {
    return ops::CallLine{shapes_line(c), "plan=reference"};
  });
  const lb::RowwiseDesc& d = c.desc;
  runtime::parallel_for(c.x.rows, [&](int64_t r) {
    const int64_t xb = r * c.x.stride, ob = r * c.out.stride;
    if (d.op == lb::RowOp::glu) {
      for (int64_t i = 0; i < d.h; ++i) {
        const int64_t g = d.interleaved ? 2 * i : i, u = d.interleaved ? 2 * i + 1 : d.h + i;
        ops::store_element(out, ob + i,
                           runtime::reference_glu(glu, ops::load_element(x, xb + g),
                                                  ops::load_element(x, xb + u)));
      }
      return;
    }
    std::vector<double> v(d.h);
    for (int64_t i = 0; i < d.h; ++i) {
      if (d.op == lb::RowOp::rms_norm) {
        v[i] = ops::load_element(x, xb + i);
        continue;
      }
      const int64_t rb = r * c.res.stride + i;
      const float sum = runtime::reference_residual_sum(
          static_cast<float>(ops::load_element(x, xb + i)),
          static_cast<float>(ops::load_element(*residual, rb)), [&](float s) {
            return d.res == DType::f32 ? s : runtime::bf16_to_f32(runtime::f32_to_bf16(s));
          });
      ops::store_element(*residual, rb, sum);
      v[i] = sum;
    }
    const double rstd = runtime::reference_rstd(v.data(), d.h, c.eps);
    for (int64_t i = 0; i < d.h; ++i) {
      double w = 1;
      if (c.weight) w = ops::load_element(*c.weight, i) + (d.plus_one ? 1.0 : 0.0);
      ops::store_element(out, ob + i, runtime::reference_norm_value(v[i], rstd, w));
    }
  });
}

void run(const RowCall& c, const TensorView& x, const TensorView* residual, const TensorView& out,
         const runtime::ReferenceGlu& glu = {}) {
  if (c.x.rows == 0) return;
  const Isa path = runtime::active_isa();
  if (path != Isa::scalar) {
    if (jit::family_built(jit::Family::rowwise)) return run_jit(c, path, x, residual, out);
    static std::once_flag logged;
    runtime::log_fallback_once(logged,
                               "rms_norm / act_and_mul: no row-wise kernel in this build (no "
                               "LLVM): reference");
  }
  run_scalar(c, path, x, residual, out, glu);
}

// The norms' checks; residual null for rms_norm.
RowCall check_norm(const char* op, const TensorView& x, const TensorView* residual,
                   const TensorView* weight, const TensorView& out, const NormOptions& opt) {
  RowCall c;
  c.x = rows_of(op, "x", x);
  const int64_t h = c.x.n;
  if (h < 1)
    throw Error(fmt::format("{}: x has shape {}; allowed: h >= 1", op, shape_str(x.shape)));
  c.out = rows_of(op, "out", out);
  check_same_rows(op, "out", out, "x", x, h);
  check_weight(op, weight, h);
  check_eps(op, opt.eps);
  if (weight == nullptr && opt.weight_plus_one)
    throw Error(fmt::format("{}: weight_plus_one=true without a weight; allowed: a weight", op));
  c.weight = weight;
  c.eps = opt.eps;
  c.desc =
      ops::norm_desc(opt, residual != nullptr, x.dtype, residual ? residual->dtype : DType::bf16,
                     weight ? std::optional(weight->dtype) : std::nullopt, out.dtype, h);
  if (residual) {
    c.res = rows_of(op, "residual", *residual);
    check_same_rows(op, "residual", *residual, "x", x, h);
    ops::check_output(op, "residual", *residual, {{"x", &x}, {"out", &out}, {"weight", weight}});
  }
  if (same_view(out, x))
    ops::check_output(op, "out", out, {{"weight", weight}});
  else
    ops::check_output(op, "out", out, {{"x", &x}, {"weight", weight}});
  return c;
}

}  // namespace

void rms_norm(const TensorView& x, const TensorView* weight, const TensorView& out,
              const NormOptions& opt) {
  runtime::api_guard("rms_norm", [&] {
    const RowCall c = check_norm("rms_norm", x, nullptr, weight, out, opt);
    run(c, x, nullptr, out);
  });
}

void fused_add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight,
                        const TensorView& out, const NormOptions& opt) {
  runtime::api_guard("fused_add_rms_norm", [&] {
    const RowCall c = check_norm("fused_add_rms_norm", x, &residual, weight, out, opt);
    run(c, x, &residual, out);
  });
}

void act_and_mul(const TensorView& x, const TensorView& out, const GluOptions& opt) {
  constexpr const char* kOp = "act_and_mul";
  runtime::api_guard(kOp, [&] {
    RowCall c;
    c.x = rows_of(kOp, "x", x);
    if (c.x.n < 2 || c.x.n % 2)
      throw Error(fmt::format("{}: x has shape {}; allowed: [..., 2·d] with d >= 1 (gate and up)",
                              kOp, shape_str(x.shape)));
    const int64_t d = c.x.n / 2;
    c.out = rows_of(kOp, "out", out);
    check_same_rows(kOp, "out", out, "x", x, d);
    ops::check_output(kOp, "out", out, {{"x", &x}});
    activation_name(opt.act);  // an Error naming the value when outside the enum
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
    run(c, x, nullptr, out, glu);
  });
}

}  // namespace tilejit
