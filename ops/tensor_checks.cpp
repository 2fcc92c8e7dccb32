#include "ops/tensor_checks.h"

#include <fmt/format.h>

namespace tilejit::ops {

std::string shape_str(const std::vector<int64_t>& v) {
  return fmt::format("[{}]", fmt::join(v, ", "));
}

void check_view(const char* op, const char* arg, const TensorView& t, size_t rank) {
  if (t.shape.size() != rank)
    throw Error(fmt::format("{}: {} has shape {} (rank {}); allowed: rank {}", op, arg,
                            shape_str(t.shape), t.shape.size(), rank));
  if (t.strides.size() != t.shape.size())
    throw Error(fmt::format("{}: {} has {} strides {} for shape {}; allowed: one stride per dim",
                            op, arg, t.strides.size(), shape_str(t.strides), shape_str(t.shape)));
  for (size_t i = 0; i < rank; ++i) {
    if (t.shape[i] < 0)
      throw Error(fmt::format("{}: {} has shape {}; allowed: non-negative dims", op, arg,
                              shape_str(t.shape)));
    if (t.strides[i] < 0)
      throw Error(fmt::format("{}: {} has strides {}; allowed: non-negative strides", op, arg,
                              shape_str(t.strides)));
  }
  bool empty = false;
  for (int64_t d : t.shape) empty |= d == 0;
  if (t.data == nullptr && !empty)
    throw Error(fmt::format("{}: {} data is null for shape {}; allowed: a valid pointer", op, arg,
                            shape_str(t.shape)));
}

void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed) {
  std::vector<std::string> names;
  for (DType d : allowed) {
    if (d == t.dtype) return;
    names.push_back(dtype_name(d));
  }
  throw Error(fmt::format("{}: {}.dtype={} is not allowed; allowed: {}", op, arg,
                          dtype_name(t.dtype), fmt::join(names, ", ")));
}

void check_row_major_rows(const char* op, const char* arg, const TensorView& t) {
  const size_t r = t.shape.size();
  if (r == 0) return;
  if (t.strides[r - 1] != 1 && t.shape[r - 1] > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: innermost stride 1", op, arg,
                            shape_str(t.strides)));
  if (r >= 2 && t.shape[r - 2] > 1 && t.strides[r - 2] < t.shape[r - 1])
    throw Error(fmt::format("{}: {} has row stride {} < row length {}; allowed: row stride >= {}",
                            op, arg, t.strides[r - 2], t.shape[r - 1], t.shape[r - 1]));
}

void check_index_dtype(const char* op, const char* arg, const TensorView& t) {
  check_dtype(op, arg, t, {DType::i32, DType::i64});
}

}  // namespace tilejit::ops
