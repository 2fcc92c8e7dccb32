#include <gtest/gtest.h>
#include <random>
#include "runtime/bf16.h"
#include "runtime/reference_gemm.h"
#include "tilejit/tilejit.h"
using namespace tilejit;
TEST(Smoke, Gemm) {
  for (int M : {1, 3, 7, 8, 20}) for (int N : {1, 17, 64, 100}) for (int K : {1, 2, 3, 64, 101}) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1, 1);
    std::vector<uint16_t> x(M * K), w(N * K);
    for (auto& v : x) v = runtime::f32_to_bf16(d(rng));
    for (auto& v : w) v = runtime::f32_to_bf16(d(rng));
    std::vector<float> y(M * N), r(M * N);
    auto pw = pack_weight(TensorView(w.data(), DType::bf16, {N, K}));
    gemm(TensorView(x.data(), DType::bf16, {M, K}), pw, TensorView(y.data(), DType::f32, {M, N}));
    runtime::ReferenceGemmArgs a; a.x = x.data(); a.ldx = K; a.m = M; a.n = N; a.k = K; a.y = r.data(); a.ldy = N;
    runtime::reference_gemm(a, [&](int64_t n, int64_t k) { return w[n * K + k]; });
    for (int i = 0; i < M * N; ++i) ASSERT_NEAR(y[i], r[i], 1e-4 * K) << M << " " << N << " " << K << " i=" << i;
  }
}
