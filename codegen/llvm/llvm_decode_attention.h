// Paged decode attention compiled by LLVM: the G query heads that share one
// kv head, against a key range of one sequence's paged cache, with an fp32
// online softmax. K and V rows are read where they lie in the cache (no
// repack), which is what makes decode bandwidth-bound instead of glue-bound
// (docs/attention.md). LLVM-free: the rest of the project includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

// What the emitted bytes depend on (K and V are bf16).
struct DecodeAttentionDesc {
  int64_t d = 0, dv = 0;   // head sizes, multiples of 16
  int64_t g = 0;           // query rows per kv head (Hq / Hkv)
  int64_t block_size = 0;  // cache block, a multiple of 16
  int64_t ldo = 0;         // floats between O rows of the partial
  bool softcap = false;    // s = cap·tanh(s / cap)
  bool alibi = false;      // s += slope_r · (j − i_pos)

  // decode_attn_llvm_d128_dv128_g4_bs16_ldo128[_softcap][_alibi]
  std::string name() const;
};

// The call: keys [j0, j1) (0 ≤ j0 < j1, every block they touch already
// checked) folded into the running state (m, l, O) of the G rows. Strides in
// elements. Row r of q is qf[r·d .. r·d + d), already multiplied by the scale.
struct DecodeAttentionArgs {
  const float* qf;       // [G][D] f32
  const uint16_t* k;     // cache block 0, this kv head
  const uint16_t* v;     // cache block 0, this kv head (may alias k: MLA)
  const int32_t* table;  // the sequence's block-table row
  int64_t table_stride;
  int64_t k_block_stride, k_row_stride;
  int64_t v_block_stride, v_row_stride;
  int64_t j0, j1;
  int64_t i_pos;        // the query's position (ALiBi)
  const float* slopes;  // [G] (alibi)
  float softcap, pad_;  // cap (softcap)
  float* m;             // [G] running max (−inf: no key yet)
  float* l;             // [G] running sum of exp(s − m)
  float* o;             // [G][ldo] unnormalised output
  // Kv heads h < heads done chunk by chunk together (rows of head h are rows
  // h·G.. of qf, slopes, m, l, o), so a chunk reads whole cache rows.
  int64_t heads;
  int64_t k_head_stride, v_head_stride;
};
static_assert(offsetof(DecodeAttentionArgs, j0) == 72 && offsetof(DecodeAttentionArgs, o) == 128 &&
              offsetof(DecodeAttentionArgs, v_head_stride) == 152);

using DecodeAttentionFn = void (*)(const DecodeAttentionArgs*);

// Checks the descriptor (Error naming the field) and compiles it.
LlvmKernel compile_llvm_decode_attention(const DecodeAttentionDesc& desc,
                                         OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
