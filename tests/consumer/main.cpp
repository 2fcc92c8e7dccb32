// Uses tilejit through its installed public header only: a small gemm with
// bias and relu whose result is exact in fp32, and an Error caught across the
// shared-library boundary.
#include <tilejit/tilejit.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

namespace {

uint16_t bf16(float f) {  // exact for the small integers used here
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

}  // namespace

int main() {
  constexpr int64_t M = 2, N = 3, K = 4;
  // x = [[1, 2, 3, 4], [-1, -2, -3, -4]], w[n] = (n+1) · [1, 1, 1, 1], bias = [1, 2, -100]
  std::vector<uint16_t> x, w;
  for (int i = 0; i < M; ++i)
    for (int k = 0; k < K; ++k) x.push_back(bf16(static_cast<float>((i == 0 ? 1 : -1) * (k + 1))));
  for (int n = 0; n < N; ++n)
    for (int k = 0; k < K; ++k) w.push_back(bf16(static_cast<float>(n + 1)));
  std::vector<float> bias = {1, 2, -100}, y(M * N, -1.0f);

  const tilejit::PackedWeight pw = tilejit::pack_weight({w.data(), tilejit::DType::bf16, {N, K}});
  tilejit::GemmOptions opt;
  opt.bias = tilejit::TensorView(bias.data(), tilejit::DType::f32, {N});
  opt.act = tilejit::Activation::relu;
  tilejit::gemm({x.data(), tilejit::DType::bf16, {M, K}}, pw,
                {y.data(), tilejit::DType::f32, {M, N}}, opt);

  // Row 0: 10·(n+1) + bias = 11, 22, -70 -> relu -> 11, 22, 0. Row 1: all negative -> 0.
  const float want[M * N] = {11, 22, 0, 0, 0, 0};
  int bad = 0;
  for (int i = 0; i < M * N; ++i)
    if (y[i] != want[i]) {
      std::fprintf(stderr, "y[%d] = %g, expected %g\n", i, y[i], want[i]);
      ++bad;
    }

  bool caught = false;
  try {
    tilejit::gemm({x.data(), tilejit::DType::f32, {M, K}}, pw,
                  {y.data(), tilejit::DType::f32, {M, N}});
  } catch (const tilejit::Error& e) {
    caught = std::strstr(e.what(), "x.dtype=f32") != nullptr;
  }
  if (!caught) {
    std::fprintf(stderr, "a bad dtype did not raise tilejit::Error naming x.dtype\n");
    ++bad;
  }

  std::printf("tilejit consumer: path %s, layout %s, %s\n",
              tilejit::isa_name(tilejit::cpu_info().isa), pw.layout().c_str(),
              bad ? "FAILED" : "ok");
  return bad ? 1 : 0;
}
