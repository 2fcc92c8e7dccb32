// Reads the text form of the IR (grammar in docs/ir.md) into a Function.
//
//   ir::Function f = ir::parse(text, "linear.tir");   // throws ir::ParseError
//   ir::verify(f);                                    // semantic rules
//
// The parser checks syntax, names (defined once, defined before use), types
// (well formed) and the declared result types against the returned values. Op
// rules are the verifier's: a parsed function may still fail verify(), which
// is how a tool can show a wrong program before saying what is wrong with it.
#pragma once

#include <string>
#include <string_view>

#include "ir/program.h"
#include "tilejit/error.h"

namespace tilejit::ir {

// what() is "file:line:col: error: message" (line and col 1-based, col in bytes).
class ParseError : public Error {
 public:
  ParseError(std::string_view file, int line, int col, std::string_view message);

  const std::string& file() const { return file_; }
  int line() const { return line_; }
  int col() const { return col_; }
  // The message without the location prefix.
  const std::string& detail() const { return detail_; }

 private:
  std::string file_;
  int line_;
  int col_;
  std::string detail_;
};

Function parse(std::string_view text, std::string_view filename = "<input>");

}  // namespace tilejit::ir
