// rms_norm, fused_add_rms_norm and act_and_mul on the active ISA path against
// the double references (runtime/reference_rowwise.h, reference_glu), over
// row lengths that hit every tail of the 16-lane chunks and the 8-chunk sum
// blocks, every dtype pairing, weights (none, f32, bf16, Gemma's 1 + w),
// padded rows, 3-D views, in-place forms and threads.
//
// Bounds (runtime/reference_error_bounds.h, where each is argued):
//  - norms: rms_norm_output_bound: 8 f32 units of |ref| (the blocked f32 sum
//    of squares, rstd rounded to f32, v·rstd, ·w, 1 + w), then for bf16 out
//    one bf16 rounding (2⁻⁸);
//  - fused_add_rms_norm's residual: bit-exact (its f32 sum and one rounding
//    to the residual's dtype are the definition);
//  - act_and_mul: glu_output_bound (the activation's vector-math error,
//    moe_act_error, plus the bf16 rounding).
// Inputs are exact in both (bf16 or f32 values). Every byte past a view's
// rows sits before a PROT_NONE page; padding between rows must keep its bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "row_operand.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_rowwise.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

// ---- norms -----------------------------------------------------------------

enum class Weight { none, f32, bf16, bf16_plus_one };

struct NormCase {
  int64_t h = 64, rows = 3;
  DType x = DType::bf16, out = DType::bf16, res = DType::bf16;
  Weight weight = Weight::bf16;
  bool add = false;
  bool in_place = false;  // out is x
  int64_t pad = 0;        // elements between rows of x, residual and out
  bool three_d = false;   // [2, rows / 2, h] views
  float eps = 1e-6f;
};

std::string norm_str(const NormCase& c) {
  std::ostringstream s;
  s << (c.add ? "add_" : "") << "h" << c.h << "_r" << c.rows << "_" << dtype_name(c.x) << "_"
    << dtype_name(c.out) << "out";
  if (c.add) s << "_res" << dtype_name(c.res);
  const char* w[] = {"_nowt", "_wf32", "_wbf16", "_gemma"};
  s << w[static_cast<int>(c.weight)] << (c.in_place ? "_inplace" : "")
    << (c.pad ? "_pad" + std::to_string(c.pad) : "") << (c.three_d ? "_3d" : "");
  return s.str();
}

void PrintTo(const NormCase& c, std::ostream* os) {
  *os << norm_str(c);
}

// Runs the case on x (and residual) as given and checks out (and the new
// residual) against the references. Returns the number of mismatches.
int check_norm(const NormCase& c, Operand& x, Operand* res, const Operand* w, Operand& out) {
  const int64_t h = c.h;
  std::vector<double> x0(c.rows * h), r0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < h; ++i) x0[r * h + i] = x.get(r, i);
  if (res) {
    r0.resize(c.rows * h);
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t i = 0; i < h; ++i) r0[r * h + i] = res->get(r, i);
  }
  NormOptions opt;
  opt.eps = c.eps;
  opt.weight_plus_one = c.weight == Weight::bf16_plus_one;
  const TensorView wv = w ? w->view() : TensorView{};
  const auto pick = [&](const Operand& o) { return c.three_d ? o.view3(2) : o.view(); };
  TensorView w1 = wv;
  if (w) w1.shape = {h}, w1.strides = {1};
  if (res)
    fused_add_rms_norm(pick(x), pick(*res), w ? &w1 : nullptr, pick(out), opt);
  else
    rms_norm(pick(x), w ? &w1 : nullptr, pick(out), opt);

  int bad = 0;
  std::vector<double> v(h);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      if (!res) {
        v[i] = x0[r * h + i];
        continue;
      }
      const float sum = runtime::reference_residual_sum(
          static_cast<float>(x0[r * h + i]), static_cast<float>(r0[r * h + i]), [&](float s) {
            return c.res == DType::f32 ? s : runtime::bf16_to_f32(runtime::f32_to_bf16(s));
          });
      v[i] = sum;
      const double got = res->get(r, i);
      if (!(got == sum || (std::isnan(got) && std::isnan(sum)))) {
        if (++bad <= 5)
          ADD_FAILURE() << norm_str(c) << " residual[" << r << "][" << i << "] = " << got
                        << ", want " << sum << " (bit-exact)";
      }
    }
    const double rstd = runtime::reference_rstd(v.data(), h, c.eps);
    for (int64_t i = 0; i < h; ++i) {
      double wi = 1;
      if (w) wi = w->get(0, i) + (c.weight == Weight::bf16_plus_one ? 1.0 : 0.0);
      const double ref = runtime::reference_norm_value(v[i], rstd, wi);
      const double got = out.get(r, i);
      if (std::isfinite(ref) ? std::fabs(got - ref) <= runtime::rms_norm_output_bound(c.out, ref)
                             : same_special(got, ref))
        continue;
      if (++bad <= 5)
        ADD_FAILURE() << norm_str(c) << " out[" << r << "][" << i << "] = " << got << ", ref "
                      << ref << ", bound " << runtime::rms_norm_output_bound(c.out, ref);
    }
  }
  EXPECT_TRUE(x.padding_intact() && out.padding_intact() && (!res || res->padding_intact()))
      << norm_str(c) << ": a padding element between rows changed";
  return bad;
}

class Norm : public IsaTestWithParam<NormCase> {};

TEST_P(Norm, MatchesReference) {
  const NormCase& c = GetParam();
  const uint32_t seed = seed_of({c.h, c.rows, int(c.x), int(c.out), int(c.weight), c.add});
  Operand x(c.x, c.rows, c.h, c.pad);
  x.fill_random(seed);
  std::unique_ptr<Operand> res;
  if (c.add) {
    res = std::make_unique<Operand>(c.res, c.rows, c.h, c.pad);
    res->fill_random(seed + 1);
  }
  std::unique_ptr<Operand> w;
  if (c.weight != Weight::none) {
    w = std::make_unique<Operand>(c.weight == Weight::f32 ? DType::f32 : DType::bf16, 1, c.h);
    w->fill_random(seed + 2, -1.5f, 1.5f);
  }
  std::unique_ptr<Operand> separate;
  if (!c.in_place) separate = std::make_unique<Operand>(c.out, c.rows, c.h, c.pad);
  Operand& out = c.in_place ? x : *separate;
  EXPECT_EQ(check_norm(c, x, res.get(), w.get(), out), 0);
}

std::vector<NormCase> norm_cases() {
  std::vector<NormCase> v;
  // Row lengths around the 16-lane chunks and the two-chunk sum loop.
  for (int64_t h : {1, 2, 7, 15, 16, 17, 31, 32, 33, 48, 63, 100, 128, 1000, 4096, 5123}) {
    NormCase c;
    c.h = h;
    v.push_back(c);
    c.add = true;
    c.in_place = true;
    v.push_back(c);
  }
  for (DType x : {DType::f32, DType::bf16})
    for (DType out : {DType::f32, DType::bf16})
      for (Weight w : {Weight::none, Weight::f32, Weight::bf16, Weight::bf16_plus_one}) {
        NormCase c;
        c.h = 200;
        c.rows = 5;
        c.x = x;
        c.out = out;
        c.weight = w;
        v.push_back(c);
        c.add = true;
        c.res = x == DType::f32 ? DType::bf16 : DType::f32;  // mixed residual dtypes
        v.push_back(c);
      }
  NormCase c;
  c.h = 77;
  c.rows = 6;
  c.pad = 5;
  v.push_back(c);  // padded rows
  c.three_d = true;
  v.push_back(c);  // [2, 3, 77] views
  c.add = true;
  v.push_back(c);
  c.in_place = true;
  c.x = c.out = DType::f32;
  c.res = DType::f32;
  v.push_back(c);
  NormCase many;
  many.h = 256;
  many.rows = 301;  // several tasks on several threads
  v.push_back(many);
  many.add = true;
  many.eps = 1e-5f;
  v.push_back(many);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Rows, Norm, ::testing::ValuesIn(norm_cases()),
                         [](const auto& p) { return norm_str(p.param); });

// Values whose squares an f32 sum could not hold: huge (|x|² overflows f32),
// tiny (|x|² underflows), subnormal inputs, and an eps of the smallest float.
TEST(NormValues, HugeTinyAndSubnormalRowsNormaliseAsDefined) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  for (double scale : {1e30, 1e19, 1e-20, 1e-30, 1e-40}) {
    for (float eps : {1e-6f, std::numeric_limits<float>::denorm_min()}) {
      NormCase c;
      c.h = 50;
      c.rows = 2;
      c.x = c.out = DType::f32;
      c.eps = eps;
      Operand x(DType::f32, c.rows, c.h), out(DType::f32, c.rows, c.h);
      x.fill_random(seed_of({c.h, static_cast<int64_t>(std::log10(scale))}));
      for (int64_t i = 0; i < c.h; ++i) x.set(0, i, x.get(0, i) * scale);
      Operand w(DType::bf16, 1, c.h);
      w.fill_random(9);
      SCOPED_TRACE(testing::Message() << "scale " << scale << " eps " << eps);
      EXPECT_EQ(check_norm(c, x, nullptr, &w, out), 0);
      // The scaled row normalises like the unscaled one as long as eps is
      // negligible: outputs of magnitude ~1, never 0, Inf or NaN.
      if (eps < 1e-40 || scale >= 1e-20) {
        for (int64_t i = 0; i < c.h; ++i) EXPECT_TRUE(std::isfinite(out.get(0, i)));
      }
    }
  }
}

// NaN in a row makes that row NaN; ±Inf gives NaN where it was and 0
// elsewhere (rstd = 0); the other rows are untouched by either.
TEST(NormValues, NanAndInfStayInTheirRow) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  for (DType dt : {DType::f32, DType::bf16}) {
    NormCase c;
    c.h = 40;
    c.rows = 3;
    c.x = c.out = dt;
    c.weight = Weight::none;
    Operand x(dt, c.rows, c.h), out(dt, c.rows, c.h);
    x.fill_random(3);
    x.set(0, 17, std::numeric_limits<double>::quiet_NaN());
    x.set(1, 33, -std::numeric_limits<double>::infinity());
    EXPECT_EQ(check_norm(c, x, nullptr, nullptr, out), 0);
    EXPECT_TRUE(std::isnan(out.get(0, 0)));
    EXPECT_TRUE(std::isnan(out.get(1, 33)));
    EXPECT_EQ(out.get(1, 0), 0.0);
    EXPECT_TRUE(std::isfinite(out.get(2, 0)) && out.get(2, 0) != 0);
  }
}

// A row's bits do not depend on the rows around it or the thread count.
TEST(NormValues, RowAloneOrInABatchIsTheSame) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const int64_t h = 1000, rows = 64;
  Operand x(DType::bf16, rows, h), out(DType::bf16, rows, h), one(DType::bf16, 1, h);
  x.fill_random(11);
  Operand w(DType::bf16, 1, h);
  w.fill_random(12);
  TensorView wv = w.view();
  wv.shape = {h};
  wv.strides = {1};
  const int threads = num_threads();
  set_num_threads(2);
  rms_norm(x.view(), &wv, out.view());
  set_num_threads(threads);
  for (int64_t r : {0, 31, 63}) {
    TensorView xr = x.view();
    xr.data = static_cast<uint16_t*>(xr.data) + r * h;
    xr.shape = {1, h};
    rms_norm(xr, &wv, one.view());
    for (int64_t i = 0; i < h; ++i)
      ASSERT_EQ(one.get(0, i), out.get(r, i)) << "row " << r << " element " << i;
  }
}

// eps is an argument of the kernel, not part of it: another eps compiles nothing.
TEST(NormValues, EpsDoesNotCompileAnotherKernel) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  if (cpu_info().isa == Isa::scalar) GTEST_SKIP() << "the scalar path compiles nothing";
  Operand x(DType::bf16, 2, 96), out(DType::bf16, 2, 96);
  x.fill_random(5);
  NormOptions o;
  o.eps = 1e-5f;
  rms_norm(x.view(), nullptr, out.view(), o);
  const uint64_t compiles = cache_stats().compiles;
  for (float eps : {1e-6f, 1e-3f, 0.5f}) {
    o.eps = eps;
    rms_norm(x.view(), nullptr, out.view(), o);
  }
  EXPECT_EQ(cache_stats().compiles, compiles);
}

// Leading dims that do not collapse into one row stride: a Q/K norm over the
// heads of a fused qkv output (Qwen3's q_norm / k_norm, sglang's
// qkv[:, :Hq·D].view(T, Hq, D)), in place and into a contiguous out, and a
// transposed [H, T, D] view; the k / v columns and the padding keep their bits.
TEST(NormValues, QkNormOverFusedQkvHeads) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t T = 5, Hq = 4, Hk = 2, D = 72, W = (Hq + 2 * Hk) * D + 8;
  for (bool in_place : {true, false}) {
    Operand qkv(DType::bf16, T, W);
    qkv.fill_random(21);
    std::vector<double> before(T * W);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < W; ++i) before[t * W + i] = qkv.get(t, i);
    Operand w(DType::f32, 1, D), sep(DType::bf16, T * Hk, D);
    w.fill_random(22);
    TensorView wv = w.view();
    wv.shape = {D};
    wv.strides = {1};
    TensorView q = qkv.view(), k = qkv.view();
    q.shape = {T, Hq, D};
    q.strides = {W, D, 1};
    k.data = static_cast<uint16_t*>(k.data) + Hq * D;
    k.shape = {T, Hk, D};
    k.strides = {W, D, 1};
    NormOptions o;
    rms_norm(q, &wv, q, o);
    TensorView kout = sep.view();
    kout.shape = {T, Hk, D};
    kout.strides = {Hk * D, D, 1};
    rms_norm(k, &wv, in_place ? k : kout, o);
    std::vector<double> v(D);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < Hq + Hk; ++h) {
        const int64_t base = t * W + h * D;
        for (int64_t i = 0; i < D; ++i) v[i] = before[base + i];
        const double rstd = runtime::reference_rstd(v.data(), D, o.eps);
        for (int64_t i = 0; i < D; ++i) {
          const double ref = runtime::reference_norm_value(v[i], rstd, w.get(0, i));
          const bool in_k = h >= Hq;
          const double got =
              in_k && !in_place ? sep.get(t * Hk + (h - Hq), i) : qkv.get(t, h * D + i);
          ASSERT_LE(std::fabs(got - ref), runtime::rms_norm_output_bound(DType::bf16, ref))
              << "token " << t << " head " << h << " element " << i;
        }
      }
    // The v columns and the row padding are untouched; k too when out was separate.
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = (in_place ? Hq + Hk : Hq) * D; i < W; ++i)
        ASSERT_EQ(qkv.get(t, i), before[t * W + i]) << "token " << t << " column " << i;
  }
  // A transposed view: rows of [H, T, D] over a [T, H, D] buffer.
  Operand buf(DType::f32, 3 * 4, 16), out(DType::f32, 4 * 3, 16);
  buf.fill_random(23);
  TensorView tr = buf.view();
  tr.shape = {4, 3, 16};
  tr.strides = {16, 4 * 16, 1};
  TensorView ov = out.view();
  ov.shape = {4, 3, 16};
  ov.strides = {3 * 16, 16, 1};
  rms_norm(tr, nullptr, ov);
  std::vector<double> v(16);
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t t = 0; t < 3; ++t) {
      for (int64_t i = 0; i < 16; ++i) v[i] = buf.get(t * 4 + h, i);
      const double rstd = runtime::reference_rstd(v.data(), 16, 1e-6);
      for (int64_t i = 0; i < 16; ++i)
        ASSERT_LE(std::fabs(out.get(h * 3 + t, i) - v[i] * rstd),
                  runtime::rms_norm_output_bound(DType::f32, v[i] * rstd));
    }
}

// A weight vector in the row padding of out (or of the residual) shares no
// byte with it: accepted (the overlap check's one-period rule), and right.
TEST(NormValues, WeightInTheRowPaddingOfOut) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t T = 4, H = 64;
  Operand buf(DType::f32, T, 2 * H), x(DType::f32, T, H);
  buf.fill_random(31);
  x.fill_random(32);
  TensorView out = buf.view(), w = buf.view();
  out.shape = {T, H};
  w.data = static_cast<float*>(w.data) + 2 * H + H;  // row 1's padding
  w.shape = {H};
  w.strides = {1};
  std::vector<double> wv(H);
  for (int64_t i = 0; i < H; ++i) wv[i] = buf.get(1, H + i);
  ASSERT_NO_THROW(rms_norm(x.view(), &w, out));
  std::vector<double> v(H);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < H; ++i) v[i] = x.get(t, i);
    const double rstd = runtime::reference_rstd(v.data(), H, 1e-6);
    for (int64_t i = 0; i < H; ++i) {
      const double ref = v[i] * rstd * wv[i];
      ASSERT_LE(std::fabs(buf.get(t, i) - ref), runtime::rms_norm_output_bound(DType::f32, ref));
    }
  }
  for (int64_t i = 0; i < H; ++i) ASSERT_EQ(buf.get(1, H + i), wv[i]);  // the weight is intact
  // One element further, the weight reaches into row 2: refused.
  w.data = static_cast<float*>(w.data) + 1;
  expect_tilejit_error([&] { rms_norm(x.view(), &w, out); }, ") overlaps weight (");
}

// ---- act_and_mul -------------------------------------------------------------

struct GluCase {
  int64_t d = 64, rows = 3;
  DType x = DType::bf16, out = DType::bf16;
  Activation act = Activation::silu;
  bool clamped = false;
  bool interleaved = false;
  int64_t pad = 0;
};

std::string glu_str(const GluCase& c) {
  std::ostringstream s;
  s << "d" << c.d << "_r" << c.rows << "_" << dtype_name(c.x) << "_" << dtype_name(c.out) << "out_"
    << (c.clamped ? "swiglu" : activation_name(c.act)) << (c.interleaved ? "_il" : "")
    << (c.pad ? "_pad" + std::to_string(c.pad) : "");
  return s.str();
}

void PrintTo(const GluCase& c, std::ostream* os) {
  *os << glu_str(c);
}

class Glu : public IsaTestWithParam<GluCase> {};

TEST_P(Glu, MatchesReference) {
  const GluCase& c = GetParam();
  Operand x(c.x, c.rows, 2 * c.d, c.pad), out(c.out, c.rows, c.d, c.pad);
  // ±9 reaches past the clamped SwiGLU's limit (7) on both sides.
  x.fill_random(seed_of({c.d, c.rows, int(c.act), c.clamped, c.interleaved}), -9, 9);
  GluOptions o;
  o.act = c.act;
  o.clamped_swiglu = c.clamped;
  o.rows = c.interleaved ? GluRows::interleaved : GluRows::halves;
  act_and_mul(x.view(), out.view(), o);
  runtime::ReferenceGlu glu;
  glu.act = c.act;
  glu.clamped_swiglu = c.clamped;
  glu.alpha = o.swiglu_alpha;
  glu.limit = o.swiglu_limit;
  int bad = 0;
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.d; ++i) {
      const double g = x.get(r, c.interleaved ? 2 * i : i);
      const double u = x.get(r, c.interleaved ? 2 * i + 1 : c.d + i);
      const double ref = runtime::reference_glu(glu, g, u);
      const double tol = runtime::glu_output_bound(glu, g, u, c.out, ref);
      const double got = out.get(r, i);
      if (std::fabs(got - ref) <= tol) continue;
      if (++bad <= 5)
        ADD_FAILURE() << glu_str(c) << " out[" << r << "][" << i << "] = " << got << ", ref " << ref
                      << " (gate " << g << ", up " << u << "), bound " << tol;
    }
  EXPECT_EQ(bad, 0);
  EXPECT_TRUE(out.padding_intact() && x.padding_intact());
}

std::vector<GluCase> glu_cases() {
  std::vector<GluCase> v;
  for (int64_t d : {1, 5, 16, 17, 40, 100, 768, 1031}) {
    GluCase c;
    c.d = d;
    v.push_back(c);
    c.interleaved = true;
    v.push_back(c);
  }
  for (Activation a : {Activation::none, Activation::relu, Activation::silu, Activation::gelu_tanh,
                       Activation::gelu_erf, Activation::relu2})
    for (DType x : {DType::f32, DType::bf16}) {
      GluCase c;
      c.d = 90;
      c.act = a;
      c.x = x;
      c.out = x == DType::f32 ? DType::bf16 : DType::f32;
      v.push_back(c);
    }
  GluCase s;
  s.clamped = true;
  s.d = 130;
  v.push_back(s);
  s.interleaved = true;
  s.pad = 3;
  v.push_back(s);
  GluCase many;
  many.d = 512;
  many.rows = 129;
  many.pad = 16;
  v.push_back(many);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Rows, Glu, ::testing::ValuesIn(glu_cases()),
                         [](const auto& p) { return glu_str(p.param); });

// ---- bad input -----------------------------------------------------------------

TEST(RowwiseErrors, NormArguments) {
  Operand x(DType::bf16, 2, 8), out(DType::bf16, 2, 8), w(DType::bf16, 1, 8);
  TensorView wv = w.view();
  wv.shape = {8};
  wv.strides = {1};
  NormOptions o;
  for (float eps : {0.0f, -1e-6f, std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::infinity()}) {
    o.eps = eps;
    expect_tilejit_error([&] { rms_norm(x.view(), &wv, out.view(), o); }, "rms_norm: eps=");
  }
  o = {};
  TensorView bad_w = wv;
  bad_w.shape = {7};
  expect_tilejit_error([&] { rms_norm(x.view(), &bad_w, out.view(), o); },
                       "weight has shape [7]; allowed: [h] = [8]");
  Operand out7(DType::bf16, 2, 7);
  expect_tilejit_error([&] { rms_norm(x.view(), &wv, out7.view(), o); },
                       "out has shape [2, 7]; allowed: [2, 8]");
  TensorView f16 = x.view();
  f16.dtype = DType::f16;
  expect_tilejit_error([&] { rms_norm(f16, &wv, out.view(), o); }, "rms_norm: x");
  TensorView rank5 = x.view();
  rank5.shape = {1, 1, 1, 2, 8};
  rank5.strides = {16, 16, 16, 8, 1};
  expect_tilejit_error([&] { rms_norm(rank5, &wv, out.view(), o); }, "x has rank 5");
  TensorView strided = x.view();
  strided.shape = {2, 4};
  strided.strides = {8, 2};
  expect_tilejit_error([&] { rms_norm(strided, nullptr, strided, o); }, "the last dim contiguous");
  TensorView overlapping = x.view();  // rows 4 apart of 8: out's rows share elements
  overlapping.shape = {3, 8};
  overlapping.strides = {4, 1};
  Operand x3(DType::bf16, 3, 8);
  expect_tilejit_error([&] { rms_norm(x3.view(), nullptr, overlapping, o); }, "rms_norm: out");
  o.weight_plus_one = true;
  expect_tilejit_error([&] { rms_norm(x.view(), nullptr, out.view(), o); },
                       "weight_plus_one=true without a weight");
  o = {};
  // out overlapping x other than exactly (one row shifted) is refused;
  // exactly x (in place) is the supported form.
  Operand big(DType::bf16, 3, 8);
  TensorView lo = big.view(), hi = big.view();
  lo.shape = {2, 8};
  hi.shape = {2, 8};
  hi.data = static_cast<uint16_t*>(hi.data) + 8;
  expect_tilejit_error([&] { rms_norm(lo, &wv, hi, o); }, ") overlaps x (");
  EXPECT_NO_THROW(rms_norm(x.view(), &wv, x.view(), o));
  // The same bytes read as another dtype are not "in place".
  TensorView xb = x.view(), as_f32 = x.view();
  xb.shape = {2, 4};
  as_f32.dtype = DType::f32;
  as_f32.shape = {2, 4};
  as_f32.strides = {4, 1};
  expect_tilejit_error([&] { rms_norm(xb, nullptr, as_f32, o); }, ") overlaps x (");
  Operand x1(DType::bf16, 1, 8);
  TensorView w_as_out = w.view();  // [1, 8] over the weight's bytes
  expect_tilejit_error([&] { rms_norm(x1.view(), &wv, w_as_out, o); }, ") overlaps weight (");
}

TEST(RowwiseErrors, FusedAddArguments) {
  Operand x(DType::bf16, 2, 8), res(DType::f32, 2, 8), out(DType::bf16, 2, 8);
  NormOptions o;
  expect_tilejit_error([&] { fused_add_rms_norm(x.view(), x.view(), nullptr, out.view(), o); },
                       ") overlaps x (");
  expect_tilejit_error([&] { fused_add_rms_norm(x.view(), res.view(), nullptr, res.view(), o); },
                       ") overlaps out (");
  Operand res3(DType::f32, 3, 8);
  expect_tilejit_error([&] { fused_add_rms_norm(x.view(), res3.view(), nullptr, out.view(), o); },
                       "residual has shape [3, 8]; allowed: [2, 8]");
  o.eps = -1;
  expect_tilejit_error([&] { fused_add_rms_norm(x.view(), res.view(), nullptr, x.view(), o); },
                       "eps=-1");
  o = {};
  EXPECT_NO_THROW(fused_add_rms_norm(x.view(), res.view(), nullptr, x.view(), o));
}

TEST(RowwiseErrors, ActAndMulArguments) {
  Operand x(DType::bf16, 2, 9), x8(DType::bf16, 2, 8), out(DType::bf16, 2, 4);
  GluOptions o;
  expect_tilejit_error([&] { act_and_mul(x.view(), out.view(), o); },
                       "act_and_mul: x has shape [2, 9]; allowed: [..., 2·d]");
  Operand out5(DType::bf16, 2, 5);
  expect_tilejit_error([&] { act_and_mul(x8.view(), out5.view(), o); },
                       "out has shape [2, 5]; allowed: [2, 4]");
  TensorView half = x8.view();  // out as x's first columns
  half.shape = {2, 4};
  expect_tilejit_error([&] { act_and_mul(x8.view(), half, o); }, ") overlaps x (");
  o.act = static_cast<Activation>(42);
  expect_tilejit_error([&] { act_and_mul(x8.view(), out.view(), o); },
                       "act_and_mul: act=42 is not an activation; allowed: none, relu");
  o.clamped_swiglu = true;  // act is unused then
  EXPECT_NO_THROW(act_and_mul(x8.view(), out.view(), o));
  o = {};
  o.clamped_swiglu = true;
  o.swiglu_limit = 0;
  expect_tilejit_error([&] { act_and_mul(x8.view(), out.view(), o); }, "swiglu_limit=0");
  o.swiglu_limit = 7;
  o.swiglu_alpha = std::numeric_limits<float>::infinity();
  expect_tilejit_error([&] { act_and_mul(x8.view(), out.view(), o); }, "swiglu_alpha");
  o = {};
  o.rows = static_cast<GluRows>(7);
  expect_tilejit_error([&] { act_and_mul(x8.view(), out.view(), o); }, "rows=GluRows(7)");
}

// Zero rows are a no-op on every operator (an engine's empty batch).
TEST(RowwiseErrors, EmptyBatchIsANoOp) {
  Operand x(DType::bf16, 1, 8), out(DType::bf16, 1, 8);
  TensorView e = x.view(), eo = out.view();
  e.shape = {0, 8};
  eo.shape = {0, 8};
  EXPECT_NO_THROW(rms_norm(e, nullptr, eo));
  EXPECT_NO_THROW(fused_add_rms_norm(e, eo, nullptr, e));
  TensorView eo4 = eo;
  eo4.shape = {0, 4};
  EXPECT_NO_THROW(act_and_mul(e, eo4));
}

}  // namespace
}  // namespace tilejit::test
