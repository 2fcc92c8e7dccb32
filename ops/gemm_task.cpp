#include "ops/gemm_task.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "runtime/aligned_buffer.h"
#include "runtime/per_thread.h"
#include "runtime/thread_pool.h"

namespace tilejit::ops {

void run_row_block(const GemmExecutable& exe, const RowBlockJob& job) {
  using Chunk = codegen::GemmPlan::Chunk;
  const codegen::GemmPlan& plan = exe.plan();
  const int mr = plan.mr;
  const int64_t m_blocks = (job.rows + mr - 1) / mr;
  const bool one_chunk = job.only_chunk >= 0;
  const int64_t k_chunks = one_chunk ? plan.k_chunks : plan.k_chunks_for(job.rows);
  // Partial sums keep every computed column of the block (64, also for a GLU,
  // which pairs them only in the last chunk).
  constexpr int64_t kCols = codegen::PackedLayout::kBlockN;
  auto& own_partial = runtime::per_thread<std::vector<float>>([] {});
  float* partial = job.partial;
  int64_t ld_partial = job.ld_partial;
  if (k_chunks > 1 && !one_chunk) {
    own_partial.resize(static_cast<size_t>(m_blocks * mr * kCols));
    partial = own_partial.data();
    ld_partial = kCols * 4;
  }
  const codegen::PackedA pa = plan.packed_a();
  const int64_t kc0 = one_chunk ? job.only_chunk : 0;
  const int64_t kc1 = one_chunk ? job.only_chunk + 1 : k_chunks;
  // The kernel of the previous call: only the last row block differs.
  const jit::Kernel* kernel = nullptr;
  int kernel_rows = 0;
  for (int64_t kci = kc0; kci < kc1; ++kci) {
    const Chunk chunk = k_chunks == 1         ? Chunk::whole
                        : kci == 0            ? Chunk::first
                        : kci == k_chunks - 1 ? Chunk::last
                                              : Chunk::middle;
    const bool epilogue = chunk == Chunk::whole || chunk == Chunk::last;
    const int64_t b_offset = plan.b_offset(kci * plan.kc);
    const void* b_ptr = job.b_is_chunk ? job.b_block : job.b_block + b_offset;
    // The B rows this chunk reads: its K padded to whole K steps, in k-pair rows.
    const int64_t step = codegen::amx_k_step_of(plan.spec.int8() ? DType::u8 : DType::bf16);
    const int64_t b_bytes = plan.b_offset((plan.chunk_k(chunk) + step - 1) / step * step);
    kernel = nullptr;
    for (int64_t mb = 0; mb < m_blocks; ++mb) {
      const int64_t m0 = mb * mr;
      const int rows = static_cast<int>(std::min<int64_t>(mr, job.rows - m0));
      const void* a_ptr = plan.a_packed ? job.a + pa.offset(m0, plan.a_offset(kci * plan.kc) / 2)
                                        : job.a + m0 * job.lda + plan.a_offset(kci * plan.kc);
      float* part =
          k_chunks > 1
              ? reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(partial) + m0 * ld_partial)
              : nullptr;
      codegen::BrgemmArgs args{};
      args.a = &a_ptr;
      args.b = &b_ptr;
      args.batch = 1;
      args.lda = job.lda;
      args.c = epilogue ? static_cast<void*>(job.c + m0 * job.ldc) : part;
      args.ldc = epilogue ? job.ldc : ld_partial;
      args.bias = job.bias;
      args.acc_in = part;
      args.ld_acc_in = ld_partial;
      if (job.a_scale != nullptr) {  // int8
        args.a_scale = job.a_scale + m0;
        args.a_zero = job.a_zero + m0;
        args.b_scale = job.b_scale;
        args.b_comp = job.b_comp;
      }
      if (job.b_next != nullptr && plan.a_packed && mb > 0) {
        // Call mb pulls its share of the next block's B chunk into L2.
        const int64_t share = codegen::xbyak::amx_b_prefetch_bytes(
            plan.ukernel(rows, job.n_tail ? plan.n_tail : plan.nb, chunk));
        if ((mb - 1) * share < b_bytes) args.b_prefetch = job.b_next + b_offset + (mb - 1) * share;
      }
      if (kernel == nullptr || rows != kernel_rows) {
        kernel = &exe.kernel(rows, job.n_tail, chunk);
        kernel_rows = rows;
      }
      kernel->entry<codegen::BrgemmFn>()(&args);
    }
  }
}

void pack_a_rows(const uint8_t* a, int64_t lda, int64_t rows, int64_t k, uint8_t* dst) {
  const codegen::PackedA pa{k};
  const int64_t full = k / 32, tail = k % 32;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = a + r * lda;
    uint8_t* d = dst + pa.offset(r, 0);
    for (int64_t s = 0; s < full; ++s)
      std::memcpy(d + s * codegen::PackedA::kStepBytes, src + s * 64, 64);
    if (tail != 0) {
      uint8_t* dt = d + full * codegen::PackedA::kStepBytes;
      std::memcpy(dt, src + full * 64, tail * 2);
      std::memset(dt + tail * 2, 0, 64 - tail * 2);
    }
  }
}

void pack_a(const uint8_t* a, int64_t lda, int64_t rows, int64_t k, uint8_t* dst) {
  constexpr int64_t kRows = codegen::PackedA::kBlockRows;
  const codegen::PackedA pa{k};
  runtime::parallel_for((rows + kRows - 1) / kRows, [&](int64_t mb) {
    const int64_t r0 = mb * kRows;
    pack_a_rows(a + r0 * lda, lda, std::min(kRows, rows - r0), k, dst + pa.offset(r0, 0));
  });
}

uint8_t* packed_a_scratch(int slot, int64_t bytes) {
  struct Scratch {
    std::unique_ptr<std::byte[], runtime::FreeDeleter> mem;
    int64_t bytes = 0;
  };
  auto& s = runtime::per_thread<std::array<Scratch, 8>>([] {});
  Scratch& b = s[slot];
  if (b.bytes < bytes) {
    b.mem = runtime::aligned_alloc_bytes(static_cast<size_t>(bytes));
    b.bytes = bytes;
  }
  return reinterpret_cast<uint8_t*>(b.mem.get());
}

}  // namespace tilejit::ops
