#include "ir/verifier.h"

#include "ir/text_util.h"
#include "ir/verify_rules.h"

namespace tilejit::ir {

std::string value_label(const Function& f, int id) {
  return f.has_value(id) ? "%" + f.values[static_cast<size_t>(id)].name : cat("id ", id);
}

std::string op_label(const Function& f, size_t i) {
  const Op& op = f.ops[i];
  if (!f.has_value(op.result)) return cat("op #", i, " (", name(op.kind), ")");
  return cat(value_label(f, op.result), " = ", name(op.kind));
}

std::vector<Diagnostic> check(const Function& f) {
  std::vector<Diagnostic> out;
  verify_structure(f, out);
  verify_types(f, out);
  verify_ops(f, out);
  return out;
}

void verify(const Function& f) {
  std::vector<Diagnostic> d = check(f);
  if (!d.empty()) throw Error(d.front().message);
}

}  // namespace tilejit::ir
