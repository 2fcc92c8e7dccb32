// fork() and the library's lazily made statics and leaf locks. A
// function-local static that another thread is making when the process forks
// stays "being made" in the child, whose first access then waits on its guard
// forever (a child hung in num_threads() when its parent forked during the
// parent's first gemm); a mutex another thread holds at the fork stays locked
// in the child. The one fork handler (jit/kernel_cache.cpp) runs what each
// file registers next to its own statics and locks:
//   - on_fork_complete(make): before the LLVM JIT's gate (a make may
//     compile); `make` touches the file's statics, which waits for a make in
//     flight or makes it now, so the child gets them whole. Only in a process
//     that has begun a public call (api_guard marks it): making them at the
//     fork of a process that merely loaded the library would have side
//     effects (the AMX permission request, the emulator's SIGILL handler).
//   - on_fork_lock(lock, unlock): after the gate, for a leaf mutex (one under
//     which nothing else is locked or compiled): held across fork, released
//     on each side.
// Register from a namespace-scope initializer (`const bool x = on_fork_...`):
// registration runs while the library loads, before any fork handler can.
#pragma once

#include <atomic>

namespace tilejit::runtime {

inline std::atomic<bool> g_library_used{false};

// Cheap enough for every call: a relaxed load, one store per process.
inline void mark_library_used() {
  if (!g_library_used.load(std::memory_order_relaxed))
    g_library_used.store(true, std::memory_order_relaxed);
}
inline bool library_used() {
  return g_library_used.load(std::memory_order_relaxed);
}

// An exception thrown by `make` (an Error for a bad TILEJIT_* value: the
// static stays unmade and the next access retries) is the calls' to raise,
// not the fork's: it is swallowed. Both return true (for the initializer).
bool on_fork_complete(void (*make)());
bool on_fork_lock(void (*lock)(), void (*unlock)());

// For the fork handler: every registered make, in registration order.
void fork_complete_statics();
// Every registered lock in registration order; the unlocks in reverse.
void fork_lock_leaves();
void fork_unlock_leaves();

}  // namespace tilejit::runtime
