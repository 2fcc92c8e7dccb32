#include "tools/program/host_tensor.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/bf16.h"
#include "runtime/quant_formats.h"

namespace tilejit::tools {

int64_t elem_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

int64_t dense_bytes(const std::vector<int64_t>& shape, int64_t item_bytes,
                    const std::string& what) {
  int64_t n = item_bytes;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(fmt::format("{} has shape {}: a dim is negative", what, shape_str(shape)));
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  // A zero dim makes an empty tensor whatever the other dims multiply to.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  if (overflow || n > kMaxHostTensorBytes)
    throw Error(fmt::format(
        "{} has shape {} of {}-byte elements: {} bytes; allowed: at most {} GiB (the tool's cap "
        "on one tensor)",
        what, shape_str(shape), item_bytes,
        overflow ? std::string("more than 2^63") : std::to_string(n), kMaxHostTensorBytes >> 30));
  return n;
}

HostTensor HostTensor::zeros(DType dtype, std::vector<int64_t> shape, const std::string& what) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<size_t>(dense_bytes(t.shape, elem_bytes(dtype), what)), 0);
  return t;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

double HostTensor::at(int64_t i) const {
  switch (dtype) {
    case DType::bf16:
      return runtime::bf16_to_f32(data<uint16_t>()[i]);
    case DType::f16:
      return runtime::f16_to_f32(data<uint16_t>()[i]);
    case DType::f8e4m3:
    case DType::f8e5m2:
      return runtime::fp8_to_f32(*runtime::fp8_format_of(dtype), data<uint8_t>()[i]);
    case DType::i8:
      return data<int8_t>()[i];
    case DType::i32:
      return data<int32_t>()[i];
    case DType::i64:
      return static_cast<double>(data<int64_t>()[i]);
    case DType::f32:
      return data<float>()[i];
    case DType::u8:
      return data<uint8_t>()[i];
    default:
      // u4 / f4e2m1 params hold checkpoint words, not one element each.
      throw Error(fmt::format("HostTensor::at: {} has no element view", dtype_name(dtype)));
  }
}

std::vector<int64_t> bind_shape(const ir::TensorType& t, const DimBindings& dims) {
  std::vector<int64_t> s;
  for (const ir::Dim& d : t.dims) {
    if (d.is_static()) {
      s.push_back(d.value);
    } else {
      auto it = dims.find(d.symbol);
      s.push_back(it == dims.end() ? -1 : it->second);
    }
  }
  return s;
}

std::string dims_str(const ir::TensorType& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + t.dims[i].str();
  return s + "]";
}

}  // namespace tilejit::tools
