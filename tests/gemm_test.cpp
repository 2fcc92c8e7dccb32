// tilejit::gemm against the scalar reference, XNNPACK-style: one battery of
// shapes (M, N, K tails around the 64-column block, the AVX-512 row blocks
// 7/9/12 and the AMX 16/32 rows, odd K, K below/at/above the 32-step), every
// epilogue (activation × bias × output dtype) with strided x and y, the
// activations' tails, and the compile bound of the M-tail variants.
//
// ctest runs this binary once per TILEJIT_ISA value (amx, avx512, scalar);
// a variant whose path this machine lacks skips (test_util.h).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "codegen/gemm_plan.h"
#include "jit/kernel_cache.h"
#include "test_util.h"
#include "tests/support/activations.h"

namespace tilejit::test {
namespace {

// ---------------------------------------------------------------------------
// The ISA lattice: the active path is one this build and CPU can run. A path
// that is missing (no AMX on the CPU, no LLVM in the build) must be capped to
// a lower one, as amx falls to avx512 on a CPU without AMX (and the variant
// skips); a path reported active must run a gemm.
class IsaLattice : public IsaTest {};

TEST_F(IsaLattice, ActivePathRunsAGemm) {
  const CpuInfo info = cpu_info();
  EXPECT_LE(info.isa, info.max_isa);
  const GemmProblem p = random_problem(3, 17, 30, Activation::silu, Bias::f32, DType::bf16);
  EXPECT_TRUE(run_and_compare(p)) << "active path " << isa_name(info.isa)
                                  << " (best the CPU allows: " << isa_name(info.max_isa) << ")";
}

// ---------------------------------------------------------------------------
// Shapes: act none, no bias, f32 out, contiguous.

using Shape = std::tuple<int64_t, int64_t, int64_t>;  // M, N, K

std::string shape_name(const ::testing::TestParamInfo<Shape>& info) {
  const auto [m, n, k] = info.param;
  return "m" + std::to_string(m) + "_n" + std::to_string(n) + "_k" + std::to_string(k);
}

class GemmShape : public IsaTestWithParam<Shape> {};

TEST_P(GemmShape, MatchesReference) {
  const auto [m, n, k] = GetParam();
  EXPECT_TRUE(run_and_compare(random_problem(m, n, k)));
}

std::vector<int64_t> small_m() {
  std::vector<int64_t> v;
  for (int64_t m = 1; m <= 33; ++m) v.push_back(m);
  for (int64_t m : {64, 127, 128, 300}) v.push_back(m);
  return v;
}

// Full cross product of the small dimensions: every M tail of every blocking
// against every N tail and K class.
INSTANTIATE_TEST_SUITE_P(Small, GemmShape,
                         ::testing::Combine(::testing::ValuesIn(small_m()),
                                            ::testing::Values(1, 15, 16, 17, 31, 32, 33, 64),
                                            ::testing::Values(1, 2, 30, 32, 64)),
                         shape_name);

// Wide N (several 64-column blocks plus a tail), with a handful of M.
INSTANTIATE_TEST_SUITE_P(LargeN, GemmShape,
                         ::testing::Combine(::testing::Values(1, 2, 7, 12, 13, 33),
                                            ::testing::Values(100, 1000, 4096),
                                            ::testing::Values(1, 2, 30, 32, 64, 100)),
                         shape_name);
// ... and with many row blocks (several M chunks per column block at 300).
INSTANTIATE_TEST_SUITE_P(LargeNTallM, GemmShape,
                         ::testing::Combine(::testing::Values(64, 127, 128, 300),
                                            ::testing::Values(100, 1000, 4096),
                                            ::testing::Values(1, 30, 64)),
                         shape_name);

// Deep K (the unrolled K loop, long fp32 accumulation chains).
INSTANTIATE_TEST_SUITE_P(LargeK, GemmShape,
                         ::testing::Combine(::testing::Values(1, 2, 7, 13, 33, 127),
                                            ::testing::Values(1, 17, 64, 100),
                                            ::testing::Values(100, 4096)),
                         shape_name);

// K above the 2048-deep chunk: fp32 partial sums carried across 2 or 3 K
// chunks (first / middle / last micro-kernels) when a task has several M
// blocks; odd last chunks.
INSTANTIATE_TEST_SUITE_P(KChunks, GemmShape,
                         ::testing::Combine(::testing::Values(1, 8, 15, 33),
                                            ::testing::Values(17, 100),
                                            ::testing::Values(2049, 4097, 6001)),
                         shape_name);

// Big problems: many M blocks and M chunks over the thread pool. Not run on
// the scalar variant (ctest filters Big/*): there the path is the reference
// itself and these cost seconds each.
INSTANTIATE_TEST_SUITE_P(Big, GemmShape,
                         ::testing::Values(Shape{1, 4096, 4096}, Shape{7, 4096, 4096},
                                           Shape{33, 1000, 4096}, Shape{127, 1000, 1000},
                                           Shape{128, 4096, 100}, Shape{300, 1000, 100},
                                           Shape{300, 4096, 64}, Shape{300, 100, 4096},
                                           Shape{64, 4096, 1024}, Shape{127, 1000, 2049},
                                           Shape{300, 1000, 1000}, Shape{2000, 17, 64},
                                           Shape{1000, 100, 30}, Shape{600, 64, 2100},
                                           // K = 65536: 128 KiB of packed A per row, so
                                           // the driver runs M in slices of one row
                                           // chunk (its 64 MiB scratch bound), K-chunked.
                                           Shape{600, 17, 65536}),
                         shape_name);

// ---------------------------------------------------------------------------
// Epilogues: every activation × bias × output dtype × x/y striding.

struct EpilogueCase {
  Shape shape;
  Activation act;
  Bias bias;
  DType out;
  bool x_strided, y_strided;
};

std::string epilogue_name(const ::testing::TestParamInfo<EpilogueCase>& info) {
  const auto& c = info.param;
  const auto [m, n, k] = c.shape;
  return "m" + std::to_string(m) + "_n" + std::to_string(n) + "_k" + std::to_string(k) + "_" +
         activation_name(c.act) + "_" + bias_name(c.bias) + "_" + dtype_name(c.out) + "out" +
         (c.x_strided ? "_xstrided" : "") + (c.y_strided ? "_ystrided" : "");
}

std::vector<EpilogueCase> epilogue_cases() {
  // Odd and even K (with a strided x, a NaN follows each row's last element),
  // N below one vector, across a tail vector, several blocks.
  // {15, 70, 2081}: several row blocks, so K is cut into chunks and the
  // epilogue runs in the last-chunk kernel on carried fp32 partial sums.
  const Shape shapes[] = {{1, 1, 1},   {2, 15, 1},   {5, 17, 30},     {13, 100, 64},
                          {33, 33, 2}, {8, 64, 101}, {12, 1000, 100}, {15, 70, 2081}};
  std::vector<EpilogueCase> v;
  for (const Shape& s : shapes)
    for (Activation act : testing_support::all_activations())
      for (Bias b : {Bias::none, Bias::f32, Bias::bf16})
        for (DType out : {DType::f32, DType::bf16})
          for (int strides = 0; strides < 4; ++strides)
            v.push_back({s, act, b, out, (strides & 1) != 0, (strides & 2) != 0});
  return v;
}

class GemmEpilogue : public IsaTestWithParam<EpilogueCase> {};

TEST_P(GemmEpilogue, MatchesReference) {
  const auto& c = GetParam();
  const auto [m, n, k] = c.shape;
  // Row strides that keep rows misaligned: K + 7 and N + 5 elements.
  const GemmProblem p = random_problem(m, n, k, c.act, c.bias, c.out, c.x_strided ? k + 7 : 0,
                                       c.y_strided ? n + 5 : 0);
  EXPECT_TRUE(run_and_compare(p));
}

INSTANTIATE_TEST_SUITE_P(All, GemmEpilogue, ::testing::ValuesIn(epilogue_cases()), epilogue_name);

// ---------------------------------------------------------------------------
// Activation tails: pre-activations laid out on a grid, built exactly.
//
// K = 2, x[i] = (v_i, 1), w[j] = (1, c_j): pre = v_i + c_j + bias_j exactly.
// v spans [-10, 10] in 64 steps and the far tails (±20, ±30, ±88, ±100, where
// exp saturates), c_j small offsets.

struct TailCase {
  Activation act;
  DType out;
};

std::string tail_name(const ::testing::TestParamInfo<TailCase>& info) {
  return std::string(activation_name(info.param.act)) + "_" + dtype_name(info.param.out) + "out";
}

class GemmActivationTails : public IsaTestWithParam<TailCase> {};

TEST_P(GemmActivationTails, MatchesReferenceOnBothTails) {
  const auto [act, out] = GetParam();
  std::vector<float> v;
  for (int i = 0; i < 64; ++i) v.push_back(-10.0f + 20.0f * static_cast<float>(i) / 63);
  for (float f : {20.f, 30.f, 60.f, 88.f, 90.f, 100.f, 1000.f}) {
    v.push_back(f);
    v.push_back(-f);
  }
  const int64_t M = static_cast<int64_t>(v.size()), N = 19, K = 2;
  GemmProblem p;
  p.m = M, p.n = N, p.k = K, p.act = act, p.out = out, p.bias = Bias::f32;
  for (float f : v) {
    p.x.push_back(f32_to_bf16(f));
    p.x.push_back(f32_to_bf16(1.0f));
  }
  for (int64_t j = 0; j < N; ++j) {
    p.w.push_back(f32_to_bf16(1.0f));
    p.w.push_back(f32_to_bf16(static_cast<float>(j - 9) / 32));
    p.bias_f32.push_back(static_cast<float>(j % 3) * 0.125f);
  }
  EXPECT_TRUE(run_and_compare(p));
}

INSTANTIATE_TEST_SUITE_P(All, GemmActivationTails,
                         ::testing::Values(TailCase{Activation::none, DType::f32},
                                           TailCase{Activation::relu, DType::f32},
                                           TailCase{Activation::silu, DType::f32},
                                           TailCase{Activation::gelu_tanh, DType::f32},
                                           TailCase{Activation::gelu_erf, DType::f32},
                                           TailCase{Activation::relu2, DType::f32},
                                           TailCase{Activation::relu, DType::bf16},
                                           TailCase{Activation::silu, DType::bf16},
                                           TailCase{Activation::gelu_tanh, DType::bf16},
                                           TailCase{Activation::gelu_erf, DType::bf16},
                                           TailCase{Activation::relu2, DType::bf16}),
                         tail_name);

// ---------------------------------------------------------------------------
// Other properties of a call.

class GemmCall : public IsaTest {};

// One packed weight serves every M, activation and output dtype.
TEST_F(GemmCall, OnePackedWeightServesManyCalls) {
  const int64_t N = 100, K = 64;
  GemmProblem base = random_problem(1, N, K);
  const PackedWeight w = pack_weight(TensorView(base.w.data(), DType::bf16, {N, K}));
  for (int64_t m : {1, 9, 40}) {
    for (Activation act : {Activation::none, Activation::gelu_erf}) {
      GemmProblem p = random_problem(m, N, K, act, Bias::bf16, DType::bf16);
      p.w = base.w;
      EXPECT_TRUE(run_and_compare(p, &w));
    }
  }
}

// Results are bit-identical across repeated calls and thread counts: each
// output element is computed by one micro-kernel call, whatever the split.
TEST_F(GemmCall, DeterministicAcrossCallsAndThreadCounts) {
  const int saved = num_threads();
  const GemmProblem p = random_problem(77, 300, 96, Activation::silu, Bias::f32, DType::f32);
  const PackedWeight w = pack_weight(TensorView(p.w.data(), DType::bf16, {p.n, p.k}));
  GemmOutput first, again, one_thread, three_threads;
  ASSERT_TRUE(run_and_compare(p, &w, &first));
  ASSERT_TRUE(run_and_compare(p, &w, &again));
  set_num_threads(1);
  ASSERT_TRUE(run_and_compare(p, &w, &one_thread));
  set_num_threads(3);
  ASSERT_TRUE(run_and_compare(p, &w, &three_threads));
  set_num_threads(saved);
  EXPECT_EQ(first.y_bytes, again.y_bytes);
  EXPECT_EQ(first.y_bytes, one_thread.y_bytes);
  EXPECT_EQ(first.y_bytes, three_threads.y_bytes);
}

// Pre-activations at the ends of the float range, where a JIT activation's
// clamped exp or an intermediate overflow used to part from the definition:
// silu / gelu_tanh of -2.5e38 gave about -1 (e^x capped at e^88.4), gelu_erf
// of 2.5e38 gave +Inf (x·2 overflowed before the halving), silu / gelu of
// -Inf gave -Inf where the definition's -Inf·0 is NaN. Each result must be the
// double-precision definition's, rounded to the f32 output, within 1e-6 relative (the exp and erf
// approximations are good to ~2e-7) plus 1e-30 absolute (the definition's
// tiny negative tails, e.g. silu(-100) = -3.7e-42, may come out as -0).
TEST_F(GemmCall, ActivationsAtTheEndsOfTheFloatRange) {
  const std::vector<float> pre = {2.5e38f, -2.5e38f, 3.38e38f, -3.38e38f, 88.5f,
                                  -88.5f,  100.0f,   -100.0f,  1e30f,     -1e30f};
  std::vector<uint16_t> x;
  for (float v : pre) x.push_back(f32_to_bf16(v));
  x.push_back(f32_to_bf16(std::numeric_limits<float>::infinity()));
  x.push_back(f32_to_bf16(-std::numeric_limits<float>::infinity()));
  const int64_t M = static_cast<int64_t>(x.size()), N = 3;
  const std::vector<uint16_t> ones(N, f32_to_bf16(1.0f));
  const PackedWeight w = pack_weight(TensorView(ones.data(), DType::bf16, {N, 1}));
  for (Activation act : testing_support::applied_activations()) {
    std::vector<float> y(static_cast<size_t>(M * N), 123.0f);
    GemmOptions opt;
    opt.act = act;
    gemm(TensorView(x.data(), DType::bf16, {M, 1}), w, TensorView(y.data(), DType::f32, {M, N}),
         opt);
    for (int64_t i = 0; i < M; ++i) {
      const double p = bf16_to_f32(x[i]);
      // The definition rounded to the f32 output (relu2(1e30) is +Inf there).
      const double want = static_cast<float>(runtime::reference_activation(act, p));
      for (int64_t j = 0; j < N; ++j) {
        const float got = y[i * N + j];
        SCOPED_TRACE(std::string(activation_name(act)) + "(" + std::to_string(p) + ")");
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << got;
        } else if (std::isinf(want)) {
          EXPECT_EQ(got, want);
        } else {
          EXPECT_LE(std::abs(got - want), 1e-6 * std::abs(want) + 1e-30) << got << " want " << want;
        }
      }
    }
  }
}

// M = 0 is a valid empty problem: nothing is read or written.
TEST_F(GemmCall, EmptyMDoesNothing) {
  const GemmProblem p = random_problem(1, 17, 30);
  const PackedWeight w = pack_weight(TensorView(p.w.data(), DType::bf16, {17, 30}));
  float y = 123.0f;
  EXPECT_NO_THROW(gemm(TensorView(static_cast<void*>(nullptr), DType::bf16, {0, 30}), w,
                       TensorView(&y, DType::f32, {0, 17})));
  EXPECT_EQ(y, 123.0f);
}

// ---------------------------------------------------------------------------
// Compile bound: on one (N, K) the driver needs the main row block and one
// kernel per M tail (1..mr-1), each for the full 64-column block and the N
// tail. Once a variant exists no call compiles it again, so `compiles` grows
// by exactly the number of variants a call needs for the first time, and
// stops growing once all of them exist.

// The (rows, columns) micro-kernels a call with M rows needs.
std::set<std::tuple<Isa, int, int>> variants_for(Isa path, int64_t M, int64_t N, int mr) {
  std::set<std::tuple<Isa, int, int>> v;
  std::vector<int> rows, cols;
  if (M >= mr) rows.push_back(mr);
  if (M % mr != 0) rows.push_back(static_cast<int>(M % mr));
  if (N >= 64) cols.push_back(64);
  if (N % 64 != 0) cols.push_back(static_cast<int>(N % 64));
  for (int r : rows)
    for (int c : cols) v.insert({path, r, c});
  return v;
}

// The task split feeds the threads when the column blocks cannot: a GEMM of
// one column block (N <= 64) and M <= 256 was one task (one thread busy), and
// M = 256 two tasks of 252 and 4 rows. Row chunks are whole mr blocks, of
// about equal size, and n_blocks x chunks tasks divide evenly over the
// threads; with enough column blocks, or one thread, the split is
// task_rows() as before. (Planning only: any host.)
TEST(GemmSchedule, ThreadsGetEvenTasksWhenColumnsCannot) {
  const codegen::GemmPlan one = codegen::plan_gemm(
      {64, 4096, codegen::BiasKind::none, Activation::none, DType::bf16}, Isa::avx512);
  const int64_t mr = one.mr;
  for (int64_t threads : {2, 3, 4})
    for (int64_t m : {int64_t{2} * mr, int64_t{64}, int64_t{128}, int64_t{256}, int64_t{257},
                      int64_t{512}, int64_t{1000}}) {
      const codegen::GemmPlan::Schedule s = one.schedule(m, threads);
      SCOPED_TRACE("threads " + std::to_string(threads) + " M " + std::to_string(m));
      ASSERT_EQ(s.n_blocks, 1);
      EXPECT_EQ(s.task_rows % mr, 0);
      const int64_t chunks = s.row_chunks(m);
      EXPECT_GE(chunks, std::min<int64_t>(threads, (m + mr - 1) / mr));
      if (m >= threads * mr) {
        EXPECT_EQ(chunks % threads, 0) << "uneven over the threads";
      }
      // About equal: every chunk has rows (no empty task), none more than the
      // heuristic's task_rows.
      EXPECT_GE(m - (chunks - 1) * s.task_rows, 1);
      EXPECT_LE(s.task_rows, one.task_rows());
    }
  EXPECT_EQ(one.schedule(256, 1).task_rows, one.task_rows());
  const codegen::GemmPlan wide = codegen::plan_gemm(
      {256, 4096, codegen::BiasKind::none, Activation::none, DType::bf16}, Isa::avx512);
  EXPECT_EQ(wide.schedule(300, 2).task_rows, wide.task_rows()) << "4 column blocks feed 2 threads";
  codegen::PlanOverrides tuned;
  tuned.task_rows = 4 * mr;
  EXPECT_EQ(codegen::plan_gemm({64, 4096, codegen::BiasKind::none, Activation::none, DType::bf16},
                               Isa::avx512, tuned)
                .schedule(256, 2)
                .task_rows,
            4 * mr)
      << "a tuned task_rows stays";
}

class GemmCompileBound : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    // Kernels loaded from TILEJIT_CACHE_DIR do not count as compiles.
    jit::KernelCache::global().set_disk_dir("");
  }
};

TEST_F(GemmCompileBound, MTailVariantsCompileOnceThenNothing) {
  // A shape no other test of this binary uses, so every kernel is new.
  const int64_t N = 100, K = 77;
  const Isa isa = cpu_info().isa;
  // The path serving m rows (AMX hands m ≤ 2 to AVX-512) and its row blocking.
  auto mr_of = [&](Isa path) {
    return path == Isa::scalar
               ? 1
               : codegen::plan_gemm({N, K, codegen::BiasKind::f32, Activation::silu, DType::bf16},
                                    path)
                     .mr;
  };
  const int mr = mr_of(isa);
  GemmProblem base = random_problem(1, N, K);
  const PackedWeight w = pack_weight(TensorView(base.w.data(), DType::bf16, {N, K}));
  std::set<std::tuple<Isa, int, int>> seen;
  const uint64_t start = cache_stats().compiles;
  for (int64_t m = 1; m <= 40; ++m) {
    GemmProblem p = random_problem(m, N, K, Activation::silu, Bias::f32, DType::bf16);
    p.w = base.w;
    const uint64_t before = cache_stats().compiles;
    ASSERT_TRUE(run_and_compare(p, &w));
    size_t fresh = 0;
    if (isa != Isa::scalar)  // the scalar path compiles nothing
      for (const auto& v : variants_for(codegen::gemm_isa_for_rows(isa, m), m, N,
                                        mr_of(codegen::gemm_isa_for_rows(isa, m))))
        fresh += seen.insert(v).second ? 1 : 0;
    EXPECT_EQ(cache_stats().compiles - before, fresh)
        << "M=" << m << " (mr=" << mr << ", path " << isa_name(isa) << ")";
  }
  const uint64_t all = cache_stats().compiles - start;
  // main + (mr-1) tails, times (full block, N tail); M up to 40 ≥ mr meets
  // all; plus rows 1 and 2 on AVX-512 where AMX hands them over.
  const uint64_t handed_over = codegen::gemm_isa_for_rows(isa, 1) != isa ? 4 : 0;
  EXPECT_EQ(all, isa == Isa::scalar ? 0u : static_cast<uint64_t>(2 * mr) + handed_over);
  // Any further M compiles nothing.
  const uint64_t settled = cache_stats().compiles;
  for (int64_t m : {1, 5, 17, 40, 41, 64, 99, 130}) {
    GemmProblem p = random_problem(m, N, K, Activation::silu, Bias::f32, DType::bf16);
    p.w = base.w;
    ASSERT_TRUE(run_and_compare(p, &w));
  }
  EXPECT_EQ(cache_stats().compiles, settled);
}

// K deeper than one chunk: a GEMM of m rows needs the kernels its plan lists
// (GemmPlan::variants_for, on the path gemm_isa_for_rows picks for m); the
// compiles are exactly the distinct ones, so M = 1..40 compiles a bounded
// set and later shapes compile only the variants they add (on AMX, M = 41
// and 77 add K-chunked tail kernels of 9 and 13 rows).
TEST_F(GemmCompileBound, KChunkedVariantsAreBounded) {
  const int64_t N = 100, K = 4100;  // fresh: 3 chunks of ≤ 2048
  const Isa isa = cpu_info().isa;
  const codegen::GemmSpec spec{N, K, codegen::BiasKind::none, Activation::relu, DType::f32};
  std::set<std::string> seen;
  // The distinct kernel keys the plan says m rows need and no earlier m did.
  auto added_by = [&](int64_t m) {
    uint64_t n = 0;
    for (const std::string& key : gemm_kernel_keys(spec, isa, m)) n += seen.insert(key).second;
    return n;
  };
  GemmProblem base = random_problem(1, N, K);
  const PackedWeight w = pack_weight(TensorView(base.w.data(), DType::bf16, {N, K}));
  uint64_t expected = 0;
  const uint64_t start = cache_stats().compiles;
  for (int64_t m = 1; m <= 40; ++m) {
    GemmProblem p = random_problem(m, N, K, Activation::relu);
    p.w = base.w;
    ASSERT_TRUE(run_and_compare(p, &w));
    expected += added_by(m);
    EXPECT_EQ(cache_stats().compiles - start, expected) << "after M = " << m;
  }
  // The set is bounded: ≤ 2 row variants × 2 column variants × 3 chunk kinds
  // per row count the plan has, on at most two paths.
  const int mr = isa == Isa::scalar ? 1 : codegen::plan_gemm(spec, isa).mr;
  EXPECT_LE(expected, static_cast<uint64_t>(2 * 4 * (mr + 2)));
  for (int64_t m : {3, 40, 41, 77, 100, 1000}) {
    GemmProblem p = random_problem(m, N, K, Activation::relu);
    p.w = base.w;
    ASSERT_TRUE(run_and_compare(p, &w));
    expected += added_by(m);
    EXPECT_EQ(cache_stats().compiles - start, expected) << "after M = " << m;
  }
}

}  // namespace
}  // namespace tilejit::test
