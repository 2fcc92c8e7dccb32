// Argument checks shared by the operators: each failure names the operator,
// the argument, the value and what is allowed. Every size, extent and index
// product of a call is computed here, with overflow checks, once: the
// operators and the drivers below them may then use plain int64 arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::ops {

// "[a, b, c]"; past 11 entries the first 8, how many more, and the last 2.
std::string shape_str(const std::vector<int64_t>& v);

// Rank, a valid dtype, non-null data, strides consistent with the shape, dims
// and strides in [0, Limits::max_dim] / non-negative, data aligned to the
// element size, and a byte extent (view_bytes) within Limits::max_view_bytes
// that does not wrap the address space.
void check_view(const char* op, const char* arg, const TensorView& t, size_t rank);
void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed);
// The innermost dimension must be contiguous, the outer stride must cover it.
void check_row_major_rows(const char* op, const char* arg, const TensorView& t);
// The last two dims of t, any strides, with every element at its own address
// (a weight packed once, read in any order: a [K, N] checkpoint is the
// logical [N, K] with strides {1, N}); an Error naming the strides otherwise.
void check_distinct_matrix(const char* op, const char* arg, const TensorView& t);
// fn(r, c) over [rows, cols] in 64 × 64 tiles: a packer reading a matrix
// of any strides (check_distinct_matrix) reads a transposed one a cache
// line at a time, not a line per element.
template <class Fn>
void for_each_in_tiles(int64_t rows, int64_t cols, Fn fn) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile)
      for (int64_t r = r0; r < std::min(rows, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(cols, c0 + kTile); ++c) fn(r, c);
}

// Bytes from the first to one past the last element of a checked view (0 when empty).
int64_t view_bytes(const TensorView& t);

// An output: no two of its elements share memory (no stride 0, no rows that
// overlap). Checked on a view that passed check_view.
void check_writable(const char* op, const char* arg, const TensorView& t);
// Whether two checked views may touch a common byte. Exact for the layouts
// engines use: disjoint byte ranges; views of one dtype with the same strides
// (K and V as column halves of one cache buffer, q / k / v as slices of a
// fused qkv), whatever their shapes; views that interleave with the same
// outermost stride (K and V caches as halves of one block) without sharing a
// byte inside a period. Anything else whose byte ranges intersect counts as
// overlapping.
bool views_overlap(const TensorView& a, const TensorView& b);
// Error when out shares memory with in: "{op}: {out_arg} overlaps {in_arg}".
void check_disjoint(const char* op, const char* out_arg, const TensorView& out, const char* in_arg,
                    const TensorView& in);

// check_writable(out), then check_disjoint against every input given (a null
// view pointer is an absent optional input and is skipped).
struct NamedView {
  const char* name;
  const TensorView* view;
};
void check_output(const char* op, const char* arg, const TensorView& out,
                  std::initializer_list<NamedView> inputs);
// The view inside an optional, or null.
inline const TensorView* opt_view(const std::optional<TensorView>& v) {
  return v ? &*v : nullptr;
}

// a·b and a + b, or an Error "{op}: {what} = a·b overflows int64".
int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b);
int64_t checked_add(const char* op, const char* what, int64_t a, int64_t b);

// An Error "{op}: {arg}={value}; allowed: a finite value" for NaN / ±Inf: a
// scalar option applies to every output, so a NaN there is a caller's bug,
// not a value to propagate (NaN tensors elements propagate, docs/reliability.md).
void check_finite(const char* op, const char* arg, float value);
// a·b, or INT64_MAX when it overflows (a capacity compared against values that fit).
int64_t saturating_mul(int64_t a, int64_t b);

// A count against its documented limit: "{op}: {what}={v}; allowed: 1 .. {max}".
void check_count(const char* op, const char* what, int64_t v, int64_t min, int64_t max);

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
