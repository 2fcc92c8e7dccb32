// Argument checks of the attention operators: each failure is a tilejit::Error
// naming the operator, the argument, the value and what is allowed.
#pragma once

#include <cstdint>
#include <vector>

#include "ir/attention_rules.h"
#include "ops/tensor_checks.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops::attn {

// Head sizes the engine specialises for: Limits::attention_head_dim_ok (even, in
// [2, Limits::max_head_dim]), the rule the IR verifier calls too.
void check_head_dim(const char* op, const char* what, int64_t d);
// Hq and Hkv in [1, Limits::max_heads], Hq a multiple of Hkv. `of_q` and
// `of_kv` name the tensors the counts come from.
void check_head_counts(const char* op, int64_t hq, const char* of_q, int64_t hkv,
                       const char* of_kv);
// out [·, Hq, Dv] of an attention call: writable, and sharing no memory with
// q, the keys and values, or any index / option tensor it reads.
void check_attention_out(const char* op, const TensorView& out, const AttentionOptions& opt,
                         std::initializer_list<ops::NamedView> inputs);
// A bf16 tensor of the given rank with innermost stride 1.
void check_bf16_rows(const char* op, const char* arg, const TensorView& t, size_t rank);
// The dtypes a paged KV cache may have (ir/attention_rules.h: the one list).
using ir::kKvCacheDtypes;
// A paged cache [num_blocks, block_size, Hkv, head_dim] view: rank 4, a
// kKvCacheDtypes dtype, innermost stride 1.
void check_cache_rows(const char* op, const char* arg, const TensorView& t);
// The scales of a call, resolved per kv head (k[h], v[h]); fp8 when the
// caches are f8e4m3 or f8e5m2 (code: the caches' dtype). Checks: k_cache and v_cache of one dtype;
// every scale finite and > 0; head-scale tensors f32 [Hkv]; a bf16 cache only with the default
// scales. `where` prefixes the argument names ("opt.kv_scales" or "scales").
struct KvScales {
  bool fp8 = false;
  DType code = DType::bf16;
  std::vector<float> k, v;  // [Hkv]
};
KvScales check_kv_scales(const char* op, const char* where, const TensorView& k_cache,
                         const TensorView& v_cache, const KvCacheScales& s, int64_t hkv);
// The caller's AttentionOptions with the per-head vectors (sinks,
// alibi_slopes) as the kernels read them: f32. A bf16 vector (GPT-OSS's
// checkpoints ship bf16 sinks) is replaced by a dense f32 copy, exact.
// An entry point binds `const AttentionOptions& opt = hv.options` first and
// calls check_and_widen once Hq is known, so nothing reads a bf16 vector.
class HeadVectors {
 public:
  explicit HeadVectors(const AttentionOptions& o) : options(o) {}
  // Each present vector: [Hq], f32 or bf16 (an Error naming it otherwise).
  void check_and_widen(const char* op, int64_t hq);
  AttentionOptions options;

 private:
  std::vector<float> sinks_, slopes_;
};
// window_left / window_right ≥ −1, softcap ≥ 0, sm_scale finite.
void check_options(const char* op, const AttentionOptions& opt);
// A paged cache [num_blocks, block_size, Hkv, head_dim] bf16 whose first two
// dims match k_cache's.
void check_cache(const char* op, const char* arg, const TensorView& c, int64_t hkv,
                 int64_t head_dim, const TensorView& k_cache);
// q [rows, Hq, D], the paged k_cache / v_cache and out [rows, Hq, Dv] of
// decode and extend: dtypes, head dims, Hq a multiple of Hkv, block_size
// >= 1, matching caches and out shape. `rows` names q's first dim
// in messages ("B" or "T").
struct PagedDims {
  int64_t rows, hq, d, dv, hkv, num_blocks, block_size;
};
PagedDims check_paged_attention(const char* op, const char* rows, const TensorView& q,
                                const TensorView& k_cache, const TensorView& v_cache,
                                const TensorView& out);
// Row b of block_table (int32 [B, max_blocks]): the block ids of its first
// `keys` keys (ceil(keys / block_size) entries) are in [0, num_blocks).
void check_block_ids(const char* op, const TensorView& block_table, int64_t b, int64_t keys,
                     int64_t block_size, int64_t num_blocks);
// int32 [B+1] prefix sums from 0 to total; returns them.
std::vector<int64_t> read_cu_seqlens(const char* op, const char* arg, const TensorView& t,
                                     int64_t total);

}  // namespace tilejit::ops::attn
