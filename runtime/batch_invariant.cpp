#include "runtime/batch_invariant.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/env_text.h"
#include "runtime/lazy_statics.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

namespace {
// -1: not set by the API (the environment decides), else 0 / 1.
std::atomic<int> g_set{-1};

// TILEJIT_BATCH_INVARIANT, read once (the operators ask on every call, and
// fused_experts once per expert group: a getenv there cost ~0.2 µs each):
// 0 / 1, or the message of a bad value, raised by every call that reads it.
struct EnvChoice {
  int value = 0;
  std::string error;
};
const EnvChoice& env_choice() {
  static const EnvChoice c = [] {
    EnvChoice r;
    const char* env = std::getenv("TILEJIT_BATCH_INVARIANT");
    if (env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0) return r;
    if (std::strcmp(env, "1") == 0) {
      r.value = 1;
      return r;
    }
    r.error = std::string("TILEJIT_BATCH_INVARIANT='") + shown_env_value(env) +
              "' is not a switch; allowed: 0, 1 (or unset)";
    return r;
  }();
  return c;
}
// Made before a fork, as every lazy static (runtime/lazy_statics.h).
const bool g_fork_hook = on_fork_complete([] { (void)env_choice(); });
}  // namespace

bool batch_invariant() {
  const int s = g_set.load(std::memory_order_relaxed);
  if (s >= 0) return s == 1;
  const EnvChoice& c = env_choice();
  if (!c.error.empty()) throw Error(c.error);
  return c.value == 1;
}

void set_batch_invariant(bool on) {
  g_set.store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace tilejit::runtime
