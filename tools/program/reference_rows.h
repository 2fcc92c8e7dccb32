// The scalar references of runtime/ run over dense host buffers: what the
// runner's checks and the llama-layer job's checks both feed them.
#pragma once

#include <cstdint>
#include <vector>

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

// One quantized matrix's checkpoint tensors, dense, as the IR names them
// (docs/ir.md "Quantized weights"; an expert of a moe op is one of these,
// views at expert e of the [E, ...] tensors).
struct QuantMatrix {
  WeightFormat format = WeightFormat::bf16;  // int8, fp8_e4m3, int4_awq, int4_gptq or mxfp4
  int64_t n = 0, k = 0;                      // the logical [N, K]
  // int8 i8 [N, K], fp8 e4m3 codes [N, K], int4 the int32 qweight
  // (gptq [ceil(K/8), N], awq [K, ceil(N/8)]), mxfp4 code bytes [N, ceil(K/2)].
  const void* w = nullptr;
  const void* scale = nullptr;  // f32 (int8, fp8), f16 / bf16 / f32 (int4), u8 e8m0 (mxfp4)
  DType scale_dtype = DType::f32;
  std::vector<int64_t>
      scale_shape;                 // [1], [N], [G, N] or fp8 block scales [ceil(N/bn), ceil(K/bk)]
  const int32_t* zero = nullptr;   // int4: qzeros [G, ceil(N/8)], or null (z = 8)
  const int32_t* g_idx = nullptr;  // int4: [K], or null
  int64_t block_n = 0, block_k = 0;  // fp8 block scales
  int64_t group_size = 128;          // int4
  bool gptq_v2 = false;
};
// The exact logical weight w[n·K + k] in double (a code times an f32 / f16 /
// bf16 scale is exact), decoded here from the checkpoint tensors, not by the
// library. Where `mag` is given, per element the magnitude of the terms the
// fused int4 decode kernel sums, (q + z + 32)·|s| (its terms are a·(16 + q)
// and (16 + z)·Σa), and |w| for the other formats.
void dequantize_exact(const QuantMatrix& m, double* w, double* mag = nullptr);

}  // namespace tilejit::tools
