// The RoPE kernel descriptor tilejit::rope builds, exported so that a caller
// reporting which kernel a call runs (the `tilejit` tool, the llama job)
// takes the operator's own rule instead of re-deriving its fields.
#pragma once

#include <cstdint>
#include <string>

#include "codegen/llvm/llvm_rope.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The kernel of a rope call on q [T, hq, d] of `dtype` (and k [T, hk, d], hk
// 0 without k), positions of `pos_dtype`, a cos/sin cache of `cache_dtype`,
// with `opt` (rotary_dim 0 means d). Builds; tilejit::rope checks.
codegen::llvm_backend::RopeDesc rope_desc(const RopeOptions& opt, DType dtype, DType cache_dtype,
                                          int64_t d, int64_t hq, int64_t hk, DType pos_dtype);

// The head rules of a rope call, tilejit::rope's own checks (tune's
// workload parser calls them too): a head size D even, >= 2 and <=
// Limits::max_head_dim (`of_d` says where D comes from, e.g. "q has head
// size D=64 (shape [...])" is "q", " (shape [...])"); rotary_dim (resolved:
// 0 is D) a multiple of 2·ndim in [2, D]. Errors name `op`.
void check_rope_head_size(const char* op, const char* arg, int64_t d, const std::string& shape);
void check_rotary_dim(const char* op, int64_t rotary_dim, int64_t d, int64_t ndim);

}  // namespace tilejit::ops
