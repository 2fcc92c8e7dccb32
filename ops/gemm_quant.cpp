// The weight-quantized GEMM drivers (docs/quantized.md):
//   fp8 / int4 (W8A16, W4A16): per task and K chunk, the dequant kernel turns
//     the chunk of the column block's codes into a bf16 packed chunk (L1 / L2
//     resident), which the bf16 brgemm kernels of the plan then run on;
//     act-order weights first gather x's columns into the packed K order.
//   int8 (W8A8): the act_quant kernel quantizes each slice of x to u8 with
//     per-row scales and zero points; the int8 brgemm kernels run on the int8
//     packed weight with the scaled epilogue.
// The scalar path computes both from the logical weights in double.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "codegen/quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/moe_quant.h"
#include "ops/quant_weight.h"
#include "runtime/batch_invariant.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "runtime/lazy_statics.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit::ops {

namespace {

constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;

// Up to this many rows the GEMM streams the weight once per column block
// with few rows to amortize a dequantized chunk over: shallow K chunks keep
// the chunk in L1 (256 deep: 32 KiB of bf16).
constexpr int64_t kShallowChunkRows = 16, kShallowChunk = 256;

void store(const TensorView& y, int64_t i, int64_t j, double v) {
  if (y.dtype == DType::f32)
    static_cast<float*>(y.data)[i * y.strides[0] + j] = static_cast<float>(v);
  else
    static_cast<uint16_t*>(y.data)[i * y.strides[0] + j] =
        runtime::f32_to_bf16(static_cast<float>(v));
}

double bias_at(const GemmOptions& opt, int64_t j) {
  if (!opt.bias) return 0;
  return opt.bias->dtype == DType::f32
             ? double(static_cast<const float*>(opt.bias->data)[j])
             : double(runtime::bf16_to_f32(static_cast<const uint16_t*>(opt.bias->data)[j]));
}

// The oracle path: w from weight_value (double); int8 quantizes x with the
// kernels' rule (runtime/reference_quant.h) and sums the codes exactly.
void run_scalar_quant(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                      const GemmOptions& opt) {
  const int64_t M = x.shape[0], N = p.layout.n, K = p.layout.k;
  const auto* xs = static_cast<const uint16_t*>(x.data);
  if (p.format == WeightFormat::int8) {
    const codegen::ActQuantMode mode = act_quant_mode(opt.act_quant);
    std::vector<uint8_t> q(static_cast<size_t>(M * K));
    std::vector<float> sa(static_cast<size_t>(M));
    std::vector<int32_t> za(static_cast<size_t>(M));
    runtime::parallel_for(M, [&](int64_t i) {
      runtime::reference_act_quant_row(act_quant_rule(mode), xs + i * x.strides[0], K, K,
                                       fixed_inv_scale(opt), opt.act_scale, opt.act_zero_point,
                                       &q[i * K], &sa[i], &za[i]);
    });
    const auto* sw = reinterpret_cast<const float*>(p.quant->col_scale.get());
    runtime::parallel_for(N, [&](int64_t j) {
      std::vector<int32_t> w(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k) w[k] = static_cast<int8_t>(p.bytes()[p.int8.index(j, k)]);
      for (int64_t i = 0; i < M; ++i) {
        int64_t acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += int64_t(q[i * K + k] - za[i]) * w[k];
        const double v = double(acc) * double(sa[i]) * double(sw[j]) + bias_at(opt, j);
        store(y, i, j, runtime::reference_activation(opt.act, v));
      }
    });
    return;
  }
  runtime::parallel_for(N, [&](int64_t j) {
    std::vector<double> w(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) w[k] = weight_value(p, j, k);
    for (int64_t i = 0; i < M; ++i) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(runtime::bf16_to_f32(xs[i * x.strides[0] + k])) * w[k];
      store(y, i, j, runtime::reference_activation(opt.act, acc + bias_at(opt, j)));
    }
  });
}

void log_plan(const char* what, const TensorView& x, const PackedWeight::Impl& p, Isa isa,
              const codegen::GemmPlan& plan) {
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr, "tilejit: gemm %s M=%lld N=%lld K=%lld path=%s weight=%s plan=%s\n", what,
                 static_cast<long long>(x.shape[0]), static_cast<long long>(p.layout.n),
                 static_cast<long long>(p.layout.k), isa_name(isa), p.layout_name.c_str(),
                 plan.name().c_str());
}

// ---- W8A8 -------------------------------------------------------------------------

void run_int8(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
              const GemmOptions& opt, Isa isa, const codegen::PlanOverrides& tuned) {
  const int64_t K = p.layout.k;
  const codegen::GemmSpec spec = quant_gemm_spec(p, bias_kind(opt), opt.act, y.dtype, x.shape[0]);
  const int64_t k4 = spec.k;
  GemmExecutable& exe = gemm_executable(spec, isa, tuned);
  log_plan("w8a8", x, p, isa, exe.plan());
  // u8 rows padded to whole AMX K steps (the pack_a copy reads 64-byte steps).
  const int64_t ldq = (k4 + 63) / 64 * 64;

  GemmRun r = GemmRun::of(x, y, opt);
  r.b = p.bytes();
  r.block_bytes = p.int8.block_bytes();
  r.b_scale = reinterpret_cast<const float*>(p.quant->col_scale.get());
  r.b_comp = reinterpret_cast<const int32_t*>(p.quant->col_comp.get());
  std::vector<float> scale;
  std::vector<int32_t> zero;
  r.prepare_slice = [&](int64_t s0, int64_t rows, int64_t* lda) {
    uint8_t* q = packed_a_scratch(kQuantX, rows * ldq);
    scale.resize(static_cast<size_t>(rows));
    zero.resize(static_cast<size_t>(rows));
    quantize_rows(static_cast<const uint16_t*>(x.data) + s0 * x.strides[0], x.strides[0], rows, K,
                  ldq, opt, isa, q, scale.data(), zero.data());
    r.a_scale = scale.data();
    r.a_zero = zero.data();
    *lda = ldq;
    return q;
  };
  run_gemm_plan(exe, r);
}

// ---- W8A16 / W4A16 ------------------------------------------------------------------

// x's rows [s0, s0 + rows) in the packed K order (act-order; padding
// positions exactly 0, as both kernels need), `ldg` elements a row.
uint16_t* gather_rows(const TensorView& x, const QuantTables& q, int64_t s0, int64_t rows,
                      int64_t ldg) {
  auto* g = reinterpret_cast<uint16_t*>(packed_a_scratch(kQuantX, rows * ldg * 2));
  runtime::parallel_for(rows, [&](int64_t i) {
    const auto* src = static_cast<const uint16_t*>(x.data) + (s0 + i) * x.strides[0];
    uint16_t* dst = g + i * ldg;
    for (int64_t j = 0; j < q.k_packed; ++j) dst[j] = q.perm[j] >= 0 ? src[q.perm[j]] : 0;
  });
  return g;
}

// Decode shapes (quant_gemm_fused: M <= 16, or <= 4 on amx): the fused
// micro-kernel reads the codes and group tables itself, one call per column
// block over the whole K and group of <= kFusedMaxMr rows
// (codegen/xbyak/quant_brgemm.cpp; the LLVM brgemm's quantized mode).

void run_fused(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
               const GemmOptions& opt, Isa isa, const codegen::PlanOverrides& tuned) {
  const QuantTables& q = *p.quant;
  const int64_t M = x.shape[0], N = p.layout.n;
  const codegen::GemmSpec spec{p.layout.n, p.layout.k, bias_kind(opt), opt.act, y.dtype};
  const FusedKernels kernels(p, spec, M, isa, tuned);
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr, "tilejit: gemm %s M=%lld N=%lld K=%lld path=%s weight=%s kernel=%s\n",
                 p.dtype == DType::f8e4m3 ? "w8a16" : "w4a16", static_cast<long long>(M),
                 static_cast<long long>(N), static_cast<long long>(p.layout.k), isa_name(isa),
                 p.layout_name.c_str(), kernels.name().c_str());
  const uint8_t* a = static_cast<const uint8_t*>(x.data);
  int64_t lda = x.strides[0] * 2;
  if (!q.perm.empty()) {
    const int64_t ldg = (q.k_packed + 31) / 32 * 32;
    a = reinterpret_cast<const uint8_t*>(gather_rows(x, q, 0, M, ldg));
    lda = ldg * 2;
  }
  const int64_t n_blocks = (N + kBlockN - 1) / kBlockN;
  const int64_t y_elem = y.dtype == DType::f32 ? 4 : 2;
  const int64_t bias_elem = opt.bias && opt.bias->dtype == DType::f32 ? 4 : 2;
  // Runs of consecutive column blocks per task: the kernel's prefetch runs on
  // from one block's codes into the next; a block's row groups reread its
  // codes from cache. More rows than kFusedMaxRows (batch-invariant mode)
  // go in chunks of kFusedMaxRows (a multiple of kFusedMaxMr, so only the
  // last chunk has the remainder group FusedKernels holds), x's chunk
  // staying in cache across the run's blocks.
  constexpr int64_t kBlocksPerTask = 8;
  static_assert(kFusedMaxRows % kFusedMaxMr == 0);
  const int64_t runs = (n_blocks + kBlocksPerTask - 1) / kBlocksPerTask;
  const int64_t chunk = std::min(M, kFusedMaxRows);
  const int64_t chunks = (M + chunk - 1) / chunk;
  runtime::parallel_for(runs * chunks, [&](int64_t t) {
    const int64_t r0 = t / runs * chunk, rows = std::min(chunk, M - r0), run = t % runs;
    uint8_t* yc = static_cast<uint8_t*>(y.data) + r0 * y.strides[0] * y_elem;
    for (int64_t nb = run * kBlocksPerTask; nb < std::min(n_blocks, (run + 1) * kBlocksPerTask);
         ++nb)
      kernels.run(p, nb, nb == n_blocks - 1 && N % kBlockN != 0, a + r0 * lda, lda, rows,
                  yc + nb * kBlockN * y_elem, y.strides[0] * y_elem,
                  opt.bias ? static_cast<const uint8_t*>(opt.bias->data) + nb * kBlockN * bias_elem
                           : nullptr);
  });
}

void run_dequant(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                 const GemmOptions& opt, Isa isa, const codegen::PlanOverrides& tuned) {
  const QuantTables& q = *p.quant;
  const int64_t M = x.shape[0], kp = q.k_packed;
  GemmExecutable& exe =
      gemm_executable(quant_gemm_spec(p, bias_kind(opt), opt.act, y.dtype, M), isa, tuned);
  const codegen::GemmPlan& plan = exe.plan();
  log_plan(p.format == WeightFormat::fp8_e4m3 ? "w8a16" : "w4a16", x, p, isa, plan);
  const auto dequant = jit::get(quant_dequant_desc(p, isa)).entry<codegen::DequantFn>();

  const codegen::GemmPlan::Schedule sched = plan.schedule(M, runtime::num_threads());
  const int64_t n_blocks = sched.n_blocks, chunk_rows = sched.task_rows;
  const codegen::PackedA pa_layout = plan.packed_a();
  GemmRun r = GemmRun::of(x, y, opt);

  for (int64_t s0 = 0; s0 < M; s0 += sched.slice_rows) {
    const int64_t rows = std::min(sched.slice_rows, M - s0);
    const uint8_t* xb = r.x + s0 * r.lda;
    int64_t lda = r.lda;
    if (!q.perm.empty()) {
      // Act-order: x's columns in the packed K order (padding positions 0).
      const int64_t ldg = (kp + 31) / 32 * 32;
      xb = reinterpret_cast<const uint8_t*>(gather_rows(x, q, s0, rows, ldg));
      lda = ldg * 2;
    }
    if (plan.a_packed) {
      uint8_t* pa = packed_a_scratch(kQuantAPacked, pa_layout.bytes(rows));
      pack_a(xb, lda, rows, pa_layout.k, pa);
      xb = pa;
    }
    uint8_t* yb = r.y + s0 * r.ldc;
    const int64_t m_chunks = sched.row_chunks(rows);
    runtime::parallel_for(n_blocks * m_chunks, [&](int64_t t) {
      const int64_t nbi = t % n_blocks, m0 = t / n_blocks * chunk_rows;
      RowBlockJob job;
      job.a = plan.a_packed ? xb + pa_layout.offset(m0, 0) : xb + m0 * lda;
      job.lda = lda;
      job.rows = std::min(rows, m0 + chunk_rows) - m0;
      job.c = yb + m0 * r.ldc + nbi * plan.nb * r.y_elem;
      job.ldc = r.ldc;
      job.bias = r.bias ? r.bias + nbi * plan.nb * r.bias_elem : nullptr;
      job.n_tail = nbi == n_blocks - 1 && plan.n_tail != 0;
      run_dequant_block(p, exe, dequant, job, nbi);
    });
  }
}

}  // namespace

void check_act_quant(const char* op, ActQuant q) {
  if (q != ActQuant::dynamic_sym && q != ActQuant::dynamic_asym && q != ActQuant::fixed)
    throw Error(fmt::format(
        "{}: act_quant={} is not an ActQuant; allowed: dynamic_sym, dynamic_asym, fixed", op,
        static_cast<int>(q)));
}

void check_fixed_act_quant(const char* op, const char* scale_name, float scale,
                           const char* zero_name, int zero) {
  if (!(scale > 0) || !std::isfinite(scale))
    throw Error(
        fmt::format("{}: act_quant=fixed with {}={}; allowed: finite > 0", op, scale_name, scale));
  if (zero < 0 || zero > 255)
    throw Error(
        fmt::format("{}: act_quant=fixed with {}={}; allowed: [0, 255]", op, zero_name, zero));
}

codegen::ActQuantMode act_quant_mode(ActQuant q) {
  check_act_quant("gemm", q);
  switch (q) {
    case ActQuant::dynamic_sym:
      return codegen::ActQuantMode::sym;
    case ActQuant::dynamic_asym:
      return codegen::ActQuantMode::asym;
    case ActQuant::fixed:
      break;
  }
  return codegen::ActQuantMode::fixed;
}

// ActQuant::fixed's 1 / s (checked > 0 and finite before); unused otherwise.
float fixed_inv_scale(ActQuant mode, float scale) {
  return mode == ActQuant::fixed ? 1.0f / scale : 1.0f;
}

float fixed_inv_scale(const GemmOptions& opt) {
  return fixed_inv_scale(opt.act_quant, opt.act_scale);
}

runtime::ActQuantRule act_quant_rule(codegen::ActQuantMode m) {
  switch (m) {
    case codegen::ActQuantMode::sym:
      return runtime::ActQuantRule::sym;
    case codegen::ActQuantMode::asym:
      return runtime::ActQuantRule::asym;
    case codegen::ActQuantMode::fixed:
      break;
  }
  return runtime::ActQuantRule::fixed;
}

void quantize_rows(const uint16_t* x, int64_t ldx, int64_t rows, int64_t k, int64_t ldq,
                   const GemmOptions& opt, Isa isa, uint8_t* q, float* scale, int32_t* zero) {
  const RowQuant rq{opt.act_quant, opt.act_scale, opt.act_zero_point};
  constexpr int64_t kRowsPerTask = 16;
  runtime::parallel_for((rows + kRowsPerTask - 1) / kRowsPerTask, [&](int64_t t) {
    const int64_t r0 = t * kRowsPerTask;
    quantize_rows(rq, isa, x + r0 * ldx, ldx, std::min(kRowsPerTask, rows - r0), k, q + r0 * ldq,
                  ldq, scale + r0, zero + r0);
  });
}

void set_fused_tables(const PackedWeight::Impl& p, int64_t block, int64_t scratch_bytes,
                      codegen::BrgemmArgs& args) {
  const QuantTables& q = *p.quant;
  args.q_groups = q.groups.data();
  args.q_scales = q.scale_rows(block);
  args.q_zeros = q.zeros != nullptr ? reinterpret_cast<const uint8_t*>(q.zeros.get()) +
                                          block * q.n_groups * kBlockN
                                    : nullptr;
  args.q_scratch = scratch_bytes > 0 ? packed_a_scratch(kQuantB, scratch_bytes) : nullptr;
}

void run_dequant_block(const PackedWeight::Impl& p, const GemmExecutable& exe,
                       codegen::DequantFn dequant, RowBlockJob job, int64_t block) {
  const QuantTables& q = *p.quant;
  const codegen::GemmPlan& plan = exe.plan();
  // The dequantized chunk: the K rows the kernels read, whole AMX K steps.
  const int64_t chunk_pairs = (plan.kc + 31) / 32 * 16;
  auto* chunk = reinterpret_cast<uint16_t*>(
      packed_a_scratch(kQuantB, chunk_pairs * codegen::PackedLayout::kRowBytes));
  const int64_t part_rows = (job.rows + plan.mr - 1) / plan.mr * plan.mr;
  job.partial = reinterpret_cast<float*>(packed_a_scratch(kQuantPartial, part_rows * kBlockN * 4));
  job.ld_partial = kBlockN * 4;
  job.b_block = reinterpret_cast<const uint8_t*>(chunk);
  job.b_is_chunk = true;
  const auto* zeros = reinterpret_cast<const uint8_t*>(q.zeros.get());
  for (int64_t c = 0; c < plan.k_chunks; ++c) {
    const int64_t k0 = c * plan.kc;
    const int64_t klen = std::min(plan.kc, q.k_packed - k0);
    codegen::DequantArgs d{};
    d.codes = p.bytes() + block * p.code_block_bytes() + k0 / 2 * q.code_row_bytes;
    d.groups = q.groups.data() + k0 / 2;
    d.scales = q.scale_rows(block);
    d.zeros = zeros != nullptr ? zeros + block * q.n_groups * kBlockN : nullptr;
    d.out = chunk;
    d.rows = (klen + 31) / 32 * 16;
    dequant(&d);
    job.only_chunk = c;
    run_row_block(exe, job);
  }
}

const char* layout_tag_prefix(WeightFormat f) {
  switch (f) {
    case WeightFormat::bf16:
      return "bf16_vnni2_n64k32";
    case WeightFormat::int8:
      return "i8_vnni4_n64k64_";
    case WeightFormat::fp8_e4m3:
      return "f8e4m3_vnni2_n64k32_";
    case WeightFormat::int4_awq:
      return "u4_awq_vnni2_n64k32_g";
    case WeightFormat::int4_gptq:
      return "u4_gptq_vnni2_n64k32_g";
    case WeightFormat::mxfp4:
      return "f4e2m1_mx_vnni2_n64k32_";
  }
  return "?";
}

int64_t quant_gemm_max_kc(bool int8, int64_t m, bool invariant) {
  return !int8 && !invariant && m <= kShallowChunkRows ? kShallowChunk : codegen::GemmSpec{}.max_kc;
}

codegen::GemmSpec quant_gemm_spec(const PackedWeight::Impl& p, codegen::GemmSpec spec, int64_t m) {
  const bool int8 = p.format == WeightFormat::int8;
  spec.k = int8 ? (p.layout.k + 3) / 4 * 4 : p.quant->k_packed;
  if (int8) spec.b_type = DType::i8;
  spec.max_kc = quant_gemm_max_kc(int8, m, spec.invariant);
  return spec;
}

codegen::GemmSpec quant_gemm_spec(const PackedWeight::Impl& p, codegen::BiasKind bias,
                                  Activation act, DType out, int64_t m) {
  codegen::GemmSpec spec{p.layout.n, p.layout.k, bias, act, out};
  spec.invariant = runtime::batch_invariant();
  return quant_gemm_spec(p, spec, m);
}

codegen::BrgemmDesc quant_fused_desc(DType code, bool zeros, int64_t k_packed,
                                     const codegen::GemmSpec& spec, int64_t m, Isa path,
                                     const codegen::PlanOverrides& tuned) {
  codegen::BrgemmDesc d;
  d.prefetch_kib = tuned.prefetch_kib.value_or(-1);
  d.isa = path == Isa::llvm ? Isa::llvm : Isa::avx512;
  d.b_type = code;  // f8e4m3, u4 or f4e2m1
  d.b_zeros = zeros;
  d.mr = static_cast<int>(std::min<int64_t>(m, kFusedMaxMr));  // rows per call
  d.kb = k_packed;
  d.b_row_bytes = code == DType::f8e4m3 ? 128 : 64;  // a k-pair row of codes
  d.bias = spec.bias;
  d.act = spec.act;
  d.out = spec.out;
  d.glu = spec.glu;
  d.glu_alpha = spec.glu_alpha;
  d.glu_limit = spec.glu_limit;
  if (d.glu != codegen::Glu::none) d.nr = 32;
  // Batch-invariant mode (quant_gemm_fused at every M): one accumulator
  // chain and one arithmetic for every mr (the Xbyak kernel's vdpbf16ps
  // form; the LLVM kernel has one).
  d.one_chain = !quant_routes_follow_rows();
  // The Xbyak u4 kernel's arithmetic: tuned, or this CPU's (the LLVM kernel
  // has one).
  d.u4_bf16_dot = d.isa == Isa::avx512 && code == DType::u4 &&
                  tuned.u4_dot.value_or(runtime::bf16_dot_at_fma_rate(runtime::cpu_features()));
  return d;
}

codegen::BrgemmDesc quant_fused_desc(const PackedWeight::Impl& p, const codegen::GemmSpec& spec,
                                     int64_t m, Isa path, const codegen::PlanOverrides& tuned) {
  const QuantTables& q = *p.quant;
  return quant_fused_desc(p.dtype, q.zeros != nullptr, q.k_packed, spec, m, path, tuned);
}

codegen::DequantDesc quant_dequant_desc(const PackedWeight::Impl& p, Isa isa) {
  const QuantTables& q = *p.quant;
  return {isa == Isa::llvm ? Isa::llvm : Isa::avx512, p.dtype,  // f8e4m3, u4 or f4e2m1
          q.zeros != nullptr, q.normal_products};
}

const codegen::PlanOverrides& quant_tuned(WeightFormat format, int64_t n, int64_t k,
                                          codegen::BiasKind bias, Activation act, DType out,
                                          Isa path, int64_t m) {
  static const codegen::PlanOverrides& kNone = *new codegen::PlanOverrides;  // immortal
  // Batch-invariant mode takes no tuned plan (entries are per M class).
  if (path == Isa::scalar || runtime::batch_invariant() || !jit::tuning_db_active()) return kNone;
  return jit::find_tuned_gemm(path, runtime::num_threads(), n, k, bias, act, out, m, format);
}

namespace {

// The entry of a packed weight's GEMM: what gemm_quantized and
// quant_gemm_kernel_name apply.
const codegen::PlanOverrides& weight_tuned(const PackedWeight::Impl& p, codegen::BiasKind bias,
                                           Activation act, DType out, Isa path, int64_t m) {
  return quant_tuned(p.format, p.layout.n, p.layout.k, bias, act, out, path, m);
}

}  // namespace

std::string quant_gemm_kernel_name(const PackedWeight::Impl& p, codegen::BiasKind bias,
                                   Activation act, DType out, Isa path, int64_t m) {
  const bool invariant = runtime::batch_invariant();
  const Isa isa = quant_rows_isa(path, m);
  const codegen::PlanOverrides& tuned = weight_tuned(p, bias, act, out, path, m);
  // The automatic route (GemmOptions' default), or the tuned one.
  if (w4a8_route(p, GemmOptions{}, isa, m, tuned)) {
    if (!w4a8_kernels_usable(isa)) return "scalar reference (W4A8: x quantized per row, double)";
    return w4a8_kernel_name(p, bias, act, out, isa);
  }
  if (isa == Isa::scalar) return "scalar reference (logical weights, double)";
  if (quant_gemm_fused(p, isa, m))
    return quant_fused_desc(p, codegen::GemmSpec{p.layout.n, p.layout.k, bias, act, out}, m, isa,
                            tuned)
        .name();
  return gemm_executable(quant_gemm_spec(p, bias, act, out, m),
                         codegen::gemm_isa_for_rows(path, m, tuned, invariant), tuned)
      .plan()
      .name();
}

int64_t quant_fused_scratch_bytes(const codegen::BrgemmDesc& d) {
  return d.isa == Isa::llvm ? 0 : codegen::xbyak::quant_brgemm_scratch_bytes(d);
}

FusedDescs quant_fused_descs(DType code, bool zeros, int64_t k_packed,
                             const codegen::GemmSpec& spec, int64_t rows, Isa path,
                             const codegen::PlanOverrides& tuned) {
  FusedDescs out;
  const codegen::BrgemmDesc d = quant_fused_desc(code, zeros, k_packed, spec, rows, path, tuned);
  const int64_t rem = rows > d.mr ? rows % d.mr : 0;
  for (int g = 0; g < 2; ++g) {
    if (g == 1 && rem == 0) continue;
    const codegen::BrgemmDesc dg =
        g == 0 ? d : quant_fused_desc(code, zeros, k_packed, spec, rem, path, tuned);
    codegen::BrgemmDesc tail = dg;
    tail.nr = static_cast<int>(spec.n % dg.nr);
    if (spec.n >= dg.nr) out[g][0] = dg;
    if (tail.nr != 0) out[g][1] = tail;
  }
  return out;
}

FusedKernels::FusedKernels(const PackedWeight::Impl& p, const codegen::GemmSpec& spec, int64_t rows,
                           Isa path, const codegen::PlanOverrides& tuned) {
  const QuantTables& q = *p.quant;
  const FusedDescs descs =
      quant_fused_descs(p.dtype, q.zeros != nullptr, q.k_packed, spec, rows, path, tuned);
  mr_ = (descs[0][0] ? *descs[0][0] : *descs[0][1]).mr;
  for (int g = 0; g < 2; ++g)
    for (int t = 0; t < 2; ++t) {
      if (!descs[g][t]) continue;
      k_[g][t] = &jit::get(*descs[g][t]);
      // One per-thread scratch serves them all.
      scratch_ = std::max(scratch_, quant_fused_scratch_bytes(*descs[g][t]));
    }
}

const std::string& FusedKernels::name() const {
  return (k_[0][0] != nullptr ? k_[0][0] : k_[0][1])->name;
}

void FusedKernels::run(const PackedWeight::Impl& p, int64_t block, bool n_tail, const uint8_t* a,
                       int64_t lda, int64_t rows, uint8_t* c, int64_t ldc, const void* bias) const {
  // Groups of mr rows, then the remainder; a block's later groups reread its
  // codes from cache.
  for (int64_t r0 = 0; r0 < rows; r0 += mr_) {
    const int64_t rr = std::min(mr_, rows - r0);
    const jit::Kernel* k = k_[rr < mr_ ? 1 : 0][n_tail ? 1 : 0];
    if (k == nullptr)
      throw InternalError(
          fmt::format("quantized gemm: no fused kernel for a group of {} rows (mr {}, n_tail {})",
                      rr, mr_, n_tail));
    const void* a_ptr = a + r0 * lda;
    const void* b_ptr = p.bytes() + block * p.code_block_bytes();
    codegen::BrgemmArgs args{};
    args.a = &a_ptr;
    args.b = &b_ptr;
    args.batch = 1;
    args.lda = lda;
    args.c = c + r0 * ldc;
    args.ldc = ldc;
    args.bias = bias;
    set_fused_tables(p, block, scratch_, args);
    k->entry<codegen::BrgemmFn>()(&args);
  }
}

int64_t fused_max_rows(Isa path) {
  // The Xbyak kernel needs AVX512-VBMI (runtime::xbyak_fused_quant_kernel).
  static const bool vbmi = runtime::xbyak_fused_quant_kernel(runtime::cpu_features());
  // llvm and avx512: up to kFusedMaxRows rows in calls of <= kFusedMaxMr
  // rows (the dequant route's bf16 kernels are slower there below that);
  // amx: one call of <= kFusedMaxMr rows (the AMX bf16 kernels take over).
  switch (path) {
    case Isa::llvm:
      return kFusedMaxRows;
    case Isa::avx512:
      return vbmi ? kFusedMaxRows : 0;
    case Isa::amx:
      return vbmi ? kFusedMaxMr : 0;
    default:
      return 0;
  }
}
namespace {
const bool g_fork_hook = runtime::on_fork_complete([] { (void)fused_max_rows(Isa::avx512); });
}  // namespace

bool quant_routes_follow_rows() {
  return !runtime::batch_invariant();
}

Isa quant_rows_isa(Isa path, int64_t m) {
  return codegen::gemm_isa_for_rows(path, m, {}, !quant_routes_follow_rows());
}

bool quant_gemm_fused(Isa path, int64_t m) {
  if (!quant_routes_follow_rows()) return path != Isa::amx && fused_max_rows(path) > 0;
  return m <= fused_max_rows(path);
}

bool quant_gemm_fused(const PackedWeight::Impl& p, Isa path, int64_t m) {
  return p.format != WeightFormat::bf16 && p.format != WeightFormat::int8 &&
         quant_gemm_fused(path, m);
}

bool bf16_rows_have_inf(const uint16_t* x, int64_t ld, int64_t rows, int64_t k) {
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < k; ++j)
      if ((x[i * ld + j] & 0x7FFF) == 0x7F80) return true;
  return false;
}

bool layout_tag_ok(const PackedWeight::Impl& p) {
  const char* prefix = layout_tag_prefix(p.format);
  if ((p.format == WeightFormat::bf16) != (p.quant == nullptr)) return false;
  if (p.format == WeightFormat::bf16) return p.layout_name == prefix;
  return p.layout_name.rfind(prefix, 0) == 0;
}

namespace {

// Rows [r0, r1) of a 2-D view.
TensorView row_range(const TensorView& t, int64_t r0, int64_t r1) {
  const int64_t elem = t.dtype == DType::f32 ? 4 : 2;
  return TensorView(static_cast<uint8_t*>(t.data) + r0 * t.strides[0] * elem, t.dtype,
                    {r1 - r0, t.shape[1]}, t.strides);
}

// Batch-invariant int4 GEMM with ±Inf activations: maximal runs of rows
// with and without an ±Inf, the former on the dequant route, the latter on
// the fused kernel (the route each run would take alone).
void run_rows_by_inf(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                     const GemmOptions& opt, Isa rows_isa, const codegen::PlanOverrides& tuned) {
  const auto* xd = static_cast<const uint16_t*>(x.data);
  const int64_t M = x.shape[0], K = x.shape[1], ld = x.strides[0];
  auto inf_row = [&](int64_t r) { return bf16_rows_have_inf(xd + r * ld, ld, 1, K); };
  for (int64_t r0 = 0; r0 < M;) {
    const bool inf = inf_row(r0);
    int64_t r1 = r0 + 1;
    while (r1 < M && inf_row(r1) == inf) ++r1;
    const TensorView xs = row_range(x, r0, r1), ys = row_range(y, r0, r1);
    if (inf)
      run_dequant(xs, p, ys, opt, rows_isa, tuned);
    else
      run_fused(xs, p, ys, opt, rows_isa, tuned);
    r0 = r1;
  }
}

}  // namespace

void gemm_quantized(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                    const GemmOptions& opt) {
  const int64_t M = x.shape[0];
  const Isa path = runtime::active_isa();
  // Batch-invariant mode: the path's ISA, and one route (quant_gemm_fused),
  // for every M.
  const bool invariant = runtime::batch_invariant();
  const Isa rows_isa = quant_rows_isa(path, M);
  // A tuning database entry of this format and shape class: the int4 route
  // and, for W8A8 and the dequant route, the GemmPlan's row blocking, task
  // split and ISA (validated at load: jit/tuning_db.cpp).
  const codegen::PlanOverrides& tuned = weight_tuned(p, bias_kind(opt), opt.act, y.dtype, path, M);
  // Whether x holds an ±Inf, asked only where it changes the route (int4
  // weights): the fused kernel's zero-point form and W4A8 would make NaN of it.
  const bool x_has_inf =
      fused_int4_form(p.format) &&
      bf16_rows_have_inf(static_cast<const uint16_t*>(x.data), x.strides[0], M, x.shape[1]);
  // W4A8 (int4 weights, int8 activations): opt.int4_route, by path and M.
  const bool w4a8 =
      w4a8_route(p, opt, rows_isa, M, tuned) && w4a8_keeps_infinities(opt.int4_route, x_has_inf);
  if (w4a8) {
    // Without its kernels (the llvm path of a build without LLVM, scalar),
    // the oracle computes the same W4A8 result.
    if (!w4a8_kernels_usable(rows_isa)) return run_scalar_w4a8(x, p, y, opt);
    return run_w4a8(x, p, y, opt, rows_isa);
  }
  if (rows_isa == Isa::scalar) return run_scalar_quant(x, p, y, opt);
  // The fused decode kernel has no plan (one kernel per M): of the tuned
  // knobs only the prefetch distance applies there (docs/tuning.md).
  if (p.format != WeightFormat::int8 && quant_gemm_fused(p, rows_isa, M) &&
      fused_keeps_infinities(p.format, x_has_inf))
    return run_fused(x, p, y, opt, rows_isa, tuned);
  // Batch-invariant mode, int4 weights and an x holding an ±Inf: a route
  // taken for the whole call would make the other rows' bits depend on that
  // row, so each run of rows takes its own — the rows holding an ±Inf the
  // dequant route (IEEE infinities; invariant in the mode too), the others
  // the fused kernel, as alone.
  if (invariant && x_has_inf && quant_gemm_fused(p, rows_isa, M))
    return run_rows_by_inf(x, p, y, opt, rows_isa, tuned);
  // W8A8 and the dequant route run a GemmPlan (with the entry's knobs).
  const Isa isa = codegen::gemm_isa_for_rows(path, M, tuned, invariant);
  if (p.format == WeightFormat::int8) return run_int8(x, p, y, opt, isa, tuned);
  run_dequant(x, p, y, opt, isa, tuned);
}

}  // namespace tilejit::ops
