// The activations: one row per tilejit::Activation, the only list of them.
// Every check that an activation is allowed (gemm, fused_experts, the LLVM
// brgemm, the gemm lowering, the IR verifier and builder, the tool's program
// runner), every message that lists them, activation_name() and the mapping
// between activation ops and Activation read this table.
//
//   find_activation(Activation::silu)->name == "silu"
//   activation_from_name("gelu_erf") == Activation::gelu_erf
//   activation_list(false) == "none, relu, silu, gelu_tanh, gelu_erf, relu2"
//   activation_of(OpKind::silu) == Activation::silu  (ir/ops.h, from the table)
//
// A new activation is a value of the enum (include/tilejit/tilejit.h), a row
// here, its OpKind if the IR spells it (ir/ops.h, ir/ops.cpp), and its math:
// the reference (runtime/reference_gemm.h), the Xbyak epilogue
// (codegen/xbyak/avx512_epilogue.cpp), the LLVM vector math
// (codegen/llvm/vector_math.cpp) and its Lipschitz constant in the error
// bounds (runtime/reference_error_bounds.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/ops.h"
#include "tilejit/error.h"

namespace tilejit::ir {

struct ActivationInfo {
  Activation act;
  const char* name;          // activation_name(), the IR op and the moe attribute spelling
  std::optional<OpKind> op;  // the elementwise IR op that computes it (none for none)
  // Allowed as the act of a gated act(gate)·up (fused_experts, the GLU
  // epilogue); `gated_kernel` is sglang's name of that kernel, for messages.
  bool gated;
  const char* gated_kernel;
};

inline constexpr ActivationInfo kActivations[] = {
    {Activation::none, "none", std::nullopt, false, nullptr},
    {Activation::relu, "relu", OpKind::relu, false, nullptr},
    {Activation::silu, "silu", OpKind::silu, true, "silu_and_mul"},
    {Activation::gelu_tanh, "gelu_tanh", OpKind::gelu_tanh, true, "gelu_tanh_and_mul"},
    {Activation::gelu_erf, "gelu_erf", OpKind::gelu_erf, true, "gelu_and_mul"},
    {Activation::relu2, "relu2", OpKind::relu2, false, nullptr},
};

// Rows in enum order, so a row's index is its value (a value past the last
// row is outside the enum).
consteval bool activation_rows_in_enum_order() {
  for (size_t i = 0; i < std::size(kActivations); ++i)
    if (kActivations[i].act != static_cast<Activation>(i)) return false;
  return true;
}
static_assert(activation_rows_in_enum_order(), "kActivations: one row per Activation, in order");

// The row of `a`, or null for a value outside the enum (a cast from an int).
inline const ActivationInfo* find_activation(Activation a) {
  const auto i = static_cast<size_t>(a);
  return i < std::size(kActivations) ? &kActivations[i] : nullptr;
}

inline bool is_gated_activation(Activation a) {
  const ActivationInfo* r = find_activation(a);
  return r != nullptr && r->gated;
}

inline std::optional<Activation> activation_from_name(std::string_view name) {
  for (const ActivationInfo& r : kActivations)
    if (name == r.name) return r.act;
  return std::nullopt;
}

// The names, in enum order: every activation, or only the gated ones.
inline std::vector<std::string_view> activation_names(bool gated_only) {
  std::vector<std::string_view> names;
  for (const ActivationInfo& r : kActivations)
    if (!gated_only || r.gated) names.push_back(r.name);
  return names;
}

// For an "allowed:" message: "none, relu, silu, gelu_tanh, gelu_erf", or for
// the gated ones "silu (silu_and_mul), gelu_tanh (gelu_tanh_and_mul), ...".
inline std::string activation_list(bool gated_only, std::string_view sep = ", ") {
  std::string s;
  for (const ActivationInfo& r : kActivations) {
    if (gated_only && !r.gated) continue;
    if (!s.empty()) s += sep;
    s += r.name;
    if (gated_only) (s += " (") += std::string(r.gated_kernel) + ")";
  }
  return s;
}

// `a` for a message: its name, or its number when it is outside the enum.
inline std::string activation_str(Activation a) {
  const ActivationInfo* r = find_activation(a);
  return r != nullptr ? std::string(r->name) : std::to_string(static_cast<int>(a));
}

// The Error of `op` for an act outside the enum (a cast from an int): gemm's
// and a non-gated fused_experts' one rule.
inline void check_activation(const char* op, Activation a) {
  if (find_activation(a) == nullptr)
    throw Error(std::string(op) + ": act=" + activation_str(a) +
                " is not an activation; allowed: " + activation_list(false));
}

}  // namespace tilejit::ir
