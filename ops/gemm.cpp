// tilejit::gemm: argument checks, plan lookup, and the driver loop that runs
// the micro-kernels over (N block, M chunk) tasks on the thread pool.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "ir/activation.h"
#include "jit/front_cache.h"
#include "jit/kernel_cache.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_ir.h"
#include "ops/gemm_task.h"
#include "ops/packed_weight_impl.h"
#include "ops/quant_weight.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/batch_invariant.h"
#include "runtime/isa.h"
#include "runtime/lazy_statics.h"
#include "runtime/reference_gemm.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

#include "runtime/api_guard.h"

namespace tilejit {
namespace ops {

const jit::Kernel& GemmExecutable::kernel(int rows, bool n_tail, Chunk chunk) const {
  return jit::get(plan_.ukernel(rows, n_tail ? plan_.n_tail : plan_.nb, chunk));
}

namespace {

// A spec on an ISA, with the tuned overrides (if any) its plan takes.
struct PlanKey {
  codegen::GemmSpec spec;
  Isa isa;
  codegen::PlanOverrides tuned;
  bool operator==(const PlanKey&) const = default;
};
struct PlanKeyHash {
  size_t operator()(const PlanKey& s) const {
    size_t h = codegen::desc_hash(s.spec) * 31 + codegen::field_hash(s.isa);
    if (!s.tuned.empty())
      h = h * 31 + std::hash<std::string>()(s.tuned.entry) * 7 + size_t(s.tuned.mr.value_or(0)) +
          size_t(s.tuned.task_rows.value_or(0)) * 131;
    return h;
  }
};

// The process-wide table behind the per-thread front: built once per spec.
struct PlanTable {
  std::mutex mu;  // a leaf: held for a lookup or an insert, nothing else
  std::unordered_map<PlanKey, std::unique_ptr<GemmExecutable>, PlanKeyHash> map;
};
PlanTable& plan_table() {
  // Immortal: a host thread may still run a plan while static destructors run.
  static PlanTable& t = *new PlanTable;
  return t;
}
const bool g_fork_hooks =
    runtime::on_fork_complete([] { (void)plan_table(); }) &&
    runtime::on_fork_lock([] { plan_table().mu.lock(); }, [] { plan_table().mu.unlock(); });

GemmExecutable& build_executable(const PlanKey& key) {
  auto& [mu, map] = plan_table();
  {
    std::lock_guard<std::mutex> lk(mu);
    if (auto it = map.find(key); it != map.end()) return *it->second;
  }
  // Miss: the whole pipeline (IR -> verify -> lower), outside the lock. Cheap
  // next to emission, and done once per spec. A GLU epilogue (MoE gate/up)
  // has no IR op yet: it is planned directly.
  const auto& [spec, isa, tuned] = key;
  // Quantized specs (b_type, max_kc) have no IR op yet either; a tuned plan
  // is the lowered one with the entry's overrides (plan_gemm checks them).
  // So are batch-invariant ones (the IR op does not carry the mode).
  const bool planned_directly = spec.glu != codegen::Glu::none || spec.b_type != DType::bf16 ||
                                spec.max_kc != codegen::GemmSpec{}.max_kc || spec.invariant ||
                                !tuned.empty();
  LoweredGemm lowered = !planned_directly ? lower_gemm_spec(spec, isa)
                                          : LoweredGemm{codegen::plan_gemm(spec, isa, tuned), ""};
  std::lock_guard<std::mutex> lk(mu);
  auto& slot = map[key];
  if (!slot) {
    slot = std::make_unique<GemmExecutable>(std::move(lowered.plan));
    slot->ir_text = std::move(lowered.ir_text);
  }
  return *slot;
}

}  // namespace

const codegen::PlanOverrides& tuned_gemm(Isa path, const codegen::GemmSpec& spec, int64_t m) {
  static const codegen::PlanOverrides& kNone = *new codegen::PlanOverrides;  // immortal
  // Batch-invariant specs take no tuned plan: entries are per M class.
  if (path == Isa::scalar || spec.invariant || !jit::tuning_db_active()) return kNone;
  return jit::find_tuned_gemm(path, runtime::num_threads(), spec.n, spec.k, spec.bias, spec.act,
                              spec.out, m);
}

codegen::BiasKind bias_kind(const GemmOptions& opt) {
  if (!opt.bias) return codegen::BiasKind::none;
  return opt.bias->dtype == DType::f32 ? codegen::BiasKind::f32 : codegen::BiasKind::bf16;
}

codegen::GemmSpec bf16_gemm_spec(int64_t n, int64_t k, const GemmOptions& opt, DType out) {
  codegen::GemmSpec s{n, k, bias_kind(opt), opt.act, out};
  s.invariant = runtime::batch_invariant();
  return s;
}

GemmExecutable& gemm_executable(const codegen::GemmSpec& spec, Isa isa) {
  return gemm_executable(spec, isa, {});
}

GemmExecutable& gemm_executable(const codegen::GemmSpec& spec, Isa isa,
                                const codegen::PlanOverrides& tuned) {
  bool hit = false;
  GemmExecutable& exe = jit::FrontCache<PlanKey, GemmExecutable, PlanKeyHash>::get(
      {spec, isa, tuned}, build_executable, &hit);
  if (hit) jit::KernelCache::global().count_hit();
  return exe;
}

}  // namespace ops

namespace {

void check_gemm_args(const TensorView& x, const PackedWeight& w, const TensorView& y,
                     const GemmOptions& opt) {
  if (w.empty())
    throw Error("gemm: w is an empty PackedWeight; allowed: a weight from pack_weight()");
  // The tag against the format's layouts (compared in place: layout() would
  // allocate on every call).
  if (!ops::layout_tag_ok(*w.impl()))
    throw Error(fmt::format("gemm: w has layout {} for format {}; allowed: {}", w.layout(),
                            weight_format_name(w.impl()->format),
                            ops::layout_tag_prefix(w.impl()->format)));
  ops::check_view("gemm", "x", x, 2);
  ops::check_dtype("gemm", "x", x, {DType::bf16});
  ops::check_row_major_rows("gemm", "x", x);
  ops::check_view("gemm", "y", y, 2);
  ops::check_dtype("gemm", "y", y, {DType::bf16, DType::f32});
  ops::check_row_major_rows("gemm", "y", y);
  if (x.shape[1] != w.k())
    throw Error(fmt::format("gemm: x has shape {} but w is [{}, {}]; allowed: x.shape[1] == K = {}",
                            ops::shape_str(x.shape), w.n(), w.k(), w.k()));
  if (y.shape[0] != x.shape[0] || y.shape[1] != w.n())
    throw Error(fmt::format("gemm: y has shape {}; allowed: [M, N] = [{}, {}]",
                            ops::shape_str(y.shape), x.shape[0], w.n()));
  if (opt.bias) {
    ops::check_view("gemm", "bias", *opt.bias, 1);
    ops::check_dtype("gemm", "bias", *opt.bias, {DType::f32, DType::bf16});
    if (opt.bias->shape[0] != w.n())
      throw Error(fmt::format("gemm: bias has shape {}; allowed: [N] = [{}]",
                              ops::shape_str(opt.bias->shape), w.n()));
    if (opt.bias->strides[0] != 1 && w.n() > 1)
      throw Error(fmt::format("gemm: bias has stride {}; allowed: 1", opt.bias->strides[0]));
  }
  ir::check_activation("gemm", opt.act);
  // The int8-activation and int4 options, checked for every format (a bad
  // value was accepted where the format ignores it).
  ops::check_act_quant("gemm", opt.act_quant);
  if (opt.act_quant == ActQuant::fixed)
    ops::check_fixed_act_quant("gemm", "act_scale", opt.act_scale, "act_zero_point",
                               opt.act_zero_point);
  ops::check_int4_route(opt.int4_route, "gemm");
  // y is written while x and bias are still read (by other row and column blocks).
  ops::check_output("gemm", "y", y, {{"x", &x}, {"bias", ops::opt_view(opt.bias)}});
}

void run_scalar(const TensorView& x, const PackedWeight& w, const TensorView& y,
                const GemmOptions& opt) {
  const PackedWeight::Impl& p = *w.impl();
  runtime::ReferenceGemmArgs a;
  a.x = static_cast<const uint16_t*>(x.data);
  a.ldx = x.strides[0];
  a.m = x.shape[0];
  a.n = w.n();
  a.k = w.k();
  a.bias = opt.bias ? opt.bias->data : nullptr;
  a.bias_dtype = opt.bias ? opt.bias->dtype : DType::f32;
  a.act = opt.act;
  a.y = y.data;
  a.y_dtype = y.dtype;
  a.ldy = y.strides[0];
  const uint16_t* packed = p.bf16();
  // Rows are independent: split M over the pool.
  runtime::parallel_for(a.m, [&](int64_t i) {
    runtime::ReferenceGemmArgs row = a;
    row.m = 1;
    row.x = a.x + i * a.ldx;
    row.y = static_cast<char*>(a.y) + i * a.ldy * (a.y_dtype == DType::f32 ? 4 : 2);
    runtime::reference_gemm(row,
                            [&](int64_t n, int64_t k) { return packed[p.layout.index(n, k)]; });
  });
}

}  // namespace

namespace ops {

GemmRun GemmRun::of(const TensorView& x, const TensorView& y, const GemmOptions& opt) {
  GemmRun r;
  r.m = x.shape[0];
  r.x = static_cast<const uint8_t*>(x.data);
  r.lda = x.strides[0] * 2;
  r.y = static_cast<uint8_t*>(y.data);
  r.y_elem = y.dtype == DType::f32 ? 4 : 2;
  r.ldc = y.strides[0] * r.y_elem;
  r.bias = opt.bias ? static_cast<const uint8_t*>(opt.bias->data) : nullptr;
  r.bias_elem = opt.bias && opt.bias->dtype == DType::f32 ? 4 : 2;
  return r;
}

namespace {

// Task t of one slice of a run (its A rows at xb, lda; C at yb): column block
// t % n_blocks of row chunk t / n_blocks, the rule of every gemm pass.
RowBlockJob slice_job(const codegen::GemmPlan& plan, const codegen::GemmPlan::Schedule& sched,
                      const GemmRun& r, const uint8_t* xb, int64_t lda, uint8_t* yb, int64_t rows,
                      int64_t t, int64_t threads) {
  const int64_t n_blocks = sched.n_blocks, chunk_rows = sched.task_rows, nb = plan.nb;
  const int64_t nbi = t % n_blocks, m0 = t / n_blocks * chunk_rows;
  RowBlockJob job;
  job.a = plan.a_packed ? xb + plan.packed_a().offset(m0, 0) : xb + m0 * lda;
  job.lda = lda;
  job.rows = std::min(rows, m0 + chunk_rows) - m0;
  job.b_block = r.b + nbi * r.block_bytes;
  job.c = yb + m0 * r.ldc + nbi * nb * r.y_elem;
  job.ldc = r.ldc;
  job.bias = r.bias ? r.bias + nbi * nb * r.bias_elem : nullptr;
  job.n_tail = nbi == n_blocks - 1 && plan.n_tail != 0;
  // The pool hands out tasks in order, one at a time: this thread's next
  // one is about `threads` further on.
  if (nbi + threads < n_blocks) job.b_next = r.b + (nbi + threads) * r.block_bytes;
  if (r.a_scale != nullptr) {
    job.a_scale = r.a_scale + m0;
    job.a_zero = r.a_zero + m0;
    job.b_scale = r.b_scale + nbi * nb;
    job.b_comp = r.b_comp + nbi * nb;
  }
  return job;
}

}  // namespace

void run_gemm_batch(const GemmExecutable& exe, std::vector<GemmRun>& runs) {
  if (runs.empty()) return;
  const codegen::GemmPlan& plan = exe.plan();
  const int64_t M = runs[0].m, threads = runtime::num_threads();
  const codegen::GemmPlan::Schedule sched = plan.schedule(M, threads);
  bool one_pass = !plan.a_packed && sched.k_passes == 1 && sched.slice_rows >= M;
  for (const GemmRun& r : runs) one_pass = one_pass && !r.prepare_slice && r.m == M;
  if (!one_pass) {
    for (GemmRun& r : runs) run_gemm_plan(exe, r);
    return;
  }
  const int64_t per_run = sched.n_blocks * sched.row_chunks(M);
  runtime::parallel_for(static_cast<int64_t>(runs.size()) * per_run, [&](int64_t t) {
    const GemmRun& r = runs[static_cast<size_t>(t / per_run)];
    run_row_block(exe, slice_job(plan, sched, r, r.x, r.lda, r.y, M, t % per_run, threads));
  });
}

void run_gemm_plan(const GemmExecutable& exe, GemmRun& r) {
  const codegen::GemmPlan& plan = exe.plan();
  const int64_t M = r.m, K = plan.spec.k;
  const int64_t nb = plan.nb;
  // The task split (row chunks x column blocks, slices, K passes) is the
  // plan's: GemmPlan::schedule.
  const int64_t threads = runtime::num_threads();
  const codegen::GemmPlan::Schedule sched = plan.schedule(M, threads);
  const int64_t n_blocks = sched.n_blocks, chunk_rows = sched.task_rows;
  const bool chunked = sched.k_passes > 1;
  const int64_t ld_part = sched.ld_partial;
  const codegen::PackedA pa_layout = plan.packed_a();

  for (int64_t s0 = 0; s0 < M; s0 += sched.slice_rows) {
    const int64_t rows = std::min(sched.slice_rows, M - s0);
    const uint8_t* xb = r.x + s0 * r.lda;
    int64_t lda = r.lda;
    if (r.prepare_slice) xb = r.prepare_slice(s0, rows, &lda);
    if (plan.a_packed) {
      // Once per slice, shared by every column block's tasks.
      uint8_t* pa = packed_a_scratch(kGemmA, pa_layout.bytes(rows));
      pack_a(xb, lda, rows, pa_layout.k, pa);
      xb = pa;
    }
    (void)K;
    uint8_t* yb = r.y + s0 * r.ldc;
    const int64_t m_chunks = sched.row_chunks(rows);
    auto job_at = [&](int64_t t) {
      return slice_job(plan, sched, r, xb, lda, yb, rows, t, threads);
    };
    if (!chunked) {
      runtime::parallel_for(n_blocks * m_chunks, [&](int64_t t) { run_row_block(exe, job_at(t)); });
      continue;
    }
    auto* part = reinterpret_cast<float*>(packed_a_scratch(kGemmPartial, rows * ld_part));
    for (int64_t kci = 0; kci < sched.k_passes; ++kci)
      runtime::parallel_for(n_blocks * m_chunks, [&](int64_t t) {
        RowBlockJob job = job_at(t);
        job.only_chunk = kci;
        job.partial = part + (t / n_blocks) * chunk_rows * (ld_part / 4) + (t % n_blocks) * nb;
        job.ld_partial = ld_part;
        run_row_block(exe, job);
      });
  }
}

}  // namespace ops

namespace {

// Batch entry b of a rank-3 view: the rank-2 view [dim 1, dim 2].
TensorView batch_entry(const TensorView& t, int64_t b) {
  const int64_t esz = t.dtype == DType::f32 ? 4 : 2;
  return TensorView(static_cast<uint8_t*>(t.data) + b * t.strides[0] * esz, t.dtype,
                    {t.shape[1], t.shape[2]}, {t.strides[1], t.strides[2]});
}

}  // namespace

void gemm_batched(const TensorView& x, const std::vector<PackedWeight>& w, const TensorView& y,
                  const GemmOptions& opt) {
  runtime::api_guard("gemm_batched", [&] {
    constexpr const char* op = "gemm_batched";
    ops::check_view(op, "x", x, 3);
    ops::check_dtype(op, "x", x, {DType::bf16});
    ops::check_view(op, "y", y, 3);
    ops::check_dtype(op, "y", y, {DType::bf16, DType::f32});
    const int64_t batch = x.shape[0];
    if (static_cast<int64_t>(w.size()) != batch)
      throw Error(fmt::format("{}: w holds {} weights; allowed: one per batch entry of x, B = {}",
                              op, w.size(), batch));
    if (y.shape[0] != batch)
      throw Error(fmt::format("{}: y has shape {}; allowed: [B, M, N] with B = {} (x)", op,
                              ops::shape_str(y.shape), batch));
    if (batch == 0) return;
    for (int64_t b = 0; b < batch; ++b) {
      const PackedWeight& wb = w[static_cast<size_t>(b)];
      if (b > 0 && !wb.empty() && !w[0].empty() &&
          (wb.n() != w[0].n() || wb.k() != w[0].k() || wb.impl()->format != w[0].impl()->format))
        throw Error(
            fmt::format("{}: w[{}] is {} [{}, {}] but w[0] is {} [{}, {}]; allowed: one "
                        "shape and format",
                        op, b, weight_format_name(wb.impl()->format), wb.n(), wb.k(),
                        weight_format_name(w[0].impl()->format), w[0].n(), w[0].k()));
      // Each entry as its own gemm (shapes, dtypes, strides, options, aliasing).
      try {
        check_gemm_args(batch_entry(x, b), wb, batch_entry(y, b), opt);
      } catch (const Error& e) {
        throw Error(fmt::format("{}: batch entry {}: {}", op, b, e.what()));
      }
    }
    // Across entries too: y[b] may not overlap another entry's x.
    ops::check_output(op, "y", y, {{"x", &x}, {"bias", ops::opt_view(opt.bias)}});
    const int64_t M = x.shape[1], N = w[0].n(), K = w[0].k();
    if (M == 0) return;
    const Isa path = runtime::active_isa();
    const codegen::GemmSpec spec = ops::bf16_gemm_spec(N, K, opt, y.dtype);
    const codegen::PlanOverrides& tuned = ops::tuned_gemm(path, spec, M);
    const Isa isa = codegen::gemm_isa_for_rows(path, M, tuned, spec.invariant);
    if (w[0].impl()->quant != nullptr || isa == Isa::scalar) {
      // Quantized weights (their own routes) and the scalar path: one gemm
      // per entry, the same result as the caller's own loop.
      for (int64_t b = 0; b < batch; ++b)
        gemm(batch_entry(x, b), w[static_cast<size_t>(b)], batch_entry(y, b), opt);
      return;
    }
    ops::GemmExecutable& exe = ops::gemm_executable(spec, isa, tuned);
    if (runtime::verbose_level() > 0)
      std::fprintf(stderr, "tilejit: gemm_batched B=%lld M=%lld N=%lld K=%lld path=%s plan=%s\n",
                   static_cast<long long>(batch), static_cast<long long>(M),
                   static_cast<long long>(N), static_cast<long long>(K), isa_name(isa),
                   exe.plan().name().c_str());
    std::vector<ops::GemmRun> runs;
    runs.reserve(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      ops::GemmRun r = ops::GemmRun::of(batch_entry(x, b), batch_entry(y, b), opt);
      const PackedWeight::Impl& p = *w[static_cast<size_t>(b)].impl();
      r.b = p.bytes();
      r.block_bytes = p.layout.block_elems() * 2;
      runs.push_back(std::move(r));
    }
    ops::run_gemm_batch(exe, runs);
  });
}

void gemm(const TensorView& x, const PackedWeight& w, const TensorView& y, const GemmOptions& opt) {
  runtime::api_guard("gemm", [&] {
    check_gemm_args(x, w, y, opt);
    const int64_t M = x.shape[0], N = w.n(), K = w.k();
    if (M == 0) return;
    const PackedWeight::Impl& p = *w.impl();
    if (p.quant != nullptr) return ops::gemm_quantized(x, p, y, opt);
    const Isa path = runtime::active_isa();
    const codegen::GemmSpec spec = ops::bf16_gemm_spec(N, K, opt, y.dtype);
    const codegen::PlanOverrides& tuned = ops::tuned_gemm(path, spec, M);
    const Isa isa = codegen::gemm_isa_for_rows(path, M, tuned, spec.invariant);
    if (isa == Isa::scalar) {
      ops::log_call("gemm", isa, [&] {
        return ops::CallLine{fmt::format("M={} N={} K={}", M, N, K), "plan=reference"};
      });
      return run_scalar(x, w, y, opt);
    }

    ops::GemmExecutable& exe = ops::gemm_executable(spec, isa, tuned);
    if (runtime::verbose_level() > 0)
      std::fprintf(stderr, "tilejit: gemm M=%lld N=%lld K=%lld path=%s plan=%s%s%s\n",
                   static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                   isa_name(isa), exe.plan().name().c_str(),
                   tuned.empty() ? "" : " tuned=", tuned.entry.c_str());
    ops::GemmRun r = ops::GemmRun::of(x, y, opt);
    r.b = p.bytes();
    r.block_bytes = p.layout.block_elems() * 2;
    ops::run_gemm_plan(exe, r);
  });
}

}  // namespace tilejit
