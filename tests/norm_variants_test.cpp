// layer_norm, fused_add_layer_norm and rms_norm_gated on the active ISA path
// against the double references (runtime/reference_rowwise.h), over row
// lengths that hit every tail of the 16-lane chunks and the 8-chunk sum
// blocks, every dtype pairing, weights and biases (none, f32, bf16, Gemma's
// 1 + w), padded rows, 3-D views, in-place forms, rows far from zero
// (LayerNorm's cancellation), huge / tiny / non-finite rows and threads.
//
// Bounds (runtime/reference_error_bounds.h, where each is argued):
//  - layer norms: layer_norm_output_bound (the f32 mean and its correction,
//    the corrected two-pass variance, three roundings of the output), then
//    for bf16 out one bf16 rounding;
//  - fused_add_layer_norm's residual: bit-exact (the definition's f32 sum
//    and one rounding, as fused_add_rms_norm);
//  - rms_norm_gated: gated_norm_output_bound (rms_norm's 8 units and the
//    gate activation's vector-math error), or with the gate first
//    gate_first_output_bound (the activation's error pushed through rstd).
// Inputs are exact in both (bf16 or f32 values). Every byte past a view's
// rows sits before a PROT_NONE page; padding between rows keeps its bits.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "row_operand.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_rowwise.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

enum class Vec { none, f32, bf16, bf16_plus_one };  // a weight (plus_one: Gemma) or a bias

const char* vec_str(Vec v) {
  const char* s[] = {"none", "f32", "bf16", "gemma"};
  return s[static_cast<int>(v)];
}
DType vec_dtype(Vec v) {
  return v == Vec::f32 ? DType::f32 : DType::bf16;
}

// A [h] weight or bias operand (none: null), random in [lo, hi].
struct VecOperand {
  std::unique_ptr<Operand> op;
  TensorView view;
  VecOperand(Vec kind, int64_t h, uint32_t seed, float lo, float hi) {
    if (kind == Vec::none) return;
    op = std::make_unique<Operand>(vec_dtype(kind), 1, h);
    op->fill_random(seed, lo, hi);
    view = op->view();
    view.shape = {h};
    view.strides = {1};
  }
  const TensorView* get() const { return op ? &view : nullptr; }
  double at(int64_t i) const { return op ? op->get(0, i) : 0.0; }
};

// ---- layer norms -----------------------------------------------------------

struct LayerCase {
  int64_t h = 64, rows = 3;
  DType x = DType::bf16, out = DType::bf16, res = DType::bf16;
  Vec weight = Vec::bf16, bias = Vec::bf16;
  bool add = false;
  bool in_place = false;
  int64_t pad = 0;
  bool three_d = false;
  float centre = 0;  // the rows' values lie in centre ± 2
  float eps = 1e-5f;
};

std::string layer_str(const LayerCase& c) {
  std::ostringstream s;
  s << (c.add ? "add_" : "") << "h" << c.h << "_r" << c.rows << "_" << dtype_name(c.x) << "_"
    << dtype_name(c.out) << "out";
  if (c.add) s << "_res" << dtype_name(c.res);
  s << "_w" << vec_str(c.weight) << "_b" << vec_str(c.bias) << (c.in_place ? "_inplace" : "")
    << (c.pad ? "_pad" + std::to_string(c.pad) : "") << (c.three_d ? "_3d" : "");
  if (c.centre != 0)  // in tenths
    s << (c.centre < 0 ? "_atminus" : "_at") << int64_t(std::fabs(c.centre) * 10);
  return s.str();
}
void PrintTo(const LayerCase& c, std::ostream* os) {
  *os << layer_str(c);
}

// Runs the case and checks out (and the residual) against the reference.
// Returns the number of mismatches.
int check_layer(const LayerCase& c, Operand& x, Operand* res, const VecOperand& w,
                const VecOperand& b, Operand& out) {
  const int64_t h = c.h;
  std::vector<double> x0(c.rows * h), r0(res ? c.rows * h : 0);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < h; ++i) {
      x0[r * h + i] = x.get(r, i);
      if (res) r0[r * h + i] = res->get(r, i);
    }
  NormOptions opt;
  opt.eps = c.eps;
  opt.weight_plus_one = c.weight == Vec::bf16_plus_one;
  const auto pick = [&](const Operand& o) { return c.three_d ? o.view3(2) : o.view(); };
  if (res)
    fused_add_layer_norm(pick(x), pick(*res), w.get(), b.get(), pick(out), opt);
  else
    layer_norm(pick(x), w.get(), b.get(), pick(out), opt);

  int bad = 0;
  std::vector<double> v(h);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      v[i] = x0[r * h + i];
      if (!res) continue;
      const float sum = runtime::reference_residual_sum(
          static_cast<float>(x0[r * h + i]), static_cast<float>(r0[r * h + i]), [&](float s) {
            return c.res == DType::f32 ? s : runtime::bf16_to_f32(runtime::f32_to_bf16(s));
          });
      v[i] = sum;
      if (res->get(r, i) != sum && ++bad <= 5)
        ADD_FAILURE() << layer_str(c) << " residual[" << r << "][" << i << "] = " << res->get(r, i)
                      << ", want " << sum << " (bit-exact)";
    }
    const runtime::ReferenceMoments m = runtime::reference_moments(v.data(), h, c.eps);
    const runtime::LayerNormRow row = runtime::layer_norm_row(v.data(), h, c.eps);
    for (int64_t i = 0; i < h; ++i) {
      const double wi = w.get() ? w.at(i) + (c.weight == Vec::bf16_plus_one ? 1.0 : 0.0) : 1.0;
      const double bi = b.at(i);
      const double ref = runtime::reference_layer_norm_value(v[i], m, wi, bi);
      const double got = out.get(r, i);
      const double tol =
          runtime::layer_norm_output_bound(row, c.eps, c.out, v[i] - m.mean, wi, bi, ref);
      if (!(std::fabs(got - ref) <= tol) && !same_special(got, ref) && ++bad <= 5)
        ADD_FAILURE() << layer_str(c) << " out[" << r << "][" << i << "] = " << got << ", want "
                      << ref << " ± " << tol;
    }
  }
  return bad;
}

class LayerNorm : public IsaTestWithParam<LayerCase> {};

TEST_P(LayerNorm, MatchesReference) {
  const LayerCase& c = GetParam();
  Operand x(c.x, c.rows, c.h, c.pad), out(c.out, c.rows, c.h, c.pad);
  const uint32_t seed = seed_of({c.h, c.rows, int(c.x), int(c.out), int(c.weight), c.add});
  x.fill_random(seed, c.centre - 2, c.centre + 2);
  std::unique_ptr<Operand> res;
  if (c.add) {
    res = std::make_unique<Operand>(c.res, c.rows, c.h, c.pad);
    res->fill_random(seed + 1, -1, 1);
  }
  const VecOperand w(c.weight, c.h, seed + 2, -2, 2), b(c.bias, c.h, seed + 3, -1, 1);
  Operand& o = c.in_place ? x : out;
  EXPECT_EQ(check_layer(c, x, res.get(), w, b, o), 0);
  EXPECT_TRUE(x.padding_intact() && o.padding_intact() && (!res || res->padding_intact()));
}

std::vector<LayerCase> layer_cases() {
  std::vector<LayerCase> v;
  // Row lengths around every chunk (16) and sum-block (8·16) boundary.
  for (int64_t h : {1, 2, 15, 16, 17, 127, 128, 129, 255, 256, 257, 1000, 2048, 4096, 5123}) {
    LayerCase c;
    c.h = h;
    v.push_back(c);
    c.add = true;
    v.push_back(c);
  }
  for (DType x : {DType::f32, DType::bf16})
    for (DType out : {DType::f32, DType::bf16})
      for (Vec w : {Vec::none, Vec::f32, Vec::bf16, Vec::bf16_plus_one})
        for (Vec b : {Vec::none, Vec::f32, Vec::bf16}) {
          LayerCase c;
          c.h = 200;
          c.x = x, c.out = out, c.weight = w, c.bias = b;
          v.push_back(c);
        }
  for (DType res : {DType::f32, DType::bf16})
    for (DType x : {DType::f32, DType::bf16}) {
      LayerCase c;
      c.h = 333;
      c.add = true;
      c.x = x, c.res = res, c.out = x;
      v.push_back(c);
    }
  // Rows far from zero (the mean's rounding must not leak into the
  // output), and rows around the one-pass variance's limit (mean² = var:
  // the values span centre ± 2, var 4/3).
  for (float centre : {1000.0f, -3.0e5f, 1.0f, 1.2f, -1.5f})
    for (bool add : {false, true}) {
      LayerCase c;
      c.h = 777;
      c.x = c.out = c.res = std::fabs(centre) < 2 && add ? DType::bf16 : DType::f32;
      c.centre = centre;
      c.add = add;
      v.push_back(c);
    }
  LayerCase c;
  c.h = 300, c.rows = 6, c.pad = 5;
  v.push_back(c);
  c.in_place = true;
  v.push_back(c);
  c.add = true;
  v.push_back(c);
  c.three_d = true;
  v.push_back(c);
  c = LayerCase{};
  c.h = 4096, c.rows = 40;  // several tasks on two threads
  c.add = true;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Rows, LayerNorm, ::testing::ValuesIn(layer_cases()),
                         [](const auto& i) { return layer_str(i.param); });

// Rows an f32 sum could not hold, and degenerate ones: huge values of both
// signs (|v|² and |v - m| overflow f32), a constant row (var 0: out = b),
// subnormal and tiny rows (eps of the smallest float), a 1e30 offset.
TEST(LayerNormValues, HugeTinyConstantAndOffsetRows) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t H = 300;
  const float big = std::numeric_limits<float>::max();
  const float sub = std::numeric_limits<float>::denorm_min();
  const std::vector<std::vector<float>> rows_by_kind = {
      {big, -big, big / 3, -big / 7, 1.0f},  // the values repeat along the row
      {3e30f, -1e30f, 2e30f},
      {1e-30f, -3e-30f, 2e-31f},
      {sub, 5 * sub, -3 * sub},
      {7.25f},                    // constant
      {1e30f, 1e30f, 1.0001e30f}  // offset far above the spread
  };
  for (const float eps : {1e-5f, sub}) {
    Operand x(DType::f32, int64_t(rows_by_kind.size()), H), out(DType::f32, x.view().shape[0], H);
    for (size_t r = 0; r < rows_by_kind.size(); ++r)
      for (int64_t i = 0; i < H; ++i)
        x.set(int64_t(r), i, rows_by_kind[r][size_t(i) % rows_by_kind[r].size()]);
    const VecOperand w(Vec::f32, H, 5, -2, 2), b(Vec::f32, H, 6, -1, 1);
    LayerCase c;
    c.h = H, c.rows = int64_t(rows_by_kind.size());
    c.x = c.out = DType::f32;
    c.eps = eps;
    EXPECT_EQ(check_layer(c, x, nullptr, w, b, out), 0) << "eps " << eps;
    for (int64_t i = 0; i < H; ++i) {
      ASSERT_TRUE(std::isfinite(out.get(0, i)) && std::isfinite(out.get(1, i))) << i;
      ASSERT_EQ(out.get(4, i), b.at(i)) << "a constant row is its bias exactly, element " << i;
    }
  }
}

// NaN in a row makes that row NaN, Inf too (v - mean is Inf - Inf); the
// other rows are untouched by either.
TEST(LayerNormValues, NanAndInfStayInTheirRow) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t H = 100;
  Operand x(DType::bf16, 4, H), out(DType::bf16, 4, H);
  x.fill_random(8);
  x.set(1, 37, std::nan(""));
  x.set(2, 99, INFINITY);
  layer_norm(x.view(), nullptr, nullptr, out.view());
  for (int64_t i = 0; i < H; ++i) {
    ASSERT_TRUE(std::isnan(out.get(1, i)) && std::isnan(out.get(2, i))) << i;
    ASSERT_TRUE(std::isfinite(out.get(0, i)) && std::isfinite(out.get(3, i))) << i;
  }
}

// A row's bits do not depend on the rows around it or the thread count.
TEST(LayerNormValues, RowAloneOrInABatchIsTheSame) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t H = 2048, T = 64;
  Operand x(DType::bf16, T, H), out(DType::bf16, T, H), one(DType::bf16, 1, H);
  x.fill_random(9, -3, 5);
  const VecOperand w(Vec::bf16, H, 10, -2, 2), b(Vec::bf16, H, 11, -1, 1);
  const int threads = num_threads();
  set_num_threads(2);
  layer_norm(x.view(), w.get(), b.get(), out.view());
  set_num_threads(threads);
  for (int64_t t : {int64_t(0), T / 2, T - 1}) {
    TensorView row = x.view();
    row.data = static_cast<uint16_t*>(row.data) + t * H;
    row.shape = {1, H};
    layer_norm(row, w.get(), b.get(), one.view());
    for (int64_t i = 0; i < H; ++i) ASSERT_EQ(out.get(t, i), one.get(0, i)) << t << " " << i;
  }
}

// ---- rms_norm_gated ----------------------------------------------------------

struct GatedCase {
  int64_t h = 64, rows = 3;
  DType x = DType::bf16, gate = DType::bf16, out = DType::bf16;
  Vec weight = Vec::bf16;
  Activation act = Activation::silu;
  bool before = true;  // norm_before_gate
  bool in_place = false;
  int64_t pad = 0;
};

std::string gated_str(const GatedCase& c) {
  std::ostringstream s;
  s << "h" << c.h << "_r" << c.rows << "_" << dtype_name(c.x) << "_gate" << dtype_name(c.gate)
    << "_" << dtype_name(c.out) << "out_w" << vec_str(c.weight) << "_" << activation_name(c.act)
    << (c.before ? "" : "_gatefirst") << (c.in_place ? "_inplace" : "")
    << (c.pad ? "_pad" + std::to_string(c.pad) : "");
  return s.str();
}
void PrintTo(const GatedCase& c, std::ostream* os) {
  *os << gated_str(c);
}

// Checks out against the reference for x, gate as they were before the call.
int check_gated(const GatedCase& c, const std::vector<double>& x0, const Operand& gate,
                const VecOperand& w, const Operand& out, float eps) {
  const int64_t h = c.h;
  int bad = 0;
  std::vector<double> v(h), e(h);
  for (int64_t r = 0; r < c.rows; ++r) {
    for (int64_t i = 0; i < h; ++i) {
      const double g = gate.get(r, i), xi = x0[r * h + i];
      v[i] = c.before ? xi : runtime::reference_gated_value(c.act, xi, g);
      e[i] = c.before ? 0.0 : runtime::gate_first_value_error(c.act, xi, g);
    }
    const double rstd = runtime::reference_rstd(v.data(), h, eps);
    const double rel = runtime::gate_first_rstd_error(v.data(), e.data(), h, eps);
    for (int64_t i = 0; i < h; ++i) {
      const double wi = w.get() ? w.at(i) : 1.0, g = gate.get(r, i);
      const double n = runtime::reference_norm_value(v[i], rstd, wi);
      const double ref = c.before ? n * runtime::reference_gate(c.act, g) : n;
      const double tol = c.before
                             ? runtime::gated_norm_output_bound(c.act, g, c.out, n, ref)
                             : runtime::gate_first_output_bound(c.out, e[i], rstd, wi, rel, ref);
      const double got = out.get(r, i);
      if (!(std::fabs(got - ref) <= tol) && !same_special(got, ref) && ++bad <= 5)
        ADD_FAILURE() << gated_str(c) << " out[" << r << "][" << i << "] = " << got << ", want "
                      << ref << " ± " << tol;
    }
  }
  return bad;
}

class Gated : public IsaTestWithParam<GatedCase> {};

TEST_P(Gated, MatchesReference) {
  const GatedCase& c = GetParam();
  Operand x(c.x, c.rows, c.h, c.pad), gate(c.gate, c.rows, c.h, c.pad),
      out(c.out, c.rows, c.h, c.pad);
  const uint32_t seed = seed_of({c.h, c.rows, int(c.x), int(c.gate), int(c.act), c.before});
  x.fill_random(seed, -3, 3);
  gate.fill_random(seed + 1, -6, 6);
  const VecOperand w(c.weight, c.h, seed + 2, -2, 2);
  std::vector<double> x0(c.rows * c.h);
  for (int64_t r = 0; r < c.rows; ++r)
    for (int64_t i = 0; i < c.h; ++i) x0[r * c.h + i] = x.get(r, i);
  GatedNormOptions opt;
  opt.act = c.act;
  opt.norm_before_gate = c.before;
  Operand& o = c.in_place ? x : out;
  rms_norm_gated(x.view(), gate.view(), w.get(), o.view(), opt);
  EXPECT_EQ(check_gated(c, x0, gate, w, o, opt.norm.eps), 0);
  EXPECT_TRUE(x.padding_intact() && gate.padding_intact() && o.padding_intact());
}

std::vector<GatedCase> gated_cases() {
  std::vector<GatedCase> v;
  for (int64_t h : {1, 15, 16, 17, 128, 129, 257, 1000, 4096})
    for (bool before : {true, false}) {
      GatedCase c;
      c.h = h;
      c.before = before;
      v.push_back(c);
    }
  for (DType x : {DType::f32, DType::bf16})
    for (DType g : {DType::f32, DType::bf16})
      for (DType out : {DType::f32, DType::bf16}) {
        GatedCase c;
        c.h = 200;
        c.x = x, c.gate = g, c.out = out, c.weight = Vec::f32;
        v.push_back(c);
      }
  for (Activation a : {Activation::none, Activation::relu, Activation::silu, Activation::gelu_tanh,
                       Activation::gelu_erf, Activation::relu2})
    for (bool before : {true, false}) {
      GatedCase c;
      c.h = 130;
      c.act = a;
      c.before = before;
      c.weight = Vec::none;
      v.push_back(c);
    }
  GatedCase c;
  c.h = 128, c.rows = 5, c.pad = 3;
  v.push_back(c);
  c.in_place = true;
  v.push_back(c);
  c.before = false;
  v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Rows, Gated, ::testing::ValuesIn(gated_cases()),
                         [](const auto& i) { return gated_str(i.param); });

// Qwen3-Next's per-head form: x a [T, H, D] view of the attention output's
// padded rows, the gate a contiguous [T, H·D] projection viewed [T, H, D]
// (operands whose leading dims coalesce differently).
TEST(GatedValues, PerHeadViewsWithDifferentStrides) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  constexpr int64_t T = 5, H = 4, D = 72, W = H * D + 24;
  Operand xbuf(DType::bf16, T, W), gbuf(DType::bf16, T * H, D), out(DType::bf16, T * H, D);
  xbuf.fill_random(40, -3, 3);
  gbuf.fill_random(41, -5, 5);
  TensorView xv = xbuf.view();
  xv.shape = {T, H, D};
  xv.strides = {W, D, 1};
  TensorView gv = gbuf.view();
  gv.shape = {T, H, D};
  gv.strides = {H * D, D, 1};
  TensorView ov = out.view();
  ov.shape = {T, H, D};
  ov.strides = {H * D, D, 1};
  const VecOperand w(Vec::bf16, D, 42, -2, 2);
  rms_norm_gated(xv, gv, w.get(), ov);
  GatedCase c;
  c.h = D, c.rows = T * H;
  std::vector<double> x0(T * H * D);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H * D; ++i) x0[t * H * D + i] = xbuf.get(t, i);
  EXPECT_EQ(check_gated(c, x0, gbuf, w, out, GatedNormOptions{}.norm.eps), 0);
}

// x·act(gate) is an f32 value (the definition): where it overflows, the row
// holds an Inf and follows the Inf rule (NaN there, 0 elsewhere) on every
// path, the scalar one included; the norm before the gate stays finite.
TEST(GatedValues, AGatedValueThatOverflowsIsInfOnEveryPath) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  Operand x(DType::f32, 1, 4), gate(DType::f32, 1, 4), out(DType::f32, 1, 4);
  for (int64_t i = 0; i < 4; ++i) {
    x.set(0, i, 1e20);
    gate.set(0, i, i == 0 ? 1e20 : 1.0);
  }
  GatedNormOptions first;
  first.norm_before_gate = false;
  rms_norm_gated(x.view(), gate.view(), nullptr, out.view(), first);
  EXPECT_TRUE(std::isnan(out.get(0, 0)));
  for (int64_t i = 1; i < 4; ++i) EXPECT_EQ(out.get(0, i), 0.0) << i;
  rms_norm_gated(x.view(), gate.view(), nullptr, out.view());
  EXPECT_NEAR(out.get(0, 0), 1e20, 1e14);  // 1·silu(1e20)
  EXPECT_NEAR(out.get(0, 1), 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
}

// ---- bad input -----------------------------------------------------------------

TEST(NormVariantErrors, Arguments) {
  Operand x(DType::bf16, 2, 8), out(DType::bf16, 2, 8), gate(DType::bf16, 2, 8),
      res(DType::bf16, 2, 8);
  x.fill_random(1);
  gate.fill_random(2);
  const VecOperand w(Vec::bf16, 8, 3, -1, 1), b(Vec::bf16, 8, 4, -1, 1);
  const VecOperand b9(Vec::bf16, 9, 5, -1, 1);
  expect_tilejit_error([&] { layer_norm(x.view(), w.get(), b9.get(), out.view()); },
                       "layer_norm: bias has shape [9]; allowed: [h] = [8]");
  Operand i8(DType::f32, 1, 8);
  TensorView bad_b = i8.view();
  bad_b.dtype = DType::i8;
  bad_b.shape = {8};
  bad_b.strides = {1};
  expect_tilejit_error([&] { layer_norm(x.view(), w.get(), &bad_b, out.view()); },
                       "layer_norm: bias");
  NormOptions zero;
  zero.eps = 0;
  expect_tilejit_error([&] { layer_norm(x.view(), w.get(), b.get(), out.view(), zero); },
                       "layer_norm: eps=0");
  NormOptions plus;
  plus.weight_plus_one = true;
  expect_tilejit_error([&] { layer_norm(x.view(), nullptr, b.get(), out.view(), plus); },
                       "weight_plus_one=true without a weight");
  // The residual may not overlap out or x; the bias may not overlap out.
  expect_tilejit_error(
      [&] { fused_add_layer_norm(x.view(), x.view(), w.get(), b.get(), out.view()); },
      "fused_add_layer_norm: residual");
  TensorView b_in_out = out.view();
  b_in_out.shape = {8};
  b_in_out.strides = {1};
  expect_tilejit_error([&] { layer_norm(x.view(), w.get(), &b_in_out, out.view()); },
                       "overlaps bias");
  // The gate: same shape as x, only read (x may be it), never out.
  Operand g3(DType::bf16, 3, 8);
  expect_tilejit_error([&] { rms_norm_gated(x.view(), g3.view(), w.get(), out.view()); },
                       "rms_norm_gated: gate has shape [3, 8]; allowed: [2, 8]");
  expect_tilejit_error([&] { rms_norm_gated(x.view(), out.view(), w.get(), out.view()); },
                       "overlaps gate");
  EXPECT_NO_THROW(rms_norm_gated(x.view(), x.view(), w.get(), out.view()));
  GatedNormOptions bad_act;
  bad_act.act = static_cast<Activation>(77);
  expect_tilejit_error([&] { rms_norm_gated(x.view(), gate.view(), w.get(), out.view(), bad_act); },
                       "rms_norm_gated:");
  GatedNormOptions nan_eps;
  nan_eps.norm.eps = NAN;
  expect_tilejit_error([&] { rms_norm_gated(x.view(), gate.view(), w.get(), out.view(), nan_eps); },
                       "rms_norm_gated: eps=nan");
  // Zero rows: a no-op.
  TensorView e = x.view(), eo = out.view();
  e.shape = {0, 8};
  eo.shape = {0, 8};
  EXPECT_NO_THROW(layer_norm(e, w.get(), b.get(), eo));
  EXPECT_NO_THROW(fused_add_layer_norm(e, eo, nullptr, nullptr, e));
  EXPECT_NO_THROW(rms_norm_gated(e, e, nullptr, eo));
}

}  // namespace
}  // namespace tilejit::test
