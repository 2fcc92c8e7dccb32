// The quantized GEMMs' helper kernels, bit for bit against their scalar
// statement (runtime/reference_quant.h):
//   act_quant (Xbyak AVX-512 where the CPU has the avx512 path, LLVM where
//   built): every mode, tails, strided rows, NaN / Inf / huge / subnormal
//   rows, padding and nothing written past k_padded or read past a row;
//   dequant (Xbyak AVX-512): every fp8 code, every int4 byte with and
//   without zero points, group switches, huge / tiny / special scales.
// Inputs sit at the end of guarded buffers (a read past them faults).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codegen/quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/kernel.h"
#include "ops/quant_weight.h"
#include "runtime/reference_quant.h"
#include "test_util.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_act_quant.h"
#include "codegen/llvm/llvm_dequant.h"
#endif

namespace tilejit::test {
namespace {

using codegen::ActQuantArgs;
using codegen::ActQuantDesc;
using codegen::ActQuantFn;
using codegen::ActQuantMode;
using codegen::DequantArgs;
using codegen::DequantDesc;
using codegen::DequantFn;

bool xbyak_here() {
  return cpu_info().max_isa >= Isa::avx512;
}

#ifdef TILEJIT_HAVE_LLVM
bool llvm_here() {
  const CpuInfo info = cpu_info();
  return info.llvm_backend && info.avx2 && info.fma;
}
#endif

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---------------------------------------------------------------------------
// act_quant

struct AqKernel {
  std::string name;
  ActQuantFn fn = nullptr;
  std::shared_ptr<void> keepalive;
};

std::vector<AqKernel> act_quant_kernels(ActQuantMode mode) {
  std::vector<AqKernel> v;
  if (xbyak_here()) {
    std::shared_ptr<jit::Kernel> k = jit::make_xbyak_kernel(
        codegen::xbyak::emit_act_quant(ActQuantDesc{.isa = Isa::avx512, .mode = mode}));
    v.push_back({"xbyak", k->entry<ActQuantFn>(), k});
  }
#ifdef TILEJIT_HAVE_LLVM
  if (llvm_here()) {
    const ActQuantDesc d{.isa = Isa::llvm, .mode = mode};
    auto k = std::make_shared<codegen::llvm_backend::LlvmKernel>(
        codegen::llvm_backend::compile_llvm_act_quant(d));
    EXPECT_EQ(k->name, d.name());
    v.push_back({"llvm", k->fn<ActQuantFn>(), k});
  }
#endif
  return v;
}

enum class Pattern {
  random,
  zero,
  huge,
  nan,
  inf,
  neg_inf,
  negative,
  positive,
  subnormal,
  any_bits,
  wide,
  count
};

const char* pattern_name(Pattern p) {
  static const char* names[] = {"random",   "zero",     "huge",      "nan",      "inf", "neg_inf",
                                "negative", "positive", "subnormal", "any_bits", "wide"};
  return names[static_cast<int>(p)];
}

// One row of k bf16 values of pattern p.
std::vector<uint16_t> row_values(Pattern p, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint16_t> v(static_cast<size_t>(k));
  std::uniform_real_distribution<float> u(-3, 3);
  for (auto& e : v) e = runtime::f32_to_bf16(u(rng));
  const size_t at = static_cast<size_t>(rng() % static_cast<uint32_t>(k));
  switch (p) {
    case Pattern::random:
    case Pattern::count:
      break;
    case Pattern::zero:
      for (auto& e : v) e = (rng() & 1) ? 0x8000 : 0;
      break;
    case Pattern::huge:
      v[at] = (rng() & 1) ? 0x7F7F : 0xFF7F;  // ±max finite
      break;
    case Pattern::nan:
      v[at] = (rng() & 1) ? 0x7FC0 : 0xFF81;
      break;
    case Pattern::inf:
      v[at] = 0x7F80;
      break;
    case Pattern::neg_inf:
      v[at] = 0xFF80;
      break;
    case Pattern::negative: {
      std::uniform_real_distribution<float> n(-5, -0.1f);
      for (auto& e : v) e = runtime::f32_to_bf16(n(rng));
      break;
    }
    case Pattern::positive: {
      std::uniform_real_distribution<float> n(0.1f, 5);
      for (auto& e : v) e = runtime::f32_to_bf16(n(rng));
      break;
    }
    case Pattern::subnormal:  // max |x| subnormal: 127 / a overflows to Inf
      for (auto& e : v) e = static_cast<uint16_t>((rng() % 0x80) | ((rng() & 1) << 15));
      break;
    case Pattern::any_bits:  // every finite bf16 (NaN / Inf may appear)
      for (auto& e : v) e = static_cast<uint16_t>(rng());
      break;
    case Pattern::wide:  // finite, every exponent
      for (auto& e : v) {
        e = static_cast<uint16_t>(rng());
        if ((e & 0x7F80) == 0x7F80) e &= 0xBFFF;
      }
      break;
  }
  return v;
}

struct AqCase {
  int64_t rows, k, k_padded, ldx, ld_out;
  Pattern pattern;
  float inv_scale, fixed_scale;
  int32_t fixed_zero;
};

constexpr uint8_t kGuard = 0xA5;

void run_act_quant(const AqKernel& kern, ActQuantMode mode, const AqCase& c) {
  SCOPED_TRACE(kern.name + " " + codegen::act_quant_mode_name(mode) +
               " rows=" + std::to_string(c.rows) + " k=" + std::to_string(c.k) +
               " k_padded=" + std::to_string(c.k_padded) + " pattern=" + pattern_name(c.pattern));
  // x: the last row ends at the guard page.
  const int64_t x_elems = (c.rows - 1) * c.ldx + c.k;
  GuardedBuffer xbuf(static_cast<size_t>(x_elems) * 2);
  uint16_t* x = xbuf.as<uint16_t>();
  for (int64_t i = 0; i < x_elems; ++i) x[i] = 0x7FC1;  // NaN between rows: must not be read
  for (int64_t r = 0; r < c.rows; ++r) {
    // Rows cycle through the patterns, starting at the case's.
    const auto p =
        static_cast<Pattern>((static_cast<int>(c.pattern) + r) % static_cast<int>(Pattern::count));
    const std::vector<uint16_t> v =
        row_values(c.rows == 1 ? c.pattern : p, c.k,
                   seed_of({c.k, r, static_cast<int64_t>(c.pattern), static_cast<int64_t>(mode)}));
    std::memcpy(x + r * c.ldx, v.data(), v.size() * 2);
  }
  const size_t out_bytes = static_cast<size_t>(c.rows * c.ld_out);
  GuardedBuffer obuf(out_bytes);
  uint8_t* out = obuf.as<uint8_t>();
  std::memset(out, kGuard, out_bytes);
  std::vector<float> scale(static_cast<size_t>(c.rows + 1), -7.0f);
  std::vector<int32_t> zero(static_cast<size_t>(c.rows + 1), -7);

  ActQuantArgs a{};
  a.x = x;
  a.ldx = c.ldx;
  a.rows = c.rows;
  a.k = c.k;
  a.k_padded = c.k_padded;
  a.out = out;
  a.ld_out = c.ld_out;
  a.scale = scale.data();
  a.zero = zero.data();
  a.inv_scale = c.inv_scale;
  a.fixed_scale = c.fixed_scale;
  a.fixed_zero = c.fixed_zero;
  kern.fn(&a);

  std::vector<uint8_t> want(static_cast<size_t>(c.k_padded));
  for (int64_t r = 0; r < c.rows; ++r) {
    float ws = 0;
    int32_t wz = 0;
    runtime::reference_act_quant_row(ops::act_quant_rule(mode), x + r * c.ldx, c.k, c.k_padded,
                                     c.inv_scale, c.fixed_scale, c.fixed_zero, want.data(), &ws,
                                     &wz);
    const uint8_t* got = out + r * c.ld_out;
    EXPECT_EQ(bits(scale[r]), bits(ws)) << "row " << r << " scale " << scale[r] << " want " << ws;
    EXPECT_EQ(zero[r], wz) << "row " << r;
    int bad = 0;
    for (int64_t j = 0; j < c.k_padded && bad < 5; ++j)
      if (got[j] != want[j]) {
        ++bad;
        ADD_FAILURE() << "row " << r << " q[" << j << "] = " << int(got[j]) << ", want "
                      << int(want[j]) << " (x bits 0x" << std::hex
                      << (j < c.k ? x[r * c.ldx + j] : 0) << std::dec << ")";
      }
    for (int64_t j = c.k_padded; j < c.ld_out; ++j)
      ASSERT_EQ(got[j], kGuard) << "row " << r << " byte " << j << " past k_padded written";
  }
  EXPECT_EQ(scale[c.rows], -7.0f) << "scale written past rows";
  EXPECT_EQ(zero[c.rows], -7) << "zero written past rows";
}

class ActQuantKernels : public ::testing::TestWithParam<ActQuantMode> {};

TEST_P(ActQuantKernels, MatchReferenceBitForBit) {
  const ActQuantMode mode = GetParam();
  const std::vector<AqKernel> kernels = act_quant_kernels(mode);
  if (kernels.empty()) GTEST_SKIP() << "neither the Xbyak avx512 path nor the LLVM backend here";
  for (const AqKernel& kern : kernels)
    for (int64_t k : {1, 3, 15, 16, 17, 31, 32, 33, 100, 4096 + 7})
      for (int64_t rows : {1, 5})
        for (int p = 0; p < static_cast<int>(Pattern::count); ++p) {
          const int64_t kp =
              (k + 3) / 4 * 4 + (p % 3 == 1 ? 8 : 0);  // sometimes past the VNNI group
          AqCase c{};
          c.rows = rows;
          c.k = k;
          c.k_padded = kp;
          c.ldx = k + 5 + p;
          c.ld_out = kp + 3;
          c.pattern = static_cast<Pattern>(p);
          c.fixed_scale = 0.01f * static_cast<float>(1 + (k + p) % 7);
          c.inv_scale = 1.0f / c.fixed_scale;
          c.fixed_zero = static_cast<int32_t>((k * 37 + p * 101) % 256);
          run_act_quant(kern, mode, c);
          if (HasFatalFailure()) return;
        }
}

TEST_P(ActQuantKernels, ZeroRowsWriteNothing) {
  const ActQuantMode mode = GetParam();
  for (const AqKernel& kern : act_quant_kernels(mode)) {
    uint16_t x[4] = {0x3F80, 0x3F80, 0x3F80, 0x3F80};
    uint8_t out[8];
    std::memset(out, kGuard, sizeof out);
    float scale = -7;
    int32_t zero = -7;
    ActQuantArgs a{x, 4, 0, 4, 4, out, 8, &scale, &zero, 1, 1, 0};
    kern.fn(&a);
    for (uint8_t b : out) EXPECT_EQ(b, kGuard) << kern.name;
    EXPECT_EQ(scale, -7) << kern.name;
    EXPECT_EQ(zero, -7) << kern.name;
  }
}

// A row whose range is tiny (max |x| below 127 / FLT_MAX ~ 3.7e-37, bf16
// subnormals included) is quantized within half a step like any other: its
// inverse step used to overflow to Inf, so 0 · Inf made every zero of the row
// a NaN code, i.e. -127 (a result of the wrong sign, ~100x too large). Each
// x must come back as (q - zero) · s within s / 2 (plus the rounding of
// x · inv), in the reference and in every kernel.
TEST_P(ActQuantKernels, TinyRangesStayWithinHalfAStep) {
  const ActQuantMode mode = GetParam();
  if (mode == ActQuantMode::fixed) GTEST_SKIP() << "the caller gives the step";
  const int64_t k = 37;
  for (float a : {1e-38f, 1e-37f, 0x1p-126f, 3e-37f, 4e-37f, 9.2e-41f, 1e-30f}) {
    std::vector<uint16_t> x(static_cast<size_t>(k), 0);
    x[0] = runtime::f32_to_bf16(a);
    x[3] = runtime::f32_to_bf16(-a / 2);
    x[5] = runtime::f32_to_bf16(a / 4);
    x[9] = 0x8000;  // -0
    auto check = [&](const std::string& who, const uint8_t* q, float s, int32_t z) {
      SCOPED_TRACE(who + " a=" + fmt::format("{:g}", a));
      ASSERT_TRUE(std::isfinite(s) && s > 0) << s;
      for (int64_t j = 0; j < k; ++j) {
        const double v = runtime::bf16_to_f32(x[size_t(j)]);
        const double back = double(int32_t(q[j]) - z) * s;
        EXPECT_LE(std::fabs(back - v), 0.5 * s * (1 + 1e-6))
            << "x[" << j << "] = " << v << " came back as " << back;
      }
    };
    std::vector<uint8_t> want(static_cast<size_t>(k + 3));
    float ws = 0;
    int32_t wz = 0;
    runtime::reference_act_quant_row(ops::act_quant_rule(mode), x.data(), k, k + 3, 1, 1, 0,
                                     want.data(), &ws, &wz);
    check("reference", want.data(), ws, wz);
    for (const AqKernel& kern : act_quant_kernels(mode)) {
      std::vector<uint8_t> out(static_cast<size_t>(k + 3), kGuard);
      float scale = -7;
      int32_t zero = -7;
      ActQuantArgs args{x.data(), k, 1, k, k + 3, out.data(), k + 3, &scale, &zero, 1, 1, 0};
      kern.fn(&args);
      check(kern.name, out.data(), scale, zero);
      EXPECT_EQ(out, want) << kern.name;
      EXPECT_EQ(bits(scale), bits(ws)) << kern.name;
    }
  }
}

// The codes round to nearest even whatever rounding mode the caller left in
// MXCSR: in round-down mode x = 2.875 · s became code 2 instead of 3, which
// moved a W8A8 result (sum over K) by far more than its stated s / 2 bound.
TEST_P(ActQuantKernels, CodesIgnoreTheCallersRoundingMode) {
  const ActQuantMode mode = GetParam();
  const int64_t k = 200;
  std::vector<uint16_t> x = row_values(Pattern::random, k, 77);
  x[0] = runtime::f32_to_bf16(127.0f);  // sym: s = 1, so x = 2.875 is 2.875 steps
  for (int64_t j = 1; j < 40; ++j) x[size_t(j)] = runtime::f32_to_bf16(j % 2 ? 2.875f : -2.5f);
  std::vector<uint8_t> want(static_cast<size_t>(k));
  float ws = 0;
  int32_t wz = 0;
  runtime::reference_act_quant_row(ops::act_quant_rule(mode), x.data(), k, k, 1.0f, 1.0f, 128,
                                   want.data(), &ws, &wz);
  const int saved = std::fegetround();
  for (int rounding : {FE_DOWNWARD, FE_UPWARD, FE_TOWARDZERO}) {
    ASSERT_EQ(std::fesetround(rounding), 0);
    std::vector<uint8_t> ref(static_cast<size_t>(k));
    float rs = 0;
    int32_t rz = 0;
    runtime::reference_act_quant_row(ops::act_quant_rule(mode), x.data(), k, k, 1.0f, 1.0f, 128,
                                     ref.data(), &rs, &rz);
    std::vector<std::pair<std::string, std::vector<uint8_t>>> got = {{"reference", ref}};
    for (const AqKernel& kern : act_quant_kernels(mode)) {
      std::vector<uint8_t> out(static_cast<size_t>(k));
      float scale = 0;
      int32_t zero = 0;
      ActQuantArgs args{x.data(), k, 1, k, k, out.data(), k, &scale, &zero, 1.0f, 1.0f, 128};
      kern.fn(&args);
      got.emplace_back(kern.name, out);
      EXPECT_EQ(zero, wz) << kern.name << " rounding mode " << rounding;
    }
    std::fesetround(saved);
    for (const auto& [who, q] : got) EXPECT_EQ(q, want) << who << " rounding mode " << rounding;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ActQuantKernels,
                         ::testing::Values(ActQuantMode::sym, ActQuantMode::asym,
                                           ActQuantMode::fixed),
                         [](const auto& p) {
                           return std::string(codegen::act_quant_mode_name(p.param));
                         });

// ---------------------------------------------------------------------------
// dequant

struct DqKernel {
  std::string name;
  std::function<std::shared_ptr<jit::Kernel>(const DequantDesc&)> make;
};

std::vector<DqKernel> dequant_kernels() {
  std::vector<DqKernel> v;
  if (xbyak_here())
    v.push_back({"xbyak", [](const DequantDesc& d) {
                   return std::shared_ptr<jit::Kernel>(
                       jit::make_xbyak_kernel(codegen::xbyak::emit_dequant(d)));
                 }});
  return v;
}

enum class Scales { normal, huge, tiny, special };

const char* scales_name(Scales s) {
  static const char* names[] = {"normal", "huge", "tiny", "special"};
  return names[static_cast<int>(s)];
}

float scale_value(Scales kind, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(0, 1);
  const float sign = (rng() & 1) ? -1.0f : 1.0f;
  switch (kind) {
    case Scales::normal:
      return sign * std::ldexp(1.0f + u(rng), static_cast<int>(rng() % 20) - 12);
    case Scales::huge:  // products overflow to ±Inf
      return sign * std::ldexp(1.0f + u(rng), 120 + static_cast<int>(rng() % 8));
    case Scales::tiny:  // subnormal products (and subnormal scales)
      return sign * std::ldexp(1.0f + u(rng), -150 + static_cast<int>(rng() % 40));
    case Scales::special: {
      const float v[] = {0.0f,
                         -0.0f,
                         std::numeric_limits<float>::infinity(),
                         -std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::denorm_min(),
                         std::numeric_limits<float>::max(),
                         1.0f,
                         0.5f};
      return v[rng() % (sizeof v / sizeof v[0])];
    }
  }
  return 1;
}

struct DqCase {
  DType code;
  bool zeros;
  int64_t rows;
  int64_t groups;  // scale rows G
  Scales scales;
};

void run_dequant(const DqKernel& kern, const DqCase& c) {
  const bool fp8 = c.code == DType::f8e4m3;
  SCOPED_TRACE(kern.name + (fp8 ? " fp8" : " u4") + (c.zeros ? "_zp" : "") +
               " rows=" + std::to_string(c.rows) + " G=" + std::to_string(c.groups) +
               " scales=" + scales_name(c.scales));
  const uint32_t seed = seed_of({c.rows, c.groups, static_cast<int64_t>(c.scales), c.zeros, fp8});
  std::mt19937 rng(seed);
  const int64_t row_bytes = fp8 ? 128 : 64;
  // The 254 non-NaN e4m3 codes (every one within two rows), or every int4 byte.
  std::vector<uint8_t> codes_v(static_cast<size_t>(std::max<int64_t>(c.rows, 1) * row_bytes));
  for (size_t i = 0; i < codes_v.size(); ++i) {
    if (fp8) {
      const int n = static_cast<int>((i + seed % 7) % 254);  // skip 0x7F and 0xFF
      codes_v[i] = static_cast<uint8_t>(n < 127 ? n : n + 1);
    } else {
      codes_v[i] = static_cast<uint8_t>((i * 97 + seed) % 256);
    }
  }
  GuardedBuffer codes(codes_v.size());
  std::memcpy(codes.data(), codes_v.data(), codes_v.size());
  GuardedBuffer groups_buf(static_cast<size_t>(std::max<int64_t>(c.rows, 1)) * 4);
  int32_t* groups = groups_buf.as<int32_t>();
  for (int64_t r = 0; r < c.rows; ++r)  // runs of equal groups, and jumps back
    groups[r] = static_cast<int32_t>(r % 3 == 0 ? rng() % c.groups : (r / 3) % c.groups);
  GuardedBuffer scales_buf(static_cast<size_t>(c.groups * 64) * 4);
  float* scales = scales_buf.as<float>();
  for (int64_t i = 0; i < c.groups * 64; ++i) scales[i] = scale_value(c.scales, rng);
  GuardedBuffer zeros_buf(static_cast<size_t>(c.groups * 64));
  uint8_t* zeros = zeros_buf.as<uint8_t>();
  for (int64_t i = 0; i < c.groups * 64; ++i) zeros[i] = static_cast<uint8_t>(rng() % 17);

  const size_t out_words = static_cast<size_t>(c.rows * 128);
  std::vector<uint16_t> out(out_words + 64, 0xDEAD);

  const std::shared_ptr<jit::Kernel> k = kern.make(DequantDesc{
      .isa = kern.name == "xbyak" ? Isa::avx512 : Isa::llvm, .code = c.code, .zeros = c.zeros});
  DequantArgs a{};
  a.codes = codes.as<uint8_t>();
  a.groups = groups;
  a.scales = scales;
  a.zeros = c.zeros ? zeros : nullptr;
  a.out = out.data();
  a.rows = c.rows;
  k->entry<DequantFn>()(&a);

  uint16_t want[128];
  for (int64_t r = 0; r < c.rows; ++r) {
    const int64_t g = groups[r];
    runtime::reference_dequant_row(fp8, codes.as<uint8_t>() + r * row_bytes, scales + g * 64,
                                   c.zeros ? zeros + g * 64 : nullptr, want);
    int bad = 0;
    for (int i = 0; i < 128 && bad < 5; ++i)
      if (out[static_cast<size_t>(r * 128 + i)] != want[i]) {
        ++bad;
        const uint8_t code = codes.as<uint8_t>()[r * row_bytes + (fp8 ? i : i / 2)];
        ADD_FAILURE() << "row " << r << " (group " << g << ") col " << i / 2 << " parity " << i % 2
                      << ": got 0x" << std::hex << out[static_cast<size_t>(r * 128 + i)]
                      << ", want 0x" << want[i] << " (code 0x" << int(code) << ", scale bits 0x"
                      << bits(scales[g * 64 + i / 2]) << ")" << std::dec;
      }
  }
  for (size_t i = out_words; i < out.size(); ++i)
    ASSERT_EQ(out[i], 0xDEAD) << "written past rows at word " << i;
}

TEST(DequantKernels, MatchReferenceBitForBit) {
  const std::vector<DqKernel> kernels = dequant_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no Xbyak avx512 path here";
  for (const DqKernel& kern : kernels)
    for (const auto& [code, zp] :
         {std::pair{DType::f8e4m3, false}, std::pair{DType::u4, false}, std::pair{DType::u4, true}})
      for (int64_t rows : {0, 1, 2, 37})
        for (int64_t groups : {1, 3})
          for (Scales s : {Scales::normal, Scales::huge, Scales::tiny, Scales::special}) {
            run_dequant(kern, DqCase{code, zp, rows, groups, s});
            if (HasFatalFailure()) return;
          }
}

// The W4A8 chunk (DequantDesc::out = i8; Xbyak for the avx512 / amx paths,
// LLVM for llvm): q − z as s8 in the int8 k-quad layout, the missing row of
// an odd count 0, the column sums; nothing written past ⌈rows/2⌉ quad rows;
// comp null writes no sums. Zero points up to 16 (GPTQ's old format stores
// z − 1), so q − z spans all of [−16, 15].
TEST(DequantKernels, W4A8ChunkExact) {
  struct I8Kernel {
    const char* name;
    std::function<DequantFn(const DequantDesc&, std::shared_ptr<void>*)> make;
  };
  std::vector<I8Kernel> kernels;
  if (xbyak_here())
    kernels.push_back({"xbyak", [](const DequantDesc& d, std::shared_ptr<void>* keep) {
                         std::shared_ptr<jit::Kernel> k =
                             jit::make_xbyak_kernel(codegen::xbyak::emit_dequant(d));
                         *keep = k;
                         return k->entry<DequantFn>();
                       }});
#ifdef TILEJIT_HAVE_LLVM
  if (llvm_here())
    kernels.push_back({"llvm", [](DequantDesc d, std::shared_ptr<void>* keep) {
                         d.isa = Isa::llvm;
                         auto k = std::make_shared<codegen::llvm_backend::LlvmKernel>(
                             codegen::llvm_backend::compile_llvm_dequant(d));
                         *keep = k;
                         return k->fn<DequantFn>();
                       }});
#endif
  if (kernels.empty()) GTEST_SKIP() << "no JIT path here";
  for (const I8Kernel& kern : kernels)
    for (bool zp : {false, true}) {
      const DequantDesc d{.isa = Isa::avx512, .code = DType::u4, .zeros = zp, .out = DType::i8};
      std::shared_ptr<void> keep;
      const DequantFn fn = kern.make(d, &keep);
      for (int64_t rows : {0, 1, 2, 3, 37}) {
        for (bool with_comp : {true, false}) {
          SCOPED_TRACE(fmt::format("{} zp={} rows={} comp={}", kern.name, zp, rows, with_comp));
          std::mt19937 rng(seed_of({rows, zp, with_comp}));
          const int64_t G = 3;
          GuardedBuffer codes(static_cast<size_t>(std::max<int64_t>(rows, 1) * 64));
          for (int64_t i = 0; i < rows * 64; ++i) codes.as<uint8_t>()[i] = uint8_t(rng());
          GuardedBuffer groups_buf(static_cast<size_t>(std::max<int64_t>(rows, 1)) * 4);
          int32_t* groups = groups_buf.as<int32_t>();
          for (int64_t r = 0; r < rows; ++r) groups[r] = int32_t(rng() % G);
          GuardedBuffer zeros_buf(static_cast<size_t>(G * 64));
          for (int64_t i = 0; i < G * 64; ++i) zeros_buf.as<uint8_t>()[i] = uint8_t(rng() % 17);
          const int64_t quads = (rows + 1) / 2;
          std::vector<uint8_t> out(static_cast<size_t>(quads * 256 + 64), 0xA5);
          std::vector<int32_t> comp(64, 0x5A5A5A5A);
          DequantArgs a{};
          a.codes = codes.as<uint8_t>();
          a.groups = groups;
          a.zeros = zp ? zeros_buf.as<uint8_t>() : nullptr;
          a.out = out.data();
          a.rows = rows;
          a.comp = with_comp ? comp.data() : nullptr;
          fn(&a);
          int bad = 0;
          for (int64_t c = 0; c < 64; ++c) {
            int32_t sum = 0;
            for (int64_t r = 0; r < 2 * quads; ++r)
              for (int p = 0; p < 2; ++p) {
                int want = 0;
                if (r < rows) {
                  const int q = (codes.as<uint8_t>()[r * 64 + c] >> (4 * p)) & 0xF;
                  const int z = zp ? zeros_buf.as<uint8_t>()[groups[r] * 64 + c] : 8;
                  want = q - z;
                }
                sum += want;
                const auto got =
                    static_cast<int8_t>(out[size_t((r / 2) * 256 + 4 * c + 2 * (r % 2) + p)]);
                if (got != want && bad++ < 5)
                  ADD_FAILURE() << "row " << r << " col " << c << " parity " << p << ": got "
                                << int(got) << ", want " << want;
              }
            const int32_t want_comp = with_comp ? sum : 0x5A5A5A5A;
            if (comp[size_t(c)] != want_comp && bad++ < 5)
              ADD_FAILURE() << "comp[" << c << "] = " << comp[size_t(c)] << ", want " << want_comp;
          }
          for (size_t i = size_t(quads * 256); i < out.size(); ++i)
            ASSERT_EQ(out[i], 0xA5) << "written past the quad rows at byte " << i;
        }
      }
    }
}

}  // namespace
}  // namespace tilejit::test
