// tilejit::rope: argument checks, then the LLVM kernel (llvm, avx512 and amx
// paths: LLVM emits AVX-512 code on such hosts) or the scalar reference, over
// chunks of tokens on the thread pool. Semantics: docs/rope.md.
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "jit/registry.h"
#include "ops/element_access.h"
#include "ops/rope_desc.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/isa.h"
#include "runtime/reference_rope.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

#include "runtime/api_guard.h"

namespace tilejit {

using ops::shape_str;

namespace ops {

codegen::llvm_backend::RopeDesc rope_desc(const RopeOptions& opt, DType dtype, DType cache_dtype,
                                          int64_t d, int64_t hq, int64_t hk, DType pos_dtype) {
  codegen::llvm_backend::RopeDesc r;
  r.neox = opt.style == RopeStyle::neox;
  r.dtype = dtype;
  r.cache_dtype = cache_dtype;
  r.d = d;
  r.rotary_dim = opt.rotary_dim == 0 ? d : opt.rotary_dim;
  r.hq = hq;
  r.hk = hk;
  r.ndim = opt.ndim;
  r.mrope_section = opt.mrope_section;
  r.mrope_interleaved = opt.mrope_interleaved;
  r.pos_dtype = pos_dtype;
  return r;
}

void check_rope_head_size(const char* op, const char* arg, int64_t d, const std::string& shape) {
  if (d < 2 || d % 2)
    throw Error(fmt::format("{}: {} has head size D={}{}; allowed: even, >= 2", op, arg, d, shape));
  if (d > Limits::max_head_dim)
    throw Error(fmt::format("{}: {} has head size D={}{}; allowed: <= {}", op, arg, d, shape,
                            Limits::max_head_dim));
}

void check_rotary_dim(const char* op, int64_t rotary_dim, int64_t d, int64_t ndim) {
  if (rotary_dim < 2 || rotary_dim > d || rotary_dim % (2 * ndim))
    throw Error(
        fmt::format("{}: rotary_dim={} with D={}, ndim={}; allowed: a multiple of 2·ndim "
                    "in [2, D] (0: D)",
                    op, rotary_dim, d, ndim));
}

}  // namespace ops

namespace {

constexpr const char* kOp = "rope";

// Everything the checks establish: the kernel descriptor and the views.
struct RopeCall {
  codegen::llvm_backend::RopeDesc desc;
  int64_t t = 0, width = 0, max_position = 0;
  int64_t pos_stream_stride = 0, pos_token_stride = 0;
};

void check_heads(const char* arg, const TensorView& x) {
  ops::check_view(kOp, arg, x, 3);
  ops::check_dtype(kOp, arg, x, {DType::f32, DType::bf16});
  ops::check_row_major_rows(kOp, arg, x);
}

RopeCall check(const TensorView& q, const TensorView* k, const TensorView& positions,
               const TensorView& cache, const RopeOptions& opt) {
  RopeCall c;
  auto& d = c.desc;
  check_heads("q", q);
  c.t = q.shape[0];
  d.hq = q.shape[1];
  d.d = q.shape[2];
  d.dtype = q.dtype;
  ops::check_rope_head_size(kOp, "q", d.d, " (shape " + shape_str(q.shape) + ")");
  ops::check_count(kOp, "Hq (q.shape[1])", d.hq, 1, Limits::max_heads);
  if (k != nullptr) {
    check_heads("k", *k);
    if (k->dtype != q.dtype)
      throw Error(fmt::format("{}: k.dtype={}; allowed: q.dtype={}", kOp, dtype_name(k->dtype),
                              dtype_name(q.dtype)));
    if (k->shape[0] != c.t || k->shape[2] != d.d || k->shape[1] < 1)
      throw Error(fmt::format("{}: k has shape {}; allowed: [T, Hk >= 1, D] = [{}, ·, {}]", kOp,
                              shape_str(k->shape), c.t, d.d));
    d.hk = k->shape[1];
    ops::check_count(kOp, "Hk (k.shape[1])", d.hk, 1, Limits::max_heads);
  }
  if (opt.style != RopeStyle::neox && opt.style != RopeStyle::gptj)
    throw Error(fmt::format("{}: style=RopeStyle({}) is not a RopeStyle; allowed: neox, gptj", kOp,
                            static_cast<int>(opt.style)));
  d = ops::rope_desc(opt, q.dtype, cache.dtype, d.d, d.hq, d.hk, positions.dtype);
  // Bounded first, so 2·ndim below cannot overflow.
  ops::check_count(kOp, "ndim", opt.ndim, 1, d.d / 2);
  ops::check_rotary_dim(kOp, d.rotary_dim, d.d, d.ndim);
  if (!d.mrope_section.empty()) {
    if (d.ndim > 1)
      throw Error(
          fmt::format("{}: mrope_section with ndim={}; allowed: one of the two", kOp, d.ndim));
    // Summed only while every size is in (0, rotary_dim/2], so it cannot overflow.
    int64_t sum = 0;
    bool positive = true;
    for (int64_t v : d.mrope_section) {
      positive &= v > 0 && v <= d.rotary_dim / 2;
      if (positive) sum += v;
    }
    if (!positive || sum != d.rotary_dim / 2)
      throw Error(
          fmt::format("{}: mrope_section={}; allowed: positive sizes summing to "
                      "rotary_dim/2 = {}",
                      kOp, shape_str(d.mrope_section), d.rotary_dim / 2));
  }
  if (d.mrope_interleaved && d.mrope_section.size() != 3)
    throw Error(
        fmt::format("{}: mrope_interleaved=true with mrope_section={}; allowed: 3 sections "
                    "[t, h, w] summing to rotary_dim/2 = {}",
                    kOp, shape_str(d.mrope_section), d.rotary_dim / 2));

  const int64_t streams = d.streams();
  ops::check_index_dtype(kOp, "positions", positions);
  if (streams == 1 && positions.shape.size() != 1 && positions.shape.size() != 2)
    throw Error(fmt::format("{}: positions has rank {}; allowed: [T] = [{}] or [1, {}]", kOp,
                            positions.shape.size(), c.t, c.t));
  if (positions.shape.size() == 1 && streams == 1) {
    ops::check_view(kOp, "positions", positions, 1);
    c.pos_token_stride = positions.strides[0];
  } else {
    ops::check_view(kOp, "positions", positions, 2);
    c.pos_stream_stride = positions.strides[0];
    c.pos_token_stride = positions.strides[1];
  }
  const int64_t pos_t = positions.shape.back();
  const int64_t pos_s = positions.shape.size() == 2 ? positions.shape[0] : 1;
  if (pos_s != streams || pos_t != c.t)
    throw Error(streams == 1
                    ? fmt::format("{}: positions has shape {}; allowed: [T] = [{}] or [1, {}]", kOp,
                                  shape_str(positions.shape), c.t, c.t)
                    : fmt::format("{}: positions has shape {}; allowed: [streams, T] = [{}, {}] "
                                  "(streams: ndim or the mrope sections)",
                                  kOp, shape_str(positions.shape), streams, c.t));

  c.width = d.rotary_dim / d.ndim;
  ops::check_view(kOp, "cos_sin_cache", cache, 2);
  ops::check_dtype(kOp, "cos_sin_cache", cache, {DType::f32, DType::bf16});
  ops::check_row_major_rows(kOp, "cos_sin_cache", cache);
  if (cache.shape[1] != c.width)
    throw Error(
        fmt::format("{}: cos_sin_cache has shape {}; allowed: [max_position, {}] (cos "
                    "half, sin half of rotary_dim/ndim)",
                    kOp, shape_str(cache.shape), c.width));
  c.max_position = cache.shape[0];
  // In place: q and k are rotated while positions and the cache are read, so
  // each of q and k is writable and shares memory with none of the others
  // (q passed again as k would rotate twice).
  ops::check_output(kOp, "q", q, {{"k", k}, {"positions", &positions}, {"cos_sin_cache", &cache}});
  if (k != nullptr)
    ops::check_output(kOp, "k", *k, {{"positions", &positions}, {"cos_sin_cache", &cache}});

  // Every position before any read of the cache. int64 values are compared
  // whole, so 2^32 + 5 is out of range, not position 5.
  for (int64_t s = 0; s < streams; ++s)
    for (int64_t t = 0; t < c.t; ++t) {
      const int64_t v = ops::index_at(positions, s * c.pos_stream_stride + t * c.pos_token_stride);
      if (v < 0 || v >= c.max_position)
        throw Error(fmt::format("{}: positions[{}][{}]={}; allowed: [0, max_position = {})", kOp, s,
                                t, v, c.max_position));
    }
  return c;
}

// The TILEJIT_VERBOSE line of a call on `path` that runs `runs` (a callable:
// the kernel or plan).
template <class Runs>
void log_rope(const RopeCall& c, Isa path, Runs&& runs) {
  ops::log_call(kOp, path, [&] {
    return ops::CallLine{fmt::format("T={} Hq={} Hk={} D={} dtype={}", c.t, c.desc.hq, c.desc.hk,
                                     c.desc.d, dtype_name(c.desc.dtype)),
                         runs()};
  });
}

// The scalar path: the reference, one head row at a time.
void rope_scalar(const RopeCall& c, const TensorView& q, const TensorView* k,
                 const TensorView& positions, const TensorView& cache) {
  runtime::ReferenceRope r;
  r.neox = c.desc.neox;
  r.rotary_dim = c.desc.rotary_dim;
  r.ndim = c.desc.ndim;
  r.mrope_section = c.desc.mrope_section;
  r.mrope_interleaved = c.desc.mrope_interleaved;
  runtime::parallel_for(c.t, [&](int64_t t) {
    const auto row = [&](int64_t s, int64_t col) {
      const int64_t p = ops::index_at(positions, s * c.pos_stream_stride + t * c.pos_token_stride);
      return ops::load_element(cache, p * cache.strides[0] + col);
    };
    std::vector<double> in(c.desc.d), out(c.desc.d);
    for (const TensorView* x : {&q, k}) {
      if (x == nullptr) continue;
      for (int64_t h = 0; h < x->shape[1]; ++h) {
        const int64_t base = t * x->strides[0] + h * x->strides[1];
        for (int64_t i = 0; i < c.desc.d; ++i) in[i] = ops::load_element(*x, base + i);
        runtime::reference_rope_head(r, c.desc.d, in.data(), out.data(), row);
        for (int64_t i = 0; i < c.desc.rotary_dim; ++i) ops::store_element(*x, base + i, out[i]);
      }
    }
  });
}

// Called only in a build with LLVM (the kernels are LLVM's).
void rope_jit(const RopeCall& c, Isa path, const TensorView& q, const TensorView* k,
              const TensorView& positions, const TensorView& cache) {
  namespace lb = codegen::llvm_backend;
  const auto fn = jit::get(c.desc).entry<lb::RopeFn>();
  const int64_t qb = dtype_bits(q.dtype) / 8, pb = dtype_bits(positions.dtype) / 8;
  // A few chunks per thread: the machine is shared, dynamic claiming evens out.
  const int64_t tasks = std::min<int64_t>(c.t, 4 * runtime::num_threads());
  const int64_t chunk = (c.t + tasks - 1) / tasks, chunks = (c.t + chunk - 1) / chunk;
  log_rope(c, path, [&] {
    return fmt::format("kernel={} tasks={} chunk={}", c.desc.name(), chunks, chunk);
  });
  runtime::parallel_for(chunks, [&](int64_t i) {
    const int64_t t0 = i * chunk;
    lb::RopeArgs a{};
    a.q = static_cast<char*>(q.data) + t0 * q.strides[0] * qb;
    a.k = k ? static_cast<char*>(k->data) + t0 * k->strides[0] * qb : nullptr;
    a.positions = static_cast<const char*>(positions.data) + t0 * c.pos_token_stride * pb;
    a.cache = cache.data;
    a.tokens = std::min(chunk, c.t - t0);
    a.q_token_stride = q.strides[0];
    a.q_head_stride = q.strides[1];
    a.k_token_stride = k ? k->strides[0] : 0;
    a.k_head_stride = k ? k->strides[1] : 0;
    a.pos_stream_stride = c.pos_stream_stride;
    a.pos_token_stride = c.pos_token_stride;
    a.cache_row_stride = cache.strides[0];
    fn(&a);
  });
}

}  // namespace

void rope(const TensorView& q, const TensorView* k, const TensorView& positions,
          const TensorView& cos_sin_cache, const RopeOptions& opt) {
  runtime::api_guard("rope", [&] {
    const RopeCall c = check(q, k, positions, cos_sin_cache, opt);
    if (c.t == 0) return;
    const Isa path = runtime::active_isa();
    if (path != Isa::scalar) {
      if (jit::family_built(jit::Family::rope))
        return rope_jit(c, path, q, k, positions, cos_sin_cache);
      static std::once_flag logged;
      runtime::log_fallback_once(logged, "rope: no RoPE kernel in this build (no LLVM): reference");
    }
    log_rope(c, path, [] { return std::string("plan=reference"); });
    rope_scalar(c, q, k, positions, cos_sin_cache);
  });
}

}  // namespace tilejit
