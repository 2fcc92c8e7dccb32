#include "ir/builder.h"

#include "ir/activation.h"
#include "ir/infer.h"
#include "ir/text_util.h"
#include "ir/verifier.h"

namespace tilejit::ir {

Builder::Builder(std::string func_name) {
  if (!is_identifier(func_name)) {
    throw Error(cat("Builder: function name '", func_name, "' is not an identifier"));
  }
  f_.name = std::move(func_name);
}

void Builder::check_open(const char* what) const {
  if (finished_) throw Error(cat(what, ": the builder of @", f_.name, " has finished"));
  if (returned_) throw Error(cat(what, ": @", f_.name, " has returned already"));
}

int Builder::param(std::string name, TensorType type) {
  check_open("param");
  if (!f_.ops.empty()) {
    throw Error(cat("param '", name, "': parameters must be declared before the first op"));
  }
  if (!is_identifier(name)) throw Error(cat("param '", name, "': not an identifier"));
  if (names_.count(name)) throw Error(cat("param '", name, "': the name is taken"));
  std::vector<std::string> problems;
  check_type(type, problems);
  if (!problems.empty()) {
    throw Error(cat("param '", name, "': ", type.str(), ": ", problems.front()));
  }
  int id = static_cast<int>(f_.values.size());
  names_.insert(name);
  f_.values.push_back(Value{id, std::move(name), std::move(type)});
  f_.params.push_back(id);
  return id;
}

const Value& Builder::value(int id) const {
  if (!f_.has_value(id)) throw Error(cat("Builder: no value with id ", id));
  return f_.values[static_cast<size_t>(id)];
}

const Value& Builder::operand(const char* op, int id) const {
  if (!f_.has_value(id)) {
    throw Error(cat(op, ": operand id ", id, " is not a value of @", f_.name));
  }
  return f_.values[static_cast<size_t>(id)];
}

int Builder::op(OpKind kind, std::vector<int> operands, Attrs attrs,
                std::vector<std::string> named) {
  check_open(name(kind));
  std::vector<const Value*> vals;
  vals.reserve(operands.size());
  for (int id : operands) vals.push_back(&operand(name(kind), id));
  TensorType type = infer_type(kind, vals, attrs, named);

  std::string result_name;
  do {
    result_name = std::to_string(next_number_++);
  } while (names_.count(result_name));
  int id = static_cast<int>(f_.values.size());
  names_.insert(result_name);
  f_.values.push_back(Value{id, std::move(result_name), std::move(type)});
  f_.ops.push_back(Op{kind, std::move(operands), id, std::move(attrs), std::move(named)});
  return id;
}

int Builder::gemm(int x, int w) {
  return op(OpKind::gemm, {x, w});
}
int Builder::gemm_quant(int x, int w, int scale, Attrs attrs, int zero, int g_idx) {
  std::vector<int> operands = {x, w, scale};
  std::vector<std::string> named = {"scale"};
  if (zero >= 0) operands.push_back(zero), named.push_back("zero");
  if (g_idx >= 0) operands.push_back(g_idx), named.push_back("g_idx");
  return op(OpKind::gemm, std::move(operands), std::move(attrs), std::move(named));
}
int Builder::add(int a, int b) {
  return op(OpKind::add, {a, b});
}
int Builder::mul(int a, int b) {
  return op(OpKind::mul, {a, b});
}

int Builder::unary(OpKind act, int x) {
  if (!is_activation(act)) {
    std::string ops;
    for (const ActivationInfo& r : kActivations)
      if (r.op) ops += cat(ops.empty() ? "" : ", ", name(*r.op));
    throw Error(cat("unary: ", name(act), " is not an activation (", ops, ")"));
  }
  return op(act, {x});
}

int Builder::cast(int x, DType to) {
  return op(OpKind::cast, {x}, Attrs{{"to", to}});
}

int Builder::attention(int q, int k, int v, Attrs attrs) {
  return op(OpKind::attention, {q, k, v}, std::move(attrs));
}

int Builder::rope(int q, int positions, int cos_sin, Attrs attrs) {
  return op(OpKind::rope, {q, positions, cos_sin}, std::move(attrs));
}

int Builder::moe(int hidden, int w13, int w2, int topk_weights, int topk_ids, Attrs attrs) {
  return op(OpKind::moe, {hidden, w13, w2, topk_weights, topk_ids}, std::move(attrs));
}

void Builder::ret(std::vector<int> values) {
  check_open("return");
  if (values.empty()) throw Error(cat("return: @", f_.name, " must return at least one value"));
  for (int id : values) operand("return", id);
  f_.results = std::move(values);
  returned_ = true;
}

Function Builder::finish() {
  if (finished_) throw Error(cat("finish: the builder of @", f_.name, " has finished"));
  if (!returned_) throw Error(cat("finish: @", f_.name, " has no return (call ret first)"));
  verify(f_);  // the op methods checked each op; this checks the whole
  finished_ = true;
  return std::move(f_);
}

}  // namespace tilejit::ir
