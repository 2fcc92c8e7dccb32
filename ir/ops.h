// Op kinds, their operand roles, and op attributes with the per-kind schema.
//
//   Attrs a{{"causal", true}, {"sm_scale", 0.125}};
//   a.get_bool("causal") == true;   name(OpKind::gelu_tanh) == "gelu_tanh"
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::ir {

enum class OpKind {
  gemm,
  attention,
  decode_attention,
  rope,
  moe,
  add,
  mul,
  relu,
  silu,
  gelu_tanh,
  gelu_erf,
  cast,
  relu2
};

// The spelling in the text form ("gemm", "gelu_tanh", ...).
const char* name(OpKind kind);
std::optional<OpKind> op_kind_from_name(std::string_view name);
// Every kind, in declaration order (for tests and tools that enumerate).
std::span<const OpKind> all_op_kinds();

bool is_activation(OpKind kind);          // relu, silu, gelu_tanh, gelu_erf, relu2
bool is_binary_elementwise(OpKind kind);  // add, mul
// add, mul, the activations and cast: what an elementwise kernel (a fused
// epilogue or an LLVM elementwise chain) can compute.
bool is_elementwise(OpKind kind);
// The public Activation an activation op computes; Activation::none otherwise.
Activation activation_of(OpKind kind);

// The names of the operands, in order: gemm -> {"x", "w"}. Their count is the
// op's arity. Messages refer to operands by these names.
std::span<const char* const> operand_roles(OpKind kind);
// The optional operands an op may take by name after its positional ones, in
// canonical order: gemm -> {"scale", "zero", "g_idx"} (quantized weights);
// empty for the other kinds.
std::span<const char* const> named_operand_roles(OpKind kind);

// ---- Attributes -----------------------------------------------------------

using IntList = std::vector<int64_t>;
using AttrValue = std::variant<bool, int64_t, double, std::string, DType, IntList>;
// Index-aligned with AttrValue's alternatives.
enum class AttrKind { boolean, integer, real, string, dtype, int_list };

AttrKind kind_of(const AttrValue& v);
const char* name(AttrKind kind);  // "bool", "int", "float", "string", "dtype", "int list"
// The text form: true, -1, 0.125, "neox", bf16, [1, 2].
std::string str(const AttrValue& v);

// A small name -> value map, kept sorted by name so that equal maps print and
// compare equal whatever order they were built in.
class Attrs {
 public:
  using Entry = std::pair<std::string, AttrValue>;

  Attrs() = default;
  // Throws tilejit::Error on a duplicate name or a non-finite float.
  Attrs(std::initializer_list<Entry> entries);

  // Inserts or replaces. Throws on a non-identifier name or a non-finite float
  // (the text form has no spelling for them, and no kernel wants them).
  Attrs& set(std::string name, AttrValue value);
  bool erase(std::string_view name);

  bool has(std::string_view name) const { return find(name) != nullptr; }
  const AttrValue* find(std::string_view name) const;

  // Typed getters: std::nullopt when absent, tilejit::Error when present with
  // another kind. get_double also accepts an int.
  std::optional<bool> get_bool(std::string_view name) const;
  std::optional<int64_t> get_int(std::string_view name) const;
  std::optional<double> get_double(std::string_view name) const;
  std::optional<std::string> get_string(std::string_view name) const;
  std::optional<DType> get_dtype(std::string_view name) const;
  std::optional<IntList> get_ints(std::string_view name) const;

  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  auto begin() const { return entries_.begin(); }
  auto end() const { return entries_.end(); }

  // "{causal = true, sm_scale = 0.125}", or "" when empty.
  std::string str() const;
  bool operator==(const Attrs&) const = default;

 private:
  std::vector<Entry> entries_;
};

// The attributes an op kind takes.
struct AttrSpec {
  const char* name;
  AttrKind kind;
  bool required;
  const char* doc;  // what it means and what values are allowed
};
std::span<const AttrSpec> attr_specs(OpKind kind);

// Appends a problem for each unknown, missing, mistyped or out-of-range
// attribute of an op of `kind` (messages do not name the op; callers prefix it).
void check_attrs(OpKind kind, const Attrs& attrs, std::vector<std::string>& problems);

}  // namespace tilejit::ir
