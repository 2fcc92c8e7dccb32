// The batch-reduce GEMM micro-kernel: its call arguments and its specialization.
//
//   C[mr × nr] = epilogue( Σ_{i < batch} A_i[mr × kb] · B_i[kb × nr] )
//
// A_i is bf16 row-major (row stride lda bytes); B_i is a block of the packed
// weight layout (see packed_layout.h): k-pair rows of `b_row_bytes`, each row
// holding 64 columns × 2 bf16. The epilogue (bias, activation, conversion) is
// fused into the store. Every emitter (AMX, AVX-512) implements this contract.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "tilejit/tilejit.h"

namespace tilejit::codegen {

// Passed by pointer in the first argument register. The emitters address its
// fields by offsetof (JitGenerator::arg, the LLVM emitter's field()); the
// layout below is also the C ABI the disk cache's stored kernels were built
// against, which the static_assert pins.
struct BrgemmArgs {
  const void* const* a;  // [batch] A block pointers
  const void* const* b;  // [batch] packed B block pointers
  int64_t batch;
  int64_t lda;       // bytes between A rows
  void* c;           // C[0, 0]
  int64_t ldc;       // bytes between C rows
  const void* bias;  // bias[0] of this column block, or null
  // AMX only: zero-padded copy of the last A block's K tail (kb % 32 columns,
  // rows of 64 bytes), so tile loads never read past the end of a row.
  const void* a_tail;
  // With desc.accumulate: fp32 partial sums of earlier K chunks, added before
  // the epilogue (may alias c when both are f32).
  const float* acc_in;
  int64_t ld_acc_in;  // bytes between acc_in rows
  // AMX with desc.a_packed: bytes to pull into L2 while this call computes
  // (xbyak::amx_b_prefetch_bytes(desc) of them from here on), e.g. the part
  // of the B chunk the thread's next task will need; null: none.
  const void* b_prefetch;
};
static_assert(offsetof(BrgemmArgs, a) == 0 && offsetof(BrgemmArgs, b) == 8 &&
              offsetof(BrgemmArgs, batch) == 16 && offsetof(BrgemmArgs, lda) == 24 &&
              offsetof(BrgemmArgs, c) == 32 && offsetof(BrgemmArgs, ldc) == 40 &&
              offsetof(BrgemmArgs, bias) == 48 && offsetof(BrgemmArgs, a_tail) == 56 &&
              offsetof(BrgemmArgs, acc_in) == 64 && offsetof(BrgemmArgs, ld_acc_in) == 72 &&
              offsetof(BrgemmArgs, b_prefetch) == 80);

using BrgemmFn = void (*)(const BrgemmArgs*);

enum class BiasKind { none, f32, bf16 };
const char* bias_kind_name(BiasKind b);

// Gated (GLU) epilogue of the MoE gate/up projection. The B block then holds
// 64 columns: gate columns in 0..31 and the matching up columns in 32..63
// (ExpertProj::gate_up packing); the kernel computes all 64 and stores
// nr ≤ 32 outputs out[c] = f(gate[c], up[c]). Bias and acc_in, when present,
// are 64 columns in the same order.
enum class Glu {
  none,
  act_mul,         // act(gate)·up (silu_and_mul, gelu_and_mul)
  clamped_swiglu,  // GPT-OSS: g = min(gate, limit), u = clamp(up, ±limit), g·σ(alpha·g)·(u + 1)
};
const char* glu_name(Glu g);

// Everything that changes the emitted bytes, and nothing else. Hash, equality
// and the key text all derive from fields(), so a new field cannot be forgotten.
struct BrgemmDesc {
  Isa isa = Isa::avx512;
  int mr = 1;                 // rows of C
  int nr = 64;                // columns of C (≤ 64)
  int64_t kb = 1;             // K elements per batch item
  int64_t b_row_bytes = 256;  // bytes per k-pair row of a packed B block
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  DType out = DType::f32;   // f32 or bf16
  bool accumulate = false;  // add args.acc_in (K-chunked GEMMs) before the epilogue
  Glu glu = Glu::none;
  float glu_alpha = 0, glu_limit = 0;  // clamped_swiglu only (0 otherwise)
  // AMX only: A_i is in the tile layout of PackedA (packed_layout.h) instead
  // of row-major: every tile load is 1 KiB contiguous and K is zero-padded to
  // 32, so lda and a_tail are unused and any kb works with any batch.
  bool a_packed = false;

  // Columns of the B block the kernel computes: 64 for a GLU, else nr.
  int computed_cols() const { return glu != Glu::none ? 64 : nr; }

  auto fields() const {
    return std::tie(isa, mr, nr, kb, b_row_bytes, bias, act, out, accumulate, glu, glu_alpha,
                    glu_limit, a_packed);
  }
  bool operator==(const BrgemmDesc& o) const { return fields() == o.fields(); }

  // Canonical key text, e.g.
  // "brgemm;isa=avx512;mr=7;nr=64;kb=4096;brow=256;bias=f32;act=silu;out=bf16".
  std::string key() const;
  // Kernel name spelling its specialization, e.g.
  // "brgemm_avx512_bf16_f32acc_m7n64k4096_bias_silu_bf16out".
  std::string name() const;
};

}  // namespace tilejit::codegen
