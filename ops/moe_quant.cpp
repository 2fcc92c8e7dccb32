// ExpertGemm: one expert projection on the experts' format (ops/moe_quant.h).
#include "ops/moe_quant.h"

#include <fmt/format.h>

#include <algorithm>

#include "codegen/quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "ops/quant_weight.h"

namespace tilejit::ops {

namespace {
constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;
}  // namespace

ExpertGemm::ExpertGemm(const PackedExperts::Impl& w, int64_t e, const codegen::GemmSpec& spec,
                       int64_t rows, Isa isa, Int4Route int4_route,
                       const codegen::PlanOverrides& tuned, bool x_has_inf)
    : w_(&w), e_(e) {
  // AMX or AVX-512 by the GEMM's own rule for `rows` (very few rows: AVX-512).
  const Isa plan_isa = codegen::gemm_isa_for_rows(isa, rows, {}, spec.invariant);
  // The tuned prefetch distance is the Xbyak AVX-512 kernels' (plan_gemm
  // accepts it on an avx512 plan only; the fused kernel is Xbyak's off llvm).
  codegen::PlanOverrides plan_tuned;
  if (tuned.prefetch_kib && plan_isa == Isa::avx512) {
    plan_tuned.prefetch_kib = tuned.prefetch_kib;
    plan_tuned.entry = tuned.entry;
  }
  codegen::PlanOverrides fused_tuned;
  if (tuned.prefetch_kib && isa != Isa::llvm) fused_tuned.prefetch_kib = tuned.prefetch_kib;
  if (w.quant.empty()) {
    exe_ = &gemm_executable(spec, plan_isa, plan_tuned);
    a_cols_ = spec.k;
    return;
  }
  q_ = &w.q(e);
  const codegen::GemmSpec qs = quant_gemm_spec(*q_, spec, rows);
  a_cols_ = qs.k;
  if (q_->format == WeightFormat::int8) {
    route_ = Route::int8;
    exe_ = &gemm_executable(qs, plan_isa, plan_tuned);
    return;
  }
  if (w4a8_route(q_->format, q_->layout.k, int4_route, plan_isa, rows, "fused_experts", tuned) &&
      w4a8_keeps_infinities(int4_route, x_has_inf)) {
    if (!w4a8_kernels_usable(plan_isa))
      throw InternalError("fused_experts: the W4A8 route without its kernels");
    route_ = Route::w4a8;
    w4a8_ = W4A8Kernels(*q_, spec, rows, plan_isa);
    a_cols_ = w4a8_.k_quad();
    return;
  }
  if (quant_gemm_fused(*q_, isa, rows) && fused_keeps_infinities(q_->format, x_has_inf)) {
    route_ = Route::fused;
    fused_ = FusedKernels(*q_, spec, rows, isa, fused_tuned);
    return;
  }
  route_ = Route::dequant;
  exe_ = &gemm_executable(qs, plan_isa, plan_tuned);
  dequant_ = jit::get(quant_dequant_desc(*q_, isa)).entry<codegen::DequantFn>();
}

int64_t ExpertGemm::task_rows() const {
  // The fused kernel's route: one task takes all of the expert's rows (at
  // most kFusedMaxRows), which FusedKernels::run calls in groups of <=
  // kFusedMaxMr per column block, so the block's codes are reread from L2
  // (as tilejit::gemm's decode does) rather than streamed again by another
  // task. DeepSeek-like block-fp8 experts at T = 16 (moe_bench, E 32, 4-8
  // rows an expert, 2 threads, 5 alternating runs): 48.7 against 54.5 ms
  // with tasks of 4 rows (medians; the runs moved 42-65 ms).
  if (route_ == Route::fused) return kFusedMaxRows;
  if (route_ == Route::w4a8) return w4a8_.task_rows();
  return exe_->plan().task_rows();
}

const std::vector<int32_t>* ExpertGemm::perm() const {
  if (q_ == nullptr || q_->format == WeightFormat::int8 || route_ == Route::w4a8 ||
      q_->quant->perm.empty())
    return nullptr;
  return &q_->quant->perm;
}

void ExpertGemm::run(RowBlockJob job, int64_t block) const {
  switch (route_) {
    case Route::bf16:
      job.b_block = w_->expert(e_) + block * w_->block_bytes();
      run_row_block(*exe_, job);
      return;
    case Route::int8: {
      const QuantTables& q = *q_->quant;
      job.b_block = q_->bytes() + block * q_->int8.block_bytes();
      job.b_scale = reinterpret_cast<const float*>(q.col_scale.get()) + block * kBlockN;
      job.b_comp = reinterpret_cast<const int32_t*>(q.col_comp.get()) + block * kBlockN;
      run_row_block(*exe_, job);
      return;
    }
    case Route::fused:
      fused_.run(*q_, block, job.n_tail, job.a, job.lda, job.rows, job.c, job.ldc, job.bias);
      return;
    case Route::dequant:
      run_dequant_block(*q_, *exe_, dequant_, job, block);
      return;
    case Route::w4a8:
      w4a8_.run(*q_, block, job.n_tail, job.a, job.lda, job.a_scale, job.a_zero, job.rows, job.c,
                job.ldc, job.bias);
      return;
  }
}

RowQuant row_quant(const MoeOptions& opt, bool down) {
  RowQuant rq;
  rq.mode = opt.act_quant;
  if (opt.act_quant == ActQuant::fixed) {
    rq.scale = down ? opt.act_scale2 : opt.act_scale13;
    rq.zero = down ? opt.act_zero_point2 : opt.act_zero_point13;
  }
  return rq;
}

void quantize_rows(const RowQuant& rq, Isa isa, const uint16_t* x, int64_t ldx, int64_t rows,
                   int64_t k, uint8_t* q, int64_t ldq, float* scale, int32_t* zero) {
  const codegen::ActQuantDesc qd{isa == Isa::llvm ? Isa::llvm : Isa::avx512,
                                 act_quant_mode(rq.mode)};
  codegen::ActQuantArgs a{};
  a.x = x;
  a.ldx = ldx;
  a.rows = rows;
  a.k = k;
  a.k_padded = ldq;
  a.out = q;
  a.ld_out = ldq;
  a.scale = scale;
  a.zero = zero;
  // fixed: the kernel multiplies by 1/s rounded to f32; the scalar oracle
  // uses the same (fixed_inv_scale).
  a.inv_scale = fixed_inv_scale(rq.mode, rq.scale);
  a.fixed_scale = rq.scale;
  a.fixed_zero = rq.zero;
  jit::get(qd).entry<codegen::ActQuantFn>()(&a);
}

}  // namespace tilejit::ops
