// A lowered GEMM ready to run: its plan and the micro-kernels it needs,
// compiled lazily per (M tail, N tail) variant and then held in atomic slots,
// so a call on a known shape costs one table lookup and no compile.
#pragma once

#include <array>
#include <atomic>
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
  const jit::Kernel& kernel(int rows, bool n_tail, Chunk chunk);

 private:
  static constexpr int kMaxRows = 32;
  codegen::GemmPlan plan_;
  // [rows][n_tail][chunk]: filled on first use, then read without a lock.
  std::array<std::array<std::array<std::atomic<const jit::Kernel*>, 4>, 2>, kMaxRows + 1> slots_{};
};

// The executable for a spec on the active ISA: builds the IR, verifies and
// lowers it on first use; later calls are a lookup.
GemmExecutable& gemm_executable(const codegen::GemmSpec& spec, Isa isa);

}  // namespace tilejit::ops
