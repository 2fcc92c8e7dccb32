// SSA structure: values indexed by id with unique names, each defined once
// (as a parameter or by one op) before any use, and a return of defined values.
#include <unordered_map>

#include "ir/text_util.h"
#include "ir/verify_rules.h"

namespace tilejit::ir {

namespace {

bool is_value_name(const std::string& n) {
  if (n.empty()) return false;
  for (char c : n) {
    if (!is_ident_char(c)) return false;
  }
  return true;
}

}  // namespace

void verify_structure(const Function& f, std::vector<Diagnostic>& out) {
  auto add = [&](std::string msg, int op = -1, int value = -1) {
    out.push_back(Diagnostic{std::move(msg), op, value});
  };
  if (!is_identifier(f.name)) add(cat("function name '", f.name, "' is not an identifier"));

  std::unordered_map<std::string, int> by_name;
  for (size_t i = 0; i < f.values.size(); ++i) {
    const Value& v = f.values[i];
    int id = static_cast<int>(i);
    if (v.id != id)
      add(cat("value %", v.name, " at index ", i, " has id ", v.id, ": values are indexed by id"),
          -1, id);
    if (!is_value_name(v.name)) {
      add(cat("value id ", i, " has name '", v.name, "': names are [A-Za-z0-9_]+"), -1, id);
    } else if (auto [it, fresh] = by_name.emplace(v.name, id); !fresh) {
      add(cat("value %", v.name, " is named twice (ids ", it->second, " and ", i, ")"), -1, id);
    }
  }

  // 0 = undefined, 1 = defined; walking in program order makes "defined
  // before use" a lookup.
  std::vector<char> defined(f.values.size(), 0);
  for (int p : f.params) {
    if (!f.has_value(p)) {
      add(cat("parameter id ", p, " is not a value"));
    } else if (defined[static_cast<size_t>(p)]) {
      add(cat("parameter ", value_label(f, p), " is listed twice"), -1, p);
    } else {
      defined[static_cast<size_t>(p)] = 1;
    }
  }

  for (size_t i = 0; i < f.ops.size(); ++i) {
    const Op& op = f.ops[i];
    int oi = static_cast<int>(i);
    for (size_t j = 0; j < op.operands.size(); ++j) {
      int id = op.operands[j];
      std::string role = operand_role(op, j);
      if (role[0] != '#') role = cat("'", role, "'");
      if (!f.has_value(id)) {
        add(cat(op_label(f, i), ": operand ", role, " (id ", id, ") is not a value"), oi);
      } else if (!defined[static_cast<size_t>(id)]) {
        add(cat(op_label(f, i), ": operand ", role, " (", value_label(f, id),
                ") is used before it is defined"),
            oi, id);
      }
    }
    if (!f.has_value(op.result)) {
      add(cat(op_label(f, i), ": result id ", op.result, " is not a value"), oi);
    } else if (defined[static_cast<size_t>(op.result)]) {
      add(cat(op_label(f, i), ": redefines ", value_label(f, op.result),
              " (each value is defined once)"),
          oi, op.result);
    } else {
      defined[static_cast<size_t>(op.result)] = 1;
    }
  }

  if (f.results.empty()) add(cat("function @", f.name, " returns nothing"));
  for (int r : f.results) {
    if (!f.has_value(r)) {
      add(cat("return: id ", r, " is not a value"));
    } else if (!defined[static_cast<size_t>(r)]) {
      add(cat("return: ", value_label(f, r), " is not defined"), -1, r);
    }
  }
  for (size_t i = 0; i < f.values.size(); ++i) {
    if (!defined[i]) {
      add(cat("value ", value_label(f, static_cast<int>(i)),
              " is neither a parameter nor an op result"),
          -1, static_cast<int>(i));
    }
  }
}

}  // namespace tilejit::ir
