// The row operands of the row-wise op tests (tests/rowwise_test.cpp,
// tests/norm_variants_test.cpp): rows × h values of f32 or bf16 with padding
// between rows that must keep its marker, ending at a guard page.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "runtime/bf16.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {

constexpr uint16_t kPadBf16 = 0x7fa5;  // a NaN payload no kernel writes
constexpr uint32_t kPadF32 = 0x7fc0a5a5u;

// rows × h values of `dtype` with `pad` elements after each row, ending at a
// guard page; the padding holds a marker that must survive every call.
class Operand {
 public:
  Operand(DType dtype, int64_t rows, int64_t h, int64_t pad = 0)
      : dtype_(dtype),
        rows_(rows),
        h_(h),
        stride_(h + pad),
        buf_(std::make_unique<GuardedBuffer>(std::max<size_t>(
            1, static_cast<size_t>(rows > 0 ? (rows - 1) * stride_ + h : 0) * elem()))) {
    for (int64_t i = 0; i < count(); ++i) set_raw_pad(i);
  }

  size_t elem() const { return dtype_ == DType::f32 ? 4 : 2; }
  int64_t count() const { return rows_ > 0 ? (rows_ - 1) * stride_ + h_ : 0; }
  int64_t at(int64_t r, int64_t i) const { return r * stride_ + i; }

  double get(int64_t r, int64_t i) const { return get_flat(at(r, i)); }
  double get_flat(int64_t k) const {
    if (dtype_ == DType::f32) return buf_->as<float>()[k];
    return runtime::bf16_to_f32(buf_->as<uint16_t>()[k]);
  }
  // Stores v rounded to the dtype (bf16: round to nearest even via f32).
  void set(int64_t r, int64_t i, double v) {
    if (dtype_ == DType::f32)
      buf_->as<float>()[at(r, i)] = static_cast<float>(v);
    else
      buf_->as<uint16_t>()[at(r, i)] = runtime::f32_to_bf16(static_cast<float>(v));
  }
  void fill_random(uint32_t seed, float lo = -2, float hi = 2) {
    const auto v = random_f32(static_cast<size_t>(rows_ * h_), seed, lo, hi);
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t i = 0; i < h_; ++i) set(r, i, v[r * h_ + i]);
  }
  // Whether every padding element still holds the marker.
  bool padding_intact() const {
    for (int64_t r = 0; r + 1 < rows_; ++r)
      for (int64_t i = h_; i < stride_; ++i)
        if (!is_pad(at(r, i))) return false;
    return true;
  }
  TensorView view() const { return view_as({rows_, h_}); }
  // [b, rows / b, h] (rows a multiple of b).
  TensorView view3(int64_t b) const { return view_as({b, rows_ / b, h_}); }
  DType dtype() const { return dtype_; }

 private:
  TensorView view_as(std::vector<int64_t> shape) const {
    TensorView v;
    v.data = buf_->data();
    v.dtype = dtype_;
    v.shape = shape;
    v.strides.assign(shape.size(), 1);
    for (size_t i = shape.size() - 1; i-- > 0;)
      v.strides[i] = (i == shape.size() - 2 ? stride_ : v.strides[i + 1] * shape[i + 1]);
    return v;
  }
  void set_raw_pad(int64_t k) {
    if (dtype_ == DType::f32)
      std::memcpy(buf_->as<float>() + k, &kPadF32, 4);
    else
      buf_->as<uint16_t>()[k] = kPadBf16;
  }
  bool is_pad(int64_t k) const {
    if (dtype_ == DType::f32) return std::memcmp(buf_->as<float>() + k, &kPadF32, 4) == 0;
    return buf_->as<uint16_t>()[k] == kPadBf16;
  }

  DType dtype_;
  int64_t rows_, h_, stride_;
  std::unique_ptr<GuardedBuffer> buf_;
};

inline bool same_special(double got, double ref) {
  if (std::isnan(ref)) return std::isnan(got);
  if (std::isinf(ref)) return got == ref;
  return false;
}

}  // namespace tilejit::test
