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

#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// ---- fp8 codes: e4m3 ("fn", weights and KV caches) and e5m2 (KV caches).
// A format's constants, the one home of what the scalar rule below, the
// Xbyak and LLVM store kernels (codegen/kv_quant_desc.h) and the readers use.
struct Fp8Format {
  int man_bits;          // 3 (e4m3), 2 (e5m2)
  int bias;              // 7, 15
  uint32_t max_bits;     // the largest finite magnitude as f32 bits: 448, 57344
  uint8_t max_code;      // its code: 0x7E, 0x7B
  uint32_t normal_bits;  // the least normal magnitude 2^(1 − bias) as f32 bits
  float sub_scale;       // 2^(bias − 1 + man_bits): |x| · this = the subnormal code
  bool has_inf;          // e5m2: S.11111.00 is ±Inf (e4m3fn has none)
};
// e4m3 ("fn"): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no
// infinities; S.1111.111 is NaN; max finite 448; subnormals down to 2^-9.
inline constexpr Fp8Format kE4m3{3, 7, 0x43E00000u, 0x7E, 0x3C800000u, 512.0f, false};
// e5m2: 1 sign, 5 exponent bits (bias 15), 2 mantissa bits, IEEE-like (f16's
// top byte): S.11111.00 is ±Inf, S.11111.{01,10,11} NaN; max finite 57344;
// subnormals down to 2^-16.
inline constexpr Fp8Format kE5m2{2, 15, 0x47600000u, 0x7B, 0x38800000u, 65536.0f, true};

inline float fp8_to_f32(const Fp8Format& f, uint8_t v) {
  const int exp_bits = 7 - f.man_bits, exp_max = (1 << exp_bits) - 1;
  const int sign = v >> 7, exp = (v >> f.man_bits) & exp_max, man = v & ((1 << f.man_bits) - 1);
  const float inf = std::numeric_limits<float>::infinity();
  if (f.has_inf && exp == exp_max)
    return man == 0 ? (sign ? -inf : inf) : std::numeric_limits<float>::quiet_NaN();
  if (!f.has_inf && exp == exp_max && man == (1 << f.man_bits) - 1)
    return std::numeric_limits<float>::quiet_NaN();
  const float mag = exp == 0
                        ? std::ldexp(float(man), 1 - f.bias - f.man_bits)  // subnormal
                        : std::ldexp(float((1 << f.man_bits) + man), exp - f.bias - f.man_bits);
  return sign ? -mag : mag;
}

// Round to nearest even, saturating to ± the largest finite value (the
// sglang / vLLM convention for scaled fp8 stores, CUDA's SATFINITE: stored =
// round(x / scale) clamped, ±Inf included); NaN stays NaN (0x7F).
// Branch-free (masks, no selects a compiler may turn into branches), so a
// loop of it vectorizes: store_kv's fp8 rows ran ~6.5 cycles an element with
// branches (random signs and magnitudes mispredict), 12-30x the bf16 store.
// Every step is exact or rounds in integers, so the caller's MXCSR rounding
// mode cannot move a code.
inline uint8_t f32_to_fp8(const Fp8Format& f, float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 24) & 0x80, a = u & 0x7FFFFFFFu;
  // Normal (a >= the least normal): f32's mantissa rounded to its top
  // man_bits bits, nearest even (a carry moves into the exponent); a below
  // the largest finite value rounds to at most it, never to an Inf / NaN
  // code. The f32 exponent E + 127 becomes the code's E + bias.
  const int shift = 23 - f.man_bits;
  const uint32_t r = a + ((1u << (shift - 1)) - 1) + ((a >> shift) & 1);
  const uint32_t normal = (r >> shift) - (static_cast<uint32_t>(127 - f.bias) << f.man_bits);
  // Subnormal codes m·2^(1 − bias − man_bits), m = 0..2^man_bits (the last:
  // the least normal): |x|·sub_scale and its fraction f are exact (|x| below
  // the least normal; any other a is replaced by it so the conversion stays
  // defined). Nearest, ties to the even m: up when f > 1/2, or f = 1/2 and m
  // odd, i.e. f > 1/2 − 2^-24 (an m >= 1 means |x|·sub_scale >= 1, whose f is
  // a multiple of 2^-23: none lies between).
  const uint32_t is_sub = 0u - static_cast<uint32_t>(a < f.normal_bits);
  const uint32_t clamped = (a & is_sub) | (f.normal_bits & ~is_sub);
  float mag;
  std::memcpy(&mag, &clamped, 4);
  const float v = mag * f.sub_scale;
  const int32_t m = static_cast<int32_t>(v);
  const float fr = v - static_cast<float>(m);
  const float half = 0.5f - static_cast<float>(m & 1) * 0x1p-24f;
  const uint32_t sub = static_cast<uint32_t>(m) + static_cast<uint32_t>(fr > half);
  uint32_t code = (sub & is_sub) | (normal & ~is_sub);
  const uint32_t sat = 0u - static_cast<uint32_t>(a >= f.max_bits);  // ±Inf too
  code = (f.max_code & sat) | (code & ~sat);
  const uint32_t nan = 0u - static_cast<uint32_t>(a > 0x7F800000u);  // NaN: 0x7F
  return static_cast<uint8_t>((0x7Fu & nan) | ((sign | code) & ~nan));
}

// The format of an fp8 element type: f8e4m3 or f8e5m2; null for any other.
inline const Fp8Format* fp8_format_of(DType t) {
  return t == DType::f8e4m3 ? &kE4m3 : t == DType::f8e5m2 ? &kE5m2 : nullptr;
}

inline float e4m3_to_f32(uint8_t v) {
  return fp8_to_f32(kE4m3, v);
}
inline uint8_t f32_to_e4m3(float x) {
  return f32_to_fp8(kE4m3, x);
}
inline float e5m2_to_f32(uint8_t v) {
  return fp8_to_f32(kE5m2, v);
}
inline uint8_t f32_to_e5m2(float x) {
  return f32_to_fp8(kE5m2, x);
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
