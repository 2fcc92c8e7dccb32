// What every benchmark of bench/ measures the same way: CPU clocks, a wall +
// CPU-time meter, medians, and the machine's per-core bf16 peak from the JIT
// register-only probe (codegen/xbyak/peak_probe.cpp, as jit/peak.h).
//
// CPU time matters on this shared machine: other tenants take cores away, so
// wall time grows while the CPU time of our threads does not (spin-waiting
// does count). Benches report both.
#pragma once

#include <time.h>

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "jit/peak.h"
#include "runtime/aligned_buffer.h"
#include "runtime/bf16.h"
#include "tilejit/tilejit.h"

namespace tilejit::bench {

using Clock = std::chrono::steady_clock;
inline constexpr size_t kGiB = size_t(1) << 30;

inline double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

inline double process_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Wall time and CPU time of a measured region. cpu() is the process CPU time
// divided by the thread count: the time each of the T threads would have taken
// with a core of its own.
struct Meter {
  using Clock = std::chrono::steady_clock;
  int threads;
  Clock::time_point t0 = Clock::now();
  double c0 = process_cpu_seconds();
  explicit Meter(int t) : threads(t) {}
  double wall() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  double cpu() const { return (process_cpu_seconds() - c0) / threads; }
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Per-core bf16 peak (GFLOP/s) of the best path the CPU and OS allow
// (jit::path_peak_gflops: the AMX tiles, or the host's best vector dot product
// for the avx512 and llvm paths; 0 on scalar or emulated AMX), measured once.
// The peak of T threads is T times this.
inline double per_core_peak_gflops() {
  return jit::path_peak_gflops(cpu_info().max_isa);
}

// A 64-byte aligned scratch of `bytes` bytes (activations, outputs).
struct Buffer {
  std::unique_ptr<std::byte[], runtime::FreeDeleter> mem;
  size_t bytes = 0;
  explicit Buffer(size_t n) : mem(runtime::aligned_alloc_bytes(n)), bytes(n) {}
  uint16_t* u16() const { return reinterpret_cast<uint16_t*>(mem.get()); }
  uint8_t* u8() const { return reinterpret_cast<uint8_t*>(mem.get()); }
};

inline double pct_of_peak(double gflops, int threads) {
  const double peak = per_core_peak_gflops() * threads;
  return peak > 0 ? 100.0 * gflops / peak : 0.0;
}

// Marks a benchmark skipped with the reason (the state loop must still run).
inline void skip(benchmark::State& state, const std::string& why) {
  state.SkipWithError(why.c_str());
  for (auto _ : state) {
  }
}

// Uniform(-scale, scale) bf16 values from a xorshift stream (fast enough for
// tens of millions of elements; mt19937 would dominate the setup).
inline void fill_random_bf16(uint16_t* p, size_t n, uint64_t seed, float scale = 1.0f) {
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    const float f = static_cast<float>(s >> 40) * (2.0f / 16777216.0f) - 1.0f;
    p[i] = runtime::f32_to_bf16(scale * f);
  }
}

// The same for GiB-sized buffers whose timing does not depend on the values:
// 1 Mi values from the stream, then copies of them.
inline void fill_repeating_bf16(uint16_t* p, size_t n, uint64_t seed, float scale = 1.0f) {
  const size_t chunk = std::min<size_t>(n, size_t(1) << 20);
  fill_random_bf16(p, chunk, seed, scale);
  for (size_t i = chunk; i < n; i += chunk) std::memcpy(p + i, p, std::min(chunk, n - i) * 2);
}

// The main() of a Google Benchmark bench: the flags, the benchmarks
// register_all() registers, the context (the active ISA, then what
// add_context() adds), the run.
template <class Register, class Context>
int benchmark_main(int argc, char** argv, Register register_all, Context add_context) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  register_all();
  benchmark::AddCustomContext("tilejit_active_isa", isa_name(cpu_info().isa));
  add_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace tilejit::bench
