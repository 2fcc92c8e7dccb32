// moe_bench: tilejit::fused_experts on two model layers against this
// machine's measured limits (bf16 peak from the JIT peak probe, DRAM read
// bandwidth).
//
//   build-moe/bench/moe_bench --benchmark_repetitions=5
//       --benchmark_display_aggregates_only=true --benchmark_filter=...
// (docs/moe.md has the exact commands and the measured tables.)
//
// Layers:
//   qwen3   Qwen3-30B-A3B-like: E = 128, k = 8, H = 2048, I = 768
//           (1.21 GB of packed experts, 9.4 MB per expert)
//   mixtral Mixtral-8x7B-like:  E = 8,   k = 2, H = 4096, I = 14336
//           (2.8 GB of packed experts, 352 MB per expert)
// T ∈ {1, 16, 256, 512, 2048} tokens. Mixtral at T = 2048 is one call of ~1.4 TFLOP
// of routed work, several seconds on this 2-core machine: it runs once per
// repetition, on 2 threads only.
//
// Routing: random logits [T, E] through tilejit::topk_softmax (renormalized),
// 16 routing sets per T cycled per iteration, so consecutive calls touch
// different experts as consecutive decode steps do. Routing is done outside
// the timed region (it is its own op).
//
// Counters (wall clock, UseRealTime: the library runs its own threads):
//   tokens_per_s  T / time per call
//   GFLOPs        routed-expert FLOPs actually computed per second:
//                 2·T·k·(2I·H + H·I) per call (no shared expert, nothing for
//                 experts no token chose)
//   GFLOPs_cpu    the same over process CPU time / threads: on this shared
//                 machine it leaves out the time other processes held the cores
//   pct_peak      GFLOPs of threads × the per-core bf16 peak (JIT probe)
//   for T ≤ 16 (weight-streaming decode):
//   GBs           expert weights read per second: unique experts touched by the
//                 call × packed bytes per expert (w13 + w2); the weights total
//                 ≥ 1.2 GB ≫ the 32 MiB L3, and each call routes afresh, so
//                 they come from DRAM
//   dram_GBs      streaming read bandwidth with the same thread count, measured
//                 right before the run (2 GiB, huge pages, as packed weights get)
//   pct_dram      GBs of dram_GBs (pct_dram_cpu: both over CPU time)
//
// Quantized experts (BM_QuantExperts/<layer>/<format>, T in {1, 16, 512}):
//   qwen3     the layer above, formats int8 (W8A8, per-channel), fp8
//             (per-channel), int4 GPTQ and AWQ (g128, zero points), mxfp4;
//   deepseek  DeepSeek-V3-like experts with block-fp8 (128 x 128) scales:
//             k = 8, H = 7168, I = 2048, but E = 32 instead of 256 (256 would
//             be 11 GB of fp8 plus the checkpoint copy to pack it from;
//             a decode step's traffic is the touched experts either way).
//   The checkpoints are random codes with normal-range scales (speed does
//   not depend on the values). Each layer is packed in enough independent
//   copies to exceed 1.5 GiB, and the calls rotate through them as
//   consecutive decoder layers do, so decode reads come from DRAM (the L3
//   here is 504 MiB). GBs counts the touched experts' packed bytes: codes,
//   scales and zero points (PackedExperts::packed_bytes per expert).
//
// On this shared VM the wall-clock rates move with the other tenants (the
// process often gets a fraction of its cores); the *_cpu counters are the
// stable view: the rate each thread sustains while it actually runs.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "codegen/xbyak/emitters.h"
#include "dram_refs.h"
#include "runtime/bf16.h"
#include "runtime/exec_memory.h"
#include "tilejit/tilejit.h"

namespace {

using tilejit::DType;
using tilejit::TensorView;
using namespace tilejit::bench;

// A decode run's memory counters: GB/s of the touched experts' bytes
// (weights + scales) over wall and CPU time, and their percent of the DRAM
// probe measured right before the run.
void set_decode_counters(benchmark::State& state, double bytes, double wall, double cpu,
                         const DramRate& dram) {
  const double gbs = bytes / wall * 1e-9, cpu_gbs = bytes / cpu * 1e-9;
  state.counters["GBs"] = gbs;
  state.counters["GBs_cpu"] = cpu_gbs;
  state.counters["dram_GBs"] = dram.wall_gbs;
  state.counters["dram_GBs_cpu"] = dram.cpu_gbs;
  if (dram.wall_gbs > 0) state.counters["pct_dram"] = 100.0 * gbs / dram.wall_gbs;
  if (dram.cpu_gbs > 0) state.counters["pct_dram_cpu"] = 100.0 * cpu_gbs / dram.cpu_gbs;
}

// ---------------------------------------------------------------- layers

struct LayerShape {
  const char* name;
  int64_t e, k, h, i;
};
constexpr LayerShape kQwen3{"qwen3", 128, 8, 2048, 768};
constexpr LayerShape kMixtral{"mixtral", 8, 2, 4096, 14336};

// The packed experts of one layer (the raw weights are dropped after packing).
struct Layer {
  LayerShape s;
  tilejit::PackedExperts w13, w2;
  double bytes_per_expert = 0;
  explicit Layer(const LayerShape& shape) : s(shape) {
    {
      std::vector<uint16_t> raw(size_t(s.e * 2 * s.i * s.h));
      // ~unit-variance gate/up pre-activations: uniform(±a) with a = 3/√H.
      fill_repeating_bf16(raw.data(), raw.size(), 1, float(3.0 / std::sqrt(double(s.h))));
      w13 = tilejit::pack_experts(TensorView(raw.data(), DType::bf16, {s.e, 2 * s.i, s.h}),
                                  tilejit::ExpertProj::gate_up);
    }
    {
      std::vector<uint16_t> raw(size_t(s.e * s.h * s.i));
      fill_repeating_bf16(raw.data(), raw.size(), 2, float(3.0 / std::sqrt(double(s.i))));
      w2 = tilejit::pack_experts(TensorView(raw.data(), DType::bf16, {s.e, s.h, s.i}),
                                 tilejit::ExpertProj::down);
    }
    bytes_per_expert = double(w13.packed_bytes() + w2.packed_bytes()) / double(s.e);
  }
};

// One live layer at a time (mixtral's packed experts alone are 2.8 GB).
Layer& layer(const LayerShape& s) {
  static std::unique_ptr<Layer> cur;
  if (!cur || cur->s.e != s.e || cur->s.h != s.h || cur->s.i != s.i) {
    cur.reset();
    cur = std::make_unique<Layer>(s);
  }
  return *cur;
}

// kSets routing sets for T tokens: topk_softmax over random logits.
constexpr int kSets = 16;
struct Routing {
  int64_t t = 0, k = 0;
  std::vector<float> weights;   // [kSets][T, k]
  std::vector<int32_t> ids;     // [kSets][T, k]
  std::vector<int64_t> unique;  // experts touched per set
  double mean_unique = 0;
};

Routing make_routing(const LayerShape& s, int64_t t) {
  Routing r;
  r.t = t, r.k = s.k;
  r.weights.resize(size_t(kSets * t * s.k));
  r.ids.resize(r.weights.size());
  std::mt19937 rng(uint32_t(t * 1000 + s.e));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits(size_t(t * s.e));
  for (int set = 0; set < kSets; ++set) {
    for (float& l : logits) l = nd(rng);
    float* w = r.weights.data() + set * t * s.k;
    int32_t* id = r.ids.data() + set * t * s.k;
    tilejit::topk_softmax(TensorView(logits.data(), DType::f32, {t, s.e}),
                          TensorView(w, DType::f32, {t, s.k}),
                          TensorView(id, DType::i32, {t, s.k}));
    r.unique.push_back(int64_t(std::set<int32_t>(id, id + t * s.k).size()));
  }
  double sum = 0;
  for (int64_t u : r.unique) sum += double(u);
  r.mean_unique = sum / kSets;
  return r;
}

// Hidden states and the output, the largest T's worth, reused by every run.
struct Activations {
  std::vector<uint16_t> hidden, out;
};
Activations& activations(int64_t t, int64_t h) {
  static Activations a;
  const size_t n = size_t(t * h);
  if (a.hidden.size() < n) {
    a.hidden.resize(n);
    fill_repeating_bf16(a.hidden.data(), n, 3, 1.0f);
    a.out.resize(n);
  }
  return a;
}

void BM_FusedExperts(benchmark::State& state, LayerShape s) {
  const int64_t t = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  if (tilejit::cpu_info().isa == tilejit::Isa::scalar)
    return skip(state, "the scalar path is the reference: nothing to time");
  Layer& l = layer(s);
  const Routing r = make_routing(s, t);
  Activations& act = activations(t, s.h);
  tilejit::set_num_threads(threads);
  const TensorView hidden(act.hidden.data(), DType::bf16, {t, s.h});
  const TensorView out(act.out.data(), DType::bf16, {t, s.h});
  auto run = [&](int set) {
    tilejit::fused_experts(hidden, l.w13, l.w2,
                           TensorView(r.weights.data() + set * t * s.k, DType::f32, {t, s.k}),
                           TensorView(r.ids.data() + set * t * s.k, DType::i32, {t, s.k}), out);
  };
  run(kSets - 1);  // warm-up: compiles the kernels
  const DramRate dram = t <= 16 ? measure_dram(threads) : DramRate{};
  int set = 0;
  double bytes = 0;
  const Meter m(threads);
  for (auto _ : state) {
    run(set);
    bytes += double(r.unique[size_t(set)]) * l.bytes_per_expert;
    set = (set + 1) % kSets;
  }
  const double wall = m.wall(), cpu = m.cpu(), it = double(state.iterations());
  for (size_t n = 0; n < act.out.size() && n < size_t(s.h); ++n)
    if (!std::isfinite(tilejit::runtime::bf16_to_f32(act.out[n])))
      return state.SkipWithError("non-finite output");
  const double flops = 2.0 * double(t * s.k) * double(2 * s.i * s.h + s.h * s.i);
  const double gflops = flops * it / wall * 1e-9, cpu_gflops = flops * it / cpu * 1e-9;
  state.counters["tokens_per_s"] = double(t) * it / wall;
  state.counters["GFLOPs"] = gflops;
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak"] = pct_of_peak(gflops, threads);
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, threads);
  state.counters["experts_touched"] = r.mean_unique;
  if (t <= 16) set_decode_counters(state, bytes, wall, cpu, dram);
}

// ---------------------------------------------------------------- quantized experts

enum class QFormat { int8, fp8_channel, fp8_block, int4_gptq, int4_awq, mxfp4 };
const char* qformat_name(QFormat f) {
  switch (f) {
    case QFormat::int8:
      return "int8";
    case QFormat::fp8_channel:
      return "fp8_channel";
    case QFormat::fp8_block:
      return "fp8_block128";
    case QFormat::int4_gptq:
      return "int4_gptq_g128";
    case QFormat::int4_awq:
      return "int4_awq_g128";
    case QFormat::mxfp4:
      return "mxfp4";
  }
  return "?";
}
constexpr LayerShape kDeepseek{"deepseek", 32, 8, 7168, 2048};

void fill_words(void* p, size_t bytes, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < bytes / 8; ++i) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    w[i] = x;
  }
}

// E random [N, K] matrices of format f, packed for proj.
tilejit::PackedExperts pack_random(QFormat f, int64_t E, int64_t N, int64_t K,
                                   tilejit::ExpertProj proj, uint64_t seed) {
  constexpr int64_t g = 128;
  const int64_t G = (K + g - 1) / g;
  switch (f) {
    case QFormat::int8: {
      std::vector<int8_t> w(size_t(E * N * K));
      fill_words(w.data(), w.size(), seed);
      std::vector<float> sc(size_t(E * N), 0.01f);
      std::vector<tilejit::Int8Weight> v(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        v[e].weight = TensorView(w.data() + e * N * K, DType::i8, {N, K});
        v[e].scales = TensorView(sc.data() + e * N, DType::f32, {N});
      }
      return tilejit::pack_experts(v, proj);
    }
    case QFormat::fp8_channel:
    case QFormat::fp8_block: {
      std::vector<uint8_t> w(size_t(E * N * K));
      fill_words(w.data(), w.size(), seed);
      for (uint8_t& b : w) b &= 0xF7;  // exponent < 15: never the NaN code
      const bool block = f == QFormat::fp8_block;
      const int64_t gn = block ? (N + 127) / 128 : N, gk = block ? G : 1;
      std::vector<float> sc(size_t(E * gn * gk), 0.01f);
      std::vector<tilejit::Fp8Weight> v(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        v[e].weight = TensorView(w.data() + e * N * K, DType::f8e4m3, {N, K});
        if (block) {
          v[e].scales = TensorView(sc.data() + e * gn * gk, DType::f32, {gn, gk});
          v[e].block_n = v[e].block_k = 128;
        } else {
          v[e].scales = TensorView(sc.data() + e * N, DType::f32, {N});
        }
      }
      return tilejit::pack_experts(v, proj);
    }
    case QFormat::int4_gptq:
    case QFormat::int4_awq: {
      const bool awq = f == QFormat::int4_awq;
      const int64_t qr = awq ? K : (K + 7) / 8, qc = awq ? (N + 7) / 8 : N;
      std::vector<int32_t> qw(size_t(E * qr * qc)), qz(size_t(E * G * ((N + 7) / 8)));
      fill_words(qw.data(), qw.size() * 4, seed);
      fill_words(qz.data(), qz.size() * 4, seed + 1);
      std::vector<uint16_t> sc(size_t(E * G * N), 0x211F);  // f16 0.01
      std::vector<tilejit::Int4Weight> v(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        v[e].format = awq ? tilejit::Int4Format::awq : tilejit::Int4Format::gptq;
        v[e].group_size = g;
        v[e].qweight = TensorView(qw.data() + e * qr * qc, DType::i32, {qr, qc});
        v[e].qzeros = TensorView(qz.data() + e * G * ((N + 7) / 8), DType::i32, {G, (N + 7) / 8});
        v[e].scales = TensorView(sc.data() + e * G * N, DType::f16, {G, N});
      }
      return tilejit::pack_experts(v, proj);
    }
    case QFormat::mxfp4: {
      const int64_t kb = (K + 31) / 32;
      std::vector<uint8_t> blocks(size_t(E * N * kb * 16)), sc(size_t(E * N * kb), 120);
      fill_words(blocks.data(), blocks.size(), seed);
      std::vector<tilejit::Mxfp4Weight> v(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        v[e].blocks = TensorView(blocks.data() + e * N * kb * 16, DType::u8, {N, kb, 16});
        v[e].scales = TensorView(sc.data() + e * N * kb, DType::u8, {N, kb});
      }
      return tilejit::pack_experts(v, proj);
    }
  }
  return {};
}

// Independent packed copies of one quantized layer (see the top), one live
// layer at a time.
struct QuantLayer {
  LayerShape s;
  QFormat f;
  std::vector<tilejit::PackedExperts> w13, w2;
  double bytes_per_expert = 0;
  QuantLayer(const LayerShape& shape, QFormat fmt) : s(shape), f(fmt) {
    double layer_bytes = 0;
    for (uint64_t c = 0; c == 0 || layer_bytes * double(c) < 1.5 * double(kGiB); ++c) {
      w13.push_back(pack_random(f, s.e, 2 * s.i, s.h, tilejit::ExpertProj::gate_up, 2 * c + 1));
      w2.push_back(pack_random(f, s.e, s.h, s.i, tilejit::ExpertProj::down, 2 * c + 2));
      layer_bytes = double(w13[0].packed_bytes() + w2[0].packed_bytes());
    }
    bytes_per_expert = layer_bytes / double(s.e);
  }
};

QuantLayer& quant_layer(const LayerShape& s, QFormat f) {
  static std::unique_ptr<QuantLayer> cur;
  if (!cur || cur->s.e != s.e || cur->s.h != s.h || cur->f != f) {
    cur.reset();
    cur = std::make_unique<QuantLayer>(s, f);
  }
  return *cur;
}

void BM_QuantExperts(benchmark::State& state, LayerShape s, QFormat f) {
  const int64_t t = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  if (tilejit::cpu_info().isa == tilejit::Isa::scalar)
    return skip(state, "the scalar path is the reference: nothing to time");
  QuantLayer& l = quant_layer(s, f);
  const Routing r = make_routing(s, t);
  Activations& act = activations(t, s.h);
  tilejit::set_num_threads(threads);
  const TensorView hidden(act.hidden.data(), DType::bf16, {t, s.h});
  const TensorView out(act.out.data(), DType::bf16, {t, s.h});
  const size_t copies = l.w13.size();
  auto run = [&](int set, size_t copy) {
    tilejit::fused_experts(hidden, l.w13[copy], l.w2[copy],
                           TensorView(r.weights.data() + set * t * s.k, DType::f32, {t, s.k}),
                           TensorView(r.ids.data() + set * t * s.k, DType::i32, {t, s.k}), out);
  };
  for (size_t c = 0; c < copies; ++c) run(kSets - 1, c);  // warm-up: compiles, faults pages in
  const DramRate dram = t <= 16 ? measure_dram(threads) : DramRate{};
  int set = 0;
  size_t copy = 0;
  double bytes = 0;
  const Meter m(threads);
  for (auto _ : state) {
    run(set, copy);
    bytes += double(r.unique[size_t(set)]) * l.bytes_per_expert;
    set = (set + 1) % kSets;
    copy = (copy + 1) % copies;
  }
  const double wall = m.wall(), cpu = m.cpu(), it = double(state.iterations());
  for (size_t n = 0; n < size_t(s.h); ++n)
    if (!std::isfinite(tilejit::runtime::bf16_to_f32(act.out[n])))
      return state.SkipWithError("non-finite output");
  const double flops = 2.0 * double(t * s.k) * double(2 * s.i * s.h + s.h * s.i);
  state.counters["tokens_per_s"] = double(t) * it / wall;
  state.counters["GFLOPs"] = flops * it / wall * 1e-9;
  state.counters["GFLOPs_cpu"] = flops * it / cpu * 1e-9;
  state.counters["copies"] = double(copies);
  if (t <= 16) set_decode_counters(state, bytes, wall, cpu, dram);
}

// The routers on their own: T tokens of random logits over E experts, top k
// (renormalized softmax, or sigmoid), tokens per second. Arguments:
// {T, E, k, sigmoid, threads}.
void BM_Routing(benchmark::State& state) {
  const int64_t t = state.range(0), e = state.range(1), k = state.range(2);
  const bool sig = state.range(3) != 0;
  tilejit::set_num_threads(static_cast<int>(state.range(4)));
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> logits(size_t(t * e)), w(size_t(t * k));
  std::vector<int32_t> ids(w.size());
  for (float& l : logits) l = nd(rng);
  const TensorView lv(logits.data(), DType::f32, {t, e});
  const TensorView wv(w.data(), DType::f32, {t, k}), iv(ids.data(), DType::i32, {t, k});
  for (auto _ : state) {
    if (sig)
      tilejit::topk_sigmoid(lv, wv, iv);
    else
      tilejit::topk_softmax(lv, wv, iv);
    benchmark::DoNotOptimize(w.data());
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(double(t), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  using benchmark::RegisterBenchmark;
  for (int64_t e : {64, 128, 256})
    for (int sig : {0, 1})
      for (int threads : {1, 2})
        RegisterBenchmark("BM_Routing", BM_Routing)
            ->Args({256, e, 8, sig, threads})
            ->ArgNames({"T", "E", "k", "sigmoid", "threads"})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  for (int threads : {1, 2})
    RegisterBenchmark("BM_DramReadBandwidth", BM_DramReadBandwidth)
        ->Args({threads, 1})
        ->ArgNames({"threads", "hugepages"})
        ->Iterations(1)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  for (const LayerShape& s : {kQwen3, kMixtral})
    for (int64_t t : {1, 16, 256, 512, 2048}) {
      const bool huge = s.e == kMixtral.e && t > 256;  // see the top
      for (int threads : {1, 2}) {
        if (huge && threads == 1) continue;
        const std::string name = std::string("BM_FusedExperts/") + s.name;
        auto* b = RegisterBenchmark(name.c_str(), BM_FusedExperts, s)
                      ->Args({t, threads})
                      ->ArgNames({"T", "threads"})
                      ->UseRealTime()
                      ->Unit(benchmark::kMillisecond);
        if (huge) b->Iterations(1);
      }
    }
  const std::pair<LayerShape, QFormat> quant[] = {
      {kQwen3, QFormat::int8},     {kQwen3, QFormat::fp8_channel}, {kQwen3, QFormat::int4_gptq},
      {kQwen3, QFormat::int4_awq}, {kQwen3, QFormat::mxfp4},       {kDeepseek, QFormat::fp8_block},
  };
  for (const auto& [s, f] : quant)
    for (int64_t t : {1, 16, 512})
      for (int threads : {1, 2}) {
        const std::string name = std::string("BM_QuantExperts/") + s.name + "/" + qformat_name(f);
        RegisterBenchmark(name.c_str(), BM_QuantExperts, s, f)
            ->Args({t, threads})
            ->ArgNames({"T", "threads"})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
}

}  // namespace

int main(int argc, char** argv) {
  return benchmark_main(argc, argv, register_all, [] {
    benchmark::AddCustomContext("peak_per_core_gflops", std::to_string(per_core_peak_gflops()));
  });
}
