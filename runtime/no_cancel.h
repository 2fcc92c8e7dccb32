// A scope in which the calling thread cannot be cancelled (pthread_cancel):
// every public call runs in one (runtime::api_guard, the C API's call), and
// so does run_with_stack's wait. A caller unwound by a cancel at one of the
// waits inside a call (the pool's condition variable, a join, a file write)
// left the pool's workers running tasks on its freed frame: a SIGSEGV on the
// scalar path, 128 outputs of a later call never written on llvm, the next
// caller waiting forever for helpers (docs/reliability.md). A cancel that
// arrives during the call stays pending and is acted on at the caller's next
// cancellation point after the call returns. Nests: only the outermost scope
// of a thread switches the state (and restores the one it found), so a C API
// call (its wrapper, then the C++ entry) pays two pthread_setcancelstate
// calls, not four (+10 ns a call measured by an outside tester).
#pragma once

#include <pthread.h>

namespace tilejit::runtime {

class NoCancelScope {
 public:
  NoCancelScope() {
    if (depth()++ == 0) pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old_);
  }
  ~NoCancelScope() {
    if (--depth() == 0) pthread_setcancelstate(old_, nullptr);
  }
  NoCancelScope(const NoCancelScope&) = delete;
  NoCancelScope& operator=(const NoCancelScope&) = delete;

 private:
  // A plain int: no thread_local destructor (runtime/per_thread.h says why).
  static int& depth() {
    static thread_local int d = 0;
    return d;
  }
  int old_ = PTHREAD_CANCEL_ENABLE;
};

}  // namespace tilejit::runtime
