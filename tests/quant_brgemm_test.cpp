// The fused W4A16 / W8A16 decode micro-kernel through jit::get(desc) on the
// avx512 row (codegen/xbyak/quant_brgemm.cpp) and on the llvm row (the LLVM
// brgemm's quantized mode, codegen/llvm/llvm_brgemm.cpp), with hand-built code blocks and
// group tables (the packed k-pair order of ops/packed_weight_impl.h):
//   fp8: codes[kp][c][2] bytes (128 a k-pair row); int4 and MXFP4 (e2m1):
//   codes[kp][c] bytes, low nibble = even k (64 a row); groups[kp] the scale row of k-pair row
//   kp; scales [G][64] f32 (u4, fp8) or, for MXFP4, the e8m0 exponent bytes
//   u8 [G][64] (s = 2^(e − 127), e = 0 the f32 subnormal 2^-127; passed through
//   the `const float*` q_scales), zeros [G][64] u8 (u4 with zeros).
// Contract: y[r][c] = act(Σ_g s[g][c]·Σ_{k∈g} a[r][k]·(q[k][c] − z[g][c]) + bias[c]),
// fp8: the e4m3 value instead of q − z, MXFP4 the e2m1 value (decoded here
// from its bit fields); z = 8 for u4 without zeros.
//
// Cases:
//   shape_*   every format (u4, u4 with zeros, fp8, mxfp4) × mr 1..4 × nr {1, 15, 16,
//             17, 33, 64} × kb {1, 2, 3, 31, 64, 127, 256, 1000}, the group
//             pattern cycling through constant / every 16 k / every 32 k /
//             every 64 k / irregular runs (ids not monotone);
//   epi_*     every format × bias (none, f32, bf16) × activation × out (f32,
//             bf16) on an odd shape with irregular groups and a full one;
//   groups_*  every format × every pattern at kb 1000, every mr;
//   fp8all_*  every e4m3 code (zero, ±0, subnormals, ±448) in every column;
//   zeros_*   u4 zero points all 0 / all 16 with codes 0 / 15.
//   hugex_*   every format with A ~2^100 and scales ~2^-100 (no overflow).
//   e8m0ext_* MXFP4 with exponent bytes 0 and 254: A scaled by 2^±110 by
//             group parity, each column mixing one extreme byte with a
//             balancing one (34 / 220) so both halves count in every output.
// The llvm row (llvm_* names) takes every case of epi_ / groups_ / codes_ too,
// and of shape_ every format × mr with the nr and kb lists zipped (each an
// LLVM compile: the full cross product would take minutes), plus MXCSR's
// DAZ / FTZ set for the e4m3 subnormal codes (mxcsr_*).
// Reference: double, from the logical weights (q − z)·s (e4m3(q)·s), bound
// runtime::quant_brgemm_output_bound (sum_abs = Σ|a|·(|q| + |z|)·|s|; int4
// offset_abs = Σ|a|·32·|s| for the table-free path's 16 + q codes).
//
// Traps: A, the code block, groups, scales, zeros and bias each end at a
// PROT_NONE page (GuardedBuffer). A rows of an odd kb are followed by a NaN
// (lda = kb + 1) and the last row ends at the guard: the kernel must never
// read the element past a row. Scales past nr are NaN (MXFP4: random exponent
// bytes), codes past nr random: masked lanes must not leak into stores. C
// sits between sentinel guard zones with sentinel row padding.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <xmmintrin.h>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "test_util.h"
#include "tests/support/activations.h"
#include "tilejit/error.h"

namespace tilejit::test {
namespace {

using codegen::BiasKind;
using codegen::BrgemmArgs;
using codegen::BrgemmDesc;
using codegen::BrgemmFn;

enum class Fmt { u4, u4zp, fp8, mx };
enum class Groups { constant, every16, every32, every64, irregular };
enum class Codes { random, all_fp8, min, max };

const char* fmt_name(Fmt f) {
  return f == Fmt::u4 ? "u4" : f == Fmt::u4zp ? "u4zp" : f == Fmt::mx ? "mxfp4" : "fp8";
}
const char* groups_name(Groups g) {
  switch (g) {
    case Groups::constant:
      return "g1";
    case Groups::every16:
      return "g16";
    case Groups::every32:
      return "g32";
    case Groups::every64:
      return "g64";
    case Groups::irregular:
      return "girr";
  }
  return "?";
}

struct QCase {
  std::string group;
  Isa isa = Isa::avx512;  // the registry row: avx512 (Xbyak) or llvm
  Fmt fmt = Fmt::u4;
  int mr = 1, nr = 64;
  int64_t kb = 64;
  Groups groups = Groups::every32;
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  DType out = DType::f32;
  Codes codes = Codes::random;
  int zero = -1;       // u4zp: -1 random 0..16, else every zero point
  bool daz = false;    // run with MXCSR's DAZ and FTZ set
  int x_exp = 0;       // A scaled by 2^x_exp and the scales by 2^-x_exp (exact)
  bool dot = false;    // u4: BrgemmDesc::u4_bf16_dot (vdpbf16ps at mr <= 3 too)
  bool ext_e = false;  // mx: exponent bytes 0 / 254 (header: e8m0ext_)

  BrgemmDesc desc() const {
    BrgemmDesc d;
    d.isa = isa;
    d.b_type = fmt == Fmt::fp8 ? DType::f8e4m3 : fmt == Fmt::mx ? DType::f4e2m1 : DType::u4;
    d.b_zeros = fmt == Fmt::u4zp;
    d.b_row_bytes = fmt == Fmt::fp8 ? 128 : 64;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.bias = bias, d.act = act, d.out = out;
    d.u4_bf16_dot = dot;
    return d;
  }
  std::string str() const {
    std::string s =
        fmt::format("{}{}_{}_m{}n{}k{}_{}_{}", isa == Isa::llvm ? "llvm_" : "", group,
                    fmt_name(fmt), mr, nr, kb, groups_name(groups), activation_name(act));
    if (daz) s += "_daz";
    if (x_exp != 0) s += fmt::format("_x2e{}", x_exp);
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    if (codes == Codes::all_fp8) s += "_allcodes";
    if (codes == Codes::min) s += "_qmin";
    if (codes == Codes::max) s += "_qmax";
    if (zero >= 0) s += fmt::format("_z{}", zero);
    if (dot) s += "_dot";
    if (ext_e) s += "_e0e254";
    return s + "_" + dtype_name(out);
  }
};

void PrintTo(const QCase& c, std::ostream* os) {
  *os << c.str();
}

constexpr uint16_t kNan = 0x7fc1;

// e2m1 from its bit fields: sign bit 3, exponent bits 2..1 (bias 1),
// mantissa bit 0; exponent 0 is the subnormal m · 0.5.
double e2m1(int q) {
  const int e = (q >> 1) & 3, m = q & 1;
  const double mag = e == 0 ? 0.5 * m : std::ldexp(1.0 + 0.5 * m, e - 1);
  return (q & 8) ? -mag : mag;
}
constexpr int64_t kGuard = kBrgemmGuard;

// The e8m0 exponent byte of the power of two nearest to m > 0 (linearly:
// f·2^x, f in [0.5, 1), is 2^(x-1) below f = 0.75, else 2^x), clamped to the
// byte range 0..254 (255 is NaN: packing refuses it).
uint8_t nearest_e8m0(double m) {
  int x = 0;
  const double f = std::frexp(m, &x);
  const int p = f < 0.75 ? x - 1 : x;
  return uint8_t(std::clamp(p + 127, 0, 254));
}

struct QData {
  QCase c;
  int64_t lda = 0, ldc = 0, pairs = 0, groups_n = 1;
  std::vector<uint16_t> x;      // [mr][kb]
  std::vector<uint8_t> q;       // [kb][64] code per (k, column): nibble or e4m3 byte
  std::vector<int32_t> groups;  // [pairs]
  std::vector<float> scales;    // [G][64] (u4, fp8)
  std::vector<uint8_t> e8m0;    // [G][64] (mx): exponent bytes, s = 2^(e − 127)
  std::vector<uint8_t> zeros;   // [G][64]
  std::vector<float> bias;      // [nr]
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  const void* a_ptr = nullptr;
  const void* b_ptr = nullptr;
  const void* bias_ptr = nullptr;
  const int32_t* groups_ptr = nullptr;
  const float* scales_ptr = nullptr;
  const uint8_t* zeros_ptr = nullptr;

  GuardedBuffer& buffer(size_t bytes) {
    bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(bytes, 1)));
    return *bufs.back();
  }
  template <class T>
  const T* guarded_copy(const std::vector<T>& v) {
    GuardedBuffer& b = buffer(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
    return b.as<T>();
  }
  int group_of(int64_t k) const { return groups[size_t(k / 2)]; }
  // The scale of group g, column j, exactly.
  double scale(int g, int j) const {
    if (c.fmt == Fmt::mx) return std::ldexp(1.0, int(e8m0[size_t(g * 64 + j)]) - 127);
    return scales[size_t(g * 64 + j)];
  }
  // The logical weight value (without the scale) of (k, column j).
  double value(int64_t k, int j) const {
    const uint8_t code = q[size_t(k * 64 + j)];
    if (c.fmt == Fmt::fp8) return runtime::e4m3_to_f32(code);
    if (c.fmt == Fmt::mx) return e2m1(code);
    const int z = c.fmt == Fmt::u4zp ? zeros[size_t(group_of(k) * 64 + j)] : 8;
    return double(int(code) - z);
  }
  double zero_abs(int64_t k, int j) const {
    if (c.fmt == Fmt::fp8 || c.fmt == Fmt::mx) return 0;
    return c.fmt == Fmt::u4zp ? zeros[size_t(group_of(k) * 64 + j)] : 8;
  }
  double code_abs(int64_t k, int j) const {
    const uint8_t code = q[size_t(k * 64 + j)];
    if (c.fmt == Fmt::mx) return std::fabs(e2m1(code));
    return c.fmt == Fmt::fp8 ? std::fabs(runtime::e4m3_to_f32(code)) : double(code);
  }
};

std::vector<int32_t> make_groups(Groups g, int64_t pairs, std::mt19937& rng) {
  std::vector<int32_t> out(static_cast<size_t>(pairs));
  int64_t run = 0;
  switch (g) {
    case Groups::constant:
      run = pairs;
      break;
    case Groups::every16:
      run = 8;
      break;
    case Groups::every32:
      run = 16;
      break;
    case Groups::every64:
      run = 32;
      break;
    case Groups::irregular:
      break;
  }
  if (run > 0) {
    for (int64_t p = 0; p < pairs; ++p) out[size_t(p)] = int32_t(p / run);
    return out;
  }
  // Irregular run lengths 1..9 and ids drawn at random (revisiting, not monotone).
  const int32_t ids = int32_t(std::max<int64_t>(1, pairs / 3));
  int64_t p = 0;
  while (p < pairs) {
    const int64_t len = std::uniform_int_distribution<int64_t>(1, 9)(rng);
    const int32_t id = std::uniform_int_distribution<int32_t>(0, ids - 1)(rng);
    for (int64_t i = 0; i < len && p < pairs; ++i) out[size_t(p++)] = id;
  }
  return out;
}

QData make_data(const QCase& c) {
  QData d;
  d.c = c;
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.str())));
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  auto uniform_int = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  const bool odd = c.kb % 2 != 0;
  d.lda = c.kb + (odd ? 1 : 0);
  d.ldc = c.nr + 3;
  d.pairs = (c.kb + 1) / 2;
  d.groups = make_groups(c.groups, d.pairs, rng);
  d.groups_n = *std::max_element(d.groups.begin(), d.groups.end()) + 1;

  // Codes per (k, column); k past kb (the odd pair's partner) random too.
  const int64_t kpad = d.pairs * 2;
  d.q.resize(size_t(kpad * 64));
  for (int64_t k = 0; k < kpad; ++k)
    for (int j = 0; j < 64; ++j) {
      uint8_t v;
      if (c.fmt == Fmt::fp8) {
        if (c.codes == Codes::all_fp8) {
          v = uint8_t((k + 37 * j) % 256);
        } else {
          v = uint8_t(uniform_int(0, 255));
        }
        if ((v & 0x7F) == 0x7F) v = v & 0x80;  // NaN codes -> ±0
        if (c.codes == Codes::min) v = 0xFE;   // −448
        if (c.codes == Codes::max) v = 0x7E;   // 448
      } else {
        v = uint8_t(c.codes == Codes::min ? 0 : c.codes == Codes::max ? 15 : uniform_int(0, 15));
      }
      d.q[size_t(k * 64 + j)] = v;
    }
  if (c.fmt == Fmt::u4zp) {
    d.zeros.resize(size_t(d.groups_n * 64));
    for (auto& z : d.zeros) z = uint8_t(c.zero >= 0 ? c.zero : uniform_int(0, 16));
  }

  // A uniform in [-a, a], scales normalised so pre-activations are ~±5..15.
  const double a = std::sqrt(3.0);
  d.x = random_bf16(size_t(c.mr * c.kb), uint32_t(rng()), float(-a), float(a));
  for (uint16_t& v : d.x) v = f32_to_bf16(std::ldexp(bf16_to_f32(v), c.x_exp));
  // e8m0ext: A of even groups times 2^kExt, of odd groups times 2^-kExt (exact).
  constexpr int kExt = 110;
  if (c.ext_e)
    for (int r = 0; r < c.mr; ++r)
      for (int64_t k = 0; k < c.kb; ++k) {
        uint16_t& v = d.x[size_t(r * c.kb + k)];
        v = f32_to_bf16(std::ldexp(bf16_to_f32(v), d.group_of(k) % 2 == 0 ? kExt : -kExt));
      }
  double wsq = 0;
  for (int64_t k = 0; k < c.kb; ++k)
    for (int j = 0; j < 64; ++j) {
      const double v = d.value(k, j);  // groups / zeros known already
      wsq += v * v;
    }
  const double wrms = std::sqrt(wsq / double(c.kb * 64)) + 1e-3;
  const double sbase = 5.0 / (std::sqrt(double(c.kb)) * wrms);
  if (c.fmt == Fmt::mx) {
    // e8m0 scales are positive powers of two: the one nearest the same
    // magnitude; past nr any byte. e8m0ext: even columns take byte 0 in even
    // groups (a·v·2^(kExt − 127)) and 2·kExt in odd ones (the same
    // magnitude), odd columns 254 in odd groups (a·v·2^(127 − kExt)) and
    // 254 − 2·kExt in even ones.
    d.e8m0.resize(size_t(d.groups_n * 64));
    for (int64_t g = 0; g < d.groups_n; ++g)
      for (int j = 0; j < 64; ++j) {
        uint8_t e;
        if (j >= c.nr)
          e = uint8_t(uniform_int(0, 254));
        else if (c.ext_e)
          e = uint8_t(j % 2 == 0 ? (g % 2 == 0 ? 0 : 2 * kExt)
                                 : (g % 2 == 0 ? 254 - 2 * kExt : 254));
        else
          e = nearest_e8m0(std::ldexp(sbase * uniform(0.5, 1.5), -c.x_exp));
        d.e8m0[size_t(g * 64 + j)] = e;
      }
  } else {
    d.scales.resize(size_t(d.groups_n * 64));
    for (int64_t g = 0; g < d.groups_n; ++g)
      for (int j = 0; j < 64; ++j)
        d.scales[size_t(g * 64 + j)] = j < c.nr
                                           ? float(std::ldexp(sbase * uniform(0.5, 1.5), -c.x_exp) *
                                                   (uniform_int(0, 3) == 0 ? -1 : 1))
                                           : std::nanf("");
  }

  // A rows (lda elements, the padding NaN); the last row ends at the guard.
  {
    const size_t elems = size_t((c.mr - 1) * d.lda + c.kb);
    uint16_t* p = d.buffer(elems * 2).as<uint16_t>();
    std::fill(p, p + elems, kNan);
    for (int r = 0; r < c.mr; ++r)
      std::memcpy(p + r * d.lda, d.x.data() + r * c.kb, size_t(c.kb) * 2);
    d.a_ptr = p;
  }
  // The packed code block: exactly `pairs` k-pair rows.
  {
    const int64_t rb = c.fmt == Fmt::fp8 ? 128 : 64;
    std::vector<uint8_t> b(size_t(d.pairs * rb));
    for (int64_t p = 0; p < d.pairs; ++p)
      for (int j = 0; j < 64; ++j) {
        const uint8_t e = d.q[size_t((2 * p) * 64 + j)], o = d.q[size_t((2 * p + 1) * 64 + j)];
        if (c.fmt == Fmt::fp8) {
          b[size_t(p * 128 + 2 * j)] = e;
          b[size_t(p * 128 + 2 * j + 1)] = o;
        } else {
          b[size_t(p * 64 + j)] = uint8_t(e | (o << 4));
        }
      }
    d.b_ptr = d.guarded_copy(b);
  }
  d.groups_ptr = d.guarded_copy(d.groups);
  d.scales_ptr = c.fmt == Fmt::mx ? reinterpret_cast<const float*>(d.guarded_copy(d.e8m0))
                                  : d.guarded_copy(d.scales);
  if (c.fmt == Fmt::u4zp) d.zeros_ptr = d.guarded_copy(d.zeros);
  if (c.bias == BiasKind::f32) {
    d.bias = random_f32(size_t(c.nr), uint32_t(rng()), -5, 5);
    d.bias_ptr = d.guarded_copy(d.bias);
  } else if (c.bias == BiasKind::bf16) {
    const std::vector<uint16_t> h = random_bf16(size_t(c.nr), uint32_t(rng()), -5, 5);
    for (uint16_t v : h) d.bias.push_back(bf16_to_f32(v));
    d.bias_ptr = d.guarded_copy(h);
  }
  return d;
}

std::vector<uint8_t> run(const QData& d, BrgemmFn fn) {
  const QCase& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  std::vector<uint8_t> buf = sentinel_c(c.mr, d.ldc, es);
  const void* a_list[1] = {d.a_ptr};
  const void* b_list[1] = {d.b_ptr};
  BrgemmArgs args{};
  args.a = a_list;
  args.b = b_list;
  args.batch = 1;
  args.lda = d.lda * 2;
  args.c = buf.data() + kGuard * int64_t(es);
  args.ldc = d.ldc * int64_t(es);
  args.bias = d.bias_ptr;
  args.q_groups = d.groups_ptr;
  args.q_scales = d.scales_ptr;
  args.q_zeros = d.zeros_ptr;
  // The kernel's scratch (its f32 copy of A), guarded: it must stay inside.
  const int64_t scratch =
      c.isa == Isa::llvm ? 0 : codegen::xbyak::quant_brgemm_scratch_bytes(c.desc());
  std::optional<GuardedBuffer> sbuf;
  if (scratch > 0) {
    sbuf.emplace(static_cast<size_t>(scratch));
    args.q_scratch = sbuf->data();
  }
  if (c.daz) {
    // DAZ (bit 6) and FTZ (bit 15): an engine's threads may run so.
    const unsigned saved = _mm_getcsr();
    _mm_setcsr(saved | 0x8040u);
    fn(&args);
    _mm_setcsr(saved);
  } else {
    fn(&args);
  }
  return buf;
}

::testing::AssertionResult check(const QData& d, const std::vector<uint8_t>& got) {
  const QCase& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  const uint8_t* body = got.data() + kGuard * int64_t(es);
  int64_t bad = 0;
  std::string msg;
  for (int r = 0; r < c.mr; ++r)
    for (int j = 0; j < c.nr; ++j) {
      double pre = 0, sabs = 0, oabs = 0;
      for (int64_t k = 0; k < c.kb; ++k) {
        const double a = bf16_to_f32(d.x[size_t(r * c.kb + k)]);
        const double s = d.scale(d.group_of(k), j);
        pre += a * d.value(k, j) * s;
        sabs += std::fabs(a) * (d.code_abs(k, j) + d.zero_abs(k, j)) * std::fabs(s);
        if (c.fmt == Fmt::u4 || c.fmt == Fmt::u4zp)
          oabs += std::fabs(a) * 32 * std::fabs(s);  // int4's 16 + q
      }
      const double b = c.bias != BiasKind::none ? d.bias[size_t(j)] : 0.0;
      pre += b;
      const double want = runtime::reference_activation(c.act, pre);
      const double tol = runtime::quant_brgemm_output_bound(c.act, c.out, c.kb, sabs, std::fabs(b),
                                                            pre, want, oabs);
      const double g = read_out(body, c.out, r * d.ldc + j);
      const double err = std::fabs(g - want);
      if (!std::isfinite(g) || !(err <= tol)) {
        if (bad++ < 5)
          msg += fmt::format("\n  C[{}, {}] = {}, reference {}, |err| {:.3g} > tol {:.3g}", r, j, g,
                             want, err, tol);
      }
    }
  // Nothing outside C[mr × nr] written.
  const int64_t touched = touched_outside_c(got, es, c.mr, d.ldc, c.nr, &msg);
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.str() << ": " << bad << " outputs out of bound, "
                                       << touched << " elements outside C written" << msg;
}

bool row_runs(Isa isa) {
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, isa);
  return row != nullptr && jit::row_runs_here(*row);
}

class QuantBrgemm : public ::testing::TestWithParam<QCase> {
 protected:
  void SetUp() override {
    if (!row_runs(GetParam().isa))
      GTEST_SKIP() << "the " << isa_name(GetParam().isa) << " brgemm row does not run here";
  }
};

TEST_P(QuantBrgemm, MatchesReference) {
  const QCase& c = GetParam();
  const jit::Kernel& k = jit::get(c.desc());
  const QData d = make_data(c);
  EXPECT_TRUE(check(d, run(d, k.entry<BrgemmFn>())));
}

// The shape lists, and case i of them (its group pattern and output cycle).
constexpr int kShapeNr[] = {1, 15, 16, 17, 33, 64};
constexpr int64_t kShapeKb[] = {1, 2, 3, 31, 64, 127, 256, 1000};
QCase shape_case(Isa isa, Fmt f, int mr, int nr, int64_t kb, int i) {
  const Groups pats[] = {Groups::constant, Groups::every16, Groups::every32, Groups::every64,
                         Groups::irregular};
  QCase c;
  c.group = "shape";
  c.isa = isa;
  c.fmt = f, c.mr = mr, c.nr = nr, c.kb = kb;
  c.groups = pats[i % 5];
  c.out = (i + 1) % 3 == 0 ? DType::bf16 : DType::f32;
  return c;
}

std::vector<QCase> shape_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx})
    for (int mr = 1; mr <= 4; ++mr)
      for (int nr : kShapeNr)
        for (int64_t kb : kShapeKb)
          v.push_back(shape_case(Isa::avx512, f, mr, nr, kb, int(v.size())));
  return v;
}

std::vector<QCase> epilogue_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx})
    for (BiasKind b : {BiasKind::none, BiasKind::f32, BiasKind::bf16})
      for (Activation a : testing_support::all_activations())
        for (DType o : {DType::f32, DType::bf16})
          for (int shape = 0; shape < 2; ++shape) {
            QCase c;
            c.group = "epi";
            c.fmt = f, c.bias = b, c.act = a, c.out = o;
            if (shape == 0)
              c.mr = 3, c.nr = 33, c.kb = 127, c.groups = Groups::irregular;
            else
              c.mr = 4, c.nr = 64, c.kb = 256, c.groups = Groups::every64;
            v.push_back(c);
          }
  return v;
}

std::vector<QCase> group_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx})
    for (Groups g :
         {Groups::constant, Groups::every16, Groups::every32, Groups::every64, Groups::irregular})
      for (int mr = 1; mr <= 4; ++mr) {
        QCase c;
        c.group = "groups";
        c.fmt = f, c.groups = g, c.mr = mr, c.nr = 64, c.kb = 1000;
        c.bias = BiasKind::f32;
        v.push_back(c);
      }
  return v;
}

std::vector<QCase> code_cases() {
  std::vector<QCase> v;
  for (int mr = 1; mr <= 4; ++mr)
    for (int64_t kb : {256, 257, 512})
      for (Groups g : {Groups::constant, Groups::every64}) {
        QCase c;
        c.group = "fp8all";
        c.fmt = Fmt::fp8, c.mr = mr, c.kb = kb, c.groups = g, c.codes = Codes::all_fp8;
        v.push_back(c);
      }
  for (Codes q : {Codes::min, Codes::max}) {
    QCase c;
    c.group = "fp8ext";
    c.fmt = Fmt::fp8, c.mr = 2, c.kb = 129, c.codes = q;
    v.push_back(c);
    for (int z : {0, 16}) {
      QCase u;
      u.group = "zeros";
      u.fmt = Fmt::u4zp, u.mr = 4, u.kb = 129, u.codes = q, u.zero = z;
      u.groups = Groups::irregular;
      v.push_back(u);
    }
    QCase s;
    s.group = "sym";
    s.fmt = Fmt::u4, s.mr = 3, s.kb = 130, s.codes = q;
    v.push_back(s);
  }
  return v;
}

// The llvm row's share (header): shape_ with nr and kb zipped, the rest whole.
std::vector<QCase> on_llvm(std::vector<QCase> v) {
  for (QCase& c : v) c.isa = Isa::llvm;
  return v;
}
std::vector<QCase> llvm_shape_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx})
    for (int mr = 1; mr <= 4; ++mr)
      for (int t = 0; t < 8; ++t)
        v.push_back(
            shape_case(Isa::llvm, f, mr, kShapeNr[(t + mr) % 6], kShapeKb[t], int(v.size())));
  return v;
}
// Activations far up the bf16 range (2^100, scales 2^-100: the outputs are
// ordinary numbers): no partial sum may overflow. (The LLVM u4 planes hold
// 256·q·a, so above |a| ~ 2^104 they overflow where a·q would not: at 2^112
// this case fails there; docs/quantized.md states the limit.)
// The vdpbf16ps arithmetic of the u4 kernel at mr <= 3 (u4_bf16_dot, what
// the planner picks on AMD), over the shapes, group patterns and epilogues
// the FMA form above is checked on: full blocks (the table-free path it
// changes) and tails (whose arithmetic it leaves as it was).
std::vector<QCase> dot_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::u4, Fmt::u4zp})
    for (int mr = 1; mr <= 4; ++mr)
      for (int nr : {33, 64})
        for (int64_t kb : kShapeKb) {
          QCase c = shape_case(Isa::avx512, f, mr, nr, kb, int(v.size()));
          c.group = "dot";
          c.dot = true;
          v.push_back(c);
        }
  for (QCase c : epilogue_cases())
    if (c.fmt == Fmt::u4 || c.fmt == Fmt::u4zp) {
      c.group = "dotepi";
      c.dot = true;
      c.mr = c.mr == 4 ? 2 : 1;
      v.push_back(c);
    }
  for (Groups g : {Groups::constant, Groups::every16, Groups::every32, Groups::irregular}) {
    QCase c;
    c.group = "dotgroups";
    c.fmt = Fmt::u4zp, c.groups = g, c.mr = 3, c.nr = 64, c.kb = 1000, c.dot = true;
    v.push_back(c);
  }
  return v;
}

std::vector<QCase> huge_x_cases() {
  std::vector<QCase> v;
  for (Isa isa : {Isa::avx512, Isa::llvm})
    for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx}) {
      QCase c;
      c.group = "hugex";
      c.isa = isa;
      c.fmt = f, c.mr = 2, c.kb = 1000, c.groups = Groups::every64, c.x_exp = 100;
      c.codes = Codes::max;
      v.push_back(c);
    }
  // MXFP4 exponent bytes 0 and 254 (header: e8m0ext_).
  for (Isa isa : {Isa::avx512, Isa::llvm})
    for (Groups g : {Groups::every32, Groups::irregular}) {
      QCase c;
      c.group = "e8m0ext";
      c.isa = isa;
      c.fmt = Fmt::mx, c.mr = g == Groups::every32 ? 2 : 4, c.nr = 33, c.kb = 1000, c.groups = g;
      c.ext_e = true;
      v.push_back(c);
    }
  return v;
}

std::vector<QCase> llvm_mxcsr_cases() {
  std::vector<QCase> v;
  for (Fmt f : {Fmt::fp8, Fmt::mx, Fmt::u4zp}) {
    QCase c;
    c.group = "mxcsr";
    c.isa = Isa::llvm;
    c.fmt = f, c.mr = 2, c.kb = 257, c.daz = true;
    c.codes = f == Fmt::fp8 ? Codes::all_fp8 : Codes::random;
    v.push_back(c);
  }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<QCase>& info) {
  return info.param.str();
}

INSTANTIATE_TEST_SUITE_P(Shape, QuantBrgemm, ::testing::ValuesIn(shape_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Epilogue, QuantBrgemm, ::testing::ValuesIn(epilogue_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Groups, QuantBrgemm, ::testing::ValuesIn(group_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(Codes, QuantBrgemm, ::testing::ValuesIn(code_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LlvmShape, QuantBrgemm, ::testing::ValuesIn(llvm_shape_cases()),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LlvmEpilogue, QuantBrgemm, ::testing::ValuesIn(on_llvm(epilogue_cases())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LlvmGroups, QuantBrgemm, ::testing::ValuesIn(on_llvm(group_cases())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(LlvmCodes, QuantBrgemm, ::testing::ValuesIn(on_llvm(code_cases())),
                         case_name);
INSTANTIATE_TEST_SUITE_P(Dot, QuantBrgemm, ::testing::ValuesIn(dot_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(HugeX, QuantBrgemm, ::testing::ValuesIn(huge_x_cases()), case_name);
INSTANTIATE_TEST_SUITE_P(LlvmMxcsr, QuantBrgemm, ::testing::ValuesIn(llvm_mxcsr_cases()),
                         case_name);

// A NaN in A row r makes row r NaN and no other.
TEST(QuantBrgemmNan, RowStaysInItsRow) {
  for (Isa isa : {Isa::avx512, Isa::llvm})
    for (Fmt f : {Fmt::u4, Fmt::u4zp, Fmt::fp8, Fmt::mx}) {
      if (!row_runs(isa)) continue;
      QCase c;
      c.group = "nan";
      c.isa = isa;
      c.fmt = f, c.mr = 4, c.nr = 64, c.kb = 100, c.groups = Groups::every32;
      QData d = make_data(c);
      uint16_t* a = const_cast<uint16_t*>(static_cast<const uint16_t*>(d.a_ptr));
      a[2 * d.lda + 41] = kNan;
      const std::vector<uint8_t> got = run(d, jit::get(c.desc()).entry<BrgemmFn>());
      const uint8_t* body = got.data() + kGuard * 4;
      for (int r = 0; r < c.mr; ++r)
        for (int j = 0; j < c.nr; ++j)
          EXPECT_EQ(std::isnan(read_out(body, DType::f32, r * d.ldc + j)), r == 2)
              << fmt_name(f) << " r " << r << " c " << j;
    }
}

// ---------------------------------------------------------------------------
// The registry's refusals: each an Error naming the field.

void expect_refused(const BrgemmDesc& d, const std::string& what) {
  try {
    jit::get(d);
    ADD_FAILURE() << d.key() << ": accepted; expected an Error naming " << what;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

TEST(QuantBrgemmErrors, RefusedDescriptorsNameTheField) {
  QCase base;
  base.fmt = Fmt::u4zp;
  const BrgemmDesc ok = base.desc();
  BrgemmDesc d = ok;
  d.mr = 5;
  expect_refused(d, "mr=5");
  d = ok, d.mr = 0;
  expect_refused(d, "mr=0");
  d = ok, d.nr = 65;
  expect_refused(d, "nr=65");
  d = ok, d.kb = 0;
  expect_refused(d, "kb=0");
  d = ok, d.accumulate = true;
  expect_refused(d, "acc_in=1");
  // A GLU block stores at most 32 outputs (gate/up pairs of the 64 columns;
  // its numerics are fused_experts' battery, tests/moe_quant_test.cpp).
  d = ok, d.glu = codegen::Glu::act_mul, d.nr = 33;
  expect_refused(d, "nr=33 with glu=and_mul");
  d = ok, d.a_packed = true;
  expect_refused(d, "apack=1");
  d = ok, d.b_row_bytes = 256;
  expect_refused(d, "b_row_bytes=256");
  d = ok, d.out = DType::i32;
  expect_refused(d, "out=i32");
  d = ok, d.a_type = DType::u8;
  expect_refused(d, "a=u8");
  d = ok, d.acc_type = DType::i32;
  expect_refused(d, "acc=i32");
  d = ok, d.isa = Isa::amx;
  expect_refused(d, "b=u4");
  // vdpbf16ps instead of FMAs is the Xbyak u4 kernel's choice only.
  QCase f8d;
  f8d.fmt = Fmt::fp8;
  d = f8d.desc(), d.u4_bf16_dot = true;
  expect_refused(d, "dot=1");
  if (row_runs(Isa::llvm)) {
    d = ok, d.isa = Isa::llvm, d.u4_bf16_dot = true;
    expect_refused(d, "dot=1");
  }
  QCase f8;
  f8.fmt = Fmt::fp8;
  d = f8.desc(), d.b_zeros = true;
  expect_refused(d, "zeros=1 with b=f8e4m3");
  // The llvm row takes the same descriptors and refuses the same ones.
  if (row_runs(Isa::llvm)) {
    d = ok, d.isa = Isa::llvm, d.mr = 5;
    expect_refused(d, "mr=5");
    d = ok, d.isa = Isa::llvm, d.b_row_bytes = 256;
    expect_refused(d, "b_row_bytes=256");
    d = f8.desc(), d.isa = Isa::llvm, d.b_zeros = true;
    expect_refused(d, "zeros=1 with b=f8e4m3");
  }
  BrgemmDesc bf;  // a bf16 kernel with zero points
  bf.b_zeros = true;
  expect_refused(bf, "zeros=1 with b=bf16");
}

TEST(QuantBrgemmErrors, NameSaysWhatItIs) {
  QCase c;
  c.fmt = Fmt::u4zp, c.mr = 1, c.nr = 64, c.kb = 4096, c.out = DType::bf16;
  EXPECT_EQ(c.desc().name(), "brgemm_avx512_bf16xu4_zp_f32acc_m1n64k4096_bf16out");
  c.fmt = Fmt::fp8, c.out = DType::f32;
  EXPECT_EQ(c.desc().name(), "brgemm_avx512_bf16xf8e4m3_f32acc_m1n64k4096_f32out");
  c.isa = Isa::llvm;
  EXPECT_EQ(c.desc().name(), "brgemm_llvm_bf16xf8e4m3_f32acc_m1n64k4096_f32out");
}

}  // namespace
}  // namespace tilejit::test
