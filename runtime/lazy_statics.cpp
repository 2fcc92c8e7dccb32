#include "runtime/lazy_statics.h"

#include <vector>

#include "runtime/verbose.h"

namespace tilejit::runtime {
namespace {

struct Hooks {
  std::vector<void (*)()> makes;
  std::vector<std::pair<void (*)(), void (*)()>> locks;
};
// Made by the first registration, while the library loads (one thread), so
// never half made at a fork; immortal, as the handlers run to the end.
Hooks& hooks() {
  static Hooks& h = *new Hooks;
  return h;
}

// runtime/verbose.h has no file of its own.
const bool g_verbose_hook = on_fork_complete([] { (void)verbose_level(); });

}  // namespace

bool on_fork_complete(void (*make)()) {
  hooks().makes.push_back(make);
  return true;
}

bool on_fork_lock(void (*lock)(), void (*unlock)()) {
  hooks().locks.emplace_back(lock, unlock);
  return true;
}

void fork_complete_statics() {
  for (auto* make : hooks().makes) {
    try {
      make();
    } catch (...) {
      // A make's Error (a bad TILEJIT_* value) is the calls' to raise; and
      // nothing may leave a fork handler.
    }
  }
}

void fork_lock_leaves() {
  for (const auto& l : hooks().locks) l.first();
}

void fork_unlock_leaves() {
  for (auto it = hooks().locks.rbegin(); it != hooks().locks.rend(); ++it) it->second();
}

}  // namespace tilejit::runtime
