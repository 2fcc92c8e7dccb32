#include "ir/printer.h"

#include "ir/text_util.h"

namespace tilejit::ir {

namespace {

std::string ref(const Function& f, int id) {
  return f.has_value(id) ? "%" + f.values[static_cast<size_t>(id)].name : cat("%<id ", id, ">");
}

std::string type_of(const Function& f, int id) {
  return f.has_value(id) ? f.values[static_cast<size_t>(id)].type.str() : "<no type>";
}

}  // namespace

std::string print(const Function& f, const Op& op) {
  std::string s = ref(f, op.result) + " = " + name(op.kind);
  const size_t named = first_named_operand(op);
  for (size_t i = 0; i < op.operands.size(); ++i) {
    s += i ? ", " : " ";
    // Named operands (a quantized gemm's scale, zero, g_idx): `scale = %s`.
    if (i >= named) s += op.operand_names[i - named] + " = ";
    s += ref(f, op.operands[i]);
  }
  if (!op.attrs.empty()) {
    s += ' ';
    s += op.attrs.str();
  }
  return s + " : " + type_of(f, op.result);
}

std::string print(const Function& f) {
  std::string s = "func @" + f.name + "(";
  for (size_t i = 0; i < f.params.size(); ++i) {
    s += i ? ", " : "";
    s += ref(f, f.params[i]) + ": " + type_of(f, f.params[i]);
  }
  s += ") -> (";
  for (size_t i = 0; i < f.results.size(); ++i) {
    s += i ? ", " : "";
    s += type_of(f, f.results[i]);
  }
  s += ") {\n";
  for (const Op& op : f.ops) {
    s += "  ";
    s += print(f, op);
    s += '\n';
  }
  s += "  return";
  for (size_t i = 0; i < f.results.size(); ++i) {
    s += i ? ", " : " ";
    s += ref(f, f.results[i]);
  }
  return s + "\n}\n";
}

}  // namespace tilejit::ir
