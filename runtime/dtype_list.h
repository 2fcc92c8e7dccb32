// Every tilejit::DType in enum order: the one list that the IR's type parser,
// the Python dtype names and a bad DType's "allowed" message read, so a new
// element type is added here once.
#pragma once

#include <array>

#include "tilejit/tilejit.h"

namespace tilejit::runtime {

inline constexpr std::array kAllDTypes = {DType::f32, DType::bf16,   DType::f16,    DType::i8,
                                          DType::u8,  DType::i32,    DType::f8e4m3, DType::u4,
                                          DType::i64, DType::f4e2m1, DType::f8e5m2};

}  // namespace tilejit::runtime
