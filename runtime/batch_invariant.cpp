#include "runtime/batch_invariant.h"

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/env_text.h"
#include "tilejit/error.h"

namespace tilejit::runtime {

namespace {
// -1: not set by the API (the environment decides), else 0 / 1.
std::atomic<int> g_set{-1};

bool from_env() {
  const char* env = std::getenv("TILEJIT_BATCH_INVARIANT");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0) return false;
  if (std::strcmp(env, "1") == 0) return true;
  throw Error(std::string("TILEJIT_BATCH_INVARIANT='") + shown_env_value(env) +
              "' is not a switch; allowed: 0, 1 (or unset)");
}
}  // namespace

bool batch_invariant() {
  const int s = g_set.load(std::memory_order_relaxed);
  if (s >= 0) return s == 1;
  // Read on every call until set: a bad value stays an Error of each call
  // (nothing cached from it), and the read is a getenv next to a GEMM.
  return from_env();
}

void set_batch_invariant(bool on) {
  g_set.store(on ? 1 : 0, std::memory_order_relaxed);
}

}  // namespace tilejit::runtime
