// Argument checks shared by the operators: each failure names the operator,
// the argument, the value and what is allowed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::ops {

std::string shape_str(const std::vector<int64_t>& v);

// Rank, non-null data, strides consistent with the shape and non-negative.
void check_view(const char* op, const char* arg, const TensorView& t, size_t rank);
void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed);
// The innermost dimension must be contiguous, the outer stride must cover it.
void check_row_major_rows(const char* op, const char* arg, const TensorView& t);

// Index tensors (slot_mapping, positions) come as int32 or int64: PyTorch
// engines hand over int64, C++ engines int32. The dtype must be one of the two.
void check_index_dtype(const char* op, const char* arg, const TensorView& t);
// Element `offset` (in elements, strides already applied) of an i32 or i64
// index tensor, widened to int64 so one range check covers both dtypes.
inline int64_t index_at(const TensorView& t, int64_t offset) {
  if (t.dtype == DType::i64) return static_cast<const int64_t*>(t.data)[offset];
  return static_cast<const int32_t*>(t.data)[offset];
}

}  // namespace tilejit::ops
