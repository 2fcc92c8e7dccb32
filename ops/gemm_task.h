// One column block of a GEMM over a contiguous run of rows: the loop every
// GEMM driver (tilejit::gemm, fused_experts) runs inside a task. It cuts the
// rows into micro-kernel blocks of plan.mr, carries fp32 partial sums across
// K chunks when the B panel is reused by several row blocks, and gives the
// AMX kernel its zero-padded copy of A's K tail.
#pragma once

#include <cstdint>

#include "ops/gemm_executable.h"

namespace tilejit::ops {

struct RowBlockJob {
  const uint8_t* a = nullptr;  // A[0, 0] of the run (bf16)
  int64_t lda = 0;             // bytes between A rows
  int64_t rows = 0;
  const uint8_t* b_block = nullptr;  // the packed B block of this column block
  uint8_t* c = nullptr;              // C[0, first column of the block]
  int64_t ldc = 0;                   // bytes between C rows
  const void* bias = nullptr;        // bias of this column block, or null
  bool n_tail = false;               // the block is the plan's N tail
};

void run_row_block(GemmExecutable& exe, const RowBlockJob& job);

}  // namespace tilejit::ops
