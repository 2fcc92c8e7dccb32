// The DRAM yardstick of every cold-data benchmark (GEMM decode, quantized
// decode, MoE decode, paged attention decode): a streaming read over a 2 GiB
// buffer (bench/dram_bandwidth.h), measured right before each run, since on
// this shared machine a reference taken minutes apart is not comparable, and
// the counters a cold run reports against it.
#pragma once

#include <benchmark/benchmark.h>

#include <cstddef>
#include <cstdint>

#include "bench_util.h"

namespace tilejit::bench {

// An anonymous private mapping with transparent huge pages requested
// (madvise MADV_HUGEPAGE) or refused (MADV_NOHUGEPAGE). Huge pages are the
// machine's real ceiling (no page walks, no prefetcher stop at 4 KiB
// boundaries); 4 KiB pages are what a buffer from plain malloc can expect.
struct Mapping {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Mapping(size_t n, bool huge = true);
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  uint16_t* u16() const { return static_cast<uint16_t*>(p); }
};

// Whether this CPU runs the streaming probe (AVX-512F or AVX2).
bool dram_probe_usable();

// The 2 GiB probe buffer in huge or 4 KiB pages: every page touched with
// non-zero data once, then kept mapped for the process.
const Mapping& dram_buffer(bool huge);

// GB/s by the wall clock and by CPU time / threads; 0 where the probe cannot run.
struct DramRate {
  double wall_gbs = 0, cpu_gbs = 0;
};

// Streaming read bandwidth of `threads` threads now: the median of `passes`
// reads of dram_buffer(huge).
DramRate measure_dram(int threads, bool huge = true, int passes = 3);

// Both references of a cold run, huge and 4 KiB pages, taken right before it.
struct DramRefs {
  DramRate huge, small;
};
DramRefs measure_dram_refs(int threads);

// A cold run's counters: GB/s of `bytes_per_call`, GFLOP/s, and the percent
// of each reference (pct_dram_bw: huge pages; pct_dram_bw_4k: 4 KiB pages;
// the _cpu forms by CPU time).
void set_cold_counters(benchmark::State& state, double bytes_per_call, const Meter& t,
                       const DramRefs& dram, double flops);

// The probe as a benchmark of its own: args {threads, hugepages}.
void BM_DramReadBandwidth(benchmark::State& state);

}  // namespace tilejit::bench
