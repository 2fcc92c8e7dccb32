// Attention (flash_attn_varlen, decode_attention over bf16 and fp8 e4m3
// caches) and tilejit::gemm called from several host threads at once,
// interleaved, on shapes none of them has compiled yet. What this exercises
// that the single-threaded tests do not:
//  - per-thread state: on AMX the tile configuration is loaded by each kernel
//    on its own thread, and prefill, decode and GEMM kernels want different
//    configurations, so a thread that switches between them must never run on
//    another kernel's palette;
//  - the thread pool: only one host thread owns it at a time, the others run
//    their parallel_for inline, and an owner must not wait on a worker that
//    is busy with another caller's task;
//  - the kernel cache and the operators' kernel tables: concurrent first
//    lookups of one key compile it once and every waiter gets the same kernel.
//
// Every result is checked against the scalar references, computed once on the
// main thread before the threads start (runtime/reference_attention.h,
// runtime/reference_gemm.h; bounds as in attention_test and gemm_test), and
// every call of a problem must produce the same bytes as its first call:
// nothing in these operators depends on which thread runs a task or whether
// the pool was free (decode's split-KV depends on the thread count only, and
// the test keeps it fixed), so a difference can only be a race.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/quant_formats.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_gemm.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

constexpr int kHostThreads = 4;
constexpr int kIterations = 20;

// One operator call with a fixed input and output buffer per calling thread.
// `run` writes the output into the given buffer; `ref` / `tol` hold the
// reference value and the bound of every output element.
struct Problem {
  std::string name;
  DType out_dtype = DType::bf16;
  size_t out_elems = 0;
  std::function<void(void* out)> run;
  std::vector<double> ref, tol;

  std::mutex first_mu;
  std::vector<uint8_t> first;  // the bytes of the first call to finish

  size_t out_bytes() const { return out_elems * static_cast<size_t>(dtype_bits(out_dtype) / 8); }
  double at(const std::vector<uint8_t>& out, size_t i) const {
    if (out_dtype == DType::f32) {
      float f;
      std::memcpy(&f, out.data() + 4 * i, 4);
      return f;
    }
    uint16_t h;
    std::memcpy(&h, out.data() + 2 * i, 2);
    return bf16_to_f32(h);
  }

  // "" when out is within the bound everywhere and equal to the first result.
  std::string check(const std::vector<uint8_t>& out) {
    for (size_t i = 0; i < out_elems; ++i) {
      const double got = at(out, i);
      if (!(std::fabs(got - ref[i]) <= tol[i]))
        return name + ": element " + std::to_string(i) + " = " + std::to_string(got) +
               ", reference " + std::to_string(ref[i]) + " ± " + std::to_string(tol[i]);
    }
    std::lock_guard lock(first_mu);
    if (first.empty()) {
      first = out;
      return "";
    }
    const size_t es = static_cast<size_t>(dtype_bits(out_dtype) / 8);
    for (size_t i = 0; i < out_elems; ++i)
      if (std::memcmp(out.data() + i * es, first.data() + i * es, es) != 0)
        return name + ": element " + std::to_string(i) + " = " + std::to_string(at(out, i)) +
               ", but an earlier call of the same problem gave " + std::to_string(at(first, i)) +
               " (reference " + std::to_string(ref[i]) + ")";
    return "";
  }
};

double attention_tolerance(double max_v, double ref) {
  // attention_test's bound: P rounded to bf16 (2⁻⁹·max|v|) and the bf16
  // output (2⁻⁹·|ref|), with headroom for fp32 exp and summation.
  return std::ldexp(max_v, -7) + std::ldexp(std::fabs(ref), -8);
}

double bf16_at(const std::vector<uint16_t>& v, int64_t i) {
  return bf16_to_f32(v[static_cast<size_t>(i)]);
}

// ---------------------------------------------------------------------------
// Prefill: packed variable-length sequences, q [T, Hq, D], k / v [T, Hkv, D].

struct PrefillShape {
  std::vector<int32_t> lens;
  int64_t hq, hkv, d;
  bool causal;
};

std::unique_ptr<Problem> prefill_problem(const PrefillShape& s, uint32_t seed) {
  auto p = std::make_unique<Problem>();
  std::vector<int32_t> cu = {0};
  for (int32_t l : s.lens) cu.push_back(cu.back() + l);
  const int64_t t = cu.back(), b = static_cast<int64_t>(s.lens.size());
  p->name = "prefill T=" + std::to_string(t) + " Hq=" + std::to_string(s.hq) +
            " Hkv=" + std::to_string(s.hkv) + " D=" + std::to_string(s.d) +
            (s.causal ? " causal" : "");
  p->out_elems = static_cast<size_t>(t * s.hq * s.d);
  auto q = std::make_shared<std::vector<uint16_t>>(random_bf16(t * s.hq * s.d, seed, -2, 2));
  auto k = std::make_shared<std::vector<uint16_t>>(random_bf16(t * s.hkv * s.d, seed + 1, -2, 2));
  auto v = std::make_shared<std::vector<uint16_t>>(random_bf16(t * s.hkv * s.d, seed + 2, -1, 1));
  auto cus = std::make_shared<std::vector<int32_t>>(cu);
  const int64_t hq = s.hq, hkv = s.hkv, d = s.d;
  AttentionOptions opt;
  opt.causal = s.causal;
  p->run = [=](void* out) {
    flash_attn_varlen(TensorView(q->data(), DType::bf16, {t, hq, d}),
                      TensorView(k->data(), DType::bf16, {t, hkv, d}),
                      TensorView(v->data(), DType::bf16, {t, hkv, d}),
                      TensorView(out, DType::bf16, {t, hq, d}),
                      TensorView(cus->data(), DType::i32, {b + 1}),
                      TensorView(cus->data(), DType::i32, {b + 1}), opt);
  };
  double max_v = 0;
  for (uint16_t x : *v) max_v = std::max(max_v, std::fabs(double(bf16_to_f32(x))));
  p->ref.assign(p->out_elems, 0);
  p->tol.assign(p->out_elems, 0);
  const int64_t g = hq / hkv;
  for (int64_t sq = 0; sq < b; ++sq)
    for (int64_t h = 0; h < hq; ++h) {
      runtime::ReferenceAttentionHead rh;
      rh.tq = rh.tk = s.lens[sq];
      rh.d = rh.dv = d;
      rh.sm_scale = 1.0 / std::sqrt(double(d));
      rh.causal = s.causal;
      const int64_t row0 = cu[sq];
      rh.q_at = [&](int64_t i, int64_t c) { return bf16_at(*q, ((row0 + i) * hq + h) * d + c); };
      rh.k_at = [&](int64_t j, int64_t c) {
        return bf16_at(*k, ((row0 + j) * hkv + h / g) * d + c);
      };
      rh.v_at = [&](int64_t j, int64_t c) {
        return bf16_at(*v, ((row0 + j) * hkv + h / g) * d + c);
      };
      rh.out = [&](int64_t i, int64_t c, double x) {
        const auto at = static_cast<size_t>(((row0 + i) * hq + h) * d + c);
        p->ref[at] = x;
        p->tol[at] = attention_tolerance(max_v, x);
      };
      runtime::reference_attention_head(rh);
    }
  return p;
}

// ---------------------------------------------------------------------------
// Decode: one token per sequence over a paged cache whose blocks are shuffled.

struct DecodeShape {
  std::vector<int32_t> lens;
  int64_t hq, hkv, d, block_size;
  float softcap;
  bool fp8 = false;  // an f8e4m3 cache (store_kv's rule, k / v scales 1/32, 1/64)
};

std::unique_ptr<Problem> decode_problem(const DecodeShape& s, uint32_t seed) {
  auto p = std::make_unique<Problem>();
  const int64_t b = static_cast<int64_t>(s.lens.size()), hq = s.hq, hkv = s.hkv, d = s.d,
                bs = s.block_size;
  p->name = "decode B=" + std::to_string(b) + " Hq=" + std::to_string(hq) +
            " Hkv=" + std::to_string(hkv) + " D=" + std::to_string(d) +
            " block_size=" + std::to_string(bs) + (s.fp8 ? " fp8 cache" : "");
  p->out_elems = static_cast<size_t>(b * hq * d);
  int64_t max_blocks = 1, used = 0;
  for (int32_t l : s.lens) max_blocks = std::max<int64_t>(max_blocks, (l + bs - 1) / bs);
  for (int32_t l : s.lens) used += (l + bs - 1) / bs;
  const int64_t nb = used + 2;
  std::vector<int32_t> perm(static_cast<size_t>(nb));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  auto table = std::make_shared<std::vector<int32_t>>(static_cast<size_t>(b * max_blocks), 0);
  for (int64_t sq = 0, next = 0; sq < b; ++sq)
    for (int64_t i = 0; i < (s.lens[sq] + bs - 1) / bs; ++i)
      (*table)[sq * max_blocks + i] = perm[next++];
  auto lens = std::make_shared<std::vector<int32_t>>(s.lens);
  auto kc = std::make_shared<std::vector<uint16_t>>(random_bf16(nb * bs * hkv * d, seed, -2, 2));
  auto vc =
      std::make_shared<std::vector<uint16_t>>(random_bf16(nb * bs * hkv * d, seed + 1, -1, 1));
  auto q = std::make_shared<std::vector<uint16_t>>(random_bf16(b * hq * d, seed + 2, -2, 2));
  AttentionOptions opt;
  opt.softcap = s.softcap;
  // fp8: the e4m3 codes of the same values (|K| / k_scale <= 64, |V| / v_scale
  // <= 64: no saturation), read by the reference as code value · scale.
  const float k_scale = 1.0f / 32, v_scale = 1.0f / 64;
  auto kc8 = std::make_shared<std::vector<uint8_t>>(),
       vc8 = std::make_shared<std::vector<uint8_t>>();
  if (s.fp8) {
    for (uint16_t x : *kc) kc8->push_back(runtime::f32_to_e4m3(bf16_to_f32(x) / k_scale));
    for (uint16_t x : *vc) vc8->push_back(runtime::f32_to_e4m3(bf16_to_f32(x) / v_scale));
    opt.kv_scales.k_scale = k_scale;
    opt.kv_scales.v_scale = v_scale;
  }
  const DType cache_dtype = s.fp8 ? DType::f8e4m3 : DType::bf16;
  const bool fp8 = s.fp8;
  p->run = [=](void* out) {  // holds the shared vectors: the caches live as long as the problem
    void* const k_data = fp8 ? static_cast<void*>(kc8->data()) : kc->data();
    void* const v_data = fp8 ? static_cast<void*>(vc8->data()) : vc->data();
    decode_attention(TensorView(q->data(), DType::bf16, {b, hq, d}),
                     TensorView(k_data, cache_dtype, {nb, bs, hkv, d}),
                     TensorView(v_data, cache_dtype, {nb, bs, hkv, d}),
                     TensorView(out, DType::bf16, {b, hq, d}),
                     TensorView(table->data(), DType::i32, {b, max_blocks}),
                     TensorView(lens->data(), DType::i32, {b}), opt);
  };
  // The cache element the kernels read, as a value.
  const auto cache_at = [&](bool is_k, int64_t sq, int64_t j, int64_t h, int64_t col) -> double {
    const int64_t blk = (*table)[sq * max_blocks + j / bs];
    const int64_t at = ((blk * bs + j % bs) * hkv + h) * d + col;
    if (!s.fp8) return bf16_at(is_k ? *kc : *vc, at);
    return double(runtime::e4m3_to_f32((is_k ? *kc8 : *vc8)[static_cast<size_t>(at)])) *
           (is_k ? k_scale : v_scale);
  };
  double max_v = 0;
  if (s.fp8)
    for (uint8_t c : *vc8)
      max_v = std::max(max_v, std::fabs(double(runtime::e4m3_to_f32(c))) * v_scale);
  else
    for (uint16_t x : *vc) max_v = std::max(max_v, std::fabs(double(bf16_to_f32(x))));
  p->ref.assign(p->out_elems, 0);
  p->tol.assign(p->out_elems, 0);
  const int64_t g = hq / hkv;
  for (int64_t sq = 0; sq < b; ++sq)
    for (int64_t h = 0; h < hq; ++h) {
      runtime::ReferenceAttentionHead rh;
      rh.tq = 1;
      rh.tk = s.lens[sq];
      rh.d = rh.dv = d;
      rh.sm_scale = 1.0 / std::sqrt(double(d));
      rh.softcap = s.softcap;
      rh.q_at = [&](int64_t, int64_t c) { return bf16_at(*q, (sq * hq + h) * d + c); };
      rh.k_at = [&](int64_t j, int64_t c) { return cache_at(true, sq, j, h / g, c); };
      rh.v_at = [&](int64_t j, int64_t c) { return cache_at(false, sq, j, h / g, c); };
      rh.out = [&](int64_t, int64_t c, double x) {
        const auto at = static_cast<size_t>((sq * hq + h) * d + c);
        p->ref[at] = x;
        p->tol[at] = attention_tolerance(max_v, x);
      };
      runtime::reference_attention_head(rh);
    }
  return p;
}

// ---------------------------------------------------------------------------
// GEMM: y[M, N] = act(x · wᵀ + bias), the weight packed once and shared.

std::unique_ptr<Problem> gemm_problem(int64_t m, int64_t n, int64_t k, Activation act, Bias bias,
                                      DType out) {
  auto p = std::make_unique<Problem>();
  auto gp = std::make_shared<GemmProblem>(random_problem(m, n, k, act, bias, out));
  p->name = "gemm " + problem_str(*gp);
  p->out_dtype = out;
  p->out_elems = static_cast<size_t>(m * n);
  auto packed =
      std::make_shared<PackedWeight>(pack_weight(TensorView(gp->w.data(), DType::bf16, {n, k})));
  p->run = [=](void* y) {
    GemmOptions opt;
    opt.act = gp->act;
    if (gp->bias == Bias::f32) opt.bias = TensorView(gp->bias_f32.data(), DType::f32, {n});
    if (gp->bias == Bias::bf16) opt.bias = TensorView(gp->bias_bf16.data(), DType::bf16, {n});
    gemm(TensorView(gp->x.data(), DType::bf16, {m, k}), *packed, TensorView(y, out, {m, n}), opt);
  };
  // The reference in double on the unpacked weight, and gemm_test's bound.
  std::vector<uint8_t> ref(p->out_bytes());
  runtime::ReferenceGemmArgs a;
  a.x = gp->x.data();
  a.ldx = k;
  a.m = m, a.n = n, a.k = k;
  a.bias = bias == Bias::f32    ? static_cast<const void*>(gp->bias_f32.data())
           : bias == Bias::bf16 ? static_cast<const void*>(gp->bias_bf16.data())
                                : nullptr;
  a.bias_dtype = bias == Bias::bf16 ? DType::bf16 : DType::f32;
  a.act = act;
  a.y = ref.data();
  a.y_dtype = out;
  a.ldy = n;
  runtime::reference_gemm(a, [&](int64_t r, int64_t c) { return gp->w[r * k + c]; });
  p->ref.resize(p->out_elems);
  p->tol.resize(p->out_elems);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double pre = 0, sum_abs = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double prod = double(bf16_to_f32(gp->x[i * k + kk])) * bf16_to_f32(gp->w[j * k + kk]);
        pre += prod;
        sum_abs += std::fabs(prod);
      }
      const double bv = bias == Bias::f32    ? double(gp->bias_f32[j])
                        : bias == Bias::bf16 ? double(bf16_to_f32(gp->bias_bf16[j]))
                                             : 0.0;
      pre += bv;
      const auto at = static_cast<size_t>(i * n + j);
      p->ref[at] = p->at(ref, at);
      p->tol[at] = gemm_tolerance(act, out, k, sum_abs, std::fabs(bv), pre,
                                  runtime::reference_activation(act, pre));
    }
  return p;
}

// ---------------------------------------------------------------------------

class AttentionThreads : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    saved_ = num_threads();
    // More pool threads than cores: tasks of one owner interleave with the
    // inline work of the other host threads on the same cores.
    set_num_threads(4);
  }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

TEST_F(AttentionThreads, PrefillGemmDecodeInterleavedOnFourHostThreads) {
  // Three shapes per kind, none compiled before the threads start (each test
  // binary is its own process, and nothing below runs an operator before the
  // threads do): the first calls race on the kernel cache.
  std::vector<std::unique_ptr<Problem>> kinds[3];
  kinds[0].push_back(prefill_problem({{37, 100}, 8, 2, 128, true}, 1));
  kinds[0].push_back(prefill_problem({{1, 64, 130}, 4, 4, 64, false}, 2));
  kinds[0].push_back(prefill_problem({{200}, 6, 3, 96, true}, 3));
  kinds[1].push_back(gemm_problem(1, 256, 512, Activation::none, Bias::none, DType::bf16));
  kinds[1].push_back(gemm_problem(33, 200, 320, Activation::silu, Bias::f32, DType::bf16));
  kinds[1].push_back(gemm_problem(128, 192, 1000, Activation::none, Bias::bf16, DType::f32));
  kinds[2].push_back(decode_problem({{1, 300, 1000}, 8, 2, 128, 16, 0.f}, 4));
  kinds[2].push_back(decode_problem({{513}, 32, 8, 128, 32, 0.f}, 5));
  kinds[2].push_back(decode_problem({{64, 65, 700}, 4, 1, 64, 64, 20.f}, 6));
  kinds[2].push_back(decode_problem({{1, 90, 800}, 8, 2, 128, 16, 0.f, true}, 7));
  kinds[2].push_back(decode_problem({{300}, 4, 1, 80, 1, 30.f, true}, 8));

  std::mutex mu;
  std::vector<std::string> failures;
  std::atomic<int> calls{0};
  std::latch start(kHostThreads);
  std::vector<std::thread> threads;
  for (int w = 0; w < kHostThreads; ++w)
    threads.emplace_back([&, w] {
      std::vector<uint8_t> out;
      start.arrive_and_wait();
      for (int i = 0; i < kIterations; ++i) {
        // Thread w runs kind (i + w) % 3: at any moment the threads are in
        // different operators, and shape (i / 3 + w) mod the kind's count
        // spreads the shapes.
        const auto& kind = kinds[(i + w) % 3];
        Problem& p = *kind[static_cast<size_t>(i / 3 + w) % kind.size()];
        out.assign(p.out_bytes(), 0xFF);  // NaN in bf16 and f32: an unwritten element fails
        std::string err;
        try {
          p.run(out.data());
          err = p.check(out);
        } catch (const std::exception& e) {
          err = p.name + ": threw " + e.what();
        }
        calls.fetch_add(1);
        if (!err.empty()) {
          std::lock_guard lock(mu);
          failures.push_back("host thread " + std::to_string(w) + ", iteration " +
                             std::to_string(i) + ": " + err);
          return;
        }
      }
    });
  for (auto& t : threads) t.join();
  for (const std::string& f : failures) ADD_FAILURE() << f;
  ASSERT_TRUE(failures.empty());
  EXPECT_EQ(calls.load(), kHostThreads * kIterations);

  // Every kernel the threads needed is now resident: running each problem
  // once more on this thread compiles nothing and gives the same bytes.
  const uint64_t compiles = cache_stats().compiles;
  for (auto& kind : kinds)
    for (auto& p : kind) {
      EXPECT_FALSE(p->first.empty()) << p->name << " never ran";
      std::vector<uint8_t> out(p->out_bytes(), 0xFF);
      p->run(out.data());
      EXPECT_EQ(p->check(out), "");
    }
  EXPECT_EQ(cache_stats().compiles, compiles) << "a kernel compiled after the threaded phase";
}

}  // namespace
}  // namespace tilejit::test
