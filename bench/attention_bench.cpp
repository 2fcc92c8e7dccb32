// attention_bench: tilejit attention against this machine's measured limits
// and against a baseline composed in this binary from oneDNN bf16 matmuls.
//
//   build-attnb/bench/attention_bench --benchmark_repetitions=3
//       --benchmark_display_aggregates_only=true --benchmark_filter=Prefill
// (docs/attention.md has the exact commands and the measured tables.)
//
// Sections (benchmark names):
//   BM_PrefillOnednn/D/T/threads/block   the baseline (see Baseline below): per q
//                                        head and block of query rows, S = Q·Kᵀ
//                                        (oneDNN brgemm matmul, f32, scale folded
//                                        in), causal softmax (AVX-512 intrinsics),
//                                        O = P·V (oneDNN, bf16 out). block = T is
//                                        the full square (T ≤ 2048 only); block =
//                                        256 skips the key columns past each block's
//                                        last row (~(1 + 256/T)/2 of the square).
//   BM_PrefillTilejit/D/T/threads        tilejit::flash_attn_varlen, causal
//   BM_DramReadBandwidth/threads/hugepages  streaming read over a 2 GiB buffer
//   BM_DecodeTilejit/B/ctx/block/threads tilejit::decode_attention, cold KV cache
//                                        (block 1, 8, 16, 64: rows scattered per key
//                                        at block 1, per 8 keys at block 8)
//   BM_DecodeTilejitFp8/B/ctx/block/threads the same over an fp8 e4m3 cache
//   BM_DecodeTilejitE5m2/B/ctx/block/threads the same over an fp8 e5m2 cache
//                                        (KvCacheScales, per-tensor scales)
//   BM_DecodeSkewed, BM_ExtendOneToken, BM_StoreKv  see their comments
//
// Prefill: one sequence of T tokens, Hq = 32, Hkv = 8, D = Dv ∈ {64, 128},
// causal. FLOPs count only the visible (query, key) pairs: query i sees keys
// 0..i, so a head has T(T+1)/2 pairs, each costing 2·D (q·k) + 2·Dv (p·v):
//     flops = Hq · T(T+1)/2 · (2D + 2Dv)
// The baseline is charged the same (useful) FLOPs, so GFLOP/s ratios are time
// ratios. Counters: GFLOPs (wall), GFLOPs_cpu (the same work over the process
// CPU time / threads: on this shared machine it leaves out the time other
// processes held the cores; spin-waiting still counts), pct_peak[_cpu] (of
// threads × the per-core peak: the register-only JIT probe behind jit/peak.h,
// timed on the thread's CPU clock), vs_baseline[_cpu] (tilejit ÷ the fastest
// baseline variant measured for the same D, T, threads earlier in this process,
// median over its repetitions), vs_full_square[_cpu] (÷ the block = T variant).
// Every tilejit shape is checked once against the baseline's output
// (relative L2 error ≤ 1e-2, counter rel_err) so a wrong kernel cannot post a
// number. T = 8192 runs one iteration per repetition (seconds per call).
//
// Decode: Hq = 32, Hkv = 8, D = 128, every sequence `ctx` keys. Counters: GBs
// (K + V bytes of the cache read per second: B·ctx·Hkv·D·2 bytes each, 1
// byte per element for the fp8 cache), keys_per_s (B·ctx keys per second:
// compares the two caches' rates),
// pct_dram (of the streaming read bandwidth dram_GBs, measured with the same
// thread count right before the run). The KV pool holds copies of the cache
// totalling ≥ 1 GiB (32× the 32 MiB L3), blocks in a random order; each
// iteration reads the next copy, so the cache is cold. Combinations over
// ~6 GiB are not registered.
//
// All timings are wall clock (UseRealTime): both libraries run their own threads.
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "bench_util.h"
#include "codegen/xbyak/emitters.h"
#include "dram_refs.h"
#include "onednn_context.h"
#include "runtime/bf16.h"
#include "runtime/exec_memory.h"
#include "tilejit/tilejit.h"

namespace {

using tilejit::DType;
using tilejit::TensorView;
using namespace tilejit::bench;

constexpr int64_t kHq = 32, kHkv = 8;

// ---------------------------------------------------------------- prefill data

struct PrefillData {
  int64_t d, t;
  std::vector<uint16_t> q, k, v, out, out_ref;
  int32_t cu[2];
  PrefillData(int64_t d_, int64_t t_) : d(d_), t(t_) {
    q.resize(size_t(t * kHq * d));
    k.resize(size_t(t * kHkv * d));
    v.resize(size_t(t * kHkv * d));
    out.assign(size_t(t * kHq * d), 0);
    out_ref.assign(size_t(t * kHq * d), 0);
    fill_random_bf16(q.data(), q.size(), 11 + uint64_t(d));
    fill_random_bf16(k.data(), k.size(), 23 + uint64_t(d));
    fill_random_bf16(v.data(), v.size(), 37 + uint64_t(d));
    cu[0] = 0;
    cu[1] = static_cast<int32_t>(t);
  }
  double flops() const { return double(kHq) * double(t) * double(t + 1) / 2 * (4.0 * double(d)); }
};

// The one live problem (T = 8192 needs 100 MB; keep one).
PrefillData& prefill_data(int64_t d, int64_t t) {
  static std::unique_ptr<PrefillData> cur;
  if (!cur || cur->d != d || cur->t != t) {
    cur.reset();
    cur = std::make_unique<PrefillData>(d, t);
  }
  return *cur;
}

void run_tilejit_prefill(PrefillData& pd) {
  const int64_t t = pd.t, d = pd.d;
  tilejit::AttentionOptions opt;
  opt.causal = true;
  tilejit::flash_attn_varlen(TensorView(pd.q.data(), DType::bf16, {t, kHq, d}),
                             TensorView(pd.k.data(), DType::bf16, {t, kHkv, d}),
                             TensorView(pd.v.data(), DType::bf16, {t, kHkv, d}),
                             TensorView(pd.out.data(), DType::bf16, {t, kHq, d}),
                             TensorView(pd.cu, DType::i32, {2}), TensorView(pd.cu, DType::i32, {2}),
                             opt);
}

// ---------------------------------------------------------------- baseline softmax

// Causal softmax of score rows, written plainly with AVX-512 (a baseline, not a
// tilejit path; only called when the CPU has AVX-512 BF16). Row r of the
// block is query position pos0 + r: it sees keys [0, pos0 + r], the rest of
// its nk columns get P = 0. s (f32, scale already applied by the matmul) is
// overwritten with exp(s − max); p receives the normalised weights in bf16.
#define BASELINE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

BASELINE_AVX512 inline __m512 exp512(__m512 x) {
  // e^x = 2^n · e^f, n = round(x·log2 e), |f| ≤ ln2/2, degree-6 polynomial.
  // (The all-ones masked forms are the same instructions; GCC 12 warns that
  // the unmasked ones read their own _mm512_undefined_ps.)
  constexpr __mmask16 all = 0xffff;
  x = _mm512_mask_max_ps(x, all, x, _mm512_set1_ps(-87.3f));
  const __m512 xl = _mm512_mul_ps(x, _mm512_set1_ps(1.44269504f));
  const __m512 n =
      _mm512_mask_roundscale_ps(xl, all, xl, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
  __m512 p = _mm512_set1_ps(1.38888889e-3f);
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.33333333e-3f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.16666667e-2f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.66666667e-1f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  return _mm512_mask_scalef_ps(p, all, p, n);
}

// Horizontal max / sum through memory: GCC 12's _mm512_reduce_* trip
// -Wuninitialized on its own _mm256_undefined_si256.
BASELINE_AVX512 inline float hmax(__m512 v) {
  alignas(64) float x[16];
  _mm512_store_ps(x, v);
  return *std::max_element(x, x + 16);
}
BASELINE_AVX512 inline float hsum(__m512 v) {
  alignas(64) float x[16];
  _mm512_store_ps(x, v);
  return std::accumulate(x, x + 16, 0.0f);
}

BASELINE_AVX512 void causal_softmax_rows(float* s, int64_t lds, uint16_t* p, int64_t ldp,
                                         int64_t rows, int64_t pos0, int64_t nk) {
  for (int64_t r = 0; r < rows; ++r) {
    float* sr = s + r * lds;
    uint16_t* pr = p + r * ldp;
    const int64_t n = std::min(nk, pos0 + r + 1);
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
      vmax = _mm512_mask_max_ps(vmax, m, vmax, _mm512_maskz_loadu_ps(m, sr + j));
    }
    const __m512 mx = _mm512_set1_ps(hmax(vmax));
    __m512 vsum = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
      const __m512 e = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sr + j), mx));
      _mm512_mask_storeu_ps(sr + j, m, e);
      vsum = _mm512_add_ps(vsum, _mm512_maskz_mov_ps(m, e));
    }
    const __m512 inv = _mm512_set1_ps(1.0f / hsum(vsum));
    for (int64_t j = 0; j < n; j += 16) {
      const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
      const __m256bh b = _mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, sr + j), inv));
      _mm256_mask_storeu_epi16(pr + j, m, reinterpret_cast<__m256i>(b));
    }
    if (nk > n) std::memset(pr + n, 0, size_t(nk - n) * 2);
  }
}

// ---------------------------------------------------------------- baseline matmuls

using dt = dnnl::memory::data_type;

dnnl::engine& engine() {
  static dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  return eng;
}

// One oneDNN matmul primitive with strided plain operands (the views of the
// [T, H, D] tensors), user scratchpad (one per thread, see Baseline).
struct Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul prim;
  dnnl::memory::desc src, wei, dst;
  Matmul(const dnnl::memory::desc& s, const dnnl::memory::desc& w, const dnnl::memory::desc& d,
         float scale)
      : src(s), wei(w), dst(d) {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (scale != 1.0f) attr.set_output_scales(0, {scale});
    pd = dnnl::matmul::primitive_desc(dnnl::matmul::desc(s, w, d), attr, engine());
    prim = dnnl::matmul(pd);
  }
  void run(dnnl::stream& strm, const void* a, const void* b, void* c, void* scratch) const {
    dnnl::memory ms(src, engine(), const_cast<void*>(a));
    dnnl::memory mw(wei, engine(), const_cast<void*>(b));
    dnnl::memory md(dst, engine(), c);
    dnnl::memory sp(pd.scratchpad_desc(), engine(), scratch);
    prim.execute(strm, {{DNNL_ARG_SRC, ms},
                        {DNNL_ARG_WEIGHTS, mw},
                        {DNNL_ARG_DST, md},
                        {DNNL_ARG_SCRATCHPAD, sp}});
  }
};

// The composed baseline for one (D, T, block), as an engine would write it
// with a GEMM library (PyTorch's math SDPA path does the same steps):
//   0. q, k, v [T, H, D] → per-head contiguous [H, T, D] copies
//   for each q head h (kv head h / 4) and block of ≤ `block` query rows [r0, r1):
//     1. S[r1−r0 × nk] = scale · Q_h[r0:r1] · K_{h/4}[0:nk]ᵀ   oneDNN, f32 out
//     2. P = causal softmax of S rows, bf16                       AVX-512 above
//     3. O_h[r0:r1] = P · V_{h/4}[0:nk]                           oneDNN, bf16 out
//   4. O [H, T, D] → out [T, H, D]
// with nk = r1 (keys past the block's last row are never visible) or, with
// block = T, nk = T (the full square, masked in the softmax). The copies (0, 4)
// are timed; they cost ~1% and let oneDNN pick its brgemm matmul
// (brg:avx512_core_bf16), ~10% faster here than the gemm:jit it takes for the
// strided head views. Heads run in parallel on OpenMP threads, one matmul per
// thread at a time with primitives built for one thread: every matmul stays at
// full size rather than splitting small ones two ways.
struct Baseline {
  int64_t d, t, block;
  std::vector<std::unique_ptr<Matmul>> qk, pv;  // per row block
  std::vector<uint16_t> qh, kh, vh, oh;         // [H, T, D]
  struct PerThread {
    dnnl::stream strm{engine()};
    std::vector<float> s;
    std::vector<uint16_t> p;
    std::vector<uint8_t> scratch;
  };
  std::vector<std::unique_ptr<PerThread>> per_thread;
  std::string impl;

  Baseline(int64_t d_, int64_t t_, int64_t block_, int threads) : d(d_), t(t_), block(block_) {
    using tag = dnnl::memory::format_tag;
    omp_set_num_threads(1);  // the primitives are run one per thread
    const float scale = static_cast<float>(1.0 / std::sqrt(double(d)));
    size_t scratch = 0;
    for (int64_t r0 = 0; r0 < t; r0 += block) {
      const int64_t mb = std::min(block, t - r0), nk = block >= t ? t : r0 + mb;
      const dnnl::memory::desc q_md({mb, d}, dt::bf16, tag::ab);
      const dnnl::memory::desc kt_md({d, nk}, dt::bf16, tag::ba);  // K rows [nk, D] = Kᵀ in ba
      const dnnl::memory::desc s_md({mb, nk}, dt::f32, tag::ab);
      const dnnl::memory::desc p_md({mb, nk}, dt::bf16, tag::ab);
      const dnnl::memory::desc v_md({nk, d}, dt::bf16, tag::ab);
      const dnnl::memory::desc o_md({mb, d}, dt::bf16, tag::ab);
      qk.push_back(std::make_unique<Matmul>(q_md, kt_md, s_md, scale));
      pv.push_back(std::make_unique<Matmul>(p_md, v_md, o_md, 1.0f));
      scratch = std::max({scratch, qk.back()->pd.scratchpad_desc().get_size(),
                          pv.back()->pd.scratchpad_desc().get_size()});
    }
    impl = std::string(qk.front()->pd.impl_info_str()) + " / " + pv.front()->pd.impl_info_str();
    qh.resize(size_t(kHq * t * d));
    oh.resize(size_t(kHq * t * d));
    kh.resize(size_t(kHkv * t * d));
    vh.resize(size_t(kHkv * t * d));
    // The last row block sees all T keys in either variant.
    for (int i = 0; i < threads; ++i) {
      auto pt = std::make_unique<PerThread>();
      pt->s.resize(size_t(std::min(block, t) * t));
      pt->p.resize(size_t(std::min(block, t) * t));
      pt->scratch.resize(std::max<size_t>(scratch, 64));
      per_thread.push_back(std::move(pt));
    }
  }

  // [T, H, D] ↔ [H, T, D] for head h.
  void gather(const uint16_t* src, int64_t heads, int64_t h, uint16_t* dst) const {
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(dst + (h * t + i) * d, src + (i * heads + h) * d, size_t(d) * 2);
  }
  void scatter(const uint16_t* src, int64_t heads, int64_t h, uint16_t* dst) const {
    for (int64_t i = 0; i < t; ++i)
      std::memcpy(dst + (i * heads + h) * d, src + (h * t + i) * d, size_t(d) * 2);
  }

  void run(const PrefillData& pd, uint16_t* out, int threads) {
    const int64_t g = kHq / kHkv;
#pragma omp parallel num_threads(threads)
    {
#pragma omp for schedule(static)
      for (int64_t h = 0; h < kHq + 2 * kHkv; ++h) {
        if (h < kHq)
          gather(pd.q.data(), kHq, h, qh.data());
        else if (h < kHq + kHkv)
          gather(pd.k.data(), kHkv, h - kHq, kh.data());
        else
          gather(pd.v.data(), kHkv, h - kHq - kHkv, vh.data());
      }
#pragma omp for schedule(dynamic, 1)
      for (int64_t h = 0; h < kHq; ++h) {
        PerThread& pt = *per_thread[size_t(omp_get_thread_num())];
        const uint16_t* kp = kh.data() + (h / g) * t * d;
        const uint16_t* vp = vh.data() + (h / g) * t * d;
        for (size_t b = 0; b < qk.size(); ++b) {
          const int64_t r0 = int64_t(b) * block, mb = std::min(block, t - r0);
          const int64_t nk = block >= t ? t : r0 + mb;
          qk[b]->run(pt.strm, qh.data() + (h * t + r0) * d, kp, pt.s.data(), pt.scratch.data());
          causal_softmax_rows(pt.s.data(), nk, pt.p.data(), nk, mb, r0, nk);
          pv[b]->run(pt.strm, pt.p.data(), vp, oh.data() + (h * t + r0) * d, pt.scratch.data());
        }
        pt.strm.wait();
      }
#pragma omp for schedule(static)
      for (int64_t h = 0; h < kHq; ++h) scatter(oh.data(), kHq, h, out);
    }
  }
};

// The one live baseline (its per-thread scores of a full square are large).
Baseline& baseline(int64_t d, int64_t t, int64_t block, int threads) {
  static std::unique_ptr<Baseline> cur;
  if (!cur || cur->d != d || cur->t != t || cur->block != block ||
      cur->per_thread.size() != size_t(threads)) {
    cur.reset();
    cur = std::make_unique<Baseline>(d, t, block, threads);
  }
  return *cur;
}

// Baseline GFLOP/s (wall and CPU) per (D, T, threads, block) in this process.
using PrefillKey = std::tuple<int64_t, int64_t, int>;
struct Rates {
  std::vector<double> wall, cpu;
};
std::map<PrefillKey, std::map<int64_t, Rates>>& baseline_rates() {
  static std::map<PrefillKey, std::map<int64_t, Rates>> m;
  return m;
}

bool baseline_usable() {
  const tilejit::CpuInfo ci = tilejit::cpu_info();
  return ci.avx512f && ci.avx512_bf16;
}

void BM_PrefillOnednn(benchmark::State& state, int64_t d, int64_t t, int threads, int64_t block) {
  if (!baseline_usable()) return skip(state, "the baseline softmax needs AVX-512 BF16");
  PrefillData& pd = prefill_data(d, t);
  Baseline& bl = baseline(d, t, block, threads);
  bl.run(pd, pd.out_ref.data(), threads);  // warm-up: page faults, oneDNN JIT
  const Meter m(threads);
  for (auto _ : state) bl.run(pd, pd.out_ref.data(), threads);
  const double n = double(state.iterations());
  const double gflops = pd.flops() * n / m.wall() * 1e-9,
               cpu_gflops = pd.flops() * n / m.cpu() * 1e-9;
  Rates& r = baseline_rates()[{d, t, threads}][block];
  r.wall.push_back(gflops);
  r.cpu.push_back(cpu_gflops);
  state.counters["GFLOPs"] = gflops;
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak"] = pct_of_peak(gflops, threads);
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, threads);
  state.SetLabel(bl.impl);
}

// Relative L2 distance of tilejit's output from the baseline's (both bf16).
double relative_error(const PrefillData& pd) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < pd.out.size(); ++i) {
    const double r = tilejit::runtime::bf16_to_f32(pd.out_ref[i]);
    const double x = tilejit::runtime::bf16_to_f32(pd.out[i]) - r;
    err += x * x;
    norm += r * r;
  }
  return std::sqrt(err / std::max(norm, 1e-30));
}

void BM_PrefillTilejit(benchmark::State& state, int64_t d, int64_t t, int threads) {
  PrefillData& pd = prefill_data(d, t);
  tilejit::set_num_threads(threads);
  run_tilejit_prefill(pd);  // warm-up: compiles this shape's kernels
  // The baseline ran just before on the same data (out_ref); check against it.
  const auto& rates = baseline_rates()[{d, t, threads}];
  if (!rates.empty()) {
    const double rel = relative_error(pd);
    if (!(rel <= 1e-2)) {
      char buf[128];
      std::snprintf(buf, sizeof buf, "tilejit differs from the baseline: relative L2 error %.3g",
                    rel);
      return skip(state, buf);
    }
    state.counters["rel_err"] = rel;
  }
  const Meter m(threads);
  for (auto _ : state) run_tilejit_prefill(pd);
  const double n = double(state.iterations());
  const double gflops = pd.flops() * n / m.wall() * 1e-9,
               cpu_gflops = pd.flops() * n / m.cpu() * 1e-9;
  state.counters["GFLOPs"] = gflops;
  state.counters["GFLOPs_cpu"] = cpu_gflops;
  state.counters["pct_peak"] = pct_of_peak(gflops, threads);
  state.counters["pct_peak_cpu"] = pct_of_peak(cpu_gflops, threads);
  state.counters["peak_per_core"] = per_core_peak_gflops();
  double best = 0, best_cpu = 0, full = 0, full_cpu = 0;
  for (const auto& [block, r] : rates) {
    best = std::max(best, median(r.wall));
    best_cpu = std::max(best_cpu, median(r.cpu));
    if (block >= t) full = median(r.wall), full_cpu = median(r.cpu);
  }
  if (best > 0) state.counters["vs_baseline"] = gflops / best;
  if (best_cpu > 0) state.counters["vs_baseline_cpu"] = cpu_gflops / best_cpu;
  if (full > 0) state.counters["vs_full_square"] = gflops / full;
  if (full_cpu > 0) state.counters["vs_full_square_cpu"] = cpu_gflops / full_cpu;
}

// ---------------------------------------------------------------- decode

constexpr int64_t kDecodeD = 128;

int64_t cache_bytes(int64_t b, int64_t ctx, bool fp8 = false) {
  return b * ctx * kHkv * kDecodeD * 2 * (fp8 ? 1 : 2);  // K and V, bf16 or e4m3
}

// A KV pool of `copies` caches of B sequences × ctx keys, blocks shuffled.
struct DecodeData {
  int64_t b, ctx, bs, copies, blocks_per_seq, num_blocks;
  DType kv;  // bf16, f8e4m3 or f8e5m2
  bool fp8;
  // Mappings with huge pages requested, as an engine's large KV cache would
  // get; filled here, so every page is touched before a measurement. (The
  // prefill tensors are plain std::vectors: 4 KiB pages under this machine's
  // THP "madvise" setting.)
  std::unique_ptr<Mapping> k, v;
  std::vector<int32_t> tables;  // [copies][B][blocks_per_seq]
  std::vector<int32_t> seq_lens;
  std::vector<uint16_t> q, out;
  DecodeData(int64_t b_, int64_t ctx_, int64_t bs_, DType kv_)
      : b(b_), ctx(ctx_), bs(bs_), kv(kv_), fp8(kv_ != DType::bf16) {
    const int64_t bytes = cache_bytes(b, ctx, fp8);
    copies = std::max<int64_t>(1, (int64_t(kGiB) + bytes - 1) / bytes);
    blocks_per_seq = (ctx + bs - 1) / bs;
    num_blocks = copies * b * blocks_per_seq;
    const size_t elems = size_t(num_blocks * bs * kHkv * kDecodeD);
    k = std::make_unique<Mapping>(elems * (fp8 ? 1 : 2));
    v = std::make_unique<Mapping>(elems * (fp8 ? 1 : 2));
    if (fp8) {  // random codes of magnitude 2^-3 .. 2^3 (never Inf / NaN)
      const bool e5m2 = kv == DType::f8e5m2;
      auto fill = [&](uint8_t* p, uint64_t seed) {
        std::mt19937_64 rng(seed);
        for (size_t i = 0; i < elems; ++i)
          p[i] = static_cast<uint8_t>(((rng() & 1) << 7) |
                                      (e5m2 ? ((12 + rng() % 7) << 2) | (rng() & 3)
                                            : ((4 + rng() % 7) << 3) | (rng() & 7)));
      };
      fill(static_cast<uint8_t*>(static_cast<void*>(k->u16())), 5);
      fill(static_cast<uint8_t*>(static_cast<void*>(v->u16())), 6);
    } else {
      fill_repeating_bf16(k->u16(), elems, 5);
      fill_repeating_bf16(v->u16(), elems, 6);
    }
    tables.resize(size_t(num_blocks));
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), std::mt19937_64(42));
    seq_lens.assign(size_t(b), static_cast<int32_t>(ctx));
    q.resize(size_t(b * kHq * kDecodeD));
    fill_random_bf16(q.data(), q.size(), 3);
    out.assign(q.size(), 0);
  }
  void run(int64_t copy) {
    const DType t = kv;
    const TensorView cache_k(k->u16(), t, {num_blocks, bs, kHkv, kDecodeD});
    const TensorView cache_v(v->u16(), t, {num_blocks, bs, kHkv, kDecodeD});
    tilejit::AttentionOptions opt;
    if (fp8) opt.kv_scales.k_scale = 0.125f, opt.kv_scales.v_scale = 0.25f;
    tilejit::decode_attention(
        TensorView(q.data(), DType::bf16, {b, kHq, kDecodeD}), cache_k, cache_v,
        TensorView(out.data(), DType::bf16, {b, kHq, kDecodeD}),
        TensorView(tables.data() + copy * b * blocks_per_seq, DType::i32, {b, blocks_per_seq}),
        TensorView(seq_lens.data(), DType::i32, {b}), opt);
  }
};

DecodeData& decode_data(int64_t b, int64_t ctx, int64_t bs, DType kv) {
  static std::unique_ptr<DecodeData> cur;
  if (!cur || cur->b != b || cur->ctx != ctx || cur->bs != bs || cur->kv != kv) {
    cur.reset();
    cur = std::make_unique<DecodeData>(b, ctx, bs, kv);
  }
  return *cur;
}

void run_decode_bench(benchmark::State& state, DType kv) {
  const bool fp8 = kv != DType::bf16;
  const int64_t b = state.range(0), ctx = state.range(1), bs = state.range(2);
  const int threads = static_cast<int>(state.range(3));
  DecodeData& dd = decode_data(b, ctx, bs, kv);
  const double ref = measure_dram(threads).wall_gbs;
  tilejit::set_num_threads(threads);
  dd.run(0);  // warm-up: compiles the kernel
  int64_t copy = 0;
  const Meter m(threads);
  for (auto _ : state) {
    copy = (copy + 1) % dd.copies;
    dd.run(copy);
  }
  const double gbs =
      double(cache_bytes(b, ctx, fp8)) * double(state.iterations()) / m.wall() * 1e-9;
  state.counters["GBs"] = gbs;
  state.counters["keys_per_s"] = double(b * ctx) * double(state.iterations()) / m.wall();
  state.counters["dram_GBs"] = ref;
  if (ref > 0) state.counters["pct_dram"] = 100.0 * gbs / ref;
  state.counters["copies"] = double(dd.copies);
}

void BM_DecodeTilejit(benchmark::State& state) {
  run_decode_bench(state, DType::bf16);
}
void BM_DecodeTilejitFp8(benchmark::State& state) {
  run_decode_bench(state, DType::f8e4m3);
}
void BM_DecodeTilejitE5m2(benchmark::State& state) {
  run_decode_bench(state, DType::f8e5m2);
}

// One long context among 63 short ones (skew 1) against a uniform batch of
// the same keys (skew 0): decode's split rule for a dominant sequence
// (docs/attention.md, "Decode tasks"). Block 16, blocks in order.
// deterministic 1: DecodeOptions::deterministic (no split: what it costs).
void BM_DecodeSkewed(benchmark::State& state) {
  const int64_t longest = state.range(0), skew = state.range(1), b = 64, bs = 16;
  const int threads = static_cast<int>(state.range(2));
  tilejit::DecodeOptions dec;
  dec.deterministic = state.range(3) != 0;
  std::vector<int32_t> lens(size_t(b), 16);
  lens[0] = static_cast<int32_t>(longest);
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  if (skew == 0) lens.assign(size_t(b), static_cast<int32_t>(total / b));
  const int64_t max_len = *std::max_element(lens.begin(), lens.end());
  const int64_t per_seq = (max_len + bs - 1) / bs, blocks = b * per_seq;
  std::vector<uint16_t> k(size_t(blocks * bs * kHkv * kDecodeD)), v(k.size());
  fill_repeating_bf16(k.data(), k.size(), 5);
  fill_repeating_bf16(v.data(), v.size(), 6);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<uint16_t> q(size_t(b * kHq * kDecodeD)), out(q.size());
  fill_random_bf16(q.data(), q.size(), 3);
  auto run = [&] {
    tilejit::decode_attention(TensorView(q.data(), DType::bf16, {b, kHq, kDecodeD}),
                              TensorView(k.data(), DType::bf16, {blocks, bs, kHkv, kDecodeD}),
                              TensorView(v.data(), DType::bf16, {blocks, bs, kHkv, kDecodeD}),
                              TensorView(out.data(), DType::bf16, {b, kHq, kDecodeD}),
                              TensorView(table.data(), DType::i32, {b, per_seq}),
                              TensorView(lens.data(), DType::i32, {b}), {}, dec);
  };
  tilejit::set_num_threads(threads);
  run();  // warm-up: compiles the kernel
  const Meter m(threads);
  for (auto _ : state) run();
  state.counters["keys_per_s"] = double(total) * double(state.iterations()) / m.wall();
}

// One new token per sequence through extend_attention (an engine's decode
// tokens inside a mixed extend batch) against decode_attention over the same
// cache: B = 64 sequences of `prefix` cached keys, block 16 or 1 (blocks in
// a random order). mode 0: decode_attention over prefix + 1 keys; 1: extend,
// the new K/V in the cache; 2: extend with k_new / v_new. keys_per_s counts
// prefix + 1 keys per sequence.
void BM_ExtendOneToken(benchmark::State& state) {
  const int64_t prefix = state.range(0), bs = state.range(1), mode = state.range(2), b = 64;
  const int threads = static_cast<int>(state.range(3));
  const int64_t len = prefix + 1, per_seq = (len + bs - 1) / bs, blocks = b * per_seq;
  std::vector<uint16_t> k(size_t(blocks * bs * kHkv * kDecodeD)), v(k.size());
  fill_repeating_bf16(k.data(), k.size(), 5);
  fill_repeating_bf16(v.data(), v.size(), 6);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937_64(42));
  std::vector<uint16_t> q(size_t(b * kHq * kDecodeD)), out(q.size()),
      kv_new(size_t(b * kHkv * kDecodeD));
  fill_random_bf16(q.data(), q.size(), 3);
  fill_random_bf16(kv_new.data(), kv_new.size(), 4);
  std::vector<int32_t> lens(size_t(b), static_cast<int32_t>(len)),
      pre(size_t(b), static_cast<int32_t>(prefix)), qo(size_t(b + 1));
  std::iota(qo.begin(), qo.end(), 0);
  const TensorView kc(k.data(), DType::bf16, {blocks, bs, kHkv, kDecodeD}),
      vc(v.data(), DType::bf16, {blocks, bs, kHkv, kDecodeD}),
      qv(q.data(), DType::bf16, {b, kHq, kDecodeD}),
      ov(out.data(), DType::bf16, {b, kHq, kDecodeD}), tv(table.data(), DType::i32, {b, per_seq});
  tilejit::ExtendOptions ext;
  if (mode == 2)
    ext.k_new = ext.v_new = TensorView(kv_new.data(), DType::bf16, {b, kHkv, kDecodeD});
  auto run = [&] {
    if (mode == 0)
      tilejit::decode_attention(qv, kc, vc, ov, tv, TensorView(lens.data(), DType::i32, {b}));
    else
      tilejit::extend_attention(qv, kc, vc, ov, TensorView(qo.data(), DType::i32, {b + 1}), tv,
                                TensorView(pre.data(), DType::i32, {b}), {}, ext);
  };
  tilejit::set_num_threads(threads);
  run();  // warm-up: compiles the kernels
  const Meter m(threads);
  for (auto _ : state) run();
  state.counters["keys_per_s"] = double(b * len) * double(state.iterations()) / m.wall();
}

// store_kv of T tokens (Hkv 8, D 128) into a bf16 or an fp8 e4m3 cache,
// slots shuffled: the copy against the conversion (docs/attention.md,
// "Store rule"). fp8 1: power-of-two scales (the kernel multiplies by 1/s);
// fp8 2: other scales (it divides). GB/s of bf16 K and V read.
void BM_StoreKv(benchmark::State& state) {
  const int64_t t = state.range(0), bs = 16, blocks = (t + bs - 1) / bs;
  const bool fp8 = state.range(1) != 0;
  const int threads = static_cast<int>(state.range(2));
  std::vector<uint16_t> k(size_t(t * kHkv * kDecodeD)), v(k.size());
  fill_random_bf16(k.data(), k.size(), 7);
  fill_random_bf16(v.data(), v.size(), 8);
  const size_t cache_elems = size_t(blocks * bs * kHkv * kDecodeD);
  std::vector<uint16_t> kc(cache_elems), vc(cache_elems);  // fp8 uses the first half
  std::vector<int64_t> slots(static_cast<size_t>(t));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), std::mt19937_64(9));
  const DType ct = fp8 ? DType::f8e4m3 : DType::bf16;
  tilejit::KvCacheScales sc;
  if (state.range(1) == 1) sc.k_scale = 0.125f, sc.v_scale = 0.25f;
  if (state.range(1) == 2) sc.k_scale = 0.3f, sc.v_scale = 0.7f;
  auto run = [&] {
    tilejit::store_kv(TensorView(k.data(), DType::bf16, {t, kHkv, kDecodeD}),
                      TensorView(v.data(), DType::bf16, {t, kHkv, kDecodeD}),
                      TensorView(kc.data(), ct, {blocks, bs, kHkv, kDecodeD}),
                      TensorView(vc.data(), ct, {blocks, bs, kHkv, kDecodeD}),
                      TensorView(slots.data(), DType::i64, {t}), sc);
  };
  tilejit::set_num_threads(threads);
  run();
  const Meter m(threads);
  for (auto _ : state) run();
  state.counters["GBs"] = double(2 * k.size() * 2) * double(state.iterations()) / m.wall() * 1e-9;
}

void register_all() {
  using benchmark::RegisterBenchmark;
  char name[160];
  // Prefill, per shape: the baseline variants first, then tilejit (its
  // vs_baseline reads their medians). T = 8192 costs seconds per call: one
  // iteration per repetition, and no full-square baseline (it would be 2× the
  // work and 0.75 GiB of scores per thread).
  for (int64_t t : {512, 2048, 8192})
    for (int64_t d : {64, 80, 128})
      for (int threads : {1, 2}) {
        if (d == 80 && t != 2048) continue;  // a head size off the 32 grid, one length
        std::vector<int64_t> blocks = {256};
        if (t <= 2048) blocks.push_back(t);
        for (int64_t block : blocks) {
          std::snprintf(name, sizeof name, "BM_PrefillOnednn/D:%ld/T:%ld/threads:%d/block:%ld",
                        long(d), long(t), threads, long(block));
          auto* bm = RegisterBenchmark(name, BM_PrefillOnednn, d, t, threads, block)
                         ->UseRealTime()
                         ->Unit(benchmark::kMillisecond);
          if (t >= 8192) bm->Iterations(1);
        }
        std::snprintf(name, sizeof name, "BM_PrefillTilejit/D:%ld/T:%ld/threads:%d", long(d),
                      long(t), threads);
        auto* bm = RegisterBenchmark(name, BM_PrefillTilejit, d, t, threads)
                       ->UseRealTime()
                       ->Unit(benchmark::kMillisecond);
        if (t >= 8192) bm->Iterations(1);
      }

  for (int threads : {1, 2})
    RegisterBenchmark("BM_DramReadBandwidth", BM_DramReadBandwidth)
        ->Args({threads, 1})
        ->ArgNames({"threads", "hugepages"})
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);

  // Decode: B × context, block 16 (plus blocks 1, 8 and 64 at B = 16, 8k:
  // token-granular caches scatter every row), caches over ~6 GiB left out
  // (B = 64 at 32k would be 8 GiB; the machine has 24 GiB, shared).
  for (int64_t b : {1, 16, 64})
    for (int64_t ctx : {1024, 8192, 32768}) {
      if (cache_bytes(b, ctx) > 6 * int64_t(kGiB)) continue;
      for (int64_t bs : {1, 8, 16, 64}) {
        if (bs != 16 && !(b == 16 && ctx == 8192)) continue;
        for (int threads : {1, 2})
          RegisterBenchmark("BM_DecodeTilejit", BM_DecodeTilejit)
              ->Args({b, ctx, bs, threads})
              ->ArgNames({"B", "ctx", "block", "threads"})
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
      }
    }
  for (int threads : {1, 2})
    for (int64_t skew : {0, 1})
      for (int64_t det : {0, 1})
        RegisterBenchmark("BM_DecodeSkewed", BM_DecodeSkewed)
            ->Args({31000, skew, threads, det})
            ->ArgNames({"longest", "skew", "threads", "deterministic"})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  for (int64_t bs : {16, 1})
    for (int64_t mode : {0, 1, 2})
      for (int threads : {1, 2})
        RegisterBenchmark("BM_ExtendOneToken", BM_ExtendOneToken)
            ->Args({1024, bs, mode, threads})
            ->ArgNames({"prefix", "block", "mode", "threads"})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  for (int64_t t : {64, 4096})
    for (int64_t fp8 : {0, 1, 2})
      for (int threads : {1, 2})
        RegisterBenchmark("BM_StoreKv", BM_StoreKv)
            ->Args({t, fp8, threads})
            ->ArgNames({"T", "fp8", "threads"})
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
  // The fp8 e4m3 cache at B = 16, 8k (against the bf16 rows of the same shape above).
  for (int64_t bs : {16, 64})
    for (int threads : {1, 2})
      for (const auto& [bench_name, fn] : {std::pair<const char*, void (*)(benchmark::State&)>{
                                               "BM_DecodeTilejitFp8", BM_DecodeTilejitFp8},
                                           std::pair<const char*, void (*)(benchmark::State&)>{
                                               "BM_DecodeTilejitE5m2", BM_DecodeTilejitE5m2}})
        RegisterBenchmark(bench_name, fn)
            ->Args({16, 8192, bs, threads})
            ->ArgNames({"B", "ctx", "block", "threads"})
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
}

}  // namespace

int main(int argc, char** argv) {
  return benchmark_main(argc, argv, register_all, [] {
    benchmark::AddCustomContext("peak_per_core_gflops", std::to_string(per_core_peak_gflops()));
    add_onednn_context();
  });
}
