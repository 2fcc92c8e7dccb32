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

#include "codegen/kernel_desc.h"
#include "codegen/packed_layout.h"
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
  // Integer kernels (a=u8, b=i8, acc=i32) only. The epilogue computes, per
  // row r and column c of the call (f32 arithmetic in this order):
  //   v = float(acc[r][c] − a_zero[r]·b_comp[c]) · a_scale[r] · b_scale[c]  (+ bias[c], act)
  // where acc is the exact int32 Σ_k a[r][k]·b[k][c] (plus acc_in, int32).
  // With desc.glu (out f32 or bf16), for each output column j < nr of the
  // 64-column GLU block (gate columns 0..31, up columns 32..63), in f32 in
  // the order above, without act:
  //   gate = float(acc[r][j] − a_zero[r]·b_comp[j]) · a_scale[r] · b_scale[j]  (+ bias[j])
  //   up   = float(acc[r][32+j] − a_zero[r]·b_comp[32+j]) · a_scale[r] · b_scale[32+j]
  //          (+ bias[32+j])
  //   out[r][j] = glu(gate, up)
  // by the same GLU code as the bf16 kernels' (BrgemmDesc::glu) from f32
  // gate and up: b_scale, b_comp, bias and acc_in are indexed by the 64
  // computed columns.
  const float* a_scale;   // [mr] per row of this call
  const int32_t* a_zero;  // [mr] per row zero points (u8 activations)
  const float* b_scale;   // [64] per column of this block (padded with 0)
  const int32_t* b_comp;  // [64] Σ_k b[k][c] over the real K (padded with 0)
  // Quantized-weight kernels (b = u4 or f8e4m3, xbyak/quant_brgemm.cpp) only:
  // B = b[0] holds the column block's codes in the packed k-pair order
  // (ops/packed_weight_impl.h, QuantTables), q_groups[kp] names the scale row
  // of k-pair row kp, q_scales is [G][64] f32 (f4e2m1: the e8m0 exponent
  // bytes u8 [G][64], 2^(e − 127) made at the fold) and q_zeros [G][64] u8
  // (with desc.b_zeros; otherwise every zero point is 8 for u4, none for fp8).
  const int32_t* q_groups;
  const float* q_scales;
  const uint8_t* q_zeros;
  // xbyak::quant_brgemm_scratch_bytes(desc) bytes, 64-byte aligned, that the
  // call may overwrite (its f32 copy of A), when that is nonzero: kept off
  // the stack, whose size an embedding engine's threads choose.
  void* q_scratch;
  // W4A8 kernels (desc.w4a8) only: per batch item, the b_scale and b_comp
  // rows ([64] each) of the scale group that ends with that item, or null
  // where the group goes on into the next item. Null arrays: one group over
  // the whole batch, with b_scale and b_comp.
  const float* const* w4a8_scales;
  const int32_t* const* w4a8_comps;
};
static_assert(offsetof(BrgemmArgs, a) == 0 && offsetof(BrgemmArgs, b) == 8 &&
              offsetof(BrgemmArgs, batch) == 16 && offsetof(BrgemmArgs, lda) == 24 &&
              offsetof(BrgemmArgs, c) == 32 && offsetof(BrgemmArgs, ldc) == 40 &&
              offsetof(BrgemmArgs, bias) == 48 && offsetof(BrgemmArgs, a_tail) == 56 &&
              offsetof(BrgemmArgs, acc_in) == 64 && offsetof(BrgemmArgs, ld_acc_in) == 72 &&
              offsetof(BrgemmArgs, b_prefetch) == 80 && offsetof(BrgemmArgs, a_scale) == 88 &&
              offsetof(BrgemmArgs, a_zero) == 96 && offsetof(BrgemmArgs, b_scale) == 104 &&
              offsetof(BrgemmArgs, b_comp) == 112 && offsetof(BrgemmArgs, q_groups) == 120 &&
              offsetof(BrgemmArgs, q_scales) == 128 && offsetof(BrgemmArgs, q_zeros) == 136 &&
              offsetof(BrgemmArgs, q_scratch) == 144 && offsetof(BrgemmArgs, w4a8_scales) == 152 &&
              offsetof(BrgemmArgs, w4a8_comps) == 160);

using BrgemmFn = void (*)(const BrgemmArgs*);

enum class BiasKind { none, f32, bf16 };
const char* bias_kind_name(BiasKind b);
inline std::string field_text(BiasKind b) {
  return bias_kind_name(b);
}

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
inline std::string field_text(Glu g) {
  return glu_name(g);
}

// Everything that changes the emitted bytes, and nothing else. Key text, name,
// hash and equality are generated from field_list() (codegen/kernel_desc.h).
struct BrgemmDesc {
  static constexpr const char* kFamily = "brgemm";

  Isa isa = Isa::avx512;
  // Operand and accumulator types: bf16 × bf16 → f32, or u8 × i8 → i32 (W8A8:
  // B in the Int8Layout, kb a multiple of 4, the scaled epilogue of
  // BrgemmArgs; a partial K chunk stores its raw int32 sums with out = i32
  // and acc_in is int32). The registry's rows say which each takes.
  DType a_type = DType::bf16;  // A (activations)
  DType b_type = DType::bf16;  // B (the packed weight's element type)
  // b = u4 (W4A16) or f8e4m3 (W8A16) with a = bf16, acc = f32: the fused
  // decode kernel (xbyak/quant_brgemm.cpp) that reads the packed codes and the
  // group tables of BrgemmArgs (q_groups, q_scales, q_zeros) itself; mr ≤ 4,
  // kb the whole K, batch 1, b_row_bytes the code row (64 u4, 128 fp8).
  // b_zeros: u4 with per-group zero points (q_zeros), else z = 8.
  bool b_zeros = false;
  DType acc_type = DType::f32;  // accumulators (and acc_in)
  int mr = 1;                   // rows of C
  int nr = 64;                  // columns of C (≤ 64)
  int64_t kb = 1;               // K elements per batch item
  int64_t b_row_bytes = 256;    // bytes per k-group row of a packed B block
  // AMX only: A_i is in the tile layout of PackedA (packed_layout.h) instead
  // of row-major: every tile load is 1 KiB contiguous and K is zero-padded to
  // the K step, so lda and a_tail are unused and any kb works with any batch.
  bool a_packed = false;
  bool accumulate = false;  // add args.acc_in (K-chunked GEMMs) before the epilogue
  // Batch-invariant mode (GemmSpec::invariant): one accumulator chain per
  // output vector whatever mr, so a row's sum runs in the same K order in
  // every row block and M tail (the kernels otherwise split K over 2-4
  // accumulator sets when mr·nr leaves registers free: 1-row tails).
  bool one_chain = false;
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  Glu glu = Glu::none;
  float glu_alpha = 0, glu_limit = 0;  // clamped_swiglu only (0 otherwise)
  DType out = DType::f32;              // f32 or bf16
  // W4A8 (int4 weights, int8 activations; ops/gemm_w4a8.cpp): an int8 kernel
  // (a = u8, b = i8, acc = i32) for one scale group of int4 weights, whose B
  // values are int4 codes minus zero points, in [−16, 15], so a pair of
  // u8·s8 products is at most 2·255·16 = 8160 in magnitude and four k-quads'
  // pairs sum to at most 32640: they fit s16 exactly (vpmaddubsw, paddw)
  // before widening. kb a multiple of 16; out f32 or bf16 (scaled). The
  // batch holds whole scale groups (args.w4a8_scales / w4a8_comps mark where
  // each ends); at the end of group g the kernel folds its exact int32 sums
  // into f32 sums that start at acc_in (`accumulate`: the earlier K chunks'
  // f32 sums) or at −0, in this order:
  //   f[r][c] = float(acc_g − a_zero[r]·comp_g[c])·a_scale[r]·scale_g[c] + f[r][c]
  // and resets acc_g; the epilogue then adds the bias and applies the
  // activation (one group with acc_in: the order of one call per group).
  // With a GLU (fused_experts' gate/up) the last call gates the 64 computed
  // columns, acc_in covering all 64.
  bool w4a8 = false;
  // Software prefetch of the B stream into L2, in KiB ahead of the k row in
  // use: -1 the kernel's own distance (32 KiB for the AVX-512 brgemm, 8 KiB
  // for the fused quantized kernel), 0 none, else that distance
  // (kPrefetchKibMax at most). A tuning knob (docs/tuning.md `prefetch`): the
  // best distance depends on the CPU's hardware prefetchers and its DRAM
  // latency, not on the shape alone. Xbyak AVX-512 kernels only.
  int prefetch_kib = -1;
  static constexpr int kPrefetchKibMax = 1024;
  // The fused u4 decode kernel's arithmetic at mr <= 3 on full blocks (Xbyak
  // AVX-512, b = u4): false, f32 FMAs on A converted to f32 (one FMA per 16
  // weights); true, vdpbf16ps on the bf16 pairs (one per 32 weights), as at
  // mr = 4 and on N tails. Which is faster is the CPU's: on the Intel Xeons
  // measured vdpbf16ps takes two cycles of both FMA ports (the FMAs won); on
  // AMD Zen 5 it issues like an FMA and the bf16 form ran 1.6x faster (hot
  // int4 M = 1). ops sets it from runtime::bf16_dot_at_fma_rate(); a tuning
  // knob (`u4_dot`) may override.
  bool u4_bf16_dot = false;
  // Rows one call of a fused quantized decode kernel takes at most (b = u4,
  // f8e4m3, f4e2m1: the Xbyak kernel and the LLVM brgemm's quantized mode).
  static constexpr int kQuantMaxMr = 4;
  // The one rule for a distance on a kernel of `isa` (the registry's rows,
  // plan_gemm's tuned value), and its text for the Errors.
  static bool prefetch_allowed(int kib, Isa isa) {
    return kib == -1 || (isa == Isa::avx512 && kib >= 0 && kib <= kPrefetchKibMax);
  }
  static std::string prefetch_allowed_text() {
    return fmt::format(
        "-1 (the kernel's default), or 0 .. {} KiB on avx512 (the Xbyak AVX-512 kernels)",
        kPrefetchKibMax);
  }
  // The distance the kernel runs: prefetch_kib, or its default (the fused
  // quantized kernel streams a quarter / half the bytes of bf16 per k row).
  int effective_prefetch_kib() const {
    if (prefetch_kib >= 0) return prefetch_kib;
    const bool fused = b_type == DType::u4 || b_type == DType::f8e4m3 || b_type == DType::f4e2m1;
    return fused ? 8 : 32;
  }

  static constexpr auto field_list() {
    using D = BrgemmDesc;
    using enum NameRule;
    return std::make_tuple(
        field("isa", &D::isa, "_"), field("a", &D::a_type, "_"),
        field("b", &D::b_type, "x", unless_default), field("zeros", &D::b_zeros, "_zp", flag),
        field("acc", &D::acc_type, "_", "acc"), field("mr", &D::mr, "_m"), field("nr", &D::nr, "n"),
        field("kb", &D::kb, "k"), field("brow", &D::b_row_bytes, "", never),
        field("apack", &D::a_packed, "_apack", flag),
        field("acc_in", &D::accumulate, "_accin", flag),
        field("chain1", &D::one_chain, "_chain1", flag),
        field("bias", &D::bias, "_bias", unless_default),
        field("act", &D::act, "_", unless_default), field("glu", &D::glu, "_", unless_default),
        field("alpha", &D::glu_alpha, "_a", unless_default),
        field("limit", &D::glu_limit, "_l", unless_default), field("out", &D::out, "_", "out"),
        field("w4a8", &D::w4a8, "_w4a8", flag),
        field("pf", &D::prefetch_kib, "_pf", "k", unless_default),
        field("dot", &D::u4_bf16_dot, "_dot", flag));
  }

  // K elements one VNNI group of B holds (a k-group row of the packed block),
  // and the K step of one AMX tile (64 bytes of A): both follow the dtypes.
  int k_group() const { return k_group_of(b_type); }
  int k_step() const { return amx_k_step_of(a_type); }
  // Columns of the B block the kernel computes: 64 for a GLU, else nr.
  int computed_cols() const { return glu != Glu::none ? 64 : nr; }

  bool operator==(const BrgemmDesc& o) const { return same_fields(*this, o); }
  // e.g. "brgemm;isa=avx512;a=bf16;b=bf16;zeros=0;acc=f32;mr=7;nr=64;kb=4096;...".
  std::string key() const { return desc_key(*this); }
  // e.g. "brgemm_avx512_bf16_f32acc_m7n64k4096_biasf32_silu_bf16out".
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<BrgemmDesc>(), "a BrgemmDesc member is missing from field_list()");

}  // namespace tilejit::codegen
