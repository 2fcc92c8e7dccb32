// The gemm's trip through the compiler pipeline: spec -> IR program ->
// verified -> lowered to a kernel plan.
#pragma once

#include <string>

#include "codegen/gemm_plan.h"
#include "ir/program.h"

namespace tilejit::ops {

struct LoweredGemm {
  codegen::GemmPlan plan;
  std::string ir_text;  // printed IR of the verified program
};

// The IR program of a gemm + epilogue chain (M symbolic).
ir::Function build_gemm_ir(const codegen::GemmSpec& spec);

LoweredGemm lower_gemm_spec(const codegen::GemmSpec& spec, Isa isa);

}  // namespace tilejit::ops
