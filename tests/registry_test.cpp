// The descriptor concept (codegen/kernel_desc.h), the CPU feature lattice
// (runtime/isa.h) and the kernel registry (jit/registry.h).
#include <gtest/gtest.h>

#include <clocale>
#include <cmath>
#include <locale>
#include <set>
#include <string>
#include <thread>
#include <tuple>

#include "codegen/brgemm_desc.h"
#include "codegen/gemm_plan.h"
#include "codegen/llvm/llvm_decode_attention.h"
#include "codegen/llvm/llvm_rope.h"
#include "codegen/quant_desc.h"
#include "ir/text_util.h"
#include "jit/kernel_cache.h"
#include "jit/registry.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "runtime/reference_error_bounds.h"
#include "test_util.h"
#include "tilejit/error.h"

namespace tilejit {
namespace {

namespace lb = codegen::llvm_backend;
using test::expect_tilejit_error;

// Changing any one listed field of a default descriptor changes its key and
// its equality (and, for these values, its hash): nothing in field_list() is
// left out of what is generated from it.
template <class D, class Mutate>
void expect_every_field_counts(const D& base, Mutate mutate) {
  const std::string base_key = codegen::desc_key(base);
  constexpr size_t n = std::tuple_size_v<decltype(D::field_list())>;
  std::set<std::string> keys{base_key};
  for (size_t i = 0; i < n; ++i) {
    D d = base;
    mutate(d, i);
    SCOPED_TRACE(codegen::desc_key(d));
    EXPECT_FALSE(d == base) << "field " << i;
    EXPECT_NE(codegen::desc_key(d), base_key) << "field " << i;
    EXPECT_NE(codegen::desc_hash(d), codegen::desc_hash(base)) << "field " << i;
    keys.insert(codegen::desc_key(d));
  }
  EXPECT_EQ(keys.size(), n + 1);  // every mutation gives its own key
}

// Sets field i of d to a value different from its default.
template <class D>
void bump(D& d, size_t i) {
  size_t at = 0;
  std::apply(
      [&](const auto&... f) {
        (
            [&] {
              if (at++ != i) return;
              auto& v = d.*(f.member);
              using T = std::decay_t<decltype(v)>;
              if constexpr (std::is_same_v<T, bool>)
                v = !v;
              else if constexpr (std::is_enum_v<T>)
                v = static_cast<T>(static_cast<int>(v) + 1);
              else if constexpr (std::is_same_v<T, std::vector<int64_t>>)
                v.push_back(8);
              else
                v = v + 3;
            }(),
            ...);
      },
      D::field_list());
}

TEST(KernelDesc, EveryBrgemmFieldIsInKeyHashAndEquality) {
  expect_every_field_counts(codegen::BrgemmDesc{}, bump<codegen::BrgemmDesc>);
}

TEST(KernelDesc, EveryOtherDescriptorsFieldsCount) {
  expect_every_field_counts(codegen::GemmSpec{}, bump<codegen::GemmSpec>);
  expect_every_field_counts(lb::DecodeAttentionDesc{}, bump<lb::DecodeAttentionDesc>);
  expect_every_field_counts(lb::RopeDesc{}, bump<lb::RopeDesc>);
  expect_every_field_counts(lb::SoftmaxStepDesc{}, bump<lb::SoftmaxStepDesc>);
}

TEST(KernelDesc, NamesSpellTheSpecialization) {
  codegen::BrgemmDesc d;
  d.isa = Isa::avx512;
  d.mr = 7;
  d.nr = 40;
  d.kb = 1024;
  d.bias = codegen::BiasKind::bf16;
  EXPECT_EQ(d.name(), "brgemm_avx512_bf16_f32acc_m7n40k1024_biasbf16_f32out");
  d.accumulate = true;
  d.act = Activation::silu;
  d.out = DType::bf16;
  EXPECT_EQ(d.name(), "brgemm_avx512_bf16_f32acc_m7n40k1024_accin_biasbf16_silu_bf16out");
  d.b_type = DType::u4;  // a weight type other than the default is spelled
  EXPECT_EQ(d.name(), "brgemm_avx512_bf16xu4_f32acc_m7n40k1024_accin_biasbf16_silu_bf16out");
  lb::RopeDesc r;
  r.neox = false;
  r.dtype = DType::f32;
  r.d = 96;
  r.rotary_dim = 64;
  r.hq = 4;
  r.pos_dtype = DType::i64;
  EXPECT_EQ(r.name(), "rope_llvm_gptj_f32_cachef32_d96_rd64_hq4_hk0_posi64");
  r.mrope_section = {16, 8, 8};
  EXPECT_EQ(r.name(), "rope_llvm_gptj_f32_cachef32_d96_rd64_hq4_hk0_mrope16x8x8_posi64");
}

TEST(KernelDesc, KeysAreExactForFloats) {
  codegen::BrgemmDesc a, b;
  a.glu = b.glu = codegen::Glu::clamped_swiglu;
  a.glu_alpha = 1.702f;
  b.glu_alpha = std::nextafter(1.702f, 2.f);
  EXPECT_NE(a.key(), b.key());  // one ulp apart: different code
  EXPECT_FALSE(a == b);
}

TEST(KernelDesc, KStepsFollowTheDtypes) {
  codegen::BrgemmDesc d;
  EXPECT_EQ(d.k_group(), 2);  // bf16: VNNI pairs
  EXPECT_EQ(d.k_step(), 32);  // bf16: 32 per AMX tile row
  d.a_type = d.b_type = DType::i8;
  EXPECT_EQ(d.k_group(), 4);
  EXPECT_EQ(d.k_step(), 64);
}

TEST(Features, IsaViewIsTheLatticeOfFeatureSets) {
  using runtime::isa_features;
  EXPECT_TRUE(isa_features(Isa::amx).contains(isa_features(Isa::avx512)));
  EXPECT_TRUE(isa_features(Isa::scalar) == runtime::FeatureSet{});
  EXPECT_EQ(runtime::isa_backend(Isa::amx), runtime::Backend::xbyak);
  EXPECT_EQ(runtime::isa_backend(Isa::llvm), runtime::Backend::llvm);
  EXPECT_EQ(runtime::isa_backend(Isa::scalar), runtime::Backend::reference);
  // The best path is the highest whose features are usable here.
  const runtime::FeatureSet have = runtime::detected_features();
  const Isa best = runtime::max_supported_isa();
  EXPECT_TRUE(have.contains(isa_features(best)));
  for (Isa above : {Isa::amx, Isa::avx512})
    if (above > best) {
      EXPECT_FALSE(have.contains(isa_features(above))) << isa_name(above);
    }
  // Usable = detected ∧ the cap: exactly what the active path needs, at least.
  const runtime::FeatureSet usable = runtime::usable_features();
  EXPECT_TRUE(have.contains(usable));
  EXPECT_TRUE(usable.contains(isa_features(runtime::active_isa())));
  if (runtime::active_isa() < Isa::amx) {
    EXPECT_FALSE(usable.has(runtime::Feature::amx_tile));
  }
  if (runtime::active_isa() < Isa::avx512) {
    EXPECT_FALSE(usable.has(runtime::Feature::avx512f));
  }
  EXPECT_EQ(runtime::FeatureSet{}.str(), "none");
  EXPECT_EQ((runtime::FeatureSet{runtime::Feature::fma, runtime::Feature::avx2}).str(), "avx2 fma");
}

TEST(Registry, TableHasOneRowPerFamilyAndPath) {
  std::set<std::pair<jit::Family, Isa>> seen;
  for (const jit::KernelRow& r : jit::kernel_rows()) {
    EXPECT_TRUE(seen.insert({r.family, r.path}).second) << jit::family_name(r.family);
    EXPECT_TRUE(r.needs == runtime::isa_features(r.path)) << jit::family_name(r.family);
    EXPECT_EQ(r.backend, runtime::isa_backend(r.path)) << jit::family_name(r.family);
    EXPECT_EQ(jit::find_row(r.family, r.path), &r);
  }
  EXPECT_NE(jit::find_row(jit::Family::brgemm, Isa::avx512), nullptr);
  EXPECT_EQ(jit::find_row(jit::Family::brgemm, Isa::scalar), nullptr);
  // The LLVM families come and go together with the LLVM brgemm row.
  EXPECT_EQ(jit::family_built(jit::Family::rope),
            jit::find_row(jit::Family::brgemm, Isa::llvm) != nullptr);
}

TEST(Registry, GetCompilesOnceAndAnswersFromTheFront) {
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, Isa::avx512);
  ASSERT_NE(row, nullptr);
  if (!jit::row_runs_here(*row)) GTEST_SKIP() << "no AVX-512 BF16 here";
  codegen::BrgemmDesc d;
  d.isa = Isa::avx512;
  d.mr = 3;
  d.nr = 19;
  d.kb = 77;  // a shape no other test asks for
  const CacheStats before = cache_stats();
  const jit::Kernel& k = jit::get(d);
  const jit::Kernel& again = jit::get(d);
  EXPECT_EQ(&k, &again);
  const CacheStats after = cache_stats();
  EXPECT_EQ(after.hits, before.hits + 1);  // the second call: a front hit
  EXPECT_EQ(k.name, d.name());
  EXPECT_EQ(k.key, jit::cache_key(d));
  EXPECT_EQ(k.backend, "xbyak");
  // Another thread has its own front but finds the same kernel.
  const jit::Kernel* other = nullptr;
  std::thread([&] { other = &jit::get(d); }).join();
  EXPECT_EQ(other, &k);
  // The disassembler is LLVM's: a build without it prints the raw bytes.
  if (cpu_info().llvm_backend) {
    EXPECT_NE(jit::disassemble(k).find("vdpbf16ps"), std::string::npos);
  }
}

TEST(Registry, DescriptorsOutsideTheRowsLimitsAreErrors) {
  codegen::BrgemmDesc d;
  d.isa = Isa::avx512;
  d.a_type = DType::i8;
  try {
    jit::get(d);
    FAIL() << "an int8 descriptor compiled on a bf16-only row";
  } catch (const InternalError&) {
    FAIL() << "a descriptor outside the limits is the caller's Error, not an internal one";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("a=i8"), std::string::npos) << e.what();
  }
  d = {};
  d.nr = 65;
  EXPECT_THROW(jit::get(d), Error);
  d = {};
  d.isa = Isa::scalar;  // no row: the reference path has no kernels
  EXPECT_THROW(jit::get(d), Error);
  // W4A8 group kernels: every row, the int8 dtypes, kb a multiple of 16 (of
  // 64 on AMX: whole tile K steps), no raw i32 out, row-major A.
  d = {};
  d.isa = Isa::amx;
  d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
  d.kb = 64, d.w4a8 = true, d.a_packed = true;
  expect_tilejit_error([&] { jit::get(d); },
                       "on the amx row; allowed: kb % 64 == 0, out f32|bf16, apack=0");
  d.a_packed = false, d.kb = 32;
  expect_tilejit_error([&] { jit::get(d); }, "kb % 64 == 0");
  d.isa = Isa::avx512, d.kb = 8;
  expect_tilejit_error([&] { jit::get(d); }, "kb % 16 == 0");
  d.kb = 32, d.out = DType::i32;
  expect_tilejit_error([&] { jit::get(d); }, "on the avx512 row; allowed");
  d.out = DType::f32;
  if (jit::row_runs_here(*jit::find_row(jit::Family::brgemm, Isa::avx512))) {
    EXPECT_NE(jit::get(d).entry<codegen::BrgemmFn>(), nullptr);
  }
  d.a_type = DType::bf16, d.b_type = DType::bf16, d.acc_type = DType::f32;
  d.isa = Isa::llvm;
  EXPECT_THROW(jit::get(d), Error);
  d.b_type = DType::u4, d.b_row_bytes = 64;  // the fused decode kernel takes no w4a8
  EXPECT_THROW(jit::get(d), Error);
  // The dequant kernel's i8 output: u4 codes only.
  EXPECT_THROW(
      jit::get(codegen::DequantDesc{.isa = Isa::llvm, .code = DType::f8e4m3, .out = DType::i8}),
      Error);
}

// A prefetch distance (BrgemmDesc::prefetch_kib, a tuning knob) is another
// kernel on the Xbyak AVX-512 row: other code (none: no prefetch
// instructions, so shorter), another key. Elsewhere, or out of range, an Error naming it.
TEST(Registry, PrefetchDistanceIsAnXbyakAvx512Operand) {
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, Isa::avx512);
  ASSERT_NE(row, nullptr);
  if (!jit::row_runs_here(*row)) GTEST_SKIP() << "no AVX-512 BF16 here";
  codegen::BrgemmDesc d;
  d.isa = Isa::avx512;
  d.mr = 4, d.kb = 256;
  const jit::Kernel& dflt = jit::get(d);
  d.prefetch_kib = 0;
  const jit::Kernel& none = jit::get(d);
  EXPECT_NE(none.key, dflt.key);
  EXPECT_LT(none.size, dflt.size) << "pf=0 emits no prefetch";
  d.prefetch_kib = 64;
  EXPECT_EQ(jit::get(d).size, dflt.size) << "another distance is another displacement";
  EXPECT_NE(jit::get(d).name.find("_pf64k"), std::string::npos) << jit::get(d).name;
  d.prefetch_kib = codegen::BrgemmDesc::kPrefetchKibMax + 1;
  EXPECT_THROW(jit::get(d), Error);
  d.prefetch_kib = -2;
  EXPECT_THROW(jit::get(d), Error);
  d.prefetch_kib = 16;
  d.isa = Isa::llvm;
  try {
    jit::get(d);
    FAIL() << "a prefetch distance compiled on the llvm row";
  } catch (const Error& e) {
    // Without LLVM there is no llvm row to refuse it: the path itself is refused.
    const char* want = cpu_info().llvm_backend ? "pf=16 on the llvm row"
                                               : "no brgemm kernel for the llvm path in this build";
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(Registry, LlvmRowsKeyOnTheHost) {
  if (!jit::family_built(jit::Family::rope)) GTEST_SKIP() << "built without LLVM";
  lb::RopeDesc r;
  r.d = r.rotary_dim = 64;
  r.hq = 2;
  EXPECT_NE(jit::cache_key(r).find(";llvm_cpu="), std::string::npos);
  codegen::BrgemmDesc d;
  d.isa = Isa::llvm;
  EXPECT_NE(jit::cache_key(d).find(";llvm_cpu="), std::string::npos);
  d.isa = Isa::avx512;
  EXPECT_EQ(jit::cache_key(d), d.key());  // Xbyak code depends on nothing else
}

TEST(Errors, InternalErrorIsAnErrorThatSaysSo) {
  try {
    throw InternalError("emitter x failed");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("internal error"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("emitter x failed"), std::string::npos);
  }
}

}  // namespace
}  // namespace tilejit

namespace tilejit {
namespace {

// Keys hold floats exactly, as C's %a spells them, whatever the host's
// locale: libfmt 9's "{:a}" went through snprintf, and under de_DE a key
// read "0x1,b3b646p+0", so a host that set LC_NUMERIC missed every
// float-keyed kernel the C-locale `tilejit tune` had cached (an outside
// tester's find).
TEST(KernelKeys, FloatsAreExactAndLocaleFree) {
  EXPECT_EQ(codegen::field_text(1.702f), "0x1.b3b646p+0");
  EXPECT_EQ(codegen::field_text(7.0f), "0x1.cp+2");
  EXPECT_EQ(codegen::field_text(-0.5f), "-0x1p-1");
  EXPECT_EQ(codegen::field_text(0.0f), "0x0p+0");
  EXPECT_EQ(codegen::field_text(-0.0f), "-0x0p+0");
  EXPECT_EQ(codegen::field_text(1e-45f), "0x1p-149");
  EXPECT_EQ(codegen::field_text(INFINITY), "inf");
  const std::string c_key = codegen::field_text(1.702f);
  const std::string c_slope = runtime::activation_slope_text(Activation::gelu_tanh);
  // A locale with a decimal comma, if the machine has one (dev.sh makes de_DE).
  const char* got = nullptr;
  for (const char* name : {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "ru_RU.UTF-8"})
    if ((got = std::setlocale(LC_NUMERIC, name)) != nullptr) break;
  if (got == nullptr) GTEST_SKIP() << "no locale with a decimal comma installed";
  const bool comma = std::localeconv()->decimal_point[0] == ',';
  const std::string de_key = codegen::field_text(1.702f);
  const std::string de_slope = runtime::activation_slope_text(Activation::gelu_tanh);
  std::setlocale(LC_NUMERIC, "C");
  ASSERT_TRUE(comma) << got;
  EXPECT_EQ(de_key, c_key);
  EXPECT_EQ(de_slope, c_slope);
}

// The IR's text (dims, float attributes) and its messages under a host's
// global C++ locale that groups thousands and writes a decimal comma.
TEST(KernelKeys, IrTextIgnoresTheGlobalLocale) {
  struct Comma : std::numpunct<char> {
    char do_decimal_point() const override { return ','; }
    char do_thousands_sep() const override { return '.'; }
    std::string do_grouping() const override { return "\3"; }
  };
  const std::locale before = std::locale::global(std::locale(std::locale::classic(), new Comma));
  const std::string text = ir::cat("K=", 4096, " scale=", 0.5);
  std::locale::global(before);
  EXPECT_EQ(text, "K=4096 scale=0.5");
}

}  // namespace
}  // namespace tilejit
