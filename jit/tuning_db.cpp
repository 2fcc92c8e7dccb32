#include "jit/tuning_db.h"
#include "runtime/lazy_statics.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <new>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <unordered_map>

#include "codegen/attention_blocking.h"
#include "codegen/llvm/llvm_decode_attention.h"
#include "ir/activation.h"
#include "ir/attention_rules.h"
#include "ir/types.h"
#include "runtime/capped_file.h"
#include "runtime/cpu_features.h"
#include "runtime/file_size_limit.h"
#include "runtime/isa.h"
#include "runtime/per_thread.h"
#include "runtime/thread_limits.h"
#include "runtime/verbose.h"
#include "tilejit/error.h"
#include "tilejit/tilejit.h"

#ifndef TILEJIT_BUILD_ID
#define TILEJIT_BUILD_ID "unknown"
#endif

namespace tilejit::jit {

using nlohmann::json;

namespace {

// The knobs each family takes and their ranges: the one list (load checks
// against it, docs/tuning.md describes it, tune searches inside it).
struct KnobRule {
  const char* family;
  const char* knob;
  int64_t lo, hi;
  const char* what;
  int64_t step = 1;  // the value is a multiple of it
};
using Blocking = codegen::AttentionBlocking;
constexpr KnobRule kKnobs[] = {
    {"gemm", "mr", 1, 32, "rows per micro-kernel call"},
    {"gemm", "task_rows", 1, 4096, "rows per driver task"},
    {"gemm", "max_kc", 32, 65536, "deepest K chunk"},
    {"gemm", "amx", 0, 1, "1: AMX tiles, 0: AVX-512 at this M (AMX path only)"},
    {"gemm", "llvm", 1, 1, "1: the LLVM backend's kernels at this M instead of Xbyak's"},
    {"gemm", "w4a8", 0, 1, "int4 weights: 1 the W4A8 route, 0 W4A16 at this M"},
    {"gemm", "prefetch", 0, codegen::BrgemmDesc::kPrefetchKibMax,
     "KiB of the weight stream prefetched ahead (Xbyak AVX-512 kernels)"},
    {"gemm", "u4_dot", 0, 1,
     "int4 at decode M: 1 the fused kernel multiplies bf16 pairs (vdpbf16ps), 0 f32 FMAs"},
    {"decode_attention", "splits", 1, 64, "split-KV chunks per sequence"},
    {"decode_attention", "prefetch_chunks", 1,
     codegen::llvm_backend::DecodeAttentionDesc::kPrefetchChunksMax,
     "16-key chunks the LLVM decode kernel prefetches ahead"},
    {"moe", "run_blocks", 1, 64, "consecutive column blocks per streaming task"},
    {"moe", "w4a8_rows", 0, int64_t{1} << 20,
     "int4 experts: the fewest rows routed to an expert that run W4A8 (0: none)"},
    {"moe", "prefetch", 0, codegen::BrgemmDesc::kPrefetchKibMax,
     "KiB of the experts' weight streams prefetched ahead (Xbyak AVX-512 kernels)"},
    {"prefill_attention", "rows", Blocking::kRowsStep, Blocking::kRowsMax, "query rows per task",
     Blocking::kRowsStep},
    {"prefill_attention", "key_block", Blocking::kKeyBlockStep, Blocking::kKeyBlockMax,
     "keys per online-softmax step", Blocking::kKeyBlockStep},
    {"extend_attention", "rows", Blocking::kRowsStep, Blocking::kRowsMax, "query rows per task",
     Blocking::kRowsStep},
    {"extend_attention", "key_block", Blocking::kKeyBlockStep, Blocking::kKeyBlockMax,
     "keys per online-softmax step", Blocking::kKeyBlockStep},
    {"extend_attention", "splits", 1, 64, "split-KV chunks per task"},
};

constexpr int kFormatVersion = 1;

std::string allowed_families() {
  std::set<std::string> f;
  for (const KnobRule& r : kKnobs) f.insert(r.family);
  std::string s;
  for (const auto& x : f) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string allowed_knobs(const std::string& family) {
  std::string s;
  for (const KnobRule& r : kKnobs)
    if (family == r.family)
      s += fmt::format("{}{} ({} .. {}{})", s.empty() ? "" : ", ", r.knob, r.lo, r.hi,
                       r.step > 1 ? fmt::format(", multiples of {}", r.step) : "");
  return s;
}

// The shape fields a family's entries carry: those its builder sets.
std::set<std::string> shape_fields(const std::string& family) {
  ShapeClass s;
  if (family == "gemm")
    s = gemm_shape_class(Isa::scalar, 1, 1, 1, codegen::BiasKind::none, Activation::none,
                         DType::bf16, 1);
  else if (family == "decode_attention")
    s = decode_shape_class(Isa::scalar, 1, 1, 1, 1, 1, 1, DType::bf16, 1, 1);
  else if (family == "moe")
    s = moe_shape_class(Isa::scalar, 1, 1, 1, 1, 1, 1);
  else if (family == "prefill_attention")
    s = prefill_shape_class(Isa::scalar, 1, 1, 1, 1, 1, false, 1, 1);
  else if (family == "extend_attention")
    s = extend_shape_class(Isa::scalar, 1, 1, 1, 1, 1, 1, DType::bf16, 1, 1, 1);
  std::set<std::string> out;
  for (const auto& [k, v] : s.fields) out.insert(k);
  return out;
}

int64_t to_int(const TunedEntry& e, const std::string& field) {
  const auto it = e.shape.fields.find(field);
  if (it == e.shape.fields.end()) throw Error(fmt::format("shape has no field '{}'", field));
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size() && v >= 1) return v;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("shape field {}='{}'; allowed: an integer >= 1", field, it->second));
}

// The lowest count of a bucket ("5-16" -> 5, "1025+" -> 1025).
int64_t bucket_low(const std::string& b) {
  try {
    return std::stoll(b);
  } catch (const std::exception&) {
    throw Error(fmt::format("shape field m='{}'; allowed: a bucket such as 1, 2-4, 5-16", b));
  }
}

// The highest count of a bucket ("5-16" -> 16, "1" -> 1, "1025+" -> no bound).
int64_t bucket_high(const std::string& b) {
  if (!b.empty() && b.back() == '+') return std::numeric_limits<int64_t>::max();
  const size_t dash = b.find('-');
  return bucket_low(dash == std::string::npos ? b : b.substr(dash + 1));
}

// The gemm plan an entry names, with its overrides: plan_gemm checks them.
void validate_gemm_plan(const TunedEntry& e) {
  const auto& f = e.shape.fields;
  codegen::GemmSpec spec;
  spec.n = to_int(e, "n");
  spec.k = to_int(e, "k");
  const std::string& bias = f.at("bias");
  spec.bias =
      bias == "none"  ? codegen::BiasKind::none
      : bias == "f32" ? codegen::BiasKind::f32
      : bias == "bf16"
          ? codegen::BiasKind::bf16
          : throw Error(fmt::format("shape field bias='{}'; allowed: none, f32, bf16", bias));
  const auto act = ir::activation_from_name(f.at("act"));
  if (!act)
    throw Error(
        fmt::format("shape field act='{}'; allowed: {}", f.at("act"), ir::activation_list(false)));
  spec.act = *act;
  const auto out = ir::dtype_from_name(f.at("out"));
  if (!out || (*out != DType::bf16 && *out != DType::f32))
    throw Error(fmt::format("shape field out='{}'; allowed: bf16, f32", f.at("out")));
  spec.out = *out;
  const auto wf = weight_format_from_name(f.at("fmt"));
  if (!wf)
    throw Error(
        fmt::format("shape field fmt='{}'; allowed: {}", f.at("fmt"), weight_format_list()));
  if (e.knob("w4a8") && !is_int4(*wf))
    throw Error(fmt::format("knob w4a8 with fmt={}; allowed: int4_awq, int4_gptq", f.at("fmt")));
  if (*wf != WeightFormat::bf16) {
    // A quantized GEMM's plan (ops/gemm_quant.cpp): the dequant route's and
    // W8A8's K chunk is the route's own (the dequant scratch, the s8 groups
    // of four), and the LLVM backend is not offered there: only the row
    // blocking, the task split and AMX vs AVX-512 are tuned.
    for (const char* k : {"max_kc", "llvm"})
      if (e.knob(k))
        throw Error(
            fmt::format("knob {} with fmt={}; allowed: mr, task_rows, amx, prefetch, w4a8 "
                        "(int4) (quantized)",
                        k, f.at("fmt")));
    // The int4 route: W4A8 has no plan knob (its kernels' blocking is fixed);
    // on the llvm path its kernels are LLVM code.
    if (auto v = e.knob("w4a8")) {
      if (*v == 1) {
        for (const char* k : {"mr", "task_rows", "amx", "prefetch"})
          if (e.knob(k))
            throw Error(
                fmt::format("knobs w4a8=1 and {} together; allowed: w4a8=1 alone (the "
                            "W4A8 kernels have no plan knob)",
                            k));
        if (f.at("path") == "llvm" && !cpu_info().llvm_backend)
          throw Error("knob w4a8=1 on path=llvm: this tilejit is built without the LLVM backend");
      }
    }
    if (*wf == WeightFormat::int8) {
      spec.b_type = DType::i8;
      spec.k = (spec.k + 3) / 4 * 4;
    } else {
      // The dequantized tiles' K (k_packed: K plus a pad per odd-length group
      // run; the checks of mr / task_rows / amx do not depend on it).
      spec.k = (spec.k + 1) / 2 * 2;
    }
  }
  const Isa path = runtime::parse_isa(f.at("path").c_str(), "shape field path");
  const codegen::PlanOverrides o = gemm_overrides(e);
  if (e.knob("amx") && path != Isa::amx)
    throw Error(fmt::format("knob amx on path={}; allowed: only on path=amx", isa_name(path)));
  if (e.knob("llvm")) {
    if (e.knob("amx")) throw Error("knobs amx and llvm together; allowed: one ISA choice");
    if (path != Isa::amx && path != Isa::avx512)
      throw Error(
          fmt::format("knob llvm on path={}; allowed: on path=amx or avx512", isa_name(path)));
    if (!cpu_info().llvm_backend)
      throw Error("knob llvm: this tilejit is built without the LLVM backend");
  }
  // The prefetch distance is the Xbyak AVX-512 kernels' (plan_gemm checks
  // it): on the AMX path only with amx=0, so every M of the bucket (AMX
  // from 3 rows) runs them.
  if (e.knob("prefetch") && path == Isa::amx && e.knob("amx") != 0)
    throw Error("knob prefetch on path=amx without amx=0; allowed: on path=avx512, or with amx=0");
  const Isa isa = codegen::gemm_isa_for_rows(path, bucket_low(f.at("m")), o);
  if (isa == Isa::scalar) throw Error("shape field path=scalar; allowed: a JIT path");
  // The arithmetic of the Xbyak fused int4 kernel: int4 weights, a bucket
  // whose every M it runs (W4A16 at <= 4 rows on the amx / avx512 paths).
  if (e.knob("u4_dot")) {
    const bool int4 = wf && is_int4(*wf);
    const int64_t hi = bucket_high(f.at("m"));
    const bool kernel = runtime::xbyak_fused_quant_kernel(runtime::cpu_features());
    if (!int4 || (path != Isa::amx && path != Isa::avx512) ||
        hi > codegen::BrgemmDesc::kQuantMaxMr || e.knob("w4a8") == 1 || !kernel)
      throw Error(fmt::format(
          "knob u4_dot with fmt={} path={} m={}{}; allowed: int4 weights (int4_awq, "
          "int4_gptq) on path amx or avx512 at m <= {} (one call of the fused kernel), without "
          "w4a8=1{}",
          f.at("fmt"), isa_name(path), f.at("m"), e.knob("w4a8") == 1 ? " w4a8=1" : "",
          codegen::BrgemmDesc::kQuantMaxMr,
          kernel ? "" : ", on a CPU with AVX512-VBMI (this one has none: the dequant route runs)"));
  }
  // W4A16's knobs name their route: where the automatic rule takes W4A8
  // (from 4 rows on llvm, 9 on avx512: ops::w4a8_automatic, which this
  // layer cannot ask) an entry without w4a8=0 was reported applied
  // (TILEJIT_VERBOSE, tuned_plans, dump) while the call ran W4A8 and
  // ignored it. With w4a8=0 the entry runs what it tuned at every M.
  if (is_int4(*wf) && !e.knob("w4a8"))
    for (const char* k : {"mr", "task_rows", "amx", "prefetch", "u4_dot"})
      if (e.knob(k))
        throw Error(
            fmt::format("knob {} with fmt={} and no w4a8; allowed: with w4a8=0 (the W4A16 route it "
                        "tunes: int4_route automatic takes W4A8 at some M, which has no plan knob)",
                        k, f.at("fmt")));
  (void)codegen::plan_gemm(spec, isa, o);
}

// A moe entry's route and prefetch knobs against its format and path (the
// ranges are kKnobs'): W4A8 is an int4 route (LLVM kernels on path llvm); the
// prefetch distance is the Xbyak AVX-512 kernels' (the llvm path runs none).
void validate_moe_knobs(const TunedEntry& e) {
  const auto& f = e.shape.fields;
  const auto wf = weight_format_from_name(f.at("fmt"));
  if (!wf)
    throw Error(
        fmt::format("shape field fmt='{}'; allowed: {}", f.at("fmt"), weight_format_list()));
  if (auto v = e.knob("w4a8_rows")) {
    if (!is_int4(*wf))
      throw Error(
          fmt::format("knob w4a8_rows with fmt={}; allowed: int4_awq, int4_gptq", f.at("fmt")));
    if (*v > 0 && f.at("path") == "llvm" && !cpu_info().llvm_backend)
      throw Error(
          "knob w4a8_rows > 0 on path=llvm: this tilejit is built without the LLVM backend");
  }
  const Isa path = runtime::parse_isa(f.at("path").c_str(), "shape field path");
  if (e.knob("prefetch") && path != Isa::amx && path != Isa::avx512)
    throw Error(
        fmt::format("knob prefetch on path={}; allowed: on path amx or avx512", isa_name(path)));
}

// A walk over JSON text that tells strings from structure (escapes honoured),
// allocating nothing: the two scans of a database's text (entry_lines,
// check_db_structure) read it through this one rule.
class JsonTextScan {
 public:
  enum Kind {
    structure,   // outside every string, not a quote
    open_quote,  // the quote that opens a string
    content,     // a character of a string's value (not an escape's backslash or escaped char)
    other,       // a backslash, the character it escapes, the closing quote
  };
  Kind next(char c) {
    if (!in_str_) {
      if (c != '"') return structure;
      in_str_ = true;
      return open_quote;
    }
    if (esc_) {
      esc_ = false;
      return other;
    }
    if (c == '\\') {
      esc_ = true;
      return other;
    }
    if (c == '"') {
      in_str_ = false;
      return other;
    }
    return content;
  }

 private:
  bool in_str_ = false, esc_ = false;
};

// Lines of the text at which each entry object starts: nlohmann keeps no
// positions, so a scan (outside strings) finds each '{' directly inside the
// top-level "entries" array (not one inside another key's nested objects).
std::vector<int64_t> entry_lines(const std::string& text) {
  std::vector<int64_t> lines;
  int depth = 0, entries_depth = -1;  // the depth inside the "entries" array
  int64_t line = 1;
  JsonTextScan scan;
  std::string str, key;  // the last string at depth 1; the key it became
  for (char c : text) {
    if (c == '\n') ++line;
    const JsonTextScan::Kind kind = scan.next(c);
    if (kind == JsonTextScan::open_quote) str.clear();
    if (kind == JsonTextScan::content && depth == 1) str += c;
    if (kind != JsonTextScan::structure) continue;
    if (c == ':' && depth == 1) {
      key = str;
    } else if (c == '{' || c == '[') {
      if (c == '{' && depth == entries_depth) lines.push_back(line);
      if (c == '[' && depth == 1 && key == "entries") entries_depth = 2;
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth < entries_depth) entries_depth = -1;
    } else if (c == ',' && depth == 1) {
      key.clear();
    }
  }
  return lines;
}

int64_t line_of_byte(const std::string& text, size_t byte) {
  int64_t line = 1;
  for (size_t i = 0; i < std::min(byte, text.size()); ++i) line += text[i] == '\n';
  return line;
}

std::string get_string(const json& j, const char* key) {
  if (!j.contains(key) || !j[key].is_string())
    throw Error(fmt::format("field '{}' missing or not a string", key));
  return j[key].get<std::string>();
}

// The fields of an entry past its identity (family, cpu, build). strict: an
// entry this build applies, every field checked; else (another CPU or
// build: the fields may be another version's) what can be read is read and
// the rest left empty, for id() and the report.
void entry_fields(const json& j, bool strict, TunedEntry* e) {
  auto bad = [&](const std::string& msg) {
    if (strict) throw Error(msg);
  };
  if (!j.contains("shape") || !j["shape"].is_object()) {
    bad("field 'shape' missing or not an object");
  } else {
    for (const auto& [k, v] : j["shape"].items()) {
      if (v.is_string())
        e->shape.fields[k] = v.get<std::string>();
      else if (v.is_number_integer())
        e->shape.fields[k] = v.dump();
      else
        bad(fmt::format("shape field '{}' = {}; allowed: a string or an integer", k, v.dump()));
    }
  }
  if (!j.contains("knobs") || !j["knobs"].is_object()) {
    bad("field 'knobs' missing or not an object");
  } else {
    for (const auto& [k, v] : j["knobs"].items()) {
      // is_number_integer holds for a uint64 past INT64_MAX too: get<int64_t>
      // would wrap it.
      if (v.is_number_integer() &&
          (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t(INT64_MAX)))
        e->knobs[k] = v.get<int64_t>();
      else
        bad(fmt::format("knob '{}' = {}; allowed: an integer", k, v.dump()));
    }
  }
  if (!j.contains("measured")) return;
  const json& m = j["measured"];
  if (!m.is_object())
    return bad(fmt::format("field 'measured' = {}; allowed: an object", m.dump()));
  // Other keys are ignored, as at the top of an entry.
  for (auto [k, out] : {std::pair<const char*, double*>{"default_us", &e->default_us},
                        {"tuned_us", &e->tuned_us},
                        {"noise_us", &e->noise_us}}) {
    if (!m.contains(k)) continue;
    // A time: >= 0 (a negative one was taken and reported as measured).
    if (m[k].is_number() && m[k].get<double>() >= 0)
      *out = m[k].get<double>();
    else
      bad(fmt::format("measured.{} = {}; allowed: a number >= 0 (microseconds)", k, m[k].dump()));
  }
  if (m.contains("candidates")) {
    const json& v = m["candidates"];
    if (v.is_number_integer() && v.get<int64_t>() >= 0)
      e->candidates = v.get<int64_t>();
    else
      bad(fmt::format("measured.candidates = {}; allowed: an integer >= 0", v.dump()));
  }
}

// Staleness is decided first, from the identity alone: an entry of another
// CPU or build is kept verbatim (save writes it back unchanged) and not
// checked beyond that, since another build may know families, knobs and
// fields this one does not (docs/tuning.md "The database").
TunedEntry entry_from_json(const json& j) {
  if (!j.is_object()) throw Error("an entry is not a JSON object");
  TunedEntry e;
  e.family = get_string(j, "family");
  e.cpu = get_string(j, "cpu");
  e.version = get_string(j, "tilejit");
  const bool stale = e.cpu != runtime::cpu_signature() || e.version != tuning_db_version();
  entry_fields(j, !stale, &e);
  if (stale) {
    e.verbatim = j.dump();
    return e;
  }
  validate_entry(e);
  return e;
}

json entry_to_json(const TunedEntry& e) {
  if (!e.verbatim.empty()) return json::parse(e.verbatim);
  json shape = json::object();
  for (const auto& [k, v] : e.shape.fields) shape[k] = v;
  json knobs = json::object();
  for (const auto& [k, v] : e.knobs) knobs[k] = v;
  return json{{"family", e.family},
              {"shape", shape},
              {"knobs", knobs},
              {"cpu", e.cpu},
              {"tilejit", e.version},
              {"measured",
               {{"default_us", e.default_us},
                {"tuned_us", e.tuned_us},
                {"noise_us", e.noise_us},
                {"candidates", e.candidates}}}};
}

// What identifies an entry in a file: two with one key are one entry (put
// replaces, save's merge keeps one). A stale entry whose shape could not
// be read is its own text.
std::string entry_key(const TunedEntry& e) {
  if (!e.verbatim.empty() && e.shape.fields.empty()) return e.verbatim;
  return e.id() + "|" + e.cpu + "|" + e.version;
}

}  // namespace

std::string ShapeClass::text() const {
  std::string s;
  for (const auto& [k, v] : fields) s += fmt::format("{}{}={}", s.empty() ? "" : ";", k, v);
  return s;
}

namespace {
// The upper ends of the count buckets (the last bucket is open).
constexpr int64_t kCountEdges[] = {1, 4, 16, 64, 256, 1024};
int count_bucket_index(int64_t n) {
  int i = 0;
  while (i < static_cast<int>(std::size(kCountEdges)) && n > kCountEdges[i]) ++i;
  return i;
}
}  // namespace

std::string count_bucket(int64_t n) {
  const int i = count_bucket_index(n);
  const int64_t lo = i == 0 ? 1 : kCountEdges[i - 1] + 1;
  if (i == static_cast<int>(std::size(kCountEdges))) return fmt::format("{}+", lo);
  const int64_t hi = kCountEdges[i];
  return lo == hi ? fmt::format("{}", hi) : fmt::format("{}-{}", lo, hi);
}

namespace {
// The upper ends of the sequence buckets (the last bucket is open).
constexpr int64_t kSeqEdges[] = {256, 1024, 4096, 16384};
}  // namespace

std::string seq_bucket(int64_t n) {
  int64_t lo = 1;
  for (int64_t hi : kSeqEdges) {
    if (n <= hi) return fmt::format("{}-{}", lo, hi);
    lo = hi + 1;
  }
  return fmt::format("{}+", lo);
}

std::optional<WeightFormat> weight_format_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(WeightFormat::mxfp4); ++i)
    if (name == weight_format_name(static_cast<WeightFormat>(i)))
      return static_cast<WeightFormat>(i);
  return std::nullopt;
}

std::string weight_format_list() {
  std::string s;
  for (int i = 0; i <= static_cast<int>(WeightFormat::mxfp4); ++i)
    s += fmt::format("{}{}", i ? ", " : "", weight_format_name(static_cast<WeightFormat>(i)));
  return s;
}

ShapeClass gemm_shape_class(Isa path, int threads, int64_t n, int64_t k, codegen::BiasKind bias,
                            Activation act, DType out, int64_t m, WeightFormat fmt) {
  return {{{"path", isa_name(path)},
           {"threads", std::to_string(threads)},
           {"fmt", weight_format_name(fmt)},
           {"n", std::to_string(n)},
           {"k", std::to_string(k)},
           {"bias", codegen::bias_kind_name(bias)},
           {"act", activation_name(act)},
           {"out", dtype_name(out)},
           {"m", count_bucket(m)}}};
}

namespace {
// The fields every attention family's class starts with: path, threads and
// the head geometry.
ShapeClass attention_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq, int64_t hkv) {
  return {{{"path", isa_name(path)},
           {"threads", std::to_string(threads)},
           {"d", std::to_string(d)},
           {"dv", std::to_string(dv)},
           {"hq", std::to_string(hq)},
           {"hkv", std::to_string(hkv)}}};
}
}  // namespace

ShapeClass decode_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq, int64_t hkv,
                              int64_t block_size, DType kv, int64_t batch, int64_t longest) {
  ShapeClass s = attention_class(path, threads, d, dv, hq, hkv);
  s.fields.insert({{"block", std::to_string(block_size)},
                   {"kv", dtype_name(kv)},
                   {"batch", count_bucket(batch)},
                   {"seq", seq_bucket(longest)}});
  return s;
}

ShapeClass prefill_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq,
                               int64_t hkv, bool causal, int64_t batch, int64_t longest) {
  ShapeClass s = attention_class(path, threads, d, dv, hq, hkv);
  s.fields.insert({{"causal", causal ? "1" : "0"},
                   {"batch", count_bucket(batch)},
                   {"seq", seq_bucket(longest)}});
  return s;
}

ShapeClass extend_shape_class(Isa path, int threads, int64_t d, int64_t dv, int64_t hq, int64_t hkv,
                              int64_t block_size, DType kv, int64_t batch, int64_t longest_new,
                              int64_t longest) {
  ShapeClass s = attention_class(path, threads, d, dv, hq, hkv);
  s.fields.insert({{"block", std::to_string(block_size)},
                   {"kv", dtype_name(kv)},
                   {"batch", count_bucket(batch)},
                   {"new", count_bucket(longest_new)},
                   {"seq", seq_bucket(longest)}});
  return s;
}

ShapeClass moe_shape_class(Isa path, int threads, int64_t e, int64_t k, int64_t h, int64_t i,
                           int64_t t, WeightFormat fmt) {
  return {{{"path", isa_name(path)},
           {"threads", std::to_string(threads)},
           {"fmt", weight_format_name(fmt)},
           {"e", std::to_string(e)},
           {"topk", std::to_string(k)},
           {"h", std::to_string(h)},
           {"i", std::to_string(i)},
           {"t", count_bucket(t)}}};
}

std::optional<int64_t> TunedEntry::knob(const std::string& name) const {
  const auto it = knobs.find(name);
  return it == knobs.end() ? std::nullopt : std::optional<int64_t>(it->second);
}

std::string knobs_text(const std::map<std::string, int64_t>& knobs) {
  std::string s;
  for (const auto& [k, v] : knobs) s += fmt::format("{}{}={}", s.empty() ? "" : " ", k, v);
  return s;
}

codegen::PlanOverrides gemm_overrides(const TunedEntry& e) {
  codegen::PlanOverrides o;
  if (auto v = e.knob("mr")) o.mr = static_cast<int>(*v);
  o.task_rows = e.knob("task_rows");
  o.max_kc = e.knob("max_kc");
  if (auto v = e.knob("amx")) o.isa = *v ? Isa::amx : Isa::avx512;
  if (e.knob("llvm")) o.isa = Isa::llvm;
  if (auto v = e.knob("w4a8")) o.w4a8 = *v != 0;
  if (auto v = e.knob("prefetch")) o.prefetch_kib = static_cast<int>(*v);
  if (auto v = e.knob("u4_dot")) o.u4_dot = *v != 0;
  o.entry = e.id();
  return o;
}

std::string tuning_db_version() {
  return TILEJIT_BUILD_ID;
}

namespace {

// The names of every bucket of a bucketing function (its value at each
// bucket's lowest count), for the check of an entry's bucket fields.
template <class Edges, class Bucket>
std::vector<std::string> bucket_names(const Edges& edges, Bucket bucket) {
  std::vector<std::string> names = {bucket(1)};
  for (int64_t hi : edges) names.push_back(bucket(hi + 1));
  return names;
}

// An entry's shape value as the shape class builders write it: the lookup
// compares the text, so a value they never write (m "5-4", "17-064", a kv
// dtype that is no cache's, threads "abc") would be an entry never applied.
// The allowed values are the builders' own (count_bucket, seq_bucket,
// isa_name, the activation and weight format lists, ...).
void check_shape_value(const std::string& field, const std::string& v) {
  auto refuse = [&](const std::string& allowed) {
    throw Error(fmt::format("shape field {}='{}'; allowed: {}", field, v, allowed));
  };
  auto one_of = [&](const std::vector<std::string>& names) {
    if (std::find(names.begin(), names.end(), v) == names.end())
      refuse(fmt::format("{}", fmt::join(names, ", ")));
  };
  // A count in [lo, hi] written as std::to_string writes it.
  auto integer = [&](int64_t lo, int64_t hi) {
    int64_t x = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
    if (ec != std::errc() || end != v.data() + v.size() || x < lo || x > hi ||
        std::to_string(x) != v)
      refuse(
          hi == std::numeric_limits<int64_t>::max()
              ? fmt::format("an integer >= {} (decimal, no sign or leading zeros)", lo)
              : fmt::format("an integer in [{}, {}] (decimal, no sign or leading zeros)", lo, hi));
  };
  if (field == "path") {
    // The JIT paths: tune tunes nothing on the scalar reference (and
    // listing it, then refusing path=scalar, sent a user in a circle).
    std::vector<std::string> isas;
    for (Isa i : {Isa::amx, Isa::avx512, Isa::llvm}) isas.push_back(isa_name(i));
    one_of(isas);
  } else if (field == "threads") {
    integer(1, runtime::kMaxThreads);
  } else if (field == "fmt") {
    if (!weight_format_from_name(v)) refuse(weight_format_list());
  } else if (field == "bias") {
    one_of({codegen::bias_kind_name(codegen::BiasKind::none),
            codegen::bias_kind_name(codegen::BiasKind::f32),
            codegen::bias_kind_name(codegen::BiasKind::bf16)});
  } else if (field == "act") {
    if (!ir::activation_from_name(v)) refuse(ir::activation_list(false));
  } else if (field == "out") {
    one_of({dtype_name(DType::bf16), dtype_name(DType::f32)});
  } else if (field == "kv") {
    std::vector<std::string> kvs;
    for (DType t : ir::kKvCacheDtypes) kvs.emplace_back(dtype_name(t));
    one_of(kvs);
  } else if (field == "causal") {
    one_of({"0", "1"});
  } else if (field == "m" || field == "batch" || field == "t" || field == "new") {
    one_of(bucket_names(kCountEdges, count_bucket));
  } else if (field == "seq") {
    one_of(bucket_names(kSeqEdges, seq_bucket));
  } else {
    // Sizes and counts (n, k, d, dv, hq, hkv, block, e, topk, h, i): the
    // operators' own limits apply at the call; an entry holds a positive one.
    integer(1, std::numeric_limits<int64_t>::max());
  }
}

}  // namespace

void validate_entry(const TunedEntry& e) {
  const std::set<std::string> want = shape_fields(e.family);
  if (want.empty())
    throw Error(fmt::format("family '{}'; allowed: {}", e.family, allowed_families()));
  for (const auto& [k, v] : e.shape.fields)
    if (!want.count(k))
      throw Error(fmt::format("shape field '{}' is not one of family {}'s", k, e.family));
  for (const std::string& k : want)
    if (!e.shape.fields.count(k))
      throw Error(fmt::format("shape field '{}' missing (family {})", k, e.family));
  for (const auto& [k, v] : e.shape.fields) check_shape_value(k, v);
  // No knobs: tune measured the default as the best plan (kept so --resume
  // skips it); nothing to apply.
  for (const auto& [k, v] : e.knobs) {
    const KnobRule* rule = nullptr;
    for (const KnobRule& r : kKnobs)
      if (e.family == r.family && k == r.knob) rule = &r;
    if (rule == nullptr)
      throw Error(fmt::format("knob '{}' for family {}; allowed: {}", k, e.family,
                              allowed_knobs(e.family)));
    if (v < rule->lo || v > rule->hi || v % rule->step != 0)
      throw Error(fmt::format("knob {}={}; allowed: {} .. {}{} ({})", k, v, rule->lo, rule->hi,
                              rule->step > 1 ? fmt::format(", a multiple of {}", rule->step) : "",
                              rule->what));
  }
  if (e.family == "gemm" && !e.knobs.empty()) validate_gemm_plan(e);
  if (e.family == "moe") validate_moe_knobs(e);
  // The prefetch distance is the LLVM decode kernel's (a build without LLVM
  // decodes with the brgemm engine, which has no such distance).
  if (e.family == "decode_attention" && e.knob("prefetch_chunks") && !cpu_info().llvm_backend)
    throw Error("knob prefetch_chunks: this tilejit is built without the LLVM backend");
}

namespace {

// The database text (runtime::CappedFile: a FIFO, /dev/zero or a directory
// is an Error, not a hang or an unbounded read).
std::string read_db_text(const std::string& path) {
  try {
    return runtime::CappedFile(path).read_all(kMaxTuningDbBytes, "tuning database");
  } catch (const Error& e) {
    throw Error(fmt::format("cannot read the tuning database: {}", e.what()));
  }
}

// The structure bounds of a database's text (kMaxTuningDbDepth,
// kMaxTuningDbValues), by a scan outside strings that allocates nothing: what
// load checks before nlohmann builds the document, and save before it
// writes (a save never leaves a file load refuses).
void check_db_structure(const std::string& text, const std::string& path) {
  int depth = 0;
  int64_t values = 0;
  JsonTextScan scan;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (scan.next(c) != JsonTextScan::structure) continue;
    if (c == '{' || c == '[') {
      if (++depth > kMaxTuningDbDepth)
        throw Error(fmt::format(
            "{}:{}: error: the tuning database nests more than {} JSON objects and arrays here; "
            "allowed: at most {} levels (an entry's fields are 4 deep)",
            path, line_of_byte(text, i), kMaxTuningDbDepth, kMaxTuningDbDepth));
      ++values;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',') {
      ++values;
    }
    if (values > kMaxTuningDbValues)
      throw Error(fmt::format(
          "{}:{}: error: the tuning database has more than {} JSON objects, arrays and items; "
          "allowed: at most {} (about 170000 entries)",
          path, line_of_byte(text, i), kMaxTuningDbValues, kMaxTuningDbValues));
  }
}

// Empties a JSON value leaf first, allocating nothing: nlohmann's
// destructor moves a container's children into a vector as large as the
// container, and a std::bad_alloc there (memory ran out while the document
// was built, or is still short) ends the process (a destructor is
// noexcept). The depth is kMaxTuningDbDepth's (check_db_structure).
void teardown(json& v) noexcept {
  if (v.is_array()) {
    auto& a = v.get_ref<json::array_t&>();
    while (!a.empty()) {
      teardown(a.back());
      a.pop_back();
    }
  } else if (v.is_object()) {
    auto& o = v.get_ref<json::object_t&>();
    while (!o.empty()) {
      teardown(o.begin()->second);
      o.erase(o.begin());
    }
  }
}

// A JSON document torn down by teardown() when it goes out of scope, on
// every path (a thrown Error or std::bad_alloc included).
struct Document {
  json j;
  Document() = default;
  Document(const Document&) = delete;
  Document& operator=(const Document&) = delete;
  ~Document() { teardown(j); }
};

// nlohmann's DOM builder, remembering where the parser failed: a number
// out of double's range (1e400) is an out_of_range exception, which, unlike a
// parse_error, carries no position.
struct PositionedDom : nlohmann::detail::json_sax_dom_parser<json> {
  using nlohmann::detail::json_sax_dom_parser<json>::json_sax_dom_parser;
  size_t error_byte = 0;  // 1-based, as parse_error::byte
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& last_token, const Exception& ex) {
    error_byte = position;
    return nlohmann::detail::json_sax_dom_parser<json>::parse_error(position, last_token, ex);
  }
};

TuningDb parse_db(const std::string& text, const std::string& path) {
  check_db_structure(text, path);
  // nlohmann reads a NUL byte as the end of the input: what follows one
  // would be ignored, not refused.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(
        fmt::format("{}:{}: error: the tuning database is not valid JSON: a NUL byte at "
                    "byte {}; allowed: JSON text",
                    path, line_of_byte(text, nul), nul));
  Document doc;
  json& j = doc.j;
  // Built in place (not json::parse's return value): what was built when
  // memory ran out is doc's, torn down without allocating.
  PositionedDom dom(j, true);
  try {
    json::sax_parse(text, &dom);
  } catch (const json::exception& e) {
    // dom.error_byte: 1-based position of the byte at which parsing failed.
    throw Error(fmt::format("{}:{}: error: the tuning database is not valid JSON: {}", path,
                            line_of_byte(text, dom.error_byte == 0 ? 0 : dom.error_byte - 1),
                            e.what()));
  }
  // The version compared as JSON: get<int> would truncate 4294967297 to 1.
  if (!j.is_object() || !j.contains("tilejit_tuning_db") ||
      !j["tilejit_tuning_db"].is_number_integer() ||
      j["tilejit_tuning_db"] != json(kFormatVersion) || !j.contains("entries") ||
      !j["entries"].is_array())
    throw Error(
        fmt::format("{}:1: error: not a tilejit tuning database; allowed: an object with "
                    "\"tilejit_tuning_db\": {} and an \"entries\" array",
                    path, kFormatVersion));
  const std::vector<int64_t> lines = entry_lines(text);
  TuningDb db;
  std::set<std::string> keys;
  for (size_t i = 0; i < j["entries"].size(); ++i) {
    const int64_t line = i < lines.size() ? lines[i] : 1;
    try {
      TunedEntry e = entry_from_json(j["entries"][i]);
      // Another build's entries may repeat what this one calls one class.
      if (e.verbatim.empty() && !keys.insert(entry_key(e)).second)
        throw Error(fmt::format("a second entry for {}", e.id()));
      db.entries.push_back(std::move(e));
    } catch (const Error& e) {
      throw Error(
          fmt::format("{}:{}: error: tuning database entry {}: {}", path, line, i, e.what()));
    }
  }
  return db;
}

// The file a path names after its symbolic links: a database reached
// through a link is written where the link points (the link stays).
std::string resolve_links(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path p = path;
  std::error_code ec;
  for (int hops = 0; hops < 40 && fs::is_symlink(p, ec); ++hops) {
    const fs::path to = fs::read_symlink(p, ec);
    if (ec) break;
    p = to.is_absolute() ? to : p.parent_path() / to;
  }
  return p.string();
}

// An exclusive flock(2) on "<db>.lock", held while in scope: the writers of
// one database take turns at read-merge-write (readers need none: the file
// is replaced by rename(2), never written in place).
class DbLock {
 public:
  explicit DbLock(const std::string& db) {
    const std::string lock = db + ".lock";
    fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd_ < 0)
      throw Error(fmt::format("{}: cannot open the tuning database's lock file: {}", lock,
                              std::strerror(errno)));
    int r;
    while ((r = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
    if (r != 0) {
      const int e = errno;
      ::close(fd_);
      throw Error(fmt::format("{}: cannot lock: {}", lock, std::strerror(e)));
    }
  }
  ~DbLock() { ::close(fd_); }  // closing releases the lock
  DbLock(const DbLock&) = delete;
  DbLock& operator=(const DbLock&) = delete;

 private:
  int fd_ = -1;
};

// Writes text to a temporary file of its own next to `target` (mkstemp:
// two writers never share one) and renames it over target.
void replace_file(const std::string& target, const std::string& text) {
  if (!runtime::file_size_allowed(text.size()))
    throw Error(fmt::format("{}: its {} would pass the file size limit (RLIMIT_FSIZE)", target,
                            runtime::byte_size_str(static_cast<int64_t>(text.size()))));
  std::string tmp = target + ".tmp.XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("{}: cannot create a temporary file next to it: {}", target,
                            std::strerror(errno)));
  auto fail = [&](const char* what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: {}: {}", tmp, what, std::strerror(e)));
  };
  // mkstemp makes 0600; a database is as readable as any file the user writes.
  struct stat st;
  const mode_t mode = ::stat(target.c_str(), &st) == 0 ? (st.st_mode & 07777) : 0644;
  if (::fchmod(fd, mode) != 0) fail("cannot set its mode");
  for (size_t done = 0; done < text.size();) {
    const ssize_t w = ::write(fd, text.data() + done, text.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) fail("write failed");
    done += static_cast<size_t>(w);
  }
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: write failed: {}", tmp, std::strerror(e)));
  }
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("{}: cannot rename {} over it: {}", target, tmp, std::strerror(e)));
  }
}

}  // namespace

namespace {
// Memory running out while a database is read or written (the structure
// bounds keep a file's parse to a few hundred MB, which a process under a
// low `ulimit -v` may still not have): an Error naming the file, not a
// std::bad_alloc that a caller reports as its own.
[[noreturn]] void out_of_memory(const std::string& path, const char* doing) {
  throw Error(
      fmt::format("{}: error: out of memory {} the tuning database (a file of up to {} and {} JSON "
                  "objects, arrays and items)",
                  path, doing, runtime::byte_size_str(kMaxTuningDbBytes), kMaxTuningDbValues));
}
}  // namespace

TuningDb TuningDb::load(const std::string& path) {
  try {
    return parse_db(read_db_text(path), path);
  } catch (const std::bad_alloc&) {
    out_of_memory(path, "reading");
  }
}

namespace {
void save_merged(const TuningDb& db, const std::string& path) {
  const std::string target = resolve_links(path);
  DbLock lock(target);
  // What other writers saved since this database was read: their entries
  // are kept; this database's replace those of the same key.
  // A file that is not a database (garbage, an entry this build refuses)
  // is replaced, as tune replaces what it could not load.
  TuningDb merged;
  if (::access(target.c_str(), F_OK) == 0) {
    try {
      merged = parse_db(read_db_text(target), path);
    } catch (const Error&) {
      merged = {};
    }
  }
  // Another CPU's or build's entries are never changed here: the file's
  // copy (perhaps re-tuned by that machine since) wins.
  std::set<std::string> on_disk;
  for (const TunedEntry& e : merged.entries) on_disk.insert(entry_key(e));
  for (const TunedEntry& e : db.entries)
    if (e.verbatim.empty() || !on_disk.count(entry_key(e))) merged.put(e);
  Document doc;
  json& j = doc.j;
  j["tilejit_tuning_db"] = kFormatVersion;
  json& list = j["entries"] = json::array();
  for (const TunedEntry& e : merged.entries) list.push_back(entry_to_json(e));
  // Indented (an entry's fields one per line) while that fits the read cap,
  // else compact; what does not load is never written (the old file stays).
  std::string text = j.dump(1) + "\n";
  if (static_cast<int64_t>(text.size()) > kMaxTuningDbBytes) text = j.dump() + "\n";
  if (static_cast<int64_t>(text.size()) > kMaxTuningDbBytes)
    throw Error(fmt::format(
        "{}: error: the tuning database would be {} bytes with {} entries, more than the {} a "
        "tuning database may have; nothing written (the file is unchanged: move other "
        "machines' entries to a database of their own)",
        path, text.size(), merged.entries.size(), runtime::byte_size_str(kMaxTuningDbBytes)));
  try {
    check_db_structure(text, path);
  } catch (const Error& e) {
    throw Error(fmt::format("{}; nothing written (the file is unchanged)", e.what()));
  }
  replace_file(target, text);
}
}  // namespace

void check_db_writable(const std::string& path) {
  const std::string target = resolve_links(path);
  DbLock lock(target);
  std::string tmp = target + ".tmp.XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);
  if (fd < 0)
    throw Error(fmt::format("{}: cannot create a temporary file next to it: {}", target,
                            std::strerror(errno)));
  ::close(fd);
  ::unlink(tmp.c_str());
}

void TuningDb::save(const std::string& path) const {
  try {
    save_merged(*this, path);
  } catch (const std::bad_alloc&) {
    out_of_memory(path, "writing");
  }
}

void TuningDb::put(TunedEntry e) {
  const std::string key = entry_key(e);
  for (TunedEntry& x : entries)
    if (entry_key(x) == key) {
      x = std::move(e);
      return;
    }
  entries.push_back(std::move(e));
}

const TunedEntry* TuningDb::find(const std::string& id) const {
  for (const TunedEntry& e : entries)
    if (e.id() == id) return &e;
  return nullptr;
}

TuningDb TuningDb::current(int64_t* stale) const {
  TuningDb out;
  const std::string cpu = runtime::cpu_signature(), version = tuning_db_version();
  int64_t n = 0;
  for (const TunedEntry& e : entries) {
    if (e.cpu == cpu && e.version == version)
      out.entries.push_back(e);
    else
      ++n;
  }
  if (stale) *stale = n;
  return out;
}

// ---- the process-wide database ---------------------------------------------

namespace {

struct Slot {
  TunedEntry entry;
  std::atomic<bool> used{false};
};
using Index = std::unordered_map<std::string, std::unique_ptr<Slot>>;

struct Global {
  std::mutex mu;
  std::shared_ptr<const Index> index;
  // Installed indexes stay alive: an entry pointer handed out stays valid.
  std::vector<std::shared_ptr<const Index>> all;
  std::atomic<bool> any{false};
  std::atomic<bool> installed{false};  // a database was installed (API or env)
  std::atomic<uint64_t> used{0};
  std::atomic<uint64_t> generation{0};  // installs so far (find_tuned_gemm's tables)
  std::once_flag env_once;
};
Global& global() {
  static Global& g = *new Global;  // immortal: threads may outlive static destruction
  return g;
}

void load_from_env() {
  const char* p = std::getenv("TILEJIT_TUNING_DB");
  // load_tuning_db before the first lookup wins over the environment.
  if (p == nullptr || *p == '\0' || global().installed.load()) return;
  // Read inside an operator call: the variable named, not only the file.
  try {
    install_tuning_db(TuningDb::load(p), p);
  } catch (const Error& e) {
    throw Error(fmt::format("TILEJIT_TUNING_DB: {}", e.what()));
  } catch (const std::bad_alloc&) {
    throw Error(
        fmt::format("TILEJIT_TUNING_DB: {}: out of memory installing the tuning database", p));
  }
}
// TILEJIT_TUNING_DB's load runs once, under a once_flag: made (or waited
// for) before a fork. Its mutex is a leaf (an index pointer swapped or read).
const bool g_fork_hooks =
    runtime::on_fork_complete([] { (void)tuning_db_active(); }) &&
    runtime::on_fork_lock([] { global().mu.lock(); }, [] { global().mu.unlock(); });

}  // namespace

void install_tuning_db(TuningDb db, const std::string& source) {
  int64_t stale = 0;
  const size_t total = db.entries.size();
  TuningDb cur = db.current(&stale);
  auto index = std::make_shared<Index>();
  for (TunedEntry& e : cur.entries) {
    if (e.knobs.empty()) continue;  // the default measured best: nothing to apply
    auto slot = std::make_unique<Slot>();
    slot->entry = std::move(e);
    const std::string id = slot->entry.id();
    (*index)[id] = std::move(slot);
  }
  if (runtime::verbose_level() > 0 && !source.empty())
    std::fprintf(stderr,
                 "tilejit: tuning db %s: %zu of %zu entries for this CPU and build; %lld stale "
                 "(another CPU or tilejit build) ignored\n",
                 source.c_str(), index->size(), total, static_cast<long long>(stale));
  Global& g = global();
  std::lock_guard<std::mutex> lk(g.mu);
  g.installed.store(true);
  g.any.store(!index->empty(), std::memory_order_release);
  g.index = index;
  g.all.push_back(std::move(index));
  g.generation.fetch_add(1, std::memory_order_acq_rel);
}

bool tuning_db_active() {
  Global& g = global();
  std::call_once(g.env_once, load_from_env);
  return g.any.load(std::memory_order_acquire);
}

const TunedEntry* find_tuned(const std::string& family, const ShapeClass& shape) {
  Global& g = global();
  if (!tuning_db_active()) return nullptr;
  std::shared_ptr<const Index> index;
  {
    std::lock_guard<std::mutex> lk(g.mu);
    index = g.index;
  }
  const auto it = index->find(family + ":" + shape.text());
  if (it == index->end()) return nullptr;
  Slot& s = *it->second;
  if (!s.used.exchange(true, std::memory_order_relaxed)) {
    g.used.fetch_add(1, std::memory_order_relaxed);
    if (runtime::verbose_level() > 0)
      std::fprintf(stderr, "tilejit: tuned plan %s: %s\n", s.entry.id().c_str(),
                   knobs_text(s.entry.knobs).c_str());
  }
  return &s.entry;
}

const codegen::PlanOverrides& find_tuned_gemm(Isa path, int threads, int64_t n, int64_t k,
                                              codegen::BiasKind bias, Activation act, DType out,
                                              int64_t m, WeightFormat fmt) {
  static const codegen::PlanOverrides& kNone = *new codegen::PlanOverrides;  // immortal
  if (!tuning_db_active()) return kNone;
  Global& g = global();
  // The M bucket's index stands for the bucket; the generation for the
  // database installed.
  const int bucket = count_bucket_index(m);
  using Key = std::tuple<uint64_t, int, int, int64_t, int64_t, int, int, int, int, int>;
  struct KeyHash {
    size_t operator()(const Key& x) const {
      return std::hash<uint64_t>()(std::get<0>(x) * 1000003u ^ uint64_t(std::get<3>(x)) * 31 ^
                                   uint64_t(std::get<4>(x)) * 131 ^ uint64_t(std::get<8>(x)));
    }
  };
  auto& cache =
      runtime::per_thread<std::unordered_map<Key, codegen::PlanOverrides, KeyHash>>([] {});
  const Key key{g.generation.load(std::memory_order_acquire),
                static_cast<int>(path),
                threads,
                n,
                k,
                static_cast<int>(bias),
                static_cast<int>(act),
                static_cast<int>(out),
                bucket,
                static_cast<int>(fmt)};
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  if (cache.size() > 4096) cache.clear();  // old generations
  const TunedEntry* e =
      find_tuned("gemm", gemm_shape_class(path, threads, n, k, bias, act, out, m, fmt));
  return cache.emplace(key, e ? gemm_overrides(*e) : kNone).first->second;
}

uint64_t tuned_plans_used() {
  return global().used.load(std::memory_order_relaxed);
}

}  // namespace tilejit::jit

namespace tilejit {

void load_tuning_db(const std::string& path) {
  jit::install_tuning_db(jit::TuningDb::load(path), path);
}

}  // namespace tilejit
