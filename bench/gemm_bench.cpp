// gemm_bench: tilejit GEMM against oneDNN and against this machine's measured
// limits (bf16 peak from the JIT peak probe, DRAM read bandwidth).
//
//   build-bench/bench/gemm_bench --benchmark_repetitions=5
//       --benchmark_display_aggregates_only=true --benchmark_filter=...
// (docs/gemm-performance.md has the exact commands and bench/tabulate.py the
// tables; the whole binary with default settings ran in 3 min 43 s on an idle
// machine, longer when shared.)
//
// Sections (benchmark names):
//   BM_PeakAvx512Bf16/T, BM_PeakAmxBf16/T    register-only dot-product peak
//   BM_PeakLlvmVector/T                      the same, the host's best vector FMA
//                                            (vdpbf16ps / vfmadd231ps zmm or ymm)
//   BM_DramReadBandwidth/T/hugepages         streaming read over a 2 GiB buffer
//   BM_L3ReadBandwidth/T                     the same over 32 MiB, hot in the LLC
//   BM_OnednnMatmul/M/N/K/T                  oneDNN bf16 matmul (packed weights)
//   BM_TilejitGemm/M/N/K/T                   tilejit::gemm, same shape; vs_onednn
//   BM_{Onednn,Tilejit}*DecodeSweep/1/4096/K/T  M=1 with 8..64 MiB of weights (vs L3)
//   BM_TilejitGemmColdWeights/M/N/K/T        decode over > 1 GiB of weight copies
//   BM_OnednnMatmulColdWeights/M/N/K/T       the same for oneDNN
//   BM_JitCompileMicrokernel/mr/nr/kb        emit one micro-kernel + W^X placement
//   BM_GemmFirstCall                         a gemm call that misses the cache
//   BM_OnednnPrimitiveCreate/M               oneDNN pd + primitive, cache disabled
//   BM_CacheHitOverhead, BM_RawMicrokernel   per-call cost on a tiny shape
//   BM_GemmAfterIdleGap/gap_us/threads       M=1 1024 x 1024 after an idle gap
//   BM_BrgemmMicrokernel/mr/K                one micro-kernel over a warm 64 × K panel
//   BM_RawDecodeColdPages/hugepages          M=1 cold decode, 4 KiB vs 2 MiB pages
//
// All timings are wall clock (UseRealTime): the library runs its own threads.
// The *_cpu counters divide the same work by the process CPU time / threads
// (see Meter): on a shared machine they exclude the time other processes held
// the cores, so they are the stable view; spin-waiting still counts.
// Counters: GFLOPs (2·M·N·K per second), pct_peak (of threads × the measured
// per-core peak), vs_onednn (tilejit GFLOP/s ÷ oneDNN's median GFLOP/s for the
// same shape and threads, measured earlier in the same process), GBs and
// pct_dram_bw (weight bytes read per second, of the measured DRAM bandwidth).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/gemm_plan.h"
#include "codegen/xbyak/emitters.h"
#include "dram_bandwidth.h"
#include "dram_refs.h"
#include "jit/registry.h"
#include "onednn_context.h"
#include "ops/packed_weight_impl.h"
#include "runtime/aligned_buffer.h"
#include "runtime/bf16.h"
#include "runtime/exec_memory.h"
#include "tilejit/tilejit.h"

namespace {

using tilejit::DType;
using tilejit::Isa;
using tilejit::TensorView;
using namespace tilejit::bench;

// ---------------------------------------------------------------- data

// Activations: one random buffer big enough for every shape (M ≤ 1024, K ≤ 11008).
constexpr int64_t kMaxM = 1024, kMaxDim = 11008;
const Buffer& activations() {
  static const Buffer b = [] {
    Buffer x(size_t(kMaxM) * kMaxDim * 2);
    fill_random_bf16(x.u16(), size_t(kMaxM) * kMaxDim, 7);
    return x;
  }();
  return b;
}
uint16_t* output_buffer() {
  static Buffer y(size_t(kMaxM) * kMaxDim * 4);
  return y.u16();
}

// Plain [N, K] bf16 weights and their tilejit packing, per (N, K), kept for the run.
struct Weight {
  std::vector<uint16_t> raw;
  tilejit::PackedWeight packed;
};
const Weight& weight(int64_t n, int64_t k) {
  static std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Weight>> cache;
  auto& slot = cache[{n, k}];
  if (!slot) {
    slot = std::make_unique<Weight>();
    slot->raw.resize(size_t(n) * k);
    fill_random_bf16(slot->raw.data(), slot->raw.size(), uint64_t(n * 31 + k));
    slot->packed = tilejit::pack_weight(TensorView(slot->raw.data(), DType::bf16, {n, k}));
  }
  return *slot;
}

// ---------------------------------------------------------------- peak

struct Probe {
  tilejit::runtime::ExecutableMemory mem;
  double flops_per_iter = 0;
  void run(int64_t iters) const {
    reinterpret_cast<void (*)(int64_t)>(const_cast<void*>(mem.data()))(iters);
  }
};

bool isa_usable(Isa isa) {
  const tilejit::CpuInfo ci = tilejit::cpu_info();
  if (isa == Isa::amx) return ci.max_isa == Isa::amx;
  // The llvm probe is the host's best vector FMA (ymm on an AVX2-only host):
  // what the LLVM backend's kernels run on.
  if (isa == Isa::llvm) return ci.max_isa != Isa::scalar;
  return ci.avx512_bf16;
}

const Probe& probe(Isa isa) {
  static std::map<Isa, std::unique_ptr<Probe>> probes;
  auto& p = probes[isa];
  if (!p) {
    const std::vector<uint8_t> code = tilejit::codegen::xbyak::emit_peak_probe(isa);
    p = std::make_unique<Probe>();
    p->mem = tilejit::runtime::ExecutableMemory(code.data(), code.size());
    p->flops_per_iter = tilejit::codegen::xbyak::peak_flops_per_iter(isa);
  }
  return *p;
}

// Runs the probe for `iters` on `threads` threads at once (the caller is one).
void run_probe(const Probe& p, int threads, int64_t iters) {
  std::vector<std::thread> extra;
  for (int t = 1; t < threads; ++t) extra.emplace_back([&] { p.run(iters); });
  p.run(iters);
  for (auto& t : extra) t.join();
}

// Iterations of the probe that take about 50 ms on one core.
int64_t probe_iters(Isa isa) {
  static std::map<Isa, int64_t> iters;
  auto& n = iters[isa];
  if (n == 0) {
    const Probe& p = probe(isa);
    p.run(100000);                           // warm up (clocks, AMX state)
    const double t0 = thread_cpu_seconds();  // CPU time: a busy machine must not shrink the run
    p.run(1000000);
    const double s = thread_cpu_seconds() - t0;
    n = std::max<int64_t>(100000, static_cast<int64_t>(1000000 * 0.05 / std::max(s, 1e-6)));
  }
  return n;
}

Isa best_isa() {
  if (isa_usable(Isa::amx)) return Isa::amx;
  if (isa_usable(Isa::avx512)) return Isa::avx512;
  if (isa_usable(Isa::llvm)) return Isa::llvm;
  return Isa::scalar;
}

void BM_Peak(benchmark::State& state, Isa isa) {
  if (!isa_usable(isa)) {
    state.SkipWithError(isa == Isa::amx    ? "AMX not available (cpu_info().max_isa != amx)"
                        : isa == Isa::llvm ? "no vector ISA (cpu_info().max_isa == scalar)"
                                           : "AVX-512 BF16 not available");
    for (auto _ : state) {
    }
    return;
  }
  const int threads = static_cast<int>(state.range(0));
  const Probe& p = probe(isa);
  const int64_t iters = probe_iters(isa);
  const Meter t(threads);
  for (auto _ : state) run_probe(p, threads, iters);
  const double flops = p.flops_per_iter * double(iters) * threads * double(state.iterations());
  state.counters["GFLOPs"] = benchmark::Counter(flops / double(state.iterations()) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs_cpu"] = flops / t.cpu() * 1e-9;
  state.counters["peak_per_core"] = per_core_peak_gflops();
  // Wall-clock GFLOP/s of this run against T x the per-core peak (scaling, noise).
  state.counters["pct_peak"] = pct_of_peak(flops / t.wall() * 1e-9, threads);
}

// The 2×2 AMX kernel that reloads its four operand tiles every K step, from a
// footprint of `steps` × 4 KiB (1: L1; 64: 256 KiB, L2): the ceiling of a
// streaming micro-kernel, next to the register-only peak above.
void BM_AmxReloadCeiling(benchmark::State& state) {
  if (!isa_usable(Isa::amx)) {
    state.SkipWithError("AMX not available (cpu_info().max_isa != amx)");
    for (auto _ : state) {
    }
    return;
  }
  const int64_t steps = state.range(0);
  static tilejit::runtime::ExecutableMemory mem = [] {
    const std::vector<uint8_t> code = tilejit::codegen::xbyak::emit_amx_reload_probe();
    return tilejit::runtime::ExecutableMemory(code.data(), code.size());
  }();
  Buffer ops(size_t(steps) * 4096);
  fill_random_bf16(ops.u16(), size_t(steps) * 2048, 3);
  auto fn =
      reinterpret_cast<void (*)(int64_t, const void*, int64_t)>(const_cast<void*>(mem.data()));
  const int64_t iters = std::max<int64_t>(1, 2000000 / steps);
  fn(iters / 10 + 1, ops.mem.get(), steps);
  const Meter t(1);
  for (auto _ : state) fn(iters, ops.mem.get(), steps);
  const double flops = 4.0 * 16 * 16 * 32 * 2 * double(iters * steps) * double(state.iterations());
  state.counters["GFLOPs"] = benchmark::Counter(flops / double(state.iterations()) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs_cpu"] = flops / t.cpu() * 1e-9;
  state.counters["pct_peak"] = pct_of_peak(flops / t.wall() * 1e-9, 1);
}

// ---------------------------------------------------------------- DRAM

// The same streaming read over a 32 MiB buffer that stays in the last-level
// cache (a 4096 × 4096 bf16 weight's size): the ceiling of a hot decode GEMM,
// whose weights are read once per call from L3.
void BM_L3ReadBandwidth(benchmark::State& state) {
  if (!dram_probe_usable()) return skip(state, "the streaming probe needs AVX-512F or AVX2");
  const int threads = static_cast<int>(state.range(0));
  constexpr size_t kBytes = size_t(32) << 20;
  static Buffer b(kBytes);
  std::memset(b.mem.get(), 1, kBytes);
  benchmark::DoNotOptimize(tilejit::bench::stream_read(b.mem.get(), kBytes, threads));  // warm
  const Meter t(threads);
  for (auto _ : state)
    benchmark::DoNotOptimize(tilejit::bench::stream_read(b.mem.get(), kBytes, threads));
  state.counters["GBs"] =
      benchmark::Counter(double(kBytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GBs_cpu"] = double(kBytes) * double(state.iterations()) / t.cpu() * 1e-9;
}

// ---------------------------------------------------------------- oneDNN

struct OnednnMatmul {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory src, dst;
  std::vector<dnnl::memory> weights;  // one or more copies in the primitive's packed format
  std::string impl;

  // x: [M, K] bf16; w: [N, K] bf16 row-major (= [K, N] in format ba).
  OnednnMatmul(int64_t m, int64_t n, int64_t k, const uint16_t* x, const uint16_t* w, void* y,
               int copies = 1) {
    using tag = dnnl::memory::format_tag;
    using dt = dnnl::memory::data_type;
    const dnnl::memory::desc src_md({m, k}, dt::bf16, tag::ab);
    const dnnl::memory::desc wei_any({k, n}, dt::bf16, tag::any);
    const dnnl::memory::desc dst_md({m, n}, dt::bf16, tag::ab);
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(src_md, wei_any, dst_md), eng);
    prim = dnnl::matmul(pd);
    impl = pd.impl_info_str();
    src = dnnl::memory(src_md, eng, const_cast<uint16_t*>(x));
    dst = dnnl::memory(dst_md, eng, y);
    dnnl::memory plain({{k, n}, dt::bf16, tag::ba}, eng, const_cast<uint16_t*>(w));
    for (int c = 0; c < copies; ++c) {
      weights.emplace_back(pd.weights_desc(), eng);
      dnnl::reorder(plain, weights.back()).execute(strm, plain, weights.back());
    }
    strm.wait();
  }
  void run(size_t copy = 0) {
    prim.execute(strm,
                 {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, weights[copy]}, {DNNL_ARG_DST, dst}});
    strm.wait();
  }
  size_t weight_bytes() const { return pd.weights_desc().get_size(); }
};

using GemmKey = std::tuple<int64_t, int64_t, int64_t, int>;  // M, N, K, threads

// The one live oneDNN matmul (primitives and packed weights are large: keep one).
OnednnMatmul& onednn_matmul(const GemmKey& key) {
  static GemmKey current{-1, -1, -1, -1};
  static std::unique_ptr<OnednnMatmul> mm;
  if (!mm || key != current) {
    mm.reset();
    const auto [m, n, k, threads] = key;
    omp_set_num_threads(threads);  // oneDNN (OpenMP build) partitions at creation
    mm = std::make_unique<OnednnMatmul>(m, n, k, activations().u16(), weight(n, k).raw.data(),
                                        output_buffer());
    current = key;
  }
  return *mm;
}

// oneDNN GFLOP/s per shape and thread count measured in this process run: the
// denominator of tilejit's vs_onednn. Runs shorter than 0.1 s (the iteration
// estimation of Google Benchmark) are not kept unless nothing else exists.
struct RateLog {
  std::vector<double> long_runs, short_runs, cpu;  // wall GFLOP/s; CPU-normalised GFLOP/s
  void add(double gflops, double seconds, double cpu_gflops) {
    (seconds >= 0.1 ? long_runs : short_runs).push_back(gflops);
    if (seconds >= 0.1 || cpu.empty()) cpu.push_back(cpu_gflops);
  }
  double median_gflops() const { return median(long_runs.empty() ? short_runs : long_runs); }
  double median_cpu_gflops() const { return median(cpu); }
};
std::map<GemmKey, RateLog>& onednn_rates() {
  static std::map<GemmKey, RateLog> m;
  return m;
}

GemmKey gemm_key(const benchmark::State& state) {
  return {state.range(0), state.range(1), state.range(2), static_cast<int>(state.range(3))};
}

void BM_OnednnMatmul(benchmark::State& state) {
  const GemmKey key = gemm_key(state);
  const auto [m, n, k, threads] = key;
  omp_set_num_threads(threads);
  OnednnMatmul& mm = onednn_matmul(key);
  mm.run();  // warm-up
  const Meter t(threads);
  for (auto _ : state) mm.run();
  const double s = t.wall(), cpu = t.cpu();
  const double flops = 2.0 * m * n * k;
  const double gflops = flops * double(state.iterations()) / s * 1e-9;
  const double cpu_gflops = flops * double(state.iterations()) / cpu * 1e-9;
  onednn_rates()[key].add(gflops, s, cpu_gflops);
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, threads);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = pct_of_peak(gflops, threads);
  state.SetLabel(mm.impl);
}

// oneDNN's rates for `key` from this run; measured here (0.3 s) if its own
// benchmark was filtered out.
const RateLog& onednn_gflops(const GemmKey& key) {
  auto& log = onednn_rates()[key];
  if (log.long_runs.empty() && log.short_runs.empty()) {
    const auto [m, n, k, threads] = key;
    omp_set_num_threads(threads);
    OnednnMatmul& mm = onednn_matmul(key);
    mm.run();
    int64_t iters = 0;
    const Meter t(threads);
    while (t.wall() < 0.3 || iters < 2) {
      mm.run();
      ++iters;
    }
    const double flops = 2.0 * m * n * k * double(iters);
    log.add(flops / t.wall() * 1e-9, 1.0, flops / t.cpu() * 1e-9);
  }
  return log;
}

// ---------------------------------------------------------------- tilejit hot

// Once per shape: tilejit's y against oneDNN's y (both bf16, fp32 accumulation
// in different orders). Returns an error text when the relative L2 error is
// above 1e-2, so a wrong kernel can never post a fast number.
std::string check_against_onednn(const GemmKey& key, const TensorView& x,
                                 const tilejit::PackedWeight& w) {
  static std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> checked;
  const auto [m, n, k, threads] = key;
  const auto shape = std::make_tuple(m, n, k);
  if (auto it = checked.find(shape); it != checked.end()) return it->second;
  const size_t count = size_t(m) * size_t(n);
  omp_set_num_threads(threads);
  onednn_matmul(key).run();
  std::vector<uint16_t> ref(output_buffer(), output_buffer() + count);
  tilejit::gemm(x, w, TensorView(output_buffer(), DType::bf16, {m, n}));
  double err = 0, norm = 0;
  for (size_t i = 0; i < count; ++i) {
    const double r = tilejit::runtime::bf16_to_f32(ref[i]);
    const double d = tilejit::runtime::bf16_to_f32(output_buffer()[i]) - r;
    err += d * d;
    norm += r * r;
  }
  const double rel = std::sqrt(err / std::max(norm, 1e-30));
  std::string msg;
  if (!(rel <= 1e-2)) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "tilejit output differs from oneDNN: relative L2 error %.3g",
                  rel);
    msg = buf;
  }
  checked[shape] = msg;
  return msg;
}

void BM_TilejitGemm(benchmark::State& state) {
  const GemmKey key = gemm_key(state);
  const auto [m, n, k, threads] = key;
  const RateLog& ref_log = onednn_gflops(key);
  const double ref = ref_log.median_gflops(), ref_cpu = ref_log.median_cpu_gflops();
  tilejit::set_num_threads(threads);
  const Weight& w = weight(n, k);
  const TensorView x(activations().u16(), DType::bf16, {m, k});
  const TensorView y(output_buffer(), DType::bf16, {m, n});
  tilejit::gemm(x, w.packed, y);  // warm-up: compiles the kernels of this shape
  if (const std::string err = check_against_onednn(key, x, w.packed); !err.empty()) {
    state.SkipWithError(err.c_str());
    for (auto _ : state) {
    }
    return;
  }
  const Meter t(threads);
  for (auto _ : state) tilejit::gemm(x, w.packed, y);
  const double s = t.wall(), cpu = t.cpu();
  const double flops = 2.0 * m * n * k;
  const double gflops = flops * double(state.iterations()) / s * 1e-9;
  const double cpu_gflops = flops * double(state.iterations()) / cpu * 1e-9;
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, threads);
  state.counters["vs_onednn_cpu"] = ref_cpu > 0 ? cpu_gflops / ref_cpu : 0.0;
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pct_peak"] = pct_of_peak(gflops, threads);
  state.counters["peak_per_core"] = per_core_peak_gflops();
  state.counters["vs_onednn"] = ref > 0 ? gflops / ref : 0.0;
  state.counters["onednn_GFLOPs"] = ref;
}

// ---------------------------------------------------------------- cold weights

// Enough copies of a weight to exceed 1 GiB (L3 here is 32 MiB): every call
// reads a copy that was evicted long ago. One pool is live at a time.
size_t copies_for(size_t bytes) {
  return kGiB / bytes + 2;
}

struct ColdPools {
  std::pair<int64_t, int64_t> tj_shape{-1, -1};
  std::vector<tilejit::PackedWeight> tj;
  GemmKey dnnl_key{-1, -1, -1, -1};
  std::unique_ptr<OnednnMatmul> dnnl;
};
ColdPools& cold_pools() {
  static ColdPools p;
  return p;
}

const std::vector<tilejit::PackedWeight>& tilejit_cold_copies(int64_t n, int64_t k) {
  ColdPools& p = cold_pools();
  if (p.tj_shape != std::make_pair(n, k)) {
    p.tj.clear();
    p.dnnl.reset();
    const Weight& w = weight(n, k);
    const size_t count = copies_for(w.packed.packed_bytes());
    p.tj.resize(count);
    // Pack on two threads (packing is not what this measures).
    std::vector<std::thread> th;
    for (int t = 0; t < 2; ++t)
      th.emplace_back([&, t] {
        for (size_t i = t; i < count; i += 2)
          p.tj[i] = tilejit::pack_weight(TensorView(w.raw.data(), DType::bf16, {n, k}));
      });
    for (auto& t : th) t.join();
    p.tj_shape = {n, k};
  }
  return p.tj;
}

void BM_TilejitGemmColdWeights(benchmark::State& state) {
  const GemmKey key = gemm_key(state);
  const auto [m, n, k, threads] = key;
  const auto& copies = tilejit_cold_copies(n, k);
  tilejit::set_num_threads(threads);
  const TensorView x(activations().u16(), DType::bf16, {m, k});
  const TensorView y(output_buffer(), DType::bf16, {m, n});
  tilejit::gemm(x, copies[0], y);  // warm-up (compile)
  const DramRefs dram = measure_dram_refs(threads);
  size_t next = 1;
  const Meter t(threads);
  for (auto _ : state) {
    tilejit::gemm(x, copies[next], y);
    if (++next == copies.size()) next = 0;
  }
  set_cold_counters(state, double(copies[0].packed_bytes()), t, dram, 2.0 * m * n * k);
  state.counters["copies"] = double(copies.size());
}

void BM_OnednnMatmulColdWeights(benchmark::State& state) {
  const GemmKey key = gemm_key(state);
  const auto [m, n, k, threads] = key;
  ColdPools& p = cold_pools();
  omp_set_num_threads(threads);
  if (!p.dnnl || p.dnnl_key != key) {
    p.dnnl.reset();
    p.tj.clear();
    p.tj_shape = {-1, -1};
    const Weight& w = weight(n, k);
    const size_t count = copies_for(size_t(n) * k * 2);
    p.dnnl = std::make_unique<OnednnMatmul>(m, n, k, activations().u16(), w.raw.data(),
                                            output_buffer(), static_cast<int>(count));
    p.dnnl_key = key;
  }
  OnednnMatmul& mm = *p.dnnl;
  mm.run(0);
  const DramRefs dram = measure_dram_refs(threads);
  size_t next = 1;
  const Meter t(threads);
  for (auto _ : state) {
    mm.run(next);
    if (++next == mm.weights.size()) next = 0;
  }
  set_cold_counters(state, double(mm.weight_bytes()), t, dram, 2.0 * m * n * k);
  state.counters["copies"] = double(mm.weights.size());
  state.SetLabel(mm.impl);
}

// ---------------------------------------------------------------- compile time

Isa jit_isa() {
  return tilejit::cpu_info().isa;
}

void BM_JitCompileMicrokernel(benchmark::State& state, Isa isa) {
  if (!isa_usable(isa)) {
    state.SkipWithError(isa == Isa::amx ? "AMX not available (cpu_info().max_isa != amx)"
                                        : "AVX-512 BF16 not available");
    for (auto _ : state) {
    }
    return;
  }
  tilejit::codegen::BrgemmDesc d;
  d.isa = isa;
  d.mr = static_cast<int>(state.range(0));
  d.nr = static_cast<int>(state.range(1));
  d.kb = state.range(2);
  d.b_row_bytes = 256;
  d.out = DType::bf16;
  size_t code_bytes = 0;
  for (auto _ : state) {
    const std::vector<uint8_t> code = isa == Isa::amx
                                          ? tilejit::codegen::xbyak::emit_amx_brgemm(d)
                                          : tilejit::codegen::xbyak::emit_avx512_brgemm(d);
    tilejit::runtime::ExecutableMemory mem(code.data(), code.size());
    benchmark::DoNotOptimize(mem.data());
    code_bytes = code.size();
  }
  state.counters["code_bytes"] = double(code_bytes);
  state.SetLabel(d.name());
}

// A gemm call on a spec never seen before: IR build + verify + lower + emit +
// publish + the (tiny) run. Each iteration uses a new K, so it always misses.
void BM_GemmFirstCall(benchmark::State& state) {
  static int64_t next_k = 64;
  tilejit::set_num_threads(1);
  constexpr int64_t N = 16, kMaxK = 64 + 20000;
  static std::vector<uint16_t> raw = [] {
    std::vector<uint16_t> r(N * kMaxK);
    fill_random_bf16(r.data(), r.size(), 3);
    return r;
  }();
  activations();  // allocate + fill outside the timed region
  output_buffer();
  const auto before = tilejit::cache_stats();
  int64_t calls = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const int64_t k = next_k++;
    if (k >= kMaxK) {
      state.SkipWithError("out of fresh K values");
      break;
    }
    const tilejit::PackedWeight w =
        tilejit::pack_weight(TensorView(raw.data(), DType::bf16, {N, k}));
    state.ResumeTiming();
    tilejit::gemm(TensorView(activations().u16(), DType::bf16, {1, k}), w,
                  TensorView(output_buffer(), DType::bf16, {1, N}));
    ++calls;
  }
  const auto after = tilejit::cache_stats();
  const double compiles = double(after.compiles - before.compiles);
  state.counters["compiles_per_call"] = calls ? compiles / double(calls) : 0.0;
  state.counters["lib_compile_us"] =
      compiles > 0 ? (after.compile_seconds - before.compile_seconds) / compiles * 1e6 : 0.0;
}

void BM_OnednnPrimitiveCreate(benchmark::State& state) {
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  const int64_t m = state.range(0), n = 4096, k = 4096;
  omp_set_num_threads(1);
  const int saved = dnnl::get_primitive_cache_capacity();
  dnnl::set_primitive_cache_capacity(0);
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  const dnnl::memory::desc src_md({m, k}, dt::bf16, tag::ab);
  const dnnl::memory::desc wei_any({k, n}, dt::bf16, tag::any);
  const dnnl::memory::desc dst_md({m, n}, dt::bf16, tag::ab);
  std::string impl;
  for (auto _ : state) {
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_any, dst_md), eng);
    dnnl::matmul prim(pd);
    benchmark::DoNotOptimize(prim.get());
    if (impl.empty()) impl = pd.impl_info_str();
  }
  dnnl::set_primitive_cache_capacity(saved);
  state.SetLabel(impl);
}

// ---------------------------------------------------------------- cache hit

constexpr int64_t kTinyM = 1, kTinyN = 16, kTinyK = 32;

void BM_CacheHitOverhead(benchmark::State& state) {
  tilejit::set_num_threads(static_cast<int>(state.range(0)));
  const Weight& w = weight(kTinyN, kTinyK);
  const TensorView x(activations().u16(), DType::bf16, {kTinyM, kTinyK});
  const TensorView y(output_buffer(), DType::bf16, {kTinyM, kTinyN});
  for (int i = 0; i < 100; ++i) tilejit::gemm(x, w.packed, y);  // warm-up
  const auto before = tilejit::cache_stats();
  for (auto _ : state) tilejit::gemm(x, w.packed, y);
  const auto after = tilejit::cache_stats();
  state.counters["compiles"] = double(after.compiles - before.compiles);
  state.counters["hits_per_call"] =
      double(after.hits - before.hits) / double(std::max<int64_t>(1, state.iterations()));
}

// A batch of GEMMs of one shape, each entry its own weight (DeepSeek's
// absorbed MLA: per head, q_nope [M, 128] · w_kc [512, 128]ᵀ and
// o [M, 512] · w_vc [128, 512]ᵀ): tilejit::gemm_batched (one pass over the
// pool) against a loop of tilejit::gemm calls (what an engine writes without
// it: 2·H calls a layer). Args: B, M, N, K, threads, batched (0: the loop).
// Weights hot (B·N·K·2 bytes, 16 MiB at B 128); GFLOPs counted 2·B·M·N·K.
void BM_GemmBatched(benchmark::State& state) {
  const int64_t b = state.range(0), m = state.range(1), n = state.range(2), k = state.range(3);
  tilejit::set_num_threads(static_cast<int>(state.range(4)));
  const bool batched = state.range(5) != 0;
  std::vector<std::vector<uint16_t>> raw(static_cast<size_t>(b));
  std::vector<tilejit::PackedWeight> w;
  for (int64_t i = 0; i < b; ++i) {
    raw[i].resize(static_cast<size_t>(n * k));
    fill_random_bf16(raw[i].data(), raw[i].size(), uint64_t(i + 1));
    w.push_back(tilejit::pack_weight(TensorView(raw[i].data(), DType::bf16, {n, k})));
  }
  std::vector<uint16_t> x(static_cast<size_t>(b * m * k)), y(static_cast<size_t>(b * m * n));
  fill_random_bf16(x.data(), x.size(), 77);
  auto run = [&] {
    if (batched) {
      tilejit::gemm_batched(TensorView(x.data(), DType::bf16, {b, m, k}), w,
                            TensorView(y.data(), DType::bf16, {b, m, n}));
      return;
    }
    for (int64_t i = 0; i < b; ++i)
      tilejit::gemm(TensorView(x.data() + i * m * k, DType::bf16, {m, k}), w[size_t(i)],
                    TensorView(y.data() + i * m * n, DType::bf16, {m, n}));
  };
  for (int i = 0; i < 3; ++i) run();  // compile, warm
  for (auto _ : state) run();
  state.counters["GFLOPs"] = benchmark::Counter(double(2 * b * m * n * k) * 1e-9,
                                                benchmark::Counter::kIsIterationInvariantRate);
}

// A decode-sized call (M = 1, 1024 x 1024, hot in L2) after an idle gap of
// gap_us: what an engine's first call of a step pays when the pool's helpers
// have gone to sleep (their wake-up costs 10-200 µs on a VM). Manual time:
// only the call is timed, not the sleep.
void BM_GemmAfterIdleGap(benchmark::State& state) {
  const int gap_us = static_cast<int>(state.range(0));
  tilejit::set_num_threads(static_cast<int>(state.range(1)));
  constexpr int64_t kN = 1024, kK = 1024;
  const Weight& w = weight(kN, kK);
  const TensorView x(activations().u16(), DType::bf16, {1, kK});
  const TensorView y(output_buffer(), DType::bf16, {1, kN});
  for (int i = 0; i < 20; ++i) tilejit::gemm(x, w.packed, y);  // compile, warm
  for (auto _ : state) {
    if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
    const auto t0 = std::chrono::steady_clock::now();
    tilejit::gemm(x, w.packed, y);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}

// The same tiny problem, calling the micro-kernel directly (no checks, no
// lookup, no driver): the floor under BM_CacheHitOverhead.
void BM_RawMicrokernel(benchmark::State& state) {
  const Isa isa = jit_isa();
  if (isa == Isa::scalar) {
    state.SkipWithError("active ISA is scalar: no micro-kernel");
    for (auto _ : state) {
    }
    return;
  }
  const tilejit::codegen::GemmPlan plan = tilejit::codegen::plan_gemm(
      {kTinyN, kTinyK, tilejit::codegen::BiasKind::none, tilejit::Activation::none, DType::bf16},
      isa);
  const auto& kernel = tilejit::jit::get(plan.ukernel(kTinyM, kTinyN));
  const auto fn = kernel.entry<tilejit::codegen::BrgemmFn>();
  const Weight& w = weight(kTinyN, kTinyK);
  alignas(64) uint16_t a_tail[32 * 32] = {};
  const void* a_ptr = activations().u16();
  const void* b_ptr = w.packed.impl()->bf16();  // the very bytes gemm() reads
  tilejit::codegen::BrgemmArgs args{};
  args.a = &a_ptr;
  args.b = &b_ptr;
  args.batch = 1;
  args.lda = kTinyK * 2;
  args.c = output_buffer();
  args.ldc = kTinyN * 2;
  args.a_tail = a_tail;
  for (auto _ : state) {
    fn(&args);
    benchmark::ClobberMemory();
  }
  state.SetLabel(kernel.name);
}

// ---------------------------------------------------------------- micro-kernel

// One micro-kernel call over a whole packed column block (nr=64, all of K),
// A = mr rows: the kernel's own efficiency per row count, with the B panel
// (64 × K bf16: 512 KiB at K=4096, 1.4 MiB at K=11008) as warm as L2 allows.
// Shows what the driver's M blocking costs (e.g. M=16 runs as 7 + 7 + 2 rows).
void BM_BrgemmMicrokernel(benchmark::State& state) {
  const Isa isa = jit_isa();
  if (isa == Isa::scalar) {
    state.SkipWithError("active ISA is scalar: no micro-kernel");
    for (auto _ : state) {
    }
    return;
  }
  const int mr = static_cast<int>(state.range(0));
  const int64_t k = state.range(1);
  tilejit::codegen::GemmPlan plan = tilejit::codegen::plan_gemm(
      {64, k, tilejit::codegen::BiasKind::none, tilejit::Activation::none, DType::bf16}, isa);
  if (mr > plan.mr) {
    state.SkipWithError("mr above the plan's register blocking");
    for (auto _ : state) {
    }
    return;
  }
  const auto& kernel = tilejit::jit::get(plan.ukernel(mr, 64));
  const auto fn = kernel.entry<tilejit::codegen::BrgemmFn>();
  const Weight& w = weight(64, k);
  alignas(64) static uint16_t a_tail[32 * 32] = {};
  const void* a_ptr = activations().u16();
  const void* b_ptr = w.packed.impl()->bf16();
  tilejit::codegen::BrgemmArgs args{};
  args.a = &a_ptr;
  args.b = &b_ptr;
  args.batch = 1;
  args.lda = k * 2;
  args.c = output_buffer();
  args.ldc = 64 * 2;
  args.a_tail = a_tail;
  fn(&args);
  // range(2): distinct A blocks walked call after call, as a driver's M loop does.
  const int64_t a_blocks = state.range(2);
  std::vector<const void*> a_ptrs;
  for (int64_t i = 0; i < a_blocks; ++i)
    a_ptrs.push_back(activations().u16() + i * tilejit::codegen::PackedA{k}.block_bytes() / 2);
  const Meter t(1);
  int64_t i = 0;
  for (auto _ : state) {
    a_ptr = a_ptrs[i];
    i = i + 1 == a_blocks ? 0 : i + 1;
    fn(&args);
    benchmark::ClobberMemory();
  }
  const double flops = 2.0 * mr * 64 * double(k);
  const double cpu_gflops = flops * double(state.iterations()) / t.cpu() * 1e-9;
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, 1);
  state.SetLabel(kernel.name);
}

// Page-size experiment for cold decode: the library's own M=1 micro-kernel
// driven over N blocks exactly like gemm() with one thread, but over copies of
// the packed weight placed in one mapping with or without transparent huge
// pages (packed weights come from aligned_alloc: 4 KiB pages unless THP is
// "always"). Same bytes, same kernel; only the page size differs.
void BM_RawDecodeColdPages(benchmark::State& state) {
  const Isa isa = jit_isa();
  if (isa == Isa::scalar) {
    state.SkipWithError("active ISA is scalar: no micro-kernel");
    for (auto _ : state) {
    }
    return;
  }
  const bool huge = state.range(0) != 0;
  constexpr int64_t n = 4096, k = 4096;
  const Weight& w = weight(n, k);
  const size_t bytes = w.packed.packed_bytes();
  const size_t copies = copies_for(bytes);
  static std::unique_ptr<Mapping> pool[2];
  if (!pool[huge]) {
    pool[!huge].reset();
    pool[huge] = std::make_unique<Mapping>(bytes * copies, huge);
    for (size_t c = 0; c < copies; ++c)
      std::memcpy(static_cast<char*>(pool[huge]->p) + c * bytes, w.packed.impl()->bf16(), bytes);
  }
  const tilejit::codegen::GemmPlan plan = tilejit::codegen::plan_gemm(
      {n, k, tilejit::codegen::BiasKind::none, tilejit::Activation::none, DType::bf16}, isa);
  const auto fn = tilejit::jit::get(plan.ukernel(1, 64)).entry<tilejit::codegen::BrgemmFn>();
  const int64_t n_blocks = n / 64, block_bytes = int64_t(bytes) / n_blocks;
  alignas(64) static uint16_t a_tail[32 * 32] = {};
  const void* a_ptr = activations().u16();
  auto* y = reinterpret_cast<char*>(output_buffer());
  auto decode = [&](const char* base) {
    for (int64_t nb = 0; nb < n_blocks; ++nb) {
      const void* b_ptr = base + nb * block_bytes;
      tilejit::codegen::BrgemmArgs args{};
      args.a = &a_ptr;
      args.b = &b_ptr;
      args.batch = 1;
      args.lda = k * 2;
      args.c = y + nb * 64 * 2;
      args.ldc = n * 2;
      args.a_tail = a_tail;
      fn(&args);
    }
  };
  const auto* base = static_cast<const char*>(pool[huge]->p);
  decode(base);
  const DramRefs dram = measure_dram_refs(1);
  size_t next = 1;
  const Meter t(1);
  for (auto _ : state) {
    decode(base + next * bytes);
    if (++next == copies) next = 0;
  }
  set_cold_counters(state, double(bytes), t, dram, 2.0 * n * k);
}

// ---------------------------------------------------------------- registration

void register_all() {
  using benchmark::RegisterBenchmark;
  for (int t : {1, 2}) {
    RegisterBenchmark("BM_PeakAvx512Bf16", BM_Peak, Isa::avx512)
        ->Arg(t)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int t : {1, 2}) {
    RegisterBenchmark("BM_PeakLlvmVector", BM_Peak, Isa::llvm)
        ->Arg(t)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int t : {1, 2}) {
    RegisterBenchmark("BM_PeakAmxBf16", BM_Peak, Isa::amx)
        ->Arg(t)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int steps : {1, 8, 64, 256})
    RegisterBenchmark("BM_AmxReloadCeiling", BM_AmxReloadCeiling)
        ->Arg(steps)
        ->ArgName("steps")
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (int t : {1, 2})
    RegisterBenchmark("BM_L3ReadBandwidth", BM_L3ReadBandwidth)
        ->Arg(t)
        ->ArgName("threads")
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  for (int huge : {1, 0})
    for (int t : {1, 2})
      RegisterBenchmark("BM_DramReadBandwidth", BM_DramReadBandwidth)
          ->Args({t, huge})
          ->ArgNames({"threads", "hugepages"})
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);

  // Hot GEMM: each oneDNN shape runs right before the tilejit one it is compared with.
  const std::vector<std::pair<int64_t, int64_t>> nk = {{4096, 4096}, {11008, 4096}, {4096, 11008}};
  for (auto [n, k] : nk)
    for (int64_t m : {1, 4, 16, 64, 256, 1024})
      for (int t : {1, 2}) {
        RegisterBenchmark("BM_OnednnMatmul", BM_OnednnMatmul)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
        RegisterBenchmark("BM_TilejitGemm", BM_TilejitGemm)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }

  // Decode (M=1) across weight sizes around the 32 MiB L3: 8, 16, 32, 64 MiB.
  for (int64_t k : {1024, 2048, 4096, 8192})
    for (int t : {1, 2}) {
      RegisterBenchmark("BM_OnednnMatmulDecodeSweep", BM_OnednnMatmul)
          ->Args({1, 4096, k, t})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
      RegisterBenchmark("BM_TilejitGemmDecodeSweep", BM_TilejitGemm)
          ->Args({1, 4096, k, t})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }

  // Cold-weight decode.
  for (auto [n, k] : nk)
    for (int64_t m : {1, 16})
      for (int t : {1, 2})
        RegisterBenchmark("BM_TilejitGemmColdWeights", BM_TilejitGemmColdWeights)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  for (auto [n, k] : nk)
    for (int64_t m : {1, 16})
      for (int t : {1, 2})
        RegisterBenchmark("BM_OnednnMatmulColdWeights", BM_OnednnMatmulColdWeights)
            ->Args({m, n, k, t})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);

  // Compile time.
  for (auto [mr, nr] :
       std::vector<std::pair<int, int>>{{1, 64}, {4, 64}, {7, 64}, {1, 16}, {12, 16}})
    RegisterBenchmark("BM_JitCompileMicrokernel", BM_JitCompileMicrokernel, Isa::avx512)
        ->Args({mr, nr, 4096})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  for (auto [mr, nr] : std::vector<std::pair<int, int>>{{32, 64}, {16, 64}})
    RegisterBenchmark("BM_JitCompileMicrokernelAmx", BM_JitCompileMicrokernel, Isa::amx)
        ->Args({mr, nr, 4096})
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);
  RegisterBenchmark("BM_GemmFirstCall", BM_GemmFirstCall)
      ->Iterations(300)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
  for (int64_t m : {1, 256})
    RegisterBenchmark("BM_OnednnPrimitiveCreate", BM_OnednnPrimitiveCreate)
        ->Arg(m)
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);

  // Batched GEMMs (DeepSeek's absorbed MLA, decode and a few tokens).
  for (auto [b, m, n, k] : std::vector<std::array<int64_t, 4>>{
           {128, 1, 512, 128}, {128, 1, 128, 512}, {16, 4, 512, 128}})
    for (int t : {1, 2})
      for (int batched : {0, 1})
        RegisterBenchmark("BM_GemmBatched", BM_GemmBatched)
            ->Args({b, m, n, k, t, batched})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  // Per-call overhead on a cache hit.
  for (int t : {1, 2})
    RegisterBenchmark("BM_CacheHitOverhead", BM_CacheHitOverhead)
        ->Arg(t)
        ->UseRealTime()
        ->Unit(benchmark::kNanosecond);
  for (int gap : {0, 300, 1000, 5000})
    for (int t : {1, 2})
      RegisterBenchmark("BM_GemmAfterIdleGap", BM_GemmAfterIdleGap)
          ->Args({gap, t})
          ->ArgNames({"gap_us", "threads"})
          ->UseManualTime()
          ->Iterations(400)
          ->Unit(benchmark::kMicrosecond);
  RegisterBenchmark("BM_RawMicrokernel", BM_RawMicrokernel)
      ->UseRealTime()
      ->Unit(benchmark::kNanosecond);

  // Cold decode over 4 KiB vs 2 MiB pages (same kernel, same bytes).
  for (int huge : {0, 1, 0, 1})
    RegisterBenchmark("BM_RawDecodeColdPages", BM_RawDecodeColdPages)
        ->Arg(huge)
        ->ArgName("hugepages")
        ->UseRealTime()
        ->Unit(benchmark::kMicrosecond);

  // The AMX kernel walking 8 A blocks of a K chunk, as the driver does.
  for (int64_t k : {1024, 2048, 4096})
    for (int64_t blocks : {1, 8})
      RegisterBenchmark("BM_BrgemmMicrokernel", BM_BrgemmMicrokernel)
          ->Args({32, k, blocks})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
  // Micro-kernel efficiency by row count (single thread, B panel warm).
  for (int64_t k : {4096, 11008})
    for (int mr : {1, 2, 4, 5, 6, 7, 16, 32})
      RegisterBenchmark("BM_BrgemmMicrokernel", BM_BrgemmMicrokernel)
          ->Args({mr, k, 1})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
}

}  // namespace

int main(int argc, char** argv) {
  return benchmark_main(argc, argv, register_all, [] {
    benchmark::AddCustomContext("tilejit_max_isa", tilejit::isa_name(tilejit::cpu_info().max_isa));
    benchmark::AddCustomContext("peak_isa", tilejit::isa_name(best_isa()));
    add_onednn_context();
  });
}
