// RoPE throughput in GB/s (bytes of q and k read + written, the cache rows
// counted once per token) next to an in-place read-modify-write stream over
// the same q/k bytes: the memory-bound ceiling of an in-place operator.
//   rope_bench [--threads N | N] [--help]
// GB/s counts the rotary bytes only (partial rotary touches fewer bytes than
// its cache lines).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "bench_args.h"
#include "runtime/thread_pool.h"
#include "tilejit/tilejit.h"

namespace {

using Clock = std::chrono::steady_clock;

// Best seconds of `reps` runs of f.
double best_of(int reps, const std::function<void()>& f) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

struct Shape {
  const char* name;
  int64_t t, hq, hk, d, rd;
  tilejit::RopeStyle style;
  tilejit::DType dtype;
};

void run(const Shape& s) {
  const int64_t eb = tilejit::dtype_bits(s.dtype) / 8, maxpos = 8192;
  std::vector<uint8_t> q(size_t(s.t * s.hq * s.d * eb), 0x3c),
      k(size_t(s.t * s.hk * s.d * eb), 0x3c);
  std::vector<float> cache(size_t(maxpos * s.rd));
  // A real cos / sin table: the bench rotates q and k in place thousands of
  // times, and only true rotations keep the values from drifting into
  // subnormals (slow arithmetic, the kernel's integer-rounding branch) or Inf.
  for (int64_t p = 0; p < maxpos; ++p)
    for (int64_t i = 0; i < s.rd / 2; ++i) {
      const double th = double(p) * std::pow(500000.0, -2.0 * double(i) / double(s.rd));
      cache[size_t(p * s.rd + i)] = float(std::cos(th));
      cache[size_t(p * s.rd + s.rd / 2 + i)] = float(std::sin(th));
    }
  std::vector<int32_t> pos(size_t(s.t));
  for (int64_t i = 0; i < s.t; ++i) pos[i] = int32_t((i * 7919) % maxpos);
  tilejit::TensorView qv(q.data(), s.dtype, {s.t, s.hq, s.d}),
      kv(k.data(), s.dtype, {s.t, s.hk, s.d});
  tilejit::TensorView pv(pos.data(), tilejit::DType::i32, {s.t});
  tilejit::TensorView cv(cache.data(), tilejit::DType::f32, {maxpos, s.rd});
  tilejit::RopeOptions opt;
  opt.style = s.style;
  opt.rotary_dim = s.rd;
  const double c0 = tilejit::cache_stats().compile_seconds;
  tilejit::rope(qv, &kv, pv, cv, opt);  // compile
  const double compile_ms = (tilejit::cache_stats().compile_seconds - c0) * 1e3;
  const double rot_bytes = double(s.t * (s.hq + s.hk) * s.rd * eb) * 2 + double(s.t * s.rd * 4);
  const int reps = s.t >= 1024 ? 10 : 2000;
  const double sec = best_of(reps, [&] { tilejit::rope(qv, &kv, pv, cv, opt); });
  // Baseline: copy the same q/k rows to a scratch buffer (read + write of the
  // same byte count, no arithmetic), on the same threads.
  std::vector<uint8_t> scratch(q.size() + k.size());
  const double base = best_of(reps, [&] {
    tilejit::runtime::parallel_for(s.t, [&](int64_t t) {
      const size_t qr = size_t(s.hq * s.d * eb), kr = size_t(s.hk * s.d * eb);
      std::memcpy(scratch.data() + t * (qr + kr), q.data() + t * qr, qr);
      std::memcpy(scratch.data() + t * (qr + kr) + qr, k.data() + t * kr, kr);
    });
  });
  const double copy_bytes = double(q.size() + k.size()) * 2;
  std::printf("%-28s T=%-5lld %9.2f us %7.2f GB/s  (row copy %7.2f GB/s)  compile %.1f ms\n",
              s.name, (long long)s.t, sec * 1e6, rot_bytes / sec / 1e9, copy_bytes / base / 1e9,
              compile_ms);
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  if (const int rc = tilejit::bench::parse_bench_args(
          argc, argv, "rope_bench [--threads N | N] [--help]: RoPE GB/s next to a row copy",
          &threads);
      rc >= 0)
    return rc;
  using tilejit::DType;
  using tilejit::RopeStyle;
  std::printf("threads %d, isa %s\n", tilejit::num_threads(),
              tilejit::isa_name(tilejit::cpu_info().isa));
  const Shape shapes[] = {
      {"llama3-8b prefill neox bf16", 4096, 32, 8, 128, 128, RopeStyle::neox, DType::bf16},
      // The issue-15 comparison point (vLLM's rotary_embedding, docs/rope.md).
      {"llama3-8b prefill neox bf16", 512, 32, 8, 128, 128, RopeStyle::neox, DType::bf16},
      {"llama3-8b prefill neox f32", 2048, 32, 8, 128, 128, RopeStyle::neox, DType::f32},
      {"llama3-8b prefill gptj bf16", 4096, 32, 8, 128, 128, RopeStyle::gptj, DType::bf16},
      {"gptj-6b rd64 prefill bf16", 2048, 16, 16, 256, 64, RopeStyle::gptj, DType::bf16},
      {"llama3-8b decode b64 bf16", 64, 32, 8, 128, 128, RopeStyle::neox, DType::bf16},
      {"llama3-8b decode b1 bf16", 1, 32, 8, 128, 128, RopeStyle::neox, DType::bf16},
  };
  for (const Shape& s : shapes) run(s);
}
