// A function of the IR: SSA values, ops that define them, parameters and
// results. Plain data; build it with ir::Builder or ir::parse, check it with
// ir::verify.
//
//   values are indexed by id (values[i].id == i); params come first, then each
//   op defines exactly one new value (its result), in program order.
#pragma once

#include <string>
#include <vector>

#include "ir/ops.h"
#include "ir/types.h"

namespace tilejit::ir {

struct Value {
  int id = -1;
  std::string name;  // printed as %name: a parameter name or a number ("0")
  TensorType type;
  bool operator==(const Value&) const = default;
};

struct Op {
  OpKind kind = OpKind::add;
  // Value ids: the positional operands, in operand_roles(kind) order, then
  // the named ones (a quantized gemm's scale, zero, g_idx).
  std::vector<int> operands;
  int result = -1;  // value id
  Attrs attrs;
  // The roles of the named operands (operands past operand_roles(kind)), in
  // canonical order (named_operand_roles(kind)); printed `scale = %s`.
  std::vector<std::string> operand_names;
  bool operator==(const Op&) const = default;
};

// Where op's named operands start: they are always its last
// operand_names.size() operands (the parser puts them there), whatever the
// number of positional ones a malformed op holds; the printer, operand_role
// and the verifier all go by this one rule.
size_t first_named_operand(const Op& op);

// The role of operand i of op: a positional role, a named one, or "#i".
std::string operand_role(const Op& op, size_t i);

struct Function {
  std::string name;
  std::vector<int> params;    // value ids
  std::vector<Value> values;  // indexed by id
  std::vector<Op> ops;
  std::vector<int> results;  // value ids

  bool has_value(int id) const { return id >= 0 && id < static_cast<int>(values.size()); }
  // Throws tilejit::Error when no value has this id.
  const Value& value(int id) const;
  // The types of the results, in order (throws like value()).
  std::vector<TensorType> result_types() const;
  bool operator==(const Function&) const = default;
};

}  // namespace tilejit::ir
