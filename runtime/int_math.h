#pragma once

#include <cstdint>

namespace tilejit::runtime {

// ceil(a / b) for a >= 0 and b >= 1, exact for every such pair. The usual
// (a + b - 1) / b overflows when b comes from a caller (a checkpoint's block
// or group size, an IR attribute) near INT64_MAX, and then a block count of 0
// let a pack accept an empty scale tensor and read past it.
constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return a / b + (a % b != 0 ? 1 : 0);
}

}  // namespace tilejit::runtime
