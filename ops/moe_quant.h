// One projection (gate_up with its act-and-mul, or down) of one expert, run
// by fused_experts' tasks on whatever format the experts were packed in:
//   bf16:    the bf16 brgemm kernels on the packed block;
//   fused:   fp8 / int4 at <= ops::fused_max_rows(path) rows: the
//            fused decode kernel (exact weights, codegen/xbyak/quant_brgemm.cpp,
//            the LLVM brgemm's quantized mode), one call per block and group
//            of <= kFusedMaxMr rows;
//   dequant: fp8 / int4 otherwise: per K chunk the dequant kernel fills a bf16
//            chunk that the bf16 kernels run on (as ops/gemm_quant.cpp does);
//   int8:    u8 rows (quantized by the caller with quantize_rows) × the i8
//            block on the int8 kernels, with the scaled epilogue;
//   w4a8:    int4 experts by MoeOptions::int4_route (w4a8_route, the rows
//            as M): u8 rows in the weight's quad K order (W4A8Kernels), one
//            int8 call per K chunk folding each scale group, the GLU in the
//            last one.
// A's rows must be in the weight's packed K order (gather_row), a_cols wide.
#pragma once

#include <cstdint>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/quant_desc.h"
#include "jit/kernel.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/packed_experts_impl.h"
#include "ops/packed_weight_impl.h"
#include "ops/quant_weight.h"

namespace tilejit::ops {

class ExpertGemm {
 public:
  enum class Route { bf16, fused, dequant, int8, w4a8 };

  // Expert e of w for a run of `rows` rows; spec: n (outputs), k, bias, out,
  // act or GLU as for bf16 experts (k is replaced by the weight's own).
  // tuned (fused_experts' moe tuning entry, docs/tuning.md): w4a8, this
  // expert's int4 route under int4_route automatic; prefetch_kib, the
  // distance of its Xbyak AVX-512 kernels (the plan's or the fused decode
  // kernel's; ignored where none runs).
  ExpertGemm() = default;
  // x_has_inf: the call's inputs hold an ±Inf (int4 then avoids the fused
  // kernel and, under int4_route automatic, W4A8: ops::fused_keeps_infinities,
  // ops::w4a8_keeps_infinities).
  ExpertGemm(const PackedExperts::Impl& w, int64_t e, const codegen::GemmSpec& spec, int64_t rows,
             Isa isa, Int4Route int4_route, const codegen::PlanOverrides& tuned = {},
             bool x_has_inf = false);

  Route route() const { return route_; }
  // Rows per task (a multiple of the kernels' row block).
  int64_t task_rows() const;
  // The A layout the tasks read: row-major (a_cols elements of A's type per
  // row), or the PackedA tile copy when a_packed().
  bool a_packed() const { return exe_ != nullptr && exe_->plan().a_packed; }
  codegen::PackedA packed_a() const { return exe_->plan().packed_a(); }
  // A's columns: K (bf16), k_packed (fp8 / int4: act-order order with
  // padding), K rounded up to 4 (int8, u8 bytes) or the quad K (W4A8).
  int64_t a_cols() const { return a_cols_; }
  // A is u8 rows quantized per row (int8 and W4A8).
  bool int8() const { return route_ == Route::int8 || route_ == Route::w4a8; }
  // W4A8: its kernels (the quad order A's rows must be gathered into unless
  // identity()), else null.
  const W4A8Kernels* w4a8() const { return route_ == Route::w4a8 ? &w4a8_ : nullptr; }
  // fp8 / int4 act-order: A column j holds input channel perm[j] (−1: zero).
  const std::vector<int32_t>* perm() const;

  // Runs job (a, lda, rows, c, ldc, bias, n_tail and, for int8, a_scale /
  // a_zero of the job's rows set by the caller) on column block `block`.
  void run(RowBlockJob job, int64_t block) const;

 private:
  Route route_ = Route::bf16;
  const PackedExperts::Impl* w_ = nullptr;
  const PackedWeight::Impl* q_ = nullptr;  // quantized experts
  int64_t e_ = 0;
  int64_t a_cols_ = 0;
  GemmExecutable* exe_ = nullptr;
  FusedKernels fused_;
  W4A8Kernels w4a8_;
  codegen::DequantFn dequant_ = nullptr;
};

// How one projection's input rows are quantized: MoeOptions::act_quant and,
// for ActQuant::fixed, that projection's scale and zero point (checked
// before: finite > 0, [0, 255]).
struct RowQuant {
  ActQuant mode = ActQuant::dynamic_sym;
  float scale = 0;
  int32_t zero = 128;
};
// w13's input (down = false) or w2's (down = true).
RowQuant row_quant(const MoeOptions& opt, bool down);

// int8 experts: quantizes `rows` bf16 rows (k columns, ldx elements apart)
// to u8 rows of ldq bytes with per-row scale and zero point (the act_quant
// kernel gemm's W8A8 uses, in rq's mode), on the calling thread.
void quantize_rows(const RowQuant& rq, Isa isa, const uint16_t* x, int64_t ldx, int64_t rows,
                   int64_t k, uint8_t* q, int64_t ldq, float* scale, int32_t* zero);

}  // namespace tilejit::ops
