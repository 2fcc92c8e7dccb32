// Attention operators against the double-precision reference
// (runtime/reference_attention.h), on the active ISA path.
//
// Error bound, per output element: |out − ref| ≤ 2⁻⁷·max|v| + 2⁻⁸·|ref|.
// Scores are fp32 sums of exact bf16 products; the softmax weights P are
// rounded to bf16 (relative error ≤ 2⁻⁹ each) before P·V, which moves the
// output by at most 2⁻⁹·max|v|; the output itself is rounded to bf16 (2⁻⁹·|ref|).
// The bound leaves 4× / 2× headroom over those for fp32 exp and summation.
//
// Long problems compare a sample of query rows (the last rows through the
// reference's bottom-right alignment, early rows of causal problems through a
// truncated key range), so each variant stays well under a minute.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "ops/attention_descs.h"
#include "ops/attention_engine.h"
#include "runtime/isa.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "test_util.h"
#include "tilejit/tilejit.h"
#include "tuned_entry.h"

namespace tilejit::test {
namespace {

// ---------------------------------------------------------------------------
// Prefill problems

struct Varlen {
  std::vector<int64_t> lq, lk;  // per sequence
  int64_t hq = 1, hkv = 1, d = 64, dv = 64;
  AttentionOptions opt;
  std::vector<float> sinks, slopes;
  bool qkv_packed = false;  // q, k, v as column views of one [T, (Hq + 2·Hkv)·D] buffer
};

// The bound above (runtime/reference_error_bounds.h).
double tolerance(double max_v, double ref) {
  return runtime::attention_output_bound(max_v, ref);
}

struct Checker {
  double max_v = 0, worst = 0;
  int64_t checked = 0;
  void compare(double got, double ref, const std::string& where) {
    const double err = std::fabs(got - ref), tol = tolerance(max_v, ref);
    worst = std::max(worst, err / tol);
    ++checked;
    ASSERT_LE(err, tol) << where << ": got " << got << " want " << ref;
  }
};

// Reference rows [i0, i0 + n) of a head with tq queries / tk keys. Rows at the
// end keep bottom-right alignment with tq' = n; causal rows elsewhere use a
// key range truncated to i_pos + 1 (the keys past i_pos are masked anyway).
template <class Q, class K, class V, class Out>
void reference_rows(runtime::ReferenceAttentionHead h, int64_t i0, int64_t n, Q q_at, K k_at,
                    V v_at, Out out) {
  const int64_t tq = h.tq, tk = h.tk;
  if (i0 + n != tq) {
    h.tk = tk - tq + i0 + n;  // only valid when causal (checked by the caller)
  }
  h.tq = n;
  h.q_at = [&](int64_t i, int64_t c) { return q_at(i0 + i, c); };
  h.k_at = k_at;
  h.v_at = v_at;
  h.out = [&](int64_t i, int64_t c, double x) { out(i0 + i, c, x); };
  runtime::reference_attention_head(h);
}

void run_varlen(const Varlen& pr, bool sample = false) {
  const int64_t b = static_cast<int64_t>(pr.lq.size());
  std::vector<int32_t> cq(b + 1, 0), ck(b + 1, 0);
  for (int64_t i = 0; i < b; ++i) cq[i + 1] = cq[i] + pr.lq[i], ck[i + 1] = ck[i] + pr.lk[i];
  const int64_t tq = cq[b], tk = ck[b], hq = pr.hq, hkv = pr.hkv, d = pr.d, dv = pr.dv;
  const uint32_t seed = seed_of({tq, tk, hq, hkv, d, dv, pr.opt.causal});
  // Guarded inputs: a kernel reading past the last row of q, k or v faults.
  std::optional<GuardedBuffer> qkv_buf;
  GuardedBuffer qb(std::max<int64_t>(1, tq * hq * d) * 2),
      kb(std::max<int64_t>(1, tk * hkv * d) * 2), vb(std::max<int64_t>(1, tk * hkv * dv) * 2);
  auto fill = [](uint16_t* p, int64_t n, uint32_t s, float a) {
    const auto r = random_bf16(static_cast<size_t>(n), s, -a, a);
    std::copy(r.begin(), r.end(), p);
  };
  TensorView q, k, v;
  if (pr.qkv_packed) {
    EXPECT_EQ(tq, tk);
    EXPECT_EQ(d, dv);
    const int64_t w = (hq + 2 * hkv) * d;
    qkv_buf.emplace(std::max<int64_t>(1, tq * w) * 2);
    auto* base = qkv_buf->as<uint16_t>();
    fill(base, tq * w, seed, 2);
    q = TensorView(base, DType::bf16, {tq, hq, d}, {w, d, 1});
    k = TensorView(base + hq * d, DType::bf16, {tk, hkv, d}, {w, d, 1});
    v = TensorView(base + (hq + hkv) * d, DType::bf16, {tk, hkv, dv}, {w, dv, 1});
  } else {
    fill(qb.as<uint16_t>(), tq * hq * d, seed, 2);
    fill(kb.as<uint16_t>(), tk * hkv * d, seed + 1, 2);
    fill(vb.as<uint16_t>(), tk * hkv * dv, seed + 2, 1);
    q = TensorView(qb.as<uint16_t>(), DType::bf16, {tq, hq, d});
    k = TensorView(kb.as<uint16_t>(), DType::bf16, {tk, hkv, d});
    v = TensorView(vb.as<uint16_t>(), DType::bf16, {tk, hkv, dv});
  }
  std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(1, tq * hq * dv)), 0x7fc0);
  AttentionOptions opt = pr.opt;
  if (!pr.sinks.empty()) opt.sinks = TensorView(pr.sinks.data(), DType::f32, {hq});
  if (!pr.slopes.empty()) opt.alibi_slopes = TensorView(pr.slopes.data(), DType::f32, {hq});
  flash_attn_varlen(q, k, v, TensorView(out.data(), DType::bf16, {tq, hq, dv}),
                    TensorView(cq.data(), DType::i32, {b + 1}),
                    TensorView(ck.data(), DType::i32, {b + 1}), opt);

  auto el = [](const TensorView& t, int64_t i, int64_t h, int64_t c) {
    return double(
        bf16_to_f32(static_cast<const uint16_t*>(t.data)[i * t.strides[0] + h * t.strides[1] + c]));
  };
  Checker chk;
  for (int64_t i = 0; i < tk; ++i)
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t c = 0; c < dv; ++c) chk.max_v = std::max(chk.max_v, std::fabs(el(v, i, h, c)));
  const int64_t g = hq / hkv;
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t h = 0; h < hq; ++h) {
      runtime::ReferenceAttentionHead rh;
      rh.tq = pr.lq[s];
      rh.tk = pr.lk[s];
      rh.d = d;
      rh.dv = dv;
      rh.sm_scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(double(d));
      rh.causal = opt.causal;
      rh.window_left = opt.window_left;
      rh.window_right = opt.window_right;
      rh.softcap = opt.softcap;
      rh.has_sink = !pr.sinks.empty();
      if (rh.has_sink) rh.sink = pr.sinks[h];
      if (!pr.slopes.empty()) rh.alibi_slope = pr.slopes[h];
      auto q_at = [&](int64_t i, int64_t c) { return el(q, cq[s] + i, h, c); };
      auto k_at = [&](int64_t j, int64_t c) { return el(k, ck[s] + j, h / g, c); };
      auto v_at = [&](int64_t j, int64_t c) { return el(v, ck[s] + j, h / g, c); };
      auto cmp = [&](int64_t i, int64_t c, double ref) {
        const double got = bf16_to_f32(out[((cq[s] + i) * hq + h) * dv + c]);
        chk.compare(got, ref,
                    "seq " + std::to_string(s) + " head " + std::to_string(h) + " row " +
                        std::to_string(i) + " col " + std::to_string(c));
      };
      const int64_t nq = pr.lq[s];
      if (!sample || nq <= 32) {
        reference_rows(rh, 0, nq, q_at, k_at, v_at, cmp);
      } else {
        reference_rows(rh, nq - 16, 16, q_at, k_at, v_at, cmp);
        if (opt.causal && opt.window_right < 0)
          for (int64_t i0 : {int64_t{0}, nq / 2, nq - 100})
            reference_rows(rh, i0, 8, q_at, k_at, v_at, cmp);
      }
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  EXPECT_GT(chk.checked + (tq == 0 ? 1 : 0), 0);
}

class Prefill : public IsaTest {};

TEST_F(Prefill, HeadDims) {
  for (int64_t d : {16, 32, 64, 80, 96, 112, 128, 160, 192, 256, 576}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("D=" + std::to_string(d) + " causal=" + std::to_string(causal));
      Varlen pr;
      pr.lq = pr.lk = {0, 1, 15, 16, 17, 100};
      pr.hq = 4, pr.hkv = 1, pr.d = d, pr.dv = d == 576 ? 512 : d;
      pr.opt.causal = causal;
      run_varlen(pr);
      if (HasFatalFailure()) return;
    }
  }
}

// Head sizes that are not multiples of 16 (SigLIP's 72, 40, and the
// smallest and odd-pair ones): the K step is zero-padded, the Dv tail
// masked. GQA rows, causal and not, D ≠ Dv both ways.
TEST_F(Prefill, EvenHeadDimTails) {
  for (auto [d, dv] : {std::pair<int64_t, int64_t>{2, 2},
                       {40, 40},
                       {66, 66},
                       {72, 72},
                       {80, 80},
                       {258, 258},
                       {574, 574},
                       {72, 40},
                       {40, 72},
                       {66, 2},
                       {2, 66},
                       {258, 130}}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("D=" + std::to_string(d) + " Dv=" + std::to_string(dv) +
                   " causal=" + std::to_string(causal));
      Varlen pr;
      pr.lq = {1, 15, 17, 70};
      pr.lk = {1, 15, 40, 150};
      pr.hq = 4, pr.hkv = 2, pr.d = d, pr.dv = dv;
      pr.opt.causal = causal;
      run_varlen(pr);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(Prefill, EvenHeadDimOptions) {
  Varlen pr;
  pr.lq = {1, 17, 100};
  pr.lk = {1, 40, 200};
  pr.hq = 4, pr.hkv = 1, pr.d = 72, pr.dv = 40;
  pr.opt.causal = true;
  pr.opt.window_left = 30;
  pr.opt.softcap = 20.f;
  pr.sinks = {-1.f, 0.5f, 3.f, 40.f};
  pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
  run_varlen(pr);
}

TEST_F(Prefill, DifferentDv) {
  Varlen pr;
  pr.lq = {5, 70};
  pr.lk = {9, 130};
  pr.hq = 2, pr.hkv = 2, pr.d = 96, pr.dv = 48;
  pr.opt.causal = true;
  run_varlen(pr);
}

TEST_F(Prefill, GroupedQueries) {
  for (auto [hq, hkv] : {std::pair<int64_t, int64_t>{2, 2}, {8, 2}, {8, 1}, {16, 1}}) {
    for (bool causal : {false, true}) {
      SCOPED_TRACE("Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv));
      Varlen pr;
      pr.lq = {1, 17, 0, 40, 100};  // chunked prefill: fewer queries than keys
      pr.lk = {15, 17, 16, 100, 100};
      pr.hq = hq, pr.hkv = hkv, pr.d = 128, pr.dv = 128;
      pr.opt.causal = causal;
      run_varlen(pr);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(Prefill, Thousand) {
  Varlen pr;
  pr.lq = pr.lk = {1000, 17};
  pr.hq = 4, pr.hkv = 2, pr.d = 64, pr.dv = 64;
  pr.opt.causal = true;
  run_varlen(pr, /*sample=*/true);
  pr.opt.causal = false;
  run_varlen(pr, /*sample=*/true);
}

TEST_F(Prefill, Options) {
  struct Case {
    const char* name;
    bool causal;
    int wl, wr;
    float softcap;
    bool sinks, alibi;
    std::optional<float> scale;
  };
  const Case cases[] = {
      {"window_left", true, 20, -1, 0, false, false, {}},
      {"window_both", false, 10, 5, 0, false, false, {}},
      {"window_right0", false, -1, 0, 0, false, false, {}},
      {"softcap", true, -1, -1, 5.f, false, false, {}},
      {"sinks", true, -1, -1, 0, true, false, {}},
      {"sinks_noncausal", false, 8, -1, 0, true, false, {}},
      {"alibi", true, -1, -1, 0, false, true, {}},
      {"all", true, 30, -1, 20.f, true, true, 0.3f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Varlen pr;
    pr.lq = {1, 17, 100, 64};
    pr.lk = {1, 40, 100, 200};
    pr.hq = 4, pr.hkv = 2, pr.d = 64, pr.dv = 64;
    pr.opt.causal = c.causal;
    pr.opt.window_left = c.wl;
    pr.opt.window_right = c.wr;
    pr.opt.softcap = c.softcap;
    pr.opt.sm_scale = c.scale;
    if (c.sinks) pr.sinks = {-1.f, 0.5f, 3.f, 40.f};  // 40: a sink far above every score
    if (c.alibi) pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    run_varlen(pr);
    if (HasFatalFailure()) return;
  }
}

// Scaled scores near ±1e10 (a huge or negative sm_scale): the softmax is
// one-hot on each row's best key, and the kernels must give that key's v. The
// step's weights were s·(scale·log2e) − ref·log2e with the two products
// rounded apart: past ~2^31 every weight of a row flushed to 0 and the row
// came out as zeros; a negative scale took the row's smallest score as its
// max. Few rows and keys, so no two keys of a row tie within fp32 rounding.
TEST_F(Prefill, HugeAndNegativeScales) {
  for (const float scale : {1e10f, -1e10f, 5e9f, -0.3f}) {
    SCOPED_TRACE(scale);
    Varlen pr;
    pr.lq = {1, 5};
    pr.lk = {6, 9};
    pr.hq = 2, pr.hkv = 1, pr.d = 64, pr.dv = 32;
    pr.opt.sm_scale = scale;
    run_varlen(pr);
    if (HasFatalFailure()) return;
    pr.opt.causal = true;
    run_varlen(pr);
    if (HasFatalFailure()) return;
  }
}

TEST_F(Prefill, PackedQkvStrides) {
  Varlen pr;
  pr.lq = pr.lk = {33, 80};
  pr.hq = 4, pr.hkv = 1, pr.d = 80, pr.dv = 80;
  pr.opt.causal = true;
  pr.qkv_packed = true;
  run_varlen(pr);
}

TEST_F(Prefill, LongCausal) {
  Varlen pr;
  pr.lq = pr.lk = {4200, 3};
  pr.hq = 2, pr.hkv = 1, pr.d = 64, pr.dv = 64;
  pr.opt.causal = true;
  run_varlen(pr, /*sample=*/true);
}

// A tuned blocking (docs/tuning.md: rows per task, keys per online-softmax
// step) over the shapes, tails and options of the tests above, against the
// reference under the same bound: key blocks of 32 .. 256 (one not a power
// of two), tasks of 16 .. 64 rows, head sizes with AMX K tails, Dv != D,
// windows, softcap, sinks and ALiBi. Each entry is applied (counted).
TEST_F(Prefill, TunedBlocking) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "the scalar path has no blocking to tune";
  const std::pair<int64_t, int64_t> blockings[] = {{16, 32}, {48, 64}, {64, 256}, {32, 160}};
  for (const auto& [rows, key_block] : blockings)
    for (int problem = 0; problem < 3; ++problem) {
      SCOPED_TRACE(::testing::Message()
                   << "rows " << rows << ", key_block " << key_block << ", problem " << problem);
      Varlen pr;
      pr.lq = {1, 17, 100, 64, 300};
      pr.lk = {1, 40, 100, 200, 300};
      pr.hq = 4, pr.hkv = 2, pr.d = 72, pr.dv = 72;
      pr.opt.causal = true;
      if (problem == 1) {  // every option at once
        pr.opt.window_left = 130;
        pr.opt.softcap = 20.f;
        pr.opt.sm_scale = 0.3f;
        pr.sinks = {-1.f, 0.5f, 3.f, 40.f};
        pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
      } else if (problem == 2) {  // not causal, Dv != D, one group of 8
        pr.hq = 8, pr.hkv = 1, pr.d = 112, pr.dv = 64;
        pr.opt.causal = false;
        pr.lq = {33, 250};
        pr.lk = {290, 250};
      }
      const int64_t longest = *std::max_element(pr.lk.begin(), pr.lk.end());
      const TunedEntryScope tuned(
          "prefill_attention",
          jit::prefill_shape_class(path, num_threads(), pr.d, pr.dv, pr.hq, pr.hkv, pr.opt.causal,
                                   static_cast<int64_t>(pr.lq.size()), longest),
          {{"rows", rows}, {"key_block", key_block}});
      const uint64_t before = cache_stats().tuned_plans;
      run_varlen(pr);
      if (HasFatalFailure()) return;
      EXPECT_EQ(cache_stats().tuned_plans, before + 1) << "the entry was not applied";
    }
}

// ---------------------------------------------------------------------------
// Decode over a paged cache

struct Paged {
  std::vector<int64_t> lens;
  int64_t hq = 8, hkv = 2, d = 128, dv = 128, bs = 16;
  bool mla = false;  // v_cache = the first Dv columns of k_cache (Hkv = 1)
  AttentionOptions opt;
  std::vector<float> sinks, slopes;
};

// Returns the output; checks it against the reference.
std::vector<uint16_t> run_decode(const Paged& pr, int threads) {
  const int64_t b = static_cast<int64_t>(pr.lens.size()), hq = pr.hq, hkv = pr.hkv, d = pr.d,
                dv = pr.dv, bs = pr.bs;
  int64_t max_blocks = 1, used = 0;
  for (int64_t l : pr.lens)
    max_blocks = std::max(max_blocks, (l + bs - 1) / bs), used += (l + bs - 1) / bs;
  const int64_t num_blocks = used + 3;  // a few never referenced
  const uint32_t seed = seed_of({b, hq, hkv, d, dv, bs, pr.mla});
  // Blocks handed out in a shuffled order, so neighbouring blocks of a sequence are not adjacent.
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> table(static_cast<size_t>(b * max_blocks), -1), lens32;
  int64_t next = 0;
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < (pr.lens[s] + bs - 1) / bs; ++i)
      table[s * max_blocks + i] = perm[next++];
    lens32.push_back(static_cast<int32_t>(pr.lens[s]));
  }
  const int64_t kcols = hkv * d;
  GuardedBuffer kc(num_blocks * bs * kcols * 2);
  {
    const auto r = random_bf16(static_cast<size_t>(num_blocks * bs * kcols), seed, -2, 2);
    std::copy(r.begin(), r.end(), kc.as<uint16_t>());
  }
  std::optional<GuardedBuffer> vc;
  TensorView k_cache(kc.as<uint16_t>(), DType::bf16, {num_blocks, bs, hkv, d});
  TensorView v_cache;
  if (pr.mla) {
    v_cache =
        TensorView(kc.as<uint16_t>(), DType::bf16, {num_blocks, bs, 1, dv}, {bs * d, d, d, 1});
  } else {
    vc.emplace(num_blocks * bs * hkv * dv * 2);
    const auto r = random_bf16(static_cast<size_t>(num_blocks * bs * hkv * dv), seed + 1, -1, 1);
    std::copy(r.begin(), r.end(), vc->as<uint16_t>());
    v_cache = TensorView(vc->as<uint16_t>(), DType::bf16, {num_blocks, bs, hkv, dv});
  }
  const auto qv = random_bf16(static_cast<size_t>(b * hq * d), seed + 2, -2, 2);
  std::vector<uint16_t> out(static_cast<size_t>(b * hq * dv), 0x7fc0);
  AttentionOptions opt = pr.opt;
  if (!pr.sinks.empty()) opt.sinks = TensorView(pr.sinks.data(), DType::f32, {hq});
  if (!pr.slopes.empty()) opt.alibi_slopes = TensorView(pr.slopes.data(), DType::f32, {hq});
  const int saved = num_threads();
  set_num_threads(threads);
  decode_attention(TensorView(qv.data(), DType::bf16, {b, hq, d}), k_cache, v_cache,
                   TensorView(out.data(), DType::bf16, {b, hq, dv}),
                   TensorView(table.data(), DType::i32, {b, max_blocks}),
                   TensorView(lens32.data(), DType::i32, {b}), opt);
  set_num_threads(saved);

  auto cache_at = [&](const TensorView& c, int64_t s, int64_t j, int64_t h, int64_t col) {
    const int64_t blk = table[s * max_blocks + j / bs];
    return double(bf16_to_f32(static_cast<const uint16_t*>(
        c.data)[blk * c.strides[0] + (j % bs) * c.strides[1] + h * c.strides[2] + col]));
  };
  Checker chk;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t j = 0; j < pr.lens[s]; ++j)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < dv; ++c)
          chk.max_v = std::max(chk.max_v, std::fabs(cache_at(v_cache, s, j, h, c)));
  const int64_t g = hq / hkv;
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t h = 0; h < hq; ++h) {
      runtime::ReferenceAttentionHead rh;
      rh.tq = 1;
      rh.tk = pr.lens[s];
      rh.d = d;
      rh.dv = dv;
      rh.sm_scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(double(d));
      rh.causal = opt.causal;
      rh.window_left = opt.window_left;
      rh.window_right = opt.window_right;
      rh.softcap = opt.softcap;
      rh.has_sink = !pr.sinks.empty();
      if (rh.has_sink) rh.sink = pr.sinks[h];
      if (!pr.slopes.empty()) rh.alibi_slope = pr.slopes[h];
      rh.q_at = [&](int64_t, int64_t c) { return double(bf16_to_f32(qv[(s * hq + h) * d + c])); };
      rh.k_at = [&](int64_t j, int64_t c) { return cache_at(k_cache, s, j, h / g, c); };
      rh.v_at = [&](int64_t j, int64_t c) { return cache_at(v_cache, s, j, h / g, c); };
      rh.out = [&](int64_t, int64_t c, double ref) {
        chk.compare(bf16_to_f32(out[(s * hq + h) * dv + c]), ref,
                    "seq " + std::to_string(s) + " head " + std::to_string(h) + " col " +
                        std::to_string(c));
      };
      runtime::reference_attention_head(rh);
      if (::testing::Test::HasFatalFailure()) return out;
    }
  }
  return out;
}

class Decode : public IsaTest {
 protected:
  // `pr` on 1 thread (no split) and on 8 (B·Hkv < 16: the long sequences
  // split over KV) agree. Split placement moves the running max each P row is
  // rounded against, so the two may differ by P's bf16 rounding (2⁻⁹·max|v|,
  // max|v| ≤ 1 here) plus the output rounding; anything larger is a merge bug.
  void expect_split_matches_unsplit(const Paged& pr) {
    const auto one = run_decode(pr, 1);
    if (HasFatalFailure()) return;
    const auto many = run_decode(pr, 8);
    if (HasFatalFailure()) return;
    for (size_t i = 0; i < one.size(); ++i) {
      const double a = bf16_to_f32(one[i]), b = bf16_to_f32(many[i]);
      ASSERT_LE(std::fabs(a - b), std::ldexp(1.0, -8) + std::ldexp(std::fabs(a), -7))
          << "element " << i << ": " << a << " vs " << b;
    }
  }
};

TEST_F(Decode, BlockSizesSplitOnAndOff) {
  for (int64_t bs : {16, 32, 64, 128}) {
    SCOPED_TRACE("block_size=" + std::to_string(bs));
    Paged pr;
    pr.lens = {1, 100, 1500};
    pr.bs = bs;
    expect_split_matches_unsplit(pr);
    if (HasFatalFailure()) return;
  }
}

// A long context among many short ones: enough tasks for the pool, yet one
// sequence holds most of the keys. It splits (an outside tester's batch of
// 1 × 31 000 + 63 × 16 keys ran on one thread: 2 threads gained nothing),
// and the split result matches the unsplit one and the reference.
TEST_F(Decode, ALongSequenceAmongManyShortOnesIsSplit) {
  EXPECT_EQ(ops::attn::default_splits(64, 2, 31000, 31000 + 63 * 16), 2);
  EXPECT_EQ(ops::attn::default_splits(64, 2, 512, 64 * 512), 1);  // uniform: as before
  EXPECT_EQ(ops::attn::default_splits(64, 8, 31000, 31000 + 63 * 16), 8);
  EXPECT_EQ(ops::attn::default_splits(64, 8, 300, 300 + 63 * 16), 1);  // too short to pay
  EXPECT_EQ(ops::attn::default_splits(64, 1, 31000, 31000 + 63 * 16), 1);
  EXPECT_EQ(ops::attn::default_splits(64, 2, 31000), 1);  // no total: the task rule only
  EXPECT_EQ(ops::attn::default_splits(3, 8, 1500), 5);    // few tasks: unchanged
  Paged pr;
  pr.lens.assign(31, 16);
  pr.lens.insert(pr.lens.begin() + 7, 3000);
  expect_split_matches_unsplit(pr);
}

// Any block size: rows of a sequence scattered over blocks of 1, 3, 8, 17
// keys (sglang's token-granular cache is block size 1), split-KV on and off.
TEST_F(Decode, AnyBlockSize) {
  for (int64_t bs : {1, 3, 8, 16, 17, 64}) {
    SCOPED_TRACE("block_size=" + std::to_string(bs));
    Paged pr;
    pr.lens = {1, 5, 100, 700};
    pr.bs = bs;
    expect_split_matches_unsplit(pr);
    if (HasFatalFailure()) return;
  }
}

// Head sizes that are not multiples of 16, with D ≠ Dv, group sizes 1, 4, 8
// and 16 (G > 8 takes the kernel's other head loop) and block sizes that
// do and do not divide into 16-key chunks.
TEST_F(Decode, EvenHeadDimTails) {
  struct Case {
    int64_t hq, hkv, d, dv, bs;
  };
  for (const Case& c : {Case{4, 4, 2, 2, 16}, Case{8, 2, 40, 40, 8}, Case{8, 2, 66, 66, 16},
                        Case{8, 1, 72, 72, 1}, Case{32, 2, 72, 72, 3}, Case{16, 2, 80, 80, 17},
                        Case{8, 2, 258, 258, 64}, Case{8, 2, 72, 40, 8}, Case{8, 2, 40, 72, 16},
                        Case{4, 2, 66, 2, 1}, Case{4, 2, 2, 66, 17}, Case{8, 1, 258, 130, 3}}) {
    SCOPED_TRACE("Hq=" + std::to_string(c.hq) + " Hkv=" + std::to_string(c.hkv) +
                 " D=" + std::to_string(c.d) + " Dv=" + std::to_string(c.dv) +
                 " bs=" + std::to_string(c.bs));
    Paged pr;
    pr.lens = {3, 40, 300};
    pr.hq = c.hq, pr.hkv = c.hkv, pr.d = c.d, pr.dv = c.dv, pr.bs = c.bs;
    run_decode(pr, 1);
    if (HasFatalFailure()) return;
    run_decode(pr, 8);  // split-KV
    if (HasFatalFailure()) return;
  }
}

TEST_F(Decode, TailsWithOptions) {
  for (int64_t bs : {1, 8}) {
    SCOPED_TRACE("block_size=" + std::to_string(bs));
    Paged pr;
    pr.lens = {1, 33, 700};
    pr.hq = 4, pr.hkv = 2, pr.d = 72, pr.dv = 72, pr.bs = bs;
    pr.opt.window_left = 100;
    pr.opt.softcap = 10;
    pr.sinks = {0.f, 1.f, -2.f, 30.f};
    pr.slopes = {0.1f, 0.01f, 0.f, 0.5f};
    run_decode(pr, 4);
    if (HasFatalFailure()) return;
  }
}

TEST_F(Decode, MlaSmallBlocks) {
  Paged pr;
  pr.lens = {5, 140};
  pr.hq = 16, pr.hkv = 1, pr.d = 576, pr.dv = 512, pr.bs = 8, pr.mla = true;
  pr.opt.sm_scale = 0.1f;
  run_decode(pr, 2);
}

TEST_F(Decode, GroupedAndHeadDims) {
  for (auto [hq, hkv, d] :
       {std::tuple<int64_t, int64_t, int64_t>{4, 4, 64}, {32, 4, 80}, {16, 1, 256}, {128, 1, 64}}) {
    SCOPED_TRACE("Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                 " D=" + std::to_string(d));
    Paged pr;
    pr.lens = {7, 300};
    pr.hq = hq, pr.hkv = hkv, pr.d = d, pr.dv = d, pr.bs = 32;
    run_decode(pr, 4);
    if (HasFatalFailure()) return;
  }
}

// More query heads per kv head than the LLVM decode kernel unrolls
// (DecodeAttentionDesc::kMaxG): the attention engine's decode runs instead
// of the call raising the kernel compiler's Error.
TEST_F(Decode, GroupPastTheKernelsUnrolling) {
  Paged pr;
  pr.lens = {5, 40};
  pr.hq = codegen::llvm_backend::DecodeAttentionDesc::kMaxG + 64, pr.hkv = 1;
  pr.d = 16, pr.dv = 16, pr.bs = 16;
  EXPECT_FALSE(ops::decode_attention_llvm_kernel(runtime::active_isa(), pr.hq));
  run_decode(pr, 2);
}

TEST_F(Decode, Options) {
  Paged pr;
  pr.lens = {1, 33, 700};
  pr.hq = 4, pr.hkv = 2, pr.d = 64, pr.dv = 64, pr.bs = 16;
  pr.opt.window_left = 100;
  pr.opt.softcap = 10;
  pr.sinks = {0.f, 1.f, -2.f, 30.f};
  pr.slopes = {0.1f, 0.01f, 0.f, 0.5f};
  run_decode(pr, 4);
}

TEST_F(Decode, Mla) {
  Paged pr;
  pr.lens = {5, 300};
  pr.hq = 16, pr.hkv = 1, pr.d = 576, pr.dv = 512, pr.bs = 64, pr.mla = true;
  pr.opt.sm_scale = 0.1f;
  run_decode(pr, 2);
  run_decode(pr, 1);
}

// DeepSeek's MLA decode (Hq 128 over one latent head, D 576, Dv 512) on a
// thread with a 64 KiB stack (musl's default is 128 KiB, some engines' pools
// use less), on 1 thread, in a child. Warm: the kernel's G·D-sized working
// memory lived on the stack (180 KiB here, 1.2 MB at G 1024) and the call
// died by SIGSEGV; the result must be the main thread's, bit for bit. Cold
// (block size 8, a kernel the process has not made): the LLVM compile
// itself needs ~80 KiB and died inside LLVM; it now runs on a thread of its
// own (runtime::run_with_stack).
std::vector<uint16_t> mla_decode_g128(int64_t block = 16) {
  return mla_decode(/*hq=*/128, block, /*blocks=*/8, /*len=*/50, /*seed=*/11);
}

TEST_F(Decode, MlaOnASmallStackThread) {
  if (kUnderAsan || kUnderTsan)
    GTEST_SKIP() << "the sanitizers' instrumentation takes stack of its own";
  const int saved = num_threads();
  set_num_threads(1);
  const std::vector<uint16_t> expected = mla_decode_g128();
  set_num_threads(saved);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(120);
    set_num_threads(1);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, 64 << 10) != 0) ::_exit(10);
    static std::vector<uint16_t> got, cold;
    pthread_t t;
    auto body = [](void*) -> void* {
      try {
        got = mla_decode_g128();
        cold = mla_decode_g128(8);
      } catch (...) {
        ::_exit(11);
      }
      return nullptr;
    };
    if (pthread_create(&t, &attr, body, nullptr) != 0) ::_exit(12);
    pthread_join(t, nullptr);
    for (uint16_t v : cold)
      if (!std::isfinite(bf16_to_f32(v))) ::_exit(14);
    ::_exit(got == expected ? 0 : 13);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// DecodeOptions::deterministic: a sequence's output bit for bit the same
// alone or in any batch (other sequences' number and lengths), on any thread
// count. Without it the split-KV count follows the threads, the task count
// and the longest sequence, so a sequence alone on 2 threads splits and in a
// batch does not (an outside tester's batch-invariance check: ~1500 of 4096
// outputs moved), and a long neighbour made a short sequence split.
TEST_F(Decode, DeterministicIsBatchAndThreadInvariant) {
  const int64_t hq = 32, hkv = 8, d = 128, bs = 16;
  const std::vector<int64_t> lens = {1000, 6000, 40, 300};  // the target is sequence 0
  int64_t blocks = 0;
  for (int64_t l : lens) blocks += (l + bs - 1) / bs;
  const auto kc = random_bf16(static_cast<size_t>(blocks * bs * hkv * d), 21, -2, 2);
  const auto vc = random_bf16(static_cast<size_t>(blocks * bs * hkv * d), 22, -1, 1);
  const TensorView k_cache(const_cast<uint16_t*>(kc.data()), DType::bf16, {blocks, bs, hkv, d});
  const TensorView v_cache(const_cast<uint16_t*>(vc.data()), DType::bf16, {blocks, bs, hkv, d});
  // Sequence s owns consecutive blocks, handed out in reverse.
  std::vector<std::vector<int32_t>> owned(lens.size());
  int64_t next = blocks;
  for (size_t s = 0; s < lens.size(); ++s)
    for (int64_t i = 0; i < (lens[s] + bs - 1) / bs; ++i)
      owned[s].push_back(static_cast<int32_t>(--next));
  const auto qs = random_bf16(static_cast<size_t>(lens.size() * hq * d), 23, -2, 2);
  // The target's output rows when decoded in the batch `seqs` (the target at
  // position `at`) on `threads` threads.
  auto target = [&](std::vector<size_t> seqs, size_t at, int threads, bool deterministic) {
    seqs.insert(seqs.begin() + static_cast<ptrdiff_t>(at), 0);
    const auto b = static_cast<int64_t>(seqs.size());
    int64_t max_blocks = 0;
    for (size_t s : seqs) max_blocks = std::max<int64_t>(max_blocks, owned[s].size());
    std::vector<int32_t> table(static_cast<size_t>(b * max_blocks), 0), lens32;
    std::vector<uint16_t> q;
    for (int64_t i = 0; i < b; ++i) {
      const size_t s = seqs[static_cast<size_t>(i)];
      std::copy(owned[s].begin(), owned[s].end(), table.begin() + i * max_blocks);
      lens32.push_back(static_cast<int32_t>(lens[s]));
      q.insert(q.end(), qs.begin() + static_cast<ptrdiff_t>(s * hq * d),
               qs.begin() + static_cast<ptrdiff_t>((s + 1) * hq * d));
    }
    std::vector<uint16_t> out(static_cast<size_t>(b * hq * d));
    const int saved = num_threads();
    set_num_threads(threads);
    DecodeOptions dec;
    dec.deterministic = deterministic;
    decode_attention(TensorView(q.data(), DType::bf16, {b, hq, d}), k_cache, v_cache,
                     TensorView(out.data(), DType::bf16, {b, hq, d}),
                     TensorView(table.data(), DType::i32, {b, max_blocks}),
                     TensorView(lens32.data(), DType::i32, {b}), {}, dec);
    set_num_threads(saved);
    return std::vector<uint16_t>(out.begin() + static_cast<ptrdiff_t>(at * hq * d),
                                 out.begin() + static_cast<ptrdiff_t>((at + 1) * hq * d));
  };
  const std::vector<uint16_t> alone = target({}, 0, 1, true);
  struct Variant {
    std::vector<size_t> others;
    size_t at;
    int threads;
  };
  for (const Variant& v :
       {Variant{{}, 0, 2}, Variant{{}, 0, 8}, Variant{{1}, 1, 2}, Variant{{2, 3}, 0, 2},
        Variant{{1, 2, 3, 2, 3, 2, 3}, 4, 3}, Variant{{3, 2, 1}, 3, 1}}) {
    SCOPED_TRACE(::testing::Message() << "batch of " << v.others.size() + 1 << ", target at "
                                      << v.at << ", " << v.threads << " threads");
    const std::vector<uint16_t> got = target(v.others, v.at, v.threads, true);
    for (size_t i = 0; i < alone.size(); ++i) ASSERT_EQ(got[i], alone[i]) << "element " << i;
  }
}

TEST_F(Decode, Long32k) {
  Paged pr;
  pr.lens = {32768};
  pr.hq = 4, pr.hkv = 1, pr.d = 128, pr.dv = 128, pr.bs = 256;
  run_decode(pr, 4);
}

// ---------------------------------------------------------------------------
// store_kv

TEST(StoreKv, ScattersSkipsNegativeAndRejectsOutOfRange) {
  const int64_t t = 5, hkv = 2, d = 32, dv = 16, nb = 3, bs = 16;
  const auto k = random_bf16(t * hkv * d, 1), v = random_bf16(t * hkv * dv, 2);
  std::vector<uint16_t> kc(nb * bs * hkv * d, 0), vc(nb * bs * hkv * dv, 0);
  std::vector<int32_t> slots = {0, 17, -1, 47, 33};
  TensorView kt(k.data(), DType::bf16, {t, hkv, d}), vt(v.data(), DType::bf16, {t, hkv, dv});
  TensorView kct(kc.data(), DType::bf16, {nb, bs, hkv, d}),
      vct(vc.data(), DType::bf16, {nb, bs, hkv, dv});
  store_kv(kt, vt, kct, vct, TensorView(slots.data(), DType::i32, {t}));
  int64_t written = 0;
  for (int64_t i = 0; i < t; ++i) {
    if (slots[i] < 0) continue;
    ++written;
    for (int64_t h = 0; h < hkv; ++h) {
      for (int64_t c = 0; c < d; ++c)
        ASSERT_EQ(kc[(slots[i] * hkv + h) * d + c], k[(i * hkv + h) * d + c]);
      for (int64_t c = 0; c < dv; ++c)
        ASSERT_EQ(vc[(slots[i] * hkv + h) * dv + c], v[(i * hkv + h) * dv + c]);
    }
  }
  // The skipped token left nothing behind: exactly 4 slots hold data.
  int64_t nonzero_slots = 0;
  for (int64_t s = 0; s < nb * bs; ++s)
    nonzero_slots += std::any_of(kc.begin() + s * hkv * d, kc.begin() + (s + 1) * hkv * d,
                                 [](uint16_t x) { return x != 0; });
  EXPECT_EQ(nonzero_slots, written);

  const auto before = kc;
  slots[1] = static_cast<int32_t>(nb * bs);
  try {
    store_kv(kt, vt, kct, vct, TensorView(slots.data(), DType::i32, {t}));
    FAIL() << "expected Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("slot_mapping[1]=48"), std::string::npos) << e.what();
  }
  EXPECT_EQ(kc, before) << "nothing is written when a slot is out of range";
}

// Tokens sharing a slot (sglang's padding tokens on its dummy slot 0): the
// last token's row is stored, whatever the thread count (they raced before:
// the row stored depended on which thread wrote last), bf16 and fp8.
TEST(StoreKv, TokensSharingASlotStoreTheLastTokensRow) {
  const int64_t t = 256, hkv = 2, d = 64, nb = 2, bs = 16;
  const auto k = random_bf16(t * hkv * d, 3), v = random_bf16(t * hkv * d, 4);
  std::vector<int64_t> slots(t);
  for (int64_t i = 0; i < t; ++i) slots[i] = i % 3 == 0 ? 5 : (i * 7) % (nb * bs);
  slots[t - 1] = 5;
  const int threads_before = num_threads();
  for (DType cache : {DType::bf16, DType::f8e4m3}) {
    const int64_t eb = cache == DType::bf16 ? 2 : 1;
    std::vector<uint8_t> kc(nb * bs * hkv * d * eb), vc(kc.size()), kr(kc.size()), vr(kc.size());
    const TensorView kt(k.data(), DType::bf16, {t, hkv, d}), vt(v.data(), DType::bf16, {t, hkv, d});
    // The expected cache: the tokens stored one at a time, in order.
    for (int64_t i = 0; i < t; ++i)
      store_kv(TensorView(k.data() + i * hkv * d, DType::bf16, {1, hkv, d}),
               TensorView(v.data() + i * hkv * d, DType::bf16, {1, hkv, d}),
               TensorView(kr.data(), cache, {nb, bs, hkv, d}),
               TensorView(vr.data(), cache, {nb, bs, hkv, d}),
               TensorView(&slots[i], DType::i64, {1}));
    for (int threads : {1, 2, 4}) {
      set_num_threads(threads);
      for (int rep = 0; rep < 20; ++rep) {
        std::fill(kc.begin(), kc.end(), 0);
        std::fill(vc.begin(), vc.end(), 0);
        store_kv(kt, vt, TensorView(kc.data(), cache, {nb, bs, hkv, d}),
                 TensorView(vc.data(), cache, {nb, bs, hkv, d}),
                 TensorView(slots.data(), DType::i64, {t}));
        ASSERT_EQ(kc, kr) << dtype_name(cache) << " threads " << threads << " rep " << rep;
        ASSERT_EQ(vc, vr) << dtype_name(cache) << " threads " << threads << " rep " << rep;
      }
    }
  }
  set_num_threads(threads_before);
}

// ---------------------------------------------------------------------------
// Errors: each names the argument, the value and what is allowed.

// out may not overlap the caller's sinks, whatever their dtype (a bf16
// tensor is widened into a copy, but the check sees the caller's memory).
TEST(AttentionErrors, OutOverlappingSinksOfEitherDtype) {
  std::vector<uint16_t> qb(8 * 4 * 64, 0), kb(8 * 2 * 64, 0), vb(8 * 2 * 64, 0), ob(8 * 4 * 64, 0);
  std::vector<int32_t> cu = {0, 8};
  const TensorView q(qb.data(), DType::bf16, {8, 4, 64}), k(kb.data(), DType::bf16, {8, 2, 64}),
      v(vb.data(), DType::bf16, {8, 2, 64}), o(ob.data(), DType::bf16, {8, 4, 64});
  const TensorView c(cu.data(), DType::i32, {2});
  for (DType dt : {DType::f32, DType::bf16}) {
    AttentionOptions opt;
    opt.sinks = TensorView(ob.data() + 64, dt, {4});
    expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, c, c, opt); }, "sinks");
  }
}

TEST(AttentionErrors, Prefill) {
  std::vector<uint16_t> buf(64 * 8 * 128, 0);
  std::vector<float> f(64, 0);
  std::vector<int32_t> cu = {0, 4, 8}, cu_bad0 = {1, 4, 8}, cu_desc = {0, 6, 4},
                       cu_short = {0, 4, 7}, cu3 = {0, 2, 4, 8}, cu_k_small = {0, 2, 8};
  auto bf = [&](std::vector<int64_t> s) { return TensorView(buf.data(), DType::bf16, s); };
  auto i32 = [](std::vector<int32_t>& v) {
    return TensorView(v.data(), DType::i32, {static_cast<int64_t>(v.size())});
  };
  const TensorView q = bf({8, 4, 64}), k = bf({8, 2, 64}), v = bf({8, 2, 64}), o = bf({8, 4, 64});
  const char* f_op = "flash_attn_varlen";
  (void)f_op;
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(TensorView(buf.data(), DType::f32, {8, 4, 64}), k, v, o, i32(cu),
                          i32(cu));
      },
      "q.dtype=f32 is not allowed; allowed: bf16");
  expect_tilejit_error(
      [&] { flash_attn_varlen(q, k, v, o, TensorView(f.data(), DType::f32, {3}), i32(cu)); },
      "cu_seqlens_q.dtype=f32");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(bf({8, 4, 71}), bf({8, 2, 71}), bf({8, 2, 71}), bf({8, 4, 71}), i32(cu),
                          i32(cu));
      },
      "D (q.shape[2])=71; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(bf({8, 4, 64}), bf({8, 2, 64}), bf({8, 2, 33}), bf({8, 4, 33}), i32(cu),
                          i32(cu));
      },
      "Dv (v.shape[2])=33; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(bf({8, 4, 0}), bf({8, 2, 0}), bf({8, 2, 0}), bf({8, 4, 0}), i32(cu),
                          i32(cu));
      },
      "D (q.shape[2])=0; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(bf({8, 1, 592}), bf({8, 1, 592}), bf({8, 1, 592}), bf({8, 1, 592}),
                          i32(cu), i32(cu));
      },
      "=592; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(bf({8, 3, 64}), k, v, bf({8, 3, 64}), i32(cu), i32(cu));
      },
      "Hq=3 (q) and Hkv=2 (k); allowed: Hq a multiple of Hkv");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(q, bf({8, 2, 32}), v, o, i32(cu), i32(cu));
      },
      "k has shape [8, 2, 32]; allowed: [Tk, Hkv, D] with D = 64");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(q, k, bf({7, 2, 64}), o, i32(cu), i32(cu));
      },
      "v has shape [7, 2, 64]");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(q, k, v, bf({8, 4, 32}), i32(cu), i32(cu));
      },
      "out has shape [8, 4, 32]; allowed: [Tq, Hq, Dv] = [8, 4, 64]");
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu_bad0), i32(cu)); },
                       "cu_seqlens_q[0]=1; allowed: 0");
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu_desc)); },
                       "cu_seqlens_k[2]=4 < cu_seqlens_k[1]=6");
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu_short), i32(cu)); },
                       "cu_seqlens_q[2]=7; allowed: the token count 8");
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu3), i32(cu)); },
                       "cu_seqlens_q has 4 entries, cu_seqlens_k 3");
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu_k_small)); },
                       "sequence 0 has 4 queries and 2 keys; allowed: queries <= keys");
  AttentionOptions opt;
  opt.sinks = TensorView(f.data(), DType::f32, {3});
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu), opt); },
                       "sinks has shape [3]; allowed: [Hq] = [4]");
  opt = {};
  opt.alibi_slopes = TensorView(buf.data(), DType::f16, {4});
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu), opt); },
                       "alibi_slopes.dtype=f16 is not allowed; allowed: f32, bf16");
  opt = {};
  opt.window_left = -5;
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu), opt); },
                       "window_left=-5");
  opt = {};
  opt.softcap = -1;
  expect_tilejit_error([&] { flash_attn_varlen(q, k, v, o, i32(cu), i32(cu), opt); }, "softcap=-1");
  expect_tilejit_error(
      [&] {
        flash_attn_varlen(TensorView(buf.data(), DType::bf16, {8, 4, 64}, {256, 64, 2}), k, v, o,
                          i32(cu), i32(cu));
      },
      "q has strides [256, 64, 2]; allowed: innermost stride 1");
}

TEST(AttentionErrors, Decode) {
  const int64_t nb = 4, bs = 16;
  GuardedBuffer kc(nb * bs * 2 * 64 * 2), vc(nb * bs * 2 * 64 * 2);
  std::vector<uint16_t> qb(2 * 4 * 64, 0), ob(2 * 4 * 64, 0);
  std::vector<int32_t> table = {0, 1, 2, 3}, lens = {20, 5};
  const TensorView q(qb.data(), DType::bf16, {2, 4, 64}), o(ob.data(), DType::bf16, {2, 4, 64});
  const TensorView k(kc.as<uint16_t>(), DType::bf16, {nb, bs, 2, 64}),
      v(vc.as<uint16_t>(), DType::bf16, {nb, bs, 2, 64});
  auto tab = [&] { return TensorView(table.data(), DType::i32, {2, 2}); };
  auto sl = [&] { return TensorView(lens.data(), DType::i32, {2}); };
  decode_attention(q, k, v, o, tab(), sl());  // valid baseline

  expect_tilejit_error(
      [&] {
        decode_attention(q, k, v, o, TensorView(table.data(), DType::f32, {2, 2}), sl());
      },
      "block_table.dtype=f32 is not allowed; allowed: i32");
  expect_tilejit_error(
      [&] { decode_attention(q, k, v, o, tab(), TensorView(lens.data(), DType::f32, {2})); },
      "seq_lens.dtype=f32");
  // Any block size >= 1 is a cache layout (24: two blocks of 24 hold 48 keys).
  std::vector<int32_t> table24 = {1, 9, 0, 9};  // entries past a sequence's length: unused
  decode_attention(q, TensorView(kc.as<uint16_t>(), DType::bf16, {2, 24, 2, 64}),
                   TensorView(vc.as<uint16_t>(), DType::bf16, {2, 24, 2, 64}), o,
                   TensorView(table24.data(), DType::i32, {2, 2}), sl());
  expect_tilejit_error(
      [&] {
        decode_attention(q, TensorView(kc.as<uint16_t>(), DType::bf16, {nb, 0, 2, 64}),
                         TensorView(vc.as<uint16_t>(), DType::bf16, {nb, 0, 2, 64}), o, tab(),
                         sl());
      },
      "decode_attention: block_size=0 (k_cache.shape[1]); allowed: >= 1");
  // Odd head sizes are refused on every path (the kernels contract k-pairs).
  std::vector<uint16_t> q_odd(2 * 4 * 63, 0), o_odd(2 * 4 * 63, 0);
  expect_tilejit_error(
      [&] {
        decode_attention(TensorView(q_odd.data(), DType::bf16, {2, 4, 63}),
                         TensorView(kc.as<uint16_t>(), DType::bf16, {nb, bs, 2, 63}),
                         TensorView(vc.as<uint16_t>(), DType::bf16, {nb, bs, 2, 63}),
                         TensorView(o_odd.data(), DType::bf16, {2, 4, 63}), tab(), sl());
      },
      "decode_attention: D (q.shape[2])=63; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        decode_attention(q, k, TensorView(vc.as<uint16_t>(), DType::bf16, {nb, bs, 1, 64}), o,
                         tab(), sl());
      },
      "v_cache has shape [4, 16, 1, 64]");
  expect_tilejit_error(
      [&] {
        decode_attention(q, k, v, TensorView(ob.data(), DType::bf16, {2, 4, 32}), tab(), sl());
      },
      "out has shape [2, 4, 32]");
  lens = {33, 5};
  expect_tilejit_error([&] { decode_attention(q, k, v, o, tab(), sl()); },
                       "seq_lens[0]=33; allowed: 1 .. max_blocks·block_size = 32");
  lens = {20, 0};
  expect_tilejit_error([&] { decode_attention(q, k, v, o, tab(), sl()); }, "seq_lens[1]=0");
  lens = {20, 5};
  // An out-of-range block index raises before any key is read: block 4 would
  // start past the end of k_cache, inside the guard page.
  table = {0, 4, 2, 3};
  expect_tilejit_error([&] { decode_attention(q, k, v, o, tab(), sl()); },
                       "block_table[0, 1]=4; allowed: [0, num_blocks) = [0, 4)");
  table = {0, 1, -1, 3};
  expect_tilejit_error([&] { decode_attention(q, k, v, o, tab(), sl()); }, "block_table[1, 0]=-1");
  // Entries past a sequence's length are never used, so they are not checked.
  table = {0, 1, 2, 999};
  decode_attention(q, k, v, o, tab(), sl());
}

TEST(AttentionErrors, StoreKv) {
  std::vector<uint16_t> buf(4 * 16 * 2 * 64, 0);
  std::vector<int32_t> slots = {0, 1};
  const TensorView k(buf.data(), DType::bf16, {2, 2, 64}),
      kc(buf.data(), DType::bf16, {4, 16, 2, 64});
  expect_tilejit_error([&] { store_kv(k, k, kc, kc, TensorView(slots.data(), DType::f32, {2})); },
                       "slot_mapping.dtype=f32 is not allowed; allowed: i32");
  // Three slots for two rows: the message names where T came from.
  std::vector<uint16_t> out(4 * 16 * 2 * 64);
  std::vector<int32_t> three = {0, 1, 2};
  expect_tilejit_error(
      [&] {
        store_kv(k, k, TensorView(out.data(), DType::bf16, {4, 16, 2, 64}),
                 TensorView(out.data(), DType::bf16, {4, 16, 2, 64}),
                 TensorView(three.data(), DType::i32, {3}));
      },
      "store_kv: k has shape [2, 2, 64]; allowed: [T, Hkv, ·] = [3, 2, ·] (T = slot_mapping's "
      "length 3");
  expect_tilejit_error(
      [&] {
        store_kv(k, k, TensorView(buf.data(), DType::bf16, {4, 16, 2, 32}), kc,
                 TensorView(slots.data(), DType::i32, {2}));
      },
      "k_cache has shape [4, 16, 2, 32]");
  expect_tilejit_error(
      [&] {
        store_kv(TensorView(buf.data(), DType::bf16, {3, 2, 64}), k, kc, kc,
                 TensorView(slots.data(), DType::i32, {2}));
      },
      "k has shape [3, 2, 64]");
}

// ---------------------------------------------------------------------------
// store_kv with int64 slot_mapping (vLLM's dtype)

struct StoreKvCase {
  static constexpr int64_t t = 6, hkv = 2, d = 32, dv = 16, nb = 3, bs = 16;
  std::vector<uint16_t> k = random_bf16(t * hkv * d, 11), v = random_bf16(t * hkv * dv, 12);
  std::vector<uint16_t> kc = std::vector<uint16_t>(nb * bs * hkv * d, 0),
                        vc = std::vector<uint16_t>(nb * bs * hkv * dv, 0);
  TensorView kt{k.data(), DType::bf16, {t, hkv, d}}, vt{v.data(), DType::bf16, {t, hkv, dv}};
  TensorView kct{kc.data(), DType::bf16, {nb, bs, hkv, d}},
      vct{vc.data(), DType::bf16, {nb, bs, hkv, dv}};
};

// The same scatter as int32, from a strided int64 table; every negative
// value skips its token, however large (vLLM pads with -1).
TEST(StoreKvInt64, ScattersLikeInt32AndSkipsNegative) {
  const std::vector<int64_t> slots = {47, 0, -1, 17, -(int64_t{1} << 40), 33};
  StoreKvCase a, b;
  std::vector<int32_t> s32;
  for (int64_t s : slots) s32.push_back(s < 0 ? -1 : static_cast<int32_t>(s));
  store_kv(a.kt, a.vt, a.kct, a.vct, TensorView(s32.data(), DType::i32, {a.t}));
  // Every other element of a [2T] buffer: the stride is in int64 elements.
  std::vector<int64_t> strided(2 * slots.size(), int64_t{1} << 50);
  for (size_t i = 0; i < slots.size(); ++i) strided[2 * i] = slots[i];
  store_kv(b.kt, b.vt, b.kct, b.vct, TensorView(strided.data(), DType::i64, {b.t}, {2}));
  EXPECT_EQ(a.kc, b.kc);
  EXPECT_EQ(a.vc, b.vc);
  // And the int32 result is the scatter itself: token 3 sits in slot 17.
  for (int64_t h = 0; h < a.hkv; ++h)
    for (int64_t c = 0; c < a.d; ++c)
      ASSERT_EQ(b.kc[(17 * a.hkv + h) * a.d + c], b.k[(3 * a.hkv + h) * a.d + c]);
  int64_t filled = 0;
  for (int64_t s = 0; s < a.nb * a.bs; ++s)
    filled += std::any_of(b.kc.begin() + s * a.hkv * a.d, b.kc.begin() + (s + 1) * a.hkv * a.d,
                          [](uint16_t x) { return x != 0; });
  EXPECT_EQ(filled, 4);
}

// A slot past the cache is rejected over the full int64 range (2^32 + 1 would
// be slot 1 if truncated to int32), before any row is written.
TEST(StoreKvInt64, RejectsOutOfRangeBeforeWriting) {
  for (int64_t bad : {int64_t{48}, int64_t{1} << 40, (int64_t{1} << 32) + 1, int64_t{INT64_MAX}}) {
    StoreKvCase c;
    std::vector<int64_t> slots = {0, 1, 2, 3, 4, bad};
    try {
      store_kv(c.kt, c.vt, c.kct, c.vct, TensorView(slots.data(), DType::i64, {c.t}));
      ADD_FAILURE() << "slot " << bad << ": expected Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("slot_mapping[5]=" + std::to_string(bad) +
                                           "; allowed: < num_blocks·block_size = 48"),
                std::string::npos)
          << e.what();
    }
    EXPECT_TRUE(std::all_of(c.kc.begin(), c.kc.end(), [](uint16_t x) { return x == 0; }))
        << "slot " << bad << ": k_cache written before the check";
    EXPECT_TRUE(std::all_of(c.vc.begin(), c.vc.end(), [](uint16_t x) { return x == 0; }));
  }
  std::vector<uint8_t> u8(StoreKvCase::t);
  StoreKvCase c;
  expect_tilejit_error(
      [&] { store_kv(c.kt, c.vt, c.kct, c.vct, TensorView(u8.data(), DType::u8, {c.t})); },
      "slot_mapping.dtype=u8 is not allowed; allowed: i32, i64");
}

}  // namespace
}  // namespace tilejit::test
