#include "ops/gemm_ir.h"

namespace tilejit::ops {

// Placeholder until ir/ lands: plans straight from the spec.
LoweredGemm lower_gemm_spec(const codegen::GemmSpec& spec, Isa isa) {
  return {codegen::plan_gemm(spec, isa), ""};
}

}  // namespace tilejit::ops
