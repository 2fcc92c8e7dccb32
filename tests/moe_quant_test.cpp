// fused_experts on quantized experts (int8 W8A8, fp8 e4m3 per-channel and
// block, int4 GPTQ act-order with zero points, AWQ, symmetric per-channel)
// against a double-precision oracle written here on the experts' logical
// weights, decoded from the checkpoint tensors this test builds (not through
// the library), on the active ISA path; plus the pack contract and bad input.
//
// The oracle: per token and routed expert, gate/up = x·W13ᵀ (+ b13), the
// activation glu(gate, up) rounded to bf16 (the kernels store it as bf16),
// y = act·W2ᵀ (+ b2), out = rsf·Σ w·y + shared. For int8 experts, and int4
// experts on the W4A8 route (ops::w4a8_route by MoeOptions::int4_route, the
// path and the rows routed to the expert), x and the activation row are
// first quantized per token (or, act_quant = fixed, with static
// per-projection scales, saturating) with the kernels' documented rule
// (runtime/reference_quant.h, the act_quant contract), so the oracle sees
// (q − z)·s as they do.
//
// The oracle follows the route each expert's GEMMs take (ops::quant_gemm_fused,
// the library's one rule for it): the fused decode kernel and int8 read the
// exact weights, the dequant route the weights rounded once to bf16 (the
// dequant kernels' contract: bf16(f32(v·s))). The bound is then moe_test's
// (runtime/reference_error_bounds.h): fp32 sums within 8·u·Σ|terms| per
// sum (the fused int4 kernel's terms are a·(16 + q) and (16 + z)·Σa, so its
// Σ|terms| uses (|q| + |z| + 32)·|s|), an activation's bf16 rounding
// allowed to go the other way only where the fp32 error can reach a
// rounding midpoint (moe_act_slack), and for int8 the requantized
// activation row: a code one step off where an activation has slack, or
// every code and the row scale if the row's max or min element has slack.
// A 1 % error in any scale, a wrong group or nibble, a dropped tail fails it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_quant.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

enum class QFmt {
  int8_sym,
  int8_asym,
  int8_fixed,  // ActQuant::fixed: static per-projection scales (fixed_quant)
  fp8_channel,
  fp8_block,
  gptq_actorder,
  awq,
  gptq_sym_ch,
  mxfp4
};

const char* qfmt_name(QFmt f) {
  switch (f) {
    case QFmt::int8_sym:
      return "int8sym";
    case QFmt::int8_asym:
      return "int8asym";
    case QFmt::int8_fixed:
      return "int8fixed";
    case QFmt::fp8_channel:
      return "fp8ch";
    case QFmt::fp8_block:
      return "fp8block32";
    case QFmt::gptq_actorder:
      return "gptqg32zpactorder";
    case QFmt::awq:
      return "awqg32zp";
    case QFmt::gptq_sym_ch:
      return "gptqsymch";
    case QFmt::mxfp4:
      return "mxfp4";
  }
  return "?";
}

bool is_int8(QFmt f) {
  return f == QFmt::int8_sym || f == QFmt::int8_asym || f == QFmt::int8_fixed;
}

struct QCase {
  int64_t t = 5, h = 80, i = 48, e = 8, k = 2;
  QFmt fmt = QFmt::fp8_channel;
  Activation act = Activation::silu;
  bool clamped = false, b13 = false, b2 = false;
  bool plain = false;  // non-gated experts (ExpertProj::up, [I, H]; the shared one too)
  int64_t shared_i = 0;
  QFmt shared_fmt = QFmt::fp8_channel;
  DType out = DType::bf16;
  bool hot = false;          // every token on experts 0..k-1 (the rest cold)
  bool interleaved = false;  // gate_up rows as GPT-OSS's: 2i gate i, 2i + 1 up i
  bool saturate = false;     // int8_fixed: scales too small, many codes clip at 0 / 255
  bool asym = false;         // act_quant = dynamic_asym for int4 experts on W4A8
  Int4Route int4_route = Int4Route::automatic;
};

// int8_fixed's static scale and zero point of w13's (down = false) or w2's
// input. hidden is drawn in [-1, 1]: 1/127 with z = 120 clips only the
// lowest few codes (an asymmetric zero point); the activations here reach
// |a| ~ 4..300 per row (median row max ~ 44), so w2's symmetric scale 1 clips
// only the largest. saturate: 1/4 and 1/20 of those, so codes of both
// inputs clip (check_case requires some).
std::pair<float, int32_t> fixed_quant(const QCase& c, bool down) {
  if (down) return {c.saturate ? 0.05f : 1.0f, 128};
  return {(c.saturate ? 0.25f : 1.0f) / 127.0f, 120};
}
bool uses_fixed(const QCase& c) {
  return c.fmt == QFmt::int8_fixed || (c.shared_i != 0 && c.shared_fmt == QFmt::int8_fixed);
}
// The case's MoeOptions::act_quant: one mode for every quantized input.
ActQuant act_quant(const QCase& c) {
  if (uses_fixed(c)) return ActQuant::fixed;
  return c.fmt == QFmt::int8_asym || c.asym ? ActQuant::dynamic_asym : ActQuant::dynamic_sym;
}

std::string case_str(const QCase& c) {
  std::ostringstream s;
  s << qfmt_name(c.fmt) << "_T" << c.t << "_H" << c.h << "_I" << c.i << "_E" << c.e << "_k" << c.k
    << "_" << (c.clamped ? "swigluclamp" : activation_name(c.act));
  if (c.plain) s << "_nongated";
  if (c.b13) s << "_b13";
  if (c.b2) s << "_b2";
  if (c.shared_i) s << "_shared" << c.shared_i << qfmt_name(c.shared_fmt);
  if (c.out == DType::f32) s << "_outf32";
  if (c.hot) s << "_hot";
  if (c.interleaved) s << "_interleaved";
  if (c.saturate) s << "_saturate";
  if (c.asym) s << "_asym";
  if (c.int4_route == Int4Route::w4a8) s << "_w4a8";
  if (c.int4_route == Int4Route::w4a16) s << "_w4a16";
  return s.str();
}

void PrintTo(const QCase& c, std::ostream* os) {
  *os << case_str(c);
}

// ---------------------------------------------------------------------------
// One logical matrix [N, K] in a checkpoint format, with its exact weights.

struct Matrix {
  int64_t n = 0, k = 0;
  std::vector<int8_t> i8;
  std::vector<uint8_t> f8;
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<float> scales;
  std::vector<uint8_t> e8m0;  // mxfp4 scales
  std::vector<double> w;      // [N, K] exact
  std::vector<double> mag;    // [N, K] the magnitude of w's terms in fp32 sums (see the top)
  Int8Weight int8;
  Fp8Weight fp8;
  Int4Weight int4;
  Mxfp4Weight mxfp4;
};

// Weights of magnitude up to `a`, from codes and scales drawn for the format.
Matrix make_matrix(QFmt f, int64_t N, int64_t K, double a, uint32_t seed) {
  Matrix m;
  m.n = N, m.k = K;
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  m.w.assign(static_cast<size_t>(N * K), 0);
  m.mag.assign(static_cast<size_t>(N * K), 0);
  switch (f) {
    case QFmt::int8_sym:
    case QFmt::int8_asym:
    case QFmt::int8_fixed: {
      m.i8.resize(static_cast<size_t>(N * K));
      m.scales.resize(static_cast<size_t>(N));
      for (int64_t n = 0; n < N; ++n) {
        m.scales[n] = static_cast<float>(a / 127 * (0.5 + u01(rng)));
        for (int64_t k = 0; k < K; ++k) {
          const auto q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
          m.i8[n * K + k] = q;
          m.w[n * K + k] = double(q) * double(m.scales[n]);
          m.mag[n * K + k] = std::fabs(m.w[n * K + k]);
        }
      }
      m.int8.weight = TensorView(m.i8.data(), DType::i8, {N, K});
      m.int8.scales = TensorView(m.scales.data(), DType::f32, {N});
      return m;
    }
    case QFmt::fp8_channel:
    case QFmt::fp8_block: {
      const bool block = f == QFmt::fp8_block;
      constexpr int64_t kB = 32;
      const int64_t gn = block ? (N + kB - 1) / kB : N, gk = block ? (K + kB - 1) / kB : 1;
      m.scales.resize(static_cast<size_t>(gn * gk));
      for (float& s : m.scales) s = static_cast<float>(a / 448 * (1.0 + u01(rng)));
      m.f8.resize(static_cast<size_t>(N * K));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const float s = block ? m.scales[n / kB * gk + k / kB] : m.scales[n];
          const uint8_t q = runtime::f32_to_e4m3(static_cast<float>((2 * u01(rng) - 1) * a / s));
          m.f8[n * K + k] = q;
          m.w[n * K + k] = double(runtime::e4m3_to_f32(q)) * double(s);
          m.mag[n * K + k] = std::fabs(m.w[n * K + k]);
        }
      m.fp8.weight = TensorView(m.f8.data(), DType::f8e4m3, {N, K});
      if (block) {
        m.fp8.scales = TensorView(m.scales.data(), DType::f32, {gn, gk});
        m.fp8.block_n = kB;
        m.fp8.block_k = kB;
      } else {
        m.fp8.scales = TensorView(m.scales.data(), DType::f32, {N});
      }
      return m;
    }
    case QFmt::mxfp4: {
      // Blocks [N, ceil(K/32), 16], low nibble the even k; e8m0 scales near a/6.
      const int64_t kb = (K + 31) / 32;
      m.f8.assign(static_cast<size_t>(N * kb * 16), 0);
      std::vector<uint8_t>& sc = m.e8m0;
      sc.resize(static_cast<size_t>(N * kb));
      const int e0 = 127 + static_cast<int>(std::floor(std::log2(a / 6)));
      for (uint8_t& e : sc) e = static_cast<uint8_t>(e0 + static_cast<int>(rng() % 2));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          const auto q = static_cast<uint8_t>(rng() % 16);
          m.f8[(n * kb + k / 32) * 16 + k % 32 / 2] |= static_cast<uint8_t>(q << (4 * (k % 2)));
          m.w[n * K + k] =
              double(runtime::e2m1_to_f32(q)) * std::ldexp(1.0, sc[n * kb + k / 32] - 127);
          m.mag[n * K + k] = std::fabs(m.w[n * K + k]);
        }
      m.mxfp4.blocks = TensorView(m.f8.data(), DType::u8, {N, kb, 16});
      m.mxfp4.scales = TensorView(sc.data(), DType::u8, {N, kb});
      m.mxfp4.k = K;
      return m;
    }
    case QFmt::gptq_actorder:
    case QFmt::awq:
    case QFmt::gptq_sym_ch: {
      const bool awq = f == QFmt::awq, zp = f != QFmt::gptq_sym_ch;
      const int64_t g = f == QFmt::gptq_sym_ch ? -1 : 32;
      const int64_t G = g < 0 ? 1 : (K + g - 1) / g;
      std::vector<int32_t> group(static_cast<size_t>(K));
      if (f == QFmt::gptq_actorder) {
        // Act-order: channel perm[j] in group j / g.
        std::vector<int32_t> perm(static_cast<size_t>(K));
        std::iota(perm.begin(), perm.end(), 0);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (int64_t j = 0; j < K; ++j) group[perm[j]] = static_cast<int32_t>(j / g);
        m.g_idx = group;
      } else {
        for (int64_t k = 0; k < K; ++k) group[k] = static_cast<int32_t>(g < 0 ? 0 : k / g);
      }
      m.scales.resize(static_cast<size_t>(G * N));
      for (float& s : m.scales) s = static_cast<float>(a / 8 * (0.5 + u01(rng)));
      std::vector<int> z(static_cast<size_t>(G * N), 8);
      if (zp)
        for (int& v : z) v = 1 + static_cast<int>(rng() % 15);  // 1..15: GPTQ v1 stores z − 1
      const int64_t words_n = (N + 7) / 8;
      if (awq)
        m.qweight.assign(static_cast<size_t>(K * words_n), 0);
      else
        m.qweight.assign(static_cast<size_t>((K + 7) / 8 * N), 0);
      for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n) {
          const int q = static_cast<int>(rng() % 16);
          const auto v = static_cast<uint32_t>(q);
          if (awq)
            m.qweight[k * words_n + n / 8] |=
                static_cast<int32_t>(v << (4 * runtime::kAwqNibble[n % 8]));
          else
            m.qweight[k / 8 * N + n] |= static_cast<int32_t>(v << (4 * (k % 8)));
          const int64_t gi = group[k] * N + n;
          m.w[n * K + k] = double(q - z[gi]) * double(m.scales[gi]);
          m.mag[n * K + k] = double(q + z[gi] + 32) * double(m.scales[gi]);
        }
      if (zp) {
        m.qzeros.assign(static_cast<size_t>(G * words_n), 0);
        for (int64_t gg = 0; gg < G; ++gg)
          for (int64_t n = 0; n < N; ++n) {
            const int stored = awq ? z[gg * N + n] : z[gg * N + n] - 1;
            const int pos = awq ? runtime::kAwqNibble[n % 8] : static_cast<int>(n % 8);
            m.qzeros[gg * words_n + n / 8] |= static_cast<int32_t>(uint32_t(stored) << (4 * pos));
          }
      }
      m.int4.format = awq ? Int4Format::awq : Int4Format::gptq;
      m.int4.group_size = g;
      m.int4.n = N;
      m.int4.k = K;
      m.int4.qweight = awq ? TensorView(m.qweight.data(), DType::i32, {K, words_n})
                           : TensorView(m.qweight.data(), DType::i32, {(K + 7) / 8, N});
      m.int4.scales = TensorView(m.scales.data(), DType::f32, {G, N});
      if (zp) m.int4.qzeros = TensorView(m.qzeros.data(), DType::i32, {G, words_n});
      if (!m.g_idx.empty()) m.int4.g_idx = TensorView(m.g_idx.data(), DType::i32, {K});
      return m;
    }
  }
  return m;
}

PackedExperts pack_matrices(QFmt f, const std::vector<Matrix>& ms, ExpertProj proj, GluRows rows) {
  if (is_int8(f)) {
    std::vector<Int8Weight> v;
    for (const Matrix& m : ms) v.push_back(m.int8);
    return pack_experts(v, proj, rows);
  }
  if (f == QFmt::fp8_channel || f == QFmt::fp8_block) {
    std::vector<Fp8Weight> v;
    for (const Matrix& m : ms) v.push_back(m.fp8);
    return pack_experts(v, proj, rows);
  }
  if (f == QFmt::mxfp4) {
    std::vector<Mxfp4Weight> v;
    for (const Matrix& m : ms) v.push_back(m.mxfp4);
    return pack_experts(v, proj, rows);
  }
  std::vector<Int4Weight> v;
  for (const Matrix& m : ms) v.push_back(m.int4);
  return pack_experts(v, proj, rows);
}

struct Experts {
  std::vector<Matrix> w13, w2;  // per expert: [2I, H] (gate rows, then up rows), [H, I]
  PackedExperts p13, p2;
};

// The rows of a halves-ordered [2I, ...] matrix in GPT-OSS's interleaved
// order (the checkpoint the packer sees; the oracle keeps the halves).
Matrix interleave_rows(QFmt f, const Matrix& m) {
  Matrix r = m;
  const int64_t I = m.n / 2, K = m.k;
  auto src_row = [&](int64_t row) { return row % 2 == 0 ? row / 2 : I + row / 2; };
  auto copy_rows = [&](auto& dst, const auto& src, int64_t width) {
    for (int64_t row = 0; row < m.n; ++row)
      std::copy_n(src.begin() + src_row(row) * width, width, dst.begin() + row * width);
  };
  if (is_int8(f)) {
    copy_rows(r.i8, m.i8, K);
    copy_rows(r.scales, m.scales, 1);
    r.int8.weight.data = r.i8.data();
    r.int8.scales.data = r.scales.data();
  } else if (f == QFmt::mxfp4) {
    const int64_t kb = (K + 31) / 32;
    copy_rows(r.f8, m.f8, kb * 16);
    copy_rows(r.e8m0, m.e8m0, kb);
    r.mxfp4.blocks.data = r.f8.data();
    r.mxfp4.scales.data = r.e8m0.data();
  } else if (f == QFmt::fp8_channel) {
    copy_rows(r.f8, m.f8, K);
    copy_rows(r.scales, m.scales, 1);
    r.fp8.weight.data = r.f8.data();
    r.fp8.scales.data = r.scales.data();
  } else {
    ADD_FAILURE() << "interleave_rows: no interleaved form for " << qfmt_name(f);
  }
  return r;
}

Experts make_experts(QFmt f, int64_t E, int64_t H, int64_t I, uint32_t seed,
                     bool interleaved = false, bool plain = false) {
  Experts x;
  // x in [-1, 1] and |w13| <= 12/√H give pre-activations of a few units (both
  // tails of silu / gelu, the clamp of the swiglu); |w2| <= 3/√I.
  for (int64_t e = 0; e < E; ++e) {
    x.w13.push_back(
        make_matrix(f, (plain ? 1 : 2) * I, H, 12.0 / std::sqrt(double(H)), seed + 2 * e));
    x.w2.push_back(make_matrix(f, H, I, 3.0 / std::sqrt(double(I)), seed + 2 * e + 1));
  }
  if (interleaved) {
    std::vector<Matrix> il;
    for (const Matrix& m : x.w13) il.push_back(interleave_rows(f, m));
    x.p13 = pack_matrices(f, il, ExpertProj::gate_up, GluRows::interleaved);
  } else {
    x.p13 = pack_matrices(f, x.w13, plain ? ExpertProj::up : ExpertProj::gate_up, GluRows::halves);
  }
  x.p2 = pack_matrices(f, x.w2, ExpertProj::down, GluRows::halves);
  return x;
}

// ---------------------------------------------------------------------------
// The oracle.

constexpr double kU = 1.0 / (1 << 24);
constexpr double kSumUlps = 8;  // moe_test's allowance per fp32 sum, in u·Σ|terms|

// A projection's input row as the kernels see it (int8: quantized per token),
// with the magnitude of each element's terms.
struct InputRow {
  std::vector<double> v, mag;
  double scale = 0;        // int8: the row's scale
  int64_t lo = 0, hi = 0;  // int8: the elements that set the row's scale / zero point
  int64_t clipped = 0;     // int8_fixed: codes saturated at 0 / 255
};

// Whether an expert in format f with `rows` rows quantizes its inputs: int8
// always, int4 on the W4A8 route (the library's one rule, by the case's
// int4_route, this path and the rows as M).
bool quantized_input(const QCase& c, QFmt f, int64_t k, int64_t rows) {
  if (is_int8(f)) return true;
  if (f != QFmt::awq && f != QFmt::gptq_actorder && f != QFmt::gptq_sym_ch) return false;
  const WeightFormat wf = f == QFmt::awq ? WeightFormat::int4_awq : WeightFormat::int4_gptq;
  return ops::w4a8_route(wf, k, c.int4_route, cpu_info().isa, rows, "moe_quant_test");
}

InputRow input_row(bool quant, const uint16_t* x, int64_t k, const QCase& c, bool down) {
  InputRow in;
  in.v.resize(static_cast<size_t>(k));
  in.mag.resize(static_cast<size_t>(k));
  if (!quant) {
    for (int64_t i = 0; i < k; ++i) in.mag[i] = std::fabs(in.v[i] = bf16_to_f32(x[i]));
    return in;
  }
  std::vector<uint8_t> q(static_cast<size_t>(k));
  float s = 0;
  int32_t z = 0;
  const ActQuant mode = act_quant(c);
  if (mode == ActQuant::fixed) {
    // The contract's fixed rule: x·(1/s) with 1/s rounded to f32 (as gemm's).
    const auto [fs, fz] = fixed_quant(c, down);
    runtime::reference_act_quant_row(runtime::ActQuantRule::fixed, x, k, k, 1.0f / fs, fs, fz,
                                     q.data(), &s, &z);
    for (int64_t i = 0; i < k; ++i) {
      const double code = std::nearbyint(double(bf16_to_f32(x[i])) / fs) + fz;
      in.clipped += code < 0 || code > 255;
    }
  } else {
    runtime::reference_act_quant_row(
        mode == ActQuant::dynamic_asym ? runtime::ActQuantRule::asym : runtime::ActQuantRule::sym,
        x, k, k, 1.0f, 0.0f, 0, q.data(), &s, &z);
  }
  for (int64_t i = 0; i < k; ++i) {
    in.v[i] = double(int32_t(q[i]) - z) * double(s);
    in.mag[i] = (std::fabs(double(int32_t(q[i]) - z)) + 2.0 * std::abs(z)) * double(s);
    if (bf16_to_f32(x[i]) < bf16_to_f32(x[in.lo])) in.lo = i;
    if (bf16_to_f32(x[i]) > bf16_to_f32(x[in.hi])) in.hi = i;
    if (mode == ActQuant::dynamic_sym &&
        std::fabs(bf16_to_f32(x[i])) > std::fabs(bf16_to_f32(x[in.hi])))
      in.hi = i;
  }
  in.scale = s;
  return in;
}

struct Oracle {
  std::vector<double> out, abs_sum, act_term;  // [T, H]
  int64_t clipped13 = 0, clipped2 = 0;         // int8_fixed: saturated input codes
};

// Weight (n, k) as the route reads it: exact, or rounded once to bf16 by the
// dequant kernels.
double route_weight(const Matrix& m, int64_t at, bool exact) {
  return exact ? m.w[at] : double(bf16_to_f32(f32_to_bf16(static_cast<float>(m.w[at]))));
}

// Whether an expert's GEMMs over `rows` rows read exact weights on this path
// (quant: its inputs are quantized, int8 or W4A8).
bool exact_route(bool quant, int64_t rows) {
  const Isa isa = cpu_info().isa;
  return quant || isa == Isa::scalar || ops::quant_gemm_fused(isa, rows);
}

void add_expert(const QCase& c, QFmt f, const Matrix& w13, const Matrix& w2, int64_t rows,
                const uint16_t* x, const float* b13, const float* b2, double scale, int64_t t,
                Oracle& o) {
  const int64_t H = c.h, I = c.plain ? w13.n : w13.n / 2;
  // Both projections take the same route (their K differ, but W4A8's only
  // limit on K is far beyond these shapes).
  const bool quant = quantized_input(c, f, H, rows);
  const bool exact = exact_route(quant, rows);
  // The fused int4 kernel's terms are larger than |a·w| (see the top); W4A8's
  // group sums are exact int32.
  const bool fold =
      exact && !quant && (f == QFmt::gptq_actorder || f == QFmt::awq || f == QFmt::gptq_sym_ch);
  runtime::ReferenceGlu glu;
  glu.act = c.act;
  glu.clamped_swiglu = c.clamped;
  glu.gated = !c.plain;
  const InputRow xin = input_row(quant, x, H, c, false);
  std::vector<uint16_t> act(static_cast<size_t>(I));
  std::vector<double> slack(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    runtime::MoeActPoint p;
    if (c.plain) {  // act(up): the up sum in gate, an exact 1 in up (runtime/reference_moe.h)
      for (int64_t hh = 0; hh < H; ++hh) {
        const double w = route_weight(w13, i * H + hh, exact);
        p.gate += xin.v[hh] * w;
        p.gate_abs += xin.mag[hh] * (fold ? w13.mag[i * H + hh] : std::fabs(w));
      }
      if (b13 != nullptr) p.gate += b13[i], p.gate_abs += std::fabs(b13[i]);
      p.up = 1;
    }
    for (int64_t hh = 0; hh < H && !c.plain; ++hh) {
      const int64_t ag = i * H + hh, au = (I + i) * H + hh;
      const double wg = route_weight(w13, ag, exact), wu = route_weight(w13, au, exact);
      p.gate += xin.v[hh] * wg;
      p.up += xin.v[hh] * wu;
      p.gate_abs += xin.mag[hh] * (fold ? w13.mag[ag] : std::fabs(wg));
      p.up_abs += xin.mag[hh] * (fold ? w13.mag[au] : std::fabs(wu));
    }
    if (b13 != nullptr && !c.plain) {
      p.gate += b13[i], p.up += b13[I + i];
      p.gate_abs += std::fabs(b13[i]), p.up_abs += std::fabs(b13[I + i]);
    }
    p.act = runtime::reference_glu(glu, p.gate, p.up);
    act[i] = f32_to_bf16(static_cast<float>(p.act));
    p.act_bf16 = bf16_to_f32(act[i]);
    slack[i] = runtime::moe_act_slack(glu, p, kSumUlps * kU);
  }
  const InputRow ain = input_row(quant, act.data(), I, c, true);
  o.clipped13 += xin.clipped;
  o.clipped2 += ain.clipped;
  // int8: where the kernel's activation may differ, its requantized row may
  // too (one code step each; everything when the scale-setting element does,
  // which a fixed scale never is).
  const bool row_shift =
      quant && act_quant(c) != ActQuant::fixed && (slack[ain.lo] > 0 || slack[ain.hi] > 0);
  for (int64_t hh = 0; hh < H; ++hh) {
    double y = b2 ? b2[hh] : 0, mag = b2 ? std::fabs(b2[hh]) : 0, term = 0, wabs = 0;
    for (int64_t i = 0; i < I; ++i) {
      const int64_t at = hh * I + i;
      const double w = route_weight(w2, at, exact);
      y += ain.v[i] * w;
      mag += ain.mag[i] * (fold ? w2.mag[at] : std::fabs(w));
      wabs += std::fabs(w);
      if (slack[i] > 0) term += (quant ? ain.scale + slack[i] : slack[i]) * std::fabs(w);
    }
    if (row_shift) term = ain.scale * wabs + std::ldexp(mag, -7);
    o.out[t * H + hh] += scale * y;
    o.abs_sum[t * H + hh] += std::fabs(scale) * mag;
    o.act_term[t * H + hh] += std::fabs(scale) * term;
  }
}

// ---------------------------------------------------------------------------
// A case end to end.

::testing::AssertionResult check_case(const QCase& c) {
  const uint32_t seed =
      seed_of({c.t, c.h, c.i, c.e, c.k, static_cast<int64_t>(c.fmt), static_cast<int64_t>(c.act),
               c.clamped, c.b13, c.b2, c.shared_i, c.plain});
  const Experts x = make_experts(c.fmt, c.e, c.h, c.i, seed, c.interleaved, c.plain);
  std::optional<Experts> sh;
  if (c.shared_i)
    sh.emplace(make_experts(c.shared_fmt, 1, c.h, c.shared_i, seed + 1000, false, c.plain));
  const int64_t g13 = c.plain ? 1 : 2;  // w13 rows (and b13 entries) per intermediate unit
  const std::vector<uint16_t> hidden = random_bf16(static_cast<size_t>(c.t * c.h), seed + 1, -1, 1);
  const std::vector<float> weights = random_f32(static_cast<size_t>(c.t * c.k), seed + 2, 0.05f, 1);
  std::vector<float> b13, b2;
  if (c.b13) b13 = random_f32(static_cast<size_t>(c.e * g13 * c.i), seed + 3, -2, 2);
  if (c.b2) b2 = random_f32(static_cast<size_t>(c.e * c.h), seed + 4, -1, 1);
  std::vector<int32_t> ids(static_cast<size_t>(c.t * c.k));
  std::mt19937 rng(seed + 5);
  for (int64_t t = 0; t < c.t; ++t) {
    std::vector<int32_t> perm(static_cast<size_t>(c.e));
    std::iota(perm.begin(), perm.end(), 0);
    if (!c.hot) std::shuffle(perm.begin(), perm.end(), rng);
    for (int64_t j = 0; j < c.k; ++j) ids[t * c.k + j] = perm[j];
  }

  MoeOptions o;
  o.act = c.act;
  o.clamped_swiglu = c.clamped;
  o.routed_scaling_factor = 0.75f;
  o.act_quant = act_quant(c);
  o.int4_route = c.int4_route;
  if (uses_fixed(c)) {
    std::tie(o.act_scale13, o.act_zero_point13) = fixed_quant(c, false);
    std::tie(o.act_scale2, o.act_zero_point2) = fixed_quant(c, true);
  }
  // b13 comes in w13's row order: interleaved (gate i at 2i, up i at 2i + 1)
  // with GPT-OSS's rows, as its checkpoint ships it; the oracle keeps halves.
  std::vector<float> b13_given = b13;
  if (c.b13 && c.interleaved)
    for (int64_t e = 0; e < c.e; ++e)
      for (int64_t i = 0; i < c.i; ++i) {
        b13_given[size_t(e * 2 * c.i + 2 * i)] = b13[size_t(e * 2 * c.i + i)];
        b13_given[size_t(e * 2 * c.i + 2 * i + 1)] = b13[size_t(e * 2 * c.i + c.i + i)];
      }
  if (c.b13) o.b13 = TensorView(b13_given.data(), DType::f32, {c.e, g13 * c.i});
  if (c.b2) o.b2 = TensorView(b2.data(), DType::f32, {c.e, c.h});
  if (sh) {
    o.shared_w13 = &sh->p13;
    o.shared_w2 = &sh->p2;
  }
  const size_t esz = c.out == DType::f32 ? 4 : 2;
  std::vector<uint8_t> out(static_cast<size_t>(c.t * c.h) * esz, 0xEE);
  try {
    fused_experts(TensorView(const_cast<uint16_t*>(hidden.data()), DType::bf16, {c.t, c.h}), x.p13,
                  x.p2, TensorView(const_cast<float*>(weights.data()), DType::f32, {c.t, c.k}),
                  TensorView(ids.data(), DType::i32, {c.t, c.k}),
                  TensorView(out.data(), c.out, {c.t, c.h}), o);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << case_str(c) << ": fused_experts threw " << e.what();
  }

  Oracle ref;
  ref.out.assign(static_cast<size_t>(c.t * c.h), 0);
  ref.abs_sum = ref.out;
  ref.act_term = ref.out;
  std::vector<int64_t> rows(static_cast<size_t>(c.e), 0);
  for (int32_t e : ids) ++rows[e];
  for (int64_t t = 0; t < c.t; ++t) {
    const uint16_t* xr = hidden.data() + t * c.h;
    for (int64_t j = 0; j < c.k; ++j) {
      const int32_t e = ids[t * c.k + j];
      add_expert(c, c.fmt, x.w13[e], x.w2[e], rows[e], xr,
                 c.b13 ? b13.data() + e * g13 * c.i : nullptr, c.b2 ? b2.data() + e * c.h : nullptr,
                 0.75 * weights[t * c.k + j], t, ref);
    }
    if (sh)
      add_expert(c, c.shared_fmt, sh->w13[0], sh->w2[0], c.t, xr, nullptr, nullptr, 1.0, t, ref);
  }
  // The saturating cases must saturate both inputs (else they test nothing).
  if (c.saturate && (ref.clipped13 == 0 || ref.clipped2 == 0))
    return ::testing::AssertionFailure() << case_str(c) << ": clipped codes " << ref.clipped13
                                         << " (w13), " << ref.clipped2 << " (w2); want both > 0";
  int64_t bad = 0;
  double worst = 0;
  std::ostringstream msg;
  for (int64_t at = 0; at < c.t * c.h; ++at) {
    double got;
    if (esz == 4) {
      float v;
      std::memcpy(&v, &out[at * 4], 4);
      got = v;
    } else {
      uint16_t v;
      std::memcpy(&v, &out[at * 2], 2);
      got = bf16_to_f32(v);
    }
    const double want = ref.out[at];
    const double tol = runtime::moe_output_bound(c.out, ref.abs_sum[at], ref.act_term[at],
                                                 2 * kSumUlps * kU, want);
    const double err = std::fabs(got - want);
    worst = std::max(worst, err / tol);
    if (!(err <= tol)) {
      if (bad++ < 5)
        msg << "\n  out[" << at / c.h << ", " << at % c.h << "] = " << got << ", oracle " << want
            << ", tol " << tol;
    }
  }
  if (bad)
    return ::testing::AssertionFailure()
           << case_str(c) << " (path " << isa_name(cpu_info().isa) << "): " << bad << " of "
           << c.t * c.h << " outputs outside the bound" << msg.str();
  return ::testing::AssertionSuccess()
         << case_str(c) << ": worst err/tol " << worst << ", clipped codes " << ref.clipped13
         << " / " << ref.clipped2;
}

class QuantExperts : public IsaTestWithParam<QCase> {};

TEST_P(QuantExperts, MatchesOracle) {
  const auto r = check_case(GetParam());
  EXPECT_TRUE(r);
  if (r) RecordProperty("detail", r.message());
}

std::vector<QCase> battery() {
  std::vector<QCase> v;
  const QFmt fmts[] = {QFmt::int8_sym,      QFmt::int8_asym, QFmt::int8_fixed,
                       QFmt::fp8_channel,   QFmt::fp8_block, QFmt::mxfp4,
                       QFmt::gptq_actorder, QFmt::awq,       QFmt::gptq_sym_ch};
  for (QFmt f : fmts) {
    // T = 1 and 5: every expert's run is <= 4 rows (the fused decode kernel
    // in one call); 77: runs of up to 16 rows (the fused kernel's row groups
    // on avx512 / llvm, the dequant route on amx) and past them; 512: the
    // dequant / int8 kernels; hot and cold experts. H = 80, I = 48: a full and a partial column
    // block in both projections, K tails past every group of 32.
    for (int64_t t : {1, 5, 77, 512}) {
      QCase c;
      c.fmt = f;
      c.t = t;
      c.out = t == 5 ? DType::f32 : DType::bf16;
      c.hot = t == 77;
      v.push_back(c);
    }
    QCase b;  // biases, another activation, a shared expert in another format
    b.fmt = f;
    b.t = 9;
    b.act = Activation::gelu_tanh;
    b.b13 = b.b2 = true;
    b.shared_i = 40;
    b.shared_fmt = is_int8(f) ? QFmt::awq : QFmt::int8_sym;
    v.push_back(b);
    QCase s;  // GPT-OSS's clamped swiglu; a TP shard's I = 40 (not a group multiple)
    s.fmt = f;
    s.t = 3;
    s.i = 40;
    s.h = 72;
    s.clamped = true;
    s.b13 = true;
    s.e = 4;
    s.k = 4;
    s.out = DType::f32;
    v.push_back(s);
    QCase g = s;  // gelu_erf at prefill size
    g.t = 40;
    g.clamped = false;
    g.act = Activation::gelu_erf;
    v.push_back(g);
  }
  // Wide enough that decode tasks take runs of several column blocks in both
  // phases (ops/moe.cpp, kStreamingRows), with tails in each.
  for (QFmt f : {QFmt::awq, QFmt::fp8_block, QFmt::int8_sym})
    for (int64_t t : {1, 3}) {
      QCase c;
      c.fmt = f;
      c.t = t;
      c.h = 1056;
      c.i = 544;
      c.e = 4;
      c.k = 2;
      c.b2 = true;
      c.out = DType::f32;
      v.push_back(c);
    }
  // int4's routes forced: W4A8 at decode sizes (its kernels' row remainders,
  // T = 1 and 5 on every path) and prefill, per-token asymmetric too, and
  // W4A16 at prefill size (which automatic leaves to W4A8 on llvm).
  for (QFmt f : {QFmt::awq, QFmt::gptq_actorder, QFmt::gptq_sym_ch}) {
    for (int64_t t : {1, 5, 77}) {
      QCase c;
      c.fmt = f;
      c.t = t;
      c.int4_route = Int4Route::w4a8;
      c.asym = t == 5;
      c.b13 = c.b2 = t == 77;
      c.act = t == 77 ? Activation::gelu_tanh : Activation::silu;
      c.out = t == 1 ? DType::f32 : DType::bf16;
      v.push_back(c);
    }
    QCase c;
    c.fmt = f;
    c.t = 77;
    c.int4_route = Int4Route::w4a16;
    c.b13 = true;
    v.push_back(c);
  }
  // W4A8 with a narrow gate/up (2I = 34 rows): the GLU kernel still computes
  // whole 64-column blocks, so its row blocking is that of 4 zmm columns
  // (the plan once took 3 from N and asked the AVX-512 row for mr = 9: an
  // Error, found by the experts fuzzer); ~10 rows per expert.
  {
    QCase c;
    c.fmt = QFmt::awq;
    c.t = 40;
    c.i = 17;
    c.int4_route = Int4Route::w4a8;
    v.push_back(c);
  }
  // Static activation scales: saturating codes (decode and prefill), and the
  // fixed scales on an int8 shared expert, with int8 or fp8 routed experts.
  for (int64_t t : {5, 77}) {
    QCase c;
    c.fmt = QFmt::int8_fixed;
    c.t = t;
    c.saturate = true;
    c.b13 = true;
    v.push_back(c);
  }
  for (QFmt f : {QFmt::int8_fixed, QFmt::fp8_channel}) {
    QCase c;
    c.fmt = f;
    c.t = 9;
    c.shared_i = 40;
    c.shared_fmt = QFmt::int8_fixed;
    v.push_back(c);
  }
  // Non-gated experts (ExpertProj::up, Nemotron-H's relu2 MLPs) in every
  // format, decode (the fused kernel's plain epilogue) and prefill, I with a
  // 64-column tail, biases; a non-gated shared expert in another format.
  for (QFmt f : {QFmt::int8_sym, QFmt::int8_fixed, QFmt::fp8_channel, QFmt::fp8_block,
                 QFmt::gptq_actorder, QFmt::awq, QFmt::gptq_sym_ch, QFmt::mxfp4})
    for (int64_t t : {1, 5, 77}) {
      QCase c;
      c.fmt = f;
      c.t = t;
      c.i = t == 5 ? 100 : 48;
      c.plain = true;
      c.act = t == 77 ? Activation::gelu_tanh : Activation::relu2;
      c.b13 = c.b2 = t != 5;
      c.out = t == 1 ? DType::f32 : DType::bf16;
      v.push_back(c);
    }
  {
    QCase c;
    c.fmt = QFmt::fp8_block;
    c.t = 9;
    c.plain = true;
    c.act = Activation::relu2;
    c.shared_i = 40;
    c.shared_fmt = QFmt::awq;
    v.push_back(c);
  }
  // GPT-OSS: MXFP4 experts with interleaved gate_up rows and the clamped
  // swiglu, decode and prefill; the interleaving on other formats too.
  for (QFmt f : {QFmt::mxfp4, QFmt::int8_sym, QFmt::fp8_channel})
    for (int64_t t : {2, 77}) {
      QCase c;
      c.fmt = f;
      c.t = t;
      c.clamped = true;
      c.b13 = c.b2 = true;
      c.interleaved = true;
      c.out = DType::f32;
      v.push_back(c);
    }
  return v;
}

INSTANTIATE_TEST_SUITE_P(Battery, QuantExperts, ::testing::ValuesIn(battery()),
                         [](const auto& p) { return case_str(p.param); });

// ---------------------------------------------------------------------------
// The pack contract: unpack bit for bit, dequantize the logical weights,
// packing packed experts a no-op, the layout tag.

template <class W>
void expect_same_bytes(const TensorView& a, const std::vector<W>& b, const char* what, int64_t e) {
  const auto* p = static_cast<const W*>(a.data);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), p)) << what << " of expert " << e;
}

TEST(QuantExpertsPack, UnpackDequantizeRepack) {
  for (QFmt f : {QFmt::int8_sym, QFmt::fp8_block, QFmt::mxfp4, QFmt::gptq_actorder, QFmt::awq}) {
    SCOPED_TRACE(qfmt_name(f));
    const int64_t E = 3, H = 72, I = 40;
    const Experts x = make_experts(f, E, H, I, 77);
    EXPECT_EQ(x.p13.num_experts(), E);
    EXPECT_EQ(x.p13.n(), I);
    EXPECT_EQ(x.p13.k(), H);
    EXPECT_EQ(x.p2.n(), H);
    EXPECT_EQ(x.p2.k(), I);
    EXPECT_GT(x.p13.packed_bytes(), 0u);
    EXPECT_NE(x.p13.layout().find("_glu32"), std::string::npos) << x.p13.layout();
    EXPECT_EQ(x.p2.layout().find("_glu32"), std::string::npos) << x.p2.layout();
    EXPECT_EQ(x.p13.format(), x.p2.format());
    // dequantize: the exact weights rounded once to f32.
    for (int proj = 0; proj < 2; ++proj) {
      const PackedExperts& p = proj == 0 ? x.p13 : x.p2;
      const std::vector<Matrix>& ms = proj == 0 ? x.w13 : x.w2;
      const int64_t rows = ms[0].n, cols = ms[0].k;
      std::vector<float> d(static_cast<size_t>(E * rows * cols));
      p.dequantize(TensorView(d.data(), DType::f32, {E, rows, cols}));
      int64_t wrong = 0;
      for (int64_t e = 0; e < E; ++e)
        for (int64_t r = 0; r < rows * cols; ++r)
          wrong += d[e * rows * cols + r] != static_cast<float>(ms[e].w[r]);
      EXPECT_EQ(wrong, 0) << "dequantized weights differing from the checkpoint's, proj " << proj;
      // Repacking is the same object; the wrong proj is an Error.
      const PackedExperts again = pack_experts(p, p.proj());
      EXPECT_EQ(again.impl(), p.impl());
      EXPECT_THROW(pack_experts(p, proj == 0 ? ExpertProj::down : ExpertProj::gate_up), Error);
    }
    // unpack: every checkpoint tensor back, bit for bit.
    for (int proj = 0; proj < 2; ++proj) {
      const PackedExperts& p = proj == 0 ? x.p13 : x.p2;
      std::vector<Matrix> back;
      for (int64_t e = 0; e < E; ++e)
        back.push_back(make_matrix(f, proj == 0 ? 2 * I : H, proj == 0 ? H : I, 1.0, 5000 + e));
      const std::vector<Matrix>& orig = proj == 0 ? x.w13 : x.w2;
      // Unpacks into back's descriptions (field W of each) and checks each
      // expert's tensors against the checkpoint's.
      auto unpack_into = [&](auto Matrix::*field, auto check) {
        std::vector<std::remove_reference_t<decltype(back[0].*field)>> v;
        for (Matrix& m : back) v.push_back(m.*field);
        p.unpack(v);
        for (int64_t e = 0; e < E; ++e) check(v[e], orig[e], e);
      };
      if (is_int8(f)) {
        unpack_into(&Matrix::int8, [](const Int8Weight& v, const Matrix& m, int64_t e) {
          expect_same_bytes(v.weight, m.i8, "weight", e);
          expect_same_bytes(v.scales, m.scales, "scales", e);
        });
      } else if (f == QFmt::mxfp4) {
        unpack_into(&Matrix::mxfp4, [](const Mxfp4Weight& v, const Matrix& m, int64_t e) {
          expect_same_bytes(v.blocks, m.f8, "blocks", e);
          expect_same_bytes(v.scales, m.e8m0, "scales", e);
        });
      } else if (f == QFmt::fp8_block) {
        unpack_into(&Matrix::fp8, [](const Fp8Weight& v, const Matrix& m, int64_t e) {
          expect_same_bytes(v.weight, m.f8, "weight", e);
          expect_same_bytes(v.scales, m.scales, "scales", e);
        });
      } else {
        unpack_into(&Matrix::int4, [](const Int4Weight& v, const Matrix& m, int64_t e) {
          expect_same_bytes(v.qweight, m.qweight, "qweight", e);
          expect_same_bytes(v.scales, m.scales, "scales", e);
          if (!m.qzeros.empty()) expect_same_bytes(*v.qzeros, m.qzeros, "qzeros", e);
          if (!m.g_idx.empty()) expect_same_bytes(*v.g_idx, m.g_idx, "g_idx", e);
        });
      }
    }
    // The bf16 unpack refuses quantized experts.
    std::vector<uint16_t> bf(static_cast<size_t>(E * 2 * I * H));
    EXPECT_THROW(x.p13.unpack(TensorView(bf.data(), DType::bf16, {E, 2 * I, H})), Error);
  }
}

// GPT-OSS's interleaved gate_up rows, bf16 experts: the same logical weights
// packed from either row order give the same bytes to the kernels, so the
// outputs agree bit for bit; unpack and dequantize keep the given order.
TEST(QuantExpertsPack, Bf16InterleavedRowsMatchHalves) {
  const int64_t E = 3, H = 72, I = 40, T = 6, K = 2;
  const std::vector<uint16_t> halves = random_bf16(static_cast<size_t>(E * 2 * I * H), 3, -1, 1);
  std::vector<uint16_t> inter(halves.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * I; ++r) {
      const int64_t src = r % 2 == 0 ? r / 2 : I + r / 2;
      std::copy_n(halves.begin() + (e * 2 * I + src) * H, H, inter.begin() + (e * 2 * I + r) * H);
    }
  const std::vector<uint16_t> w2 = random_bf16(static_cast<size_t>(E * H * I), 4, -1, 1);
  const PackedExperts ph =
      pack_experts(TensorView(const_cast<uint16_t*>(halves.data()), DType::bf16, {E, 2 * I, H}),
                   ExpertProj::gate_up);
  const PackedExperts pi = pack_experts(TensorView(inter.data(), DType::bf16, {E, 2 * I, H}),
                                        ExpertProj::gate_up, GluRows::interleaved);
  const PackedExperts p2 = pack_experts(
      TensorView(const_cast<uint16_t*>(w2.data()), DType::bf16, {E, H, I}), ExpertProj::down);
  std::vector<uint16_t> hidden = random_bf16(static_cast<size_t>(T * H), 5, -1, 1);
  std::vector<float> w(static_cast<size_t>(T * K), 0.5f), oh(static_cast<size_t>(T * H)),
      oi(oh.size());
  std::vector<int32_t> ids(static_cast<size_t>(T * K));
  for (size_t j = 0; j < ids.size(); ++j) ids[j] = static_cast<int32_t>(j % E);
  for (auto [p13, out] : {std::pair{&ph, &oh}, std::pair{&pi, &oi}})
    fused_experts(TensorView(hidden.data(), DType::bf16, {T, H}), *p13, p2,
                  TensorView(w.data(), DType::f32, {T, K}),
                  TensorView(ids.data(), DType::i32, {T, K}),
                  TensorView(out->data(), DType::f32, {T, H}));
  EXPECT_EQ(0, std::memcmp(oh.data(), oi.data(), oh.size() * 4));
  std::vector<uint16_t> back(inter.size());
  pi.unpack(TensorView(back.data(), DType::bf16, {E, 2 * I, H}));
  EXPECT_EQ(back, inter);
  std::vector<float> deq(inter.size());
  pi.dequantize(TensorView(deq.data(), DType::f32, {E, 2 * I, H}));
  int64_t wrong = 0;
  for (size_t j = 0; j < deq.size(); ++j) wrong += deq[j] != bf16_to_f32(inter[j]);
  EXPECT_EQ(wrong, 0);
}

// A NaN token poisons its own output row only, on every route: every other
// row is bit for bit what it is without it (per-token activation
// quantization, per-row accumulators), the NaN row is NaN.
TEST(QuantExpertsNan, TokenOfNanStaysInItsRow) {
  const int64_t E = 4, H = 72, I = 40, K = 2;
  // (AWQ with W4A8 forced: its quantized rows at T = 3 too, where the
  // automatic route keeps W4A16.)
  for (auto [f, route] : {std::pair{QFmt::int8_asym, Int4Route::automatic},
                          {QFmt::fp8_block, Int4Route::automatic},
                          {QFmt::mxfp4, Int4Route::automatic},
                          {QFmt::gptq_actorder, Int4Route::automatic},
                          {QFmt::awq, Int4Route::w4a8}})
    for (int64_t T : {3, 40}) {
      SCOPED_TRACE(std::string(qfmt_name(f)) + " T=" + std::to_string(T) +
                   (route == Int4Route::w4a8 ? " w4a8" : ""));
      const Experts x = make_experts(f, E, H, I, 21);
      std::vector<uint16_t> hidden = random_bf16(static_cast<size_t>(T * H), 22, -1, 1);
      std::vector<float> w(static_cast<size_t>(T * K), 0.5f);
      std::vector<int32_t> ids(static_cast<size_t>(T * K));
      for (size_t j = 0; j < ids.size(); ++j) ids[j] = static_cast<int32_t>(j % E);
      MoeOptions o;
      o.act_quant = ActQuant::dynamic_asym;
      o.int4_route = route;
      auto run = [&](std::vector<float>& out) {
        out.assign(static_cast<size_t>(T * H), 0);
        fused_experts(TensorView(hidden.data(), DType::bf16, {T, H}), x.p13, x.p2,
                      TensorView(w.data(), DType::f32, {T, K}),
                      TensorView(ids.data(), DType::i32, {T, K}),
                      TensorView(out.data(), DType::f32, {T, H}), o);
      };
      std::vector<float> clean, poisoned;
      run(clean);
      const int64_t bad = 1;
      std::fill_n(hidden.begin() + bad * H, H, uint16_t{0x7FC0});
      run(poisoned);
      int64_t differ = 0, not_nan = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t h = 0; h < H; ++h) {
          const float a = clean[t * H + h], b = poisoned[t * H + h];
          if (t == bad)
            not_nan += !std::isnan(b);
          else
            differ += std::memcmp(&a, &b, 4) != 0;
        }
      EXPECT_EQ(differ, 0) << "outputs of other tokens changed";
      EXPECT_EQ(not_nan, 0) << "outputs of the NaN token that are not NaN";
    }
}

// An ±Inf in hidden keeps int4 experts on W4A16 under int4_route automatic:
// W4A8 would quantize the token's row to a NaN scale (every output NaN),
// W4A16 gives the IEEE ±Inf / NaN, so the route (path, rows per expert) must
// not change the result. With I = 1 the token's outputs are act·w2[h]: ±Inf
// where act is ±Inf, so the W4A16 row is not all NaN. T = 40 tokens on 2
// experts: 20 rows each, W4A8 by the automatic rule on llvm and avx512.
TEST(QuantExpertsNan, InfTokenTakesW4a16UnderAutomatic) {
  const int64_t E = 2, H = 64, I = 1, K = 1, T = 40;
  for (QFmt f : {QFmt::awq, QFmt::gptq_actorder}) {
    SCOPED_TRACE(qfmt_name(f));
    const Experts x = make_experts(f, E, H, I, 31);
    std::vector<uint16_t> hidden = random_bf16(static_cast<size_t>(T * H), 32, -1, 1);
    for (int64_t t = 0; t < T; t += 3) hidden[t * H + t % H] = t % 2 ? 0xff80 : 0x7f80;
    std::vector<float> w(static_cast<size_t>(T * K), 1.0f);
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>(t % E);
    auto run = [&](Int4Route route) {
      MoeOptions o;
      o.int4_route = route;
      std::vector<float> out(static_cast<size_t>(T * H), 0);
      fused_experts(TensorView(hidden.data(), DType::bf16, {T, H}), x.p13, x.p2,
                    TensorView(w.data(), DType::f32, {T, K}),
                    TensorView(ids.data(), DType::i32, {T, K}),
                    TensorView(out.data(), DType::f32, {T, H}), o);
      return out;
    };
    const std::vector<float> automatic = run(Int4Route::automatic);
    const std::vector<float> w4a16 = run(Int4Route::w4a16);
    int64_t differ = 0, infinite = 0;
    for (size_t j = 0; j < w4a16.size(); ++j) {
      const float a = automatic[j], b = w4a16[j];
      differ += std::isnan(a) != std::isnan(b) || (!std::isnan(b) && a != b);
      infinite += std::isinf(b);
    }
    EXPECT_EQ(differ, 0) << "automatic and w4a16 differ";
    EXPECT_GT(infinite, 0) << "no ±Inf output: the case does not tell the routes apart";
  }
}

// ---------------------------------------------------------------------------
// Bad input: each an Error naming what is wrong.

TEST(QuantExpertsErrors, PackAndCall) {
  const int64_t H = 72, I = 40, T = 2;
  const Experts a = make_experts(QFmt::awq, 2, H, I, 9);
  const Experts f8 = make_experts(QFmt::fp8_channel, 2, H, I, 10);
  const Experts i8 = make_experts(QFmt::int8_sym, 2, H, I, 11);
  std::vector<uint16_t> hidden(static_cast<size_t>(T * H), 0x3f80);
  std::vector<float> w(static_cast<size_t>(T), 1.0f), out(static_cast<size_t>(T * H));
  std::vector<int32_t> ids(static_cast<size_t>(T), 1);
  auto call = [&](const PackedExperts& p13, const PackedExperts& p2, const MoeOptions& o) {
    fused_experts(TensorView(hidden.data(), DType::bf16, {T, H}), p13, p2,
                  TensorView(w.data(), DType::f32, {T, 1}),
                  TensorView(ids.data(), DType::i32, {T, 1}),
                  TensorView(out.data(), DType::f32, {T, H}), o);
  };
  // w13 and w2 in different formats.
  expect_tilejit_error([&] { call(a.p13, f8.p2, {}); }, "both in one format");
  // Experts packed for a different number of experts in w2.
  const Experts a3 = make_experts(QFmt::awq, 3, H, I, 12);
  expect_tilejit_error([&] { call(a.p13, a3.p2, {}); }, "w2 has 3 experts");
  // Static activation scales: each field named with its value and the
  // allowed range; fixed with experts that quantize no activation.
  MoeOptions fixed;
  fixed.act_quant = ActQuant::fixed;
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); }, "act_scale13=0; allowed: finite > 0");
  fixed.act_scale13 = 0.01f;
  fixed.act_scale2 = -1;
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); }, "act_scale2=-1; allowed: finite > 0");
  fixed.act_scale2 = std::numeric_limits<float>::quiet_NaN();
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); }, "act_scale2=nan; allowed: finite > 0");
  fixed.act_scale2 = std::numeric_limits<float>::infinity();
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); }, "act_scale2=inf; allowed: finite > 0");
  fixed.act_scale2 = 0.01f;
  fixed.act_zero_point13 = 256;
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); },
                       "act_zero_point13=256; allowed: [0, 255]");
  fixed.act_zero_point13 = 128;
  fixed.act_zero_point2 = -1;
  expect_tilejit_error([&] { call(i8.p13, i8.p2, fixed); },
                       "act_zero_point2=-1; allowed: [0, 255]");
  fixed.act_zero_point2 = 128;
  EXPECT_NO_THROW(call(i8.p13, i8.p2, fixed));
  expect_tilejit_error([&] { call(f8.p13, f8.p2, fixed); }, "fixed only with int8");
  // Scales for the wrong number of channels, in expert 1: the expert is named.
  std::vector<Fp8Weight> bad;
  for (const Matrix& m : f8.w13) bad.push_back(m.fp8);
  bad[1].scales = TensorView(const_cast<float*>(f8.w13[1].scales.data()), DType::f32, {7});
  expect_tilejit_error([&] { pack_experts(bad, ExpertProj::gate_up); }, "expert 1");
  // Experts of different shapes.
  std::vector<Int4Weight> mixed{a.w2[0].int4, a.w13[1].int4};
  expect_tilejit_error([&] { pack_experts(mixed, ExpertProj::down); }, "expert 1");
  // An odd row count for gate_up, and no experts at all.
  std::vector<Int8Weight> odd{make_matrix(QFmt::int8_sym, 7, H, 1.0, 3).int8};
  expect_tilejit_error([&] { pack_experts(odd, ExpertProj::gate_up); }, "2I");
  expect_tilejit_error([&] { pack_experts(std::vector<Int8Weight>{}, ExpertProj::down); }, "empty");
  // A value outside the enums, on every format (a bad cast from a binding).
  MoeOptions route;
  route.int4_route = static_cast<Int4Route>(7);
  expect_tilejit_error([&] { call(a.p13, a.p2, route); },
                       "int4_route=7 is not an Int4Route; allowed: automatic, w4a16, w4a8");
  expect_tilejit_error([&] { call(f8.p13, f8.p2, route); }, "int4_route=7");
  MoeOptions aq;
  aq.act_quant = static_cast<ActQuant>(9);
  expect_tilejit_error([&] { call(a.p13, a.p2, aq); }, "act_quant=9 is not an ActQuant");
  // A quantized shared expert whose two halves disagree.
  MoeOptions so;
  so.shared_w13 = &a.p13;
  so.shared_w2 = &f8.p2;
  expect_tilejit_error([&] { call(a.p13, a.p2, so); }, "shared_w13");
}

// fuzz/crashes/experts-int4-pad-huge-scale: an int4 gate row whose codes all
// equal the zero point (weights 0) under a finite scale of 3e38, H = 1 (31
// padding positions in the k32 block). The dequant route (8 rows to one
// expert) decoded the padding codes 0 as (0 − 8)·3e38 = −Inf, which the zero
// activations there made NaN: the output must be the exact 0 of the scalar path.
TEST(QuantExpertsErrors, Int4PaddingUnderHugeScaleStaysZero) {
  const int64_t T = 8, H = 1, I = 1;
  std::vector<int32_t> q13{8, 9}, q2{9};  // gptq [K/8, N]: gate q = z = 8, up and down q = 9
  std::vector<float> s13{3e38f, 1.0f}, s2{1.0f};
  auto int4 = [](std::vector<int32_t>& q, std::vector<float>& s, int64_t n) {
    Int4Weight w;
    w.qweight = TensorView(q.data(), DType::i32, {1, n});
    w.scales = TensorView(s.data(), DType::f32, {1, n});
    w.group_size = 32;
    w.n = n, w.k = 1;
    return w;
  };
  const PackedExperts p13 =
      pack_experts(std::vector<Int4Weight>{int4(q13, s13, 2 * I)}, ExpertProj::gate_up);
  const PackedExperts p2 = pack_experts(std::vector<Int4Weight>{int4(q2, s2, H)}, ExpertProj::down);
  std::vector<uint16_t> hidden(static_cast<size_t>(T * H), f32_to_bf16(0.5f));
  std::vector<float> w(static_cast<size_t>(T), 1.0f), out(static_cast<size_t>(T * H), -1.0f);
  std::vector<int32_t> ids(static_cast<size_t>(T), 0);
  fused_experts(TensorView(hidden.data(), DType::bf16, {T, H}), p13, p2,
                TensorView(w.data(), DType::f32, {T, 1}),
                TensorView(ids.data(), DType::i32, {T, 1}),
                TensorView(out.data(), DType::f32, {T, H}));
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(out[t], 0.0f) << "token " << t;
}

// A value outside ExpertProj / GluRows (a cast from an engine's int) is an
// Error naming the argument, the value and the allowed ones, for the bf16 and
// the quantized overloads alike.
TEST(QuantExpertsPack, BadProjOrRowsNamed) {
  std::vector<uint16_t> w(size_t(2 * 64 * 32), 0x3f80);
  const TensorView bf(w.data(), DType::bf16, {2, 64, 32});
  std::vector<int8_t> codes(size_t(64 * 32), 1);
  std::vector<float> scales(64, 1.0f);
  const std::vector<Int8Weight> q = {Int8Weight{TensorView(codes.data(), DType::i8, {64, 32}),
                                                TensorView(scales.data(), DType::f32, {64})}};
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no Error");
  };
  const auto bad_proj = static_cast<ExpertProj>(7);
  const auto bad_rows = static_cast<GluRows>(9);
  EXPECT_EQ(message([&] { pack_experts(bf, bad_proj); }),
            "pack_experts: proj=7 is not an ExpertProj; allowed: gate_up, down, up");
  EXPECT_EQ(message([&] { pack_experts(bf, ExpertProj::gate_up, bad_rows); }),
            "pack_experts: glu_rows=9 is not a GluRows; allowed: halves, interleaved");
  EXPECT_THAT(message([&] { pack_experts(q, bad_proj); }),
              ::testing::HasSubstr("proj=7 is not an ExpertProj; allowed: gate_up, down, up"));
  EXPECT_THAT(message([&] { pack_experts(q, ExpertProj::gate_up, bad_rows); }),
              ::testing::HasSubstr("glu_rows=9 is not a GluRows; allowed: halves, interleaved"));
}

}  // namespace
}  // namespace tilejit::test
