// W4A8: int4 (AWQ / GPTQ) weights against int8 activations (docs/quantized.md).
//
// At large M an int4 GEMM is compute-bound, and where the host's best dot
// product is integer (AVX2's vpmaddubsw, VNNI's vpdpbusd) the int4 codes are
// cheaper to multiply as bytes than dequantized to bf16 and multiplied in
// f32. Per call:
//   1. x is quantized per row (opt.act_quant: u8 codes, a scale and zero
//      point a row), after a gather into the "quad K order" when needed:
//      every scale group's run of the packed K order starts at a multiple of
//      16 and is zero-padded to one (so no k-quad and no 16-deep step of the
//      kernel straddles two groups);
//   2. per task (a 64-column block × a row chunk) and K chunk of whole runs,
//      the dequant kernel (out = i8) writes the codes as s8 q − z in the
//      int8 k-quad layout and each run's column sums Σ (q − z);
//   3. per row block, one W4A8 brgemm call per K chunk (BrgemmDesc::w4a8):
//      at the end of each run (BrgemmArgs::w4a8_scales) the group's exact
//      int32 sums, scaled by s_x · s_g, are added to the f32 sums of the
//      earlier groups; the last chunk's call applies bias, activation and
//      the output conversion.
// Padding positions of x are exactly 0 before quantization, so their codes
// equal the row's zero point and (x_q − z_x)·w is 0 whatever w is there;
// the chunk's own padding (an odd pair count, the run's tail to 16) is w = 0
// and out of the column sums.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/quant_desc.h"
#include "jit/registry.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "runtime/per_thread.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "runtime/scratch_limits.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit::ops {

namespace {

constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;
// K elements a run of the quad order is padded to: the vector kernels' 16-bit
// step (BrgemmDesc::w4a8), AMX's tile K step (64 bytes of u8).
int64_t quad_step(Isa kernel_isa) {
  return kernel_isa == Isa::amx ? 64 : 16;
}
// K of the s8 chunk a task converts at once (whole runs; a longer run is a
// chunk of its own): 128 KiB for a 64-column block, L2-resident.
constexpr int64_t kChunkK = 2048;

}  // namespace

// A scale group's run of k-pair rows in the packed K order and its place in
// the quad K order.
struct W4A8Run {
  int64_t pair0 = 0, pairs = 0;  // k-pair rows [pair0, pair0 + pairs) of the codes
  int32_t group = 0;             // the scales' row
  int64_t k0 = 0, klen = 0;      // quad-order K offset and length (multiples of quad_step)
};

struct W4A8Order {
  std::vector<W4A8Run> runs;
  // K chunks of whole runs, [first, end) run indices: each is converted to
  // s8 at once (kChunkK deep, or one longer run) and taken by one kernel
  // call per row block, which folds each run's scale group in turn.
  std::vector<std::pair<size_t, size_t>> chunks;
  int64_t k_total = 0;
  int64_t kb = 16;        // the kernels' K per batch item: divides every run's klen
  bool identity = false;  // the quad order is x's own K order: no gather
};

namespace {

W4A8Order quad_order(const PackedWeight::Impl& p, int64_t step) {
  const QuantTables& q = *p.quant;
  W4A8Order o;
  o.kb = step;
  // The k-pair rows that hold channels (q.groups goes on over the layout's
  // zero padding to whole K steps).
  const int64_t pairs = (q.k_packed + 1) / 2;
  for (int64_t r = 0; r < pairs;) {
    W4A8Run run;
    run.pair0 = r;
    run.group = q.groups[static_cast<size_t>(r)];
    while (r < pairs && q.groups[static_cast<size_t>(r)] == run.group) ++r;
    run.pairs = r - run.pair0;
    run.k0 = o.k_total;
    run.klen = (2 * run.pairs + step - 1) / step * step;
    o.k_total += run.klen;
    o.runs.push_back(run);
  }
  for (size_t c0 = 0; c0 < o.runs.size();) {
    size_t c1 = c0 + 1;
    while (c1 < o.runs.size() && o.runs[c1].k0 + o.runs[c1].klen - o.runs[c0].k0 <= kChunkK) ++c1;
    o.chunks.emplace_back(c0, c1);
    c0 = c1;
  }
  for (int64_t kb : {128, 64, 32}) {
    if (kb < step) break;
    if (std::all_of(o.runs.begin(), o.runs.end(),
                    [&](const W4A8Run& r) { return r.klen % kb == 0; })) {
      o.kb = kb;
      break;
    }
  }
  // No gather when x's K is the quad order with nothing to pad: every run
  // starts where the packed order puts it and K fills the last one.
  o.identity = q.perm.empty() && o.k_total == p.layout.k &&
               std::all_of(o.runs.begin(), o.runs.end(),
                           [](const W4A8Run& r) { return r.k0 == 2 * r.pair0; });
  return o;
}

// The roles of a K chunk's brgemm call: the first / a middle / the last
// chunk of the K sum, or the only one.
enum Role { kFirst = 0, kMiddle = 1, kLast = 2, kOnly = 3 };

Role role_of(size_t i, size_t n_chunks) {
  return n_chunks == 1 ? kOnly : i == 0 ? kFirst : i == n_chunks - 1 ? kLast : kMiddle;
}

// The int8 plan of `spec` (its outputs and epilogue: a GLU computes whole
// 64-column blocks, which sets the register budget of the rows) over the
// quad K order on the kernels' ISA: its row blocking (mr) and task rows.
codegen::GemmPlan w4a8_plan(const codegen::GemmSpec& spec, const W4A8Order& o, Isa kernel_isa) {
  codegen::GemmSpec s = spec;
  s.k = o.k_total;
  s.b_type = DType::i8;
  return codegen::plan_gemm(s, kernel_isa);
}

}  // namespace

bool w4a8_route(const PackedWeight::Impl& p, const GemmOptions& opt, Isa path, int64_t m) {
  return w4a8_route(p.format, p.layout.k, opt, path, m);
}

bool w4a8_route(const PackedWeight::Impl& p, const GemmOptions& opt, Isa path, int64_t m,
                const codegen::PlanOverrides& tuned) {
  return w4a8_route(p.format, p.layout.k, opt.int4_route, path, m, "gemm", tuned);
}

bool w4a8_route(WeightFormat format, int64_t k, Int4Route route, Isa path, int64_t m,
                const char* op, const codegen::PlanOverrides& tuned) {
  check_int4_route(route, op);
  if (route == Int4Route::automatic && tuned.w4a8 && is_int4(format) && k <= kW4A8MaxK &&
      w4a8_kernels_usable(path) && quant_routes_follow_rows())
    return *tuned.w4a8;
  return w4a8_route(format, k, route, path, m, op);
}

bool w4a8_route(WeightFormat format, int64_t k, const GemmOptions& opt, Isa path, int64_t m) {
  return w4a8_route(format, k, opt.int4_route, path, m, "gemm");
}

bool w4a8_automatic(Isa path, int64_t m) {
  // Measured (docs/quantized.md, "W4A8 against W4A16 by M"): on llvm W4A8
  // wins from 4 rows (1.6x on an AVX2 host, a tie on an AVX-512 one); on
  // avx512 the Xbyak fused decode kernel wins up to 8 rows, W4A8 beats it
  // from 9-10 and the dequant route (hosts without VBMI) from 4-5 rows. On
  // amx the AMX bf16 kernels stay (W4A8's AMX kernel is unmeasured). Without its
  // kernels W4A8 would be the scalar oracle: never automatic.
  if (m < kW4A8MinRows || !w4a8_kernels_usable(path) || !quant_routes_follow_rows()) return false;
  if (path == Isa::llvm) return true;
  if (path != Isa::avx512) return false;
  return !quant_gemm_fused(path, m) || m >= kW4A8MinRowsOverXbyakFused;
}

void check_int4_route(Int4Route route, const char* op) {
  if (route != Int4Route::automatic && route != Int4Route::w4a16 && route != Int4Route::w4a8)
    throw Error(
        fmt::format("{}: int4_route={} is not an Int4Route; allowed: automatic, w4a16, w4a8", op,
                    static_cast<int>(route)));
}

bool w4a8_route(WeightFormat format, int64_t k, Int4Route route, Isa path, int64_t m,
                const char* op) {
  check_int4_route(route, op);
  const bool w4a8 = route == Int4Route::w4a8 ||
                    (route == Int4Route::automatic && w4a8_automatic(path, m) && k <= kW4A8MaxK);
  if (!w4a8 || !is_int4(format)) return false;
  if (k > kW4A8MaxK)
    throw Error(fmt::format(
        "{}: int4_route=w4a8 with K={}; allowed: K <= {} (a scale group's int32 sums of "
        "u8 x 4-bit products stay exact up to there; int4_route=w4a16 takes any K)",
        op, k, kW4A8MaxK));
  return true;
}

bool w4a8_kernels_usable(Isa path) {
  switch (path) {
    case Isa::amx:
    case Isa::avx512:
      // The Xbyak kernels (AMX's tdpbusd, AVX-512 VNNI's vpdpbusd: each
      // part of its path's features), in every build.
      return runtime::usable_features().contains(runtime::isa_features(path));
    case Isa::llvm:
#ifdef TILEJIT_HAVE_LLVM
      return runtime::usable_features().contains(runtime::isa_features(Isa::llvm)) &&
             runtime::backend_choice() != runtime::BackendChoice::xbyak;
#else
      return false;
#endif
    default:
      return false;
  }
}

std::string w4a8_kernel_name(const PackedWeight::Impl& p, codegen::BiasKind bias, Activation act,
                             DType out, Isa path) {
  return W4A8Kernels(p, codegen::GemmSpec{p.layout.n, p.layout.k, bias, act, out}, 0, path, false)
      .name();
}

// ---- W4A8Kernels ---------------------------------------------------------------

W4A8Kernels::W4A8Kernels(const PackedWeight::Impl& p, const codegen::GemmSpec& spec, int64_t rows,
                         Isa path, bool compile)
    : o_(std::make_shared<const W4A8Order>(quad_order(p, quad_step(path)))),
      spec_(spec),
      isa_(path) {
  const QuantTables& q = *p.quant;
  const codegen::GemmPlan plan = w4a8_plan(spec_, *o_, isa_);
  mr_ = plan.mr;
  task_rows_ = plan.task_rows();
  // Tasks take whole mr blocks but the last one's (task_rows is a multiple of mr).
  rem_ = static_cast<int>(rows % mr_);
  if (!compile) return;
  // (The Xbyak dequant kernel serves the amx path too.)
  dequant_ = jit::get(codegen::DequantDesc{isa_ == Isa::llvm ? Isa::llvm : Isa::avx512, DType::u4,
                                           q.zeros != nullptr, q.normal_products, DType::i8})
                 .entry<codegen::DequantFn>();
  const bool glu = spec_.glu != codegen::Glu::none;
  const int64_t out_block = glu ? 32 : kBlockN;
  const size_t n_chunks = o_->chunks.size();
  for (int role = 0; role < 4; ++role) {
    const bool used =
        n_chunks == 1 ? role == kOnly : role != kOnly && (role != kMiddle || n_chunks > 2);
    for (int g = 0; g < 2 && used; ++g) {
      const int r = g == 0 ? mr_ : rem_;
      if (r == 0) continue;
      if (spec_.n >= out_block) k_[role][g][0] = &jit::get(desc(role, r, false));
      if (spec_.n % out_block != 0) k_[role][g][1] = &jit::get(desc(role, r, true));
    }
  }
}

int64_t W4A8Kernels::k_quad() const {
  return o_->k_total;
}

bool W4A8Kernels::identity() const {
  return o_->identity;
}

void W4A8Kernels::gather_row(const PackedWeight::Impl& p, const uint16_t* x, uint16_t* dst) const {
  const QuantTables& q = *p.quant;
  const int64_t K = p.layout.k;
  for (const W4A8Run& r : o_->runs) {
    int64_t k = 0;
    for (; k < 2 * r.pairs; ++k) {
      const int64_t pos = 2 * r.pair0 + k;
      const int64_t ch = q.perm.empty()     ? (pos < K ? pos : -1)
                         : pos < q.k_packed ? q.perm[pos]
                                            : -1;
      dst[r.k0 + k] = ch >= 0 ? x[ch] : 0;
    }
    for (; k < r.klen; ++k) dst[r.k0 + k] = 0;
  }
}

codegen::BrgemmDesc W4A8Kernels::desc(int role, int rows, bool n_tail) const {
  codegen::BrgemmDesc d;
  d.isa = isa_;
  d.a_type = DType::u8;
  d.b_type = DType::i8;
  d.acc_type = DType::i32;
  d.w4a8 = true;
  d.mr = rows;
  d.kb = o_->kb;
  d.b_row_bytes = codegen::PackedLayout::kRowBytes;
  d.accumulate = role == kMiddle || role == kLast;
  const bool final_call = role == kLast || role == kOnly;
  const bool glu = spec_.glu != codegen::Glu::none;
  // Outputs of this call: the earlier groups' f32 sums cover the whole
  // computed block (a GLU's gate and up: 64 columns); the last call writes
  // the spec's outputs.
  const int64_t cols = glu && !final_call ? kBlockN : glu ? 32 : kBlockN;
  d.nr = static_cast<int>(n_tail && !(glu && !final_call) ? spec_.n % cols : cols);
  d.out = final_call ? spec_.out : DType::f32;
  if (final_call) {
    d.bias = spec_.bias;
    d.act = spec_.act;
    d.glu = spec_.glu;
    d.glu_alpha = spec_.glu_alpha;
    d.glu_limit = spec_.glu_limit;
  }
  return d;
}

codegen::BrgemmFn W4A8Kernels::kernel(int role, int rows, bool n_tail) const {
  const int g = rows == mr_ ? 0 : rows == rem_ ? 1 : -1;
  const jit::Kernel* k = g >= 0 ? k_[role][g][n_tail ? 1 : 0] : nullptr;
  // Another remainder (a caller's rows split otherwise): the registry's cache.
  if (k == nullptr) k = &jit::get(desc(role, rows, n_tail));
  return k->entry<codegen::BrgemmFn>();
}

std::string W4A8Kernels::name() const {
  const bool full = spec_.n >= (spec_.glu != codegen::Glu::none ? 32 : kBlockN);
  return desc(o_->chunks.size() == 1 ? kOnly : kLast, mr_, !full).name();
}

void W4A8Kernels::run(const PackedWeight::Impl& p, int64_t block, bool n_tail, const uint8_t* a,
                      int64_t lda, const float* a_scale, const int32_t* a_zero, int64_t rows,
                      uint8_t* c, int64_t ldc, const void* bias) const {
  const QuantTables& q = *p.quant;
  const W4A8Order& o = *o_;
  const int64_t G = q.n_groups;
  const float* block_scales = q.scale_rows(block);  // int4: f32
  const uint8_t* block_zeros =
      q.zeros != nullptr ? reinterpret_cast<const uint8_t*>(q.zeros.get()) + block * G * kBlockN
                         : nullptr;
  const uint8_t* codes = p.bytes() + block * p.code_block_bytes();
  auto* partial = reinterpret_cast<float*>(packed_a_scratch(kQuantPartial, rows * kBlockN * 4));
  const size_t n_chunks = o.chunks.size();
  // Per batch item of a chunk's call: A's K offset, B's block, and the scale
  // and column-sum rows of the group it ends (null inside a group).
  auto& a_offs = runtime::per_thread<std::vector<int64_t>>([] {});
  auto& a_ptrs = runtime::per_thread<std::vector<const void*>>([] {});
  auto& b_ptrs = runtime::per_thread<std::vector<const void*>>([] {});
  auto& scale_rows = runtime::per_thread<std::vector<const float*>>([] {});
  auto& comp_rows = runtime::per_thread<std::vector<const int32_t*>>([] {});
  for (size_t ci = 0; ci < n_chunks; ++ci) {
    const auto [c0, c1] = o.chunks[ci];
    const int64_t ck0 = o.runs[c0].k0;
    const int64_t ck = o.runs[c1 - 1].k0 + o.runs[c1 - 1].klen - ck0;
    uint8_t* chunk = packed_a_scratch(kQuantB, ck * kBlockN + int64_t(c1 - c0) * kBlockN * 4);
    auto* comp = reinterpret_cast<int32_t*>(chunk + ck * kBlockN);
    a_offs.clear();
    b_ptrs.clear();
    scale_rows.clear();
    comp_rows.clear();
    for (size_t i = c0; i < c1; ++i) {
      const W4A8Run& r = o.runs[i];
      uint8_t* out = chunk + (r.k0 - ck0) * kBlockN;
      codegen::DequantArgs d{};
      d.codes = codes + r.pair0 * q.code_row_bytes;
      d.groups = q.groups.data() + r.pair0;
      d.scales = block_scales;
      d.zeros = block_zeros;
      d.out = out;
      d.rows = r.pairs;
      d.comp = comp + (i - c0) * kBlockN;
      dequant_(&d);
      // The run's padding to its step: weights 0 (quad rows of 256 bytes).
      const int64_t done = (r.pairs + 1) / 2 * 256;
      std::memset(out + done, 0, static_cast<size_t>(r.klen * kBlockN - done));
      const int64_t items = r.klen / o.kb;
      for (int64_t b = 0; b < items; ++b) {
        const bool end = b == items - 1;
        a_offs.push_back(r.k0 + b * o.kb);
        b_ptrs.push_back(out + b * o.kb * kBlockN);
        scale_rows.push_back(end ? block_scales + r.group * kBlockN : nullptr);
        comp_rows.push_back(end ? comp + (i - c0) * kBlockN : nullptr);
      }
    }
    const Role role = role_of(ci, n_chunks);
    const bool final_call = role == kLast || role == kOnly;
    a_ptrs.resize(a_offs.size());
    for (int64_t mb = 0; mb < rows; mb += mr_) {
      const int rr = static_cast<int>(std::min<int64_t>(mr_, rows - mb));
      const uint8_t* a_row = a + mb * lda;
      float* part = partial + mb * kBlockN;
      for (size_t t = 0; t < a_offs.size(); ++t) a_ptrs[t] = a_row + a_offs[t];
      codegen::BrgemmArgs args{};
      args.a = a_ptrs.data();
      args.b = b_ptrs.data();
      args.batch = static_cast<int64_t>(a_offs.size());
      args.lda = lda;
      args.c = final_call ? static_cast<void*>(c + mb * ldc) : part;
      args.ldc = final_call ? ldc : kBlockN * 4;
      args.bias = bias;
      args.acc_in = part;
      args.ld_acc_in = kBlockN * 4;
      args.a_scale = a_scale + mb;
      args.a_zero = a_zero + mb;
      args.w4a8_scales = scale_rows.data();
      args.w4a8_comps = comp_rows.data();
      kernel(role, rr, n_tail)(&args);
    }
  }
}

void run_scalar_w4a8(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
                     const GemmOptions& opt) {
  const int64_t M = x.shape[0], N = p.layout.n, K = p.layout.k;
  const auto* xs = static_cast<const uint16_t*>(x.data);
  std::vector<uint8_t> q(static_cast<size_t>(M * K));
  std::vector<float> sa(static_cast<size_t>(M));
  std::vector<int32_t> za(static_cast<size_t>(M));
  const runtime::ActQuantRule rule = act_quant_rule(act_quant_mode(opt.act_quant));
  runtime::parallel_for(M, [&](int64_t i) {
    runtime::reference_act_quant_row(rule, xs + i * x.strides[0], K, K, fixed_inv_scale(opt),
                                     opt.act_scale, opt.act_zero_point, &q[i * K], &sa[i], &za[i]);
  });
  const int64_t groups = p.quant->scales_in.shape[0];
  runtime::parallel_for(N, [&](int64_t j) {
    std::vector<Int4Term> w(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) w[k] = int4_term(p, j, k);
    std::vector<int64_t> sums(static_cast<size_t>(groups));
    std::vector<double> scale(static_cast<size_t>(groups));
    for (int64_t k = 0; k < K; ++k) scale[w[k].group] = w[k].scale;
    for (int64_t i = 0; i < M; ++i) {
      std::fill(sums.begin(), sums.end(), 0);
      for (int64_t k = 0; k < K; ++k)
        sums[w[k].group] += int64_t(q[i * K + k] - za[i]) * (w[k].code - w[k].zero);
      double acc = 0;
      for (int64_t g = 0; g < groups; ++g) acc += double(sums[g]) * scale[g];
      double v = acc * double(sa[i]);
      if (opt.bias)
        v += opt.bias->dtype == DType::f32
                 ? double(static_cast<const float*>(opt.bias->data)[j])
                 : double(runtime::bf16_to_f32(static_cast<const uint16_t*>(opt.bias->data)[j]));
      v = runtime::reference_activation(opt.act, v);
      if (y.dtype == DType::f32)
        static_cast<float*>(y.data)[i * y.strides[0] + j] = static_cast<float>(v);
      else
        static_cast<uint16_t*>(y.data)[i * y.strides[0] + j] =
            runtime::f32_to_bf16(static_cast<float>(v));
    }
  });
}

void run_w4a8(const TensorView& x, const PackedWeight::Impl& p, const TensorView& y,
              const GemmOptions& opt, Isa path) {
  const int64_t M = x.shape[0], N = p.layout.n, K = p.layout.k;
  const W4A8Kernels kern(p, codegen::GemmSpec{N, K, bias_kind(opt), opt.act, y.dtype}, M, path);
  const int64_t ldq = kern.ldq(), k_quad = kern.k_quad();
  const int64_t task_rows = kern.task_rows();
  const int64_t n_blocks = (N + kBlockN - 1) / kBlockN;
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr,
                 "tilejit: gemm w4a8 M=%lld N=%lld K=%lld path=%s weight=%s kernel=%s "
                 "(quad K %lld%s)\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                 isa_name(path), p.layout_name.c_str(), kern.name().c_str(),
                 static_cast<long long>(k_quad), kern.identity() ? "" : ", gathered");

  // Slices of M whose u8 copy (and gathered bf16 copy) stay within the kept scratch.
  const int64_t row_bytes = ldq + (kern.identity() ? 0 : 2 * k_quad);
  const int64_t slice_rows =
      std::max(task_rows, runtime::kScratchKeepBytes / row_bytes / task_rows * task_rows);
  std::vector<float> a_scale;
  std::vector<int32_t> a_zero;
  const int64_t y_elem = y.dtype == DType::f32 ? 4 : 2;
  const int64_t bias_elem = opt.bias && opt.bias->dtype == DType::f32 ? 4 : 2;

  for (int64_t s0 = 0; s0 < M; s0 += slice_rows) {
    const int64_t rows = std::min(slice_rows, M - s0);
    const auto* xs = static_cast<const uint16_t*>(x.data) + s0 * x.strides[0];
    int64_t ldx = x.strides[0], kx = K;
    if (!kern.identity()) {
      // x in the quad K order, padding positions exactly 0.
      auto* g = reinterpret_cast<uint16_t*>(packed_a_scratch(kQuantAPacked, rows * k_quad * 2));
      runtime::parallel_for(
          rows, [&](int64_t i) { kern.gather_row(p, xs + i * x.strides[0], g + i * k_quad); });
      xs = g;
      ldx = k_quad;
      kx = k_quad;
    }
    uint8_t* xq = packed_a_scratch(kQuantX, rows * ldq);
    a_scale.resize(static_cast<size_t>(rows));
    a_zero.resize(static_cast<size_t>(rows));
    quantize_rows(xs, ldx, rows, kx, ldq, opt, kern.isa(), xq, a_scale.data(), a_zero.data());

    const int64_t row_chunks = (rows + task_rows - 1) / task_rows;
    runtime::parallel_for(n_blocks * row_chunks, [&](int64_t t) {
      const int64_t nb = t % n_blocks, m0 = t / n_blocks * task_rows;
      const int64_t t_rows = std::min(task_rows, rows - m0);
      uint8_t* yb =
          static_cast<uint8_t*>(y.data) + ((s0 + m0) * y.strides[0] + nb * kBlockN) * y_elem;
      const void* bias =
          opt.bias ? static_cast<const uint8_t*>(opt.bias->data) + nb * kBlockN * bias_elem
                   : nullptr;
      kern.run(p, nb, nb == n_blocks - 1 && N % kBlockN != 0, xq + m0 * ldq, ldq,
               a_scale.data() + m0, a_zero.data() + m0, t_rows, yb, y.strides[0] * y_elem, bias);
    });
  }
}

}  // namespace tilejit::ops
