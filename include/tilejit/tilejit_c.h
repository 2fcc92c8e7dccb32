/* The C API of tilejit: the same operators as tilejit/tilejit.h behind a C
 * ABI, for engines written in C, built without C++ exceptions, built against
 * another C++ standard library (libc++) than libtilejit's, or calling it
 * through an FFI (ctypes, Rust, Go). docs/c-api.md has the contract.
 *
 *   int64_t xs[2] = {M, K}, ys[2] = {M, N};
 *   tilejit_tensor x = {x_ptr, TILEJIT_BF16, 2, xs, NULL};
 *   tilejit_tensor y = {y_ptr, TILEJIT_BF16, 2, ys, NULL};
 *   if (tilejit_gemm(&x, w, &y, NULL) != TILEJIT_OK)
 *     fprintf(stderr, "tilejit: %s\n", tilejit_last_error());
 *
 * Every function returns a tilejit_status; nothing throws, aborts or exits.
 * On failure the calling thread's tilejit_last_error() names the argument, its
 * value and what is allowed (the message of the C++ API's tilejit::Error);
 * bad input writes no output (a resource failure in the middle of a call may
 * leave one partly written). Semantics, layouts, aliasing rules and limits are
 * those of the C++ function of the same name. C89 with <stdbool.h>, C99 or
 * later; C++ callers (C++98 on) may include it too. */
#ifndef TILEJIT_TILEJIT_C_H
#define TILEJIT_TILEJIT_C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header's ABI. A program built against version V runs
 * on a library that reports V from tilejit_c_api_version(). */
#define TILEJIT_C_API_VERSION 1
int tilejit_c_api_version(void);

typedef enum tilejit_status {
  TILEJIT_OK = 0,
  /* Refused or failed: bad input (a shape, dtype, stride, option, a NULL
   * argument, an options struct not set up by its _init function), or a
   * resource the call could not get (memory, threads, stack). The C++ API's
   * tilejit::Error. */
  TILEJIT_ERROR = 1,
  /* A failure inside tilejit on an input it accepted (please report it):
   * tilejit::InternalError, or any other C++ exception. */
  TILEJIT_INTERNAL_ERROR = 2
} tilejit_status;

/* The message of the calling thread's last failed call ("" if none failed
 * yet). A successful call leaves it as it was. Valid until the thread's next
 * failed call; at most 4095 bytes (a longer message ends in "..."). */
const char* tilejit_last_error(void);
/* "ok", "error", "internal error"; "unknown status" otherwise. */
const char* tilejit_status_name(tilejit_status s);

/* ---- Tensors ------------------------------------------------------------ */
/* The values of tilejit::DType. */
typedef enum tilejit_dtype {
  TILEJIT_F32 = 0,
  TILEJIT_BF16 = 1,
  TILEJIT_F16 = 2,
  TILEJIT_I8 = 3,
  TILEJIT_U8 = 4,
  TILEJIT_I32 = 5,
  TILEJIT_F8E4M3 = 6,
  TILEJIT_U4 = 7,
  TILEJIT_I64 = 8,
  TILEJIT_F4E2M1 = 9,
  TILEJIT_F8E5M2 = 10
} tilejit_dtype;

/* The most dims a tensor may declare (no operator takes more than 4). */
#define TILEJIT_MAX_NDIM 8

/* A non-owning view of a strided tensor, as DLPack describes one: shape and
 * strides point to ndim int64 values each (read during the call only);
 * strides NULL means row-major; strides are in elements. The C++ API's
 * TensorView rules apply (docs/reliability.md). */
typedef struct tilejit_tensor {
  void* data;
  tilejit_dtype dtype;
  int32_t ndim;
  const int64_t* shape;
  const int64_t* strides;
} tilejit_tensor;

/* The values of tilejit::Activation. */
typedef enum tilejit_activation {
  TILEJIT_ACT_NONE = 0,
  TILEJIT_ACT_RELU = 1,
  TILEJIT_ACT_SILU = 2,
  TILEJIT_ACT_GELU_TANH = 3,
  TILEJIT_ACT_GELU_ERF = 4,
  TILEJIT_ACT_RELU2 = 5
} tilejit_activation;

/* Options structs: declare one, call its _init function (the defaults of
 * the C++ options, and struct_size = sizeof the struct), then set fields.
 * Fields are only ever appended: a struct of an earlier header's size is
 * read up to it, later fields at their defaults; any other struct_size
 * (e.g. not set up by _init) is refused with TILEJIT_ERROR (docs/c-api.md).
 * A NULL options pointer means the defaults. Optional tensors are pointers,
 * NULL when absent. */

/* ---- Weights and GEMM (docs/gemm.md, docs/quantized.md) ------------------ */
/* The values of tilejit::WeightFormat. */
typedef enum tilejit_weight_format {
  TILEJIT_WEIGHT_BF16 = 0,
  TILEJIT_WEIGHT_INT8 = 1,
  TILEJIT_WEIGHT_FP8_E4M3 = 2,
  TILEJIT_WEIGHT_INT4_AWQ = 3,
  TILEJIT_WEIGHT_INT4_GPTQ = 4,
  TILEJIT_WEIGHT_MXFP4 = 5
} tilejit_weight_format;

/* The checkpoint tensors of each quantized format: tilejit::Int8Weight,
 * Fp8Weight, Int4Weight, Mxfp4Weight (tilejit/tilejit.h says what each holds). */
typedef struct tilejit_int8_weight {
  tilejit_tensor weight;
  tilejit_tensor scales;
} tilejit_int8_weight;

typedef struct tilejit_fp8_weight {
  tilejit_tensor weight;
  tilejit_tensor scales;
  int64_t block_n, block_k; /* block scales only (0 otherwise) */
} tilejit_fp8_weight;

typedef enum tilejit_int4_format {
  TILEJIT_INT4_AWQ = 0,
  TILEJIT_INT4_GPTQ = 1
} tilejit_int4_format;

typedef struct tilejit_int4_weight {
  tilejit_int4_format format;
  tilejit_tensor qweight;
  tilejit_tensor scales;
  const tilejit_tensor* qzeros; /* NULL: symmetric */
  const tilejit_tensor* g_idx;  /* NULL: k / group_size */
  int32_t bits;                 /* 4 */
  int64_t group_size;           /* any >= 1, or -1 (per channel) */
  bool gptq_v2;
  int64_t n, k; /* 0: from qweight */
} tilejit_int4_weight;
/* The C++ defaults: gptq, bits 4, group 128, v1 zeros, n = k = 0; no tensors. */
void tilejit_int4_weight_init(tilejit_int4_weight* w);

/* An AutoRound quantization_config (tilejit::AutoRoundConfig):
 * checkpoint_format is "auto_gptq", "gptq", "gptq_v2", "gptqmodel" (v2 zeros),
 * "auto_awq", "awq", with or without an "auto_round:" prefix. */
typedef struct tilejit_autoround_config {
  int32_t bits;
  int64_t group_size;
  bool sym;
  bool desc_act;
  const char* checkpoint_format;
} tilejit_autoround_config;
/* Fills *out from the config and the tensors (which *out then points to,
 * as given: they must outlive its use), checking them as
 * tilejit::int4_weight_from_config does. qzeros and g_idx may be NULL. */
tilejit_status tilejit_int4_weight_from_autoround(const tilejit_autoround_config* config,
                                                  const tilejit_tensor* qweight,
                                                  const tilejit_tensor* scales,
                                                  const tilejit_tensor* qzeros,
                                                  const tilejit_tensor* g_idx,
                                                  tilejit_int4_weight* out);

typedef struct tilejit_mxfp4_weight {
  tilejit_tensor blocks;
  tilejit_tensor scales;
  int64_t k; /* 0: all that blocks holds */
} tilejit_mxfp4_weight;

/* A packed weight (tilejit::PackedWeight): made by a tilejit_pack_weight_*
 * function, freed by tilejit_packed_weight_destroy. Immutable: any number of
 * threads may run GEMMs on one at once. */
typedef struct tilejit_packed_weight tilejit_packed_weight;

/* On success *out is a new packed weight; on failure *out is NULL. */
tilejit_status tilejit_pack_weight_bf16(const tilejit_tensor* w, tilejit_packed_weight** out);
tilejit_status tilejit_pack_weight_int8(const tilejit_int8_weight* w, tilejit_packed_weight** out);
tilejit_status tilejit_pack_weight_fp8(const tilejit_fp8_weight* w, tilejit_packed_weight** out);
tilejit_status tilejit_pack_weight_int4(const tilejit_int4_weight* w, tilejit_packed_weight** out);
tilejit_status tilejit_pack_weight_mxfp4(const tilejit_mxfp4_weight* w,
                                         tilejit_packed_weight** out);
/* NULL is a no-op. */
void tilejit_packed_weight_destroy(tilejit_packed_weight* w);

typedef struct tilejit_packed_weight_info {
  int64_t n, k;
  tilejit_dtype dtype; /* of the packed codes */
  tilejit_weight_format format;
  size_t packed_bytes;
  const char* layout; /* the layout tag; valid while the weight lives */
} tilejit_packed_weight_info;
tilejit_status tilejit_packed_weight_get_info(const tilejit_packed_weight* w,
                                              tilejit_packed_weight_info* out);
/* The logical weight [N, K] in f32 or bf16, any format. */
tilejit_status tilejit_packed_weight_dequantize(const tilejit_packed_weight* w,
                                                const tilejit_tensor* out);
/* The tensors given to pack_weight, bit for bit, into caller-allocated views
 * of the same shapes and dtypes; the function of the weight's format. */
tilejit_status tilejit_packed_weight_unpack_bf16(const tilejit_packed_weight* w,
                                                 const tilejit_tensor* out);
tilejit_status tilejit_packed_weight_unpack_int8(const tilejit_packed_weight* w,
                                                 const tilejit_int8_weight* out);
tilejit_status tilejit_packed_weight_unpack_fp8(const tilejit_packed_weight* w,
                                                const tilejit_fp8_weight* out);
tilejit_status tilejit_packed_weight_unpack_int4(const tilejit_packed_weight* w,
                                                 const tilejit_int4_weight* out);
tilejit_status tilejit_packed_weight_unpack_mxfp4(const tilejit_packed_weight* w,
                                                  const tilejit_mxfp4_weight* out);

/* The values of tilejit::ActQuant and tilejit::Int4Route. */
typedef enum tilejit_act_quant {
  TILEJIT_ACT_QUANT_DYNAMIC_SYM = 0,
  TILEJIT_ACT_QUANT_DYNAMIC_ASYM = 1,
  TILEJIT_ACT_QUANT_FIXED = 2
} tilejit_act_quant;
typedef enum tilejit_int4_route {
  TILEJIT_INT4_ROUTE_AUTOMATIC = 0,
  TILEJIT_INT4_ROUTE_W4A16 = 1,
  TILEJIT_INT4_ROUTE_W4A8 = 2
} tilejit_int4_route;

typedef struct tilejit_gemm_options {
  uint32_t struct_size;
  const tilejit_tensor* bias; /* [N] f32 or bf16 */
  tilejit_activation act;
  tilejit_int4_route int4_route;
  tilejit_act_quant act_quant;
  float act_scale;
  int32_t act_zero_point;
} tilejit_gemm_options;
void tilejit_gemm_options_init(tilejit_gemm_options* opt);

/* y[M, N] = act(x[M, K] · wᵀ + bias): tilejit::gemm. */
tilejit_status tilejit_gemm(const tilejit_tensor* x, const tilejit_packed_weight* w,
                            const tilejit_tensor* y, const tilejit_gemm_options* opt);

/* y[b] = act(x[b] · w[b]ᵀ + bias) for b < B: tilejit::gemm_batched (x [B, M,
   K], y [B, M, N], w an array of B weights of one shape; w may be NULL when
   w_count is 0). */
tilejit_status tilejit_gemm_batched(const tilejit_tensor* x, const tilejit_packed_weight* const* w,
                                    size_t w_count, const tilejit_tensor* y,
                                    const tilejit_gemm_options* opt);

/* ---- Attention (docs/attention.md) -------------------------------------- */
typedef struct tilejit_kv_cache_scales {
  float k_scale, v_scale;
  const tilejit_tensor* k_head_scales; /* [Hkv] f32 or NULL */
  const tilejit_tensor* v_head_scales;
} tilejit_kv_cache_scales;

typedef struct tilejit_attention_options {
  uint32_t struct_size;
  bool causal;
  bool has_sm_scale; /* false: 1/√D */
  float sm_scale;
  int32_t window_left, window_right;  /* -1: unbounded */
  float softcap;                      /* 0: off */
  const tilejit_tensor* sinks;        /* [Hq] f32 or bf16 */
  const tilejit_tensor* alibi_slopes; /* [Hq] f32 or bf16 */
  tilejit_kv_cache_scales kv_scales;  /* an f8e4m3 cache's scales (1, 1) */
} tilejit_attention_options;
void tilejit_attention_options_init(tilejit_attention_options* opt);

typedef struct tilejit_extend_options {
  uint32_t struct_size;
  const tilejit_tensor* k_new; /* [T, Hkv, D] bf16 */
  const tilejit_tensor* v_new; /* [T, Hkv, Dv] bf16 */
  const tilejit_tensor* tree_mask;
  bool deterministic;
} tilejit_extend_options;
void tilejit_extend_options_init(tilejit_extend_options* opt);

tilejit_status tilejit_flash_attn_varlen(const tilejit_tensor* q, const tilejit_tensor* k,
                                         const tilejit_tensor* v, const tilejit_tensor* out,
                                         const tilejit_tensor* cu_seqlens_q,
                                         const tilejit_tensor* cu_seqlens_k,
                                         const tilejit_attention_options* opt);
tilejit_status tilejit_decode_attention(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                        const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                        const tilejit_tensor* block_table,
                                        const tilejit_tensor* seq_lens,
                                        const tilejit_attention_options* opt);
typedef struct tilejit_decode_options {
  uint32_t struct_size;
  bool deterministic; /* DecodeOptions::deterministic */
} tilejit_decode_options;
void tilejit_decode_options_init(tilejit_decode_options* opt);
/* tilejit_decode_attention with decode options (dec NULL: the defaults). */
tilejit_status tilejit_decode_attention_ex(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                           const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                           const tilejit_tensor* block_table,
                                           const tilejit_tensor* seq_lens,
                                           const tilejit_attention_options* opt,
                                           const tilejit_decode_options* dec);
tilejit_status tilejit_extend_attention(const tilejit_tensor* q, const tilejit_tensor* k_cache,
                                        const tilejit_tensor* v_cache, const tilejit_tensor* out,
                                        const tilejit_tensor* qo_indptr,
                                        const tilejit_tensor* block_table,
                                        const tilejit_tensor* prefix_lens,
                                        const tilejit_attention_options* opt,
                                        const tilejit_extend_options* ext);
/* scales NULL: 1, 1 (a bf16 cache). */
tilejit_status tilejit_store_kv(const tilejit_tensor* k, const tilejit_tensor* v,
                                const tilejit_tensor* k_cache, const tilejit_tensor* v_cache,
                                const tilejit_tensor* slot_mapping,
                                const tilejit_kv_cache_scales* scales);

/* ---- RoPE (docs/rope.md) ------------------------------------------------ */
typedef enum tilejit_rope_style { TILEJIT_ROPE_NEOX = 0, TILEJIT_ROPE_GPTJ = 1 } tilejit_rope_style;
typedef struct tilejit_rope_options {
  uint32_t struct_size;
  tilejit_rope_style style;
  int64_t rotary_dim;           /* 0: D */
  int32_t ndim;                 /* 1 */
  const int64_t* mrope_section; /* mrope_section_count values, or NULL */
  int32_t mrope_section_count;
  bool mrope_interleaved;
} tilejit_rope_options;
void tilejit_rope_options_init(tilejit_rope_options* opt);

/* k may be NULL (q only). */
tilejit_status tilejit_rope(const tilejit_tensor* q, const tilejit_tensor* k,
                            const tilejit_tensor* positions, const tilejit_tensor* cos_sin_cache,
                            const tilejit_rope_options* opt);

/* ---- Mixture of experts (docs/moe.md) ----------------------------------- */
typedef enum tilejit_expert_proj {
  TILEJIT_EXPERTS_GATE_UP = 0,
  TILEJIT_EXPERTS_DOWN = 1,
  TILEJIT_EXPERTS_UP = 2 /* non-gated up projection [E, I, H] (docs/moe.md) */
} tilejit_expert_proj;
typedef enum tilejit_glu_rows {
  TILEJIT_GLU_HALVES = 0,
  TILEJIT_GLU_INTERLEAVED = 1
} tilejit_glu_rows;

/* Packed experts (tilejit::PackedExperts), freed by tilejit_packed_experts_destroy. */
typedef struct tilejit_packed_experts tilejit_packed_experts;

/* w [E, 2I, H] (gate_up) or [E, H, I] (down), bf16. */
tilejit_status tilejit_pack_experts_bf16(const tilejit_tensor* w, tilejit_expert_proj proj,
                                         tilejit_glu_rows rows, tilejit_packed_experts** out);
/* One checkpoint description per expert: w[0 .. num_experts). */
tilejit_status tilejit_pack_experts_int8(const tilejit_int8_weight* w, int64_t num_experts,
                                         tilejit_expert_proj proj, tilejit_glu_rows rows,
                                         tilejit_packed_experts** out);
tilejit_status tilejit_pack_experts_fp8(const tilejit_fp8_weight* w, int64_t num_experts,
                                        tilejit_expert_proj proj, tilejit_glu_rows rows,
                                        tilejit_packed_experts** out);
tilejit_status tilejit_pack_experts_int4(const tilejit_int4_weight* w, int64_t num_experts,
                                         tilejit_expert_proj proj, tilejit_glu_rows rows,
                                         tilejit_packed_experts** out);
tilejit_status tilejit_pack_experts_mxfp4(const tilejit_mxfp4_weight* w, int64_t num_experts,
                                          tilejit_expert_proj proj, tilejit_glu_rows rows,
                                          tilejit_packed_experts** out);
void tilejit_packed_experts_destroy(tilejit_packed_experts* w);

typedef struct tilejit_packed_experts_info {
  int64_t num_experts, n, k;
  tilejit_expert_proj proj;
  tilejit_weight_format format;
  size_t packed_bytes;
  const char* layout; /* valid while the experts live */
} tilejit_packed_experts_info;
tilejit_status tilejit_packed_experts_get_info(const tilejit_packed_experts* w,
                                               tilejit_packed_experts_info* out);
/* out [E, 2I, H] or [E, H, I], f32 or bf16. */
tilejit_status tilejit_packed_experts_dequantize(const tilejit_packed_experts* w,
                                                 const tilejit_tensor* out);
/* The tensors given to pack_experts, bit for bit: out [E, 2I, H] or
 * [E, H, I] bf16, or one caller-allocated description per expert. */
tilejit_status tilejit_packed_experts_unpack_bf16(const tilejit_packed_experts* w,
                                                  const tilejit_tensor* out);
tilejit_status tilejit_packed_experts_unpack_int8(const tilejit_packed_experts* w,
                                                  const tilejit_int8_weight* out,
                                                  int64_t num_experts);
tilejit_status tilejit_packed_experts_unpack_fp8(const tilejit_packed_experts* w,
                                                 const tilejit_fp8_weight* out,
                                                 int64_t num_experts);
tilejit_status tilejit_packed_experts_unpack_int4(const tilejit_packed_experts* w,
                                                  const tilejit_int4_weight* out,
                                                  int64_t num_experts);
tilejit_status tilejit_packed_experts_unpack_mxfp4(const tilejit_packed_experts* w,
                                                   const tilejit_mxfp4_weight* out,
                                                   int64_t num_experts);

typedef struct tilejit_moe_options {
  uint32_t struct_size;
  tilejit_activation act; /* silu */
  bool clamped_swiglu;
  float swiglu_alpha, swiglu_limit;
  const tilejit_tensor* b13; /* [E, 2I] f32 or bf16 ([E, I]: w13 packed TILEJIT_EXPERTS_UP) */
  const tilejit_tensor* b2;  /* [E, H] f32 or bf16 */
  float routed_scaling_factor;
  const tilejit_packed_experts* shared_w13; /* both or neither */
  const tilejit_packed_experts* shared_w2;
  tilejit_int4_route int4_route;
  tilejit_act_quant act_quant;
  float act_scale13, act_scale2;
  int32_t act_zero_point13, act_zero_point2;
  const tilejit_tensor* shared_weights; /* [T] f32 or bf16: the shared expert's weight per token, or
                                           NULL: 1 */
} tilejit_moe_options;
void tilejit_moe_options_init(tilejit_moe_options* opt);

tilejit_status tilejit_fused_experts(const tilejit_tensor* hidden,
                                     const tilejit_packed_experts* w13,
                                     const tilejit_packed_experts* w2,
                                     const tilejit_tensor* topk_weights,
                                     const tilejit_tensor* topk_ids, const tilejit_tensor* out,
                                     const tilejit_moe_options* opt);

tilejit_status tilejit_topk_softmax(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids, bool renormalize);
tilejit_status tilejit_topk_sigmoid(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids, bool renormalize);

typedef enum tilejit_router_score {
  TILEJIT_ROUTER_SOFTMAX = 0,
  TILEJIT_ROUTER_SIGMOID = 1
} tilejit_router_score;
typedef struct tilejit_grouped_topk_options {
  uint32_t struct_size;
  tilejit_router_score score; /* sigmoid */
  int32_t num_expert_group, topk_group;
  bool renormalize;
  float routed_scaling_factor;
  const tilejit_tensor* correction_bias; /* [E] f32 */
} tilejit_grouped_topk_options;
void tilejit_grouped_topk_options_init(tilejit_grouped_topk_options* opt);
tilejit_status tilejit_grouped_topk(const tilejit_tensor* logits,
                                    const tilejit_tensor* topk_weights,
                                    const tilejit_tensor* topk_ids,
                                    const tilejit_grouped_topk_options* opt);

/* ---- Row-wise layer ops (docs/rowwise.md) ------------------------------- */
typedef struct tilejit_norm_options {
  uint32_t struct_size;
  float eps;            /* 1e-6; finite, >= the smallest positive float */
  bool weight_plus_one; /* Gemma: (1 + w) */
} tilejit_norm_options;
void tilejit_norm_options_init(tilejit_norm_options* opt);
/* weight may be NULL (no weight); out may be x (in place). */
tilejit_status tilejit_rms_norm(const tilejit_tensor* x, const tilejit_tensor* weight,
                                const tilejit_tensor* out, const tilejit_norm_options* opt);
/* residual = x + residual; out = rms_norm(residual). out may be x. */
tilejit_status tilejit_fused_add_rms_norm(const tilejit_tensor* x, const tilejit_tensor* residual,
                                          const tilejit_tensor* weight, const tilejit_tensor* out,
                                          const tilejit_norm_options* opt);
/* out = (v - mean)·rstd·weight + bias; weight and bias may each be NULL. */
tilejit_status tilejit_layer_norm(const tilejit_tensor* x, const tilejit_tensor* weight,
                                  const tilejit_tensor* bias, const tilejit_tensor* out,
                                  const tilejit_norm_options* opt);
/* residual = x + residual; out = layer_norm(residual). out may be x. */
tilejit_status tilejit_fused_add_layer_norm(const tilejit_tensor* x, const tilejit_tensor* residual,
                                            const tilejit_tensor* weight,
                                            const tilejit_tensor* bias, const tilejit_tensor* out,
                                            const tilejit_norm_options* opt);
typedef struct tilejit_gated_norm_options {
  uint32_t struct_size;
  tilejit_norm_options norm;
  tilejit_activation act; /* silu */
  bool norm_before_gate;  /* true: rms_norm(x)·w·act(gate); false: rms_norm(x·act(gate))·w */
} tilejit_gated_norm_options;
void tilejit_gated_norm_options_init(tilejit_gated_norm_options* opt);
tilejit_status tilejit_rms_norm_gated(const tilejit_tensor* x, const tilejit_tensor* gate,
                                      const tilejit_tensor* weight, const tilejit_tensor* out,
                                      const tilejit_gated_norm_options* opt);

typedef struct tilejit_glu_options {
  uint32_t struct_size;
  tilejit_activation act; /* silu */
  bool clamped_swiglu;
  float swiglu_alpha, swiglu_limit; /* 1.702, 7 */
  tilejit_glu_rows rows;            /* halves */
} tilejit_glu_options;
void tilejit_glu_options_init(tilejit_glu_options* opt);
/* out [..., d] = act(gate)·up of x [..., 2d]. */
tilejit_status tilejit_act_and_mul(const tilejit_tensor* x, const tilejit_tensor* out,
                                   const tilejit_glu_options* opt);

/* ---- The process ---------------------------------------------------------- */
/* The values of tilejit::Isa. */
typedef enum tilejit_isa {
  TILEJIT_ISA_SCALAR = 0,
  TILEJIT_ISA_LLVM = 1,
  TILEJIT_ISA_AVX512 = 2,
  TILEJIT_ISA_AMX = 3
} tilejit_isa;

typedef struct tilejit_cpu_info {
  char vendor[16]; /* "GenuineIntel", "AuthenticAMD" (NUL-terminated) */
  bool avx512f, avx512bw, avx512vl, avx512_bf16, avx512_fp16;
  bool amx_tile, amx_bf16, amx_int8, amx_permitted, amx_emulated;
  bool avx2, fma, llvm_backend;
  tilejit_isa max_isa; /* the best path the CPU and OS allow */
  tilejit_isa isa;     /* the active path */
  int32_t num_threads;
} tilejit_cpu_info;
tilejit_status tilejit_get_cpu_info(tilejit_cpu_info* out);

typedef struct tilejit_cache_stats {
  uint64_t hits, misses, compiles;
  double compile_seconds;
  uint64_t kernels, disk_loads, disk_stores, tuned_plans;
} tilejit_cache_stats;
tilejit_status tilejit_get_cache_stats(tilejit_cache_stats* out);
/* Every counter of the C++ CacheStats but disk_dir, in a struct that can
 * grow: set struct_size = sizeof(tilejit_cache_stats_ex) first (fields are
 * only ever appended; a size of this header's or an earlier one's is
 * filled up to it, any other is an error naming struct_size). */
typedef struct tilejit_cache_stats_ex {
  uint32_t struct_size;
  uint64_t hits, misses, compiles;
  double compile_seconds;
  uint64_t kernels, disk_loads, disk_stores, tuned_plans;
  uint64_t disk_evictions; /* entries removed to stay under TILEJIT_CACHE_MAX_SIZE */
} tilejit_cache_stats_ex;
tilejit_status tilejit_get_cache_stats_ex(tilejit_cache_stats_ex* out);

tilejit_status tilejit_load_tuning_db(const char* path);
/* Threads used by operator calls (default: TILEJIT_NUM_THREADS, else the
 * CPUs the process may run on (README); a bad TILEJIT_NUM_THREADS is an error
 * of the first call that reads it). */
tilejit_status tilejit_set_num_threads(int32_t n);
tilejit_status tilejit_get_num_threads(int32_t* out);
/* Batch-invariant mode (tilejit::set_batch_invariant; default
 * TILEJIT_BATCH_INVARIANT): a row's or sequence's output independent of
 * the rest of the call and of the thread count (docs/reliability.md). */
tilejit_status tilejit_set_batch_invariant(bool on);
tilejit_status tilejit_get_batch_invariant(bool* out);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TILEJIT_TILEJIT_C_H */
