// The verifier's rule groups (see verifier.h). Private to ir/.
#pragma once

#include <string>
#include <vector>

#include "ir/verifier.h"

namespace tilejit::ir {

void verify_structure(const Function& f, std::vector<Diagnostic>& out);
void verify_types(const Function& f, std::vector<Diagnostic>& out);
void verify_ops(const Function& f, std::vector<Diagnostic>& out);

// How a message names op #i: "%3 = cast", or "op #3 (cast)" when its result id is bad.
std::string op_label(const Function& f, size_t i);
// "%name", or "id N" when N is not a value.
std::string value_label(const Function& f, int id);

}  // namespace tilejit::ir
