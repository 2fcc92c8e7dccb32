#include "ir/infer.h"

#include <algorithm>

#include "ir/op_rules.h"

namespace tilejit::ir {

const Dim& RuleContext::dim(size_t i, int axis) const {
  const auto& dims = type(i).dims;
  return dims[static_cast<size_t>(axis < 0 ? static_cast<int>(dims.size()) + axis : axis)];
}

std::string RuleContext::role(size_t i) const {
  auto roles = operand_roles(kind_);
  if (i < roles.size()) return roles[i];
  if (i - roles.size() < named_.size()) return named_[i - roles.size()];
  return cat("#", i);
}

std::optional<size_t> RuleContext::named(std::string_view r) const {
  for (size_t j = 0; j < named_.size(); ++j)
    if (named_[j] == r) return operand_roles(kind_).size() + j;
  return std::nullopt;
}

std::string RuleContext::who(size_t i) const {
  return cat("'", role(i), "' (%", operands_[i]->name, ")");
}

bool RuleContext::fail(const std::string& message) {
  problems_.push_back(cat(name(kind_), ": ", message));
  return false;
}

bool RuleContext::rank(size_t i, int r, const char* shape) {
  if (type(i).rank() == r) return true;
  return fail(cat("operand ", who(i), " has rank ", type(i).rank(), " (", type(i).str(),
                  "): ", name(kind_), " takes ", role(i), " as ", shape));
}

bool RuleContext::dtype(size_t i, std::initializer_list<DType> allowed) {
  return dtype(i, std::span<const DType>(allowed.begin(), allowed.size()));
}

bool RuleContext::dtype(size_t i, std::span<const DType> allowed) {
  if (std::find(allowed.begin(), allowed.end(), type(i).dtype) != allowed.end()) return true;
  std::string list = join(allowed, ", ", [](DType t) { return dtype_name(t); });
  return fail(cat("operand ", who(i), " has dtype ", dtype_name(type(i).dtype), ": ", name(kind_),
                  " takes ", role(i), " as ", list));
}

bool RuleContext::same_dtype(size_t i, size_t j, const char* rule) {
  if (type(i).dtype == type(j).dtype) return true;
  return fail(cat("operand ", who(i), " has dtype ", dtype_name(type(i).dtype), " but ", who(j),
                  " has ", dtype_name(type(j).dtype), ": ", rule));
}

bool RuleContext::unit_stride_rows(size_t i) {
  const Layout& l = type(i).layout;
  if (l.kind == LayoutKind::row_major &&
      (l.strides.empty() || l.strides.back() == std::optional<int64_t>(1))) {
    return true;
  }
  return fail(cat("operand ", who(i), " has layout ", l.str(), ": ", name(kind_), " takes ",
                  role(i), " row_major with unit stride on the last dim"));
}

bool RuleContext::weight_layout(size_t i) {
  const Layout& l = type(i).layout;
  if (l.is_packed("vnni2")) return true;
  if (l.kind == LayoutKind::row_major &&
      (l.strides.empty() || l.strides.back() == std::optional<int64_t>(1))) {
    return true;
  }
  return fail(cat("operand ", who(i), " has layout ", l.str(), ": ", name(kind_), " takes ",
                  role(i), " row_major (unit stride on the last dim) or packed<vnni2>"));
}

bool RuleContext::row_major(size_t i) {
  const Layout& l = type(i).layout;
  if (l.kind == LayoutKind::row_major) return true;
  return fail(cat("operand ", who(i), " has layout ", l.str(), ": ", name(kind_),
                  " takes row_major operands (unpack first)"));
}

bool RuleContext::static_dim(size_t i, int axis, const char* dim_name, const char* rule) {
  if (dim(i, axis).is_static()) return true;
  return fail(cat("operand ", who(i), " has ", dim_name, "=", dim(i, axis).str(), ": ", rule));
}

bool RuleContext::nonzero_dim(size_t i, int axis, const char* dim_name, const char* rule) {
  const Dim& d = dim(i, axis);
  if (!d.is_static() || d.value != 0) return true;
  return fail(
      cat("operand ", who(i), " has ", dim_name, "=0; allowed: ", dim_name, " >= 1 (", rule, ")"));
}

bool RuleContext::same_dim(size_t i, int ai, size_t j, int aj, const char* dim_name,
                           const char* rule) {
  if (dim(i, ai) == dim(j, aj)) return true;
  return fail(cat("operand ", who(i), " has ", dim_name, "=", dim(i, ai).str(), " but ", who(j),
                  " has ", dim_name, "=", dim(j, aj).str(), ": ", rule));
}

std::string shape_str(const std::vector<Dim>& dims) {
  return cat("[", join(dims, ", ", [](const Dim& d) { return d.str(); }), "]");
}

std::optional<TensorType> check_op(OpKind kind, std::span<const Value* const> operands,
                                   const Attrs& attrs, std::vector<std::string>& problems,
                                   std::span<const std::string> named) {
  auto roles = operand_roles(kind);
  if (operands.size() != roles.size() + named.size()) {
    std::string list = join(roles, ", ", [](const char* r) { return r; });
    if (named.empty()) {
      problems.push_back(cat(name(kind), ": takes ", roles.size(), " operands (", list, "), got ",
                             operands.size()));
    } else {
      problems.push_back(cat(name(kind), ": has ", operands.size(), " operands but ", roles.size(),
                             " positional (", list, ") and ", named.size(), " named ones"));
    }
    return std::nullopt;
  }
  // Named operands: known roles, each once, in canonical order.
  size_t before = problems.size();
  {
    auto known = named_operand_roles(kind);
    std::string known_list = join(known, ", ", [](const char* r) { return r; });
    size_t last = 0;
    for (size_t j = 0; j < named.size(); ++j) {
      size_t at = known.size();
      for (size_t r = 0; r < known.size(); ++r)
        if (named[j] == known[r]) at = r;
      if (at == known.size()) {
        problems.push_back(cat(name(kind), ": has no operand '", named[j], "' (",
                               known.empty() ? cat(name(kind), " takes no named operands")
                                             : cat("its named operands are ", known_list),
                               ")"));
      } else if (j > 0 && at <= last) {
        problems.push_back(cat(name(kind), ": operand '", named[j],
                               "' is given twice or out of "
                               "order (the named operands come in the order ",
                               known_list, ")"));
      }
      last = at;
    }
    if (problems.size() != before) return std::nullopt;
  }
  std::vector<std::string> attr_problems;
  check_attrs(kind, attrs, attr_problems);
  for (auto& p : attr_problems) problems.push_back(cat(name(kind), ": ", p));
  // Operand rules read attributes (top_k, rotary_dim), so they wait for sane ones.
  if (problems.size() != before) return std::nullopt;

  RuleContext c(kind, operands, attrs, problems, named);
  switch (kind) {
    case OpKind::gemm:
      return check_gemm(c);
    case OpKind::add:
    case OpKind::mul:
      return check_binary(c);
    case OpKind::relu:
    case OpKind::silu:
    case OpKind::gelu_tanh:
    case OpKind::gelu_erf:
    case OpKind::relu2:
      return check_activation(c);
    case OpKind::cast:
      return check_cast(c);
    case OpKind::attention:
      return check_attention(c);
    case OpKind::decode_attention:
      return check_decode_attention(c);
    case OpKind::rope:
      return check_rope(c);
    case OpKind::moe:
      return check_moe(c);
  }
  problems.push_back(cat("unknown op kind ", static_cast<int>(kind)));
  return std::nullopt;
}

TensorType infer_type(OpKind kind, std::span<const Value* const> operands, const Attrs& attrs,
                      std::span<const std::string> named) {
  std::vector<std::string> problems;
  std::optional<TensorType> t = check_op(kind, operands, attrs, problems, named);
  if (!t)
    throw Error(problems.empty() ? cat(name(kind), ": cannot infer the result type")
                                 : problems.front());
  return *t;
}

}  // namespace tilejit::ir
