// The scalar references of the row-wise ops (docs/rowwise.md): the oracle of
// tests/rowwise_test.cpp and the scalar path of ops/rowwise.cpp. One row at a
// time, in double, straight from the definitions; no code shared with the
// JIT path (the residual add excepted: its f32 sum and rounding to the
// residual's dtype are the definition, so the reference performs them too).
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/reference_gemm.h"

namespace tilejit::runtime {

// 1 / sqrt(mean(v²) + eps) over the h values of a row.
inline double reference_rstd(const double* v, int64_t h, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < h; ++i) sum += v[i] * v[i];
  return 1.0 / std::sqrt(sum / static_cast<double>(h) + eps);
}

// The normalised value of element i: v·rstd·w, w the weight (1 without one,
// 1 + w for Gemma's weight_plus_one).
inline double reference_norm_value(double v, double rstd, double w) {
  return v * rstd * w;
}

// LayerNorm's statistics of a row: the mean, and 1 / sqrt(var + eps) with
// var the population variance, each by its definition (two passes).
struct ReferenceMoments {
  double mean = 0, rstd = 0;
};
inline ReferenceMoments reference_moments(const double* v, int64_t h, double eps) {
  double sum = 0;
  for (int64_t i = 0; i < h; ++i) sum += v[i];
  ReferenceMoments m;
  m.mean = sum / static_cast<double>(h);
  double sq = 0;
  for (int64_t i = 0; i < h; ++i) sq += (v[i] - m.mean) * (v[i] - m.mean);
  m.rstd = 1.0 / std::sqrt(sq / static_cast<double>(h) + eps);
  return m;
}

// LayerNorm's value of element i: (v - mean)·rstd·w + b (w 1, b 0 without).
inline double reference_layer_norm_value(double v, const ReferenceMoments& m, double w, double b) {
  return (v - m.mean) * m.rstd * w + b;
}

// The gated norm's gate, act(g), and with the gate first its value
// x·act(g): f32 values by definition (the kernels form them in f32, and an
// overflow there is ±Inf on every path), so the reference rounds them too.
inline float reference_gate(Activation act, double g) {
  return static_cast<float>(reference_activation(act, g));
}
inline float reference_gated_value(Activation act, double x, double g) {
  return static_cast<float>(x * static_cast<double>(reference_gate(act, g)));
}

// The residual add: x + residual in f32 (one rounding), then rounded to the
// residual's dtype by `round` (f32: identity; bf16: round to nearest even).
template <class Round>
float reference_residual_sum(float x, float residual, Round round) {
  return round(x + residual);
}

}  // namespace tilejit::runtime
