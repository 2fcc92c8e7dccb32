// Lowering of a gemm + epilogue chain to a kernel plan: the ISA, the register
// / tile blocking, the tails and the fused epilogue, and the micro-kernel
// descriptors the driver needs for any M.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "runtime/scratch_limits.h"

namespace tilejit::codegen {

// What a gemm + epilogue chain computes, independent of the machine.
struct GemmSpec {
  static constexpr const char* kFamily = "gemm";
  int64_t n = 0, k = 0;
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  DType out = DType::f32;
  // A GLU epilogue (MoE gate/up): n counts the outputs, each packed 64-column
  // block yields 32 of them (see BrgemmDesc::glu).
  Glu glu = Glu::none;
  float glu_alpha = 0, glu_limit = 0;
  // The micro-kernels' weight type: bf16 (also for fp8 / int4 weights, which
  // are dequantized to bf16 chunks first) or i8 (W8A8: u8 activations, i32
  // accumulators, k a multiple of 4).
  DType b_type = DType::bf16;
  // The deepest K chunk (a multiple of the AMX K step): a B chunk of
  // max_kc/2 rows of 256 bytes is what stays in L2 (or, for dequantized
  // weights at small M, in L1).
  int64_t max_kc = 2048;
  // Batch-invariant mode (tilejit::set_batch_invariant): every row summed in
  // one K order whatever M: K chunks for every M (not only from two row
  // blocks on) and one accumulator chain in every micro-kernel.
  bool invariant = false;

  static constexpr auto field_list() {
    using D = GemmSpec;
    using enum NameRule;
    return std::make_tuple(field("n", &D::n, "n"), field("k", &D::k, "k"),
                           field("bias", &D::bias, "_bias", unless_default),
                           field("act", &D::act, "_", unless_default),
                           field("out", &D::out, "_", "out"),
                           field("glu", &D::glu, "_", unless_default),
                           field("alpha", &D::glu_alpha, "_a", unless_default),
                           field("limit", &D::glu_limit, "_l", unless_default),
                           field("b", &D::b_type, "_b", unless_default),
                           field("kcmax", &D::max_kc, "_kc", unless_default),
                           field("inv", &D::invariant, "_inv", flag));
  }
  bool int8() const { return b_type == DType::i8; }
  // Bytes of one A element and K elements per B VNNI group.
  int64_t a_bytes() const { return int8() ? 1 : 2; }
  int64_t k_group() const { return k_group_of(b_type); }
  bool operator==(const GemmSpec& o) const { return same_fields(*this, o); }
};
static_assert(fields_cover<GemmSpec>(), "a GemmSpec member is missing from field_list()");

struct GemmPlan {
  GemmSpec spec;
  Isa isa = Isa::scalar;
  int mr = 1;      // rows per micro-kernel call (main block); M tails use 1..mr-1
  int nb = 64;     // output columns per micro-kernel call (the packed block; 32 with a GLU)
  int n_tail = 0;  // N % nb (0: none)
  // K chunking: when a 64-column B panel of the whole K would not stay in L2,
  // K is cut into chunks of kc (a multiple of 32) whose fp32 partial sums are
  // carried in a scratch; the last chunk applies the epilogue.
  int64_t kc = 0;
  int64_t k_chunks = 1;
  // AMX: the drivers repack A into the PackedA tile layout once per call and
  // the micro-kernels read it from there (K tails are its zero padding).
  bool a_packed = false;
  // Set by apply_overrides (a tuning database entry): the entry's name, whether
  // mr is the entry's (it changes the micro-kernels, so key() spells it) and
  // the entry's rows per task (0: the heuristic task_rows()).
  std::string tuned_entry;
  bool tuned_mr = false;
  int64_t tuned_task_rows = 0;
  // The entry's prefetch distance for every micro-kernel (-1: the kernels'
  // default; BrgemmDesc::prefetch_kib). Changes the code, so key() spells it.
  int tuned_prefetch_kib = -1;

  // Which part of a K-chunked reduction a micro-kernel computes.
  enum class Chunk { whole, first, middle, last };
  int64_t chunk_k(Chunk c) const;
  // K chunks run for a GEMM (or a driver job) of `rows` rows: they pay off
  // only when the B chunk is reused by more than one row block.
  // Batch-invariant specs chunk every M alike (the chunks' partial sums are
  // added at the end, so chunking changes a row's sum order).
  int64_t k_chunks_for(int64_t rows) const { return rows > mr || spec.invariant ? k_chunks : 1; }
  // Every micro-kernel variant a GEMM of `m` rows runs with this plan
  // (distinct; ukernel(rows, cols, chunk) gives each one's descriptor).
  struct Variant {
    int rows, cols;
    Chunk chunk;
    bool operator==(const Variant&) const = default;
  };
  std::vector<Variant> variants_for(int64_t m) const;

  // Rows per driver task: whole micro-kernel blocks, about 256 rows, so a
  // task's B panel stays hot in L2 while leaving enough tasks to balance two
  // noisy cores (tilejit::gemm and fused_experts' gate/up both cut M so).
  int64_t task_rows() const;
  // How tilejit::gemm runs a GEMM of `m` rows on `threads` threads with this
  // plan: the one copy of the split, which `tilejit dump --dim` prints.
  struct Schedule {
    int64_t m = 0;
    int64_t n_blocks = 0;    // column blocks of nb (the last one is the N tail, if any)
    int64_t task_rows = 0;   // rows per task (task_rows(), fewer when the threads need more
                             // tasks than the column blocks give); a task is (row chunk,
                             // column block)
    int64_t slice_rows = 0;  // rows per slice: whole row chunks whose scratch fits kScratchBytes
    // K chunks run as separate passes over all tasks of a slice (1: each task
    // runs the whole K), so one K chunk of A stays in L2 while the column
    // blocks stream by; the fp32 partial sums [rows, n_blocks·nb] are kept in
    // a scratch between passes, ld_partial bytes a row.
    int64_t k_passes = 1;
    int64_t ld_partial = 0;
    // A slice's scratch (packed A for AMX, partial sums) is at most this, so a
    // huge M costs no huge allocation and the buffer is kept between calls.
    static constexpr int64_t kScratchBytes = runtime::kScratchKeepBytes;

    int64_t slices() const { return (m + slice_rows - 1) / slice_rows; }
    // Row chunks of a slice of `rows` rows; a pass runs row_chunks · n_blocks tasks.
    int64_t row_chunks(int64_t rows) const { return (rows + task_rows - 1) / task_rows; }
    // One line, e.g. "M=1000: 1 slice of 1000 rows, each 4 row chunks of 252 rows
    // x 172 column blocks = 688 tasks per K pass; 2 K passes".
    std::string str() const;
  };
  Schedule schedule(int64_t m, int64_t threads) const;

  // The tile layout the AMX drivers repack A into (PackedA counts K in bf16
  // units: an int8 GEMM's k bytes are k/2 of them).
  PackedA packed_a() const { return PackedA{spec.k * spec.a_bytes() / 2}; }
  // Byte offsets of K element k (a multiple of the chunk size) in a
  // row-major A row and in a packed B block.
  int64_t a_offset(int64_t k) const { return k * spec.a_bytes(); }
  int64_t b_offset(int64_t k) const { return k / spec.k_group() * PackedLayout::kRowBytes; }

  // Micro-kernel for a block of `rows` × `cols`.
  BrgemmDesc ukernel(int rows, int cols, Chunk chunk = Chunk::whole) const;
  // e.g. "gemm_avx512_bf16_f32acc_m7n64k4096_nt17_bias_silu_bf16out".
  std::string name() const;
  // Canonical key text: everything that changes the code of this plan.
  std::string key() const;
  // Multi-line human-readable plan, for `tilejit dump --stage plan`.
  std::string str() const;
};

GemmPlan plan_gemm(const GemmSpec& spec, Isa isa);

// Tuned values for the heuristics above (from a tuning database entry; see
// docs/tuning.md): plain data, every field optional, unset keeps the
// heuristic. None changes what a GEMM computes beyond what another valid
// plan changes (the K chunking and the row blocking order the fp32 sums).
struct PlanOverrides {
  std::optional<int> mr;             // rows per micro-kernel call
  std::optional<int64_t> task_rows;  // rows per driver task (thread split only)
  std::optional<int64_t> max_kc;     // the deepest K chunk (GemmSpec::max_kc)
  std::optional<Isa> isa;            // at this M: amx, avx512 or llvm (at or below the path)
  // int4 weights with int4_route automatic: W4A8 (true) or W4A16 at this M
  // (not a plan knob: ops::w4a8_route reads it before any plan is made).
  std::optional<bool> w4a8;
  // The B stream's prefetch distance in KiB (BrgemmDesc::prefetch_kib): the
  // Xbyak AVX-512 kernels of the plan, or the fused quantized decode kernel.
  std::optional<int> prefetch_kib;
  // int4 weights at decode M (the fused kernel, no plan): its arithmetic
  // (BrgemmDesc::u4_bf16_dot: vdpbf16ps, or f32 FMAs at mr <= 3).
  std::optional<bool> u4_dot;
  std::string entry;  // the database entry they come from
  bool empty() const {
    return !mr && !task_rows && !max_kc && !isa && !w4a8 && !prefetch_kib && !u4_dot;
  }
  bool operator==(const PlanOverrides&) const = default;
};
// The plan for `spec` on `isa` with `o` applied: max_kc before planning, then
// mr and task_rows. Throws Error naming the field, its value and what this
// plan allows (mr: 1 .. the heuristic mr on avx512 / llvm, 32 on amx;
// task_rows: a multiple of mr up to 4096; max_kc: plan_gemm's rule;
// prefetch_kib: 0 .. BrgemmDesc::kPrefetchKibMax, on an avx512 plan only).
GemmPlan plan_gemm(const GemmSpec& spec, Isa isa, const PlanOverrides& o);
// plan_gemm's check of a tuned prefetch distance (BrgemmDesc::prefetch_allowed,
// without the default -1). Throws Error naming the value and the ISA.
void check_prefetch_kib(int kib, Isa isa);

// The path a GEMM of `m` rows runs on when `path` is the active one. At m ≤ 2
// the AMX kernels lose to AVX-512 (1-2 %, both bound by the weight stream:
// docs/gemm-performance.md), so such GEMMs take the AVX-512 plan.
// With o.isa set (a JIT path at or below `path`), the entry's choice instead.
// Batch-invariant mode (`invariant`): `path` for every m (rows must not pick
// the kernels).
Isa gemm_isa_for_rows(Isa path, int64_t m, const PlanOverrides& o = {}, bool invariant = false);

// One micro-kernel a plan runs, with why (for `tilejit dump --stage key|asm`).
struct KernelUse {
  std::string role;  // "main block", "N tail", "M tail (3 rows)", ... + chunk
  BrgemmDesc desc;
};
// Without m: the main block and N tail variants (and K-chunk variants when the
// plan chunks K). With m: exactly the variants the GEMM driver (ops/gemm.cpp)
// calls for that M, M tails included (variants_for).
std::vector<KernelUse> plan_kernels(const GemmPlan& plan, std::optional<int64_t> m);

}  // namespace tilejit::codegen
