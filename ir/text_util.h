// Small string helpers shared by the IR's message builders, printer and parser.
// Private to ir/.
#pragma once

#include <locale>
#include <sstream>
#include <string>
#include <utility>

namespace tilejit::ir {

// Concatenates anything streamable: cat("K=", 64) == "K=64".
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  // The classic locale, not the global one a host may have set: under de_DE
  // a stream writes 4096 as "4.096" and 0.5 as "0,5" (IR text and messages).
  os.imbue(std::locale::classic());
  (os << ... << std::forward<Args>(args));
  return os.str();
}

// "a, b, c": each item of `items` formatted by `fmt`, separated by `sep`.
template <typename Range, typename Fmt>
std::string join(const Range& items, const char* sep, Fmt fmt) {
  std::string s;
  bool first = true;
  for (const auto& item : items) {
    if (!first) s += sep;
    first = false;
    s += fmt(item);
  }
  return s;
}

inline bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
inline bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
inline bool is_ident_char(char c) {
  return is_alpha(c) || is_digit(c);
}

}  // namespace tilejit::ir
