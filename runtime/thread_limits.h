// The thread counts tilejit runs with: one home for TILEJIT_NUM_THREADS,
// set_num_threads and the thread field of a tuning database entry.
#pragma once

namespace tilejit::runtime {

inline constexpr int kMaxThreads = 4096;

}  // namespace tilejit::runtime
