// The rule "every element of a strided tensor has its own address", in one
// place: the IR refuses such static strides where a type is written
// (ir/types.cpp), the bf16 packers refuse such views (ops::
// check_distinct_matrix). Each says it in its own words.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tilejit::runtime {

struct StrideAxis {
  size_t dim;      // the axis' index in its tensor (for messages)
  int64_t stride;  // >= 0
  int64_t extent;  // > 1 (axes of extent 0 or 1 address nothing or one place); -1: unknown
};

// Two axes whose elements meet: `outer` steps inside the span of `inner`
// (extent × stride), or `zero` when inner has stride 0 (outer == inner).
struct StrideClash {
  StrideAxis inner, outer;
  bool zero;
};

// Taken in increasing stride order, each stride must step over everything
// the smaller ones span; the first pair that does not, or nullopt. An axis
// of unknown extent says nothing about the next one.
inline std::optional<StrideClash> find_stride_clash(std::vector<StrideAxis> axes) {
  // By stride, then dim (equal strides in their tensor's order). std::sort:
  // stable_sort's temporary buffer is deprecated under clang + libstdc++ 12.
  std::sort(axes.begin(), axes.end(), [](const StrideAxis& a, const StrideAxis& b) {
    return a.stride != b.stride ? a.stride < b.stride : a.dim < b.dim;
  });
  for (size_t j = 0; j < axes.size(); ++j) {
    if (axes[j].stride == 0) return StrideClash{axes[j], axes[j], true};
    if (j == 0 || axes[j - 1].extent < 0) continue;
    int64_t span = 0;  // past int64: more than any stride
    if (__builtin_mul_overflow(axes[j - 1].stride, axes[j - 1].extent, &span) ||
        axes[j].stride < span)
      return StrideClash{axes[j - 1], axes[j], false};
  }
  return std::nullopt;
}

}  // namespace tilejit::runtime
