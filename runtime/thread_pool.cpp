#include "runtime/thread_pool.h"

#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/env_text.h"
#include "runtime/lazy_statics.h"
#include "runtime/thread_limits.h"
#include "tilejit/error.h"

namespace tilejit::runtime {
namespace {

thread_local bool t_in_task = false;
thread_local bool t_exiting_thread = false;  // mark_exiting_thread

int default_threads() {
  if (const char* env = std::getenv("TILEJIT_NUM_THREADS"); env != nullptr && *env != '\0') {
    char* end = nullptr;
    long v = std::strtol(env, &end, 10);  // leading blanks skipped; trailing ones too:
    while (*end == ' ' || *end == '\t') ++end;
    if (end == env || *end != '\0' || v < 1 || v > kMaxThreads)
      throw Error(std::string("TILEJIT_NUM_THREADS='") + shown_env_value(env) +
                  "' is not a thread count; allowed: an integer from 1 to " +
                  std::to_string(kMaxThreads));
    return static_cast<int>(v);
  }
  return available_cpus();
}

// The smallest cgroup v2 quota (cpu.max "<quota> <period>", rounded up) on
// the path from the process's cgroup to the root; 0 for none or unreadable.
long cgroup_cpu_quota() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty() || path[0] != '/') return 0;
  long best = 0;
  for (;;) {
    std::ifstream max("/sys/fs/cgroup" + (path == "/" ? std::string() : path) + "/cpu.max");
    std::string quota;
    long period = 0;
    if (max >> quota >> period && quota != "max" && period > 0) {
      char* end = nullptr;
      const long q = std::strtol(quota.c_str(), &end, 10);
      if (*end == '\0' && q > 0) {
        const long cpus = q / period + (q % period != 0);  // (q + period - 1) could overflow
        best = best == 0 ? cpus : std::min(best, cpus);
      }
    }
    if (path == "/") break;
    const size_t slash = path.find_last_of('/');
    path = slash == 0 ? "/" : path.substr(0, slash);
  }
  return best;
}

}  // namespace

// Online cores counted threads the process could not run (an engine under
// `taskset -c 0` got two workers time-sharing one CPU; docker --cpus 1 on a
// 64-core host, 64 threads throttled by the quota): an outside tester's find.
int available_cpus() {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  if (n < 1) n = 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) n = CPU_COUNT(&set);
  if (const long quota = cgroup_cpu_quota(); quota > 0) n = std::min(n, quota);
  return static_cast<int>(std::clamp<long>(n, 1, kMaxThreads));
}

namespace {

class Pool {
 public:
  ~Pool() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      ++generation_;
    }
    for (auto& cv : cvs_) cv.notify_one();
    for (auto& t : workers_) t.join();
  }

  void run(int threads, int64_t n, const std::function<void(int64_t)>& fn) {
    std::unique_lock<std::mutex> owner(owner_mu_, std::try_to_lock);
    if (!owner.owns_lock() || threads <= 1 || n <= 1) return run_inline(n, fn);
    // Fewer workers than asked when the OS refuses more threads: the call
    // runs on those (inline with none) instead of failing.
    const int workers = std::min(ensure_workers(threads - 1), threads - 1);
    const int helpers = static_cast<int>(std::min<int64_t>(workers, n - 1));
    if (helpers == 0) return run_inline(n, fn);
    {
      std::lock_guard<std::mutex> lk(mu_);
      fn_ = &fn;
      split(n, helpers + 1);
      active_helpers_ = helpers;
      open_ = true;
      joined_ = 0;
      error_ = nullptr;
      ++generation_;
    }
    // Only the helpers this call uses are woken: a pool grown by an earlier
    // set_num_threads(64) must not wake (and spin) 63 idle threads per call.
    for (int i = 0; i < helpers; ++i) cvs_[size_t(i)].notify_one();
    work(0);
    // The call waits only for helpers that joined it (they hold tasks), not
    // for the ones still waking up: a sleeping vCPU takes 60-130 µs to run
    // again on these VMs, three times a decode-sized call, and the caller has
    // claimed every task by then. A helper that wakes after the close finds
    // the call gone and sleeps again.
    std::unique_lock<std::mutex> lk(mu_);
    open_ = false;
    done_cv_.wait(lk, [&] { return joined_ == 0; });
    fn_ = nullptr;
    if (error_) std::rethrow_exception(error_);
  }

 private:
  static void run_inline(int64_t n, const std::function<void(int64_t)>& fn) {
    const bool was = t_in_task;
    t_in_task = true;
    try {
      for (int64_t i = 0; i < n; ++i) fn(i);
    } catch (...) {
      t_in_task = was;
      throw;
    }
    t_in_task = was;
  }

  // Participant r of the call owns the r-th of `parts` contiguous ranges of
  // the indices: it runs its own range first, then takes what is left of the
  // others'. So the same thread runs the same indices call after call (a
  // decode GEMM's column blocks stay in the L2 of the core that read them:
  // with one shared counter the halves of a hot 128 x 4096 GEMM moved
  // between the cores and 2 threads took 22 µs against 8 on one), and a late
  // or slow participant's range is finished by the others.
  void split(int64_t n, int parts) {
    if (parts > ranges_cap_) {
      ranges_ = std::make_unique<Range[]>(size_t(parts));
      ranges_cap_ = parts;
    }
    parts_ = parts;
    const int64_t q = n / parts, rem = n % parts;
    for (int r = 0; r < parts; ++r) {
      const int64_t begin = q * r + std::min<int64_t>(r, rem);
      ranges_[size_t(r)].next.store(begin, std::memory_order_relaxed);
      ranges_[size_t(r)].end = begin + q + (r < rem ? 1 : 0);
    }
  }

  void work(int rank) {
    const bool was = t_in_task;
    t_in_task = true;
    for (int j = 0; j < parts_; ++j) {
      Range& range = ranges_[size_t((rank + j) % parts_)];
      for (;;) {
        const int64_t i = range.next.fetch_add(1, std::memory_order_relaxed);
        if (i >= range.end) break;
        try {
          (*fn_)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lk(mu_);
          if (!error_) error_ = std::current_exception();
          // Stop handing out work.
          for (int r = 0; r < parts_; ++r) ranges_[size_t(r)].next.store(ranges_[size_t(r)].end);
        }
      }
    }
    t_in_task = was;
  }

  // Grows the pool to `count` workers; returns how many there are (fewer
  // when the OS refuses a thread: std::system_error is not the caller's).
  int ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int index = static_cast<int>(workers_.size());
      cvs_.emplace_back();  // a deque: the others stay where they are
      try {
        workers_.emplace_back([this, index] { worker_loop(index); });
      } catch (const std::system_error&) {
        cvs_.pop_back();
        break;
      }
    }
    return static_cast<int>(workers_.size());
  }

  void worker_loop(int index) {
    uint64_t seen = 0;
    bool was_active = false;
    for (;;) {
      // Wait actively for 100 µs before sleeping, if this worker helped the
      // last call: decode-sized calls come back to back, and waking a
      // sleeping thread costs 10-30 µs on a VM, as long as a whole small
      // GEMM. The active wait yields the CPU at every turn instead of
      // spinning on `pause`: when this worker shares a core with the caller
      // (another process holds the other one, and the scheduler put the
      // woken worker on the caller's core), a spin starved the caller for
      // the whole 100 µs (a 23 µs call took 133 µs after every idle gap, a
      // decode step 2.4x its 1-thread time); sched_yield on a core of its
      // own returns at once. The lock-protected wait below stays the source
      // of truth.
      const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(100);
      for (int i = 0; was_active && generation_.load(std::memory_order_acquire) == seen; ++i) {
        sched_yield();
        if ((i & 7) == 7 && std::chrono::steady_clock::now() > spin_until) break;
      }
      {
        std::unique_lock<std::mutex> lk(mu_);
        for (;;) {
          if (stop_) return;
          if (generation_ != seen) {
            seen = generation_;
            // Join a call that uses this worker and is still open; a call
            // that closed while this worker woke up is left alone.
            if (open_ && index < active_helpers_) break;
          }
          cvs_[size_t(index)].wait(lk);
        }
        ++joined_;
      }
      was_active = true;
      work(index + 1);
      std::lock_guard<std::mutex> lk(mu_);
      if (--joined_ == 0) done_cv_.notify_one();
    }
  }

  std::mutex owner_mu_;  // one parallel region at a time
  std::mutex mu_;
  std::condition_variable done_cv_;
  std::deque<std::condition_variable> cvs_;  // one per worker: wake only the helpers
  std::vector<std::thread> workers_;
  const std::function<void(int64_t)>* fn_ = nullptr;
  // The call's index ranges, one per participant (the caller's is 0), each
  // on its own cache line; written under mu_ before a call's generation.
  struct alignas(64) Range {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  std::unique_ptr<Range[]> ranges_;
  int ranges_cap_ = 0;
  int parts_ = 0;
  int active_helpers_ = 0;
  bool open_ = false;                    // helpers may still join the current call
  int joined_ = 0;                       // helpers inside the current call's work()
  std::atomic<uint64_t> generation_{0};  // written under mu_, read by spinners
  bool stop_ = false;
  std::exception_ptr error_;
};

// The count calls use: TILEJIT_NUM_THREADS's (else the CPUs online) until
// set_num_threads() sets one. 0 while the variable holds no valid count:
// every call needing a count then raises its Error (default_threads()'s),
// until set_num_threads() gives one, which overrides the variable (README)
// instead of failing on it, as it did when the Error came from this static's
// initialization (retried, and thrown, on every access).
std::atomic<int>& thread_count() {
  static std::atomic<int> n{[] {
    try {
      return default_threads();
    } catch (const Error&) {
      return 0;
    }
  }()};
  return n;
}
const bool g_count_fork_hook = on_fork_complete([] { (void)thread_count(); });

// The pool is reached through a pointer so that a child of fork(), which has
// none of the parent's worker threads, can start over with a fresh pool (the
// parent's copy is leaked: its threads do not exist in the child, so it can
// be neither joined nor destroyed).
std::atomic<Pool*> g_pool{nullptr};
std::mutex g_pool_mu;

// Registered when the library loads, before any pool exists: g_pool_mu is
// held across fork() (a thread creating the pool at that moment left the
// child's copy locked forever), and the child starts without a pool.
const bool g_fork_handlers = [] {
  pthread_atfork([] { g_pool_mu.lock(); }, [] { g_pool_mu.unlock(); },
                 [] {
                   g_pool.store(nullptr);
                   g_pool_mu.unlock();
                 });
  return true;
}();

Pool& pool() {
  if (Pool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (Pool* p = g_pool.load()) return *p;
  Pool* p = new Pool();  // lives for the process: workers may outlive static destruction order
  g_pool.store(p, std::memory_order_release);
  return *p;
}

}  // namespace

int num_threads() {
  const int n = thread_count().load(std::memory_order_relaxed);
  return n > 0 ? n : default_threads();  // 0: throws the variable's Error
}

void set_num_threads(int n) {
  if (n < 1 || n > kMaxThreads)
    throw Error("set_num_threads: n=" + std::to_string(n) + " is not allowed; allowed: 1 to " +
                std::to_string(kMaxThreads));
  thread_count().store(n);
}

void mark_exiting_thread() {
  t_exiting_thread = true;
}
bool on_exiting_thread() {
  return t_exiting_thread;
}

void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (t_in_task || t_exiting_thread) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  pool().run(num_threads(), n, fn);
}

}  // namespace tilejit::runtime
