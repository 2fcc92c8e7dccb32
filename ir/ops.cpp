#include "ir/ops.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>

#include "ir/activation.h"
#include "ir/attention_rules.h"
#include "ir/text_util.h"
#include "ir/types.h"

namespace tilejit::ir {

namespace {

struct KindInfo {
  OpKind kind;
  const char* name;
  std::span<const char* const> roles;
};

constexpr const char* kGemmRoles[] = {"x", "w"};
constexpr const char* kAttentionRoles[] = {"q", "k", "v"};
constexpr const char* kDecodeAttentionRoles[] = {"q", "k_cache", "v_cache", "block_table",
                                                 "seq_lens"};
constexpr const char* kRopeRoles[] = {"q", "positions", "cos_sin"};
constexpr const char* kMoeRoles[] = {"hidden", "w13", "w2", "topk_weights", "topk_ids"};
constexpr const char* kBinaryRoles[] = {"a", "b"};
constexpr const char* kUnaryRoles[] = {"x"};
constexpr const char* kGemmNamedRoles[] = {"scale", "zero", "g_idx"};
// AttentionOptions' per-head tensors (both attention ops).
constexpr const char* kAttentionNamedRoles[] = {"sinks", "alibi_slopes"};
// Per projection, the gemm's roles with the projection's suffix; then the
// MoeOptions tensors: biases, the shared expert and its per-token weight.
constexpr const char* kMoeNamedRoles[] = {"scale13",    "zero13",    "g_idx13",       "scale2",
                                          "zero2",      "g_idx2",    "b13",           "b2",
                                          "shared_w13", "shared_w2", "shared_weights"};

constexpr std::array<KindInfo, 13> kKinds = {{
    {OpKind::gemm, "gemm", kGemmRoles},
    {OpKind::attention, "attention", kAttentionRoles},
    {OpKind::decode_attention, "decode_attention", kDecodeAttentionRoles},
    {OpKind::rope, "rope", kRopeRoles},
    {OpKind::moe, "moe", kMoeRoles},
    {OpKind::add, "add", kBinaryRoles},
    {OpKind::mul, "mul", kBinaryRoles},
    {OpKind::relu, "relu", kUnaryRoles},
    {OpKind::silu, "silu", kUnaryRoles},
    {OpKind::gelu_tanh, "gelu_tanh", kUnaryRoles},
    {OpKind::gelu_erf, "gelu_erf", kUnaryRoles},
    {OpKind::cast, "cast", kUnaryRoles},
    {OpKind::relu2, "relu2", kUnaryRoles},
}};

constexpr std::array<OpKind, 13> kAllKinds = {
    OpKind::gemm,      OpKind::attention, OpKind::decode_attention,
    OpKind::rope,      OpKind::moe,       OpKind::add,
    OpKind::mul,       OpKind::relu,      OpKind::silu,
    OpKind::gelu_tanh, OpKind::gelu_erf,  OpKind::cast,
    OpKind::relu2};

const KindInfo& info(OpKind kind) {
  for (const KindInfo& k : kKinds) {
    if (k.kind == kind) return k;
  }
  throw Error(cat("unknown OpKind ", static_cast<int>(kind)));
}

constexpr AttrSpec kAttentionAttrs[] = {
    {"causal", AttrKind::boolean, false, "mask keys after the query position (default false)"},
    {"sm_scale", AttrKind::real, false, "softmax scale, finite (default 1/sqrt(D))"},
    {"window_left", AttrKind::integer, false, "keys visible before the query, -1 = all (default)"},
    {"window_right", AttrKind::integer, false, "keys visible after the query, -1 = all (default)"},
    {"softcap", AttrKind::real, false, "logit soft-capping tanh(s/c)*c, 0 = off (default), >= 0"},
};
// tilejit::decode_attention's options: the new token is the last position,
// so there is no causal flag or right window; k_scale / v_scale exactly with
// an fp8 (f8e4m3 or f8e5m2) cache (rules_attention.cpp).
constexpr AttrSpec kDecodeAttentionAttrs[] = {
    {"sm_scale", AttrKind::real, false, "softmax scale, finite (default 1/sqrt(D))"},
    {"window_left", AttrKind::integer, false,
     "keys visible before the new token, -1 = all (default)"},
    {"softcap", AttrKind::real, false, "logit soft-capping tanh(s/c)*c, 0 = off (default), >= 0"},
    {"k_scale", AttrKind::real, false,
     "fp8 cache: K is read as code * k_scale, finite and > 0 (default 1)"},
    {"v_scale", AttrKind::real, false,
     "fp8 cache: V is read as code * v_scale, finite and > 0 (default 1)"},
};
constexpr AttrSpec kRopeAttrs[] = {
    {"style", AttrKind::string, false, "\"neox\" (rotate halves, default) or \"gptj\" (pairs)"},
    {"rotary_dim", AttrKind::integer, false, "leading head dims rotated, even, <= D (default D)"},
};
constexpr AttrSpec kMoeAttrs[] = {
    {"top_k", AttrKind::integer, true, "experts per token, >= 1"},
    {"activation", AttrKind::string, false,
     "gated activation: \"silu\" (default), \"gelu_tanh\", \"gelu_erf\" or \"clamped_swiglu\" "
     "(GPT-OSS); with gated = false any activation (\"relu2\": Nemotron-H)"},
    {"gated", AttrKind::boolean, false,
     "true (default): w13 [E, 2*I, H] stacks gate and up, act(gate)*up; false: a non-gated MLP, "
     "w13 [E, I, H] the up projection alone, act(up) (tilejit::ExpertProj::up)"},
    {"swiglu_alpha", AttrKind::real, false, "clamped_swiglu: sigmoid slope, > 0 (default 1.702)"},
    {"swiglu_limit", AttrKind::real, false,
     "clamped_swiglu: clamp of gate and up, > 0 (default 7)"},
    {"routed_scaling_factor", AttrKind::real, false, "scale of the routed sum (default 1)"},
    {"glu_rows", AttrKind::string, false,
     "w13's gate / up rows: \"halves\" (default: the I gate rows, then the I up rows) or "
     "\"interleaved\" (GPT-OSS: gate i, up i alternate)"},
    // Quantized experts (one set for both projections; rules_gemm.cpp's rules).
    {"act_quant", AttrKind::string, false,
     "i8 experts: how both projections' inputs are quantized per token, \"dynamic_sym\" "
     "(default) or \"dynamic_asym\""},
    {"bits", AttrKind::integer, false, "u4 experts: bits per code, 4 (the default and only value)"},
    {"block_k", AttrKind::integer, false, "f8e4m3 block scales: K per scale block, even, >= 2"},
    {"block_n", AttrKind::integer, false, "f8e4m3 block scales: N per scale block, >= 1"},
    {"format", AttrKind::string, false,
     "u4 experts (required): the checkpoint layout, \"awq\" or \"gptq\""},
    {"gptq_v2", AttrKind::boolean, false,
     "u4 gptq experts: zero points stored as z (gptq_v2) instead of z - 1 (default false)"},
    {"group_size", AttrKind::integer, false,
     "u4 experts: K per scale group, >= 1 (128 default; 32, 64, ...) or -1 (one group)"},
    {"int4_route", AttrKind::string, false,
     "u4 experts: \"automatic\" (default: W4A8 per expert by its routed rows, on llvm from 4, "
     "on avx512 from 5), \"w4a16\" or \"w4a8\" (inputs quantized per token, dynamic_sym)"},
};
// The quantized weight's attributes; which apply to which weight dtype is a
// rule of rules_gemm.cpp.
constexpr AttrSpec kGemmAttrs[] = {
    {"act_quant", AttrKind::string, false,
     "i8 weights: how x is quantized per call, \"dynamic_sym\" (default), \"dynamic_asym\" or "
     "\"fixed\""},
    {"act_scale", AttrKind::real, false, "i8 weights, act_quant = \"fixed\": x's scale, > 0"},
    {"act_zero_point", AttrKind::integer, false,
     "i8 weights, act_quant = \"fixed\": x's u8 zero point in [0, 255] (default 128)"},
    {"bits", AttrKind::integer, false, "u4 weights: bits per code, 4 (the default and only value)"},
    {"block_k", AttrKind::integer, false, "f8e4m3 block scales: K per scale block, even, >= 2"},
    {"block_n", AttrKind::integer, false, "f8e4m3 block scales: N per scale block, >= 1"},
    {"format", AttrKind::string, false,
     "u4 weights (required): the checkpoint layout, \"awq\" or \"gptq\""},
    {"gptq_v2", AttrKind::boolean, false,
     "u4 gptq weights: zero points stored as z (gptq_v2) instead of z - 1 (default false)"},
    {"group_size", AttrKind::integer, false,
     "u4 weights: K per scale group, >= 1 (128 default; 32, 64, ...) or -1 (one group)"},
    {"int4_route", AttrKind::string, false,
     "u4 weights: \"automatic\" (default: W4A8 on llvm from M = 4, on avx512 from M = 5), "
     "\"w4a16\" or \"w4a8\" (x quantized per token, dynamic_sym)"},
};
constexpr AttrSpec kCastAttrs[] = {
    {"to", AttrKind::dtype, true, "target dtype: f32, bf16 or f16"},
};

bool kind_accepts(AttrKind want, AttrKind got) {
  return want == got || (want == AttrKind::real && got == AttrKind::integer);
}

double as_double(const AttrValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::get<double>(v);
}

}  // namespace

const char* name(OpKind kind) {
  return info(kind).name;
}

std::optional<OpKind> op_kind_from_name(std::string_view n) {
  for (const KindInfo& k : kKinds) {
    if (n == k.name) return k.kind;
  }
  return std::nullopt;
}

std::span<const OpKind> all_op_kinds() {
  return kAllKinds;
}

bool is_activation(OpKind k) {
  return activation_of(k) != Activation::none;
}

bool is_elementwise(OpKind k) {
  return is_activation(k) || is_binary_elementwise(k) || k == OpKind::cast;
}

Activation activation_of(OpKind k) {
  for (const ActivationInfo& r : kActivations)
    if (r.op == k) return r.act;
  return Activation::none;
}

bool is_binary_elementwise(OpKind k) {
  return k == OpKind::add || k == OpKind::mul;
}

std::span<const char* const> operand_roles(OpKind kind) {
  return info(kind).roles;
}

std::span<const char* const> named_operand_roles(OpKind kind) {
  if (kind == OpKind::gemm) return kGemmNamedRoles;
  if (kind == OpKind::moe) return kMoeNamedRoles;
  if (kind == OpKind::attention || kind == OpKind::decode_attention) return kAttentionNamedRoles;
  return {};
}

AttrKind kind_of(const AttrValue& v) {
  return static_cast<AttrKind>(v.index());
}

const char* name(AttrKind kind) {
  switch (kind) {
    case AttrKind::boolean:
      return "bool";
    case AttrKind::integer:
      return "int";
    case AttrKind::real:
      return "float";
    case AttrKind::string:
      return "string";
    case AttrKind::dtype:
      return "dtype";
    case AttrKind::int_list:
      return "int list";
  }
  return "?";
}

std::string str(const AttrValue& v) {
  struct Visitor {
    std::string operator()(bool b) const { return b ? "true" : "false"; }
    std::string operator()(int64_t i) const { return std::to_string(i); }
    std::string operator()(double d) const {
      // Shortest form that reads back to the same double, always with a '.' or
      // an exponent so that the parser reads it back as a float, not an int.
      char buf[64];
      auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
      std::string s(buf, ec == std::errc() ? end : buf);
      if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
      return s;
    }
    std::string operator()(const std::string& s) const {
      std::string out = "\"";
      for (char c : s) {
        if (c == '"' || c == '\\') out += '\\';
        out += c;
      }
      return out + "\"";
    }
    std::string operator()(DType t) const { return dtype_name(t); }
    std::string operator()(const IntList& l) const {
      return cat("[", join(l, ", ", [](int64_t i) { return std::to_string(i); }), "]");
    }
  };
  return std::visit(Visitor{}, v);
}

Attrs::Attrs(std::initializer_list<Entry> entries) {
  for (const Entry& e : entries) {
    if (has(e.first)) throw Error(cat("Attrs: attribute '", e.first, "' given twice"));
    set(e.first, e.second);
  }
}

Attrs& Attrs::set(std::string n, AttrValue value) {
  if (!is_identifier(n)) throw Error(cat("Attrs: name '", n, "' is not an identifier"));
  if (const auto* d = std::get_if<double>(&value); d && !std::isfinite(*d)) {
    throw Error(cat("Attrs: attribute '", n, "' is not finite"));
  }
  auto it = std::lower_bound(entries_.begin(), entries_.end(), n,
                             [](const Entry& e, const std::string& k) { return e.first < k; });
  if (it != entries_.end() && it->first == n) {
    it->second = std::move(value);
  } else {
    entries_.insert(it, Entry{std::move(n), std::move(value)});
  }
  return *this;
}

bool Attrs::erase(std::string_view n) {
  auto it =
      std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.first == n; });
  if (it == entries_.end()) return false;
  entries_.erase(it);
  return true;
}

const AttrValue* Attrs::find(std::string_view n) const {
  for (const Entry& e : entries_) {
    if (e.first == n) return &e.second;
  }
  return nullptr;
}

namespace {
template <typename T>
std::optional<T> get_as(const Attrs& a, std::string_view n, AttrKind want) {
  const AttrValue* v = a.find(n);
  if (v == nullptr) return std::nullopt;
  if (const T* p = std::get_if<T>(v)) return *p;
  throw Error(cat("attribute '", n, "' is a ", name(kind_of(*v)), ", not a ", name(want)));
}
}  // namespace

std::optional<bool> Attrs::get_bool(std::string_view n) const {
  return get_as<bool>(*this, n, AttrKind::boolean);
}
std::optional<int64_t> Attrs::get_int(std::string_view n) const {
  return get_as<int64_t>(*this, n, AttrKind::integer);
}
std::optional<double> Attrs::get_double(std::string_view n) const {
  const AttrValue* v = find(n);
  if (v != nullptr && std::holds_alternative<int64_t>(*v)) return as_double(*v);
  return get_as<double>(*this, n, AttrKind::real);
}
std::optional<std::string> Attrs::get_string(std::string_view n) const {
  return get_as<std::string>(*this, n, AttrKind::string);
}
std::optional<DType> Attrs::get_dtype(std::string_view n) const {
  return get_as<DType>(*this, n, AttrKind::dtype);
}
std::optional<IntList> Attrs::get_ints(std::string_view n) const {
  return get_as<IntList>(*this, n, AttrKind::int_list);
}

std::string Attrs::str() const {
  if (entries_.empty()) return "";
  std::string s = "{";
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i) s += ", ";
    s += entries_[i].first + " = " + ir::str(entries_[i].second);
  }
  return s + "}";
}

std::span<const AttrSpec> attr_specs(OpKind kind) {
  switch (kind) {
    case OpKind::attention:
      return kAttentionAttrs;
    case OpKind::decode_attention:
      return kDecodeAttentionAttrs;
    case OpKind::rope:
      return kRopeAttrs;
    case OpKind::moe:
      return kMoeAttrs;
    case OpKind::cast:
      return kCastAttrs;
    case OpKind::gemm:
      return kGemmAttrs;
    default:
      return {};
  }
}

void check_attrs(OpKind kind, const Attrs& attrs, std::vector<std::string>& problems) {
  auto specs = attr_specs(kind);
  auto spec_of = [&](std::string_view n) -> const AttrSpec* {
    for (const AttrSpec& s : specs) {
      if (n == s.name) return &s;
    }
    return nullptr;
  };
  size_t before = problems.size();
  for (const auto& [n, v] : attrs) {
    const AttrSpec* s = spec_of(n);
    if (s == nullptr) {
      std::string known = join(specs, ", ", [](const AttrSpec& sp) { return sp.name; });
      problems.push_back(cat("unknown attribute '", n, "' (", name(kind), " takes ",
                             known.empty() ? "no attributes" : known, ")"));
    } else if (!kind_accepts(s->kind, kind_of(v))) {
      problems.push_back(cat("attribute '", n, "' is a ", name(kind_of(v)), " (", str(v),
                             "), expected a ", name(s->kind)));
    }
  }
  for (const AttrSpec& s : specs) {
    if (s.required && !attrs.has(s.name)) {
      problems.push_back(cat("missing required attribute '", s.name, "': ", s.doc));
    }
  }
  if (problems.size() != before) return;  // values are only checked once the kinds are right

  auto int_at_least = [&](const char* n, int64_t lo) {
    if (auto v = attrs.get_int(n); v && *v < lo) {
      problems.push_back(cat("attribute '", n, "' = ", *v, " must be >= ", lo));
    }
  };
  auto one_of = [&](const char* n, const std::vector<std::string_view>& allowed) {
    auto v = attrs.get_string(n);
    if (!v || std::find(allowed.begin(), allowed.end(), *v) != allowed.end()) return;
    std::string list = join(allowed, ", ", [](std::string_view a) { return cat('"', a, '"'); });
    problems.push_back(cat("attribute '", n, "' = \"", *v, "\" must be one of ", list));
  };
  // An attribute against the operators' own rule (ir/attention_rules.h).
  auto real_rule = [&](const char* n, const char* (*refusal)(double)) {
    if (auto v = attrs.get_double(n))
      if (const char* allowed = refusal(*v))
        problems.push_back(cat("attribute '", n, "' = ", *v, "; allowed: ", allowed));
  };
  auto int_rule = [&](const char* n, const char* (*refusal)(int64_t)) {
    if (auto v = attrs.get_int(n))
      if (const char* allowed = refusal(*v))
        problems.push_back(cat("attribute '", n, "' = ", *v, "; allowed: ", allowed));
  };
  // The score options both attention ops take (AttentionOptions).
  auto score_attrs = [&] {
    real_rule("sm_scale", sm_scale_refusal);
    real_rule("softcap", softcap_refusal);
    int_rule("window_left", window_refusal);
  };
  switch (kind) {
    case OpKind::attention:
      score_attrs();
      int_rule("window_right", window_refusal);
      break;
    case OpKind::decode_attention:
      score_attrs();
      for (const char* n : {"k_scale", "v_scale"}) real_rule(n, kv_scale_refusal);
      break;
    case OpKind::rope:
      one_of("style", {"neox", "gptj"});
      int_at_least("rotary_dim", 1);
      break;
    case OpKind::gemm:
      one_of("format", {"awq", "gptq"});
      one_of("act_quant", {"dynamic_sym", "dynamic_asym", "fixed"});
      one_of("int4_route", {"automatic", "w4a16", "w4a8"});
      break;
    case OpKind::moe:
      int_at_least("top_k", 1);
      one_of("format", {"awq", "gptq"});
      // A fixed activation scale needs one per projection (MoeOptions::act_scale13 /
      // act_scale2): the IR op has no attributes for them yet, so it stays dynamic.
      one_of("act_quant", {"dynamic_sym", "dynamic_asym"});
      one_of("int4_route", {"automatic", "w4a16", "w4a8"});
      one_of("glu_rows", {"halves", "interleaved"});
      if (!attrs.get_bool("gated").value_or(true)) {
        // A non-gated MLP: any activation of act(up), no gate / up layout.
        one_of("activation", activation_names(/*gated_only=*/false));
        for (const char* n : {"glu_rows", "swiglu_alpha", "swiglu_limit"})
          if (attrs.has(n))
            problems.push_back(
                cat("attribute '", n, "' with gated = false: it describes a gated w13"));
      } else {
        one_of("activation", [] {
          std::vector<std::string_view> v = activation_names(/*gated_only=*/true);
          v.push_back("clamped_swiglu");
          return v;
        }());
      }
      for (const char* n : {"swiglu_alpha", "swiglu_limit"})
        if (auto v = attrs.get_double(n); v && !(*v > 0))
          problems.push_back(cat("attribute '", n, "' = ", *v, " must be > 0"));
      break;
    default:
      break;
  }
}

}  // namespace tilejit::ir
