// The fused activations at the ends of the float range, on the active ISA
// path: gemm (bf16, fp8 and int8 weights; f32 and bf16 outputs; decode and
// prefill row counts, so the fused quantized kernels, the AVX-512 and AMX
// micro-kernels and the LLVM ones all run), a sweep of the whole finite
// range, fused_experts' gated activations (act(gate)·up and GPT-OSS's
// clamped SwiGLU) and, on the llvm variant, the LLVM elementwise compiler.
// Every gemm / MoE pre-activation is exact on every path: w[n] is pre[n]
// truncated to bf16 (a ±1 code with scale |w[n]| for the quantized formats)
// times x = 1, plus an f32 bias of pre[n] − w[n] (an exact sum), so a
// kernel's result can only part from the double-precision definition
// (runtime/reference_gemm.h, reference_moe.h) through its activation.
//
// The bound: 2e-5·|want| + 1e-6·min(|pre|, 16). The relative part covers the
// vector exp (its argument, up to ±89, carries a few f32 roundings: ≤ 1.5e-5
// relative on e^arg) and the f32 divisions; the absolute part the erf
// approximation (1.5e-7 of 1 + erf, times |x|/2, only while 1 + erf is not
// negligible, |x| < 6) and the results that sit in or below the f32 denormals
// (silu(−100) = −3.7e-42 comes out −0). The kernels stay within a third of
// it. It does not grow with |pre|: before d3a6090 a saturated exp made
// silu / gelu_tanh(−2.5e38) −1.04 instead of −0, and gelu_erf's
// x·(1 + erf) overflowed to +Inf at x = 2.5e38 before the ·0.5 (and a MoE
// token's down projection to NaN through 0·Inf); this test fails on every
// JIT path with those two emitter changes undone. (The documented
// activation_math_error, 4e-6·max(1, |pre|), allows 1e33 there.)
// bf16 outputs are compared with the reference rounded to bf16, one bf16 ulp
// (2⁻⁷·|want|) added. Registered once per ISA path (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"
#if TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_elementwise.h"
#include "ir/parser.h"
#endif
#include "test_util.h"
#include "tests/support/activations.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

// 32 pre-activations: the extremes the outside checks used (±2.5e38, ±1e30,
// ±100, ±89, ±88.7), the edges of e^x's range (ln FLT_MAX = 88.72, the lower
// clamp −87.34), where x² or x³ overflow (1e13, 1e19), and ordinary values.
const std::vector<float>& pre_values() {
  static const std::vector<float> v = {
      0.0f,   1.0f,    -1.0f,    3.0f,     -3.0f,     10.0f,  -10.0f,  20.0f,
      -20.0f, 87.5f,   -87.5f,   88.7f,    -88.7f,    88.75f, -88.75f, 89.0f,
      -89.0f, 100.0f,  -100.0f,  1e13f,    -1e13f,    1e19f,  -1e19f,  1e30f,
      -1e30f, 2.5e38f, -2.5e38f, 3.38e38f, -3.38e38f, 0.5f,   -0.5f,   -5.0f};
  return v;
}

// pre truncated toward zero to bf16 (never rounded up to Inf), and the exact
// f32 rest: w + (pre − w) == pre in f32. Below 1e-30 w is 0 (the dot
// product instructions flush f32 denormals; the bias carries all of pre).
uint16_t bf16_trunc(float pre) {
  if (std::fabs(pre) < 1e-30f) return 0;
  uint32_t u;
  std::memcpy(&u, &pre, 4);
  return static_cast<uint16_t>(u >> 16);
}
float rest_of(float pre) {
  return pre - bf16_to_f32(bf16_trunc(pre));
}

double tolerance(double want, double pre) {
  return 2e-5 * std::fabs(want) + 1e-6 * std::min(std::fabs(pre), 16.0);
}

double round_bf16(double v) {
  return bf16_to_f32(f32_to_bf16(static_cast<float>(v)));
}

// got (an output element, f32 or bf16) against the definition's `want`.
::testing::AssertionResult close(double got, double want, double pre, DType out) {
  const double ref = out == DType::bf16 ? round_bf16(want) : double(static_cast<float>(want));
  double tol = tolerance(ref, pre);
  if (out == DType::bf16) tol = tol * 2 + std::ldexp(std::fabs(ref), -7);
  if (std::isinf(ref) ? got == ref : std::fabs(got - ref) <= tol)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "got " << got << ", want " << ref << " (bound " << tol << ")";
}

enum class Format { bf16, fp8, int8 };
const char* format_name(Format f) {
  switch (f) {
    case Format::bf16:
      return "bf16";
    case Format::fp8:
      return "fp8";
    case Format::int8:
      return "int8";
  }
  return "?";
}

struct GemmCase {
  Format format;
  int64_t m;
  DType out;
};

// The weight [N, K] whose row n is (w[n], 0, ..., 0), w[n] = pre[n]
// truncated to bf16, in `f`: bf16 as is; fp8 and int8 a code ±1 (0 for 0)
// with the per-channel scale |w[n]| (1 for 0).
PackedWeight weight_for(Format f, int64_t k, const std::vector<float>& pre) {
  const int64_t n = static_cast<int64_t>(pre.size());
  if (f == Format::bf16) {
    std::vector<uint16_t> w(size_t(n * k), 0);
    for (int64_t j = 0; j < n; ++j) w[size_t(j * k)] = bf16_trunc(pre[size_t(j)]);
    return pack_weight(TensorView(w.data(), DType::bf16, {n, k}));
  }
  std::vector<float> scales(static_cast<size_t>(n));
  std::vector<uint8_t> codes(size_t(n * k), 0);
  for (int64_t j = 0; j < n; ++j) {
    const float w = bf16_to_f32(bf16_trunc(pre[size_t(j)]));
    scales[size_t(j)] = w == 0 ? 1.0f : std::fabs(w);
    uint8_t code = 0;
    if (w != 0) {
      if (f == Format::fp8)
        code = w > 0 ? 0x38 : 0xB8;  // e4m3 ±1.0
      else
        code = static_cast<uint8_t>(w > 0 ? 1 : -1);  // i8 ±1
    }
    codes[size_t(j * k)] = code;
  }
  if (f == Format::fp8)
    return pack_weight(Fp8Weight{TensorView(codes.data(), DType::f8e4m3, {n, k}),
                                 TensorView(scales.data(), DType::f32, {n})});
  return pack_weight(Int8Weight{TensorView(codes.data(), DType::i8, {n, k}),
                                TensorView(scales.data(), DType::f32, {n})});
}

std::string case_name(const ::testing::TestParamInfo<GemmCase>& info) {
  return std::string(format_name(info.param.format)) + "_m" + std::to_string(info.param.m) + "_" +
         (info.param.out == DType::f32 ? "f32" : "bf16");
}

// Runs gemm on x = (1, 0, ..., 0) in every row against weight_for(f, pre)
// with the bias pre − w, for every activation, and checks each output.
void check_gemm(Format f, int64_t m, DType out, const std::vector<float>& pre) {
  const int64_t n = static_cast<int64_t>(pre.size()), k = 64;
  const PackedWeight w = weight_for(f, k, pre);
  std::vector<uint16_t> x(size_t(m * k), 0);
  for (int64_t i = 0; i < m; ++i) x[size_t(i * k)] = f32_to_bf16(1.0f);
  std::vector<float> bias(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) bias[size_t(j)] = rest_of(pre[size_t(j)]);
  for (Activation act : testing_support::applied_activations()) {
    GemmOptions opt;
    opt.act = act;
    opt.bias = TensorView(bias.data(), DType::f32, {n});
    if (f == Format::int8) {
      // x = 1 is the code 64 + 128 exactly; (64 − 0)·2⁻⁶·scale is exact.
      opt.act_quant = ActQuant::fixed;
      opt.act_scale = 1.0f / 64;
      opt.act_zero_point = 128;
    }
    const size_t elem = out == DType::f32 ? 4 : 2;
    std::vector<uint8_t> y(size_t(m * n) * elem, 0x5a);
    gemm(TensorView(x.data(), DType::bf16, {m, k}), w, TensorView(y.data(), out, {m, n}), opt);
    int64_t failures = 0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        const size_t o = size_t(i * n + j);
        double got;
        if (out == DType::f32) {
          float v;
          std::memcpy(&v, y.data() + o * 4, 4);
          got = v;
        } else {
          uint16_t b;
          std::memcpy(&b, y.data() + o * 2, 2);
          got = bf16_to_f32(b);
        }
        const double p = pre[size_t(j)];
        const ::testing::AssertionResult r =
            close(got, runtime::reference_activation(act, p), p, out);
        if (!r && ++failures <= 8)
          ADD_FAILURE() << activation_name(act) << "(" << p << ") row " << i << ": " << r.message();
      }
    EXPECT_EQ(failures, 0) << activation_name(act);
  }
}

class ActivationExtremesGemm : public IsaTestWithParam<GemmCase> {};

TEST_P(ActivationExtremesGemm, MatchesTheDefinition) {
  const GemmCase c = GetParam();
  check_gemm(c.format, c.m, c.out, pre_values());
}

// m = 1: the fused fp8 decode kernel and the AVX-512 bf16 / int8 brgemm (AMX
// starts at 3 rows); 5: fp8 dequantized to bf16 on amx / avx512 (fused up to
// 4 rows there), fused on llvm (up to 16); 40: AMX tiles.
INSTANTIATE_TEST_SUITE_P(
    Formats, ActivationExtremesGemm,
    ::testing::Values(GemmCase{Format::bf16, 1, DType::f32}, GemmCase{Format::bf16, 5, DType::f32},
                      GemmCase{Format::bf16, 40, DType::f32},
                      GemmCase{Format::bf16, 40, DType::bf16}, GemmCase{Format::fp8, 1, DType::f32},
                      GemmCase{Format::fp8, 5, DType::f32}, GemmCase{Format::fp8, 40, DType::bf16},
                      GemmCase{Format::int8, 1, DType::f32},
                      GemmCase{Format::int8, 40, DType::f32}),
    case_name);

// A sweep of the whole finite range, for the claim "every finite input":
// magnitudes 10^(e/8) from 1e-30 to 3.2e38 and an eighth-step grid on
// [−110, 110] (e^x's range ends, ±87.34 and ±88.72, inside it), both signs,
// and the neighbours of those ends; bf16 weights, f32 output, one row (the
// AVX-512 kernel on amx) and 40 (AMX tiles).
TEST(ActivationExtremesSweep, EveryFiniteRange) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  std::vector<float> pre;
  for (int e = -30 * 8; e <= 38 * 8 + 4; ++e) {
    const float v = static_cast<float>(std::pow(10.0, e / 8.0));
    pre.push_back(v);
    pre.push_back(-v);
  }
  for (int i = -880; i <= 880; ++i) pre.push_back(static_cast<float>(i) / 8);
  for (float edge : {88.7228391f, 87.3365448f, 89.0f, 103.97f, std::numeric_limits<float>::max()})
    for (float v : {std::nextafter(edge, 0.0f), edge, std::nextafter(edge, 1e38f)})
      if (std::isfinite(v)) {
        pre.push_back(v);
        pre.push_back(-v);
      }
  check_gemm(Format::bf16, 1, DType::f32, pre);
  check_gemm(Format::bf16, 40, DType::f32, pre);
}

// ---- fused_experts -------------------------------------------------------------

// One expert, one token route of weight 1: gate_up row i (gate) is
// (w[i], 0, ...), up row i is 0 with the bias supplying up[i]; the gate's bias
// is pre[i] − w[i]; W2 is the identity, so out[t, i] = bf16(glu(pre[i], up[i])).
struct MoeCase {
  int glu;  // 0 silu, 1 gelu_tanh, 2 gelu_erf, 3 clamped SwiGLU
  int64_t t;
};

std::string moe_case_name(const ::testing::TestParamInfo<MoeCase>& info) {
  static const char* names[] = {"silu", "gelu_tanh", "gelu_erf", "clamped_swiglu"};
  return std::string(names[info.param.glu]) + "_t" + std::to_string(info.param.t);
}

class ActivationExtremesMoe : public IsaTestWithParam<MoeCase> {};

TEST_P(ActivationExtremesMoe, MatchesTheDefinition) {
  const MoeCase c = GetParam();
  const auto& pre = pre_values();
  const int64_t inter = static_cast<int64_t>(pre.size()), h = inter, t = c.t;
  MoeOptions opt;
  runtime::ReferenceGlu rg;
  if (c.glu == 3) {
    opt.clamped_swiglu = true;
    rg.clamped_swiglu = true;
    rg.alpha = opt.swiglu_alpha;
    rg.limit = opt.swiglu_limit;
  } else {
    opt.act = c.glu == 0   ? Activation::silu
              : c.glu == 1 ? Activation::gelu_tanh
                           : Activation::gelu_erf;
    rg.act = opt.act;
  }
  // up: small for act(gate)·up (so that |act·up| stays finite); for the
  // clamped SwiGLU the extremes again (reversed), which its clamp bounds.
  std::vector<float> up(static_cast<size_t>(inter));
  for (int64_t i = 0; i < inter; ++i) {
    static const float small[] = {1.0f, -0.5f, 0.75f};
    up[size_t(i)] = c.glu == 3 ? pre[size_t(inter - 1 - i)] : small[i % 3];
  }
  std::vector<uint16_t> w13(size_t(2 * inter * h), 0), w2(size_t(h * inter), 0);
  std::vector<float> b13(size_t(2 * inter));
  for (int64_t i = 0; i < inter; ++i) {
    w13[size_t(i * h)] = bf16_trunc(pre[size_t(i)]);
    b13[size_t(i)] = rest_of(pre[size_t(i)]);
    b13[size_t(inter + i)] = up[size_t(i)];
    w2[size_t(i * inter + i)] = f32_to_bf16(1.0f);
  }
  const PackedExperts p13 =
      pack_experts(TensorView(w13.data(), DType::bf16, {1, 2 * inter, h}), ExpertProj::gate_up);
  const PackedExperts p2 =
      pack_experts(TensorView(w2.data(), DType::bf16, {1, h, inter}), ExpertProj::down);
  opt.b13 = TensorView(b13.data(), DType::f32, {1, 2 * inter});
  std::vector<uint16_t> x(size_t(t * h), 0);
  for (int64_t r = 0; r < t; ++r) x[size_t(r * h)] = f32_to_bf16(1.0f);
  const std::vector<float> wt(size_t(t), 1.0f);
  const std::vector<int32_t> ids(size_t(t), 0);
  std::vector<float> out(size_t(t * h), 123.0f);
  fused_experts(
      TensorView(x.data(), DType::bf16, {t, h}), p13, p2, TensorView(wt.data(), DType::f32, {t, 1}),
      TensorView(ids.data(), DType::i32, {t, 1}), TensorView(out.data(), DType::f32, {t, h}), opt);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const double g = pre[size_t(i)], u = up[size_t(i)];
      const double want = runtime::reference_glu(rg, g, u);
      // The bound of act(gate) times |up| (or |clamp(up) + 1| ≤ limit + 1),
      // rounded to bf16 on both sides.
      const double mult = c.glu == 3 ? rg.limit + 1 : std::fabs(u);
      const double ref = round_bf16(want);
      const double tol =
          2 * tolerance(want, g) * std::max(1.0, mult) + std::ldexp(std::fabs(ref), -7);
      EXPECT_LE(std::fabs(out[size_t(r * h + i)] - ref), tol)
          << "glu(" << g << ", " << u << ") token " << r << ": got " << out[size_t(r * h + i)]
          << ", want " << ref;
    }
}

INSTANTIATE_TEST_SUITE_P(Glu, ActivationExtremesMoe,
                         ::testing::Values(MoeCase{0, 1}, MoeCase{1, 1}, MoeCase{2, 1},
                                           MoeCase{3, 1}, MoeCase{0, 40}, MoeCase{1, 40},
                                           MoeCase{2, 40}, MoeCase{3, 40}),
                         moe_case_name);

#if TILEJIT_HAVE_LLVM
// The LLVM elementwise compiler (IR programs: `tilejit run`) evaluates the
// same VectorMath activations: silu, gelu_tanh, gelu_erf and relu2 of the 32
// pre-activations, f32 in and out. The llvm variant only (it is the path
// these kernels serve; the others would repeat it).
TEST(ActivationExtremesElementwise, MatchesTheDefinition) {
  const auto want_isa = requested_isa();
  if (!want_isa || *want_isa != Isa::llvm) GTEST_SKIP() << "runs in the llvm variant";
  TILEJIT_SKIP_IF_ISA_MISSING();
  const ir::Function f = ir::parse(R"(
func @acts(%x: tensor<1x32xf32>) -> (tensor<1x32xf32>, tensor<1x32xf32>, tensor<1x32xf32>, tensor<1x32xf32>) {
  %0 = silu %x : tensor<1x32xf32>
  %1 = gelu_tanh %x : tensor<1x32xf32>
  %2 = gelu_erf %x : tensor<1x32xf32>
  %3 = relu2 %x : tensor<1x32xf32>
  return %0, %1, %2, %3
})");
  namespace lb = codegen::llvm_backend;
  const lb::LlvmKernel k = lb::compile_llvm_elementwise(f);
  const std::vector<float>& pre = pre_values();
  ASSERT_EQ(pre.size(), 32u);
  std::vector<float> out[4] = {std::vector<float>(32), std::vector<float>(32),
                               std::vector<float>(32), std::vector<float>(32)};
  const void* params[] = {pre.data()};
  void* results[] = {out[0].data(), out[1].data(), out[2].data(), out[3].data()};
  const lb::ElementwiseArgs args{params, results, 1, nullptr, nullptr};
  k.fn<lb::ElementwiseFn>()(&args);
  const Activation acts[] = {Activation::silu, Activation::gelu_tanh, Activation::gelu_erf,
                             Activation::relu2};
  for (int a = 0; a < 4; ++a)
    for (size_t j = 0; j < 32; ++j)
      EXPECT_TRUE(
          close(out[a][j], runtime::reference_activation(acts[a], pre[j]), pre[j], DType::f32))
          << activation_name(acts[a]) << "(" << pre[j] << ")";
}
#endif

}  // namespace
}  // namespace tilejit::test
