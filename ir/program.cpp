#include "ir/program.h"

#include <algorithm>

#include "ir/text_util.h"

namespace tilejit::ir {

size_t first_named_operand(const Op& op) {
  return op.operands.size() - std::min(op.operand_names.size(), op.operands.size());
}

std::string operand_role(const Op& op, size_t i) {
  const size_t named = first_named_operand(op);
  if (i >= named && i < op.operands.size()) return op.operand_names[i - named];
  auto roles = operand_roles(op.kind);
  if (i < roles.size()) return roles[i];
  return cat("#", i);
}

const Value& Function::value(int id) const {
  if (!has_value(id)) {
    throw Error(cat("function @", name, " has no value with id ", id, " (it has ", values.size(),
                    " values)"));
  }
  return values[static_cast<size_t>(id)];
}

std::vector<TensorType> Function::result_types() const {
  std::vector<TensorType> types;
  types.reserve(results.size());
  for (int id : results) types.push_back(value(id).type);
  return types;
}

}  // namespace tilejit::ir
