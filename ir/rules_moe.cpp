// moe %hidden, %w13, %w2, %topk_weights, %topk_ids: fused mixture of experts.
// Each token runs through its top_k experts e: act(hidden·w13[e]ᵀ) split in
// gate/up halves, gate_act(gate)*up, ·w2[e]ᵀ, summed with its routing weights.
//
// Quantized experts (docs/ir.md, "Quantized experts"): w13 and w2 both i8,
// f8e4m3, u4 or f4e2m1 with the named operands scale13, zero13, g_idx13 (w13's) and
// scale2, zero2, g_idx2 (w2's), each tensor the gemm's with a leading [E];
// the gemm's rules (QuantWeight, rules_gemm.cpp) per projection.
#include <string_view>
#include <tuple>

#include "ir/op_rules.h"

namespace tilejit::ir {

namespace {

// The named operands that describe quantized experts (scale13, zero2, ...).
bool is_quant_role(std::string_view r) {
  return r.starts_with("scale") || r.starts_with("zero") || r.starts_with("g_idx");
}

// The MoeOptions tensors (named operands b13, b2, shared_w13, shared_w2,
// shared_weights): f32 biases [E, 2*I] in w13's row order and [E, H]; a bf16
// shared expert [2*Is, H] / [H, Is] (row-major, its gate / up rows stacked as
// w13's: the glu_rows attribute), both or neither; f32 shared_weights [T],
// only with a shared expert.
void check_moe_options(RuleContext& c, bool gated) {
  constexpr size_t h = 0, w13 = 1, w2 = 2;
  auto vector_of = [&](size_t op, int rank, const char* shape) {
    c.rank(op, rank, shape);
    if (!c.ok()) return false;
    c.dtype(op, {DType::f32});
    c.unit_stride_rows(op);
    return c.ok();
  };
  if (auto b13 = c.named("b13"); b13 && vector_of(*b13, 2, gated ? "[E, 2*I]" : "[E, I]")) {
    c.same_dim(*b13, 0, w13, 0, "E", "one gate / up bias row per expert");
    c.same_dim(*b13, 1, w13, 1, gated ? "2*I" : "I", "a bias per row of w13, in its row order");
  }
  if (auto b2 = c.named("b2"); b2 && vector_of(*b2, 2, "[E, H]")) {
    c.same_dim(*b2, 0, w2, 0, "E", "one down bias row per expert");
    c.same_dim(*b2, 1, h, 1, "H", "the down bias has one entry per hidden column");
  }
  const auto s13 = c.named("shared_w13"), s2 = c.named("shared_w2"), sw = c.named("shared_weights");
  if (s13.has_value() != s2.has_value()) {
    c.fail(cat("operand ", c.who(s13 ? *s13 : *s2), " without '", s13 ? "shared_w2" : "shared_w13",
               "': the shared expert takes both projections"));
    return;
  }
  if (sw && !s13) {
    c.fail(cat("operand ", c.who(*sw), " without a shared expert (shared_w13, shared_w2)"));
    return;
  }
  if (!s13) return;
  c.rank(*s13, 2, gated ? "[2*Is, H]" : "[Is, H]");
  c.rank(*s2, 2, "[H, Is]");
  if (!c.ok()) return;
  for (size_t w : {*s13, *s2}) {
    c.dtype(w, {DType::bf16});
    c.unit_stride_rows(w);
  }
  if (!c.ok()) return;
  c.same_dim(*s13, 1, h, 1, "H", "the shared expert's input dim is the hidden size");
  c.same_dim(*s2, 0, h, 1, "H", "the shared expert's output dim is the hidden size");
  const Dim& rows_s = c.dim(*s13, 0);
  const Dim& is = c.dim(*s2, 1);
  const int64_t per = gated ? 2 : 1;
  if (!rows_s.is_static() || !is.is_static() || rows_s.value % per != 0 ||
      rows_s.value / per != is.value || is.value < 1)
    c.fail(cat("operand ", c.who(*s13), " has ", gated ? "2*Is=" : "Is=", rows_s.str(), " and ",
               c.who(*s2), " has Is=", is.str(), ": static, Is >= 1, and ",
               gated ? "shared_w13 stacks the gate and up rows (twice Is)"
                     : "shared_w13 is the shared expert's up projection (gated = false)"));
  if (sw && vector_of(*sw, 1, "[T]")) c.same_dim(*sw, 0, h, 0, "T", "one shared weight per token");
}

// The named operands and quantization attributes of experts of dtype wt.
void check_quant_experts(RuleContext& c, DType wt, bool gated) {
  constexpr size_t w13 = 1, w2 = 2;
  check_quant_attr_owners(c, wt, cat(c.who(w13), " is ", dtype_name(wt)));
  if (wt == DType::bf16) {
    for (size_t i = 5; i < c.size(); ++i)
      if (is_quant_role(c.role(i)))
        c.fail(cat("operand ", c.who(i), ": bf16 experts take no '", c.role(i),
                   "' (the scale, zero and g_idx operands describe i8, f8e4m3, u4 and f4e2m1 "
                   "experts)"));
    return;
  }
  for (auto [w, name] : {std::tuple{w13, gated ? "2*I" : "I"}, {w2, "H"}})
    c.static_dim(w, 1, name, "quantized experts have static dims");
  c.static_dim(w13, 0, "E", "quantized experts have static dims");
  c.static_dim(w13, 2, "H", "quantized experts have static dims");
  if (!c.ok()) return;
  const int64_t e = c.dim(w13, 0).value, h = c.dim(w13, 2).value, i = c.dim(w2, 2).value;
  struct Proj {
    size_t w;
    const char *scale, *zero, *g_idx, *example;
    int64_t n, k;
  };
  const Proj projs[] = {
      {w13, "scale13", "zero13", "g_idx13", "moe %h, %w13, %w2, %tw, %ti, scale13 = %s13, ...",
       (gated ? 2 : 1) * i, h},
      {w2, "scale2", "zero2", "g_idx2", "moe %h, %w13, %w2, %tw, %ti, ..., scale2 = %s2", h, i},
  };
  for (const Proj& p : projs) {
    QuantWeight q;
    q.w = p.w;
    q.scale = c.named(p.scale);
    q.zero = c.named(p.zero);
    q.g_idx = c.named(p.g_idx);
    q.n = p.n;
    q.k = p.k;
    q.experts = true;
    q.e = e;
    q.scale_role = p.scale;
    q.example = p.example;
    check_quant_weight(c, wt, q);
  }
}

}  // namespace

std::optional<TensorType> check_moe(RuleContext& c) {
  constexpr size_t h = 0, w13 = 1, w2 = 2, tw = 3, ti = 4;
  // gated = false: a non-gated MLP, w13 [E, I, H] (tilejit::ExpertProj::up).
  const bool gated = c.attrs().get_bool("gated").value_or(true);
  const char* rows13 = gated ? "2*I" : "I";
  c.rank(h, 2, "[T, H]");
  c.rank(w13, 3, gated ? "[E, 2*I, H]" : "[E, I, H]");
  c.rank(w2, 3, "[E, H, I]");
  c.rank(tw, 2, "[T, top_k]");
  c.rank(ti, 2, "[T, top_k]");
  if (!c.ok()) return std::nullopt;
  c.dtype(h, {DType::bf16});
  c.dtype(w13, kWeightDtypes);
  c.dtype(w2, kWeightDtypes);
  c.dtype(tw, {DType::f32});
  c.dtype(ti, {DType::i32});
  c.unit_stride_rows(h);
  if (!c.ok()) return std::nullopt;
  // tilejit::pack_experts refuses w13 and w2 in different formats.
  if (!c.same_dtype(w2, w13, "w13 and w2 are packed in one format (tilejit::pack_experts)"))
    return std::nullopt;
  const DType wt = c.type(w13).dtype;
  for (size_t w : {w13, w2}) check_weight_layout(c, w, wt);
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
    c.fail(cat("operand ", c.who(w13), " has ", rows13, "=", two_i.str(), " and ", c.who(w2),
               " has I=", i.str(), ": expert intermediate dims must be static"));
    return std::nullopt;
  }
  // Compared as a division: 2·I could overflow for a huge static I.
  const int64_t per = gated ? 2 : 1;
  if (two_i.value % per != 0 || two_i.value / per != i.value) {
    c.fail(cat("operand ", c.who(w13), " has ", rows13, "=", two_i.value, " but ", c.who(w2),
               " has I=", i.value,
               gated ? ": w13 stacks the gate and up projections, so its dim 1 is twice w2's dim 2"
                     : ": w13 is the up projection (gated = false), so its dim 1 is w2's dim 2"));
    return std::nullopt;
  }
  for (auto [operand, axis, name] : {std::tuple{w13, 0, "E"}, {w13, 1, rows13}, {w13, 2, "H"}})
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
  check_quant_experts(c, wt, gated);
  if (!c.ok()) return std::nullopt;
  check_moe_options(c, gated);
  if (!c.ok()) return std::nullopt;
  return result(c.type(h).dtype, c.type(h).dims);
}

}  // namespace tilejit::ir
