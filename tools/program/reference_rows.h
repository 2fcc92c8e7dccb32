// The scalar references of runtime/ run over dense host buffers: what the
// runner's checks and the llama-layer job's checks both feed them.
#pragma once

#include <cstdint>

#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"

namespace tilejit::tools {

// x [rows, k] · wᵀ (w [n, k]; both bf16, dense) by runtime::reference_gemm
// with the bias and activation of `a` (its n and k set), rows over the thread
// pool, into y (f32, [rows, n]) before any rounding to an output type; and
// per element Σ|x·w| into abs_sum and, where `pre` is given, the
// pre-activation (bias included) into it: what the bounds need.
void reference_gemm_rows(runtime::ReferenceGemmArgs a, const uint16_t* x, const uint16_t* w,
                         int64_t rows, float* y, double* abs_sum, double* pre = nullptr);
// Element j of the bias of `a` (0 without one).
double reference_bias_at(const runtime::ReferenceGemmArgs& a, int64_t j);

// Points `a` (its h, i, e and k set) at token `tok` of dense operands:
// hidden [T, H], w13 [E, 2I, H] and w2 [E, H, I] bf16, topk_weights [T, k]
// f32, topk_ids [T, k] i32, and `out`, that token's [H] f32 row; a.t = 1.
void moe_token_args(runtime::ReferenceMoeArgs& a, const uint16_t* hidden, const uint16_t* w13,
                    const uint16_t* w2, const float* topk_weights, const int32_t* topk_ids,
                    int64_t tok, float* out);

}  // namespace tilejit::tools
