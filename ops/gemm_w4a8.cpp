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
//   3. per row block, one W4A8 brgemm call per run (BrgemmDesc::w4a8): the
//      exact int32 sums of the group, scaled by s_x · s_g and added to the f32
//      sums of the earlier groups; the last group's call applies bias,
//      activation and the output conversion.
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
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit::ops {

namespace {

constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;
constexpr int64_t kStep = 16;  // K elements of the kernel's 16-bit step (BrgemmDesc::w4a8)
// K of the s8 chunk a task converts at once (whole runs; a longer run is a
// chunk of its own): 128 KiB for a 64-column block, L2-resident.
constexpr int64_t kChunkK = 2048;

// A scale group's run of k-pair rows in the packed K order and its place in
// the quad K order.
struct Run {
  int64_t pair0 = 0, pairs = 0;  // k-pair rows [pair0, pair0 + pairs) of the codes
  int32_t group = 0;             // the scales' row
  int64_t k0 = 0, klen = 0;      // quad-order K offset and length (multiples of kStep)
};

struct QuadOrder {
  std::vector<Run> runs;
  int64_t k_total = 0;
  int64_t kb = kStep;     // the kernels' K per batch item: divides every run's klen
  bool identity = false;  // the quad order is x's own K order: no gather
};

QuadOrder quad_order(const PackedWeight::Impl& p) {
  const QuantTables& q = *p.quant;
  QuadOrder o;
  // The k-pair rows that hold channels (q.groups goes on over the layout's
  // zero padding to whole K steps).
  const int64_t pairs = (q.k_packed + 1) / 2;
  for (int64_t r = 0; r < pairs;) {
    Run run;
    run.pair0 = r;
    run.group = q.groups[static_cast<size_t>(r)];
    while (r < pairs && q.groups[static_cast<size_t>(r)] == run.group) ++r;
    run.pairs = r - run.pair0;
    run.k0 = o.k_total;
    run.klen = (2 * run.pairs + kStep - 1) / kStep * kStep;
    o.k_total += run.klen;
    o.runs.push_back(run);
  }
  for (int64_t kb : {128, 64, 32}) {
    if (std::all_of(o.runs.begin(), o.runs.end(), [&](const Run& r) { return r.klen % kb == 0; })) {
      o.kb = kb;
      break;
    }
  }
  // No gather when x's K is the quad order with nothing to pad: every run
  // starts where the packed order puts it and K fills the last one.
  o.identity =
      q.perm.empty() && o.k_total == p.layout.k &&
      std::all_of(o.runs.begin(), o.runs.end(), [](const Run& r) { return r.k0 == 2 * r.pair0; });
  return o;
}

// The kernels of one GEMM: per role (first / middle / last group, or the only
// one), rows 1..mr and the N tail, looked up once each.
enum Role { kFirst = 0, kMiddle = 1, kLast = 2, kOnly = 3 };

codegen::BrgemmDesc w4a8_desc(const QuadOrder& o, codegen::BiasKind bias, Activation act, DType out,
                              Role role, int rows, int cols) {
  codegen::BrgemmDesc d;
  d.isa = Isa::llvm;
  d.a_type = DType::u8;
  d.b_type = DType::i8;
  d.acc_type = DType::i32;
  d.w4a8 = true;
  d.mr = rows;
  d.nr = cols;
  d.kb = o.kb;
  d.b_row_bytes = codegen::PackedLayout::kRowBytes;
  d.accumulate = role == kMiddle || role == kLast;
  const bool final_call = role == kLast || role == kOnly;
  d.out = final_call ? out : DType::f32;
  if (final_call) {
    d.bias = bias;
    d.act = act;
  }
  return d;
}

// The int8 plan over the quad K order: its row blocking (mr) and task rows.
codegen::GemmPlan w4a8_plan(int64_t n, const QuadOrder& o) {
  codegen::GemmSpec spec{n, o.k_total};
  spec.b_type = DType::i8;
  return codegen::plan_gemm(spec, Isa::llvm);
}

}  // namespace

bool w4a8_route(const PackedWeight::Impl& p, const GemmOptions& opt, Isa path, int64_t m) {
  return w4a8_route(p.format, p.layout.k, opt, path, m);
}

bool w4a8_route(WeightFormat format, int64_t k, const GemmOptions& opt, Isa path, int64_t m) {
  bool w4a8 = false;
  switch (opt.int4_route) {
    case Int4Route::w4a16:
      break;
    case Int4Route::w4a8:
      w4a8 = true;
      break;
    case Int4Route::automatic:
      w4a8 = path == Isa::llvm && m >= kW4A8MinRows && k <= kW4A8MaxK;
      break;
    default:
      throw Error(
          fmt::format("gemm: int4_route={} is not an Int4Route; allowed: automatic, w4a16, w4a8",
                      static_cast<int>(opt.int4_route)));
  }
  if (!w4a8 || (format != WeightFormat::int4_awq && format != WeightFormat::int4_gptq))
    return false;
  if (k > kW4A8MaxK)
    throw Error(fmt::format(
        "gemm: int4_route=w4a8 with K={}; allowed: K <= {} (a scale group's int32 sums of "
        "u8 x 4-bit products stay exact up to there; int4_route=w4a16 takes any K)",
        k, kW4A8MaxK));
  return true;
}

bool w4a8_kernels_usable() {
#ifdef TILEJIT_HAVE_LLVM
  return runtime::usable_features().contains(runtime::isa_features(Isa::llvm)) &&
         runtime::backend_choice() != runtime::BackendChoice::xbyak;
#else
  return false;
#endif
}

std::string w4a8_kernel_name(const PackedWeight::Impl& p, codegen::BiasKind bias, Activation act,
                             DType out) {
  const QuadOrder o = quad_order(p);
  const codegen::GemmPlan plan = w4a8_plan(p.layout.n, o);
  return w4a8_desc(o, bias, act, out, o.runs.size() == 1 ? kOnly : kLast, plan.mr, 64).name();
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
              const GemmOptions& opt) {
  const QuantTables& q = *p.quant;
  const int64_t M = x.shape[0], N = p.layout.n, K = p.layout.k;
  const QuadOrder o = quad_order(p);
  const int64_t ldq = (o.k_total + 63) / 64 * 64;
  const codegen::GemmPlan plan = w4a8_plan(N, o);
  const int mr = plan.mr;
  const int64_t task_rows = plan.task_rows();
  const int64_t n_blocks = (N + kBlockN - 1) / kBlockN;
  const int n_tail = static_cast<int>(N % kBlockN);
  const auto dequant = jit::get(codegen::DequantDesc{Isa::llvm, DType::u4, q.zeros != nullptr,
                                                     q.normal_products, DType::i8})
                           .entry<codegen::DequantFn>();
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr,
                 "tilejit: gemm w4a8 M=%lld N=%lld K=%lld path=llvm weight=%s kernel=%s "
                 "(%zu groups, quad K %lld%s)\n",
                 static_cast<long long>(M), static_cast<long long>(N), static_cast<long long>(K),
                 p.layout_name.c_str(),
                 w4a8_kernel_name(p, bias_kind(opt), opt.act, y.dtype).c_str(), o.runs.size(),
                 static_cast<long long>(o.k_total), o.identity ? "" : ", gathered");

  // Slices of M whose u8 copy (and gathered bf16 copy) stay below 64 MiB.
  const int64_t row_bytes = ldq + (o.identity ? 0 : 2 * o.k_total);
  const int64_t slice_rows =
      std::max(task_rows, (int64_t{64} << 20) / row_bytes / task_rows * task_rows);
  std::vector<float> a_scale;
  std::vector<int32_t> a_zero;
  const int64_t y_elem = y.dtype == DType::f32 ? 4 : 2;
  const int64_t bias_elem = opt.bias && opt.bias->dtype == DType::f32 ? 4 : 2;
  const int64_t G = q.n_groups;
  const auto* scales = reinterpret_cast<const float*>(q.scales.get());
  const auto* zeros = reinterpret_cast<const uint8_t*>(q.zeros.get());

  for (int64_t s0 = 0; s0 < M; s0 += slice_rows) {
    const int64_t rows = std::min(slice_rows, M - s0);
    const auto* xs = static_cast<const uint16_t*>(x.data) + s0 * x.strides[0];
    int64_t ldx = x.strides[0], kx = K;
    if (!o.identity) {
      // x in the quad K order, padding positions exactly 0.
      auto* g = reinterpret_cast<uint16_t*>(packed_a_scratch(kQuantAPacked, rows * o.k_total * 2));
      runtime::parallel_for(rows, [&](int64_t i) {
        const uint16_t* src = xs + i * x.strides[0];
        uint16_t* dst = g + i * o.k_total;
        for (const Run& r : o.runs) {
          int64_t k = 0;
          for (; k < 2 * r.pairs; ++k) {
            const int64_t pos = 2 * r.pair0 + k;
            const int64_t ch = q.perm.empty()     ? (pos < K ? pos : -1)
                               : pos < q.k_packed ? q.perm[pos]
                                                  : -1;
            dst[r.k0 + k] = ch >= 0 ? src[ch] : 0;
          }
          for (; k < r.klen; ++k) dst[r.k0 + k] = 0;
        }
      });
      xs = g;
      ldx = o.k_total;
      kx = o.k_total;
    }
    uint8_t* xq = packed_a_scratch(kQuantX, rows * ldq);
    a_scale.resize(static_cast<size_t>(rows));
    a_zero.resize(static_cast<size_t>(rows));
    quantize_rows(xs, ldx, rows, kx, ldq, opt, Isa::llvm, xq, a_scale.data(), a_zero.data());

    const int64_t row_chunks = (rows + task_rows - 1) / task_rows;
    runtime::parallel_for(n_blocks * row_chunks, [&](int64_t t) {
      const int64_t nb = t % n_blocks, m0 = t / n_blocks * task_rows;
      const int64_t t_rows = std::min(task_rows, rows - m0);
      const int cols = nb == n_blocks - 1 && n_tail != 0 ? n_tail : static_cast<int>(kBlockN);
      auto* partial = reinterpret_cast<float*>(packed_a_scratch(kQuantPartial, t_rows * 256));
      // The kernels this task calls, by role and rows (cols is the task's).
      const jit::Kernel* kernels[4][33] = {};  // rows <= mr <= 32
      auto kernel = [&](Role role, int r) {
        const jit::Kernel*& k = kernels[role][r];
        if (k == nullptr)
          k = &jit::get(w4a8_desc(o, bias_kind(opt), opt.act, y.dtype, role, r, cols));
        return k->entry<codegen::BrgemmFn>();
      };
      const float* block_scales = scales + nb * G * kBlockN;
      const uint8_t* block_zeros = zeros != nullptr ? zeros + nb * G * kBlockN : nullptr;
      const uint8_t* codes = p.bytes() + nb * p.code_block_bytes();
      uint8_t* yb =
          static_cast<uint8_t*>(y.data) + ((s0 + m0) * y.strides[0] + nb * kBlockN) * y_elem;
      const void* bias =
          opt.bias ? static_cast<const uint8_t*>(opt.bias->data) + nb * kBlockN * bias_elem
                   : nullptr;
      const size_t n_runs = o.runs.size();
      std::vector<const void*> a_ptrs, b_ptrs;
      for (size_t c0 = 0; c0 < n_runs;) {
        // A K chunk of whole runs.
        size_t c1 = c0 + 1;
        while (c1 < n_runs && o.runs[c1].k0 + o.runs[c1].klen - o.runs[c0].k0 <= kChunkK) ++c1;
        const int64_t ck0 = o.runs[c0].k0;
        const int64_t ck = o.runs[c1 - 1].k0 + o.runs[c1 - 1].klen - ck0;
        uint8_t* chunk = packed_a_scratch(kQuantB, ck * kBlockN + (c1 - c0) * kBlockN * 4);
        auto* comp = reinterpret_cast<int32_t*>(chunk + ck * kBlockN);
        for (size_t i = c0; i < c1; ++i) {
          const Run& r = o.runs[i];
          uint8_t* out = chunk + (r.k0 - ck0) * kBlockN;
          codegen::DequantArgs d{};
          d.codes = codes + r.pair0 * q.code_row_bytes;
          d.groups = q.groups.data() + r.pair0;
          d.scales = block_scales;
          d.zeros = block_zeros;
          d.out = out;
          d.rows = r.pairs;
          d.comp = comp + (i - c0) * kBlockN;
          dequant(&d);
          // The run's padding to kStep: weights 0 (quad rows of 256 bytes).
          const int64_t done = (r.pairs + 1) / 2 * 256;
          std::memset(out + done, 0, static_cast<size_t>(r.klen * kBlockN - done));
        }
        for (int64_t mb = 0; mb < t_rows; mb += mr) {
          const int rr = static_cast<int>(std::min<int64_t>(mr, t_rows - mb));
          const uint8_t* a_row = xq + (m0 + mb) * ldq;
          float* part = partial + mb * kBlockN;
          for (size_t i = c0; i < c1; ++i) {
            const Run& r = o.runs[i];
            const Role role = n_runs == 1       ? kOnly
                              : i == 0          ? kFirst
                              : i == n_runs - 1 ? kLast
                                                : kMiddle;
            const int64_t batch = r.klen / o.kb;
            a_ptrs.resize(static_cast<size_t>(batch));
            b_ptrs.resize(static_cast<size_t>(batch));
            for (int64_t b = 0; b < batch; ++b) {
              a_ptrs[b] = a_row + r.k0 + b * o.kb;
              b_ptrs[b] = chunk + (r.k0 - ck0 + b * o.kb) * kBlockN;
            }
            const bool final_call = role == kLast || role == kOnly;
            codegen::BrgemmArgs args{};
            args.a = a_ptrs.data();
            args.b = b_ptrs.data();
            args.batch = batch;
            args.lda = ldq;
            args.c = final_call ? static_cast<void*>(yb + mb * y.strides[0] * y_elem) : part;
            args.ldc = final_call ? y.strides[0] * y_elem : kBlockN * 4;
            args.bias = bias;
            args.acc_in = part;
            args.ld_acc_in = kBlockN * 4;
            args.a_scale = a_scale.data() + m0 + mb;
            args.a_zero = a_zero.data() + m0 + mb;
            args.b_scale = block_scales + r.group * kBlockN;
            args.b_comp = comp + (i - c0) * kBlockN;
            kernel(role, rr)(&args);
          }
        }
        c0 = c1;
      }
    });
  }
}

}  // namespace tilejit::ops
