// What the libFuzzer harnesses share: the failure report, the describe
// switch and NaN-aware equality.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace tilejit::fuzz {

// A failed check: the harness and what failed on stderr, then abort, so
// libFuzzer keeps the input as a crash.
[[noreturn]] inline void die(const char* harness, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", harness, what.c_str());
  std::fflush(stderr);
  std::abort();
}

// TILEJIT_FUZZ_DESCRIBE=1: print each decoded case before running it.
inline bool describe() {
  static const bool on = std::getenv("TILEJIT_FUZZ_DESCRIBE") != nullptr;
  return on;
}

// Equal values, NaN equal to NaN.
inline bool same_value(double a, double b) {
  return (std::isnan(a) && std::isnan(b)) || a == b;
}

}  // namespace tilejit::fuzz
