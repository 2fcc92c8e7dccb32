// The RoPE kernel descriptor tilejit::rope builds, exported so that a caller
// reporting which kernel a call runs (the `tilejit` tool, the llama job)
// takes the operator's own rule instead of re-deriving its fields.
#pragma once

#include <cstdint>

#include "codegen/llvm/llvm_rope.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The kernel of a rope call on q [T, hq, d] of `dtype` (and k [T, hk, d], hk
// 0 without k), positions of `pos_dtype`, a cos/sin cache of `cache_dtype`,
// with `opt` (rotary_dim 0 means d). Builds; tilejit::rope checks.
codegen::llvm_backend::RopeDesc rope_desc(const RopeOptions& opt, DType dtype, DType cache_dtype,
                                          int64_t d, int64_t hq, int64_t hk, DType pos_dtype);

}  // namespace tilejit::ops
