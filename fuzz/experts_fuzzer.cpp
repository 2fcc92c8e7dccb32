// libFuzzer harness: the MoE entry points on quantized experts. pack_experts
// of every checkpoint format (std::vector<Int8Weight | Fp8Weight | Int4Weight
// | Mxfp4Weight>, both ExpertProj, both GluRows) and fused_experts on them
// (MoeOptions: act, clamped_swiglu, b13 / b2, routed_scaling_factor, a shared
// expert in another format, act_quant), driven by a fuzzed description: E,
// H, I (tails past every 32 / 64 block), T, top-k and ids (also out of
// range), the format's parameters (group sizes, zero points, act-order g_idx
// incl. out-of-range and over-full ones, GPTQ v1 / v2, scale dtypes, fp8 block
// sizes and [K, N] strides, MXFP4 K not a multiple of 32, e8m0 NaN), NaN / Inf
// / subnormal scales, one expert whose parameters or shape differ. The bulk
// bytes (codes, zero points) come from a generator seeded by the input, so
// an input stays short and a run does thousands of executions.
//
// The contract under test: pack_experts raises tilejit::Error or returns
// experts whose n() / k() / num_experts() are the checkpoint's, whose
// dequantize() is the harness's own decoding of each expert's checkpoint
// (rounded once to f32; gate_up rows in the order given) and whose unpack()
// gives every tensor back bit for bit; fused_experts on them raises an Error
// (it must for ids out of [0, E)) or, when the call is well-formed, must not,
// and its output is within the bound of tests/moe_quant_test.cpp of the
// oracle below on the active path. An Error for a well-formed call, or after
// a pack that succeeded, is a finding.
//
// The oracle is tests/moe_quant_test.cpp's (add_expert there: the route each
// expert's GEMMs take, ops::quant_gemm_fused and ops::w4a8_route; int8 and
// W4A8 inputs quantized per token
// by runtime::reference_act_quant_row; the fused int4 kernel's larger terms;
// the activation's bf16 slack), on the exact double weights decoded here;
// its bound functions are runtime/reference_error_bounds.h's.
#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_quant.h"
#include "tilejit/tilejit.h"

namespace {

using namespace tilejit;

[[noreturn]] void die(const std::string& what) {
  fuzz::die("experts_fuzzer", what);
}

using fuzz::describe;
using fuzz::same_value;

// The bulk bytes: xorshift64 seeded by the input.
struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9e3779b97f4a7c15ull | 1) {}
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  double unit() { return static_cast<double>(next() >> 11) * 0x1p-53; }
};

enum class Fmt { int8, fp8, int4, mxfp4 };
const char* fmt_name(Fmt f) {
  switch (f) {
    case Fmt::int8:
      return "int8";
    case Fmt::fp8:
      return "fp8";
    case Fmt::int4:
      return "int4";
    case Fmt::mxfp4:
      return "mxfp4";
  }
  return "?";
}

// One projection's checkpoint parameters (every expert's, unless one is
// mutated on purpose).
struct Params {
  Fmt fmt = Fmt::int8;
  bool per_tensor = false;                     // int8
  int fp8_kind = 1;                            // fp8: 0 tensor, 1 channel, 2 block
  int64_t bn = 0, bk = 0;                      // fp8 block sizes
  bool kn = false;                             // fp8 stored [K, N]
  bool awq = false, zp = false, gidx = false;  // int4
  bool v2 = false;                             // int4 GPTQ v2 zeros
  int64_t gs = 32;                             // int4 group size
  int64_t groups = 1;                          // int4 with g_idx: G
  int gidx_mode = 0;                           // 0 act-order, 1 one group, 2 garbage
  int sdt = 2;                                 // int4 scales: 0 f16, 1 bf16, 2 f32
  int bits = 4;                                // int4
  bool three_d = true, k_given = true;         // mxfp4
  int scale_width_extra = 0;                   // a wrong scales width
  bool nan_codes = false;                      // fp8 NaN codes / e8m0 255 left in
};

Params fuzz_params(FuzzedDataProvider& f, Fmt fmt) {
  Params p;
  p.fmt = fmt;
  p.per_tensor = f.ConsumeIntegralInRange(0, 3) == 0;
  p.fp8_kind = f.ConsumeIntegralInRange(0, 2);
  static constexpr int64_t kBlocks[] = {32, 64, 128, 16, 2, 1, 7, 0, -1, 48};
  p.bn = f.PickValueInArray(kBlocks);
  p.bk = f.PickValueInArray(kBlocks);
  p.kn = f.ConsumeIntegralInRange(0, 3) == 0;
  p.awq = f.ConsumeBool();
  p.zp = f.ConsumeBool();
  p.gidx = !p.awq && f.ConsumeIntegralInRange(0, 2) == 0;
  p.v2 = !p.awq && f.ConsumeIntegralInRange(0, 3) == 0;
  if (f.ConsumeIntegralInRange(0, 31) == 0) p.v2 = true;  // with awq: an Error
  static constexpr int64_t kGroups[] = {32, 64, 128, -1, 32, 16, 7, 0, -3};
  p.gs = f.PickValueInArray(kGroups);
  p.groups = f.ConsumeIntegralInRange<int64_t>(1, 6);
  p.gidx_mode = f.ConsumeIntegralInRange(0, 7) == 0 ? f.ConsumeIntegralInRange(1, 2) : 0;
  p.sdt = f.ConsumeIntegralInRange(0, 2);
  p.bits = f.ConsumeIntegralInRange(0, 31) == 0 ? 3 : 4;
  p.three_d = f.ConsumeBool();
  p.k_given = f.ConsumeIntegralInRange(0, 3) != 0;
  p.scale_width_extra = f.ConsumeIntegralInRange(0, 31) == 0 ? 1 : 0;
  p.nan_codes = f.ConsumeIntegralInRange(0, 15) == 0;
  return p;
}

// One expert's checkpoint of a logical matrix [N, K] and its exact weights.
struct Mat {
  int64_t n = 0, k = 0;
  Params p;
  std::vector<int8_t> i8;
  std::vector<uint8_t> u8, e8m0;
  std::vector<int32_t> qw, qz, g;
  std::vector<float> sf;
  std::vector<uint16_t> s16;
  std::vector<double> w;    // [N, K] exact; empty when the checkpoint has no defined value
  std::vector<double> mag;  // [N, K] the magnitude of each weight's terms in the fused sums
  Int8Weight int8;
  Fp8Weight fp8;
  Int4Weight int4;
  Mxfp4Weight mx;
};

// A scale near `a` (exact in bf16 and f16), or a hostile one (1 in 32).
double pick_scale(Rng& r, bool hostile_ok, double a) {
  if (hostile_ok && r.next() % 32 == 0) {
    static constexpr double kHostile[] = {NAN, INFINITY, 1e-40, 0.0, -0.5, 3e38};
    return kHostile[r.next() % 6];
  }
  const int e = static_cast<int>(std::floor(std::log2(a))) - static_cast<int>(r.next() % 2);
  return std::ldexp(1.0 + double(r.next() % 16) / 16.0, e);
}

// f16 bits of a pick_scale value (normal, or one of the hostile ones).
uint16_t to_f16(double v) {
  if (std::isnan(v)) return 0x7E00;
  if (std::isinf(v) || std::fabs(v) > 65504) return v < 0 ? 0xFC00 : 0x7C00;
  if (v == 0) return 0;
  int e;
  const double m = std::frexp(std::fabs(v), &e);  // v = m·2^e, m in [0.5, 1)
  const int ex = e - 1 + 15;
  if (ex <= 0) return 0x0001;  // a subnormal stands for a tiny one
  const auto mant = static_cast<uint16_t>(std::lround((m * 2 - 1) * 1024));
  return static_cast<uint16_t>((v < 0 ? 0x8000 : 0) | (ex << 10) | mant);
}

void make_int8(Mat& m, Rng& r, double a) {
  const int64_t N = m.n, K = m.k;
  m.i8.resize(static_cast<size_t>(N * K));
  for (auto& q : m.i8) q = static_cast<int8_t>(static_cast<int>(r.next() % 255) - 127);
  m.sf.resize(static_cast<size_t>(m.p.per_tensor ? 1 : N) + m.p.scale_width_extra);
  for (auto& s : m.sf) s = static_cast<float>(pick_scale(r, true, a / 127));
  m.w.resize(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      m.w[n * K + k] = double(m.i8[n * K + k]) * m.sf[std::min<size_t>(size_t(n), m.sf.size() - 1)];
  m.mag = m.w;
  for (auto& v : m.mag) v = std::fabs(v);
  m.int8.weight = TensorView(m.i8.data(), DType::i8, {N, K});
  m.int8.scales = TensorView(m.sf.data(), DType::f32, {int64_t(m.sf.size())});
}

void make_fp8(Mat& m, Rng& r, double a) {
  const int64_t N = m.n, K = m.k;
  const Params& p = m.p;
  m.u8.resize(static_cast<size_t>(N * K));
  for (auto& c : m.u8) {
    c = static_cast<uint8_t>(r.next());
    if (!p.nan_codes && (c & 0x7F) == 0x7F) c ^= 1;
  }
  int64_t gn = 1, gk = 1;
  if (p.fp8_kind == 1) gn = N;
  if (p.fp8_kind == 2) {
    gn = p.bn > 0 ? (N + p.bn - 1) / p.bn : 1;
    gk = p.bk > 0 ? (K + p.bk - 1) / p.bk + p.scale_width_extra : 1;
  }
  m.sf.resize(static_cast<size_t>(gn * gk));
  for (auto& s : m.sf) s = static_cast<float>(pick_scale(r, true, a / 448));
  m.fp8.weight = p.kn ? TensorView(m.u8.data(), DType::f8e4m3, {N, K}, {1, N})
                      : TensorView(m.u8.data(), DType::f8e4m3, {N, K});
  m.fp8.scales = p.fp8_kind == 2 ? TensorView(m.sf.data(), DType::f32, {gn, gk})
                                 : TensorView(m.sf.data(), DType::f32, {gn});
  if (p.fp8_kind == 2) m.fp8.block_n = p.bn, m.fp8.block_k = p.bk;
  // Block sizes 0 x 0 with a [1, 1] scale table: pack_weight takes that as
  // the per-tensor scale.
  const bool blocks = p.fp8_kind == 2 && !(p.bn == 0 && p.bk == 0 && m.sf.size() == 1);
  if (blocks && !(p.bn > 0 && p.bk > 0)) return;  // no defined weights: pack must refuse
  m.w.resize(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const uint8_t c = p.kn ? m.u8[k * N + n] : m.u8[n * K + k];
      const float s = blocks ? m.sf[(n / p.bn) * gk + k / p.bk] : m.sf[p.fp8_kind == 1 ? n : 0];
      m.w[n * K + k] = double(runtime::e4m3_to_f32(c)) * s;
    }
  m.mag = m.w;
  for (auto& v : m.mag) v = std::fabs(v);
}

void make_int4(Mat& m, Rng& r, double a) {
  const int64_t N = m.n, K = m.k, n8 = (N + 7) / 8, k8 = (K + 7) / 8;
  const Params& p = m.p;
  int64_t G = p.gs > 0 ? (K + p.gs - 1) / p.gs : 1;
  if (p.gidx) {
    G = p.gs > 0 && p.gidx_mode == 0 ? G : p.groups;
    m.g.resize(static_cast<size_t>(K));
    if (p.gidx_mode == 0 && p.gs > 0) {  // act-order: channel perm[j] in group j / gs
      std::vector<int32_t> perm(static_cast<size_t>(K));
      std::iota(perm.begin(), perm.end(), 0);
      for (int64_t j = K - 1; j > 0; --j) std::swap(perm[j], perm[r.next() % (j + 1)]);
      for (int64_t j = 0; j < K; ++j) m.g[perm[j]] = static_cast<int32_t>(j / p.gs);
    } else if (p.gidx_mode == 1) {
      std::fill(m.g.begin(), m.g.end(), 0);  // one over-full group
    } else {
      for (auto& v : m.g) v = static_cast<int32_t>(int64_t(r.next() % (G + 2)) - 1);  // garbage
    }
  }
  m.qw.resize(static_cast<size_t>(p.awq ? K * n8 : k8 * N));
  for (auto& v : m.qw) v = static_cast<int32_t>(r.next());
  m.qz.resize(static_cast<size_t>(G * n8));
  for (auto& v : m.qz) v = static_cast<int32_t>(r.next());
  // Nibbles past N (packed along N) or K (along K) come back as 0: clear them.
  auto clear = [](std::vector<int32_t>& t, int64_t rows, int64_t words, int64_t valid, bool awq) {
    for (int64_t row = 0; row < rows; ++row)
      for (int64_t j = valid; j < words * 8; ++j)
        t[row * words + j / 8] &=
            ~static_cast<int32_t>(0xFu << (4 * (awq ? runtime::kAwqNibble[j % 8] : j % 8)));
  };
  if (p.awq)
    clear(m.qw, K, n8, N, true);
  else
    for (int64_t k = K; k < k8 * 8; ++k)
      for (int64_t n = 0; n < N; ++n)
        m.qw[(k / 8) * N + n] &= ~static_cast<int32_t>(0xFu << (4 * (k % 8)));
  clear(m.qz, G, n8, N, p.awq);
  const int64_t gw = G + p.scale_width_extra;
  std::vector<double> sv(static_cast<size_t>(gw * N));
  m.sf.resize(sv.size());
  m.s16.resize(sv.size());
  for (size_t i = 0; i < sv.size(); ++i) {
    const double s = pick_scale(r, true, a / 8);
    if (p.sdt == 2) {
      m.sf[i] = static_cast<float>(s);
      sv[i] = m.sf[i];
    } else if (p.sdt == 1) {
      m.s16[i] = runtime::f32_to_bf16(static_cast<float>(s));
      sv[i] = runtime::bf16_to_f32(m.s16[i]);
    } else {
      m.s16[i] = to_f16(s);
      sv[i] = runtime::f16_to_f32(m.s16[i]);
    }
  }
  const DType sd = p.sdt == 0 ? DType::f16 : p.sdt == 1 ? DType::bf16 : DType::f32;
  Int4Weight& d = m.int4;
  d.format = p.awq ? Int4Format::awq : Int4Format::gptq;
  d.qweight = p.awq ? TensorView(m.qw.data(), DType::i32, {K, n8})
                    : TensorView(m.qw.data(), DType::i32, {k8, N});
  d.scales = sd == DType::f32 ? TensorView(m.sf.data(), sd, {gw, N})
                              : TensorView(m.s16.data(), sd, {gw, N});
  if (p.zp) d.qzeros = TensorView(m.qz.data(), DType::i32, {G, n8});
  if (p.gidx) d.g_idx = TensorView(m.g.data(), DType::i32, {K});
  d.group_size = p.gs;
  d.gptq_v2 = p.v2;
  d.bits = p.bits;
  d.n = N, d.k = K;
  // With g_idx the groups are the scale rows (gw: one more when the width is
  // wrong on purpose) and, with zero points, the qzeros rows (G) too.
  for (int32_t v : m.g)
    if (v < 0 || v >= (p.zp ? G : gw)) return;  // no defined weights: pack must refuse
  if (!p.gidx && p.gs <= 0 && p.gs != -1) return;
  m.w.resize(static_cast<size_t>(N * K));
  m.mag.resize(m.w.size());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      const int64_t grp = p.gidx ? m.g[k] : p.gs < 0 ? 0 : k / p.gs;
      const int q =
          p.awq ? runtime::awq_at(m.qw.data(), n8, k, n) : runtime::gptq_q_at(m.qw.data(), N, k, n);
      int z = 8;
      if (p.zp)
        z = p.awq ? runtime::awq_at(m.qz.data(), n8, grp, n)
                  : runtime::gptq_zero_at(m.qz.data(), n8, grp, n, !p.v2);
      const double s = sv[static_cast<size_t>(grp * N + n)];
      m.w[n * K + k] = double(q - z) * s;
      // tests/moe_quant_test.cpp: the fused int4 kernel's terms are
      // a·(16 + q) and (16 + z)·Σa.
      m.mag[n * K + k] = double(q + z + 32) * std::fabs(s);
    }
}

void make_mxfp4(Mat& m, Rng& r, double a) {
  const int64_t N = m.n, K = m.k;
  const Params& p = m.p;
  const int64_t G = (K + 31) / 32, B = (K + 1) / 2, row = p.three_d ? G * 16 : B;
  // The logical K: k, or all the blocks hold (k = 0).
  const int64_t KL = p.k_given ? K : p.three_d ? 32 * G : 2 * B;
  m.k = KL;
  m.u8.resize(static_cast<size_t>(N * row));
  for (auto& b : m.u8) b = static_cast<uint8_t>(r.next());
  for (int64_t n = 0; n < N; ++n)  // unpack writes the codes past K as 0
    for (int64_t j = 0; j < row; ++j) {
      if (2 * j >= KL) m.u8[n * row + j] = 0;
      if (2 * j + 1 == KL) m.u8[n * row + j] &= 0x0F;
    }
  const int64_t gs = (KL + 31) / 32 + p.scale_width_extra;
  m.e8m0.resize(static_cast<size_t>(N * gs));
  const int e0 = 127 + static_cast<int>(std::floor(std::log2(a / 6)));
  for (auto& e : m.e8m0) {
    e = static_cast<uint8_t>(e0 + static_cast<int>(r.next() % 2));
    if (r.next() % 64 == 0) e = static_cast<uint8_t>(r.next());
    if (!p.nan_codes && e == 0xFF) e = 0x7F;
  }
  m.mx.blocks = p.three_d ? TensorView(m.u8.data(), DType::u8, {N, G, 16})
                          : TensorView(m.u8.data(), DType::u8, {N, B});
  m.mx.scales = TensorView(m.e8m0.data(), DType::u8, {N, gs});
  m.mx.k = p.k_given ? K : 0;
  m.w.resize(static_cast<size_t>(N * KL));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < KL; ++k) {
      const int q = (m.u8[n * row + k / 2] >> (4 * (k % 2))) & 0xF;
      m.w[n * KL + k] = double(runtime::e2m1_to_f32(static_cast<uint8_t>(q))) *
                        std::ldexp(1.0, int(m.e8m0[n * gs + k / 32]) - 127);
    }
  m.mag = m.w;
  for (auto& v : m.mag) v = std::fabs(v);
}

Mat make_mat(const Params& p, int64_t N, int64_t K, double a, Rng& r) {
  Mat m;
  m.n = N, m.k = K, m.p = p;
  switch (p.fmt) {
    case Fmt::int8:
      make_int8(m, r, a);
      break;
    case Fmt::fp8:
      make_fp8(m, r, a);
      break;
    case Fmt::int4:
      make_int4(m, r, a);
      break;
    case Fmt::mxfp4:
      make_mxfp4(m, r, a);
      break;
  }
  return m;
}

// One projection's experts: checkpoints, packed.
struct Proj {
  std::vector<Mat> m;
  std::optional<PackedExperts> packed;
  std::string error;
};

template <class W>
PackedExperts pack_as(const std::vector<Mat>& ms, W Mat::*field, ExpertProj proj, GluRows rows) {
  std::vector<W> v;
  for (const Mat& m : ms) v.push_back(m.*field);
  return pack_experts(v, proj, rows);
}

PackedExperts pack_mats(const std::vector<Mat>& ms, Fmt f, ExpertProj proj, GluRows rows) {
  switch (f) {
    case Fmt::int8:
      return pack_as(ms, &Mat::int8, proj, rows);
    case Fmt::fp8:
      return pack_as(ms, &Mat::fp8, proj, rows);
    case Fmt::int4:
      return pack_as(ms, &Mat::int4, proj, rows);
    case Fmt::mxfp4:
      break;
  }
  return pack_as(ms, &Mat::mx, proj, rows);
}

// unpack into fresh buffers: every tensor bit for bit (the padding nibbles
// were cleared when the checkpoint was made).
template <class T>
void fresh(TensorView& v, std::vector<T>& buf, size_t n, T fill) {
  buf.assign(n, fill);
  v.data = buf.data();
}

void check_unpack(const PackedExperts& pe, std::vector<Mat>& ms, Fmt f, const char* what) {
  const size_t E = ms.size();
  std::vector<std::vector<int8_t>> i8(E);
  std::vector<std::vector<uint8_t>> u8(E), u8b(E);
  std::vector<std::vector<int32_t>> qw(E), qz(E), g(E);
  std::vector<std::vector<float>> sf(E);
  std::vector<std::vector<uint16_t>> s16(E);
  auto bad = [&](size_t e, const char* t) {
    die(std::string(what) + ": unpack of expert " + std::to_string(e) + " differs in " + t);
  };
  if (f == Fmt::int8) {
    std::vector<Int8Weight> out;
    for (size_t e = 0; e < E; ++e) {
      Int8Weight u = ms[e].int8;
      fresh(u.weight, i8[e], ms[e].i8.size(), int8_t{-1});
      fresh(u.scales, sf[e], ms[e].sf.size(), -1.0f);
      out.push_back(u);
    }
    pe.unpack(out);
    for (size_t e = 0; e < E; ++e) {
      if (i8[e] != ms[e].i8) bad(e, "weight");
      if (std::memcmp(sf[e].data(), ms[e].sf.data(), sf[e].size() * 4) != 0) bad(e, "scales");
    }
  } else if (f == Fmt::fp8) {
    std::vector<Fp8Weight> out;
    for (size_t e = 0; e < E; ++e) {
      Fp8Weight u = ms[e].fp8;
      fresh(u.weight, u8[e], ms[e].u8.size(), uint8_t{0x7F});
      fresh(u.scales, sf[e], ms[e].sf.size(), -1.0f);
      out.push_back(u);
    }
    pe.unpack(out);
    for (size_t e = 0; e < E; ++e) {
      if (u8[e] != ms[e].u8) bad(e, "weight");
      if (std::memcmp(sf[e].data(), ms[e].sf.data(), sf[e].size() * 4) != 0) bad(e, "scales");
    }
  } else if (f == Fmt::int4) {
    std::vector<Int4Weight> out;
    for (size_t e = 0; e < E; ++e) {
      Int4Weight u = ms[e].int4;
      fresh(u.qweight, qw[e], ms[e].qw.size(), -1);
      if (u.scales.dtype == DType::f32)
        fresh(u.scales, sf[e], ms[e].sf.size(), -1.0f);
      else
        fresh(u.scales, s16[e], ms[e].s16.size(), uint16_t{0xFFFF});
      if (u.qzeros) fresh(*u.qzeros, qz[e], ms[e].qz.size(), -1);
      if (u.g_idx) fresh(*u.g_idx, g[e], ms[e].g.size(), -1);
      out.push_back(u);
    }
    pe.unpack(out);
    for (size_t e = 0; e < E; ++e) {
      const Mat& m = ms[e];
      if (qw[e] != m.qw) bad(e, "qweight");
      if (m.int4.qzeros && qz[e] != m.qz) bad(e, "qzeros");
      if (m.int4.g_idx && g[e] != m.g) bad(e, "g_idx");
      if (m.int4.scales.dtype == DType::f32
              ? std::memcmp(sf[e].data(), m.sf.data(), m.sf.size() * 4) != 0
              : s16[e] != m.s16)
        bad(e, "scales");
    }
  } else {
    std::vector<Mxfp4Weight> out;
    for (size_t e = 0; e < E; ++e) {
      Mxfp4Weight u = ms[e].mx;
      fresh(u.blocks, u8[e], ms[e].u8.size(), uint8_t{0xEE});
      fresh(u.scales, u8b[e], ms[e].e8m0.size(), uint8_t{0});
      out.push_back(u);
    }
    pe.unpack(out);
    for (size_t e = 0; e < E; ++e) {
      if (u8[e] != ms[e].u8) bad(e, "blocks");
      if (u8b[e] != ms[e].e8m0) bad(e, "scales");
    }
  }
}

// Builds and packs one projection; on success checks shape, dequantize and
// unpack. E experts of [rows, cols], one of them perhaps mutated.
Proj build_proj(FuzzedDataProvider& f, Rng& r, const Params& p, int64_t E, int64_t rows,
                int64_t cols, double a, ExpertProj proj, GluRows glu, const char* what) {
  Proj out;
  const int odd = f.ConsumeIntegralInRange(0, 31) == 0 ? f.ConsumeIntegralInRange(1, 5) : 0;
  const int64_t odd_e = E > 1 ? f.ConsumeIntegralInRange<int64_t>(1, E - 1) : 0;
  out.m.reserve(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) {
    Params pe = p;
    int64_t re = rows, ce = cols;
    if (odd && e == odd_e) {
      if (odd == 1) pe.gs = pe.gs == 32 ? 64 : 32, pe.per_tensor = !pe.per_tensor;
      if (odd == 2) pe.zp = !pe.zp, pe.fp8_kind = (pe.fp8_kind + 1) % 3;
      if (odd == 3) ce += 8;
      if (odd == 4) re += 2;
      if (odd == 5) pe.sdt = (pe.sdt + 1) % 3, pe.three_d = !pe.three_d;
    }
    out.m.push_back(make_mat(pe, re, ce, a, r));
  }
  try {
    out.packed = pack_mats(out.m, p.fmt, proj, glu);
  } catch (const Error& e) {
    out.error = e.what();
    return out;
  }
  const PackedExperts& pk = *out.packed;
  const int64_t N = out.m[0].n, K = out.m[0].k;
  for (const Mat& m : out.m) {
    if (m.n != N || m.k != K)
      die(std::string(what) + ": pack_experts accepted experts of different shapes");
    if (m.w.empty())
      die(std::string(what) + ": pack_experts accepted a " + fmt_name(m.p.fmt) +
          " checkpoint with no defined weights (g_idx out of range, block or group size <= 0): "
          "group_size " +
          std::to_string(m.p.gs) + ", g_idx " + std::to_string(m.p.gidx) + " (" +
          std::to_string(m.g.size()) + " entries), fp8 blocks " + std::to_string(m.p.bn) + " x " +
          std::to_string(m.p.bk) + ", scales " + std::to_string(m.sf.size()));
  }
  const int64_t want_n = proj == ExpertProj::gate_up ? N / 2 : N;
  if (pk.num_experts() != E || pk.n() != want_n || pk.k() != K || pk.proj() != proj)
    die(std::string(what) + ": num_experts / n / k / proj differ from the checkpoint's");
  if (pack_experts(pk, proj).impl() != pk.impl())
    die(std::string(what) + ": packing packed experts is not a no-op");
  std::vector<float> dq(static_cast<size_t>(E * N * K));
  pk.dequantize(TensorView(dq.data(), DType::f32, {E, N, K}));
  for (int64_t e = 0; e < E; ++e)
    for (int64_t j = 0; j < N * K; ++j)
      if (!same_value(dq[e * N * K + j], static_cast<float>(out.m[e].w[j])))
        die(std::string(what) + ": dequantize of expert " + std::to_string(e) + " differs at " +
            std::to_string(j) + ": " + std::to_string(dq[e * N * K + j]) + " vs " +
            std::to_string(out.m[e].w[j]));
  check_unpack(pk, out.m, p.fmt, what);
  return out;
}

// ---------------------------------------------------------------------------
// The oracle: tests/moe_quant_test.cpp's add_expert on the exact weights.

constexpr double kU = 1.0 / (1 << 24);
constexpr double kSumUlps = 8;  // moe_test's allowance per fp32 sum, in u·Σ|terms|

struct InputRow {
  std::vector<double> v, mag;
  double scale = 0;
  int64_t lo = 0, hi = 0;
};

InputRow input_row(bool int8, ActQuant aq, const uint16_t* x, int64_t k) {
  InputRow in;
  in.v.resize(static_cast<size_t>(k));
  in.mag.resize(static_cast<size_t>(k));
  if (!int8) {
    for (int64_t i = 0; i < k; ++i) in.mag[i] = std::fabs(in.v[i] = runtime::bf16_to_f32(x[i]));
    return in;
  }
  const bool asym = aq == ActQuant::dynamic_asym;
  std::vector<uint8_t> q(static_cast<size_t>(k));
  float s = 0;
  int32_t z = 0;
  runtime::reference_act_quant_row(asym ? runtime::ActQuantRule::asym : runtime::ActQuantRule::sym,
                                   x, k, k, 1.0f, 0.0f, 0, q.data(), &s, &z);
  auto at = [&](int64_t i) { return runtime::bf16_to_f32(x[i]); };
  for (int64_t i = 0; i < k; ++i) {
    in.v[i] = double(int32_t(q[i]) - z) * double(s);
    in.mag[i] = (std::fabs(double(int32_t(q[i]) - z)) + 2.0 * std::abs(z)) * double(s);
    if (at(i) < at(in.lo)) in.lo = i;
    if (at(i) > at(in.hi)) in.hi = i;
    if (!asym && std::fabs(at(i)) > std::fabs(at(in.hi))) in.hi = i;
  }
  in.scale = s;
  return in;
}

struct Oracle {
  std::vector<double> out, abs_sum, act_term;  // [T, H]
};

struct ExpertRef {
  Fmt fmt;
  const Mat* w13;  // [2I, H], rows in the checkpoint's order
  const Mat* w2;   // [H, I]
  bool interleaved;
};

void add_expert(const runtime::ReferenceGlu& glu, ActQuant aq, const ExpertRef& x, int64_t rows,
                const uint16_t* xr, const float* b13, const float* b2, double scale, int64_t t,
                Oracle& o) {
  const int64_t H = x.w13->k, I = x.w13->n / 2;
  // Inputs quantized per token: int8, and int4 on the W4A8 route (the
  // library's rule, ops::w4a8_route, with the expert's rows as M; the call
  // leaves int4_route automatic). Both read the exact weights.
  const bool int8 =
      x.fmt == Fmt::int8 ||
      (x.fmt == Fmt::int4 &&
       ops::w4a8_route(x.w13->p.awq ? WeightFormat::int4_awq : WeightFormat::int4_gptq, H,
                       Int4Route::automatic, cpu_info().isa, rows, "experts_fuzzer"));
  const bool exact =
      int8 || cpu_info().isa == Isa::scalar || ops::quant_gemm_fused(cpu_info().isa, rows);
  const bool fold = exact && !int8 && x.fmt == Fmt::int4;
  auto weight = [&](const Mat& m, int64_t at) {
    return exact ? m.w[at] : double(runtime::bf16_to_f32(runtime::f32_to_bf16(float(m.w[at]))));
  };
  auto mag = [&](const Mat& m, int64_t at, double w) { return fold ? m.mag[at] : std::fabs(w); };
  const InputRow xin = input_row(int8, aq, xr, H);
  std::vector<uint16_t> act(static_cast<size_t>(I));
  std::vector<double> slack(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    const int64_t gr = x.interleaved ? 2 * i : i, ur = x.interleaved ? 2 * i + 1 : I + i;
    runtime::MoeActPoint p;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t ag = gr * H + h, au = ur * H + h;
      const double wg = weight(*x.w13, ag), wu = weight(*x.w13, au);
      p.gate += xin.v[h] * wg;
      p.up += xin.v[h] * wu;
      p.gate_abs += xin.mag[h] * mag(*x.w13, ag, wg);
      p.up_abs += xin.mag[h] * mag(*x.w13, au, wu);
    }
    if (b13 != nullptr) {  // in w13's row order (MoeOptions::b13)
      p.gate += b13[gr], p.up += b13[ur];
      p.gate_abs += std::fabs(b13[gr]), p.up_abs += std::fabs(b13[ur]);
    }
    p.act = runtime::reference_glu(glu, p.gate, p.up);
    act[i] = runtime::f32_to_bf16(static_cast<float>(p.act));
    p.act_bf16 = runtime::bf16_to_f32(act[i]);
    slack[i] = runtime::moe_act_slack(glu, p, kSumUlps * kU);
  }
  const InputRow ain = input_row(int8, aq, act.data(), I);
  const bool row_shift = int8 && (slack[ain.lo] > 0 || slack[ain.hi] > 0);
  // tests/moe_quant_test.cpp's row_shift term assumes the scale-setting
  // element moves by about a bf16 ulp. Deep in a tail of gelu / silu its
  // slack can be far larger than the element itself (gate -6: the exact
  // 3e-8, the fp32 kernels' 0, an int8 row of all 0 codes), and the kernel's
  // row scale is then anything up to max(|a| + slack) / 127: each code moves
  // by its slack plus a step of either scale.
  double big = 0;
  for (int64_t i = 0; i < I; ++i)
    big = std::max(big, std::fabs(double(runtime::bf16_to_f32(act[i]))) + slack[i]);
  for (int64_t h = 0; h < H; ++h) {
    double y = b2 ? b2[h] : 0, m = b2 ? std::fabs(b2[h]) : 0, term = 0, wabs = 0, wide = 0;
    for (int64_t i = 0; i < I; ++i) {
      const int64_t at = h * I + i;
      const double w = weight(*x.w2, at);
      y += ain.v[i] * w;
      m += ain.mag[i] * mag(*x.w2, at, w);
      wabs += std::fabs(w);
      wide += (slack[i] + ain.scale + big / 127) * std::fabs(w);
      if (slack[i] > 0) term += (int8 ? ain.scale + slack[i] : slack[i]) * std::fabs(w);
    }
    if (row_shift) term = std::max(ain.scale * wabs + std::ldexp(m, -7), wide);
    o.out[t * H + h] += scale * y;
    o.abs_sum[t * H + h] += std::fabs(scale) * m;
    o.act_term[t * H + h] += std::fabs(scale) * term;
  }
}

// Whether the weights are inside the model of the bound: finite, and small
// enough that no activation or sum leaves the f32 range (a hostile 3e38
// scale makes gate·up overflow: IEEE, not the bound, says what comes out).
bool modelled(const std::vector<Mat>& ms) {
  for (const Mat& m : ms)
    for (double w : m.w)
      if (!(std::fabs(w) <= 1e6)) return false;
  return true;
}

Fmt pick_fmt(FuzzedDataProvider& f) {
  return static_cast<Fmt>(f.ConsumeIntegralInRange(0, 3));
}

void run_case(FuzzedDataProvider& f) {
  Rng r(f.ConsumeIntegral<uint64_t>());
  const Fmt fmt = pick_fmt(f);
  const Params p = fuzz_params(f, fmt);
  static constexpr int64_t kE[] = {1, 2, 3, 4, 2};
  static constexpr int64_t kH[] = {32, 72, 80, 33, 64, 8, 1, 31, 96};
  static constexpr int64_t kI[] = {16, 40, 48, 32, 1, 3, 17, 64};
  const int64_t E = f.ConsumeIntegralInRange(0, 63) == 0 ? 0 : f.PickValueInArray(kE);
  const int64_t H = f.PickValueInArray(kH), I = f.PickValueInArray(kI);
  const GluRows glu_rows = f.ConsumeIntegralInRange(0, 31) == 0
                               ? static_cast<GluRows>(f.ConsumeIntegralInRange(2, 3))
                           : f.ConsumeBool() ? GluRows::interleaved
                                             : GluRows::halves;
  // Weights of the sizes moe_quant_test uses: pre-activations of a few units.
  Proj w13 = build_proj(f, r, p, E, 2 * I, H, 12.0 / std::sqrt(double(H)), ExpertProj::gate_up,
                        glu_rows, "w13");
  Proj w2 = build_proj(f, r, p, E, H, I, 3.0 / std::sqrt(double(I)), ExpertProj::down,
                       GluRows::halves, "w2");
  if (describe())
    std::fprintf(
        stderr,
        "experts %s E=%lld H=%lld I=%lld rows=%d per_tensor=%d fp8 kind=%d block %lldx%lld "
        "kn=%d int4 awq=%d zp=%d g_idx=%d(mode %d, G %lld) v2=%d gs=%lld sdt=%d bits=%d "
        "mxfp4 3d=%d k_given=%d extra=%d nan=%d: w13 %s, w2 %s\n",
        fmt_name(fmt), (long long)E, (long long)H, (long long)I, int(glu_rows), p.per_tensor,
        p.fp8_kind, (long long)p.bn, (long long)p.bk, p.kn, p.awq, p.zp, p.gidx, p.gidx_mode,
        (long long)p.groups, p.v2, (long long)p.gs, p.sdt, p.bits, p.three_d, p.k_given,
        p.scale_width_extra, p.nan_codes, w13.packed ? "packed" : w13.error.c_str(),
        w2.packed ? "packed" : w2.error.c_str());
  if (!w13.packed || !w2.packed) return;
  // The logical K of w13 (MXFP4 with k = 0: what the blocks hold) is the
  // hidden size of the call; w2's logical K is I.
  const int64_t HK = w13.m[0].k;
  // An MXFP4 k = 0 pads K to 32 (w13: past H, w2: past I): no pair, the call must refuse.
  // So does a mutated sole expert (E = 1) of another shape.
  bool well_formed = HK == H && w13.m[0].n == 2 * I && w2.m[0].n == H && w2.m[0].k == I;

  // A shared expert, perhaps in another format.
  std::optional<Proj> s13, s2;
  int64_t shared_i = 0;
  if (f.ConsumeIntegralInRange(0, 3) == 0) {
    const Fmt sf = pick_fmt(f);
    Params sp = fuzz_params(f, sf);
    sp.scale_width_extra = 0;
    shared_i = f.PickValueInArray(kI);
    s13 = build_proj(f, r, sp, 1, 2 * shared_i, H, 12.0 / std::sqrt(double(H)), ExpertProj::gate_up,
                     GluRows::halves, "shared_w13");
    s2 = build_proj(f, r, sp, 1, H, shared_i, 3.0 / std::sqrt(double(shared_i)), ExpertProj::down,
                    GluRows::halves, "shared_w2");
    if (describe())
      std::fprintf(stderr, "shared %s: w13 %s [%lld, %lld], w2 %s [%lld, %lld]\n", fmt_name(sf),
                   s13->packed ? "packed" : s13->error.c_str(), (long long)s13->m[0].n,
                   (long long)s13->m[0].k, s2->packed ? "packed" : s2->error.c_str(),
                   (long long)s2->m[0].n, (long long)s2->m[0].k);
    if (!s13->packed || !s2->packed) return;
    // Its I is its w2's K (an MXFP4 k = 0 pads it; a mutated sole expert
    // changes it): a pair when w13 has twice as many rows.
    well_formed =
        well_formed && s13->m[0].k == HK && s13->m[0].n == 2 * s2->m[0].k && s2->m[0].n == H;
  }

  // The call.
  static constexpr int64_t kT[] = {1, 2, 3, 5, 9, 1, 2, 40, 0};
  const int64_t T = f.PickValueInArray(kT);
  const int64_t k = f.ConsumeIntegralInRange<int64_t>(1, std::max<int64_t>(E, 1) + 1);
  const bool wild_ids = f.ConsumeIntegralInRange(0, 15) == 0;
  std::vector<uint16_t> hidden(static_cast<size_t>(T * HK));
  for (auto& v : hidden) v = runtime::f32_to_bf16(static_cast<float>(2 * r.unit() - 1));
  std::vector<float> tw(static_cast<size_t>(T * k));
  for (auto& v : tw) v = static_cast<float>(0.05 + 0.95 * r.unit());
  std::vector<int32_t> ids(static_cast<size_t>(T * k));
  bool ids_ok = true;
  for (auto& v : ids) {
    v = static_cast<int32_t>(r.next() % uint64_t(std::max<int64_t>(E, 1)));
    if (wild_ids && r.next() % 3 == 0) {
      static constexpr int32_t kBad[] = {-1, 0, 1, 2, 3, 4, 5, 65536, -2147483647 - 1, 2147483647};
      v = kBad[r.next() % 10];
    }
    ids_ok = ids_ok && v >= 0 && v < E;
  }
  MoeOptions o;
  well_formed = well_formed && ids_ok && k <= E;  // 1 <= k <= E
  o.clamped_swiglu = f.ConsumeIntegralInRange(0, 3) == 0;
  const int act = f.ConsumeIntegralInRange(0, 15);
  if (act < 12 || o.clamped_swiglu) {  // clamped_swiglu replaces act
    static constexpr Activation kActs[] = {Activation::silu, Activation::gelu_tanh,
                                           Activation::gelu_erf};
    o.act = kActs[act % 3];
  } else {
    o.act = static_cast<Activation>(f.ConsumeIntegralInRange(-1, 8));
    well_formed = well_formed && (o.act == Activation::silu || o.act == Activation::gelu_tanh ||
                                  o.act == Activation::gelu_erf);
  }
  if (o.clamped_swiglu && f.ConsumeBool()) {
    o.swiglu_alpha = static_cast<float>(f.ConsumeIntegralInRange(1, 40) / 10.0);
    o.swiglu_limit = static_cast<float>(f.ConsumeIntegralInRange(1, 100) / 10.0);
  }
  std::vector<float> b13, b2;
  if (f.ConsumeIntegralInRange(0, 2) == 0) {
    b13.resize(static_cast<size_t>(E * 2 * I));
    for (auto& v : b13) v = static_cast<float>(4 * r.unit() - 2);
    o.b13 = TensorView(b13.data(), DType::f32, {E, 2 * I});
  }
  if (f.ConsumeIntegralInRange(0, 2) == 0) {
    b2.resize(static_cast<size_t>(E * H));
    for (auto& v : b2) v = static_cast<float>(2 * r.unit() - 1);
    o.b2 = TensorView(b2.data(), DType::f32, {E, H});
  }
  if (f.ConsumeBool())
    o.routed_scaling_factor = static_cast<float>(f.ConsumeIntegralInRange(1, 40) / 16.0);
  if (s13) {
    o.shared_w13 = &*s13->packed;
    o.shared_w2 = &*s2->packed;
  }
  const int aq = f.ConsumeIntegralInRange(0, 15);
  o.act_quant = aq < 7 ? ActQuant::dynamic_sym : aq < 14 ? ActQuant::dynamic_asym : ActQuant::fixed;
  const bool any_int8 = fmt == Fmt::int8 || (s13 && s13->m[0].p.fmt == Fmt::int8);
  // fixed needs its per-tensor scales (0 by default: refused with int8
  // experts); without int8 experts it is ignored or refused, by the version
  // of the contract (the MoE fixed mode is being added): either is allowed.
  if (o.act_quant == ActQuant::fixed && any_int8) well_formed = false;
  const bool may_refuse = o.act_quant == ActQuant::fixed;
  const DType out_dt = f.ConsumeBool() ? DType::f32 : DType::bf16;
  const size_t esz = out_dt == DType::f32 ? 4 : 2;
  std::vector<uint8_t> out(static_cast<size_t>(T * H) * esz, 0xEE);
  if (describe())
    std::fprintf(stderr,
                 "call T=%lld k=%lld ids_ok=%d act=%d clamped=%d b13=%d b2=%d rsf=%g shared=%lld "
                 "act_quant=%d out=%s well_formed=%d\n",
                 (long long)T, (long long)k, ids_ok, int(o.act), o.clamped_swiglu, !b13.empty(),
                 !b2.empty(), o.routed_scaling_factor, (long long)shared_i, int(o.act_quant),
                 dtype_name(out_dt), well_formed);
  try {
    fused_experts(TensorView(hidden.data(), DType::bf16, {T, HK}), *w13.packed, *w2.packed,
                  TensorView(tw.data(), DType::f32, {T, k}),
                  TensorView(ids.data(), DType::i32, {T, k}),
                  TensorView(out.data(), out_dt, {T, H}), o);
  } catch (const Error& e) {
    if (well_formed && !may_refuse)
      die(std::string("fused_experts refused a well-formed call: ") + e.what());
    return;
  }
  if (!ids_ok) die("fused_experts accepted topk_ids outside [0, E)");
  if (!well_formed)
    die("fused_experts accepted an ill-formed call (act, act_quant, or w13 / w2 / shared shapes "
        "that do not pair)");
  if (!modelled(w13.m) || !modelled(w2.m) || (s13 && (!modelled(s13->m) || !modelled(s2->m))))
    return;  // NaN / Inf / huge weights: it ran; IEEE says the rest

  Oracle ref;
  ref.out.assign(static_cast<size_t>(T * H), 0);
  ref.abs_sum = ref.out;
  ref.act_term = ref.out;
  std::vector<int64_t> rows(static_cast<size_t>(E), 0);
  for (int32_t e : ids) ++rows[e];
  runtime::ReferenceGlu glu;
  glu.act = o.act;
  glu.clamped_swiglu = o.clamped_swiglu;
  glu.alpha = o.swiglu_alpha;
  glu.limit = o.swiglu_limit;
  const bool il = glu_rows == GluRows::interleaved;
  for (int64_t t = 0; t < T; ++t) {
    const uint16_t* xr = hidden.data() + t * HK;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      add_expert(glu, o.act_quant, {fmt, &w13.m[e], &w2.m[e], il}, rows[e], xr,
                 b13.empty() ? nullptr : b13.data() + e * 2 * I,
                 b2.empty() ? nullptr : b2.data() + e * H,
                 double(o.routed_scaling_factor) * tw[t * k + j], t, ref);
    }
    if (s13)
      add_expert(glu, o.act_quant, {s13->m[0].p.fmt, &s13->m[0], &s2->m[0], false}, T, xr, nullptr,
                 nullptr, 1.0, t, ref);
  }
  for (int64_t at = 0; at < T * H; ++at) {
    double got;
    if (esz == 4) {
      float v;
      std::memcpy(&v, &out[at * 4], 4);
      got = v;
    } else {
      uint16_t v;
      std::memcpy(&v, &out[at * 2], 2);
      got = runtime::bf16_to_f32(v);
    }
    const double want = ref.out[at];
    if (!std::isfinite(want) || std::fabs(want) > 1e30) continue;
    const double tol = runtime::moe_output_bound(out_dt, ref.abs_sum[at], ref.act_term[at],
                                                 2 * kSumUlps * kU, want);
    if (!(std::fabs(got - want) <= tol + 1e-30)) {
      char msg[256];
      std::snprintf(msg, sizeof msg,
                    "fused_experts out[%lld, %lld] = %.9g, oracle %.9g (tol %.3g) on the %s path",
                    (long long)(at / H), (long long)(at % H), got, want, tol,
                    isa_name(cpu_info().isa));
      die(msg);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider f(data, size);
  try {
    run_case(f);
  } catch (const Error& e) {
    // pack_experts' and fused_experts' own Errors are handled above; one from
    // dequantize / unpack / repack of experts that packed is a finding.
    die(std::string("Error after a successful pack: ") + e.what());
  }
  return 0;
}
