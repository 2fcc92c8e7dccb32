// The fp8 KV caches (e4m3 and e5m2, KvCacheScales): store_kv's quantization,
// and decode_attention / extend_attention over an f8e4m3 or f8e5m2 cache
// against the
// double-precision reference (runtime/reference_attention.h) computed on the
// dequantized values code · scale, on the active ISA path.
//
// Error bound: the bf16 cache's, |out − ref| ≤ 2⁻⁷·max|v| + 2⁻⁸·|ref|
// (runtime::attention_output_bound), with max|v| over the dequantized V.
// Every e4m3 and e5m2 value is a bf16 number, so the kernels read K and V exactly
// (the LLVM decode kernel converts the codes in registers, the other paths
// convert the blocks to an exact bf16 copy); the scales are applied in fp32
// (the K scale folded into the score scale, the V scale into O), a relative
// error of ~2⁻²³ next to the bound's 2⁻⁹ terms. So nothing in the fp8 path
// widens the bf16 cache's bound, and a kernel that reads one wrong code,
// drops a scale or applies it twice fails it.
//
// The decoded values come from the formats' bit fields here (e4m3_value,
// e5m2_value), not from the library's conversion.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include <xmmintrin.h>

#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

// e4m3 ("fn"): sign, 4 exponent bits (bias 7), 3 mantissa bits, S.1111.111 NaN.
double e4m3_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::nan("");
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return s ? -mag : mag;
}

// e5m2: sign, 5 exponent bits (bias 15), 2 mantissa bits; S.11111.00 ±Inf,
// S.11111.{01,10,11} NaN (IEEE-like: the top byte of an f16).
double e5m2_value(uint8_t c) {
  const int s = c >> 7, e = (c >> 2) & 31, m = c & 3;
  if (e == 31) return m ? std::nan("") : (s ? -INFINITY : INFINITY);
  const double mag = e == 0 ? std::ldexp(m, -16) : std::ldexp(4 + m, e - 17);
  return s ? -mag : mag;
}

double code_value(DType code, uint8_t c) {
  return code == DType::f8e5m2 ? e5m2_value(c) : e4m3_value(c);
}

// Random finite codes, each equally likely (e4m3: all but the two NaNs;
// e5m2: all but the Inf and NaN codes S.11111.xx).
std::vector<uint8_t> random_codes(size_t n, uint32_t seed, DType code = DType::f8e4m3) {
  std::vector<uint8_t> finite;
  for (int c = 0; c < 256; ++c)
    if (std::isfinite(code_value(code, static_cast<uint8_t>(c))))
      finite.push_back(static_cast<uint8_t>(c));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> d(0, finite.size() - 1);
  std::vector<uint8_t> v(n);
  for (auto& c : v) c = finite[d(rng)];
  return v;
}

// ---------------------------------------------------------------------------
// store_kv

TEST(Fp8StoreKv, EveryCodeRoundTripsAndTiesGoToEven) {
  // Every finite code's value, times the scale, is stored as that code.
  const int64_t hkv = 2, d = 128, bs = 4;
  const float scale = 0.5f;  // a power of two: value · scale is exact in bf16
  std::vector<uint16_t> k(static_cast<size_t>(2 * hkv * d)), v(k.size());
  for (int64_t i = 0; i < 2 * hkv * d; ++i) {
    const uint8_t c = static_cast<uint8_t>(i % 256);
    const bool nan = (c & 0x7f) == 0x7f;
    k[i] = f32_to_bf16(nan ? 0.0f : static_cast<float>(e4m3_value(c) * scale));
    // Midpoints between neighbouring positive codes 8 .. 0x7D: ties to even.
    const int lo = 8 + static_cast<int>(i % 117);
    const double mid =
        (e4m3_value(static_cast<uint8_t>(lo)) + e4m3_value(static_cast<uint8_t>(lo + 1))) / 2;
    v[i] = f32_to_bf16(static_cast<float>(mid));
  }
  std::vector<uint8_t> kc(static_cast<size_t>(bs * hkv * d), 0xAA), vc(kc.size(), 0xAA);
  const std::vector<int32_t> slots = {1, 3};
  KvCacheScales s;
  s.k_scale = scale;
  store_kv(TensorView(k.data(), DType::bf16, {2, hkv, d}),
           TensorView(v.data(), DType::bf16, {2, hkv, d}),
           TensorView(kc.data(), DType::f8e4m3, {1, bs, hkv, d}),
           TensorView(vc.data(), DType::f8e4m3, {1, bs, hkv, d}),
           TensorView(slots.data(), DType::i32, {2}), s);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t e = 0; e < hkv * d; ++e) {
      const int64_t i = t * hkv * d + e;
      const uint8_t c = static_cast<uint8_t>(i % 256);
      const uint8_t got = kc[slots[t] * hkv * d + e];
      if ((c & 0x7f) == 0x7f)
        EXPECT_EQ(got & 0x7f, 0) << i;  // stored 0 (±0)
      else
        EXPECT_EQ(got, c) << "code " << int(c);
      const int lo = 8 + static_cast<int>(i % 117);
      // The midpoint is exact in bf16 (4 significant bits); even code wins.
      EXPECT_EQ(vc[slots[t] * hkv * d + e], lo % 2 == 0 ? lo : lo + 1) << "tie " << lo;
    }
  // Slots 0 and 2 untouched.
  for (int64_t e = 0; e < hkv * d; ++e) {
    EXPECT_EQ(kc[e], 0xAA);
    EXPECT_EQ(kc[2 * hkv * d + e], 0xAA);
  }
}

TEST(Fp8StoreKv, SaturatesAndKeepsNaN) {
  const int64_t d = 8;
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1000.0f,       -1000.0f, inf,    -inf,
                                std::nanf(""), 449.0f,   464.0f, 0.0001f};
  std::vector<uint16_t> k(static_cast<size_t>(d));
  for (int64_t i = 0; i < d; ++i) k[i] = f32_to_bf16(x[i]);
  std::vector<uint8_t> kc(static_cast<size_t>(d)), vc(kc.size());
  const std::vector<int32_t> slot = {0};
  store_kv(
      TensorView(k.data(), DType::bf16, {1, 1, d}), TensorView(k.data(), DType::bf16, {1, 1, d}),
      TensorView(kc.data(), DType::f8e4m3, {1, 1, 1, d}),
      TensorView(vc.data(), DType::f8e4m3, {1, 1, 1, d}), TensorView(slot.data(), DType::i32, {1}));
  const std::vector<uint8_t> want = {0x7E, 0xFE, 0x7E, 0xFE, 0x7F, 0x7E, 0x7E, 0x00};
  // ±1000, ±Inf, 449 and 464 (past 448, below the 480 a wider format would
  // give) saturate; NaN is 0x7F; 0.0001 < 2^-10 (half the least subnormal) is 0.
  for (int64_t i = 0; i < d; ++i) EXPECT_EQ(kc[i], want[i]) << "x = " << x[i];
}

// On a JIT path the conversion is the kv_quant kernel (a kernel lookup per
// call); on the scalar path it is the reference function (none).
TEST(Fp8StoreKv, JitPathsRunTheKvQuantKernel) {
  const int64_t hkv = 3, d = 40;
  std::vector<uint16_t> k(static_cast<size_t>(hkv * d));
  for (size_t i = 0; i < k.size(); ++i) k[i] = f32_to_bf16(0.01f * float(i) - 0.5f);
  std::vector<uint8_t> kc(k.size()), vc(k.size());
  const std::vector<int32_t> slot = {0};
  const CacheStats before = cache_stats();
  KvCacheScales s;
  s.k_scale = 0.3f;
  store_kv(TensorView(k.data(), DType::bf16, {1, hkv, d}),
           TensorView(k.data(), DType::bf16, {1, hkv, d}),
           TensorView(kc.data(), DType::f8e4m3, {1, 1, hkv, d}),
           TensorView(vc.data(), DType::f8e4m3, {1, 1, hkv, d}),
           TensorView(slot.data(), DType::i32, {1}), s);
  const CacheStats after = cache_stats();
  const uint64_t lookups = after.hits + after.misses - before.hits - before.misses;
  if (cpu_info().isa == Isa::scalar)
    EXPECT_EQ(lookups, 0u);
  else
    EXPECT_GE(lookups, 1u) << "store_kv did not ask for its kernel on the "
                           << isa_name(cpu_info().isa) << " path";
  // Whichever ran: the codes of the rule (k / 0.3, v / 1).
  for (size_t i = 0; i < k.size(); ++i) {
    const double x = bf16_to_f32(k[i]);
    EXPECT_NEAR(e4m3_value(kc[i]), x / 0.3, std::abs(x / 0.3) / 16 + 0x1p-10) << i;
    EXPECT_NEAR(e4m3_value(vc[i]), x, std::abs(x) / 16 + 0x1p-10) << i;
  }
}

TEST(Fp8StoreKv, PerTensorAndPerHeadScales) {
  const int64_t t = 5, hkv = 3, d = 64, dv = 32, bs = 3, nb = 3;
  const auto k = random_bf16(static_cast<size_t>(t * hkv * d), 11, -3, 3);
  const auto v = random_bf16(static_cast<size_t>(t * hkv * dv), 12, -3, 3);
  const std::vector<int32_t> slots = {8, -1, 0, 4, 2};
  for (bool per_head : {false, true}) {
    std::vector<uint8_t> kc(static_cast<size_t>(nb * bs * hkv * d)), vc(nb * bs * hkv * dv);
    std::vector<float> khs = {0.01f, 0.02f, 0.005f}, vhs = {0.03f, 0.001f, 0.2f};
    KvCacheScales s;
    s.k_scale = 0.0125f;
    s.v_scale = 0.05f;
    if (per_head) {
      s.k_head_scales = TensorView(khs.data(), DType::f32, {hkv});
      s.v_head_scales = TensorView(vhs.data(), DType::f32, {hkv});
    }
    store_kv(TensorView(k.data(), DType::bf16, {t, hkv, d}),
             TensorView(v.data(), DType::bf16, {t, hkv, dv}),
             TensorView(kc.data(), DType::f8e4m3, {nb, bs, hkv, d}),
             TensorView(vc.data(), DType::f8e4m3, {nb, bs, hkv, dv}),
             TensorView(slots.data(), DType::i32, {t}), s);
    for (int64_t i = 0; i < t; ++i) {
      if (slots[i] < 0) continue;
      for (int64_t h = 0; h < hkv; ++h) {
        auto check = [&](const std::vector<uint16_t>& x, const std::vector<uint8_t>& c, int64_t w,
                         float sc) {
          for (int64_t e = 0; e < w; ++e) {
            const float q = bf16_to_f32(x[(i * hkv + h) * w + e]) / sc;
            const uint8_t code = c[(slots[i] * hkv + h) * w + e];
            // The stored code is the nearest e4m3 to q (within half a step),
            // saturated at 448.
            const double back = e4m3_value(code);
            double best = 1e30;
            for (int cc = 0; cc < 256; ++cc)
              if ((cc & 0x7f) != 0x7f)
                best = std::min(best, std::fabs(e4m3_value(static_cast<uint8_t>(cc)) - q));
            ASSERT_EQ(std::fabs(back - q), best) << "h " << h << " e " << e << " q " << q;
          }
        };
        check(k, kc, d, per_head ? khs[h] : s.k_scale);
        check(v, vc, dv, per_head ? vhs[h] : s.v_scale);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// A paged fp8 problem: decode (n = 1 per sequence, no k_new) or extend.

struct Fp8Problem {
  std::vector<int64_t> prefix, n;  // per sequence: cached keys before the new tokens, new tokens
  int64_t hq = 8, hkv = 2, d = 128, dv = 128, bs = 16;
  bool mla = false;       // v_cache = the first Dv columns of k_cache (Hkv = 1)
  bool per_head = false;  // head scales instead of per-tensor ones
  bool k_new = false;     // extend: new K/V from k_new / v_new (else in the cache)
  bool tree = false;      // extend: a random tree mask (no window, no ALiBi)
  bool deterministic = false;
  AttentionOptions opt;
  bool sinks = false, alibi = false;
  DType code = DType::f8e4m3;  // the caches' dtype
};

// decode (extend = false: n = 1, prefix = seq_len − 1, the new token in the
// cache) or extend; checks against the reference.
void run_fp8(const Fp8Problem& pr, bool extend, int threads = 0) {
  const int64_t b = static_cast<int64_t>(pr.prefix.size()), hq = pr.hq, hkv = pr.hkv, d = pr.d,
                dv = pr.dv, bs = pr.bs, g = hq / hkv;
  std::vector<int64_t> qo(1, 0), cached(static_cast<size_t>(b));
  int64_t max_blocks = 1, used = 0;
  for (int64_t s = 0; s < b; ++s) {
    qo.push_back(qo.back() + pr.n[s]);
    cached[s] = pr.prefix[s] + (pr.k_new ? 0 : pr.n[s]);
    max_blocks = std::max(max_blocks, (cached[s] + bs - 1) / bs);
    used += (cached[s] + bs - 1) / bs;
  }
  const int64_t tokens = qo.back(), num_blocks = used + 2;
  const uint32_t seed =
      seed_of({b, hq, hkv, d, dv, bs, pr.mla, pr.per_head, pr.k_new, pr.tree, extend});
  std::vector<int32_t> perm(static_cast<size_t>(num_blocks));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), std::mt19937(seed));
  std::vector<int32_t> table(static_cast<size_t>(b * max_blocks), -1), lens32, prefix32, qo32;
  int64_t next = 0;
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < (cached[s] + bs - 1) / bs; ++i)
      table[s * max_blocks + i] = perm[next++];
    lens32.push_back(static_cast<int32_t>(pr.prefix[s] + pr.n[s]));
    prefix32.push_back(static_cast<int32_t>(pr.prefix[s]));
  }
  for (int64_t x : qo) qo32.push_back(static_cast<int32_t>(x));
  GuardedBuffer kbuf(num_blocks * bs * hkv * d);
  {
    const auto c = random_codes(static_cast<size_t>(num_blocks * bs * hkv * d), seed, pr.code);
    std::copy(c.begin(), c.end(), kbuf.as<uint8_t>());
  }
  std::optional<GuardedBuffer> vbuf;
  TensorView k_cache(kbuf.as<uint8_t>(), pr.code, {num_blocks, bs, hkv, d}), v_cache;
  if (pr.mla) {
    v_cache = TensorView(kbuf.as<uint8_t>(), pr.code, {num_blocks, bs, 1, dv}, {bs * d, d, d, 1});
  } else {
    vbuf.emplace(num_blocks * bs * hkv * dv);
    const auto c = random_codes(static_cast<size_t>(num_blocks * bs * hkv * dv), seed + 1, pr.code);
    std::copy(c.begin(), c.end(), vbuf->as<uint8_t>());
    v_cache = TensorView(vbuf->as<uint8_t>(), pr.code, {num_blocks, bs, hkv, dv});
  }
  // Scales: e4m3 codes reach 448, so ~1/128 keeps scores and values
  // moderate; e5m2's reach 57344, 128x more.
  const float range = pr.code == DType::f8e5m2 ? 1.0f / 128 : 1.0f;
  std::vector<float> khs(static_cast<size_t>(hkv)), vhs(khs.size());
  std::mt19937 rng(seed + 7);
  std::uniform_real_distribution<float> sd(0.5f, 2.0f);
  for (int64_t h = 0; h < hkv; ++h) khs[h] = sd(rng) / 128 * range, vhs[h] = sd(rng) / 64 * range;
  AttentionOptions opt = pr.opt;
  opt.kv_scales.k_scale = 1.0f / 160 * range;
  opt.kv_scales.v_scale = 1.0f / 48 * range;
  if (pr.per_head) {
    opt.kv_scales.k_head_scales = TensorView(khs.data(), DType::f32, {hkv});
    opt.kv_scales.v_head_scales = TensorView(vhs.data(), DType::f32, {hkv});
  }
  auto kscale = [&](int64_t h) { return double(pr.per_head ? khs[h] : opt.kv_scales.k_scale); };
  auto vscale = [&](int64_t h) { return double(pr.per_head ? vhs[h] : opt.kv_scales.v_scale); };
  std::vector<float> sinks, slopes;
  for (int64_t h = 0; h < hq; ++h)
    sinks.push_back(0.5f * float(h % 5) - 1), slopes.push_back(0.05f * float(h % 4 + 1));
  if (pr.sinks) opt.sinks = TensorView(sinks.data(), DType::f32, {hq});
  if (pr.alibi) opt.alibi_slopes = TensorView(slopes.data(), DType::f32, {hq});
  const auto qv = random_bf16(static_cast<size_t>(tokens * hq * d), seed + 2, -2, 2);
  const auto kn = random_bf16(static_cast<size_t>(tokens * hkv * d), seed + 3, -2, 2);
  const auto vn = random_bf16(static_cast<size_t>(tokens * hkv * dv), seed + 4, -2, 2);
  std::vector<uint8_t> mask;
  std::vector<int64_t> mask_off(1, 0);
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t i = 0; i < pr.n[s]; ++i)
      for (int64_t j = 0; j < pr.n[s]; ++j)
        mask.push_back(j == i || (j < i && (rng() % 3 != 0)) || (j > i && rng() % 7 == 0));
    mask_off.push_back(static_cast<int64_t>(mask.size()));
  }
  std::vector<uint16_t> out(static_cast<size_t>(tokens * hq * dv), 0x7fc0);
  const int saved = num_threads();
  if (threads > 0) set_num_threads(threads);
  if (extend) {
    ExtendOptions ext;
    if (pr.k_new) {
      ext.k_new = TensorView(kn.data(), DType::bf16, {tokens, hkv, d});
      ext.v_new = TensorView(vn.data(), DType::bf16, {tokens, hkv, dv});
    }
    if (pr.tree) ext.tree_mask = TensorView(mask.data(), DType::u8, {mask_off.back()});
    ext.deterministic = pr.deterministic;
    extend_attention(TensorView(qv.data(), DType::bf16, {tokens, hq, d}), k_cache, v_cache,
                     TensorView(out.data(), DType::bf16, {tokens, hq, dv}),
                     TensorView(qo32.data(), DType::i32, {b + 1}),
                     TensorView(table.data(), DType::i32, {b, max_blocks}),
                     TensorView(prefix32.data(), DType::i32, {b}), opt, ext);
  } else {
    decode_attention(TensorView(qv.data(), DType::bf16, {b, hq, d}), k_cache, v_cache,
                     TensorView(out.data(), DType::bf16, {b, hq, dv}),
                     TensorView(table.data(), DType::i32, {b, max_blocks}),
                     TensorView(lens32.data(), DType::i32, {b}), opt);
  }
  set_num_threads(saved);

  auto cache_at = [&](const TensorView& c, int64_t s, int64_t j, int64_t h, int64_t col) {
    const int64_t blk = table[s * max_blocks + j / bs];
    return code_value(
        pr.code,
        static_cast<const uint8_t*>(
            c.data)[blk * c.strides[0] + (j % bs) * c.strides[1] + h * c.strides[2] + col]);
  };
  // Key j of sequence s, kv head h: cached (code · scale) or new (bf16).
  auto k_at = [&](int64_t s, int64_t j, int64_t h, int64_t c) {
    if (j < cached[s]) return cache_at(k_cache, s, j, h, c) * kscale(h);
    return double(bf16_to_f32(kn[((qo[s] + j - pr.prefix[s]) * hkv + h) * d + c]));
  };
  auto v_at = [&](int64_t s, int64_t j, int64_t h, int64_t c) {
    if (j < cached[s]) return cache_at(v_cache, s, j, pr.mla ? 0 : h, c) * vscale(h);
    return double(bf16_to_f32(vn[((qo[s] + j - pr.prefix[s]) * hkv + h) * dv + c]));
  };
  double max_v = 0;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t j = 0; j < pr.prefix[s] + pr.n[s]; ++j)
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < dv; ++c) max_v = std::max(max_v, std::fabs(v_at(s, j, h, c)));
  for (int64_t s = 0; s < b; ++s) {
    const int64_t tk = pr.prefix[s] + pr.n[s];
    for (int64_t i = 0; i < pr.n[s]; ++i)
      for (int64_t h = 0; h < hq; ++h) {
        // Visible keys of the row: a tree mask maps the reference onto the
        // list of keys it lets through (no window or ALiBi in those cases).
        std::vector<int64_t> keys;
        for (int64_t j = 0; j < tk; ++j) {
          if (!pr.tree) {
            keys.push_back(j);
            continue;
          }
          const int64_t jn = j - pr.prefix[s];
          if (jn < 0 || mask[mask_off[s] + i * pr.n[s] + jn]) keys.push_back(j);
        }
        runtime::ReferenceAttentionHead rh;
        rh.tq = 1;
        rh.tk = pr.tree ? static_cast<int64_t>(keys.size()) : pr.prefix[s] + i + 1;
        rh.d = d;
        rh.dv = dv;
        rh.sm_scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(double(d));
        rh.causal = !pr.tree && (extend || opt.causal);
        rh.window_left = opt.window_left;
        rh.window_right = opt.window_right;
        if (!extend) rh.tk = tk;  // decode: the whole sequence, i_pos = tk − 1
        rh.softcap = opt.softcap;
        rh.has_sink = pr.sinks;
        if (pr.sinks) rh.sink = sinks[h];
        if (pr.alibi) rh.alibi_slope = slopes[h];
        const int64_t row = qo[s] + i;
        rh.q_at = [&](int64_t, int64_t c) {
          return double(bf16_to_f32(qv[(row * hq + h) * d + c]));
        };
        rh.k_at = [&](int64_t j, int64_t c) { return k_at(s, keys[j], h / g, c); };
        rh.v_at = [&](int64_t j, int64_t c) { return v_at(s, keys[j], h / g, c); };
        rh.out = [&](int64_t, int64_t c, double ref) {
          const double got = bf16_to_f32(out[(row * hq + h) * dv + c]);
          const double tol = runtime::attention_output_bound(max_v, ref);
          ASSERT_LE(std::fabs(got - ref), tol)
              << "seq " << s << " token " << i << " head " << h << " col " << c << ": got " << got
              << " want " << ref;
        };
        runtime::reference_attention_head(rh);
        if (::testing::Test::HasFatalFailure()) return;
      }
  }
}

// Decode: prefix = seq_len − 1, one new token in the cache.
Fp8Problem decode_problem(std::vector<int64_t> lens) {
  Fp8Problem p;
  for (int64_t l : lens) p.prefix.push_back(l - 1), p.n.push_back(1);
  return p;
}

class Fp8Decode : public IsaTest {};
class Fp8Extend : public IsaTest {};

TEST_F(Fp8Decode, HeadSizesAndBlockSizes) {
  for (int64_t bs : {1, 16, 64})
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {80, 80}, {72, 40}}) {
      Fp8Problem p = decode_problem({1, 37, 300});
      p.d = d, p.dv = dv, p.bs = bs;
      SCOPED_TRACE("bs " + std::to_string(bs) + " d " + std::to_string(d) + "/" +
                   std::to_string(dv));
      run_fp8(p, false);
      if (HasFatalFailure()) return;
    }
}

TEST_F(Fp8Decode, PerHeadScalesGqaAndSplit) {
  for (int64_t hkv : {1, 2, 8})
    for (int threads : {1, 2}) {
      Fp8Problem p = decode_problem({700, 5});
      p.hq = 16, p.hkv = hkv, p.per_head = true;
      SCOPED_TRACE("hkv " + std::to_string(hkv) + " threads " + std::to_string(threads));
      run_fp8(p, false, threads);
      if (HasFatalFailure()) return;
    }
}

TEST_F(Fp8Decode, Options) {
  for (int which = 0; which < 5; ++which)
    for (int64_t bs : {1, 16}) {
      Fp8Problem p = decode_problem({260, 17});
      p.bs = bs;
      p.per_head = which % 2 == 1;
      if (which == 0) p.opt.window_left = 50;
      if (which == 1) p.opt.softcap = 5;
      if (which == 2) p.sinks = true;
      if (which == 3) p.alibi = true;
      if (which == 4) p.opt.sm_scale = 0.3f, p.opt.window_left = 7, p.sinks = true;
      SCOPED_TRACE("case " + std::to_string(which) + " bs " + std::to_string(bs));
      run_fp8(p, false);
      if (HasFatalFailure()) return;
    }
}

TEST_F(Fp8Decode, Mla) {
  for (int64_t bs : {1, 64}) {
    Fp8Problem p = decode_problem({90, 33});
    p.hq = 16, p.hkv = 1, p.d = 576, p.dv = 512, p.mla = true, p.bs = bs;
    run_fp8(p, false);
    if (HasFatalFailure()) return;
  }
}

TEST_F(Fp8Extend, BothModesHeadAndBlockSizes) {
  for (bool k_new : {false, true})
    for (int64_t bs : {1, 16, 64})
      for (auto [d, dv] : {std::pair<int64_t, int64_t>{64, 64}, {128, 128}, {80, 80}, {66, 40}}) {
        Fp8Problem p;
        p.prefix = {0, 40, 130}, p.n = {3, 1, 20};
        p.d = d, p.dv = dv, p.bs = bs, p.k_new = k_new, p.per_head = bs == 16;
        SCOPED_TRACE("k_new " + std::to_string(k_new) + " bs " + std::to_string(bs) + " d " +
                     std::to_string(d));
        run_fp8(p, true);
        if (HasFatalFailure()) return;
      }
}

TEST_F(Fp8Extend, OptionsTreeDeterministicMla) {
  for (int which = 0; which < 6; ++which) {
    Fp8Problem p;
    p.prefix = {300, 17, 60}, p.n = {5, 9, 1};  // the one-token sequence: decode's kernel
    p.k_new = which % 2 == 0, p.per_head = true, p.bs = which < 3 ? 16 : 1;
    if (which == 0) p.opt.window_left = 40, p.sinks = true;
    if (which == 1) p.opt.softcap = 4, p.alibi = true;
    if (which == 2) p.tree = true, p.sinks = true;
    if (which == 3) p.deterministic = true, p.alibi = true;
    if (which == 4) p.hq = 16, p.hkv = 1, p.d = 576, p.dv = 512, p.mla = true, p.k_new = false;
    if (which == 5) p.tree = true, p.opt.softcap = 3;
    SCOPED_TRACE("case " + std::to_string(which));
    run_fp8(p, true, which == 3 ? 2 : 0);
    if (HasFatalFailure()) return;
  }
}

TEST_F(Fp8Extend, SplitKvLongPrefix) {
  Fp8Problem p;
  p.prefix = {1500, 1200}, p.n = {2, 1};
  p.k_new = true, p.per_head = true, p.hq = 4, p.hkv = 2;
  run_fp8(p, true, 2);
}

// A NaN code in a key a row sees makes it NaN; in a slot past seq_len it does not.
TEST_F(Fp8Decode, NanCodes) {
  const int64_t d = 64, bs = 16;
  std::vector<uint8_t> kc(static_cast<size_t>(2 * bs * d), 0x30), vc(kc.size(), 0x38);
  kc[20 * d + 3] = 0x7F;  // key 20 (block 1, row 4): past seq_len 20
  std::vector<int32_t> table = {0, 1}, lens = {20};
  std::vector<uint16_t> q(static_cast<size_t>(d), f32_to_bf16(0.5f)), out(static_cast<size_t>(d));
  auto run = [&] {
    decode_attention(TensorView(q.data(), DType::bf16, {1, 1, d}),
                     TensorView(kc.data(), DType::f8e4m3, {2, bs, 1, d}),
                     TensorView(vc.data(), DType::f8e4m3, {2, bs, 1, d}),
                     TensorView(out.data(), DType::bf16, {1, 1, d}),
                     TensorView(table.data(), DType::i32, {1, 2}),
                     TensorView(lens.data(), DType::i32, {1}));
  };
  run();
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(bf16_to_f32(out[c]), 1.0f) << c;  // 0x38 = 1.0
  lens[0] = 21;
  run();
  for (int64_t c = 0; c < d; ++c) EXPECT_TRUE(std::isnan(bf16_to_f32(out[c]))) << c;
  kc[20 * d + 3] = 0x30, vc[5 * d + 7] = 0xFF;  // a NaN V element: only its column
  run();
  for (int64_t c = 0; c < d; ++c) EXPECT_EQ(std::isnan(bf16_to_f32(out[c])), c == 7) << c;
}

// One pass of EveryCodeReadExactly under the calling thread's MXCSR: every
// code of the format in V (NaN codes included: NaN in their column only;
// e5m2's Inf codes: ±Inf), one key of 1.0.
void every_code_read_exactly(DType code) {
  const int64_t d = 64, dv = 256, bs = 16;
  const uint8_t one = code == DType::f8e5m2 ? 0x3C : 0x38;
  std::vector<uint8_t> kc(static_cast<size_t>(bs * d), one), vc(static_cast<size_t>(bs * dv));
  for (int64_t c = 0; c < dv; ++c) vc[c] = static_cast<uint8_t>(c);
  std::vector<int32_t> table = {0}, lens = {1};
  const auto q = random_bf16(static_cast<size_t>(2 * d), 31, -1, 1);
  std::vector<uint16_t> out(static_cast<size_t>(2 * dv));
  for (float vs : {1.0f, 0.125f}) {
    AttentionOptions opt;
    opt.kv_scales.v_scale = vs;
    decode_attention(TensorView(q.data(), DType::bf16, {1, 2, d}),
                     TensorView(kc.data(), code, {1, bs, 1, d}),
                     TensorView(vc.data(), code, {1, bs, 1, dv}),
                     TensorView(out.data(), DType::bf16, {1, 2, dv}),
                     TensorView(table.data(), DType::i32, {1, 1}),
                     TensorView(lens.data(), DType::i32, {1}), opt);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < dv; ++c) {
        const double want = code_value(code, vc[c]) * vs;
        const float got = bf16_to_f32(out[h * dv + c]);
        if (std::isnan(want))
          ASSERT_TRUE(std::isnan(got)) << "code 0x" << std::hex << int(vc[c]);
        else
          ASSERT_EQ(got, static_cast<float>(want)) << "code 0x" << std::hex << int(vc[c]);
      }
  }
}

// Every code of both formats through the kernel's conversion, bit for bit:
// one visible key has weight exactly 1, so out = v · v_scale exactly (a
// power of two), while the attention bound alone would not see a wrong
// subnormal. The second pass runs with the caller's MXCSR.DAZ and FTZ set
// (engines do: torch's set_flush_denormal), on one thread so the kernel
// runs under that MXCSR: the conversion must not go through f32 subnormals
// (the llvm path's on AVX2 hosts did, and read every subnormal code as 0).
TEST_F(Fp8Decode, EveryCodeReadExactly) {
  for (const DType code : {DType::f8e4m3, DType::f8e5m2})
    for (const bool daz : {false, true}) {
      SCOPED_TRACE(std::string(dtype_name(code)) + (daz ? ", MXCSR DAZ + FTZ" : ", MXCSR default"));
      const unsigned saved_csr = _mm_getcsr();
      const int saved_threads = num_threads();
      if (daz) {
        set_num_threads(1);
        _mm_setcsr(saved_csr | 0x8040);  // FTZ (bit 15) | DAZ (bit 6)
      }
      every_code_read_exactly(code);
      _mm_setcsr(saved_csr);
      set_num_threads(saved_threads);
      if (HasFatalFailure()) return;
    }
}

// store_kv writes the cache decode then reads: the path an engine takes.
// 40 tokens of random values into a cache of `code` with scales s, blocks in
// reverse order; decode against the reference on the stored codes' values.
void store_then_decode(DType code, const KvCacheScales& s) {
  const int64_t hkv = 2, hq = 4, d = 128, bs = 16, len = 40;
  const auto k = random_bf16(static_cast<size_t>(len * hkv * d), 21, -2, 2);
  const auto v = random_bf16(static_cast<size_t>(len * hkv * d), 22, -1, 1);
  std::vector<uint8_t> kc(static_cast<size_t>(3 * bs * hkv * d)), vc(kc.size());
  std::vector<int32_t> slots;
  for (int64_t t = 0; t < len; ++t)
    slots.push_back(static_cast<int32_t>((2 - t / bs) * bs + t % bs));
  store_kv(TensorView(k.data(), DType::bf16, {len, hkv, d}),
           TensorView(v.data(), DType::bf16, {len, hkv, d}),
           TensorView(kc.data(), code, {3, bs, hkv, d}),
           TensorView(vc.data(), code, {3, bs, hkv, d}),
           TensorView(slots.data(), DType::i32, {len}), s);
  const auto q = random_bf16(static_cast<size_t>(hq * d), 23, -2, 2);
  std::vector<uint16_t> out(static_cast<size_t>(hq * d));
  std::vector<int32_t> table = {2, 1, 0}, lens = {static_cast<int32_t>(len)};
  AttentionOptions opt;
  opt.kv_scales = s;
  decode_attention(
      TensorView(q.data(), DType::bf16, {1, hq, d}), TensorView(kc.data(), code, {3, bs, hkv, d}),
      TensorView(vc.data(), code, {3, bs, hkv, d}), TensorView(out.data(), DType::bf16, {1, hq, d}),
      TensorView(table.data(), DType::i32, {1, 3}), TensorView(lens.data(), DType::i32, {1}), opt);
  double max_v = 0;
  for (uint8_t c : vc) max_v = std::max(max_v, std::fabs(code_value(code, c) * s.v_scale));
  for (int64_t h = 0; h < hq; ++h) {
    runtime::ReferenceAttentionHead rh;
    rh.tq = 1, rh.tk = len, rh.d = d, rh.dv = d, rh.sm_scale = 1.0 / std::sqrt(double(d));
    auto at = [&](const std::vector<uint8_t>& c, double sc, int64_t j, int64_t col) {
      return code_value(code, c[(slots[j] * hkv + h / 2) * d + col]) * sc;
    };
    rh.q_at = [&](int64_t, int64_t c) { return double(bf16_to_f32(q[h * d + c])); };
    rh.k_at = [&](int64_t j, int64_t c) { return at(kc, s.k_scale, j, c); };
    rh.v_at = [&](int64_t j, int64_t c) { return at(vc, s.v_scale, j, c); };
    rh.out = [&](int64_t, int64_t c, double ref) {
      ASSERT_LE(std::fabs(bf16_to_f32(out[h * d + c]) - ref),
                runtime::attention_output_bound(max_v, ref))
          << h << " " << c;
    };
    runtime::reference_attention_head(rh);
  }
}

TEST_F(Fp8Decode, StoreThenDecode) {
  KvCacheScales s;
  s.k_scale = 2.0f / 448, s.v_scale = 1.0f / 448;
  store_then_decode(DType::f8e4m3, s);
}

// ---------------------------------------------------------------------------
// e5m2 caches (vLLM's kv_cache_dtype "fp8_e5m2"): the same battery on the
// other code format, every path (IsaTest), tails of head and block size.

TEST_F(Fp8Decode, E5m2HeadBlockSizesOptionsMla) {
  int which = 0;
  for (int64_t bs : {1, 16, 64})
    for (auto [d, dv] : {std::pair<int64_t, int64_t>{128, 128}, {80, 80}, {72, 40}}) {
      Fp8Problem p = decode_problem({1, 37, 300});
      p.code = DType::f8e5m2, p.d = d, p.dv = dv, p.bs = bs, p.per_head = which % 2 == 1;
      if (which % 4 == 1) p.opt.softcap = 5, p.sinks = true;
      if (which % 4 == 2) p.opt.window_left = 50, p.alibi = true;
      SCOPED_TRACE("bs " + std::to_string(bs) + " d " + std::to_string(d) + "/" +
                   std::to_string(dv) + " case " + std::to_string(which % 4));
      run_fp8(p, false, which % 3 == 0 ? 2 : 0);
      if (HasFatalFailure()) return;
      ++which;
    }
  Fp8Problem p = decode_problem({90, 33});
  p.code = DType::f8e5m2, p.hq = 16, p.hkv = 1, p.d = 576, p.dv = 512, p.mla = true;
  run_fp8(p, false);
}

TEST_F(Fp8Extend, E5m2BothModesOptionsMla) {
  for (int which = 0; which < 6; ++which) {
    Fp8Problem p;
    p.code = DType::f8e5m2;
    p.prefix = {0, 40, 130}, p.n = {3, 1, 20};
    p.k_new = which % 2 == 0, p.per_head = which % 3 == 0, p.bs = which < 3 ? 16 : 1;
    p.d = p.dv = which == 1 ? 66 : 128;
    if (which == 2) p.tree = true, p.sinks = true;
    if (which == 3) p.deterministic = true, p.opt.window_left = 20;
    if (which == 4) p.hq = 16, p.hkv = 1, p.d = 576, p.dv = 512, p.mla = true, p.k_new = false;
    if (which == 5) p.opt.softcap = 3, p.alibi = true;
    SCOPED_TRACE("case " + std::to_string(which));
    run_fp8(p, true, which == 3 ? 2 : 0);
    if (HasFatalFailure()) return;
  }
}

// store_kv into an e5m2 cache: every finite code's value round-trips, ties go
// to the even code, |x| past 57344 (±Inf too) saturates to ±57344 (never an
// Inf code: vLLM's and CUDA's SATFINITE), NaN is 0x7F; then decode reads
// what was stored against the reference on the stored codes' values.
TEST_F(Fp8Decode, E5m2StoreRoundTripSaturationThenDecode) {
  const int64_t hkv = 2, d = 128, bs = 16;
  // Token 0: every finite code's value (a power-of-two scale: exact in bf16);
  // token 1: midpoints of neighbouring normal codes (ties), then the
  // saturating and special values.
  const float scale = 0.25f;
  std::vector<uint16_t> k(static_cast<size_t>(2 * hkv * d)), v(k.size());
  std::vector<uint8_t> want_k(k.size());
  for (int64_t i = 0; i < hkv * d; ++i) {
    const uint8_t c = static_cast<uint8_t>(i);
    const bool finite = std::isfinite(e5m2_value(c));
    k[i] = f32_to_bf16(finite ? static_cast<float>(e5m2_value(c) * scale) : 0.0f);
    want_k[i] = finite ? c : 0;                    // Inf / NaN codes: a +0 stored in their place
    const int lo = 4 + static_cast<int>(i % 110);  // normal codes 4 .. 0x71
    const double mid =
        (e5m2_value(static_cast<uint8_t>(lo)) + e5m2_value(static_cast<uint8_t>(lo + 1))) / 2;
    k[hkv * d + i] = f32_to_bf16(static_cast<float>(mid * scale));  // exact: 3 bits
    want_k[hkv * d + i] = static_cast<uint8_t>(lo % 2 == 0 ? lo : lo + 1);
  }
  const float inf = std::numeric_limits<float>::infinity();
  const std::pair<float, uint8_t> special[] = {
      {1e6f, 0x7B},     {-1e6f, 0xFB},         {inf, 0x7B},  {-inf, 0xFB},
      {61440.0f, 0x7B}, {std::nanf(""), 0x7F}, {1e-7f, 0x00}};
  for (size_t i = 0; i < std::size(special); ++i) {
    k[hkv * d + i] = f32_to_bf16(special[i].first * scale);
    want_k[hkv * d + i] = special[i].second;
  }
  for (size_t i = 0; i < v.size(); ++i) v[i] = k[(i * 7) % k.size()];
  std::vector<uint8_t> kc(static_cast<size_t>(bs * hkv * d), 0xAA), vc(kc.size(), 0xAA);
  const std::vector<int32_t> slots = {3, 5};
  KvCacheScales s;
  s.k_scale = s.v_scale = scale;
  store_kv(TensorView(k.data(), DType::bf16, {2, hkv, d}),
           TensorView(v.data(), DType::bf16, {2, hkv, d}),
           TensorView(kc.data(), DType::f8e5m2, {1, bs, hkv, d}),
           TensorView(vc.data(), DType::f8e5m2, {1, bs, hkv, d}),
           TensorView(slots.data(), DType::i32, {2}), s);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t e = 0; e < hkv * d; ++e) {
      const uint8_t got = kc[slots[t] * hkv * d + e], want = want_k[t * hkv * d + e];
      if (want == 0x7F)
        EXPECT_EQ(got & 0x7F, 0x7F) << "NaN, element " << e;
      else
        EXPECT_EQ(got, want) << "token " << t << " element " << e;
    }
  for (int64_t e = 0; e < hkv * d; ++e) EXPECT_EQ(kc[e], 0xAA) << "slot 0 written";

  // Decode over the cache store_kv filled (40 tokens of random values).
  KvCacheScales s3;
  s3.k_scale = 3.0f / 57344, s3.v_scale = 1.0f / 4096;
  store_then_decode(DType::f8e5m2, s3);
}

// ---------------------------------------------------------------------------
// Bad input

TEST(Fp8CacheErrors, ScalesDtypesAndShapes) {
  const int64_t d = 64, bs = 16;
  std::vector<uint8_t> kc(static_cast<size_t>(bs * 2 * d)), vc(kc.size());
  std::vector<uint16_t> q(static_cast<size_t>(4 * d)), out(q.size()), kb(kc.size()), rows(2 * d);
  std::vector<int32_t> table = {0}, lens = {3}, slot = {0}, qo = {0, 1}, pre = {2};
  std::vector<float> hs2 = {1, 1}, hs3 = {1, 1, 1}, bad = {1, 0};
  const TensorView k8(kc.data(), DType::f8e4m3, {1, bs, 2, d}),
      v8(vc.data(), DType::f8e4m3, {1, bs, 2, d});
  const TensorView kbf(kb.data(), DType::bf16, {1, bs, 2, d});
  auto decode = [&](const TensorView& k, const TensorView& v, const AttentionOptions& opt) {
    decode_attention(TensorView(q.data(), DType::bf16, {1, 4, d}), k, v,
                     TensorView(out.data(), DType::bf16, {1, 4, d}),
                     TensorView(table.data(), DType::i32, {1, 1}),
                     TensorView(lens.data(), DType::i32, {1}), opt);
  };
  auto extend = [&](const TensorView& k, const TensorView& v, const AttentionOptions& opt) {
    extend_attention(
        TensorView(q.data(), DType::bf16, {1, 4, d}), k, v,
        TensorView(out.data(), DType::bf16, {1, 4, d}), TensorView(qo.data(), DType::i32, {2}),
        TensorView(table.data(), DType::i32, {1, 1}), TensorView(pre.data(), DType::i32, {1}), opt);
  };
  auto store = [&](const TensorView& k, const TensorView& v, const KvCacheScales& s) {
    store_kv(TensorView(rows.data(), DType::bf16, {1, 2, d}),
             TensorView(rows.data(), DType::bf16, {1, 2, d}), k, v,
             TensorView(slot.data(), DType::i32, {1}), s);
  };
  for (float x : {0.0f, -1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    AttentionOptions o;
    o.kv_scales.k_scale = x;
    expect_tilejit_error([&] { decode(k8, v8, o); }, "decode_attention: opt.kv_scales.k_scale=");
    expect_tilejit_error([&] { extend(k8, v8, o); }, "extend_attention: opt.kv_scales.k_scale=");
    KvCacheScales s;
    s.v_scale = x;
    expect_tilejit_error([&] { store(k8, v8, s); }, "store_kv: scales.v_scale=");
  }
  {
    AttentionOptions o;
    o.kv_scales.k_head_scales = TensorView(hs3.data(), DType::f32, {3});
    expect_tilejit_error(
        [&] { decode(k8, v8, o); },
        "decode_attention: opt.kv_scales.k_head_scales has shape [3]; allowed: [Hkv] = [2]");
    o.kv_scales.k_head_scales = TensorView(hs2.data(), DType::i32, {2});
    expect_tilejit_error([&] { extend(k8, v8, o); },
                         "extend_attention: opt.kv_scales.k_head_scales");
    o.kv_scales.k_head_scales.reset();
    o.kv_scales.v_head_scales = TensorView(bad.data(), DType::f32, {2});
    expect_tilejit_error([&] { decode(k8, v8, o); },
                         "opt.kv_scales.v_head_scales[1]=0; allowed: a finite value > 0");
    KvCacheScales s;
    s.k_head_scales = TensorView(hs3.data(), DType::f32, {3});
    expect_tilejit_error([&] { store(k8, v8, s); }, "store_kv: scales.k_head_scales has shape [3]");
  }
  // Mixed dtypes; a dtype that is neither.
  expect_tilejit_error(
      [&] {
        decode(k8, TensorView(kb.data(), DType::bf16, {1, bs, 2, d}), {});
      },
      "decode_attention: k_cache is f8e4m3, v_cache is bf16; allowed: the same dtype");
  expect_tilejit_error([&] { extend(kbf, v8, {}); },
                       "extend_attention: k_cache is bf16, v_cache is f8e4m3");
  expect_tilejit_error([&] { store(k8, kbf, {}); }, "store_kv: k_cache is f8e4m3, v_cache is bf16");
  const TensorView k32(kb.data(), DType::f32, {1, bs, 1, d});
  expect_tilejit_error([&] { decode(k32, k32, {}); },
                       "decode_attention: k_cache has dtype f32; allowed: bf16, f8e4m3, f8e5m2");
  // e4m3 keys with e5m2 values: one code format per cache pair.
  const TensorView v52(vc.data(), DType::f8e5m2, {1, bs, 2, d});
  expect_tilejit_error([&] { decode(k8, v52, {}); },
                       "decode_attention: k_cache is f8e4m3, v_cache is f8e5m2; allowed: the same "
                       "dtype (one of bf16, f8e4m3, f8e5m2)");
  expect_tilejit_error([&] { store(k8, v52, {}); },
                       "store_kv: k_cache is f8e4m3, v_cache is f8e5m2");
  expect_tilejit_error(
      [&] {
        store(TensorView(kc.data(), DType::u8, {1, bs, 2, d}), v8, {});
      },
      "store_kv: k_cache has dtype u8; allowed: bf16, f8e4m3, f8e5m2");
  // Scales with a bf16 cache; scales in prefill.
  {
    AttentionOptions o;
    o.kv_scales.v_scale = 2;
    expect_tilejit_error([&] { decode(kbf, kbf, o); },
                         "decode_attention: opt.kv_scales.v_scale=2; allowed: the defaults");
    KvCacheScales s;
    s.k_head_scales = TensorView(hs2.data(), DType::f32, {2});
    expect_tilejit_error([&] { store(kbf, kbf, s); },
                         "store_kv: scales.k_head_scales given; allowed: the defaults");
    std::vector<int32_t> cu = {0, 1};
    expect_tilejit_error(
        [&] {
          flash_attn_varlen(TensorView(q.data(), DType::bf16, {1, 4, d}),
                            TensorView(q.data(), DType::bf16, {1, 4, d}),
                            TensorView(q.data(), DType::bf16, {1, 4, d}),
                            TensorView(out.data(), DType::bf16, {1, 4, d}),
                            TensorView(cu.data(), DType::i32, {2}),
                            TensorView(cu.data(), DType::i32, {2}), o);
        },
        "flash_attn_varlen: opt.kv_scales set");
  }
}

}  // namespace
}  // namespace tilejit::test
