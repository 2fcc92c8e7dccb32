// Argument checks shared by the operators: each failure names the operator,
// the argument, the value and what is allowed.
#pragma once

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

}  // namespace tilejit::ops
