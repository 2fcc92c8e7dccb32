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
                       int64_t rows, Isa isa)
    : w_(&w), e_(e) {
  // AMX or AVX-512 by the GEMM's own rule for `rows` (very few rows: AVX-512).
  const Isa plan_isa = codegen::gemm_isa_for_rows(isa, rows);
  if (w.quant.empty()) {
    exe_ = &gemm_executable(spec, plan_isa);
    a_cols_ = spec.k;
    return;
  }
  q_ = &w.q(e);
  const codegen::GemmSpec qs = quant_gemm_spec(*q_, spec, rows);
  a_cols_ = qs.k;
  if (q_->format == WeightFormat::int8) {
    route_ = Route::int8;
    exe_ = &gemm_executable(qs, plan_isa);
    return;
  }
  if (quant_gemm_fused(*q_, isa, rows)) {
    route_ = Route::fused;
    // Row groups of mr = min(rows, kFusedMaxMr) rows, then one of rows % mr.
    const codegen::BrgemmDesc d = quant_fused_desc(*q_, spec, rows, isa);
    fused_mr_ = d.mr;
    const int64_t rem = rows > d.mr ? rows % d.mr : 0;
    for (int g = 0; g < 2; ++g) {
      if (g == 1 && rem == 0) continue;
      const codegen::BrgemmDesc dg = g == 0 ? d : quant_fused_desc(*q_, spec, rem, isa);
      codegen::BrgemmDesc tail = dg;
      tail.nr = static_cast<int>(spec.n % dg.nr);
      if (spec.n >= dg.nr) fused_[g][0] = &jit::get(dg);
      if (tail.nr != 0) fused_[g][1] = &jit::get(tail);
      fused_scratch_ = std::max({fused_scratch_, quant_fused_scratch_bytes(dg),
                                 tail.nr != 0 ? quant_fused_scratch_bytes(tail) : int64_t{0}});
    }
    return;
  }
  route_ = Route::dequant;
  exe_ = &gemm_executable(qs, plan_isa);
  dequant_ = jit::get(quant_dequant_desc(*q_, isa)).entry<codegen::DequantFn>();
}

int64_t ExpertGemm::task_rows() const {
  // The fused kernel takes a group of <= kFusedMaxMr rows a call.
  return route_ == Route::fused ? kFusedMaxMr : exe_->plan().task_rows();
}

const std::vector<int32_t>* ExpertGemm::perm() const {
  if (q_ == nullptr || q_->format == WeightFormat::int8 || q_->quant->perm.empty()) return nullptr;
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
    case Route::fused: {
      // Groups of fused_mr_ rows, then the remainder (the kernels of both
      // were compiled for the expert's row count).
      for (int64_t r0 = 0; r0 < job.rows; r0 += fused_mr_) {
        const int64_t rr = std::min(fused_mr_, job.rows - r0);
        const int g = rr < fused_mr_ ? 1 : 0;
        const jit::Kernel* k = fused_[g][job.n_tail ? 1 : 0];
        if (k == nullptr)
          throw InternalError(fmt::format(
              "fused_experts: no fused kernel for a group of {} rows (mr {})", rr, fused_mr_));
        const void* a_ptr = job.a + r0 * job.lda;
        const void* b_ptr = q_->bytes() + block * q_->code_block_bytes();
        codegen::BrgemmArgs args{};
        args.a = &a_ptr;
        args.b = &b_ptr;
        args.batch = 1;
        args.lda = job.lda;
        args.c = job.c + r0 * job.ldc;
        args.ldc = job.ldc;
        args.bias = job.bias;
        set_fused_tables(*q_, block, fused_scratch_, args);
        k->entry<codegen::BrgemmFn>()(&args);
      }
      return;
    }
    case Route::dequant:
      run_dequant_block(*q_, *exe_, dequant_, job, block);
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
