// Elementwise ops: add and mul with [N] broadcast, the activations, and cast.
// They are the epilogue vocabulary: each one either fuses into a producer's
// store or runs as a vector loop, so the rules keep them to what both can do.
#include <algorithm>

#include "ir/op_rules.h"

namespace tilejit::ir {

std::optional<TensorType> check_binary(RuleContext& c) {
  constexpr size_t a = 0, b = 1;
  c.dtype(a, {DType::f32, DType::bf16});
  c.dtype(b, {DType::f32, DType::bf16});
  c.row_major(a);
  c.row_major(b);
  if (!c.ok()) return std::nullopt;
  // Mixed f32/bf16 computes in f32: the bf16 side is exact in f32.
  DType out =
      c.type(a).dtype == DType::bf16 && c.type(b).dtype == DType::bf16 ? DType::bf16 : DType::f32;
  const auto& da = c.type(a).dims;
  const auto& db = c.type(b).dims;
  if (da == db) return result(out, da);
  // A [N] operand broadcasts over the last dim of the other: bias, scale.
  if (db.size() == 1 && !da.empty() && db[0] == da.back()) return result(out, da);
  if (da.size() == 1 && !db.empty() && da[0] == db.back()) return result(out, db);
  c.fail(cat("operand ", c.who(b), " has shape ", shape_str(db), " but ", c.who(a), " has shape ",
             shape_str(da), ": ", name(c.kind()),
             " needs equal shapes, or a [N] operand broadcast over [..., N]"));
  return std::nullopt;
}

std::optional<TensorType> check_activation(RuleContext& c) {
  constexpr size_t x = 0;
  c.row_major(x);
  // Activations are evaluated in f32 (tanh/erf/exp of bf16 lose too much);
  // a bf16 tensor is cast first, which is free when fused.
  if (c.type(x).dtype != DType::f32) {
    c.fail(cat("operand ", c.who(x), " has dtype ", dtype_name(c.type(x).dtype), ": ",
               name(c.kind()), " is elementwise on f32 (cast to f32 first)"));
  }
  if (!c.ok()) return std::nullopt;
  return result(DType::f32, c.type(x).dims);
}

std::optional<TensorType> check_cast(RuleContext& c) {
  constexpr size_t x = 0;
  DType to = *c.attrs().get_dtype("to");  // check_attrs made sure it is there
  c.row_major(x);
  constexpr DType kTargets[] = {DType::f32, DType::bf16, DType::f16};
  if (std::find(std::begin(kTargets), std::end(kTargets), to) == std::end(kTargets)) {
    c.fail(cat("target dtype ", dtype_name(to),
               " is not supported: cast converts to f32, bf16 or f16 "
               "(integer and fp8 targets need a scale, i.e. a quantize op)"));
  }
  if (const DType from = c.type(x).dtype; from == DType::u4 || from == DType::f4e2m1) {
    c.fail(cat("operand ", c.who(x), " has dtype ", dtype_name(from),
               ": 4-bit values have no meaning without their group scales"));
  }
  if (c.type(x).dtype == DType::f8e5m2)
    c.fail(cat("operand ", c.who(x),
               " has dtype f8e5m2: a KV cache element type only (its codes are read by "
               "decode_attention / extend_attention with the cache's scales)"));
  if (!c.ok()) return std::nullopt;
  return result(to, c.type(x).dims);
}

}  // namespace tilejit::ir
