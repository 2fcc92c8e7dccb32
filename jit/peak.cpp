#include "jit/peak.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "codegen/xbyak/emitters.h"
#include "runtime/exec_memory.h"

namespace tilejit::jit {

double measure_peak_gflops(Isa isa, int reps, DType op) {
  if (isa == Isa::scalar) return 0;
  const std::vector<uint8_t> code = codegen::xbyak::emit_peak_probe(isa, op);
  runtime::ExecutableMemory mem(code.data(), code.size());
  auto fn = reinterpret_cast<void (*)(int64_t)>(const_cast<void*>(mem.data()));
  const double flops_per_iter = codegen::xbyak::peak_flops_per_iter(isa, op);
  // ~20 ms per repetition at a few hundred GFLOP/s (AMX: ~4 ms at 3.7 TFLOP/s).
  const int64_t iters = isa == Isa::amx ? 100000 : 5000000;
  // Warm up for a whole repetition: the AMX unit ramps up over milliseconds
  // (a 1000-iteration warm-up measured 1.7 instead of 3.7 TFLOP/s per core).
  fn(iters);
  std::vector<double> g;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    fn(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    g.push_back(flops_per_iter * iters / s / 1e9);
  }
  std::sort(g.begin(), g.end());
  return g[g.size() / 2];
}

}  // namespace tilejit::jit
