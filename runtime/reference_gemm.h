// The scalar reference GEMM: the oracle of every test and the last fallback.
// Written for clarity, double accumulation, no code shared with the JIT paths.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/bf16.h"
#include "tilejit/tilejit.h"

namespace tilejit::runtime {

inline double reference_activation(Activation act, double v) {
  switch (act) {
    case Activation::none:
      return v;
    // max(v, 0) with IEEE NaN propagation (relu(NaN) = NaN, as torch's) and
    // relu(−0) = −0: the JIT epilogues' vmaxps with v as its second operand.
    case Activation::relu:
      return v < 0 ? 0 : v;
    case Activation::relu2:
      return v < 0 ? 0 : v * v;
    case Activation::silu:
      return v / (1.0 + std::exp(-v));
    case Activation::gelu_tanh: {
      const double k = std::sqrt(2.0 / M_PI);
      return 0.5 * v * (1.0 + std::tanh(k * (v + 0.044715 * v * v * v)));
    }
    case Activation::gelu_erf:
      return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  }
  return v;
}

struct ReferenceGemmArgs {
  const uint16_t* x = nullptr;  // bf16 [M, K], row stride ldx elements
  int64_t ldx = 0;
  int64_t m = 0, n = 0, k = 0;
  const void* bias = nullptr;  // [N] of bias_dtype, or null
  DType bias_dtype = DType::f32;
  Activation act = Activation::none;
  void* y = nullptr;  // [M, N] f32 or bf16, row stride ldy elements
  DType y_dtype = DType::f32;
  int64_t ldy = 0;
};

// y = act(x · wᵀ + bias); w_at(n, k) returns the bf16 bits of w[n, k], so the
// same oracle reads a plain [N, K] weight or a packed one.
template <class WAt>
void reference_gemm(const ReferenceGemmArgs& a, WAt&& w_at) {
  for (int64_t i = 0; i < a.m; ++i) {
    for (int64_t j = 0; j < a.n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < a.k; ++kk)
        acc += double(bf16_to_f32(a.x[i * a.ldx + kk])) * double(bf16_to_f32(w_at(j, kk)));
      if (a.bias != nullptr)
        acc += a.bias_dtype == DType::f32
                   ? double(static_cast<const float*>(a.bias)[j])
                   : double(bf16_to_f32(static_cast<const uint16_t*>(a.bias)[j]));
      const double v = reference_activation(a.act, acc);
      if (a.y_dtype == DType::f32)
        static_cast<float*>(a.y)[i * a.ldy + j] = static_cast<float>(v);
      else
        static_cast<uint16_t*>(a.y)[i * a.ldy + j] = f32_to_bf16(static_cast<float>(v));
    }
  }
}

}  // namespace tilejit::runtime
