// The dequantization kernels of the weight-quantized GEMMs (codegen/quant_desc.h:
// DequantDesc / DequantArgs) bit for bit against runtime::reference_dequant_row
// (runtime/reference_quant.h), for every kernel maker of this build (the
// table below: the Xbyak AVX-512 kernel, skipped on a CPU without it, and the
// LLVM kernel where LLVM is built): fp8 e4m3, every one of the 254 non-NaN codes in every one of
// the 128 positions of a row; int4, every nibble value in both halves of every column, with the
// default zero point 8 and with zero points 0..16 (GPTQ v1 can give 16); MXFP4 (e2m1), every
// nibble value in both halves of every column under every e8m0 scale 2^(e − 127), e = 0..254
// (e = 0 and 1 give f32 subnormal products), the scales passed as the raw exponent bytes
// u8 [G][64] through the `const float*` DequantArgs::scales; fp8 and int4 under f32 scales
// normal, zero, subnormal, huge (products overflowing to Inf), Inf and NaN (a NaN result stays
// NaN, with the reference's bits); rows 0, 1, 2, 37, 254; groups changing every row, constant,
// monotone.
//
// No tolerance: the contract is exact f32 arithmetic (one multiply, RNE) and
// bf16 round-to-nearest-even, so every output must equal the reference's
// (MXFP4: bf16(e2m1 value · 2^(e − 127)), computed here from the bytes).
// Traps: codes, groups, scales and zeros end at a PROT_NONE page (reading
// past them faults); out lies between sentinel zones (a store past the rows
// fails).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <algorithm>
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
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_quant.h"
#include "test_util.h"

#if TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_dequant.h"
#include "codegen/llvm/llvm_jit.h"
#endif

namespace tilejit::test {
namespace {

using codegen::DequantArgs;
using codegen::DequantDesc;
using codegen::DequantFn;

// ---------------------------------------------------------------------------
// The kernel makers: one row per emitter. `unavailable` says why this
// machine or build cannot run it ("" when it can); `make` compiles one.

struct DequantKernel {
  DequantFn fn = nullptr;
  std::shared_ptr<void> keepalive;  // owns the code
};

struct DequantMaker {
  std::string name;
  Isa isa;  // DequantDesc::isa of its kernels
  std::function<std::string()> unavailable;
  std::function<DequantKernel(const DequantDesc&)> make;
};

std::vector<DequantMaker> makers() {
  std::vector<DequantMaker> v;
  // The Xbyak AVX-512 kernel (the avx512 and amx rows): AVX512-BF16.
  v.push_back({"xbyak", Isa::avx512,
               [] {
                 const CpuInfo info = cpu_info();
                 return info.max_isa >= Isa::avx512 && info.avx512_bf16
                            ? std::string()
                            : std::string("no AVX-512 with BF16 on this CPU / OS");
               },
               [](const DequantDesc& d) {
                 std::shared_ptr<jit::Kernel> k =
                     jit::make_xbyak_kernel(codegen::xbyak::emit_dequant(d));
                 return DequantKernel{k->entry<DequantFn>(), k};
               }});
#if TILEJIT_HAVE_LLVM
  namespace lb = codegen::llvm_backend;
  v.push_back({"llvm", Isa::llvm,
               [] {
                 try {
                   lb::require_vector_host("dequant_kernel_test");
                 } catch (const Error& e) {
                   return std::string(e.what());
                 }
                 return std::string();
               },
               [](const DequantDesc& d) {
                 auto k = std::make_shared<lb::LlvmKernel>(lb::compile_llvm_dequant(d));
                 return DequantKernel{k->fn<DequantFn>(), k};
               }});
#endif
  return v;
}

std::vector<std::string> maker_names() {
  std::vector<std::string> v;
  for (const DequantMaker& m : makers()) v.push_back(m.name);
  return v;
}

const DequantMaker& maker(const std::string& name) {
  static const std::vector<DequantMaker> all = makers();
  for (const DequantMaker& m : all)
    if (m.name == name) return m;
  throw Error("no dequant kernel maker " + name);
}

// ---------------------------------------------------------------------------
// One call's inputs, run and check.

struct DequantCase {
  std::string what;
  DType code = DType::f8e4m3;
  bool zeros = false;
  int64_t rows = 0;
  int64_t groups = 1;              // G: scale rows
  std::vector<uint8_t> codes;      // [rows][128 or 64]
  std::vector<int32_t> group;      // [rows]
  std::vector<float> scales;       // [G][64] (fp8, u4)
  std::vector<uint8_t> e8m0;       // [G][64] (f4e2m1): exponent bytes, scale 2^(e − 127)
  std::vector<uint8_t> zero_rows;  // [G][64] (zeros only)

  DequantDesc desc(Isa isa) const {
    DequantDesc d;
    d.isa = isa;
    d.code = code;
    d.zeros = zeros;
    return d;
  }
  int64_t row_bytes() const { return code == DType::f8e4m3 ? 128 : 64; }
  // Every product code value · scale normal or zero (what DequantDesc::
  // normal_products requires). f4e2m1: |v| >= 0.5 for v != 0, so 2^(e − 127)
  // keeps every product normal iff e >= 2.
  bool normal_products_only() const {
    if (code != DType::f4e2m1) return true;  // fp8 / u4: the tame scale kinds
    for (uint8_t e : e8m0)
      if (e < 2) return false;
    return true;
  }
};

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The e8m0 scale 2^(e − 127) as f32 from its bits: e = 0 is the subnormal
// 0x00400000 (e = 255, NaN, never occurs: packing refuses it).
float e8m0_f32(uint8_t e) {
  return bits_f32(e == 0 ? 0x00400000u : uint32_t(e) << 23);
}

constexpr int64_t kGuard = 128;  // sentinel elements before and after out
constexpr uint16_t kSentinel = 0x7fa5;

// A guarded copy of `v` (the last byte just below a PROT_NONE page); null for none.
template <class T>
const T* guarded(std::vector<std::unique_ptr<GuardedBuffer>>& bufs, const std::vector<T>& v) {
  if (v.empty()) return nullptr;
  bufs.push_back(std::make_unique<GuardedBuffer>(v.size() * sizeof(T)));
  std::memcpy(bufs.back()->data(), v.data(), v.size() * sizeof(T));
  return bufs.back()->as<T>();
}

::testing::AssertionResult run_and_check(const DequantKernel& k, const DequantCase& c) {
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::vector<uint16_t> out(size_t(c.rows * 128 + 2 * kGuard), kSentinel);
  DequantArgs args{};
  args.codes = guarded(bufs, c.codes);
  args.groups = guarded(bufs, c.group);
  args.scales = c.code == DType::f4e2m1 ? reinterpret_cast<const float*>(guarded(bufs, c.e8m0))
                                        : guarded(bufs, c.scales);
  args.zeros = c.zeros ? guarded(bufs, c.zero_rows) : nullptr;
  args.out = out.data() + kGuard;
  args.rows = c.rows;
  k.fn(&args);

  int64_t bad = 0;
  std::string msg;
  std::vector<uint16_t> want(128);
  for (int64_t r = 0; r < c.rows; ++r) {
    const int32_t g = c.group[size_t(r)];
    if (c.code == DType::f4e2m1) {
      // bf16(e2m1 value · 2^(e − 127)): the f32 product (exact or a rounded
      // subnormal), rounded to bf16.
      for (int i = 0; i < 128; ++i) {
        const int col = i / 2;
        const uint8_t nib = uint8_t((c.codes[size_t(r * 64 + col)] >> (4 * (i % 2))) & 0xF);
        want[size_t(i)] =
            f32_to_bf16(runtime::e2m1_to_f32(nib) * e8m0_f32(c.e8m0[size_t(g * 64 + col)]));
      }
    } else {
      runtime::reference_dequant_row(c.code, &c.codes[size_t(r * c.row_bytes())],
                                     &c.scales[size_t(g * 64)],
                                     c.zeros ? &c.zero_rows[size_t(g * 64)] : nullptr, want.data());
    }
    for (int i = 0; i < 128; ++i) {
      const uint16_t got = out[size_t(kGuard + r * 128 + i)];
      if (got != want[size_t(i)] && bad++ < 8) {
        const int col = i / 2, p = i % 2;
        const uint8_t byte =
            c.code == DType::f8e4m3 ? c.codes[size_t(r * 128 + i)] : c.codes[size_t(r * 64 + col)];
        msg += fmt::format(
            "\n  row {} column {} parity {}: code byte 0x{:02x}, group {}, scale {}{}: got "
            "0x{:04x}, reference 0x{:04x}",
            r, col, p, byte, g,
            c.code == DType::f4e2m1
                ? fmt::format("{:a} (e8m0 {})", e8m0_f32(c.e8m0[size_t(g * 64 + col)]),
                              c.e8m0[size_t(g * 64 + col)])
                : fmt::format("{:a}", c.scales[size_t(g * 64 + col)]),
            c.zeros ? fmt::format(", zero {}", c.zero_rows[size_t(g * 64 + col)]) : "", got,
            want[size_t(i)]);
      }
    }
  }
  int64_t touched = 0;
  for (size_t e = 0; e < out.size(); ++e) {
    const int64_t idx = int64_t(e) - kGuard;
    if ((idx < 0 || idx >= c.rows * 128) && out[e] != kSentinel && touched++ < 4)
      msg += fmt::format("\n  out[{}] written (rows {})", idx, c.rows);
  }
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << c.what << ": " << bad << " of " << c.rows * 128 << " outputs differ, " << touched
         << " elements outside out written" << msg;
}

// ---------------------------------------------------------------------------
// Inputs.

// A scale of one of the kinds the contract must survive, chosen by `kind`.
float scale_of(std::mt19937& rng, int kind) {
  std::uniform_real_distribution<float> u(0.5f, 2.0f);
  const float sign = rng() % 2 ? -1.0f : 1.0f;
  switch (kind % 12) {
    case 0:
      return sign * std::ldexp(u(rng), -130);  // subnormal: products subnormal or zero
    case 1:
      return sign * std::ldexp(u(rng), -120);  // products around the subnormal boundary
    case 2:
      return sign * std::ldexp(u(rng), 120);  // 448 · s overflows; bf16 rounding to Inf
    case 3:
      return sign * std::numeric_limits<float>::max();
    case 4:
      return sign * std::numeric_limits<float>::infinity();
    case 5:
      return kind % 24 < 12 ? bits_f32(0x7fc00000u) : bits_f32(0xffc01234u);  // NaN, payload
    case 6:
      return kind % 24 < 12 ? 0.0f : -0.0f;
    case 7:
      return bits_f32(0x00000001u);  // the smallest subnormal
    default:
      return sign * std::ldexp(u(rng), int(rng() % 20) - 10);  // ordinary
  }
}

enum class Groups { every_row, constant, monotone };

void fill_groups(DequantCase& c, Groups how, std::mt19937& rng) {
  c.group.resize(size_t(c.rows));
  for (int64_t r = 0; r < c.rows; ++r) {
    switch (how) {
      case Groups::every_row:
        c.group[size_t(r)] = int32_t(rng() % uint32_t(c.groups));
        break;
      case Groups::constant:
        c.group[size_t(r)] = int32_t(c.groups - 1);
        break;
      case Groups::monotone:
        c.group[size_t(r)] = int32_t(r * c.groups / std::max<int64_t>(c.rows, 1));
        break;
    }
  }
}

// Scales: every kind in every column over the groups; `tame` for normal ones only.
void fill_scales(DequantCase& c, std::mt19937& rng, bool tame) {
  c.scales.resize(size_t(c.groups * 64));
  for (int64_t g = 0; g < c.groups; ++g)
    for (int col = 0; col < 64; ++col)
      c.scales[size_t(g * 64 + col)] =
          scale_of(rng, tame ? 8 + int(rng() % 4) : int(g * 7 + col + int64_t(rng() % 3)));
}

// The 254 non-NaN e4m3 codes.
std::vector<uint8_t> e4m3_codes() {
  std::vector<uint8_t> v;
  for (int b = 0; b < 256; ++b)
    if ((b & 0x7f) != 0x7f) v.push_back(uint8_t(b));
  return v;
}

// fp8: row r position i holds code (r + i) mod 254, so 254 rows put every
// code in every position once; fewer rows a rotating part of them.
DequantCase fp8_case(int64_t rows, int64_t groups, Groups how, bool tame, uint32_t seed) {
  std::mt19937 rng(seed);
  DequantCase c;
  c.what = fmt::format("fp8 rows {} groups {} ({}){}", rows, groups, int(how), tame ? " tame" : "");
  c.code = DType::f8e4m3;
  c.rows = rows, c.groups = groups;
  const std::vector<uint8_t> codes = e4m3_codes();
  for (int64_t r = 0; r < rows; ++r)
    for (int i = 0; i < 128; ++i) c.codes.push_back(codes[size_t((r + i) % 254)]);
  fill_groups(c, how, rng);
  fill_scales(c, rng, tame);
  return c;
}

// int4: byte (r, col) = lo | hi << 4 with lo = (r + col) mod 16 and hi =
// (3r + col + 5) mod 16: 16 rows put every nibble value in both halves of
// every column. Zero points (g + col) mod 17, i.e. 0..16.
DequantCase u4_case(int64_t rows, int64_t groups, bool zeros, Groups how, bool tame,
                    uint32_t seed) {
  std::mt19937 rng(seed);
  DequantCase c;
  c.what = fmt::format("u4{} rows {} groups {} ({}){}", zeros ? " zeros" : "", rows, groups,
                       int(how), tame ? " tame" : "");
  c.code = DType::u4;
  c.zeros = zeros;
  c.rows = rows, c.groups = groups;
  for (int64_t r = 0; r < rows; ++r)
    for (int col = 0; col < 64; ++col)
      c.codes.push_back(uint8_t(((r + col) % 16) | (((3 * r + col + 5) % 16) << 4)));
  fill_groups(c, how, rng);
  fill_scales(c, rng, tame);
  if (zeros)
    for (int64_t g = 0; g < groups; ++g)
      for (int col = 0; col < 64; ++col) c.zero_rows.push_back(uint8_t((g + col) % 17));
  return c;
}

// MXFP4: the int4 case's nibble pattern (every value in both halves of every
// column over 16 rows); scales e8m0 exponent bytes e (scale 2^(e − 127); e = 255
// is NaN: packing refuses it). `e8m0`: column c of group g takes
// e = (g·64 + c + seed) mod 255, so 4 groups hold every e in [0, 254].
// Otherwise `tame`: random e in 119..130 (every product normal: e >= 2); not
// tame: the bytes 0..254 repeated over the G·64 slots in random places (every
// byte once G >= 4; e = 0 and 1 give subnormal products).
DequantCase mx_case(int64_t rows, int64_t groups, Groups how, bool e8m0, bool tame, uint32_t seed) {
  DequantCase c = u4_case(rows, groups, false, how, tame, seed);
  c.what = fmt::format("mxfp4 rows {} groups {} ({}){}", rows, groups, int(how),
                       e8m0   ? " e8m0"
                       : tame ? " tame"
                              : "");
  c.code = DType::f4e2m1;
  c.scales.clear();
  std::mt19937 rng(seed * 2654435761u + 17);
  c.e8m0.resize(size_t(groups * 64));
  for (int64_t i = 0; i < groups * 64; ++i)
    c.e8m0[size_t(i)] = e8m0   ? uint8_t((i + seed) % 255)
                        : tame ? uint8_t(127 - 8 + int(rng() % 12))
                               : uint8_t(i % 255);
  if (!e8m0 && !tame) std::shuffle(c.e8m0.begin(), c.e8m0.end(), rng);
  return c;
}

const int64_t kRows[] = {0, 1, 2, 37, 254};
const Groups kGroups[] = {Groups::every_row, Groups::constant, Groups::monotone};

// ---------------------------------------------------------------------------

class DequantKernelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string why = maker(GetParam()).unavailable();
    if (!why.empty()) GTEST_SKIP() << GetParam() << " kernel unavailable here: " << why;
  }
  DequantKernel make(DType code, bool zeros, bool normal_products = false) {
    DequantDesc d;
    d.isa = maker(GetParam()).isa;
    d.code = code;
    d.zeros = zeros;
    d.normal_products = normal_products;
    return maker(GetParam()).make(d);
  }
};

TEST_P(DequantKernelTest, Fp8EveryCodeInEveryPosition) {
  const DequantKernel k = make(DType::f8e4m3, false);
  uint32_t seed = 1;
  for (int64_t rows : kRows)
    for (Groups how : kGroups)
      for (bool tame : {true, false})
        for (int64_t groups : {int64_t{1}, int64_t{5}})
          EXPECT_TRUE(run_and_check(k, fp8_case(rows, groups, how, tame, seed++)));
}

TEST_P(DequantKernelTest, Int4EveryNibbleDefaultZero) {
  const DequantKernel k = make(DType::u4, false);
  uint32_t seed = 100;
  for (int64_t rows : kRows)
    for (Groups how : kGroups)
      for (bool tame : {true, false})
        for (int64_t groups : {int64_t{1}, int64_t{5}})
          EXPECT_TRUE(run_and_check(k, u4_case(rows, groups, false, how, tame, seed++)));
}

TEST_P(DequantKernelTest, Int4EveryNibbleWithZeros) {
  const DequantKernel k = make(DType::u4, true);
  uint32_t seed = 200;
  for (int64_t rows : kRows)
    for (Groups how : kGroups)
      for (bool tame : {true, false})
        for (int64_t groups : {int64_t{1}, int64_t{17}})
          EXPECT_TRUE(run_and_check(k, u4_case(rows, groups, true, how, tame, seed++)));
}

TEST_P(DequantKernelTest, Mxfp4EveryNibbleEveryExponent) {
  const DequantKernel k = make(DType::f4e2m1, false);
  uint32_t seed = 400;
  for (int64_t rows : kRows)
    for (Groups how : kGroups) {
      EXPECT_TRUE(run_and_check(k, mx_case(rows, 4, how, true, false, seed++)));
      EXPECT_TRUE(run_and_check(k, mx_case(rows, 1, how, true, false, seed++)));
      for (bool tame : {true, false})
        EXPECT_TRUE(run_and_check(k, mx_case(rows, 5, how, false, tame, seed++)));
    }
}

// The variant without the per-product subnormal check (DequantDesc::
// normal_products): the same results for the scales it is made for.
TEST_P(DequantKernelTest, NormalProductsVariantOnTameScales) {
  uint32_t seed = 300;
  for (const auto& [code, zeros] : {std::pair{DType::f8e4m3, false}, std::pair{DType::u4, false},
                                    std::pair{DType::u4, true}, std::pair{DType::f4e2m1, false}}) {
    const DequantKernel k = make(code, zeros, true);
    for (int64_t rows : kRows)
      for (Groups how : kGroups) {
        const DequantCase c = code == DType::u4       ? u4_case(rows, 5, zeros, how, true, seed++)
                              : code == DType::f4e2m1 ? mx_case(rows, 5, how, false, true, seed++)
                                                      : fp8_case(rows, 5, how, true, seed++);
        ASSERT_TRUE(c.normal_products_only()) << c.what;
        EXPECT_TRUE(run_and_check(k, c));
      }
  }
}

// Random bytes (fp8: NaN codes replaced) and random scales of every kind, many rows.
TEST_P(DequantKernelTest, RandomRows) {
  for (DType code : {DType::f8e4m3, DType::u4, DType::f4e2m1})
    for (bool zeros : {false, true}) {
      if (zeros && code != DType::u4) continue;
      const DequantKernel k = make(code, zeros);
      for (uint32_t seed = 0; seed < 8; ++seed) {
        std::mt19937 rng(seed * 31 + (zeros ? 7 : 0));
        DequantCase c = code == DType::u4 ? u4_case(101, 9, zeros, Groups::every_row, false, seed)
                        : code == DType::f4e2m1
                            ? mx_case(101, 9, Groups::every_row, seed % 2 == 0, false, seed)
                            : fp8_case(101, 9, Groups::every_row, false, seed);
        for (uint8_t& b : c.codes) {
          b = uint8_t(rng());
          if (code == DType::f8e4m3 && (b & 0x7f) == 0x7f) b ^= 1;
        }
        for (uint8_t& z : c.zero_rows) z = uint8_t(rng() % 17);
        c.what = "random " + c.what;
        EXPECT_TRUE(run_and_check(k, c));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Makers, DequantKernelTest, ::testing::ValuesIn(maker_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DequantKernelTest);

// The oracle's e8m0 decoding (from the f32 bits) is runtime::e8m0_to_f32's.
TEST(DequantKernelOracle, E8m0BitsMatchRuntime) {
  for (int e = 0; e < 255; ++e) {
    const float a = e8m0_f32(uint8_t(e)), b = runtime::e8m0_to_f32(uint8_t(e));
    uint32_t ua, ub;
    std::memcpy(&ua, &a, 4);
    std::memcpy(&ub, &b, 4);
    EXPECT_EQ(ua, ub) << "e = " << e;
  }
}

TEST(DequantKernelMakers, SomeKernelIsBuilt) {
  EXPECT_FALSE(maker_names().empty());
  SUCCEED() << fmt::format("makers: {}", fmt::join(maker_names(), ", "));
}

#if TILEJIT_HAVE_LLVM
TEST(LlvmDequant, NameAndBadDescriptors) {
  namespace lb = codegen::llvm_backend;
  DequantDesc d;
  d.isa = Isa::amx;  // ignored
  d.code = DType::u4, d.zeros = true;
  EXPECT_EQ(lb::llvm_dequant_name(d), "dequant_llvm_u4_zp");
  d.code = DType::f8e4m3;  // zero points are for int4
  EXPECT_THROW(lb::compile_llvm_dequant(d), Error);
  d.zeros = false, d.code = DType::bf16;
  EXPECT_THROW(lb::compile_llvm_dequant(d), Error);
  d.code = DType::i8;
  EXPECT_THROW(lb::compile_llvm_dequant(d), Error);
  d.code = DType::f4e2m1;
  EXPECT_EQ(lb::llvm_dequant_name(d), "dequant_llvm_f4e2m1");
  d.zeros = true;  // MXFP4 has no zero points
  EXPECT_THROW(lb::compile_llvm_dequant(d), Error);
}
#endif

}  // namespace
}  // namespace tilejit::test
