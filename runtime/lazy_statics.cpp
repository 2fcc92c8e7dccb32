#include "runtime/lazy_statics.h"

#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "runtime/thread_pool.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

void complete_runtime_statics() {
  // Each in its own try: a bad TILEJIT_* value makes its static's initializer
  // throw (the static stays unmade and the next access retries), which is the
  // calls' Error to raise, not the fork's.
  auto touch = [](auto f) {
    try {
      f();
    } catch (const Error&) {
    }
  };
  touch([] { (void)cpu_features(); });
  touch([] { (void)detected_features(); });
  touch([] { (void)usable_features(); });
  touch([] { (void)backend_choice(); });
  touch([] { (void)active_isa(); });
  touch([] { (void)num_threads(); });
}

}  // namespace tilejit::runtime
