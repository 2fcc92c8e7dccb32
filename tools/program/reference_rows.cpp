#include "tools/program/reference_rows.h"

#include <cmath>

#include "runtime/bf16.h"
#include "runtime/thread_pool.h"

namespace tilejit::tools {

double reference_bias_at(const runtime::ReferenceGemmArgs& a, int64_t j) {
  if (a.bias == nullptr) return 0;
  return a.bias_dtype == DType::f32 ? static_cast<const float*>(a.bias)[j]
                                    : runtime::bf16_to_f32(static_cast<const uint16_t*>(a.bias)[j]);
}

void reference_gemm_rows(runtime::ReferenceGemmArgs a, const uint16_t* x, const uint16_t* w,
                         int64_t rows, float* y, double* abs_sum, double* pre) {
  const int64_t n = a.n, k = a.k;
  a.ldx = k;
  a.m = 1;
  a.y_dtype = DType::f32;
  a.ldy = n;
  // O(rows·N·K) in double: rows over the pool.
  runtime::parallel_for(rows, [&](int64_t i) {
    runtime::ReferenceGemmArgs row = a;
    row.x = x + i * k;
    row.y = y + i * n;
    runtime::reference_gemm(row, [&](int64_t r, int64_t c) { return w[r * k + c]; });
    for (int64_t j = 0; j < n; ++j) {
      double s = 0, p = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double t =
            double(runtime::bf16_to_f32(x[i * k + kk])) * runtime::bf16_to_f32(w[j * k + kk]);
        s += std::fabs(t);
        p += t;
      }
      abs_sum[i * n + j] = s;
      if (pre != nullptr) pre[i * n + j] = p + reference_bias_at(a, j);
    }
  });
}

void moe_token_args(runtime::ReferenceMoeArgs& a, const uint16_t* hidden, const uint16_t* w13,
                    const uint16_t* w2, const float* topk_weights, const int32_t* topk_ids,
                    int64_t tok, float* out) {
  a.t = 1;
  a.hidden = hidden + tok * a.h;
  a.ld_hidden = a.h;
  a.w13 = w13;
  a.w2 = w2;
  a.topk_weights = topk_weights + tok * a.k;
  a.ld_weights = a.k;
  a.topk_ids = topk_ids + tok * a.k;
  a.ld_ids = a.k;
  a.out = out;
  a.ld_out = a.h;
}

}  // namespace tilejit::tools
