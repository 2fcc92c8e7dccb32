// tilejit::fused_experts (and pack_experts) against the double-precision
// reference runtime/reference_moe.h, on the active ISA path.
//
// Error bound, per output out[t, h], built from the arithmetic the API
// promises (bf16 products exact in fp32, fp32 accumulation, the act-and-mul
// result stored as bf16 between the two GEMMs, fp32 weighted sum) and scaled,
// like the gemm bound of test_util.h, by the output's own Σ|terms| rather
// than by one constant. u = 2⁻²⁴.
//
// Why not test_util's worst-case (K+2)·u·Σ|terms|: at H = 2880 it is ~0.03
// on a gate value, wider than half a bf16 ulp of most activations, so it would
// have to allow every intermediate activation to round the other way; the
// bound grows to ~40% of a row's largest output and a dropped K tail or a
// missing bias would pass. Instead the fp32 sums use the probabilistic model
// (Higham & Mary, "A new approach to probabilistic rounding error analysis",
// 2019): the rounding errors of a sum are independent and zero-mean, so the
// error of an n-term sum has rms ≤ u·√(Σ_k S_k²/3) over the partial sums S_k.
// With these inputs' zero-mean terms (|S_k| ~ √k·σ_t, E|t| = 0.75·σ_t) that is
// ≤ 0.55·u·Σ|t| in any summation order; we allow 8·u·Σ|t|, about 15 standard
// deviations. Per output:
//
//  1. Gate/up dot products (+ b13): εg = 8·u·Σ|x·w|, εu likewise.
//  2. glu(gate, up) in fp32: εg through glu's Lipschitz constant (1.1 for
//     silu and σ-swiglu, 1.13 for gelu; the clamps are 1-Lipschitz) times
//     |up|, εu times |act(gate)|, the vectorised exp/erf/tanh approximations
//     (≤ 4e-6·max(1, |gate|) relative to |up|, the gemm tests' figure), a few
//     fp32 roundings of the product: εa, doubled for headroom.
//  3. The bf16 rounding of the activation. The kernel rounds its fp32 value,
//     which lies in [a − εa, a + εa] (a the exact activation); rounding is
//     monotone, so its bf16 value lies between bf16(a − εa) and bf16(a + εa).
//     slack = the larger distance of those two from the reference's bf16(a):
//     zero unless a sits within εa of a rounding midpoint (a fraction of a
//     percent of the elements), where the two may round apart by one ulp.
//  4. Down projection (+ b2) and the weighted sum over the experts (+ the
//     shared one): 8·u·Σ|terms| each, with the slack of step 3 pushed through
//     |W2|: act_term = Σ|rsf·w|·Σ_i slack_i·|W2[h, i]|.
//  5. Output: f32 adds the reference's own f32 rounding (u·|ref|); bf16 adds
//     half a bf16 ulp of the kernel's value, ≤ 2⁻⁸·(|ref| + tol) (rigorous).
//
// The reference reports Σ|terms| and act_term per output in its one pass over
// the weights. With bf16 outputs step 5 dominates (2⁻⁸ relative); the f32
// output cases are the ones that pin the numerics: there an extra bf16
// rounding anywhere in the chain (~2⁻⁹ relative) fails by orders of magnitude.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/reference_error_bounds.h"
#include "runtime/reference_moe.h"
#include "test_util.h"
#include "tests/support/activations.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

constexpr double kU = 1.0 / (1 << 24);
// The probabilistic allowance of an fp32 sum, in units of u·Σ|terms| (see the top).
constexpr double kSumUlps = 8;

enum class Route {
  random,      // k distinct random experts per token
  one_expert,  // every token's slot j on expert (E − 1 − j): k hot experts, the rest empty
  two_ends,    // experts 0 and E − 1 only: everything between is empty
  duplicate,   // a token names the same expert in several slots (weights add up)
};

struct MoeCase {
  int64_t t = 7, h = 80, i = 48, e = 8, k = 2;
  Activation act = Activation::silu;
  bool clamped = false;
  bool plain = false;  // a non-gated MLP: w13 packed ExpertProj::up, [E, I, H], act(up)
  bool b13 = false, b2 = false;
  float rsf = 1.0f;
  int64_t shared_i = 0;      // 0: no shared expert
  bool shared_gate = false;  // MoeOptions::shared_weights (Qwen2-MoE's gated shared expert)
  int64_t hidden_pad = 0, out_pad = 0, route_pad = 0;
  DType out = DType::bf16;
  Route route = Route::random;
};

std::string case_str(const MoeCase& c) {
  std::ostringstream s;
  s << "T" << c.t << "_H" << c.h << "_I" << c.i << "_E" << c.e << "_k" << c.k << "_"
    << (c.clamped ? "swigluclamp" : activation_name(c.act));
  if (c.plain) s << "_nongated";
  if (c.b13) s << "_b13";
  if (c.b2) s << "_b2";
  if (c.rsf != 1.0f) s << "_rsf" << int(c.rsf * 100);
  if (c.shared_i) s << "_shared" << c.shared_i;
  if (c.shared_gate) s << "_gated";
  if (c.hidden_pad) s << "_hpad" << c.hidden_pad;
  if (c.out_pad) s << "_opad" << c.out_pad;
  if (c.route_pad) s << "_rpad" << c.route_pad;
  if (c.out == DType::f32) s << "_outf32";
  switch (c.route) {
    case Route::random:
      break;
    case Route::one_expert:
      s << "_oneexpert";
      break;
    case Route::two_ends:
      s << "_twoends";
      break;
    case Route::duplicate:
      s << "_dup";
      break;
  }
  return s.str();
}

void PrintTo(const MoeCase& c, std::ostream* os) {
  *os << case_str(c);
}

runtime::ReferenceGlu glu_of(const MoeCase& c) {
  runtime::ReferenceGlu g;
  g.act = c.act;
  g.clamped_swiglu = c.clamped;
  g.gated = !c.plain;
  return g;  // alpha, limit: MoeOptions' defaults (1.702, 7), the same in both structs
}

MoeOptions options_of(const MoeCase& c) {
  MoeOptions o;
  o.act = c.act;
  o.clamped_swiglu = c.clamped;
  o.routed_scaling_factor = c.rsf;
  return o;
}

// ---------------------------------------------------------------------------
// Inputs.

struct MoeData {
  std::vector<uint16_t> hidden;     // [T, H]
  std::vector<uint16_t> w13, w2;    // [E, 2I, H] (non-gated: [E, I, H]), [E, H, I]
  std::vector<float> b13, b2;       // [E, 2I] (non-gated: [E, I]), [E, H] (empty when off)
  std::vector<uint16_t> w13s, w2s;  // [2Is, H] (non-gated: [Is, H]), [H, Is]
  std::vector<float> shared_w;      // [T] (shared_gate)
  std::vector<float> weights;       // [T, k]
  std::vector<int32_t> ids;         // [T, k]
};

// Magnitudes that exercise every part of the activations: x uniform in
// [-1, 1] and w13 in [-a, a] with a = 12/√H give gate/up pre-activations of
// standard deviation √H·(1/√3)·(a/√3) = 4 for every H, so silu/gelu see both
// tails and the clamped swiglu (limit 7) clamps a few percent of its inputs;
// b13 in [-2, 2]. w2 in [-3/√I, 3/√I] keeps the outputs O(10) for every I.
MoeData make_data(const MoeCase& c) {
  const uint32_t seed = seed_of({c.t, c.h, c.i, c.e, c.k, static_cast<int64_t>(c.act), c.clamped,
                                 c.b13, c.b2, c.shared_i, static_cast<int64_t>(c.route), c.plain});
  const int64_t g = c.plain ? 1 : 2;  // w13 rows per intermediate unit
  MoeData d;
  const float a13 = static_cast<float>(12.0 / std::sqrt(double(c.h)));
  const float a2 = static_cast<float>(3.0 / std::sqrt(double(c.i)));
  d.hidden = random_bf16(static_cast<size_t>(c.t * c.h), seed, -1, 1);
  d.w13 = random_bf16(static_cast<size_t>(c.e * g * c.i * c.h), seed + 1, -a13, a13);
  d.w2 = random_bf16(static_cast<size_t>(c.e * c.h * c.i), seed + 2, -a2, a2);
  if (c.b13) d.b13 = random_f32(static_cast<size_t>(c.e * g * c.i), seed + 3, -2, 2);
  if (c.b2) d.b2 = random_f32(static_cast<size_t>(c.e * c.h), seed + 4, -1, 1);
  if (c.shared_i) {
    const float as = static_cast<float>(3.0 / std::sqrt(double(c.shared_i)));
    d.w13s = random_bf16(static_cast<size_t>(g * c.shared_i * c.h), seed + 5, -a13, a13);
    d.w2s = random_bf16(static_cast<size_t>(c.h * c.shared_i), seed + 6, -as, as);
    // σ(gate) is in (0, 1); a 0, a negative and a large weight too.
    if (c.shared_gate) {
      d.shared_w = random_f32(static_cast<size_t>(c.t), seed + 9, 0.0f, 1.0f);
      d.shared_w[0] = 0.0f;
      if (c.t > 2) d.shared_w[1] = -0.75f, d.shared_w[2] = 3.5f;
    }
  }
  d.weights = random_f32(static_cast<size_t>(c.t * c.k), seed + 7, 0.05f, 1.0f);
  d.ids.resize(static_cast<size_t>(c.t * c.k));
  std::mt19937 rng(seed + 8);
  std::vector<int32_t> perm(static_cast<size_t>(c.e));
  for (int64_t t = 0; t < c.t; ++t) {
    int32_t* id = &d.ids[t * c.k];
    switch (c.route) {
      case Route::random:
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = 0; j < c.k; ++j) {  // partial Fisher-Yates: k distinct experts
          std::uniform_int_distribution<int64_t> pick(j, c.e - 1);
          std::swap(perm[j], perm[pick(rng)]);
          id[j] = perm[j];
        }
        break;
      case Route::one_expert:
        for (int64_t j = 0; j < c.k; ++j) id[j] = static_cast<int32_t>(c.e - 1 - j);
        break;
      case Route::two_ends:
        for (int64_t j = 0; j < c.k; ++j)
          id[j] = (t + j) % 2 == 0 ? 0 : static_cast<int32_t>(c.e - 1);
        break;
      case Route::duplicate:
        for (int64_t j = 0; j < c.k; ++j) id[j] = static_cast<int32_t>((t + j / 2) % c.e);
        break;
    }
  }
  return d;
}

// ---------------------------------------------------------------------------
// The reference with the bound's ingredients, split over two threads by tokens.

// Rounds to bf16 the way a kernel's fp32 value would be (double -> f32 -> bf16,
// both round-to-nearest-even, so the composition is monotone).
double round_bf16(double v) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
}

// Step 2 and 3 of the bound above, for one intermediate activation
// (runtime/reference_error_bounds.h), with the fp32 sums at kSumUlps.
double act_slack(const runtime::ReferenceGlu& glu, const runtime::MoeActPoint& p) {
  return runtime::moe_act_slack(glu, p, kSumUlps * kU);
}

struct Reference {
  std::vector<float> out;                 // [T, H]
  std::vector<double> abs_sum, act_term;  // [T, H]
};

Reference run_reference(const MoeCase& c, const MoeData& d) {
  Reference r;
  const size_t n = static_cast<size_t>(c.t * c.h);
  r.out.resize(n);
  r.abs_sum.resize(n);
  r.act_term.resize(n);
  const runtime::ReferenceGlu glu = glu_of(c);
  auto run = [&](int64_t t0, int64_t t1) {
    runtime::ReferenceMoeArgs a;
    a.t = t1 - t0, a.h = c.h, a.i = c.i, a.e = c.e, a.k = c.k;
    a.hidden = d.hidden.data() + t0 * c.h;
    a.ld_hidden = c.h;
    a.w13 = d.w13.data();
    a.w2 = d.w2.data();
    a.topk_weights = d.weights.data() + t0 * c.k;
    a.ld_weights = c.k;
    a.topk_ids = d.ids.data() + t0 * c.k;
    a.ld_ids = c.k;
    a.glu = glu;
    a.b13 = c.b13 ? d.b13.data() : nullptr;
    a.b2 = c.b2 ? d.b2.data() : nullptr;
    a.routed_scaling_factor = c.rsf;
    if (c.shared_i) {
      a.shared_i = c.shared_i;
      a.w13s = d.w13s.data();
      a.w2s = d.w2s.data();
      if (c.shared_gate) a.shared_weights = d.shared_w.data() + t0;
    }
    a.out = r.out.data() + t0 * c.h;
    a.ld_out = c.h;
    a.abs_sum = r.abs_sum.data() + t0 * c.h;
    a.act_term = r.act_term.data() + t0 * c.h;
    a.act_slack = [&](const runtime::MoeActPoint& p) { return act_slack(glu, p); };
    runtime::reference_moe(a);
  };
  // The oracle is O(T·k·H·I) in double: use both cores (it is not the code under test).
  const int64_t mid = c.t / 2;
  std::thread other(run, mid, c.t);
  run(0, mid);
  other.join();
  return r;
}

// Steps 4 and 5 of the bound.
double out_tolerance(const MoeCase& c, double abs_sum, double act_term, double ref) {
  return runtime::moe_output_bound(c.out, abs_sum, act_term, 2 * kSumUlps * kU, ref);
}

// ---------------------------------------------------------------------------
// Running fused_experts on a case.

constexpr int64_t kGuard = 64;  // sentinel elements before and after out

struct Packed {
  PackedExperts w13, w2, w13s, w2s;
};

Packed pack(const MoeCase& c, const MoeData& d) {
  Packed p;
  const int64_t g = c.plain ? 1 : 2;
  const ExpertProj first = c.plain ? ExpertProj::up : ExpertProj::gate_up;
  p.w13 = pack_experts(TensorView(d.w13.data(), DType::bf16, {c.e, g * c.i, c.h}), first);
  p.w2 = pack_experts(TensorView(d.w2.data(), DType::bf16, {c.e, c.h, c.i}), ExpertProj::down);
  if (c.shared_i) {
    p.w13s = pack_experts(TensorView(d.w13s.data(), DType::bf16, {1, g * c.shared_i, c.h}), first);
    p.w2s =
        pack_experts(TensorView(d.w2s.data(), DType::bf16, {1, c.h, c.shared_i}), ExpertProj::down);
  }
  return p;
}

// The output as doubles, [T, H] (row stride H), or an error message.
struct FusedRun {
  std::vector<double> out;
  std::string error;  // what went wrong outside the numerics (throw, guard writes)
};

FusedRun run_fused(const MoeCase& c, const MoeData& d, const Packed& p) {
  FusedRun r;
  const int64_t ldh = c.h + c.hidden_pad, ldo = c.h + c.out_pad, ldr = c.k + c.route_pad;
  // hidden: the last row ends at a PROT_NONE page; padding columns hold NaN.
  const size_t h_elems = static_cast<size_t>(c.t > 0 ? (c.t - 1) * ldh + c.h : 1);
  GuardedBuffer hbuf(h_elems * 2);
  std::fill_n(hbuf.as<uint16_t>(), h_elems, uint16_t{0x7fc1});
  for (int64_t t = 0; t < c.t; ++t)
    std::memcpy(hbuf.as<uint16_t>() + t * ldh, d.hidden.data() + t * c.h,
                static_cast<size_t>(c.h) * 2);
  // Routing, strided too (padding poisoned: a NaN weight, an id far out of range).
  std::vector<float> w(static_cast<size_t>(std::max<int64_t>(1, c.t * ldr)), std::nanf(""));
  std::vector<int32_t> ids(w.size(), 1 << 30);
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t j = 0; j < c.k; ++j) {
      w[t * ldr + j] = d.weights[t * c.k + j];
      ids[t * ldr + j] = d.ids[t * c.k + j];
    }
  // Biases in guarded buffers too: reading past their end faults.
  std::optional<GuardedBuffer> b13buf, b2buf;
  MoeOptions o = options_of(c);
  if (c.b13) {
    b13buf.emplace(d.b13.size() * 4);
    std::memcpy(b13buf->data(), d.b13.data(), d.b13.size() * 4);
    o.b13 = TensorView(b13buf->data(), DType::f32, {c.e, (c.plain ? 1 : 2) * c.i});
  }
  if (c.b2) {
    b2buf.emplace(d.b2.size() * 4);
    std::memcpy(b2buf->data(), d.b2.data(), d.b2.size() * 4);
    o.b2 = TensorView(b2buf->data(), DType::f32, {c.e, c.h});
  }
  if (c.shared_i) {
    o.shared_w13 = &p.w13s;
    o.shared_w2 = &p.w2s;
    if (c.shared_gate) o.shared_weights = TensorView(d.shared_w.data(), DType::f32, {c.t});
  }
  const size_t esz = c.out == DType::f32 ? 4 : 2;
  const int64_t o_elems = c.t * ldo;
  std::vector<uint8_t> obuf(static_cast<size_t>(o_elems + 2 * kGuard) * esz);
  for (size_t e = 0; e < obuf.size() / esz; ++e) {
    if (esz == 4)
      std::memcpy(&obuf[e * 4], &kSentinelF32, 4);
    else
      std::memcpy(&obuf[e * 2], &kSentinelBf16, 2);
  }
  uint8_t* out = obuf.data() + kGuard * esz;
  try {
    fused_experts(TensorView(hbuf.data(), DType::bf16, {c.t, c.h}, {ldh, 1}), p.w13, p.w2,
                  TensorView(w.data(), DType::f32, {c.t, c.k}, {ldr, 1}),
                  TensorView(ids.data(), DType::i32, {c.t, c.k}, {ldr, 1}),
                  TensorView(out, c.out, {c.t, c.h}, {ldo, 1}), o);
  } catch (const std::exception& e) {
    r.error = std::string("fused_experts threw: ") + e.what();
    return r;
  }
  int64_t touched = 0;
  for (int64_t idx = -kGuard; idx < o_elems + kGuard; ++idx) {
    const bool inside = idx >= 0 && idx < o_elems && idx % ldo < c.h;
    const uint8_t* at = out + idx * static_cast<int64_t>(esz);
    const bool sentinel =
        esz == 4 ? std::memcmp(at, &kSentinelF32, 4) == 0 : std::memcmp(at, &kSentinelBf16, 2) == 0;
    if (!inside && !sentinel) ++touched;
  }
  if (touched)
    r.error = std::to_string(touched) + " elements outside out[T, H] (padding, guards) written";
  r.out.resize(static_cast<size_t>(c.t * c.h));
  for (int64_t t = 0; t < c.t; ++t)
    for (int64_t hh = 0; hh < c.h; ++hh) {
      const uint8_t* at = out + (t * ldo + hh) * static_cast<int64_t>(esz);
      if (esz == 4) {
        float f;
        std::memcpy(&f, at, 4);
        r.out[t * c.h + hh] = f;
      } else {
        uint16_t b;
        std::memcpy(&b, at, 2);
        r.out[t * c.h + hh] = bf16_to_f32(b);
      }
    }
  return r;
}

// Compares got [T, H] with the reference under the bound, scaled by `slack`
// (1 for a kernel against the oracle, 2 for two kernels against each other).
::testing::AssertionResult compare(const MoeCase& c, const std::vector<double>& got,
                                   const Reference& ref, double slack = 1.0,
                                   const char* what = "fused_experts") {
  int64_t bad = 0;
  double worst = 0, max_tol_rel = 0;
  std::ostringstream msg;
  for (int64_t t = 0; t < c.t; ++t) {
    double row_max = 0;
    for (int64_t hh = 0; hh < c.h; ++hh)
      row_max = std::max(row_max, std::fabs(double(ref.out[t * c.h + hh])));
    for (int64_t hh = 0; hh < c.h; ++hh) {
      const size_t at = static_cast<size_t>(t * c.h + hh);
      const double want = ref.out[at];
      const double tol = slack * out_tolerance(c, ref.abs_sum[at], ref.act_term[at], want);
      const double err = std::fabs(got[at] - want);
      if (std::isfinite(got[at]) && tol > 0) worst = std::max(worst, err / tol);
      if (row_max > 0) max_tol_rel = std::max(max_tol_rel, tol / row_max);
      if (!(std::isfinite(got[at]) && err <= tol)) {
        if (bad < 5)
          msg << "\n  out[" << t << ", " << hh << "] = " << got[at] << ", reference " << want
              << ", |err| " << err << " > tol " << tol << " (Σ|terms| " << ref.abs_sum[at]
              << ", act slack term " << ref.act_term[at] << ")";
        ++bad;
      }
    }
  }
  if (bad == 0)
    return ::testing::AssertionSuccess() << what << " " << case_str(c) << ": worst err/tol "
                                         << worst << ", largest tol/row max " << max_tol_rel;
  return ::testing::AssertionFailure()
         << what << " " << case_str(c) << " (active path " << isa_name(cpu_info().isa)
         << "): " << bad << " of " << c.t * c.h << " outputs outside the bound" << msg.str();
}

::testing::AssertionResult check_case(const MoeCase& c) {
  const MoeData d = make_data(c);
  const Packed p = pack(c, d);
  const FusedRun r = run_fused(c, d, p);
  if (!r.error.empty()) return ::testing::AssertionFailure() << case_str(c) << ": " << r.error;
  return compare(c, r.out, run_reference(c, d));
}

// ---------------------------------------------------------------------------
// The battery.

class FusedExperts : public IsaTestWithParam<MoeCase> {};

TEST_P(FusedExperts, MatchesReference) {
  const auto result = check_case(GetParam());
  EXPECT_TRUE(result);
  if (result) RecordProperty("detail", result.message());
}

MoeCase mk(int64_t t, int64_t h, int64_t i, int64_t e, int64_t k) {
  MoeCase c;
  c.t = t, c.h = h, c.i = i, c.e = e, c.k = k;
  return c;
}

// E × k × T on a small odd shape (H = 80: one full 64-column block of the down
// projection and a 16-column tail; I = 48: one 32-wide gate/up block and a
// 16-wide tail; K tails of 80 % 32 and 48 % 32 in both GEMMs).
std::vector<MoeCase> grid_cases() {
  std::vector<MoeCase> v;
  for (int64_t e : {1, 8, 64, 256})
    for (int64_t k : {1, 2, 8})
      for (int64_t t : {1, 7, 64, 1000}) {
        if (k > e) continue;
        if (t == 1000 && e == 1) continue;  // covered by the hot-expert cases below
        MoeCase c = mk(t, 80, 48, e, k);
        if (t == 7) c.out = DType::f32;  // the tight bound (see the top)
        v.push_back(c);
      }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Grid, FusedExperts, ::testing::ValuesIn(grid_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Every gated activation, with and without biases, on tails of every kind.
std::vector<MoeCase> activation_cases() {
  std::vector<MoeCase> v;
  for (int variant = 0; variant < 4; ++variant)
    for (bool bias : {false, true})
      for (auto [h, i] : {std::pair<int64_t, int64_t>{80, 40}, {130, 72}}) {
        MoeCase c = mk(33, h, i, 8, 2);
        if (variant == 3)
          c.clamped = true;
        else
          c.act = variant == 0   ? Activation::silu
                  : variant == 1 ? Activation::gelu_tanh
                                 : Activation::gelu_erf;
        c.b13 = c.b2 = bias;
        if (h == 130) c.out = DType::f32;
        v.push_back(c);
      }
  // Clamped swiglu on a hot expert: the clamp engages on many rows at once.
  MoeCase c = mk(300, 64, 96, 4, 1);
  c.clamped = true, c.b13 = c.b2 = true, c.route = Route::one_expert;
  v.push_back(c);
  // Only one of the two biases.
  c = mk(20, 80, 48, 8, 2);
  c.b13 = true;
  v.push_back(c);
  c.b13 = false, c.b2 = true;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Activations, FusedExperts, ::testing::ValuesIn(activation_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Non-gated experts (w13 packed ExpertProj::up: Nemotron-H's relu2 MLPs):
// every activation on I with and without a 64-column tail (48, 100, 128), H
// tails, biases, a non-gated shared expert, the routed scaling factor, a
// hot expert (row chunks) and decode.
std::vector<MoeCase> nongated_cases() {
  std::vector<MoeCase> v;
  int variant = 0;
  for (Activation act : testing_support::all_activations())
    for (int64_t i : {48, 100}) {
      MoeCase c = mk(variant % 2 ? 33 : 5, 80, i, 8, 2);
      c.plain = true, c.act = act;
      c.b13 = c.b2 = variant % 3 == 0;
      if (variant % 4 == 1) c.out = DType::f32;
      ++variant;
      v.push_back(c);
    }
  // Nemotron-H-like: relu2, a shared expert, rsf 2.5, at decode and prefill.
  for (int64_t t : {1, 64}) {
    MoeCase c = mk(t, 130, 128, 16, 6);
    c.plain = true, c.act = Activation::relu2, c.rsf = 2.5f, c.shared_i = 72;
    v.push_back(c);
  }
  MoeCase c = mk(300, 64, 96, 4, 1);
  c.plain = true, c.act = Activation::relu2, c.b13 = true, c.route = Route::one_expert;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(NonGated, FusedExperts, ::testing::ValuesIn(nongated_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Routing shapes: empty experts, every token on the same expert(s), an expert
// named twice by one token, no tokens at all.
std::vector<MoeCase> routing_cases() {
  std::vector<MoeCase> v;
  MoeCase c = mk(1000, 80, 48, 8, 1);
  c.route = Route::one_expert;  // 1000 rows on one expert: several row chunks and tiles
  v.push_back(c);
  c = mk(64, 80, 48, 8, 2);
  c.route = Route::one_expert;
  v.push_back(c);
  c = mk(64, 80, 48, 64, 2);
  c.route = Route::two_ends;  // 62 of 64 experts empty
  v.push_back(c);
  c = mk(7, 80, 48, 256, 8);
  c.route = Route::two_ends;
  v.push_back(c);
  c = mk(9, 80, 48, 8, 4);
  c.route = Route::duplicate;
  v.push_back(c);
  c = mk(1, 80, 48, 8, 8);
  c.route = Route::duplicate;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Routing, FusedExperts, ::testing::ValuesIn(routing_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Options and layouts: routed_scaling_factor, shared expert, strided rows,
// f32 output.
std::vector<MoeCase> option_cases() {
  std::vector<MoeCase> v;
  MoeCase c = mk(7, 80, 48, 64, 8);
  c.rsf = 2.5f;
  v.push_back(c);
  c.shared_i = 72;  // a shared expert of another width than the routed ones
  v.push_back(c);
  c = mk(64, 96, 40, 16, 2);
  c.shared_i = 40, c.rsf = 0.75f, c.act = Activation::gelu_tanh;
  v.push_back(c);
  c = mk(5, 80, 48, 8, 2);
  c.shared_i = 48, c.clamped = true;
  v.push_back(c);
  c = mk(33, 80, 48, 8, 2);
  c.hidden_pad = 17, c.out_pad = 5, c.route_pad = 3;
  v.push_back(c);
  c.out = DType::f32;
  v.push_back(c);
  c = mk(64, 130, 72, 8, 2);
  c.out = DType::f32, c.b13 = c.b2 = true, c.shared_i = 24, c.rsf = 2.0f;
  v.push_back(c);
  // Qwen2-MoE / Qwen3-Next: the shared expert weighted per token.
  c.shared_gate = true;
  v.push_back(c);
  c = mk(5, 80, 48, 8, 2);
  c.shared_i = 48, c.shared_gate = true, c.rsf = 0.5f;
  v.push_back(c);
  c = mk(1, 96, 40, 16, 4);  // decode
  c.shared_i = 80, c.shared_gate = true;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Options, FusedExperts, ::testing::ValuesIn(option_cases()),
                         [](const auto& p) { return case_str(p.param); });

// Model-sized layers (few tokens: the oracle is O(T·k·H·I) in double).
// GPT-OSS: H = 2880 (45 blocks of 64, K tail 0 of 32), I = 1440 (45 gate/up
// blocks, K = 1440 for the down GEMM), clamped swiglu with both biases.
// Qwen3-30B-A3B-like: H = 2048, I = 768. Mixtral-like tails: H = 1000 (N tail
// 40, K tail 8), I = 360 (K tail 8, gate/up tail 8).
std::vector<MoeCase> model_cases() {
  std::vector<MoeCase> v;
  // f32 outputs where T > 1: the tight bound (see the top).
  for (int64_t t : {1, 9}) {
    MoeCase c = mk(t, 2880, 1440, 4, 2);
    c.clamped = true, c.b13 = c.b2 = true;
    if (t > 1) c.out = DType::f32;
    v.push_back(c);
  }
  for (int64_t t : {1, 7}) {
    MoeCase c = mk(t, 2048, 768, 16, 8);
    if (t > 1) c.out = DType::f32;
    v.push_back(c);
  }
  // Mid-sized layers with many tokens: several row chunks per expert, many
  // tasks in both phases.
  MoeCase m = mk(64, 512, 768, 64, 8);
  m.out = DType::f32;
  v.push_back(m);
  m = mk(1000, 256, 192, 64, 8);
  m.b13 = m.b2 = true;
  v.push_back(m);
  MoeCase c = mk(16, 1000, 360, 8, 2);
  c.act = Activation::gelu_erf, c.shared_i = 200, c.rsf = 1.5f, c.b2 = true;
  v.push_back(c);
  c.out = DType::f32;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Models, FusedExperts, ::testing::ValuesIn(model_cases()),
                         [](const auto& p) { return case_str(p.param); });

// ---------------------------------------------------------------------------
// No tokens: nothing is written.

class FusedExpertsEdge : public IsaTest {};

TEST_F(FusedExpertsEdge, NoTokensIsANoOp) {
  const MoeCase c = mk(4, 64, 32, 4, 2);
  const MoeData d = make_data(c);
  const Packed p = pack(c, d);
  uint16_t out = kSentinelBf16;
  EXPECT_NO_THROW(fused_experts(TensorView(d.hidden.data(), DType::bf16, {0, 64}), p.w13, p.w2,
                                TensorView(d.weights.data(), DType::f32, {0, 2}),
                                TensorView(d.ids.data(), DType::i32, {0, 2}),
                                TensorView(&out, DType::bf16, {0, 64})));
  EXPECT_EQ(out, kSentinelBf16);
}

// The same MoE layer composed from the project's own gemm: gate and up as two
// f32 GEMMs (act none), glu in the test, rounded to bf16, down as an f32 GEMM,
// weighted sum in double. Both it and fused_experts are checked against the
// oracle, and against each other within twice the bound.
TEST_F(FusedExpertsEdge, MatchesComposedGemms) {
  MoeCase c = mk(7, 200, 72, 8, 2);
  c.out = DType::f32, c.b13 = c.b2 = true;
  const MoeData d = make_data(c);
  const Packed p = pack(c, d);
  const FusedRun fused = run_fused(c, d, p);
  ASSERT_TRUE(fused.error.empty()) << fused.error;
  const Reference ref = run_reference(c, d);

  const int64_t H = c.h, I = c.i;
  std::vector<double> composed(static_cast<size_t>(c.t * H), 0.0);
  std::vector<float> gate(static_cast<size_t>(I)), up(static_cast<size_t>(I)),
      down(static_cast<size_t>(H));
  std::vector<uint16_t> act(static_cast<size_t>(I));
  const runtime::ReferenceGlu glu = glu_of(c);
  for (int64_t e = 0; e < c.e; ++e) {
    const uint16_t* w13e = d.w13.data() + e * 2 * I * H;
    const PackedWeight wg = pack_weight(TensorView(w13e, DType::bf16, {I, H}));
    const PackedWeight wu = pack_weight(TensorView(w13e + I * H, DType::bf16, {I, H}));
    const PackedWeight wd = pack_weight(TensorView(d.w2.data() + e * H * I, DType::bf16, {H, I}));
    GemmOptions og, ou, od;
    og.bias = TensorView(d.b13.data() + e * 2 * I, DType::f32, {I});
    ou.bias = TensorView(d.b13.data() + e * 2 * I + I, DType::f32, {I});
    od.bias = TensorView(d.b2.data() + e * H, DType::f32, {H});
    for (int64_t t = 0; t < c.t; ++t)
      for (int64_t j = 0; j < c.k; ++j) {
        if (d.ids[t * c.k + j] != e) continue;
        const TensorView x(d.hidden.data() + t * H, DType::bf16, {1, H});
        gemm(x, wg, TensorView(gate.data(), DType::f32, {1, I}), og);
        gemm(x, wu, TensorView(up.data(), DType::f32, {1, I}), ou);
        for (int64_t i = 0; i < I; ++i)
          act[i] = f32_to_bf16(static_cast<float>(runtime::reference_glu(glu, gate[i], up[i])));
        gemm(TensorView(act.data(), DType::bf16, {1, I}), wd,
             TensorView(down.data(), DType::f32, {1, H}), od);
        const double w = double(c.rsf) * d.weights[t * c.k + j];
        for (int64_t hh = 0; hh < H; ++hh) composed[t * H + hh] += w * down[hh];
      }
  }
  EXPECT_TRUE(compare(c, composed, ref, 1.0, "composed gemm"));
  EXPECT_TRUE(compare(c, fused.out, ref, 1.0, "fused_experts"));
  // Against each other: each is within the bound of the oracle.
  Reference as_ref = ref;
  for (size_t n = 0; n < composed.size(); ++n) as_ref.out[n] = static_cast<float>(composed[n]);
  EXPECT_TRUE(compare(c, fused.out, as_ref, 2.0, "fused_experts vs composed gemm"));
}

// The routing tensors as PyTorch hands them over: int64 ids (torch.topk) and
// bf16 weights (a bf16 router), strided views of wider tensors. The weights
// are bf16 values, so the f32 call with the same values and int32 ids is the
// same computation: bit-identical outputs on every path.
TEST_F(FusedExpertsEdge, TorchRoutingDtypesMatchInt32AndF32) {
  MoeCase c = mk(9, 96, 40, 6, 3);
  MoeData d = make_data(c);
  for (float& w : d.weights) w = bf16_to_f32(f32_to_bf16(w));
  const Packed p = pack(c, d);
  const int64_t T = c.t, K = c.k, H = c.h;
  std::vector<uint16_t> want(static_cast<size_t>(T * H)), got(want.size(), kSentinelBf16);
  fused_experts(TensorView(d.hidden.data(), DType::bf16, {T, H}), p.w13, p.w2,
                TensorView(d.weights.data(), DType::f32, {T, K}),
                TensorView(d.ids.data(), DType::i32, {T, K}),
                TensorView(want.data(), DType::bf16, {T, H}));
  // Column views with a row stride of 2K (the other half garbage).
  std::vector<int64_t> ids64(static_cast<size_t>(T * 2 * K), 999);
  std::vector<uint16_t> wb(static_cast<size_t>(T * 2 * K), f32_to_bf16(std::nanf("")));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) {
      ids64[t * 2 * K + j] = d.ids[t * K + j];
      wb[t * 2 * K + j] = f32_to_bf16(d.weights[t * K + j]);
    }
  fused_experts(TensorView(d.hidden.data(), DType::bf16, {T, H}), p.w13, p.w2,
                TensorView(wb.data(), DType::bf16, {T, K}, {2 * K, 1}),
                TensorView(ids64.data(), DType::i64, {T, K}, {2 * K, 1}),
                TensorView(got.data(), DType::bf16, {T, H}));
  EXPECT_EQ(got, want);
  // Each on its own: int64 ids with f32 weights, int32 ids with bf16 weights.
  std::fill(got.begin(), got.end(), kSentinelBf16);
  fused_experts(TensorView(d.hidden.data(), DType::bf16, {T, H}), p.w13, p.w2,
                TensorView(d.weights.data(), DType::f32, {T, K}),
                TensorView(ids64.data(), DType::i64, {T, K}, {2 * K, 1}),
                TensorView(got.data(), DType::bf16, {T, H}));
  EXPECT_EQ(got, want);
  std::fill(got.begin(), got.end(), kSentinelBf16);
  fused_experts(TensorView(d.hidden.data(), DType::bf16, {T, H}), p.w13, p.w2,
                TensorView(wb.data(), DType::bf16, {T, K}, {2 * K, 1}),
                TensorView(d.ids.data(), DType::i32, {T, K}),
                TensorView(got.data(), DType::bf16, {T, H}));
  EXPECT_EQ(got, want);
}

// GPT-OSS's checkpoints ship bf16 expert biases; an engine's gate may give
// bf16 shared weights: each widens exactly, so the call equals the f32 one
// with the same values bit for bit, on every path.
TEST_F(FusedExpertsEdge, Bf16BiasesAndSharedWeightsMatchF32) {
  MoeCase c = mk(7, 96, 40, 6, 2);
  c.b13 = c.b2 = true;
  c.shared_i = 48;
  c.shared_gate = true;
  MoeData d = make_data(c);
  for (std::vector<float>* v : {&d.b13, &d.b2, &d.shared_w})
    for (float& x : *v) x = bf16_to_f32(f32_to_bf16(x));
  const Packed p = pack(c, d);
  const FusedRun want = run_fused(c, d, p);
  ASSERT_TRUE(want.error.empty()) << want.error;
  auto to_bf16 = [](const std::vector<float>& v) {
    std::vector<uint16_t> r(v.size());
    for (size_t i = 0; i < v.size(); ++i) r[i] = f32_to_bf16(v[i]);
    return r;
  };
  const std::vector<uint16_t> b13 = to_bf16(d.b13), b2 = to_bf16(d.b2), sw = to_bf16(d.shared_w);
  MoeOptions o = options_of(c);
  o.shared_w13 = &p.w13s;
  o.shared_w2 = &p.w2s;
  o.b13 = TensorView(const_cast<uint16_t*>(b13.data()), DType::bf16, {c.e, 2 * c.i});
  o.b2 = TensorView(const_cast<uint16_t*>(b2.data()), DType::bf16, {c.e, c.h});
  o.shared_weights = TensorView(const_cast<uint16_t*>(sw.data()), DType::bf16, {c.t});
  std::vector<uint16_t> got(static_cast<size_t>(c.t * c.h), kSentinelBf16);
  fused_experts(TensorView(d.hidden.data(), DType::bf16, {c.t, c.h}), p.w13, p.w2,
                TensorView(d.weights.data(), DType::f32, {c.t, c.k}),
                TensorView(d.ids.data(), DType::i32, {c.t, c.k}),
                TensorView(got.data(), DType::bf16, {c.t, c.h}), o);
  ASSERT_EQ(got.size(), want.out.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(double(bf16_to_f32(got[i])), want.out[i]) << "element " << i;
}

// The oracle itself on a hand-computed case (a test of the test): E = 2,
// H = 2, I = 1, silu, one token on expert 1 with weight 0.5, rsf 2.
class ReferenceMoe : public IsaTest {};

TEST_F(ReferenceMoe, HandComputed) {
  const std::vector<uint16_t> x = {f32_to_bf16(1.0f), f32_to_bf16(2.0f)};
  // Expert 0 is garbage; expert 1: gate row (1, 0), up row (0, 1); w2 rows (1), (-2).
  std::vector<uint16_t> w13 = {f32_to_bf16(9), f32_to_bf16(9), f32_to_bf16(9), f32_to_bf16(9),
                               f32_to_bf16(1), f32_to_bf16(0), f32_to_bf16(0), f32_to_bf16(1)};
  std::vector<uint16_t> w2 = {f32_to_bf16(9), f32_to_bf16(9), f32_to_bf16(1), f32_to_bf16(-2)};
  const float weight = 0.5f;
  const int32_t id = 1;
  const std::vector<float> b2 = {0, 0, 0.25f, 0};
  float out[2];
  runtime::ReferenceMoeArgs a;
  a.t = 1, a.h = 2, a.i = 1, a.e = 2, a.k = 1;
  a.hidden = x.data(), a.ld_hidden = 2;
  a.w13 = w13.data(), a.w2 = w2.data();
  a.topk_weights = &weight, a.ld_weights = 1;
  a.topk_ids = &id, a.ld_ids = 1;
  a.b2 = b2.data();
  a.routed_scaling_factor = 2.0;
  a.out = out, a.ld_out = 2;
  runtime::reference_moe(a);
  // gate = 1, up = 2: silu(1)·2 = 2/(1 + e⁻¹) = 1.4621..., in bf16 1.4609375.
  const double act = 1.4609375;
  EXPECT_EQ(round_bf16(2.0 / (1.0 + std::exp(-1.0))), act);
  EXPECT_DOUBLE_EQ(out[0], static_cast<float>(2.0 * 0.5 * (act * 1 + 0.25)));
  EXPECT_DOUBLE_EQ(out[1], static_cast<float>(2.0 * 0.5 * (act * -2)));
  // Clamped swiglu: gate 9 → 7, up 9 → 7: 7·σ(1.702·7)·8.
  runtime::ReferenceGlu g;
  g.clamped_swiglu = true;
  EXPECT_DOUBLE_EQ(runtime::reference_glu(g, 9, 9), 7.0 / (1 + std::exp(-1.702 * 7)) * 8);
  EXPECT_DOUBLE_EQ(runtime::reference_glu(g, -9, -9), -9.0 / (1 + std::exp(1.702 * 9)) * -6);
}

// ---------------------------------------------------------------------------
// Errors: each names the argument, the value and what is allowed, and is
// raised before anything is written.

class FusedExpertsErrors : public IsaTest {
 protected:
  static constexpr int64_t T = 3, H = 64, I = 32, E = 4, K = 2;
  MoeCase c = mk(T, H, I, E, K);
  MoeData d = make_data(c);
  Packed p = pack(c, d);
  std::vector<uint16_t> out = std::vector<uint16_t>(T * H, kSentinelBf16);

  TensorView X() const { return TensorView(d.hidden.data(), DType::bf16, {T, H}); }
  TensorView W() const { return TensorView(d.weights.data(), DType::f32, {T, K}); }
  TensorView Ids() const { return TensorView(d.ids.data(), DType::i32, {T, K}); }
  TensorView Out() { return TensorView(out.data(), DType::bf16, {T, H}); }
  bool untouched() const {
    return std::all_of(out.begin(), out.end(), [](uint16_t v) { return v == kSentinelBf16; });
  }
  void call(const MoeOptions& o = {}) { fused_experts(X(), p.w13, p.w2, W(), Ids(), Out(), o); }
};

TEST_F(FusedExpertsErrors, ValidCallPasses) {
  // The fixture's own call is valid: the failures below are the one change each makes.
  EXPECT_NO_THROW(call());
  EXPECT_FALSE(untouched());
}

TEST_F(FusedExpertsErrors, ExpertIdOutOfRange) {
  for (int32_t bad : {-1, int32_t(E), 1 << 30, -(1 << 30)}) {
    d.ids[T * K - 1] = bad;  // the last slot: every id before it is valid
    const std::string v = std::to_string(bad);
    EXPECT_TRUE(throws_with([&] { call(); }, {"fused_experts", "topk_ids", v.c_str(), "[0, 4)"}));
    EXPECT_TRUE(untouched());
  }
}

// int64 ids (torch.topk's) are checked by their 64-bit value: 2^32 would
// wrap to expert 0 if it were narrowed first.
TEST_F(FusedExpertsErrors, Int64ExpertIdOutOfRange) {
  std::vector<int64_t> ids64(d.ids.begin(), d.ids.end());
  for (int64_t bad : {int64_t{1} << 32, (int64_t{1} << 32) + 1, int64_t{-1}, int64_t{E},
                      std::numeric_limits<int64_t>::min()}) {
    ids64[T * K - 1] = bad;
    const std::string v = std::to_string(bad);
    EXPECT_TRUE(throws_with(
        [&] {
          fused_experts(X(), p.w13, p.w2, W(), TensorView(ids64.data(), DType::i64, {T, K}), Out());
        },
        {"fused_experts", "topk_ids", v.c_str(), "[0, 4)"}));
    EXPECT_TRUE(untouched());
  }
}

TEST_F(FusedExpertsErrors, MismatchedExperts) {
  // w2 with another H, another I, another E.
  auto w2_of = [&](int64_t e, int64_t h, int64_t i) {
    std::vector<uint16_t> w(static_cast<size_t>(e * h * i), 0);
    return pack_experts(TensorView(w.data(), DType::bf16, {e, h, i}), ExpertProj::down);
  };
  const PackedExperts h_bad = w2_of(E, H + 16, I);
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), p.w13, h_bad, W(), Ids(), Out()); },
                          {"w2", "80", "64"}));
  const PackedExperts i_bad = w2_of(E, H, I + 8);
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), p.w13, i_bad, W(), Ids(), Out()); },
                          {"w2", "40", "32"}));
  const PackedExperts e_bad = w2_of(E + 1, H, I);
  EXPECT_TRUE(
      throws_with([&] { fused_experts(X(), p.w13, e_bad, W(), Ids(), Out()); }, {"w2", "5", "4"}));
  // hidden of another width than w13's H.
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(TensorView(d.hidden.data(), DType::bf16, {1, H - 16}), p.w13, p.w2,
                      TensorView(d.weights.data(), DType::f32, {1, K}),
                      TensorView(d.ids.data(), DType::i32, {1, K}),
                      TensorView(out.data(), DType::bf16, {1, H - 16}));
      },
      {"hidden", "[1, 48]", "64"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, PackedForTheOtherProjection) {
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), p.w2, p.w2, W(), Ids(), Out()); },
                          {"w13", "down", "gate_up"}));
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), p.w13, p.w13, W(), Ids(), Out()); },
                          {"w2", "gate_up", "down"}));
  const PackedExperts none;
  EXPECT_TRUE(
      throws_with([&] { fused_experts(X(), none, p.w2, W(), Ids(), Out()); }, {"w13", "empty"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, Dtypes) {
  std::vector<float> xf(T * H), of(T * H);
  std::vector<uint16_t> wb(T * K);
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(TensorView(xf.data(), DType::f32, {T, H}), p.w13, p.w2, W(), Ids(), Out());
      },
      {"hidden.dtype=f32", "allowed: bf16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, TensorView(wb.data(), DType::f16, {T, K}), Ids(), Out());
      },
      {"topk_weights.dtype=f16", "allowed: f32, bf16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, W(), TensorView(d.ids.data(), DType::u8, {T, K}), Out());
      },
      {"topk_ids.dtype=u8", "allowed: i32, i64"}));
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, W(), Ids(), TensorView(of.data(), DType::f16, {T, H}));
      },
      {"out.dtype=f16", "bf16"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, RoutingShapes) {
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, TensorView(d.weights.data(), DType::f32, {T, 1}), Ids(),
                      Out());
      },
      {"topk_weights", "[3, 1]", "[3, 2]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, TensorView(d.weights.data(), DType::f32, {T - 1, K}),
                      TensorView(d.ids.data(), DType::i32, {T - 1, K}), Out());
      },
      {"topk_ids", "[2, 2]", "3"}));
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(X(), p.w13, p.w2, W(), Ids(),
                      TensorView(out.data(), DType::bf16, {T, H - 1}));
      },
      {"out", "[3, 63]", "[3, 64]"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, UnsupportedActivation) {
  for (Activation a : {Activation::relu, Activation::none, Activation::relu2}) {
    MoeOptions o;
    o.act = a;
    EXPECT_TRUE(throws_with([&] { call(o); },
                            {"act", activation_name(a), "silu", "gelu_tanh", "gelu_erf"}));
  }
  EXPECT_TRUE(untouched());
}

// Non-gated experts (w13 packed ExpertProj::up): what only a gated w13 takes,
// a b13 of the gated shape, a gated shared expert beside them, and an
// activation outside the enum are Errors naming them.
TEST_F(FusedExpertsErrors, NonGatedExperts) {
  std::vector<uint16_t> w1(static_cast<size_t>(E * I * H), 0x3c00);
  const PackedExperts up =
      pack_experts(TensorView(w1.data(), DType::bf16, {E, I, H}), ExpertProj::up);
  EXPECT_EQ(up.proj(), ExpertProj::up);
  EXPECT_EQ(up.n(), I);
  EXPECT_TRUE(throws_with(
      [&] {
        pack_experts(TensorView(w1.data(), DType::bf16, {E, I, H}), ExpertProj::up,
                     GluRows::interleaved);
      },
      {"glu_rows=interleaved with proj=up", "allowed: halves"}));
  // A down matrix has none either (the flag was ignored).
  std::vector<uint16_t> w2(static_cast<size_t>(E * H * I), 0x3c00);
  EXPECT_TRUE(throws_with(
      [&] {
        pack_experts(TensorView(w2.data(), DType::bf16, {E, H, I}), ExpertProj::down,
                     GluRows::interleaved);
      },
      {"glu_rows=interleaved with proj=down", "allowed: halves"}));
  MoeOptions o;
  o.act = Activation::relu2;
  EXPECT_NO_THROW(fused_experts(X(), up, p.w2, W(), Ids(), Out(), o));
  std::fill(out.begin(), out.end(), kSentinelBf16);
  o.clamped_swiglu = true;
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), up, p.w2, W(), Ids(), Out(), o); },
                          {"clamped_swiglu", "ExpertProj::up"}));
  o.clamped_swiglu = false;
  o.act = static_cast<Activation>(99);
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), up, p.w2, W(), Ids(), Out(), o); },
                          {"act=99", "relu2"}));
  o.act = Activation::relu2;
  std::vector<float> b13(static_cast<size_t>(E * 2 * I), 0.0f);
  o.b13 = TensorView(b13.data(), DType::f32, {E, 2 * I});
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), up, p.w2, W(), Ids(), Out(), o); },
                          {"b13", "[4, 64]", "[4, 32]"}));
  o.b13.reset();
  // A gated shared expert beside non-gated routed ones, and the reverse.
  std::vector<uint16_t> s13(static_cast<size_t>(2 * I * H), 0), s1(static_cast<size_t>(I * H), 0),
      s2(static_cast<size_t>(H * I), 0);
  const PackedExperts sh_gated =
      pack_experts(TensorView(s13.data(), DType::bf16, {1, 2 * I, H}), ExpertProj::gate_up);
  const PackedExperts sh_up =
      pack_experts(TensorView(s1.data(), DType::bf16, {1, I, H}), ExpertProj::up);
  const PackedExperts sh_down =
      pack_experts(TensorView(s2.data(), DType::bf16, {1, H, I}), ExpertProj::down);
  o.shared_w13 = &sh_gated;
  o.shared_w2 = &sh_down;
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), up, p.w2, W(), Ids(), Out(), o); },
                          {"shared_w13", "ExpertProj::gate_up", "ExpertProj::up"}));
  MoeOptions g;
  g.shared_w13 = &sh_up;
  g.shared_w2 = &sh_down;
  EXPECT_TRUE(
      throws_with([&] { call(g); }, {"shared_w13", "ExpertProj::up", "ExpertProj::gate_up"}));
  // w13 packed as down.
  EXPECT_TRUE(throws_with([&] { fused_experts(X(), p.w2, p.w2, W(), Ids(), Out(), o); },
                          {"w13", "ExpertProj::down", "ExpertProj::up"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, NonFiniteRoutedScalingFactor) {
  for (float v : {NAN, INFINITY, -INFINITY}) {
    MoeOptions o;
    o.routed_scaling_factor = v;
    EXPECT_TRUE(throws_with([&] { call(o); },
                            {"fused_experts", "routed_scaling_factor", "allowed: a finite value"}));
  }
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, OutAliasingHidden) {
  // Same buffer, same shape: the kernels read hidden rows after writing out
  // blocks, so aliasing would silently compute garbage.
  std::vector<uint16_t> buf = d.hidden;
  const std::vector<uint16_t> before = buf;
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(TensorView(buf.data(), DType::bf16, {T, H}), p.w13, p.w2, W(), Ids(),
                      TensorView(buf.data(), DType::bf16, {T, H}));
      },
      {"out", "hidden"}));
  // Partial overlap: out starts inside hidden's last row.
  std::vector<uint16_t> big(2 * T * H);
  EXPECT_TRUE(throws_with(
      [&] {
        fused_experts(TensorView(big.data(), DType::bf16, {T, H}), p.w13, p.w2, W(), Ids(),
                      TensorView(big.data() + (T - 1) * H + 1, DType::bf16, {T, H}));
      },
      {"out", "hidden"}));
  EXPECT_EQ(buf, before);
}

TEST_F(FusedExpertsErrors, Biases) {
  std::vector<float> b(E * 2 * I + E * H);
  MoeOptions o;
  o.b13 = TensorView(b.data(), DType::f32, {E, I});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"b13", "[4, 32]", "[4, 64]"}));
  o.b13.reset();
  o.b2 = TensorView(b.data(), DType::f32, {E - 1, H});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"b2", "[3, 64]", "[4, 64]"}));
  o.b2 = TensorView(b.data(), DType::f16, {E, H});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"b2.dtype=f16", "f32, bf16"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, SharedExpert) {
  MoeOptions o;
  o.shared_w13 = &p.w13;  // E = 4 experts: a shared expert is one
  o.shared_w2 = &p.w2;
  EXPECT_TRUE(throws_with([&] { call(o); }, {"shared", "4", "1"}));
  o.shared_w2 = nullptr;
  EXPECT_TRUE(throws_with([&] { call(o); }, {"shared_w13", "shared_w2"}));
  // shared_weights: only with a shared expert, f32 [T].
  std::vector<float> sw(T + 1, 0.5f);
  o = {};
  o.shared_weights = TensorView(sw.data(), DType::f32, {T});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"shared_weights given without a shared expert"}));
  const PackedExperts s13 =
      pack_experts(TensorView(d.w13.data(), DType::bf16, {1, 2 * I, H}), ExpertProj::gate_up);
  const PackedExperts s2 =
      pack_experts(TensorView(d.w2.data(), DType::bf16, {1, H, I}), ExpertProj::down);
  o.shared_w13 = &s13, o.shared_w2 = &s2;
  o.shared_weights = TensorView(sw.data(), DType::f32, {T + 1});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"shared_weights has shape [4]", "[T] = [3]"}));
  o.shared_weights = TensorView(sw.data(), DType::f16, {T});
  EXPECT_TRUE(throws_with([&] { call(o); }, {"shared_weights", "f16", "f32, bf16"}));
  EXPECT_TRUE(untouched());
}

TEST_F(FusedExpertsErrors, PackExperts) {
  std::vector<uint16_t> w(2 * 5 * 8);
  EXPECT_TRUE(throws_with(
      [&] {
        pack_experts(TensorView(w.data(), DType::bf16, {2, 5, 8}), ExpertProj::gate_up);
      },
      {"pack_experts", "[2, 5, 8]", "2I"}));
  EXPECT_TRUE(throws_with(
      [&] {
        pack_experts(TensorView(w.data(), DType::f32, {2, 4, 8}), ExpertProj::down);
      },
      {"pack_experts", "w.dtype=f32", "bf16"}));
  EXPECT_TRUE(throws_with(
      [&] {
        pack_experts(TensorView(w.data(), DType::bf16, {10, 8}), ExpertProj::down);
      },
      {"pack_experts", "rank 2", "rank 3"}));
  // The accessors report what was packed.
  EXPECT_EQ(p.w13.num_experts(), E);
  EXPECT_EQ(p.w13.proj(), ExpertProj::gate_up);
  EXPECT_EQ(p.w13.n(), I);
  EXPECT_EQ(p.w13.k(), H);
  EXPECT_EQ(p.w2.proj(), ExpertProj::down);
  EXPECT_EQ(p.w2.n(), H);
  EXPECT_EQ(p.w2.k(), I);
  EXPECT_GE(p.w13.packed_bytes(), size_t(E * 2 * I * H * 2));
}

// Packing: a round trip restores every weight (tails in I and H, the GLU's
// gate/up interleave), the layout tag names the format, and packing packed
// experts is a no-op for the same projection and an Error for the other.
TEST(PackExperts, UnpackRestoresEveryWeightAndRepackIsANoOp) {
  for (auto [e, rows, cols, proj] :
       {std::tuple{3, int64_t{2 * 40}, int64_t{80}, ExpertProj::gate_up},
        std::tuple{2, int64_t{2 * 33}, int64_t{17}, ExpertProj::gate_up},
        std::tuple{3, int64_t{80}, int64_t{40}, ExpertProj::down},
        std::tuple{1, int64_t{65}, int64_t{33}, ExpertProj::down}}) {
    SCOPED_TRACE(::testing::Message() << e << "x" << rows << "x" << cols);
    const auto w = random_bf16(size_t(e * rows * cols), seed_of({e, rows, cols}));
    const PackedExperts p = pack_experts(TensorView(w.data(), DType::bf16, {e, rows, cols}), proj);
    EXPECT_EQ(p.layout(),
              proj == ExpertProj::gate_up ? "bf16_vnni2_n64k32_glu32" : "bf16_vnni2_n64k32");
    // Strided destination rows: the padding column must stay untouched.
    const int64_t ld = cols + 3;
    std::vector<uint16_t> back(size_t(e * rows * ld), 0x7777);
    p.unpack(TensorView(back.data(), DType::bf16, {e, rows, cols}, {rows * ld, ld, 1}));
    for (int64_t x = 0; x < e; ++x)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < ld; ++c) {
          const uint16_t want = c < cols ? w[(x * rows + r) * cols + c] : uint16_t{0x7777};
          ASSERT_EQ(back[(x * rows + r) * ld + c], want) << x << "," << r << "," << c;
        }
    const PackedExperts again = pack_experts(p, proj);
    EXPECT_EQ(again.impl(), p.impl());  // the same bytes, not a second transform
    const ExpertProj other = proj == ExpertProj::gate_up ? ExpertProj::down : ExpertProj::gate_up;
    EXPECT_THROW(pack_experts(p, other), Error);
    std::vector<uint16_t> small(size_t(e * rows * cols));
    EXPECT_THROW(p.unpack(TensorView(small.data(), DType::bf16, {e, rows, cols - 1})), Error);
  }
  EXPECT_THROW(PackedExperts().unpack(TensorView()), Error);
}

}  // namespace
}  // namespace tilejit::test
