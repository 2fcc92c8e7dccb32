#include "ops/attention_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <string>

#include "ir/attention_rules.h"
#include "ops/attention_engine.h"
#include "ops/tensor_checks.h"
#include "runtime/bf16.h"
#include "runtime/int_math.h"
#include "runtime/quant_formats.h"

namespace tilejit::ops::attn {

void check_head_dim(const char* op, const char* what, int64_t d) {
  if (!Limits::attention_head_dim_ok(d))
    throw Error(fmt::format("{}: {}={}; allowed: an even size in [{}, {}] (Limits::head_dim_step)",
                            op, what, d, Limits::head_dim_step, kMaxHeadDim));
}

void check_head_counts(const char* op, int64_t hq, const char* of_q, int64_t hkv,
                       const char* of_kv) {
  if (hq < 1 || hq > Limits::max_heads || hkv < 1 || hkv > Limits::max_heads || hq % hkv != 0)
    throw Error(fmt::format(
        "{}: Hq={} ({}) and Hkv={} ({}); allowed: Hq a multiple of Hkv, both in 1 .. {}", op, hq,
        of_q, hkv, of_kv, Limits::max_heads));
}

void check_attention_out(const char* op, const TensorView& out, const AttentionOptions& opt,
                         std::initializer_list<ops::NamedView> inputs) {
  ops::check_output(op, "out", out, inputs);
  ops::check_output(
      op, "out", out,
      {{"sinks", ops::opt_view(opt.sinks)}, {"alibi_slopes", ops::opt_view(opt.alibi_slopes)}});
}

void check_bf16_rows(const char* op, const char* arg, const TensorView& t, size_t rank) {
  check_view(op, arg, t, rank);
  check_dtype(op, arg, t, {DType::bf16});
  if (t.strides[rank - 1] != 1 && t.shape[rank - 1] > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: innermost stride 1", op, arg,
                            shape_str(t.strides)));
}

namespace {
// "bf16, f8e4m3, f8e5m2" (kKvCacheDtypes).
std::string cache_dtype_names() {
  std::string allowed;
  for (DType d : kKvCacheDtypes)
    allowed += (allowed.empty() ? "" : ", ") + std::string(dtype_name(d));
  return allowed;
}
}  // namespace

void check_cache_rows(const char* op, const char* arg, const TensorView& t) {
  check_view(op, arg, t, 4);
  if (std::find(std::begin(kKvCacheDtypes), std::end(kKvCacheDtypes), t.dtype) ==
      std::end(kKvCacheDtypes))
    throw Error(fmt::format("{}: {} has dtype {}; allowed: {}", op, arg, dtype_name(t.dtype),
                            cache_dtype_names()));
  if (t.strides[3] != 1 && t.shape[3] > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: innermost stride 1", op, arg,
                            shape_str(t.strides)));
}

KvScales check_kv_scales(const char* op, const char* where, const TensorView& k_cache,
                         const TensorView& v_cache, const KvCacheScales& s, int64_t hkv) {
  if (k_cache.dtype != v_cache.dtype)
    throw Error(fmt::format("{}: k_cache is {}, v_cache is {}; allowed: the same dtype (one of {})",
                            op, dtype_name(k_cache.dtype), dtype_name(v_cache.dtype),
                            cache_dtype_names()));
  KvScales r;
  r.code = k_cache.dtype;
  r.fp8 = runtime::fp8_format_of(k_cache.dtype) != nullptr;
  auto side = [&](const char* name, float scale, const char* heads_name,
                  const std::optional<TensorView>& heads, std::vector<float>& out) {
    if (!r.fp8) {
      if (scale != 1 || heads)
        throw Error(fmt::format(
            "{}: {}.{}{}; allowed: the defaults (1, no head scales) with a "
            "bf16 cache (scales apply to fp8 caches)",
            op, where, heads ? heads_name : name, heads ? " given" : fmt::format("={}", scale)));
      out.assign(static_cast<size_t>(hkv), 1.0f);
      return;
    }
    if (const char* allowed = ir::kv_scale_refusal(scale))
      throw Error(fmt::format("{}: {}.{}={}; allowed: {}", op, where, name, scale, allowed));
    out.assign(static_cast<size_t>(hkv), scale);
    if (!heads) return;
    const std::string arg = fmt::format("{}.{}", where, heads_name);
    check_view(op, arg.c_str(), *heads, 1);
    check_dtype(op, arg.c_str(), *heads, {DType::f32});
    if (heads->shape[0] != hkv)
      throw Error(fmt::format("{}: {} has shape {}; allowed: [Hkv] = [{}]", op, arg,
                              shape_str(heads->shape), hkv));
    const auto* p = static_cast<const float*>(heads->data);
    for (int64_t h = 0; h < hkv; ++h) {
      const float x = p[h * heads->strides[0]];
      if (const char* allowed = ir::kv_scale_refusal(x))
        throw Error(fmt::format("{}: {}[{}]={}; allowed: {}", op, arg, h, x, allowed));
      out[static_cast<size_t>(h)] = x;
    }
  };
  side("k_scale", s.k_scale, "k_head_scales", s.k_head_scales, r.k);
  side("v_scale", s.v_scale, "v_head_scales", s.v_head_scales, r.v);
  return r;
}

namespace {
// Checks one per-head vector; a bf16 one is copied into `copy` (f32, dense)
// and the view replaced by it.
void check_head_vector(const char* op, const char* arg, std::optional<TensorView>& t, int64_t hq,
                       std::vector<float>& copy) {
  if (!t) return;
  check_view(op, arg, *t, 1);
  check_dtype(op, arg, *t, {DType::f32, DType::bf16});
  if (t->shape[0] != hq)
    throw Error(
        fmt::format("{}: {} has shape {}; allowed: [Hq] = [{}]", op, arg, shape_str(t->shape), hq));
  if (t->dtype == DType::f32) return;
  copy.resize(static_cast<size_t>(hq));
  const auto* src = static_cast<const uint16_t*>(t->data);
  for (int64_t h = 0; h < hq; ++h) copy[h] = runtime::bf16_to_f32(src[h * t->strides[0]]);
  t = TensorView(copy.data(), DType::f32, {hq});
}
}  // namespace

void HeadVectors::check_and_widen(const char* op, int64_t hq) {
  check_head_vector(op, "sinks", options.sinks, hq, sinks_);
  check_head_vector(op, "alibi_slopes", options.alibi_slopes, hq, slopes_);
}

void check_options(const char* op, const AttentionOptions& opt) {
  if (const char* allowed = ir::window_refusal(opt.window_left))
    throw Error(fmt::format("{}: window_left={}; allowed: {}", op, opt.window_left, allowed));
  if (const char* allowed = ir::window_refusal(opt.window_right))
    throw Error(fmt::format("{}: window_right={}; allowed: {}", op, opt.window_right, allowed));
  if (const char* allowed = ir::softcap_refusal(opt.softcap))
    throw Error(fmt::format("{}: softcap={}; allowed: {}", op, opt.softcap, allowed));
  if (opt.sm_scale)
    if (const char* allowed = ir::sm_scale_refusal(*opt.sm_scale))
      throw Error(fmt::format("{}: sm_scale={}; allowed: {}", op, *opt.sm_scale, allowed));
}

void check_cache(const char* op, const char* arg, const TensorView& c, int64_t hkv,
                 int64_t head_dim, const TensorView& k_cache) {
  check_cache_rows(op, arg, c);
  if (c.shape[0] != k_cache.shape[0] || c.shape[1] != k_cache.shape[1] || c.shape[2] != hkv ||
      c.shape[3] != head_dim)
    throw Error(fmt::format(
        "{}: {} has shape {}; allowed: [num_blocks, block_size, Hkv, {}] = "
        "[{}, {}, {}, {}]",
        op, arg, shape_str(c.shape), head_dim, k_cache.shape[0], k_cache.shape[1], hkv, head_dim));
}

void check_block_ids(const char* op, const TensorView& block_table, int64_t b, int64_t keys,
                     int64_t block_size, int64_t num_blocks) {
  const auto* table = static_cast<const int32_t*>(block_table.data);
  for (int64_t i = 0; i < runtime::ceil_div(keys, block_size); ++i) {
    const int64_t blk = table[b * block_table.strides[0] + i * block_table.strides[1]];
    if (blk < 0 || blk >= num_blocks)
      throw Error(fmt::format("{}: block_table[{}, {}]={}; allowed: [0, num_blocks) = [0, {})", op,
                              b, i, blk, num_blocks));
  }
}

std::vector<int64_t> read_cu_seqlens(const char* op, const char* arg, const TensorView& t,
                                     int64_t total) {
  check_view(op, arg, t, 1);
  check_dtype(op, arg, t, {DType::i32});
  if (t.shape[0] < 1)
    throw Error(fmt::format("{}: {} has shape {}; allowed: [B+1] with B >= 0", op, arg,
                            shape_str(t.shape)));
  const auto* p = static_cast<const int32_t*>(t.data);
  std::vector<int64_t> v(static_cast<size_t>(t.shape[0]));
  for (int64_t i = 0; i < t.shape[0]; ++i) v[i] = p[i * t.strides[0]];
  if (v[0] != 0) throw Error(fmt::format("{}: {}[0]={}; allowed: 0", op, arg, v[0]));
  for (size_t i = 1; i < v.size(); ++i)
    if (v[i] < v[i - 1])
      throw Error(fmt::format("{}: {}[{}]={} < {}[{}]={}; allowed: non-decreasing prefix sums", op,
                              arg, i, v[i], arg, i - 1, v[i - 1]));
  if (v.back() != total)
    throw Error(fmt::format("{}: {}[{}]={}; allowed: the token count {}", op, arg, v.size() - 1,
                            v.back(), total));
  return v;
}

PagedDims check_paged_attention(const char* op, const char* rows, const TensorView& q,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const TensorView& out) {
  check_bf16_rows(op, "q", q, 3);
  check_cache_rows(op, "k_cache", k_cache);
  check_cache_rows(op, "v_cache", v_cache);
  check_bf16_rows(op, "out", out, 3);
  PagedDims p{q.shape[0],       q.shape[1],       q.shape[2],      v_cache.shape[3],
              k_cache.shape[2], k_cache.shape[0], k_cache.shape[1]};
  check_head_dim(op, "D (q.shape[2])", p.d);
  check_head_dim(op, "Dv (v_cache.shape[3])", p.dv);
  check_head_counts(op, p.hq, "q", p.hkv, "k_cache");
  if (p.block_size < 1)
    throw Error(
        fmt::format("{}: block_size={} (k_cache.shape[1]); allowed: >= 1", op, p.block_size));
  check_cache(op, "k_cache", k_cache, p.hkv, p.d, k_cache);
  check_cache(op, "v_cache", v_cache, p.hkv, p.dv, k_cache);
  if (out.shape != std::vector<int64_t>{p.rows, p.hq, p.dv})
    throw Error(fmt::format("{}: out has shape {}; allowed: [{}, Hq, Dv] = [{}, {}, {}]", op,
                            shape_str(out.shape), rows, p.rows, p.hq, p.dv));
  return p;
}

}  // namespace tilejit::ops::attn
