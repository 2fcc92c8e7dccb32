// Compile-once and thread safety: tilejit::gemm on a fresh shape from 8
// threads at once (bf16 and quantized weights), jit::KernelCache directly (one emit per key, errors
// reach every waiter and a later call retries), and runtime::parallel_for.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <latch>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "codegen/gemm_plan.h"
#include "jit/kernel_cache.h"
#include "runtime/lazy_statics.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

// LeakSanitizer's hook (read at exit, in sanitizer builds only): the children
// of ProcessExitWhileCallsRun exit while their threads hold buffers, which
// are live, not leaks.
namespace {
int g_lsan_off = 0;
}  // namespace
extern "C" int __lsan_is_turned_off() {
  return g_lsan_off;
}

namespace tilejit::test {
namespace {

using ::testing::HasSubstr;

constexpr int kThreads = 8;

// Runs body(t) on kThreads threads released together by a latch.
template <class F>
void run_together(F&& body) {
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      body(t);
    });
  for (auto& th : threads) th.join();
}

// ---------------------------------------------------------------------------
// tilejit::gemm from 8 threads

codegen::GemmSpec concurrency_spec(int64_t N, int64_t K) {
  return {N, K, codegen::BiasKind::bf16, Activation::gelu_tanh, DType::f32};
}

class GemmConcurrency : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    // Kernels loaded from TILEJIT_CACHE_DIR do not count as compiles.
    jit::KernelCache::global().set_disk_dir("");
  }
};

// Eight threads call gemm on one never-seen shape at the same moment: the
// kernels it needs are compiled exactly once and every result is right.
TEST_F(GemmConcurrency, FreshShapeCompilesOnceUnderEightThreads) {
  const Isa isa = cpu_info().isa;
  const int64_t M = 7, N = 192, K = 93;  // K used by no other test in this binary
  const size_t expected = gemm_kernel_keys(concurrency_spec(N, K), isa, M).size();
  if (isa == Isa::avx512) {
    EXPECT_EQ(expected, 1u) << "AVX-512 blocks 7 rows for N >= 64";
  }

  const GemmProblem p = random_problem(M, N, K, Activation::gelu_tanh, Bias::bf16, DType::f32);
  const PackedWeight w = pack_weight(TensorView(p.w.data(), DType::bf16, {N, K}));
  const CacheStats before = cache_stats();
  std::vector<::testing::AssertionResult> results(kThreads, ::testing::AssertionSuccess());
  run_together([&](int t) { results[t] = run_and_compare(p, &w); });
  const CacheStats after = cache_stats();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t]) << "thread " << t;
  EXPECT_EQ(after.compiles - before.compiles, expected) << "path " << isa_name(isa);
  EXPECT_EQ(after.kernels - before.kernels, expected);
}

// Eight threads with eight different M on one fresh shape: the compiles are the
// union of the variants they need, each once.
// The process exits (static destructors run) while other threads are inside
// gemm, making new kernels: it must end with its own status, not a crash (a
// worker died in the kernel cache's destroyed disk-cache state, and on the
// llvm path inside LLVM's destroyed statics). Ten children; the parent made
// a kernel first, so the children start with LLVM's statics made (the first
// compiles of a process stay a window: docs/reliability.md).
TEST_F(GemmConcurrency, ProcessExitWhileCallsRun) {
  if (kUnderTsan) GTEST_SKIP() << "ThreadSanitizer does not support threads started after fork";
  ASSERT_TRUE(run_and_compare(random_problem(3, 70, 40)));
  for (int child = 0; child < 10; ++child) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(60);
      g_lsan_off = 1;
      for (int t = 0; t < 4; ++t)
        std::thread([t, child] {
          for (int64_t k = 1;; ++k) {
            const GemmProblem p = random_problem(16 + t, 64 + t, 100 + 40 * child + 4 * k + t);
            (void)run_and_compare(p);
          }
        }).detach();
      std::this_thread::sleep_for(std::chrono::milliseconds(2 + 3 * child));
      std::exit(0);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << child << ": "
        << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                : "exit " + std::to_string(WEXITSTATUS(status)));
  }
}

// Runs this test binary again in a fresh process with only the test
// `filter`, its environment plus `extra` and an empty TILEJIT_CACHE_DIR
// (compiles, not loads); its wait status.
int run_child_test(const std::string& filter, const std::vector<std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::strncmp(*e, "TILEJIT_CACHE_DIR=", 18) != 0) env.emplace_back(*e);
  env.emplace_back("TILEJIT_CACHE_DIR=");
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::string self = "/proc/self/exe", arg = "--gtest_filter=" + filter;
  char* argv[] = {self.data(), arg.data(), nullptr};
  pid_t pid = 0;
  if (::posix_spawn(&pid, self.c_str(), nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  return ::waitpid(pid, &status, 0) == pid ? status : -1;
}

std::string wait_status_str(int status) {
  if (status == -1) return "could not spawn or wait";
  if (WIFSIGNALED(status))
    return "signal " + std::to_string(WTERMSIG(status)) +
           (WTERMSIG(status) == SIGALRM ? " (its alarm: hung)" : "");
  return "exit " + std::to_string(WEXITSTATUS(status));
}

// The same in a fresh process, during its first compiles: this binary run
// again with only ExitChildDuringFirstCompiles, which starts four threads
// making LLVM kernels and exits `ms` later. LLVM made the statics of its
// instruction selection (SDNode's interned value types) in the first
// compile, after every exit handler, so exit freed them under compiles in
// flight (16 of 100 such processes crashed; llvm_jit.cpp now makes them with
// the JIT). The delays cover the first compiles (2-47 ms).
TEST_F(GemmConcurrency, ExitDuringTheProcesssFirstCompiles) {
  if (kUnderTsan) GTEST_SKIP() << "ThreadSanitizer: exit with running threads is its report";
  if (cpu_info().isa != Isa::llvm) GTEST_SKIP() << "the LLVM JIT's first compiles";
  for (int child = 0; child < 16; ++child) {
    const int status =
        run_child_test("GemmConcurrency.ExitChildDuringFirstCompiles",
                       {"TILEJIT_TEST_EXIT_AFTER_MS=" + std::to_string(2 + 3 * child)});
    EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "child " << child << " (exit after " << 2 + 3 * child
        << " ms): " << wait_status_str(status);
  }
}

// The child of ExitDuringTheProcesssFirstCompiles (skipped when run otherwise).
TEST_F(GemmConcurrency, ExitChildDuringFirstCompiles) {
  const char* ms = std::getenv("TILEJIT_TEST_EXIT_AFTER_MS");
  if (ms == nullptr) GTEST_SKIP() << "run in a fresh process by ExitDuringTheProcesssFirstCompiles";
  ::alarm(60);
  g_lsan_off = 1;
  for (int t = 0; t < 4; ++t)
    std::thread([t] {
      for (int64_t k = 1;; ++k)
        (void)run_and_compare(random_problem(16 + t, 64 + t, 100 + 4 * k + t));
    }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(ms)));
  std::exit(0);
}

// An exit handler (or a static destructor) that needs a kernel the process
// has not made: the exit gate refuses it with an Error on the exiting
// thread, whose tasks run inline, instead of parking it (and the pool worker
// it waited for) until an exit that never came; kernels made before still
// run. The child below registers its handler before its first compile, so
// the handler runs after the gate has closed.
TEST_F(GemmConcurrency, AnExitHandlerNeedingANewKernelGetsAnError) {
  if (cpu_info().isa != Isa::llvm) GTEST_SKIP() << "the LLVM JIT's exit gate";
  const int status =
      run_child_test("GemmConcurrency.ExitHandlerChild", {"TILEJIT_TEST_EXIT_HANDLER=1"});
  EXPECT_TRUE(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << wait_status_str(status);
}

// The child of AnExitHandlerNeedingANewKernelGetsAnError.
int g_exit_handler_code = 10;
void exit_handler_calls_gemm() {
  // A shape made before exit (warm) runs and is right; a new one is an Error.
  const bool warm_ok = run_and_compare(random_problem(33, 96, 70));
  const GemmProblem p = random_problem(21, 80, 1007);
  const PackedWeight w = pack_weight(TensorView(p.w.data(), DType::bf16, {p.n, p.k}));
  std::vector<float> y(size_t(p.m * p.n));
  try {
    gemm(TensorView(p.x.data(), DType::bf16, {p.m, p.k}), w,
         TensorView(y.data(), DType::f32, {p.m, p.n}));
    std::_Exit(11);  // compiled after the gate closed
  } catch (const Error& e) {
    const bool named = std::string(e.what()).find("the process is exiting") != std::string::npos;
    std::_Exit(warm_ok && named ? 0 : 12);
  }
}
TEST_F(GemmConcurrency, ExitHandlerChild) {
  if (std::getenv("TILEJIT_TEST_EXIT_HANDLER") == nullptr)
    GTEST_SKIP() << "run in a fresh process by AnExitHandlerNeedingANewKernelGetsAnError";
  ::alarm(30);
  g_lsan_off = 1;
  std::atexit(exit_handler_calls_gemm);  // before the gate's registrations
  ASSERT_TRUE(run_and_compare(random_problem(33, 96, 70)));
  std::exit(g_exit_handler_code);  // the handler ends the process (0 on success)
}

// A caller cancelled (pthread_cancel) while its call waits for the pool's
// workers: the cancel used to unwind the caller's frame under them (a
// SIGSEGV on the scalar path, a later call's outputs never written on llvm,
// the next caller waiting forever). Calls are no cancellation points now:
// every call the thread began ends, and the next call is right.
std::atomic<int64_t> g_calls_begun{0}, g_calls_ended{0};
void* gemm_until_cancelled(void* arg) {
  const auto* p = static_cast<const GemmProblem*>(arg);
  const PackedWeight w = pack_weight(TensorView(p->w.data(), DType::bf16, {p->n, p->k}));
  std::vector<float> y(size_t(p->m * p->n));
  for (;;) {
    pthread_testcancel();  // the only place the cancel may act
    g_calls_begun.fetch_add(1);
    gemm(TensorView(p->x.data(), DType::bf16, {p->m, p->k}), w,
         TensorView(y.data(), DType::f32, {p->m, p->n}));
    g_calls_ended.fetch_add(1);
  }
  return nullptr;
}
TEST_F(GemmConcurrency, ACancelledCallerLeavesThePoolWhole) {
  const bool scalar = cpu_info().isa == Isa::scalar;
  const GemmProblem big = scalar ? random_problem(32, 256, 256) : random_problem(128, 1024, 1024);
  for (int round = 0; round < 6; ++round) {
    g_calls_begun.store(0);
    g_calls_ended.store(0);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, nullptr, gemm_until_cancelled, const_cast<GemmProblem*>(&big)), 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(40 + 7 * round));
    pthread_cancel(t);
    void* res = nullptr;
    ASSERT_EQ(pthread_join(t, &res), 0);
    EXPECT_EQ(res, PTHREAD_CANCELED);
    EXPECT_EQ(g_calls_begun.load(), g_calls_ended.load()) << "round " << round;
    ASSERT_TRUE(run_and_compare(random_problem(16, 256, 256))) << "round " << round;
  }
}

TEST_F(GemmConcurrency, MixedTailsCompileTheUnionOnce) {
  const Isa isa = cpu_info().isa;
  const int64_t N = 100, K = 59;  // fresh; N has a 36-column tail
  const int64_t ms[kThreads] = {1, 3, 7, 10, 14, 33, 40, 64};
  std::set<std::string> all;
  for (int64_t m : ms) all.merge(gemm_kernel_keys(concurrency_spec(N, K), isa, m));
  const size_t expected = all.size();

  std::vector<GemmProblem> problems;
  for (int64_t m : ms) {
    problems.push_back(random_problem(m, N, K, Activation::gelu_tanh, Bias::bf16, DType::f32));
    problems.back().w = problems.front().w;
  }
  const PackedWeight w = pack_weight(TensorView(problems[0].w.data(), DType::bf16, {N, K}));
  const CacheStats before = cache_stats();
  std::vector<::testing::AssertionResult> results(kThreads, ::testing::AssertionSuccess());
  run_together([&](int t) { results[t] = run_and_compare(problems[t], &w); });
  const CacheStats after = cache_stats();
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t]) << "thread " << t;
  EXPECT_EQ(after.compiles - before.compiles, expected) << "path " << isa_name(isa);

  // A second round finds everything compiled.
  run_together([&](int t) { results[t] = run_and_compare(problems[t], &w); });
  for (int t = 0; t < kThreads; ++t) EXPECT_TRUE(results[t]) << "thread " << t;
  EXPECT_EQ(cache_stats().compiles, after.compiles);
}

// Random bytes in [lo, hi].
std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n, int lo, int hi) {
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(d(rng));
  return v;
}

// call(t, y) writes thread t's output into y. Round 0 runs every thread's
// call at once (on fresh shapes their kernels compile concurrently), then
// each call runs alone, then `rounds` − 1 more concurrent rounds (a race
// shows in some rounds only): every concurrent output must be the alone one,
// bit for bit (same plan, same bits), and finite. what(t) names the call.
void expect_concurrent_calls_match_alone(int rounds,
                                         const std::function<void(int, std::vector<float>&)>& call,
                                         const std::function<std::string(int)>& what) {
  std::vector<std::vector<std::vector<float>>> together(rounds,
                                                        std::vector<std::vector<float>>(kThreads));
  std::vector<std::vector<float>> alone(kThreads);
  std::vector<std::string> errors(kThreads);
  auto round = [&](int r) {
    run_together([&](int t) {
      try {
        call(t, together[r][t]);
      } catch (const std::exception& e) {
        errors[t] = e.what();
      }
    });
  };
  round(0);
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(errors[t], "") << what(t);
    call(t, alone[t]);
    for (float v : alone[t]) ASSERT_TRUE(std::isfinite(v)) << what(t);
  }
  for (int r = 1; r < rounds; ++r) round(r);
  for (int r = 0; r < rounds; ++r)
    for (int t = 0; t < kThreads; ++t) {
      ASSERT_EQ(errors[t], "") << what(t);
      ASSERT_EQ(together[r][t].size(), alone[t].size()) << what(t);
      EXPECT_EQ(std::memcmp(together[r][t].data(), alone[t].data(), alone[t].size() * 4), 0)
          << "round " << r << ", " << what(t)
          << ": a concurrent call's output differs from the same call alone";
    }
}

// Quantized weights from 8 threads at once: int4 on both routes (the
// automatic rule and forced), fp8 and MXFP4, fresh shapes, each thread its
// own M (fused decode rows, row groups, the dequant and W4A8 routes). Each
// output must equal, bit for bit, the same call made alone afterwards (same
// plan, same bits): nothing a call builds (activation codes, dequantized
// chunks, W4A8 group sums) may be shared between concurrent callers.
TEST_F(GemmConcurrency, QuantizedCallsAgreeWithSerialCalls) {
  const int64_t N = 136, K = 200;  // fresh; an 8-column N tail, K past every 64 / 128 block
  std::mt19937 rng(41);
  auto bytes = [&](size_t n, int lo, int hi) { return random_bytes(rng, n, lo, hi); };
  // int4 GPTQ, group 64 (G = 4, the last group 8 wide), zero points.
  const int64_t G = (K + 63) / 64, n8 = N / 8;
  std::vector<uint8_t> qw = bytes(size_t(K / 8 * N) * 4, 0, 255),
                       qz = bytes(size_t(G * n8) * 4, 0, 255);
  std::vector<float> s4(static_cast<size_t>(G * N));
  for (auto& v : s4) v = std::uniform_real_distribution<float>(0.01f, 0.02f)(rng);
  Int4Weight i4;
  i4.qweight = TensorView(qw.data(), DType::i32, {K / 8, N});
  i4.scales = TensorView(s4.data(), DType::f32, {G, N});
  i4.qzeros = TensorView(qz.data(), DType::i32, {G, n8});
  i4.group_size = 64;
  // fp8 e4m3 per channel: every finite code (0x7F / 0xFF are NaN).
  std::vector<uint8_t> w8 = bytes(size_t(N * K), 0, 0x7E);
  for (auto& b : w8) b |= static_cast<uint8_t>(rng() & 0x80);
  std::vector<float> s8(static_cast<size_t>(N), 1.0f / 64);
  // MXFP4: e2m1 codes, e8m0 scales around 2^0.
  const int64_t kb = (K + 31) / 32;
  std::vector<uint8_t> mb = bytes(size_t(N * kb * 16), 0, 255),
                       ms = bytes(size_t(N * kb), 122, 130);
  const PackedWeight weights[] = {
      pack_weight(i4),
      pack_weight(Fp8Weight{TensorView(w8.data(), DType::f8e4m3, {N, K}),
                            TensorView(s8.data(), DType::f32, {N})}),
      pack_weight(Mxfp4Weight{TensorView(mb.data(), DType::u8, {N, kb, 16}),
                              TensorView(ms.data(), DType::u8, {N, kb}), K})};
  struct Call {
    int w;
    int64_t m;
    Int4Route route;
  };
  const Call calls[kThreads] = {{0, 1, Int4Route::automatic}, {0, 12, Int4Route::automatic},
                                {0, 5, Int4Route::w4a8},      {0, 33, Int4Route::w4a16},
                                {1, 3, Int4Route::automatic}, {1, 40, Int4Route::automatic},
                                {2, 2, Int4Route::automatic}, {2, 17, Int4Route::automatic}};
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(64 * K), 43, -1, 1);
  auto run = [&](const Call& c, std::vector<float>& y) {
    y.assign(static_cast<size_t>(c.m * N), -1.0f);
    GemmOptions opt;
    if (c.w == 0) opt.int4_route = c.route;
    gemm(TensorView(x.data(), DType::bf16, {c.m, K}), weights[c.w],
         TensorView(y.data(), DType::f32, {c.m, N}), opt);
  };
  expect_concurrent_calls_match_alone(
      12, [&](int t, std::vector<float>& y) { run(calls[t], y); },
      [&](int t) {
        return "thread " + std::to_string(t) + " (weight " + std::to_string(calls[t].w) + ", M " +
               std::to_string(calls[t].m) + ")";
      });
}

// Quantized experts from 8 threads at once, as the GEMMs above: int4 (GPTQ,
// both routes) and MXFP4 experts, each thread its own T and routing, every
// output bit for bit the same call's alone.
TEST_F(GemmConcurrency, QuantizedExpertsAgreeWithSerialCalls) {
  constexpr int64_t E = 4, H = 128, I = 40, kTop = 2;  // fresh shapes; I not a multiple of 32
  std::mt19937 rng(47);
  auto bytes = [&](size_t n, int lo, int hi) { return random_bytes(rng, n, lo, hi); };
  // Per expert and projection (n rows of k): the int4 and MXFP4 tensors.
  struct Tensors {
    std::vector<uint8_t> qw, qz, mb, ms;
    std::vector<float> s4;
  };
  std::vector<Tensors> t13(E), t2(E);
  auto make = [&](Tensors& t, int64_t n, int64_t k, Int4Weight& i4, Mxfp4Weight& mx) {
    const int64_t g = (k + 31) / 32;
    t.qw = bytes(size_t(k / 8 * n) * 4, 0, 255);
    t.qz = bytes(size_t(g * n / 8) * 4, 0, 255);
    t.s4.resize(static_cast<size_t>(g * n));
    for (auto& v : t.s4) v = std::uniform_real_distribution<float>(0.01f, 0.02f)(rng);
    t.mb = bytes(size_t(n * g * 16), 0, 255);
    t.ms = bytes(size_t(n * g), 122, 130);
    i4.qweight = TensorView(t.qw.data(), DType::i32, {k / 8, n});
    i4.scales = TensorView(t.s4.data(), DType::f32, {g, n});
    i4.qzeros = TensorView(t.qz.data(), DType::i32, {g, n / 8});
    i4.group_size = 32;
    mx = Mxfp4Weight{TensorView(t.mb.data(), DType::u8, {n, g, 16}),
                     TensorView(t.ms.data(), DType::u8, {n, g}), k};
  };
  std::vector<Int4Weight> i13(E), i2(E);
  std::vector<Mxfp4Weight> m13(E), m2(E);
  for (int64_t e = 0; e < E; ++e) {
    make(t13[e], 2 * I, H, i13[e], m13[e]);
    make(t2[e], H, I, i2[e], m2[e]);
  }
  const PackedExperts w13[] = {pack_experts(i13, ExpertProj::gate_up),
                               pack_experts(m13, ExpertProj::gate_up)};
  const PackedExperts w2[] = {pack_experts(i2, ExpertProj::down),
                              pack_experts(m2, ExpertProj::down)};
  struct Call {
    int w;
    int64_t t;
    Int4Route route;
  };
  const Call calls[kThreads] = {{0, 1, Int4Route::automatic}, {0, 5, Int4Route::automatic},
                                {0, 12, Int4Route::w4a8},     {0, 40, Int4Route::automatic},
                                {0, 3, Int4Route::w4a16},     {1, 1, Int4Route::automatic},
                                {1, 7, Int4Route::automatic}, {1, 20, Int4Route::automatic}};
  constexpr int64_t kMaxT = 40;
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(kMaxT * H), 53, -1, 1);
  std::vector<int32_t> ids(static_cast<size_t>(kMaxT * kTop));
  std::vector<float> tw(ids.size());
  for (int64_t r = 0; r < kMaxT; ++r) {
    ids[r * kTop] = static_cast<int32_t>(rng() % E);
    ids[r * kTop + 1] = static_cast<int32_t>((ids[r * kTop] + 1 + rng() % (E - 1)) % E);
    tw[r * kTop] = 0.7f, tw[r * kTop + 1] = 0.3f;
  }
  auto run = [&](const Call& c, std::vector<float>& y) {
    y.assign(static_cast<size_t>(c.t * H), -1.0f);
    MoeOptions opt;
    opt.int4_route = c.route;
    fused_experts(TensorView(x.data(), DType::bf16, {c.t, H}), w13[c.w], w2[c.w],
                  TensorView(tw.data(), DType::f32, {c.t, kTop}),
                  TensorView(ids.data(), DType::i32, {c.t, kTop}),
                  TensorView(y.data(), DType::f32, {c.t, H}), opt);
  };
  expect_concurrent_calls_match_alone(
      8, [&](int t, std::vector<float>& y) { run(calls[t], y); },
      [&](int t) {
        return "thread " + std::to_string(t) + " (experts " + std::to_string(calls[t].w) + ", T " +
               std::to_string(calls[t].t) + ")";
      });
}

// ---------------------------------------------------------------------------
// jit::KernelCache directly (no ISA involved: the bytes are a tiny function).

// mov eax, imm32 ; ret
std::vector<uint8_t> return_const(int32_t v) {
  std::vector<uint8_t> b = {0xB8, 0, 0, 0, 0, 0xC3};
  std::memcpy(&b[1], &v, 4);
  return b;
}

std::string unique_key(const char* what) {
  static std::atomic<int> counter{0};
  return std::string("test;") + what + ";" + std::to_string(counter++);
}

class KernelCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { jit::KernelCache::global().set_disk_dir(""); }
};

TEST_F(KernelCacheTest, EightThreadsOneKeyEmitOnce) {
  auto& cache = jit::KernelCache::global();
  const std::string key = unique_key("once");
  std::atomic<int> emits{0};
  std::vector<const jit::Kernel*> got(kThreads, nullptr);
  const CacheStats before = cache.stats();
  run_together([&](int t) {
    got[t] = &cache.get(key, "test_return_42", [&] {
      emits.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // widen the race
      return return_const(42);
    });
  });
  const CacheStats after = cache.stats();
  EXPECT_EQ(emits.load(), 1);
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t], got[0]) << "thread " << t;
  EXPECT_EQ(after.compiles - before.compiles, 1u);
  EXPECT_EQ(after.kernels - before.kernels, 1u);
  EXPECT_EQ((after.hits + after.misses) - (before.hits + before.misses),
            static_cast<uint64_t>(kThreads));
  EXPECT_GE(after.misses - before.misses, 1u);
  EXPECT_EQ(got[0]->key, key);
  EXPECT_EQ(got[0]->name, "test_return_42");
  // The bytes run.
  EXPECT_EQ(got[0]->entry<int (*)()>()(), 42);
  // A later lookup is a hit and emits nothing.
  const jit::Kernel& again = cache.get(key, "test_return_42", [&] {
    emits.fetch_add(1);
    return return_const(0);
  });
  EXPECT_EQ(&again, got[0]);
  EXPECT_EQ(emits.load(), 1);
  EXPECT_EQ(cache.stats().hits, after.hits + 1);
}

TEST_F(KernelCacheTest, DistinctKeysAreDistinctKernels) {
  auto& cache = jit::KernelCache::global();
  std::vector<const jit::Kernel*> got(kThreads, nullptr);
  std::vector<std::string> keys;
  for (int t = 0; t < kThreads; ++t) keys.push_back(unique_key("distinct"));
  run_together([&](int t) { got[t] = &cache.get(keys[t], "k", [t] { return return_const(t); }); });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(got[t]->entry<int (*)()>()(), t);
}

// An emit that throws: every waiter sees the error, nothing is cached, and a
// later call compiles successfully.
TEST_F(KernelCacheTest, FailedEmitReachesEveryWaiterAndCanBeRetried) {
  auto& cache = jit::KernelCache::global();
  const std::string key = unique_key("throws");
  std::atomic<int> emits{0};
  std::vector<std::string> errors(kThreads);
  const CacheStats before = cache.stats();
  run_together([&](int t) {
    try {
      cache.get(key, "test_throws", [&]() -> std::vector<uint8_t> {
        emits.fetch_add(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        throw Error("emit failed on purpose");
      });
      errors[t] = "<no exception>";
    } catch (const Error& e) {
      errors[t] = e.what();
    } catch (...) {
      errors[t] = "<other exception>";
    }
  });
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(errors[t], "emit failed on purpose") << "thread " << t;
  // Threads that arrived while the first emit ran waited on it; a thread that
  // arrived after the failure was erased may try again (and fail again).
  EXPECT_GE(emits.load(), 1);
  EXPECT_LE(emits.load(), kThreads);
  EXPECT_EQ(cache.stats().compiles, before.compiles);
  EXPECT_EQ(cache.stats().kernels, before.kernels);

  // Retry with a working emit.
  const jit::Kernel& k = cache.get(key, "test_retry", [] { return return_const(7); });
  EXPECT_EQ(k.entry<int (*)()>()(), 7);
  EXPECT_EQ(cache.stats().compiles, before.compiles + 1);
  // And it is now cached.
  int late = 0;
  const jit::Kernel& k2 = cache.get(key, "test_retry", [&] {
    ++late;
    return return_const(8);
  });
  EXPECT_EQ(&k2, &k);
  EXPECT_EQ(late, 0);
}

// fork() while another thread is making a kernel: the child's cache must not
// wait for that kernel (its maker is not in the child, so the child hung
// forever); the child makes it itself. The parent's maker blocks until the
// child is done, so the fork surely lands mid-compile.
TEST_F(KernelCacheTest, ForkDuringACompileDoesNotHangTheChild) {
  if (kUnderTsan) GTEST_SKIP() << "a fork of a threaded process: outside ThreadSanitizer's model";
  auto& cache = jit::KernelCache::global();
  const std::string key = unique_key("fork");
  std::atomic<bool> inside{false}, release{false};
  std::thread maker([&] {
    cache.get(key, "test_fork_parent", [&] {
      inside = true;
      while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return return_const(1);
    });
  });
  while (!inside) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);  // a hang ends as SIGALRM, which the parent reports
    const jit::Kernel& k = cache.get(key, "test_fork_child", [] { return return_const(2); });
    ::_exit(k.entry<int (*)()>()() == 2 ? 0 : 3);
  }
  int status = 0;
  ASSERT_GT(pid, 0);
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  release = true;
  maker.join();
  EXPECT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status)
                                 << (WTERMSIG(status) == SIGALRM ? " (hung)" : "");
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  EXPECT_EQ(cache.get(key, "x", [] { return return_const(9); }).entry<int (*)()>()(), 1);
}

// The fork handler runs what files register next to their statics and locks
// (runtime/lazy_statics.h): a leaf mutex another thread holds at the fork is
// waited for and comes unlocked into the child; a registered make has run.
std::mutex g_test_leaf;
std::atomic<int> g_test_makes{0};
const bool g_test_fork_hooks =
    runtime::on_fork_complete([] { g_test_makes.fetch_add(1); }) &&
    runtime::on_fork_lock([] { g_test_leaf.lock(); }, [] { g_test_leaf.unlock(); });

TEST_F(KernelCacheTest, ForkWhileARegisteredLockIsHeldGivesTheChildItUnlocked) {
  if (kUnderTsan) GTEST_SKIP() << "a fork of a threaded process: outside ThreadSanitizer's model";
  runtime::mark_library_used();
  std::atomic<bool> held{false};
  std::thread holder([&] {
    std::lock_guard<std::mutex> lk(g_test_leaf);
    held = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  });
  while (!held) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int makes_before = g_test_makes.load();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(20);
    if (!g_test_leaf.try_lock()) ::_exit(3);
    ::_exit(g_test_makes.load() > makes_before ? 0 : 4);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  holder.join();
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: the lock came locked into the child; 4: no make ran";
  EXPECT_TRUE(g_test_leaf.try_lock()) << "the parent's copy stayed locked";
  g_test_leaf.unlock();
}

// A non-tilejit exception from emit keeps its type.
TEST_F(KernelCacheTest, EmitExceptionTypeIsPreserved) {
  auto& cache = jit::KernelCache::global();
  const std::string key = unique_key("runtime_error");
  EXPECT_THROW(cache.get(key, "x", []() -> std::vector<uint8_t> { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_EQ(cache.get(key, "x", [] { return return_const(1); }).entry<int (*)()>()(), 1);
}

// ---------------------------------------------------------------------------
// runtime::parallel_for (no JIT).

class ParallelFor : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = runtime::num_threads(); }
  void TearDown() override { runtime::set_num_threads(saved_); }
  int saved_ = 1;
};

TEST_F(ParallelFor, EveryIndexRunsExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    runtime::set_num_threads(threads);
    for (int64_t n : {0, 1, 2, 3, 17, 1000, 100000}) {
      std::vector<std::atomic<int>> count(static_cast<size_t>(n));
      runtime::parallel_for(n, [&](int64_t i) { count[static_cast<size_t>(i)].fetch_add(1); });
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) wrong += count[static_cast<size_t>(i)].load() != 1;
      EXPECT_EQ(wrong, 0) << "n=" << n << " threads=" << threads;
    }
  }
  // Negative counts run nothing.
  int calls = 0;
  runtime::parallel_for(-5, [&](int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST_F(ParallelFor, UsesSeveralThreadsAndOneThreadRunsInline) {
  runtime::set_num_threads(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  // Task 0 waits (up to 5 s) until a second thread has joined, so the check
  // does not depend on how fast the helper wakes up on a busy machine.
  runtime::parallel_for(64, [&](int64_t i) {
    {
      std::lock_guard<std::mutex> lk(mu);
      ids.insert(std::this_thread::get_id());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (i == 0 && std::chrono::steady_clock::now() < deadline) {
      {
        std::lock_guard<std::mutex> lk(mu);
        if (ids.size() >= 2) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  EXPECT_EQ(ids.size(), 2u) << "two threads requested";
  runtime::set_num_threads(1);
  ids.clear();
  runtime::parallel_for(64, [&](int64_t) {
    std::lock_guard<std::mutex> lk(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
}

TEST_F(ParallelFor, NestedCallsRunInline) {
  runtime::set_num_threads(4);
  const int64_t outer = 16, inner = 50;
  std::vector<std::atomic<int>> count(outer * inner);
  std::atomic<int> foreign{0};
  runtime::parallel_for(outer, [&](int64_t i) {
    const auto me = std::this_thread::get_id();
    runtime::parallel_for(inner, [&](int64_t j) {
      if (std::this_thread::get_id() != me) foreign.fetch_add(1);
      count[static_cast<size_t>(i * inner + j)].fetch_add(1);
    });
  });
  EXPECT_EQ(foreign.load(), 0) << "nested tasks ran on another thread";
  for (int64_t e = 0; e < outer * inner; ++e) ASSERT_EQ(count[e].load(), 1) << "index " << e;
}

TEST_F(ParallelFor, ExceptionsPropagateAndThePoolSurvives) {
  for (int threads : {1, 2, 4}) {
    runtime::set_num_threads(threads);
    try {
      runtime::parallel_for(1000, [&](int64_t i) {
        if (i == 37) throw Error("task 37 failed");
      });
      ADD_FAILURE() << "no exception with " << threads << " threads";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "task 37 failed");
    }
    // Every task throws: one error arrives, no deadlock.
    EXPECT_THROW(runtime::parallel_for(100, [](int64_t) { throw std::runtime_error("all"); }),
                 std::runtime_error);
    // The pool is usable afterwards.
    std::atomic<int64_t> sum{0};
    runtime::parallel_for(100, [&](int64_t i) { sum.fetch_add(i); });
    EXPECT_EQ(sum.load(), 4950);
  }
}

TEST_F(ParallelFor, ConcurrentCallersAllComplete) {
  runtime::set_num_threads(2);
  std::vector<int64_t> sums(kThreads, 0);
  run_together([&](int t) {
    std::atomic<int64_t> s{0};
    for (int rep = 0; rep < 20; ++rep)
      runtime::parallel_for(500, [&](int64_t i) { s.fetch_add(i); });
    sums[t] = s.load();
  });
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(sums[t], 20 * 124750) << "caller " << t;
}

// Threads the system refuses (here: no address space for their stacks) are
// not the caller's error: the call runs on the workers there are, or inline.
// std::system_error escaped before. In a child process: the limit is its own.
TEST_F(ParallelFor, ThreadsTheSystemRefusesRunWithFewer) {
  if (kUnderAsan || kUnderTsan)
    GTEST_SKIP() << "an address-space limit starves the sanitizer's own shadow and fake stacks";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);
    // The child starts without a pool (the fork handler): the 63 workers
    // asked for below are made now, 8 MiB of stack each, past this limit.
    rlimit lim{};
    ::getrlimit(RLIMIT_AS, &lim);
    long pages = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
      std::fclose(f);
    }
    lim.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                   (rlim_t(24) << 20);
    if (pages == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(4);
    runtime::set_num_threads(64);
    std::atomic<int64_t> sum{0};
    try {
      runtime::parallel_for(1000, [&](int64_t i) { sum.fetch_add(i); });
    } catch (...) {
      ::_exit(5);
    }
    if (sum.load() != 499500) ::_exit(6);
    // The limit must have refused some of the 63 workers, else this proves nothing.
    int threads = 0;
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "Threads: %d", &threads) == 1) break;
      std::fclose(f);
    }
    ::_exit(threads > 0 && threads < 64 ? 0 : 7);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status);
  EXPECT_NE(WEXITSTATUS(status), 4) << "could not set the address-space limit";
  EXPECT_NE(WEXITSTATUS(status), 5) << "parallel_for threw";
  EXPECT_NE(WEXITSTATUS(status), 7) << "the limit refused no thread: the test proves nothing";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// A smaller count after a larger one uses no more threads than it says,
// though the pool keeps the workers the larger count made.
TEST_F(ParallelFor, ALowerCountAfterAHigherOneUsesOnlyIt) {
  runtime::set_num_threads(8);
  runtime::parallel_for(64,
                        [](int64_t) { std::this_thread::sleep_for(std::chrono::milliseconds(1)); });
  runtime::set_num_threads(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  runtime::parallel_for(64, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::lock_guard<std::mutex> lk(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_LE(ids.size(), 2u);
}

TEST_F(ParallelFor, ThreadCountIsValidated) {
  EXPECT_THROW(runtime::set_num_threads(0), Error);
  EXPECT_THROW(runtime::set_num_threads(-3), Error);
  EXPECT_THROW(set_num_threads(0), Error);
  runtime::set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
}

}  // namespace
}  // namespace tilejit::test
