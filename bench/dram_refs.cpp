#include "dram_refs.h"

#include <sys/mman.h>

#include <memory>
#include <new>
#include <vector>

#include "dram_bandwidth.h"

namespace tilejit::bench {

Mapping::Mapping(size_t n, bool huge) : bytes(n) {
  p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  madvise(p, n, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
}

Mapping::~Mapping() {
  munmap(p, bytes);
}

bool dram_probe_usable() {
  return stream_read_usable();
}

const Mapping& dram_buffer(bool huge) {
  static std::unique_ptr<Mapping> b[2];
  if (!b[huge]) {
    b[huge] = std::make_unique<Mapping>(2 * kGiB, huge);
    auto* w = static_cast<uint64_t*>(b[huge]->p);
    for (size_t i = 0; i < b[huge]->bytes / 8; ++i) w[i] = i;  // every page, non-zero data
  }
  return *b[huge];
}

DramRate measure_dram(int threads, bool huge, int passes) {
  DramRate v;
  if (!dram_probe_usable()) return v;
  const Mapping& b = dram_buffer(huge);
  std::vector<double> g, c;
  for (int r = 0; r < passes; ++r) {
    const Meter t(threads);
    benchmark::DoNotOptimize(stream_read(b.p, b.bytes, threads));
    g.push_back(double(b.bytes) / t.wall() * 1e-9);
    c.push_back(double(b.bytes) / t.cpu() * 1e-9);
  }
  v.wall_gbs = median(g);
  v.cpu_gbs = median(c);
  return v;
}

DramRefs measure_dram_refs(int threads) {
  return {measure_dram(threads, true), measure_dram(threads, false)};
}

void set_cold_counters(benchmark::State& state, double bytes_per_call, const Meter& t,
                       const DramRefs& dram, double flops) {
  const double it = double(state.iterations());
  const double gbs = bytes_per_call * it / t.wall() * 1e-9;
  const double cpu_gbs = bytes_per_call * it / t.cpu() * 1e-9;
  auto pct = [](double x, double ref) { return ref > 0 ? 100.0 * x / ref : 0.0; };
  state.counters["GBs"] =
      benchmark::Counter(bytes_per_call * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GBs_cpu"] = cpu_gbs;
  state.counters["pct_dram_bw"] = pct(gbs, dram.huge.wall_gbs);
  state.counters["pct_dram_bw_cpu"] = pct(cpu_gbs, dram.huge.cpu_gbs);
  state.counters["pct_dram_bw_4k"] = pct(gbs, dram.small.wall_gbs);
  state.counters["pct_dram_bw_4k_cpu"] = pct(cpu_gbs, dram.small.cpu_gbs);
  state.counters["dram_GBs"] = dram.huge.wall_gbs;
  state.counters["dram_GBs_cpu"] = dram.huge.cpu_gbs;
  state.counters["dram4k_GBs"] = dram.small.wall_gbs;
  state.counters["dram4k_GBs_cpu"] = dram.small.cpu_gbs;
  state.counters["bytes_per_call"] = bytes_per_call;
}

void BM_DramReadBandwidth(benchmark::State& state) {
  if (!dram_probe_usable()) return skip(state, "the streaming probe needs AVX-512F or AVX2");
  const int threads = static_cast<int>(state.range(0));
  const Mapping& b = dram_buffer(state.range(1) != 0);
  // One untimed pass: a run of one iteration (moe_bench) must not time the
  // first walk over freshly mapped pages.
  benchmark::DoNotOptimize(stream_read(b.p, b.bytes, threads));
  const Meter t(threads);
  for (auto _ : state) benchmark::DoNotOptimize(stream_read(b.p, b.bytes, threads));
  state.counters["GBs"] =
      benchmark::Counter(double(b.bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GBs_cpu"] = double(b.bytes) * double(state.iterations()) / t.cpu() * 1e-9;
}

}  // namespace tilejit::bench
