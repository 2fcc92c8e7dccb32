// The scalar statement of the quantized GEMMs' helper kernels
// (codegen/quant_desc.h): the dequantization of packed fp8 / int4 / MXFP4 codes to
// bf16 and the per-row quantization of bf16 activations to u8. Both are
// defined as exact f32 arithmetic, so the JIT kernels must match these
// bit for bit; the tests compare them so.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// One k-pair row of DequantArgs' contract: `code` is f8e4m3, u4 or f4e2m1
// (MXFP4); scale / zero the row's group rows (zero: u4 only, null: 8); out
// 128 bf16.
inline void reference_dequant_row(DType code, const uint8_t* codes, const float* scale,
                                  const uint8_t* zero, uint16_t* out) {
  for (int c = 0; c < 64; ++c)
    for (int p = 0; p < 2; ++p) {
      float v;
      if (code == DType::f8e4m3) {
        v = e4m3_to_f32(codes[2 * c + p]);
      } else {
        const int q = (codes[c] >> (4 * p)) & 0xF;
        v = code == DType::f4e2m1 ? e2m1_to_f32(static_cast<uint8_t>(q))
                                  : static_cast<float>(q - (zero != nullptr ? zero[c] : 8));
      }
      out[2 * c + p] = f32_to_bf16(v * scale[c]);
    }
}
inline void reference_dequant_row(bool fp8, const uint8_t* codes, const float* scale,
                                  const uint8_t* zero, uint16_t* out) {
  reference_dequant_row(fp8 ? DType::f8e4m3 : DType::u4, codes, scale, zero, out);
}

// Round to nearest even whatever the caller's MXCSR / fenv rounding mode (the
// kernels use vcvtps2dq with {rn-sae}, LLVM's roundeven), including vcvtps2dq's
// answer for NaN and values outside int32: INT32_MIN (the "integer
// indefinite"), without the undefined C++ conversion. trunc and the
// difference are exact, so no step depends on the rounding mode.
inline int32_t rne_to_int(float x) {
  if (!(std::fabs(x) < 2147483648.0f)) return std::numeric_limits<int32_t>::min();
  const float t = std::trunc(x), f = std::fabs(x - t);
  const bool odd = std::fmod(t, 2.0f) != 0;
  const float up = f > 0.5f || (f == 0.5f && odd) ? (x < 0 ? -1.0f : 1.0f) : 0.0f;
  return static_cast<int32_t>(t + up);
}

// The dynamic modes' step from a row's range (sym: max |x| over 127 levels,
// asym: max − min over 255): inv = levels / range, s = range / levels; a zero
// range gives 1 and 1. A range below kActQuantMinRange is taken as that: else
// levels / range overflows to Inf, 0 · Inf is NaN and every zero of the row
// became code −127 (a sign-flipped result ~100× too large at |x| ~ 1e-38).
// The coarser step still keeps each code within s / 2 of x · inv.
inline constexpr float kActQuantMinRange = 0x1p-119f;  // 255 / 2^-119 < FLT_MAX
struct ActQuantStep {
  float inv, s;
};
inline ActQuantStep act_quant_step(float range, float levels) {
  if (range == 0) return {1.0f, 1.0f};
  const float r = std::max(range, kActQuantMinRange);
  return {levels / r, r / levels};
}

enum class ActQuantRule { sym, asym, fixed };

// One row of ActQuantArgs' contract: q[k_padded] (zeros past k), *scale, *zero.
inline void reference_act_quant_row(ActQuantRule rule, const uint16_t* x, int64_t k,
                                    int64_t k_padded, float fixed_inv, float fixed_scale,
                                    int32_t fixed_zero, uint8_t* q, float* scale, int32_t* zero) {
  bool finite = true;
  for (int64_t i = 0; i < k; ++i) finite = finite && (x[i] & 0x7FFF) < 0x7F80;
  float inv = 1, s = 1;
  int32_t z = 0, lo_q = 0, hi_q = 255;
  switch (rule) {
    case ActQuantRule::sym: {
      float a = 0;
      for (int64_t i = 0; i < k; ++i) a = std::max(a, std::fabs(bf16_to_f32(x[i])));
      const ActQuantStep st = act_quant_step(a, 127.0f);
      inv = st.inv, s = st.s;
      z = 128, lo_q = 1, hi_q = 255;  // s8 −127..127, + 128
      break;
    }
    case ActQuantRule::asym: {
      float lo = 0, hi = 0;
      for (int64_t i = 0; i < k; ++i) {
        lo = std::min(lo, bf16_to_f32(x[i]));
        hi = std::max(hi, bf16_to_f32(x[i]));
      }
      const float r = hi - lo;
      const ActQuantStep st = act_quant_step(r, 255.0f);
      inv = st.inv, s = st.s;
      z = std::clamp(rne_to_int(-lo * inv), 0, 255);
      break;
    }
    case ActQuantRule::fixed:
      inv = fixed_inv, s = fixed_scale, z = fixed_zero;
      break;
  }
  if (!finite) {
    s = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < k; ++i) q[i] = static_cast<uint8_t>(z);
  } else {
    for (int64_t i = 0; i < k; ++i) {
      const float v = bf16_to_f32(x[i]) * inv;
      // Clamp in float first: a huge v must not overflow the conversion.
      const float c = std::clamp(v, -512.0f, 512.0f);
      q[i] = static_cast<uint8_t>(std::clamp(rne_to_int(c) + z, lo_q, hi_q));
    }
  }
  for (int64_t i = k; i < k_padded; ++i) q[i] = 0;
  *scale = s;
  *zero = z;
}

}  // namespace tilejit::runtime
