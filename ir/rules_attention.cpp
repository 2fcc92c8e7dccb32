// attention %q, %k, %v: out[T, Hq, Dv] = softmax(q·kᵀ·sm_scale (+mask, softcap))·v
// with grouped-query heads (each of Hkv kv heads serves Hq/Hkv query heads).
// decode_attention %q, %k_cache, %v_cache, %block_table, %seq_lens: the same
// for one new token per sequence over a paged KV cache (tilejit::decode_attention).
// Both take the named operands sinks and alibi_slopes (f32 [Hq]: AttentionOptions).
#include "ir/op_rules.h"
#include "ops/attention_checks.h"

namespace tilejit::ir {

namespace {

// The JIT specialises on the head dim; these are the sizes the operators
// take (Limits, the public contract).
bool check_head_dim(RuleContext& c, size_t i, const char* dim_name) {
  if (!c.static_dim(i, -1, dim_name, "head dims must be static (the kernel specialises on them)")) {
    return false;
  }
  int64_t d = c.dim(i, -1).value;
  if (Limits::attention_head_dim_ok(d)) return true;
  return c.fail(cat("operand ", c.who(i), " has head dim ", dim_name, "=", d,
                    ": head dims must be even (multiples of ", Limits::head_dim_step, ") in [",
                    Limits::head_dim_step, ", ", Limits::max_head_dim, "]"));
}

// D (q's and k's last dim, the same) and Dv (v's last dim): static, allowed
// head sizes.
void check_head_dims(RuleContext& c, size_t q, size_t k, size_t v, const char* rule) {
  check_head_dim(c, q, "D");
  check_head_dim(c, v, "Dv");
  if (c.ok()) c.same_dim(k, -1, q, -1, "D", rule);
}

// Hq (dim qa of q) and Hkv (dim ka of k) not 0, Hq a multiple of Hkv
// (grouped-query heads): the rule of both attention ops.
bool check_heads(RuleContext& c, size_t q, int qa, size_t k, int ka, const char* rule) {
  c.nonzero_dim(q, qa, "Hq", rule);
  c.nonzero_dim(k, ka, "Hkv", rule);
  if (!c.ok()) return false;
  const Dim& hq = c.dim(q, qa);
  const Dim& hkv = c.dim(k, ka);
  if (hq == hkv) return true;
  if (!hq.is_static() || !hkv.is_static())
    return c.fail(
        cat("operand ", c.who(q), " has Hq=", hq.str(), " and ", c.who(k), " has Hkv=", hkv.str(),
            ": cannot prove Hq is a multiple of Hkv (make the head counts static or equal)"));
  if (hkv.value == 0 || hq.value % hkv.value != 0)
    return c.fail(cat("operand ", c.who(q), " has Hq=", hq.value, " but ", c.who(k), " has Hkv=",
                      hkv.value, ": Hq must be a multiple of Hkv (grouped-query heads)"));
  return true;
}

// AttentionOptions' per-head tensors, the named operands `sinks` and
// `alibi_slopes`: f32 [Hq], Hq = dim 1 of q (operand 0).
void check_head_vectors(RuleContext& c) {
  for (const char* role : {"sinks", "alibi_slopes"}) {
    const auto i = c.named(role);
    if (!i) continue;
    if (!c.rank(*i, 1, "[Hq]")) continue;
    c.dtype(*i, {DType::f32});
    c.row_major(*i);
    c.same_dim(*i, 0, 0, 1, "Hq", "one value per query head");
  }
}

}  // namespace

std::optional<TensorType> check_attention(RuleContext& c) {
  constexpr size_t q = 0, k = 1, v = 2;
  c.rank(q, 3, "[T, Hq, D]");
  c.rank(k, 3, "[S, Hkv, D]");
  c.rank(v, 3, "[S, Hkv, Dv]");
  if (!c.ok()) return std::nullopt;
  if (c.dtype(q, {DType::bf16, DType::f16, DType::f32})) {
    c.same_dtype(k, q, "q, k and v share one dtype");
    c.same_dtype(v, q, "q, k and v share one dtype");
  }
  for (size_t i : {q, k, v}) c.unit_stride_rows(i);
  if (!c.ok()) return std::nullopt;

  check_head_dims(c, q, k, v, "q and k share the head dim");
  c.same_dim(v, 0, k, 0, "S", "k and v hold the same keys");
  c.same_dim(v, 1, k, 1, "Hkv", "k and v have the same heads");
  if (!c.ok()) return std::nullopt;

  if (!check_heads(c, q, 1, k, 1, "tilejit::flash_attn_varlen takes 1 or more heads"))
    return std::nullopt;
  check_head_vectors(c);
  if (!c.ok()) return std::nullopt;
  return result(c.type(q).dtype, {c.dim(q, 0), c.dim(q, 1), c.dim(v, 2)});
}

std::optional<TensorType> check_decode_attention(RuleContext& c) {
  constexpr size_t q = 0, kc = 1, vc = 2, table = 3, lens = 4;
  c.rank(q, 3, "[B, Hq, D]");
  c.rank(kc, 4, "[num_blocks, block_size, Hkv, D]");
  c.rank(vc, 4, "[num_blocks, block_size, Hkv, Dv]");
  c.rank(table, 2, "[B, max_blocks_per_seq]");
  c.rank(lens, 1, "[B]");
  if (!c.ok()) return std::nullopt;
  c.dtype(q, {DType::bf16});
  if (c.dtype(kc, ops::attn::kKvCacheDtypes))
    c.same_dtype(vc, kc, "k_cache and v_cache share one dtype");
  c.dtype(table, {DType::i32});
  c.dtype(lens, {DType::i32});
  for (size_t i : {q, kc, vc}) c.unit_stride_rows(i);
  c.row_major(table);
  c.row_major(lens);
  if (!c.ok()) return std::nullopt;

  check_head_dims(c, q, kc, vc, "q and k_cache share the head dim");
  c.same_dim(vc, 0, kc, 0, "num_blocks", "k_cache and v_cache hold the same blocks");
  c.same_dim(vc, 1, kc, 1, "block_size", "k_cache and v_cache have one block size");
  c.same_dim(vc, 2, kc, 2, "Hkv", "k_cache and v_cache have the same heads");
  c.same_dim(table, 0, q, 0, "B", "one block-table row per sequence");
  c.same_dim(lens, 0, q, 0, "B", "one length per sequence");
  c.nonzero_dim(kc, 1, "block_size", "a paged cache holds 1 or more keys per block");
  if (!c.ok()) return std::nullopt;
  if (!check_heads(c, q, 1, kc, 2, "tilejit::decode_attention takes 1 or more heads"))
    return std::nullopt;
  // The cache scales are read only from an fp8 cache (KvCacheScales: a bf16
  // cache takes only the defaults).
  if (const DType kd = c.type(kc).dtype; kd != DType::f8e4m3 && kd != DType::f8e5m2)
    for (const char* n : {"k_scale", "v_scale"})
      if (c.attrs().has(n))
        c.fail(cat("attribute '", n, "' needs an fp8 (f8e4m3 or f8e5m2) cache; ", c.who(kc), " is ",
                   dtype_name(c.type(kc).dtype)));
  check_head_vectors(c);
  if (!c.ok()) return std::nullopt;
  return result(DType::bf16, {c.dim(q, 0), c.dim(q, 1), c.dim(vc, 3)});
}

}  // namespace tilejit::ir
