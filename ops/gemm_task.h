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
  // A[0, 0] of the run (bf16): row-major with lda, or, when plan.a_packed, the
  // PackedA block holding the run's first row (the run starts a 32-row block).
  const uint8_t* a = nullptr;
  int64_t lda = 0;  // bytes between A rows (row-major A only)
  int64_t rows = 0;
  const uint8_t* b_block = nullptr;  // the packed B block of this column block
  uint8_t* c = nullptr;              // C[0, first column of the block]
  int64_t ldc = 0;                   // bytes between C rows
  const void* bias = nullptr;        // bias of this column block, or null
  bool n_tail = false;               // the block is the plan's N tail
  // AMX: the packed B block the thread will likely run next (or null): the
  // calls after the first, whose B is in L2 by then, pull it into L2 so the
  // next job does not start on an L3 stream.
  const uint8_t* b_next = nullptr;
  // K chunks: by default the job runs every chunk of the plan in turn with
  // its partial sums in a thread-local scratch. A driver that runs the chunks
  // as separate passes over many jobs (so one K chunk of A stays in L2 while
  // the column blocks stream by) sets `only_chunk` and gives each job its own
  // fp32 partial sums [rows][64] with `ld_partial` bytes between rows.
  int64_t only_chunk = -1;
  float* partial = nullptr;
  int64_t ld_partial = 0;
  // b_block already points at the rows of the chunk being run (a dequantized
  // copy of just that chunk) instead of the start of the whole K panel.
  bool b_is_chunk = false;
  // int8 (W8A8) plans: the rows' activation scales and zero points (from the
  // run's first row) and the block's weight scales and compensation sums.
  const float* a_scale = nullptr;
  const int32_t* a_zero = nullptr;
  const float* b_scale = nullptr;
  const int32_t* b_comp = nullptr;
};

void run_row_block(const GemmExecutable& exe, const RowBlockJob& job);

// Copies rows [0, rows) of row-major bf16 A (k columns, lda bytes between rows)
// into the PackedA tile layout at dst (PackedA{k}.bytes(rows) bytes, 64-byte
// aligned), zero past column k. Splits the rows over the thread pool.
void pack_a(const uint8_t* a, int64_t lda, int64_t rows, int64_t k, uint8_t* dst);
// The same on the calling thread only (for callers that split work themselves).
void pack_a_rows(const uint8_t* a, int64_t lda, int64_t rows, int64_t k, uint8_t* dst);

// A grown-on-demand, 64-byte aligned scratch for a packed A, one per thread
// and per purpose, so concurrent callers on their own threads never share one.
enum ScratchSlot : int {
  kGemmA = 0,         // gemm's packed A
  kGemmPartial = 1,   // gemm's K-pass partial sums
  kMoeA = 2,          // fused_experts' packed A
  kMoeAct = 3,        // fused_experts' intermediate
  kQuantB = 4,        // quantized gemm: a dequantized B chunk
  kQuantX = 5,        // quantized gemm: x gathered (act-order) or quantized (int8)
  kQuantPartial = 6,  // quantized gemm: a task's partial sums
  kQuantAPacked = 7,  // quantized gemm: the AMX tile copy of x
};
uint8_t* packed_a_scratch(int slot, int64_t bytes);

}  // namespace tilejit::ops
