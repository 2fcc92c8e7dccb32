// NaN and Inf semantics (docs/reliability.md, "NaN and Inf") on the active
// ISA path: NaN / +Inf / −Inf planted in q, k, v, x, weights, biases, sinks,
// cos/sin rows and routing logits. Each case asserts exactly which outputs
// are NaN (or ±Inf) — the ones IEEE arithmetic makes so, as the double
// references compute them — and that every other output matches the
// reference (attention, gemm) or the same call on clean inputs, bit for bit
// (rope, fused_experts: the outputs that cannot see the bad value).
// Registered once per ISA variant (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/reference_attention.h"
#include "runtime/reference_gemm.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

constexpr uint16_t kNaN = 0x7fc0, kPosInf = 0x7f80, kNegInf = 0xff80;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNanF = std::numeric_limits<float>::quiet_NaN();

// 0 finite, 1 NaN, 2 +inf, 3 −inf.
int cls(double x) {
  if (std::isnan(x)) return 1;
  if (std::isinf(x)) return x > 0 ? 2 : 3;
  return 0;
}
const char* cls_name(int c) {
  static const char* names[] = {"finite", "NaN", "+inf", "-inf"};
  return names[c];
}

// ---- Attention ---------------------------------------------------------------

struct Prefill {
  int64_t tq = 40, tk = 40, hq = 4, hkv = 2, d = 64, dv = 64;
  std::vector<uint16_t> q, k, v;
  AttentionOptions opt;
  std::vector<float> sinks;
  Prefill() {
    q = random_bf16(size_t(tq * hq * d), 1);
    k = random_bf16(size_t(tk * hkv * d), 2);
    v = random_bf16(size_t(tk * hkv * dv), 3);
  }
  uint16_t& qa(int64_t i, int64_t h, int64_t c) { return q[(i * hq + h) * d + c]; }
  uint16_t& ka(int64_t j, int64_t h, int64_t c) { return k[(j * hkv + h) * d + c]; }
  uint16_t& va(int64_t j, int64_t h, int64_t c) { return v[(j * hkv + h) * dv + c]; }
};

// Runs flash_attn_varlen and the double reference; NaN / ±Inf must agree
// element by element, finite outputs within the attention bound
// (docs/attention.md). Returns the number of non-finite outputs.
int64_t check_prefill(Prefill& c, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<uint16_t> out(size_t(c.tq * c.hq * c.dv), 0x1234);
  const int32_t cq[] = {0, int32_t(c.tq)}, ck[] = {0, int32_t(c.tk)};
  AttentionOptions opt = c.opt;
  if (!c.sinks.empty()) opt.sinks = TensorView(c.sinks.data(), DType::f32, {c.hq});
  flash_attn_varlen(TensorView(c.q.data(), DType::bf16, {c.tq, c.hq, c.d}),
                    TensorView(c.k.data(), DType::bf16, {c.tk, c.hkv, c.d}),
                    TensorView(c.v.data(), DType::bf16, {c.tk, c.hkv, c.dv}),
                    TensorView(out.data(), DType::bf16, {c.tq, c.hq, c.dv}),
                    TensorView(cq, DType::i32, {2}), TensorView(ck, DType::i32, {2}), opt);
  double vmax = 0;
  for (uint16_t x : c.v)
    if (std::isfinite(bf16_to_f32(x))) vmax = std::max(vmax, double(std::fabs(bf16_to_f32(x))));
  int64_t bad = 0, mismatches = 0;
  for (int64_t h = 0; h < c.hq; ++h) {
    const int64_t g = h / (c.hq / c.hkv);
    runtime::ReferenceAttentionHead rh;
    rh.tq = c.tq, rh.tk = c.tk, rh.d = c.d, rh.dv = c.dv;
    rh.sm_scale = opt.sm_scale ? *opt.sm_scale : 1.0 / std::sqrt(double(c.d));
    rh.causal = opt.causal;
    rh.window_left = opt.window_left, rh.window_right = opt.window_right;
    rh.softcap = opt.softcap;
    rh.has_sink = !c.sinks.empty();
    if (rh.has_sink) rh.sink = c.sinks[h];
    rh.q_at = [&](int64_t i, int64_t e) { return double(bf16_to_f32(c.qa(i, h, e))); };
    rh.k_at = [&](int64_t j, int64_t e) { return double(bf16_to_f32(c.ka(j, g, e))); };
    rh.v_at = [&](int64_t j, int64_t e) { return double(bf16_to_f32(c.va(j, g, e))); };
    rh.out = [&](int64_t i, int64_t e, double ref) {
      const double got = bf16_to_f32(out[(i * c.hq + h) * c.dv + e]);
      const double r = bf16_to_f32(f32_to_bf16(float(ref)));
      const bool ok = cls(got) == cls(r) &&
                      (cls(r) != 0 || std::fabs(got - r) <= vmax / 128 + std::fabs(r) / 256);
      if (cls(r) != 0) ++bad;
      if (!ok && ++mismatches <= 8)
        ADD_FAILURE() << "out[" << i << ", " << h << ", " << e << "] = " << got << " ("
                      << cls_name(cls(got)) << "), reference " << r << " (" << cls_name(cls(r))
                      << ")";
    };
    runtime::reference_attention_head(rh);
  }
  EXPECT_EQ(mismatches, 0);
  return bad;
}

class NanAttention : public IsaTestWithParam<bool> {};  // param: causal

TEST_P(NanAttention, PrefillQuery) {
  Prefill c;
  c.opt.causal = GetParam();
  c.qa(5, 1, 3) = kNaN;  // one row of one head
  EXPECT_EQ(check_prefill(c, "NaN in q[5, 1, 3]"), c.dv);
  Prefill c2;
  c2.opt.causal = GetParam();
  c2.qa(7, 2, 0) = kPosInf;  // scores ±inf or NaN (inf·0 never: no zero k); row NaN
  EXPECT_EQ(check_prefill(c2, "+Inf in q[7, 2, 0]"), c2.dv);
}

TEST_P(NanAttention, PrefillKey) {
  for (uint16_t bad : {kNaN, kPosInf, kNegInf}) {
    Prefill c;
    c.opt.causal = GetParam();
    c.ka(20, 0, 7) = bad;  // key 20 of kv head 0: heads 0 and 1
    const int64_t n = check_prefill(c, "k[20, 0, 7] = " + std::to_string(bad));
    // NaN: every row that sees key 20 (causal: rows ≥ 20) of heads 0, 1.
    // ±Inf: the rows whose score is +inf (NaN) — the others give key 20 a
    // weight of 0 and stay finite.
    if (bad == kNaN) {
      EXPECT_EQ(n, (GetParam() ? 20 : 40) * 2 * c.dv);
    } else {
      EXPECT_GT(n, 0);
    }
  }
}

TEST_P(NanAttention, PrefillValue) {
  for (uint16_t bad : {kNaN, kPosInf, kNegInf}) {
    Prefill c;
    c.opt.causal = GetParam();
    c.va(33, 1, 5) = bad;  // column 5 of the rows of heads 2, 3 that see key 33
    const int64_t n = check_prefill(c, "v[33, 1, 5] = " + std::to_string(bad));
    EXPECT_EQ(n, (GetParam() ? 40 - 33 : 40) * 2);
  }
}

// A key hidden by the causal mask or a window, but inside a key block the
// engine computes for other rows: its NaN K and V must not reach the rows
// that cannot see it (0·NaN in the P·V GEMM would).
TEST_P(NanAttention, PrefillMaskedKeysDoNotPoison) {
  Prefill c;
  c.opt.causal = GetParam();
  c.opt.window_left = 8;
  for (int64_t e = 0; e < c.d; ++e) c.ka(3, 0, e) = kNaN;
  for (int64_t e = 0; e < c.dv; ++e) c.va(3, 0, e) = kNaN;
  // Rows 3 .. 11 see key 3 (window 8; non-causal also rows 0 .. 2).
  EXPECT_EQ(check_prefill(c, "NaN key 3, window 8"), (GetParam() ? 9 : 12) * 2 * c.dv);
}

// Every visible score −inf: the row sees no key and outputs 0 (not 0/0).
TEST_P(NanAttention, PrefillAllScoresMinusInf) {
  Prefill c;
  c.opt.causal = GetParam();
  for (int64_t j = 0; j < c.tk; ++j) c.ka(j, 1, 0) = kPosInf;
  c.qa(10, 2, 0) = f32_to_bf16(-1.0f);  // row 10, head 2: every score −inf → 0
  c.qa(11, 2, 0) = f32_to_bf16(1.0f);   // row 11: every score +inf → NaN
  c.qa(12, 2, 0) = 0;                   // row 12: 0·inf → NaN
  check_prefill(c, "k[:, 1, 0] = +inf");
}

TEST_P(NanAttention, PrefillSinksAndSoftcap) {
  for (float sink : {kNanF, kInf, -kInf}) {
    Prefill c;
    c.opt.causal = GetParam();
    c.sinks = {0.5f, sink, -1.f, 2.f};
    const int64_t n = check_prefill(c, "sink[1] = " + std::to_string(sink));
    EXPECT_EQ(n, std::isnan(sink) || sink > 0 ? c.tq * c.dv : 0);
  }
  Prefill c;  // softcap: cap·tanh(±inf) = ±cap, finite
  c.opt.causal = GetParam();
  c.opt.softcap = 30.f;
  c.ka(17, 0, 2) = kPosInf;
  EXPECT_EQ(check_prefill(c, "softcap, k +inf"), 0);
}

INSTANTIATE_TEST_SUITE_P(Causal, NanAttention, ::testing::Bool());

// Decode over a paged cache whose unused slots (past every seq_len) hold
// NaN, as a cache allocated with torch.empty may: they must never be read
// into a result.
struct Decode {
  int64_t b = 2, hq = 8, hkv = 2, d = 64, dv = 64, bs = 16, blocks = 48, max_blocks = 40;
  std::vector<int32_t> lens{37, 600};
  std::vector<uint16_t> q, kc, vc;
  std::vector<int32_t> table;
  AttentionOptions opt;
  Decode() {
    q = random_bf16(size_t(b * hq * d), 4);
    kc.assign(size_t(blocks * bs * hkv * d), kNaN);
    vc.assign(size_t(blocks * bs * hkv * dv), kNaN);
    // Blocks in a shuffled order: sequence 0 from the top (47, 46, 45 used),
    // sequence 1 a permutation of 0 .. 40 (38 used).
    for (int64_t s = 0; s < b; ++s)
      for (int64_t i = 0; i < max_blocks; ++i)
        table.push_back(int32_t(s == 0 ? blocks - 1 - i : i * 5 % 41));
    const auto kr = random_bf16(kc.size(), 5), vr = random_bf16(vc.size(), 6);
    for (int64_t s = 0; s < b; ++s)
      for (int64_t j = 0; j < lens[s]; ++j)
        for (int64_t h = 0; h < hkv; ++h) {
          for (int64_t e = 0; e < d; ++e) ka(s, j, h, e) = kr[at(s, j, h, d) + e];
          for (int64_t e = 0; e < dv; ++e) va(s, j, h, e) = vr[at(s, j, h, dv) + e];
        }
  }
  int64_t at(int64_t s, int64_t j, int64_t h, int64_t w) const {
    const int64_t blk = table[s * max_blocks + j / bs];
    return ((blk * bs + j % bs) * hkv + h) * w;
  }
  uint16_t& ka(int64_t s, int64_t j, int64_t h, int64_t e) { return kc[at(s, j, h, d) + e]; }
  uint16_t& va(int64_t s, int64_t j, int64_t h, int64_t e) { return vc[at(s, j, h, dv) + e]; }
};

int64_t check_decode(Decode& c, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<uint16_t> out(size_t(c.b * c.hq * c.dv), 0x1234);
  decode_attention(TensorView(c.q.data(), DType::bf16, {c.b, c.hq, c.d}),
                   TensorView(c.kc.data(), DType::bf16, {c.blocks, c.bs, c.hkv, c.d}),
                   TensorView(c.vc.data(), DType::bf16, {c.blocks, c.bs, c.hkv, c.dv}),
                   TensorView(out.data(), DType::bf16, {c.b, c.hq, c.dv}),
                   TensorView(c.table.data(), DType::i32, {c.b, c.max_blocks}),
                   TensorView(c.lens.data(), DType::i32, {c.b}), c.opt);
  int64_t bad = 0, mismatches = 0;
  for (int64_t s = 0; s < c.b; ++s)
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t g = h / (c.hq / c.hkv);
      runtime::ReferenceAttentionHead rh;
      rh.tq = 1, rh.tk = c.lens[s], rh.d = c.d, rh.dv = c.dv;
      rh.sm_scale = 1.0 / std::sqrt(double(c.d));
      rh.window_left = c.opt.window_left;
      rh.q_at = [&](int64_t, int64_t e) {
        return double(bf16_to_f32(c.q[(s * c.hq + h) * c.d + e]));
      };
      rh.k_at = [&](int64_t j, int64_t e) { return double(bf16_to_f32(c.ka(s, j, g, e))); };
      rh.v_at = [&](int64_t j, int64_t e) { return double(bf16_to_f32(c.va(s, j, g, e))); };
      rh.out = [&](int64_t, int64_t e, double ref) {
        const double got = bf16_to_f32(out[(s * c.hq + h) * c.dv + e]);
        const double r = bf16_to_f32(f32_to_bf16(float(ref)));
        const bool ok = cls(got) == cls(r) &&
                        (cls(r) != 0 || std::fabs(got - r) <= 1.0 / 128 + std::fabs(r) / 256);
        if (cls(r) != 0) ++bad;
        if (!ok && ++mismatches <= 8)
          ADD_FAILURE() << "out[" << s << ", " << h << ", " << e << "] = " << got << " ("
                        << cls_name(cls(got)) << "), reference " << r << " (" << cls_name(cls(r))
                        << ")";
      };
      runtime::reference_attention_head(rh);
    }
  EXPECT_EQ(mismatches, 0);
  return bad;
}

class NanDecode : public IsaTestWithParam<int> {};  // param: threads (2 splits the long sequence)

TEST_P(NanDecode, StaleCacheSlotsAndPlantedValues) {
  const int threads = num_threads();
  set_num_threads(GetParam());
  {
    Decode c;
    EXPECT_EQ(check_decode(c, "clean (NaN only in unused cache slots)"), 0);
  }
  {
    Decode c;
    c.q[(1 * c.hq + 3) * c.d + 9] = kNaN;  // sequence 1, head 3
    EXPECT_EQ(check_decode(c, "NaN in q[1, 3, 9]"), c.dv);
  }
  for (uint16_t bad : {kNaN, kPosInf, kNegInf}) {
    Decode c;
    c.ka(1, 500, 1, 4) = bad;  // sequence 1, kv head 1: heads 4 .. 7
    const int64_t n = check_decode(c, "k[1, 500, 1, 4] = " + std::to_string(bad));
    if (bad == kNaN) {
      EXPECT_EQ(n, 4 * c.dv);
    }
    c.va(0, 36, 0, 60) = bad;  // sequence 0's last key, column 60 of heads 0 .. 3
    check_decode(c, "and v[0, 36, 0, 60]");
  }
  {
    Decode c;  // window: key 100 of sequence 1 lies outside it
    c.opt.window_left = 256;
    for (int64_t e = 0; e < c.d; ++e) c.ka(1, 100, 0, e) = kNaN;
    for (int64_t e = 0; e < c.dv; ++e) c.va(1, 100, 0, e) = kNaN;
    EXPECT_EQ(check_decode(c, "NaN key outside the window"), 0);
  }
  {
    Decode c;  // every score of sequence 0, kv head 0 −inf for head 0
    for (int64_t j = 0; j < c.lens[0]; ++j) c.ka(0, j, 0, 0) = kPosInf;
    c.q[0] = f32_to_bf16(-1.f);
    check_decode(c, "all scores -inf");
  }
  set_num_threads(threads);
}

INSTANTIATE_TEST_SUITE_P(Threads, NanDecode, ::testing::Values(1, 2));

// Extend: one sequence, a 20-key prefix in the paged cache (its unused slots
// NaN) and 30 new tokens with k_new / v_new, causal among themselves.
TEST(NanExtend, NewKeysReachOnlyTheTokensThatSeeThem) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t prefix = 20, n = 30, hq = 4, hkv = 2, d = 64, dv = 64, bs = 16, blocks = 4;
  const int64_t g = hq / hkv;
  auto q = random_bf16(size_t(n * hq * d), 17);
  auto kn = random_bf16(size_t(n * hkv * d), 18), vn = random_bf16(size_t(n * hkv * dv), 19);
  std::vector<uint16_t> kc(size_t(blocks * bs * hkv * d), kNaN), vc(kc.size(), kNaN);
  const std::vector<int32_t> table{3, 1, 0, 2};
  const auto kr = random_bf16(kc.size(), 20), vr = random_bf16(vc.size(), 21);
  auto slot = [&](int64_t j) { return table[size_t(j / bs)] * bs + j % bs; };
  for (int64_t j = 0; j < prefix; ++j)
    for (int64_t e = 0; e < hkv * d; ++e) {
      kc[size_t(slot(j) * hkv * d + e)] = kr[size_t(j * hkv * d + e)];
      vc[size_t(slot(j) * hkv * dv + e)] = vr[size_t(j * hkv * dv + e)];
    }
  kn[(12 * hkv + 1) * d + 3] = kNaN;  // new token 12 (key 32), kv head 1: heads 2, 3 of tokens ≥ 12
  for (int64_t e = 0; e < dv; ++e) vn[(25 * hkv + 0) * dv + e] = kNaN;  // tokens ≥ 25, heads 0, 1
  q[(4 * hq + 0) * d + 0] = kNaN;                                       // token 4, head 0
  std::vector<uint16_t> out(size_t(n * hq * dv), 0x1234);
  const int32_t qo[] = {0, int32_t(n)}, pl[] = {int32_t(prefix)};
  extend_attention(TensorView(q.data(), DType::bf16, {n, hq, d}),
                   TensorView(kc.data(), DType::bf16, {blocks, bs, hkv, d}),
                   TensorView(vc.data(), DType::bf16, {blocks, bs, hkv, dv}),
                   TensorView(out.data(), DType::bf16, {n, hq, dv}),
                   TensorView(qo, DType::i32, {2}), TensorView(table.data(), DType::i32, {1, 4}),
                   TensorView(pl, DType::i32, {1}), {},
                   {.k_new = TensorView(kn.data(), DType::bf16, {n, hkv, d}),
                    .v_new = TensorView(vn.data(), DType::bf16, {n, hkv, dv})});
  int64_t mismatches = 0;
  for (int64_t h = 0; h < hq; ++h) {
    const int64_t kvh = h / g;
    runtime::ReferenceAttentionHead rh;
    rh.tq = n, rh.tk = prefix + n, rh.d = d, rh.dv = dv;
    rh.sm_scale = 1.0 / std::sqrt(double(d));
    rh.causal = true;
    rh.q_at = [&](int64_t i, int64_t e) { return double(bf16_to_f32(q[(i * hq + h) * d + e])); };
    rh.k_at = [&](int64_t j, int64_t e) {
      return double(bf16_to_f32(j < prefix ? kc[size_t((slot(j) * hkv + kvh) * d + e)]
                                           : kn[size_t(((j - prefix) * hkv + kvh) * d + e)]));
    };
    rh.v_at = [&](int64_t j, int64_t e) {
      return double(bf16_to_f32(j < prefix ? vc[size_t((slot(j) * hkv + kvh) * dv + e)]
                                           : vn[size_t(((j - prefix) * hkv + kvh) * dv + e)]));
    };
    rh.out = [&](int64_t i, int64_t e, double ref) {
      const double got = bf16_to_f32(out[(i * hq + h) * dv + e]);
      const double r = bf16_to_f32(f32_to_bf16(float(ref)));
      const bool nan = (i == 4 && h == 0) || (i >= 12 && kvh == 1) || (i >= 25 && kvh == 0);
      EXPECT_EQ(std::isnan(r), nan) << "reference out[" << i << ", " << h << ", " << e << "]";
      const bool ok = cls(got) == cls(r) &&
                      (cls(r) != 0 || std::fabs(got - r) <= 1.0 / 128 + std::fabs(r) / 256);
      if (!ok && ++mismatches <= 8)
        ADD_FAILURE() << "out[" << i << ", " << h << ", " << e << "] = " << got << ", reference "
                      << r;
    };
    runtime::reference_attention_head(rh);
  }
  EXPECT_EQ(mismatches, 0);
}

// Extend with a tree mask (speculative decoding): the masked scores are −inf
// in the engine's slow pass, but the hidden keys' V rows are still in the key
// block. Rows that see no bad key must match the clean call: bit for bit, or
// within twice the attention bound where the rule recomputed them (the
// reference rounds differently).
TEST(NanExtend, TreeMaskHidesBadKeys) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t prefix = 8, n = 20, hq = 4, hkv = 2, d = 64, dv = 64, bs = 16, blocks = 2;
  const auto q = random_bf16(size_t(n * hq * d), 22);
  const auto kc = random_bf16(size_t(blocks * bs * hkv * d), 23);
  const auto vc = random_bf16(size_t(blocks * bs * hkv * dv), 24);
  const auto kn = random_bf16(size_t(n * hkv * d), 25), vn = random_bf16(size_t(n * hkv * dv), 26);
  std::vector<uint8_t> mask(size_t(n * n));
  auto sees = [](int64_t i, int64_t j) { return j <= i && (i - j) % 3 != 1; };
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) mask[size_t(i * n + j)] = sees(i, j) ? 1 : 0;
  const std::vector<int32_t> table{1, 0};
  const int32_t qo[] = {0, int32_t(n)}, pl[] = {int32_t(prefix)};
  auto run = [&](const std::vector<uint16_t>& k_new, const std::vector<uint16_t>& v_new) {
    std::vector<uint16_t> out(size_t(n * hq * dv), 0x1234);
    extend_attention(TensorView(q.data(), DType::bf16, {n, hq, d}),
                     TensorView(kc.data(), DType::bf16, {blocks, bs, hkv, d}),
                     TensorView(vc.data(), DType::bf16, {blocks, bs, hkv, dv}),
                     TensorView(out.data(), DType::bf16, {n, hq, dv}),
                     TensorView(qo, DType::i32, {2}), TensorView(table.data(), DType::i32, {1, 2}),
                     TensorView(pl, DType::i32, {1}), {},
                     {.k_new = TensorView(k_new.data(), DType::bf16, {n, hkv, d}),
                      .v_new = TensorView(v_new.data(), DType::bf16, {n, hkv, dv}),
                      .tree_mask = TensorView(mask.data(), DType::u8, {n * n})});
    return out;
  };
  const auto clean = run(kn, vn);
  auto kb = kn, vb = vn;
  for (int64_t e = 0; e < dv; ++e) vb[(5 * hkv + 0) * dv + e] = kNaN;  // new token 5, kv head 0
  kb[(9 * hkv + 1) * d + 0] = kNaN;                                    // new token 9, kv head 1
  const auto got = run(kb, vb);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t h = 0; h < hq; ++h) {
      const bool bad = h / (hq / hkv) == 0 ? sees(i, 5) : sees(i, 9);
      for (int64_t e = 0; e < dv; ++e) {
        const size_t o = size_t((i * hq + h) * dv + e);
        if (bad)
          EXPECT_TRUE(std::isnan(bf16_to_f32(got[o]))) << i << ", " << h << ", " << e;
        else
          EXPECT_NEAR(bf16_to_f32(got[o]), bf16_to_f32(clean[o]),
                      2.0 / 128 + std::fabs(bf16_to_f32(clean[o])) / 128)
              << i << ", " << h << ", " << e;
      }
    }
}

// ---- GEMM --------------------------------------------------------------------

TEST(NanGemm, PropagatesThroughProductsBiasAndActivations) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t m = 9, n = 40, k = 64;
  for (Activation act : {Activation::none, Activation::silu, Activation::gelu_tanh}) {
    auto x = random_bf16(size_t(m * k), 7), w = random_bf16(size_t(n * k), 8);
    std::vector<float> bias = random_f32(size_t(n), 9);
    x[2 * k + 5] = kNaN;  // row 2
    w[7 * k + 1] = kNaN;  // column 7
    bias[30] = kNanF;     // column 30
    // Infinite pre-activations only through the identity: silu / gelu at −inf
    // differ between the reference (NaN) and the JIT epilogues (docs/reliability.md).
    if (act == Activation::none) {
      x[4 * k + 6] = kPosInf;   // row 4: ±inf, or NaN where signs mix
      w[11 * k + 2] = kNegInf;  // column 11
      bias[31] = kInf;          // column 31
    }
    std::vector<float> y(size_t(m * n)), ref(size_t(m * n));
    gemm(TensorView(x.data(), DType::bf16, {m, k}),
         pack_weight(TensorView(w.data(), DType::bf16, {n, k})),
         TensorView(y.data(), DType::f32, {m, n}),
         {.bias = TensorView(bias.data(), DType::f32, {n}), .act = act});
    runtime::ReferenceGemmArgs a;
    a.x = x.data(), a.ldx = k, a.m = m, a.n = n, a.k = k;
    a.bias = bias.data(), a.act = act, a.y = ref.data(), a.ldy = n;
    runtime::reference_gemm(a, [&](int64_t j, int64_t kk) { return w[j * k + kk]; });
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const float got = y[i * n + j], r = ref[i * n + j];
        // NaN inputs: exactly their row / column NaN, whatever the activation.
        const bool nan_expected = i == 2 || j == 7 || j == 30;
        if (nan_expected) {
          EXPECT_TRUE(std::isnan(got)) << i << ", " << j;
        }
        EXPECT_EQ(cls(got), cls(r)) << activation_name(act) << " y[" << i << ", " << j
                                    << "] = " << got << ", reference " << r;
        if (std::isfinite(r) && std::isfinite(got)) {
          EXPECT_NEAR(got, r, 1e-2 + 1e-2 * std::fabs(r)) << i << ", " << j;
        }
      }
  }
}

// relu(NaN) and relu2(NaN) are NaN on every path, as torch's (IEEE
// propagation; until 2026-12-07 vmaxps x, x, 0 and v > 0 ? v : 0 made them 0,
// which let a NaN token through a relu2 expert as a finite row).
TEST(NanGemm, ReluPropagatesNaN) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t m = 3, n = 32, k = 32;
  auto x = random_bf16(size_t(m * k), 15), w = random_bf16(size_t(n * k), 16);
  x[1 * k + 4] = kNaN;
  for (Activation act : {Activation::relu, Activation::relu2}) {
    std::vector<float> y(size_t(m * n));
    gemm(TensorView(x.data(), DType::bf16, {m, k}),
         pack_weight(TensorView(w.data(), DType::bf16, {n, k})),
         TensorView(y.data(), DType::f32, {m, n}), {.act = act});
    for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(y[1 * n + j])) << j;
    for (int64_t j = 0; j < n; ++j) EXPECT_FALSE(std::isnan(y[j]) || std::isnan(y[2 * n + j]));
  }
}

// ---- RoPE --------------------------------------------------------------------

TEST(NanRope, OnlyTheRotatedPairSeesTheNaN) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t t = 5, hq = 2, d = 64, rot = 32, maxp = 16;
  for (RopeStyle style : {RopeStyle::neox, RopeStyle::gptj}) {
    auto clean = random_bf16(size_t(t * hq * d), 10);
    auto cs = random_f32(size_t(maxp * rot), 11);
    std::vector<int32_t> pos{3, 9, 9, 0, 12};
    cs[9 * rot + 4] = kNanF;  // position 9: cos θ_4 → pair 4 of tokens 1, 2
    auto bad = clean;
    bad[(0 * hq + 1) * d + 2] = kNaN;   // token 0 head 1, element 2 (rotated)
    bad[(3 * hq + 0) * d + 40] = kNaN;  // token 3 head 0, element 40 (passes through)
    auto run = [&](std::vector<uint16_t>& q) {
      rope(TensorView(q.data(), DType::bf16, {t, hq, d}), nullptr,
           TensorView(pos.data(), DType::i32, {t}), TensorView(cs.data(), DType::f32, {maxp, rot}),
           {.style = style, .rotary_dim = rot});
    };
    auto ref = clean;
    run(ref);
    run(bad);
    auto partner = [&](int64_t e) {
      return style == RopeStyle::neox ? (e < rot / 2 ? e + rot / 2 : e - rot / 2) : (e ^ 1);
    };
    auto pair_index = [&](int64_t e) { return style == RopeStyle::neox ? e % (rot / 2) : e / 2; };
    for (int64_t i = 0; i < t; ++i)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t e = 0; e < d; ++e) {
          const size_t o = size_t((i * hq + h) * d + e);
          bool nan = (i == 0 && h == 1 && (e == 2 || e == partner(2))) ||
                     (i == 3 && h == 0 && e == 40) ||
                     ((i == 1 || i == 2) && e < rot && pair_index(e) == 4);
          if (nan)
            EXPECT_TRUE(std::isnan(bf16_to_f32(bad[o]))) << i << ", " << h << ", " << e;
          else
            EXPECT_EQ(bad[o], ref[o]) << i << ", " << h << ", " << e;
        }
  }
}

// ---- Fused experts -----------------------------------------------------------

// Every gated activation, GPT-OSS's clamped SwiGLU included: its clamps
// min(gate, limit) and clamp(up, ±limit) must keep a NaN (they returned the
// limit on the JIT paths, so a NaN token came out finite); and non-gated
// relu / relu2 experts (Nemotron-H), whose relu(NaN) was 0.
class NanMoe : public IsaTestWithParam<int> {};

TEST_P(NanMoe, ATokenWithNaNPoisonsOnlyItself) {
  MoeOptions opt;
  if (GetParam() == 1) opt.act = Activation::gelu_tanh;
  if (GetParam() == 2) opt.clamped_swiglu = true;
  const bool gated = GetParam() < 3;
  if (GetParam() == 3) opt.act = Activation::relu;
  if (GetParam() == 4) opt.act = Activation::relu2;
  const int64_t t = 6, h = 64, inter = 32, e = 4, k = 2, rows13 = gated ? 2 * inter : inter;
  const auto w13 = random_bf16(size_t(e * rows13 * h), 12, -0.1f, 0.1f);
  const auto w2 = random_bf16(size_t(e * h * inter), 13, -0.1f, 0.1f);
  const PackedExperts p13 = pack_experts(TensorView(w13.data(), DType::bf16, {e, rows13, h}),
                                         gated ? ExpertProj::gate_up : ExpertProj::up);
  const PackedExperts p2 =
      pack_experts(TensorView(w2.data(), DType::bf16, {e, h, inter}), ExpertProj::down);
  std::vector<int32_t> ids{0, 1, 1, 2, 0, 1, 3, 2, 0, 3, 1, 2};
  auto run = [&](const std::vector<uint16_t>& x, const std::vector<float>& wt) {
    std::vector<float> out(size_t(t * h));
    fused_experts(TensorView(x.data(), DType::bf16, {t, h}), p13, p2,
                  TensorView(wt.data(), DType::f32, {t, k}),
                  TensorView(ids.data(), DType::i32, {t, k}),
                  TensorView(out.data(), DType::f32, {t, h}), opt);
    return out;
  };
  const auto x = random_bf16(size_t(t * h), 14);
  const std::vector<float> wt(size_t(t * k), 0.5f);
  const auto clean = run(x, wt);
  auto xb = x;
  xb[1 * h + 17] = kNaN;  // token 1 (experts 1, 2, shared with tokens 0, 2, 3, 5)
  auto wb = wt;
  wb[4 * k + 1] = kNanF;  // token 4's second weight
  const auto got = run(xb, wb);
  for (int64_t i = 0; i < t; ++i)
    for (int64_t c = 0; c < h; ++c) {
      const size_t o = size_t(i * h + c);
      if (i == 1 || i == 4)
        EXPECT_TRUE(std::isnan(got[o])) << i << ", " << c;
      else
        EXPECT_EQ(got[o], clean[o]) << i << ", " << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Glu, NanMoe, ::testing::Values(0, 1, 2, 3, 4));

// ---- Routing -----------------------------------------------------------------

struct Routed {
  std::vector<float> w;
  std::vector<int32_t> ids;
};

Routed route(const std::vector<float>& logits, int64_t e, int64_t k, int which,
             bool renormalize = true) {
  const int64_t t = int64_t(logits.size()) / e;
  Routed r{std::vector<float>(size_t(t * k)), std::vector<int32_t>(size_t(t * k))};
  const TensorView lv(logits.data(), DType::f32, {t, e});
  const TensorView wv(r.w.data(), DType::f32, {t, k}), iv(r.ids.data(), DType::i32, {t, k});
  if (which == 0) topk_softmax(lv, wv, iv, renormalize);
  if (which == 1) topk_sigmoid(lv, wv, iv, renormalize);
  if (which == 2)
    grouped_topk(lv, wv, iv,
                 {.score = RouterScore::softmax, .num_expert_group = 2, .topk_group = 2});
  return r;
}

TEST(NanRouting, NaNRanksLastAndPoisonsOnlyItsToken) {
  const float nan = kNanF, inf = kInf;
  // Token 0: NaN at expert 1; token 1: clean.
  const std::vector<float> logits{0.5f, nan, 2.0f, -1.0f, 0.5f, 1.0f, 2.0f, -1.0f};
  const Routed s = route(logits, 4, 2, 0);
  EXPECT_EQ(s.ids[0], 2);
  EXPECT_EQ(s.ids[1], 0);  // 0.5: the NaN expert is never chosen ahead of a number
  EXPECT_TRUE(std::isnan(s.w[0]) && std::isnan(s.w[1]));  // softmax's denominator saw it
  EXPECT_EQ(s.ids[2], 2);
  EXPECT_EQ(s.ids[3], 1);
  EXPECT_NEAR(s.w[2] + s.w[3], 1.0f, 1e-6f);
  // Sigmoid scores each expert alone: only a chosen NaN expert would be NaN.
  const Routed g = route(logits, 4, 2, 1, false);
  EXPECT_EQ(g.ids[0], 2);
  EXPECT_EQ(g.ids[1], 0);
  EXPECT_TRUE(std::isfinite(g.w[0]) && std::isfinite(g.w[1]));
  // NaN below −inf: with k = 4 the NaN expert comes last.
  const std::vector<float> l2{nan, -inf, 1.0f, -inf};
  const Routed s2 = route(l2, 4, 4, 1, false);
  EXPECT_EQ(s2.ids, (std::vector<int32_t>{2, 1, 3, 0}));
  EXPECT_EQ(s2.w[1], 0.0f);
  EXPECT_EQ(s2.w[2], 0.0f);
  EXPECT_TRUE(std::isnan(s2.w[3]));
}

// An outside tester's cases: a chosen σ(NaN) left the others' weights finite
// and unnormalized (summing past 1) under renormalize, and grouped_topk's
// softmax chose the NaN expert (every key NaN) where topk_softmax chose the
// best numbers.
TEST(NanRouting, AChosenNaNPoisonsRenormalizedWeightsAndNeverWinsASelection) {
  const float nan = kNanF;
  const std::vector<float> l{nan, nan, 1.0f, 0.0f};
  const Routed r = route(l, 4, 3, 1, true);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3, 0}));
  for (float w : r.w) EXPECT_TRUE(std::isnan(w)) << w;
  const Routed p = route(l, 4, 3, 1, false);  // not renormalized: the NaN expert alone
  EXPECT_FLOAT_EQ(p.w[0], 1.0f / (1.0f + std::exp(-1.0f)));
  EXPECT_FLOAT_EQ(p.w[1], 0.5f);
  EXPECT_TRUE(std::isnan(p.w[2]));
  for (int64_t groups : {1, 2}) {
    std::vector<float> w(3);
    std::vector<int32_t> ids(3);
    grouped_topk(
        TensorView(l.data(), DType::f32, {1, 4}), TensorView(w.data(), DType::f32, {1, 3}),
        TensorView(ids.data(), DType::i32, {1, 3}),
        {.num_expert_group = static_cast<int>(groups), .topk_group = static_cast<int>(groups)});
    EXPECT_EQ(ids, (std::vector<int32_t>{2, 3, 0})) << groups;
    for (float x : w) EXPECT_TRUE(std::isnan(x)) << groups;
  }
  // Softmax: the ids are the best numbers on both routers, the weights NaN.
  const std::vector<float> l2{1.0f, nan, 2.0f, 3.0f};
  const Routed s = route(l2, 4, 2, 0);
  EXPECT_EQ(s.ids, (std::vector<int32_t>{3, 2}));
  const Routed g = route(l2, 4, 2, 2);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{3, 2}));
  for (float x : g.w) EXPECT_TRUE(std::isnan(x));
  for (int64_t groups : {1, 4}) {
    std::vector<float> w(2);
    std::vector<int32_t> ids(2);
    grouped_topk(TensorView(l2.data(), DType::f32, {1, 4}),
                 TensorView(w.data(), DType::f32, {1, 2}),
                 TensorView(ids.data(), DType::i32, {1, 2}),
                 {.score = RouterScore::softmax,
                  .num_expert_group = static_cast<int>(groups),
                  .topk_group = static_cast<int>(groups)});
    EXPECT_EQ(ids, (std::vector<int32_t>{3, 2})) << groups;
  }
}

TEST(NanRouting, InfiniteLogitsTakeTheirLimits) {
  const float inf = kInf;
  // Softmax: an all −inf row is uniform; +inf logits share probability 1.
  const std::vector<float> logits{-inf, -inf, -inf, -inf, 1.0f, inf,
                                  3.0f, inf,  -inf, 2.0f, -inf, 0.0f};
  const Routed s = route(logits, 4, 2, 0, false);
  EXPECT_EQ(s.ids[0], 0);
  EXPECT_EQ(s.ids[1], 1);
  EXPECT_EQ(s.w[0], 0.25f);
  EXPECT_EQ(s.w[1], 0.25f);
  EXPECT_EQ(s.ids[2], 1);
  EXPECT_EQ(s.ids[3], 3);
  EXPECT_EQ(s.w[2], 0.5f);
  EXPECT_EQ(s.w[3], 0.5f);
  EXPECT_EQ(s.ids[4], 1);  // 2.0
  EXPECT_EQ(s.ids[5], 3);  // 0.0, ahead of −inf
  for (float w : s.w) EXPECT_FALSE(std::isnan(w));
  const Routed r = route(logits, 4, 2, 0, true);
  EXPECT_EQ(r.w[0], 0.5f);
  EXPECT_EQ(r.w[1], 0.5f);
  for (float w : r.w) EXPECT_FALSE(std::isnan(w));
  // Sigmoid: σ(−inf) = 0, and renormalizing a zero sum leaves the zeros.
  const Routed g = route(logits, 4, 2, 1, true);
  EXPECT_EQ(g.w[0], 0.0f);
  EXPECT_EQ(g.w[1], 0.0f);
  EXPECT_EQ(g.w[2], 0.5f);
  EXPECT_EQ(g.w[3], 0.5f);
  // A NaN correction bias is not data but a corrupt checkpoint constant (it
  // would keep its expert, and often its group, out of every selection): an
  // Error naming the entry, the outputs untouched (RoutingErrors.CorrectionBias
  // has ±Inf too).
  {
    const std::vector<float> lg{2.0f, 1.0f, 0.5f, 0.0f};
    std::vector<float> bias{kNanF, 0.0f, 0.0f, 0.0f};
    std::vector<float> w(2, -1.0f);
    std::vector<int32_t> ids(2, -1);
    try {
      grouped_topk(TensorView(lg.data(), DType::f32, {1, 4}),
                   TensorView(w.data(), DType::f32, {1, 2}),
                   TensorView(ids.data(), DType::i32, {1, 2}),
                   {.num_expert_group = 2,
                    .topk_group = 1,
                    .correction_bias = TensorView(bias.data(), DType::f32, {4})});
      ADD_FAILURE() << "a NaN correction bias was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("correction_bias[0] = nan"), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(ids, (std::vector<int32_t>{-1, -1}));
    EXPECT_EQ(w, (std::vector<float>{-1.0f, -1.0f}));
  }
  // Grouped (softmax, 2 groups of 2): the same scores, never a NaN.
  const Routed gr = route(logits, 4, 2, 2);
  for (float w : gr.w) EXPECT_FALSE(std::isnan(w));
  EXPECT_EQ(gr.w[0], 0.5f);
  EXPECT_EQ(gr.w[1], 0.5f);
}

}  // namespace
}  // namespace tilejit::test
