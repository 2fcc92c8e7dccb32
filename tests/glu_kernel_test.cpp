// The GLU epilogue of the brgemm micro-kernel (BrgemmDesc::glu, the MoE
// gate/up projection): the Xbyak AVX-512 and LLVM kernels bit for bit against
// each other (same instruction, accumulator sets and formulas) over the M, N
// and K tails, every gated activation, bias, acc_in and both output dtypes,
// and the descriptor limit. Each kernel against the reference (every row,
// AMX included, and every tail and epilogue) is tests/brgemm_battery_test;
// fused_experts is tested end to end in moe_test.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "jit/registry.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

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

// Both kernels run here and use vdpbf16ps (the LLVM kernel's dot product on
// an AVX512-BF16 host), or the reason they cannot be compared.
std::string why_not_comparable() {
  const CpuInfo info = cpu_info();
  if (info.max_isa < Isa::avx512) return "no Xbyak AVX-512 path on this CPU/OS";
  if (!info.llvm_backend || !info.avx2 || !info.fma) return "no LLVM path on this build/CPU";
  if (!info.avx512_bf16) return "no AVX512-BF16: the LLVM kernel uses fp32 FMAs, not vdpbf16ps";
  return "";
}

TEST_P(GluKernel, LlvmAndXbyakKernelsAgreeBitForBit) {
  if (const std::string why = why_not_comparable(); !why.empty()) GTEST_SKIP() << why;
  const Case& c = GetParam();
  const Data d = make_data(c);
  const std::vector<uint8_t> x = run(c, d, jit::get(c.desc(Isa::avx512)).entry<BrgemmFn>());
  const std::vector<uint8_t> l = run(c, d, jit::get(c.desc(Isa::llvm)).entry<BrgemmFn>());
  const int64_t elems = int64_t(x.size()) / (c.out == DType::f32 ? 4 : 2);
  int differ = 0;
  std::string msg;
  for (int64_t e = 0; e < elems; ++e) {
    // Subnormal bf16 results excepted (brgemm_test_util.h).
    if (same_output_bits(x.data(), l.data(), c.out, e)) continue;
    if (differ++ < 5) msg += fmt::format("\n  element {} (row {}, col {})", e, e / kLdc, e % kLdc);
  }
  EXPECT_EQ(differ, 0) << c.str() << ": LLVM and Xbyak kernels differ" << msg;
}

INSTANTIATE_TEST_SUITE_P(Shapes, GluKernel, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) { return p.param.str(); });

TEST(GluKernelErrors, MoreThan32OutputsIsRejected) {
  Case c{1, 33, 32, Glu::act_mul, Activation::silu, false, false, DType::f32};
  EXPECT_THROW(jit::get(c.desc(Isa::avx512)), Error);
}

}  // namespace
}  // namespace tilejit::test
