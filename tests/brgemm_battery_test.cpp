// The brgemm micro-kernel tail battery (XNNPACK's, test/f32-gemm-minmax.yaml):
// one list of cases, instantiated over every brgemm row of the kernel
// registry (jit::kernel_rows(): amx, avx512, llvm; instance prefixes name the
// row's path), each case run through jit::get() and checked against the
// scalar reference (runtime/reference_gemm.h; the GLU math of
// runtime/reference_moe.h). A row this CPU/OS cannot run
// (!jit::row_runs_here) is skipped with the reason, not failed; the AMX row
// runs on tile hardware or under the test-support emulator
// (TILEJIT_AMX_EMULATE, tests/CMakeLists.txt). One more instance, llvm_fma,
// runs the llvm row's list on its kernels compiled with the fp32-FMA dot
// product forced (codegen/llvm/llvm_brgemm.h, BrgemmDot::fma): the variant an
// AVX2-only host gets, which an AVX512-BF16 host's llvm row does not use.
// The harness (inputs, run, reference, check) is tests/brgemm_test_util.h.
//
// The cases, per row (K step: 32 for AMX, one VNNI pair = 2 otherwise; M the
// row's most rows for the block: AMX 32, AVX-512 and LLVM
// avx512_brgemm_max_mr(nz)):
//   k_*      kb equal to the K step, less, greater, divisible by it, odd, large
//            (2065), on the full tile and on an (m, n) sub-tile;
//   n_*      nr 1 15 16 17 31 32 33 48 63 64 at full M and at 5 rows;
//   m_*      mr 1..M at nr 64 and 17 (LLVM also 13, 16, 32: its emitter splits
//            rows into register blocks up to 32);
//   stride_* lda and ldc larger than the row (the A padding is NaN);
//   batch_*  batch 2, 3, 5;
//   epi_*    every activation × bias (none, f32, bf16) × out (f32, bf16) ×
//            acc_in (none, own buffer, in place over C) on two shapes;
//   glu_*    act_mul with every activation and clamped_swiglu, × bias × out ×
//            acc_in, and the GLU over its nr and mr tails.
// AMX cases run with A in the PackedA tile layout (a_packed) and row-major
// (the kernel's a_tail path for a K tail), both where the contract allows
// (row-major A with a K tail takes batch 1); the epilogue cases alternate.
//
// Traps: every A block, B block, a_tail, bias and acc_in ends at a PROT_NONE
// page (GuardedBuffer: reading past it faults); B columns the kernel must not
// use (past nr) and A / acc_in row padding hold NaN; C is surrounded by 64
// sentinel elements on each side and its row padding is sentinel too: a
// store outside C[mr × nr] is a failure (brgemm_test_util.h).
//
// Tolerance, per output, by dtype (runtime/reference_error_bounds.h):
//  - plain epilogue: gemm_output_bound. bf16 products are exact in fp32; the
//    kernel's fp32 accumulation rounds once per addition, in whatever order its
//    blocking picks, so the error grows with the number of terms
//    (batch·kb, +1 for acc_in): (terms + 2)·u·Σ|a·b| + u·|bias|, u = 2⁻²⁴,
//    stretched by the activation's Lipschitz constant plus its vector-math
//    error; a bf16 output rounds once more: one bf16 ulp (2⁻⁷·|ref|) on top.
//  - GLU: gate and up are such sums (eps = (terms + 2)·u relative to their
//    Σ|terms|); a bf16 output must equal the reference's bf16 value unless the
//    exact value lies within the GLU's error εa of a rounding boundary
//    (runtime::moe_act_slack); an f32 output is within εa itself
//    (runtime::moe_act_error: moe_act_slack's εa before its bf16 step).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "runtime/cpu_features.h"
#include "tests/support/activations.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_brgemm.h"
#endif

namespace tilejit::test {
namespace {

// ---------------------------------------------------------------------------
// The case list of one row.

int k_step(Isa path) {
  return path == Isa::amx ? codegen::amx_k_step_of(DType::bf16) : 2;  // one VNNI pair otherwise
}

// The most rows the row's kernels take for `cols` computed columns.
int max_mr(Isa path, int cols) {
  if (path == Isa::amx) return 32;
  return codegen::xbyak::avx512_brgemm_max_mr((cols + 15) / 16);
}

// Under the AMX emulator every tile instruction is a signal round trip
// (~4 us), but a brgemm call executes few of them (tile loads and tdpbf16ps
// per K step of 32, ~50 per case on average here): the whole AMX list is ~30 k
// emulated instructions, well under a second, so the emulated runs take the
// same list as the hardware.
bool amx_emulated() {
  return runtime::cpu_features().amx_emulated;
}

std::vector<BrgemmCase> battery(Isa path) {
  const int ks = k_step(path);
  std::vector<BrgemmCase> v;
  std::set<std::string> seen;
  // Adds c (AMX: with packed and with row-major A where the contract allows:
  // row-major A with a K tail takes batch 1), each name once.
  // `apack` (0, 1) picks one of the two; a row-major pick the contract
  // refuses becomes a packed one.
  auto add = [&](BrgemmCase c, int apack = -1) {
    c.path = path;
    auto row_major_ok = [&] { return c.batch == 1 || c.kb % ks == 0; };
    for (int packed : {1, 0}) {
      if (path != Isa::amx && packed) continue;
      if (path == Isa::amx && apack >= 0 && packed != apack &&
          !(apack == 0 && packed && !row_major_ok()))
        continue;
      c.a_packed = packed;
      if (path == Isa::amx && !packed && !row_major_ok()) continue;
      if (packed && c.lda_pad != 0 && c.ldc_pad == 0) continue;  // lda is unused
      if (seen.insert(c.str()).second) v.push_back(c);
    }
  };
  const int m64 = max_mr(path, 64);
  const int64_t kodd = 37, klarge = 2048 + 17;
  std::vector<int64_t> ks_list = {ks, 1, ks - 1, ks + 1, 2 * ks, 5 * ks, kodd, klarge};

  // k: equal, less, greater, divisible, odd, large; full tile and sub-tile.
  for (int64_t kb : ks_list) {
    if (kb < 1) continue;
    for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}}) {
      BrgemmCase c;
      c.group = "k";
      c.mr = mr, c.nr = nr, c.kb = kb;
      add(c);
    }
  }
  // A deep reduction: 3 × 4096 terms per output (the accumulation-error
  // bound at its largest), on a tailed sub-tile with acc_in.
  {
    BrgemmCase c;
    c.group = "k";
    c.mr = 3, c.nr = 17, c.kb = 4096, c.batch = 3;
    c.acc = Acc::separate;
    add(c);
  }
  // n: every sub-tile of the 64-column block, at full M and at 5 rows.
  for (int nr : {1, 15, 16, 17, 31, 32, 33, 48, 63, 64})
    for (int mr : {max_mr(path, nr), 5})
      for (int64_t kb : {int64_t(ks), kodd}) {
        BrgemmCase c;
        c.group = "n";
        c.mr = mr, c.nr = nr, c.kb = kb;
        add(c);
      }
  // m: every row count of the row, at a full and a tailed column block.
  for (int nr : {64, 17}) {
    std::vector<int> mrs;
    for (int mr = 1; mr <= max_mr(path, nr); ++mr) mrs.push_back(mr);
    if (path == Isa::llvm)
      for (int mr : {13, 16, 32})
        if (mr > max_mr(path, nr)) mrs.push_back(mr);
    for (int mr : mrs) {
      BrgemmCase c;
      c.group = "m";
      c.mr = mr, c.nr = nr, c.kb = kodd;
      add(c);
    }
  }
  // strided A and C.
  for (auto [mr, nr, kb] : {std::tuple{m64, 64, kodd}, std::tuple{5, 17, int64_t(2 * ks + 1)},
                            std::tuple{1, 33, klarge}})
    for (auto [lp, cp] : {std::pair{7, 0}, std::pair{0, 11}, std::pair{7, 11}}) {
      BrgemmCase c;
      c.group = "stride";
      c.mr = mr, c.nr = nr, c.kb = kb, c.lda_pad = lp, c.ldc_pad = cp;
      add(c);
    }
  // batch > 1.
  for (int batch : {2, 3, 5})
    for (int64_t kb : {int64_t(ks), int64_t(2 * ks), int64_t(1), kodd})
      for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}}) {
        BrgemmCase c;
        c.group = "batch";
        c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch;
        add(c);
      }
  // Every epilogue, on an N- and K-tailed sub-tile and on a full tile with
  // batch 2 (AMX: there the accumulators load acc_in and store f32 directly).
  const std::vector<Activation> acts = testing_support::all_activations();
  const BiasKind biases[] = {BiasKind::none, BiasKind::f32, BiasKind::bf16};
  int i = 0;
  for (int shape = 0; shape < 2; ++shape)
    for (Activation act : acts)
      for (BiasKind bias : biases)
        for (DType out : {DType::f32, DType::bf16})
          for (Acc acc : {Acc::off, Acc::separate, Acc::alias}) {
            if (acc == Acc::alias && out != DType::f32) continue;
            BrgemmCase c;
            c.group = "epi";
            if (shape == 0)
              c.mr = 3, c.nr = 17, c.kb = ks + 1;
            else
              c.mr = m64, c.nr = 64, c.kb = 2 * ks, c.batch = 2;
            c.act = act, c.bias = bias, c.out = out, c.acc = acc;
            add(c, i++ % 2);
          }
  // GLU: every gated function × bias × out × acc_in on one shape, then the
  // GLU's own tails (nr ≤ 32 outputs of a 64-column block).
  const int mglu = max_mr(path, 64);
  struct G {
    Glu glu;
    Activation act;
  };
  std::vector<G> glus;
  for (Activation act : acts) glus.push_back({Glu::act_mul, act});
  glus.push_back({Glu::clamped_swiglu, Activation::none});
  i = 0;
  for (const G& g : glus)
    for (BiasKind bias : biases)
      for (DType out : {DType::f32, DType::bf16})
        for (Acc acc : {Acc::off, Acc::separate}) {
          BrgemmCase c;
          c.group = "glu";
          c.mr = mglu, c.nr = 17, c.kb = ks + 1;
          c.glu = g.glu, c.act = g.act, c.bias = bias, c.out = out, c.acc = acc;
          add(c, i++ % 2);
        }
  i = 0;
  for (int nr : {1, 15, 16, 17, 31, 32})
    for (int mr : {1, 5, mglu})
      for (int64_t kb : {int64_t(ks), kodd}) {
        const G& g = glus[size_t(i) % glus.size()];
        BrgemmCase c;
        c.group = "glu";
        c.mr = std::min(mr, mglu), c.nr = nr, c.kb = kb;
        c.glu = g.glu, c.act = g.act;
        c.bias = biases[i % 3];
        c.out = (i / 3) % 2 ? DType::bf16 : DType::f32;
        c.acc = (i / 2) % 2 ? Acc::separate : Acc::off;
        c.batch = i % 4 == 3 ? 2 : 1;
        add(c, i++ % 2);
      }
  return v;
}

// The cases of the row serving `path`, or none when this build has no such row.
std::vector<BrgemmCase> row_cases(Isa path) {
  if (jit::find_row(jit::Family::brgemm, path) == nullptr) return {};
  return battery(path);
}

// The llvm row's cases for its kernel compiled with the fma dot product
// forced (the llvm_fma instance): on a host with AVX512-BF16 the row's
// kernels use vdpbf16ps, so the portable fp32-FMA variant (the default of an
// AVX2-only host) runs here only through this instance. None in a build
// without LLVM.
std::vector<BrgemmCase> llvm_fma_cases() {
  std::vector<BrgemmCase> v;
#ifdef TILEJIT_HAVE_LLVM
  v = row_cases(Isa::llvm);
  for (BrgemmCase& c : v) c.llvm_fma = true;
#endif
  return v;
}

// ---------------------------------------------------------------------------
// The suite.

class BrgemmBattery : public ::testing::TestWithParam<BrgemmCase> {};

TEST_P(BrgemmBattery, MatchesReference) {
  const BrgemmCase& c = GetParam();
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, c.path);
  ASSERT_NE(row, nullptr);
  if (!jit::row_runs_here(*row))
    GTEST_SKIP() << "brgemm row " << isa_name(c.path) << " (" << row->emitter
                 << ") cannot run on this CPU/OS: it needs " << row->needs.str() << ", usable here "
                 << runtime::detected_features().str();
  const BrgemmData d = make_brgemm_data(c);
  if (c.llvm_fma) {
#ifdef TILEJIT_HAVE_LLVM
    // Compiled for the case, alive until its check is done.
    namespace lb = codegen::llvm_backend;
    const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::fma});
    EXPECT_TRUE(check_brgemm(d, run_brgemm(d, k.fn<BrgemmFn>())));
#endif
    return;
  }
  const jit::Kernel& k = jit::get(c.desc());
  EXPECT_TRUE(check_brgemm(d, run_brgemm(d, k.entry<BrgemmFn>())));
}

std::string case_name(const ::testing::TestParamInfo<BrgemmCase>& info) {
  return info.param.str();
}

// One instantiation per brgemm row of the registry, named by its path, and
// llvm_fma (the llvm row's list, the fma variant forced); the test below
// fails when a row appears that none of them covers.
INSTANTIATE_TEST_SUITE_P(amx, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::amx)), case_name);
INSTANTIATE_TEST_SUITE_P(avx512, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::avx512)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(llvm, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::llvm)), case_name);
INSTANTIATE_TEST_SUITE_P(llvm_fma, BrgemmBattery, ::testing::ValuesIn(llvm_fma_cases()), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BrgemmBattery);

TEST(BrgemmBatteryRows, EveryBrgemmRowIsInstantiated) {
  const Isa covered[] = {Isa::amx, Isa::avx512, Isa::llvm};
  int rows = 0;
  for (const jit::KernelRow& row : jit::kernel_rows()) {
    if (row.family != jit::Family::brgemm) continue;
    ++rows;
    EXPECT_NE(std::find(std::begin(covered), std::end(covered), row.path), std::end(covered))
        << "brgemm row " << isa_name(row.path) << " (" << row.emitter
        << ") has no instantiation in brgemm_battery_test";
    EXPECT_FALSE(row_cases(row.path).empty());
    std::printf("brgemm row %-6s %-36s %4zu cases, %s here%s\n", isa_name(row.path), row.emitter,
                row_cases(row.path).size(), jit::row_runs_here(row) ? "runs" : "skipped",
                row.path == Isa::amx && amx_emulated() ? " (AMX emulated)" : "");
    if (row.path == Isa::llvm) {
      // The forced-fma instance takes the same list (empty: TILEJIT_HAVE_LLVM
      // missing from this test's build, tests/CMakeLists.txt).
      EXPECT_EQ(llvm_fma_cases().size(), row_cases(row.path).size());
      std::printf("brgemm row %-6s %-36s %4zu cases, %s here\n", "llvm", "(fma dot forced)",
                  llvm_fma_cases().size(), jit::row_runs_here(row) ? "runs" : "skipped");
    }
  }
  EXPECT_GE(rows, 2);  // amx and avx512 in every build, llvm with LLVM
}

}  // namespace
}  // namespace tilejit::test
