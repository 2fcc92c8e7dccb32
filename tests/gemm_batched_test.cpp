// gemm_batched (sgl-kernel's bmm_cpu): every y[b] equals gemm(x[b], w[b],
// y[b], opt) bit for bit, on the active path, for shapes that hit the M, N
// and K tails, head-major views of token-major tensors (DeepSeek's absorbed
// MLA: x = q_nope viewed [H, T, 128], y written into [T, H, 512]), every
// activation and bias, bf16 and f32 out, and quantized weights; nothing
// outside y is written; bad input is an Error naming the argument.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "test_util.h"

namespace tilejit::test {
namespace {

constexpr uint16_t kPoison = 0x7fc1;  // a NaN: any stray read or write shows

struct Case {
  int64_t b, m, n, k;
  Activation act = Activation::none;
  bool bias = false;
  DType out = DType::bf16;
};

std::string name(const Case& c) {
  return "B" + std::to_string(c.b) + "_m" + std::to_string(c.m) + "n" + std::to_string(c.n) + "k" +
         std::to_string(c.k) + "_" + activation_name(c.act) + (c.bias ? "_bias" : "") +
         (c.out == DType::f32 ? "_f32" : "");
}

class GemmBatched : public IsaTestWithParam<Case> {};

TEST_P(GemmBatched, EachEntryIsItsGemmBitForBit) {
  const Case c = GetParam();
  SCOPED_TRACE(name(c));
  const int64_t esz = c.out == DType::f32 ? 4 : 2;
  // Token-major storage viewed head-major: x [M, B, K] -> [B, M, K] with
  // strides {K, B·K, 1}; y [M, B, N + 3] (3 padding columns) -> [B, M, N].
  const int64_t ldy = c.n + 3;
  std::vector<uint16_t> x = random_bf16(static_cast<size_t>(c.m * c.b * c.k), 7);
  std::vector<float> bias(static_cast<size_t>(c.n));
  for (int64_t i = 0; i < c.n; ++i) bias[i] = 0.01f * float(i % 17) - 0.05f;
  std::vector<PackedWeight> w;
  for (int64_t b = 0; b < c.b; ++b) {
    const std::vector<uint16_t> wb = random_bf16(static_cast<size_t>(c.n * c.k), 100 + b);
    w.push_back(pack_weight(TensorView(const_cast<uint16_t*>(wb.data()), DType::bf16, {c.n, c.k})));
  }
  GemmOptions opt;
  opt.act = c.act;
  if (c.bias) opt.bias = TensorView(bias.data(), DType::f32, {c.n});
  std::vector<uint8_t> y(static_cast<size_t>(c.m * c.b * ldy * esz), 0xA5);
  const std::vector<uint8_t> y0 = y;
  gemm_batched(TensorView(x.data(), DType::bf16, {c.b, c.m, c.k}, {c.k, c.b * c.k, 1}), w,
               TensorView(y.data(), c.out, {c.b, c.m, c.n}, {ldy, c.b * ldy, 1}), opt);
  // The reference: one gemm per entry into its own dense output.
  for (int64_t b = 0; b < c.b; ++b) {
    std::vector<uint8_t> want(static_cast<size_t>(c.m * c.n * esz));
    gemm(TensorView(x.data() + b * c.k, DType::bf16, {c.m, c.k}, {c.b * c.k, 1}),
         w[static_cast<size_t>(b)], TensorView(want.data(), c.out, {c.m, c.n}), opt);
    for (int64_t i = 0; i < c.m; ++i)
      ASSERT_EQ(0, std::memcmp(y.data() + ((i * c.b + b) * ldy) * esz, want.data() + i * c.n * esz,
                               static_cast<size_t>(c.n * esz)))
          << "entry " << b << " row " << i;
  }
  // The padding columns are untouched.
  for (int64_t r = 0; r < c.m * c.b; ++r)
    for (int64_t j = c.n; j < ldy; ++j)
      for (int64_t e = 0; e < esz; ++e) {
        const size_t at = static_cast<size_t>((r * ldy + j) * esz + e);
        ASSERT_EQ(y[at], y0[at]) << "padding written at row " << r << " column " << j;
      }
}

std::vector<Case> cases() {
  return {
      {1, 1, 16, 32},
      {16, 1, 512, 128},  // DeepSeek decode: one token, 16 heads, q_nope · w_kc
      {8, 5, 128, 512},   // and o · w_vc, a few tokens
      {3, 17, 70, 33, Activation::silu, true},
      {4, 33, 129, 65, Activation::gelu_tanh, false, DType::f32},
      {2, 64, 64, 2100, Activation::relu, true},  // K chunks (the per-entry fallback)
      {5, 2, 48, 40, Activation::gelu_erf, true, DType::f32},
  };
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBatched, ::testing::ValuesIn(cases()),
                         [](const auto& p) { return name(p.param); });

class GemmBatchedEdge : public IsaTest {};

// Quantized weights run as one gemm per entry: the same bits.
TEST_F(GemmBatchedEdge, QuantizedWeights) {
  const int64_t B = 3, M = 4, N = 40, K = 64;
  std::vector<uint16_t> x = random_bf16(static_cast<size_t>(B * M * K), 3);
  std::vector<std::vector<int8_t>> codes;
  std::vector<std::vector<float>> scales;
  std::vector<PackedWeight> w;
  for (int64_t b = 0; b < B; ++b) {
    codes.emplace_back(static_cast<size_t>(N * K));
    for (size_t i = 0; i < codes.back().size(); ++i)
      codes.back()[i] = static_cast<int8_t>((i * 37 + b * 11) % 255 - 127);
    scales.emplace_back(static_cast<size_t>(N), 0.01f * float(b + 1));
    w.push_back(pack_weight(Int8Weight{TensorView(codes.back().data(), DType::i8, {N, K}),
                                       TensorView(scales.back().data(), DType::f32, {N})}));
  }
  std::vector<float> y(static_cast<size_t>(B * M * N)), want(static_cast<size_t>(M * N));
  gemm_batched(TensorView(x.data(), DType::bf16, {B, M, K}), w,
               TensorView(y.data(), DType::f32, {B, M, N}));
  for (int64_t b = 0; b < B; ++b) {
    gemm(TensorView(x.data() + b * M * K, DType::bf16, {M, K}), w[static_cast<size_t>(b)],
         TensorView(want.data(), DType::f32, {M, N}));
    ASSERT_EQ(0, std::memcmp(y.data() + b * M * N, want.data(), want.size() * 4)) << b;
  }
}

TEST_F(GemmBatchedEdge, EmptyBatchAndRowsAreNoOps) {
  std::vector<uint16_t> y(8, kPoison);
  const std::vector<uint16_t> wb(16 * 32, 0);
  std::vector<PackedWeight> w1 = {
      pack_weight(TensorView(const_cast<uint16_t*>(wb.data()), DType::bf16, {16, 32}))};
  std::vector<uint16_t> x(32);
  EXPECT_NO_THROW(gemm_batched(TensorView(x.data(), DType::bf16, {0, 1, 32}), {},
                               TensorView(y.data(), DType::bf16, {0, 1, 16})));
  EXPECT_NO_THROW(gemm_batched(TensorView(x.data(), DType::bf16, {1, 0, 32}), w1,
                               TensorView(y.data(), DType::bf16, {1, 0, 16})));
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint16_t v) { return v == kPoison; }));
}

TEST_F(GemmBatchedEdge, BadInputNamesTheArgument) {
  const std::vector<uint16_t> wa(16 * 32, 0), wb(24 * 32, 0);
  const PackedWeight a =
      pack_weight(TensorView(const_cast<uint16_t*>(wa.data()), DType::bf16, {16, 32}));
  const PackedWeight b =
      pack_weight(TensorView(const_cast<uint16_t*>(wb.data()), DType::bf16, {24, 32}));
  std::vector<uint16_t> x(2 * 3 * 32), y(2 * 3 * 24, kPoison);
  const TensorView X(x.data(), DType::bf16, {2, 3, 32});
  const TensorView Y(y.data(), DType::bf16, {2, 3, 16});
  EXPECT_TRUE(throws_with([&] { gemm_batched(X, {a}, Y); },
                          {"gemm_batched", "w holds 1 weights", "B = 2"}));
  EXPECT_TRUE(throws_with(
      [&] {
        gemm_batched(X, {a, b}, Y);
      },
      {"gemm_batched", "w[1] is bf16 [24, 32] but w[0] is bf16 [16, 32]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        gemm_batched(X, {a, a}, TensorView(y.data(), DType::bf16, {2, 3, 17}));
      },
      {"gemm_batched: batch entry 0", "y has shape [3, 17]", "[3, 16]"}));
  EXPECT_TRUE(throws_with(
      [&] {
        gemm_batched(TensorView(x.data(), DType::bf16, {2, 96}), {a, a}, Y);
      },
      {"gemm_batched", "x", "rank 2", "allowed: rank 3"}));
  EXPECT_TRUE(throws_with(
      [&] {
        gemm_batched(X, {a, PackedWeight{}}, Y);
      },
      {"gemm_batched: batch entry 1", "w is an empty PackedWeight"}));
  // y over another entry's x: entry 1's y is entry 0's x.
  EXPECT_TRUE(throws_with(
      [&] {
        gemm_batched(TensorView(x.data(), DType::bf16, {2, 1, 32}, {32, 32, 1}), {a, a},
                     TensorView(x.data() + 32 - 32, DType::bf16, {2, 1, 16}, {32, 32, 1}));
      },
      {"gemm_batched", "y", "x"}));
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint16_t v) { return v == kPoison; }));
}

}  // namespace
}  // namespace tilejit::test
