// The quantized weight formats as their checkpoints store them, element by
// element: the scalar decoding the quantized GEMM kernels (issue 12) will be
// checked against, and the unpacking that gives the logical weights back.
// Layouts as AutoAWQ, AutoGPTQ / AutoRound and DeepSeek / GPT-OSS ship them
// (../shared/JIT-FACTS.md, "Quantized checkpoint formats"). Header-only,
// no allocation: a reference, not a fast path.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace tilejit::runtime {

// ---- fp8 e4m3 ("fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities; S.1111.111 is NaN; max finite 448; subnormals down to 2^-9.
inline float e4m3_to_f32(uint8_t v) {
  const int sign = v >> 7, exp = (v >> 3) & 0xF, man = v & 0x7;
  if (exp == 0xF && man == 0x7) return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0 ? std::ldexp(float(man), -9)                // subnormal: m·2^-9
                             : std::ldexp(float(8 + man), exp - 7 - 3);  // 1.m·2^(e-7)
  return sign ? -mag : mag;
}

// Round to nearest even, saturating to ±448 (the sglang / vLLM convention for
// scaled fp8 stores: stored = round(x / scale) clamped); NaN stays NaN (0x7F).
inline uint8_t f32_to_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;  // saturate (also ±inf)
  if (a < 0x1p-6f) {
    // Subnormal codes m·2^-9, m = 0..8 (8: the least normal, 2^-6): a·2^9 and
    // its fraction are exact; nearest, ties to the even m.
    const float v = a * 512.0f;
    int m = static_cast<int>(v);
    const float f = v - static_cast<float>(m);
    if (f > 0.5f || (f == 0.5f && (m & 1))) ++m;
    return static_cast<uint8_t>(sign | m);
  }
  // Normal: f32's mantissa rounded to its top 3 bits, nearest even (a carry
  // moves into the exponent); a < 448 rounds to at most 448, never to the
  // NaN code. The f32 exponent E + 127 becomes e4m3's E + 7.
  uint32_t u;
  std::memcpy(&u, &a, 4);
  u += 0x7FFFFu + ((u >> 20) & 1);
  const uint32_t e = (u >> 23) - 120, m = (u >> 20) & 7;
  return static_cast<uint8_t>(sign | (e << 3) | m);
}

// ---- MXFP4 (OCP MX, GPT-OSS): e2m1 values {0, 0.5, 1, 1.5, 2, 3, 4, 6} with a
// sign bit, two per byte (low nibble first); one e8m0 scale per 32 values.
inline float e2m1_to_f32(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 0x7];
  return (nibble & 0x8) ? -m : m;
}
// 2^(e − 127); 0xFF is NaN.
inline float e8m0_to_f32(uint8_t e) {
  if (e == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(e) - 127);
}

// ---- int4 AWQ ("GEMM" version): qweight int32 [K, N/8] packed along N:
// nibble i (bits 4i..4i+3) of word c holds column 8c + kAwqOrder[i]; qzeros
// int32 [K/g, N/8] the same; scales [K/g, N]; w = (q − z) · s.
inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
// The nibble that holds column offset j (the inverse of kAwqOrder).
inline constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

inline int nibble(uint32_t word, int i) {
  return static_cast<int>((word >> (4 * i)) & 0xF);
}

// Element (row r, column n) of an AWQ-packed int32 matrix with `words` int32
// per row (N/8): qweight with r = k, qzeros with r = the group.
inline int awq_at(const int32_t* packed, int64_t words, int64_t r, int64_t n) {
  return nibble(static_cast<uint32_t>(packed[r * words + n / 8]), kAwqNibble[n % 8]);
}

// ---- int4 GPTQ: qweight int32 [K/8, N] packed along K (nibble i of word r
// holds row 8r + i); qzeros int32 [K/g, N/8] packed along N in plain order
// (nibble i of word c holds column 8c + i). The original format stores z − 1
// (gptq_v1: symmetric 4-bit is 0x77777777, z = 8); gptq_v2 stores z.
inline int gptq_q_at(const int32_t* qweight, int64_t n_cols, int64_t k, int64_t n) {
  return nibble(static_cast<uint32_t>(qweight[(k / 8) * n_cols + n]), static_cast<int>(k % 8));
}
inline int gptq_zero_at(const int32_t* qzeros, int64_t words, int64_t group, int64_t n,
                        bool v1_minus_one) {
  const int z =
      nibble(static_cast<uint32_t>(qzeros[group * words + n / 8]), static_cast<int>(n % 8));
  // v1 stores z − 1 in 4 bits: 15 means z = 16, as the v1 kernels compute it.
  return v1_minus_one ? z + 1 : z;
}

// The group of input channel k: g_idx[k] (act-order checkpoints: any
// grouping, not monotonic) or k / group_size.
inline int64_t quant_group_of(int64_t k, int64_t group_size, const int32_t* g_idx) {
  return g_idx != nullptr ? g_idx[k] : k / group_size;
}

// w = (q − z) · s, in double (the oracle's precision).
inline double dequant_int4(int q, int z, double scale) {
  return double(q - z) * scale;
}

}  // namespace tilejit::runtime
