// IR -> GEMM kernel plan: recognises a gemm followed by a fusable epilogue
// chain (add bias[N] → one activation → cast) and lowers it.
#pragma once

#include "codegen/gemm_plan.h"
#include "ir/program.h"

namespace tilejit::codegen {

// The GemmSpec a verified function computes. Throws tilejit::Error naming the
// op that cannot be fused and the chain that can.
GemmSpec match_gemm(const ir::Function& f);

// match_gemm + plan_gemm.
GemmPlan lower_gemm(const ir::Function& f, Isa isa);

}  // namespace tilejit::codegen
