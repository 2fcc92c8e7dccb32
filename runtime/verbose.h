// TILEJIT_VERBOSE: 0 (default) silent; 1 logs each kernel compile and each
// operator call's chosen kernel to stderr.
#pragma once

#include <cstdlib>

namespace tilejit::runtime {

inline int verbose_level() {
  static const int level = [] {
    const char* v = std::getenv("TILEJIT_VERBOSE");
    return v != nullptr && *v != '\0' ? std::atoi(v) : 0;
  }();
  return level;
}

}  // namespace tilejit::runtime
