// The verifier: every rule a Function must meet before it is lowered, as a
// query (check) and as an enforcing pass (verify). Rule groups, one file each:
//   verify_structure.cpp  SSA: ids, names, defined-before-use, params, return
//   verify_types.cpp      every value's type is well formed (see check_type)
//   verify_ops.cpp        each op's operand rules and its inferred result type
//                         (the rules themselves are in rules_*.cpp, shared
//                         with the Builder)
#pragma once

#include <string>
#include <vector>

#include "ir/program.h"

namespace tilejit::ir {

struct Diagnostic {
  // Complete and self-contained, naming the op by its result, the operand and
  // the rule: "%0 = gemm: operand 'w' (%w) has K=100 but 'x' (%x) has K=64:
  // the reduction dims must match".
  std::string message;
  int op_index = -1;  // index into Function::ops, or -1
  int value_id = -1;  // the value concerned, or -1
};

// Every problem, in a fixed order (structure, types, ops); empty = valid.
std::vector<Diagnostic> check(const Function& f);
// Throws tilejit::Error with the first problem's message.
void verify(const Function& f);

}  // namespace tilejit::ir
