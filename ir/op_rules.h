// The context a per-op rule function works in: its operands by role, and
// helpers that both test a rule and phrase its message. Private to ir/.
#pragma once

#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ir/program.h"
#include "ir/text_util.h"

namespace tilejit::ir {

class RuleContext {
 public:
  RuleContext(OpKind kind, std::span<const Value* const> operands, const Attrs& attrs,
              std::vector<std::string>& problems, std::span<const std::string> named = {})
      : kind_(kind),
        operands_(operands),
        attrs_(attrs),
        problems_(problems),
        named_(named),
        start_(problems.size()) {}

  // No problem recorded so far. Rules run checks as statements (so messages
  // come in a fixed order) and test ok() where later checks need earlier ones.
  bool ok() const { return problems_.size() == start_; }

  OpKind kind() const { return kind_; }
  const Attrs& attrs() const { return attrs_; }
  const TensorType& type(size_t i) const { return operands_[i]->type; }
  // Axis counted from the front, or from the back when negative (-1 = last).
  const Dim& dim(size_t i, int axis) const;
  // "'w' (%w)": how messages name an operand.
  std::string who(size_t i) const;
  // The role of operand i ("x", "w", or a named one: "scale").
  std::string role(size_t i) const;
  size_t size() const { return operands_.size(); }
  // The index of the named operand `role`, if the op has it.
  std::optional<size_t> named(std::string_view role) const;

  // Records "<op>: <message>" and returns false, so rules read `return fail(...)`.
  bool fail(const std::string& message);

  // Each check records a message naming the operand and the rule, and returns
  // whether it held. `shape` reads like "[M, K]".
  bool rank(size_t i, int rank, const char* shape);
  bool dtype(size_t i, std::initializer_list<DType> allowed);
  bool dtype(size_t i, std::span<const DType> allowed);
  bool same_dtype(size_t i, size_t j, const char* rule);
  // row_major, with unit stride on the last dim (strided rows are fine).
  bool unit_stride_rows(size_t i);
  // row_major with unit last stride, or packed<vnni2> (GEMM weights).
  bool weight_layout(size_t i);
  // Any row_major layout (elementwise ops read strided operands).
  bool row_major(size_t i);
  bool static_dim(size_t i, int axis, const char* dim_name, const char* rule);
  // A static dim is not 0 (a symbolic one is checked when it is bound):
  // "operand 'w' (%w) has N=0; allowed: N >= 1 (<rule>)". The IR refuses the
  // empty dims the operators refuse, so that no later stage (plan, emit)
  // divides by them.
  bool nonzero_dim(size_t i, int axis, const char* dim_name, const char* rule);
  // dim(i, ai) == dim(j, aj), else "operand 'i' has N=.. but 'j' has N=..: <rule>".
  bool same_dim(size_t i, int ai, size_t j, int aj, const char* dim_name, const char* rule);

 private:
  OpKind kind_;
  std::span<const Value* const> operands_;
  const Attrs& attrs_;
  std::vector<std::string>& problems_;
  std::span<const std::string> named_;
  size_t start_;
};

// "[?M, 4096]"
std::string shape_str(const std::vector<Dim>& dims);
// A contiguous row-major result.
inline TensorType result(DType dtype, std::vector<Dim> dims) {
  return TensorType{dtype, std::move(dims), Layout{}};
}

// One quantized weight matrix (or E of them) and its named operands: the
// rules of docs/ir.md "Quantized weights", shared by gemm (w [N, K], scale,
// zero, g_idx) and moe (w13 / w2 [E, N, K], scale13, zero13, ...; each
// tensor then has a leading [E] dim). Defined in rules_gemm.cpp.
struct QuantWeight {
  size_t w = 0;                              // the weight operand
  std::optional<size_t> scale, zero, g_idx;  // its named operands, if given
  int64_t n = 0, k = 0;                      // one matrix's logical [N, K], static
  bool experts = false;                      // a leading expert dim on every tensor
  int64_t e = 0;                             // its size (experts only)
  const char* scale_role = "scale";          // for the missing-scale message
  const char* example = "";                  // how the op names it: "gemm %x, %w, scale = %s"
};
// The weight dtypes gemm and moe take (bf16, and the quantized ones of
// check_quant_weight).
inline constexpr DType kWeightDtypes[] = {DType::bf16, DType::i8, DType::f8e4m3, DType::u4,
                                          DType::f4e2m1};
// The layout rule of weight operand w of dtype wt, for gemm and moe.
void check_weight_layout(RuleContext& c, size_t w, DType wt);
// The scale / zero / g_idx rules and the format's attribute rules for a
// weight of dtype wt (i8, f8e4m3, u4 or f4e2m1).
void check_quant_weight(RuleContext& c, DType wt, const QuantWeight& q);
// An attribute of another weight dtype (group_size on f8e4m3): "<w_is>"
// says what the weight is.
void check_quant_attr_owners(RuleContext& c, DType wt, const std::string& w_is);

// One per op group; each returns the result type, or std::nullopt after
// recording at least one problem.
std::optional<TensorType> check_gemm(RuleContext& c);
std::optional<TensorType> check_binary(RuleContext& c);
std::optional<TensorType> check_activation(RuleContext& c);
std::optional<TensorType> check_cast(RuleContext& c);
std::optional<TensorType> check_attention(RuleContext& c);
std::optional<TensorType> check_decode_attention(RuleContext& c);
std::optional<TensorType> check_rope(RuleContext& c);
std::optional<TensorType> check_moe(RuleContext& c);

}  // namespace tilejit::ir
