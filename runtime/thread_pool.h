// A small persistent thread pool: parallel_for over task indices, each
// participant running its own contiguous range first (the same thread gets
// the same indices call after call: cache affinity) and then taking what is
// left of the others' (the machine is shared and noisy, so static splits
// straggle).
#pragma once

#include <cstdint>
#include <functional>

namespace tilejit::runtime {

// Threads used by parallel_for (TILEJIT_NUM_THREADS, else available_cpus()).
int num_threads();
// The default thread count without TILEJIT_NUM_THREADS: the CPUs the calling
// thread may run on (its affinity mask: taskset, docker --cpuset-cpus,
// numactl), capped by a cgroup v2 CPU quota rounded up (docker --cpus,
// Kubernetes CPU limits); the online CPUs when neither can be read.
int available_cpus();
// Sets the thread count for later calls; n >= 1 (else Error).
void set_num_threads(int n);

// Runs fn(i) for i in [0, n) on up to num_threads() threads (the caller is one
// of them) and returns when all are done. Calls from inside a task, or while
// another thread owns the pool, run inline: never a deadlock.
// The first exception thrown by a task is rethrown to the caller.
void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

// The thread running the process's exit handlers (marked by the LLVM JIT's
// exit gate, codegen/llvm/llvm_jit.cpp, when it closes): its parallel_for
// calls run inline from then on, since a pool worker asking the closed gate
// for a compile parks there until the process ends and the exiting thread
// would wait for it forever; on that thread the gate refuses with an Error.
void mark_exiting_thread();
bool on_exiting_thread();

}  // namespace tilejit::runtime
