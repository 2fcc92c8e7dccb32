// The one check before the library writes a file: a write past the soft
// RLIMIT_FSIZE raises SIGXFSZ, whose default action ends the process (the
// disk cache under `ulimit -f 1` killed an embedding process with exit 153
// at its first store). Writers ask first and skip, or report, what would
// not fit; the limit is read per write, as a host may change it.
#pragma once

#include <sys/resource.h>

#include <cstdint>

namespace tilejit::runtime {

// Whether a file may grow to `end_bytes` under the soft RLIMIT_FSIZE.
inline bool file_size_allowed(uint64_t end_bytes) {
  rlimit lim{};
  if (::getrlimit(RLIMIT_FSIZE, &lim) != 0 || lim.rlim_cur == RLIM_INFINITY) return true;
  return end_bytes <= static_cast<uint64_t>(lim.rlim_cur);
}

}  // namespace tilejit::runtime
