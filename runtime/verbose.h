// TILEJIT_VERBOSE: 0 (default) silent; 1 logs each kernel compile and each
// operator call's chosen kernel to stderr.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace tilejit::runtime {

inline int verbose_level() {
  static const int level = [] {
    const char* v = std::getenv("TILEJIT_VERBOSE");
    return v != nullptr && *v != '\0' ? std::atoi(v) : 0;
  }();
  return level;
}

// A path that falls back to another says why, once per call site, under
// TILEJIT_VERBOSE: `site` is that site's own static flag.
inline void log_fallback_once(std::once_flag& site, const std::string& why) {
  if (verbose_level() <= 0) return;
  std::call_once(site, [&] { std::fprintf(stderr, "tilejit: fallback: %s\n", why.c_str()); });
}

}  // namespace tilejit::runtime
