// rope %q, %positions, %cos_sin: rotates the first rotary_dim dims of each head
// of q[T, H, D] by the angles of its token's position. cos_sin is the cache
// [P, rotary_dim] holding rotary_dim/2 cosines then rotary_dim/2 sines per
// position (the vLLM/sgl-kernel cos_sin_cache layout).
#include "ir/op_rules.h"

namespace tilejit::ir {

std::optional<TensorType> check_rope(RuleContext& c) {
  constexpr size_t q = 0, pos = 1, cs = 2;
  c.rank(q, 3, "[T, H, D]");
  c.rank(pos, 1, "[T]");
  c.rank(cs, 2, "[P, rotary_dim]");
  if (!c.ok()) return std::nullopt;
  c.dtype(q, {DType::bf16, DType::f16, DType::f32});
  c.dtype(pos, {DType::i32, DType::i64});  // PyTorch engines pass int64
  c.dtype(cs, {DType::f32});
  for (size_t i : {q, pos, cs}) c.unit_stride_rows(i);
  if (!c.ok()) return std::nullopt;
  c.same_dim(pos, 0, q, 0, "T", "one position per token");
  c.static_dim(q, 2, "D", "rope needs a static head dim");
  c.nonzero_dim(q, 1, "H", "tilejit::rope takes 1 or more heads");
  c.nonzero_dim(q, 2, "D", "tilejit::rope takes a non-empty head");
  if (!c.ok()) return std::nullopt;

  int64_t d = c.dim(q, 2).value;
  if (d % 2 != 0) {
    c.fail(
        cat("operand ", c.who(q), " has head dim D=", d, ": rope rotates pairs, D must be even"));
    return std::nullopt;
  }
  int64_t rot = c.attrs().get_int("rotary_dim").value_or(d);
  if (rot > d || rot % 2 != 0) {
    c.fail(cat("attribute 'rotary_dim' = ", rot, " with ", c.who(q), " head dim D=", d,
               ": rotary_dim must be even and <= D"));
    return std::nullopt;
  }
  const Dim& cols = c.dim(cs, 1);
  if (!cols.is_static() || cols.value != rot) {
    c.fail(cat("operand ", c.who(cs), " has ", cols.str(), " columns but rotary_dim=", rot,
               ": the cache holds rotary_dim/2 cosines then rotary_dim/2 sines per position"));
    return std::nullopt;
  }
  return result(c.type(q).dtype, c.type(q).dims);
}

}  // namespace tilejit::ir
