#include "ir/program.h"

#include "ir/text_util.h"

namespace tilejit::ir {

std::string operand_role(const Op& op, size_t i) {
  auto roles = operand_roles(op.kind);
  if (i < roles.size()) return roles[i];
  if (i - roles.size() < op.operand_names.size()) return op.operand_names[i - roles.size()];
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
