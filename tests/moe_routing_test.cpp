// MoE routing (topk_softmax, topk_sigmoid, grouped_topk) against a
// straightforward double-precision reference written here, independent of
// ops/moe_routing.cpp: it sorts every expert (and every group) with a full
// std::sort instead of a partial selection.
//
// What is compared:
//  - ids: exactly, in order (best first, ties to the lower expert id). The
//    random logits are drawn so no two candidates come within many ulps of a
//    tie unless a test makes them tie on purpose, so any selection difference
//    is a bug, not rounding.
//  - weights: |got − ref| ≤ 2⁻²²·|ref|. Both sides compute in double (error
//    ~1e-15 relative, from a different summation order) and round once to f32
//    (≤ 2⁻²⁴ relative each); 2⁻²² leaves a factor two of headroom over
//    the two roundings landing on opposite sides.
//  - columns past k in strided outputs keep their sentinel bits.
//
// Routing is plain C++ (one code path for every ISA); the test binary is still
// registered per ISA like the others and applies the skip rule, so the amx
// variant skips on machines without AMX.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

enum class Kind { softmax, sigmoid, grouped };

struct RoutingCase {
  Kind kind = Kind::softmax;
  int64_t t = 37, e = 8, k = 2;
  DType dtype = DType::f32;
  bool renormalize = true;
  int64_t row_pad = 0;  // extra elements per logits row (NaN filled)
  int64_t out_pad = 0;  // extra elements per weights / ids row (sentinel filled)
  // grouped only
  RouterScore score = RouterScore::sigmoid;
  int groups = 1, topk_group = 1;
  bool bias = false;
  float scale = 1.0f;
};

std::string case_str(const RoutingCase& c) {
  std::ostringstream s;
  s << (c.kind == Kind::softmax   ? "softmax"
        : c.kind == Kind::sigmoid ? "sigmoid"
                                  : "grouped")
    << "_T" << c.t << "_E" << c.e << "_k" << c.k << "_" << dtype_name(c.dtype)
    << (c.renormalize ? "_renorm" : "_raw");
  if (c.row_pad) s << "_rowpad" << c.row_pad;
  if (c.out_pad) s << "_outpad" << c.out_pad;
  if (c.kind == Kind::grouped)
    s << (c.score == RouterScore::softmax ? "_softmaxscore" : "_sigmoidscore") << "_g" << c.groups
      << "_tg" << c.topk_group << (c.bias ? "_bias" : "") << "_scale" << int(c.scale * 100);
  return s.str();
}

void PrintTo(const RoutingCase& c, std::ostream* os) {
  *os << case_str(c);
}

// ---------------------------------------------------------------------------
// The reference.

struct Routed {
  std::vector<int32_t> ids;  // [T, k]
  std::vector<double> w;     // [T, k]
};

std::vector<double> scores_of(const std::vector<double>& logits, bool softmax) {
  std::vector<double> s(logits.size());
  if (softmax) {
    const double mx = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (size_t i = 0; i < s.size(); ++i) sum += s[i] = std::exp(logits[i] - mx);
    for (double& v : s) v /= sum;
  } else {
    for (size_t i = 0; i < s.size(); ++i) s[i] = 1.0 / (1.0 + std::exp(-logits[i]));
  }
  return s;
}

// Indices of `cand` sorted by key descending, lower index first on ties.
std::vector<int32_t> sorted_by(std::vector<int32_t> cand, const std::vector<double>& key) {
  std::sort(cand.begin(), cand.end(),
            [&](int32_t a, int32_t b) { return key[a] != key[b] ? key[a] > key[b] : a < b; });
  return cand;
}

// One token: logits (doubles) -> k ids and weights.
void route_token(const RoutingCase& c, const std::vector<double>& logits,
                 const std::vector<float>& bias, int32_t* ids, double* w) {
  const bool softmax =
      c.kind == Kind::softmax || (c.kind == Kind::grouped && c.score == RouterScore::softmax);
  const std::vector<double> s = scores_of(logits, softmax);
  std::vector<int32_t> cand;
  std::vector<double> key = s;
  double scale = 1;
  if (c.kind != Kind::grouped) {
    cand.resize(static_cast<size_t>(c.e));
    std::iota(cand.begin(), cand.end(), 0);
  } else {
    scale = c.scale;
    if (c.bias)
      for (int64_t i = 0; i < c.e; ++i) key[i] = s[i] + double(bias[i]);
    const int64_t gs = c.e / c.groups;
    std::vector<double> gscore(static_cast<size_t>(c.groups));
    for (int g = 0; g < c.groups; ++g) {
      std::vector<double> members(key.begin() + g * gs, key.begin() + (g + 1) * gs);
      std::sort(members.rbegin(), members.rend());  // descending
      gscore[g] = c.bias ? members[0] + (gs >= 2 ? members[1] : 0.0) : members[0];
    }
    std::vector<int32_t> all_groups(static_cast<size_t>(c.groups));
    std::iota(all_groups.begin(), all_groups.end(), 0);
    const std::vector<int32_t> kept = sorted_by(all_groups, gscore);
    for (int gi = 0; gi < c.topk_group; ++gi)
      for (int64_t i = 0; i < gs; ++i) cand.push_back(static_cast<int32_t>(kept[gi] * gs + i));
  }
  const std::vector<int32_t> order = sorted_by(cand, key);
  double sum = 0;
  for (int64_t j = 0; j < c.k; ++j) sum += s[order[j]];
  for (int64_t j = 0; j < c.k; ++j) {
    ids[j] = order[j];
    w[j] = (c.renormalize ? s[order[j]] / sum : s[order[j]]) * scale;
  }
}

Routed reference(const RoutingCase& c, const std::vector<double>& logits,
                 const std::vector<float>& bias) {
  Routed r;
  r.ids.resize(static_cast<size_t>(c.t * c.k));
  r.w.resize(r.ids.size());
  for (int64_t t = 0; t < c.t; ++t) {
    std::vector<double> row(logits.begin() + t * c.e, logits.begin() + (t + 1) * c.e);
    route_token(c, row, bias, &r.ids[t * c.k], &r.w[t * c.k]);
  }
  return r;
}

// ---------------------------------------------------------------------------
// Running the library on a case.

// Logits: every value distinct within a row (a random permutation of an
// evenly spaced grid plus jitter), so only deliberate ties tie. Sigmoid logits
// stay in [-6, 6] where σ is far from saturating to 1.0 in double.
std::vector<double> random_logits(const RoutingCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<double> v(static_cast<size_t>(c.t * c.e));
  std::vector<int64_t> perm(static_cast<size_t>(c.e));
  std::uniform_real_distribution<double> jitter(-0.25, 0.25);
  for (int64_t t = 0; t < c.t; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t i = 0; i < c.e; ++i) {
      const double grid = c.e > 1 ? (double(perm[i]) + 0.5 * jitter(rng)) / double(c.e) : 0.3;
      v[t * c.e + i] = -6.0 + 12.0 * grid;
    }
  }
  return v;
}

// In bf16 (ulp 2⁻⁵ at magnitude 4..8, about one grid step at E = 384) neighbours
// may round to the same value: an exact tie, which both sides break the same
// way (the reference reads the rounded logits); never a near-tie.

constexpr uint32_t kWSentinel = 0x7fb00bad;
constexpr int32_t kIdSentinel = -777;

::testing::AssertionResult run_case(const RoutingCase& c, const std::vector<double>& logits_in,
                                    const std::vector<float>& bias) {
  const int64_t ld = c.e + c.row_pad, ldo = c.k + c.out_pad;
  const size_t esz = c.dtype == DType::f32 ? 4 : 2;
  // The logits as the library sees them (rounded to bf16 if so), and the
  // reference reads the same rounded values.
  std::vector<double> logits = logits_in;
  GuardedBuffer lbuf(static_cast<size_t>(std::max<int64_t>(1, c.t * ld)) * esz);
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t i = 0; i < ld; ++i) {
      const bool pad = i >= c.e;
      const double v = pad ? std::nan("") : logits[t * c.e + i];
      if (c.dtype == DType::f32) {
        lbuf.as<float>()[t * ld + i] = static_cast<float>(v);
        if (!pad) logits[t * c.e + i] = static_cast<float>(v);
      } else {
        const uint16_t h = f32_to_bf16(static_cast<float>(v));
        lbuf.as<uint16_t>()[t * ld + i] = h;
        if (!pad) logits[t * c.e + i] = bf16_to_f32(h);
      }
    }
  std::vector<float> w(static_cast<size_t>(std::max<int64_t>(1, c.t * ldo)));
  std::vector<int32_t> ids(w.size(), kIdSentinel);
  for (float& f : w) std::memcpy(&f, &kWSentinel, 4);

  const TensorView lv(lbuf.data(), c.dtype, {c.t, c.e}, {ld, 1});
  const TensorView wv(w.data(), DType::f32, {c.t, c.k}, {ldo, 1});
  const TensorView iv(ids.data(), DType::i32, {c.t, c.k}, {ldo, 1});
  try {
    if (c.kind == Kind::softmax) {
      topk_softmax(lv, wv, iv, c.renormalize);
    } else if (c.kind == Kind::sigmoid) {
      topk_sigmoid(lv, wv, iv, c.renormalize);
    } else {
      GroupedTopkOptions o;
      o.score = c.score;
      o.num_expert_group = c.groups;
      o.topk_group = c.topk_group;
      o.renormalize = c.renormalize;
      o.routed_scaling_factor = c.scale;
      if (c.bias) o.correction_bias = TensorView(bias.data(), DType::f32, {c.e});
      grouped_topk(lv, wv, iv, o);
    }
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << case_str(c) << ": threw " << e.what();
  }

  const Routed r = reference(c, logits, bias);
  int bad = 0;
  std::ostringstream msg;
  for (int64_t t = 0; t < c.t; ++t) {
    for (int64_t j = 0; j < ldo; ++j) {
      const size_t at = static_cast<size_t>(t * ldo + j);
      if (j >= c.k) {
        uint32_t bits;
        std::memcpy(&bits, &w[at], 4);
        if (bits != kWSentinel || ids[at] != kIdSentinel) {
          if (bad++ < 5) msg << "\n  padding column " << j << " of row " << t << " was written";
        }
        continue;
      }
      const size_t ra = static_cast<size_t>(t * c.k + j);
      const double want = r.w[ra];
      const double err = std::fabs(double(w[at]) - want);
      if (ids[at] != r.ids[ra] || !(err <= std::ldexp(std::fabs(want), -22))) {
        if (bad++ < 5)
          msg << "\n  token " << t << " slot " << j << ": id " << ids[at] << " weight " << w[at]
              << ", reference id " << r.ids[ra] << " weight " << want;
      }
    }
  }
  if (bad)
    return ::testing::AssertionFailure()
           << case_str(c) << ": " << bad << " mismatches" << msg.str();
  return ::testing::AssertionSuccess();
}

std::vector<float> random_bias(int64_t e, uint32_t seed) {
  // DeepSeek-V3's correction biases are of the order of the sigmoid scores.
  return random_f32(static_cast<size_t>(e), seed, -0.5f, 0.5f);
}

::testing::AssertionResult run_random(const RoutingCase& c) {
  const uint32_t seed = seed_of({static_cast<int64_t>(c.kind), c.t, c.e, c.k, c.groups,
                                 c.topk_group, c.bias, static_cast<int64_t>(c.dtype)});
  return run_case(c, random_logits(c, seed), random_bias(c.e, seed + 1));
}

// ---------------------------------------------------------------------------
// Plain top-k over the E × k grid, both scores, f32 and bf16, with and without
// renormalization.

class TopK : public IsaTestWithParam<RoutingCase> {};

TEST_P(TopK, MatchesReference) {
  EXPECT_TRUE(run_random(GetParam()));
}

std::vector<RoutingCase> topk_cases() {
  std::vector<RoutingCase> v;
  for (Kind kind : {Kind::softmax, Kind::sigmoid})
    for (int64_t e : {1, 8, 64, 128, 256, 384})
      for (int64_t k : {1, 2, 6, 8})
        for (DType dt : {DType::f32, DType::bf16})
          for (bool renorm : {true, false}) {
            if (k > e) continue;
            RoutingCase c;
            c.kind = kind, c.e = e, c.k = k, c.dtype = dt, c.renormalize = renorm;
            v.push_back(c);
          }
  // k = E: every expert, sorted. k past the max passes (16, see
  // ops/moe_routing.cpp): the partial_sort branch.
  for (Kind kind : {Kind::softmax, Kind::sigmoid})
    for (auto [e, k] :
         {std::pair<int64_t, int64_t>{6, 6}, {64, 16}, {128, 17}, {64, 64}, {384, 40}}) {
      RoutingCase c;
      c.kind = kind, c.e = e, c.k = k;
      v.push_back(c);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Routing, TopK, ::testing::ValuesIn(topk_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Strided logits (NaN in the padding: reading it would change the result) and
// strided outputs (padding must keep its sentinel), single token, many tokens.
class TopKLayout : public IsaTestWithParam<RoutingCase> {};

TEST_P(TopKLayout, MatchesReference) {
  EXPECT_TRUE(run_random(GetParam()));
}

std::vector<RoutingCase> layout_cases() {
  std::vector<RoutingCase> v;
  for (Kind kind : {Kind::softmax, Kind::sigmoid, Kind::grouped})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t t : {1, 1000}) {
        RoutingCase c;
        c.kind = kind, c.t = t, c.e = 64, c.k = 6, c.dtype = dt;
        c.row_pad = 13, c.out_pad = 3;
        if (kind == Kind::grouped) c.groups = 8, c.topk_group = 3, c.bias = true;
        v.push_back(c);
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Routing, TopKLayout, ::testing::ValuesIn(layout_cases()),
                         [](const auto& p) { return case_str(p.param); });

// ---------------------------------------------------------------------------
// Grouped top-k.

class Grouped : public IsaTestWithParam<RoutingCase> {};

TEST_P(Grouped, MatchesReference) {
  EXPECT_TRUE(run_random(GetParam()));
}

RoutingCase grouped(int64_t e, int groups, int topk_group, int64_t k, RouterScore score, bool bias,
                    float scale = 1.0f, bool renorm = true, DType dt = DType::f32) {
  RoutingCase c;
  c.kind = Kind::grouped, c.e = e, c.groups = groups, c.topk_group = topk_group, c.k = k;
  c.score = score, c.bias = bias, c.scale = scale, c.renormalize = renorm, c.dtype = dt;
  return c;
}

std::vector<RoutingCase> grouped_cases() {
  using S = RouterScore;
  return {
      // DeepSeek-V3 / R1: 256 experts, 8 groups, 4 kept, top-8, sigmoid +
      // correction bias, scaled by 2.5.
      grouped(256, 8, 4, 8, S::sigmoid, true, 2.5f),
      grouped(256, 8, 4, 8, S::sigmoid, true, 2.5f, false),
      grouped(256, 8, 4, 8, S::sigmoid, true, 2.5f, true, DType::bf16),
      // DeepSeek-V2-like: softmax, no bias, group max.
      grouped(64, 4, 2, 6, S::softmax, false),
      grouped(64, 4, 2, 6, S::softmax, false, 1.0f, false),
      grouped(160, 8, 3, 6, S::softmax, false, 16.0f, false),
      // Shapes sgl-kernel's fixed-size kernels do not take: 3 groups of 32, k = 5.
      grouped(96, 3, 2, 5, S::sigmoid, true),
      grouped(96, 3, 2, 5, S::softmax, false),
      // Groups of a single expert (the "top two" of a group is its one key).
      grouped(8, 8, 4, 2, S::sigmoid, true),
      grouped(8, 8, 4, 2, S::softmax, false),
      // One group: plain top-k with a bias; k = every kept expert.
      grouped(64, 1, 1, 8, S::sigmoid, true),
      grouped(48, 4, 2, 24, S::sigmoid, true),
      grouped(384, 8, 8, 8, S::softmax, true),
  };
}

INSTANTIATE_TEST_SUITE_P(Routing, Grouped, ::testing::ValuesIn(grouped_cases()),
                         [](const auto& p) { return case_str(p.param); });

// ---------------------------------------------------------------------------
// Ties: equal scores go to the lower expert id, equal group scores to the
// lower group.

class RoutingTies : public IsaTest {};

TEST_F(RoutingTies, EqualLogitsPickLowerIds) {
  for (Kind kind : {Kind::softmax, Kind::sigmoid})
    for (DType dt : {DType::f32, DType::bf16}) {
      RoutingCase c;
      c.kind = kind, c.t = 4, c.e = 8, c.k = 3, c.dtype = dt;
      // Row 0: all equal. Row 1: {1, 3, 3, 2, 3, 0, 3, 1}: the 3s at 1, 2, 4
      // win over the one at 6. Row 2: the best is unique, then a tie of two.
      // Row 3: ties everywhere but at the bottom.
      std::vector<double> l = {0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5,  //
                               1,   3,   3,   2,   3,   0,   3,   1,    //
                               -1,  2,   -1,  5,   2,   -1,  -1,  -1,   //
                               1,   1,   1,   1,   -2,  1,   1,   1};
      ASSERT_TRUE(run_case(c, l, {}));
    }
  // Spot-check the expectation itself (the reference could share a bug).
  std::vector<float> w(3);
  std::vector<int32_t> ids(3);
  const std::vector<float> l = {1, 3, 3, 2, 3, 0, 3, 1};
  topk_softmax(TensorView(l.data(), DType::f32, {1, 8}), TensorView(w.data(), DType::f32, {1, 3}),
               TensorView(ids.data(), DType::i32, {1, 3}));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 4}));
  for (float f : w) EXPECT_NEAR(f, 1.0 / 3, 1e-7);
  // −0 and +0 are equal logits: a tie, so the lower id first whichever sign
  // it has (the selection compares bits, where they differ).
  for (const std::vector<float>& z :
       {std::vector<float>{-1, 0.0f, -0.0f, -2}, std::vector<float>{-1, -0.0f, 0.0f, -2}}) {
    std::vector<float> w2(2);
    std::vector<int32_t> ids2(2);
    topk_sigmoid(TensorView(z.data(), DType::f32, {1, 4}),
                 TensorView(w2.data(), DType::f32, {1, 2}),
                 TensorView(ids2.data(), DType::i32, {1, 2}));
    EXPECT_EQ(ids2, (std::vector<int32_t>{1, 2}));
  }
}

TEST_F(RoutingTies, EqualGroupsPickLowerGroups) {
  // 4 groups of 4; groups 1 and 3 tie for best, group 2 next: with
  // topk_group = 2 groups 1 and 3 are kept (not 2), and within them the
  // tie between experts 5 and 13 goes to 5.
  const std::vector<float> l = {0, 0, 0, 0,  //
                                0, 2, 1, 0,  //
                                1, 1, 1, 1,  //
                                0, 2, 1, 0};
  for (bool bias : {false, true}) {
    RoutingCase c = grouped(16, 4, 2, 3, RouterScore::sigmoid, bias);
    c.t = 1;
    std::vector<double> ld(l.begin(), l.end());
    const std::vector<float> zero_bias(16, 0.0f);
    ASSERT_TRUE(run_case(c, ld, zero_bias));
    std::vector<float> w(3);
    std::vector<int32_t> ids(3);
    GroupedTopkOptions o;
    o.num_expert_group = 4, o.topk_group = 2;
    if (bias) o.correction_bias = TensorView(zero_bias.data(), DType::f32, {16});
    grouped_topk(TensorView(l.data(), DType::f32, {1, 16}),
                 TensorView(w.data(), DType::f32, {1, 3}),
                 TensorView(ids.data(), DType::i32, {1, 3}), o);
    // Without bias, groups score by their max: 1 and 3 (2.0) beat 2 (1.0).
    // With bias, the sum of the top two: 1 and 3 (σ(2)+σ(1)) beat 2 (2σ(1)).
    EXPECT_EQ(ids, (std::vector<int32_t>{5, 13, 6}));
  }
}

TEST_F(RoutingTies, BiasSteersSelectionNotWeights) {
  // The bias pushes expert 0 (lowest score) into the selection; its weight is
  // still its own σ(logit), renormalized among the chosen.
  const std::vector<float> l = {-2, 1, 0.5, 0};
  const std::vector<float> b = {5, 0, 0, 0};
  std::vector<float> w(2);
  std::vector<int32_t> ids(2);
  GroupedTopkOptions o;
  o.correction_bias = TensorView(b.data(), DType::f32, {4});
  o.routed_scaling_factor = 2.0f;
  grouped_topk(TensorView(l.data(), DType::f32, {1, 4}), TensorView(w.data(), DType::f32, {1, 2}),
               TensorView(ids.data(), DType::i32, {1, 2}), o);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 1}));
  const double s0 = 1 / (1 + std::exp(2.0)), s1 = 1 / (1 + std::exp(-1.0));
  EXPECT_NEAR(w[0], 2 * s0 / (s0 + s1), 1e-6);
  EXPECT_NEAR(w[1], 2 * s1 / (s0 + s1), 1e-6);
}

TEST_F(RoutingTies, NoTokensIsANoOp) {
  std::vector<float> l(8), w(2, 42.0f);
  std::vector<int32_t> ids(2, 42);
  EXPECT_NO_THROW(topk_softmax(TensorView(l.data(), DType::f32, {0, 8}),
                               TensorView(w.data(), DType::f32, {0, 2}),
                               TensorView(ids.data(), DType::i32, {0, 2})));
  EXPECT_EQ(w[0], 42.0f);
  EXPECT_EQ(ids[0], 42);
}

// ---------------------------------------------------------------------------
// Errors: each names the argument, the value and what is allowed.

class RoutingErrors : public IsaTest {
 protected:
  std::vector<float> logits = std::vector<float>(4 * 16, 0.0f);
  std::vector<float> w = std::vector<float>(4 * 16);
  std::vector<int32_t> ids = std::vector<int32_t>(4 * 16);
  std::vector<float> bias = std::vector<float>(32);

  TensorView L(std::vector<int64_t> shape, DType dt = DType::f32) {
    return TensorView(logits.data(), dt, std::move(shape));
  }
  TensorView W(std::vector<int64_t> shape, DType dt = DType::f32) {
    return TensorView(w.data(), dt, std::move(shape));
  }
  TensorView I(std::vector<int64_t> shape, DType dt = DType::i32) {
    return TensorView(ids.data(), dt, std::move(shape));
  }
};

TEST_F(RoutingErrors, Shapes) {
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16, 1}), W({4, 2}), I({4, 2}));
      },
      {"topk_softmax", "logits", "rank 3", "allowed: rank 2"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 0}), W({4, 1}), I({4, 1}));
      },
      {"logits", "E = 0", "allowed: E >= 1"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_sigmoid(L({4, 16}), W({4, 2}), I({3, 2}));
      },
      {"topk_sigmoid", "topk_ids", "[3, 2]", "T = 4"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 3}), I({4, 2}));
      },
      {"topk_weights", "[4, 3]", "[4, 2]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 17}), I({4, 17}));
      },
      {"k = 17", "1 <= k <= E = 16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 0}), I({4, 0}));
      },
      {"k = 0", "1 <= k <= E = 16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 2}), I({4}));
      },
      {"topk_ids", "rank 1", "allowed: rank 2"}));
}

TEST_F(RoutingErrors, DtypesAndStrides) {
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}, DType::f16), W({4, 2}), I({4, 2}));
      },
      {"logits.dtype=f16", "allowed: f32, bf16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 2}, DType::bf16), I({4, 2}));
      },
      {"topk_weights.dtype=bf16", "allowed: f32"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), W({4, 2}), I({4, 2}, DType::i64));
      },
      {"topk_ids.dtype=i64", "allowed: i32"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(TensorView(logits.data(), DType::f32, {4, 8}, {8, 2}), W({4, 2}), I({4, 2}));
      },
      {"logits", "innermost stride 1"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(L({4, 16}), TensorView(w.data(), DType::f32, {4, 2}, {1, 1}), I({4, 2}));
      },
      {"topk_weights", "row stride 1 < row length 2"}));
  EXPECT_TRUE(throws_with(
      [&] {
        topk_softmax(TensorView(static_cast<void*>(nullptr), DType::f32, {4, 16}), W({4, 2}),
                     I({4, 2}));
      },
      {"logits", "null"}));
}

TEST_F(RoutingErrors, Groups) {
  auto run = [&](int64_t e, int groups, int topk_group, int64_t k) {
    GroupedTopkOptions o;
    o.num_expert_group = groups, o.topk_group = topk_group;
    grouped_topk(L({2, e}), W({2, k}), I({2, k}), o);
  };
  EXPECT_TRUE(throws_with([&] { run(16, 3, 1, 2); },
                          {"grouped_topk", "num_expert_group = 3", "E = 16", "dividing E"}));
  EXPECT_TRUE(throws_with([&] { run(16, 0, 1, 2); }, {"num_expert_group = 0", ">= 1"}));
  EXPECT_TRUE(throws_with([&] { run(16, 4, 5, 2); },
                          {"topk_group = 5", "1 <= topk_group <= num_expert_group = 4"}));
  EXPECT_TRUE(throws_with([&] { run(16, 4, 0, 2); }, {"topk_group = 0"}));
  EXPECT_TRUE(throws_with([&] { run(16, 4, 2, 9); },
                          {"k = 9", "k <= topk_group * E / num_expert_group = 2 * 4 = 8"}));
  EXPECT_NO_THROW(run(16, 4, 2, 8));
  GroupedTopkOptions o;
  o.num_expert_group = 4, o.topk_group = 2, o.routed_scaling_factor = NAN;
  EXPECT_TRUE(throws_with(
      [&] {
        grouped_topk(L({2, 16}), W({2, 8}), I({2, 8}), o);
      },
      {"grouped_topk", "routed_scaling_factor=nan", "a finite value"}));
}

TEST_F(RoutingErrors, CorrectionBias) {
  GroupedTopkOptions o;
  o.correction_bias = TensorView(bias.data(), DType::f32, {15});
  EXPECT_TRUE(throws_with(
      [&] {
        grouped_topk(L({2, 16}), W({2, 2}), I({2, 2}), o);
      },
      {"correction_bias", "[15]", "allowed: [E] = [16]"}));
  o.correction_bias = TensorView(bias.data(), DType::bf16, {16});
  EXPECT_TRUE(throws_with(
      [&] {
        grouped_topk(L({2, 16}), W({2, 2}), I({2, 2}), o);
      },
      {"correction_bias.dtype=bf16", "allowed: f32"}));
  o.correction_bias = TensorView(bias.data(), DType::f32, {2, 8});
  EXPECT_TRUE(throws_with(
      [&] {
        grouped_topk(L({2, 16}), W({2, 2}), I({2, 2}), o);
      },
      {"correction_bias", "rank 2", "allowed: rank 1"}));
  // A NaN or ±Inf bias (a corrupt checkpoint) would steer every selection
  // whatever the logits: refused, naming the entry; the outputs untouched.
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::fill(bias.begin(), bias.end(), 0.0f);
    bias[5] = bad;
    std::fill(ids.begin(), ids.end(), -7);
    o.correction_bias = TensorView(bias.data(), DType::f32, {16});
    o.score = RouterScore::sigmoid;
    EXPECT_TRUE(throws_with(
        [&] {
          grouped_topk(L({2, 16}), W({2, 2}), I({2, 2}), o);
        },
        {"grouped_topk", "correction_bias[5] =", "allowed: a finite value"}));
    EXPECT_TRUE(std::all_of(ids.begin(), ids.end(), [](int32_t v) { return v == -7; }));
  }
}

}  // namespace
}  // namespace tilejit::test
