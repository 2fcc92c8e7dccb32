// The public API of tilejit: the contract an embedding engine codes against.
//
//   auto w = tilejit::pack_weight({w_ptr, tilejit::DType::bf16, {N, K}});  // once, at load
//   tilejit::gemm({x_ptr, tilejit::DType::bf16, {M, K}}, w,
//                 {y_ptr, tilejit::DType::bf16, {M, N}},
//                 {.bias = bias_view, .act = tilejit::Activation::silu});  // every step
//
// Every function raises tilejit::Error on bad input; nothing aborts the host.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tilejit/error.h"

namespace tilejit {

// i64 is an index type only (slot_mapping, positions); no kernel computes in it.
// f4e2m1 is the code type of MXFP4 weights (PackedWeight::dtype(); the
// checkpoint's tensors are u8): no tensor view or IR value has it.
// f8e5m2 (1 sign, 5 exponent, 2 mantissa bits: f16's top byte) is a KV cache
// element type only (vLLM's kv_cache_dtype "fp8_e5m2", its CPU backend's fp8).
enum class DType { f32, bf16, f16, i8, u8, i32, f8e4m3, u4, i64, f4e2m1, f8e5m2 };

// "f32", "bf16", ... (the spelling the IR text uses). A value outside the
// enum raises an Error (as does every enum argument of every function).
const char* dtype_name(DType t);
// Storage size in bits (u4 and f4e2m1 are 4).
int dtype_bits(DType t);

// ---- The contract's limits (docs/reliability.md) ----------------------------
// Checked on every call before any work, so nothing overflows, runs for ever
// or allocates without bound; a value past a limit is an Error naming it.
struct Limits {
  // Every dimension of every tensor (int32 index tensors address any of them,
  // and a product of two dims cannot overflow int64).
  static constexpr int64_t max_dim = (int64_t{1} << 31) - 1;
  // The bytes a view spans, (Σ (shape[i] − 1)·strides[i] + 1) · element size:
  // at most the x86-64 user address space (57-bit virtual addresses).
  static constexpr int64_t max_view_bytes = int64_t{1} << 56;
  // Attention and RoPE heads (Hq, Hkv, Hk): a task per head is allocated.
  static constexpr int64_t max_heads = 4096;
  // Attention head sizes (D and Dv): multiples of head_dim_step in
  // [head_dim_step, max_head_dim], i.e. any even size (the bf16 kernels
  // contract over k-pairs and pad the rest of their K step with zeros; 576 is
  // DeepSeek MLA's head). The one rule the operators and the IR verifier
  // call. RoPE heads are even and at most max_head_dim.
  static constexpr int64_t head_dim_step = 2;
  static constexpr int64_t max_head_dim = 576;
  static constexpr bool attention_head_dim_ok(int64_t d) {
    return d >= head_dim_step && d <= max_head_dim && d % head_dim_step == 0;
  }
  // Experts of a PackedExperts / routing call.
  static constexpr int64_t max_experts = 65536;
};

// A non-owning view of a strided tensor. Strides are in elements.
// Every operator checks its views: dims and strides ≥ 0 and within Limits,
// data aligned to the element size (2 bytes for bf16, 4 for f32 and i32, 8
// for i64), and the byte extent within Limits::max_view_bytes. Which outputs
// may share memory with which inputs is said per operator; an output never
// overlaps itself (no stride 0, no rows or heads whose spans overlap or
// interleave: docs/reliability.md "Aliasing").
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;

  TensorView() = default;
  // Row-major (contiguous) strides.
  TensorView(void* data, DType dtype, std::vector<int64_t> shape);
  TensorView(void* data, DType dtype, std::vector<int64_t> shape, std::vector<int64_t> strides);
  // Read-only data is accepted through the same view; tilejit never writes an input.
  TensorView(const void* ptr, DType type, std::vector<int64_t> dims)
      : TensorView(const_cast<void*>(ptr), type, std::move(dims)) {}
  // A null view (only valid for a shape with a zero dim; operators reject it otherwise).
  TensorView(std::nullptr_t, DType type, std::vector<int64_t> dims)
      : TensorView(static_cast<void*>(nullptr), type, std::move(dims)) {}
};

// relu2 = relu(x)² (squared ReLU: Nemotron-H, Nemotron-4, Primer).
enum class Activation { none, relu, silu, gelu_tanh, gelu_erf, relu2 };
const char* activation_name(Activation a);

// The instruction-set paths, lowest first: the scalar reference; LLVM ORC
// vector code for the host (any x86-64 with AVX2 + FMA); Xbyak AVX-512
// (vdpbf16ps); Xbyak AMX tiles. The active path is min(what the CPU and OS
// allow, TILEJIT_ISA), adjusted by TILEJIT_BACKEND; chosen once, at the first call.
enum class Isa { scalar, llvm, avx512, amx };
const char* isa_name(Isa isa);

// ---- Quantized weights (docs/quantized.md) ---------------------------------
// A quantized linear layer's checkpoint tensors, as the format stores them.
// pack_weight() takes one of these and returns a PackedWeight that the same
// gemm() call runs; format() and layout() say which it is.
enum class WeightFormat { bf16, int8, fp8_e4m3, int4_awq, int4_gptq, mxfp4 };
const char* weight_format_name(WeightFormat f);
// The int4 checkpoint formats (AWQ, GPTQ): the ones GemmOptions::int4_route
// and MoeOptions::int4_route apply to.
constexpr bool is_int4(WeightFormat f) {
  return f == WeightFormat::int4_awq || f == WeightFormat::int4_gptq;
}

// int8 W8A8: weight i8 [N, K] (K stride 1); scales f32 [N] (per output
// channel) or [1] (per tensor), or the same as [N, 1] / [1, 1] (vLLM's
// layout; unpack gives them back as [N] / [1]). w = weight · scale. Activations are quantized
// per call (GemmOptions::act_quant).
struct Int8Weight {
  TensorView weight;
  TensorView scales;
};

// fp8 e4m3 W8A16: weight f8e4m3, logically [N, K] with any strides (a
// checkpoint stored [K, N], as for torch._scaled_mm, is passed as shape
// {N, K} with strides {1, N}). scales f32: [1] per tensor, [N] per output
// channel ([1, 1] / [N, 1] read as those), or block scales [ceil(N / block_n), ceil(K / block_k)]
// (DeepSeek's weight_scale_inv; partial last blocks allowed; block_n ≥ 1, block_k even). w[n, k] =
// e4m3(weight[n, k]) · scale. NaN codes (0x7F, 0xFF) are refused.
struct Fp8Weight {
  TensorView weight;
  TensorView scales;
  int64_t block_n = 0, block_k = 0;  // block scales only (0 otherwise)
};

// int4 W4A16 checkpoints (AutoAWQ "GEMM", AutoGPTQ / GPTQModel, AutoRound
// exports), w[n, k] = (q[n, k] − z[g, n]) · scale[g, n], g = the group of k.
enum class Int4Format {
  awq,   // qweight i32 [K, N/8] packed along N, nibble order 0 2 4 6 1 3 5 7; qzeros the same
  gptq,  // qweight i32 [K/8, N] packed along K; qzeros i32 [G, N/8] packed along N (plain order)
};
struct Int4Weight {
  Int4Format format = Int4Format::gptq;
  TensorView qweight;                // i32 (see Int4Format)
  TensorView scales;                 // f16, bf16 or f32 [G, N]
  std::optional<TensorView> qzeros;  // i32 [G, N/8]; absent: symmetric, z = 8
  // i32 [K]: the group of each input channel (act-order / desc_act checkpoints,
  // or a tensor-parallel K shard that starts inside a group); absent: k / group_size.
  std::optional<TensorView> g_idx;
  int bits = 4;              // only 4 is supported (an Error otherwise)
  int64_t group_size = 128;  // any >= 1 (32, 64, 128 are usual), or −1 (per channel: G = 1)
  // GPTQ only: qzeros hold z itself ("gptq_v2") instead of z − 1 (the
  // original v1 format, AutoGPTQ "gptq", the default). AWQ stores z: true
  // with awq is an Error.
  bool gptq_v2 = false;
  // The logical shape; 0: from qweight (awq: K = rows, N = 8·cols; gptq:
  // K = 8·rows, N = cols). Smaller values cut the packing's padding.
  int64_t n = 0, k = 0;
};

// The int4 fields of an AutoRound quantization_config: checkpoint_format is
// "auto_gptq" / "gptq" (v1 zeros), "gptq_v2" or "gptqmodel" (v2 zeros: AutoRound's
// "auto_round:gptqmodel" export), or "auto_awq" / "awq", with or without an
// "auto_round:" prefix. Checks bits == 4, the group size, that
// desc_act comes with g_idx and !sym with qzeros; an Error names the field.
struct AutoRoundConfig {
  int bits = 4;
  int64_t group_size = 128;
  bool sym = true;
  bool desc_act = false;
  std::string checkpoint_format = "auto_gptq";
};
Int4Weight int4_weight_from_config(const AutoRoundConfig& config, const TensorView& qweight,
                                   const TensorView& scales,
                                   std::optional<TensorView> qzeros = std::nullopt,
                                   std::optional<TensorView> g_idx = std::nullopt);

// MXFP4 W4A16 (OCP Microscaling fp4; GPT-OSS's MoE experts, one matrix of
// its `*_blocks` / `*_scales`): blocks u8 [N, K/32, 16] or the same bytes as
// [N, K/2] (any strides), two e2m1 codes a byte, the low nibble the even k;
// scales u8 [N, ceil(K/32)], e8m0 exponents e. w[n, k] = e2m1(code) ·
// 2^(e[n, k/32] − 127), e2m1 = sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3,
// 4, 6. e = 255 (NaN) is refused. Any K >= 1: a K that is not a multiple of
// 32 is padded (k gives it; the codes of the last block past K are ignored,
// and unpack writes them as 0).
struct Mxfp4Weight {
  TensorView blocks;  // u8 [N, ceil(K/32), 16] or [N, ceil(K/2)]
  TensorView scales;  // u8 [N, ceil(K/32)]
  // The logical K; 0: all blocks holds (32 · blocks.shape[1] for the 3-D
  // form, 2 · blocks.shape[1] for the 2-D one).
  int64_t k = 0;
};

// A weight [N, K] repacked once for the micro-kernels (see docs/gemm.md for the
// layout). Owning, movable, cheap to copy (the packed bytes are shared and
// immutable). The layout tag travels with the data: a gemm checks it.
class PackedWeight {
 public:
  struct Impl;
  PackedWeight();
  ~PackedWeight();
  PackedWeight(const PackedWeight&);
  PackedWeight(PackedWeight&&) noexcept;
  PackedWeight& operator=(const PackedWeight&);
  PackedWeight& operator=(PackedWeight&&) noexcept;

  int64_t n() const;
  int64_t k() const;
  // The element type of the packed codes: bf16, i8, f8e4m3, u4 or f4e2m1 (mxfp4).
  DType dtype() const;
  WeightFormat format() const;
  // Layout name with its parameters, e.g. "bf16_vnni2_n64k32",
  // "u4_gptq_vnni2_n64k32_g128_zp_gidx_perm".
  std::string layout() const;
  // Size of the packed buffer in bytes (includes padding of the N and K tails,
  // and the scales / zero points the kernels read).
  size_t packed_bytes() const;
  bool empty() const { return impl_ == nullptr; }
  // bf16 weights: restores the original [N, K] weight exactly into `out`
  // (rows may be strided). A quantized weight raises an Error: use its own unpack.
  void unpack(const TensorView& out) const;
  // Quantized weights: writes the tensors given to pack_weight back, bit for
  // bit, in their logical layout, into caller-allocated views of the same
  // shapes and dtypes (the fields that were absent stay absent). The format
  // must match the packed one.
  void unpack(const Int8Weight& out) const;
  void unpack(const Fp8Weight& out) const;
  void unpack(const Int4Weight& out) const;
  void unpack(const Mxfp4Weight& out) const;  // blocks in either form; k 0 or K
  // The logical weight w[N, K] = dequantized codes (in double, rounded once
  // to out's dtype: f32 or bf16; K stride 1), for any format: what a weight
  // checker compares, never the physical layout.
  void dequantize(const TensorView& out) const;

  const Impl* impl() const { return impl_.get(); }
  explicit PackedWeight(std::shared_ptr<const Impl> impl);

 private:
  std::shared_ptr<const Impl> impl_;
};

// Packs w [N, K] bf16, any strides under which every element has its own
// address: strided rows, or a [K, N] tensor (x @ W) as the view {N, K} with
// strides {1, N}.
PackedWeight pack_weight(const TensorView& w);
// Packing a packed weight is a no-op: it returns the same packed data.
PackedWeight pack_weight(const PackedWeight& w);
// Quantized weights (docs/quantized.md): every N ≥ 1 and K ≥ 1 the format can
// express; the inputs are only read (a checkpoint is never modified).
PackedWeight pack_weight(const Int8Weight& w);
PackedWeight pack_weight(const Fp8Weight& w);
PackedWeight pack_weight(const Int4Weight& w);
PackedWeight pack_weight(const Mxfp4Weight& w);

// How an int8 (W8A8) GEMM quantizes x each call.
enum class ActQuant {
  dynamic_sym,   // per token: s = max|x|/127, s8 codes (run as u8 = s8 + 128)
  dynamic_asym,  // per token: u8 over [min(0, min x), max(0, max x)], a zero point
  fixed,         // one given scale and zero point for the tensor (act_scale, act_zero_point)
};

// How a GEMM with int4 weights (AWQ / GPTQ) computes (docs/quantized.md, "W4A8").
enum class Int4Route {
  automatic,  // the plan's choice by path and M (ops::w4a8_automatic): W4A8 on
              // llvm from 4 rows, on avx512 from 9 (the fused decode kernel
              // wins below; from 4 on a CPU without VBMI), W4A16 otherwise
              // and on amx
  w4a16,      // bf16 activations: the weights dequantized, or fused at small M
              // (ops::fused_max_rows: 16 rows on avx512 and llvm, 4 on amx)
  w4a8,       // x quantized per opt.act_quant to u8, exact int32 sums per group
};

struct GemmOptions {
  std::optional<TensorView> bias;  // [N], f32 or bf16
  Activation act = Activation::none;
  // int4 (AWQ / GPTQ) weights only (ignored otherwise; a value outside the
  // enum is an Error for every format).
  Int4Route int4_route = Int4Route::automatic;
  // int8 weights, and int4 weights on the W4A8 route (ignored otherwise; a
  // value outside the enum, or fixed with a bad act_scale / act_zero_point,
  // is an Error for every format).
  ActQuant act_quant = ActQuant::dynamic_sym;
  float act_scale = 0;       // ActQuant::fixed: > 0 and finite
  int act_zero_point = 128;  // ActQuant::fixed: u8 zero point in [0, 255] (128: symmetric)
};

// y[M, N] = act(x[M, K] · wᵀ + bias), bf16 inputs, fp32 accumulation.
// Quantized w (docs/quantized.md): fp8 and int4 weights run either exact in
// a fused decode kernel (M ≤ 16 on avx512 with AVX512-VBMI and on llvm, ≤ 4
// on amx) or dequantized to bf16 inside the GEMM (w rounded to bf16 once:
// within 2⁻⁸·|w| of the exact dequantized value); int8 weights run W8A8: x
// quantized per opt.act_quant,
// exact int32 dot products, then y = act(Σ·s_x·s_w + bias) in fp32; int4
// weights on the W4A8 route (opt.int4_route) likewise per scale group.
// NaN / Inf (every operator; docs/reliability.md "NaN and Inf"): IEEE
// propagation, the same on every path: a NaN in x row m, w row n or bias[n]
// makes y row m / column n NaN, and nothing else (relu(NaN) is NaN too).
// x: [M, K] bf16, K stride 1, row stride ≥ K. y: [M, N] bf16 or f32, N stride 1.
// Aliasing: y shares memory with neither x nor bias.
void gemm(const TensorView& x, const PackedWeight& w, const TensorView& y,
          const GemmOptions& opt = {});

// A batch of GEMMs of one shape, each with its own weight (sgl-kernel's
// bmm_cpu: DeepSeek's absorbed MLA multiplies each head's rows by that head's
// w_kc / w_vc): y[b] = act(x[b]·w[b]ᵀ + bias) for b < B, every y[b] equal to
// gemm(x[b], w[b], y[b], opt) bit for bit. x [B, M, K] bf16, y [B, M, N] bf16
// or f32 (innermost stride 1, any other strides: head-major views of token-
// major tensors), w: B weights of one shape [N, K] and one format, opt as
// gemm's (bias [N] shared by the batch). bf16 weights run as one pass over
// the thread pool (not B); quantized ones as B gemm calls.
// Aliasing: y shares memory with neither x nor bias.
void gemm_batched(const TensorView& x, const std::vector<PackedWeight>& w, const TensorView& y,
                  const GemmOptions& opt = {});

// ---- Attention (docs/attention.md) ------------------------------------------
// Scores s = softcap(q·k·sm_scale) + alibi_slope[h]·(j − i_pos), where query
// row i of a sequence with Tq queries and Tk keys sits at position
// i_pos = Tk − Tq + i (bottom-right alignment) and key j at position j.
// Key j is visible to query i when: !causal or j ≤ i_pos; window_left < 0 or
// j ≥ i_pos − window_left; window_right < 0 or j ≤ i_pos + window_right.
// Softmax over the visible keys in fp32; with sinks, exp(sink[h]) joins the
// denominator (a learned "no-op" key). A query that sees no key outputs 0.
// NaN / Inf: a NaN or +Inf score (NaN in q or a visible key's k, Inf·0) or a
// NaN / +Inf sink makes the row NaN, a NaN in v[j, c] column c of the rows
// that see j; a −Inf score is a weight of 0 (all −Inf: the row outputs 0).
// Keys a row cannot see never affect it (stale NaN in unused cache slots).
// Scales of an fp8 e4m3 KV cache (k_cache / v_cache of dtype f8e4m3, the
// same paged shape as a bf16 cache), sglang's k_scale / v_scale convention:
// the cache stores e4m3(x / scale) and a reader takes code · scale. Per
// tensor (k_scale, v_scale) or per kv head (k_head_scales / v_head_scales,
// f32 [Hkv], which replace the per-tensor value of their side). Every scale
// must be finite and > 0. A bf16 cache takes only the defaults (1, no head
// scales): a scale given for a cache that does not use it is an Error.
struct KvCacheScales {
  float k_scale = 1, v_scale = 1;
  std::optional<TensorView> k_head_scales;  // [Hkv] f32
  std::optional<TensorView> v_head_scales;  // [Hkv] f32
};

struct AttentionOptions {
  bool causal = false;
  std::optional<float> sm_scale;           // default 1/√D
  int window_left = -1;                    // -1: unbounded
  int window_right = -1;                   // -1: unbounded
  float softcap = 0;                       // 0: off; else cap·tanh(s/cap)
  std::optional<TensorView> sinks;         // [Hq] f32 or bf16 (read as f32)
  std::optional<TensorView> alibi_slopes;  // [Hq] f32 or bf16 (read as f32)
  // decode_attention / extend_attention over an f8e4m3 cache: its scales.
  // K and V are read as code · scale (exact e4m3 values, scales applied in
  // fp32), scores and P·V in fp32 as for bf16. flash_attn_varlen takes
  // only the defaults.
  KvCacheScales kv_scales;
};

// Prefill over a batch of variable-length sequences packed along T.
// q [Tq, Hq, D], k [Tk, Hkv, D], v [Tk, Hkv, Dv], out [Tq, Hq, Dv] bf16;
// cu_seqlens_q / cu_seqlens_k int32 [B+1] (prefix sums, starting at 0).
// Aliasing: q, k, v may be views of one buffer (fused qkv); out shares memory
// with no input.
void flash_attn_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& cu_seqlens_q,
                       const TensorView& cu_seqlens_k, const AttentionOptions& opt = {});

// One new token per sequence over a paged KV cache.
// q [B, Hq, D]; k_cache [num_blocks, block_size, Hkv, D]; v_cache
// [num_blocks, block_size, Hkv, Dv]; out [B, Hq, Dv] bf16; block_table int32
// [B, max_blocks_per_seq]; seq_lens int32 [B] (keys per sequence, the new
// token's included). The new token is the last position: i_pos = seq_len − 1.
// Aliasing: k_cache and v_cache may share memory (MLA: V = the first Dv
// columns of K); out shares memory with no input.
struct DecodeOptions {
  // Each sequence's output independent of the thread count and of the other
  // sequences of the batch (their number and lengths), bit for bit: no
  // split-KV (a sequence's keys in one fixed order, one task), so a long
  // context no longer spreads over the cores. docs/attention.md, "Determinism".
  bool deterministic = false;
};
void decode_attention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& block_table,
                      const TensorView& seq_lens, const AttentionOptions& opt = {},
                      const DecodeOptions& dec = {});

// Extend (sglang): for each sequence b, the new tokens q[qo_indptr[b] ..
// qo_indptr[b+1]) sit at positions prefix_lens[b] + i and attend to the
// sequence's prefix in the paged cache (keys 0 .. prefix_len − 1, through
// block_table) and causally to each other (opt.causal is implied). Their own
// K/V come from k_new / v_new, or, when both are absent, from the cache at
// positions prefix_len .. prefix_len + n_new − 1 (written there beforehand,
// e.g. a KV-shared layer); a token at position p never sees a key past p.
struct ExtendOptions {
  std::optional<TensorView> k_new;  // [T, Hkv, D] bf16
  std::optional<TensorView> v_new;  // [T, Hkv, Dv] bf16
  // Speculative-decoding tree mask, u8 [Σ_b n_b²], row-major per sequence:
  // mask[i·n_b + j] != 0 lets new token i see new token j (replaces the causal
  // rule among the new tokens; the prefix stays visible, subject to windows).
  std::optional<TensorView> tree_mask;
  // Each sequence's output independent of the thread count and of the other
  // sequences of the batch, bit for bit: no split-KV, fixed key order.
  bool deterministic = false;
};

// q [T, Hq, D], out [T, Hq, Dv] bf16 (T = Σ n_b); k_cache / v_cache
// [num_blocks, block_size, Hkv, D / Dv]; qo_indptr int32 [B+1] (prefix sums
// from 0 to T); block_table int32 [B, max_blocks]; prefix_lens int32 [B].
// Aliasing: the inputs may share memory with each other; out with none of them.
void extend_attention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& qo_indptr,
                      const TensorView& block_table, const TensorView& prefix_lens,
                      const AttentionOptions& opt = {}, const ExtendOptions& ext = {});

// Writes new K/V rows into the paged cache: k [T, Hkv, D], v [T, Hkv, Dv] into
// slot slot_mapping[t] (int32 or int64 [T]; slot = block·block_size + offset;
// a negative slot skips its token; one ≥ num_blocks·block_size is an Error
// raised before anything is written; of tokens that share a slot, the last
// one's row is stored).
// Aliasing: k_cache and v_cache share memory with neither each other (they
// may be the two halves of each block of one buffer) nor k, v, slot_mapping,
// except in the MLA form: v_cache the first Dv columns of k_cache (the same
// data pointer and strides) and v the first Dv columns of k; then only k is
// written (it holds v), with K's scale (k and v scales must then be equal).
// The caches are bf16 (rows copied) or both f8e4m3 (an fp8 KV cache): then
// each element is stored as e4m3(x / scale), x / scale computed in f32 and
// rounded to the nearest e4m3 value (ties to even), saturated: |x / scale|
// beyond 448 (±Inf included) is stored as ±448; a NaN as the NaN code 0x7F
// (readers then see NaN, as with a NaN in a bf16 cache). scale is the
// KvCacheScales value of the cache's side (its head's with head scales).
void store_kv(const TensorView& k, const TensorView& v, const TensorView& k_cache,
              const TensorView& v_cache, const TensorView& slot_mapping,
              const KvCacheScales& scales = {});

// ---- Rotary position embedding (docs/rope.md) -------------------------------
// In place on q [T, Hq, D] and k [T, Hk, D] (f32 or bf16, the same dtype; row
// and head strides free, innermost stride 1), with f32 arithmetic. The first
// rotary_dim elements of each head rotate, the rest pass through untouched.
// cos_sin_cache [max_position, W] (f32 or bf16, innermost stride 1), W = the
// rotary width of one position stream: row p = cos θ_0..θ_{W/2−1}, then
// sin θ_0..θ_{W/2−1}. positions int32 or int64: [T], or [S, T] with one row
// per position stream. Every position must lie in [0, max_position) (checked
// over the full int64 range before anything is read or written).
enum class RopeStyle {
  neox,  // rotate halves: pairs (x[i], x[i + W/2])
  gptj,  // interleaved: pairs (x[2i], x[2i + 1])
};
struct RopeOptions {
  RopeStyle style = RopeStyle::neox;
  int64_t rotary_dim = 0;  // 0: D; else even, <= D
  // Multidimensional RoPE (2-D vision): the rotary part splits into ndim equal
  // chunks (rotary_dim / ndim, even), chunk c rotated on its own as a rotary
  // of width W = rotary_dim / ndim with positions[c]; positions [ndim, T].
  int ndim = 1;
  // M-RoPE (vLLM's mrope_section, e.g. {16, 24, 24} for t/h/w): frequency
  // index i < rotary_dim / 2 in section s takes its cos/sin from row
  // positions[s]; sum = rotary_dim / 2; positions [sections, T]; W = rotary_dim.
  std::vector<int64_t> mrope_section;
  // Interleaved M-RoPE (Qwen3-VL; sglang/vLLM mrope_interleaved): needs 3
  // sections {t, h, w} summing to rotary_dim / 2; frequency index i <
  // rotary_dim / 2 takes row positions[1] if i % 3 == 1 and i < 3·h,
  // positions[2] if i % 3 == 2 and i < 3·w, else positions[0] (t is implied).
  bool mrope_interleaved = false;
};

// Rotates q and, when k is non-null, k in one pass over the tokens.
// Aliasing: in place on q and k, which may be column slices of one qkv buffer
// but may not share an element (k == q would rotate twice); positions and
// cos_sin_cache share memory with neither.
void rope(const TensorView& q, const TensorView* k, const TensorView& positions,
          const TensorView& cos_sin_cache, const RopeOptions& opt = {});

// ---- Mixture of experts (docs/moe.md) ---------------------------------------
// Expert weights, packed once at load for the GEMM micro-kernels.
//   gate_up: w13 [E, 2I, H] bf16 (per expert the I gate rows, then the I up
//            rows: nn.Linear layout), packed so each 64-column block holds 32
//            gate and the matching 32 up columns (the act-and-mul epilogue
//            pairs them in registers).
//   down:    w2 [E, H, I] bf16.
//   up:      w1 [E, I, H] bf16, a non-gated MLP's up projection (Nemotron-H's
//            experts: down(relu(up(x))²)); fused_experts applies
//            MoeOptions::act to it alone, and takes it where gate_up goes.
enum class ExpertProj { gate_up, down, up };
class PackedExperts {
 public:
  struct Impl;
  PackedExperts();
  ~PackedExperts();
  PackedExperts(const PackedExperts&);
  PackedExperts(PackedExperts&&) noexcept;
  PackedExperts& operator=(const PackedExperts&);
  PackedExperts& operator=(PackedExperts&&) noexcept;

  int64_t num_experts() const;
  ExpertProj proj() const;
  // Output features per expert: I for gate_up (2I rows packed), H for down.
  int64_t n() const;
  // Input features: H for gate_up, I for down.
  int64_t k() const;
  // Layout tag, checked by fused_experts: "bf16_vnni2_n64k32_glu32" (gate_up)
  // or "bf16_vnni2_n64k32" (down).
  std::string layout() const;
  size_t packed_bytes() const;
  bool empty() const { return impl_ == nullptr; }
  // The experts' weight format (bf16, or that of the checkpoints of the
  // quantized pack_experts overloads).
  WeightFormat format() const;
  // Restores the original weights exactly: out [E, 2I, H] (gate_up) or
  // [E, H, I] (down), bf16, innermost stride 1. bf16 experts only.
  void unpack(const TensorView& out) const;
  // Quantized experts: expert e's checkpoint tensors back, bit for bit, into
  // out[e] (shaped as that expert's tensors were when packed).
  void unpack(const std::vector<Int8Weight>& out) const;
  void unpack(const std::vector<Fp8Weight>& out) const;
  void unpack(const std::vector<Int4Weight>& out) const;
  void unpack(const std::vector<Mxfp4Weight>& out) const;
  // The logical weights of any format: out [E, 2I, H] or [E, H, I], f32 or
  // bf16 (rounded to nearest even), innermost stride 1.
  void dequantize(const TensorView& out) const;

  const Impl* impl() const { return impl_.get(); }
  explicit PackedExperts(std::shared_ptr<const Impl> impl);

 private:
  std::shared_ptr<const Impl> impl_;
};

// w: [E, 2I, H] for gate_up, [E, H, I] for down; bf16, any strides under
// which an expert's elements have their own addresses (HF's GPT-OSS and
// Llama-4 experts, [E, H, 2I] for x @ W, are the view {E, 2I, H} with
// strides {2I·H, 1, 2I}).
// The order of a gate_up matrix's rows: `halves` (the I gate rows, then the
// I up rows: sglang's and vLLM's w13) or `interleaved` (row 2i gate i, row
// 2i + 1 up i: GPT-OSS's gate_up_proj); unpack and dequantize give the rows
// back in that order. interleaved with proj down or up is an Error.
enum class GluRows { halves, interleaved };
PackedExperts pack_experts(const TensorView& w, ExpertProj proj, GluRows rows = GluRows::halves);
// Packing packed experts is a no-op (the same bytes) if proj matches, else an Error.
PackedExperts pack_experts(const PackedExperts& w, ExpertProj proj);
// Quantized experts (docs/moe.md): one checkpoint description per expert
// (views into an engine's [E, ...] tensors, or its per-expert tensors), each
// of the logical [2I, H] matrix (gate_up) or [H, I] (down), with the
// formats, checks and contract of pack_weight (docs/quantized.md). Every
// expert has the same shape, format and parameters (group size, zero
// points, block sizes, scale granularity; act-order g_idx may differ per
// expert). A tensor-parallel shard is just views of the shard: any I.
// gate_up rows: GluRows (above).
PackedExperts pack_experts(const std::vector<Int8Weight>& w, ExpertProj proj,
                           GluRows rows = GluRows::halves);
PackedExperts pack_experts(const std::vector<Fp8Weight>& w, ExpertProj proj,
                           GluRows rows = GluRows::halves);
PackedExperts pack_experts(const std::vector<Int4Weight>& w, ExpertProj proj,
                           GluRows rows = GluRows::halves);
// MXFP4 (GPT-OSS): expert e's `*_blocks[e]` / `*_scales[e]`; its gate_up
// with GluRows::interleaved.
PackedExperts pack_experts(const std::vector<Mxfp4Weight>& w, ExpertProj proj,
                           GluRows rows = GluRows::halves);

struct MoeOptions {
  // Gated activation act(gate)·up; silu (silu_and_mul), gelu_tanh or gelu_erf
  // (gelu_and_mul). Others raise an Error.
  Activation act = Activation::silu;
  // GPT-OSS clamped SwiGLU instead of act: g = min(gate, limit),
  // u = clamp(up, −limit, limit), out = g·σ(alpha·g)·(u + 1).
  bool clamped_swiglu = false;
  float swiglu_alpha = 1.702f;
  float swiglu_limit = 7.0f;
  // [E, 2I] f32 or bf16 (GPT-OSS's checkpoints; read as f32), in w13's row
  // order: gate then up biases per expert, or interleaved (2i gate, 2i + 1
  // up) when w13 was packed GluRows::interleaved.
  std::optional<TensorView> b13;
  std::optional<TensorView> b2;  // [E, H] f32 or bf16
  // out = routed_scaling_factor · Σ_j w[t, j]·expert_j(x_t) + s[t]·shared(x_t)
  float routed_scaling_factor = 1.0f;
  // Shared expert (DeepSeek, Qwen-MoE): one-expert packs (E = 1), same
  // activation, no bias. It may be packed in another format than the routed
  // experts.
  const PackedExperts* shared_w13 = nullptr;
  const PackedExperts* shared_w2 = nullptr;
  // The shared expert's weight s[t] per token, f32 or bf16 [T] (Qwen2-MoE's and
  // Qwen3-Next's gated shared expert: σ(shared_expert_gate(x_t)), computed by
  // the caller); absent: 1 (DeepSeek). Not scaled by routed_scaling_factor;
  // only with a shared expert.
  std::optional<TensorView> shared_weights;
  // int4 (AWQ / GPTQ) experts: W4A16 or W4A8 per expert, by GemmOptions::
  // int4_route's rule with the rows routed to the expert as M (automatic:
  // as Int4Route::automatic). On W4A8 both projections' inputs are
  // quantized per act_quant, as for int8 experts.
  Int4Route int4_route = Int4Route::automatic;
  // int8 (W8A8) experts and int4 experts on the W4A8 route: how both
  // projections' inputs are quantized: per token (dynamic_sym, dynamic_asym)
  // or with static per-tensor scales (fixed: the four fields below). fixed
  // needs int8 routed or shared experts (an Error otherwise); dynamic modes
  // are ignored by other formats.
  ActQuant act_quant = ActQuant::dynamic_sym;
  // ActQuant::fixed: the per-tensor scale and u8 zero point of each
  // projection's input, as sglang / vLLM's a1_scale (hidden, the input of
  // w13) and a2_scale (the gated activation, the input of w2): codes
  // q = clamp(rne(x·(1/s)) + z, 0, 255), 1/s in f32, saturating as gemm's
  // fixed mode does.
  // Scales finite > 0, zero points in [0, 255] (128: symmetric s8 codes).
  // A shared int8 expert uses the same two (its inputs are the same tensors'
  // kind: hidden, then its own activation).
  float act_scale13 = 0, act_scale2 = 0;
  int act_zero_point13 = 128, act_zero_point2 = 128;
};

// out[t] = rsf · Σ_j topk_weights[t, j] · (glu(x_t·W13_eᵀ + b13_e) · W2_eᵀ + b2_e)
//          + s[t] · shared(x_t)   (s = shared_weights, or 1),
// e = topk_ids[t, j], rsf = routed_scaling_factor, glu(gate, up) the gated
// activation of MoeOptions; the intermediate glu(...) is stored as bf16.
// hidden [T, H] bf16; topk_weights f32 or bf16 [T, k]; topk_ids int32 or
// int64 (torch.topk's) [T, k] in [0, E) (all checked before any expert is
// read); out [T, H] bf16 or f32 (may not overlap hidden). Row strides free.
// Aliasing: out shares memory with no input (hidden, topk_*, biases).
void fused_experts(const TensorView& hidden, const PackedExperts& w13, const PackedExperts& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const MoeOptions& opt = {});

// Routing. logits [T, E] f32 or bf16; topk_weights f32 [T, k]; topk_ids int32
// [T, k] (k from their shape, 1 ≤ k ≤ E). Each token's experts are written
// best first; ties pick the lower expert id. Renormalizing a zero sum leaves
// the weights as they are (never NaN). NaN logits rank below every number
// (−Inf included); under softmax a NaN logit makes its token's weights NaN,
// +Inf logits share probability 1, an all −Inf token is uniform.
// docs/moe.md has the details.
// softmax over E, then the k largest; renormalize: weights sum to 1.
// Aliasing (all three routers): topk_weights and topk_ids share memory with
// neither each other nor logits (nor correction_bias).
void topk_softmax(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, bool renormalize = true);
// σ(logit) per expert, then the k largest.
void topk_sigmoid(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, bool renormalize = true);
// DeepSeek grouped top-k: the E experts split into num_expert_group equal
// groups; score s = softmax or σ of the logits; selection uses
// s + correction_bias (DeepSeek-V3) and keeps the topk_group groups with the
// best group score (sum of its top two when a correction bias is given, its
// one score for groups of one expert, else its max), then the k best experts inside them. Weights
// are s (without the bias), renormalized if asked, times routed_scaling_factor.
enum class RouterScore { softmax, sigmoid };
struct GroupedTopkOptions {
  RouterScore score = RouterScore::sigmoid;
  int num_expert_group = 1;
  int topk_group = 1;
  bool renormalize = true;
  float routed_scaling_factor = 1.0f;
  std::optional<TensorView> correction_bias;  // [E] f32, finite
};
void grouped_topk(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, const GroupedTopkOptions& opt = {});

// ---- Row-wise layer ops (docs/rowwise.md) -----------------------------------
// RMSNorm and the gated MLP activation, JIT-compiled per row length and dtype
// (one LLVM kernel serving the llvm, avx512 and amx paths; the scalar path
// runs the reference). Rows: x's last dim is the row (contiguous), the
// leading dims (rank 1-4 in all) are rows with any strides (a Q/K norm over
// the heads of a fused qkv output works in place). Each row is computed
// alone, so results never depend on the batch (batch-invariant).
struct NormOptions {
  // rstd = 1 / sqrt(mean(v²) + eps): finite, >= the smallest positive f32
  // (1.4e-45); 0 or negative is an Error (an all-zero row would be 0·∞).
  float eps = 1e-6f;
  // Gemma's RMSNorm: the weight is applied as (1 + w), in f32.
  bool weight_plus_one = false;
};
// out = v · rstd(v) · w (or (1 + w)), v = x in f32, rstd over the row's h
// values, the squares summed in double (no overflow or underflow for any
// f32); x · rstd, then · w, each rounded in f32, then to out's dtype once.
// x, out: [..., h] f32 or bf16 (dtypes may differ, shapes equal); weight:
// [h] f32 or bf16, or null (no weight: Llama-4's L2 norm of q / k). out may be
// x itself (in place) but may not otherwise overlap x or weight.
void rms_norm(const TensorView& x, const TensorView* weight, const TensorView& out,
              const NormOptions& opt = {});
// The pre-norm block's add then norm (sglang / vLLM fused_add_rms_norm):
// residual = x + residual, rounded to residual's dtype (f32 sum, one
// rounding), then out = rms_norm(residual): the stored residual is what is
// normalised (as the model's reference computes it). x, residual, out:
// [..., h] f32 or bf16, equal shapes; out may be x itself (sglang's in-place
// form); residual overlaps neither x nor out, and the weight neither of the
// written two (x and the weight are only read: they may share memory).
void fused_add_rms_norm(const TensorView& x, const TensorView& residual, const TensorView* weight,
                        const TensorView& out, const NormOptions& opt = {});

// LayerNorm (GPT-NeoX, Phi, Falcon, StarCoder; the vision towers of VLMs:
// CLIP, SigLIP): out = (v - mean)·rstd·w + b, rstd = 1 / sqrt(var + eps),
// var the population variance of the row: Σv and Σv² in one pass (f32
// blocks summed in double) where mean² ≤ var; a row farther from 0 than its
// spread takes the corrected two-pass sum (the squared deviations from the
// f32 mean, less their sum's square); rows no f32 sum holds are computed in
// double (docs/rowwise.md). weight and bias: [h] f32 or bf16, each optional
// (opt.weight_plus_one: (1 + w)). The rest as rms_norm (shapes, dtypes, in
// place, overlap); eps: NormOptions' default unless given.
void layer_norm(const TensorView& x, const TensorView* weight, const TensorView* bias,
                const TensorView& out, const NormOptions& opt = {});
// residual = x + residual (rounded to its dtype), out = layer_norm(residual):
// as fused_add_rms_norm (sgl-kernel's fused_add_layernorm_cpu).
void fused_add_layer_norm(const TensorView& x, const TensorView& residual, const TensorView* weight,
                          const TensorView* bias, const TensorView& out,
                          const NormOptions& opt = {});

// The gated RMSNorm of linear-attention and SSM layers (FLA's RMSNormGated:
// Qwen3-Next's gated delta net, Mamba-2's output norm).
struct GatedNormOptions {
  NormOptions norm;
  // The gate's activation: any Activation (none: the gate as it is).
  Activation act = Activation::silu;
  // true: out = rms_norm(x)·w·act(gate) (Qwen3-Next); false: the gated value
  // is normalised, out = rms_norm(x·act(gate))·w (Mamba-2).
  bool norm_before_gate = true;
};
// x, gate, out: [..., h] f32 or bf16, equal shapes (a group-wise norm, as
// Mamba-2's ngroups, is a [..., g, h / g] view). act(gate), and with the
// gate first x·act(gate), are f32 values (the definition: one that
// overflows is ±Inf, on every path), the rest in f32, rounded once to out.
// out may be x itself; gate may share memory with x but not with out.
void rms_norm_gated(const TensorView& x, const TensorView& gate, const TensorView* weight,
                    const TensorView& out, const GatedNormOptions& opt = {});

// The gated activation of a dense MLP (sgl-kernel's silu_and_mul,
// gelu_and_mul, gelu_tanh_and_mul; GPT-OSS's clamped SwiGLU), the formula of
// MoeOptions with the same vector math as fused_experts' epilogue.
struct GluOptions {
  // act(gate)·up; any Activation (none: gate·up); unused with clamped_swiglu.
  Activation act = Activation::silu;
  bool clamped_swiglu = false;  // instead of act, as MoeOptions::clamped_swiglu
  float swiglu_alpha = 1.702f;  // finite
  float swiglu_limit = 7.0f;    // finite, > 0
  // x's row: the d gate values then the d up values (halves), or pairs
  // (gate_i, up_i) (interleaved: GPT-OSS's gate_up_proj output).
  GluRows rows = GluRows::halves;
};
// out[..., i] = glu(gate_i, up_i) in f32, rounded once to out's dtype.
// x: [..., 2d] f32 or bf16; out: [..., d] f32 or bf16, the same leading dims;
// out shares memory with no element of x.
void act_and_mul(const TensorView& x, const TensorView& out, const GluOptions& opt = {});

struct CpuInfo {
  std::string vendor;
  bool avx512f = false, avx512bw = false, avx512vl = false;
  bool avx512_bf16 = false, avx512_fp16 = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool amx_permitted = false;  // the OS granted XTILEDATA (arch_prctl)
  bool amx_emulated = false;   // AMX runs under the tests' emulator (TILEJIT_AMX_EMULATE)
  Isa max_isa = Isa::scalar;   // best path the CPU and OS allow
  bool avx2 = false, fma = false;
  bool llvm_backend = false;  // built with the LLVM ORC backend
  Isa isa = Isa::scalar;      // the active path (capped by TILEJIT_ISA, TILEJIT_BACKEND)
  int num_threads = 1;
};
CpuInfo cpu_info();

struct CacheStats {
  uint64_t hits = 0;            // lookups served from the cache
  uint64_t misses = 0;          // lookups that had to wait for (or do) a compile
  uint64_t compiles = 0;        // kernels emitted
  double compile_seconds = 0;   // total wall time spent emitting
  size_t kernels = 0;           // kernels resident
  uint64_t disk_loads = 0;      // kernels loaded from TILEJIT_CACHE_DIR instead of compiled
  uint64_t disk_stores = 0;     // kernels written to it
  std::string disk_dir;         // "" when the on-disk cache is off
  uint64_t tuned_plans = 0;     // tuning database entries applied so far (docs/tuning.md)
  uint64_t disk_evictions = 0;  // entries removed to keep it under TILEJIT_CACHE_MAX_SIZE
};
CacheStats cache_stats();

// Loads a tuning database written by `tilejit tune` (docs/tuning.md) in place
// of the one TILEJIT_TUNING_DB names: entries of this CPU and tilejit build
// pick the plans of the shapes they cover; the others are ignored. A file
// that is not a valid database is an Error naming it and the line.
void load_tuning_db(const std::string& path);

// Threads used by operator calls (default: TILEJIT_NUM_THREADS, else the CPUs
// the process may run on: README).
void set_num_threads(int n);
int num_threads();

// Batch-invariant mode, for deterministic serving (sglang's
// --enable-deterministic-inference, vLLM's VLLM_BATCH_INVARIANT): while on,
// each row of gemm / gemm_batched / fused_experts with any weight format
// and each sequence of decode_attention / extend_attention (as with their
// `deterministic` option) gives the same bits whatever the other rows or
// sequences of the call and the thread count: the kernels sum every row in
// one fixed order (no row-count-dependent K split or accumulator
// interleaving, one ISA for every M, tuning database plans not applied).
// fp8, int4 and MXFP4 weights take one route for every M (int4_route
// automatic means W4A16): the fused decode kernel on the llvm and avx512
// paths (prefill slower than the default mode's), the dequant route on amx.
// Exception: a call whose x holds an ±Inf runs int4 weights on the dequant
// route (IEEE infinities), so its rows may differ from the same rows alone
// (docs/reliability.md "Determinism").
// Default: TILEJIT_BATCH_INVARIANT (0 or 1; unset or empty: off); this call
// overrides it for the process.
void set_batch_invariant(bool on);
bool batch_invariant();

}  // namespace tilejit
