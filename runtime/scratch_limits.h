// Per-thread scratch between calls: one home for the rule that operators
// slice large work so that each scratch buffer stays within kScratchKeepBytes,
// and free a buffer that grew past it when the call returns (one large
// prefill must not pin its peak for the life of the calling thread, while
// decode-sized calls keep theirs and allocate nothing).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tilejit::runtime {

inline constexpr int64_t kScratchKeepBytes = int64_t{64} << 20;

// Whether a buffer of `bytes` is kept for the next call.
inline bool scratch_kept(size_t bytes) {
  return bytes <= static_cast<size_t>(kScratchKeepBytes);
}

}  // namespace tilejit::runtime
