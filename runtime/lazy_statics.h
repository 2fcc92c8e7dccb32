// fork() and the library's lazily made statics. A function-local static that
// another thread is making when the process forks stays "being made" in the
// child, whose first access then waits on its guard forever (a child hung in
// num_threads() when its parent forked during the parent's first gemm). The
// kernel cache's fork handler (jit/kernel_cache.cpp) calls the complete_*
// functions before anything else: touching each static waits for a make in
// flight, or makes it now, so the child gets them whole. Only in a process
// that has begun a public call (api_guard marks it): making them at the fork
// of a process that merely loaded the library would have side effects (the
// AMX permission request, the emulator's SIGILL handler).
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

// runtime/'s lazy statics: CPU features, the ISA path and backend choice, the
// thread count (Errors of bad variables are swallowed: the calls raise them).
void complete_runtime_statics();

}  // namespace tilejit::runtime
