// runtime/quant_formats.h: the element decoding of the quantized checkpoint
// formats, against values written from the format descriptions independently
// (fp8 e4m3 over all 256 codes, known AWQ / GPTQ words, random matrices
// packed here by hand and read back).
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/bf16.h"
#include "runtime/quant_formats.h"

namespace tilejit::runtime {
namespace {

// e4m3 from its fields, in double: (-1)^s · 2^(e−7) · (1 + m/8), e > 0;
// (-1)^s · 2^−6 · m/8, e = 0; S.1111.111 NaN.
double e4m3_spec(int code) {
  const int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7) return NAN;
  const double mag = e == 0 ? std::pow(2.0, -6) * (m / 8.0) : std::pow(2.0, e - 7) * (1 + m / 8.0);
  return s ? -mag : mag;
}

// double -> bf16 rounded once (dequantize's bf16 output), against the
// rounding done in double: x / ulp rounded to an integer (nearest, ties to
// even), times ulp. Random values, and values a hair off the midpoints
// between bf16 neighbours, where rounding through f32 first rounds twice.
TEST(Bf16, DoubleRoundsOnceToNearestEven) {
  ASSERT_EQ(std::fegetround(), FE_TONEAREST);
  auto want = [](double x) {
    int e = 0;
    std::frexp(std::fabs(x), &e);  // |x| in [2^(e-1), 2^e)
    const double ulp = std::ldexp(1.0, e - 1 - 7);
    const float r = static_cast<float>(std::nearbyint(x / ulp) * ulp);  // exact in f32
    return f32_to_bf16(r);
  };
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> mant(1.0, 2.0);
  std::uniform_int_distribution<int> ex(-100, 100);
  int twice = 0;
  for (int i = 0; i < 200000; ++i) {
    double x = std::ldexp(mant(rng), ex(rng));
    if (i % 2) {  // a midpoint, moved by less than half an f32 ulp
      const double ulp = std::ldexp(1.0, std::ilogb(x) - 7);
      x = (std::floor(x / ulp) + 0.5) * ulp;
      x += (i % 4 == 1 ? 1 : -1) * std::ldexp(ulp, -20) * mant(rng);
    }
    if (rng() & 1) x = -x;
    ASSERT_EQ(f64_to_bf16(x), want(x)) << x;
    twice += f32_to_bf16(static_cast<float>(x)) != want(x);
  }
  EXPECT_GT(twice, 1000);  // the cases where the f32 route is wrong were hit
  // Exact, non-finite and out-of-range values.
  EXPECT_EQ(f64_to_bf16(1.0), 0x3f80);
  EXPECT_EQ(f64_to_bf16(1.0507813096), 0x3f87);  // the tester's value (f32 first: 0x3f86)
  EXPECT_EQ(f64_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(f64_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(f64_to_bf16(1e300), 0x7f80);
  EXPECT_EQ(f64_to_bf16(3.3895313892515355e38), 0x7f7f);  // bf16's largest
  EXPECT_EQ(f64_to_bf16(1e-300), 0x0000);
  EXPECT_EQ(f64_to_bf16(-1e-300), 0x8000);
  EXPECT_TRUE(std::isnan(bf16_to_f32(f64_to_bf16(NAN))));
}

TEST(Fp8E4m3, EveryCodeDecodesAsTheFormatSays) {
  for (int c = 0; c < 256; ++c) {
    const double want = e4m3_spec(c);
    const float got = e4m3_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code 0x" << std::hex << c;
    }
  }
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_f32(0xB8), -1.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(Fp8E4m3, EncodeRoundsToNearestEvenAndSaturates) {
  // Every finite code is its own encoding (−0 included).
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(static_cast<uint8_t>(c))), c) << "code 0x" << std::hex << c;
  }
  // Between two neighbours: the nearer; at the midpoint: the even code.
  for (int c = 0; c < 0x7E; ++c) {
    const float a = e4m3_to_f32(static_cast<uint8_t>(c)), b = e4m3_to_f32(uint8_t(c + 1));
    const float mid = (a + b) / 2;  // exact: both are short binary fractions
    EXPECT_EQ(f32_to_e4m3(mid), c % 2 == 0 ? c : c + 1) << "tie above code " << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, a)), c) << c;
    EXPECT_EQ(f32_to_e4m3(std::nextafter(mid, b)), c + 1) << c;
    EXPECT_EQ(f32_to_e4m3(-std::nextafter(mid, b)), 0x80 | (c + 1)) << c;
  }
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7E);  // saturated, not NaN
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);  // the tie with 2^-9: to even 0
}

// e5m2 from its fields, in double: (-1)^s · 2^(e−15) · (1 + m/4), 0 < e < 31;
// (-1)^s · 2^−14 · m/4, e = 0; ±Inf at e = 31, m = 0; NaN otherwise.
double e5m2_spec(int code) {
  const int s = code >> 7, e = (code >> 2) & 31, m = code & 3;
  if (e == 31) return m ? NAN : (s ? -INFINITY : INFINITY);
  const double mag =
      e == 0 ? std::pow(2.0, -14) * (m / 4.0) : std::pow(2.0, e - 15) * (1 + m / 4.0);
  return s ? -mag : mag;
}

TEST(Fp8E5m2, EveryCodeDecodesAsTheFormatSays) {
  for (int c = 0; c < 256; ++c) {
    const double want = e5m2_spec(c);
    const float got = e5m2_to_f32(static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << "code 0x" << std::hex << c;
    }
  }
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x3C), 1.0f);
  EXPECT_EQ(e5m2_to_f32(0x01), std::ldexp(1.0f, -16));
  EXPECT_EQ(e5m2_to_f32(0xFC), -INFINITY);
}

// The encoder against a brute force written from the format alone: the
// nearest finite code in double, the even code (mantissa bit 0 clear) on a
// tie, ± the largest finite value past it; over random f32 bit patterns of
// every magnitude e5m2 distinguishes and midpoints a hair either side.
TEST(Fp8E5m2, EncodeMatchesABruteForceNearestEven) {
  auto brute = [](float x) -> int {
    if (std::isnan(x)) return 0x7F;
    const int sign = std::signbit(x) ? 0x80 : 0;
    const double a = std::fabs(double(x));
    int best = 0;
    double best_d = INFINITY;
    for (int c = 0; c <= 0x7B; ++c) {
      const double d = std::fabs(e5m2_spec(c) - a);
      if (d < best_d || (d == best_d && (c & 1) == 0)) best = c, best_d = d;
    }
    return sign | best;
  };
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> ex(-30, 18);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  for (int i = 0; i < 20000; ++i) {
    float x = std::ldexp(mant(rng), ex(rng));
    if (rng() & 1) x = -x;
    ASSERT_EQ(f32_to_e5m2(x), brute(x)) << x;
  }
  for (int c = 0; c < 0x7B; ++c) {
    const float a = e5m2_to_f32(static_cast<uint8_t>(c)), b = e5m2_to_f32(uint8_t(c + 1));
    const float mid = (a + b) / 2;  // exact
    for (float x : {mid, std::nextafter(mid, a), std::nextafter(mid, b), -mid})
      ASSERT_EQ(f32_to_e5m2(x), brute(x)) << "near code " << c << ": " << x;
    EXPECT_EQ(f32_to_e5m2(mid), c % 2 == 0 ? c : c + 1) << "tie above code " << c;
  }
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7C) == 0x7C) continue;  // Inf / NaN
    EXPECT_EQ(f32_to_e5m2(e5m2_to_f32(static_cast<uint8_t>(c))), c) << "code 0x" << std::hex << c;
  }
  EXPECT_EQ(f32_to_e5m2(1e6f), 0x7B);      // saturated, not Inf
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7B);  // the tie with Inf's place
  EXPECT_EQ(f32_to_e5m2(INFINITY), 0x7B);
  EXPECT_EQ(f32_to_e5m2(-INFINITY), 0xFB);
  EXPECT_EQ(f32_to_e5m2(NAN) & 0x7F, 0x7F);
  EXPECT_EQ(f32_to_e5m2(std::ldexp(1.0f, -17)), 0x00);  // the tie with 2^-16: to even 0
  EXPECT_EQ(f32_to_e5m2(std::ldexp(1.0f, -200)), 0x00);
}

TEST(Mxfp4, E2m1AndE8m0) {
  const float mags[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int n = 0; n < 16; ++n)
    EXPECT_EQ(e2m1_to_f32(static_cast<uint8_t>(n)), n & 8 ? -mags[n & 7] : mags[n & 7]) << n;
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(130), 8.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
}

TEST(Awq, KnownWordAndTheInterleavedOrder) {
  // Word nibbles 0..7 = 0..7 (low first): AWQ puts columns 0,2,4,6,1,3,5,7 there.
  const int32_t word = 0x76543210;
  const int want[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column j's value = the nibble holding it
  for (int j = 0; j < 8; ++j) EXPECT_EQ(awq_at(&word, 1, 0, j), want[j]) << "column " << j;
}

TEST(Awq, RandomMatrixPackedByHandReadsBack) {
  const int64_t K = 13, N = 24;
  std::mt19937 rng(7);
  std::vector<int> q(size_t(K * N));
  for (int& v : q) v = int(rng() % 16);
  std::vector<int32_t> packed(size_t(K * N / 8), 0);
  const int order[8] = {0, 2, 4, 6, 1, 3, 5, 7};
  for (int64_t k = 0; k < K; ++k)
    for (int64_t c = 0; c < N / 8; ++c) {
      uint32_t w = 0;
      for (int i = 0; i < 8; ++i) w |= uint32_t(q[size_t(k * N + c * 8 + order[i])]) << (4 * i);
      packed[size_t(k * (N / 8) + c)] = static_cast<int32_t>(w);
    }
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      ASSERT_EQ(awq_at(packed.data(), N / 8, k, n), q[size_t(k * N + n)]) << k << "," << n;
}

TEST(Gptq, PackedAlongKAndZerosAlongN) {
  const int64_t K = 32, N = 5, G = 8;
  std::mt19937 rng(11);
  std::vector<int> q(size_t(K * N));
  for (int& v : q) v = int(rng() % 16);
  std::vector<int32_t> qweight(size_t(K / 8 * N), 0);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      qweight[size_t(k / 8 * N + n)] =
          static_cast<int32_t>(uint32_t(qweight[size_t(k / 8 * N + n)]) |
                               uint32_t(q[size_t(k * N + n)]) << (4 * (k % 8)));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      ASSERT_EQ(gptq_q_at(qweight.data(), N, k, n), q[size_t(k * N + n)]);
  // The symmetric v1 checkpoint: 0x77777777 means z = 8; v2 stores z itself.
  const int32_t zeros[1] = {0x77777777};
  for (int n = 0; n < 8; ++n) {
    EXPECT_EQ(gptq_zero_at(zeros, 1, 0, n, true), 8);
    EXPECT_EQ(gptq_zero_at(zeros, 1, 0, n, false), 7);
  }
  // Act-order: the group comes from g_idx, not k / G.
  const int32_t g_idx[4] = {3, 0, 2, 0};
  EXPECT_EQ(quant_group_of(0, G, g_idx), 3);
  EXPECT_EQ(quant_group_of(2, G, g_idx), 2);
  EXPECT_EQ(quant_group_of(17, G, nullptr), 2);
  EXPECT_EQ(dequant_int4(3, 8, 0.5), -2.5);
}

}  // namespace
}  // namespace tilejit::runtime
