// Paged decode attention compiled by LLVM: the G query heads that share one
// kv head, against a key range of one sequence's paged cache, with an fp32
// online softmax. K and V rows are read where they lie in the cache (no
// repack), which is what makes decode bandwidth-bound instead of glue-bound
// (docs/attention.md). LLVM-free: the rest of the project includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>

#include "codegen/kernel_desc.h"
#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

// How q·k and p·v are multiplied: vdpbf16ps (AVX512-BF16; p rounded to bf16,
// which the softmax does anyway) or fp32 FMAs on the exactly widened bf16.
// best: dpbf16 where the host has it.
enum class DecodeDot { best, fma, dpbf16 };
inline std::string field_text(DecodeDot d) {
  return d == DecodeDot::best ? "best" : d == DecodeDot::fma ? "fma" : "dpbf16";
}

// What the emitted bytes depend on.
struct DecodeAttentionDesc {
  static constexpr const char* kFamily = "decode_attn_llvm";
  int64_t d = 0, dv = 0;  // head sizes, even
  int64_t g = 0;          // query rows per kv head (Hq / Hkv), 1 .. kMaxG
  // The kernel unrolls its per-row code over g: past this many query heads
  // per kv head the operators run the attention engine's decode instead
  // (ops::decode_attention_llvm_kernel).
  static constexpr int64_t kMaxG = 1024;
  int64_t block_size = 0;  // cache block, >= 1 (multiples of 16 take the fast row addressing)
  int64_t ldo = 0;         // floats between O rows of the partial
  bool softcap = false;    // s = cap·tanh(s / cap)
  bool alibi = false;      // s += slope_r · (j − i_pos)
  DecodeDot dot = DecodeDot::best;
  // The K / V cache dtype: bf16, or f8e4m3 / f8e5m2 (fp8 KV cache: codes converted to
  // bf16 exactly in registers; the scales are folded, see DecodeAttentionArgs).
  DType kv = DType::bf16;
  // How many 16-key chunks ahead the kernel prefetches K and V rows (the
  // block table defeats the hardware prefetcher at every block boundary):
  // kPrefetchChunksMax at most. A tuning knob (docs/tuning.md
  // `prefetch_chunks`): the best distance depends on the CPU's DRAM latency
  // and its own prefetchers. Changes no arithmetic.
  int64_t prefetch_chunks = 2;
  static constexpr int64_t kPrefetchChunksMax = 8;

  static constexpr auto field_list() {
    using D = DecodeAttentionDesc;
    using enum NameRule;
    return std::make_tuple(
        field("d", &D::d, "_d"), field("dv", &D::dv, "_dv"), field("g", &D::g, "_g"),
        field("bs", &D::block_size, "_bs"), field("ldo", &D::ldo, "_ldo"),
        field("softcap", &D::softcap, "_softcap", flag), field("alibi", &D::alibi, "_alibi", flag),
        field("dot", &D::dot, "_"), field("kv", &D::kv, "_kv", unless_default),
        field("pf", &D::prefetch_chunks, "_pf", unless_default));
  }
  bool operator==(const DecodeAttentionDesc& o) const { return same_fields(*this, o); }

  // True when the kernel uses vdpbf16ps (dot resolved against the host).
  bool uses_dpbf16() const;
  // decode_attn_llvm_d128_dv128_g4_bs16_ldo128[_softcap][_alibi]_{best,fma,dpbf16}[_kvf8e4m3|_kvf8e5m2]
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<DecodeAttentionDesc>(), "a member is missing from field_list()");

// The call: keys [j0, j1) (0 ≤ j0 < j1, every block they touch already
// checked) folded into the running state (m, l, O) of the G rows of each kv
// head. Strides in elements.
struct DecodeAttentionArgs {
  const uint16_t* q;     // bf16 query row r at q + r·q_row_stride (not scaled)
  const uint16_t* k;     // cache block 0, kv head 0
  const uint16_t* v;     // cache block 0, kv head 0 (may alias k: MLA)
  const int32_t* table;  // the sequence's block-table row
  int64_t table_stride;
  int64_t k_block_stride, k_row_stride;
  int64_t v_block_stride, v_row_stride;
  int64_t j0, j1;
  int64_t i_pos;        // the query's position (ALiBi)
  const float* slopes;  // [heads·G] (alibi)
  float softcap;        // cap (softcap)
  float scale;          // s = scale · q·k before softcap
  float* m;             // [heads·G] running max (−inf: no key yet)
  float* l;             // [heads·G] running sum of exp(s − m)
  float* o;             // [heads·G][ldo] unnormalised output
  // Kv heads h < heads are done chunk by chunk together (rows of head h are
  // rows h·G.. of q, slopes, m, l, o), so a chunk reads whole cache rows.
  int64_t heads;
  int64_t k_head_stride, v_head_stride;
  int64_t q_row_stride;
  // fp8 kv only (k and v then point at code bytes, strides in bytes):
  // the score of kv head h is k_scale[h] · q·k̂ (k̂ the fp8 values of the
  // codes; the caller passes sm_scale · its k scale, `scale` is unused), and
  // O accumulates Σ p · v̂ in the codes' own units: the caller multiplies the
  // state's O by its v scale (O is linear in V, so the online rescaling and
  // the split-KV merge are unaffected).
  const float* k_scale;  // [heads]
  // The call's working memory, 64-byte aligned, decode_attention_scratch_bytes
  // (desc, heads) long: the packed q rows, the chunk's weights and (fp8) the
  // converted rows. They grow with G·D (1.2 MB at G 1024, D 576), too large
  // for a caller's stack: on the stack, a 128 KiB thread overflowed at
  // DeepSeek's MLA decode, and a frame past the guard page wrote into the
  // memory below it before faulting.
  void* scratch;
};
static_assert(offsetof(DecodeAttentionArgs, j0) == 72 &&
              offsetof(DecodeAttentionArgs, scale) == 108 &&
              offsetof(DecodeAttentionArgs, o) == 128 &&
              offsetof(DecodeAttentionArgs, q_row_stride) == 160 &&
              offsetof(DecodeAttentionArgs, k_scale) == 168 &&
              offsetof(DecodeAttentionArgs, scratch) == 176);

// Keys per softmax step of the kernel (the lanes of a score vector).
inline constexpr int64_t kDecodeChunkKeys = 16;
inline int64_t decode_scratch_align(int64_t n) {
  return (n + 63) / 64 * 64;
}
// The fixed part of DecodeAttentionArgs::scratch (everything but the packed q
// rows, which come last and grow with `heads`), as a bound on any layout the
// emitter picks, which it checks when it compiles: weights and α in f32
// (bf16 takes half), four 16-float vectors, the prefetched row offsets, rows
// padded to 32 elements. Inline: the operators size the buffer in builds
// without LLVM too.
inline int64_t decode_attention_fixed_scratch(const DecodeAttentionDesc& d) {
  constexpr int64_t c = kDecodeChunkKeys;
  const int64_t pd = (d.d + 31) / 32 * 32, pdv = (d.dv + 31) / 32 * 32;
  int64_t n = decode_scratch_align(2 * d.g * c * 4) + decode_scratch_align(2 * d.g * 4) +
              decode_scratch_align(4 * 16 * 4) +
              decode_scratch_align((d.prefetch_chunks + 1) * 2 * c * 8);
  if (d.kv != DType::bf16)
    n += decode_scratch_align(c * pd * 2) + decode_scratch_align(2 * c * pdv * 2);
  return n;
}
// Bytes of DecodeAttentionArgs::scratch for a call over `heads` kv heads.
inline int64_t decode_attention_scratch_bytes(const DecodeAttentionDesc& d, int64_t heads) {
  return decode_attention_fixed_scratch(d) +
         decode_scratch_align(heads * d.g * ((d.d + 31) / 32 * 32) * 2);
}

using DecodeAttentionFn = void (*)(const DecodeAttentionArgs*);

// Checks the descriptor (Error naming the field) and compiles it.
LlvmKernel compile_llvm_decode_attention(const DecodeAttentionDesc& desc,
                                         OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
