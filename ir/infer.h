// Type inference and op rules: given an op kind, its operand values and its
// attributes, either the result type or what is wrong. The Builder and the
// verifier both go through here, so the rules live in one place (one file per
// op group: rules_gemm.cpp, rules_elementwise.cpp, rules_attention.cpp,
// rules_rope.cpp, rules_moe.cpp).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ir/program.h"

namespace tilejit::ir {

// Checks arity, attributes and the operand rules of `kind`, and infers the
// result type. On failure appends problems of the form
//   "gemm: operand 'w' (%w) has K=100 but 'x' (%x) has K=64: the reduction dims must match"
// and returns std::nullopt. Operand pointers must not be null. `named` gives
// the roles of the operands past the positional ones (Op::operand_names).
std::optional<TensorType> check_op(OpKind kind, std::span<const Value* const> operands,
                                   const Attrs& attrs, std::vector<std::string>& problems,
                                   std::span<const std::string> named = {});

// Same, throwing tilejit::Error with the first problem.
TensorType infer_type(OpKind kind, std::span<const Value* const> operands, const Attrs& attrs,
                      std::span<const std::string> named = {});

}  // namespace tilejit::ir
