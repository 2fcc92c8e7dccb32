// bf16 <-> f32 conversions for host code (packing, reference, tests).
#pragma once

#include <cstdint>
#include <cstring>

namespace tilejit::runtime {

inline float bf16_to_f32(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  const uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return uint16_t((u + rounding) >> 16);
}

// double -> bf16 rounded once, to nearest with ties to even (the logical
// weights of a quantized checkpoint, computed in double). Through f32
// rounded to odd: f32 keeps 16 more bits than bf16, and an inexact first
// step leaves its lowest bit set, so the second rounding sees it as the
// sticky bit (f32 rounded to nearest first, then bf16, can round twice:
// 1.0507813096 gave 1.046875 instead of 1.0546875).
inline uint16_t f64_to_bf16(double x) {
  float f = static_cast<float>(x);
  if (x == x && static_cast<double>(f) != x) {  // inexact (NaN passes as it is)
    uint32_t u;
    std::memcpy(&u, &f, 4);
    // Toward zero: one step back when rounding went away from it (or overflowed).
    const double af = f < 0 ? -static_cast<double>(f) : static_cast<double>(f);
    if (af > (x < 0 ? -x : x)) --u;  // the next f32 toward zero (Inf -> FLT_MAX)
    u |= 1u;
    std::memcpy(&f, &u, 4);
  }
  return f32_to_bf16(f);
}

// IEEE half -> f32, exact (subnormals, Inf and NaN included).
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t u;
  if (exp == 0x1F) {
    u = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    u = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: man·2^-24, normalised
    int e = -1;
    uint32_t m = man;
    do {
      m <<= 1;
      ++e;
    } while ((m & 0x400u) == 0);
    u = sign | uint32_t(112 - e) << 23 | ((m & 0x3FFu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

}  // namespace tilejit::runtime
