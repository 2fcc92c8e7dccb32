// A lowered GEMM ready to run: its plan (and the IR it came from). Its
// micro-kernels come from the kernel registry (jit::get), compiled on first
// use per (M tail, N tail, K chunk) variant.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

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
// The same with a tuning database entry's overrides (tuned_gemm).
GemmExecutable& gemm_executable(const codegen::GemmSpec& spec, Isa isa,
                                const codegen::PlanOverrides& tuned);
// The tuned overrides for a bf16 GEMM of m rows on `path` (none when the
// loaded tuning database has no entry for its shape class). Valid until the
// thread's next call.
const codegen::PlanOverrides& tuned_gemm(Isa path, const codegen::GemmSpec& spec, int64_t m);

codegen::BiasKind bias_kind(const GemmOptions& opt);
// The spec of a bf16-weight gemm / gemm_batched call (n × k, opt's bias and
// activation, out dtype), in batch-invariant mode when the process is
// (runtime::batch_invariant).
codegen::GemmSpec bf16_gemm_spec(int64_t n, int64_t k, const GemmOptions& opt, DType out);

// One GEMM run of a plan over M rows: the driver every tilejit::gemm format
// shares (the schedule's slices, tasks and K passes; run_row_block per task).
struct GemmRun {
  int64_t m = 0;
  const uint8_t* x = nullptr;  // A row 0 (bf16, or u8 for int8 plans)
  int64_t lda = 0;             // bytes between A rows
  // When set: called once per slice of `rows` rows from row s0 on the
  // calling thread; returns that slice's A (and sets its row stride), e.g.
  // x quantized or gathered into a scratch.
  std::function<const uint8_t*(int64_t s0, int64_t rows, int64_t* lda)> prepare_slice;
  uint8_t* y = nullptr;
  int64_t ldc = 0, y_elem = 2;
  const uint8_t* bias = nullptr;
  int64_t bias_elem = 4;
  const uint8_t* b = nullptr;  // packed B block 0
  int64_t block_bytes = 0;     // bytes between packed B blocks
  // int8 plans: per row of the current slice (prepare_slice sets them) and per column.
  const float* a_scale = nullptr;
  const int32_t* a_zero = nullptr;
  const float* b_scale = nullptr;
  const int32_t* b_comp = nullptr;

  // x, y and the bias of a (checked) gemm call; B and the int8 fields are the caller's.
  static GemmRun of(const TensorView& x, const TensorView& y, const GemmOptions& opt);
};
void run_gemm_plan(const GemmExecutable& exe, GemmRun& r);
// Runs of one plan and one M (a batch of GEMMs of one shape): one parallel
// pass over every run's tasks where the plan's schedule is a single pass
// (no packed A, no K passes, one slice), else run_gemm_plan for each.
void run_gemm_batch(const GemmExecutable& exe, std::vector<GemmRun>& runs);

}  // namespace tilejit::ops
