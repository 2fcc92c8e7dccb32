// tilejit::store_kv: scatters new K/V rows into the paged cache by slot.
// A negative slot skips its token (vLLM's padding convention); a slot at or
// past num_blocks·block_size is an Error, raised before anything is written;
// of tokens sharing a slot, the last one's row is stored.
// slot_mapping is int32 or int64 (vLLM passes int64); both are read as int64,
// so a 64-bit slot that would wrap in 32 bits is still rejected, not truncated.
// An fp8 cache (both caches f8e4m3 or both f8e5m2, KvCacheScales) stores
// fp8(x / scale): runtime::f32_to_fp8 (nearest, ties to even; saturating to
// the largest finite value, ±Inf too; NaN -> 0x7F) of the f32 quotient: the kv_quant kernel on the
// JIT paths (Xbyak on avx512 / amx, LLVM on llvm; codegen/kv_quant_desc.h), that function itself on
// the scalar path.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kv_quant_desc.h"
#include "jit/registry.h"
#include "ops/attention_checks.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "runtime/quant_formats.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"

namespace tilejit {

using ops::shape_str;

namespace {

void check_rows_and_cache(const char* rows_arg, const TensorView& rows, const char* cache_arg,
                          const TensorView& cache, int64_t t, int64_t hkv) {
  constexpr const char* op = "store_kv";
  ops::attn::check_bf16_rows(op, rows_arg, rows, 3);
  ops::attn::check_cache_rows(op, cache_arg, cache);
  // T is slot_mapping's length, Hkv k's head count: the message names both
  // sources, since either side of a mismatch may be the wrong one.
  if (rows.shape[0] != t || rows.shape[1] != hkv)
    throw Error(fmt::format(
        "{}: {} has shape {}; allowed: [T, Hkv, ·] = [{}, {}, ·] (T = slot_mapping's length "
        "{}, Hkv = k's heads {})",
        op, rows_arg, shape_str(rows.shape), t, hkv, t, hkv));
  if (cache.shape[2] != hkv || cache.shape[3] != rows.shape[2])
    throw Error(fmt::format("{}: {} has shape {}; allowed: [num_blocks, block_size, {}, {}]", op,
                            cache_arg, shape_str(cache.shape), hkv, rows.shape[2]));
}

// `to_fp8`: the kv_quant kernel of the call's path (null on the scalar path).
void copy_rows(const TensorView& rows, const TensorView& cache, int64_t t, int64_t slot,
               const std::vector<float>& scales, codegen::KvQuantFn to_fp8) {
  const int64_t bs = cache.shape[1], hkv = rows.shape[1], d = rows.shape[2];
  if (const runtime::Fp8Format* f = runtime::fp8_format_of(cache.dtype)) {
    const auto* src = static_cast<const uint16_t*>(rows.data) + t * rows.strides[0];
    auto* dst = static_cast<uint8_t*>(cache.data) + (slot / bs) * cache.strides[0] +
                (slot % bs) * cache.strides[1];
    if (to_fp8 != nullptr) {
      const codegen::KvQuantArgs a{src, rows.strides[1], dst, cache.strides[2], scales.data(), hkv,
                                   d};
      to_fp8(&a);
      return;
    }
    for (int64_t h = 0; h < hkv; ++h) {
      const float s = scales[static_cast<size_t>(h)];
      const uint16_t* x = src + h * rows.strides[1];
      uint8_t* y = dst + h * cache.strides[2];
      for (int64_t e = 0; e < d; ++e)
        y[e] = runtime::f32_to_fp8(*f, runtime::bf16_to_f32(x[e]) / s);
    }
    return;
  }
  const auto* src = static_cast<const uint16_t*>(rows.data) + t * rows.strides[0];
  auto* dst = static_cast<uint16_t*>(cache.data) + (slot / bs) * cache.strides[0] +
              (slot % bs) * cache.strides[1];
  for (int64_t h = 0; h < hkv; ++h)
    std::memcpy(dst + h * cache.strides[2], src + h * rows.strides[1], static_cast<size_t>(d) * 2);
}

// The MLA form (DeepSeek's latent cache; sglang's MLA pool passes
// v_buffer = k_buffer[..., :Dv] and value = key[..., :Dv]): v_cache is the
// first Dv columns of k_cache and v the first Dv columns of k, so writing k
// writes v as well, and the decode reads V from those bytes.
bool mla_cache_form(const TensorView& k_cache, const TensorView& v_cache) {
  return v_cache.data == k_cache.data && v_cache.strides == k_cache.strides &&
         v_cache.dtype == k_cache.dtype && v_cache.shape[3] <= k_cache.shape[3];
}
bool mla_form(const TensorView& k, const TensorView& v, const TensorView& k_cache,
              const TensorView& v_cache) {
  return mla_cache_form(k_cache, v_cache) && v.data == k.data && v.strides == k.strides &&
         v.shape[2] <= k.shape[2];
}

// Marks every token but the last of each slot as skipped (slot −1). Slots
// strictly increasing past the skipped ones (an engine's usual allocation)
// cannot repeat: one pass, no sort.
void keep_last_writer(std::vector<int64_t>& slots) {
  int64_t last = -1;
  bool increasing = true;
  for (int64_t s : slots) {
    if (s < 0) continue;
    increasing = increasing && s > last;
    last = s;
  }
  if (increasing) return;
  std::vector<std::pair<int64_t, int64_t>> by_slot;  // (slot, token)
  by_slot.reserve(slots.size());
  for (size_t i = 0; i < slots.size(); ++i)
    if (slots[i] >= 0) by_slot.emplace_back(slots[i], static_cast<int64_t>(i));
  std::sort(by_slot.begin(), by_slot.end());
  for (size_t j = 0; j + 1 < by_slot.size(); ++j)
    if (by_slot[j].first == by_slot[j + 1].first) slots[by_slot[j].second] = -1;
}

}  // namespace

void store_kv(const TensorView& k, const TensorView& v, const TensorView& k_cache,
              const TensorView& v_cache, const TensorView& slot_mapping,
              const KvCacheScales& scales) {
  runtime::api_guard("store_kv", [&] {
    constexpr const char* op = "store_kv";
    ops::check_view(op, "slot_mapping", slot_mapping, 1);
    ops::check_index_dtype(op, "slot_mapping", slot_mapping);
    const int64_t t = slot_mapping.shape[0];
    ops::check_view(op, "k", k, 3);
    const int64_t hkv = k.shape[1];
    check_rows_and_cache("k", k, "k_cache", k_cache, t, hkv);
    check_rows_and_cache("v", v, "v_cache", v_cache, t, hkv);
    if (v_cache.shape[0] != k_cache.shape[0] || v_cache.shape[1] != k_cache.shape[1])
      throw Error(
          fmt::format("{}: v_cache has shape {}; allowed: [num_blocks, block_size] of "
                      "k_cache = [{}, {}, ...]",
                      op, shape_str(v_cache.shape), k_cache.shape[0], k_cache.shape[1]));
    const ops::attn::KvScales kvs =
        ops::attn::check_kv_scales(op, "scales", k_cache, v_cache, scales, hkv);
    // Both caches are written while k, v and slot_mapping are read: no two of
    // them may share memory (k_cache == v_cache would keep only V), and neither
    // cache may overlap itself (a slot stride of 0 puts every token in one row).
    // The one exception is the MLA form, where only k_cache is written.
    const bool mla = mla_form(k, v, k_cache, v_cache);
    // The cache side of the MLA form without its row side (v a copy of k's
    // first Dv columns, e.g. after gathering both): writing v_cache would
    // write k_cache's columns a second time, from another tensor.
    if (!mla && mla_cache_form(k_cache, v_cache) && v_cache.shape[3] < k_cache.shape[3] &&
        v_cache.shape[2] > 0 && v_cache.shape[3] > 0)
      throw Error(fmt::format(
          "{}: v_cache is the first {} columns of k_cache (the MLA form), but v (data {}, strides "
          "{}) is not the first {} columns of k (data {}, strides {}); allowed: in the MLA form, v "
          "a view of k's first Dv columns (only k is written), or v_cache in memory that k_cache "
          "does not use",
          op, v_cache.shape[3], v.data, shape_str(v.strides), v.shape[2], k.data,
          shape_str(k.strides)));
    if (mla && kvs.k != kvs.v)
      throw Error(
          fmt::format("{}: v_cache is the first {} columns of k_cache (MLA) with scales that "
                      "differ between K and V; allowed: the same k and v scales (the V columns "
                      "are stored once, with K's)",
                      op, v_cache.shape[3]));
    ops::check_output(op, "k_cache", k_cache,
                      {{"k", &k},
                       {"v", &v},
                       {"slot_mapping", &slot_mapping},
                       {"v_cache", mla ? nullptr : &v_cache}});
    if (!mla)
      ops::check_output(op, "v_cache", v_cache,
                        {{"k", &k}, {"v", &v}, {"slot_mapping", &slot_mapping}});
    // Fits: an output cache spans its slots in memory (check_writable).
    const int64_t capacity = k_cache.shape[0] * k_cache.shape[1];
    std::vector<int64_t> slots(static_cast<size_t>(t));
    for (int64_t i = 0; i < t; ++i) {
      slots[i] = ops::index_at(slot_mapping, i * slot_mapping.strides[0]);
      if (slots[i] >= capacity)
        throw Error(
            fmt::format("{}: slot_mapping[{}]={}; allowed: < num_blocks·block_size = {} "
                        "(negative: skip the token)",
                        op, i, slots[i], capacity));
    }
    // Two tokens naming one slot (sglang maps padding tokens to a dummy slot;
    // a speculative branch may rewrite one): the later token's row is stored,
    // on every thread count. Without this the tokens' writers raced and the
    // stored row (or, for fp8, a mix of both rows' bytes) depended on timing.
    keep_last_writer(slots);
    // A cache with Hkv = 0 or a head size of 0 holds nothing to write, and its
    // data pointer may be null or unaligned (check_view does not look at the
    // pointer of an empty view): no address is formed from it.
    auto holds = [](const TensorView& c) { return c.shape[2] > 0 && c.shape[3] > 0; };
    const bool write_k = holds(k_cache), write_v = !mla && holds(v_cache);
    // bf16: row copies (memcpy) on every path; fp8: the kv_quant kernel on
    // the JIT paths, the reference conversion on the scalar path.
    const Isa isa = runtime::active_isa();
    const codegen::KvQuantDesc qd{isa == Isa::llvm ? Isa::llvm : Isa::avx512,
                                  kvs.fp8 ? kvs.code : DType::f8e4m3};
    const bool kernel = kvs.fp8 && isa != Isa::scalar;
    const codegen::KvQuantFn to_fp8 = kernel ? jit::get(qd).entry<codegen::KvQuantFn>() : nullptr;
    ops::log_call(op, isa, [&] {  // the line is made only when TILEJIT_VERBOSE asks
      return ops::CallLine{
          fmt::format("T={} Hkv={} D={} Dv={} bs={} cache={}{}", t, hkv, k.shape[2], v.shape[2],
                      k_cache.shape[1], dtype_name(k_cache.dtype), mla ? " mla" : ""),
          kernel    ? "plan=" + qd.name()
          : kvs.fp8 ? fmt::format("plan=c++_to_{}", kvs.code == DType::f8e5m2 ? "e5m2" : "e4m3")
                    : "plan=c++_copy"};
    });
    runtime::parallel_for(t, [&](int64_t i) {
      if (slots[i] < 0) return;
      if (write_k) copy_rows(k, k_cache, i, slots[i], kvs.k, to_fp8);
      if (write_v) copy_rows(v, v_cache, i, slots[i], kvs.v, to_fp8);
    });
  });
}

}  // namespace tilejit
