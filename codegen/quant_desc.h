// The kernels of the weight-quantized GEMMs (docs/quantized.md) besides the
// brgemm micro-kernels themselves: their descriptors and call arguments.
//
//   dequant:   a chunk of a quantized packed weight block (fp8 e4m3, int4 or
//              MXFP4 e2m1 codes in the packed k-pair order) ->
//              the bf16 packed block the bf16 brgemm kernels read (W8A16, W4A16);
//   act_quant: bf16 activation rows -> u8 rows with a per-row scale and zero
//              point (W8A8's activations, quantized per call).
//
// Every emitter (Xbyak AVX-512 for the avx512 and amx paths, LLVM for the
// llvm path) implements exactly the arithmetic written here, so the scalar
// reference (runtime/reference_quant.h) can reproduce it.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "codegen/kernel_desc.h"
#include "tilejit/tilejit.h"

namespace tilejit::codegen {

// ---- dequant ------------------------------------------------------------------
//
// For each k-pair row r < rows, column c < 64 and parity p (0: even k, 1: odd k):
//   g    = groups[r]                                   (the row's scale group)
//   q    = fp8:  the e4m3 byte codes[r·128 + 2c + p]   (never a NaN code: packing refuses them)
//          int4, mxfp4: nibble p of the byte codes[r·64 + c]  (low nibble: even k)
//   v    = fp8:  e4m3 value of q (exact in f32)
//          int4: (float)(q − zeros[g·64 + c])          (exact; zeros null: 8)
//          mxfp4: e2m1 value of q: bit 3 the sign, magnitude (q & 7) one of
//                 0, 0.5, 1, 1.5, 2, 3, 4, 6 (0x8 is −0)
//   w    = v · scales[g·64 + c]                        (one f32 multiply, RNE;
//          mxfp4's scales are 2^(e − 127): the product is exact unless it
//          overflows, and e = 0's 2^-127 is an f32 subnormal, used as it is)
//   out[r·128 + 2c + p] = bf16(w)                      (round to nearest even)
// i.e. out is `rows` k-pair rows of the bf16 packed layout (PackedLayout:
// 64 columns × 2 bf16 = 256 bytes a row).
//
// out = i8 (u4 codes only; W4A8, ops/gemm_w4a8.cpp): no scale, the exact
// integer v = q − z (in [−16, 15]) as s8 in the int8 k-quad layout
// (Int8Layout's rows: k-pair rows 2j and 2j + 1 make quad row j):
//   out[(r / 2)·256 + 4c + 2·(r % 2) + p] = q − z
// with the bytes of the missing odd row 0 when rows is odd (so out holds
// ⌈rows/2⌉ quad rows), and, when comp is not null,
//   comp[c] = Σ_{r < rows, p} (q − z)   (the zero-point compensation of B).
struct DequantArgs {
  const uint8_t* codes;   // the chunk's first k-pair row of codes
  const int32_t* groups;  // [rows] scale group of each k-pair row
  // [G][64] f32: this column block's scale rows; f4e2m1: the e8m0 exponent
  // bytes u8 [G][64] (the kernel makes 2^(e − 127) per group).
  const float* scales;
  const uint8_t* zeros;  // [G][64] u8: this column block's zero points (int4 with zeros), or null
  void* out;             // [rows][64][2] bf16, or (out i8) [⌈rows/2⌉][64][4] s8
  int64_t rows;          // k-pair rows (>= 0)
  int32_t* comp;         // out i8: [64] Σ (q − z) per column, or null; unused for bf16
};
static_assert(offsetof(DequantArgs, codes) == 0 && offsetof(DequantArgs, groups) == 8 &&
              offsetof(DequantArgs, scales) == 16 && offsetof(DequantArgs, zeros) == 24 &&
              offsetof(DequantArgs, out) == 32 && offsetof(DequantArgs, rows) == 40 &&
              offsetof(DequantArgs, comp) == 48);
using DequantFn = void (*)(const DequantArgs*);

struct DequantDesc {
  static constexpr const char* kFamily = "dequant";
  Isa isa = Isa::avx512;       // avx512 (serves amx too) or llvm
  DType code = DType::f8e4m3;  // f8e4m3, u4 or f4e2m1 (MXFP4)
  bool zeros = false;          // u4 only: zero points given (else 8)
  // The weight's scales are all 0, non-finite, or in [normal_scale_min(),
  // 2^100] in magnitude, so no product v·s is an f32 subnormal (which
  // AVX512-BF16's conversion would flush) and a rescaling by 2^8 cannot
  // overflow: the kernel may skip its per-product check. The result is the
  // same either way.
  bool normal_products = false;
  // bf16 (scaled, the W4A16 / W8A16 chunk) or i8 (u4 only: the
  // W4A8 chunk of q − z and its column sums).
  DType out = DType::bf16;

  static constexpr auto field_list() {
    using D = DequantDesc;
    using enum NameRule;
    return std::make_tuple(field("isa", &D::isa, "_"), field("code", &D::code, "_"),
                           field("zeros", &D::zeros, "_zp", flag),
                           field("normal", &D::normal_products, "_nosub", flag),
                           field("out", &D::out, "_", unless_default));
  }
  // The smallest |scale| whose products with the smallest nonzero code value
  // (e4m3: 2^-9; int4: |q − z| = 1; e2m1: 0.5) are normal f32 numbers.
  static float normal_scale_min(DType code) {
    return code == DType::f8e4m3 ? 0x1p-117f : code == DType::f4e2m1 ? 0x1p-125f : 0x1p-126f;
  }
  bool operator==(const DequantDesc& o) const { return same_fields(*this, o); }
  std::string key() const { return desc_key(*this); }
  // e.g. "dequant_avx512_u4_zp".
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<DequantDesc>(), "a DequantDesc member is missing from field_list()");

// The e2m1 (MXFP4) value of a 4-bit code q, as the Xbyak kernels tabulate
// it: bit 3 the sign; q & 7 = 2e + m (exponent field e, bias 1; mantissa
// bit m): e = 0 is m · 0.5, else (1 + m/2) · 2^(e − 1). (The scalar
// reference decodes with its own table, runtime::e2m1_to_f32.)
inline float e2m1_code_value(int q) {
  const int e = (q >> 1) & 3, m = q & 1;
  const float mag = e == 0 ? 0.5f * float(m) : std::ldexp(1.0f + 0.5f * float(m), e - 1);
  return (q & 8) ? -mag : mag;
}

// ---- act_quant ----------------------------------------------------------------
//
// Per row i < rows of x (bf16, k >= 1 elements, row stride ldx elements), all
// arithmetic in f32 with IEEE round-to-nearest-even, in this order:
//   sym (dynamic symmetric s8, stored as u8 = s8 + 128):
//     a = max_k |x|; if a == 0: inv = 1, s = 1; else a' = max(a, 2^-119),
//     inv = 127 / a', s = a' / 127  (runtime::act_quant_step: no Inf inv)
//     q = clamp(rne(x · inv), −127, 127) + 128;  zero = 128
//   asym (dynamic asymmetric u8):
//     lo = min(0, min_k x), hi = max(0, max_k x), r = hi − lo
//     if r == 0: inv = 1, s = 1; else r' = max(r, 2^-119), inv = 255 / r', s = r' / 255
//     zero = clamp(rne(−lo · inv), 0, 255);  q = clamp(rne(x · inv) + zero, 0, 255)
//   fixed (a given per-tensor scale s > 0 and zero point z in [0, 255]):
//     inv = 1 / s (computed once by the caller: args.inv_scale);
//     q = clamp(rne(x · inv) + z, 0, 255);  zero = z
// rne(v) rounds to nearest even whatever the caller's MXCSR rounding mode
// (a caller's round-down mode moved codes by a whole step past the error
// bound); NaN and values outside int32 give INT32_MIN, as vcvtps2dq does.
// For the codes, rne(v) is taken of clamp(v, −512, 512) (so a huge x·inv cannot overflow the
// conversion; the clamps to the code range follow). In every mode a row
// holding a NaN or ±Inf (any |x| bits >= 0x7F80) gets s = NaN (so its GEMM
// outputs are NaN, as with bf16 weights) and q = zero everywhere.
// out row i: k bytes of q, then zeros up to k_padded (a multiple of 4: the
// VNNI group; the int8 kernels read whole groups), row stride ld_out bytes.
// scale[i] = s, zero[i] = the zero point (as int32).
struct ActQuantArgs {
  const uint16_t* x;
  int64_t ldx;  // elements between x rows
  int64_t rows;
  int64_t k;         // elements per row (>= 1)
  int64_t k_padded;  // >= k, multiple of 4
  uint8_t* out;
  int64_t ld_out;      // bytes between out rows (>= k_padded)
  float* scale;        // [rows]
  int32_t* zero;       // [rows]
  float inv_scale;     // fixed mode: 1 / s
  float fixed_scale;   // fixed mode: s
  int32_t fixed_zero;  // fixed mode: z
};
static_assert(offsetof(ActQuantArgs, x) == 0 && offsetof(ActQuantArgs, ldx) == 8 &&
              offsetof(ActQuantArgs, rows) == 16 && offsetof(ActQuantArgs, k) == 24 &&
              offsetof(ActQuantArgs, k_padded) == 32 && offsetof(ActQuantArgs, out) == 40 &&
              offsetof(ActQuantArgs, ld_out) == 48 && offsetof(ActQuantArgs, scale) == 56 &&
              offsetof(ActQuantArgs, zero) == 64 && offsetof(ActQuantArgs, inv_scale) == 72 &&
              offsetof(ActQuantArgs, fixed_scale) == 76 &&
              offsetof(ActQuantArgs, fixed_zero) == 80);
using ActQuantFn = void (*)(const ActQuantArgs*);

enum class ActQuantMode { sym, asym, fixed };
const char* act_quant_mode_name(ActQuantMode m);
inline std::string field_text(ActQuantMode m) {
  return act_quant_mode_name(m);
}

struct ActQuantDesc {
  static constexpr const char* kFamily = "act_quant";
  Isa isa = Isa::avx512;  // avx512 (serves amx too) or llvm
  ActQuantMode mode = ActQuantMode::sym;

  static constexpr auto field_list() {
    using D = ActQuantDesc;
    return std::make_tuple(field("isa", &D::isa, "_"), field("mode", &D::mode, "_"));
  }
  bool operator==(const ActQuantDesc& o) const { return same_fields(*this, o); }
  std::string key() const { return desc_key(*this); }
  // e.g. "act_quant_avx512_sym".
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<ActQuantDesc>(), "an ActQuantDesc member is missing from field_list()");

}  // namespace tilejit::codegen
