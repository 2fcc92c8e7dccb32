#include "ops/gemm_task.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"

namespace tilejit::ops {

void run_row_block(GemmExecutable& exe, const RowBlockJob& job) {
  using Chunk = codegen::GemmPlan::Chunk;
  const codegen::GemmPlan& plan = exe.plan();
  const int mr = plan.mr;
  const int64_t m_blocks = (job.rows + mr - 1) / mr;
  // K chunks pay off only when the B chunk is reused by several M blocks.
  const int64_t k_chunks = m_blocks > 1 ? plan.k_chunks : 1;
  // Partial sums keep every computed column of the block (64, also for a GLU,
  // which pairs them only in the last chunk).
  constexpr int64_t kCols = codegen::PackedLayout::kBlockN;
  thread_local std::vector<float> partial;
  if (k_chunks > 1) partial.resize(static_cast<size_t>(m_blocks * mr * kCols));
  const int64_t k = plan.spec.k;
  const int64_t k_full = k / 32 * 32;
  alignas(64) uint16_t a_tail[32 * 32];
  for (int64_t kci = 0; kci < k_chunks; ++kci) {
    const Chunk chunk = k_chunks == 1         ? Chunk::whole
                        : kci == 0            ? Chunk::first
                        : kci == k_chunks - 1 ? Chunk::last
                                              : Chunk::middle;
    const bool epilogue = chunk == Chunk::whole || chunk == Chunk::last;
    const void* b_ptr = job.b_block + kci * plan.kc / 2 * codegen::PackedLayout::kRowBytes;
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      const int64_t m0 = mb * mr;
      const int rows = static_cast<int>(std::min<int64_t>(mr, job.rows - m0));
      const void* a_ptr = job.a + m0 * job.lda + kci * plan.kc * 2;
      float* part = k_chunks > 1 ? partial.data() + m0 * kCols : nullptr;
      codegen::BrgemmArgs args{};
      args.a = &a_ptr;
      args.b = &b_ptr;
      args.batch = 1;
      args.lda = job.lda;
      args.c = epilogue ? static_cast<void*>(job.c + m0 * job.ldc) : part;
      args.ldc = epilogue ? job.ldc : kCols * 4;
      args.bias = job.bias;
      args.acc_in = part;
      args.ld_acc_in = kCols * 4;
      if (plan.k_tail != 0 && epilogue) {
        // AMX K tail: a zero-padded copy of the last (K % 32) columns, so
        // tile loads never read past a row of A.
        std::memset(a_tail, 0, sizeof a_tail);
        for (int r = 0; r < rows; ++r)
          std::memcpy(a_tail + r * 32, job.a + (m0 + r) * job.lda + k_full * 2, plan.k_tail * 2);
        args.a_tail = a_tail;
      }
      exe.kernel(rows, job.n_tail, chunk).entry<codegen::BrgemmFn>()(&args);
    }
  }
}

}  // namespace tilejit::ops
