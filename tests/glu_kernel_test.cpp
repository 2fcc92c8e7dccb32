// The GLU epilogue of the brgemm micro-kernel (BrgemmDesc::glu, the MoE
// gate/up projection) on its own: the Xbyak AVX-512 and LLVM kernels against a
// double-precision evaluation over the M, N and K tails, every gated
// activation, bias, acc_in and both output dtypes; the two kernels bit for bit
// against each other (same instruction, accumulator sets and formulas); and no
// store past column nr. (fused_experts is tested end to end in moe_test.)
//
// Tolerance per output: products of bf16 values are exact in fp32 and each
// addition rounds once (u = 2⁻²⁴), so gate and up are within
// (K + 2)·u·Σ|a·b| (+ u·|bias|) of exact; the gated function stretches that by
// at most (1 + |g|)·(1 + |u|) (its derivative bound on the ranges used here)
// and adds its own approximation error, 4e-6·max(1, |v|) (exp polynomial
// ~2e-7, erf 1.5e-7); a bf16 output adds one bf16 ulp, 2⁻⁷·|ref|.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "jit/registry.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

using codegen::BiasKind;
using codegen::BrgemmArgs;
using codegen::BrgemmDesc;
using codegen::BrgemmFn;
using codegen::Glu;
using runtime::bf16_to_f32;
using runtime::f32_to_bf16;

struct Case {
  int mr, nr;
  int64_t kb;
  Glu glu;
  Activation act;
  bool bias, acc;
  DType out;
  std::string str() const {
    return fmt::format("m{}n{}k{}_{}_{}{}{}_{}", mr, nr, kb, codegen::glu_name(glu),
                       activation_name(act), bias ? "_bias" : "", acc ? "_acc" : "",
                       dtype_name(out));
  }
  BrgemmDesc desc(Isa isa) const {
    BrgemmDesc d;
    d.isa = isa;
    d.mr = mr;
    d.nr = nr;
    d.kb = kb;
    d.b_row_bytes = 256;
    d.bias = bias ? BiasKind::f32 : BiasKind::none;
    d.act = act;
    d.out = out;
    d.accumulate = acc;
    d.glu = glu;
    if (glu == Glu::clamped_swiglu) {
      d.glu_alpha = 1.702f;
      d.glu_limit = 0.75f;  // small, so both clamps bite on this data
    }
    return d;
  }
};

struct Data {
  std::vector<uint16_t> a, b;
  std::vector<float> bias, acc_in;
  int64_t lda = 0, kpairs = 0;
};

constexpr int kLdc = 48;  // output row stride in elements (> 32: stores past nr are caught)

Data make_data(const Case& c) {
  std::mt19937 rng(static_cast<uint32_t>(c.mr * 1000003 + c.nr * 1009 + c.kb));
  std::uniform_real_distribution<float> u(-1, 1);
  Data d;
  d.lda = c.kb + 3;
  d.kpairs = (c.kb + 1) / 2;
  d.a.resize(static_cast<size_t>(c.mr * d.lda));
  for (auto& v : d.a) v = f32_to_bf16(u(rng));
  d.b.assign(static_cast<size_t>(d.kpairs * 128), 0);
  for (int64_t k = 0; k < c.kb; ++k)
    for (int col = 0; col < 64; ++col) d.b[(k / 2) * 128 + col * 2 + k % 2] = f32_to_bf16(u(rng));
  d.bias.resize(64);
  for (auto& v : d.bias) v = u(rng);
  d.acc_in.resize(static_cast<size_t>(c.mr * 64));
  for (auto& v : d.acc_in) v = u(rng) * 4;
  return d;
}

double gated(const Case& c, double g, double u) {
  if (c.glu == Glu::clamped_swiglu) {
    g = std::min(g, 0.75);
    u = std::clamp(u, -0.75, 0.75);
    return g / (1 + std::exp(-1.702 * g)) * (u + 1);
  }
  switch (c.act) {
    case Activation::silu:
      return g / (1 + std::exp(-g)) * u;
    case Activation::gelu_tanh:
      return 0.5 * g * (1 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u;
    case Activation::gelu_erf:
      return 0.5 * g * (1 + std::erf(g / std::sqrt(2.0))) * u;
    default:
      return g * u;
  }
}

std::vector<uint8_t> run(const Case& c, const Data& d, BrgemmFn fn) {
  const size_t es = c.out == DType::f32 ? 4 : 2;
  std::vector<uint8_t> out(static_cast<size_t>(c.mr * kLdc) * es, 0xA5);  // sentinel
  const void* a = d.a.data();
  const void* b = d.b.data();
  BrgemmArgs args{};
  args.a = &a;
  args.b = &b;
  args.batch = 1;
  args.lda = d.lda * 2;
  args.c = out.data();
  args.ldc = static_cast<int64_t>(kLdc * es);
  args.bias = c.bias ? d.bias.data() : nullptr;
  args.acc_in = c.acc ? d.acc_in.data() : nullptr;
  args.ld_acc_in = 64 * 4;
  fn(&args);
  return out;
}

double read(const std::vector<uint8_t>& out, DType t, int64_t i) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, &out[static_cast<size_t>(i) * 4], 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, &out[static_cast<size_t>(i) * 2], 2);
  return bf16_to_f32(h);
}

::testing::AssertionResult check(const Case& c, const Data& d, const std::vector<uint8_t>& got) {
  const size_t es = c.out == DType::f32 ? 4 : 2;
  int bad = 0;
  std::string msg;
  for (int r = 0; r < c.mr; ++r)
    for (int col = 0; col < kLdc; ++col) {
      const int64_t i = int64_t(r) * kLdc + col;
      if (col >= c.nr) {
        // Past nr: the sentinel must be intact.
        for (size_t byte = 0; byte < es; ++byte)
          if (got[static_cast<size_t>(i) * es + byte] != 0xA5) {
            ++bad;
            msg += fmt::format("\n  wrote past nr at row {} col {}", r, col);
            break;
          }
        continue;
      }
      double g = 0, u = 0, mag = 0;
      for (int64_t k = 0; k < c.kb; ++k) {
        const double x = bf16_to_f32(d.a[r * d.lda + k]);
        const double wg = bf16_to_f32(d.b[(k / 2) * 128 + col * 2 + k % 2]);
        const double wu = bf16_to_f32(d.b[(k / 2) * 128 + (col + 32) * 2 + k % 2]);
        g += x * wg;
        u += x * wu;
        mag += std::fabs(x * wg) + std::fabs(x * wu);
      }
      if (c.acc) {
        g += d.acc_in[r * 64 + col];
        u += d.acc_in[r * 64 + col + 32];
        mag += std::fabs(d.acc_in[r * 64 + col]) + std::fabs(d.acc_in[r * 64 + col + 32]);
      }
      if (c.bias) {
        g += d.bias[col];
        u += d.bias[col + 32];
        mag += std::fabs(d.bias[col]) + std::fabs(d.bias[col + 32]);
      }
      const double ref = gated(c, g, u);
      const double in_err = runtime::dot_bound(c.kb, mag);
      double tol = in_err * (1 + std::fabs(g)) * (1 + std::fabs(u)) * 2 +
                   runtime::kVectorMathError * std::max(1.0, std::fabs(ref));
      if (c.out == DType::bf16) tol += runtime::bf16_ulp_bound(ref);
      const double v = read(got, c.out, i);
      if (!(std::fabs(v - ref) <= tol)) {
        if (bad++ < 5)
          msg += fmt::format("\n  row {} col {}: got {}, want {} ± {}", r, col, v, ref, tol);
      }
    }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << c.str() << ": " << bad << " bad outputs" << msg;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  int i = 0;
  for (int mr : {1, 2, 5, 7})
    for (int nr : {1, 15, 16, 17, 32})
      for (int64_t kb : {1, 2, 33, 100, 257})
        for (Glu glu : {Glu::act_mul, Glu::clamped_swiglu}) {
          const Activation acts[] = {Activation::silu, Activation::gelu_tanh, Activation::gelu_erf};
          Case c{mr,
                 nr,
                 kb,
                 glu,
                 acts[i % 3],
                 i % 2 == 0,
                 (i / 2) % 2 == 0,
                 (i / 4) % 2 ? DType::f32 : DType::bf16};
          v.push_back(c);
          ++i;
        }
  return v;
}

class GluKernel : public ::testing::TestWithParam<Case> {};

// The paths this machine runs: Xbyak AVX-512 (needs AVX512-BF16) and LLVM.
std::vector<Isa> paths() {
  const CpuInfo info = cpu_info();
  std::vector<Isa> p;
  if (info.max_isa >= Isa::avx512) p.push_back(Isa::avx512);
  if (info.llvm_backend && info.avx2 && info.fma) p.push_back(Isa::llvm);
  return p;
}

TEST_P(GluKernel, MatchesReferenceOnEveryPathAndPathsAgreeBitForBit) {
  const Case& c = GetParam();
  const std::vector<Isa> isas = paths();
  if (isas.empty()) GTEST_SKIP() << "neither the AVX-512 nor the LLVM path runs on this machine";
  const Data d = make_data(c);
  std::vector<std::vector<uint8_t>> outs;
  for (Isa isa : isas) {
    SCOPED_TRACE(isa_name(isa));
    const auto& k = jit::get(c.desc(isa));
    outs.push_back(run(c, d, k.entry<BrgemmFn>()));
    EXPECT_TRUE(check(c, d, outs.back()));
  }
  // The LLVM kernel matches the Xbyak one bit for bit where it uses vdpbf16ps too.
  if (outs.size() == 2 && cpu_info().avx512_bf16 && c.out == DType::f32) {
    EXPECT_EQ(outs[0], outs[1]) << c.str() << ": LLVM and Xbyak kernels differ";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GluKernel, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.str(); });

TEST(GluKernelPaths, BothPathsRunWhereTheMachineHasThem) {
  // Guards the test above against silently checking nothing.
  const CpuInfo info = cpu_info();
  const size_t want = (info.max_isa >= Isa::avx512 ? 1u : 0u) +
                      (info.llvm_backend && info.avx2 && info.fma ? 1u : 0u);
  EXPECT_EQ(paths().size(), want);
  std::printf("GLU kernel paths tested here: %zu (avx512 %d, llvm %d)\n", paths().size(),
              info.max_isa >= Isa::avx512, info.llvm_backend);
}

TEST(GluKernelErrors, MoreThan32OutputsIsRejected) {
  Case c{1, 33, 32, Glu::act_mul, Activation::silu, false, false, DType::f32};
  EXPECT_THROW(jit::get(c.desc(Isa::avx512)), Error);
}

}  // namespace
}  // namespace tilejit::test
