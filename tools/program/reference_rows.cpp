#include "tools/program/reference_rows.h"

#include <cmath>

#include "runtime/bf16.h"
#include "runtime/int_math.h"
#include "runtime/quant_formats.h"
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

namespace {

double scale_at(DType t, const void* s, int64_t i) {
  switch (t) {
    case DType::f16:
      return runtime::f16_to_f32(static_cast<const uint16_t*>(s)[i]);
    case DType::bf16:
      return runtime::bf16_to_f32(static_cast<const uint16_t*>(s)[i]);
    default:
      return static_cast<const float*>(s)[i];
  }
}

}  // namespace

void dequantize_exact(const QuantMatrix& m, double* w, double* mag) {
  const int64_t n = m.n, k = m.k;
  if (m.format == WeightFormat::int8 || m.format == WeightFormat::fp8_e4m3) {
    const bool fp8 = m.format == WeightFormat::fp8_e4m3;
    const int64_t bn = m.block_n, bk = m.block_k;
    const int64_t gk = bk > 0 ? runtime::ceil_div(k, bk) : 1;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const double sc = m.scale_shape.size() == 2
                              ? scale_at(m.scale_dtype, m.scale, (r / bn) * gk + c / bk)
                          : m.scale_shape.at(0) == 1 ? scale_at(m.scale_dtype, m.scale, 0)
                                                     : scale_at(m.scale_dtype, m.scale, r);
        const double code =
            fp8 ? double(runtime::e4m3_to_f32(static_cast<const uint8_t*>(m.w)[r * k + c]))
                : double(static_cast<const int8_t*>(m.w)[r * k + c]);
        w[r * k + c] = code * sc;
        if (mag != nullptr) mag[r * k + c] = std::fabs(w[r * k + c]);
      }
    return;
  }
  if (m.format == WeightFormat::mxfp4) {
    // e2m1 from its bit fields (sign, 2-bit exponent, 1-bit mantissa;
    // exponent 0 is subnormal: 0 or 0.5) times 2^(e8m0 − 127), exact in double.
    const auto* codes = static_cast<const uint8_t*>(m.w);
    const auto* e8 = static_cast<const uint8_t*>(m.scale);
    const int64_t row_bytes = (k + 1) / 2, blocks = (k + 31) / 32;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < k; ++c) {
        const unsigned q = (codes[r * row_bytes + c / 2] >> (4 * (c % 2))) & 0xF;
        const int e = (q >> 1) & 3, mant = q & 1;
        const double mag_q = e == 0 ? 0.5 * mant : std::ldexp(1.0 + 0.5 * mant, e - 1);
        const double v =
            (q & 8 ? -mag_q : mag_q) * std::ldexp(1.0, int(e8[r * blocks + c / 32]) - 127);
        w[r * k + c] = v;
        if (mag != nullptr) mag[r * k + c] = std::fabs(v);
      }
    return;
  }
  const bool awq = m.format == WeightFormat::int4_awq;
  const int64_t gs = m.group_size;
  const int64_t n8 = (n + 7) / 8;
  const auto* qw = static_cast<const int32_t*>(m.w);
  auto nibble = [](int32_t word, int i) { return (static_cast<uint32_t>(word) >> (4 * i)) & 0xF; };
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < k; ++c) {
      const int64_t grp = m.g_idx != nullptr ? m.g_idx[c] : gs < 0 ? 0 : c / gs;
      const uint32_t q = awq ? nibble(qw[c * n8 + r / 8], runtime::kAwqNibble[r % 8])
                             : nibble(qw[(c / 8) * n + r], static_cast<int>(c % 8));
      int z = 8;
      if (m.zero != nullptr) {
        const uint32_t st =
            nibble(m.zero[grp * n8 + r / 8], awq ? runtime::kAwqNibble[r % 8] : int(r % 8));
        z = static_cast<int>(st) + (!awq && !m.gptq_v2 ? 1 : 0);
      }
      const double s = scale_at(m.scale_dtype, m.scale, grp * n + r);
      w[r * k + c] = double(int(q) - z) * s;
      if (mag != nullptr) mag[r * k + c] = double(int(q) + z + 32) * std::fabs(s);
    }
}

}  // namespace tilejit::tools
