#include "tools/tune_workload.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ir/activation.h"

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
      {"gemm", {"n", "k", "bias", "act", "out", "format", "m"}},
      {"decode_attention", {"d", "dv", "hq", "hkv", "block_size", "kv", "batch", "seq_len"}},
      {"prefill_attention", {"d", "dv", "hq", "hkv", "causal", "seq_len"}},
      {"moe", {"e", "topk", "h", "i", "format", "t"}},
  };
  return f;
}

constexpr int64_t kMaxDim = int64_t{1} << 20;

struct Reader {
  const json& j;
  std::string where;  // "file: ops[2]"

  [[noreturn]] void fail(const std::string& field, const std::string& msg) const {
    throw Error(fmt::format("{}.{}: {}", where, field, msg));
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
  if (o.op == "gemm" || o.op == "moe")
    (void)r.choice("format", "bf16", {"bf16"});  // the tuner searches bf16 plans only
  if (o.op == "gemm") {
    o.n = r.integer("n");
    o.k = r.integer("k");
    o.bias = r.choice("bias", "none", {"none", "f32", "bf16"});
    o.act = r.choice("act", "none", activation_choices());
    o.out = r.choice("out", "bf16", {"bf16", "f32"});
    o.m = r.counts("m");
  } else if (o.op == "decode_attention" || o.op == "prefill_attention") {
    o.d = r.integer("d");
    o.dv = r.integer("dv", false, o.d);
    o.hq = r.integer("hq");
    o.hkv = r.integer("hkv");
    if (o.hq % o.hkv != 0)
      r.fail("hq", fmt::format("{} with hkv={}; allowed: a multiple of hkv", o.hq, o.hkv));
    if (o.op == "decode_attention") {
      o.block_size = r.integer("block_size", false, 16);
      o.kv = r.choice("kv", "bf16", {"bf16"});
      o.m = r.counts("batch");
    } else {
      if (j.contains("causal") && !j["causal"].is_boolean())
        r.fail("causal", "allowed: true, false");
      o.causal = j.value("causal", true);
    }
    o.seq_len = r.counts("seq_len");
  } else {
    o.e = r.integer("e");
    o.topk = r.integer("topk", true, 0, 1, o.e);
    o.h = r.integer("h");
    o.i = r.integer("i");
    o.m = r.counts("t");
  }
  return o;
}

}  // namespace

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
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(fmt::format("{}: cannot read the workload file", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_workload(ss.str(), path);
}

std::string workload_json(const Workload& w) {
  json ops = json::array();
  for (const WorkloadOp& o : w.ops) {
    json j{{"op", o.op}, {"name", o.name}};
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
    } else {
      j.update({{"e", o.e}, {"topk", o.topk}, {"h", o.h}, {"i", o.i}, {"t", o.m}});
    }
    ops.push_back(j);
  }
  return json{{"name", w.name}, {"ops", ops}}.dump(1) + "\n";
}

Workload workload_from_model_config(const std::string& text, const std::string& source,
                                    const std::vector<int64_t>& m, int64_t context) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw Error(fmt::format("{}: not valid JSON: {}", source, e.what()));
  }
  if (!j.is_object()) throw Error(fmt::format("{}: allowed: a config.json object", source));
  if (j.contains("quantization_config"))
    throw Error(fmt::format(
        "{}: quantization_config ({}): quantized checkpoints are not tuned yet; allowed: an "
        "unquantized (bf16) config",
        source, j["quantization_config"].value("quant_method", std::string("?"))));
  const Reader r{j, source + ":"};
  auto opt_int = [&](const char* f, int64_t dflt) { return r.integer(f, false, dflt); };
  const int64_t hidden = r.integer("hidden_size");
  const int64_t hq = r.integer("num_attention_heads");
  const int64_t hkv = opt_int("num_key_value_heads", hq);
  const int64_t hd =
      j.contains("head_dim") && !j["head_dim"].is_null() ? r.integer("head_dim") : hidden / hq;
  const int64_t experts = j.contains("num_experts")         ? r.integer("num_experts")
                          : j.contains("num_local_experts") ? r.integer("num_local_experts")
                                                            : 0;
  Workload w;
  w.name = j.value("model_type", std::string("model"));
  const std::string act = j.value("hidden_act", std::string("silu"));
  (void)act;  // the GLU's activation runs in the MoE epilogue / a separate op
  auto gemm = [&](const char* name, int64_t n, int64_t k, const char* out = "bf16") {
    WorkloadOp o;
    o.op = "gemm";
    o.name = name;
    o.n = n;
    o.k = k;
    o.out = out;
    o.m = m;
    w.ops.push_back(o);
  };
  gemm("qkv_proj", (hq + 2 * hkv) * hd, hidden);
  gemm("o_proj", hidden, hq * hd);
  if (experts > 0) {
    WorkloadOp o;
    o.op = "moe";
    o.name = "experts";
    o.e = experts;
    o.topk = r.integer("num_experts_per_tok", true, 0, 1, experts);
    o.h = hidden;
    o.i = r.integer("moe_intermediate_size");
    o.m = m;
    gemm("router", experts, hidden, "f32");
    w.ops.push_back(o);
  } else {
    const int64_t inter = r.integer("intermediate_size");
    gemm("gate_up_proj", 2 * inter, hidden);
    gemm("down_proj", hidden, inter);
  }
  WorkloadOp dec;
  dec.op = "decode_attention";
  dec.name = "attn_decode";
  dec.d = dec.dv = hd;
  dec.hq = hq;
  dec.hkv = hkv;
  dec.m = {1, 16};
  dec.seq_len = {context};
  w.ops.push_back(dec);
  WorkloadOp pre = dec;
  pre.op = "prefill_attention";
  pre.name = "attn_prefill";
  pre.m.clear();
  pre.seq_len = {m.back()};
  w.ops.push_back(pre);
  return w;
}

}  // namespace tilejit::tools
