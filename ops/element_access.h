// One element of an f32 or bf16 view, by element offset (strides applied by
// the caller), as the scalar paths of the row-wise operators read and write
// them: widened to double, and rounded back to the view's dtype (bf16: via
// f32, round to nearest even).
#pragma once

#include <cstdint>

#include "runtime/bf16.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

inline double load_element(const TensorView& x, int64_t at) {
  if (x.dtype == DType::f32) return static_cast<const float*>(x.data)[at];
  return runtime::bf16_to_f32(static_cast<const uint16_t*>(x.data)[at]);
}

inline void store_element(const TensorView& x, int64_t at, double v) {
  if (x.dtype == DType::f32)
    static_cast<float*>(x.data)[at] = static_cast<float>(v);
  else
    static_cast<uint16_t*>(x.data)[at] = runtime::f32_to_bf16(static_cast<float>(v));
}

}  // namespace tilejit::ops
