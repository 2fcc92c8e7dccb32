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
  std::vector<int> operands;  // value ids, in operand_roles(kind) order
  int result = -1;            // value id
  Attrs attrs;
  bool operator==(const Op&) const = default;
};

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
