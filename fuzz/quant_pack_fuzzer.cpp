// libFuzzer harness: the quantized weight API (pack_weight of Int8Weight,
// Fp8Weight, Int4Weight, Mxfp4Weight; unpack; dequantize; gemm) driven by a fuzzed
// checkpoint description: format, shapes, the logical N / K, group size,
// zero points, g_idx contents (act-order, shards, garbage), scale dtypes and
// values (NaN, Inf, subnormal), fp8 block sizes and [K, N] strides, MXFP4
// blocks forms and e8m0 exponents (255: NaN), and the tensors' bytes.
//
// The contract under test: pack_weight either raises tilejit::Error or
// returns a weight whose unpack() gives the input tensors back bit for bit
// (padding nibbles past N / K zeroed beforehand), whose dequantize() equals
// the harness's own decoding of the checkpoint (exact, rounded once to f32),
// and which gemm() runs on the active path within the documented bound of
// the reference built from those logical weights (runtime/reference_error_bounds.h).
#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "fuzz/fuzz_util.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "tilejit/tilejit.h"

namespace {

using namespace tilejit;

[[noreturn]] void die(const std::string& what) {
  fuzz::die("quant_pack_fuzzer", what);
}

using fuzz::describe;
using fuzz::same_value;

// Fuzzed bytes for a tensor.
template <class T>
std::vector<T> bytes_of(FuzzedDataProvider& f, size_t n) {
  std::vector<T> v(n);
  std::vector<uint8_t> b = f.ConsumeBytes<uint8_t>(n * sizeof(T));
  b.resize(n * sizeof(T), 0);
  if (n > 0) std::memcpy(v.data(), b.data(), n * sizeof(T));
  return v;
}

float scale_from(FuzzedDataProvider& f) {
  switch (f.ConsumeIntegralInRange(0, 15)) {
    case 0:
      return NAN;
    case 1:
      return INFINITY;
    case 2:
      return 1e-40f;  // subnormal
    case 3:
      return 0.0f;
    case 4:
      return -0.5f;
    case 5:
      return 3e38f;
    default:
      return std::ldexp(1.0f + f.ConsumeIntegralInRange(0, 15) / 16.0f,
                        f.ConsumeIntegralInRange(-12, 2));
  }
}

// The run of a packed weight against logical weights w[N, K] (double):
// dequantize() bit-exact, gemm within the bound.
// int4 weights also fuzz the route (GemmOptions::int4_route) and reach M
// where the automatic route takes W4A8; a W4A8 output is checked against the
// exact weights times x quantized per row (the W4A8 contract), within the
// bound of its per-group f32 fold (runtime/reference_error_bounds.h; the
// groups' Σ|S_g·s_x·s_g| bounded by Σ|x_q·w|, their count by K).
void check_weight(FuzzedDataProvider& f, const PackedWeight& pw, const std::vector<double>& w,
                  int64_t N, int64_t K, bool int8, const std::vector<int8_t>& w8,
                  const std::vector<float>& s8, bool int4 = false) {
  if (pw.n() != N || pw.k() != K) die("n()/k() differ from the checkpoint");
  std::vector<float> dq(static_cast<size_t>(N * K));
  pw.dequantize(TensorView(dq.data(), DType::f32, {N, K}));
  bool finite = true;
  for (size_t e = 0; e < dq.size(); ++e) {
    if (!same_value(dq[e], static_cast<float>(w[e])))
      die("dequantize differs at " + std::to_string(e) + ": " + std::to_string(dq[e]) + " vs " +
          std::to_string(w[e]));
    // A logical weight past bf16's range becomes ±Inf in the kernels (the
    // dequantized bf16 value overflows, as specified), and 0·Inf is NaN.
    finite = finite && std::fabs(w[e]) <= 1e38;
  }
  const int64_t M = int4 && f.ConsumeIntegralInRange(0, 3) == 0
                        ? f.ConsumeIntegralInRange<int64_t>(4, 20)
                        : f.ConsumeIntegralInRange<int64_t>(1, 3);
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  for (auto& v : x)
    v = runtime::f32_to_bf16(static_cast<float>(f.ConsumeIntegralInRange(-64, 64)) / 32.0f);
  std::vector<float> y(static_cast<size_t>(M * N));
  GemmOptions opt;
  if (int8 || int4) {
    // fixed: 1/32 steps with zero point 128 hold every x of ±2 exactly.
    static constexpr ActQuant kRules[] = {ActQuant::dynamic_sym, ActQuant::dynamic_asym,
                                          ActQuant::fixed};
    opt.act_quant = f.PickValueInArray(kRules);
    opt.act_scale = 1.0f / 32;
  }
  if (int4) {
    static constexpr Int4Route kRoutes[] = {Int4Route::automatic, Int4Route::w4a16,
                                            Int4Route::w4a8};
    opt.int4_route = f.PickValueInArray(kRoutes);
  }
  const bool w4a8 =
      int4 && ops::w4a8_route(*pw.impl(), opt, codegen::gemm_isa_for_rows(cpu_info().isa, M), M);
  if (describe())
    std::fprintf(stderr, "gemm M=%lld act_quant=%d int4_route=%d w4a8=%d\n", (long long)M,
                 int(opt.act_quant), int(opt.int4_route), int(w4a8));
  gemm(TensorView(x.data(), DType::bf16, {M, K}), pw, TensorView(y.data(), DType::f32, {M, N}),
       opt);
  if (!finite) return;  // NaN / Inf weights: it ran; IEEE says the rest
  std::vector<uint8_t> q(static_cast<size_t>(K));
  for (int64_t i = 0; i < M; ++i) {
    float sa = 1;
    int32_t za = 0;
    if (int8 || w4a8)
      runtime::reference_act_quant_row(ops::act_quant_rule(ops::act_quant_mode(opt.act_quant)),
                                       &x[i * K], K, K, 1.0f / opt.act_scale, opt.act_scale,
                                       opt.act_zero_point, q.data(), &sa, &za);
    for (int64_t j = 0; j < N; ++j) {
      double ref = 0, abs = 0, tol;
      if (int8) {
        int64_t acc = 0, aabs = 0;
        for (int64_t k = 0; k < K; ++k) {
          acc += int64_t(q[k] - za) * w8[j * K + k];
          aabs += std::abs(int64_t(q[k] - za) * w8[j * K + k]);
        }
        const double sw = s8.size() == 1 ? s8[0] : s8[j];
        ref = double(acc) * sa * sw;
        abs = double(aabs) * sa * std::fabs(sw);
        tol = runtime::int8_output_bound(Activation::none, DType::f32,
                                         double(aabs) * sa * std::fabs(sw), 0, ref, ref);
      } else if (w4a8) {
        // The exact W4A8 value: the quantized x (the library's quantizer,
        // bit for bit) times the exact weights.
        for (int64_t k = 0; k < K; ++k) {
          const double v = double(q[k] - za) * sa * w[j * K + k];
          ref += v, abs += std::fabs(v);
        }
        tol = runtime::w4a8_output_bound(Activation::none, DType::f32, K, abs, 0, ref, ref);
      } else {
        for (int64_t k = 0; k < K; ++k) {
          const double v = runtime::bf16_to_f32(x[i * K + k]) * w[j * K + k];
          ref += v, abs += std::fabs(v);
        }
        tol = runtime::gemm_output_bound(Activation::none, DType::f32, K, abs, 0, ref, ref) +
              runtime::dequant_weight_bound(Activation::none, abs, 0);
      }
      // Products past the f32 range, or underflowing, are outside the model;
      // so are sums whose terms reach it: the kernels accumulate in f32, and
      // a partial sum can overflow to ±Inf (in an order each path chooses)
      // where the exact sum cancels to a finite value (docs/reliability.md,
      // "NaN and Inf"). Every partial sum is at most Σ|x·w|, so below
      // kF32Headroom (FLT_MAX / 64: room for the rounding of long sums)
      // none can.
      constexpr double kF32Headroom = 3.4028234663852886e38 / 64;
      if (!std::isfinite(ref) || std::fabs(ref) > 1e30 || !(abs <= kF32Headroom)) continue;
      const double got = y[i * N + j];
      if (!(std::fabs(got - ref) <= tol + 1e-30))
        die("gemm y[" + std::to_string(i) + ", " + std::to_string(j) +
            "] = " + std::to_string(got) + ", reference " + std::to_string(ref));
    }
  }
}

void fuzz_int8(FuzzedDataProvider& f) {
  const int64_t N = f.ConsumeIntegralInRange<int64_t>(0, 80),
                K = f.ConsumeIntegralInRange<int64_t>(0, 300);
  std::vector<int8_t> w = bytes_of<int8_t>(f, static_cast<size_t>(N * K));
  const bool per_tensor = f.ConsumeBool();
  std::vector<float> s(per_tensor ? 1 : static_cast<size_t>(std::max<int64_t>(N, 0)));
  for (auto& v : s) v = scale_from(f);
  const int64_t s_len =
      f.ConsumeIntegralInRange(0, 15) == 0 ? int64_t(s.size()) + 1 : int64_t(s.size());
  s.resize(static_cast<size_t>(s_len), 1.0f);
  if (describe())
    std::fprintf(stderr, "int8 N=%lld K=%lld scales=%lld\n", (long long)N, (long long)K,
                 (long long)s_len);
  PackedWeight pw;
  try {
    pw = pack_weight(Int8Weight{TensorView(w.data(), DType::i8, {N, K}),
                                TensorView(s.data(), DType::f32, {s_len})});
  } catch (const Error&) {
    return;
  }
  std::vector<int8_t> w2(w.size());
  std::vector<float> s2(s.size());
  pw.unpack(Int8Weight{TensorView(w2.data(), DType::i8, {N, K}),
                       TensorView(s2.data(), DType::f32, {s_len})});
  if (w2 != w || std::memcmp(s2.data(), s.data(), s.size() * 4) != 0) die("int8 unpack differs");
  std::vector<double> lw(w.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) lw[n * K + k] = double(w[n * K + k]) * s[s.size() == 1 ? 0 : n];
  check_weight(f, pw, lw, N, K, true, w, s);
}

void fuzz_fp8(FuzzedDataProvider& f) {
  const int64_t N = f.ConsumeIntegralInRange<int64_t>(0, 80),
                K = f.ConsumeIntegralInRange<int64_t>(0, 300);
  std::vector<uint8_t> w = bytes_of<uint8_t>(f, static_cast<size_t>(N * K));
  if (f.ConsumeIntegralInRange(0, 7) != 0)  // mostly valid codes
    for (auto& c : w)
      if ((c & 0x7F) == 0x7F) c ^= 1;
  const bool kn = f.ConsumeBool();
  const int kind = f.ConsumeIntegralInRange(0, 2);  // tensor, channel, block
  int64_t bn = 0, bk = 0, gn = 1, gk = 1;
  if (kind == 1) gn = N;
  if (kind == 2) {
    bn = f.ConsumeIntegralInRange<int64_t>(-1, 130);
    bk = f.ConsumeIntegralInRange<int64_t>(-1, 130);
    gn = bn > 0 ? (N + bn - 1) / bn : 1;
    gk = bk > 0 ? (K + bk - 1) / bk : 1;
    if (f.ConsumeIntegralInRange(0, 15) == 0) ++gk;
  }
  std::vector<float> s(static_cast<size_t>(std::max<int64_t>(gn * gk, 0)));
  for (auto& v : s) v = scale_from(f);
  Fp8Weight d;
  d.weight = kn ? TensorView(w.data(), DType::f8e4m3, {N, K}, {1, std::max<int64_t>(N, 1)})
                : TensorView(w.data(), DType::f8e4m3, {N, K});
  d.scales = kind == 2 ? TensorView(s.data(), DType::f32, {gn, gk})
                       : TensorView(s.data(), DType::f32, {gn});
  d.block_n = bn, d.block_k = bk;
  if (describe())
    std::fprintf(stderr, "fp8 N=%lld K=%lld kn=%d scale kind=%d block %lldx%lld\n", (long long)N,
                 (long long)K, kn, kind, (long long)bn, (long long)bk);
  PackedWeight pw;
  try {
    pw = pack_weight(d);
  } catch (const Error&) {
    return;
  }
  std::vector<uint8_t> w2(w.size(), 0x7F);
  std::vector<float> s2(s.size());
  Fp8Weight u = d;
  u.weight.data = w2.data();
  u.scales.data = s2.data();
  pw.unpack(u);
  if (w2 != w || std::memcmp(s2.data(), s.data(), s.size() * 4) != 0) die("fp8 unpack differs");
  std::vector<double> lw(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t c = kn ? w[k * N + n] : w[n * K + k];
      // bn = bk = 0 with [1, 1] scales is per tensor (vLLM's [N, 1] / [1, 1]
      // per-channel / per-tensor scales are read as [N] / [1]).
      const bool block = kind == 2 && (bn != 0 || bk != 0);
      const float sc = block ? s[(n / bn) * gk + k / bk] : s[kind == 1 ? n : 0];
      lw[n * K + k] = double(runtime::e4m3_to_f32(c)) * sc;
    }
  check_weight(f, pw, lw, N, K, false, {}, {});
}

void fuzz_int4(FuzzedDataProvider& f) {
  const bool awq = f.ConsumeBool();
  const int64_t N = f.ConsumeIntegralInRange<int64_t>(0, 80),
                K = f.ConsumeIntegralInRange<int64_t>(0, 300);
  const int64_t n8 = (N + 7) / 8, k8 = (K + 7) / 8;
  static constexpr int64_t kGroups[] = {32, 64, 128, -1, 16, 7, 0, -3, 1};
  const int64_t gs = f.PickValueInArray(kGroups);
  const bool zp = f.ConsumeBool(), gidx = f.ConsumeIntegralInRange(0, 2) == 0;
  const bool v2 = !awq && f.ConsumeBool();
  int64_t G = gs > 0 ? (K + gs - 1) / gs : 1;
  std::vector<int32_t> g(static_cast<size_t>(K));
  if (gidx) {
    G = f.ConsumeIntegralInRange<int64_t>(1, 12);
    for (auto& v : g)
      v = f.ConsumeIntegralInRange<int32_t>(
          f.ConsumeIntegralInRange(0, 31) == 0 ? -1 : 0,
          static_cast<int32_t>(G) - (f.ConsumeIntegralInRange(0, 31) == 0 ? 0 : 1));
  }
  std::vector<int32_t> qw = bytes_of<int32_t>(f, static_cast<size_t>(awq ? K * n8 : k8 * N));
  std::vector<int32_t> qz = bytes_of<int32_t>(f, static_cast<size_t>(std::max<int64_t>(G, 0) * n8));
  // Nibbles past N (packed along N) or K (along K) come back as 0.
  auto clear = [](std::vector<int32_t>& t, int64_t rows, int64_t words, int64_t valid,
                  bool awq_order) {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = valid; j < words * 8; ++j)
        t[r * words + j / 8] &=
            ~static_cast<int32_t>(0xFu << (4 * (awq_order ? runtime::kAwqNibble[j % 8] : j % 8)));
  };
  if (awq)
    clear(qw, K, n8, N, true);
  else
    for (int64_t k = K; k < k8 * 8; ++k)
      for (int64_t n = 0; n < N; ++n)
        qw[(k / 8) * N + n] &= ~static_cast<int32_t>(0xFu << (4 * (k % 8)));
  clear(qz, G, n8, N, awq);
  const int sdt = f.ConsumeIntegralInRange(0, 2);
  const DType scale_dtype = sdt == 0 ? DType::f16 : sdt == 1 ? DType::bf16 : DType::f32;
  std::vector<float> sf(static_cast<size_t>(std::max<int64_t>(G * N, 0)));
  for (auto& v : sf) v = scale_from(f);
  std::vector<uint16_t> s16(sf.size());
  for (size_t i = 0; i < sf.size(); ++i)
    s16[i] = scale_dtype == DType::bf16 ? runtime::f32_to_bf16(sf[i])
                                        : static_cast<uint16_t>(f.ConsumeIntegral<uint16_t>());
  Int4Weight d;
  d.format = awq ? Int4Format::awq : Int4Format::gptq;
  d.qweight =
      awq ? TensorView(qw.data(), DType::i32, {K, n8}) : TensorView(qw.data(), DType::i32, {k8, N});
  d.scales = scale_dtype == DType::f32 ? TensorView(sf.data(), DType::f32, {G, N})
                                       : TensorView(s16.data(), scale_dtype, {G, N});
  if (zp) d.qzeros = TensorView(qz.data(), DType::i32, {G, n8});
  if (gidx) d.g_idx = TensorView(g.data(), DType::i32, {K});
  d.group_size = gs;
  d.gptq_v2 = v2;
  d.n = N, d.k = K;
  d.bits = f.ConsumeIntegralInRange(0, 31) == 0 ? 3 : 4;
  if (describe()) {
    std::fprintf(stderr,
                 "int4 %s N=%lld K=%lld G=%lld group_size=%lld zp=%d g_idx=%d v2=%d scales %s:",
                 awq ? "awq" : "gptq", (long long)N, (long long)K, (long long)G, (long long)gs, zp,
                 gidx, v2, dtype_name(scale_dtype));
    for (size_t i = 0; i < sf.size() && i < 16; ++i)
      std::fprintf(stderr, " %g",
                   scale_dtype == DType::f32    ? sf[i]
                   : scale_dtype == DType::bf16 ? runtime::bf16_to_f32(s16[i])
                                                : runtime::f16_to_f32(s16[i]));
    std::fprintf(stderr, "\n");
  }
  PackedWeight pw;
  try {
    pw = pack_weight(d);
  } catch (const Error&) {
    return;
  }
  // unpack: bit for bit.
  std::vector<int32_t> qw2(qw.size(), -1), qz2(qz.size(), -1), g2(g.size(), -1);
  std::vector<float> sf2(sf.size(), -1);
  std::vector<uint16_t> s162(s16.size(), 0xFFFF);
  Int4Weight u = d;
  u.qweight.data = qw2.data();
  u.scales.data =
      scale_dtype == DType::f32 ? static_cast<void*>(sf2.data()) : static_cast<void*>(s162.data());
  if (zp) u.qzeros->data = qz2.data();
  if (gidx) u.g_idx->data = g2.data();
  pw.unpack(u);
  if (qw2 != qw) die("int4 unpack: qweight differs");
  if (zp && qz2 != qz) die("int4 unpack: qzeros differs");
  if (gidx && g2 != g) die("int4 unpack: g_idx differs");
  if (scale_dtype == DType::f32 ? std::memcmp(sf2.data(), sf.data(), sf.size() * 4) != 0
                                : s162 != s16)
    die("int4 unpack: scales differ");
  // The harness's own decoding.
  std::vector<double> lw(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t grp = gidx ? g[k] : gs < 0 ? 0 : k / gs;
      const int q =
          awq ? runtime::awq_at(qw.data(), n8, k, n) : runtime::gptq_q_at(qw.data(), N, k, n);
      int z = 8;
      if (zp)
        z = awq ? runtime::awq_at(qz.data(), n8, grp, n)
                : runtime::gptq_zero_at(qz.data(), n8, grp, n, !v2);
      const size_t si = static_cast<size_t>(grp * N + n);
      const double s = scale_dtype == DType::f32    ? sf[si]
                       : scale_dtype == DType::bf16 ? runtime::bf16_to_f32(s16[si])
                                                    : runtime::f16_to_f32(s16[si]);
      lw[n * K + k] = double(q - z) * s;
    }
  check_weight(f, pw, lw, N, K, false, {}, {}, true);
}

void fuzz_mxfp4(FuzzedDataProvider& f) {
  const bool three_d = f.ConsumeBool(), k_given = f.ConsumeBool();
  const int64_t N = f.ConsumeIntegralInRange<int64_t>(0, 80),
                K = f.ConsumeIntegralInRange<int64_t>(0, 300);
  const int64_t G = (K + 31) / 32, B = (K + 1) / 2, row = three_d ? G * 16 : B;
  // The logical K: k, or all the blocks hold (k = 0).
  const int64_t KL = k_given ? K : three_d ? 32 * G : 2 * B, GL = (KL + 31) / 32;
  std::vector<uint8_t> blocks = bytes_of<uint8_t>(f, static_cast<size_t>(N * row));
  const int64_t gs = GL + (f.ConsumeIntegralInRange(0, 15) == 0 ? 1 : 0);
  std::vector<uint8_t> scales = bytes_of<uint8_t>(f, static_cast<size_t>(N * gs));
  if (f.ConsumeIntegralInRange(0, 7) != 0)  // mostly no NaN exponents
    for (auto& e : scales)
      if (e == 0xFF) e = 0x7F;
  Mxfp4Weight d;
  d.blocks = three_d ? TensorView(blocks.data(), DType::u8, {N, G, 16})
                     : TensorView(blocks.data(), DType::u8, {N, B});
  d.scales = TensorView(scales.data(), DType::u8, {N, gs});
  d.k = k_given ? K : 0;
  if (describe())
    std::fprintf(stderr, "mxfp4 N=%lld K=%lld %s k=%lld scales [%lld, %lld]\n", (long long)N,
                 (long long)KL, three_d ? "3-D" : "2-D", (long long)d.k, (long long)N,
                 (long long)gs);
  PackedWeight pw;
  try {
    pw = pack_weight(d);
  } catch (const Error&) {
    return;
  }
  // unpack: bit for bit, the nibbles past K zeroed.
  std::vector<uint8_t> want = blocks, b2(blocks.size(), 0xEE), s2(scales.size(), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < row; ++j) {
      if (2 * j >= KL) want[n * row + j] = 0;
      if (2 * j + 1 == KL) want[n * row + j] &= 0x0F;
    }
  Mxfp4Weight u = d;
  u.blocks.data = b2.data();
  u.scales.data = s2.data();
  pw.unpack(u);
  if (b2 != want) die("mxfp4 unpack: blocks differ");
  if (s2 != scales) die("mxfp4 unpack: scales differ");
  std::vector<double> lw(static_cast<size_t>(N * KL));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < KL; ++k) {
      const int q = (blocks[n * row + k / 2] >> (4 * (k % 2))) & 0xF;
      lw[n * KL + k] = double(runtime::e2m1_to_f32(static_cast<uint8_t>(q))) *
                       std::ldexp(1.0, int(scales[n * gs + k / 32]) - 127);
    }
  check_weight(f, pw, lw, N, KL, false, {}, {});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider f(data, size);
  try {
    // The format byte: % 3 as before MXFP4 came, and 250..255 for MXFP4
    // (no committed corpus input ends in one of those).
    const uint8_t format = f.ConsumeIntegral<uint8_t>();
    if (format >= 250) {
      fuzz_mxfp4(f);
      return 0;
    }
    switch (format % 3) {
      case 0:
        fuzz_int8(f);
        break;
      case 1:
        fuzz_fp8(f);
        break;
      default:
        fuzz_int4(f);
        break;
    }
  } catch (const Error& e) {
    // pack_weight's Errors return above; one from unpack / dequantize / gemm
    // on a weight that packed is a contract violation.
    die(std::string("Error after a successful pack: ") + e.what());
  }
  return 0;
}
