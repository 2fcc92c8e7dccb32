#include "jit/peak.h"

#include <time.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "codegen/xbyak/emitters.h"
#include "runtime/exec_memory.h"

namespace tilejit::jit {
namespace {

double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

}  // namespace

double measure_peak_gflops(Isa isa, int reps, DType op) {
  if (isa == Isa::scalar) return 0;
  const std::vector<uint8_t> code = codegen::xbyak::emit_peak_probe(isa, op);
  runtime::ExecutableMemory mem(code.data(), code.size());
  auto fn = reinterpret_cast<void (*)(int64_t)>(const_cast<void*>(mem.data()));
  const double flops_per_iter = codegen::xbyak::peak_flops_per_iter(isa, op);
  // Warm up, then size a repetition to ~50 ms: the AMX unit ramps up over
  // milliseconds (a 1000-iteration warm-up measured 1.7 instead of 3.7
  // TFLOP/s per core), AVX-512 clocks likewise.
  fn(100000);
  double t0 = thread_cpu_seconds();
  fn(1000000);
  const int64_t iters = std::max<int64_t>(
      100000, static_cast<int64_t>(1000000 * 0.05 / std::max(thread_cpu_seconds() - t0, 1e-6)));
  std::vector<double> g;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    t0 = thread_cpu_seconds();
    fn(iters);
    const double s = std::max(thread_cpu_seconds() - t0, 1e-9);
    g.push_back(flops_per_iter * static_cast<double>(iters) / s / 1e9);
  }
  std::sort(g.begin(), g.end());
  return g[g.size() / 2];
}

double path_peak_gflops(Isa isa, DType op) {
  const CpuInfo ci = cpu_info();
  if (isa == Isa::scalar || (isa == Isa::amx && (ci.max_isa != Isa::amx || ci.amx_emulated)))
    return 0;
  // Immortal: threads may outlive static destruction.
  static std::mutex& mu = *new std::mutex;
  static auto& peaks = *new std::map<std::pair<Isa, DType>, double>;
  const std::lock_guard<std::mutex> lock(mu);
  auto it = peaks.find({isa, op});
  if (it == peaks.end())
    it = peaks.emplace(std::pair{isa, op}, measure_peak_gflops(isa, 7, op)).first;
  return it->second;
}

}  // namespace tilejit::jit
