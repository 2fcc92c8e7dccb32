// Bad input to gemm / pack_weight / unpack raises tilejit::Error whose message
// names the argument and the offending value; nothing aborts, nothing is
// written. The TILEJIT_ISA=bogus case runs as its own ctest entry (the ISA is
// read once per process).
#include <gmock/gmock.h>

#include <gtest/gtest.h>
#include <cmath>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ops/packed_weight_impl.h"
#include "test_util.h"

namespace tilejit::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The message of the tilejit::Error that f raises, or a marker saying what
// happened instead.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("<not a tilejit::Error: ") + e.what() + ">";
  } catch (...) {
    return "<not a std::exception>";
  }
  return "<no exception>";
}

class GemmErrors : public ::testing::Test {
 protected:
  static constexpr int64_t M = 4, N = 17, K = 32;
  void SetUp() override {
    x_ = random_bf16(M * K, 1);
    w_ = random_bf16(N * K, 2);
    y_.assign(M * N, 0.5f);
    bias_f32_.assign(N + 8, 0.25f);
    w = pack_weight(TensorView(w_.data(), DType::bf16, {N, K}));
  }
  TensorView x() { return TensorView(x_.data(), DType::bf16, {M, K}); }
  TensorView y() { return TensorView(y_.data(), DType::f32, {M, N}); }
  void* xp() { return x_.data(); }
  void* yp() { return y_.data(); }

  std::vector<uint16_t> x_, w_;
  std::vector<float> y_, bias_f32_;
  PackedWeight w;
};

TEST_F(GemmErrors, ValidCallSucceeds) {
  EXPECT_EQ(error_of([&] { gemm(x(), w, y()); }), "<no exception>");
}

TEST_F(GemmErrors, XWrongDtype) {
  const TensorView xf(xp(), DType::f32, {M, K});
  EXPECT_THAT(error_of([&] { gemm(xf, w, y()); }),
              AllOf(HasSubstr("gemm"), HasSubstr("x.dtype=f32"), HasSubstr("allowed: bf16")));
}

TEST_F(GemmErrors, YWrongDtype) {
  const TensorView yi(yp(), DType::i8, {M, N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, yi); }),
              AllOf(HasSubstr("y.dtype=i8"), HasSubstr("bf16"), HasSubstr("f32")));
}

TEST_F(GemmErrors, BiasWrongDtype) {
  for (DType d : {DType::i32, DType::f16, DType::i8}) {
    GemmOptions opt;
    opt.bias = TensorView(bias_f32_.data(), d, {N});
    EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
                AllOf(HasSubstr("bias.dtype=" + std::string(dtype_name(d))), HasSubstr("f32"),
                      HasSubstr("bf16")));
  }
}

TEST_F(GemmErrors, BiasWrongShape) {
  GemmOptions opt;
  opt.bias = TensorView(bias_f32_.data(), DType::f32, {N + 1});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
              AllOf(HasSubstr("bias has shape [18]"), HasSubstr("[17]")));
  opt.bias = TensorView(bias_f32_.data(), DType::f32, {N - 1});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }), HasSubstr("bias has shape [16]"));
  opt.bias = TensorView(bias_f32_.data(), DType::f32, {1, N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
              AllOf(HasSubstr("bias has shape [1, 17]"), HasSubstr("rank 2"), HasSubstr("rank 1")));
}

TEST_F(GemmErrors, BiasStrided) {
  GemmOptions opt;
  opt.bias = TensorView(bias_f32_.data(), DType::f32, {N}, {2});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }), HasSubstr("bias has stride 2"));
}

TEST_F(GemmErrors, XKMismatch) {
  const TensorView xk(xp(), DType::bf16, {M, K - 1});
  EXPECT_THAT(error_of([&] { gemm(xk, w, y()); }),
              AllOf(HasSubstr("x has shape [4, 31]"), HasSubstr("K = 32")));
}

TEST_F(GemmErrors, YShapeMismatch) {
  const TensorView yn(yp(), DType::f32, {M, N - 1});
  EXPECT_THAT(error_of([&] { gemm(x(), w, yn); }),
              AllOf(HasSubstr("y has shape [4, 16]"), HasSubstr("[4, 17]")));
  const TensorView ym(yp(), DType::f32, {M - 1, N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, ym); }),
              AllOf(HasSubstr("y has shape [3, 17]"), HasSubstr("[4, 17]")));
}

TEST_F(GemmErrors, NullData) {
  const TensorView xn(static_cast<void*>(nullptr), DType::bf16, {M, K});
  EXPECT_THAT(error_of([&] { gemm(xn, w, y()); }), HasSubstr("x data is null"));
  const TensorView yn(static_cast<void*>(nullptr), DType::f32, {M, N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, yn); }), HasSubstr("y data is null"));
  GemmOptions opt;
  opt.bias = TensorView(static_cast<void*>(nullptr), DType::f32, {N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }), HasSubstr("bias data is null"));
}

TEST_F(GemmErrors, XInnermostStride) {
  const TensorView xs(xp(), DType::bf16, {M / 2, K}, {2 * K, 2});
  EXPECT_THAT(error_of([&] {
                gemm(xs, w, TensorView(yp(), DType::f32, {M / 2, N}));
              }),
              AllOf(HasSubstr("x has strides [64, 2]"), HasSubstr("innermost stride 1")));
}

TEST_F(GemmErrors, XRowStrideBelowK) {
  const TensorView xs(xp(), DType::bf16, {M, K}, {K / 2, 1});
  EXPECT_THAT(error_of([&] { gemm(xs, w, y()); }),
              AllOf(HasSubstr("x has row stride 16"), HasSubstr("32")));
}

TEST_F(GemmErrors, YBadStrides) {
  const TensorView ys(yp(), DType::f32, {M, N}, {N - 1, 1});
  EXPECT_THAT(error_of([&] { gemm(x(), w, ys); }), HasSubstr("y has row stride 16"));
  const TensorView yi(yp(), DType::f32, {1, N}, {N, 2});
  EXPECT_THAT(error_of([&] {
                gemm(TensorView(xp(), DType::bf16, {1, K}), w, yi);
              }),
              AllOf(HasSubstr("y has strides [17, 2]"), HasSubstr("innermost stride 1")));
}

TEST_F(GemmErrors, StridesCountNotRank) {
  const TensorView xs(xp(), DType::bf16, {M, K}, {K});
  EXPECT_THAT(error_of([&] { gemm(xs, w, y()); }),
              AllOf(HasSubstr("x has 1 strides [32]"), HasSubstr("[4, 32]")));
  const TensorView ys(yp(), DType::f32, {M, N}, {N, 1, 1});
  EXPECT_THAT(error_of([&] { gemm(x(), w, ys); }), HasSubstr("y has 3 strides"));
}

TEST_F(GemmErrors, NegativeStrideOrDim) {
  const TensorView xs(xp(), DType::bf16, {M, K}, {-K, 1});
  EXPECT_THAT(error_of([&] { gemm(xs, w, y()); }),
              AllOf(HasSubstr("x has strides [-32, 1]"), HasSubstr("non-negative")));
  const TensorView xd(xp(), DType::bf16, {-1, K});
  EXPECT_THAT(error_of([&] { gemm(xd, w, y()); }),
              AllOf(HasSubstr("x has shape [-1, 32]"), HasSubstr("non-negative")));
}

TEST_F(GemmErrors, RankNotTwo) {
  const TensorView x3(xp(), DType::bf16, {1, M, K});
  EXPECT_THAT(error_of([&] { gemm(x3, w, y()); }),
              AllOf(HasSubstr("x has shape [1, 4, 32] (rank 3)"), HasSubstr("rank 2")));
  const TensorView x1(xp(), DType::bf16, {K});
  EXPECT_THAT(error_of([&] { gemm(x1, w, y()); }), HasSubstr("x has shape [32] (rank 1)"));
  const TensorView y3(yp(), DType::f32, {1, M, N});
  EXPECT_THAT(error_of([&] { gemm(x(), w, y3); }), HasSubstr("y has shape [1, 4, 17] (rank 3)"));
}

TEST_F(GemmErrors, InvalidActivation) {
  GemmOptions opt;
  opt.act = static_cast<Activation>(99);
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
              AllOf(HasSubstr("act=99"), HasSubstr("silu"), HasSubstr("gelu_erf")));
  opt.act = static_cast<Activation>(-1);
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }), HasSubstr("act=-1"));
}

// The quantized-activation options are checked for every format, also bf16
// weights that ignore them (a bad act_scale was accepted there, while
// fused_experts refused it: one rule, ops::check_act_quant /
// check_fixed_act_quant).
TEST_F(GemmErrors, BadQuantOptionsWithBf16Weights) {
  GemmOptions opt;
  opt.act_quant = ActQuant::fixed;
  for (float s : {0.0f, -1.0f, NAN, INFINITY}) {
    opt.act_scale = s;
    EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
                AllOf(HasSubstr("gemm: act_quant=fixed with act_scale="), HasSubstr("finite > 0")))
        << s;
  }
  opt.act_scale = 0.5f;
  opt.act_zero_point = -5;
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
              HasSubstr("act_zero_point=-5; allowed: [0, 255]"));
  opt.act_zero_point = 128;
  EXPECT_EQ(error_of([&] { gemm(x(), w, y(), opt); }), "<no exception>");
  opt.act_quant = static_cast<ActQuant>(7);
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }),
              HasSubstr("act_quant=7 is not an ActQuant"));
  opt = {};
  opt.int4_route = static_cast<Int4Route>(9);
  EXPECT_THAT(error_of([&] { gemm(x(), w, y(), opt); }), HasSubstr("int4_route=9"));
}

TEST_F(GemmErrors, EmptyWeight) {
  const PackedWeight empty;
  EXPECT_THAT(error_of([&] { gemm(x(), empty, y()); }),
              AllOf(HasSubstr("w"), HasSubstr("empty PackedWeight")));
}

// A rejected call writes nothing.
TEST_F(GemmErrors, RejectedCallLeavesYUntouched) {
  GemmOptions opt;
  opt.bias = TensorView(bias_f32_.data(), DType::f32, {N + 1});
  const std::vector<float> before = y_;
  EXPECT_NE(error_of([&] { gemm(x(), w, y(), opt); }), "<no exception>");
  EXPECT_EQ(y_, before);
}

// ---------------------------------------------------------------------------
// pack_weight / unpack

TEST(PackWeightErrors, WrongDtype) {
  std::vector<float> w(16 * 32);
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::f32, {16, 32}));
              }),
              AllOf(HasSubstr("pack_weight"), HasSubstr("w.dtype=f32"), HasSubstr("bf16")));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::i8, {16, 32}));
              }),
              HasSubstr("w.dtype=i8"));
}

TEST(PackWeightErrors, WrongRank) {
  std::vector<uint16_t> w(16 * 32);
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {2, 8, 32}));
              }),
              AllOf(HasSubstr("w has shape [2, 8, 32] (rank 3)"), HasSubstr("rank 2")));
  EXPECT_THAT(error_of([&] { pack_weight(TensorView(w.data(), DType::bf16, {32})); }),
              HasSubstr("w has shape [32] (rank 1)"));
}

TEST(PackWeightErrors, ZeroDims) {
  std::vector<uint16_t> w(16 * 32);
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {0, 32}));
              }),
              AllOf(HasSubstr("w has shape [0, 32]"), HasSubstr("N >= 1 and K >= 1")));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {16, 0}));
              }),
              HasSubstr("w has shape [16, 0]"));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(static_cast<void*>(nullptr), DType::bf16, {0, 0}));
              }),
              HasSubstr("w has shape [0, 0]"));
}

TEST(PackWeightErrors, BadStridesAndNull) {
  std::vector<uint16_t> w(16 * 64);
  // Any strides under which the elements are distinct pack (strided columns,
  // a transposed view); those that make two share an address do not.
  EXPECT_NO_THROW(pack_weight(TensorView(w.data(), DType::bf16, {16, 32}, {64, 2})));
  EXPECT_NO_THROW(pack_weight(TensorView(w.data(), DType::bf16, {16, 32}, {1, 16})));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {16, 32}, {31, 1}));
              }),
              AllOf(HasSubstr("w has shape [16, 32] and strides [31, 1]"),
                    HasSubstr("two elements share an address")));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {16, 32}, {1, 8}));
              }),
              HasSubstr("strides [1, 8]"));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(w.data(), DType::bf16, {16, 32}, {0, 1}));
              }),
              HasSubstr("two elements share an address"));
  EXPECT_THAT(error_of([&] {
                pack_weight(TensorView(static_cast<void*>(nullptr), DType::bf16, {16, 32}));
              }),
              HasSubstr("w data is null"));
}

TEST(PackWeightErrors, UnpackWrongOutput) {
  std::vector<uint16_t> w = random_bf16(16 * 32, 3), out(17 * 32);
  const PackedWeight p = pack_weight(TensorView(w.data(), DType::bf16, {16, 32}));
  EXPECT_THAT(
      error_of([&] {
        p.unpack(TensorView(out.data(), DType::bf16, {17, 32}));
      }),
      AllOf(HasSubstr("unpack"), HasSubstr("out has shape [17, 32]"), HasSubstr("[16, 32]")));
  EXPECT_THAT(error_of([&] {
                p.unpack(TensorView(out.data(), DType::f32, {16, 32}));
              }),
              HasSubstr("out.dtype=f32"));
  EXPECT_THAT(error_of([&] {
                p.unpack(TensorView(static_cast<void*>(nullptr), DType::bf16, {16, 32}));
              }),
              HasSubstr("out data is null"));
}

// ---------------------------------------------------------------------------
// TILEJIT_ISA holding no ISA name. Runs only in the ctest entry that sets
// TILEJIT_ISA=bogus: the library reads the variable once, at the first call
// that needs the path, and must report it as an Error (every time), not fall
// back silently and not abort.
// A TILEJIT_NUM_THREADS that is no count fails calls with an Error naming
// it, until set_num_threads() gives one: the API call overrides the variable
// (README). It failed too, so the process could not recover.
TEST(ThreadsEnv, BadValueFailsCallsUntilSetNumThreads) {
  const char* env = std::getenv("TILEJIT_NUM_THREADS");
  if (env == nullptr || std::string(env) != "0")
    GTEST_SKIP() << "runs only with TILEJIT_NUM_THREADS=0 (its own ctest entry)";
  std::vector<uint16_t> x = random_bf16(2 * 8, 1), wv = random_bf16(3 * 8, 2);
  std::vector<float> y(2 * 3, 0.5f);
  const PackedWeight w = pack_weight(TensorView(wv.data(), DType::bf16, {3, 8}));
  auto call = [&] {
    gemm(TensorView(x.data(), DType::bf16, {2, 8}), w, TensorView(y.data(), DType::f32, {2, 3}));
  };
  EXPECT_THAT(error_of(call), AllOf(HasSubstr("TILEJIT_NUM_THREADS='0'"), HasSubstr("1 to 4096")));
  EXPECT_THAT(error_of([] { num_threads(); }), HasSubstr("TILEJIT_NUM_THREADS"));
  ASSERT_EQ(error_of([] { set_num_threads(2); }), "<no exception>");
  EXPECT_EQ(num_threads(), 2);
  EXPECT_EQ(error_of(call), "<no exception>");
  EXPECT_NE(y, std::vector<float>(2 * 3, 0.5f));
}

TEST(GemmIsaEnv, BogusValueRaisesErrorNamingTheVariable) {
  const char* env = std::getenv("TILEJIT_ISA");
  if (env == nullptr || std::string(env) != "bogus")
    GTEST_SKIP() << "runs only with TILEJIT_ISA=bogus (its own ctest entry)";
  std::vector<uint16_t> x = random_bf16(2 * 8, 1), wv = random_bf16(3 * 8, 2);
  std::vector<float> y(2 * 3, 0.5f);
  // Packing needs no ISA decision.
  PackedWeight w;
  ASSERT_EQ(error_of([&] {
              w = pack_weight(TensorView(wv.data(), DType::bf16, {3, 8}));
            }),
            "<no exception>");
  for (int attempt = 0; attempt < 2; ++attempt) {
    EXPECT_THAT(error_of([&] {
                  gemm(TensorView(x.data(), DType::bf16, {2, 8}), w,
                       TensorView(y.data(), DType::f32, {2, 3}));
                }),
                AllOf(HasSubstr("TILEJIT_ISA"), HasSubstr("bogus"), HasSubstr("amx"),
                      HasSubstr("avx512"), HasSubstr("scalar")))
        << "attempt " << attempt;
  }
  EXPECT_EQ(y, std::vector<float>(2 * 3, 0.5f));
  // cpu_info reports the active path, which the variable makes undecidable.
  EXPECT_THAT(error_of([] { cpu_info(); }), HasSubstr("TILEJIT_ISA"));
}

}  // namespace
}  // namespace tilejit::test
