// The weight-quantized GEMM battery (docs/quantized.md): every format on the
// path TILEJIT_ISA names, against references written here from the test's
// own logical weights (not the library's packing), over M / N / K tails,
// group and block sizes, symmetric and zero-point int4, act-order, [K, N]
// fp8, MXFP4 (2-D and 3-D blocks, K not a multiple of 32, e8m0 exponents
// 0..254, negative zero codes), bias, activations and both output types; the pack contract (unpack
// bit for bit, dequantize, packing twice, tensor-parallel shards); and the
// Errors of malformed checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "test_util.h"
#include "tests/support/activations.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

using runtime::bf16_to_f32;
using runtime::f32_to_bf16;

enum class Fmt { int8, fp8, awq, gptq, mxfp4 };
enum class Scale { tensor, channel, block };

const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::int8:
      return "int8";
    case Fmt::fp8:
      return "fp8";
    case Fmt::awq:
      return "awq";
    case Fmt::gptq:
      return "gptq";
    case Fmt::mxfp4:
      return "mxfp4";
  }
  return "?";
}

struct QCase {
  Fmt fmt = Fmt::fp8;
  int64_t m = 1, n = 1, k = 1;
  // fp8
  Scale scale = Scale::channel;
  int64_t bn = 0, bk = 0;
  bool kn = false;  // weight stored [K, N]
  // int4
  int64_t group = 128;  // -1: per channel
  bool zp = false, act_order = false, v2 = false;
  DType scale_dtype = DType::f16;
  // mxfp4: blocks as [N, K/32, 16] (GPT-OSS's form) or [N, K/2]
  bool mx3d = false;
  // int8, and int4 on the W4A8 route
  ActQuant aq = ActQuant::dynamic_sym;
  Int4Route route = Int4Route::automatic;  // int4
  bool per_tensor = false;
  Activation act = Activation::none;
  Bias bias = Bias::none;
  DType out = DType::f32;

  std::string name() const {
    std::string s = fmt::format("{}_m{}n{}k{}", fmt_name(fmt), m, n, k);
    if (fmt == Fmt::fp8)
      s += scale == Scale::block    ? fmt::format("_block{}x{}", bn, bk)
           : scale == Scale::tensor ? "_tensor"
                                    : "_channel";
    if (fmt == Fmt::fp8 && kn) s += "_kn";
    if (fmt == Fmt::awq || fmt == Fmt::gptq) {
      s += group < 0 ? "_gch" : fmt::format("_g{}", group);
      if (zp) s += "_zp";
      if (act_order) s += "_actorder";
      if (v2) s += "_v2";
      s += fmt::format("_s{}", dtype_name(scale_dtype));
      if (route == Int4Route::w4a8)
        s += aq == ActQuant::dynamic_sym    ? "_w4a8sym"
             : aq == ActQuant::dynamic_asym ? "_w4a8asym"
                                            : "_w4a8fixed";
      if (route == Int4Route::w4a16) s += "_w4a16";
    }
    if (fmt == Fmt::mxfp4) s += mx3d ? "_3d" : "_2d";
    if (fmt == Fmt::int8) {
      s += aq == ActQuant::dynamic_sym ? "_sym" : aq == ActQuant::dynamic_asym ? "_asym" : "_fixed";
      if (per_tensor) s += "_tensor";
    }
    s += fmt::format("_{}_{}_{}", activation_name(act), bias_name(bias), dtype_name(out));
    return s;
  }
};

// Scales with `bits` mantissa bits (10: exact in f16; 3: in bf16 as well),
// so that dequantized weights need bf16 rounding and the two kernel
// families' error models are told apart.
float small_scale(std::mt19937& rng, int exp, int bits = 10) {
  return std::ldexp(1.0f + static_cast<float>(rng() % (1u << bits)) / float(1u << bits), exp);
}
uint16_t f32_to_f16_exact(float v) {  // for the values small_scale makes
  uint32_t u;
  std::memcpy(&u, &v, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int e = static_cast<int>((u >> 23) & 0xFF) - 127 + 15;
  return static_cast<uint16_t>(sign | (uint32_t(e) << 10) | ((u >> 13) & 0x3FF));
}

// The e2m1 value of a 4-bit code, decoded here from its definition (sign
// bit 3; exponent field bits 2..1, bias 1; mantissa bit 0; exponent field 0
// is the subnormal m · 0.5), not from the library's table.
double e2m1_value(int q) {
  const int e = (q >> 1) & 3, m = q & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return (q & 8) ? -mag : mag;
}

// A checkpoint built from logical values, in its format's storage, with the
// logical weights: exact (double) and as the kernels' contract rounds them.
struct Checkpoint {
  std::vector<int8_t> i8;
  std::vector<uint8_t> f8;
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<float> scales_f32;
  std::vector<uint16_t> scales_16;
  std::vector<uint8_t> mx_blocks, mx_scales;
  std::vector<uint8_t> mx_unpacked;  // mx_blocks as unpack writes them (0 past K)
  Mxfp4Weight mx;
  Int8Weight int8;
  Fp8Weight fp8;
  Int4Weight int4;
  std::vector<double> w;       // [N, K] exact
  std::vector<double> w_bf16;  // [N, K] rounded as the dequant kernels do (fp8 / int4)
  std::vector<double> qz_s;    // [N, K] (|q| + |z|)·|s| (fp8: |w|): the fused kernel's bound
  std::vector<double> off_s;   // [N, K] 32·|s| for int4 (the fused kernel's offset of 16), fp8 0
  // int4: q − z per [N, K], the group of each k, the scales [G, N] (W4A8's reference).
  std::vector<int> qmz;
  std::vector<int32_t> group_of;
  std::vector<float> s4;
  int64_t groups = 0;
};

// An MXFP4 checkpoint: code q[n, k] and exponent e[n, g] from the given
// makers (random codes; e around 127 + wexp in the battery); the nibbles
// past K of the last block hold garbage (packing ignores them, unpack
// gives 0).
template <class CodeOf, class ExpOf>
void make_mxfp4(const QCase& c, Checkpoint& ck, CodeOf code_of, ExpOf exp_of) {
  const int64_t N = c.n, K = c.k, G = (K + 31) / 32, B = (K + 1) / 2;
  const int64_t row = c.mx3d ? G * 16 : B;
  ck.mx_blocks.assign(static_cast<size_t>(N * row), 0);
  ck.mx_unpacked.assign(ck.mx_blocks.size(), 0);
  ck.mx_scales.assign(static_cast<size_t>(N * G), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) ck.mx_scales[n * G + g] = static_cast<uint8_t>(exp_of(n, g));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < 2 * row; ++k) {
      const int q = code_of(n, k) & 0xF;
      ck.mx_blocks[n * row + k / 2] |= static_cast<uint8_t>(q << (4 * (k % 2)));
      if (k >= K) continue;
      ck.mx_unpacked[n * row + k / 2] |= static_cast<uint8_t>(q << (4 * (k % 2)));
      const int e = ck.mx_scales[n * G + k / 32];
      const double s = std::ldexp(1.0, e - 127);
      ck.w[n * K + k] = e2m1_value(q) * s;
      ck.w_bf16[n * K + k] = bf16_to_f32(f32_to_bf16(float(e2m1_value(q)) * float(s)));
      ck.qz_s[n * K + k] = std::fabs(ck.w[n * K + k]);
    }
  ck.mx.blocks = c.mx3d ? TensorView(ck.mx_blocks.data(), DType::u8, {N, G, 16})
                        : TensorView(ck.mx_blocks.data(), DType::u8, {N, B});
  ck.mx.scales = TensorView(ck.mx_scales.data(), DType::u8, {N, G});
  // k = 0 (from blocks) where blocks holds exactly K.
  ck.mx.k = (c.mx3d ? 32 * G : 2 * B) == K ? 0 : K;
}

Checkpoint make_checkpoint(const QCase& c) {
  Checkpoint ck;
  const int64_t N = c.n, K = c.k;
  std::mt19937 rng(
      seed_of({static_cast<int64_t>(c.fmt), N, K, c.group, c.zp, c.act_order, c.bn, c.bk, c.kn}));
  ck.w.assign(static_cast<size_t>(N * K), 0);
  ck.w_bf16.assign(static_cast<size_t>(N * K), 0);
  ck.qz_s.assign(static_cast<size_t>(N * K), 0);
  ck.off_s.assign(static_cast<size_t>(N * K), 0);
  // Weight magnitudes ~ 15/sqrt(K)/|x| as random_problem's, so pre-activations span both tails.
  const int wexp = static_cast<int>(std::floor(std::log2(4.0 / std::sqrt(double(K))))) - 3;
  switch (c.fmt) {
    case Fmt::int8: {
      ck.i8.resize(static_cast<size_t>(N * K));
      for (auto& v : ck.i8) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
      ck.scales_f32.resize(c.per_tensor ? 1 : static_cast<size_t>(N));
      for (auto& s : ck.scales_f32) s = small_scale(rng, wexp - 4);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          ck.w[n * K + k] = double(ck.i8[n * K + k]) * ck.scales_f32[c.per_tensor ? 0 : n];
      ck.int8.weight = TensorView(ck.i8.data(), DType::i8, {N, K});
      ck.int8.scales =
          TensorView(ck.scales_f32.data(), DType::f32, {int64_t(ck.scales_f32.size())});
      break;
    }
    case Fmt::fp8: {
      ck.f8.resize(static_cast<size_t>(N * K));
      int64_t gn = 1, gk = 1;
      if (c.scale == Scale::channel) gn = N;
      if (c.scale == Scale::block) gn = (N + c.bn - 1) / c.bn, gk = (K + c.bk - 1) / c.bk;
      ck.scales_f32.resize(static_cast<size_t>(gn * gk));
      for (auto& s : ck.scales_f32) s = small_scale(rng, wexp - 2, 20);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          uint8_t code;
          do code = static_cast<uint8_t>(rng() % 256);
          while ((code & 0x7F) == 0x7F);
          (c.kn ? ck.f8[k * N + n] : ck.f8[n * K + k]) = code;
          const float s = c.scale == Scale::block    ? ck.scales_f32[(n / c.bn) * gk + k / c.bk]
                          : c.scale == Scale::tensor ? ck.scales_f32[0]
                                                     : ck.scales_f32[n];
          const float v = runtime::e4m3_to_f32(code);
          ck.w[n * K + k] = double(v) * s;
          ck.w_bf16[n * K + k] = bf16_to_f32(f32_to_bf16(v * s));
          ck.qz_s[n * K + k] = std::fabs(ck.w[n * K + k]);
        }
      ck.fp8.weight = c.kn ? TensorView(ck.f8.data(), DType::f8e4m3, {N, K}, {1, N})
                           : TensorView(ck.f8.data(), DType::f8e4m3, {N, K});
      if (c.scale == Scale::block) {
        ck.fp8.scales = TensorView(ck.scales_f32.data(), DType::f32, {gn, gk});
        ck.fp8.block_n = c.bn, ck.fp8.block_k = c.bk;
      } else {
        ck.fp8.scales = TensorView(ck.scales_f32.data(), DType::f32, {gn});
      }
      break;
    }
    case Fmt::mxfp4: {
      std::vector<int> q(static_cast<size_t>(N * 2 * ((K + 31) / 32) * 16));
      for (auto& v : q) v = static_cast<int>(rng() % 16);
      const int64_t G = (K + 31) / 32;
      std::vector<int> e(static_cast<size_t>(N * G));
      for (auto& v : e) v = 127 + wexp + static_cast<int>(rng() % 5) - 2;
      const int64_t row = 2 * ((K + 31) / 32) * 16;
      make_mxfp4(
          c, ck, [&](int64_t n, int64_t k) { return q[n * row + k]; },
          [&](int64_t n, int64_t g) { return e[n * G + g]; });
      break;
    }
    case Fmt::awq:
    case Fmt::gptq: {
      const bool awq = c.fmt == Fmt::awq;
      const int64_t G = c.group < 0 ? 1 : (K + c.group - 1) / c.group;
      std::vector<int32_t> group_of(static_cast<size_t>(K));
      for (int64_t k = 0; k < K; ++k)
        group_of[k] = static_cast<int32_t>(c.group < 0 ? 0 : k / c.group);
      if (c.act_order) std::shuffle(group_of.begin(), group_of.end(), rng);
      std::vector<int> q(static_cast<size_t>(N * K)), z(static_cast<size_t>(G * N), 8);
      for (auto& v : q) v = static_cast<int>(rng() % 16);
      if (c.zp)
        for (auto& v : z) v = static_cast<int>(rng() % 16) + (!awq && !c.v2 ? 1 : 0);  // v1: 1..16
      std::vector<float> s(static_cast<size_t>(G * N));
      for (auto& v : s) v = small_scale(rng, wexp, c.scale_dtype == DType::bf16 ? 3 : 10);
      const int64_t n8 = (N + 7) / 8, k8 = (K + 7) / 8;
      ck.qweight.assign(static_cast<size_t>(awq ? K * n8 : k8 * N), 0);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const uint32_t v = static_cast<uint32_t>(q[n * K + k]);
          if (awq)
            ck.qweight[k * n8 + n / 8] |=
                static_cast<int32_t>(v << (4 * runtime::kAwqNibble[n % 8]));
          else
            ck.qweight[(k / 8) * N + n] |= static_cast<int32_t>(v << (4 * (k % 8)));
        }
      if (c.zp) {
        ck.qzeros.assign(static_cast<size_t>(G * n8), 0);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t n = 0; n < N; ++n) {
            const uint32_t stored =
                static_cast<uint32_t>((!awq && !c.v2) ? z[g * N + n] - 1 : z[g * N + n]) & 0xF;
            const int nib = awq ? runtime::kAwqNibble[n % 8] : static_cast<int>(n % 8);
            ck.qzeros[g * n8 + n / 8] |= static_cast<int32_t>(stored << (4 * nib));
          }
      }
      if (c.scale_dtype == DType::f32) {
        ck.scales_f32 = s;
      } else {
        ck.scales_16.resize(s.size());
        for (size_t i = 0; i < s.size(); ++i)
          ck.scales_16[i] =
              c.scale_dtype == DType::bf16 ? f32_to_bf16(s[i]) : f32_to_f16_exact(s[i]);
      }
      ck.qmz.resize(static_cast<size_t>(N * K));
      ck.group_of = group_of;
      ck.s4 = s;
      ck.groups = G;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const int64_t g = group_of[k];
          ck.qmz[n * K + k] = q[n * K + k] - z[g * N + n];
          const float v = static_cast<float>(q[n * K + k] - z[g * N + n]);
          ck.w[n * K + k] = double(v) * s[g * N + n];
          ck.w_bf16[n * K + k] = bf16_to_f32(f32_to_bf16(v * s[g * N + n]));
          ck.qz_s[n * K + k] = double(q[n * K + k] + z[g * N + n]) * std::fabs(s[g * N + n]);
          ck.off_s[n * K + k] = 32.0 * std::fabs(s[g * N + n]);
        }
      Int4Weight& w = ck.int4;
      w.format = awq ? Int4Format::awq : Int4Format::gptq;
      w.qweight = awq ? TensorView(ck.qweight.data(), DType::i32, {K, n8})
                      : TensorView(ck.qweight.data(), DType::i32, {k8, N});
      w.n = N, w.k = K;
      w.scales = c.scale_dtype == DType::f32
                     ? TensorView(ck.scales_f32.data(), DType::f32, {G, N})
                     : TensorView(ck.scales_16.data(), c.scale_dtype, {G, N});
      if (c.zp) w.qzeros = TensorView(ck.qzeros.data(), DType::i32, {G, n8});
      if (c.act_order) {
        ck.g_idx = group_of;
        w.g_idx = TensorView(ck.g_idx.data(), DType::i32, {K});
      }
      w.group_size = c.group;
      w.gptq_v2 = c.v2;
      break;
    }
  }
  if (c.fmt == Fmt::int8) ck.w_bf16 = ck.w;
  return ck;
}

PackedWeight pack(const QCase& c, const Checkpoint& ck) {
  switch (c.fmt) {
    case Fmt::int8:
      return pack_weight(ck.int8);
    case Fmt::fp8:
      return pack_weight(ck.fp8);
    case Fmt::mxfp4:
      return pack_weight(ck.mx);
    default:
      return pack_weight(ck.int4);
  }
}

double bias_value(const QCase& c, const std::vector<float>& bf, const std::vector<uint16_t>& bb,
                  int64_t j) {
  if (c.bias == Bias::f32) return bf[j];
  if (c.bias == Bias::bf16) return bf16_to_f32(bb[j]);
  return 0;
}

::testing::AssertionResult run_case(const QCase& c) {
  const Checkpoint ck = make_checkpoint(c);
  const PackedWeight pw = pack(c, ck);
  const int64_t M = c.m, N = c.n, K = c.k;
  const uint32_t seed =
      seed_of({M, N, K, static_cast<int64_t>(c.act), static_cast<int64_t>(c.bias)});
  const std::vector<uint16_t> xv = random_bf16(static_cast<size_t>(M * K), seed, -2, 2);
  // x with a padded row stride holding NaN, in a guarded buffer.
  const int64_t ldx = K + 3;
  GuardedBuffer xbuf(static_cast<size_t>((M - 1) * ldx + K) * 2);
  auto* xg = xbuf.as<uint16_t>();
  for (int64_t e = 0; e < (M - 1) * ldx + K; ++e) xg[e] = 0x7fc1;
  for (int64_t i = 0; i < M; ++i) std::memcpy(xg + i * ldx, &xv[i * K], static_cast<size_t>(K) * 2);
  std::vector<float> bf;
  std::vector<uint16_t> bb;
  GemmOptions opt;
  opt.act = c.act;
  if (c.bias == Bias::f32) {
    bf = random_f32(static_cast<size_t>(N), seed + 7, -3, 3);
    opt.bias = TensorView(bf.data(), DType::f32, {N});
  } else if (c.bias == Bias::bf16) {
    bb = random_bf16(static_cast<size_t>(N), seed + 7, -3, 3);
    opt.bias = TensorView(bb.data(), DType::bf16, {N});
  }
  opt.act_quant = c.aq;
  opt.int4_route = c.route;
  if (c.aq == ActQuant::fixed) opt.act_scale = 2.0f / 127, opt.act_zero_point = 128;
  const size_t ysz = c.out == DType::f32 ? 4 : 2;
  const int64_t ldy = N + 5;
  std::vector<uint8_t> ybuf(static_cast<size_t>(M * ldy) * ysz, 0xA5);
  gemm(TensorView(xg, DType::bf16, {M, K}, {ldx, 1}), pw,
       TensorView(ybuf.data(), c.out, {M, N}, {ldy, 1}), opt);

  const bool scalar = cpu_info().isa == Isa::scalar;
  // The dequant path rounds w to bf16 (a tight check against those weights);
  // the fused decode kernel (ops::fused_max_rows: M <= 16, <= 4 on amx) keeps w exact, within
  // its own bound.
  // W4A8 (int4 weights, x quantized per row): the route the library takes.
  const bool w4a8 =
      ops::w4a8_route(*pw.impl(), opt, codegen::gemm_isa_for_rows(cpu_info().isa, M), M);
  const bool fused = !w4a8 && ops::quant_gemm_fused(*pw.impl(), cpu_info().isa, c.m);
  const bool int8 = c.fmt == Fmt::int8;
  std::vector<uint8_t> qa(static_cast<size_t>(K));
  int bad = 0;
  std::string first;
  for (int64_t i = 0; i < M; ++i) {
    float sa = 1;
    int32_t za = 0;
    if (int8 || w4a8)
      runtime::reference_act_quant_row(ops::act_quant_rule(ops::act_quant_mode(c.aq)), &xv[i * K],
                                       K, K, 1.0f / opt.act_scale, opt.act_scale,
                                       opt.act_zero_point, qa.data(), &sa, &za);
    for (int64_t j = 0; j < N; ++j) {
      const double b = bias_value(c, bf, bb, j);
      double ref, tol;
      double pre, sum_abs = 0;
      if (w4a8) {
        // Exact integer sums per group of the codes the kernels' quantizer
        // makes, scaled per group: the kernels' contract.
        std::vector<int64_t> sums(static_cast<size_t>(ck.groups), 0);
        double exact = 0, w_abs = 0;
        for (int64_t k = 0; k < K; ++k) {
          sums[ck.group_of[k]] += int64_t(qa[k] - za) * ck.qmz[j * K + k];
          exact += double(bf16_to_f32(xv[i * K + k])) * ck.w[j * K + k];
          sum_abs += std::fabs(double(bf16_to_f32(xv[i * K + k])) * ck.w[j * K + k]);
          w_abs += std::fabs(ck.w[j * K + k]);
        }
        double acc = 0, pre_abs = 0;
        for (int64_t g = 0; g < ck.groups; ++g) {
          const double t = double(sums[g]) * double(ck.s4[g * N + j]) * double(sa);
          acc += t;
          pre_abs += std::fabs(t);
        }
        pre = acc + b;
        ref = runtime::reference_activation(c.act, pre);
        tol = runtime::w4a8_output_bound(c.act, c.out, ck.groups, pre_abs, std::fabs(b), pre, ref);
        // Against the bf16 activations (the W4A16 result, exact weights):
        // the quantization of x moves each product by at most half a code,
        // s_x/2 · Σ|w| (documented in docs/quantized.md).
        const double pre_x = exact + b, ref_x = runtime::reference_activation(c.act, pre_x);
        const double tol_x =
            runtime::gemm_output_bound(c.act, c.out, K, sum_abs, std::fabs(b), pre_x, ref_x) +
            runtime::w4a8_activation_bound(c.act, sa, w_abs, pre_x) + tol;
        const double got_x = read_out(ybuf.data(), c.out, i * ldy + j);
        if (!(std::fabs(got_x - ref_x) <= tol_x) && bad++ == 0)
          first = fmt::format("y[{}, {}] = {} vs the bf16-activation reference {} (tol {})", i, j,
                              got_x, ref_x, tol_x);
      } else if (int8) {
        // Exact integer sums of the codes the kernels' quantizer makes.
        int64_t acc = 0, wabs = 0;
        const double sw = ck.scales_f32[c.per_tensor ? 0 : j];
        for (int64_t k = 0; k < K; ++k) {
          acc += int64_t(qa[k] - za) * ck.i8[j * K + k];
          wabs += std::abs(int64_t(qa[k] - za) * ck.i8[j * K + k]);
        }
        pre = double(acc) * sa * sw + b;
        ref = runtime::reference_activation(c.act, pre);
        tol = runtime::int8_output_bound(c.act, c.out, double(wabs) * sa * sw, std::fabs(b), pre,
                                         ref);
      } else {
        // Against the exact dequantized weights; off the scalar path the
        // kernels' bf16 rounding of w adds dequant_weight_bound.
        double acc = 0, acc_r = 0, abs_r = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double x = bf16_to_f32(xv[i * K + k]);
          acc += x * ck.w[j * K + k];
          sum_abs += std::fabs(x * ck.w[j * K + k]);
          acc_r += x * ck.w_bf16[j * K + k];
          abs_r += std::fabs(x * ck.w_bf16[j * K + k]);
        }
        pre = acc + b;
        ref = runtime::reference_activation(c.act, pre);
        tol = runtime::gemm_output_bound(c.act, c.out, K, sum_abs, std::fabs(b), pre, ref);
        if (fused) {
          double qz_abs = 0, off_abs = 0;  // Σ|x|·(|q| + |z|)·|s| (fp8: Σ|x·w|), Σ|x|·32·|s|
          for (int64_t k = 0; k < K; ++k) {
            qz_abs += std::fabs(bf16_to_f32(xv[i * K + k])) * ck.qz_s[j * K + k];
            off_abs += std::fabs(bf16_to_f32(xv[i * K + k])) * ck.off_s[j * K + k];
          }
          tol = runtime::quant_brgemm_output_bound(c.act, c.out, K, qz_abs, std::fabs(b), pre, ref,
                                                   off_abs);
        } else if (!scalar) {
          tol += runtime::dequant_weight_bound(c.act, sum_abs, pre) *
                 (c.out == DType::bf16 ? 1.01 : 1);
          // The tight check: the kernels' contract (w rounded to bf16) exactly.
          const double pre_r = acc_r + b, ref_r = runtime::reference_activation(c.act, pre_r);
          const double tol_r =
              runtime::gemm_output_bound(c.act, c.out, K, abs_r, std::fabs(b), pre_r, ref_r);
          const double got = read_out(ybuf.data(), c.out, i * ldy + j);
          if (!(std::fabs(got - ref_r) <= tol_r)) {
            if (bad++ == 0)
              first = fmt::format("y[{}, {}] = {} vs bf16-weight reference {} (tol {})", i, j, got,
                                  ref_r, tol_r);
          }
        }
      }
      const double got = read_out(ybuf.data(), c.out, i * ldy + j);
      if (!(std::fabs(got - ref) <= tol)) {
        if (bad++ == 0)
          first = fmt::format("y[{}, {}] = {} vs reference {} (tol {})", i, j, got, ref, tol);
      }
    }
    // The row padding of y is untouched.
    for (int64_t j = N; j < ldy; ++j)
      for (size_t b = 0; b < ysz; ++b)
        if (ybuf[(i * ldy + j) * ysz + b] != 0xA5 && bad++ == 0)
          first = fmt::format("y padding [{}, {}] written", i, j);
  }
  if (bad != 0) return ::testing::AssertionFailure() << bad << " bad outputs; first: " << first;
  return ::testing::AssertionSuccess();
}

std::vector<QCase> battery() {
  std::vector<QCase> out;
  const std::vector<Activation> acts = testing_support::all_activations();
  const Bias biases[] = {Bias::none, Bias::f32, Bias::bf16};
  // M tails (1, the AVX-512 / AMX blocks and past them, the fused kernel's
  // row groups of 4 with and without a remainder up to its 16 rows, > 16 for
  // deep K chunks), N tails around 16 / 64, K tails, K below one group, and
  // K past one 256 (small M) or 2048 (large M) chunk.
  const int64_t shapes[][3] = {{1, 1, 1},     {1, 65, 20},    {3, 31, 100},   {5, 130, 300},
                               {1, 64, 1000}, {17, 96, 64},   {40, 70, 2100}, {33, 200, 260},
                               {2, 17, 127},  {64, 129, 513}, {7, 90, 200},   {16, 33, 130}};
  int v = 0;
  auto add = [&](QCase c) {
    const int na = static_cast<int>(acts.size());
    c.act = acts[size_t(v % na)];
    c.bias = biases[(v / na) % 3];
    c.out = (v / 2) % 2 ? DType::bf16 : DType::f32;
    ++v;
    out.push_back(c);
  };
  for (const auto& s : shapes) {
    QCase c;
    c.m = s[0], c.n = s[1], c.k = s[2];
    // fp8: per tensor, per channel, blocks (128x128, partial last blocks,
    // small odd bn), [K, N] storage.
    for (Scale sc : {Scale::tensor, Scale::channel, Scale::block}) {
      QCase f = c;
      f.fmt = Fmt::fp8;
      f.scale = sc;
      if (sc == Scale::block) f.bn = 128, f.bk = 128;
      add(f);
    }
    {
      QCase f = c;
      f.fmt = Fmt::fp8, f.scale = Scale::block, f.bn = 48, f.bk = 16, f.kn = true;
      add(f);
      f.scale = Scale::channel, f.bn = f.bk = 0;
      add(f);
    }
    // int4: AWQ and GPTQ, every group size, symmetric and zero points,
    // act-order, v2 zeros, scale dtypes.
    int g = 0;
    for (int64_t group : {32, 64, 128, -1}) {
      QCase a = c;
      a.fmt = Fmt::awq, a.group = group, a.zp = g % 2 == 0,
      a.scale_dtype = g % 2 ? DType::bf16 : DType::f16;
      add(a);
      QCase q = c;
      q.fmt = Fmt::gptq, q.group = group, q.zp = g != 1, q.act_order = group != -1 && g % 2 == 1,
      q.v2 = g == 2, q.scale_dtype = g == 3 ? DType::f32 : DType::f16;
      add(q);
      ++g;
    }
    {
      QCase q = c;
      q.fmt = Fmt::gptq, q.group = 32, q.zp = true, q.act_order = true;
      add(q);
    }
    // W4A8 forced at every M (every path: the scalar path's oracle too) and
    // W4A16 forced where the automatic route would take W4A8: each group
    // size, zero points, act-order, each activation quantization.
    {
      int w = 0;
      for (int64_t group : {32, 128, -1, 64}) {
        QCase q = c;
        q.fmt = w % 2 ? Fmt::awq : Fmt::gptq, q.group = group, q.zp = w != 2;
        q.act_order = !(w % 2) && group != -1;
        q.route = Int4Route::w4a8;
        q.aq = w == 1 ? ActQuant::dynamic_asym : w == 3 ? ActQuant::fixed : ActQuant::dynamic_sym;
        add(q);
        ++w;
      }
      if (c.m >= ops::kW4A8MinRows) {
        QCase q = c;
        q.fmt = Fmt::gptq, q.group = 128, q.zp = true, q.route = Int4Route::w4a16;
        add(q);
      }
    }
    // MXFP4: both blocks forms (K % 32 != 0: the last block padded).
    for (bool mx3d : {false, true}) {
      QCase x = c;
      x.fmt = Fmt::mxfp4, x.mx3d = mx3d;
      add(x);
    }
    // int8 W8A8: dynamic sym / asym, fixed scale; per channel and per tensor.
    for (ActQuant aq : {ActQuant::dynamic_sym, ActQuant::dynamic_asym, ActQuant::fixed}) {
      QCase i = c;
      i.fmt = Fmt::int8, i.aq = aq, i.per_tensor = aq == ActQuant::fixed;
      add(i);
    }
  }
  return out;
}

class QuantGemm : public IsaTestWithParam<QCase> {};

TEST_P(QuantGemm, MatchesReference) {
  EXPECT_TRUE(run_case(GetParam())) << GetParam().name();
}

INSTANTIATE_TEST_SUITE_P(Battery, QuantGemm, ::testing::ValuesIn(battery()),
                         [](const auto& p) { return p.param.name(); });

// ---- the pack contract ------------------------------------------------------------

class QuantPack : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantPack, UnpackDequantizeRepack) {
  const QCase& c = GetParam();
  const Checkpoint ck = make_checkpoint(c);
  const PackedWeight pw = pack(c, ck);
  EXPECT_EQ(pw.n(), c.n);
  EXPECT_EQ(pw.k(), c.k);
  // Packing again is a no-op: the same bytes.
  const PackedWeight again = pack_weight(pw);
  EXPECT_EQ(again.impl(), pw.impl());
  // dequantize: the logical weight, the exact value rounded once to f32.
  std::vector<float> dq(static_cast<size_t>(c.n * c.k));
  pw.dequantize(TensorView(dq.data(), DType::f32, {c.n, c.k}));
  int bad = 0;
  for (size_t e = 0; e < dq.size(); ++e)
    if (dq[e] != static_cast<float>(ck.w[e]) && bad++ == 0)
      ADD_FAILURE() << "dequantize[" << e << "] = " << dq[e] << ", expected " << ck.w[e];
  // unpack: the checkpoint tensors bit for bit.
  Checkpoint out = ck;
  switch (c.fmt) {
    case Fmt::int8: {
      std::fill(out.i8.begin(), out.i8.end(), 0);
      std::fill(out.scales_f32.begin(), out.scales_f32.end(), 0.0f);
      pw.unpack(Int8Weight{
          TensorView(out.i8.data(), DType::i8, {c.n, c.k}),
          TensorView(out.scales_f32.data(), DType::f32, {int64_t(out.scales_f32.size())})});
      EXPECT_EQ(out.i8, ck.i8);
      break;
    }
    case Fmt::fp8: {
      std::fill(out.f8.begin(), out.f8.end(), 0x7F);
      std::fill(out.scales_f32.begin(), out.scales_f32.end(), 0.0f);
      Fp8Weight u = ck.fp8;
      u.weight.data = out.f8.data();
      u.scales.data = out.scales_f32.data();
      pw.unpack(u);
      EXPECT_EQ(out.f8, ck.f8);
      break;
    }
    case Fmt::mxfp4: {
      std::fill(out.mx_blocks.begin(), out.mx_blocks.end(), 0xEE);
      std::fill(out.mx_scales.begin(), out.mx_scales.end(), 0xFF);
      Mxfp4Weight u = ck.mx;
      u.blocks.data = out.mx_blocks.data();
      u.scales.data = out.mx_scales.data();
      pw.unpack(u);
      EXPECT_EQ(out.mx_blocks, ck.mx_unpacked);
      EXPECT_EQ(out.mx_scales, ck.mx_scales);
      // The other blocks form of the same bytes (when K fills them both).
      if ((c.k + 31) / 32 * 16 == (c.k + 1) / 2) {
        std::fill(out.mx_blocks.begin(), out.mx_blocks.end(), 0xEE);
        u.blocks = c.mx3d ? TensorView(out.mx_blocks.data(), DType::u8, {c.n, (c.k + 1) / 2})
                          : TensorView(out.mx_blocks.data(), DType::u8, {c.n, (c.k + 31) / 32, 16});
        pw.unpack(u);
        EXPECT_EQ(out.mx_blocks, ck.mx_unpacked);
      }
      break;
    }
    default: {
      std::fill(out.qweight.begin(), out.qweight.end(), -1);
      std::fill(out.qzeros.begin(), out.qzeros.end(), -1);
      std::fill(out.g_idx.begin(), out.g_idx.end(), -1);
      std::fill(out.scales_16.begin(), out.scales_16.end(), 0xFFFF);
      std::fill(out.scales_f32.begin(), out.scales_f32.end(), -1.0f);
      Int4Weight u = ck.int4;
      u.qweight.data = out.qweight.data();
      u.scales.data = c.scale_dtype == DType::f32 ? static_cast<void*>(out.scales_f32.data())
                                                  : static_cast<void*>(out.scales_16.data());
      if (u.qzeros) u.qzeros->data = out.qzeros.data();
      if (u.g_idx) u.g_idx->data = out.g_idx.data();
      pw.unpack(u);
      EXPECT_EQ(out.qweight, ck.qweight);
      EXPECT_EQ(out.qzeros, ck.qzeros);
      EXPECT_EQ(out.g_idx, ck.g_idx);
      EXPECT_EQ(out.scales_16, ck.scales_16);
      break;
    }
  }
  EXPECT_EQ(out.scales_f32, ck.scales_f32);
  // The bf16 unpack refuses a quantized weight (it would not be the checkpoint).
  std::vector<uint16_t> bf(static_cast<size_t>(c.n * c.k));
  EXPECT_THROW(pw.unpack(TensorView(bf.data(), DType::bf16, {c.n, c.k})), Error);
}

std::vector<QCase> pack_cases() {
  std::vector<QCase> out;
  for (const QCase& c : battery())
    if (c.m <= 5) out.push_back(c);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Contract, QuantPack, ::testing::ValuesIn(pack_cases()),
                         [](const auto& p) { return p.param.name(); });

}  // namespace
}  // namespace tilejit::test

namespace tilejit::test {
namespace {

// ---- tensor-parallel shards ---------------------------------------------------------

// A shard of a checkpoint is packed from slices of its tensors: an N slice
// of an AWQ layer (whole int32 words), and a K slice of a GPTQ layer that
// starts inside a group, described by its g_idx.
TEST(QuantShards, NSliceAndKSliceInsideAGroup) {
  QCase full;
  full.fmt = Fmt::awq, full.n = 200, full.k = 96, full.group = 32, full.zp = true;
  const Checkpoint ck = make_checkpoint(full);
  // AWQ columns [64, 136): qweight words [8, 17), scales / qzeros columns.
  const int64_t n0 = 64, n1 = 136, N = n1 - n0, n8 = (full.n + 7) / 8;
  Int4Weight s = ck.int4;
  s.qweight = TensorView(const_cast<int32_t*>(ck.qweight.data()) + n0 / 8, DType::i32,
                         {full.k, N / 8}, {n8, 1});
  s.scales =
      TensorView(const_cast<uint16_t*>(ck.scales_16.data()) + n0, DType::f16, {3, N}, {full.n, 1});
  s.qzeros =
      TensorView(const_cast<int32_t*>(ck.qzeros.data()) + n0 / 8, DType::i32, {3, N / 8}, {n8, 1});
  s.n = N;
  const PackedWeight pw = pack_weight(s);
  std::vector<float> dq(static_cast<size_t>(N * full.k));
  pw.dequantize(TensorView(dq.data(), DType::f32, {N, full.k}));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < full.k; ++k)
      ASSERT_EQ(dq[n * full.k + k], static_cast<float>(ck.w[(n0 + n) * full.k + k]))
          << n << " " << k;

  QCase g;
  g.fmt = Fmt::gptq, g.n = 40, g.k = 200, g.group = 32, g.zp = true;
  const Checkpoint gk = make_checkpoint(g);
  // Rows [40, 200): starts 8 rows into group 1; its groups are 1..6 of the full.
  const int64_t k0 = 40, K = g.k - k0;
  std::vector<int32_t> gidx(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) gidx[k] = static_cast<int32_t>((k0 + k) / 32 - k0 / 32);
  Int4Weight t = gk.int4;
  t.qweight =
      TensorView(const_cast<int32_t*>(gk.qweight.data()) + k0 / 8 * g.n, DType::i32, {K / 8, g.n});
  t.scales = TensorView(const_cast<uint16_t*>(gk.scales_16.data()) + 1 * g.n, DType::f16, {6, g.n});
  t.qzeros = TensorView(const_cast<int32_t*>(gk.qzeros.data()) + 1 * 5, DType::i32, {6, 5});
  t.g_idx = TensorView(gidx.data(), DType::i32, {K});
  t.k = K;
  const PackedWeight pk = pack_weight(t);
  std::vector<float> dk(static_cast<size_t>(g.n * K));
  pk.dequantize(TensorView(dk.data(), DType::f32, {g.n, K}));
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(dk[n * K + k], static_cast<float>(gk.w[n * g.k + k0 + k])) << n << " " << k;
  // And the shard runs: y = x · shardᵀ against the shard's logical weights.
  if (!missing_isa_reason().empty()) GTEST_SKIP() << missing_isa_reason();
  const int64_t M = 3;
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(M * K), 5);
  std::vector<float> y(static_cast<size_t>(M * g.n));
  gemm(TensorView(x.data(), DType::bf16, {M, K}), pk, TensorView(y.data(), DType::f32, {M, g.n}));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t n = 0; n < g.n; ++n) {
      double ref = 0, abs = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double v = bf16_to_f32(x[i * K + k]) * gk.w[n * g.k + k0 + k];
        ref += v, abs += std::fabs(v);
      }
      EXPECT_NEAR(y[i * g.n + n], ref,
                  runtime::gemm_output_bound(Activation::none, DType::f32, K, abs, 0, ref, ref) +
                      runtime::dequant_weight_bound(Activation::none, abs, 0));
    }
}

// ---- bad input ----------------------------------------------------------------------

TEST(QuantErrors, Int4Checkpoints) {
  QCase c;
  c.fmt = Fmt::gptq, c.n = 16, c.k = 64, c.group = 32, c.zp = true, c.act_order = true;
  const Checkpoint ck = make_checkpoint(c);
  auto with = [&](auto edit) {
    Int4Weight w = ck.int4;
    edit(w);
    return w;
  };
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.bits = 3; })); }, "bits=3");
  {  // an f16 +Inf scale (0x7c00): refused, as for fp8 / int8
    Int4Weight w = ck.int4;
    std::vector<uint16_t> s16(static_cast<size_t>(w.scales.shape[0] * w.scales.shape[1]),
                              0x3c00);  // 1.0
    s16[1 * w.scales.shape[1] + 5] = 0x7c00;
    w.scales = TensorView(s16.data(), DType::f16, w.scales.shape);
    expect_tilejit_error([&] { pack_weight(w); }, "scales[1, 5] = inf");
  }
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.bits = 8; })); }, "allowed: 4");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.group_size = 0; })); },
                       "group_size=0");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.group_size = -4; })); },
                       "group_size=-4");
  expect_tilejit_error(
      [&] {
        pack_weight(with([](Int4Weight& w) { w.format = Int4Format::awq, w.gptq_v2 = true; }));
      },
      "gptq_v2");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) {
                               w.scales.shape = {2, 15};
                             })); },
                       "scales has shape [2, 15]");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) {
                               w.qzeros->shape = {2, 1};
                             })); },
                       "qzeros");
  expect_tilejit_error(
      [&] { pack_weight(with([](Int4Weight& w) { w.qweight.dtype = DType::f32; })); }, "qweight");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.n = 17; })); }, "n=17");
  expect_tilejit_error([&] { pack_weight(with([](Int4Weight& w) { w.g_idx->shape = {63}; })); },
                       "g_idx");
  std::vector<int32_t> gi = ck.g_idx;
  gi[5] = 2;  // only groups 0, 1 exist
  expect_tilejit_error(
      [&] { pack_weight(with([&](Int4Weight& w) { w.g_idx->data = gi.data(); })); },
      "g_idx[5] = 2");
  gi = ck.g_idx;
  for (auto& v : gi) v = 0;  // 64 channels in a group of 32
  expect_tilejit_error(
      [&] { pack_weight(with([&](Int4Weight& w) { w.g_idx->data = gi.data(); })); },
      "more than group_size=32");
  // AutoRound configs.
  AutoRoundConfig cfg;
  cfg.bits = 2;
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "bits=2");
  cfg = {};
  cfg.desc_act = true;
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "desc_act");
  cfg = {};
  cfg.sym = false;
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "qzeros");
  cfg = {};
  cfg.checkpoint_format = "marlin";
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "marlin");
  cfg = {};
  cfg.checkpoint_format = "auto_round:auto_awq";
  cfg.desc_act = true;
  expect_tilejit_error(
      [&] {
        int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales, ck.int4.qzeros,
                                ck.int4.g_idx);
      },
      "AWQ");
  // A valid AutoRound GPTQ export packs like the hand-made description.
  cfg = {};
  cfg.group_size = 32, cfg.sym = false, cfg.desc_act = true,
  cfg.checkpoint_format = "auto_round:auto_gptq";
  Int4Weight w =
      int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales, ck.int4.qzeros, ck.int4.g_idx);
  w.n = c.n, w.k = c.k;
  std::vector<float> a(static_cast<size_t>(c.n * c.k)), b(a.size());
  pack_weight(w).dequantize(TensorView(a.data(), DType::f32, {c.n, c.k}));
  pack_weight(ck.int4).dequantize(TensorView(b.data(), DType::f32, {c.n, c.k}));
  EXPECT_EQ(a, b);
  // AutoRound's "auto_round:gptqmodel" export stores the zero points as they
  // are: the same tensors read as GPTQ v2, which differs from v1 by one step.
  cfg.checkpoint_format = "auto_round:gptqmodel";
  w = int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales, ck.int4.qzeros, ck.int4.g_idx);
  w.n = c.n, w.k = c.k;
  EXPECT_TRUE(w.gptq_v2);
  Int4Weight v2 = ck.int4;
  v2.gptq_v2 = true;
  std::vector<float> c2(a.size());
  pack_weight(w).dequantize(TensorView(a.data(), DType::f32, {c.n, c.k}));
  pack_weight(v2).dequantize(TensorView(c2.data(), DType::f32, {c.n, c.k}));
  EXPECT_EQ(a, c2);
  EXPECT_NE(a, b);
}

// GemmOptions::int4_route: a value outside the enum is an Error naming it
// (for every quantized weight format: read before the format matters);
// the W4A8 route checks act_quant like W8A8; a route on a non-int4 weight is
// ignored.
TEST(QuantErrors, Int4RouteOptions) {
  QCase c;
  c.fmt = Fmt::gptq, c.m = 3, c.n = 20, c.k = 64, c.group = 32;
  const Checkpoint ck = make_checkpoint(c);
  const PackedWeight w = pack(c, ck);
  std::vector<uint16_t> x(static_cast<size_t>(c.m * c.k), 0x3f80);
  std::vector<float> y(static_cast<size_t>(c.m * c.n));
  const TensorView xv(x.data(), DType::bf16, {c.m, c.k}), yv(y.data(), DType::f32, {c.m, c.n});
  GemmOptions opt;
  opt.int4_route = static_cast<Int4Route>(7);
  expect_tilejit_error([&] { gemm(xv, w, yv, opt); }, "int4_route=7");
  opt.int4_route = Int4Route::w4a8;
  opt.act_quant = ActQuant::fixed;
  opt.act_scale = 0;
  expect_tilejit_error([&] { gemm(xv, w, yv, opt); }, "act_scale=0");
  opt.act_quant = static_cast<ActQuant>(9);
  expect_tilejit_error([&] { gemm(xv, w, yv, opt); }, "act_quant=9");
  // The routes by M below are the default mode's (the ctest variants run
  // this battery with TILEJIT_BATCH_INVARIANT=1 too); the mode's are after.
  const bool saved_mode = batch_invariant();
  set_batch_invariant(false);
  // K past kW4A8MaxK: the automatic route keeps W4A16, a requested W4A8 is an Error.
  GemmOptions big;
  EXPECT_FALSE(ops::w4a8_route(WeightFormat::int4_gptq, ops::kW4A8MaxK + 8, big, Isa::llvm, 64));
  // (automatic needs the path's kernels: on llvm the LLVM ones, not under
  // TILEJIT_ISA=scalar or without LLVM; on avx512 the Xbyak ones.)
  const bool llvm = ops::w4a8_kernels_usable(Isa::llvm);
  const bool xbyak = ops::w4a8_kernels_usable(Isa::avx512);
  EXPECT_FALSE(ops::w4a8_kernels_usable(Isa::scalar));
  EXPECT_EQ(ops::w4a8_route(WeightFormat::int4_gptq, ops::kW4A8MaxK, big, Isa::llvm, 64), llvm);
  // The automatic rule by path and M: llvm from 4 rows; avx512 from 9 where
  // the Xbyak fused kernel runs (AVX512-VBMI: it wins up to 8 rows), from 4
  // where only the dequant route would; never amx or scalar.
  EXPECT_FALSE(ops::w4a8_automatic(Isa::llvm, ops::kW4A8MinRows - 1));
  EXPECT_EQ(ops::w4a8_automatic(Isa::llvm, ops::kW4A8MinRows), llvm);
  const bool vbmi = runtime::xbyak_fused_quant_kernel(runtime::cpu_features());
  for (int64_t m : {3, 4, 5, 8, 9, 16, 17, 64})
    EXPECT_EQ(ops::w4a8_automatic(Isa::avx512, m), xbyak && m >= (vbmi ? 9 : 4)) << m;
  for (int64_t m : {1, 4, 5, 16}) EXPECT_EQ(ops::quant_gemm_fused(Isa::avx512, m), vbmi) << m;
  EXPECT_FALSE(ops::quant_gemm_fused(Isa::avx512, 17));
  EXPECT_EQ(ops::quant_gemm_fused(Isa::amx, 4), vbmi);
  EXPECT_FALSE(ops::quant_gemm_fused(Isa::amx, 5));
  EXPECT_FALSE(ops::w4a8_automatic(Isa::amx, 512));
  EXPECT_FALSE(ops::w4a8_automatic(Isa::scalar, 512));
  // Batch-invariant mode: no route by M (W4A16; the fused kernel at every M
  // where the path has one, except amx: the dequant route there).
  set_batch_invariant(true);
  for (int64_t m : {1, 4, 9, 16, 17, 64, 512}) {
    EXPECT_EQ(ops::quant_gemm_fused(Isa::avx512, m), vbmi) << m;
    EXPECT_TRUE(ops::quant_gemm_fused(Isa::llvm, m)) << m;
    EXPECT_FALSE(ops::quant_gemm_fused(Isa::amx, m)) << m;
    EXPECT_EQ(ops::quant_rows_isa(Isa::amx, m), Isa::amx) << m;
    EXPECT_FALSE(ops::w4a8_automatic(Isa::avx512, m)) << m;
    EXPECT_FALSE(ops::w4a8_automatic(Isa::llvm, m)) << m;
  }
  EXPECT_FALSE(ops::w4a8_route(WeightFormat::int4_gptq, 4096, GemmOptions{}, Isa::llvm, 64));
  set_batch_invariant(saved_mode);
  big.int4_route = Int4Route::w4a8;
  expect_tilejit_error(
      [&] { ops::w4a8_route(WeightFormat::int4_awq, ops::kW4A8MaxK + 8, big, Isa::scalar, 1); },
      "K=524296");
  // On fp8 weights the route and act_quant are ignored (the fp8 GEMM runs);
  // invalid values are not (fixed with act_scale 0 was accepted there).
  QCase f;
  f.fmt = Fmt::fp8, f.n = 20, f.k = 64;
  const Checkpoint fk = make_checkpoint(f);
  const PackedWeight fw = pack(f, fk);
  GemmOptions fo;
  fo.int4_route = Int4Route::w4a8;
  fo.act_quant = ActQuant::fixed;
  expect_tilejit_error([&] { gemm(xv, fw, yv, fo); }, "act_scale=0; allowed: finite > 0");
  fo.act_scale = 0.25f;
  EXPECT_NO_THROW(gemm(xv, fw, yv, fo));
  fo.int4_route = static_cast<Int4Route>(7);
  expect_tilejit_error([&] { gemm(xv, fw, yv, fo); }, "int4_route=7");
}

// dequantize to bf16 rounds the double weight once (docs/quantized.md): an
// fp8 code of 1.5 times f32 scales whose product lies a hair past a bf16
// midpoint that f32 cannot tell from the midpoint itself (rounding through
// f32 first gave the even neighbour below; an outside tester's case).
TEST(QuantDequantize, Bf16OutputIsRoundedOnce) {
  const double mid = 1.05078125;  // between bf16 1.046875 and 1.0546875
  float sc = static_cast<float>(mid / 1.5);
  while (1.5 * double(sc) <= mid) sc = std::nextafter(sc, 2.0f);
  ASSERT_EQ(static_cast<float>(1.5 * double(sc)), float(mid)) << "not a double-rounding case";
  std::vector<uint8_t> codes(32, 0x3C);  // e4m3 1.5
  std::vector<float> scales = {sc};
  for (bool experts : {false, true}) {
    std::vector<uint16_t> out(32, 0);
    if (!experts) {
      pack_weight(Fp8Weight{TensorView(codes.data(), DType::f8e4m3, {1, 32}),
                            TensorView(scales.data(), DType::f32, {1})})
          .dequantize(TensorView(out.data(), DType::bf16, {1, 32}));
    } else {
      const std::vector<Fp8Weight> w = {{TensorView(codes.data(), DType::f8e4m3, {1, 32}),
                                         TensorView(scales.data(), DType::f32, {1})}};
      pack_experts(w, ExpertProj::down).dequantize(TensorView(out.data(), DType::bf16, {1, 1, 32}));
    }
    for (uint16_t v : out) ASSERT_EQ(v, 0x3f87) << (experts ? "PackedExperts" : "PackedWeight");
  }
}

// vLLM's per-channel / per-tensor scales [N, 1] / [1, 1] (an outside
// tester's port was refused): the same weight as with [N] / [1].
TEST(QuantPack, ScalesOfShapeNx1AreReadAsN) {
  const int64_t n = 5, k = 8;
  std::vector<int8_t> i8(static_cast<size_t>(n * k));
  std::vector<uint8_t> f8(i8.size());
  for (size_t i = 0; i < i8.size(); ++i) {
    i8[i] = static_cast<int8_t>(static_cast<int>(i * 7 % 255) - 127);
    f8[i] = static_cast<uint8_t>((i * 13) % 0x7E);
  }
  std::vector<float> sc = {0.5f, 0.25f, 2.0f, 1.5f, 0.125f};
  auto dq = [&](const PackedWeight& p) {
    std::vector<float> out(static_cast<size_t>(n * k));
    p.dequantize(TensorView(out.data(), DType::f32, {n, k}));
    return out;
  };
  for (bool per_tensor : {false, true}) {
    const int64_t rows = per_tensor ? 1 : n;
    const TensorView flat(sc.data(), DType::f32, {rows}), col(sc.data(), DType::f32, {rows, 1});
    const TensorView w8(i8.data(), DType::i8, {n, k}), wf(f8.data(), DType::f8e4m3, {n, k});
    EXPECT_EQ(dq(pack_weight(Int8Weight{w8, col})), dq(pack_weight(Int8Weight{w8, flat})));
    EXPECT_EQ(dq(pack_weight(Fp8Weight{wf, col})), dq(pack_weight(Fp8Weight{wf, flat})));
    // unpack writes them back into the same [N, 1] layout (the experts
    // fuzzer packed [1, 1] scales, then unpack refused that layout).
    std::vector<int8_t> i8b(i8.size());
    std::vector<uint8_t> f8b(f8.size());
    std::vector<float> scb(sc.size(), -1.0f);
    const TensorView colb(scb.data(), DType::f32, {rows, 1});
    pack_weight(Int8Weight{w8, col})
        .unpack(Int8Weight{TensorView(i8b.data(), DType::i8, {n, k}), colb});
    EXPECT_EQ(i8b, i8);
    EXPECT_EQ(std::vector<float>(scb.begin(), scb.begin() + rows),
              std::vector<float>(sc.begin(), sc.begin() + rows));
    std::fill(scb.begin(), scb.end(), -1.0f);
    pack_weight(Fp8Weight{wf, col})
        .unpack(Fp8Weight{TensorView(f8b.data(), DType::f8e4m3, {n, k}), colb});
    EXPECT_EQ(f8b, f8);
    EXPECT_EQ(std::vector<float>(scb.begin(), scb.begin() + rows),
              std::vector<float>(sc.begin(), sc.begin() + rows));
  }
  // [N, 2] is still refused, naming the shape.
  std::vector<float> two(static_cast<size_t>(2 * n), 1.0f);
  expect_tilejit_error(
      [&] {
        pack_weight(Int8Weight{TensorView(i8.data(), DType::i8, {n, k}),
                               TensorView(two.data(), DType::f32, {n, 2})});
      },
      "scales has shape [5, 2] (rank 2); allowed: rank 1");
}

TEST(QuantErrors, Fp8AndInt8Checkpoints) {
  QCase c;
  c.fmt = Fmt::fp8, c.n = 20, c.k = 40, c.scale = Scale::block, c.bn = 16, c.bk = 16;
  Checkpoint ck = make_checkpoint(c);
  Fp8Weight w = ck.fp8;
  w.block_k = 15;
  expect_tilejit_error([&] { pack_weight(w); }, "block_k=15");
  w = ck.fp8;
  w.scales.shape = {2, 2};
  expect_tilejit_error([&] { pack_weight(w); }, "scales has shape [2, 2]");
  w = ck.fp8;
  w.block_n = w.block_k = 0;
  expect_tilejit_error([&] { pack_weight(w); }, "rank 2");
  w = ck.fp8;
  w.weight.dtype = DType::bf16;
  expect_tilejit_error([&] { pack_weight(w); }, "weight");
  ck.f8[7] = 0xFF;
  expect_tilejit_error([&] { pack_weight(ck.fp8); }, "weight[0, 7] = 0xff");
  // An infinite scale: refused (a zero code times it was NaN on one kernel and
  // ±Inf on another). A NaN one is kept: its outputs are NaN on every path.
  ck.f8[7] = 0x38;
  ck.scales_f32[3] = std::numeric_limits<float>::infinity();
  expect_tilejit_error([&] { pack_weight(ck.fp8); }, "scales[1, 0] = inf; allowed: finite scales");
  ck.scales_f32[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NO_THROW(pack_weight(ck.fp8));

  std::vector<int8_t> big(65537, 1);
  std::vector<float> one(1, 1.0f), three(3, 1.0f);
  expect_tilejit_error(
      [&] {
        pack_weight(Int8Weight{TensorView(big.data(), DType::i8, {1, 65537}),
                               TensorView(one.data(), DType::f32, {1})});
      },
      "K=65537");
  expect_tilejit_error(
      [&] {
        pack_weight(Int8Weight{TensorView(big.data(), DType::i8, {2, 8}),
                               TensorView(three.data(), DType::f32, {3})});
      },
      "scales has shape [3]");
  std::vector<float> inf_scales = {1.0f, -std::numeric_limits<float>::infinity()};
  expect_tilejit_error(
      [&] {
        pack_weight(Int8Weight{TensorView(big.data(), DType::i8, {2, 8}),
                               TensorView(inf_scales.data(), DType::f32, {2})});
      },
      "scales[1] = -inf");
  // gemm: fixed activation quantization needs a scale and a u8 zero point.
  const PackedWeight p = pack_weight(Int8Weight{TensorView(big.data(), DType::i8, {2, 8}),
                                                TensorView(one.data(), DType::f32, {1})});
  std::vector<uint16_t> x(8, 0x3f80);
  std::vector<float> y(2);
  GemmOptions opt;
  opt.act_quant = ActQuant::fixed;
  expect_tilejit_error(
      [&] {
        gemm(TensorView(x.data(), DType::bf16, {1, 8}), p, TensorView(y.data(), DType::f32, {1, 2}),
             opt);
      },
      "act_scale=0");
  opt.act_scale = 0.1f, opt.act_zero_point = 300;
  expect_tilejit_error(
      [&] {
        gemm(TensorView(x.data(), DType::bf16, {1, 8}), p, TensorView(y.data(), DType::f32, {1, 2}),
             opt);
      },
      "act_zero_point=300");
  // Unpacking into another format's tensors, dequantizing into a wrong shape.
  expect_tilejit_error([&] { p.unpack(ck.fp8); }, "packed as int8");
  expect_tilejit_error(
      [&] {
        p.dequantize(TensorView(y.data(), DType::f32, {1, 2}));
      },
      "out has shape [1, 2]");
}

// Block and group sizes up to INT64_MAX count blocks without overflow: one
// block covers the whole matrix (ceil(N/block_n) was (N + block_n − 1) /
// block_n, which wrapped to 0 near INT64_MAX: an empty scale tensor was
// accepted, then read past by the kernels, a segfault on the scalar path).
TEST(QuantErrors, HugeBlockAndGroupSizesAreOneBlock) {
  const int64_t N = 20, K = 64;
  std::vector<uint8_t> codes(static_cast<size_t>(N * K), 0x38);  // e4m3 1.0
  std::vector<float> none, s2 = {0.5f, 0.25f}, s1 = {0.5f};
  std::vector<uint16_t> x(static_cast<size_t>(K), 0x3f80);  // bf16 1.0
  std::vector<float> y(static_cast<size_t>(N));
  const auto weight = TensorView(codes.data(), DType::f8e4m3, {N, K});
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  expect_tilejit_error(
      [&] {
        pack_weight(Fp8Weight{weight, TensorView(none.data(), DType::f32, {0, 2}), kMax, 32});
      },
      "allowed: [ceil(N/block_n), ceil(K/block_k)] = [1, 2]");
  expect_tilejit_error(
      [&] {
        pack_weight(
            Fp8Weight{weight, TensorView(none.data(), DType::f32, {0, 0}), kMax - 1, kMax - 1});
      },
      "= [1, 1]");
  // The valid forms: every row in block row 0; 32 columns a block (0.5, 0.25)
  // or all of K in one (0.5).
  const PackedWeight a =
      pack_weight(Fp8Weight{weight, TensorView(s2.data(), DType::f32, {1, 2}), kMax, 32});
  const PackedWeight b =
      pack_weight(Fp8Weight{weight, TensorView(s1.data(), DType::f32, {1, 1}), kMax - 1, kMax - 1});
  gemm(TensorView(x.data(), DType::bf16, {1, K}), a, TensorView(y.data(), DType::f32, {1, N}));
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y[n], 32 * 0.5f + 32 * 0.25f) << "n=" << n;
  gemm(TensorView(x.data(), DType::bf16, {1, K}), b, TensorView(y.data(), DType::f32, {1, N}));
  for (int64_t n = 0; n < N; ++n) EXPECT_EQ(y[n], 64 * 0.5f) << "n=" << n;

  // int4: a group size past K is one group, G = 1 (as per channel).
  QCase c;
  c.fmt = Fmt::gptq, c.n = 16, c.k = 64, c.group = -1;
  Checkpoint ck = make_checkpoint(c);
  std::vector<float> want(static_cast<size_t>(c.n * c.k)), got(want.size());
  pack_weight(ck.int4).dequantize(TensorView(want.data(), DType::f32, {c.n, c.k}));
  for (const int64_t g : {kMax, kMax - 1}) {
    Int4Weight w = ck.int4;
    w.group_size = g;
    pack_weight(w).dequantize(TensorView(got.data(), DType::f32, {c.n, c.k}));
    EXPECT_EQ(got, want) << "group_size=" << g;
  }
  // AutoRoundConfig's group size is checked where the config is read, by the
  // same rule as Int4Weight's.
  AutoRoundConfig cfg;
  cfg.group_size = 0;
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "int4_weight_from_config: group_size=0");
  cfg.group_size = std::numeric_limits<int64_t>::min();
  expect_tilejit_error([&] { int4_weight_from_config(cfg, ck.int4.qweight, ck.int4.scales); },
                       "group_size=-9223372036854775808");
}

}  // namespace
}  // namespace tilejit::test

namespace tilejit::test {
namespace {

// NaN in x row m makes y row m NaN and nothing else, for every format (W8A8:
// the row's scale becomes NaN, docs/quantized.md).
class QuantNan : public IsaTestWithParam<Fmt> {};

TEST_P(QuantNan, RowOfNanStaysInItsRow) {
  QCase c;
  c.fmt = GetParam(), c.m = 4, c.n = 70, c.k = 96, c.group = 32, c.zp = true;
  const Checkpoint ck = make_checkpoint(c);
  const PackedWeight pw = pack(c, ck);
  std::vector<uint16_t> x = random_bf16(static_cast<size_t>(c.m * c.k), 3);
  x[2 * c.k + 17] = 0x7fc0;  // NaN in row 2
  std::vector<float> y(static_cast<size_t>(c.m * c.n));
  gemm(TensorView(x.data(), DType::bf16, {c.m, c.k}), pw,
       TensorView(y.data(), DType::f32, {c.m, c.n}));
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j)
      EXPECT_EQ(std::isnan(y[i * c.n + j]), i == 2)
          << fmt_name(c.fmt) << " y[" << i << ", " << j << "]";
}

// An ±Inf in x gives each output its IEEE value: ±Inf by the sign of the
// weight it meets, NaN where that weight is 0 (Inf · 0), the other rows
// finite. The int4 fused decode kernel made every column of such a row NaN
// (Inf − Inf in its zero-point form): int4 rows with an Inf now take the
// dequant route. M 1 and 3 run the fused kernel on amx / avx512 / llvm, 20
// the dequant route: int4 under W4A16 and under the automatic route, which
// would take W4A8 at 20 rows on llvm and avx512 but keeps such x on W4A16
// (ops::w4a8_keeps_infinities; a requested W4A8 quantizes a row with an Inf
// to NaN, docs/quantized.md, as W8A8 does).
TEST_P(QuantNan, InfInXGivesEachColumnItsIeeeInfOrNaN) {
  QCase c;
  c.fmt = GetParam(), c.n = 70, c.k = 96, c.group = 32, c.zp = true;
  if (c.fmt == Fmt::int8) GTEST_SKIP() << "W8A8: a row with an Inf quantizes to scale NaN";
  for (const Int4Route route : {Int4Route::w4a16, Int4Route::automatic})
    for (int64_t m : {1, 3, 20}) {
      c.m = m;
      const Checkpoint ck = make_checkpoint(c);
      const PackedWeight pw = pack(c, ck);
      std::vector<float> w(static_cast<size_t>(c.n * c.k));
      pw.dequantize(TensorView(w.data(), DType::f32, {c.n, c.k}));
      std::vector<uint16_t> x = random_bf16(static_cast<size_t>(m * c.k), 5);
      x[0] = 0x7f80;                             // +Inf at row 0, k 0
      if (m > 1) x[(m - 1) * c.k + 5] = 0xff80;  // -Inf at the last row, k 5
      std::vector<float> y(static_cast<size_t>(m * c.n));
      GemmOptions opt;
      opt.int4_route = route;
      gemm(TensorView(x.data(), DType::bf16, {m, c.k}), pw,
           TensorView(y.data(), DType::f32, {m, c.n}), opt);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < c.n; ++j) {
          const float got = y[i * c.n + j];
          SCOPED_TRACE(std::string(fmt_name(c.fmt)) + " m=" + std::to_string(m) +
                       (route == Int4Route::automatic ? " automatic" : " w4a16") + " y[" +
                       std::to_string(i) + ", " + std::to_string(j) + "] = " + std::to_string(got));
          const bool inf_row = i == 0 || i == m - 1;
          if (!inf_row) {
            EXPECT_TRUE(std::isfinite(got));
            continue;
          }
          const float wv = w[j * c.k + (i == 0 ? 0 : 5)];
          const float sign = i == 0 ? 1.0f : -1.0f;
          if (wv == 0)
            EXPECT_TRUE(std::isnan(got));
          else
            EXPECT_EQ(got, sign * wv > 0 ? INFINITY : -INFINITY);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantNan,
                         ::testing::Values(Fmt::int8, Fmt::fp8, Fmt::awq, Fmt::gptq, Fmt::mxfp4),
                         [](const auto& p) { return std::string(fmt_name(p.param)); });

}  // namespace
}  // namespace tilejit::test

namespace tilejit::test {
namespace {

// ---- MXFP4: the whole e8m0 range, negative zeros, bad checkpoints -------------------

// Every exponent 0..254 (e = 0: the subnormal scale 2^-127; e = 254 with
// |v| >= 2: beyond f32, ±Inf) and every code, with -0 codes (0x8) in every
// row: dequantize is the exact value (signed zeros included), unpack the
// checkpoint; both blocks forms, K a multiple of 32 and not.
TEST(QuantMxfp4, EveryExponentAndCode) {
  for (const auto& [n, k, mx3d] : {std::tuple{64, 320, true}, std::tuple{70, 300, false},
                                   std::tuple{9, 1, false}, std::tuple{9, 33, true}}) {
    QCase c;
    c.fmt = Fmt::mxfp4, c.n = n, c.k = k, c.mx3d = mx3d;
    Checkpoint ck;
    ck.w.assign(static_cast<size_t>(n * k), 0);
    ck.w_bf16 = ck.qz_s = ck.off_s = ck.w;
    const int64_t G = (k + 31) / 32;
    make_mxfp4(
        c, ck, [&](int64_t r, int64_t kk) { return kk % 5 == 2 ? 0x8 : int((r * 7 + kk) % 16); },
        [&](int64_t r, int64_t g) { return int((r * G + g) % 255); });
    const PackedWeight pw = pack_weight(ck.mx);
    EXPECT_EQ(pw.format(), WeightFormat::mxfp4);
    EXPECT_EQ(pw.dtype(), DType::f4e2m1);
    EXPECT_EQ(pw.layout().rfind("f4e2m1_mx_vnni2_n64k32_g32", 0), 0u) << pw.layout();
    EXPECT_EQ(pack_weight(pw).impl(), pw.impl());
    std::vector<float> dq(static_cast<size_t>(n * k));
    pw.dequantize(TensorView(dq.data(), DType::f32, {n, k}));
    int bad = 0;
    for (int64_t e = 0; e < n * k; ++e) {
      const float want = static_cast<float>(ck.w[e]);
      if (!(dq[e] == want && std::signbit(dq[e]) == std::signbit(want)) && bad++ < 3)
        ADD_FAILURE() << "dequantize[" << e / k << ", " << e % k << "] = " << dq[e] << ", expected "
                      << want;
    }
    std::vector<uint8_t> blocks(ck.mx_blocks.size(), 0xEE), scales(ck.mx_scales.size(), 0);
    Mxfp4Weight u = ck.mx;
    u.blocks.data = blocks.data();
    u.scales.data = scales.data();
    pw.unpack(u);
    EXPECT_EQ(blocks, ck.mx_unpacked);
    EXPECT_EQ(scales, ck.mx_scales);
  }
}

// The GEMM over the exponents a weight can take without leaving f32 in the
// sums: e in {0, 1, 2, 126, 127, 128, 253, 254} (e >= 253 rows: |v| <= 1.5,
// small x), on the active path, against the exact weights. The bf16 dot
// products flush subnormal operands and results (weights below 2^-126: e <= 1),
// which the absolute 2^-100 allows.
TEST(QuantMxfp4, GemmAcrossTheExponentRange) {
  if (!missing_isa_reason().empty()) GTEST_SKIP() << missing_isa_reason();
  const int64_t N = 80, K = 72;
  const int kExps[] = {0, 1, 2, 126, 127, 128, 253, 254};
  QCase c;
  c.fmt = Fmt::mxfp4, c.n = N, c.k = K;
  Checkpoint ck;
  ck.w.assign(static_cast<size_t>(N * K), 0);
  ck.w_bf16 = ck.qz_s = ck.off_s = ck.w;
  std::mt19937 rng(11);
  std::vector<int> q(static_cast<size_t>(N * 96));
  for (auto& v : q) v = static_cast<int>(rng() % 16);
  const auto exp_of = [&](int64_t n, int64_t g) { return kExps[(n + g) % 8]; };
  make_mxfp4(
      c, ck,
      [&](int64_t n, int64_t k) {
        const int v = q[n * 96 + k];
        return exp_of(n, k / 32) >= 253 ? v & 0xB : v;  // |v| <= 1.5
      },
      exp_of);
  const PackedWeight pw = pack_weight(ck.mx);
  for (int64_t M : {1, 3, 20}) {
    std::vector<uint16_t> x = random_bf16(static_cast<size_t>(M * K), 7, -1.0f / 64, 1.0f / 64);
    std::vector<float> y(static_cast<size_t>(M * N));
    gemm(TensorView(x.data(), DType::bf16, {M, K}), pw, TensorView(y.data(), DType::f32, {M, N}));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        double ref = 0, abs = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double v = bf16_to_f32(x[i * K + k]) * ck.w[j * K + k];
          ref += v, abs += std::fabs(v);
        }
        const double tol =
            runtime::gemm_output_bound(Activation::none, DType::f32, K, abs, 0, ref, ref) +
            std::ldexp(1.0, -100);
        EXPECT_NEAR(y[i * N + j], ref, tol) << "M=" << M << " y[" << i << ", " << j << "]";
      }
  }
}

// Strided views (an expert's slice of GPT-OSS's [E, N, K/32, 16] tensors, a
// padded row stride, a 3-D view with its blocks apart) pack like the dense
// ones, and unpack writes into strided views.
TEST(QuantMxfp4, StridedViews) {
  QCase c;
  c.fmt = Fmt::mxfp4, c.n = 70, c.k = 96, c.mx3d = true;
  const Checkpoint ck = make_checkpoint(c);
  const int64_t N = c.n, K = c.k, G = 3;
  std::vector<float> want(static_cast<size_t>(N * K)), got(want.size());
  pack_weight(ck.mx).dequantize(TensorView(want.data(), DType::f32, {N, K}));
  // Blocks apart: row stride 5 blocks of 20 bytes; scales with a row stride of 7.
  std::vector<uint8_t> blocks(static_cast<size_t>(N * 100), 0xCC),
      scales(static_cast<size_t>(N * 7));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t g = 0; g < G; ++g) {
      for (int b = 0; b < 16; ++b)
        blocks[n * 100 + g * 20 + b] = ck.mx_blocks[(n * G + g) * 16 + b];
      scales[n * 7 + g] = ck.mx_scales[n * G + g];
    }
  }
  Mxfp4Weight w;
  w.blocks = TensorView(blocks.data(), DType::u8, {N, G, 16}, {100, 20, 1});
  w.scales = TensorView(scales.data(), DType::u8, {N, G}, {7, 1});
  const PackedWeight pw = pack_weight(w);
  pw.dequantize(TensorView(got.data(), DType::f32, {N, K}));
  EXPECT_EQ(got, want);
  // The 2-D form with a padded row stride.
  std::vector<uint8_t> flat(static_cast<size_t>(N * 53), 0xCC);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K / 2; ++j) flat[n * 53 + j] = ck.mx_blocks[n * G * 16 + j];
  w.blocks = TensorView(flat.data(), DType::u8, {N, K / 2}, {53, 1});
  pack_weight(w).dequantize(TensorView(got.data(), DType::f32, {N, K}));
  EXPECT_EQ(got, want);
  // unpack into the strided 3-D view: the bytes of the blocks, the gaps untouched.
  std::vector<uint8_t> out(blocks.size(), 0xCC), out_s(scales.size(), 0);
  Mxfp4Weight u;
  u.blocks = TensorView(out.data(), DType::u8, {N, G, 16}, {100, 20, 1});
  u.scales = TensorView(out_s.data(), DType::u8, {N, G}, {7, 1});
  pw.unpack(u);
  EXPECT_EQ(out, blocks);
  EXPECT_EQ(out_s, scales);
}

// GPT-OSS's [N, G, 16] blocks of a K that is not a multiple of 32, reshaped
// to 2-D as [N, 16·G] (the plain reshape a loader does): the same weight as
// the 3-D form and as [N, ceil(K/2)]; unpack into any of the three forms
// gives the bytes back, the padding as 0. (docs/quantized.md called the 2-D
// form "the same bytes as [N, K/2]", and [N, 48] for K = 80 was refused.)
TEST(QuantMxfp4, PaddedTwoDimensionalFormIsTheWholeBlocks) {
  QCase c;
  c.fmt = Fmt::mxfp4, c.n = 5, c.k = 80, c.mx3d = true;
  const Checkpoint ck = make_checkpoint(c);
  const int64_t N = 5, K = 80;
  Mxfp4Weight flat = ck.mx;
  flat.blocks = TensorView(ck.mx.blocks.data, DType::u8, {N, 48});
  flat.k = K;
  std::vector<float> a(static_cast<size_t>(N * K)), b(a.size());
  pack_weight(ck.mx).dequantize(TensorView(a.data(), DType::f32, {N, K}));
  const PackedWeight pf = pack_weight(flat);
  pf.dequantize(TensorView(b.data(), DType::f32, {N, K}));
  EXPECT_EQ(a, b);
  std::vector<uint8_t> back(static_cast<size_t>(N * 48), 0xAA), sc(static_cast<size_t>(N * 3));
  Mxfp4Weight out = flat;
  out.blocks = TensorView(back.data(), DType::u8, {N, 48});
  out.scales = TensorView(sc.data(), DType::u8, {N, 3});
  pf.unpack(out);
  EXPECT_EQ(back, ck.mx_unpacked);  // bytes past K/2 as 0
  std::vector<uint8_t> half(static_cast<size_t>(N * 40));
  out.blocks = TensorView(half.data(), DType::u8, {N, 40});
  pf.unpack(out);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < 40; ++j) ASSERT_EQ(half[n * 40 + j], back[n * 48 + j]);
  out.blocks = TensorView(half.data(), DType::u8, {N, 44});
  expect_tilejit_error([&] { pf.unpack(out); }, "blocks has shape [5, 44]");
}

TEST(QuantErrors, Mxfp4Checkpoints) {
  QCase c;
  c.fmt = Fmt::mxfp4, c.n = 4, c.k = 64, c.mx3d = true;
  Checkpoint ck = make_checkpoint(c);
  auto with = [&](auto edit) {
    Mxfp4Weight w = ck.mx;
    edit(w);
    return w;
  };
  ck.mx_scales[1 * 2 + 1] = 0xFF;
  expect_tilejit_error([&] { pack_weight(ck.mx); }, "scales[1, 1] = 0xff");
  ck.mx_scales[1 * 2 + 1] = 127;
  expect_tilejit_error(
      [&] {
        pack_weight(with([](Mxfp4Weight& w) { w.blocks.shape = {4, 2, 8}; }));
      },
      "blocks has shape [4, 2, 8]");
  expect_tilejit_error([&] { pack_weight(with([](Mxfp4Weight& w) { w.blocks.shape = {128}; })); },
                       "blocks has rank 1");
  expect_tilejit_error(
      [&] { pack_weight(with([](Mxfp4Weight& w) { w.blocks.dtype = DType::i8; })); }, "blocks");
  expect_tilejit_error(
      [&] { pack_weight(with([](Mxfp4Weight& w) { w.scales.dtype = DType::f32; })); }, "scales");
  expect_tilejit_error([&] { pack_weight(with([](Mxfp4Weight& w) {
                               w.scales.shape = {4, 3};
                             })); },
                       "scales has shape [4, 3]");
  expect_tilejit_error([&] { pack_weight(with([](Mxfp4Weight& w) { w.k = 65; })); }, "k=65");
  expect_tilejit_error([&] { pack_weight(with([](Mxfp4Weight& w) { w.k = 32; })); }, "k=32");
  // A 2-D view of the same bytes ([4, 32]): K is 63 or 64 (ceil(K/2) bytes)
  // or 33 .. 64 (two whole 32-code blocks, a padded checkpoint reshaped).
  expect_tilejit_error(
      [&] {
        pack_weight(with([](Mxfp4Weight& w) {
          w.blocks = TensorView(w.blocks.data, DType::u8, {4, 32});
          w.k = 31;
        }));
      },
      "k=31");
  EXPECT_NO_THROW(pack_weight(with([](Mxfp4Weight& w) {
    w.blocks = TensorView(w.blocks.data, DType::u8, {4, 32});
    w.k = 62;
  })));
  const PackedWeight pw = pack_weight(ck.mx);
  expect_tilejit_error([&] { pw.unpack(ck.int4); }, "packed as mxfp4");
  expect_tilejit_error(
      [&] {
        pw.unpack(with([](Mxfp4Weight& w) { w.blocks.shape = {4, 3, 16}; }));
      },
      "blocks has shape [4, 3, 16]");
  expect_tilejit_error([&] { pw.unpack(with([](Mxfp4Weight& w) { w.k = 63; })); }, "k=63");
  const PackedWeight p8 = pack_weight(make_checkpoint(QCase{}).fp8);
  expect_tilejit_error([&] { p8.unpack(ck.mx); }, "packed as fp8_e4m3");
}

}  // namespace
}  // namespace tilejit::test
