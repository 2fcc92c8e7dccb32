// Row-wise layer ops (docs/rowwise.md): rms_norm, fused_add_rms_norm,
// layer_norm and act_and_mul at decode (T 1, 16) and prefill (T 512) sizes
// of Llama-3-8B (H 4096, I 14336) and DeepSeek-V3 (H 7168), and
// rms_norm_gated over Qwen3-Next's linear-attention heads (32 of 128), bf16.
//
// Peers, in the same run: oneDNN's layer normalization (bf16 in / out, f32
// scale and shift): the same op as layer_norm, and for rms_norm the nearest
// primitive an engine could call (oneDNN 2.6 has no RMS flag, and
// LayerNorm's mean costs it one more reduction over the same bytes),
// and a plain copy of the same bytes (memcpy: the memory system's rate for
// that footprint, which a row-wise op can at best match). Counter GB/s:
// bytes read + written per call over the wall time; a T 512 row set of
// 4096 bf16 values is 4 MiB in and 4 MiB out, beyond this machine's L2.
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <vector>

#include "bench_util.h"
#include "onednn_context.h"
#include "tilejit/tilejit.h"

namespace tilejit::bench {
namespace {

std::vector<uint16_t> bf16_values(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = runtime::f32_to_bf16(static_cast<float>(static_cast<int32_t>(s >> 8) % 2001 - 1000) /
                             500.0f);
  }
  return v;
}

void report(benchmark::State& state, double bytes) {
  state.counters["GB/s"] =
      benchmark::Counter(bytes * double(state.iterations()), benchmark::Counter::kIsRate);
}

void threads_from(benchmark::State& state, int arg) {
  const int t = static_cast<int>(state.range(arg));
  set_num_threads(t);
  omp_set_num_threads(t);
}

// args: T, H, threads
void BM_RmsNormTilejit(benchmark::State& state) {
  const int64_t t = state.range(0), h = state.range(1);
  threads_from(state, 2);
  auto x = bf16_values(t * h, 1), w = bf16_values(h, 2);
  std::vector<uint16_t> out(t * h);
  const TensorView xv(x.data(), DType::bf16, {t, h}), wv(w.data(), DType::bf16, {h}),
      ov(out.data(), DType::bf16, {t, h});
  for (auto _ : state) {
    rms_norm(xv, &wv, ov);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 2.0 * t * h * 2 + 2.0 * h);
}

// residual += x; x = norm(residual): reads x and residual, writes both.
void BM_FusedAddRmsNormTilejit(benchmark::State& state) {
  const int64_t t = state.range(0), h = state.range(1);
  threads_from(state, 2);
  auto x = bf16_values(t * h, 1), r = bf16_values(t * h, 3), w = bf16_values(h, 2);
  const TensorView xv(x.data(), DType::bf16, {t, h}), rv(r.data(), DType::bf16, {t, h}),
      wv(w.data(), DType::bf16, {h});
  for (auto _ : state) {
    // The residual grows by about 1 per call: finite in bf16 for any run.
    fused_add_rms_norm(xv, rv, &wv, xv);
    benchmark::DoNotOptimize(r.data());
  }
  report(state, 4.0 * t * h * 2 + 2.0 * h);
}

// oneDNN's layer normalization of [t, h] bf16 rows with an f32 scale (and
// shift): the peer of rms_norm (scale) and of layer_norm (both).
void onednn_layer_norm(benchmark::State& state, bool shift) {
  const int64_t t = state.range(0), h = state.range(1);
  threads_from(state, 2);
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  const memory::desc md({t, h}, memory::data_type::bf16, memory::format_tag::ab);
  const auto flags = shift ? normalization_flags::use_scale | normalization_flags::use_shift
                           : normalization_flags::use_scale;
  const layer_normalization_forward::desc desc(prop_kind::forward_inference, md, 1e-6f, flags);
  const layer_normalization_forward::primitive_desc pd(desc, eng);
  auto x = bf16_values(t * h, 1);
  std::vector<uint16_t> out(t * h);
  std::vector<float> scale(h, 1.0f), bias(h, 0.5f);
  memory src(md, eng, x.data()), dst(md, eng, out.data());
  memory sc(pd.weights_desc(), eng, scale.data()), sh(pd.weights_desc(), eng, bias.data());
  memory mean(pd.mean_desc(), eng), var(pd.variance_desc(), eng);
  layer_normalization_forward ln(pd);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                       {DNNL_ARG_DST, dst},
                                       {DNNL_ARG_SCALE, sc},
                                       {DNNL_ARG_MEAN, mean},
                                       {DNNL_ARG_VARIANCE, var}};
  if (shift) args.emplace(DNNL_ARG_SHIFT, sh);
  for (auto _ : state) {
    ln.execute(s, args);
    s.wait();
  }
  report(state, 2.0 * t * h * 2 + (shift ? 8.0 : 4.0) * h);
}

void BM_RmsNormOnednnLayerNorm(benchmark::State& state) {
  onednn_layer_norm(state, false);
}
void BM_LayerNormOnednn(benchmark::State& state) {
  onednn_layer_norm(state, true);
}

// layer_norm with an f32 weight and bias (oneDNN's scale and shift).
void BM_LayerNormTilejit(benchmark::State& state) {
  const int64_t t = state.range(0), h = state.range(1);
  threads_from(state, 2);
  auto x = bf16_values(t * h, 1);
  std::vector<float> w(h, 1.0f), b(h, 0.5f);
  std::vector<uint16_t> out(t * h);
  const TensorView xv(x.data(), DType::bf16, {t, h}), wv(w.data(), DType::f32, {h}),
      bv(b.data(), DType::f32, {h}), ov(out.data(), DType::bf16, {t, h});
  for (auto _ : state) {
    layer_norm(xv, &wv, &bv, ov);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 2.0 * t * h * 2 + 8.0 * h);
}

// Qwen3-Next's gated delta net output norm: T tokens × 32 heads of 128,
// rms_norm(x)·w·silu(z). args: T, threads
void BM_RmsNormGatedTilejit(benchmark::State& state) {
  const int64_t t = state.range(0) * 32, h = 128;
  threads_from(state, 1);
  auto x = bf16_values(t * h, 1), z = bf16_values(t * h, 5), w = bf16_values(h, 2);
  std::vector<uint16_t> out(t * h);
  const TensorView xv(x.data(), DType::bf16, {t, h}), zv(z.data(), DType::bf16, {t, h}),
      wv(w.data(), DType::bf16, {h}), ov(out.data(), DType::bf16, {t, h});
  for (auto _ : state) {
    rms_norm_gated(xv, zv, &wv, ov);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 3.0 * t * h * 2 + 2.0 * h);
}

// args: T, D (out columns; x has 2·D), threads
void BM_SiluAndMulTilejit(benchmark::State& state) {
  const int64_t t = state.range(0), d = state.range(1);
  threads_from(state, 2);
  auto x = bf16_values(t * 2 * d, 4);
  std::vector<uint16_t> out(t * d);
  const TensorView xv(x.data(), DType::bf16, {t, 2 * d}), ov(out.data(), DType::bf16, {t, d});
  for (auto _ : state) {
    act_and_mul(xv, ov);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, 3.0 * t * d * 2);
}

// The memory system's rate for a footprint: memcpy of `bytes` (args: bytes
// in KiB), one thread.
void BM_Copy(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0)) * 1024;
  std::vector<uint8_t> a(bytes, 1), b(bytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), bytes);
    benchmark::DoNotOptimize(b.data());
  }
  report(state, 2.0 * double(bytes));
}

void norm_args(benchmark::internal::Benchmark* b) {
  for (int64_t h : {4096, 7168})
    for (int64_t t : {1, 16, 512}) b->Args({t, h, 1});
  b->Args({16, 4096, 2});
  b->Args({512, 4096, 2});
  b->ArgNames({"T", "H", "threads"})->UseRealTime();
}

BENCHMARK(BM_RmsNormTilejit)->Apply(norm_args);
BENCHMARK(BM_RmsNormOnednnLayerNorm)->Apply(norm_args);
BENCHMARK(BM_FusedAddRmsNormTilejit)->Apply(norm_args);
BENCHMARK(BM_LayerNormTilejit)->Apply(norm_args);
BENCHMARK(BM_LayerNormOnednn)->Apply(norm_args);
BENCHMARK(BM_RmsNormGatedTilejit)
    ->Args({1, 1})
    ->Args({16, 1})
    ->Args({512, 1})
    ->Args({512, 2})
    ->ArgNames({"T", "threads"})
    ->UseRealTime();
BENCHMARK(BM_SiluAndMulTilejit)
    ->Args({1, 14336, 1})
    ->Args({16, 14336, 1})
    ->Args({16, 14336, 2})
    ->Args({512, 14336, 1})
    ->Args({512, 14336, 2})
    ->ArgNames({"T", "D", "threads"})
    ->UseRealTime();
// The footprints above: 16 KiB (T 1), 256 KiB (T 16), 8 MiB (T 512), H 4096 in + out.
BENCHMARK(BM_Copy)->Arg(8)->Arg(128)->Arg(4096)->ArgName("KiB")->UseRealTime();

}  // namespace
}  // namespace tilejit::bench

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  tilejit::bench::add_onednn_context();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
