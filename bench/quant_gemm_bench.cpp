// quant_gemm_bench: tilejit::gemm with quantized weights (docs/quantized.md)
// against tilejit's own bf16 GEMM, the DRAM read bandwidth measured in the
// same run, and oneDNN's u8s8 matmul (int8 W8A8).
//
//   build/bench/quant_gemm_bench --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true --benchmark_filter=...
//
// TILEJIT_ISA picks the path; every row's label says the GEMM path that ran
// for its M (gemm runs M < 3 on the AVX-512 kernels even when AMX is active;
// an emulated AMX is labelled amx-emulated, never amx) and the packed layout.
//
// Sections (benchmark names; fmt is gptq_g128_zp, awq_g128_zp, fp8_channel,
// fp8_block128, int8_channel_sym):
//   BM_DramReadBandwidth/T/hugepages     streaming read over a 2 GiB buffer
//   BM_Bf16ColdDecode/N/K/T               bf16 M=1 over a rotating set of weight copies > L3
//   BM_QuantColdDecode/fmt/N/K/T          the same with quantized weights; vs DRAM, vs bf16
//   BM_Bf16Gemm/M/N/K/T                   bf16 GEMM, hot weights
//   BM_QuantGemm/fmt/M/N/K/T              quantized GEMM, hot weights; vs_bf16 (and
//                                         vs_onednn for int8); int4 also as
//                                         fmt_w4a16 / fmt_w4a8 (GemmOptions::int4_route)
//   BM_OnednnInt8Matmul/M/N/K/T           oneDNN u8 x s8 -> bf16 with per-N output scales
//                                         (its label: the implementation that ran)
//
// All timings are wall clock (UseRealTime: the library runs its own threads);
// the *_cpu counters divide the same work by the process CPU time / threads
// (bench_util.h Meter), the stable view on a shared machine.
// Counters:
//   GFLOPs          2·M·N·K per second
//   GBs             PackedWeight::packed_bytes() (codes + the scale / zero-point
//                   tables the kernels stream) per second; oneDNN: its packed weights
//   pct_dram_bw     GBs against the streaming read over huge pages measured right
//                   before the run (pct_dram_bw_4k: over 4 KiB pages, what a malloc'd
//                   buffer such as a packed weight gets)
//   bf16_GBs, speedup_vs_bf16   the bf16 M=1 cold decode of the same shape and threads
//                   in this run, and its time per call ÷ this one's: the ratio of tokens
//                   per second a memory-bound decode gets from the quantized weights
//   vs_bf16, bf16_GFLOPs        GFLOP/s ÷ the bf16 GEMM's at the same M, N, K, threads
//   vs_onednn, onednn_GFLOPs    int8: GFLOP/s ÷ oneDNN's u8s8 matmul (same shape, threads)
//   pct_peak        of threads × the peak of the path that ran (JIT probes,
//                   codegen/xbyak/peak_probe.cpp): bf16 for bf16, fp8 and int4
//                   (which run the bf16 kernels), int8 (tdpbusd / vpdpbusd) for int8.
// Every quantized (format, shape, M) is checked once against the bf16 GEMM on
// the weight's own dequantize() (relative L2 error ≤ 1e-2; int8, whose x is
// quantized per token, ≤ 3e-2), so a wrong kernel cannot post a fast number.
// A gemm that raises (e.g. int8 kernels not in yet on a path) skips its row
// with the message.
#include <benchmark/benchmark.h>
#include <omp.h>
#include <unistd.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "codegen/gemm_plan.h"
#include "dram_refs.h"
#include "onednn_context.h"
#include "runtime/aligned_buffer.h"
#include "runtime/bf16.h"
#include "runtime/exec_memory.h"
#include "runtime/quant_formats.h"
#include "tilejit/tilejit.h"

namespace {

using tilejit::DType;
using tilejit::Isa;
using tilejit::TensorView;
using namespace tilejit::bench;

// ---------------------------------------------------------------- data

// Activations for every shape (M ≤ 512, K ≤ 14336): bf16 for tilejit, u8 for oneDNN.
constexpr int64_t kMaxM = 512, kMaxDim = 14336;
const Buffer& activations() {
  static const Buffer b = [] {
    Buffer x(size_t(kMaxM) * kMaxDim * 2);
    fill_random_bf16(x.u16(), size_t(kMaxM) * kMaxDim, 7);
    return x;
  }();
  return b;
}
const Buffer& u8_activations() {
  static const Buffer b = [] {
    Buffer x(size_t(kMaxM) * kMaxDim);
    uint64_t s = 12345;
    for (size_t i = 0; i < x.bytes; ++i) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      x.u8()[i] = static_cast<uint8_t>(s >> 56);
    }
    return x;
  }();
  return b;
}
void* output_buffer() {
  static Buffer y(size_t(kMaxM) * kMaxDim * 4);
  return y.mem.get();
}

// xorshift64 words (checkpoint codes: every 4-bit nibble is a valid int4 code).
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
};

// bf16 [N, K] weights and their packing, per shape, kept for the run.
struct Bf16Weight {
  std::vector<uint16_t> raw;
  tilejit::PackedWeight packed;
};
const Bf16Weight& bf16_weight(int64_t n, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Bf16Weight>> cache;
  auto& slot = cache[{n, k}];
  if (!slot) {
    slot = std::make_unique<Bf16Weight>();
    slot->raw.resize(size_t(n) * k);
    fill_repeating_bf16(slot->raw.data(), slot->raw.size(), uint64_t(n * 31 + k),
                        1.0f / std::sqrt(float(k)));
    slot->packed = tilejit::pack_weight(TensorView(slot->raw.data(), DType::bf16, {n, k}));
  }
  return *slot;
}

// ---------------------------------------------------------------- checkpoints

enum class QFmt { gptq, awq, fp8_channel, fp8_block, int8, mxfp4 };
const char* qfmt_name(QFmt f) {
  switch (f) {
    case QFmt::gptq:
      return "gptq_g128_zp";
    case QFmt::awq:
      return "awq_g128_zp";
    case QFmt::fp8_channel:
      return "fp8_channel";
    case QFmt::fp8_block:
      return "fp8_block128";
    case QFmt::int8:
      return "int8_channel_sym";
    case QFmt::mxfp4:
      return "mxfp4";
  }
  return "?";
}

// A layer's checkpoint tensors in the format's own storage (as a GPTQ / AWQ /
// fp8 / W8A8 export holds them; tests/quant_gemm_test.cpp builds the same
// layouts), with random codes and scales ~ 1/sqrt(K) per unit code.
struct Checkpoint {
  QFmt fmt;
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales_f16;
  std::vector<float> scales_f32;
  std::vector<uint8_t> codes;  // fp8 e4m3 / int8 / MXFP4 blocks
  std::vector<uint8_t> e8m0;   // MXFP4 scales
  tilejit::Mxfp4Weight mx;
  tilejit::Int4Weight int4;
  tilejit::Fp8Weight fp8;
  tilejit::Int8Weight int8;
  tilejit::PackedWeight pack() const {
    switch (fmt) {
      case QFmt::gptq:
      case QFmt::awq:
        return tilejit::pack_weight(int4);
      case QFmt::fp8_channel:
      case QFmt::fp8_block:
        return tilejit::pack_weight(fp8);
      case QFmt::int8:
        return tilejit::pack_weight(int8);
      case QFmt::mxfp4:
        return tilejit::pack_weight(mx);
    }
    return {};
  }
};

// f16 bits of 2^e · (1 + m/1024), e in the normal range.
uint16_t f16_bits(int e, uint32_t m) {
  return static_cast<uint16_t>((uint32_t(e + 15) << 10) | (m & 0x3FF));
}

std::unique_ptr<Checkpoint> make_checkpoint(QFmt fmt, int64_t N, int64_t K) {
  auto ck = std::make_unique<Checkpoint>();
  ck->fmt = fmt;
  Rng rng(uint64_t(fmt) * 1000003 + uint64_t(N) * 131 + uint64_t(K));
  // Unit-code scale ~ 1/sqrt(K) (outputs of order one for |x| ≤ 1).
  const int sexp = static_cast<int>(std::floor(std::log2(1.0 / std::sqrt(double(K)))));
  switch (fmt) {
    case QFmt::gptq:
    case QFmt::awq: {
      const bool awq = fmt == QFmt::awq;
      constexpr int64_t group = 128;
      const int64_t G = (K + group - 1) / group, n8 = (N + 7) / 8, k8 = (K + 7) / 8;
      ck->qweight.resize(size_t(awq ? K * n8 : k8 * N));
      for (auto& v : ck->qweight) v = static_cast<int32_t>(rng.next() >> 32);
      // Zero points: AWQ stores z, GPTQ v1 z − 1; every nibble is a valid value.
      ck->qzeros.resize(size_t(G * n8));
      for (auto& v : ck->qzeros) v = static_cast<int32_t>(rng.next() >> 32);
      ck->scales_f16.resize(size_t(G * N));
      for (auto& v : ck->scales_f16) v = f16_bits(sexp - 3, uint32_t(rng.next() >> 54));
      tilejit::Int4Weight& w = ck->int4;
      w.format = awq ? tilejit::Int4Format::awq : tilejit::Int4Format::gptq;
      w.qweight = awq ? TensorView(ck->qweight.data(), DType::i32, {K, n8})
                      : TensorView(ck->qweight.data(), DType::i32, {k8, N});
      w.scales = TensorView(ck->scales_f16.data(), DType::f16, {G, N});
      w.qzeros = TensorView(ck->qzeros.data(), DType::i32, {G, n8});
      w.group_size = group;
      w.n = N, w.k = K;
      break;
    }
    case QFmt::fp8_channel:
    case QFmt::fp8_block: {
      ck->codes.resize(size_t(N * K));
      for (auto& c : ck->codes) {
        do c = static_cast<uint8_t>(rng.next() >> 56);
        while ((c & 0x7F) == 0x7F);  // NaN codes are refused
      }
      const bool block = fmt == QFmt::fp8_block;
      const int64_t gn = block ? (N + 127) / 128 : N, gk = block ? (K + 127) / 128 : 1;
      ck->scales_f32.resize(size_t(gn * gk));
      for (auto& s : ck->scales_f32)
        s = std::ldexp(1.0f + float(rng.next() >> 61) / 8.0f, sexp - 6);
      ck->fp8.weight = TensorView(ck->codes.data(), DType::f8e4m3, {N, K});
      ck->fp8.scales = block ? TensorView(ck->scales_f32.data(), DType::f32, {gn, gk})
                             : TensorView(ck->scales_f32.data(), DType::f32, {gn});
      if (block) ck->fp8.block_n = 128, ck->fp8.block_k = 128;
      break;
    }
    case QFmt::int8: {
      ck->codes.resize(size_t(N * K));
      for (auto& c : ck->codes) c = static_cast<uint8_t>(rng.next() >> 56);
      ck->scales_f32.resize(size_t(N));
      for (auto& s : ck->scales_f32)
        s = std::ldexp(1.0f + float(rng.next() >> 61) / 8.0f, sexp - 7);
      ck->int8.weight = TensorView(ck->codes.data(), DType::i8, {N, K});
      ck->int8.scales = TensorView(ck->scales_f32.data(), DType::f32, {N});
      break;
    }
    case QFmt::mxfp4: {  // GPT-OSS's form: blocks [N, K/32, 16], e8m0 scales [N, K/32]
      const int64_t G = (K + 31) / 32;
      ck->codes.resize(size_t(N * G * 16));
      for (auto& c : ck->codes) c = static_cast<uint8_t>(rng.next() >> 56);
      ck->e8m0.resize(size_t(N * G));
      for (auto& e : ck->e8m0) e = static_cast<uint8_t>(127 + sexp - 2 + int(rng.next() >> 62));
      ck->mx.blocks = TensorView(ck->codes.data(), DType::u8, {N, G, 16});
      ck->mx.scales = TensorView(ck->e8m0.data(), DType::u8, {N, G});
      ck->mx.k = K;
      break;
    }
  }
  return ck;
}

using QKey = std::tuple<QFmt, int64_t, int64_t>;  // format, N, K

// The checkpoint and its hot packing, per format and shape, kept for the run.
struct QWeight {
  std::unique_ptr<Checkpoint> ck;
  tilejit::PackedWeight packed;
  std::string pack_error;  // pack_weight raised
};
QWeight& qweight(QFmt fmt, int64_t n, int64_t k) {
  static std::map<QKey, std::unique_ptr<QWeight>> cache;
  auto& slot = cache[{fmt, n, k}];
  if (!slot) {
    slot = std::make_unique<QWeight>();
    slot->ck = make_checkpoint(fmt, n, k);
    try {
      slot->packed = slot->ck->pack();
    } catch (const tilejit::Error& e) {
      slot->pack_error = std::string("pack_weight raised: ") + e.what();
    }
  }
  return *slot;
}

// ---------------------------------------------------------------- path and peak

// The GEMM path gemm() runs for M rows on the active path.
Isa gemm_path(int64_t m) {
  return tilejit::codegen::gemm_isa_for_rows(tilejit::cpu_info().isa, m);
}
std::string path_name(int64_t m) {
  const Isa isa = gemm_path(m);
  if (isa == Isa::amx && tilejit::cpu_info().amx_emulated) return "amx-emulated";
  return tilejit::isa_name(isa);
}

// Per-core peak (GFLOP/s; u8: GOP/s) of the path `isa` (jit/peak.h): 0 on
// scalar and emulated AMX.
double path_peak_per_core(Isa isa, DType op = DType::bf16) {
  return tilejit::jit::path_peak_gflops(isa, op);
}

// ---------------------------------------------------------------- rate logs

// Rates of the reference runs (bf16 GEMM, oneDNN) measured in this process:
// the denominators of the ratios. Runs shorter than 0.1 s are not kept unless
// nothing else exists (Google Benchmark's iteration estimation).
struct RateLog {
  std::vector<double> long_runs, short_runs, cpu;
  void add(double rate, double seconds, double cpu_rate) {
    (seconds >= 0.1 ? long_runs : short_runs).push_back(rate);
    if (seconds >= 0.1 || cpu.empty()) cpu.push_back(cpu_rate);
  }
  bool empty() const { return long_runs.empty() && short_runs.empty(); }
  double rate() const { return median(long_runs.empty() ? short_runs : long_runs); }
  double cpu_rate() const { return median(cpu); }
};
using RateKey = std::tuple<std::string, int64_t, int64_t, int64_t, int>;  // kind, M, N, K, T
std::map<RateKey, RateLog>& rate_logs() {
  static std::map<RateKey, RateLog> m;
  return m;
}

// Runs `call` for at least 0.3 s (and `min_calls` calls): a reference whose
// own benchmark was filtered out.
template <class F>
void measure_into(RateLog& log, int threads, double work_per_call, int64_t min_calls, F call) {
  call(0);
  int64_t calls = 0;
  const Meter t(threads);
  while (t.wall() < 0.3 || calls < min_calls) call(++calls);
  log.add(work_per_call * double(calls) / t.wall(), 1.0, work_per_call * double(calls) / t.cpu());
}

// ---------------------------------------------------------------- checks

double rel_l2(const float* a, const float* ref, size_t n) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(ref[i]);
    err += d * d;
    norm += double(ref[i]) * double(ref[i]);
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

// Once per (format, shape, M): y of the quantized gemm against the bf16 gemm
// on the weight's own dequantize() (rounded to bf16, as the dequant kernels
// round it), both f32 out. Returns an error text, or "" when it agrees.
std::string check_quant(QFmt fmt, int64_t m, int64_t n, int64_t k, const tilejit::PackedWeight& w,
                        const tilejit::GemmOptions& opt = {}) {
  static std::map<std::tuple<QFmt, int64_t, int64_t, int64_t, tilejit::Int4Route>, std::string>
      checked;
  const auto key = std::make_tuple(fmt, m, n, k, opt.int4_route);
  if (auto it = checked.find(key); it != checked.end()) return it->second;
  std::string msg;
  try {
    std::vector<uint16_t> deq(size_t(n) * k);
    w.dequantize(TensorView(deq.data(), DType::bf16, {n, k}));
    const tilejit::PackedWeight ref_w =
        tilejit::pack_weight(TensorView(deq.data(), DType::bf16, {n, k}));
    const TensorView x(activations().u16(), DType::bf16, {m, k});
    std::vector<float> ref(size_t(m) * n);
    tilejit::gemm(x, ref_w, TensorView(ref.data(), DType::f32, {m, n}));
    auto* y = static_cast<float*>(output_buffer());
    tilejit::gemm(x, w, TensorView(y, DType::f32, {m, n}), opt);
    const double rel = rel_l2(y, ref.data(), ref.size());
    // x quantized per token (W8A8, W4A8): 3e-2.
    const bool int8_x = fmt == QFmt::int8 || opt.int4_route == tilejit::Int4Route::w4a8;
    const double tol = int8_x ? 3e-2 : 1e-2;
    if (!(rel <= tol)) {
      char buf[200];
      std::snprintf(buf, sizeof buf,
                    "quantized gemm differs from the bf16 gemm on its dequantized weight: "
                    "relative L2 error %.3g > %.0e",
                    rel, tol);
      msg = buf;
    }
  } catch (const tilejit::Error& e) {
    msg = std::string("gemm raised: ") + e.what();
  }
  checked[key] = msg;
  return msg;
}

std::string label_for(int64_t m, const tilejit::PackedWeight& w) {
  return "path=" + path_name(m) + " " + w.layout();
}

// ---------------------------------------------------------------- cold pools

// The rotating set of weight copies for cold decode: more bytes than
// max(1 GiB, 2 × L3) (this VM reports a 504 MiB L3: gemm_bench's 1 GiB is only
// 2× it), so each call reads a copy evicted long ago. One pool live at a time.
size_t cold_set_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<size_t>(kGiB, l3 > 0 ? 2 * size_t(l3) : 0);
}
size_t copies_for(size_t bytes) {
  return cold_set_bytes() / bytes + 2;
}

// Pool key: format (-1: bf16), N, K.
struct ColdPool {
  std::tuple<int, int64_t, int64_t> key{-2, 0, 0};
  std::vector<tilejit::PackedWeight> copies;
};
const std::vector<tilejit::PackedWeight>& cold_copies(int fmt, int64_t n, int64_t k) {
  static ColdPool pool;
  const auto key = std::make_tuple(fmt, n, k);
  if (pool.key != key) {
    pool.copies.clear();
    pool.key = key;
    const tilejit::PackedWeight first =
        fmt < 0 ? bf16_weight(n, k).packed : qweight(QFmt(fmt), n, k).packed;
    const size_t count = copies_for(first.packed_bytes());
    pool.copies.resize(count);
    // Pack on two threads (packing is not what this measures).
    std::vector<std::thread> th;
    for (int t = 0; t < 2; ++t)
      th.emplace_back([&, t] {
        for (size_t i = t; i < count; i += 2)
          pool.copies[i] = fmt < 0 ? tilejit::pack_weight(TensorView(bf16_weight(n, k).raw.data(),
                                                                     DType::bf16, {n, k}))
                                   : qweight(QFmt(fmt), n, k).ck->pack();
      });
    for (auto& t : th) t.join();
  }
  return pool.copies;
}

using ShapeKey = std::tuple<int64_t, int64_t, int64_t, int>;  // M, N, K, T

// Rates are logged in calls per second (the work of a call differs between
// bf16 and the quantized formats; tokens per second is what compares).
RateLog& bf16_cold_log(int64_t n, int64_t k, int threads) {
  RateLog& log = rate_logs()[{"bf16_cold", 1, n, k, threads}];
  if (log.empty()) {
    const auto& copies = cold_copies(-1, n, k);
    tilejit::set_num_threads(threads);
    const TensorView x(activations().u16(), DType::bf16, {1, k});
    const TensorView y(output_buffer(), DType::bf16, {1, n});
    measure_into(log, threads, 1.0, int64_t(copies.size()),
                 [&](int64_t i) { tilejit::gemm(x, copies[size_t(i) % copies.size()], y); });
  }
  return log;
}

// One cold M = 1 run over `copies` (the part the bf16 and quantized rows
// share): warm-up, the DRAM references, the rotating calls, the counters.
struct ColdRun {
  double s, cpu, it;  // wall and CPU seconds, iterations
};
ColdRun run_cold_decode(benchmark::State& state, const std::vector<tilejit::PackedWeight>& copies,
                        int64_t n, int64_t k, int threads) {
  tilejit::set_num_threads(threads);
  const TensorView x(activations().u16(), DType::bf16, {1, k});
  const TensorView y(output_buffer(), DType::bf16, {1, n});
  tilejit::gemm(x, copies[0], y);  // warm-up (compile)
  const DramRefs dram = measure_dram_refs(threads);
  size_t next = 1 % copies.size();
  const Meter t(threads);
  for (auto _ : state) {
    tilejit::gemm(x, copies[next], y);
    if (++next == copies.size()) next = 0;
  }
  const ColdRun r{t.wall(), t.cpu(), double(state.iterations())};
  set_cold_counters(state, double(copies[0].packed_bytes()), t, dram, 2.0 * n * k);
  state.counters["copies"] = double(copies.size());
  state.SetLabel(label_for(1, copies[0]));
  return r;
}

void BM_Bf16ColdDecode(benchmark::State& state) {
  const int64_t n = state.range(0), k = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  const ColdRun r = run_cold_decode(state, cold_copies(-1, n, k), n, k, threads);
  rate_logs()[{"bf16_cold", 1, n, k, threads}].add(r.it / r.s, r.s, r.it / r.cpu);
}

void BM_QuantColdDecode(benchmark::State& state, QFmt fmt) {
  const int64_t n = state.range(0), k = state.range(1);
  const int threads = static_cast<int>(state.range(2));
  QWeight& qw = qweight(fmt, n, k);
  if (!qw.pack_error.empty()) return skip(state, qw.pack_error);
  tilejit::set_num_threads(threads);
  if (const std::string err = check_quant(fmt, 1, n, k, qw.packed); !err.empty())
    return skip(state, err);
  const RateLog& bf16 = bf16_cold_log(n, k, threads);
  const double bf16_bytes = double(bf16_weight(n, k).packed.packed_bytes());
  const ColdRun r = run_cold_decode(state, cold_copies(int(fmt), n, k), n, k, threads);
  state.counters["bf16_GBs"] = bf16.rate() * bf16_bytes * 1e-9;
  state.counters["bf16_GBs_cpu"] = bf16.cpu_rate() * bf16_bytes * 1e-9;
  state.counters["speedup_vs_bf16"] = bf16.rate() > 0 ? r.it / r.s / bf16.rate() : 0.0;
  state.counters["speedup_vs_bf16_cpu"] =
      bf16.cpu_rate() > 0 ? r.it / r.cpu / bf16.cpu_rate() : 0.0;
}

// ---------------------------------------------------------------- hot GEMMs

void set_hot_counters(benchmark::State& state, const Meter& t, int64_t m, int64_t n, int64_t k,
                      int threads, double weight_bytes, bool bf16_kernels) {
  const double s = t.wall(), cpu = t.cpu(), it = double(state.iterations());
  const double flops = 2.0 * m * n * k;
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs_cpu"] = flops * it / cpu * 1e-9;
  state.counters["GBs"] =
      benchmark::Counter(weight_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  {
    // fp8 / int4 run the bf16 kernels; int8 the int8 ones (their own probe).
    const double peak =
        path_peak_per_core(gemm_path(m), bf16_kernels ? DType::bf16 : DType::u8) * threads;
    state.counters["peak_per_core"] = peak / threads;
    state.counters["pct_peak"] = peak > 0 ? 100.0 * flops * it / s * 1e-9 / peak : 0.0;
    state.counters["pct_peak_cpu"] = peak > 0 ? 100.0 * flops * it / cpu * 1e-9 / peak : 0.0;
  }
}

RateLog& bf16_hot_log(int64_t m, int64_t n, int64_t k, int threads) {
  RateLog& log = rate_logs()[{"bf16", m, n, k, threads}];
  if (log.empty()) {
    tilejit::set_num_threads(threads);
    const tilejit::PackedWeight& w = bf16_weight(n, k).packed;
    const TensorView x(activations().u16(), DType::bf16, {m, k});
    const TensorView y(output_buffer(), DType::bf16, {m, n});
    measure_into(log, threads, 2.0 * m * n * k * 1e-9, 2, [&](int64_t) { tilejit::gemm(x, w, y); });
  }
  return log;
}

void BM_Bf16Gemm(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  tilejit::set_num_threads(threads);
  const tilejit::PackedWeight& w = bf16_weight(n, k).packed;
  const TensorView x(activations().u16(), DType::bf16, {m, k});
  const TensorView y(output_buffer(), DType::bf16, {m, n});
  tilejit::gemm(x, w, y);  // warm-up (compile)
  const Meter t(threads);
  for (auto _ : state) tilejit::gemm(x, w, y);
  const double s = t.wall(), cpu = t.cpu(), flops = 2.0 * m * n * k * double(state.iterations());
  rate_logs()[{"bf16", m, n, k, threads}].add(flops / s * 1e-9, s, flops / cpu * 1e-9);
  set_hot_counters(state, t, m, n, k, threads, double(w.packed_bytes()), true);
  state.SetLabel(label_for(m, w));
}

// ---------------------------------------------------------------- oneDNN int8

// oneDNN 2.x matmul: u8 src [M, K] × s8 weights [K, N] (packed by the
// primitive) -> bf16 dst, the per-N weight scales as output scales given at
// creation (set_output_scales(1 << 1, scales): they are known at load time).
// oneDNN 2.6.3 has no brgemm kernel for run-time output scales
// ({DNNL_RUNTIME_F32_VAL}): with them this primitive is ref_int8:any (bf16
// dst, ~0.05 GFLOP/s) or gemm:jit (f32 dst), so that is not the baseline.
// Without AVX-512 (an AVX2-only AMD EPYC) even the creation-time scales with
// a bf16 dst get ref_int8:any (0.035 GFLOP/s at M = 1; minutes a call at
// M = 512): there the peer is the f32 dst (one more store width than ours),
// and where that is a reference implementation too, no peer (skipped with
// the implementation's name, never timed as one).
struct OnednnInt8 {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory src, wei, dst;
  std::string impl;

  OnednnInt8(int64_t m, int64_t n, int64_t k, const uint8_t* x, const int8_t* w_nk,
             const float* w_scales, void* y) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc src_md({m, k}, dt::u8, tag::ab);
    const dnnl::memory::desc wei_any({k, n}, dt::s8, tag::any);
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, std::vector<float>(w_scales, w_scales + n));
    dnnl::memory::desc dst_md;
    for (const dt out : {dt::bf16, dt::f32}) {
      dst_md = dnnl::memory::desc({m, n}, out, tag::ab);
      pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_any, dst_md), attr, eng);
      impl = pd.impl_info_str();
      if (impl.rfind("ref", 0) != 0) break;
    }
    if (impl.rfind("ref", 0) == 0)
      throw std::runtime_error("oneDNN has only its reference implementation (" + impl +
                               ") for this u8s8 matmul on this CPU: no peer");
    if (dst_md.data_type() == dt::f32) impl += " f32 dst";
    prim = dnnl::matmul(pd);
    src = dnnl::memory(src_md, eng, const_cast<uint8_t*>(x));
    dst = dnnl::memory(dst_md, eng, y);
    dnnl::memory plain({{k, n}, dt::s8, tag::ba}, eng, const_cast<int8_t*>(w_nk));
    wei = dnnl::memory(pd.weights_desc(), eng);
    dnnl::reorder(plain, wei).execute(strm, plain, wei);
    strm.wait();
  }
  void run() {
    prim.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
  size_t weight_bytes() const { return pd.weights_desc().get_size(); }
};

OnednnInt8& onednn_int8(const ShapeKey& key) {
  static ShapeKey current{-1, -1, -1, -1};
  static std::unique_ptr<OnednnInt8> mm;
  if (!mm || key != current) {
    mm.reset();
    const auto [m, n, k, threads] = key;
    omp_set_num_threads(threads);  // oneDNN (OpenMP build) partitions at creation
    const Checkpoint& ck = *qweight(QFmt::int8, n, k).ck;
    mm = std::make_unique<OnednnInt8>(m, n, k, u8_activations().u8(),
                                      reinterpret_cast<const int8_t*>(ck.codes.data()),
                                      ck.scales_f32.data(), output_buffer());
    current = key;
  }
  return *mm;
}

void BM_OnednnInt8Matmul(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  omp_set_num_threads(threads);
  OnednnInt8* mm = nullptr;
  try {
    mm = &onednn_int8({m, n, k, threads});
  } catch (const std::exception& e) {  // dnnl::error, or no peer (reference only)
    return skip(state, std::string("oneDNN: ") + e.what());
  }
  mm->run();  // warm-up
  const Meter t(threads);
  for (auto _ : state) mm->run();
  const double s = t.wall(), cpu = t.cpu(), flops = 2.0 * m * n * k * double(state.iterations());
  rate_logs()[{"onednn_int8", m, n, k, threads}].add(flops / s * 1e-9, s, flops / cpu * 1e-9);
  set_hot_counters(state, t, m, n, k, threads, double(mm->weight_bytes()), false);
  state.SetLabel(mm->impl);
}

const RateLog* onednn_int8_log(int64_t m, int64_t n, int64_t k, int threads) {
  RateLog& log = rate_logs()[{"onednn_int8", m, n, k, threads}];
  if (log.empty()) {
    omp_set_num_threads(threads);
    try {
      OnednnInt8& mm = onednn_int8({m, n, k, threads});
      measure_into(log, threads, 2.0 * m * n * k * 1e-9, 2, [&](int64_t) { mm.run(); });
    } catch (const std::exception&) {  // dnnl::error, or no peer (reference only)
      return nullptr;
    }
  }
  return &log;
}

// ---------------------------------------------------------------- quantized hot

void BM_QuantGemm(benchmark::State& state, QFmt fmt, tilejit::Int4Route route) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  QWeight& qw = qweight(fmt, n, k);
  if (!qw.pack_error.empty()) return skip(state, qw.pack_error);
  tilejit::set_num_threads(threads);
  tilejit::GemmOptions opt;
  opt.int4_route = route;
  if (const std::string err = check_quant(fmt, m, n, k, qw.packed, opt); !err.empty())
    return skip(state, err);
  const RateLog& bf16 = bf16_hot_log(m, n, k, threads);
  const RateLog* dnnl = fmt == QFmt::int8 ? onednn_int8_log(m, n, k, threads) : nullptr;
  tilejit::set_num_threads(threads);
  const TensorView x(activations().u16(), DType::bf16, {m, k});
  const TensorView y(output_buffer(), DType::bf16, {m, n});
  tilejit::gemm(x, qw.packed, y, opt);  // warm-up (compile)
  const Meter t(threads);
  for (auto _ : state) tilejit::gemm(x, qw.packed, y, opt);
  const double s = t.wall(), cpu = t.cpu(), flops = 2.0 * m * n * k * double(state.iterations());
  const double g = flops / s * 1e-9, g_cpu = flops / cpu * 1e-9;
  // W8A8 and W4A8 run the int8 kernels: their peak is the int8 one.
  const bool int8_kernels = fmt == QFmt::int8 || (route == tilejit::Int4Route::w4a8 &&
                                                  (fmt == QFmt::gptq || fmt == QFmt::awq));
  set_hot_counters(state, t, m, n, k, threads, double(qw.packed.packed_bytes()), !int8_kernels);
  state.counters["bf16_GFLOPs"] = bf16.rate();
  state.counters["vs_bf16"] = bf16.rate() > 0 ? g / bf16.rate() : 0.0;
  state.counters["vs_bf16_cpu"] = bf16.cpu_rate() > 0 ? g_cpu / bf16.cpu_rate() : 0.0;
  if (dnnl != nullptr) {
    state.counters["onednn_GFLOPs"] = dnnl->rate();
    state.counters["vs_onednn"] = dnnl->rate() > 0 ? g / dnnl->rate() : 0.0;
    state.counters["vs_onednn_cpu"] = dnnl->cpu_rate() > 0 ? g_cpu / dnnl->cpu_rate() : 0.0;
  }
  state.SetLabel(label_for(m, qw.packed) + (route == tilejit::Int4Route::w4a8    ? " w4a8"
                                            : route == tilejit::Int4Route::w4a16 ? " w4a16"
                                                                                 : ""));
}

// ---------------------------------------------------------------- registration

void register_all() {
  using benchmark::RegisterBenchmark;
  const std::vector<int> threads = {1, 2};
  for (int huge : {1, 0})
    for (int t : threads)
      RegisterBenchmark("BM_DramReadBandwidth", BM_DramReadBandwidth)
          ->Args({t, huge})
          ->ArgNames({"threads", "hugepages"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);

  // Llama-2/3 shapes: attention 4096², MLP up 14336×4096, MLP down 4096×14336.
  const std::vector<std::pair<int64_t, int64_t>> nk = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
  const QFmt int4[] = {QFmt::gptq, QFmt::awq, QFmt::mxfp4};
  const QFmt fp8[] = {QFmt::fp8_channel, QFmt::fp8_block};
  auto name = [](const char* bm, QFmt f) { return std::string(bm) + "/" + qfmt_name(f); };
  constexpr tilejit::Int4Route kAuto = tilejit::Int4Route::automatic;

  // 1, 3: M = 1, cold weights; per shape the bf16 reference first (its pool,
  // then each format's, are built once for both thread counts).
  for (auto [n, k] : nk) {
    for (int t : threads)
      RegisterBenchmark("BM_Bf16ColdDecode", BM_Bf16ColdDecode)
          ->Args({n, k, t})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    for (QFmt f : {QFmt::gptq, QFmt::awq, QFmt::fp8_channel, QFmt::fp8_block, QFmt::mxfp4})
      for (int t : threads)
        RegisterBenchmark(name("BM_QuantColdDecode", f).c_str(), BM_QuantColdDecode, f)
            ->Args({n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  }

  // 2, 3: hot GEMMs against bf16 at the same shape (bf16 right before).
  for (auto [n, k] : nk)
    for (int64_t m : {256, 512})
      for (int t : threads) {
        RegisterBenchmark("BM_Bf16Gemm", BM_Bf16Gemm)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
        if (m == 512)
          for (QFmt f : int4)
            RegisterBenchmark(name("BM_QuantGemm", f).c_str(), BM_QuantGemm, f, kAuto)
                ->Args({m, n, k, t})
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        // int4 on each route, whatever the automatic choice at this M.
        for (QFmt f : {QFmt::gptq, QFmt::awq})
          for (auto [route, suffix] : {std::pair{tilejit::Int4Route::w4a16, "_w4a16"},
                                       std::pair{tilejit::Int4Route::w4a8, "_w4a8"}})
            RegisterBenchmark((name("BM_QuantGemm", f) + suffix).c_str(), BM_QuantGemm, f, route)
                ->Args({m, n, k, t})
                ->UseRealTime()
                ->Unit(benchmark::kMillisecond);
        for (QFmt f : fp8)
          RegisterBenchmark(name("BM_QuantGemm", f).c_str(), BM_QuantGemm, f, kAuto)
              ->Args({m, n, k, t})
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
      }

  // int4's two routes at the small M where the automatic choice switches
  // (ops::w4a8_automatic: 4 rows on llvm, 5 on avx512; hot weights: the
  // compute side of decode).
  for (int64_t m : {1, 2, 4, 5, 8, 16, 32, 64})
    for (int t : threads)
      for (auto [route, suffix] : {std::pair{tilejit::Int4Route::w4a16, "_w4a16"},
                                   std::pair{tilejit::Int4Route::w4a8, "_w4a8"}})
        RegisterBenchmark((name("BM_QuantGemm", QFmt::gptq) + suffix).c_str(), BM_QuantGemm,
                          QFmt::gptq, route)
            ->Args({m, 4096, 4096, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);

  // 4: int8 W8A8 against oneDNN u8s8 (oneDNN right before).
  for (auto [n, k] : nk)
    for (int64_t m : {256, 512, 1})
      for (int t : threads) {
        RegisterBenchmark("BM_OnednnInt8Matmul", BM_OnednnInt8Matmul)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        RegisterBenchmark(name("BM_QuantGemm", QFmt::int8).c_str(), BM_QuantGemm, QFmt::int8, kAuto)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  return benchmark_main(argc, argv, register_all, [] {
    const tilejit::CpuInfo ci = tilejit::cpu_info();
    benchmark::AddCustomContext("tilejit_max_isa", tilejit::isa_name(ci.max_isa));
    benchmark::AddCustomContext("amx_emulated", ci.amx_emulated ? "yes" : "no");
    benchmark::AddCustomContext("path_m1", path_name(1));
    benchmark::AddCustomContext("path_m256", path_name(256));
    benchmark::AddCustomContext("cold_set_bytes", std::to_string(cold_set_bytes()));
    benchmark::AddCustomContext("int8_peak_probe", "none (peak_probe.cpp has bf16 probes only)");
    add_onednn_context();
  });
}
