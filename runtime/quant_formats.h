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
// Branch-free (masks, no selects a compiler may turn into branches), so a
// loop of it vectorizes: store_kv's fp8 rows ran ~6.5 cycles an element with
// branches (random signs and magnitudes mispredict), 12-30x the bf16 store.
// Every step is exact or rounds in integers, so the caller's MXCSR rounding
// mode cannot move a code.
inline uint8_t f32_to_e4m3(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 24) & 0x80, a = u & 0x7FFFFFFFu;
  // Normal (a >= 2^-6): f32's mantissa rounded to its top 3 bits, nearest
  // even (a carry moves into the exponent); a < 448 rounds to at most 448,
  // never to the NaN code. The f32 exponent E + 127 becomes e4m3's E + 7.
  const uint32_t r = a + 0x7FFFFu + ((a >> 20) & 1);
  const uint32_t normal = (r >> 20) - (120u << 3);
  // Subnormal codes m·2^-9, m = 0..8 (8: the least normal, 2^-6): |x|·2^9
  // and its fraction f are exact (|x| < 2^-6; any other a is replaced by
  // 2^-6 so the conversion stays defined). Nearest, ties to the even m: up
  // when f > 1/2, or f = 1/2 and m odd, i.e. f > 1/2 − 2^-24 (an m >= 1
  // means |x|·2^9 >= 1, whose f is a multiple of 2^-23: none lies between).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < 0x3C800000u);  // 2^-6
  const uint32_t clamped = (a & is_sub) | (0x3C800000u & ~is_sub);
  float mag;
  std::memcpy(&mag, &clamped, 4);
  const float v = mag * 512.0f;
  const int32_t m = static_cast<int32_t>(v);
  const float f = v - static_cast<float>(m);
  const float half = 0.5f - static_cast<float>(m & 1) * 0x1p-24f;
  const uint32_t sub = static_cast<uint32_t>(m) + static_cast<uint32_t>(f > half);
  uint32_t code = (sub & is_sub) | (normal & ~is_sub);
  const uint32_t sat = 0u - static_cast<uint32_t>(a >= 0x43E00000u);  // >= 448, ±Inf too
  code = (0x7Eu & sat) | (code & ~sat);
  const uint32_t nan = 0u - static_cast<uint32_t>(a > 0x7F800000u);  // NaN: 0x7F
  return static_cast<uint8_t>((0x7Fu & nan) | ((sign | code) & ~nan));
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
