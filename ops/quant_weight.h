// What the quantized GEMM driver and the tool need from a quantized
// PackedWeight besides its Impl (ops/packed_weight_impl.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/gemm_plan.h"
#include "codegen/quant_desc.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/packed_weight_impl.h"
#include "runtime/reference_quant.h"

namespace tilejit::ops {

// int8 W8A8: the int32 sums Σ (a − zp)·w of u8 x s8 codes stay exact while
// 255·128·K < 2^31, i.e. K <= 65793; the limit is the power of two below.
inline constexpr int64_t kInt8MaxK = 65536;

// pack_weight of each format with logical row n placed at packed column
// row_of[n] (QuantTables::row_of; empty: the identity).
PackedWeight pack_int8(const Int8Weight& w, std::vector<int64_t> row_of);
PackedWeight pack_fp8(const Fp8Weight& w, std::vector<int64_t> row_of);
PackedWeight pack_int4(const Int4Weight& w, std::vector<int64_t> row_of);
PackedWeight pack_mxfp4(const Mxfp4Weight& w, std::vector<int64_t> row_of);  // ops/pack_mxfp4.cpp

// An Error unless group_size is >= 1 or -1 (per channel): Int4Weight's and
// AutoRoundConfig's group_size.
void check_int4_group_size(const char* op, int64_t group_size);

// The logical weight w[n, k] of any format, in double, from the checkpoint's
// own scale / zero tensors (kept verbatim) and the packed codes: the oracle
// of dequantize() and of the scalar path.
double weight_value(const PackedWeight::Impl& p, int64_t n, int64_t k);

// One int4 (AWQ / GPTQ) weight as its checkpoint holds it: w[n, k] =
// (code − zero) · scale, of scale group `group` (8 when there are no zeros).
struct Int4Term {
  int code = 0, zero = 8;
  int64_t group = 0;
  double scale = 0;
};
Int4Term int4_term(const PackedWeight::Impl& p, int64_t n, int64_t k);

// The layout tag of a packed weight, from its format and parameters.
std::string quant_layout_name(const PackedWeight::Impl& p);

// The layout tag's fixed part per format ("bf16_vnni2_n64k32",
// "u4_awq_vnni2_n64k32", ...) and whether a weight's tag has it: what gemm
// checks before reading the bytes.
const char* layout_tag_prefix(WeightFormat f);
bool layout_tag_ok(const PackedWeight::Impl& p);

// Whether an fp8 / int4 GEMM of m rows on `path` runs the fused decode
// micro-kernel (codegen/xbyak/quant_brgemm.cpp on amx / avx512, the LLVM
// brgemm's quantized mode on llvm: exact weights, per-group fp32 sums)
// instead of dequantizing to bf16 chunks for the bf16 kernels.
// Both fused kernels take up to kFusedMaxMr rows a call (registry.cpp,
// kQuantLimits); on the llvm and avx512 paths a GEMM of up to kFusedMaxRows
// rows calls them once per group of <= kFusedMaxMr rows (FusedKernels; a
// column block's later groups reread its codes from L2): up to there they
// beat the dequant route's bf16 kernels (docs/quantized.md: on Zen 5 1.2-1.6x
// at 5-8 rows, 1.1-1.2x at 12, a tie at 16; the llvm path's likewise on an
// AVX2 Zen 3). On amx one call of <= kFusedMaxMr
// rows: the AMX bf16 kernels take over above (not measured against the
// groups: no AMX host since).
inline constexpr int64_t kFusedMaxMr = codegen::BrgemmDesc::kQuantMaxMr;
inline constexpr int64_t kFusedMaxRows = 16;
// The most rows a GEMM on `path` runs through the fused kernel (0: none, e.g.
// amx / avx512 without AVX512-VBMI, or scalar): the rule quant_gemm_fused
// applies and the tool's texts print.
int64_t fused_max_rows(Isa path);
// Batch-invariant mode (runtime::batch_invariant) gives no route by M: an
// fp8 / int4 W4A16 / MXFP4 GEMM then takes one route at every m — the fused
// kernel where the path has one (llvm; avx512 with AVX512-VBMI), with one
// accumulator chain and one arithmetic for every mr (BrgemmDesc::one_chain),
// in chunks of kFusedMaxRows rows; else (amx, whose AMX bf16 kernels prefill
// ~10x faster; avx512 without VBMI) the dequant route (the bf16 kernels with
// one chain, K chunked alike: GemmSpec::invariant) — and int4_route automatic
// W4A16: quant_gemm_fused is that rule, w4a8_automatic false, a tuning
// entry's route is not taken.
bool quant_routes_follow_rows();
bool quant_gemm_fused(Isa path, int64_t m);
// The ISA a quantized GEMM of m rows runs on `path` (gemm_isa_for_rows: the
// AVX-512 kernels for very few rows on amx, except in batch-invariant mode).
Isa quant_rows_isa(Isa path, int64_t m);
// The same for a GEMM with weight p (fp8, int4 or MXFP4; int8 never).
bool quant_gemm_fused(const PackedWeight::Impl& p, Isa path, int64_t m);

// Whether any of `rows` bf16 rows of k elements (row stride ld) is ±Inf.
bool bf16_rows_have_inf(const uint16_t* x, int64_t ld, int64_t rows, int64_t k);
// Whether the fused kernel gives the IEEE ±Inf / NaN outputs for inputs with
// (or without) an ±Inf: its int4 form sums (16 + q)·a and a apart and takes
// (16 + z)·s·Σa off per group, so an Inf activation made Inf − Inf = NaN in
// every column where the exact (q − z)·s·Inf is ±Inf. int4 inputs with an
// Inf take the dequant route (fp8 and MXFP4 scale each weight: exact already).
// Callers scan x only for int4 weights (the scan is on the decode path).
inline bool fused_int4_form(WeightFormat f) {
  return f == WeightFormat::int4_awq || f == WeightFormat::int4_gptq;
}
inline bool fused_keeps_infinities(WeightFormat f, bool x_has_inf) {
  return !x_has_inf || !fused_int4_form(f);
}
// Whether int4_route automatic may take W4A8 for inputs with (or without) an
// ±Inf: W4A8 quantizes a row holding an Inf to a NaN scale (the W8A8 rule),
// while W4A16 gives each column its IEEE ±Inf or NaN, so the automatic choice
// keeps such inputs on W4A16 and the NaN set does not depend on the path or M
// (docs/reliability.md). A requested int4_route=w4a8 keeps W8A8's rule.
inline bool w4a8_keeps_infinities(Int4Route route, bool x_has_inf) {
  return !x_has_inf || route != Int4Route::automatic;
}

// The deepest K chunk of a quantized GEMM of m rows: fp8 / int4 at m <= 16
// dequantize 256-deep chunks (32 KiB of bf16: L1-resident), the rest keep
// GemmSpec's default, as every m does in batch-invariant mode (`invariant`:
// the chunks' partial sums must fall alike). (Also what `tilejit dump` plans
// with.)
int64_t quant_gemm_max_kc(bool int8, int64_t m, bool invariant);

// The plan spec the driver uses for a quantized weight and m rows: int8 has
// K rounded up to the VNNI group of 4 and b_type i8; fp8 / int4 plan the bf16
// kernels over the packed K order (k_packed); invariant: the process's
// batch-invariant mode.
codegen::GemmSpec quant_gemm_spec(const PackedWeight::Impl& p, codegen::BiasKind bias,
                                  Activation act, DType out, int64_t m);

// The same for a spec of the caller's (n, bias, epilogue, GLU: fused_experts'
// projections): K and b_type of the weight's plan, its K chunk for m rows
// (by spec.invariant).
codegen::GemmSpec quant_gemm_spec(const PackedWeight::Impl& p, codegen::GemmSpec spec, int64_t m);

// The fused decode kernel for m rows on `path` (llvm: the LLVM row, else the
// avx512 one): mr = min(m, kFusedMaxMr) rows a call, a full 64-column block
// (nr 64, or 32 outputs with the spec's GLU) and the spec's epilogue; the N
// tail sets nr. tuned: a tuning entry's prefetch distance
// (BrgemmDesc::prefetch_kib) and int4 arithmetic (u4_dot: BrgemmDesc::u4_bf16_dot,
// else the CPU's default, runtime::bf16_dot_at_fma_rate).
codegen::BrgemmDesc quant_fused_desc(const PackedWeight::Impl& p, const codegen::GemmSpec& spec,
                                     int64_t m, Isa path, const codegen::PlanOverrides& tuned = {});
// The same from the weight's code type (f8e4m3, u4 or f4e2m1), whether it
// has zero points and its packed K (QuantTables::k_packed): what
// `tilejit dump` shows for a program's quantized gemm at m <= 4.
codegen::BrgemmDesc quant_fused_desc(DType code, bool zeros, int64_t k_packed,
                                     const codegen::GemmSpec& spec, int64_t m, Isa path,
                                     const codegen::PlanOverrides& tuned = {});
// Every fused decode kernel a GEMM of `rows` rows calls, [g][t]: g 0 the
// groups of mr rows, g 1 the remainder group; t 0 the full 64-column block,
// t 1 the N tail; nullopt where none is called (FusedKernels compiles these;
// `tilejit dump` lists them).
using FusedDescs = std::array<std::array<std::optional<codegen::BrgemmDesc>, 2>, 2>;
FusedDescs quant_fused_descs(DType code, bool zeros, int64_t k_packed,
                             const codegen::GemmSpec& spec, int64_t rows, Isa path,
                             const codegen::PlanOverrides& tuned = {});
// The per-thread scratch bytes a fused decode kernel's call needs (BrgemmArgs::q_scratch).
int64_t quant_fused_scratch_bytes(const codegen::BrgemmDesc& d);

// The fused decode kernels one GEMM (or one expert projection) of `rows` rows
// runs: calls of mr = min(rows, kFusedMaxMr) rows, then one of rows % mr,
// each for the full block (nr of quant_fused_desc) and the N tail.
class FusedKernels {
 public:
  FusedKernels() = default;
  FusedKernels(const PackedWeight::Impl& p, const codegen::GemmSpec& spec, int64_t rows, Isa path,
               const codegen::PlanOverrides& tuned = {});
  int64_t mr() const { return mr_; }
  const std::string& name() const;  // of the first kernel (for logs)
  // Column block `block` (the N tail when n_tail) for `rows` rows: A row 0
  // at a (lda bytes apart, the packed K order), C row 0 at c (ldc bytes
  // apart, the block's first column), the block's bias or null.
  void run(const PackedWeight::Impl& p, int64_t block, bool n_tail, const uint8_t* a, int64_t lda,
           int64_t rows, uint8_t* c, int64_t ldc, const void* bias) const;

 private:
  const jit::Kernel* k_[2][2] = {};  // [mr rows, the remainder][full block, N tail]
  int64_t mr_ = 0, scratch_ = 0;
};

// The dequant kernel of an fp8 / int4 / MXFP4 weight on `path` (avx512 serves amx).
codegen::DequantDesc quant_dequant_desc(const PackedWeight::Impl& p, Isa path);

// The tuning database entry of a quantized GEMM of this format, [N, K]
// (logical), epilogue and m rows on `path` (the int4 route, and for W8A8 and
// the dequant route the plan's row blocking, task split and ISA), or none:
// what gemm applies and `tilejit dump` shows.
const codegen::PlanOverrides& quant_tuned(WeightFormat format, int64_t n, int64_t k,
                                          codegen::BiasKind bias, Activation act, DType out,
                                          Isa path, int64_t m);

// What a quantized GEMM of m rows runs on `path`: the fused decode kernel's
// name, or the plan's (for the tool's tables).
std::string quant_gemm_kernel_name(const PackedWeight::Impl& p, codegen::BiasKind bias,
                                   Activation act, DType out, Isa path, int64_t m);

// One column block of an fp8 / int4 / mxfp4 weight on the dequant route:
// per K chunk of exe's plan the dequant kernel fills a bf16 chunk (this
// thread's kQuantB scratch) that run_row_block runs `job` on (partial sums
// in this thread's kQuantPartial scratch). gemm's and fused_experts' tasks.
void run_dequant_block(const PackedWeight::Impl& p, const GemmExecutable& exe,
                       codegen::DequantFn dequant, RowBlockJob job, int64_t block);

// The fused decode kernel's tables for column block `block` (and its
// per-thread scratch of scratch_bytes, or none).
void set_fused_tables(const PackedWeight::Impl& p, int64_t block, int64_t scratch_bytes,
                      codegen::BrgemmArgs& args);

// ---- int8 activations (W8A8, W4A8) ----------------------------------------------

// The act_quant rules of every operator that takes them (gemm, fused_experts),
// one home: q one of ActQuant's values; ActQuant::fixed's scale finite > 0
// and zero point in [0, 255] (per projection: the names say which). Errors
// name op and the field. Checked whenever given, also where the weights'
// format ignores them (a bad value is the caller's bug either way).
void check_act_quant(const char* op, ActQuant q);
void check_fixed_act_quant(const char* op, const char* scale_name, float scale,
                           const char* zero_name, int zero);
// opt.act_quant as the act_quant kernel's mode (Error for a value outside the enum).
codegen::ActQuantMode act_quant_mode(ActQuant q);
// ActQuant::fixed's 1 / s rounded to f32 (s checked > 0 and finite before);
// 1 otherwise: what the act_quant kernel multiplies by.
float fixed_inv_scale(ActQuant mode, float scale);
float fixed_inv_scale(const GemmOptions& opt);
// The scalar reference's name for the same rule.
runtime::ActQuantRule act_quant_rule(codegen::ActQuantMode m);
// Rows [0, rows) of bf16 x (k elements, ldx elements between rows) quantized
// by the act_quant kernel of `isa` per opt: u8 rows of ldq bytes (zero bytes
// from k to ldq), one scale and zero point per row. Splits over the pool.
void quantize_rows(const uint16_t* x, int64_t ldx, int64_t rows, int64_t k, int64_t ldq,
                   const GemmOptions& opt, Isa isa, uint8_t* q, float* scale, int32_t* zero);

// ---- W4A8 (ops/gemm_w4a8.cpp) ------------------------------------------------------

// From this many rows the automatic route may run int4 GEMMs as W4A8
// (docs/quantized.md: where it beat W4A16 on an AVX2 host).
inline constexpr int64_t kW4A8MinRows = 4;
// On avx512, from this many rows W4A8 beats the Xbyak fused kernel's row
// groups (docs/quantized.md, Zen 5: the fused kernel 1.1-1.3x ahead at 5-8
// rows, W4A8 from 9-10).
inline constexpr int64_t kW4A8MinRowsOverXbyakFused = 9;
// The automatic route's rule for m rows on `path` (the rows' path,
// gemm_isa_for_rows): llvm from kW4A8MinRows rows, avx512 from
// kW4A8MinRowsOverXbyakFused where the Xbyak fused kernel runs (from
// kW4A8MinRows where it cannot: no AVX512-VBMI), never amx or scalar, and
// only where its kernels are usable (w4a8_kernels_usable).
bool w4a8_automatic(Isa path, int64_t m);
// Whether a GEMM of m rows with weight p runs W4A8 when `path` (the rows'
// path, gemm_isa_for_rows) is active: int4 AWQ / GPTQ weights only, by
// opt.int4_route (automatic: w4a8_automatic).
// K above kW4A8MaxK: the automatic route keeps W4A16, a requested W4A8 is
// an Error (a group's int32 sums, up to 255·16·K, must not overflow).
inline constexpr int64_t kW4A8MaxK = int64_t{1} << 19;
bool w4a8_route(const PackedWeight::Impl& p, const GemmOptions& opt, Isa path, int64_t m);
// What gemm runs: the same, but under int4_route automatic a tuning
// database entry's choice (tuned.w4a8, docs/tuning.md) where it has one and
// W4A8 can run here (K, the LLVM kernels).
bool w4a8_route(const PackedWeight::Impl& p, const GemmOptions& opt, Isa path, int64_t m,
                const codegen::PlanOverrides& tuned);
// The same from the weight's format and logical K.
bool w4a8_route(WeightFormat format, int64_t k, const GemmOptions& opt, Isa path, int64_t m);
// The one rule, for any operator (`op` names it in the Errors): fused_experts'
// int4 experts choose per expert by the rows routed to it.
bool w4a8_route(WeightFormat format, int64_t k, Int4Route route, Isa path, int64_t m,
                const char* op);
// The same with a tuning database entry's choice (tuned.w4a8) applied under
// route automatic where W4A8 can run here (K, the LLVM kernels): gemm's
// entries, and fused_experts' per expert (its moe entry's w4a8_rows).
bool w4a8_route(WeightFormat format, int64_t k, Int4Route route, Isa path, int64_t m,
                const char* op, const codegen::PlanOverrides& tuned);
// An Error naming `op` unless route is one of Int4Route's values.
void check_int4_route(Int4Route route, const char* op);
// y = act(Σ_g s_g · s_x · Σ_{k in g} (x_q − z_x)(q − z) + bias): x quantized
// per row by opt.act_quant, exact int32 sums per scale group folded in f32.
// The JIT kernels (run_w4a8) and the oracle in double (run_scalar_w4a8).
// The kernels are those of `path` (the rows' path, gemm_isa_for_rows): the
// Xbyak AMX ones (tdpbusd tiles) on amx, the Xbyak AVX-512 ones on avx512,
// the LLVM ones on llvm. Whether they can run on `path` here (llvm: a build
// with LLVM, not TILEJIT_BACKEND=xbyak; scalar: never):
bool w4a8_kernels_usable(Isa path);
// The main-block kernel of a W4A8 GEMM with weight p and this epilogue on `path`.
std::string w4a8_kernel_name(const PackedWeight::Impl& p, codegen::BiasKind bias, Activation act,
                             DType out, Isa path);

struct W4A8Order;  // the quad K order of one weight (ops/gemm_w4a8.cpp)

// The W4A8 kernels one GEMM or one expert projection runs with int4 weight
// p: the quad K order its u8 rows must be in, the int8 plan's row blocking,
// and per column block the dequant (out = i8) chunks and one brgemm call per
// scale group, the last with spec's epilogue (bias, act or GLU, out; n is
// the outputs: with a GLU, 32 per 64-column block).
class W4A8Kernels {
 public:
  W4A8Kernels() = default;
  // rows: the call's rows (its remainder by mr gets its kernels up front);
  // compile = false: names and layout only (the tool's tables), no kernel.
  W4A8Kernels(const PackedWeight::Impl& p, const codegen::GemmSpec& spec, int64_t rows, Isa path,
              bool compile = true);
  Isa isa() const { return isa_; }  // the kernels' (the path's)
  // x's K in the quad order (a multiple of 16), and the u8 rows' stride.
  int64_t k_quad() const;
  int64_t ldq() const { return (k_quad() + 63) / 64 * 64; }
  // The quad order is x's own K order: x quantizes as it is.
  bool identity() const;
  // One bf16 row of x (logical K order) in the quad order: k_quad() elements,
  // padding exactly 0.
  void gather_row(const PackedWeight::Impl& p, const uint16_t* x, uint16_t* dst) const;
  int mr() const { return mr_; }
  int64_t task_rows() const { return task_rows_; }
  std::string name() const;  // the main block's last-group kernel
  // Column block `block` (the N tail when n_tail) for `rows` rows of u8 A
  // (quad order, lda bytes apart, per-row a_scale / a_zero), C row 0 at c
  // (ldc bytes apart, the block's first output), the block's bias or null.
  void run(const PackedWeight::Impl& p, int64_t block, bool n_tail, const uint8_t* a, int64_t lda,
           const float* a_scale, const int32_t* a_zero, int64_t rows, uint8_t* c, int64_t ldc,
           const void* bias) const;

 private:
  codegen::BrgemmDesc desc(int role, int rows, bool n_tail) const;
  codegen::BrgemmFn kernel(int role, int rows, bool n_tail) const;
  std::shared_ptr<const W4A8Order> o_;
  codegen::GemmSpec spec_;
  Isa isa_ = Isa::avx512;
  codegen::DequantFn dequant_ = nullptr;
  int mr_ = 0, rem_ = 0;
  int64_t task_rows_ = 0;
  const jit::Kernel* k_[4][2][2] = {};  // [role][mr rows, the remainder][full block, N tail]
};
void run_w4a8(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
              const GemmOptions& opt, Isa path);
void run_scalar_w4a8(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                     const GemmOptions& opt);

// gemm() for fp8, int4 and int8 weights (arguments already checked).
void gemm_quantized(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                    const GemmOptions& opt);

}  // namespace tilejit::ops
