// The online-softmax step (and the block finish) of the attention block engine
// (ops/attention_engine.h) compiled by LLVM: one key block of transposed scores Sᵀ[keys][64 rows] →
// the bf16 weights Pᵀ in the vnni2 layout the P·V micro-kernel reads as its B
// operand, with the running reference max and sum of each query row, and O
// rescaled when a reference moves. Query rows run along the vector lanes (16
// per vector, nz vectors per key), so there are no gathers and no horizontal
// reductions. LLVM-free: the rest of the project includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "codegen/kernel_desc.h"
#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

// Row stride (in elements) of every [·][64] operand: one engine block of rows.
inline constexpr int64_t kSoftmaxRows = 64;

// Weights are 2^((s·scale − ref)·log2 e); ref (the stored m) follows a row's
// max only when the max exceeds it by more than this, in scaled-score units
// (weights then stay ≤ 2⁸), so most key blocks leave O alone.
inline constexpr float kSoftmaxLazyRescale = 8.0f / 1.44269504088896341f;

// What the emitted bytes depend on (besides the host, which the cache key adds).
struct SoftmaxStepDesc {
  static constexpr const char* kFamily = "attn_softmax_step_llvm";
  int nz = 4;  // 16-row groups, 1..4

  static constexpr auto field_list() {
    return std::make_tuple(field("nz", &SoftmaxStepDesc::nz, "_nz"));
  }
  bool operator==(const SoftmaxStepDesc& o) const { return same_fields(*this, o); }
  // attn_softmax_step_llvm_nz4
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<SoftmaxStepDesc>(), "a member is missing from field_list()");

// One call: key block [j0, j0 + n), n ≤ kb, kb even (the engine: n rounded up to 32).
struct SoftmaxStepArgs {
  const float* s;     // Sᵀ [kb][64]: row j is key j0 + j (raw q·k); rows ≥ n are not read
                      // for the max and give weight 0
  uint32_t* pt;       // out: Pᵀ [kb/2][64], word (j/2, r) = bf16 P[r][j] | bf16 P[r][j+1] << 16
  float* ot;          // Oᵀ [dv][64], multiplied by e^(old ref − new ref) where a ref moves
  float* m;           // [64] reference per row (scaled-score units; −inf: no key yet)
  float* l;           // [64] sum of the bf16-rounded weights per row
  const int32_t* lo;  // [64] visible keys [lo, hi] per row (masked mode only)
  const int32_t* hi;
  int64_t j0, n, kb, dv;
  float scale;     // s·scale is the score (1 when s already holds final scores, −inf masked)
  int32_t masked;  // 0: every row sees every key of the block, n == kb (no clamp:
                   // a −inf score gives a NaN weight there; the engine repairs such rows)
};
static_assert(offsetof(SoftmaxStepArgs, j0) == 56 && offsetof(SoftmaxStepArgs, dv) == 80 &&
              offsetof(SoftmaxStepArgs, scale) == 88 && offsetof(SoftmaxStepArgs, masked) == 92);

using SoftmaxStepFn = void (*)(const SoftmaxStepArgs*);

// Checks the descriptor (Error naming the field) and compiles it.
LlvmKernel compile_llvm_softmax_step(const SoftmaxStepDesc& desc, OptLevel opt = OptLevel::kernel);

// The block's output: out[r][c] = bf16(Oᵀ[c][r] · f[r]) for r < rows, c < dv
// (dv a multiple of 16; round to nearest even, NaN quiet, as runtime/bf16.h).
// Oᵀ is transposed back 16 × 16 in registers. One kernel for every shape,
// named kSoftmaxFinishName. It also adds 0·(Σ_c Oᵀ[c][r]) into bad[r] (the
// caller zeroes it): NaN exactly for the rows whose O holds a NaN or an Inf
// (or, harmlessly, whose sum overflows), so the engine finds the rows the
// NaN/Inf rule recomputes (ops/attention_scalar.h) without a pass over out.
struct SoftmaxFinishArgs {
  const float* ot;       // Oᵀ [dv][64]
  const float* f;        // [64] per-row factor (1/l, a sink folded in; 0: no key)
  uint16_t* const* out;  // [rows] output row pointers
  int64_t rows, dv;
  float* bad;  // [64], 16-row groups up to rows
};
static_assert(offsetof(SoftmaxFinishArgs, rows) == 24 && offsetof(SoftmaxFinishArgs, dv) == 32 &&
              offsetof(SoftmaxFinishArgs, bad) == 40);

using SoftmaxFinishFn = void (*)(const SoftmaxFinishArgs*);

inline constexpr const char* kSoftmaxFinishName = "attn_glue_llvm_finish";
LlvmKernel compile_llvm_softmax_finish(OptLevel opt = OptLevel::kernel);

// Qᵀ of a block in the vnni2 layout the score micro-kernel reads as its B
// operand: out[kp][r] = word kp (elements 2kp, 2kp+1) of query row r, for
// kp < pairs and r < 16·groups; words kp ≥ `words` are 0 (the K padding AMX
// reads). Transposed 16 × 16 in registers. One kernel: kSoftmaxPackQName.
struct SoftmaxPackQArgs {
  const uint16_t* const* rows;  // [16·groups] query rows (padding rows: point at zeros)
  uint32_t* out;                // [pairs][64]
  int64_t groups;               // 16-row groups, 1..4
  int64_t words;                // D/2: bf16 pairs per row
  int64_t pairs;                // rows of out, a multiple of 16, ≥ words
};
static_assert(offsetof(SoftmaxPackQArgs, groups) == 16 && offsetof(SoftmaxPackQArgs, pairs) == 32);

using SoftmaxPackQFn = void (*)(const SoftmaxPackQArgs*);

inline constexpr const char* kSoftmaxPackQName = "attn_glue_llvm_pack_q";
LlvmKernel compile_llvm_softmax_pack_q(OptLevel opt = OptLevel::kernel);

// Vᵀ of a run of keys, the A operand of the P·V micro-kernel:
// out[c·ld + j] = rows[j][c] for j < round_up(keys, 16), c < dv (dv a
// multiple of 16; the caller pads rows to a multiple of 16 with pointers to
// zeros, so the padding columns come out 0). 16 × 16 tiles transposed in
// registers. One kernel: kSoftmaxTransposeVName.
struct SoftmaxTransposeVArgs {
  const uint16_t* const* rows;  // [round_up(keys, 16)] V rows
  uint16_t* out;
  int64_t ld;    // elements between rows of out
  int64_t keys;  // rounded up to 16 by the kernel
  int64_t dv;
};
static_assert(offsetof(SoftmaxTransposeVArgs, keys) == 24 &&
              offsetof(SoftmaxTransposeVArgs, dv) == 32);

using SoftmaxTransposeVFn = void (*)(const SoftmaxTransposeVArgs*);

inline constexpr const char* kSoftmaxTransposeVName = "attn_glue_llvm_transpose_v";
LlvmKernel compile_llvm_softmax_transpose_v(OptLevel opt = OptLevel::kernel);

// The three shape-free kernels above as one kernel family for the registry.
enum class SoftmaxGlue { finish, pack_q, transpose_v };
inline std::string field_text(SoftmaxGlue g) {
  return g == SoftmaxGlue::finish ? "finish" : g == SoftmaxGlue::pack_q ? "pack_q" : "transpose_v";
}
struct SoftmaxGlueDesc {
  static constexpr const char* kFamily = "attn_glue_llvm";
  SoftmaxGlue kind = SoftmaxGlue::finish;

  static constexpr auto field_list() {
    return std::make_tuple(field("kind", &SoftmaxGlueDesc::kind, "_"));
  }
  bool operator==(const SoftmaxGlueDesc& o) const { return same_fields(*this, o); }
  // attn_glue_llvm_{finish,pack_q,transpose_v}
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<SoftmaxGlueDesc>(), "a member is missing from field_list()");

}  // namespace tilejit::codegen::llvm_backend
