// TILEJIT_VERBOSE: 0 (default) silent; 1 logs each kernel compile and each
// operator call's chosen kernel to stderr.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

#include "runtime/env_text.h"

namespace tilejit::runtime {

// A diagnostic knob's value: an integer in [0, max], or 0 when unset or
// empty. Anything else is taken as 0 with one warning on stderr: a knob that
// only adds output must not make every call fail, nor be ignored silently.
inline int diagnostic_env_level(const char* name, int max) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);    // blanks around the number taken, as
  while (*end == ' ' || *end == '\t') ++end;  // TILEJIT_NUM_THREADS takes them
  if (end != v && *end == '\0' && n >= 0 && n <= max) return static_cast<int>(n);
  std::fprintf(stderr,
               "tilejit: warning: %s='%s' ignored: allowed: an integer from 0 to %d (unset: 0)\n",
               name, shown_env_value(v).c_str(), max);
  return 0;
}

inline int verbose_level() {
  static const int level = diagnostic_env_level("TILEJIT_VERBOSE", 9);
  return level;
}

// A path that falls back to another says why, once per call site, under
// TILEJIT_VERBOSE: `site` is that site's own static flag.
inline void log_fallback_once(std::once_flag& site, const std::string& why) {
  if (verbose_level() <= 0) return;
  std::call_once(site, [&] { std::fprintf(stderr, "tilejit: fallback: %s\n", why.c_str()); });
}

}  // namespace tilejit::runtime
