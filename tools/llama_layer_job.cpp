// The main job: one Llama-3-8B decoder layer as an engine runs it, op by op
// in execution order (GEMMs, RoPE, attention), each op JIT-compiled, checked
// against its scalar reference and timed. One function per kind of row
// (gemm_rows, rope_rows, decode_row, prefill_row); a new kind of layer op
// is one more such function and one more entry in the layer list of
// run_llama_layer_job. After the dense layer, one MoE block (moe_rows: router
// and fused experts, bf16 and, by --moe-weights, quantized: quant_moe_rows).
// docs/tool.md explains every row.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "codegen/llvm/llvm_rope.h"
#include "jit/peak.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/attention_descs.h"
#include "ops/gemm_executable.h"
#include "ops/quant_weight.h"
#include "ops/rope_desc.h"
#include "ops/rowwise_desc.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_quant.h"
#include "runtime/reference_rope.h"
#include "runtime/reference_rowwise.h"
#include "runtime/thread_pool.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/program/reference_rows.h"
#include "tools/program_io.h"
#include "tools/random_data.h"

namespace tilejit::tools {
namespace {

// Llama-3-8B: hidden 4096, 32 query heads and 8 kv heads of 128, MLP 14336,
// RoPE over the whole head (neox), 8192 positions.
constexpr int64_t kHidden = 4096, kHq = 32, kHkv = 8, kHeadDim = 128;
constexpr int64_t kQkvWidth = (kHq + 2 * kHkv) * kHeadDim;  // 6144: the fused qkv_proj output
constexpr int64_t kMaxPosition = 8192;
constexpr double kRopeTheta = 500000;
// Decode rows: every sequence has this many keys, the new token's included
// (the new token sits at position kDecodeContext − 1), in vLLM's 16-slot blocks.
constexpr int64_t kDecodeContext = 4096, kBlockSize = 16;

// What the whole job shares: the machine's limits and the options.
struct Env {
  CpuInfo cpu;
  double peak_gflops = 0;  // measured bf16 compute peak, all threads
  double peak_int8 = 0;    // measured int8 peak (GOP/s), all threads: W8A8 / W4A8 rows
  double read_gbs = 0;     // measured streaming-read bandwidth, all threads
  LlamaJobOptions opt;
};

// One row of the table.
struct Row {
  std::string op;
  int64_t m = 0;       // tokens of the engine step
  std::string shape;   // what the op computes, in its own terms
  std::string kernel;  // the kernel (or plan) name, or what runs instead
  double seconds = 0;  // per call, median of the timed batches
  double rate = 0;
  bool bytes = false;  // rate is GB/s (memory-bound op), else GFLOP/s
  bool int8 = false;   // GFLOP/s of int8 kernels (W8A8, W4A8): %peak of the int8 peak
  double compile_ms = 0;
  uint64_t hits = 0;
  std::string check;
  bool ok = true;
  std::string note;  // printed after the check (the GEMMs' weight GB/s at M = 1)
};

double bf(uint16_t h) {
  return runtime::bf16_to_f32(h);
}

// Streaming read bandwidth: every thread sums its slice of a 512 MiB buffer
// (far past any cache); best of 3. The yardstick of the GB/s rows.
double measure_read_gbs() {
  const size_t n = size_t{64} << 20;  // uint64 elements
  std::vector<uint64_t> buf(n, 1);
  const int64_t parts = runtime::num_threads();
  std::vector<uint64_t> sums(static_cast<size_t>(parts));
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    runtime::parallel_for(parts, [&](int64_t p) {
      const size_t b = n * static_cast<size_t>(p) / static_cast<size_t>(parts);
      const size_t e = n * static_cast<size_t>(p + 1) / static_cast<size_t>(parts);
      sums[static_cast<size_t>(p)] = std::accumulate(buf.begin() + b, buf.begin() + e, uint64_t{0});
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, double(n * 8) / s / 1e9);
  }
  if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) != n) return 0;  // keeps the reads
  return best;
}

// Times `call` (already run once: compiled, warm). One sizing batch, then 4
// batches of >= seconds/5 each; the median seconds per call (upper-middle
// rate, as the GEMM rows have always reported).
double seconds_per_call(const std::function<void()>& call, double seconds) {
  int64_t per_batch = 1;
  std::vector<double> times;
  for (int b = 0; b < 5; ++b) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t i = 0; i < per_batch; ++i) call();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (b == 0)
      per_batch = calls_for_budget(seconds / 5, s);
    else
      times.push_back(s / double(per_batch));
  }
  std::sort(times.begin(), times.end());
  return times[1];
}

// Receives each row as soon as it is measured (the table prints as it goes).
using Emit = std::function<void(const Row&)>;

// Runs the first call (compiles what it needs), then times the op; fills the
// row's time, compile time and the cache hits of the timed calls.
template <class Check>
void measure(Row& row, const Env& env, const std::function<void()>& call, Check check) {
  const CacheStats before = cache_stats();
  call();
  const CacheStats after_first = cache_stats();
  row.compile_ms = (after_first.compile_seconds - before.compile_seconds) * 1e3;
  if (env.opt.check) {
    double max_err = 0;
    row.ok = check(&max_err);
    row.check = fmt::format("{} (max err {:.2g})", row.ok ? "ok" : "FAIL", max_err);
  } else {
    row.check = "skipped";
  }
  row.seconds = seconds_per_call(call, env.opt.seconds);
  row.hits = cache_stats().hits - after_first.hits;
}

// ---- GEMM rows ---------------------------------------------------------------

struct LayerGemm {
  const char* name;
  int64_t n, k;
  Activation act;
};

// Checks rows {0, M/2, M-1} of y against the reference under the gemm bound
// of runtime/reference_error_bounds.h (fp32 accumulation (K+2)·2⁻²⁴·Σ|x·w|
// through the activation, its vector math at the pre-activation, one bf16 ulp
// of the output).
bool check_gemm_rows(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                     const std::vector<uint16_t>& y, int64_t m, const LayerGemm& g,
                     double* max_err) {
  std::vector<int64_t> rows = {0, m / 2, m - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  bool ok = true;
  *max_err = 0;
  for (int64_t r : rows) {
    std::vector<uint16_t> ref(g.n);
    runtime::ReferenceGemmArgs a;
    a.x = x.data() + r * g.k;
    a.ldx = g.k;
    a.m = 1;
    a.n = g.n;
    a.k = g.k;
    a.act = g.act;
    a.y = ref.data();
    a.y_dtype = DType::bf16;
    a.ldy = g.n;
    runtime::reference_gemm(a, [&](int64_t n, int64_t k) { return w[n * g.k + k]; });
    for (int64_t j = 0; j < g.n; ++j) {
      double abs_sum = 0, pre = 0;
      for (int64_t kk = 0; kk < g.k; ++kk) {
        const double t = bf(x[r * g.k + kk]) * bf(w[j * g.k + kk]);
        abs_sum += std::fabs(t);
        pre += t;
      }
      const double want = bf(ref[j]);
      const double got = bf(y[r * g.n + j]);
      const double tol = runtime::gemm_output_bound(g.act, DType::bf16, g.k, abs_sum, 0, pre, want);
      const double err = std::fabs(got - want);
      *max_err = std::max(*max_err, err);
      if (!(err <= tol)) ok = false;
    }
  }
  return ok;
}

// ---- quantized GEMM rows (--weights int8 | fp8 | int4) --------------------------

// The checkpoint formats of the quantized rows: the GEMM rows' int8 / fp8 /
// int4 are int8, fp8_block and gptq; the MoE rows take every one.
enum class QKind { int8, fp8_channel, fp8_block, gptq, awq, mxfp4 };

// A quantized checkpoint of one [N, K] matrix, built from random codes the
// way tests/quant_gemm_test.cpp's make_checkpoint does (scales 2^e·(1 + m/8),
// exact in every scale dtype; weights about as large as the bf16 rows' ±1/16).
struct QuantCheckpoint {
  QKind kind = QKind::int8;
  int64_t n = 0, k = 0;
  std::vector<int8_t> i8;
  std::vector<uint8_t> f8;  // fp8 codes [N, K]; MXFP4 blocks [N, ⌈K/32⌉, 16]
  std::vector<int32_t> qweight, qzeros;
  std::vector<float> scales;
  std::vector<uint8_t> e8m0;              // MXFP4 scales [N, ⌈K/32⌉]
  static constexpr int64_t kBlock = 128;  // fp8 block scales and int4 groups

  int64_t groups() const { return (k + kBlock - 1) / kBlock; }
  // int4: code q and zero point z of w[r, c] = (q − z)·s.
  int q4(int64_t r, int64_t c) const {
    if (kind == QKind::awq)
      return int(static_cast<uint32_t>(qweight[c * ((n + 7) / 8) + r / 8]) >>
                 (4 * runtime::kAwqNibble[r % 8])) &
             0xF;
    return int(static_cast<uint32_t>(qweight[(c / 8) * n + r]) >> (4 * (c % 8))) & 0xF;
  }
  int z4(int64_t r, int64_t c) const {
    const uint32_t word = static_cast<uint32_t>(qzeros[(c / kBlock) * ((n + 7) / 8) + r / 8]);
    if (kind == QKind::awq) return int(word >> (4 * runtime::kAwqNibble[r % 8])) & 0xF;
    return (int(word >> (4 * (r % 8))) & 0xF) + 1;  // GPTQ v1 stores z − 1
  }

  // The exact logical weight w[r, c] (code times scale, in double).
  double w(int64_t r, int64_t c) const {
    switch (kind) {
      case QKind::int8:
        return double(i8[r * k + c]) * scales[r];
      case QKind::fp8_channel:
        return double(runtime::e4m3_to_f32(f8[r * k + c])) * scales[r];
      case QKind::fp8_block:
        return double(runtime::e4m3_to_f32(f8[r * k + c])) *
               scales[(r / kBlock) * groups() + c / kBlock];
      case QKind::mxfp4: {
        const int64_t kb = (k + 31) / 32;
        const int q = (f8[(r * kb + c / 32) * 16 + c % 32 / 2] >> (4 * (c % 2))) & 0xF;
        return double(runtime::e2m1_to_f32(static_cast<uint8_t>(q))) *
               std::ldexp(1.0, e8m0[r * kb + c / 32] - 127);
      }
      default:
        return double(q4(r, c) - z4(r, c)) * scales[(c / kBlock) * n + r];
    }
  }
  // The magnitude of w[r, c]'s terms in the kernels' fp32 sums: |w|, but the
  // fused int4 kernel sums a·(16 + q) and (16 + z)·Σa (tests/moe_quant_test.cpp):
  // (q + z + 32)·s.
  double mag(int64_t r, int64_t c, bool fused) const {
    if (!fused || (kind != QKind::gptq && kind != QKind::awq)) return std::fabs(w(r, c));
    return double(q4(r, c) + z4(r, c) + 32) * scales[(c / kBlock) * n + r];
  }
};

float quant_scale(uint64_t bits, int exp) {
  return std::ldexp(1.0f + static_cast<float>(bits % 8) / 8.0f, exp);
}

QuantCheckpoint make_checkpoint(QKind f, int64_t n, int64_t k, uint64_t seed) {
  QuantCheckpoint ck;
  ck.kind = f;
  ck.n = n;
  ck.k = k;
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  auto next = [&] {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  const int64_t kb = QuantCheckpoint::kBlock, g = ck.groups(), n8 = (n + 7) / 8;
  switch (f) {
    case QKind::int8:
      ck.i8.resize(static_cast<size_t>(n * k));
      for (auto& v : ck.i8) v = static_cast<int8_t>(next() >> 56);
      ck.scales.resize(static_cast<size_t>(n));
      for (auto& v : ck.scales) v = quant_scale(next(), -12);  // |w| <= 128·2^-12·2 = 1/16
      break;
    case QKind::fp8_channel:
    case QKind::fp8_block: {
      ck.f8.resize(static_cast<size_t>(n * k));
      for (auto& v : ck.f8) {
        do v = static_cast<uint8_t>(next() >> 56);
        while ((v & 0x7F) == 0x7F);  // no NaN codes
      }
      ck.scales.resize(static_cast<size_t>(f == QKind::fp8_block ? ((n + kb - 1) / kb) * g : n));
      for (auto& v : ck.scales) v = quant_scale(next(), -12);
      break;
    }
    case QKind::mxfp4: {
      const int64_t kb32 = (k + 31) / 32;
      ck.f8.resize(static_cast<size_t>(n * kb32 * 16));
      for (auto& v : ck.f8) v = static_cast<uint8_t>(next() >> 56);
      if (k % 32 != 0)  // codes past K are zero
        for (int64_t r = 0; r < n; ++r)
          for (int64_t c = k; c < kb32 * 32; ++c)
            ck.f8[(r * kb32 + c / 32) * 16 + c % 32 / 2] &=
                static_cast<uint8_t>(0xF0 >> (4 * (c % 2)));
      ck.e8m0.resize(static_cast<size_t>(n * kb32));
      for (auto& v : ck.e8m0) v = static_cast<uint8_t>(127 - 7 + int(next() % 2));  // |w| <= 6·2^-6
      break;
    }
    default:
      ck.qweight.resize(static_cast<size_t>(f == QKind::awq ? k * n8 : ((k + 7) / 8) * n));
      for (auto& v : ck.qweight) v = static_cast<int32_t>(next() >> 32);
      ck.qzeros.resize(static_cast<size_t>(g * n8));
      for (auto& v : ck.qzeros) v = static_cast<int32_t>(next() >> 32);
      ck.scales.resize(static_cast<size_t>(g * n));
      for (auto& v : ck.scales) v = quant_scale(next(), -8);
      break;
  }
  return ck;
}

// The checkpoint's tensors as the library's weight descriptions (views into ck).
Int8Weight int8_weight(const QuantCheckpoint& ck) {
  return Int8Weight{TensorView(ck.i8.data(), DType::i8, {ck.n, ck.k}),
                    TensorView(ck.scales.data(), DType::f32, {ck.n})};
}

Fp8Weight fp8_weight(const QuantCheckpoint& ck) {
  const int64_t kb = QuantCheckpoint::kBlock;
  Fp8Weight w;
  w.weight = TensorView(ck.f8.data(), DType::f8e4m3, {ck.n, ck.k});
  const float* sc = ck.scales.data();
  if (ck.kind == QKind::fp8_block) {
    w.scales = TensorView(sc, DType::f32, {(ck.n + kb - 1) / kb, ck.groups()});
    w.block_n = kb;
    w.block_k = kb;
  } else {
    w.scales = TensorView(sc, DType::f32, {ck.n});
  }
  return w;
}

Int4Weight int4_weight(const QuantCheckpoint& ck) {
  const int64_t n = ck.n, k = ck.k, g = ck.groups(), n8 = (n + 7) / 8;
  const bool awq = ck.kind == QKind::awq;
  Int4Weight w;
  w.format = awq ? Int4Format::awq : Int4Format::gptq;
  const int32_t* qw = ck.qweight.data();
  w.qweight =
      awq ? TensorView(qw, DType::i32, {k, n8}) : TensorView(qw, DType::i32, {(k + 7) / 8, n});
  w.scales = TensorView(ck.scales.data(), DType::f32, {g, n});
  w.qzeros = TensorView(ck.qzeros.data(), DType::i32, {g, n8});
  w.group_size = QuantCheckpoint::kBlock;
  w.n = n;
  w.k = k;
  return w;
}

Mxfp4Weight mxfp4_weight(const QuantCheckpoint& ck) {
  const int64_t kb32 = (ck.k + 31) / 32;
  Mxfp4Weight w;
  w.blocks = TensorView(ck.f8.data(), DType::u8, {ck.n, kb32, 16});
  w.scales = TensorView(ck.e8m0.data(), DType::u8, {ck.n, kb32});
  w.k = ck.k;
  return w;
}

PackedWeight pack_checkpoint(const QuantCheckpoint& ck) {
  switch (ck.kind) {
    case QKind::int8:
      return pack_weight(int8_weight(ck));
    case QKind::fp8_channel:
    case QKind::fp8_block:
      return pack_weight(fp8_weight(ck));
    case QKind::mxfp4:
      return pack_weight(mxfp4_weight(ck));
    default:
      return pack_weight(int4_weight(ck));
  }
}

// Rows {0, M/2, M-1} of y against the exact dequantized weights under
// gemm_output_bound + dequant_weight_bound (fp8, int4; the kernels round w to
// bf16), or for W8A8 against the exact integer sums of the codes
// runtime::reference_act_quant_row makes, under int8_output_bound
// (runtime/reference_error_bounds.h), as tests/quant_gemm_test.cpp checks.
bool check_quant_rows(const std::vector<uint16_t>& x, const QuantCheckpoint& ck,
                      const std::vector<uint16_t>& y, int64_t m, const LayerGemm& g, Isa isa,
                      bool w4a8, double* max_err) {
  std::vector<int64_t> rows = {0, m / 2, m - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  std::vector<double> errs(rows.size() * g.n), tols(errs.size());
  runtime::parallel_for(static_cast<int64_t>(rows.size()) * g.n, [&](int64_t t) {
    const int64_t ri = t / g.n, j = t % g.n, r = rows[ri];
    const uint16_t* xr = x.data() + r * g.k;
    double ref, tol;
    if (ck.kind == QKind::int8) {
      std::vector<uint8_t> q(static_cast<size_t>(g.k));
      float sa = 1;
      int32_t za = 0;
      runtime::reference_act_quant_row(runtime::ActQuantRule::sym, xr, g.k, g.k, 1, 1, 128,
                                       q.data(), &sa, &za);
      int64_t acc = 0, wabs = 0;
      for (int64_t c = 0; c < g.k; ++c) {
        const int64_t p = int64_t(q[c] - za) * ck.i8[j * g.k + c];
        acc += p;
        wabs += p < 0 ? -p : p;
      }
      const double sw = ck.scales[j];
      const double pre = double(acc) * sa * sw;
      ref = runtime::reference_activation(g.act, pre);
      tol = runtime::int8_output_bound(g.act, DType::bf16, double(wabs) * sa * sw, 0, pre, ref);
    } else {
      double pre = 0, abs_sum = 0;
      for (int64_t c = 0; c < g.k; ++c) {
        const double p = bf(xr[c]) * ck.w(j, c);
        pre += p;
        abs_sum += std::fabs(p);
      }
      ref = runtime::reference_activation(g.act, pre);
      tol = runtime::gemm_output_bound(g.act, DType::bf16, g.k, abs_sum, 0, pre, ref);
      if (w4a8) {
        // x quantized per row (sym): half a code per element, then the
        // group folds' roundings (docs/quantized.md, W4A8).
        std::vector<uint8_t> q(static_cast<size_t>(g.k));
        float sa = 1;
        int32_t za = 0;
        runtime::reference_act_quant_row(runtime::ActQuantRule::sym, xr, g.k, g.k, 1, 1, 128,
                                         q.data(), &sa, &za);
        double w_abs = 0;
        for (int64_t c = 0; c < g.k; ++c) w_abs += std::fabs(ck.w(j, c));
        tol += runtime::w4a8_activation_bound(g.act, sa, w_abs, pre) +
               runtime::w4a8_output_bound(g.act, DType::bf16, ck.groups(),
                                          abs_sum + 0.51 * sa * w_abs, 0, pre, ref);
      } else if (isa != Isa::scalar) {
        tol += runtime::dequant_weight_bound(g.act, abs_sum, pre) * 1.01;
      }
    }
    errs[t] = std::fabs(bf(y[r * g.n + j]) - ref);
    tols[t] = tol;
  });
  bool ok = true;
  *max_err = 0;
  for (size_t i = 0; i < errs.size(); ++i) {
    *max_err = std::max(*max_err, errs[i]);
    if (!(errs[i] <= tols[i])) ok = false;
  }
  return ok;
}

// --weights: the GEMM rows' checkpoint format.
QKind gemm_weight_kind(const std::string& w) {
  if (w == "int8") return QKind::int8;
  if (w == "fp8") return QKind::fp8_block;
  return QKind::gptq;
}

// The weight stream of a decode step: packed bytes (codes, scales, zeros) per second.
std::string weight_note(const PackedWeight& pw, const Row& row) {
  if (row.m != 1) return "";
  return fmt::format("weights {:.1f} GB/s ({:.1f} MB {})",
                     double(pw.packed_bytes()) / row.seconds / 1e9, double(pw.packed_bytes()) / 1e6,
                     weight_format_name(pw.format()));
}

void quant_gemm_rows(const Env& env, const LayerGemm& g, const std::vector<int64_t>& ms,
                     uint64_t seed, const Emit& emit) {
  const QuantCheckpoint ck = make_checkpoint(gemm_weight_kind(env.opt.weights), g.n, g.k, seed);
  const PackedWeight pw = pack_checkpoint(ck);
  for (int64_t m : ms) {
    // What ops/gemm_quant.cpp runs (docs/quantized.md).
    const std::string kernel = ops::quant_gemm_kernel_name(*pw.impl(), codegen::BiasKind::none,
                                                           g.act, DType::bf16, env.cpu.isa, m);
    const auto x = random_bf16(size_t(m) * g.k, seed + 1 + uint64_t(m), 1.0f);
    std::vector<uint16_t> y(static_cast<size_t>(m * g.n));
    const TensorView xv(x.data(), DType::bf16, {m, g.k});
    const TensorView yv(y.data(), DType::bf16, {m, g.n});
    const GemmOptions go{.bias = std::nullopt, .act = g.act};
    Row row{.op = g.name,
            .m = m,
            .shape = fmt::format("N={} K={} {}", g.n, g.k, env.opt.weights),
            .kernel = kernel};
    // W8A8, and int4 on the W4A8 route, run the int8 kernels.
    row.int8 = pw.format() == WeightFormat::int8 ||
               ops::w4a8_route(*pw.impl(), go, ops::quant_rows_isa(env.cpu.isa, m), m);
    measure(
        row, env, [&] { gemm(xv, pw, yv, go); },
        [&](double* err) {
          return check_quant_rows(x, ck, y, m, g, env.cpu.isa,
                                  row.int8 && pw.format() != WeightFormat::int8, err);
        });
    row.rate = 2.0 * double(m) * double(g.n) * double(g.k) / row.seconds / 1e9;
    row.note = weight_note(pw, row);
    emit(row);
  }
}

// y[M, N] = x[M, K] · wᵀ for each M; the weight is packed once, as at model load.
void gemm_rows(const Env& env, const LayerGemm& g, const std::vector<int64_t>& ms, uint64_t seed,
               const Emit& emit) {
  if (env.opt.weights != "bf16") return quant_gemm_rows(env, g, ms, seed, emit);
  const auto w = random_bf16(size_t(g.n) * g.k, seed, 1.0f / 16);
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {g.n, g.k}));
  const std::string kernel =
      env.cpu.isa == Isa::scalar
          ? std::string("scalar reference")
          : ops::gemm_executable({g.n, g.k, codegen::BiasKind::none, g.act, DType::bf16},
                                 env.cpu.isa)
                .plan()
                .name();
  for (int64_t m : ms) {
    const auto x = random_bf16(size_t(m) * g.k, seed + 1 + uint64_t(m), 1.0f);
    std::vector<uint16_t> y(static_cast<size_t>(m * g.n));
    const TensorView xv(x.data(), DType::bf16, {m, g.k});
    const TensorView yv(y.data(), DType::bf16, {m, g.n});
    const GemmOptions go{.bias = std::nullopt, .act = g.act};
    Row row{.op = g.name, .m = m, .shape = fmt::format("N={} K={}", g.n, g.k), .kernel = kernel};
    // A tuning database entry for this M: the entry's plan, marked.
    const codegen::GemmSpec spec{g.n, g.k, codegen::BiasKind::none, g.act, DType::bf16};
    if (const codegen::PlanOverrides tuned = ops::tuned_gemm(env.cpu.isa, spec, m); !tuned.empty())
      row.kernel =
          ops::gemm_executable(spec, codegen::gemm_isa_for_rows(env.cpu.isa, m, tuned), tuned)
              .plan()
              .name() +
          " (tuned)";
    measure(
        row, env, [&] { gemm(xv, pw, yv, go); },
        [&](double* err) { return check_gemm_rows(x, w, y, m, g, err); });
    row.rate = 2.0 * double(m) * double(g.n) * double(g.k) / row.seconds / 1e9;
    row.note = weight_note(pw, row);
    emit(row);
  }
}

// ---- RoPE rows ---------------------------------------------------------------

// q and k rotated in place, as views of the fused qkv_proj output [M, 6144]
// (q: columns 0..4095, k: 4096..5119), neox style over the whole head, an f32
// cos/sin cache of 8192 positions, int64 positions (what PyTorch engines pass):
// 4095 for M = 1 (the decode token of the decode row), else 0..M−1 (a prompt).
// GB/s counts q and k read and written once plus one cache row per token.
void rope_rows(const Env& env, const std::vector<int64_t>& ms, uint64_t seed, const Emit& emit) {
  std::vector<float> cache(static_cast<size_t>(kMaxPosition * kHeadDim));
  for (int64_t p = 0; p < kMaxPosition; ++p)
    for (int64_t i = 0; i < kHeadDim / 2; ++i) {
      const double th = double(p) * std::pow(kRopeTheta, -2.0 * double(i) / double(kHeadDim));
      cache[size_t(p * kHeadDim + i)] = static_cast<float>(std::cos(th));
      cache[size_t(p * kHeadDim + kHeadDim / 2 + i)] = static_cast<float>(std::sin(th));
    }
  const TensorView cache_v(cache.data(), DType::f32, {kMaxPosition, kHeadDim});
  // The descriptor of the call below (neox, rotary_dim = D, q and k, int64 positions).
  const codegen::llvm_backend::RopeDesc desc =
      ops::rope_desc({}, DType::bf16, DType::f32, kHeadDim, kHq, kHkv, DType::i64);
  // rope runs the LLVM kernel on every JIT path of an LLVM build, else the reference.
  const bool jit = env.cpu.isa != Isa::scalar && env.cpu.llvm_backend;
  const std::string kernel = jit ? desc.name() : "scalar reference";

  for (int64_t m : ms) {
    auto qkv = random_bf16(size_t(m * kQkvWidth), seed + uint64_t(m), 2.0f);
    const auto before = qkv;
    std::vector<int64_t> pos(static_cast<size_t>(m));
    std::iota(pos.begin(), pos.end(), int64_t{0});
    if (m == 1) pos[0] = kDecodeContext - 1;
    const TensorView q(qkv.data(), DType::bf16, {m, kHq, kHeadDim}, {kQkvWidth, kHeadDim, 1});
    const TensorView k(qkv.data() + kHq * kHeadDim, DType::bf16, {m, kHkv, kHeadDim},
                       {kQkvWidth, kHeadDim, 1});
    const TensorView pv(pos.data(), DType::i64, {m});

    // Tokens {0, M/2, M−1}, every q and k head, against the double reference
    // (runtime/reference_rope.h): one bf16 ulp of the result plus the f32
    // error 2⁻²¹·(|x·cos| + |x'·sin|), the bound of tests/rope_test.cpp.
    auto check = [&](double* max_err) {
      runtime::ReferenceRope r;
      r.rotary_dim = kHeadDim;
      std::vector<double> x(kHeadDim), ref(kHeadDim), mag(kHeadDim);
      bool ok = true;
      *max_err = 0;
      for (int64_t t : {int64_t{0}, m / 2, m - 1})
        for (int64_t h = 0; h < kHq + kHkv; ++h) {
          const int64_t base = t * kQkvWidth + h * kHeadDim;
          for (int64_t i = 0; i < kHeadDim; ++i) x[i] = bf(before[size_t(base + i)]);
          runtime::reference_rope_head(
              r, kHeadDim, x.data(), ref.data(),
              [&](int64_t, int64_t col) { return double(cache[size_t(pos[t] * kHeadDim + col)]); },
              mag.data());
          for (int64_t i = 0; i < kHeadDim; ++i) {
            const double err = std::fabs(bf(qkv[size_t(base + i)]) - ref[i]);
            *max_err = std::max(*max_err, err);
            ok &= err <= runtime::rope_output_bound(DType::bf16, mag[i], ref[i]);
          }
        }
      return ok;
    };
    Row row{.op = "rope_qk",
            .m = m,
            .shape = fmt::format("Hq={} Hk={} D={} pos {}", kHq, kHkv, kHeadDim,
                                 m == 1 ? std::to_string(pos[0]) : fmt::format("0..{}", m - 1)),
            .kernel = kernel,
            .bytes = true};
    measure(
        row, env, [&] { rope(q, &k, pv, cache_v); }, check);
    const double bytes = double(m) * double((kHq + kHkv) * kHeadDim * 2 * 2 + kHeadDim * 4);
    row.rate = bytes / row.seconds / 1e9;
    emit(row);
  }
}

// ---- Row-wise rows ---------------------------------------------------------------

// The row-wise ops run the LLVM kernel on every JIT path of an LLVM build,
// else the reference.
std::string rowwise_kernel(const Env& env, const codegen::llvm_backend::RowwiseDesc& d) {
  return env.cpu.isa != Isa::scalar && env.cpu.llvm_backend ? d.name() : "scalar reference";
}

// input_layernorm (rms_norm, out a new tensor) or, `fused`,
// post_attention_layernorm (residual += x, x = norm(residual) in place, as
// sglang calls it), bf16 rows of H with a bf16 weight, eps 1e-5 (Llama-3).
// Rows {0, M/2, M−1} against the double reference under
// rms_norm_output_bound (tests/rowwise_test.cpp's bound), the residual
// bit-exact. GB/s counts the rows read and written (and the weight once).
void norm_rows(const Env& env, const std::vector<int64_t>& ms, uint64_t seed, bool fused,
               const Emit& emit) {
  constexpr float kEps = 1e-5f;
  const auto w = random_bf16(size_t(kHidden), seed, 1.0f);
  const TensorView wv(w.data(), DType::bf16, {kHidden});
  NormOptions opt;
  opt.eps = kEps;
  const auto desc = ops::norm_desc(
      fused ? codegen::llvm_backend::RowOp::add_rms_norm : codegen::llvm_backend::RowOp::rms_norm,
      opt, DType::bf16, DType::bf16, DType::bf16, DType::bf16, kHidden);
  for (int64_t m : ms) {
    const auto x0 = random_bf16(size_t(m * kHidden), seed + 1 + uint64_t(m), 2.0f);
    const auto r0 = random_bf16(size_t(m * kHidden), seed + 2 + uint64_t(m), 2.0f);
    auto x = x0, r = r0;
    std::vector<uint16_t> out(size_t(m * kHidden));
    const TensorView xv(x.data(), DType::bf16, {m, kHidden}),
        rv(r.data(), DType::bf16, {m, kHidden}), ov(out.data(), DType::bf16, {m, kHidden});
    // The first call's results (the timed calls go on adding to the residual).
    std::vector<uint16_t> got, got_res;
    auto call = [&] {
      if (fused)
        fused_add_rms_norm(xv, rv, &wv, xv, opt);
      else
        rms_norm(xv, &wv, ov, opt);
      if (got.empty()) {
        got = fused ? x : out;
        got_res = r;
      }
    };
    auto check = [&](double* max_err) {
      bool ok = true;
      *max_err = 0;
      std::vector<double> v(static_cast<size_t>(kHidden));
      for (int64_t t : {int64_t{0}, m / 2, m - 1}) {
        for (int64_t i = 0; i < kHidden; ++i) {
          const size_t at = size_t(t * kHidden + i);
          if (!fused) {
            v[size_t(i)] = bf(x0[at]);
            continue;
          }
          const float sum = runtime::reference_residual_sum(
              float(bf(x0[at])), float(bf(r0[at])),
              [](float s) { return runtime::bf16_to_f32(runtime::f32_to_bf16(s)); });
          ok &= bf(got_res[at]) == double(sum);
          v[size_t(i)] = sum;
        }
        const double rstd = runtime::reference_rstd(v.data(), kHidden, kEps);
        for (int64_t i = 0; i < kHidden; ++i) {
          const double ref = runtime::reference_norm_value(v[size_t(i)], rstd, bf(w[size_t(i)]));
          const double err = std::fabs(bf(got[size_t(t * kHidden + i)]) - ref);
          *max_err = std::max(*max_err, err);
          ok &= err <= runtime::rms_norm_output_bound(DType::bf16, ref);
        }
      }
      return ok;
    };
    Row row{.op = fused ? "post_attn_norm" : "input_norm",
            .m = m,
            .shape = fmt::format("{}H={} eps=1e-5", fused ? "residual add, " : "", kHidden),
            .kernel = rowwise_kernel(env, desc),
            .bytes = true};
    measure(row, env, call, check);
    row.rate = double(m * kHidden * 2 * (fused ? 4 : 2) + kHidden * 2) / row.seconds / 1e9;
    emit(row);
  }
}

// silu_and_mul between gate_up_proj and down_proj: x [M, 2·14336] bf16 ->
// [M, 14336] bf16; rows {0, M/2, M−1} against reference_glu under
// glu_output_bound. GB/s counts x read and out written.
void act_rows(const Env& env, const std::vector<int64_t>& ms, uint64_t seed, const Emit& emit) {
  constexpr int64_t kI = 14336;
  const GluOptions opt;  // silu, halves
  const auto desc = ops::glu_desc(opt, DType::bf16, DType::bf16, kI);
  for (int64_t m : ms) {
    const auto x = random_bf16(size_t(m * 2 * kI), seed + uint64_t(m), 4.0f);
    std::vector<uint16_t> out(size_t(m * kI));
    const TensorView xv(x.data(), DType::bf16, {m, 2 * kI}), ov(out.data(), DType::bf16, {m, kI});
    auto check = [&](double* max_err) {
      runtime::ReferenceGlu glu;  // silu
      bool ok = true;
      *max_err = 0;
      for (int64_t t : {int64_t{0}, m / 2, m - 1})
        for (int64_t i = 0; i < kI; ++i) {
          const double g = bf(x[size_t(t * 2 * kI + i)]), u = bf(x[size_t(t * 2 * kI + kI + i)]);
          const double ref = runtime::reference_glu(glu, g, u);
          const double err = std::fabs(bf(out[size_t(t * kI + i)]) - ref);
          *max_err = std::max(*max_err, err);
          ok &= err <= runtime::glu_output_bound(glu, g, u, DType::bf16, ref);
        }
      return ok;
    };
    Row row{.op = "silu_and_mul",
            .m = m,
            .shape = fmt::format("[{}, 2*{}] -> [{}, {}]", m, kI, m, kI),
            .kernel = rowwise_kernel(env, desc),
            .bytes = true};
    measure(
        row, env, [&] { act_and_mul(xv, ov, opt); }, check);
    row.rate = double(m * kI * 2 * 3) / row.seconds / 1e9;
    emit(row);
  }
}

// ---- Attention rows ------------------------------------------------------------

// The bound of tests/attention_test.cpp (runtime/reference_error_bounds.h):
// P rounded to bf16 (2⁻⁹·max|v|) and the bf16 output (2⁻⁹·|ref|), with
// headroom for fp32 exp and summation.
double attention_tolerance(double max_v, double ref) {
  return runtime::attention_output_bound(max_v, ref);
}

// Decode step of B = M sequences (M = 1: one; M = 16: a batch of 16), each at
// kDecodeContext keys in a paged cache of 16-slot blocks handed out in a
// shuffled order (as an allocator leaves them after a while). GB/s counts the
// K and V rows read (B·context·Hkv·2·D·2 bytes); the cache of B = 16 (256 MiB)
// is far past the caches, the one of B = 1 (16 MiB) partly fits L3.
// fp8: the same rows stored as an e4m3 cache (code = e4m3(x / s), the
// store_kv rule, s = 2^-8 so the values stay inside e4m3's range) read with
// AttentionOptions::kv_scales; GB/s then counts the fp8 bytes, and the
// reference reads the dequantized values code · s.
Row decode_row(const Env& env, int64_t m, uint64_t seed, bool fp8 = false) {
  const int64_t b = m, per_seq = kDecodeContext / kBlockSize, nb = b * per_seq;
  const size_t cache_elems = size_t(nb * kBlockSize * kHkv * kHeadDim);
  const auto kc = random_bf16(cache_elems, seed, 1.0f);
  const auto vc = random_bf16(cache_elems, seed + 1, 1.0f);
  constexpr float kFp8Scale = 1.0f / 256;
  std::vector<uint8_t> kc8, vc8;
  if (fp8) {
    kc8 = e4m3_codes(kc, kFp8Scale);
    vc8 = e4m3_codes(vc, kFp8Scale);
  }
  const auto q = random_bf16(size_t(b * kHq * kHeadDim), seed + 2, 1.0f);
  std::vector<uint16_t> out(static_cast<size_t>(b * kHq * kHeadDim));
  const std::vector<int32_t> table = shuffled_blocks(static_cast<size_t>(nb), seed);
  std::vector<int32_t> lens(static_cast<size_t>(b), int32_t(kDecodeContext));
  const TensorView qv(q.data(), DType::bf16, {b, kHq, kHeadDim});
  const TensorView kv =
      fp8 ? TensorView(kc8.data(), DType::f8e4m3, {nb, kBlockSize, kHkv, kHeadDim})
          : TensorView(kc.data(), DType::bf16, {nb, kBlockSize, kHkv, kHeadDim});
  const TensorView vv =
      fp8 ? TensorView(vc8.data(), DType::f8e4m3, {nb, kBlockSize, kHkv, kHeadDim})
          : TensorView(vc.data(), DType::bf16, {nb, kBlockSize, kHkv, kHeadDim});
  AttentionOptions aopt;
  if (fp8) aopt.kv_scales.k_scale = aopt.kv_scales.v_scale = kFp8Scale;
  const TensorView ov(out.data(), DType::bf16, {b, kHq, kHeadDim});
  const TensorView tv(table.data(), DType::i32, {b, per_seq});
  const TensorView lv(lens.data(), DType::i32, {b});

  std::string kernel = "scalar reference";
  if (env.cpu.isa != Isa::scalar && jit::family_built(jit::Family::decode_attention)) {
    kernel = ops::decode_attention_desc(kHeadDim, kHeadDim, kHq / kHkv, kBlockSize,
                                        /*softcap=*/false, /*alibi=*/false,
                                        fp8 ? DType::f8e4m3 : DType::bf16)
                 .name();
  } else if (env.cpu.isa != Isa::scalar) {
    kernel = fmt::format("attention engine (brgemm_{} kernels)", isa_name(env.cpu.isa));
  }

  // Sequences {0, B−1}, every head, against the double reference.
  auto check = [&](double* max_err) {
    const auto at = [&](const std::vector<uint16_t>& c, int64_t s, int64_t j, int64_t h,
                        int64_t col) {
      const int64_t blk = table[size_t(s * per_seq + j / kBlockSize)];
      const size_t i = size_t(((blk * kBlockSize + j % kBlockSize) * kHkv + h) * kHeadDim + col);
      if (!fp8) return double(bf(c[i]));
      const std::vector<uint8_t>& c8 = &c == &kc ? kc8 : vc8;
      return double(runtime::e4m3_to_f32(c8[i])) * double(kFp8Scale);
    };
    bool ok = true;
    *max_err = 0;
    std::vector<int64_t> seqs = {0, b - 1};
    seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
    for (int64_t s : seqs) {
      double max_v = 0;
      for (int64_t j = 0; j < kDecodeContext; ++j)
        for (int64_t h = 0; h < kHkv; ++h)
          for (int64_t c = 0; c < kHeadDim; ++c)
            max_v = std::max(max_v, std::fabs(at(vc, s, j, h, c)));
      for (int64_t h = 0; h < kHq; ++h) {
        const int64_t hk = h / (kHq / kHkv);
        runtime::ReferenceAttentionHead rh;
        rh.tq = 1;
        rh.tk = kDecodeContext;
        rh.d = rh.dv = kHeadDim;
        rh.sm_scale = 1.0 / std::sqrt(double(kHeadDim));
        rh.q_at = [&](int64_t, int64_t c) { return bf(q[size_t((s * kHq + h) * kHeadDim + c)]); };
        rh.k_at = [&](int64_t j, int64_t c) { return at(kc, s, j, hk, c); };
        rh.v_at = [&](int64_t j, int64_t c) { return at(vc, s, j, hk, c); };
        rh.out = [&](int64_t, int64_t c, double ref) {
          const double err = std::fabs(bf(out[size_t((s * kHq + h) * kHeadDim + c)]) - ref);
          *max_err = std::max(*max_err, err);
          ok &= err <= attention_tolerance(max_v, ref);
        };
        runtime::reference_attention_head(rh);
      }
    }
    return ok;
  };
  Row row{.op = fp8 ? "attn_decode_f8" : "attn_decode",
          .m = m,
          .shape = fmt::format("B={} ctx={} Hq={} Hkv={} D={}{}", b, kDecodeContext, kHq, kHkv,
                               kHeadDim, fp8 ? " e4m3 cache" : ""),
          .kernel = kernel,
          .bytes = true};
  if (env.cpu.isa != Isa::scalar)
    if (const jit::TunedEntry* e =
            jit::find_tuned("decode_attention",
                            jit::decode_shape_class(
                                env.cpu.isa, num_threads(), kHeadDim, kHeadDim, kHq, kHkv,
                                kBlockSize, fp8 ? DType::f8e4m3 : DType::bf16, b, kDecodeContext)))
      row.kernel += fmt::format(" (tuned {})", jit::knobs_text(e->knobs));
  measure(
      row, env, [&] { decode_attention(qv, kv, vv, ov, tv, lv, aopt); }, check);
  row.rate = double(b * kDecodeContext * kHkv * 2 * kHeadDim * (fp8 ? 1 : 2)) / row.seconds / 1e9;
  return row;
}

// Prefill of one M-token prompt (no cached prefix), causal, with q, k and v as
// column views of the fused qkv_proj output [M, 6144], as an engine calls it.
// GFLOP/s counts the visible (query, key) pairs only: Hq·M(M+1)/2·(2D + 2D).
Row prefill_row(const Env& env, int64_t m, uint64_t seed) {
  auto qkv = random_bf16(static_cast<size_t>(m * kQkvWidth), seed, 1.0f);
  std::vector<uint16_t> out(static_cast<size_t>(m * kHq * kHeadDim));
  std::vector<int32_t> cu = {0, int32_t(m)};
  const TensorView q(qkv.data(), DType::bf16, {m, kHq, kHeadDim}, {kQkvWidth, kHeadDim, 1});
  const TensorView k(qkv.data() + kHq * kHeadDim, DType::bf16, {m, kHkv, kHeadDim},
                     {kQkvWidth, kHeadDim, 1});
  const TensorView v(qkv.data() + (kHq + kHkv) * kHeadDim, DType::bf16, {m, kHkv, kHeadDim},
                     {kQkvWidth, kHeadDim, 1});
  const TensorView ov(out.data(), DType::bf16, {m, kHq, kHeadDim});
  const TensorView cuv(cu.data(), DType::i32, {2});
  const AttentionOptions opt{.causal = true};
  const std::string kernel =
      env.cpu.isa == Isa::scalar
          ? std::string("scalar reference")
          : fmt::format("attention engine (brgemm_{} kernels)", isa_name(env.cpu.isa));

  // Query rows {0, M/2, M−1} of every head against the double reference: a
  // causal row i sees keys 0..i, so it is the last row of an (i+1)-key problem.
  auto check = [&](double* max_err) {
    const auto el = [&](int64_t t, int64_t col) { return bf(qkv[size_t(t * kQkvWidth + col)]); };
    double max_v = 0;
    for (int64_t t = 0; t < m; ++t)
      for (int64_t c = 0; c < kHkv * kHeadDim; ++c)
        max_v = std::max(max_v, std::fabs(el(t, (kHq + kHkv) * kHeadDim + c)));
    bool ok = true;
    *max_err = 0;
    std::vector<int64_t> rows = {0, m / 2, m - 1};
    rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
    for (int64_t i : rows)
      for (int64_t h = 0; h < kHq; ++h) {
        const int64_t hk = h / (kHq / kHkv);
        runtime::ReferenceAttentionHead rh;
        rh.tq = 1;
        rh.tk = i + 1;
        rh.d = rh.dv = kHeadDim;
        rh.sm_scale = 1.0 / std::sqrt(double(kHeadDim));
        rh.causal = true;
        rh.q_at = [&](int64_t, int64_t c) { return el(i, h * kHeadDim + c); };
        rh.k_at = [&](int64_t j, int64_t c) { return el(j, (kHq + hk) * kHeadDim + c); };
        rh.v_at = [&](int64_t j, int64_t c) { return el(j, (kHq + kHkv + hk) * kHeadDim + c); };
        rh.out = [&](int64_t, int64_t c, double ref) {
          const double err = std::fabs(bf(out[size_t((i * kHq + h) * kHeadDim + c)]) - ref);
          *max_err = std::max(*max_err, err);
          ok &= err <= attention_tolerance(max_v, ref);
        };
        runtime::reference_attention_head(rh);
      }
    return ok;
  };
  Row row{.op = "attn_prefill",
          .m = m,
          .shape = fmt::format("T={} Hq={} Hkv={} D={} causal", m, kHq, kHkv, kHeadDim),
          .kernel = kernel};
  if (env.cpu.isa != Isa::scalar)
    if (const jit::TunedEntry* e = jit::find_tuned(
            "prefill_attention", jit::prefill_shape_class(env.cpu.isa, num_threads(), kHeadDim,
                                                          kHeadDim, kHq, kHkv, true, 1, m)))
      row.kernel += fmt::format(" (tuned {})", jit::knobs_text(e->knobs));
  measure(
      row, env, [&] { flash_attn_varlen(q, k, v, ov, cuv, cuv, opt); }, check);
  row.rate = double(kHq) * double(m) * double(m + 1) / 2 * 4 * kHeadDim / row.seconds / 1e9;
  return row;
}

// ---- MoE rows ------------------------------------------------------------------

// A Qwen3-30B-A3B-like MoE block (hidden 2048, 128 experts of intermediate 768,
// top-8, silu_and_mul): the router (gemm to f32 logits + topk_softmax, one row)
// and fused_experts (one row). Experts are packed once, as at model load; the
// 1.2 GB of expert weights is far past the caches, so the M ≤ 16 rows stream
// them from memory and report GB/s of the experts actually touched; M = 512
// reports GFLOP/s of the routed work, 2·M·k·3·H·I.
constexpr int64_t kMoeHidden = 2048, kMoeExperts = 128, kMoeInter = 768, kMoeTopk = 8;

// Tokens {0, M/2, M−1} against runtime/reference_moe.h (double, bf16
// intermediate mirrored). Bound: one bf16 ulp of the output, plus 2e-3 of the
// row's largest |value|: the kernel's fp32 gate/up (accumulation error ~H·2⁻²⁴
// relative) can put an intermediate on the other side of a bf16 rounding
// boundary than the reference's, moving the output by 2⁻⁸·|act·w2| for that
// term; a handful of such flips per row stay far inside 2e-3.
bool check_moe_rows(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w13,
                    const std::vector<uint16_t>& w2, const std::vector<float>& tw,
                    const std::vector<int32_t>& ids, const std::vector<uint16_t>& out, int64_t m,
                    double* max_err) {
  std::vector<int64_t> rows = {0, m / 2, m - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  bool ok = true;
  *max_err = 0;
  for (int64_t r : rows) {
    std::vector<float> ref(kMoeHidden);
    runtime::ReferenceMoeArgs a;
    a.h = kMoeHidden;
    a.i = kMoeInter;
    a.e = kMoeExperts;
    a.k = kMoeTopk;
    moe_token_args(a, x.data(), w13.data(), w2.data(), tw.data(), ids.data(), r, ref.data());
    runtime::reference_moe(a);
    const double row_max = std::fabs(*std::max_element(
        ref.begin(), ref.end(), [](float p, float q) { return std::fabs(p) < std::fabs(q); }));
    for (int64_t j = 0; j < kMoeHidden; ++j) {
      const double want = ref[j], got = bf(out[r * kMoeHidden + j]);
      const double tol = std::ldexp(std::fabs(want), -7) + 2e-3 * row_max;
      const double err = std::fabs(got - want);
      *max_err = std::max(*max_err, err);
      if (!(err <= tol)) ok = false;
    }
  }
  return ok;
}

// ---- quantized MoE rows (--moe-weights) --------------------------------------------

// The --moe-weights formats after bf16, in the order the rows print.
struct MoeQuantFormat {
  const char* name;  // the option's value and the shape column's suffix
  QKind kind;
  const char* what;  // the header's description
};
constexpr MoeQuantFormat kMoeQuantFormats[] = {
    {"int8", QKind::int8,
     "int8 W8A8 (per-channel scales; x and the activation quantized per token)"},
    {"fp8", QKind::fp8_channel, "fp8 e4m3, per-channel scales"},
    {"fp8_block", QKind::fp8_block, "fp8 e4m3, DeepSeek-style 128x128 block scales"},
    {"int4", QKind::gptq, "int4 GPTQ g128 with zero points"},
    {"awq", QKind::awq, "int4 AWQ g128 with zero points"},
    {"mxfp4", QKind::mxfp4, "MXFP4 (e2m1, e8m0 scales per 32)"},
};

bool moe_format_selected(const LlamaJobOptions& opt, const std::string& name) {
  for (const std::string& w : opt.moe_weights)
    if (w == name || w == "all") return true;
  return false;
}

// The inputs of one engine step of the MoE block: hidden states and the
// router's choice (the same for every expert format).
struct MoeStep {
  int64_t m = 0;
  std::vector<uint16_t> x;
  std::vector<float> tw;
  std::vector<int32_t> ids;
};

// Quantized experts of the MoE block: every expert's checkpoints with their
// logical weights (QuantCheckpoint), and the packs.
struct QuantExperts {
  QKind kind = QKind::int8;
  std::vector<QuantCheckpoint> w13, w2;  // per expert [2I, H] (gate rows, then up rows), [H, I]
  PackedExperts p13, p2;
};

template <class W>
PackedExperts pack_quant_experts(const std::vector<QuantCheckpoint>& cks, ExpertProj proj,
                                 W (*desc)(const QuantCheckpoint&)) {
  std::vector<W> v;
  v.reserve(cks.size());
  for (const QuantCheckpoint& ck : cks) v.push_back(desc(ck));
  return pack_experts(v, proj, GluRows::halves);
}

PackedExperts pack_quant_experts(const std::vector<QuantCheckpoint>& cks, ExpertProj proj) {
  switch (cks[0].kind) {
    case QKind::int8:
      return pack_quant_experts(cks, proj, int8_weight);
    case QKind::fp8_channel:
    case QKind::fp8_block:
      return pack_quant_experts(cks, proj, fp8_weight);
    case QKind::mxfp4:
      return pack_quant_experts(cks, proj, mxfp4_weight);
    default:
      return pack_quant_experts(cks, proj, int4_weight);
  }
}

QuantExperts make_quant_experts(QKind kind, uint64_t seed) {
  const int64_t E = kMoeExperts, H = kMoeHidden, I = kMoeInter;
  QuantExperts q;
  q.kind = kind;
  q.w13.resize(size_t(E));
  q.w2.resize(size_t(E));
  runtime::parallel_for(2 * E, [&](int64_t t) {
    const int64_t e = t / 2;
    if (t % 2 == 0)
      q.w13[size_t(e)] = make_checkpoint(kind, 2 * I, H, seed + uint64_t(t));
    else
      q.w2[size_t(e)] = make_checkpoint(kind, H, I, seed + uint64_t(t));
  });
  q.p13 = pack_quant_experts(q.w13, ExpertProj::gate_up);
  q.p2 = pack_quant_experts(q.w2, ExpertProj::down);
  return q;
}

// A projection's input row as the kernels see it (int8: quantized per token
// with runtime::reference_act_quant_row, MoeOptions' default dynamic_sym),
// with the magnitude of each element's terms in the kernels' sums.
struct MoeInputRow {
  std::vector<double> v, mag;
  double scale = 0;  // int8: the row's scale
};

MoeInputRow moe_input_row(bool int8, const uint16_t* x, int64_t k) {
  MoeInputRow in;
  in.v.resize(size_t(k));
  in.mag.resize(size_t(k));
  if (!int8) {
    for (int64_t i = 0; i < k; ++i) in.mag[i] = std::fabs(in.v[i] = bf(x[i]));
    return in;
  }
  std::vector<uint8_t> q(static_cast<size_t>(k));
  float s = 0;
  int32_t z = 0;
  runtime::reference_act_quant_row(runtime::ActQuantRule::sym, x, k, k, 1.0f, 0.0f, 0, q.data(), &s,
                                   &z);
  for (int64_t i = 0; i < k; ++i) {
    in.v[i] = double(int32_t(q[i]) - z) * double(s);
    in.mag[i] = (std::fabs(double(int32_t(q[i]) - z)) + 2.0 * std::abs(z)) * double(s);
  }
  in.scale = s;
  return in;
}

// Whether an expert of kind `kind` with `rows` routed rows quantizes its
// inputs per token: int8 always, int4 on the W4A8 route (ops::w4a8_route,
// automatic, the rows as M).
bool moe_quantized_input(QKind kind, int64_t rows, Isa isa) {
  if (kind == QKind::int8) return true;
  if (kind != QKind::gptq && kind != QKind::awq) return false;
  return ops::w4a8_route(kind == QKind::gptq ? WeightFormat::int4_gptq : WeightFormat::int4_awq,
                         kMoeHidden, Int4Route::automatic, isa, rows, "llama-layer");
}

// Tokens {0, M/2, M−1} of fused_experts on quantized experts against a double
// oracle on the experts' logical weights (QuantCheckpoint::w), the oracle and
// bound of tests/moe_quant_test.cpp, correct for every route an expert's GEMMs
// take (ops/moe_quant.cpp; the oracle follows each expert's, by the library's
// rule ops::quant_gemm_fused on its row count):
//  - fused decode kernel (fp8 / int4 / MXFP4, ops::fused_max_rows), int8
//    and the scalar fallback read the exact weights; the dequant route reads
//    them rounded once to bf16 (bf16(f32(w))), so the oracle does too;
//  - int8, and int4 on the W4A8 route (moe_quantized_input; exact weights):
//    x and the bf16 activation row quantized per token as the kernels do
//    (runtime::reference_act_quant_row), so the oracle sees (q − z)·s;
//  - bound (runtime/reference_error_bounds.h): each fp32 sum within
//    8·u·Σ|terms| (the fused int4 kernel's terms (q + z + 32)·s; int8's
//    int32 sums are exact, so its gate / up only carry the f32 epilogue's
//    4·u·|pre|), the activation's bf16 rounding allowed to go the other way
//    only where that error reaches a rounding midpoint (moe_act_slack),
//    pushed through |W2| and the routing weights; int8: such an activation's
//    code as far off as its bf16 neighbours' codes, and if one of them can
//    be the row's largest (its scale), the row requantized at every scale
//    it can set (alt below); then moe_output_bound for the bf16 output.
// Measured on this shape: 1 % more in every routing weight fails every row
// but the int4 / AWQ ones at M <= 16 (err/bound ~0.4: their fused kernel's
// larger terms leave more activations near a midpoint); 3 % fails every row.
bool check_quant_moe_rows(const MoeStep& st, const QuantExperts& q,
                          const std::vector<uint16_t>& out, Isa isa, double* max_err,
                          double* worst_ratio) {
  const int64_t H = kMoeHidden, I = kMoeInter, K = kMoeTopk, m = st.m;
  constexpr double kU = 1.0 / (1 << 24), kSumUlps = 8;
  const bool int8 = q.kind == QKind::int8;
  std::vector<int64_t> count(size_t(kMoeExperts), 0);
  for (int32_t e : st.ids) ++count[size_t(e)];
  runtime::ReferenceGlu glu;  // silu
  std::vector<int64_t> rows = {0, m / 2, m - 1};
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  bool ok = true;
  *max_err = 0;
  *worst_ratio = 0;
  for (int64_t r : rows) {
    std::vector<double> ref(size_t(H), 0), abs_sum(size_t(H), 0), act_term(size_t(H), 0);
    const MoeInputRow xin_b = moe_input_row(false, st.x.data() + r * H, H);
    const MoeInputRow xin_q = moe_input_row(true, st.x.data() + r * H, H);
    for (int64_t j = 0; j < K; ++j) {
      const int32_t e = st.ids[size_t(r * K + j)];
      const double scale = st.tw[size_t(r * K + j)];
      const bool quant = moe_quantized_input(q.kind, count[size_t(e)], isa);
      const MoeInputRow& xin = quant ? xin_q : xin_b;
      const bool exact =
          quant || isa == Isa::scalar || ops::quant_gemm_fused(isa, count[size_t(e)]);
      const bool fused = exact && !quant;
      const QuantCheckpoint& w13 = q.w13[size_t(e)];
      const QuantCheckpoint& w2 = q.w2[size_t(e)];
      auto wt = [&](const QuantCheckpoint& ck, int64_t a, int64_t b) {
        const double v = ck.w(a, b);
        return exact ? v : double(bf(runtime::f32_to_bf16(static_cast<float>(v))));
      };
      std::vector<uint16_t> act(static_cast<size_t>(I));
      std::vector<double> slack(static_cast<size_t>(I)), lo_act(slack), hi_act(slack);
      runtime::parallel_for(I, [&](int64_t i) {
        runtime::MoeActPoint p;
        for (int64_t hh = 0; hh < H; ++hh) {
          const double wg = wt(w13, i, hh), wu = wt(w13, I + i, hh);
          p.gate += xin.v[hh] * wg;
          p.up += xin.v[hh] * wu;
          p.gate_abs += xin.mag[hh] * (fused ? w13.mag(i, hh, true) : std::fabs(wg));
          p.up_abs += xin.mag[hh] * (fused ? w13.mag(I + i, hh, true) : std::fabs(wu));
        }
        if (int8) {  // exact int32 sums, then <= 4 f32 roundings of the scaled value
          p.gate_abs = std::fabs(p.gate);
          p.up_abs = std::fabs(p.up);
        }
        p.act = runtime::reference_glu(glu, p.gate, p.up);
        act[size_t(i)] = runtime::f32_to_bf16(static_cast<float>(p.act));
        p.act_bf16 = bf(act[size_t(i)]);
        const double eps = (int8 ? 4 : kSumUlps) * kU;
        slack[size_t(i)] = runtime::moe_act_slack(glu, p, eps);
        // The kernel's bf16 activation lies in [lo_act, hi_act] (rounding is monotone).
        const double ea = runtime::moe_act_error(glu, p, eps);
        lo_act[size_t(i)] = bf(runtime::f32_to_bf16(static_cast<float>(p.act - ea)));
        hi_act[size_t(i)] = bf(runtime::f32_to_bf16(static_cast<float>(p.act + ea)));
      });
      const MoeInputRow ain = moe_input_row(quant, act.data(), I);
      // int8 / W4A8: the kernel quantizes its own bf16 activations a'_i ∈ [lo_i, hi_i]
      // at scale max|a'|/127. Every value that max can take (an activation near
      // the row's largest) gives the row requantized at that scale (the fixed
      // rule with dynamic_sym's f32 inv and scale): alt rows, whose outputs
      // bound the scale's move exactly; at each scale, the codes of lo_i and
      // hi_i bound a'_i's code (quantizing is monotone): code_step[i], the
      // largest value change over the scales.
      std::vector<std::vector<double>> alt;
      std::vector<double> code_step(static_cast<size_t>(I), 0.0);
      if (quant) {
        std::vector<uint16_t> lo_row(static_cast<size_t>(I)), hi_row(lo_row);
        double m_ref = 0, m_min = 0;
        for (int64_t i = 0; i < I; ++i) {
          const double lo = lo_act[size_t(i)], hi = hi_act[size_t(i)];
          lo_row[size_t(i)] = runtime::f32_to_bf16(static_cast<float>(lo));
          hi_row[size_t(i)] = runtime::f32_to_bf16(static_cast<float>(hi));
          m_ref = std::max(m_ref, std::fabs(bf(act[size_t(i)])));
          m_min =
              std::max(m_min, lo <= 0 && hi >= 0 ? 0.0 : std::min(std::fabs(lo), std::fabs(hi)));
        }
        std::set<uint16_t> maxima = {runtime::f32_to_bf16(static_cast<float>(m_min)),
                                     runtime::f32_to_bf16(static_cast<float>(m_ref))};
        for (int64_t i = 0; i < I; ++i) {
          const double top = std::max(std::fabs(lo_act[size_t(i)]), std::fabs(hi_act[size_t(i)]));
          if (top <= m_min) continue;
          // Every bf16 magnitude in (m_min, top]: positive bf16 bits order as their values.
          for (uint16_t b = runtime::f32_to_bf16(static_cast<float>(m_min));
               b < runtime::f32_to_bf16(static_cast<float>(top));)
            maxima.insert(++b);
        }
        auto quantize = [&](const std::vector<uint16_t>& row, float mx) {
          std::vector<uint8_t> qa(static_cast<size_t>(I));
          float sa = 0;
          int32_t za = 0;
          const runtime::ActQuantStep step = runtime::act_quant_step(mx, 127.0f);
          runtime::reference_act_quant_row(runtime::ActQuantRule::fixed, row.data(), I, I, step.inv,
                                           step.s, 128, qa.data(), &sa, &za);
          std::vector<double> v(static_cast<size_t>(I));
          for (int64_t i = 0; i < I; ++i) v[size_t(i)] = double(int32_t(qa[size_t(i)]) - za) * sa;
          return v;
        };
        for (uint16_t mb : maxima) {
          const float mx = runtime::bf16_to_f32(mb);
          if (mx == 0) continue;
          std::vector<double> v = quantize(act, mx);
          const std::vector<double> vl = quantize(lo_row, mx), vh = quantize(hi_row, mx);
          for (int64_t i = 0; i < I; ++i)
            code_step[size_t(i)] =
                std::max({code_step[size_t(i)], std::fabs(vl[size_t(i)] - v[size_t(i)]),
                          std::fabs(vh[size_t(i)] - v[size_t(i)])});
          if (double(mx) != m_ref) alt.push_back(std::move(v));
        }
      }
      runtime::parallel_for(H, [&](int64_t hh) {
        double y = 0, mag = 0, term = 0;
        std::vector<double> y_alt(alt.size(), 0.0);
        for (int64_t i = 0; i < I; ++i) {
          const double w = wt(w2, hh, i);
          y += ain.v[i] * w;
          mag += ain.mag[i] * (fused ? w2.mag(hh, i, true) : std::fabs(w));
          for (size_t a = 0; a < alt.size(); ++a) y_alt[a] += alt[a][size_t(i)] * w;
          term += (quant ? code_step[size_t(i)] : slack[size_t(i)]) * std::fabs(w);
        }
        double shift = 0;
        for (double ya : y_alt) shift = std::max(shift, std::fabs(ya - y));
        term += shift;
        ref[size_t(hh)] += scale * y;
        abs_sum[size_t(hh)] += std::fabs(scale) * mag;
        act_term[size_t(hh)] += std::fabs(scale) * term;
      });
    }
    for (int64_t hh = 0; hh < H; ++hh) {
      const double want = ref[size_t(hh)], got = bf(out[size_t(r * H + hh)]);
      const double tol = runtime::moe_output_bound(DType::bf16, abs_sum[size_t(hh)],
                                                   act_term[size_t(hh)], 2 * kSumUlps * kU, want);
      const double err = std::fabs(got - want);
      *max_err = std::max(*max_err, err);
      *worst_ratio = std::max(*worst_ratio, err / tol);
      if (!(err <= tol)) ok = false;
    }
  }
  return ok;
}

// What fused_experts runs for this step's experts (ops/moe_quant.cpp's routes).
std::string quant_moe_kernel(const MoeQuantFormat& f, const MoeStep& st, Isa isa) {
  std::vector<int64_t> count(size_t(kMoeExperts), 0);
  for (int32_t e : st.ids) ++count[size_t(e)];
  int64_t touched = 0, fused = 0, w4a8 = 0;
  for (int64_t c : count) {
    touched += c > 0;
    fused += c > 0 && ops::quant_gemm_fused(isa, c);
    w4a8 += c > 0 && f.kind != QKind::int8 && moe_quantized_input(f.kind, c, isa);
  }
  std::string route;
  if (isa == Isa::scalar)
    route = "scalar fallback";
  else if (f.kind == QKind::int8)
    route = "int8 kernels";
  else if (w4a8 == touched)
    route = "W4A8 int8 kernels";
  else if (w4a8 > 0)
    route = fmt::format("{} W4A8, {} dequant", w4a8, touched - w4a8);
  else if (fused == touched)
    route = "fused decode kernel";
  else if (fused == 0)
    route = "dequant + bf16 kernels";
  else
    route = fmt::format("{} fused decode, {} dequant", fused, touched - fused);
  return fmt::format("fused_experts ({} experts: {})", touched, route);
}

void quant_moe_rows(const Env& env, const MoeQuantFormat& f, const std::vector<MoeStep>& steps,
                    uint64_t seed, const Emit& emit) {
  const int64_t H = kMoeHidden, E = kMoeExperts, I = kMoeInter, K = kMoeTopk;
  const QuantExperts q = make_quant_experts(f.kind, seed);
  const double bytes_per_expert = double(q.p13.packed_bytes() + q.p2.packed_bytes()) / double(E);
  for (const MoeStep& st : steps) {
    const int64_t m = st.m;
    std::vector<uint16_t> out(size_t(m * H));
    const TensorView xv(st.x.data(), DType::bf16, {m, H});
    const TensorView wv(st.tw.data(), DType::f32, {m, K});
    const TensorView iv(st.ids.data(), DType::i32, {m, K});
    const TensorView ov(out.data(), DType::bf16, {m, H});
    const std::set<int32_t> touched(st.ids.begin(), st.ids.end());
    Row row{.op = "moe_experts",
            .m = m,
            .shape = fmt::format("E={} k={} H={} I={} {}", E, K, H, I, f.name),
            .kernel = quant_moe_kernel(f, st, env.cpu.isa)};
    double ratio = -1;
    measure(
        row, env, [&] { fused_experts(xv, q.p13, q.p2, wv, iv, ov); },
        [&](double* err) { return check_quant_moe_rows(st, q, out, env.cpu.isa, err, &ratio); });
    if (ratio >= 0) row.note = fmt::format("err/bound {:.2f}", ratio);
    if (m <= 16) {
      // The touched experts' packed bytes (codes, scales, zeros) per second.
      row.bytes = true;
      row.rate = double(touched.size()) * bytes_per_expert / row.seconds / 1e9;
      row.note += fmt::format("{}experts {:.2f} MB each", row.note.empty() ? "" : "; ",
                              bytes_per_expert / 1e6);
    } else {
      row.rate = 2.0 * double(m) * double(K) * 3.0 * double(H) * double(I) / row.seconds / 1e9;
    }
    emit(row);
  }
}

// The router and the bf16 experts (when selected) for each M, then each
// selected quantized format's experts on the same steps (hidden states and
// routing).
void moe_rows(const Env& env, const std::vector<int64_t>& ms, uint64_t seed, const Emit& emit) {
  const int64_t H = kMoeHidden, E = kMoeExperts, I = kMoeInter, K = kMoeTopk;
  const bool bf16_experts = moe_format_selected(env.opt, "bf16");
  std::vector<uint16_t> w13, w2;
  PackedExperts p13, p2;
  if (bf16_experts) {
    w13 = random_bf16(size_t(E * 2 * I * H), seed, 1.0f / 16);
    w2 = random_bf16(size_t(E * H * I), seed + 1, 1.0f / 16);
    p13 = pack_experts(TensorView(w13.data(), DType::bf16, {E, 2 * I, H}), ExpertProj::gate_up);
    p2 = pack_experts(TensorView(w2.data(), DType::bf16, {E, H, I}), ExpertProj::down);
  }
  const auto w_router = random_bf16(size_t(E * H), seed + 2, 1.0f / 16);
  const PackedWeight pr = pack_weight(TensorView(w_router.data(), DType::bf16, {E, H}));
  std::vector<MoeStep> steps;
  for (int64_t m : ms) {
    MoeStep& st = steps.emplace_back();
    st.m = m;
    st.x = random_bf16(size_t(m * H), seed + 3 + uint64_t(m), 1.0f);
    const auto& x = st.x;
    auto& tw = st.tw;
    auto& ids = st.ids;
    std::vector<float> logits(size_t(m * E));
    tw.resize(size_t(m * K));
    ids.resize(size_t(m * K));
    std::vector<uint16_t> out(size_t(m * H));
    const TensorView xv(x.data(), DType::bf16, {m, H});
    const TensorView lv(logits.data(), DType::f32, {m, E});
    const TensorView wv(tw.data(), DType::f32, {m, K});
    const TensorView iv(ids.data(), DType::i32, {m, K});
    const TensorView ov(out.data(), DType::bf16, {m, H});
    Row router{.op = "moe_router",
               .m = m,
               .shape = fmt::format("E={} H={} top{}", E, H, K),
               .kernel = "gemm (f32 logits) + topk_softmax"};
    measure(
        router, env,
        [&] {
          gemm(xv, pr, lv);
          topk_softmax(lv, wv, iv, true);
        },
        [&](double* err) {
          // The chosen weights are a distribution over k experts.
          *err = 0;
          for (int64_t t = 0; t < m; ++t) {
            double sum = 0;
            for (int64_t j = 0; j < K; ++j) sum += tw[t * K + j];
            *err = std::max(*err, std::fabs(sum - 1));
          }
          return *err < 1e-5;
        });
    router.rate = 2.0 * double(m) * double(E) * double(H) / router.seconds / 1e9;
    emit(router);

    if (!bf16_experts) continue;
    std::set<int32_t> touched(ids.begin(), ids.end());
    Row experts{.op = "moe_experts",
                .m = m,
                .shape = fmt::format("E={} k={} H={} I={}", E, K, H, I),
                .kernel = fmt::format("fused_experts ({} experts touched)", touched.size())};
    if (env.cpu.isa != Isa::scalar)
      if (const jit::TunedEntry* e = jit::find_tuned(
              "moe", jit::moe_shape_class(env.cpu.isa, num_threads(), E, K, H, I, m)))
        experts.kernel += fmt::format(" (tuned {})", jit::knobs_text(e->knobs));
    measure(
        experts, env, [&] { fused_experts(xv, p13, p2, wv, iv, ov); },
        [&](double* err) { return check_moe_rows(x, w13, w2, tw, ids, out, m, err); });
    if (m <= 16) {
      experts.bytes = true;
      experts.rate =
          double(touched.size()) * 3.0 * double(H) * double(I) * 2 / experts.seconds / 1e9;
    } else {
      experts.rate =
          2.0 * double(m) * double(K) * 3.0 * double(H) * double(I) / experts.seconds / 1e9;
    }
    emit(experts);
  }
  // The bf16 experts' 2.4 GB (weights and packs) go before the quantized ones are built.
  w13 = {};
  w2 = {};
  p13 = PackedExperts();
  p2 = PackedExperts();
  for (size_t f = 0; f < std::size(kMoeQuantFormats); ++f)
    if (moe_format_selected(env.opt, kMoeQuantFormats[f].name))
      quant_moe_rows(env, kMoeQuantFormats[f], steps, seed + 1000 * (f + 1), emit);
}

// ---- The table -------------------------------------------------------------------

std::string time_str(double s) {
  if (s < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (s < 1) return fmt::format("{:.2f} ms", s * 1e3);
  return fmt::format("{:.2f} s", s);
}

void print_header() {
  fmt::print("{:<13} {:>4} {:<32} {:<7} {:<56} {:>9} {:>14} {:>10} {:>10} {:>6} {}\n", "op", "M",
             "shape", "path", "kernel (plan key)", "time", "rate", "%peak", "compile ms", "hits",
             "check");
}

// The path as the table names it: AMX says whether it ran on tiles or under
// the tests' emulator (whose times are no hardware figures).
std::string path_str(const CpuInfo& cpu) {
  if (cpu.isa != Isa::amx) return isa_name(cpu.isa);
  return cpu.amx_emulated ? "amx-emu" : "amx";
}

void print_row(const Env& env, const Row& r) {
  // %peak: of the bf16 compute peak for GFLOP/s rows; for GB/s rows of the
  // DRAM streaming read, with the op's data hot in cache ("hot" marks it: a
  // figure above 100 % means the op ran from cache, not that it beat DRAM).
  const double limit = r.bytes ? env.read_gbs : r.int8 ? env.peak_int8 : env.peak_gflops;
  std::string pct =
      fmt::format("{:.1f}%{}", limit > 0 ? 100 * r.rate / limit : 0.0, r.bytes ? " hot" : "");
  if (env.cpu.amx_emulated) pct = "n/a";  // emulated: no percentage of a hardware peak
  fmt::print("{:<13} {:>4} {:<32} {:<7} {:<56} {:>9} {:>14} {:>10} {:>10.3f} {:>6} {}{}\n", r.op,
             r.m, r.shape, path_str(env.cpu), r.kernel, time_str(r.seconds),
             fmt::format("{:.1f} {}", r.rate, r.bytes ? "GB/s" : "GFLOP/s"), pct, r.compile_ms,
             r.hits, r.check, r.note.empty() ? "" : "  " + r.note);
  std::fflush(stdout);
}

}  // namespace

int run_llama_layer_job(const LlamaJobOptions& opt) {
  set_threads_option(opt.threads);
  check_seconds_option(opt.seconds);
  if (!opt.tuning_db.empty()) load_tuning_db(opt.tuning_db);
  Env env;
  env.cpu = cpu_info();
  env.opt = opt;
  const Isa peak_isa = env.cpu.isa == Isa::scalar ? env.cpu.max_isa : env.cpu.isa;
  // Emulated AMX has no hardware peak to measure: 0 (jit/peak.h).
  const double peak_core = jit::path_peak_gflops(peak_isa);
  env.peak_gflops = peak_core * env.cpu.num_threads;
  const double peak_int8_core = jit::path_peak_gflops(peak_isa, DType::u8);
  env.peak_int8 = peak_int8_core * env.cpu.num_threads;
  env.read_gbs = measure_read_gbs();
  fmt::print(
      "tilejit llama-layer: one Llama-3-8B decoder layer (hidden {}, {} q / {} kv heads of {}, "
      "MLP 14336) in execution order: GEMMs, RoPE, attention; then one Qwen3-30B-A3B-like MoE "
      "block; bf16 in, fp32 accumulate, bf16 "
      "out\n",
      kHidden, kHq, kHkv, kHeadDim);
  fmt::print(
      "path {} | threads {} | measured {} bf16 peak {:.1f} GFLOP/s per core, {:.1f} total, "
      "int8 peak {:.1f} GOP/s per core | streaming read {:.1f} GB/s\n",
      env.cpu.isa == Isa::amx ? (env.cpu.amx_emulated ? "amx (emulated)" : "amx (native)")
                              : isa_name(env.cpu.isa),
      env.cpu.num_threads, isa_name(peak_isa), peak_core, env.peak_gflops, peak_int8_core,
      env.read_gbs);
  if (env.cpu.amx_emulated)
    fmt::print(
        "AMX is EMULATED (TILEJIT_AMX_EMULATE): times are the emulator's, not hardware "
        "figures; %peak is not printed\n");
  fmt::print(
      "%peak: of the bf16 peak for GFLOP/s rows (of the int8 peak for int8 and W4A8 GEMMs); of "
      "the streaming read for GB/s rows, measured "
      "with the op's data hot in cache (\"hot\": above 100 % it ran from cache)\n");
  fmt::print(
      "M = tokens of the engine step: 1 = one decode token (context {}), 16 = a decode batch "
      "of 16 sequences or a 16-token prompt, 512 = a 512-token prompt\n",
      kDecodeContext);
  const int64_t fused_rows = ops::fused_max_rows(env.cpu.isa);
  fmt::print(
      "GEMM weights: {}; at M = 1 each GEMM row also prints the weight stream in GB/s "
      "(PackedWeight::packed_bytes() per call)\n",
      opt.weights == "int8" ? "int8 W8A8 (per-channel f32 scales, x quantized per token)"
      : opt.weights == "fp8"
          ? fmt::format("fp8 e4m3 (128x128 block scales): exact weights in the fused decode "
                        "kernel at M <= {}, dequantized to bf16 chunks above",
                        fused_rows)
      : opt.weights == "int4"
          ? fmt::format("int4 GPTQ (groups of 128, zero points), the automatic route: exact "
                        "weights in the fused decode kernel at M <= {} unless W4A8 (x quantized "
                        "per token) is faster there, W4A8 or bf16 chunks above",
                        fused_rows)
          : std::string("bf16"));
  std::string moe_formats;
  if (moe_format_selected(opt, "bf16")) moe_formats = "bf16";
  for (const MoeQuantFormat& f : kMoeQuantFormats)
    if (moe_format_selected(opt, f.name))
      moe_formats += fmt::format("{}{} = {}", moe_formats.empty() ? "" : "; ", f.name, f.what);
  fmt::print(
      "MoE experts: {}; at M <= 16 each moe_experts row reports the touched experts' weight "
      "stream in GB/s (PackedExperts::packed_bytes() / E per expert)\n\n",
      moe_formats.empty() ? "none" : moe_formats);

  const std::vector<int64_t> all_m = {1, 16, 512};
  const LayerGemm qkv{"qkv_proj", kQkvWidth, kHidden, Activation::none};
  const LayerGemm o{"o_proj", kHidden, kHq * kHeadDim, Activation::none};
  const LayerGemm gate_up{"gate_up_proj", 2 * 14336, kHidden, Activation::none};
  const LayerGemm down{"down_proj", kHidden, 14336, Activation::none};

  print_header();
  bool all_ok = true;
  const Emit emit = [&](const Row& r) {
    print_row(env, r);
    all_ok &= r.ok;
  };
  // The layer, op by op (a dense MLP: gate_up + down), then one MoE block in
  // place of that MLP.
  if (opt.only != "moe") {
    norm_rows(env, all_m, 50, /*fused=*/false, emit);
    gemm_rows(env, qkv, all_m, 1, emit);
    rope_rows(env, all_m, 100, emit);
    emit(decode_row(env, 1, 200));
    emit(decode_row(env, 16, 210));
    emit(decode_row(env, 16, 210, /*fp8=*/true));
    emit(prefill_row(env, 16, 300));
    emit(prefill_row(env, 512, 310));
    gemm_rows(env, o, all_m, 2000, emit);
    norm_rows(env, all_m, 2500, /*fused=*/true, emit);
    gemm_rows(env, gate_up, all_m, 3000, emit);
    act_rows(env, all_m, 3500, emit);
    gemm_rows(env, down, all_m, 4000, emit);
  }
  if (opt.only != "dense") moe_rows(env, all_m, 5000, emit);
  const CacheStats st = cache_stats();
  fmt::print(
      "\ncache: {} kernels, {} compiles, {:.2f} ms compiling, {} hits, {} misses, {} tuned plans "
      "(rows marked \"tuned\")\n",
      st.kernels, st.compiles, st.compile_seconds * 1e3, st.hits, st.misses, st.tuned_plans);
  if (!all_ok) {
    fmt::print(stderr, "tilejit llama-layer: some results differ from the scalar reference\n");
    return 1;
  }
  return 0;
}

}  // namespace tilejit::tools
