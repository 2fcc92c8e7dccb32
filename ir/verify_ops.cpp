// Each op against its rules (rules_*.cpp), and its stated result type against
// the inferred one: the result type is what later stages trust without looking
// at the operands again.
#include "ir/infer.h"
#include "ir/text_util.h"
#include "ir/verify_rules.h"

namespace tilejit::ir {

void verify_ops(const Function& f, std::vector<Diagnostic>& out) {
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const Op& op = f.ops[i];
    int oi = static_cast<int>(i);
    // Bad ids were reported by verify_structure; there is nothing to check here.
    bool ids_ok = f.has_value(op.result);
    std::vector<const Value*> operands;
    for (int id : op.operands) {
      if (!f.has_value(id))
        ids_ok = false;
      else
        operands.push_back(&f.values[static_cast<size_t>(id)]);
    }
    if (!ids_ok) continue;

    std::vector<std::string> problems;
    std::optional<TensorType> inferred =
        check_op(op.kind, operands, op.attrs, problems, op.operand_names);
    std::string prefix = value_label(f, op.result) + " = ";
    for (std::string& p : problems) out.push_back(Diagnostic{prefix + p, oi, op.result});
    const TensorType& stated = f.values[static_cast<size_t>(op.result)].type;
    if (inferred && *inferred != stated) {
      out.push_back(Diagnostic{cat(op_label(f, i), ": result type ", stated.str(),
                                   " does not match the inferred type ", inferred->str()),
                               oi, op.result});
    }
  }
}

}  // namespace tilejit::ir
