// gemm %x, %w: y[M, N] = x[M, K] · w[N, K]ᵀ, bf16 in, f32 accumulator out.
// The f32 result is what epilogue ops (add, activations, cast) then consume,
// so the whole chain fuses into the micro-kernel's store.
#include "ir/op_rules.h"

namespace tilejit::ir {

std::optional<TensorType> check_gemm(RuleContext& c) {
  constexpr size_t x = 0, w = 1;
  c.rank(x, 2, "[M, K]");
  c.rank(w, 2, "[N, K]");
  if (!c.ok()) return std::nullopt;
  c.dtype(x, {DType::bf16});
  c.dtype(w, {DType::bf16});
  c.unit_stride_rows(x);
  c.weight_layout(w);
  if (!c.ok()) return std::nullopt;
  if (!c.same_dim(w, 1, x, 1, "K", "the reduction dims must match")) return std::nullopt;
  c.nonzero_dim(w, 0, "N", "tilejit::pack_weight takes no empty weight");
  c.nonzero_dim(w, 1, "K", "tilejit::pack_weight takes no empty weight");
  if (!c.ok()) return std::nullopt;
  return result(DType::f32, {c.dim(x, 0), c.dim(w, 0)});
}

}  // namespace tilejit::ir
