// attention %q, %k, %v: out[T, Hq, Dv] = softmax(q·kᵀ·sm_scale (+mask, softcap))·v
// with grouped-query heads (each of Hkv kv heads serves Hq/Hkv query heads).
#include "ir/op_rules.h"

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

  check_head_dim(c, q, "D");
  check_head_dim(c, v, "Dv");
  if (c.ok()) c.same_dim(k, 2, q, 2, "D", "q and k share the head dim");
  c.same_dim(v, 0, k, 0, "S", "k and v hold the same keys");
  c.same_dim(v, 1, k, 1, "Hkv", "k and v have the same heads");
  if (!c.ok()) return std::nullopt;

  c.nonzero_dim(q, 1, "Hq", "tilejit::flash_attn_varlen takes 1 or more heads");
  c.nonzero_dim(k, 1, "Hkv", "tilejit::flash_attn_varlen takes 1 or more heads");
  if (!c.ok()) return std::nullopt;
  const Dim& hq = c.dim(q, 1);
  const Dim& hkv = c.dim(k, 1);
  if (hq != hkv) {
    if (!hq.is_static() || !hkv.is_static()) {
      c.fail(cat("operand ", c.who(q), " has Hq=", hq.str(), " and ", c.who(k),
                 " has Hkv=", hkv.str(),
                 ": cannot prove Hq is a multiple of Hkv (make the head counts static or equal)"));
      return std::nullopt;
    }
    if (hkv.value == 0 || hq.value % hkv.value != 0) {
      c.fail(cat("operand ", c.who(q), " has Hq=", hq.value, " but ", c.who(k),
                 " has Hkv=", hkv.value, ": Hq must be a multiple of Hkv (grouped-query heads)"));
      return std::nullopt;
    }
  }
  return result(c.type(q).dtype, {c.dim(q, 0), hq, c.dim(v, 2)});
}

}  // namespace tilejit::ir
