// A lowered GEMM ready to run: its plan (and the IR it came from). Its
// micro-kernels come from the kernel registry (jit::get), compiled on first
// use per (M tail, N tail, K chunk) variant.
#pragma once

#include <memory>
#include <string>

#include "codegen/gemm_plan.h"
#include "jit/kernel.h"

namespace tilejit::ops {

class GemmExecutable {
 public:
  explicit GemmExecutable(codegen::GemmPlan plan) : plan_(std::move(plan)) {}
  const codegen::GemmPlan& plan() const { return plan_; }
  std::string ir_text;  // the verified IR this plan was lowered from (for dump)

  using Chunk = codegen::GemmPlan::Chunk;
  // The micro-kernel for `rows` (1..mr) × (full block | N tail) columns, for
  // one part of the K reduction.
  const jit::Kernel& kernel(int rows, bool n_tail, Chunk chunk) const;

 private:
  codegen::GemmPlan plan_;
};

// The executable for a spec on the active ISA: builds the IR, verifies and
// lowers it on first use; later calls are a lookup.
GemmExecutable& gemm_executable(const codegen::GemmSpec& spec, Isa isa);

}  // namespace tilejit::ops
