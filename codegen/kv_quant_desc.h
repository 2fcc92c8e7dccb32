// The kv_quant kernel: store_kv's conversion of one token's bf16 K or V rows
// into an f8e4m3 or f8e5m2 cache row (docs/attention.md, "fp8 KV cache").
//
// For each head h < heads and element e < d, in f32:
//   q   = bf16_to_f32(x[h·x_head + e]) / scales[h]     (IEEE division, nearest even)
//   out[h·out_head + e] = runtime::f32_to_fp8(format, q)
// i.e. nearest code with ties to the even code, |q| past the largest finite
// value (448 e4m3, 57344 e5m2; ±Inf too) saturated to it, NaN stored as 0x7F,
// |q| below half the least subnormal as ±0. The
// division follows the caller's MXCSR (rounding mode, DAZ / FTZ) exactly as
// the reference's C++ division does; the rounding to a subnormal code is
// nearest-even in every mode (the reference's is exact integer arithmetic;
// the kernels use embedded rounding / vroundps immediates).
//
// Every emitter (Xbyak AVX-512 for the avx512 and amx paths, LLVM for the llvm
// path) reproduces runtime::f32_to_fp8 bit for bit (tests/kv_quant_test.cpp
// runs every bf16 pattern through each); the scalar path calls that function.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "codegen/kernel_desc.h"
#include "tilejit/tilejit.h"

namespace tilejit::codegen {

struct KvQuantArgs {
  const uint16_t* x;    // bf16: head h's d elements at x + h·x_head
  int64_t x_head;       // elements between heads of x
  uint8_t* out;         // fp8 codes: head h's d bytes at out + h·out_head
  int64_t out_head;     // bytes between heads of out
  const float* scales;  // [heads] f32 (store_kv: finite, > 0)
  int64_t heads;        // >= 0
  int64_t d;            // elements a head, >= 0
};
static_assert(offsetof(KvQuantArgs, x) == 0 && offsetof(KvQuantArgs, x_head) == 8 &&
              offsetof(KvQuantArgs, out) == 16 && offsetof(KvQuantArgs, out_head) == 24 &&
              offsetof(KvQuantArgs, scales) == 32 && offsetof(KvQuantArgs, heads) == 40 &&
              offsetof(KvQuantArgs, d) == 48);
using KvQuantFn = void (*)(const KvQuantArgs*);

struct KvQuantDesc {
  static constexpr const char* kFamily = "kv_quant";
  Isa isa = Isa::avx512;       // avx512 (serves amx too) or llvm
  DType code = DType::f8e4m3;  // the cache's element type: f8e4m3 or f8e5m2

  static constexpr auto field_list() {
    using D = KvQuantDesc;
    return std::make_tuple(field("isa", &D::isa, "_"), field("code", &D::code, "_"));
  }
  bool operator==(const KvQuantDesc& o) const { return same_fields(*this, o); }
  std::string key() const { return desc_key(*this); }
  // e.g. "kv_quant_avx512_f8e4m3".
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<KvQuantDesc>(), "a KvQuantDesc member is missing from field_list()");

}  // namespace tilejit::codegen
