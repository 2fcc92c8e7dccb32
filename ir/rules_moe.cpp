// moe %hidden, %w13, %w2, %topk_weights, %topk_ids: fused mixture of experts.
// Each token runs through its top_k experts e: act(hidden·w13[e]ᵀ) split in
// gate/up halves, gate_act(gate)*up, ·w2[e]ᵀ, summed with its routing weights.
#include <tuple>

#include "ir/op_rules.h"

namespace tilejit::ir {

std::optional<TensorType> check_moe(RuleContext& c) {
  constexpr size_t h = 0, w13 = 1, w2 = 2, tw = 3, ti = 4;
  c.rank(h, 2, "[T, H]");
  c.rank(w13, 3, "[E, 2*I, H]");
  c.rank(w2, 3, "[E, H, I]");
  c.rank(tw, 2, "[T, top_k]");
  c.rank(ti, 2, "[T, top_k]");
  if (!c.ok()) return std::nullopt;
  c.dtype(h, {DType::bf16});
  c.dtype(w13, {DType::bf16});
  c.dtype(w2, {DType::bf16});
  c.dtype(tw, {DType::f32});
  c.dtype(ti, {DType::i32});
  c.unit_stride_rows(h);
  c.weight_layout(w13);
  c.weight_layout(w2);
  c.unit_stride_rows(tw);
  c.unit_stride_rows(ti);
  if (!c.ok()) return std::nullopt;

  c.same_dim(w2, 0, w13, 0, "E", "w13 and w2 hold the same experts");
  c.same_dim(w13, 2, h, 1, "H", "the experts' input dim is the hidden size");
  c.same_dim(w2, 1, h, 1, "H", "the experts' output dim is the hidden size");
  c.same_dim(tw, 0, h, 0, "T", "one routing row per token");
  c.same_dim(ti, 0, h, 0, "T", "one routing row per token");
  if (!c.ok()) return std::nullopt;

  const Dim& two_i = c.dim(w13, 1);
  const Dim& i = c.dim(w2, 2);
  if (!two_i.is_static() || !i.is_static()) {
    c.fail(cat("operand ", c.who(w13), " has 2*I=", two_i.str(), " and ", c.who(w2),
               " has I=", i.str(), ": expert intermediate dims must be static"));
    return std::nullopt;
  }
  // Compared as a division: 2·I could overflow for a huge static I.
  if (two_i.value % 2 != 0 || two_i.value / 2 != i.value) {
    c.fail(cat("operand ", c.who(w13), " has 2*I=", two_i.value, " but ", c.who(w2),
               " has I=", i.value,
               ": w13 stacks the gate and up projections, so its dim 1 is twice w2's dim 2"));
    return std::nullopt;
  }
  for (auto [operand, axis, name] : {std::tuple{w13, 0, "E"}, {w13, 1, "2*I"}, {w13, 2, "H"}})
    c.nonzero_dim(operand, axis, name, "tilejit::pack_experts takes no empty expert weights");
  if (!c.ok()) return std::nullopt;
  int64_t top_k = *c.attrs().get_int("top_k");
  for (size_t r : {tw, ti}) {
    const Dim& k = c.dim(r, 1);
    if (!k.is_static() || k.value != top_k) {
      c.fail(cat("operand ", c.who(r), " has ", k.str(), " columns but top_k=", top_k,
                 ": one column per selected expert"));
      return std::nullopt;
    }
  }
  return result(c.type(h).dtype, c.type(h).dims);
}

}  // namespace tilejit::ir
