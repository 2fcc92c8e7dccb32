// The one line per operator call that TILEJIT_VERBOSE=1 prints (README's
// TILEJIT_VERBOSE row): "tilejit: <op> <shape values that pick the kernel>
// path=<isa> <what runs>", written after the operator has chosen its path
// and kernels and before the work. The attention operators, rope and
// store_kv print through here; gemm and fused_experts print the same form.
#pragma once

#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "runtime/verbose.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The two variable parts of a call's line: the shapes (before path=) and
// what runs on that path (after it: kernel or plan names, split counts).
struct CallLine {
  std::string shapes, runs;
};

// Prints op's line when TILEJIT_VERBOSE > 0. `line` (a callable returning a
// CallLine) runs only then: with verbose off a call costs one branch.
template <class Line>
void log_call(const char* op, Isa path, Line&& line) {
  if (runtime::verbose_level() <= 0) [[likely]]
    return;
  const CallLine l = line();
  const std::string text =
      fmt::format("tilejit: {} {} path={} {}\n", op, l.shapes, isa_name(path), l.runs);
  std::fwrite(text.data(), 1, text.size(), stderr);  // one write: lines of threads do not mix
}

}  // namespace tilejit::ops
