// The row-wise kernel descriptors tilejit::rms_norm, fused_add_rms_norm and
// act_and_mul build, exported so that a caller reporting which kernel a
// call runs (the llama job) takes the operators' own rule.
#pragma once

#include <cstdint>
#include <optional>

#include "codegen/llvm/llvm_rowwise.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The norm of rows of h values: x, out (and residual, for the fused add:
// `residual` true) of the given dtypes, a weight of that dtype or none.
codegen::llvm_backend::RowwiseDesc norm_desc(const NormOptions& opt, bool residual, DType x,
                                             DType res, std::optional<DType> weight, DType out,
                                             int64_t h);
// act_and_mul's kernel: out rows of d values from x rows of 2·d.
codegen::llvm_backend::RowwiseDesc glu_desc(const GluOptions& opt, DType x, DType out, int64_t d);

}  // namespace tilejit::ops
