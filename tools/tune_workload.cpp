#include "tools/tune_workload.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>

#include "ir/activation.h"
#include "jit/tuning_db.h"
#include "ops/attention_checks.h"
#include "ops/rope_desc.h"
#include "ops/tensor_checks.h"
#include "runtime/int_math.h"
#include "tools/file_limits.h"

namespace tilejit::tools {

using nlohmann::json;

namespace {

// The fields each op kind takes (beyond "op" and "name"): unknown fields are
// an Error, so a typo never silently tunes the default.
struct OpFields {
  const char* op;
  std::vector<std::string> fields;
};
const std::vector<OpFields>& op_fields() {
  static const std::vector<OpFields> f = {
      {"gemm",
       {"n", "k", "bias", "act", "out", "format", "group_size", "sym", "desc_act", "block_n",
        "block_k", "m"}},
      {"decode_attention", {"d", "dv", "hq", "hkv", "block_size", "kv", "batch", "seq_len"}},
      {"prefill_attention", {"d", "dv", "hq", "hkv", "causal", "seq_len"}},
      {"extend_attention", {"d", "dv", "hq", "hkv", "block_size", "kv", "prefix_len", "seq_len"}},
      {"rope", {"d", "hq", "hkv", "rotary_dim", "style", "dtype", "cache", "t"}},
      {"moe",
       {"e", "topk", "h", "i", "format", "group_size", "sym", "desc_act", "block_n", "block_k",
        "t"}},
  };
  return f;
}

constexpr int64_t kMaxDim = int64_t{1} << 20;

struct Reader {
  const json& j;
  std::string where;  // "file: ops[2]"

  // where "file: ops[2]" names a field as "file: ops[2].n"; a config's
  // top level ("file:") as "file: n".
  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    throw Error(fmt::format("{}{}{}: {}", where, !where.empty() && where.back() == ':' ? " " : ".",
                            field, msg));
  }
  // An optional string field (absent or null: dflt).
  std::string string(const std::string& field, const std::string& dflt) const {
    if (!j.contains(field) || j[field].is_null()) return dflt;
    if (!j[field].is_string()) fail(field, fmt::format("{}; allowed: a string", j[field].dump()));
    return j[field].get<std::string>();
  }
  int64_t integer(const std::string& field, bool required = true, int64_t dflt = 0, int64_t lo = 1,
                  int64_t hi = kMaxDim) const {
    if (!j.contains(field)) {
      if (required) fail(field, "missing; allowed: an integer");
      return dflt;
    }
    const json& v = j[field];
    if (!v.is_number_integer() || v.get<int64_t>() < lo || v.get<int64_t>() > hi)
      fail(field, fmt::format("{}; allowed: an integer in [{}, {}]", v.dump(), lo, hi));
    return v.get<int64_t>();
  }
  std::string choice(const std::string& field, const std::string& dflt,
                     const std::vector<std::string>& allowed) const {
    if (!j.contains(field)) return dflt;
    const json& v = j[field];
    if (v.is_string())
      for (const std::string& a : allowed)
        if (a == v.get<std::string>()) return a;
    fail(field, fmt::format("{}; allowed: {}", v.dump(), fmt::join(allowed, ", ")));
  }
  // A list of counts: [1, 16, 512] or {"from": 1, "to": 512}.
  std::vector<int64_t> counts(const std::string& field) const {
    if (!j.contains(field)) fail(field, "missing; allowed: a list of integers or {from, to}");
    const json& v = j[field];
    std::vector<int64_t> out;
    if (v.is_array() && !v.empty()) {
      for (const json& x : v) {
        if (!x.is_number_integer() || x.get<int64_t>() < 1 || x.get<int64_t>() > kMaxDim)
          fail(field, fmt::format("element {}; allowed: integers in [1, {}]", x.dump(), kMaxDim));
        out.push_back(x.get<int64_t>());
      }
      return out;
    }
    if (v.is_object() && v.size() == 2 && v.contains("from") && v.contains("to")) {
      const Reader r{v, where + "." + field};
      const int64_t a = r.integer("from"), b = r.integer("to", true, 0, a);
      out.push_back(a);
      for (int64_t p = 1; p < b; p *= 2)
        if (p > a) out.push_back(p);
      if (b != a) out.push_back(b);
      return out;
    }
    fail(field,
         fmt::format("{}; allowed: a non-empty list of integers or {{\"from\": a, \"to\": b}}",
                     v.dump()));
  }
};

std::vector<std::string> activation_choices() {
  std::vector<std::string> out;
  for (const ir::ActivationInfo& a : ir::kActivations) out.push_back(a.name);
  return out;
}

// The format and its parameters. The names are the WeightFormat enum's;
// the parameter values are checked by the library itself: a small
// synthetic checkpoint with them goes through pack_weight, whose Error
// (naming what it allows) becomes the field's.
void parse_format(const Reader& r, WorkloadOp& o) {
  const json& j = r.j;
  if (j.contains("format")) {
    const json& v = j["format"];
    if (!v.is_string() || !jit::weight_format_from_name(v.get<std::string>()))
      r.fail("format", fmt::format("{}; allowed: {}", v.dump(), jit::weight_format_list()));
    o.format = v.get<std::string>();
  }
  const bool int4 = o.format == "int4_awq" || o.format == "int4_gptq";
  const bool fp8 = o.format == "fp8_e4m3";
  auto only = [&](const char* field, bool ok, const char* formats) {
    if (j.contains(field) && !ok)
      r.fail(field,
             fmt::format("given with format {}; allowed: only with format {}", o.format, formats));
  };
  only("group_size", int4, "int4_awq or int4_gptq");
  only("sym", int4, "int4_awq or int4_gptq");
  only("desc_act", int4, "int4_awq or int4_gptq");
  only("block_n", fp8, "fp8_e4m3");
  only("block_k", fp8, "fp8_e4m3");
  for (const char* b : {"sym", "desc_act"})
    if (j.contains(b) && !j[b].is_boolean()) r.fail(b, "allowed: true, false");
  o.sym = j.value("sym", o.format != "int4_awq");  // AWQ checkpoints carry zero points
  o.desc_act = j.value("desc_act", false);
  if (o.desc_act && o.format != "int4_gptq")
    r.fail("desc_act", "true with format int4_awq; allowed: act-order with int4_gptq only");
  // Only the range a dimension can have here (the probe below is sized by
  // them); the format's own rules are pack_weight's.
  o.group_size = r.integer("group_size", false, 128, -1);
  o.block_n = r.integer("block_n", false, 0, 0);
  o.block_k = r.integer("block_k", false, 0, 0);
  if ((o.block_n == 0) != (o.block_k == 0))
    r.fail(o.block_n == 0 ? "block_n" : "block_k",
           "0 with the other block size set; allowed: both (block scales) or neither");
  // The library's rules: a probe checkpoint with these parameters.
  if (!int4 && !fp8) return;
  try {
    const int64_t k = std::max<int64_t>({64, 2 * o.group_size, 2 * o.block_k});
    (void)synthetic_weight(o, 8, k, 1);
  } catch (const Error& e) {
    const char* field = !fp8                                  ? "group_size"
                        : o.block_k % 2 != 0 || o.block_k < 0 ? "block_k"
                                                              : "block_n";
    r.fail(field, fmt::format("{}; pack_weight: {}",
                              fp8 ? fmt::format("block_n={} block_k={}", o.block_n, o.block_k)
                                  : std::to_string(o.group_size),
                              e.what()));
  }
}

// A field's value under the library's own rule (the operator's check,
// which names its argument and what is allowed), quoted after the field:
// "w.json: ops[3].d: 65; decode_attention: D (q.shape[2])=65; allowed: ...".
// A workload tune would only refuse at its first call of the op (after
// measuring the ops before it) is refused here, as is what --save-workload
// would write.
template <class Check>
void library_rule(const Reader& r, const std::string& field, int64_t v, Check&& check) {
  try {
    check();
  } catch (const Error& e) {
    r.fail(field, fmt::format("{}; {}", v, e.what()));
  }
}

WorkloadOp parse_op(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(fmt::format("{}: not a JSON object", where));
  const Reader r{j, where};
  WorkloadOp o;
  std::vector<std::string> kinds;
  for (const OpFields& f : op_fields()) kinds.push_back(f.op);
  o.op = r.choice("op", "", kinds);
  if (o.op.empty()) r.fail("op", fmt::format("missing; allowed: {}", fmt::join(kinds, ", ")));
  if (j.contains("name") && !j["name"].is_string()) r.fail("name", "allowed: a string");
  o.name = j.value("name", o.op);
  const OpFields& spec = *std::find_if(op_fields().begin(), op_fields().end(),
                                       [&](const OpFields& f) { return o.op == f.op; });
  for (const auto& [key, v] : j.items()) {
    (void)v;
    if (key != "op" && key != "name" &&
        std::find(spec.fields.begin(), spec.fields.end(), key) == spec.fields.end())
      r.fail(key,
             fmt::format("not a field of op {}; allowed: {}", o.op, fmt::join(spec.fields, ", ")));
  }
  if (o.op == "gemm" || o.op == "moe") parse_format(r, o);
  if (o.op == "gemm") {
    o.n = r.integer("n");
    o.k = r.integer("k");
    o.bias = r.choice("bias", "none", {"none", "f32", "bf16"});
    o.act = r.choice("act", "none", activation_choices());
    o.out = r.choice("out", "bf16", {"bf16", "f32"});
    o.m = r.counts("m");
  } else if (o.op == "rope") {
    // The operator's own rules (even d, rotary_dim <= d, ...) are checked by
    // its first call, which names the argument.
    o.d = r.integer("d");
    o.hq = r.integer("hq");
    o.hkv = r.integer("hkv", false, 0, 0);
    o.rotary_dim = r.integer("rotary_dim", false, 0, 0);
    o.style = r.choice("style", "neox", {"neox", "gptj"});
    o.dtype = r.choice("dtype", "bf16", {"bf16", "f32"});
    o.cache = r.choice("cache", "f32", {"f32", "bf16"});
    o.m = r.counts("t");
    // tilejit::rope's rules (ops/rope_desc.h, Limits::max_heads).
    library_rule(r, "d", o.d, [&] { ops::check_rope_head_size("rope", "q", o.d, ""); });
    library_rule(r, "hq", o.hq,
                 [&] { ops::check_count("rope", "Hq (q.shape[1])", o.hq, 1, Limits::max_heads); });
    if (o.hkv > 0)
      library_rule(r, "hkv", o.hkv, [&] {
        ops::check_count("rope", "Hk (k.shape[1])", o.hkv, 1, Limits::max_heads);
      });
    library_rule(r, "rotary_dim", o.rotary_dim, [&] {
      ops::check_rotary_dim("rope", o.rotary_dim == 0 ? o.d : o.rotary_dim, o.d, 1);
    });
  } else if (o.op == "decode_attention" || o.op == "prefill_attention" ||
             o.op == "extend_attention") {
    o.d = r.integer("d");
    o.dv = r.integer("dv", false, o.d);
    o.hq = r.integer("hq");
    o.hkv = r.integer("hkv");
    // The attention operators' rules (ops/attention_checks.h: head sizes,
    // head counts), which the IR verifier calls too.
    const char* op = o.op.c_str();
    library_rule(r, "d", o.d, [&] { ops::attn::check_head_dim(op, "D (q.shape[2])", o.d); });
    library_rule(r, "dv", o.dv, [&] { ops::attn::check_head_dim(op, "Dv", o.dv); });
    library_rule(r, "hq", o.hq, [&] { ops::attn::check_head_counts(op, o.hq, "q", o.hkv, "k"); });
    if (o.op == "decode_attention") {
      o.block_size = r.integer("block_size", false, 16);
      o.kv = r.choice("kv", WorkloadOp{}.kv, kv_cache_dtype_names());
      o.m = r.counts("batch");
    } else if (o.op == "extend_attention") {
      o.block_size = r.integer("block_size", false, 16);
      o.kv = r.choice("kv", WorkloadOp{}.kv, kv_cache_dtype_names());
      o.prefix_len = r.integer("prefix_len", false, 0, 0);
    } else {
      if (j.contains("causal") && !j["causal"].is_boolean())
        r.fail("causal", "allowed: true, false");
      o.causal = j.value("causal", true);
    }
    o.seq_len = r.counts("seq_len");
  } else {
    o.e = r.integer("e");
    // The experts' rule (pack_experts, the routing: Limits::max_experts).
    library_rule(r, "e", o.e, [&] {
      ops::check_count("pack_experts", "E (experts)", o.e, 1, Limits::max_experts);
    });
    o.topk = r.integer("topk", true, 0, 1, o.e);
    o.h = r.integer("h");
    o.i = r.integer("i");
    o.m = r.counts("t");
  }
  return o;
}

}  // namespace

const std::vector<std::string>& kv_cache_dtype_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (DType t : ops::attn::kKvCacheDtypes) v.emplace_back(dtype_name(t));
    return v;
  }();
  return names;
}

const std::vector<std::string>& workload_op_kinds() {
  static const std::vector<std::string> k = [] {
    std::vector<std::string> v;
    for (const OpFields& f : op_fields()) v.push_back(f.op);
    return v;
  }();
  return k;
}

Workload parse_workload(const std::string& text, const std::string& source) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    int64_t line = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) line += text[i] == '\n';
    throw Error(fmt::format("{}:{}: error: not valid JSON: {}", source, line, e.what()));
  }
  if (!j.is_object()) throw Error(fmt::format("{}: allowed: a JSON object with \"ops\"", source));
  for (const auto& [key, v] : j.items()) {
    (void)v;
    if (key != "name" && key != "ops")
      throw Error(fmt::format("{}: {}: not a workload field; allowed: name, ops", source, key));
  }
  if (!j.contains("ops") || !j["ops"].is_array() || j["ops"].empty())
    throw Error(fmt::format("{}: ops: missing or empty; allowed: a list of operators", source));
  Workload w;
  if (j.contains("name") && !j["name"].is_string())
    throw Error(fmt::format("{}: name: allowed: a string", source));
  w.name = j.value("name", "workload");
  for (size_t i = 0; i < j["ops"].size(); ++i)
    w.ops.push_back(parse_op(j["ops"][i], fmt::format("{}: ops[{}]", source, i)));
  return w;
}

Workload load_workload(const std::string& path) {
  return parse_workload(CappedFile(path).read_all(kMaxWorkloadBytes, "tune workload"), path);
}

std::string workload_json(const Workload& w) {
  json ops = json::array();
  for (const WorkloadOp& o : w.ops) {
    json j{{"op", o.op}, {"name", o.name}};
    if (o.format != "bf16") j["format"] = o.format;
    if (o.format == "int4_awq" || o.format == "int4_gptq")
      j.update({{"group_size", o.group_size}, {"sym", o.sym}, {"desc_act", o.desc_act}});
    if (o.format == "fp8_e4m3" && o.block_n)
      j.update({{"block_n", o.block_n}, {"block_k", o.block_k}});
    if (o.op == "gemm") {
      j.update(
          {{"n", o.n}, {"k", o.k}, {"bias", o.bias}, {"act", o.act}, {"out", o.out}, {"m", o.m}});
    } else if (o.op == "decode_attention") {
      j.update({{"d", o.d},
                {"dv", o.dv},
                {"hq", o.hq},
                {"hkv", o.hkv},
                {"block_size", o.block_size},
                {"kv", o.kv},
                {"batch", o.m},
                {"seq_len", o.seq_len}});
    } else if (o.op == "prefill_attention") {
      j.update({{"d", o.d},
                {"dv", o.dv},
                {"hq", o.hq},
                {"hkv", o.hkv},
                {"causal", o.causal},
                {"seq_len", o.seq_len}});
    } else if (o.op == "extend_attention") {
      j.update({{"d", o.d},
                {"dv", o.dv},
                {"hq", o.hq},
                {"hkv", o.hkv},
                {"block_size", o.block_size},
                {"kv", o.kv},
                {"prefix_len", o.prefix_len},
                {"seq_len", o.seq_len}});
    } else if (o.op == "rope") {
      j.update({{"d", o.d},
                {"hq", o.hq},
                {"hkv", o.hkv},
                {"rotary_dim", o.rotary_dim},
                {"style", o.style},
                {"dtype", o.dtype},
                {"cache", o.cache},
                {"t", o.m}});
    } else {
      j.update({{"e", o.e}, {"topk", o.topk}, {"h", o.h}, {"i", o.i}, {"t", o.m}});
    }
    ops.push_back(j);
  }
  return json{{"name", w.name}, {"ops", ops}}.dump(1) + "\n";
}

const std::vector<std::string>& quant_methods() {
  static const std::vector<std::string> m = {
      "awq", "gptq", "auto-round", "fp8", "mxfp4", "compressed-tensors", "w8a8_int8"};
  return m;
}

namespace {

void copy_format(const WorkloadOp& f, WorkloadOp* o) {
  o->format = f.format;
  o->group_size = f.group_size;
  o->sym = f.sym;
  o->desc_act = f.desc_act;
  o->block_n = f.block_n;
  o->block_k = f.block_k;
}

// A Hugging Face quantization_config into the formats of the linear layers
// (attention and dense MLP) and of the experts.
void quant_formats(const json& q, const std::string& source, WorkloadOp* linear,
                   WorkloadOp* experts) {
  const std::string where = source + ": quantization_config";
  if (!q.is_object()) throw Error(fmt::format("{}: allowed: an object", where));
  const std::string method = q.contains("quant_method") && q["quant_method"].is_string()
                                 ? q["quant_method"].get<std::string>()
                                 : std::string();
  auto bad = [&](const std::string& field, const std::string& msg) {
    throw Error(fmt::format("{}.{}: {}", where, field, msg));
  };
  WorkloadOp f;
  // fp8 block sizes [block_n, block_k] (weight_block_size, block_structure).
  auto block_pair = [&](const json& b, const std::string& field) {
    if (!b.is_array() || b.size() != 2 || !b[0].is_number_integer() || !b[1].is_number_integer() ||
        b[0].get<int64_t>() < 1 || b[1].get<int64_t>() < 1)
      bad(field, fmt::format("{}; allowed: [block_n, block_k], both >= 1, or absent (per channel)",
                             b.dump()));
    f.block_n = b[0].get<int64_t>();
    f.block_k = b[1].get<int64_t>();
  };
  try {
    // The int4 methods' bits: 4 or absent (one rule for awq, gptq and
    // AutoRound's exports).
    auto int4_bits = [&](const Reader& r) {
      const int64_t bits = r.integer("bits", false, 4);
      if (bits != 4)
        bad("bits", fmt::format("{}; allowed: 4 (Int4Weight: only 4-bit codes are packed)", bits));
    };
    if (method == "awq" || method == "gptq") {
      const Reader r{q, where};
      int4_bits(r);
      f.format = method == "awq" ? "int4_awq" : "int4_gptq";
      // -1: per channel (GPTQ's convention, Int4Weight's too).
      f.group_size = r.integer(q.contains("q_group_size") ? "q_group_size" : "group_size", false,
                               128, -1);  // -1: per channel (pack_weight checks the rest)
      f.sym = method == "awq" ? !q.value("zero_point", true) : q.value("sym", true);
      f.desc_act = method == "gptq" && q.value("desc_act", false);
    } else if (method == "auto-round" || method == "intel/auto-round") {
      // AutoRound (its older exports say "intel/auto-round"): int4 codes in
      // a GPTQ or AWQ packing named by packing_format (older: backend).
      const Reader r{q, where};
      int4_bits(r);
      const std::string type = q.value("data_type", std::string("int"));
      if (type != "int")
        bad("data_type", fmt::format("\"{}\"; allowed: \"int\" (AutoRound's int4 exports)", type));
      const char* pf = q.contains("packing_format") ? "packing_format" : "backend";
      const std::string packing = q.value(pf, std::string("auto_round:auto_gptq"));
      f.format = packing.find("awq") != std::string::npos ? "int4_awq" : "int4_gptq";
      f.group_size = r.integer("group_size", false, 128, -1);
      f.sym = q.value("sym", true);
      f.desc_act = f.format == "int4_gptq" && q.value("desc_act", false);
    } else if (method == "fp8") {
      f.format = "fp8_e4m3";
      if (q.contains("weight_block_size") && !q["weight_block_size"].is_null())
        block_pair(q["weight_block_size"], "weight_block_size");
    } else if (method == "mxfp4") {
      f.format = "mxfp4";
    } else if (method == "w8a8_int8") {
      f.format = "int8";
    } else if (method == "compressed-tensors") {
      // The simple schemes only: one config group of 8-bit int (W8A8) or
      // float (fp8) weights.
      const json* w = nullptr;
      if (q.contains("config_groups") && q["config_groups"].is_object() &&
          q["config_groups"].size() == 1) {
        const json& g = q["config_groups"].begin().value();
        if (g.is_object() && g.contains("weights") && g["weights"].is_object()) w = &g["weights"];
      }
      const std::string type = w ? w->value("type", std::string()) : "";
      const int64_t bits = w ? w->value("num_bits", int64_t{0}) : 0;
      if (w == nullptr || bits != 8 || (type != "int" && type != "float"))
        bad("config_groups",
            fmt::format("{}; allowed: one group with weights of num_bits 8, type int (W8A8) or "
                        "float (fp8)",
                        q.contains("config_groups") ? q["config_groups"].dump() : "missing"));
      f.format = type == "int" ? "int8" : "fp8_e4m3";
      if (type == "float" && w->contains("block_structure") && !(*w)["block_structure"].is_null())
        block_pair((*w)["block_structure"], "config_groups.weights.block_structure");
    } else {
      bad("quant_method",
          fmt::format("{}; allowed: {}",
                      q.contains("quant_method") ? q["quant_method"].dump() : "missing",
                      fmt::join(quant_methods(), ", ")));
    }
  } catch (const json::exception& e) {  // a field of the wrong JSON type
    throw Error(fmt::format("{} ({}): {}", where, method, e.what()));
  }
  // The parameters through the workload's own checks (the library's rules).
  json probe = json::parse(workload_json(Workload{"probe", {[&] {
                                                    WorkloadOp o = f;
                                                    o.op = "gemm";
                                                    o.name = "probe";
                                                    o.n = o.k = 64;
                                                    o.m = {1};
                                                    return o;
                                                  }()}}));
  (void)parse_workload(probe.dump(), where);
  *experts = f;
  if (f.format != "mxfp4") *linear = f;  // GPT-OSS's attention is bf16 (modules_to_not_convert)
}

}  // namespace

Workload workload_from_model_config(const std::string& text, const std::string& source,
                                    const std::string& kv_cache, const std::vector<int64_t>& m,
                                    int64_t context) {
  {
    const auto& kv = kv_cache_dtype_names();
    if (std::find(kv.begin(), kv.end(), kv_cache) == kv.end())
      throw Error(
          fmt::format("--kv-cache-dtype: \"{}\"; allowed: {}", kv_cache, fmt::join(kv, ", ")));
  }
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) throw Error(fmt::format("{}: allowed: a config.json object", source));
  // The formats of the linear layers and of the experts.
  WorkloadOp fmt_linear, fmt_experts;
  if (j.contains("quantization_config"))
    quant_formats(j["quantization_config"], source, &fmt_linear, &fmt_experts);
  const Reader r{j, source + ":"};
  auto given = [&](const char* f) { return j.contains(f) && !j[f].is_null(); };
  // The families whose layer this builder models: a decoder with rotary
  // attention and a gated MLP (or routed experts). Anything else is refused
  // by name rather than tuned as a Llama (Phi-2's non-gated fc1 / fc2 and
  // partial rotary, SigLIP's non-causal encoder, GPT-2's learned
  // positions...). An absent model_type is taken as such a decoder.
  static const std::vector<std::string> kModelled = {
      "llama",   "mistral",  "mixtral",     "qwen2",     "qwen2_moe",   "qwen3",       "qwen3_moe",
      "gemma",   "gemma2",   "gemma3_text", "phi3",      "phimoe",      "olmo",        "olmo2",
      "olmoe",   "granite",  "granitemoe",  "internlm2", "yi",          "baichuan",    "cohere",
      "minicpm", "stablelm", "exaone",      "deepseek",  "deepseek_v2", "deepseek_v3", "gpt_oss"};
  const std::string model_type = given("model_type") ? r.string("model_type", "") : "";
  if (given("model_type") &&
      std::find(kModelled.begin(), kModelled.end(), model_type) == kModelled.end())
    r.fail("model_type",
           fmt::format("\"{}\": not modelled by --model-config (it builds decoders with rotary "
                       "attention and a gated MLP or routed experts); allowed: {} (write the "
                       "workload file by hand: docs/tuning.md)",
                       model_type, fmt::join(kModelled, ", ")));
  // What this builder does not model is refused by name, never built as
  // something else: MLA (DeepSeek's latent KV: attention of D 576 / Dv 512
  // over a compressed cache, not hq heads of hidden / hq) and shared experts
  // (a dense MLP beside the routed ones).
  for (const char* f : {"kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                        "v_head_dim", "n_shared_experts", "shared_expert_intermediate_size"})
    if (given(f) && j[f] != json(0))
      r.fail(f, fmt::format("{}: not modelled by --model-config (MLA attention, shared experts); "
                            "allowed: absent (write the workload file by hand: docs/tuning.md)",
                            j[f].dump()));
  // A logit softcap is a specialisation of the attention kernels (Gemma-2,
  // whose config class defaults it to 50 when the file omits it); the
  // workload's attention ops have none.
  for (const char* f : {"attn_logit_softcapping"}) {
    const bool defaulted = model_type == "gemma2" && !j.contains(f);
    if (defaulted || (given(f) && j[f] != json(0) && j[f] != json(0.0)))
      r.fail(f, fmt::format("{}: not modelled by --model-config (softcapped attention kernels); "
                            "allowed: null or 0 (or absent, except for gemma2, whose config "
                            "class defaults it to 50) (write the workload file by hand: "
                            "docs/tuning.md)",
                            defaulted ? "absent (50 for gemma2)" : j[f].dump()));
  }
  // The first of several names a field has among model families, or none.
  auto first_of = [&](std::initializer_list<const char*> names) -> const char* {
    for (const char* f : names)
      if (given(f)) return f;
    return nullptr;
  };
  const int64_t hidden = r.integer("hidden_size");
  const int64_t hq = r.integer("num_attention_heads");
  const int64_t hkv = r.integer("num_key_value_heads", false, hq);
  if (!given("head_dim") && hidden % hq != 0)
    r.fail("hidden_size", fmt::format("{} with num_attention_heads={} and no head_dim; allowed: "
                                      "a multiple of num_attention_heads, or head_dim given",
                                      hidden, hq));
  const int64_t hd = given("head_dim") ? r.integer("head_dim") : hidden / hq;
  const char* experts_field = first_of({"num_experts", "num_local_experts", "n_routed_experts"});
  const int64_t experts = experts_field ? r.integer(experts_field) : 0;
  Workload w;
  w.name = r.string("model_type", "model");
  (void)r.string("hidden_act", "silu");  // checked; the GLU's activation runs in the epilogue
  // Projection biases (bf16, the checkpoint's dtype; the bias kind is part of
  // the kernels' key): Qwen2's q/k/v always; attention_bias (Llama, GPT-OSS:
  // q, k, v and o), use_qkv_bias (StableLM), mlp_bias (Llama).
  auto flag = [&](const char* f) {
    if (!given(f)) return false;
    if (!j[f].is_boolean()) r.fail(f, fmt::format("{}; allowed: true, false", j[f].dump()));
    return j[f].get<bool>();
  };
  const bool attn_bias = flag("attention_bias");
  const bool qkv_bias =
      attn_bias || flag("use_qkv_bias") || model_type == "qwen2" || model_type == "qwen2_moe";
  const bool mlp_bias = flag("mlp_bias");
  auto gemm = [&](const char* name, int64_t n, int64_t k, const char* out = "bf16",
                  bool bias = false) {
    WorkloadOp o;
    o.op = "gemm";
    o.name = name;
    o.n = n;
    o.k = k;
    o.out = out;
    if (bias) o.bias = "bf16";
    o.m = m;
    if (std::string(out) != "f32") copy_format(fmt_linear, &o);  // the router stays bf16
    w.ops.push_back(o);
  };
  gemm("qkv_proj", (hq + 2 * hkv) * hd, hidden, "bf16", qkv_bias);
  gemm("o_proj", hidden, hq * hd, "bf16", attn_bias);
  fmt_linear = fmt_experts;  // mxfp4 (GPT-OSS) leaves attention bf16; others: the same format
  if (experts > 0) {
    WorkloadOp o;
    o.op = "moe";
    o.name = "experts";
    o.e = experts;
    // GPT-OSS names the experts per token experts_per_token; Mixtral and
    // GPT-OSS size the experts by intermediate_size (no dense MLP).
    const char* topk = first_of({"num_experts_per_tok", "experts_per_token"});
    o.topk = r.integer(topk ? topk : "num_experts_per_tok", true, 0, 1, experts);
    o.h = hidden;
    o.i = r.integer(given("moe_intermediate_size") ? "moe_intermediate_size" : "intermediate_size");
    o.m = m;
    copy_format(fmt_experts, &o);
    gemm("router", experts, hidden, "f32");
    w.ops.push_back(o);
  } else {
    const int64_t inter = r.integer("intermediate_size");
    gemm("gate_up_proj", 2 * inter, hidden, "bf16", mlp_bias);
    gemm("down_proj", hidden, inter, "bf16", mlp_bias);
  }
  WorkloadOp dec;
  dec.op = "decode_attention";
  dec.name = "attn_decode";
  dec.d = dec.dv = hd;
  dec.hq = hq;
  dec.hkv = hkv;
  dec.kv = kv_cache;
  dec.m = {1, 16};
  dec.seq_len = {context};
  w.ops.push_back(dec);
  WorkloadOp pre = dec;
  pre.op = "prefill_attention";
  pre.name = "attn_prefill";
  pre.m.clear();
  pre.kv = WorkloadOp{}.kv;  // no cache: k, v given
  pre.seq_len = {m.back()};
  w.ops.push_back(pre);
  // A chunked prefill / a follow-up turn: the largest count of new tokens
  // over a cached prefix of the context.
  WorkloadOp ext = pre;
  ext.op = "extend_attention";
  ext.name = "attn_extend";
  ext.prefix_len = context;
  ext.kv = kv_cache;
  w.ops.push_back(ext);
  WorkloadOp rope;
  rope.op = "rope";
  rope.name = "rope";
  rope.d = hd;
  // Cohere rotates interleaved pairs (GPT-J's), the others halves (NeoX's).
  if (model_type == "cohere") rope.style = "gptj";
  // Partial rotary (StableLM, Phi-3-small, GLM): the leading
  // partial_rotary_factor·head_dim dims, an even count.
  if (given("partial_rotary_factor")) {
    const json& f = j["partial_rotary_factor"];
    const double factor = f.is_number() ? f.get<double>() : -1.0;
    const double dims = factor * static_cast<double>(hd);
    if (!(factor > 0 && factor <= 1) || dims != std::floor(dims) || int64_t(dims) % 2 != 0)
      r.fail("partial_rotary_factor",
             fmt::format("{} with head_dim {}; allowed: a number in (0, 1] whose share of "
                         "head_dim is an even count of dims",
                         f.dump(), hd));
    if (factor < 1) rope.rotary_dim = static_cast<int64_t>(dims);
  }
  rope.hq = hq;
  rope.hkv = hkv;
  rope.m = m;
  w.ops.push_back(rope);
  // The workload file's own checks (one home: parse_workload), so that what
  // --save-workload writes is what tune reads.
  return parse_workload(workload_json(w), source + " (the workload built from it)");
}

namespace {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return static_cast<uint32_t>(s >> 32);
  }
};

// One matrix's checkpoint tensors (owned) and the format's description of
// them (views into those tensors).
struct Checkpoint {
  std::vector<int32_t> qweight, qzeros, g_idx;
  std::vector<uint8_t> codes, e8m0;
  std::vector<float> scales;
  std::vector<uint16_t> bf16;
  Int8Weight i8;
  Fp8Weight f8;
  Int4Weight i4;
  Mxfp4Weight mx;

  Checkpoint(const WorkloadOp& o, int64_t n, int64_t k, uint64_t seed) {
    Rng rng(seed);
    const std::string& f = o.format;
    if (f == "bf16") {
      bf16.resize(size_t(n * k));
      for (uint16_t& v : bf16) {
        // ±1/16 · [0, 1): sign, exponent 2^-5 .. 2^-4, random mantissa.
        const uint32_t r = rng.next();
        v = static_cast<uint16_t>((r & 0x8000u) | (0x7Au << 7) | (r & 0x7Fu));
      }
    } else if (f == "int8") {
      codes.resize(size_t(n * k));
      for (uint8_t& c : codes) c = static_cast<uint8_t>(int8_t(int(rng.next() % 255) - 127));
      scales.assign(size_t(n), 1.0f / (127 * 16));  // |w| <= 1/16
      i8 = {TensorView(codes.data(), DType::i8, {n, k}),
            TensorView(scales.data(), DType::f32, {n})};
    } else if (f == "fp8_e4m3") {
      // Exponent fields 0..7 (|code| < 2, never NaN), scale 1/32.
      codes.resize(size_t(n * k));
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng.next() & 0xBF);
      const int64_t gn = o.block_n ? runtime::ceil_div(n, o.block_n) : n;
      const int64_t gk = o.block_n ? runtime::ceil_div(k, o.block_k) : 1;
      scales.assign(size_t(gn * gk), 1.0f / 32);
      f8.weight = TensorView(codes.data(), DType::f8e4m3, {n, k});
      f8.scales = o.block_n ? TensorView(scales.data(), DType::f32, {gn, gk})
                            : TensorView(scales.data(), DType::f32, {n});
      f8.block_n = o.block_n;
      f8.block_k = o.block_k;
    } else if (f == "int4_awq" || f == "int4_gptq") {
      const bool awq = f == "int4_awq";
      const int64_t g =
          o.group_size < 0 ? 1 : runtime::ceil_div(k, std::max<int64_t>(1, o.group_size));
      const int64_t n8 = (n + 7) / 8, k8 = (k + 7) / 8;
      qweight.resize(size_t(awq ? k * n8 : k8 * n));
      for (int32_t& q : qweight) q = static_cast<int32_t>(rng.next());
      scales.assign(size_t(g * n), 1.0f / 128);  // |q - z| <= 15: |w| < 1/8
      i4.format = awq ? Int4Format::awq : Int4Format::gptq;
      i4.qweight = awq ? TensorView(qweight.data(), DType::i32, {k, n8})
                       : TensorView(qweight.data(), DType::i32, {k8, n});
      i4.scales = TensorView(scales.data(), DType::f32, {g, n});
      if (!o.sym) {
        qzeros.resize(size_t(g * n8));
        for (int32_t& z : qzeros)
          z = static_cast<int32_t>(0x77777777u + (rng.next() & 0x11111111u));
        i4.qzeros = TensorView(qzeros.data(), DType::i32, {g, n8});
      }
      if (o.desc_act) {
        // Act order: input channel c in group perm(c) / group_size, perm(c) =
        // c · stride mod K for a stride coprime to K (a bijection: every group
        // gets group_size channels, scattered).
        g_idx.resize(size_t(k));
        int64_t stride = k / 2 + 1;
        while (std::gcd(stride, k) != 1) ++stride;
        for (int64_t c = 0; c < k; ++c)
          g_idx[size_t(c)] =
              static_cast<int32_t>(o.group_size < 0 ? 0 : (c * stride % k) / o.group_size);
        i4.g_idx = TensorView(g_idx.data(), DType::i32, {k});
      }
      i4.group_size = o.group_size;
      i4.n = n;
      i4.k = k;
    } else if (f == "mxfp4") {
      const int64_t kb = (k + 31) / 32;
      codes.resize(size_t(n * kb * 16));
      for (uint8_t& c : codes) c = static_cast<uint8_t>(rng.next());
      e8m0.assign(size_t(n * kb), 127 - 7);  // |e2m1| <= 6: |w| < 1/16
      mx = {TensorView(codes.data(), DType::u8, {n, kb, 16}),
            TensorView(e8m0.data(), DType::u8, {n, kb}), k};
    } else {
      throw Error(fmt::format("format {}; allowed: {}", f, jit::weight_format_list()));
    }
  }
};

}  // namespace

PackedWeight synthetic_weight(const WorkloadOp& o, int64_t n, int64_t k, uint64_t seed) {
  const Checkpoint c(o, n, k, seed);
  const std::string& f = o.format;
  if (f == "bf16") return pack_weight(TensorView(c.bf16.data(), DType::bf16, {n, k}));
  if (f == "int8") return pack_weight(c.i8);
  if (f == "fp8_e4m3") return pack_weight(c.f8);
  if (f == "mxfp4") return pack_weight(c.mx);
  return pack_weight(c.i4);
}

PackedExperts synthetic_experts(const WorkloadOp& o, int64_t e, int64_t n, int64_t k,
                                ExpertProj proj, uint64_t seed) {
  if (o.format == "bf16") {
    std::vector<uint16_t> all;
    all.reserve(size_t(e * n * k));
    for (int64_t x = 0; x < e; ++x) {
      const Checkpoint c(o, n, k, seed + uint64_t(x));
      all.insert(all.end(), c.bf16.begin(), c.bf16.end());
    }
    return pack_experts(TensorView(all.data(), DType::bf16, {e, n, k}), proj);
  }
  std::vector<std::unique_ptr<Checkpoint>> cs;
  for (int64_t x = 0; x < e; ++x)
    cs.push_back(std::make_unique<Checkpoint>(o, n, k, seed + uint64_t(x)));
  auto views = [&](auto member) {
    std::vector<std::remove_reference_t<decltype(cs[0].get()->*member)>> v;
    for (const auto& c : cs) v.push_back(c.get()->*member);
    return v;
  };
  const std::string& f = o.format;
  if (f == "int8") return pack_experts(views(&Checkpoint::i8), proj);
  if (f == "fp8_e4m3") return pack_experts(views(&Checkpoint::f8), proj);
  if (f == "mxfp4") return pack_experts(views(&Checkpoint::mx), proj);
  return pack_experts(views(&Checkpoint::i4), proj);
}

}  // namespace tilejit::tools
