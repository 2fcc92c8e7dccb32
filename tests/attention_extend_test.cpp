// extend_attention against the double-precision reference
// (runtime/reference_attention.h), on the active ISA path.
//
// The reference is composed per sequence: without a tree mask, the n new
// queries over the prefix_len + n keys (prefix from the cache, then the new
// keys) are a causal, bottom-right aligned head, so new token i sits at
// position prefix_len + i. With a tree mask, each query row runs alone over
// the list of keys it may see (the window applied when building the list).
// Error bound as in attention_test.cpp: |out − ref| ≤ 2⁻⁷·max|v| + 2⁻⁸·|ref|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "runtime/isa.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "test_util.h"
#include "tilejit/tilejit.h"
#include "tuned_entry.h"

namespace tilejit::test {
namespace {

enum class Mask { none, tree, arbitrary };

struct Extend {
  std::vector<int64_t> prefix, n_new;  // per sequence
  int64_t hq = 8, hkv = 2, d = 128, dv = 128, bs = 16;
  bool in_cache = false;   // k_new / v_new absent: the new K/V sit in the cache after the prefix
  bool fused_new = false;  // k_new / v_new as column views of one [T, 2·Hkv·D] buffer
  Mask mask = Mask::none;
  bool deterministic = false;
  AttentionOptions opt;
  std::vector<float> sinks, slopes;
};

// The bound above (runtime/reference_error_bounds.h).
double tolerance(double max_v, double ref) {
  return runtime::attention_output_bound(max_v, ref);
}

// EAGLE-style tree: token i's parent is an earlier token (token 0 the root);
// i sees its ancestors and itself. "arbitrary" also lets tokens see later
// ones and leaves some rows blind to every new token (and every other
// one-token sequence blind to itself).
std::vector<uint8_t> make_mask(Mask kind, const std::vector<int64_t>& n_new, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> m;
  int64_t one_token = 0;
  for (int64_t n : n_new) {
    std::vector<uint8_t> blk(static_cast<size_t>(n * n), 0);
    // A one-token sequence sees itself, or (every other one) only its prefix.
    if (kind == Mask::arbitrary && n == 1) {
      blk[0] = one_token++ % 2 == 0;
      m.push_back(blk[0]);
      continue;
    }
    if (kind == Mask::tree) {
      std::vector<int64_t> parent(static_cast<size_t>(n), -1);
      for (int64_t i = 1; i < n; ++i) parent[i] = static_cast<int64_t>(rng() % i);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t a = i; a >= 0; a = parent[a]) blk[i * n + a] = 1;
    } else {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) blk[i * n + j] = (i % 5 != 3) && rng() % 3 == 0;
    }
    m.insert(m.end(), blk.begin(), blk.end());
  }
  return m;
}

// Runs extend_attention with the given thread count; checks it against the
// reference; returns the output.
std::vector<uint16_t> run_extend(const Extend& pr, int threads) {
  const int64_t b = static_cast<int64_t>(pr.prefix.size()), hq = pr.hq, hkv = pr.hkv, d = pr.d,
                dv = pr.dv, bs = pr.bs;
  std::vector<int32_t> qo(static_cast<size_t>(b + 1), 0), pre32;
  for (int64_t s = 0; s < b; ++s) qo[s + 1] = static_cast<int32_t>(qo[s] + pr.n_new[s]);
  const int64_t tokens = qo[b];
  // Cached keys per sequence; the cache mode holds the new tokens too.
  std::vector<int64_t> cached(static_cast<size_t>(b));
  int64_t max_blocks = 1, used = 0;
  for (int64_t s = 0; s < b; ++s) {
    cached[s] = pr.prefix[s] + (pr.in_cache ? pr.n_new[s] : 0);
    max_blocks = std::max(max_blocks, (cached[s] + bs - 1) / bs);
    used += (cached[s] + bs - 1) / bs;
    pre32.push_back(static_cast<int32_t>(pr.prefix[s]));
  }
  const int64_t num_blocks = used + 2;
  const uint32_t seed =
      seed_of({b, hq, hkv, d, dv, bs, pr.in_cache, static_cast<int64_t>(pr.mask), tokens});
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> table(static_cast<size_t>(b * max_blocks), -1);
  int64_t next = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = 0; i < (cached[s] + bs - 1) / bs; ++i)
      table[s * max_blocks + i] = perm[next++];

  auto fill = [](uint16_t* p, int64_t n, uint32_t sd, float a) {
    const auto r = random_bf16(static_cast<size_t>(n), sd, -a, a);
    std::copy(r.begin(), r.end(), p);
  };
  // Guarded: a read past the end of the cache or of the new rows faults.
  GuardedBuffer kc(num_blocks * bs * hkv * d * 2), vc(num_blocks * bs * hkv * dv * 2);
  fill(kc.as<uint16_t>(), num_blocks * bs * hkv * d, seed, 2);
  fill(vc.as<uint16_t>(), num_blocks * bs * hkv * dv, seed + 1, 1);
  const TensorView k_cache(kc.as<uint16_t>(), DType::bf16, {num_blocks, bs, hkv, d});
  const TensorView v_cache(vc.as<uint16_t>(), DType::bf16, {num_blocks, bs, hkv, dv});
  const int64_t new_w = pr.fused_new ? hkv * (d + dv) : 0;
  GuardedBuffer nb(std::max<int64_t>(1, pr.fused_new ? tokens * new_w : tokens * hkv * (d + dv)) *
                   2);
  TensorView k_new, v_new;
  {
    auto* base = nb.as<uint16_t>();
    fill(base, std::max<int64_t>(1, tokens * hkv * (d + dv)), seed + 2, 2);
    if (pr.fused_new) {
      k_new = TensorView(base, DType::bf16, {tokens, hkv, d}, {new_w, d, 1});
      v_new = TensorView(base + hkv * d, DType::bf16, {tokens, hkv, dv}, {new_w, dv, 1});
    } else {
      k_new = TensorView(base, DType::bf16, {tokens, hkv, d});
      v_new = TensorView(base + tokens * hkv * d, DType::bf16, {tokens, hkv, dv});
    }
  }
  const auto qv =
      random_bf16(static_cast<size_t>(std::max<int64_t>(1, tokens * hq * d)), seed + 3, -2, 2);
  std::vector<uint16_t> out(static_cast<size_t>(std::max<int64_t>(1, tokens * hq * dv)), 0x7fc0);
  std::vector<uint8_t> mask;
  ExtendOptions ext;
  ext.deterministic = pr.deterministic;
  if (!pr.in_cache) ext.k_new = k_new, ext.v_new = v_new;
  if (pr.mask != Mask::none) {
    mask = make_mask(pr.mask, pr.n_new, seed + 4);
    ext.tree_mask = TensorView(mask.data(), DType::u8, {static_cast<int64_t>(mask.size())});
  }
  AttentionOptions opt = pr.opt;
  if (!pr.sinks.empty()) opt.sinks = TensorView(pr.sinks.data(), DType::f32, {hq});
  if (!pr.slopes.empty()) opt.alibi_slopes = TensorView(pr.slopes.data(), DType::f32, {hq});
  const int saved = num_threads();
  set_num_threads(threads);
  extend_attention(TensorView(qv.data(), DType::bf16, {tokens, hq, d}), k_cache, v_cache,
                   TensorView(out.data(), DType::bf16, {tokens, hq, dv}),
                   TensorView(qo.data(), DType::i32, {b + 1}),
                   TensorView(table.data(), DType::i32, {b, max_blocks}),
                   TensorView(pre32.data(), DType::i32, {b}), opt, ext);
  set_num_threads(saved);

  auto at = [](const TensorView& t, const int64_t* idx, int64_t rank) {
    int64_t off = 0;
    for (int64_t i = 0; i < rank; ++i) off += idx[i] * t.strides[i];
    return double(bf16_to_f32(static_cast<const uint16_t*>(t.data)[off]));
  };
  // Key/value j (position) of sequence s, kv head h.
  auto kv_at = [&](bool is_v, int64_t s, int64_t j, int64_t h, int64_t c) {
    if (j < cached[s]) {
      const int64_t idx[4] = {table[s * max_blocks + j / bs], j % bs, h, c};
      return at(is_v ? v_cache : k_cache, idx, 4);
    }
    const int64_t idx[3] = {qo[s] + j - pr.prefix[s], h, c};
    return at(is_v ? v_new : k_new, idx, 3);
  };
  double max_v = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t j = 0; j < pr.prefix[s] + pr.n_new[s]; ++j)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < dv; ++c)
          max_v = std::max(max_v, std::fabs(kv_at(true, s, j, h, c)));

  const int64_t g = hq / hkv;
  int64_t checked = 0;
  for (int64_t s = 0; s < b; ++s) {
    const int64_t n = pr.n_new[s], pre = pr.prefix[s];
    int64_t moff = 0;
    for (int64_t t = 0; t < s; ++t) moff += pr.n_new[t] * pr.n_new[t];
    for (int64_t h = 0; h < hq; ++h) {
      runtime::ReferenceAttentionHead rh;
      rh.d = d;
      rh.dv = dv;
      rh.sm_scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(double(d));
      rh.softcap = opt.softcap;
      rh.has_sink = !pr.sinks.empty();
      if (rh.has_sink) rh.sink = pr.sinks[h];
      auto q_at = [&](int64_t i, int64_t c) {
        return double(bf16_to_f32(qv[((qo[s] + i) * hq + h) * d + c]));
      };
      auto compare = [&](int64_t i, int64_t c, double ref) {
        const double got = bf16_to_f32(out[((qo[s] + i) * hq + h) * dv + c]);
        ++checked;
        ASSERT_LE(std::fabs(got - ref), tolerance(max_v, ref))
            << "seq " << s << " head " << h << " new token " << i << " col " << c << ": got " << got
            << " want " << ref;
      };
      if (pr.mask == Mask::none) {
        rh.tq = n;
        rh.tk = pre + n;
        rh.causal = true;
        rh.window_left = opt.window_left;
        rh.window_right = opt.window_right;
        if (!pr.slopes.empty()) rh.alibi_slope = pr.slopes[h];
        rh.q_at = q_at;
        rh.k_at = [&](int64_t j, int64_t c) { return kv_at(false, s, j, h / g, c); };
        rh.v_at = [&](int64_t j, int64_t c) { return kv_at(true, s, j, h / g, c); };
        rh.out = compare;
        runtime::reference_attention_head(rh);
      } else {
        EXPECT_TRUE(pr.slopes.empty()) << "the composed tree reference has no ALiBi";
        for (int64_t i = 0; i < n; ++i) {
          const int64_t pos = pre + i;
          std::vector<int64_t> keys;
          for (int64_t j = 0; j < pre + n; ++j) {
            if (opt.window_left >= 0 && j < pos - opt.window_left) continue;
            if (opt.window_right >= 0 && j > pos + opt.window_right) continue;
            if (j >= pre && mask[moff + i * n + (j - pre)] == 0) continue;
            keys.push_back(j);
          }
          rh.tq = 1;
          rh.tk = static_cast<int64_t>(keys.size());
          rh.causal = false;
          rh.q_at = [&](int64_t, int64_t c) { return q_at(i, c); };
          rh.k_at = [&](int64_t j, int64_t c) { return kv_at(false, s, keys[j], h / g, c); };
          rh.v_at = [&](int64_t j, int64_t c) { return kv_at(true, s, keys[j], h / g, c); };
          rh.out = [&](int64_t, int64_t c, double ref) { compare(i, c, ref); };
          runtime::reference_attention_head(rh);
          if (::testing::Test::HasFatalFailure()) return out;
        }
      }
      if (::testing::Test::HasFatalFailure()) return out;
    }
  }
  EXPECT_GT(checked + (tokens == 0 ? 1 : 0), 0);
  return out;
}

class ExtendAttention : public IsaTest {};

TEST_F(ExtendAttention, BothKvModes) {
  for (bool in_cache : {false, true}) {
    for (int64_t bs : {16, 64}) {
      SCOPED_TRACE(std::string(in_cache ? "kv in cache" : "k_new/v_new") +
                   " block_size=" + std::to_string(bs));
      Extend pr;
      pr.prefix = {0, 5, 100, 700, 16, 3};
      pr.n_new = {9, 1, 64, 70, 0, 17};
      pr.bs = bs;
      pr.in_cache = in_cache;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(ExtendAttention, HeadDimsAndGroups) {
  for (auto [hq, hkv, d, dv] : {std::tuple<int64_t, int64_t, int64_t, int64_t>{4, 4, 64, 64},
                                {16, 1, 96, 48},
                                {32, 4, 80, 80},
                                {8, 1, 576, 512}}) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE("Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv) +
                   " D=" + std::to_string(d) + " Dv=" + std::to_string(dv) +
                   " in_cache=" + std::to_string(in_cache));
      Extend pr;
      pr.prefix = {40, 130};
      pr.n_new = {3, 20};
      pr.hq = hq, pr.hkv = hkv, pr.d = d, pr.dv = dv, pr.bs = 32;
      pr.in_cache = in_cache;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

// Any block size (1: sglang's token-granular cache), both K/V modes, with
// head sizes that are not multiples of 16 and D ≠ Dv: the prefix rows are
// scattered over the blocks and gathered per key block by the engine.
TEST_F(ExtendAttention, AnyBlockSizeAndHeadDimTails) {
  struct Case {
    int64_t hq, hkv, d, dv, bs;
  };
  for (const Case& c :
       {Case{8, 2, 128, 128, 1}, Case{8, 2, 64, 64, 3}, Case{8, 2, 128, 128, 8},
        Case{4, 2, 72, 72, 16}, Case{8, 1, 40, 40, 17}, Case{4, 1, 66, 66, 64}, Case{4, 2, 2, 2, 8},
        Case{4, 2, 72, 40, 1}, Case{4, 2, 258, 130, 17}, Case{16, 2, 80, 80, 3}}) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE("Hq=" + std::to_string(c.hq) + " Hkv=" + std::to_string(c.hkv) +
                   " D=" + std::to_string(c.d) + " Dv=" + std::to_string(c.dv) +
                   " bs=" + std::to_string(c.bs) + " in_cache=" + std::to_string(in_cache));
      Extend pr;
      pr.prefix = {0, 37, 150};
      pr.n_new = {5, 1, 20};
      pr.hq = c.hq, pr.hkv = c.hkv, pr.d = c.d, pr.dv = c.dv, pr.bs = c.bs;
      pr.in_cache = in_cache;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(ExtendAttention, SmallBlocksWithOptions) {
  for (int64_t bs : {1, 8}) {
    for (Mask kind : {Mask::none, Mask::tree}) {
      SCOPED_TRACE("bs=" + std::to_string(bs) + " tree=" + std::to_string(kind == Mask::tree));
      Extend pr;
      pr.prefix = {45, 300};
      pr.n_new = {20, 9};
      pr.hq = 4, pr.hkv = 2, pr.d = 72, pr.dv = 72, pr.bs = bs;
      pr.mask = kind;
      pr.opt.window_left = 50;
      pr.opt.softcap = 20.f;
      pr.sinks = {-1.f, 0.5f, 3.f, 40.f};
      if (kind == Mask::none) pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};  // (tree ref: no ALiBi)
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
      pr.in_cache = true;
      run_extend(pr, 8);  // split-KV over the scattered prefix
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(ExtendAttention, StridedNewKv) {
  Extend pr;
  pr.prefix = {20, 33};
  pr.n_new = {12, 40};
  pr.hq = 4, pr.hkv = 2, pr.d = 64, pr.dv = 64;
  pr.fused_new = true;
  run_extend(pr, 2);
}

TEST_F(ExtendAttention, Options) {
  struct Case {
    const char* name;
    int wl, wr;
    float softcap;
    bool sinks, alibi;
    std::optional<float> scale;
  };
  const Case cases[] = {
      {"window_left", 30, -1, 0, false, false, {}}, {"window_left0", 0, -1, 0, false, false, {}},
      {"softcap", -1, -1, 5.f, false, false, {}},   {"sinks", -1, -1, 0, true, false, {}},
      {"alibi", -1, -1, 0, false, true, {}},        {"all", 50, -1, 20.f, true, true, 0.3f},
  };
  for (const Case& c : cases) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE(std::string(c.name) + " in_cache=" + std::to_string(in_cache));
      Extend pr;
      pr.prefix = {0, 45, 300};
      pr.n_new = {5, 20, 66};
      pr.hq = 4, pr.hkv = 2, pr.d = 64, pr.dv = 64;
      pr.in_cache = in_cache;
      pr.opt.window_left = c.wl;
      pr.opt.window_right = c.wr;
      pr.opt.softcap = c.softcap;
      pr.opt.sm_scale = c.scale;
      if (c.sinks) pr.sinks = {-1.f, 0.5f, 3.f, 40.f};
      if (c.alibi) pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

// Scaled scores near ±1e10: one-hot rows over prefix and new keys, in both
// K/V modes (the softmax step Prefill.HugeAndNegativeScales covers; extend
// runs its cached keys and its new ones as two passes merged).
TEST_F(ExtendAttention, HugeAndNegativeScales) {
  for (const float scale : {1e10f, -1e10f}) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE(std::to_string(scale) + " in_cache=" + std::to_string(in_cache));
      Extend pr;
      pr.prefix = {0, 6};
      pr.n_new = {3, 4};
      pr.hq = 2, pr.hkv = 1, pr.d = 64, pr.dv = 32;
      pr.in_cache = in_cache;
      pr.opt.sm_scale = scale;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(ExtendAttention, TreeMask) {
  for (Mask kind : {Mask::tree, Mask::arbitrary}) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE(std::string(kind == Mask::tree ? "tree" : "arbitrary") +
                   " in_cache=" + std::to_string(in_cache));
      Extend pr;
      pr.prefix = {0, 37, 500};
      pr.n_new = {8, 16, 70};  // 70 draft tokens: the mask crosses a 64-key block
      pr.hq = 8, pr.hkv = 2, pr.d = 128, pr.dv = 128;
      pr.in_cache = in_cache;
      pr.mask = kind;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
      pr.opt.window_left = 40;
      pr.opt.softcap = 10;
      pr.sinks.assign(8, 0.5f);
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
    }
  }
}

// The deterministic mode gives the same bits on 1 and 2 threads (and more),
// on a shape where the default mode would split the prefix across threads.
TEST_F(ExtendAttention, DeterministicAcrossThreadCounts) {
  for (bool in_cache : {false, true}) {
    SCOPED_TRACE("in_cache=" + std::to_string(in_cache));
    Extend pr;
    pr.prefix = {3000};
    pr.n_new = {4};
    pr.hq = 4, pr.hkv = 1, pr.d = 128, pr.dv = 128, pr.bs = 64;
    pr.in_cache = in_cache;
    pr.deterministic = true;
    const auto one = run_extend(pr, 1);
    if (HasFatalFailure()) return;
    for (int threads : {2, 5}) {
      const auto many = run_extend(pr, threads);
      if (HasFatalFailure()) return;
      EXPECT_EQ(one, many) << "threads=" << threads;
    }
    pr.deterministic = false;  // split-KV: checked against the reference only
    run_extend(pr, 2);
    run_extend(pr, 8);
    if (HasFatalFailure()) return;
  }
}

// A tuned blocking and split count (docs/tuning.md) against the reference:
// key blocks of 32 .. 256 over aligned and 5-row cache blocks (the gathered
// K of a key block), tasks of 16 .. 64 rows, split-KV forced on (8 chunks,
// some of them empty) and off, K/V new or in the cache, options. Each entry
// is applied (counted); under `deterministic` it is not (its result must not
// depend on the thread count an entry is keyed by).
TEST_F(ExtendAttention, TunedBlockingAndSplits) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "the scalar path has no blocking to tune";
  struct Case {
    int64_t rows, key_block, splits, bs;
    bool in_cache, options;
  };
  const Case cases[] = {{16, 32, 3, 16, false, false},
                        {48, 256, 1, 5, true, false},
                        {32, 96, 8, 5, false, true},
                        {64, 160, 2, 16, true, true}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << ", key_block " << c.key_block
                                      << ", splits " << c.splits << ", block size " << c.bs);
    Extend pr;
    pr.prefix = {0, 5, 100, 700, 16, 3};
    pr.n_new = {9, 1, 64, 70, 0, 17};
    pr.hq = 4, pr.hkv = 2, pr.d = 72, pr.dv = 72, pr.bs = c.bs;
    pr.in_cache = c.in_cache;
    if (c.options) {
      pr.opt.window_left = 300;
      pr.opt.softcap = 20.f;
      pr.sinks = {-1.f, 0.5f, 3.f, 40.f};
      pr.slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    }
    const int threads = 2;
    const TunedEntryScope tuned(
        "extend_attention",
        jit::extend_shape_class(path, threads, pr.d, pr.dv, pr.hq, pr.hkv, pr.bs, DType::bf16, 6,
                                70, 770),
        {{"rows", c.rows}, {"key_block", c.key_block}, {"splits", c.splits}});
    uint64_t before = cache_stats().tuned_plans;
    run_extend(pr, threads);
    if (HasFatalFailure()) return;
    EXPECT_EQ(cache_stats().tuned_plans, before + 1) << "the entry was not applied";
    pr.deterministic = true;
    before = cache_stats().tuned_plans;
    run_extend(pr, threads);
    if (HasFatalFailure()) return;
    EXPECT_EQ(cache_stats().tuned_plans, before) << "applied under deterministic";
  }
}

// Sequences with one new token (an engine's decode tokens in a mixed batch)
// take decode's LLVM kernel on the paths that have it, the others the block
// engine: against the reference in both K/V modes (k_new: the kernel over
// the prefix, the token's own key folded in after), with the options, a
// 1×1 tree mask hiding or showing the token to itself, prefixes of 0 keys,
// under and across 16-key chunks and long enough to split, block sizes 1
// and 16, GQA up to 32 heads per kv head and MLA's 576/512, on 1, 2 and 8
// threads (8: split-KV over the one-token sequences).
TEST_F(ExtendAttention, OneTokenSequences) {
  struct Case {
    int64_t hq, hkv, d, dv, bs;
  };
  for (const Case& c : {Case{8, 2, 128, 128, 16}, Case{32, 1, 64, 64, 1}, Case{4, 2, 72, 40, 16},
                        Case{16, 1, 576, 512, 64}}) {
    for (bool in_cache : {false, true}) {
      SCOPED_TRACE(::testing::Message()
                   << "Hq " << c.hq << " Hkv " << c.hkv << " D " << c.d << " Dv " << c.dv << " bs "
                   << c.bs << " in_cache " << in_cache);
      Extend pr;
      pr.prefix = {0, 1, 15, 16, 17, 300, 40, 2100, 5};
      pr.n_new = {1, 1, 1, 1, 1, 1, 7, 1, 1};
      pr.hq = c.hq, pr.hkv = c.hkv, pr.d = c.d, pr.dv = c.dv, pr.bs = c.bs;
      pr.in_cache = in_cache;
      for (int threads : {1, 2, 8}) {
        run_extend(pr, threads);
        if (HasFatalFailure()) return;
      }
      if (c.d == 576) continue;  // options below on the smaller heads
      pr.opt.window_left = 200;
      pr.opt.softcap = 20.f;
      pr.opt.sm_scale = 0.3f;
      pr.sinks.assign(static_cast<size_t>(c.hq), 0.5f);
      pr.slopes.assign(static_cast<size_t>(c.hq), 0.125f);
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
      pr.opt.window_left = 0;  // the token sees itself only
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
      pr.opt = {};
      pr.slopes.clear();  // (the tree reference has no ALiBi)
      pr.mask = Mask::arbitrary;
      run_extend(pr, 2);
      if (HasFatalFailure()) return;
      run_extend(pr, 8);
      if (HasFatalFailure()) return;
    }
  }
}

// extend_attention with one new token and the K/V in the cache is decode.
TEST_F(ExtendAttention, SingleTokenMatchesDecode) {
  const int64_t hq = 8, hkv = 2, d = 64, bs = 16, nb = 8;
  const auto kc = random_bf16(nb * bs * hkv * d, 11, -2, 2),
             vc = random_bf16(nb * bs * hkv * d, 12);
  const auto q = random_bf16(2 * hq * d, 13, -2, 2);
  std::vector<int32_t> table = {3, 1, 6, 0, 2, 7, 5, 4}, qo = {0, 1, 2}, pre = {40, 9},
                       lens = {41, 10};
  const TensorView kt(kc.data(), DType::bf16, {nb, bs, hkv, d}),
      vt(vc.data(), DType::bf16, {nb, bs, hkv, d});
  std::vector<uint16_t> a(2 * hq * d), b(2 * hq * d);
  ExtendOptions ext;
  ext.deterministic = true;
  extend_attention(TensorView(q.data(), DType::bf16, {2, hq, d}), kt, vt,
                   TensorView(a.data(), DType::bf16, {2, hq, d}),
                   TensorView(qo.data(), DType::i32, {3}),
                   TensorView(table.data(), DType::i32, {2, 4}),
                   TensorView(pre.data(), DType::i32, {2}), {}, ext);
  const int saved = num_threads();
  set_num_threads(1);
  decode_attention(TensorView(q.data(), DType::bf16, {2, hq, d}), kt, vt,
                   TensorView(b.data(), DType::bf16, {2, hq, d}),
                   TensorView(table.data(), DType::i32, {2, 4}),
                   TensorView(lens.data(), DType::i32, {2}));
  set_num_threads(saved);
  // Where decode runs its LLVM kernel (a JIT path of an LLVM build), extend
  // runs one-token sequences on the same kernel over the same keys, unsplit:
  // the same bits. Elsewhere extend runs the block engine, decode its own
  // decode: the two sum in different orders, so they agree within the
  // attention bf16 tolerance of each against the reference (twice it).
#ifdef TILEJIT_HAVE_LLVM
  if (runtime::active_isa() != Isa::scalar) {
    EXPECT_EQ(a, b);
    return;
  }
#endif
  double vmax = 0;
  for (uint16_t v : vc) vmax = std::max(vmax, std::fabs(double(bf16_to_f32(v))));
  for (size_t i = 0; i < a.size(); ++i) {
    const double x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
    const double tol =
        2 * (std::ldexp(vmax, -7) + std::ldexp(std::max(std::fabs(x), std::fabs(y)), -8));
    ASSERT_LE(std::fabs(x - y), tol) << "element " << i;
  }
}

// ---------------------------------------------------------------------------
// Errors: each names the argument, the value and what is allowed, and is
// raised before any key is read.

TEST(ExtendAttentionErrors, BadInputs) {
  const int64_t nb = 4, bs = 16, hkv = 2, hq = 4, d = 64;
  GuardedBuffer kc(nb * bs * hkv * d * 2), vc(nb * bs * hkv * d * 2);
  std::vector<uint16_t> qb(8 * hq * d, 0), ob(8 * hq * d, 0), nbuf(8 * hkv * d, 0);
  std::vector<int32_t> table = {0, 1, 2, 3}, qo = {0, 3, 8}, pre = {20, 5};
  std::vector<uint8_t> mask(9 + 25, 1);
  const TensorView q(qb.data(), DType::bf16, {8, hq, d}), o(ob.data(), DType::bf16, {8, hq, d});
  const TensorView k(kc.as<uint16_t>(), DType::bf16, {nb, bs, hkv, d}),
      v(vc.as<uint16_t>(), DType::bf16, {nb, bs, hkv, d});
  const TensorView kn(nbuf.data(), DType::bf16, {8, hkv, d});
  auto tab = [&] { return TensorView(table.data(), DType::i32, {2, 2}); };
  auto qoi = [&] { return TensorView(qo.data(), DType::i32, {3}); };
  auto pl = [&] { return TensorView(pre.data(), DType::i32, {2}); };
  ExtendOptions sep;
  sep.k_new = kn, sep.v_new = kn;
  extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep);  // valid baseline
  extend_attention(q, k, v, o, qoi(), tab(), pl());           // kv in cache: 23 and 10 keys

  qo = {0, 5, 3};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep); },
                       "qo_indptr[2]=3 < qo_indptr[1]=5; allowed: non-decreasing");
  qo = {0, 3, 7};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep); },
                       "qo_indptr[2]=7; allowed: the token count 8");
  qo = {0, 3, 8};
  expect_tilejit_error(
      [&] {
        extend_attention(q, k, v, o, qoi(), tab(), TensorView(pre.data(), DType::i32, {1}), {},
                         sep);
      },
      "prefix_lens has shape [1]; allowed: [B] = [2]");
  expect_tilejit_error(
      [&] {
        extend_attention(q, k, v, o, qoi(), TensorView(table.data(), DType::i32, {1, 4}), pl(), {},
                         sep);
      },
      "block_table has shape [1, 4]; allowed: [B, max_blocks] with B = 2");
  pre = {-1, 5};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep); },
                       "prefix_lens[0]=-1; allowed: >= 0");
  pre = {33, 5};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep); },
                       "prefix_lens[0]=33; allowed: <= max_blocks·block_size = 32");
  // Cache mode: the new tokens must fit after the prefix.
  pre = {30, 5};
  expect_tilejit_error(
      [&] { extend_attention(q, k, v, o, qoi(), tab(), pl()); },
      "prefix_lens[0] + new tokens = 30 + 3 = 33; allowed: <= max_blocks·block_size = 32");
  extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep);  // fine with k_new / v_new
  pre = {20, 5};
  // Block 4 would start past the end of the cache, inside the guard page.
  table = {0, 4, 2, 3};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep); },
                       "block_table[0, 1]=4; allowed: [0, num_blocks) = [0, 4)");
  table = {0, 1, 2, 3};
  // Separate mode reads only the prefix's blocks: sequence 1 (5 keys) uses one.
  table = {0, 1, 2, -7};
  extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, sep);
  pre = {20, 20};
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl()); },
                       "block_table[1, 1]=-7");
  pre = {20, 5};
  table = {0, 1, 2, 3};

  ExtendOptions half;
  half.k_new = kn;
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, half); },
                       "k_new is given, v_new is absent; allowed: both given or both absent");
  ExtendOptions bad_new = sep;
  bad_new.v_new = TensorView(nbuf.data(), DType::bf16, {7, hkv, d});
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, bad_new); },
                       "v_new has shape [7, 2, 64]; allowed: [T, Hkv, 64] = [8, 2, 64]");
  ExtendOptions m = sep;
  m.tree_mask = TensorView(mask.data(), DType::u8, {33});
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, m); },
                       "tree_mask has shape [33]; allowed: [Σ n_b²] = [34]");
  m.tree_mask = TensorView(mask.data(), DType::i32, {8});
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, m); },
                       "tree_mask.dtype=i32 is not allowed; allowed: u8");
  m.tree_mask = TensorView(mask.data(), DType::u8, {34});
  extend_attention(q, k, v, o, qoi(), tab(), pl(), {}, m);
  expect_tilejit_error(
      [&] {
        extend_attention(q, k, v, TensorView(ob.data(), DType::bf16, {8, hq, 32}), qoi(), tab(),
                         pl(), {}, sep);
      },
      "out has shape [8, 4, 32]; allowed: [T, Hq, Dv] = [8, 4, 64]");
  expect_tilejit_error(
      [&] {
        extend_attention(TensorView(qb.data(), DType::bf16, {8, 3, d}), k, v,
                         TensorView(ob.data(), DType::bf16, {8, 3, d}), qoi(), tab(), pl(), {},
                         sep);
      },
      "Hq=3 (q) and Hkv=2 (k_cache); allowed: Hq a multiple of Hkv");
  AttentionOptions opt;
  opt.window_left = -3;
  expect_tilejit_error([&] { extend_attention(q, k, v, o, qoi(), tab(), pl(), opt, sep); },
                       "window_left=-3");
  expect_tilejit_error(
      [&] {
        extend_attention(q, TensorView(kc.as<uint16_t>(), DType::bf16, {nb, 0, hkv, d}),
                         TensorView(vc.as<uint16_t>(), DType::bf16, {nb, 0, hkv, d}), o, qoi(),
                         tab(), pl(), {}, sep);
      },
      "extend_attention: block_size=0 (k_cache.shape[1]); allowed: >= 1");
  // Odd head sizes are refused on every path; even ones that are not
  // multiples of 16 are accepted (v_new checked against Dv = 62).
  expect_tilejit_error(
      [&] {
        extend_attention(q, k, TensorView(vc.as<uint16_t>(), DType::bf16, {nb, bs, hkv, 31}),
                         TensorView(ob.data(), DType::bf16, {8, hq, 31}), qoi(), tab(), pl());
      },
      "extend_attention: Dv (v_cache.shape[3])=31; allowed: an even size in [2, 576]");
  expect_tilejit_error(
      [&] {
        extend_attention(q, k, TensorView(vc.as<uint16_t>(), DType::bf16, {nb, bs, hkv, 62}),
                         TensorView(ob.data(), DType::bf16, {8, hq, 62}), qoi(), tab(), pl(), {},
                         sep);
      },
      "v_new has shape [8, 2, 64]; allowed: [T, Hkv, 62] = [8, 2, 62]");
}

}  // namespace
}  // namespace tilejit::test
