// The main job: JIT the GEMMs of one Llama-3-8B decoder layer, check each
// against the scalar reference and print speed against the measured peak.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "jit/peak.h"
#include "ops/gemm_executable.h"
#include "runtime/bf16.h"
#include "runtime/reference_gemm.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"

namespace tilejit::tools {
namespace {

struct LayerGemm {
  const char* name;
  int64_t n, k;
  Activation act;
};

// xorshift: the 235M-element gate/up weight would take seconds with mt19937.
struct Rng {
  uint64_t s;
  float next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<float>(static_cast<int64_t>(s >> 40) - (1 << 23)) / float(1 << 23);
  }
};

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  Rng r{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = runtime::f32_to_bf16(r.next() * scale);
  return v;
}

// Checks rows {0, M/2, M-1} of y against the reference; bf16 output bound:
// one bf16 ulp of |ref| plus fp32 accumulation (K+2)·2⁻²⁴·Σ|x·w| plus the
// activation approximation 4e-6·max(1, |ref|).
bool check_rows(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                const std::vector<uint16_t>& y, int64_t m, const LayerGemm& g, double* max_err) {
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
      double abs_sum = 0;
      for (int64_t kk = 0; kk < g.k; ++kk)
        abs_sum += std::fabs(double(runtime::bf16_to_f32(x[r * g.k + kk])) *
                             runtime::bf16_to_f32(w[j * g.k + kk]));
      const double want = runtime::bf16_to_f32(ref[j]);
      const double got = runtime::bf16_to_f32(y[r * g.n + j]);
      const double tol = std::ldexp(std::fabs(want), -7) + (g.k + 2) * std::ldexp(abs_sum, -24) +
                         4e-6 * std::max(1.0, std::fabs(want));
      const double err = std::fabs(got - want);
      *max_err = std::max(*max_err, err);
      if (!(err <= tol)) ok = false;
    }
  }
  return ok;
}

}  // namespace

int run_llama_layer_job(const LlamaJobOptions& opt) {
  if (opt.threads > 0) set_num_threads(opt.threads);
  const CpuInfo cpu = cpu_info();
  const double peak_core = jit::measure_peak_gflops(cpu.isa == Isa::scalar ? cpu.max_isa : cpu.isa);
  const double peak = peak_core * cpu.num_threads;
  fmt::print(
      "tilejit llama-layer: Llama-3-8B decoder layer GEMMs, bf16 in, fp32 accumulate, bf16 out\n");
  fmt::print(
      "path {} | threads {} | measured {} bf16 peak {:.1f} GFLOP/s per core, {:.1f} total\n\n",
      isa_name(cpu.isa), cpu.num_threads, isa_name(cpu.isa == Isa::scalar ? cpu.max_isa : cpu.isa),
      peak_core, peak);

  const LayerGemm gemms[] = {{"qkv_proj", 6144, 4096, Activation::none},
                             {"o_proj", 4096, 4096, Activation::none},
                             {"gate_up_proj", 28672, 4096, Activation::none},
                             {"down_proj", 4096, 14336, Activation::none}};
  const int64_t ms[] = {1, 16, 512};

  fmt::print("{:<13} {:>4} {:>6} {:>6} {:<7} {:<52} {:>9} {:>7} {:>10} {:>6} {}\n", "gemm", "M",
             "N", "K", "path", "kernel (plan key)", "GFLOP/s", "%peak", "compile ms", "hits",
             "check");
  bool all_ok = true;
  uint64_t seed = 1;
  for (const LayerGemm& g : gemms) {
    const auto w = random_bf16(size_t(g.n) * g.k, seed++, 1.0f / 16);
    const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {g.n, g.k}));
    for (int64_t m : ms) {
      const auto x = random_bf16(size_t(m) * g.k, seed++, 1.0f);
      std::vector<uint16_t> y(size_t(m) * g.n);
      const TensorView xv(x.data(), DType::bf16, {m, g.k});
      const TensorView yv(y.data(), DType::bf16, {m, g.n});
      const GemmOptions go{.bias = std::nullopt, .act = g.act};

      const CacheStats before = cache_stats();
      gemm(xv, pw, yv, go);  // first call: compiles what this M needs
      const CacheStats after_first = cache_stats();
      const double compile_ms = (after_first.compile_seconds - before.compile_seconds) * 1e3;

      double max_err = 0;
      const bool ok = !opt.check || check_rows(x, w, y, m, g, &max_err);
      all_ok &= ok;

      // Timing: batches of calls of >= seconds/5 each; median batch rate.
      std::vector<double> rates;
      const double flops = 2.0 * m * g.n * g.k;
      int64_t per_batch = 1;
      for (int b = 0; b < 5; ++b) {
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t i = 0; i < per_batch; ++i) gemm(xv, pw, yv, go);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        rates.push_back(flops * per_batch / s / 1e9);
        if (b == 0) per_batch = std::max<int64_t>(1, int64_t(opt.seconds / 5 / (s / per_batch)));
      }
      std::sort(rates.begin() + 1, rates.end());
      const double gflops = rates[3];  // median of the 4 sized batches
      const CacheStats after = cache_stats();
      const std::string key =
          cpu.isa == Isa::scalar
              ? std::string("scalar reference")
              : ops::gemm_executable({g.n, g.k, codegen::BiasKind::none, g.act, DType::bf16},
                                     cpu.isa)
                    .plan()
                    .name();
      fmt::print("{:<13} {:>4} {:>6} {:>6} {:<7} {:<52} {:>9.1f} {:>6.1f}% {:>10.3f} {:>6} {}\n",
                 g.name, m, g.n, g.k, isa_name(cpu.isa), key, gflops,
                 peak > 0 ? 100 * gflops / peak : 0.0, compile_ms, after.hits - after_first.hits,
                 !opt.check ? "skipped"
                 : ok       ? fmt::format("ok (max err {:.2g})", max_err)
                            : fmt::format("FAIL (max err {:.2g})", max_err));
    }
  }
  const CacheStats st = cache_stats();
  fmt::print("\ncache: {} kernels, {} compiles, {:.2f} ms compiling, {} hits, {} misses\n",
             st.kernels, st.compiles, st.compile_seconds * 1e3, st.hits, st.misses);
  if (!all_ok) {
    fmt::print(stderr, "tilejit llama-layer: some results differ from the scalar reference\n");
    return 1;
  }
  return 0;
}

}  // namespace tilejit::tools
