// The row-wise kernel descriptors tilejit's norms and act_and_mul build,
// exported so that a caller reporting which kernel a call runs (the llama
// job) takes the operators' own rule.
#pragma once

#include <cstdint>
#include <optional>

#include "codegen/llvm/llvm_rowwise.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The norm `op` (rms_norm, add_rms_norm, layer_norm, add_layer_norm) of
// rows of h values: x, out (and res, for the add norms) of the given
// dtypes, a weight and a bias (layer norms) of those dtypes or none.
codegen::llvm_backend::RowwiseDesc norm_desc(codegen::llvm_backend::RowOp op,
                                             const NormOptions& opt, DType x, DType res,
                                             std::optional<DType> weight, DType out, int64_t h,
                                             std::optional<DType> bias = std::nullopt);
// rms_norm_gated's kernel.
codegen::llvm_backend::RowwiseDesc gated_norm_desc(const GatedNormOptions& opt, DType x, DType gate,
                                                   std::optional<DType> weight, DType out,
                                                   int64_t h);
// act_and_mul's kernel: out rows of d values from x rows of 2·d.
codegen::llvm_backend::RowwiseDesc glu_desc(const GluOptions& opt, DType x, DType out, int64_t d);

}  // namespace tilejit::ops
