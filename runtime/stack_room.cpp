#include "runtime/stack_room.h"

#include <pthread.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <string>

#include "runtime/no_cancel.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

size_t stack_room() {
  // This thread's stack bounds, asked once (for the main thread glibc reads
  // /proc/self/maps to answer). Plain values: no TLS destructor to register.
  thread_local uintptr_t t_lo = 0, t_hi = 0;
  thread_local bool t_asked = false;
  if (!t_asked) {
    t_asked = true;
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      void* lo = nullptr;
      size_t size = 0;
      if (pthread_attr_getstack(&attr, &lo, &size) == 0) {
        t_lo = reinterpret_cast<uintptr_t>(lo);
        t_hi = t_lo + size;
      }
      pthread_attr_destroy(&attr);
    }
  }
  const auto frame = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (t_hi == 0 || frame < t_lo || frame > t_hi) return std::numeric_limits<size_t>::max();
  return frame - t_lo;
}

namespace {
struct Job {
  const std::function<void()>* f;
  std::exception_ptr error;
};
void* run_job(void* p) {
  auto* job = static_cast<Job*>(p);
  try {
    (*job->f)();
  } catch (...) {
    job->error = std::current_exception();
  }
  return nullptr;
}
}  // namespace

void run_with_stack(size_t need, const std::function<void()>& f, const std::string& what) {
  // Room unknown (a fiber's or an alternate signal stack, outside the
  // thread's bounds): the work goes to a thread of its own too.
  const size_t room = stack_room();
  if (room >= need && room != std::numeric_limits<size_t>::max()) return f();
  constexpr size_t kStack = size_t{8} << 20;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kStack);
  Job job{&f, nullptr};
  // The wait must not be a cancellation point: a caller cancelled in
  // pthread_join unwound its frame while the helper still used it (a
  // crash in 5 of 5 runs); a pending cancel is acted on after the work.
  int rc = 0;
  {
    const NoCancelScope no_cancel;
    pthread_t t;
    rc = pthread_create(&t, &attr, run_job, &job);
    pthread_attr_destroy(&attr);
    if (rc == 0) pthread_join(t, nullptr);
  }
  if (rc != 0)
    throw Error((what.empty() ? std::string() : what + ": ") + "this thread's stack has " +
                (room == std::numeric_limits<size_t>::max() ? std::string("an unknown amount of")
                                                            : std::to_string(room >> 10) + " KiB") +
                " left, making a kernel needs " + std::to_string(need >> 10) +
                " KiB, and a thread with a larger stack could not be made: " + std::strerror(rc));
  if (job.error) std::rethrow_exception(job.error);
}

}  // namespace tilejit::runtime
