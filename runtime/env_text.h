// An environment value as messages quote it: the one home for how a knob's
// bad value is shown. Raw, a newline in the value split the warning in two
// and a 5000-byte value was printed whole (an outside reviewer's find).
#pragma once

#include <cstdio>
#include <cstring>
#include <string>

namespace tilejit::runtime {

// Control bytes and backslashes escaped (\n, \t, \xNN, \\); past 64 bytes,
// the first 64 and "... (N bytes)". Other bytes (UTF-8 included) as they are.
inline std::string shown_env_value(const char* v) {
  constexpr size_t kShown = 64;
  const size_t n = std::strlen(v);
  std::string out;
  for (size_t i = 0; i < n && i < kShown; ++i) {
    const auto c = static_cast<unsigned char>(v[i]);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (n > kShown) out += "... (" + std::to_string(n) + " bytes)";
  return out;
}

}  // namespace tilejit::runtime
