// runtime::parallel_for: every index runs exactly once and its writes are
// visible when the call returns, whatever the helpers' timing (a helper that
// wakes after the caller has claimed every task must not join, nor touch the
// finished call); errors propagate; nested and concurrent calls run inline.
// Also run under ThreadSanitizer (dev.sh tsan).
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "runtime/per_thread.h"
#include "runtime/stack_room.h"
#include "runtime/thread_pool.h"
#include "test_util.h"

namespace tilejit::runtime {
namespace {

class ThreadPoolTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = num_threads(); }
  void TearDown() override { set_num_threads(saved_); }
  int saved_ = 1;
};

// Calls separated by sleeps of 0 to 3 ms put the helpers in every state: in
// the call, spinning, asleep, or waking up while the caller finishes. Plain
// (non-atomic) per-index counters: a missing happens-before between a
// helper's task and the caller's return is a data race TSan reports, and a
// task run twice or never shows in the counts.
TEST_F(ThreadPoolTest, EveryIndexOnceAcrossHelperStates) {
  std::mt19937 rng(7);
  std::vector<int> hits;
  for (int call = 0; call < 600; ++call) {
    set_num_threads(1 + static_cast<int>(rng() % 4));
    const int64_t n = 1 + static_cast<int64_t>(rng() % 40);
    const int work_us = static_cast<int>(rng() % 30);
    hits.assign(size_t(n), 0);
    parallel_for(n, [&](int64_t i) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(work_us);
      while (std::chrono::steady_clock::now() < until) {
      }
      ++hits[size_t(i)];
    });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)], 1) << "call " << call << " i " << i;
    const int gap_us = static_cast<int>(rng() % 4) * 1000 - 1000;
    if (gap_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(gap_us));
  }
}

TEST_F(ThreadPoolTest, FirstErrorReachesTheCallerAndThePoolGoesOn) {
  set_num_threads(2);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> ran{0};
    EXPECT_THROW(parallel_for(64,
                              [&](int64_t i) {
                                ran.fetch_add(1);
                                if (i == 5) throw std::runtime_error("task 5");
                              }),
                 std::runtime_error);
    EXPECT_GE(ran.load(), 1);
    std::vector<int> hits(100, 0);
    parallel_for(100, [&](int64_t i) { ++hits[size_t(i)]; });
    for (int h : hits) ASSERT_EQ(h, 1);
    if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A call from inside a task, and calls from several application threads at
// once (one owns the pool, the others run inline), each see all their indices.
TEST_F(ThreadPoolTest, NestedAndConcurrentCallsRunEveryIndex) {
  set_num_threads(2);
  std::vector<std::thread> apps;
  std::atomic<int> bad{0};
  for (int a = 0; a < 3; ++a)
    apps.emplace_back([&] {
      for (int call = 0; call < 100; ++call) {
        std::vector<std::atomic<int>> inner(8 * 8);
        parallel_for(8, [&](int64_t i) {
          parallel_for(8, [&](int64_t j) { inner[size_t(i * 8 + j)].fetch_add(1); });
        });
        for (auto& h : inner)
          if (h.load() != 1) bad.fetch_add(1);
      }
    });
  for (auto& t : apps) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace

// runtime::per_thread (the operators' per-thread scratch without C++
// thread_local destructors): one object per call site and thread, made at
// the first use, destroyed when its thread ends.
std::atomic<int> g_made{0}, g_destroyed{0};
struct Counted {
  int value = 0;
  Counted() { g_made.fetch_add(1); }
  ~Counted() { g_destroyed.fetch_add(1); }
};
Counted& site_a() {
  return runtime::per_thread<Counted>([] {});
}
Counted& site_b() {
  return runtime::per_thread<Counted>([] {});
}

// The default thread count is the CPUs the thread may run on, not the
// online cores (under `taskset -c 0` the pool made two workers sharing CPU 0).
TEST(ThreadPool, DefaultCountFollowsTheAffinityMask) {
  cpu_set_t saved;
  ASSERT_EQ(sched_getaffinity(0, sizeof saved, &saved), 0);
  EXPECT_LE(available_cpus(), CPU_COUNT(&saved));
  EXPECT_GE(available_cpus(), 1);
  if (CPU_COUNT(&saved) < 2) GTEST_SKIP() << "one CPU allowed already";
  int first = 0;
  while (!CPU_ISSET(first, &saved)) ++first;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(first, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);
  const int pinned = available_cpus();
  ASSERT_EQ(sched_setaffinity(0, sizeof saved, &saved), 0);
  EXPECT_EQ(pinned, 1);
}

TEST(PerThread, OneObjectPerSiteAndThreadDestroyedWithTheThread) {
  const int made0 = g_made.load(), destroyed0 = g_destroyed.load();
  Counted* main_a = &site_a();
  EXPECT_EQ(&site_a(), main_a);  // the same site again: the same object
  EXPECT_NE(&site_b(), main_a);
  site_a().value = 7;
  std::thread t([&] {
    EXPECT_NE(&site_a(), main_a);  // another thread: its own
    EXPECT_EQ(site_a().value, 0);
    site_a().value = 1;
    site_b().value = 2;
  });
  t.join();
  EXPECT_EQ(g_made.load() - made0, 4);
  EXPECT_EQ(g_destroyed.load() - destroyed0, 2);  // the thread's two, not the main thread's
  EXPECT_EQ(site_a().value, 7);
}

// runtime::run_with_stack moves work off a thread without room (here: any
// thread, the need is 1 GiB) and waits for it without being cancellable: a
// caller cancelled in that wait unwound the frame the helper still used (a
// crash in 5 of 5 runs of an outside tester's program). The work must end
// before the cancel is acted on, and its exception reach the caller.
std::atomic<int> g_work_done{0};
void* cancelled_caller(void*) {
  int local = 0;
  run_with_stack(size_t{1} << 30, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    local = 1;  // the caller's frame, still there
    g_work_done.store(local);
  });
  pthread_testcancel();
  return nullptr;
}

// When no thread with a larger stack can be made (here: the address space
// capped below its 8 MiB stack, in a child process), the Error names the work
// it was for (the kernel cache passes "making kernel <name>") and nothing runs.
TEST(RunWithStack, ARefusedHelperIsAnErrorNamingTheWork) {
  if (test::kUnderAsan || test::kUnderTsan)
    GTEST_SKIP() << "the sanitizers' shadow memory needs the address space";
  // The check runs in a fresh process (this binary again, this test only):
  // glibc reuses the stacks of exited threads, so in a process whose earlier
  // tests made threads the helper would get a cached stack despite the cap.
  if (std::getenv("TILEJIT_TEST_REFUSED_HELPER") != nullptr) {
    std::FILE* f = std::fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == nullptr || std::fscanf(f, "%lu", &pages) != 1) _exit(2);
    std::fclose(f);
    const rlim_t cap = static_cast<rlim_t>(pages) * 4096 + (rlim_t{2} << 20);
    const rlimit rl{cap, cap};
    if (setrlimit(RLIMIT_AS, &rl) != 0) _exit(3);
    bool ran = false;
    try {
      run_with_stack(
          size_t{1} << 30, [&] { ran = true; }, "making kernel k1");
      _exit(4);
    } catch (const Error& e) {
      const std::string m = e.what();
      _exit(!ran && m.rfind("making kernel k1: ", 0) == 0 &&
                    m.find("could not be made") != std::string::npos
                ? 0
                : 5);
    }
  }
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    setenv("TILEJIT_TEST_REFUSED_HELPER", "1", 1);
    execl("/proc/self/exe", "thread_pool_test",
          "--gtest_filter=RunWithStack.ARefusedHelperIsAnErrorNamingTheWork", nullptr);
    _exit(6);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(RunWithStack, ACancelledCallerWaitsForItsWork) {
  g_work_done.store(0);
  pthread_t t;
  ASSERT_EQ(pthread_create(&t, nullptr, cancelled_caller, nullptr), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  pthread_cancel(t);
  void* ret = nullptr;
  ASSERT_EQ(pthread_join(t, &ret), 0);
  EXPECT_EQ(ret, PTHREAD_CANCELED);
  EXPECT_EQ(g_work_done.load(), 1);
  EXPECT_THROW(run_with_stack(size_t{1} << 30, [] { throw std::runtime_error("work"); }),
               std::runtime_error);
}
}  // namespace tilejit::runtime
