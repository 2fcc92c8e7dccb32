// The tensors the program runner holds: owned, dense, C-order host buffers of
// an IR dtype, by value name, and the symbolic dims bound to sizes. Shapes
// come from a .tir file, --dim or a .npy header, so every size is computed
// with overflow checks and capped (kMaxHostTensorBytes) before any allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "ir/program.h"
#include "ops/tensor_checks.h"
#include "tilejit/tilejit.h"

namespace tilejit::tools {

// The largest tensor the runner holds (an input read from a .npy file, a
// generated input, a result, a scratch between calls): shapes from a .tir
// file, --dim or a .npy header past it are refused before any allocation.
inline constexpr int64_t kMaxHostTensorBytes = int64_t(16) << 30;

// Bytes of one element of `t` (a sub-byte dtype counts 1).
int64_t elem_bytes(DType t);

// The bytes of a dense tensor of `shape` with `item_bytes`-byte elements,
// computed with overflow checks: Error naming `what`, the shape and the cap
// when a dim is negative or the product overflows int64 or exceeds
// kMaxHostTensorBytes.
int64_t dense_bytes(const std::vector<int64_t>& shape, int64_t item_bytes, const std::string& what);

// An owned, dense, C-order host tensor of an IR dtype (bf16 as its bit pattern).
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  // Error (dense_bytes, kMaxHostTensorBytes) naming `what` when the shape is too large.
  static HostTensor zeros(DType dtype, std::vector<int64_t> shape,
                          const std::string& what = "a tensor");
  int64_t numel() const;
  // Element i (row-major) as a double: f32, bf16, f16, f8e4m3, f8e5m2, i8, u8, i32,
  // i64 (every dtype a result can have); an Error for u4 / f4e2m1, whose
  // params hold checkpoint words, not one element each.
  double at(int64_t i) const;
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

// Inputs and outputs by value name (without the '%').
using TensorMap = std::map<std::string, HostTensor>;
// Values of the symbolic dims ("M" -> 512).
using DimBindings = std::map<std::string, int64_t>;

// The dims of `t` with symbols replaced by their bindings ("?M" unbound → -1).
std::vector<int64_t> bind_shape(const ir::TensorType& t, const DimBindings& dims);
// "[?M, 1024]" (the IR dims); shape_str (ops/tensor_checks.h) gives "[7, 1024]".
std::string dims_str(const ir::TensorType& t);
using ops::shape_str;

}  // namespace tilejit::tools
