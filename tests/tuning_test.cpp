// The tuning database (jit/tuning_db.h) and the tune workload files
// (tools/tune_workload.h): round trips, stale and corrupt databases, bad
// fields, and a tuned plan that the operators actually run (docs/tuning.md).
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <tuple>

#include "codegen/gemm_plan.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/gemm_executable.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "runtime/thread_pool.h"
#include "test_util.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/tune_measure.h"
#include "tools/tune_workload.h"

namespace tilejit {
namespace {

namespace fs = std::filesystem;
using test::expect_tilejit_error;

// Every file a test makes (the databases and the `DB.lock` files the library
// leaves beside them by design) lives in one directory per process, removed
// at exit, so runs do not pile lock files up in the temp directory.
const fs::path& temp_dir() {
  struct Dir {
    fs::path path =
        fs::temp_directory_path() / ("tilejit-tuning-test." + std::to_string(::getpid()));
    Dir() { fs::create_directories(path); }
    ~Dir() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  };
  static const Dir dir;
  return dir.path;
}

std::string temp_path(const std::string& name) {
  return (temp_dir() /
          (name + "." + ::testing::UnitTest::GetInstance()->current_test_info()->name()))
      .string();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A gemm entry of this machine and build.
jit::TunedEntry gemm_entry(Isa path, int64_t n, int64_t k, int64_t m,
                           std::map<std::string, int64_t> knobs = {}) {
  jit::TunedEntry e;
  e.family = "gemm";
  e.shape = jit::gemm_shape_class(path, runtime::num_threads(), n, k, codegen::BiasKind::none,
                                  Activation::none, DType::bf16, m);
  e.knobs = std::move(knobs);
  e.cpu = runtime::cpu_signature();
  e.version = jit::tuning_db_version();
  return e;
}

// The same for an f32-out GEMM of weight format fmt.
jit::TunedEntry quant_entry(Isa path, int64_t n, int64_t k, int64_t m, WeightFormat fmt,
                            std::map<std::string, int64_t> knobs) {
  jit::TunedEntry e = gemm_entry(path, n, k, m, std::move(knobs));
  e.shape = jit::gemm_shape_class(path, runtime::num_threads(), n, k, codegen::BiasKind::none,
                                  Activation::none, DType::f32, m, fmt);
  return e;
}

// A synthetic int4 GPTQ weight [n, k], group 64 (the tuner's own).
PackedWeight int4_weight(int64_t n, int64_t k, uint32_t seed) {
  tools::WorkloadOp o;
  o.op = "gemm";
  o.format = "int4_gptq";
  o.group_size = 64;
  return tools::synthetic_weight(o, n, k, seed);
}

// ---- workload files -----------------------------------------------------------

TEST(TuneWorkload, RoundTrip) {
  const std::string text = R"({"name": "w", "ops": [
    {"op": "gemm", "name": "qkv", "n": 6144, "k": 4096, "act": "silu", "out": "f32", "m": [1, 16, 512]},
    {"op": "decode_attention", "d": 128, "hq": 32, "hkv": 8, "batch": [1, 16], "seq_len": [4096]},
    {"op": "prefill_attention", "d": 128, "hq": 32, "hkv": 8, "causal": false, "seq_len": [512]},
    {"op": "moe", "name": "experts", "e": 128, "topk": 8, "h": 2048, "i": 768, "t": {"from": 1, "to": 64}},
    {"op": "extend_attention", "d": 64, "dv": 32, "hq": 8, "hkv": 2, "prefix_len": 100, "seq_len": [7, 33]},
    {"op": "rope", "d": 128, "hq": 32, "hkv": 0, "rotary_dim": 64, "style": "gptj", "dtype": "f32",
     "cache": "bf16", "t": [1, 512]},
    {"op": "decode_attention", "d": 128, "hq": 32, "hkv": 8, "block_size": 1, "kv": "f8e4m3",
     "batch": [16], "seq_len": [8192]},
    {"op": "extend_attention", "d": 128, "hq": 32, "hkv": 8, "kv": "f8e4m3", "prefix_len": 4096,
     "seq_len": [512]},
    {"op": "decode_attention", "d": 128, "hq": 32, "hkv": 8, "block_size": 16, "kv": "f8e5m2",
     "batch": [16], "seq_len": [8192]},
    {"op": "extend_attention", "d": 128, "hq": 32, "hkv": 8, "kv": "f8e5m2", "prefix_len": 4096,
     "seq_len": [512]}
  ]})";
  const tools::Workload w = tools::parse_workload(text, "w.json");
  ASSERT_EQ(w.ops.size(), 10u);
  EXPECT_EQ(w.ops[1].kv, "bf16");  // the default cache
  EXPECT_EQ(w.ops[4].kv, "bf16");
  EXPECT_EQ(w.ops[6].kv, "f8e4m3");
  EXPECT_EQ(w.ops[6].block_size, 1);
  EXPECT_EQ(w.ops[7].kv, "f8e4m3");
  EXPECT_EQ(w.ops[8].kv, "f8e5m2");  // vLLM's fp8_e5m2 cache
  EXPECT_EQ(w.ops[8].block_size, 16);
  EXPECT_EQ(w.ops[9].kv, "f8e5m2");
  EXPECT_EQ(w.ops[4].prefix_len, 100);
  EXPECT_EQ(w.ops[4].dv, 32);
  EXPECT_EQ(w.ops[4].seq_len, (std::vector<int64_t>{7, 33}));
  EXPECT_EQ(w.ops[5].style, "gptj");
  EXPECT_EQ(w.ops[5].cache, "bf16");
  EXPECT_EQ(w.ops[5].m, (std::vector<int64_t>{1, 512}));
  EXPECT_EQ(w.ops[0].n, 6144);
  EXPECT_EQ(w.ops[0].act, "silu");
  EXPECT_EQ(w.ops[1].dv, 128);  // dv defaults to d
  EXPECT_EQ(w.ops[1].name, "decode_attention");
  EXPECT_FALSE(w.ops[2].causal);
  // {from, to}: the ends and the powers of two between.
  EXPECT_EQ(w.ops[3].m, (std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64}));
  const tools::Workload back = tools::parse_workload(tools::workload_json(w), "back.json");
  EXPECT_EQ(back, w);
}

TEST(TuneWorkload, BadFieldsNamed) {
  auto parse = [](const std::string& ops) {
    return tools::parse_workload(R"({"ops": [)" + ops + "]}", "w.json");
  };
  expect_tilejit_error([&] { parse(R"({"op": "gemm", "n": -1, "k": 8, "m": [1]})"); },
                       "w.json: ops[0].n: -1; allowed: an integer in [1, ");
  expect_tilejit_error([&] { parse(R"({"op": "gemm", "n": 8, "m": [1]})"); }, "ops[0].k: missing");
  expect_tilejit_error([&] { parse(R"({"op": "gemm", "n": 8, "k": 8, "mm": [1]})"); },
                       "ops[0].mm: not a field of op gemm; allowed: n, k,");
  expect_tilejit_error(
      [&] { parse(R"({"op": "gemm", "n": 8, "k": 8, "m": [1], "format": "int4"})"); },
      "ops[0].format: \"int4\"; allowed: bf16");
  expect_tilejit_error([&] { parse(R"({"op": "gemm", "n": 8, "k": 8, "m": [1], "act": "tanh"})"); },
                       "ops[0].act: \"tanh\"; allowed: none, relu, silu");
  expect_tilejit_error([&] { parse(R"({"op": "gemm", "n": 8, "k": 8, "m": []})"); }, "ops[0].m:");
  expect_tilejit_error([&] { parse(R"({"op": "conv", "n": 8})"); },
                       "ops[0].op: \"conv\"; allowed: gemm, decode_attention");
  expect_tilejit_error(
      [&] {
        parse(
            R"({"op": "decode_attention", "d": 64, "hq": 6, "hkv": 4, "batch": [1], "seq_len": [8]})");
      },
      "ops[0].hq: 6; decode_attention: Hq=6 (q) and Hkv=4 (k); allowed: Hq a multiple of Hkv");
  expect_tilejit_error(
      [&] {
        parse(R"({"op": "decode_attention", "d": 64, "hq": 4, "hkv": 4, "kv": "fp8", "batch": [1],
                  "seq_len": [8]})");
      },
      "ops[0].kv: \"fp8\"; allowed: bf16, f8e4m3, f8e5m2");
  expect_tilejit_error(
      [&] {
        parse(R"({"op": "prefill_attention", "d": 64, "hq": 4, "hkv": 4, "kv": "f8e4m3",
                  "seq_len": [8]})");
      },
      "ops[0].kv: not a field of op prefill_attention");
  expect_tilejit_error(
      [&] { parse(R"({"op": "moe", "e": 4, "topk": 5, "h": 64, "i": 64, "t": [1]})"); },
      "ops[0].topk: 5; allowed: an integer in [1, 4]");
  expect_tilejit_error(
      [&] { parse(R"({"op": "rope", "d": 64, "hq": 4, "style": "yarn", "t": [1]})"); },
      "ops[0].style: \"yarn\"; allowed: neox, gptj");
  expect_tilejit_error(
      [&] {
        parse(R"({"op": "extend_attention", "d": 64, "hq": 4, "hkv": 4, "prefix_len": -3,
                  "seq_len": [1]})");
      },
      "ops[0].prefix_len: -3; allowed: an integer in [0, ");
  expect_tilejit_error([&] { tools::parse_workload("{\"ops\": [\n  {\"op\": }]}", "w.json"); },
                       "w.json:2: error: not valid JSON");
}

// Each op's values under the library's own rules (the operators' checks,
// quoted), not only the parser's ranges: these passed the parser, and tune
// measured the ops before them and then died on the operator's Error, which
// named neither the file nor the op.
TEST(TuneWorkload, LibraryRulesChecked) {
  auto parse = [](const std::string& ops) {
    return tools::parse_workload(
        R"({"ops": [{"op": "gemm", "n": 8, "k": 8, "m": [1]}, )" + ops + "]}", "w.json");
  };
  for (const char* op : {"decode_attention", "extend_attention", "prefill_attention"}) {
    const std::string rest = std::string(op) == "prefill_attention" ? R"("seq_len": [8])"
                             : std::string(op) == "decode_attention"
                                 ? R"("batch": [1], "seq_len": [8])"
                                 : R"("prefix_len": 8, "seq_len": [8])";
    for (int d : {65, 578, 1000})
      expect_tilejit_error(
          [&] {
            parse(fmt::format(R"({{"op": "{}", "d": {}, "hq": 4, "hkv": 1, {}}})", op, d, rest));
          },
          fmt::format("w.json: ops[1].d: {}; {}: D (q.shape[2])={}; allowed: an even size in [2, "
                      "576]",
                      d, op, d));
    expect_tilejit_error(
        [&] {
          parse(
              fmt::format(R"({{"op": "{}", "d": 64, "dv": 63, "hq": 4, "hkv": 1, {}}})", op, rest));
        },
        "w.json: ops[1].dv: 63; ");
    expect_tilejit_error(
        [&] {
          parse(fmt::format(R"({{"op": "{}", "d": 64, "hq": 8192, "hkv": 8192, {}}})", op, rest));
        },
        fmt::format("w.json: ops[1].hq: 8192; {}: Hq=8192 (q) and Hkv=8192 (k); allowed: Hq a "
                    "multiple of Hkv, both in 1 .. 4096",
                    op));
  }
  expect_tilejit_error(
      [&] { parse(R"({"op": "rope", "d": 64, "hq": 4, "hkv": 1, "rotary_dim": 33, "t": [1]})"); },
      "w.json: ops[1].rotary_dim: 33; rope: rotary_dim=33 with D=64, ndim=1; allowed: a multiple "
      "of 2·ndim in [2, D]");
  expect_tilejit_error([&] { parse(R"({"op": "rope", "d": 7, "hq": 4, "t": [1]})"); },
                       "w.json: ops[1].d: 7; rope: q has head size D=7; allowed: even, >= 2");
  expect_tilejit_error([&] { parse(R"({"op": "rope", "d": 64, "hq": 5000, "t": [1]})"); },
                       "w.json: ops[1].hq: 5000; rope: Hq (q.shape[1])=5000; allowed: 1 .. 4096");
  expect_tilejit_error(
      [&] { parse(R"({"op": "moe", "e": 70000, "topk": 2, "h": 32, "i": 32, "t": [1]})"); },
      "w.json: ops[1].e: 70000; pack_experts: E (experts)=70000; allowed: 1 .. 65536");
  // What the operators take still parses: D 66, 576, Dv != D, rotary_dim 0.
  EXPECT_NO_THROW(parse(
      R"({"op": "decode_attention", "d": 576, "dv": 512, "hq": 16, "hkv": 1, "batch": [1], "seq_len": [8]},
         {"op": "prefill_attention", "d": 66, "hq": 4, "hkv": 2, "seq_len": [8]},
         {"op": "rope", "d": 64, "hq": 4, "hkv": 1, "rotary_dim": 32, "t": [1]},
         {"op": "moe", "e": 65536, "topk": 2, "h": 32, "i": 32, "t": [1]})"));
  // --save-workload never writes what tune refuses: the builder's workload
  // goes through the same checks (head_dim 65 was written, then refused).
  nlohmann::json c = {{"hidden_size", 4096},
                      {"intermediate_size", 14336},
                      {"num_attention_heads", 32},
                      {"num_key_value_heads", 8},
                      {"head_dim", 65},
                      {"num_hidden_layers", 32}};
  expect_tilejit_error(
      [&] { tools::workload_from_model_config(c.dump(), "c.json"); },
      "c.json (the workload built from it): ops[4].d: 65; decode_attention: D (q.shape[2])=65");
}

TEST(TuneWorkload, FromModelConfig) {
  const tools::Workload w =
      tools::load_workload(std::string(TILEJIT_EXAMPLES_DIR) + "/tune/llama3-8b.json");
  EXPECT_EQ(w.name, "llama3-8b");
  const std::string cfg = R"({"model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
    "num_key_value_heads": 8, "intermediate_size": 14336})";
  const tools::Workload m = tools::workload_from_model_config(cfg, "config.json");
  ASSERT_GE(m.ops.size(), 4u);
  EXPECT_EQ(m.ops[0].name, "qkv_proj");
  EXPECT_EQ(m.ops[0].n, 6144);  // (32 + 2·8)·128
  EXPECT_EQ(m.ops[2].name, "gate_up_proj");
  EXPECT_EQ(m.ops[2].n, 2 * 14336);
  // The engine's KV cache dtype (a serving flag): decode and extend read it,
  // prefill has no cache; everything else is the same workload.
  const tools::Workload m8 = tools::workload_from_model_config(cfg, "config.json", "f8e4m3");
  ASSERT_EQ(m8.ops.size(), m.ops.size());
  for (size_t i = 0; i < m.ops.size(); ++i) {
    tools::WorkloadOp o = m8.ops[i];
    const bool cache = o.op == "decode_attention" || o.op == "extend_attention";
    EXPECT_EQ(o.kv, cache ? "f8e4m3" : "bf16") << o.op;
    o.kv = m.ops[i].kv;
    EXPECT_EQ(o, m.ops[i]) << o.op;
  }
  const tools::Workload m5 = tools::workload_from_model_config(cfg, "config.json", "f8e5m2");
  ASSERT_EQ(m5.ops.size(), m.ops.size());
  for (size_t i = 0; i < m.ops.size(); ++i) {
    const bool cache = m5.ops[i].op == "decode_attention" || m5.ops[i].op == "extend_attention";
    EXPECT_EQ(m5.ops[i].kv, cache ? "f8e5m2" : "bf16") << m5.ops[i].op;
  }
  expect_tilejit_error([&] { tools::workload_from_model_config(cfg, "config.json", "e4m3"); },
                       "--kv-cache-dtype: \"e4m3\"; allowed: bf16, f8e4m3, f8e5m2");
  // The shipped example is what the config builds (the file documents the workload).
  tools::Workload from_example = tools::workload_from_model_config(
      [] {
        std::ifstream in(std::string(TILEJIT_EXAMPLES_DIR) + "/tune/llama3-8b-config.json");
        return std::string(std::istreambuf_iterator<char>(in), {});
      }(),
      "llama3-8b-config.json");
  from_example.name = w.name;
  EXPECT_EQ(from_example, w);
  const std::string moe =
      R"({"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768})";
  const tools::Workload q = tools::workload_from_model_config(moe, "qwen.json");
  bool has_moe = false;
  for (const auto& o : q.ops)
    if (o.op == "moe") has_moe = o.e == 128 && o.topk == 8 && o.i == 768 && o.h == 2048;
  EXPECT_TRUE(has_moe);
  expect_tilejit_error(
      [&] {
        tools::workload_from_model_config(
            R"({"hidden_size": 64, "num_attention_heads": 2, "intermediate_size": 64,
                "quantization_config": {"quant_method": "hqq"}})",
            "q.json");
      },
      "q.json: quantization_config.quant_method: \"hqq\"; allowed:");
  expect_tilejit_error(
      [&] { tools::workload_from_model_config(R"({"num_attention_heads": 2})", "c.json"); },
      "hidden_size: missing");
}

// A config field of the wrong JSON type, a model part the builder does not
// model, a head size that does not divide: an Error naming the field, never
// a json exception or a silently wrong workload.
TEST(TuneWorkload, ModelConfigFieldsChecked) {
  const std::string base =
      R"("hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
         "intermediate_size": 14336)";
  auto cfg = [&](const std::string& extra) {
    return tools::workload_from_model_config("{" + base + extra + "}", "c.json");
  };
  expect_tilejit_error([&] { cfg(R"(, "model_type": 5)"); },
                       "c.json: model_type: 5; allowed: a string");
  expect_tilejit_error([&] { cfg(R"(, "hidden_act": [1])"); },
                       "c.json: hidden_act: [1]; allowed: a string");
  EXPECT_EQ(cfg(R"(, "model_type": null, "hidden_act": null)").name, "model");
  // Whole configs and the Error each must raise.
  const std::pair<const char*, const char*> refused[] = {
      // DeepSeek-V3: MLA attention is refused by name (not hq heads of 7168 / 128).
      {R"({"hidden_size": 7168, "num_attention_heads": 128, "intermediate_size": 18432,
           "n_routed_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
           "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
           "v_head_dim": 128, "quantization_config": {"quant_method": "fp8",
           "weight_block_size": [128, 128]}})",
       "c.json: kv_lora_rank: 512: not modelled by --model-config"},
      // No head_dim and hidden / heads not whole: both fields named.
      {R"({"hidden_size": 4000, "num_attention_heads": 48, "intermediate_size": 64})",
       "c.json: hidden_size: 4000 with num_attention_heads=48 and no head_dim"},
      // What tune would refuse is refused here (parse_workload's checks).
      {R"({"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 5,
           "head_dim": 128, "intermediate_size": 64})",
       "hq: 32; decode_attention: Hq=32 (q) and Hkv=5 (k); allowed: Hq a multiple of Hkv"},
      {R"({"hidden_size": 1048576, "num_attention_heads": 1024, "num_key_value_heads": 1024,
           "head_dim": 1024, "intermediate_size": 64})",
       "ops[0].n: 3145728; allowed: an integer in [1, 1048576]"},
      // Families it does not model (Phi-2's non-gated MLP, SigLIP's encoder),
      // a softcap (its attention kernels are other ones), a partial rotary
      // factor that leaves no even count of dims: refused by name, never
      // built as a Llama.
      {R"({"model_type": "phi", "hidden_size": 2560, "num_attention_heads": 32,
           "intermediate_size": 10240, "partial_rotary_factor": 0.4, "hidden_act": "gelu_new"})",
       "c.json: model_type: \"phi\": not modelled by --model-config"},
      {R"({"model_type": "siglip_vision_model", "hidden_size": 1152, "num_attention_heads": 16,
           "intermediate_size": 4304})",
       "c.json: model_type: \"siglip_vision_model\": not modelled"},
      {R"({"model_type": "gemma2", "hidden_size": 2304, "num_attention_heads": 8,
           "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 9216,
           "attn_logit_softcapping": 50.0})",
       "c.json: attn_logit_softcapping: 50.0: not modelled by --model-config"},
      {R"({"model_type": "stablelm", "hidden_size": 2560, "num_attention_heads": 32,
           "intermediate_size": 6912, "partial_rotary_factor": 0.33})",
       "c.json: partial_rotary_factor: 0.33 with head_dim 80"},
  };
  for (const auto& [config, error] : refused)
    expect_tilejit_error([&] { tools::workload_from_model_config(config, "c.json"); }, error);
  // Projection biases are modelled (their kind is part of the kernels' key):
  // Qwen2's q/k/v always, attention_bias (q, k, v, o), mlp_bias; Cohere's
  // rope is GPT-J's; a Gemma-2 config without attn_logit_softcapping is
  // softcapped (its config class's default 50): refused.
  auto op_of = [](const tools::Workload& w, const std::string& name) {
    for (const auto& o : w.ops)
      if (o.name == name) return o;
    ADD_FAILURE() << "no op " << name;
    return tools::WorkloadOp{};
  };
  const tools::Workload q2 = tools::workload_from_model_config(
      R"({"model_type": "qwen2", "hidden_size": 896, "num_attention_heads": 14,
          "num_key_value_heads": 2, "intermediate_size": 4864})",
      "qwen2.json");
  EXPECT_EQ(op_of(q2, "qkv_proj").bias, "bf16");
  EXPECT_EQ(op_of(q2, "o_proj").bias, "none");
  EXPECT_EQ(op_of(q2, "gate_up_proj").bias, "none");
  const tools::Workload lb =
      cfg(R"(, "model_type": "llama", "attention_bias": true, "mlp_bias": true)");
  for (const char* n : {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"})
    EXPECT_EQ(op_of(lb, n).bias, "bf16") << n;
  expect_tilejit_error([&] { cfg(R"(, "attention_bias": 1)"); },
                       "c.json: attention_bias: 1; allowed: true, false");
  EXPECT_EQ(op_of(cfg(R"(, "model_type": "cohere")"), "rope").style, "gptj");
  EXPECT_EQ(op_of(cfg(R"(, "model_type": "llama")"), "rope").style, "neox");
  expect_tilejit_error([&] { cfg(R"(, "model_type": "gemma2", "head_dim": 128)"); },
                       "c.json: attn_logit_softcapping: absent (50 for gemma2)");
  EXPECT_NO_THROW(
      cfg(R"(, "model_type": "gemma2", "head_dim": 128, "attn_logit_softcapping": null)"));
  // A partial rotary factor is modelled: the rope op rotates its share.
  const tools::Workload slm = tools::workload_from_model_config(
      R"({"model_type": "stablelm", "hidden_size": 2560, "num_attention_heads": 32,
          "intermediate_size": 6912, "partial_rotary_factor": 0.25})",
      "stablelm.json");
  ASSERT_EQ(slm.ops.back().op, "rope");
  EXPECT_EQ(slm.ops.back().rotary_dim, 20);
  // compressed-tensors block scales of 0: refused (was per channel).
  expect_tilejit_error(
      [&] {
        cfg(R"(, "quantization_config": {"quant_method": "compressed-tensors", "config_groups":
              {"g": {"weights": {"num_bits": 8, "type": "float", "block_structure": [0, 0]}}}})");
      },
      "block_structure: [0,0]; allowed: [block_n, block_k], both >= 1");
}

// Mixtral and GPT-OSS size their experts by intermediate_size and count them
// as num_local_experts (GPT-OSS: experts_per_token, mxfp4 experts).
TEST(TuneWorkload, MixtralAndGptOssConfigs) {
  const tools::Workload mix = tools::workload_from_model_config(
      R"({"model_type": "mixtral", "hidden_size": 4096, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
          "num_experts_per_tok": 2})",
      "mixtral.json");
  const tools::Workload oss = tools::workload_from_model_config(
      R"({"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
          "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880,
          "num_local_experts": 32, "experts_per_token": 4,
          "quantization_config": {"quant_method": "mxfp4"}})",
      "gpt-oss-20b.json");
  auto moe_of = [](const tools::Workload& w) {
    tools::WorkloadOp m;
    for (const auto& o : w.ops) {
      EXPECT_NE(o.name, "gate_up_proj");  // no dense MLP
      if (o.op == "moe") m = o;
    }
    return m;
  };
  const tools::WorkloadOp a = moe_of(mix), b = moe_of(oss);
  EXPECT_EQ(
      std::tie(a.e, a.topk, a.h, a.i, a.format),
      std::make_tuple(int64_t{8}, int64_t{2}, int64_t{4096}, int64_t{14336}, std::string("bf16")));
  EXPECT_EQ(
      std::tie(b.e, b.topk, b.h, b.i, b.format),
      std::make_tuple(int64_t{32}, int64_t{4}, int64_t{2880}, int64_t{2880}, std::string("mxfp4")));
  EXPECT_EQ(oss.ops[0].n, (64 + 2 * 8) * 64);  // qkv_proj, bf16 (GPT-OSS keeps attention bf16)
  EXPECT_EQ(oss.ops[0].format, "bf16");
  expect_tilejit_error(
      [&] {
        tools::workload_from_model_config(
            R"({"hidden_size": 64, "num_attention_heads": 2, "num_local_experts": 4,
                "num_experts_per_tok": 2})",
            "m.json");
      },
      "m.json: intermediate_size: missing");
}

TEST(TuneWorkload, QuantizedFormatsRoundTrip) {
  const std::string text = R"({"name": "q", "ops": [
    {"op": "gemm", "name": "a", "n": 256, "k": 512, "format": "int4_awq", "group_size": 64, "m": [1, 64]},
    {"op": "gemm", "name": "g", "n": 256, "k": 512, "format": "int4_gptq", "group_size": -1,
     "desc_act": true, "m": [1]},
    {"op": "gemm", "name": "f", "n": 256, "k": 512, "format": "fp8_e4m3", "block_n": 128, "block_k": 128, "m": [1]},
    {"op": "gemm", "name": "c", "n": 256, "k": 512, "format": "fp8_e4m3", "m": [1]},
    {"op": "gemm", "name": "i", "n": 256, "k": 512, "format": "int8", "m": [1]},
    {"op": "gemm", "name": "x", "n": 256, "k": 512, "format": "mxfp4", "m": [1]},
    {"op": "moe", "name": "e", "e": 8, "topk": 2, "h": 256, "i": 128, "format": "int4_gptq", "sym": false, "t": [1]}
  ]})";
  const tools::Workload w = tools::parse_workload(text, "q.json");
  ASSERT_EQ(w.ops.size(), 7u);
  EXPECT_EQ(w.ops[0].format, "int4_awq");
  EXPECT_EQ(w.ops[0].group_size, 64);
  EXPECT_FALSE(w.ops[0].sym);  // AWQ checkpoints carry zero points
  EXPECT_TRUE(w.ops[1].desc_act);
  EXPECT_TRUE(w.ops[1].sym);
  EXPECT_EQ(w.ops[2].block_k, 128);
  EXPECT_EQ(w.ops[3].block_n, 0);
  EXPECT_FALSE(w.ops[6].sym);
  EXPECT_EQ(tools::parse_workload(tools::workload_json(w), "back.json"), w);
  // Every format's synthetic checkpoint packs, in its format.
  for (const tools::WorkloadOp& o : w.ops) {
    if (o.op != "gemm") continue;
    const PackedWeight p = tools::synthetic_weight(o, o.n, o.k, 7);
    EXPECT_STREQ(weight_format_name(p.format()), o.format.c_str());
  }
  const PackedExperts pe = tools::synthetic_experts(w.ops[6], 8, 256, 128, ExpertProj::down, 3);
  EXPECT_EQ(pe.format(), WeightFormat::int4_gptq);
}

TEST(TuneWorkload, BadFormatFieldsNamed) {
  auto parse = [](const std::string& op) {
    tools::parse_workload(R"({"ops": [)" + op + "]}", "w.json");
  };
  const std::string g = R"({"op": "gemm", "n": 64, "k": 256, "m": [1], )";
  expect_tilejit_error([&] { parse(g + R"("format": "int3"})"); },
                       "w.json: ops[0].format: \"int3\"; allowed: bf16, int8, fp8_e4m3, int4_awq, "
                       "int4_gptq, mxfp4");
  // The group size's rule is pack_weight's, quoted.
  expect_tilejit_error([&] { parse(g + R"("format": "int4_gptq", "group_size": 0})"); },
                       "ops[0].group_size: 0; pack_weight:");
  expect_tilejit_error([&] { parse(g + R"("format": "fp8_e4m3", "block_n": 128, "block_k": 3})"); },
                       "ops[0].block_k: block_n=128 block_k=3; pack_weight:");
  expect_tilejit_error([&] { parse(g + R"("format": "fp8_e4m3", "block_n": 128})"); },
                       "ops[0].block_k: 0 with the other block size set");
  expect_tilejit_error([&] { parse(g + R"("format": "int8", "group_size": 128})"); },
                       "ops[0].group_size: given with format int8; allowed: only with format "
                       "int4_awq or int4_gptq");
  expect_tilejit_error([&] { parse(g + R"("format": "int4_awq", "desc_act": true})"); },
                       "ops[0].desc_act: true with format int4_awq");
}

TEST(TuneWorkload, QuantizationConfig) {
  auto cfg = [](const std::string& q) {
    return tools::workload_from_model_config(
        R"({"hidden_size": 256, "num_attention_heads": 2, "intermediate_size": 512,
            "quantization_config": )" +
            q + "}",
        "c.json");
  };
  auto op = [](const tools::Workload& w, const std::string& name) {
    for (const tools::WorkloadOp& o : w.ops)
      if (o.name == name) return o;
    ADD_FAILURE() << "no op " << name;
    return tools::WorkloadOp{};
  };
  tools::Workload w =
      cfg(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true})");
  EXPECT_EQ(op(w, "qkv_proj").format, "int4_awq");
  EXPECT_EQ(op(w, "down_proj").group_size, 128);
  EXPECT_FALSE(op(w, "down_proj").sym);
  w = cfg(
      R"({"quant_method": "gptq", "bits": 4, "group_size": 64, "desc_act": true, "sym": true})");
  EXPECT_EQ(op(w, "gate_up_proj").format, "int4_gptq");
  EXPECT_EQ(op(w, "gate_up_proj").group_size, 64);
  EXPECT_TRUE(op(w, "gate_up_proj").desc_act);
  EXPECT_TRUE(op(w, "gate_up_proj").sym);
  // AutoRound: int4 in a GPTQ or AWQ packing (packing_format; older exports
  // "intel/auto-round" with backend).
  w = cfg(R"({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": false,
              "data_type": "int", "packing_format": "auto_round:auto_gptq"})");
  EXPECT_EQ(op(w, "gate_up_proj").format, "int4_gptq");
  EXPECT_FALSE(op(w, "gate_up_proj").sym);
  w = cfg(R"({"quant_method": "intel/auto-round", "bits": 4, "group_size": 32,
              "backend": "auto_round:auto_awq"})");
  EXPECT_EQ(op(w, "o_proj").format, "int4_awq");
  EXPECT_EQ(op(w, "o_proj").group_size, 32);
  EXPECT_TRUE(op(w, "o_proj").sym);
  expect_tilejit_error(
      [&] { cfg(R"({"quant_method": "auto-round", "bits": 4, "data_type": "mx_fp"})"); },
      "quantization_config.data_type: \"mx_fp\"; allowed: \"int\"");
  expect_tilejit_error([&] { cfg(R"({"quant_method": "auto-round", "bits": 2})"); },
                       "quantization_config.bits: 2; allowed: 4");
  w = cfg(
      R"({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]})");
  EXPECT_EQ(op(w, "o_proj").format, "fp8_e4m3");
  EXPECT_EQ(op(w, "o_proj").block_n, 128);
  EXPECT_EQ(op(w, "o_proj").block_k, 128);
  w = cfg(R"({"quant_method": "fp8"})");
  EXPECT_EQ(op(w, "o_proj").block_n, 0);  // per channel
  w = cfg(R"({"quant_method": "mxfp4"})");
  EXPECT_EQ(op(w, "qkv_proj").format, "bf16");  // GPT-OSS: attention unquantized
  EXPECT_EQ(op(w, "down_proj").format, "mxfp4");
  w = cfg(R"({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights":
      {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": true}}}})");
  EXPECT_EQ(op(w, "qkv_proj").format, "int8");
  w = cfg(R"({"quant_method": "w8a8_int8"})");
  EXPECT_EQ(op(w, "down_proj").format, "int8");
  // MoE: experts in the format, the router bf16.
  const tools::Workload moe = tools::workload_from_model_config(
      R"({"hidden_size": 256, "num_attention_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 128, "quantization_config": {"quant_method": "gptq", "bits": 4}})",
      "m.json");
  EXPECT_EQ(op(moe, "experts").format, "int4_gptq");
  EXPECT_EQ(op(moe, "router").format, "bf16");
  // The shipped AWQ example is what its config builds.
  auto read = [](const std::string& f) {
    std::ifstream in(std::string(TILEJIT_EXAMPLES_DIR) + "/tune/" + f);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(tools::workload_from_model_config(read("qwen3-8b-awq-config.json"), "qwen3-awq"),
            tools::parse_workload(read("qwen3-8b-awq.json"), "qwen3-8b-awq.json"));
  expect_tilejit_error([&] { cfg(R"({"quant_method": "bitsandbytes"})"); },
                       "c.json: quantization_config.quant_method: \"bitsandbytes\"; allowed: awq, "
                       "gptq, auto-round, fp8, mxfp4, compressed-tensors, w8a8_int8");
  expect_tilejit_error([&] { cfg(R"({"quant_method": "gptq", "sym": "yes"})"); },
                       "c.json: quantization_config (gptq):");
  expect_tilejit_error([&] { cfg(R"({"quant_method": "gptq", "bits": 8})"); },
                       "quantization_config.bits: 8; allowed: 4");
  expect_tilejit_error([&] { cfg(R"({"quant_method": "gptq", "bits": 4, "group_size": 0})"); },
                       "group_size: 0; pack_weight:");
}

// ---- the database ------------------------------------------------------------

TEST(TuningDb, RoundTrip) {
  jit::TuningDb db;
  jit::TunedEntry g = gemm_entry(Isa::avx512, 256, 512, 16, {{"mr", 4}, {"task_rows", 8}});
  g.default_us = 12.5;
  g.tuned_us = 10.25;
  g.noise_us = 0.5;
  g.candidates = 7;
  db.put(g);
  jit::TunedEntry d;
  d.family = "decode_attention";
  d.shape = jit::decode_shape_class(Isa::avx512, 2, 128, 128, 32, 8, 16, DType::bf16, 1, 4096);
  d.knobs = {{"splits", 4}};
  d.cpu = "another-cpu";
  d.version = "0.0.0-old";
  db.put(d);
  jit::TunedEntry none = gemm_entry(Isa::avx512, 256, 512, 1);  // measured: the default won
  db.put(none);
  const std::string path = temp_path("db.json");
  db.save(path);
  const jit::TuningDb back = jit::TuningDb::load(path);
  ASSERT_EQ(back.entries.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(back.entries[i].id(), db.entries[i].id());
    EXPECT_EQ(back.entries[i].knobs, db.entries[i].knobs);
    EXPECT_EQ(back.entries[i].cpu, db.entries[i].cpu);
    EXPECT_EQ(back.entries[i].version, db.entries[i].version);
  }
  EXPECT_EQ(back.entries[0].tuned_us, 10.25);
  EXPECT_EQ(back.entries[0].candidates, 7);
  // put replaces the entry of the same id, machine and build.
  jit::TuningDb again = back;
  g.knobs = {{"mr", 2}};
  again.put(g);
  EXPECT_EQ(again.entries.size(), 3u);
  EXPECT_EQ(again.find(g.id())->knobs.at("mr"), 2);
  fs::remove(path);
}

// A host's small-stack thread (64 KiB: musl's default is 128, some engines'
// pools use less) loads a database: the file reader kept a 64 KiB buffer on
// the stack, so the call died by SIGSEGV or corrupted the heap (an outside
// tester's find). In a child, on 48 KiB.
TEST(TuningDb, LoadsOnASmallStackThread) {
  if (test::kUnderAsan || test::kUnderTsan)
    GTEST_SKIP() << "the sanitizers' instrumentation takes stack of its own";
  jit::TuningDb db;
  db.put(gemm_entry(Isa::avx512, 256, 512, 16, {{"mr", 4}, {"task_rows", 8}}));
  static std::string path;
  path = temp_path("db.json");
  db.save(path);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::alarm(60);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    if (pthread_attr_setstacksize(&attr, 48 << 10) != 0) ::_exit(10);
    pthread_t t;
    static int rc = 11;
    auto body = [](void*) -> void* {
      try {
        load_tuning_db(path);
        rc = jit::TuningDb::load(path).entries.size() == 1 ? 0 : 12;
      } catch (...) {
        rc = 13;
      }
      return nullptr;
    };
    if (pthread_create(&t, &attr, body, nullptr) != 0) ::_exit(14);
    pthread_join(t, nullptr);
    ::_exit(rc);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  if (WIFEXITED(status)) {
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  fs::remove(path);
}

TEST(TuningDb, StaleEntriesIgnored) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t n = 192, k = 96, m = 7;
  jit::TuningDb db;
  jit::TunedEntry other_cpu = gemm_entry(path, n, k, m, {{"task_rows", 32}});
  other_cpu.cpu = "AuthenticAMD-25-17-1-other";
  db.put(other_cpu);
  jit::TunedEntry other_build = gemm_entry(path, n, k + 32, m, {{"task_rows", 32}});
  other_build.version = "0.0.1-somewhere-else";
  db.put(other_build);
  int64_t stale = 0;
  EXPECT_TRUE(db.current(&stale).entries.empty());
  EXPECT_EQ(stale, 2);
  jit::install_tuning_db(db, "stale test");
  EXPECT_EQ(jit::find_tuned("gemm", other_cpu.shape), nullptr);
  EXPECT_EQ(jit::find_tuned("gemm", other_build.shape), nullptr);
  EXPECT_FALSE(jit::tuning_db_active());
  jit::install_tuning_db({}, "");
}

TEST(TuningDb, CorruptFileNamesTheLine) {
  const std::string path = temp_path("bad.json");
  write_file(path,
             "{\n \"tilejit_tuning_db\": 1,\n \"entries\": [ {\"family\": \"gemm\",, } ]\n}\n");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":3: error: the tuning database is not valid JSON");
  write_file(path, "[1, 2]\n");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":1: error: not a tilejit tuning database");
  // A well-formed entry with a knob outside its range: the entry's line.
  jit::TuningDb db;
  db.put(gemm_entry(Isa::avx512, 256, 512, 16, {{"mr", 4}}));
  db.put(gemm_entry(Isa::avx512, 256, 512, 64, {{"mr", 40}}));
  db.save(path);
  std::ifstream in(path);
  std::string line;
  int64_t n = 0, second = 0, opened = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line == "  {" && ++opened == 2) second = n;
  }
  ASSERT_GT(second, 0);
  expect_tilejit_error(
      [&] { jit::TuningDb::load(path); },
      fmt::format("{}:{}: error: tuning database entry 1: knob mr=40; allowed: 1 .. 32", path,
                  second));
  // In range for the knob table but not for this plan: plan_gemm's rule.
  jit::TuningDb db2;
  db2.put(gemm_entry(Isa::avx512, 256, 512, 16, {{"mr", 9}}));
  db2.save(path);
  expect_tilejit_error([&] { jit::TuningDb::load(path); }, "tuned mr=9 for gemm_avx512");
  jit::TuningDb db3;
  db3.put(gemm_entry(Isa::avx512, 256, 512, 16, {{"mr", 4}, {"task_rows", 6}}));
  db3.save(path);
  expect_tilejit_error([&] { jit::TuningDb::load(path); }, "tuned task_rows=6");
  jit::TuningDb db4;
  db4.put(gemm_entry(Isa::avx512, 256, 512, 16, {{"unroll", 4}}));
  db4.save(path);
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       "knob 'unroll' for family gemm; allowed: mr (1 .. 32), task_rows");
  expect_tilejit_error([&] { load_tuning_db(path + ".missing"); },
                       "cannot read the tuning database");
  fs::remove(path);
}

// An outside tester's files: a number past double's range was nlohmann's
// out_of_range escaping load_tuning_db (the C API's TILEJIT_INTERNAL_ERROR,
// and every call failing under TILEJIT_TUNING_DB), and bytes after a NUL
// were ignored (nlohmann reads NUL as the end of the input).
TEST(TuningDb, OverflowingNumbersAndNulBytesAreErrorsWithTheirLine) {
  const std::string path = temp_path("overflow.json");
  write_file(path, "{\"tilejit_tuning_db\": 1,\n \"entries\": [],\n \"x\": 1e400}\n");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":3: error: the tuning database is not valid JSON");
  expect_tilejit_error([&] { load_tuning_db(path); }, "number overflow");
  write_file(path, std::string("{\"tilejit_tuning_db\": 1, \"entries\": []}\n\0not JSON", 49));
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":2: error: the tuning database is not valid JSON: a NUL byte");
  fs::remove(path);
}

// A field of the wrong JSON type in an entry of this machine: an Error
// naming the file, the entry's line and the field (was a json exception).
TEST(TuningDb, WrongTypesNamed) {
  const std::string path = temp_path("types.json");
  const jit::TunedEntry e = gemm_entry(Isa::avx512, 256, 512, 16);
  auto with = [&](const std::string& measured, const std::string& head = "1") {
    nlohmann::json j = nlohmann::json::parse(R"({"entries": []})");
    j["tilejit_tuning_db"] = nlohmann::json::parse(head);
    nlohmann::json entry{{"family", e.family},
                         {"knobs", nlohmann::json::object()},
                         {"cpu", e.cpu},
                         {"tilejit", e.version},
                         {"measured", nlohmann::json::parse(measured)}};
    for (const auto& [k, v] : e.shape.fields) entry["shape"][k] = v;
    j["entries"].push_back(entry);
    write_file(path, j.dump(1));
  };
  with(R"({"default_us": "fast"})");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":3: error: tuning database entry 0: measured.default_us = \"fast\"");
  with("[1, 2]");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       "entry 0: field 'measured' = [1,2]; allowed: an object");
  with(R"({"candidates": 1.5})");
  expect_tilejit_error([&] { jit::TuningDb::load(path); }, "measured.candidates = 1.5");
  with(R"({"default_us": -3.5})");  // a time: a negative one was taken
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       "measured.default_us = -3.5; allowed: a number >= 0 (microseconds)");
  with(R"({"candidates": 3})");
  EXPECT_EQ(jit::TuningDb::load(path).entries.at(0).candidates, 3);
  // 2^32 + 1 is not version 1 (get<int> truncated it).
  with("{}", "4294967297");
  expect_tilejit_error([&] { jit::TuningDb::load(path); }, "not a tilejit tuning database");
  fs::remove(path);
}

// An entry's line when another key with nested objects comes before "entries".
TEST(TuningDb, LineAfterNestedKey) {
  const std::string path = temp_path("nested.json");
  write_file(path,
             "{\"meta\": {\"host\": {\"a\": 1}, \"x\": {\"b\": [{\"c\": 2}]}},\n"
             " \"tilejit_tuning_db\": 1,\n"
             " \"entries\": [\n"
             "  {\"family\": \"gemm\", \"cpu\": \"c\", \"tilejit\": \"v\", \"shape\": {}, "
             "\"knobs\": {}},\n"
             "  {\"family\": 5}\n"
             " ]}\n");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path + ":5: error: tuning database entry 1: field 'family'");
  fs::remove(path);
}

// Another CPU's or build's entries are kept verbatim and not validated:
// families, knobs and fields this build does not know round-trip.
TEST(TuningDb, StaleEntriesKeptVerbatim) {
  const std::string path = temp_path("stale.json");
  const std::string foreign =
      R"({"family": "mla_attention", "cpu": "other-cpu", "tilejit": "9.9.9",
          "shape": {"d": "576", "new_field": [1]}, "knobs": {"nr": 32, "x": "y"},
          "measured": {"default_us": "n/a"}, "extra": true})";
  const std::string foreign_gemm =
      R"({"family": "gemm", "cpu": "other-cpu", "tilejit": "9.9.9",
          "shape": {"m": "1", "wide": "1"}, "knobs": {"nr": 32}})";
  write_file(path,
             "{\"tilejit_tuning_db\": 1, \"entries\": [" + foreign + ",\n" + foreign_gemm + "]}");
  jit::TuningDb db = jit::TuningDb::load(path);
  ASSERT_EQ(db.entries.size(), 2u);
  int64_t stale = 0;
  EXPECT_TRUE(db.current(&stale).entries.empty());
  EXPECT_EQ(stale, 2);
  db.put(gemm_entry(Isa::avx512, 256, 512, 16));
  db.save(path);
  const auto back = nlohmann::json::parse(std::ifstream(path));
  ASSERT_EQ(back["entries"].size(), 3u);
  EXPECT_EQ(back["entries"][0], nlohmann::json::parse(foreign));
  EXPECT_EQ(back["entries"][1], nlohmann::json::parse(foreign_gemm));
  // An entry whose identity cannot be read is still an error.
  write_file(path, R"({"tilejit_tuning_db": 1, "entries": [{"family": "gemm", "cpu": 3}]})");
  expect_tilejit_error([&] { jit::TuningDb::load(path); }, "field 'cpu' missing or not a string");
  fs::remove(path);
}

// A database's structure is bounded before it is parsed: 5M nested '['
// within the byte cap cost GBs (and a std::bad_alloc escaped load under a
// low ulimit -v); 4M tiny items as much. Both are an Error naming the file
// and the line before nlohmann builds anything.
TEST(TuningDb, StructureBounded) {
  const std::string path = temp_path("deep.json");
  write_file(path, "{\"tilejit_tuning_db\": 1, \"entries\": [\n" + std::string(1000000, '[') +
                       std::string(1000000, ']') + "]}");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       path +
                           ":2: error: the tuning database nests more than 16 JSON objects and "
                           "arrays here; allowed: at most 16 levels");
  expect_tilejit_error([&] { load_tuning_db(path); }, "nests more than 16");
  std::string many = "{\"tilejit_tuning_db\": 1, \"entries\": [0";
  for (int64_t i = 0; i < jit::kMaxTuningDbValues; ++i) many += ",0";
  write_file(path, many + "]}");
  expect_tilejit_error([&] { jit::TuningDb::load(path); },
                       "error: the tuning database has more than 4194304 JSON objects, arrays and "
                       "items; allowed: at most 4194304");
  // 16 levels are allowed (another build's stale entry may nest its fields).
  std::string deep = "{}";
  for (int i = 0; i < 11; ++i) deep = "[" + deep + "]";
  write_file(path, R"({"tilejit_tuning_db": 1, "entries": [{"family": "x", "cpu": "c", )"
                   R"("tilejit": "t", "shape": {"a": )" +
                       deep + "}}]}");
  EXPECT_EQ(jit::TuningDb::load(path).entries.size(), 1u);
  // save checks what it writes the same way: a stale entry nesting deeper
  // than a file may is an Error, and the file is unchanged.
  const std::string before = read_text(path);
  jit::TuningDb db;
  jit::TunedEntry e;
  e.family = "x";
  e.cpu = "c";
  e.version = "t";
  e.verbatim = R"({"family": "x", "cpu": "c", "tilejit": "t", "shape": {"a": )" +
               std::string(20, '[') + std::string(20, ']') + "}}";
  db.entries.push_back(e);
  expect_tilejit_error([&] { db.save(path); }, "nothing written (the file is unchanged)");
  EXPECT_EQ(read_text(path), before);
  fs::remove(path);
  fs::remove(path + ".lock");
}

// A save writes what load reads: indented while that fits the 64 MiB cap,
// compact past it (tune rewrote a 63 MB database of other machines'
// entries indented, 101 MB, which neither the library nor tune then read),
// and an Error before replacing the file when even that does not fit.
TEST(TuningDb, SaveKeepsTheByteCap) {
  const std::string path = temp_path("big.json");
  // Stale entries in the compact form save writes (sorted keys, no spaces):
  // the file's size is the compact text's.
  auto stale_db = [](int64_t bytes) {
    const std::string head = R"({"entries":[)", tail = "],\"tilejit_tuning_db\":1}\n";
    const int64_t n = 30000;
    const std::string pre = R"({"cpu":"c","family":"x","pad":")", post = R"(","tilejit":"t"})";
    const int64_t fixed = static_cast<int64_t>(head.size() + tail.size()) + (n - 1) +
                          n * static_cast<int64_t>(pre.size() + post.size());
    const int64_t pad = (bytes - fixed) / n, extra = (bytes - fixed) % n;
    std::string text = head;
    text.reserve(static_cast<size_t>(bytes));
    for (int64_t i = 0; i < n; ++i) {
      if (i) text += ',';
      text += pre + fmt::format("{:0{}d}", i, pad + (i == n - 1 ? extra : 0)) + post;
    }
    text += tail;
    EXPECT_EQ(static_cast<int64_t>(text.size()), bytes);
    return text;
  };
  // Indented it would pass the cap; compact it fits.
  write_file(path, stale_db(jit::kMaxTuningDbBytes - 4096));
  jit::TuningDb db = jit::TuningDb::load(path);
  ASSERT_EQ(db.entries.size(), 30000u);
  db.put(gemm_entry(Isa::avx512, 256, 512, 16));
  db.save(path);
  EXPECT_LE(static_cast<int64_t>(fs::file_size(path)), jit::kMaxTuningDbBytes);
  EXPECT_EQ(jit::TuningDb::load(path).entries.size(), 30001u);
  // A database that fits in no form (a few more entries): an Error naming
  // it, the file unchanged.
  const auto size = fs::file_size(path);
  for (int64_t n = 1; n <= 16; ++n) db.put(gemm_entry(Isa::avx512, 256 * n, 512, 16));
  expect_tilejit_error([&] { db.save(path); },
                       "more than the 64 MiB a tuning database may have; nothing written");
  EXPECT_EQ(fs::file_size(path), size);
  fs::remove(path);
  fs::remove(path + ".lock");
}

// Every shape value of an entry of this machine and build is one the shape
// class builders write (the lookup compares text): a malformed one is an
// Error naming the entry's line, the field, the value and what is allowed
// (m "5-4", threads "abc", a decode entry's kv "f16" loaded and were never
// applied). Another machine's entry with such a value stays stale: loaded,
// not checked, written back verbatim.
TEST(TuningDb, ShapeValuesChecked) {
  const std::string path = temp_path("shape.json");
  const jit::TunedEntry g = gemm_entry(Isa::avx512, 256, 512, 40, {{"mr", 4}});
  jit::TunedEntry d;
  d.family = "decode_attention";
  d.shape = jit::decode_shape_class(Isa::avx512, runtime::num_threads(), 64, 64, 4, 1, 16,
                                    DType::bf16, 2, 512);
  d.knobs = {{"splits", 2}};
  d.cpu = runtime::cpu_signature();
  d.version = jit::tuning_db_version();
  auto load_with = [&](jit::TunedEntry e, const std::string& field, const std::string& value,
                       bool stale = false) {
    e.shape.fields[field] = value;
    if (stale) e.cpu = "other-cpu";
    nlohmann::json shape = e.shape.fields;
    const nlohmann::json j = {{"tilejit_tuning_db", 1},
                              {"entries",
                               {{{"family", e.family},
                                 {"shape", shape},
                                 {"knobs", e.knobs},
                                 {"cpu", e.cpu},
                                 {"tilejit", e.version}}}}};
    write_file(path, j.dump(1));
    return jit::TuningDb::load(path);
  };
  const std::string buckets = "allowed: 1, 2-4, 5-16, 17-64, 65-256, 257-1024, 1025+";
  for (const char* m : {"5-4", "0", "-1", "17-064", "40", "1-1", "17-64 "})
    expect_tilejit_error([&] { load_with(g, "m", m); },
                         fmt::format("{}:3: error: tuning database entry 0: shape field m='{}'; {}",
                                     path, m, buckets));
  for (const char* t : {"abc", "4097", "0", "02"})
    expect_tilejit_error(
        [&] { load_with(g, "threads", t); },
        fmt::format("shape field threads='{}'; allowed: an integer in [1, 4096]", t));
  expect_tilejit_error([&] { load_with(g, "n", "256.0"); },
                       "shape field n='256.0'; allowed: an integer >= 1");
  expect_tilejit_error([&] { load_with(g, "path", "sse"); },
                       "shape field path='sse'; allowed: amx, avx512, llvm");
  expect_tilejit_error([&] { load_with(g, "path", "scalar"); },
                       "shape field path='scalar'; allowed: amx, avx512, llvm");
  expect_tilejit_error([&] { load_with(d, "kv", "f16"); },
                       "shape field kv='f16'; allowed: bf16, f8e4m3, f8e5m2");
  expect_tilejit_error([&] { load_with(d, "d", "0"); }, "shape field d='0'; allowed: an integer");
  expect_tilejit_error([&] { load_with(d, "batch", "3"); }, "shape field batch='3'; " + buckets);
  expect_tilejit_error([&] { load_with(d, "seq", "1-255"); },
                       "shape field seq='1-255'; allowed: 1-256, 257-1024, 1025-4096, "
                       "4097-16384, 16385+");
  // The values the builders write load.
  EXPECT_EQ(load_with(g, "m", "1025+").entries.size(), 1u);
  EXPECT_EQ(load_with(d, "kv", "f8e4m3").entries.size(), 1u);
  EXPECT_EQ(load_with(d, "kv", "f8e5m2").entries.size(), 1u);
  // Another machine's entry: not checked, written back as it was.
  jit::TuningDb stale = load_with(g, "m", "5-4", true);
  ASSERT_EQ(stale.entries.size(), 1u);
  stale.save(path);
  EXPECT_EQ(nlohmann::json::parse(read_text(path))["entries"][0]["shape"]["m"], "5-4");
  fs::remove(path);
  fs::remove(path + ".lock");
}

// Two writers of one database (two tune processes): each save merges with
// the file under its lock, so neither loses the other's entries, and the
// file is valid JSON at every moment (a unique temporary file, renamed).
TEST(TuningDb, ConcurrentWritersMerge) {
  const std::string path = temp_path("shared.json");
  fs::remove(path);
  // Interleaved: both read the (absent) file, then save in turn.
  jit::TuningDb a, b;
  a.put(gemm_entry(Isa::avx512, 256, 512, 1));
  a.save(path);
  b.put(gemm_entry(Isa::avx512, 256, 512, 16));
  b.save(path);
  a.put(gemm_entry(Isa::avx512, 256, 512, 64));
  a.save(path);
  EXPECT_EQ(jit::TuningDb::load(path).entries.size(), 3u);
  // Concurrent: two threads saving 20 entries each while a third reads.
  fs::remove(path);
  std::atomic<bool> done{false};
  std::atomic<int> bad_reads{0};
  std::thread reader([&] {
    while (!done.load()) {
      try {
        if (fs::exists(path)) jit::TuningDb::load(path);
      } catch (const Error&) {
        ++bad_reads;
      }
    }
  });
  auto writer = [&](int64_t n) {
    jit::TuningDb db;
    for (int64_t i = 1; i <= 20; ++i) {
      db.put(gemm_entry(Isa::avx512, n, 32 * i, 1));
      db.save(path);
    }
  };
  std::thread w1(writer, 64), w2(writer, 96);
  w1.join();
  w2.join();
  done = true;
  reader.join();
  EXPECT_EQ(bad_reads.load(), 0);
  EXPECT_EQ(jit::TuningDb::load(path).entries.size(), 40u);
  for (const auto& f : fs::directory_iterator(fs::path(path).parent_path()))
    EXPECT_EQ(f.path().string().find(path + ".tmp"), std::string::npos) << f.path();
  fs::remove(path);
  fs::remove(path + ".lock");
}

// A database reached through a symbolic link is written where it points.
TEST(TuningDb, SaveThroughSymlink) {
  const std::string target = temp_path("target.json"), link = temp_path("link.json");
  fs::remove(target);
  fs::remove(link);
  fs::create_symlink(target, link);
  jit::TuningDb db;
  db.put(gemm_entry(Isa::avx512, 256, 512, 1));
  db.save(link);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(jit::TuningDb::load(target).entries.size(), 1u);
  fs::remove(link);
  fs::remove(target);
  fs::remove(target + ".lock");
}

// A FIFO, /dev/zero or a directory as the database: an Error, not a hang or
// an unbounded read (runtime::CappedFile).
TEST(TuningDb, SpecialFilesRefused) {
  const std::string fifo = temp_path("db.fifo");
  fs::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  expect_tilejit_error([&] { jit::TuningDb::load(fifo); }, "not valid JSON");
  expect_tilejit_error([&] { tools::load_workload(fifo); }, "not valid JSON");
  fs::remove(fifo);
  expect_tilejit_error([&] { jit::TuningDb::load("/dev/zero"); },
                       "/dev/zero: holds more than the 64 MiB a tuning database may have");
  expect_tilejit_error([&] { tools::load_workload("/dev/zero"); },
                       "/dev/zero: holds more than the 16 MiB a tune workload may have");
  const std::string dir = fs::temp_directory_path().string();
  expect_tilejit_error([&] { jit::TuningDb::load(dir); }, dir + ": is a directory");
  expect_tilejit_error([&] { tools::load_workload(dir); }, dir + ": is a directory");
}

TEST(TuneMeasure, BudgetCapped) {
  EXPECT_EQ(tools::parse_budget("10m"), 600);
  EXPECT_EQ(tools::parse_budget("168h"), tools::kMaxBudgetSeconds);
  EXPECT_EQ(tools::parse_budget("1.5s"), 1.5);
  // A number with its unit (docs/tuning.md): no unit, hex, inf refused.
  for (const char* b : {"5", "0x10s", "infs", "nanm", "5 s", ""})
    EXPECT_THROW(tools::parse_budget(b), tools::UsageError) << b;
  for (const char* b : {"1e10s", "99999999999999999999m", "1e300h", "169h"}) {
    try {
      tools::parse_budget(b);
      ADD_FAILURE() << b << " accepted";
    } catch (const tools::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("at most 168h"), std::string::npos) << e.what();
    }
  }
}

// ---- a tuned plan is used, and computes what the default computes -----------------

// Every output of y = x·wᵀ against the scalar reference, under the GEMM
// bound (runtime/reference_error_bounds.h), as for any plan.
void expect_matches_reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w,
                              const std::vector<uint16_t>& y, int64_t m, int64_t n, int64_t k) {
  auto bf = [](uint16_t h) { return double(runtime::bf16_to_f32(h)); };
  for (int64_t r = 0; r < m; ++r) {
    std::vector<uint16_t> ref(static_cast<size_t>(n));
    runtime::ReferenceGemmArgs a;
    a.x = x.data() + r * k;
    a.ldx = k;
    a.m = 1;
    a.n = n;
    a.k = k;
    a.y = ref.data();
    a.y_dtype = DType::bf16;
    a.ldy = n;
    runtime::reference_gemm(a, [&](int64_t j, int64_t kk) { return w[size_t(j * k + kk)]; });
    for (int64_t j = 0; j < n; ++j) {
      double abs_sum = 0, pre = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double t = bf(x[size_t(r * k + kk)]) * bf(w[size_t(j * k + kk)]);
        abs_sum += std::fabs(t);
        pre += t;
      }
      const double want = bf(ref[size_t(j)]);
      const double tol =
          runtime::gemm_output_bound(Activation::none, DType::bf16, k, abs_sum, 0, pre, want);
      ASSERT_LE(std::fabs(bf(y[size_t(r * n + j)]) - want), tol) << "row " << r << " col " << j;
    }
  }
}

// y = x·wᵀ by tilejit::gemm on random bf16 data; x, w and y returned.
struct GemmRun {
  std::vector<uint16_t> x, w, y;
};
GemmRun run_gemm(int64_t m, int64_t n, int64_t k) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1, 1);
  GemmRun g{std::vector<uint16_t>(size_t(m * k)), std::vector<uint16_t>(size_t(n * k)),
            std::vector<uint16_t>(size_t(m * n))};
  for (auto& v : g.x) v = runtime::f32_to_bf16(dist(rng));
  for (auto& v : g.w) v = runtime::f32_to_bf16(dist(rng) / 8);
  const PackedWeight pw = pack_weight(TensorView(g.w.data(), DType::bf16, {n, k}));
  gemm(TensorView(g.x.data(), DType::bf16, {m, k}), pw,
       TensorView(g.y.data(), DType::bf16, {m, n}));
  return g;
}

TEST(TuningDb, TunedGemmPlanUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t m = 40, n = 200, k = 320;  // N tail 8, M tail at mr 4: 0, task tails
  // On the AMX path the entry moves this M to AVX-512 (amx=0) and blocks it by 4 rows.
  std::map<std::string, int64_t> knobs = {{"mr", 4}, {"task_rows", 8}};
  if (path == Isa::amx) knobs["amx"] = 0;
  jit::TuningDb db;
  db.put(gemm_entry(path, n, k, m, knobs));
  const std::string file = temp_path("tuned.json");
  db.save(file);
  const uint64_t before = cache_stats().tuned_plans;
  load_tuning_db(file);

  const auto [x, w, y] = run_gemm(m, n, k);
  EXPECT_EQ(cache_stats().tuned_plans, before + 1);

  // The plan tilejit::gemm ran: the entry's, named by it, keyed by its mr.
  const codegen::GemmSpec spec{n, k, codegen::BiasKind::none, Activation::none, DType::bf16};
  const codegen::PlanOverrides o = ops::tuned_gemm(path, spec, m);
  ASSERT_FALSE(o.empty());
  const codegen::GemmPlan& plan =
      ops::gemm_executable(spec, codegen::gemm_isa_for_rows(path, m, o), o).plan();
  EXPECT_EQ(plan.mr, 4);
  EXPECT_EQ(plan.task_rows(), 8);
  EXPECT_EQ(plan.tuned_entry, db.entries[0].id());
  EXPECT_NE(plan.key().find(";mr=4"), std::string::npos) << plan.key();
  EXPECT_NE(plan.str().find("tuned        entry gemm:"), std::string::npos) << plan.str();
  // Another M bucket has no entry: the heuristics.
  EXPECT_TRUE(ops::tuned_gemm(path, spec, 1).empty());

  expect_matches_reference(x, w, y, m, n, k);
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

// A tuned entry of an int4 GPTQ weight at M = 40 (the dequant route: a
// GemmPlan) is applied, counted, and gives the quantized GEMM's result
// within quant_gemm_test's bound for that route (gemm_output_bound on the
// dequantized weights + dequant_weight_bound, the bf16 rounding of w).
TEST(TuningDb, TunedQuantizedGemmPlanUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t m = 40, n = 200, k = 320;
  const PackedWeight pw = int4_weight(n, k, 11);
  std::map<std::string, int64_t> knobs = {{"mr", 4}, {"task_rows", 8}, {"w4a8", 0}};
  if (path == Isa::amx) knobs["amx"] = 0;
  jit::TunedEntry e = quant_entry(path, n, k, m, WeightFormat::int4_gptq, knobs);
  // W4A16's knobs without their route are refused: at this M the automatic
  // route takes W4A8 on llvm and avx512, which ran while the entry was
  // reported applied (TILEJIT_VERBOSE, tuned_plans, dump's "(tuned)").
  jit::TunedEntry no_route = e;
  no_route.knobs.erase("w4a8");
  expect_tilejit_error([&] { jit::validate_entry(no_route); },
                       "knob mr with fmt=int4_gptq and no w4a8; allowed: with w4a8=0");
  no_route.knobs = {{"prefetch", 16}};
  expect_tilejit_error([&] { jit::validate_entry(no_route); }, "and no w4a8; allowed: with w4a8=0");
  jit::TuningDb db;
  db.put(e);
  const std::string file = temp_path("tuned_q.json");
  db.save(file);
  // A bf16-only knob on a quantized entry is refused at load.
  jit::TunedEntry bad = e;
  bad.knobs = {{"max_kc", 64}};
  expect_tilejit_error([&] { jit::validate_entry(bad); }, "knob max_kc with fmt=int4_gptq");
  const uint64_t before = cache_stats().tuned_plans;
  load_tuning_db(file);

  std::vector<uint16_t> x(size_t(m * k));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
  std::vector<float> y(size_t(m * n));
  // The dequant route's plan is what the entry tunes: W4A16 asked for (the
  // automatic route at this M on the llvm path is W4A8, which has no plan
  // knob: docs/tuning.md).
  GemmOptions opt;
  opt.int4_route = Int4Route::w4a16;
  gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::f32, {m, n}),
       opt);
  EXPECT_EQ(cache_stats().tuned_plans, before + 1);
  const codegen::PlanOverrides& ov =
      jit::find_tuned_gemm(path, runtime::num_threads(), n, k, codegen::BiasKind::none,
                           Activation::none, DType::f32, m, WeightFormat::int4_gptq);
  ASSERT_FALSE(ov.empty());
  EXPECT_EQ(ov.entry, e.id());
  EXPECT_EQ(ov.mr, 4);

  std::vector<float> wd(size_t(n * k));
  pw.dequantize(TensorView(wd.data(), DType::f32, {n, k}));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double ref = 0, abs = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double v = double(runtime::bf16_to_f32(x[size_t(i * k + c)])) * wd[size_t(j * k + c)];
        ref += v, abs += std::fabs(v);
      }
      ASSERT_NEAR(y[size_t(i * n + j)], ref,
                  runtime::gemm_output_bound(Activation::none, DType::f32, k, abs, 0, ref, ref) +
                      runtime::dequant_weight_bound(Activation::none, abs, 0))
          << "y[" << i << ", " << j << "]";
    }
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

// The int4 route knob: an entry choosing the route the automatic rule does
// not take at M = 40 (W4A8 on llvm / avx512, W4A16 on amx) is applied and
// counted, and gives bit for bit what asking for that route gives; a bad
// w4a8 knob is refused at load.
TEST(TuningDb, TunedInt4RouteUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar || !ops::w4a8_kernels_usable(path))
    GTEST_SKIP() << "no JIT path or no W4A8 kernels: the route is not tuned";
  const int64_t m = 40, n = 200, k = 320;
  const PackedWeight pw = int4_weight(n, k, 12);
  const bool dflt = ops::w4a8_route(WeightFormat::int4_gptq, k, Int4Route::automatic,
                                    codegen::gemm_isa_for_rows(path, m), m, "tuning_test");
  const jit::TunedEntry e =
      quant_entry(path, n, k, m, WeightFormat::int4_gptq, {{"w4a8", dflt ? 0 : 1}});
  jit::validate_entry(e);
  expect_tilejit_error(
      [&] {
        jit::validate_entry(
            quant_entry(path, n, k, m, WeightFormat::int4_gptq, {{"w4a8", 1}, {"mr", 4}}));
      },
      "knobs w4a8=1 and mr together");
  expect_tilejit_error(
      [&] {
        jit::validate_entry(quant_entry(path, n, k, m, WeightFormat::fp8_e4m3, {{"w4a8", 0}}));
      },
      "knob w4a8 with fmt=fp8_e4m3; allowed: int4_awq, int4_gptq");

  std::vector<uint16_t> x(size_t(m * k));
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
  auto run = [&](Int4Route route) {
    std::vector<float> y(size_t(m * n));
    GemmOptions opt;
    opt.int4_route = route;
    gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::f32, {m, n}),
         opt);
    return y;
  };
  const std::vector<float> untuned = run(Int4Route::automatic);
  const std::vector<float> other = run(dflt ? Int4Route::w4a16 : Int4Route::w4a8);
  ASSERT_NE(untuned, other) << "the two routes must differ for this test to tell them apart";

  jit::TuningDb db;
  db.put(e);
  const std::string file = temp_path("tuned_route.json");
  db.save(file);
  const uint64_t before = cache_stats().tuned_plans;
  load_tuning_db(file);
  EXPECT_EQ(run(Int4Route::automatic), other);
  EXPECT_EQ(cache_stats().tuned_plans, before + 1);
  // A route asked for explicitly is not overridden.
  EXPECT_EQ(run(dflt ? Int4Route::w4a8 : Int4Route::w4a16), untuned);
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

// The prefetch knob: the Xbyak AVX-512 kernels' B-stream prefetch distance.
// An entry for a bf16 GEMM at M = 40 (the plan's kernels) and one for an
// int4 GEMM at M = 1 (the fused decode kernel) are applied, counted, named
// in the plan key / kernel name, and give bit for bit the default's result
// (a prefetch moves no arithmetic). Where the knob cannot apply (another
// ISA, out of range, with w4a8=1) the entry is refused at load.
TEST(TuningDb, TunedPrefetchUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t m = 40, n = 200, k = 320;
  const std::map<std::string, int64_t> amx0 = path == Isa::amx
                                                  ? std::map<std::string, int64_t>{{"amx", 0}}
                                                  : std::map<std::string, int64_t>{};
  auto with = [&](std::map<std::string, int64_t> knobs) {
    knobs.insert(amx0.begin(), amx0.end());
    return knobs;
  };
  expect_tilejit_error(
      [&] {
        jit::validate_entry(gemm_entry(path, n, k, m, with({{"prefetch", 2000}})));
      },
      "knob prefetch=2000; allowed: 0 .. 1024");
  expect_tilejit_error(
      [&] {
        jit::validate_entry(
            quant_entry(path, n, k, m, WeightFormat::int4_gptq, {{"w4a8", 1}, {"prefetch", 16}}));
      },
      "knobs w4a8=1 and prefetch together");
  if (path == Isa::amx)
    expect_tilejit_error(
        [&] {
          jit::validate_entry(gemm_entry(path, n, k, m, {{"prefetch", 16}}));
        },
        "knob prefetch on path=amx without amx=0");
  if (path == Isa::llvm) {
    expect_tilejit_error(
        [&] {
          jit::validate_entry(gemm_entry(path, n, k, m, {{"prefetch", 16}}));
        },
        "tuned prefetch=16 on isa=llvm; allowed: -1 (the kernel's default), or 0 .. 1024 KiB on "
        "avx512");
    GTEST_SKIP() << "the llvm path has no Xbyak kernel to prefetch for";
  }

  // bf16 at M = 40: no prefetch at all.
  const GemmRun dflt = run_gemm(m, n, k);
  jit::TuningDb db;
  db.put(gemm_entry(path, n, k, m, with({{"prefetch", 0}})));
  // int4 GPTQ at M = 1 (the fused decode kernel, W4A16): 16 KiB ahead.
  const int64_t n4 = 136, k4 = 512;
  const PackedWeight pw = int4_weight(n4, k4, 13);
  db.put(
      quant_entry(path, n4, k4, 1, WeightFormat::int4_gptq, with({{"prefetch", 16}, {"w4a8", 0}})));
  std::vector<uint16_t> x(static_cast<size_t>(k4));
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
  auto run_int4 = [&] {
    std::vector<float> y(static_cast<size_t>(n4));
    gemm(TensorView(x.data(), DType::bf16, {1, k4}), pw, TensorView(y.data(), DType::f32, {1, n4}));
    return y;
  };
  const std::vector<float> int4_dflt = run_int4();
  const std::string file = temp_path("tuned_prefetch.json");
  db.save(file);
  const uint64_t before = cache_stats().tuned_plans;
  load_tuning_db(file);

  EXPECT_EQ(run_gemm(m, n, k).y, dflt.y);
  const codegen::GemmSpec spec{n, k, codegen::BiasKind::none, Activation::none, DType::bf16};
  const codegen::PlanOverrides o = ops::tuned_gemm(path, spec, m);
  ASSERT_EQ(o.prefetch_kib, 0);
  const codegen::GemmPlan& plan =
      ops::gemm_executable(spec, codegen::gemm_isa_for_rows(path, m, o), o).plan();
  EXPECT_EQ(plan.isa, Isa::avx512);
  EXPECT_NE(plan.key().find(";pf=0"), std::string::npos) << plan.key();
  EXPECT_NE(plan.str().find("prefetch=0 KiB"), std::string::npos) << plan.str();
  EXPECT_NE(plan.ukernel(plan.mr, plan.nb).name().find("_pf0k"), std::string::npos);

  EXPECT_EQ(run_int4(), int4_dflt);
  EXPECT_EQ(cache_stats().tuned_plans, before + 2);
  const std::string fused = ops::quant_gemm_kernel_name(*pw.impl(), codegen::BiasKind::none,
                                                        Activation::none, DType::f32, path, 1);
  EXPECT_NE(fused.find("_pf16k"), std::string::npos) << fused;
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

// A gemm entry's u4_dot (the Xbyak fused int4 decode kernel's arithmetic:
// vdpbf16ps on bf16 pairs, or f32 FMAs at mr <= 3; docs/tuning.md) at M = 1
// and 3, the arithmetic this CPU's rule does not pick: applied and counted,
// in the kernel's name, and every output (N tail included) within the fused
// kernel's bound of the double reference on the logical weights. Refused
// off int4, above the fused kernel's rows, with w4a8=1 and on the llvm path.
TEST(TuningDb, TunedU4DotUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t n = 136, k = 512;
  expect_tilejit_error(
      [&] {
        jit::validate_entry(quant_entry(path, n, k, 40, WeightFormat::int4_gptq, {{"u4_dot", 1}}));
      },
      "knob u4_dot with fmt=int4_gptq path=" + std::string(isa_name(path)) + " m=17-64; allowed");
  expect_tilejit_error(
      [&] {
        jit::validate_entry(quant_entry(path, n, k, 1, WeightFormat::fp8_e4m3, {{"u4_dot", 0}}));
      },
      "knob u4_dot with fmt=fp8_e4m3");
  expect_tilejit_error(
      [&] {
        jit::validate_entry(
            quant_entry(path, n, k, 1, WeightFormat::int4_gptq, {{"u4_dot", 1}, {"w4a8", 1}}));
      },
      "w4a8=1; allowed");
  // The llvm path's W4A8 kernels are LLVM code: refused there without LLVM.
  if (!cpu_info().llvm_backend)
    expect_tilejit_error(
        [&] {
          jit::validate_entry(
              quant_entry(Isa::llvm, n, k, 40, WeightFormat::int4_gptq, {{"w4a8", 1}}));
        },
        "knob w4a8=1 on path=llvm: this tilejit is built without the LLVM backend");
  if (path == Isa::llvm) {
    expect_tilejit_error(
        [&] {
          jit::validate_entry(quant_entry(path, n, k, 1, WeightFormat::int4_gptq, {{"u4_dot", 1}}));
        },
        "knob u4_dot with fmt=int4_gptq path=llvm");
    GTEST_SKIP() << "the llvm path's fused kernel has one arithmetic";
  }
  if (!runtime::xbyak_fused_quant_kernel(runtime::cpu_features())) {
    // Accepted, the entry would change nothing: refused at load instead.
    expect_tilejit_error(
        [&] {
          jit::validate_entry(quant_entry(path, n, k, 1, WeightFormat::int4_gptq, {{"u4_dot", 1}}));
        },
        "on a CPU with AVX512-VBMI (this one has none");
    GTEST_SKIP() << "no Xbyak fused int4 kernel on this CPU (AVX512-VBMI)";
  }
  ASSERT_TRUE(ops::quant_gemm_fused(codegen::gemm_isa_for_rows(path, 1), 1));
  const bool dflt = runtime::bf16_dot_at_fma_rate(runtime::cpu_features());
  const PackedWeight pw = int4_weight(n, k, 17);
  std::vector<float> wd(size_t(n * k));
  pw.dequantize(TensorView(wd.data(), DType::f32, {n, k}));
  std::mt19937 rng(10);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (const int64_t m : {int64_t{1}, int64_t{3}}) {
    SCOPED_TRACE(fmt::format("M = {}, u4_dot = {}", m, !dflt));
    std::vector<uint16_t> x(size_t(m * k));
    for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
    jit::TuningDb db;
    db.put(quant_entry(path, n, k, m, WeightFormat::int4_gptq,
                       {{"u4_dot", dflt ? 0 : 1}, {"w4a8", 0}}));
    jit::install_tuning_db(db, "u4_dot test");
    const uint64_t before = cache_stats().tuned_plans;
    std::vector<float> y(size_t(m * n));
    gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::f32, {m, n}));
    EXPECT_EQ(cache_stats().tuned_plans, before + 1);
    const std::string name = ops::quant_gemm_kernel_name(*pw.impl(), codegen::BiasKind::none,
                                                         Activation::none, DType::f32, path, m);
    EXPECT_EQ(name.find("_dot") != std::string::npos, !dflt) << name;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, abs = 0;
        for (int64_t c = 0; c < k; ++c) {
          const double v =
              double(runtime::bf16_to_f32(x[size_t(i * k + c)])) * wd[size_t(j * k + c)];
          ref += v, abs += std::fabs(v);
        }
        ASSERT_NEAR(
            y[size_t(i * n + j)], ref,
            runtime::quant_brgemm_output_bound(Activation::none, DType::f32, k, abs, 0, ref, ref) +
                runtime::dequant_weight_bound(Activation::none, abs, 0))
            << "y[" << i << ", " << j << "]";
      }
    jit::install_tuning_db({}, "");
  }
}

// The same for an int8 (W8A8) entry at M = 24: applied, and every output
// within quant_gemm_test's W8A8 bound (int8_output_bound around the exact
// integer sums of the codes the reference quantizer makes).
TEST(TuningDb, TunedInt8GemmPlanUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t m = 24, n = 136, k = 256;
  tools::WorkloadOp o;
  o.op = "gemm";
  o.format = "int8";
  const PackedWeight pw = tools::synthetic_weight(o, n, k, 13);
  std::map<std::string, int64_t> knobs = {{"mr", 4}, {"task_rows", 8}};
  if (path == Isa::amx) knobs["amx"] = 0;
  const jit::TunedEntry e = quant_entry(path, n, k, m, WeightFormat::int8, knobs);
  jit::TuningDb db;
  db.put(e);
  const std::string file = temp_path("tuned_i8.json");
  db.save(file);
  const uint64_t before = cache_stats().tuned_plans;
  load_tuning_db(file);

  std::vector<uint16_t> x(size_t(m * k));
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> dist(-1, 1);
  for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
  std::vector<float> y(size_t(m * n));
  // The dequant route's plan is what the entry tunes: W4A16 asked for (the
  // automatic route at this M on the llvm path is W4A8, which has no plan
  // knob: docs/tuning.md).
  GemmOptions opt;
  opt.int4_route = Int4Route::w4a16;
  gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::f32, {m, n}),
       opt);
  EXPECT_EQ(cache_stats().tuned_plans, before + 1);
  EXPECT_EQ(jit::find_tuned_gemm(path, runtime::num_threads(), n, k, codegen::BiasKind::none,
                                 Activation::none, DType::f32, m, WeightFormat::int8)
                .mr,
            4);

  std::vector<int8_t> codes(size_t(n * k));
  std::vector<float> sw(static_cast<size_t>(n));
  pw.unpack(Int8Weight{TensorView(codes.data(), DType::i8, {n, k}),
                       TensorView(sw.data(), DType::f32, {n})});
  std::vector<uint8_t> qa(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    float sa = 1;
    int32_t za = 0;
    runtime::reference_act_quant_row(runtime::ActQuantRule::sym, &x[size_t(i * k)], k, k, 1, 1, 128,
                                     qa.data(), &sa, &za);
    for (int64_t j = 0; j < n; ++j) {
      int64_t acc = 0, wabs = 0;
      for (int64_t c = 0; c < k; ++c) {
        const int64_t p = int64_t(qa[size_t(c)] - za) * codes[size_t(j * k + c)];
        acc += p, wabs += std::abs(p);
      }
      const double pre = double(acc) * sa * sw[size_t(j)];
      ASSERT_NEAR(y[size_t(i * n + j)], pre,
                  runtime::int8_output_bound(Activation::none, DType::f32,
                                             double(wabs) * sa * sw[size_t(j)], 0, pre, pre))
          << "y[" << i << ", " << j << "]";
    }
  }
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

TEST(TuningDb, TunedGemmOnTheLlvmBackend) {
  const Isa path = runtime::active_isa();
  if ((path != Isa::amx && path != Isa::avx512) || !cpu_info().llvm_backend)
    GTEST_SKIP() << "the llvm knob needs the amx or avx512 path and the LLVM backend";
  const int64_t m = 3, n = 130, k = 96;
  jit::TuningDb db;
  db.put(gemm_entry(path, n, k, m, {{"llvm", 1}, {"mr", 2}}));
  jit::install_tuning_db(db, "llvm test");
  const auto [x, w, y] = run_gemm(m, n, k);
  const codegen::GemmSpec spec{n, k, codegen::BiasKind::none, Activation::none, DType::bf16};
  const codegen::PlanOverrides o = ops::tuned_gemm(path, spec, m);
  EXPECT_EQ(o.isa, Isa::llvm);
  const codegen::GemmPlan& plan =
      ops::gemm_executable(spec, codegen::gemm_isa_for_rows(path, m, o), o).plan();
  EXPECT_EQ(plan.isa, Isa::llvm);
  EXPECT_EQ(plan.mr, 2);
  expect_matches_reference(x, w, y, m, n, k);
  // amx with llvm, or llvm on a path below avx512: refused at load.
  jit::TuningDb bad;
  bad.put(gemm_entry(Isa::amx, n, k, m, {{"llvm", 1}, {"amx", 1}}));
  const std::string file = temp_path("llvm.json");
  bad.save(file);
  expect_tilejit_error([&] { jit::TuningDb::load(file); }, "knobs amx and llvm together");
  jit::TuningDb bad2;
  bad2.put(gemm_entry(Isa::llvm, n, k, m, {{"llvm", 1}}));
  bad2.save(file);
  expect_tilejit_error([&] { jit::TuningDb::load(file); }, "knob llvm on path=llvm");
  jit::install_tuning_db({}, "");
  fs::remove(file);
}

// A paged decode problem on random bf16 data: b sequences of len keys, the
// block table in order (reversed: each sequence's blocks read back to
// front, scattered rows); run() is decode_attention's output.
struct PagedDecode {
  int64_t b, hq, hkv, d, bs, len, nb;
  std::vector<uint16_t> q, kc, vc;
  std::vector<int32_t> table, lens;
  PagedDecode(int64_t b_, int64_t hq_, int64_t hkv_, int64_t d_, int64_t bs_, int64_t len_,
              bool reversed, uint32_t seed)
      : b(b_), hq(hq_), hkv(hkv_), d(d_), bs(bs_), len(len_), nb((len_ + bs_ - 1) / bs_) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1, 1);
    auto fill = [&](int64_t count) {
      std::vector<uint16_t> v(static_cast<size_t>(count));
      for (auto& e : v) e = runtime::f32_to_bf16(dist(rng));
      return v;
    };
    q = fill(b * hq * d);
    kc = fill(b * nb * bs * hkv * d);
    vc = fill(b * nb * bs * hkv * d);
    table.resize(static_cast<size_t>(b * nb));
    lens.assign(static_cast<size_t>(b), static_cast<int32_t>(len));
    for (int64_t s = 0; s < b; ++s)
      for (int64_t i = 0; i < nb; ++i)
        table[size_t(s * nb + i)] = static_cast<int32_t>(s * nb + (reversed ? nb - 1 - i : i));
  }
  std::vector<uint16_t> run() const {
    std::vector<uint16_t> out(static_cast<size_t>(b * hq * d));
    decode_attention(TensorView(q.data(), DType::bf16, {b, hq, d}),
                     TensorView(kc.data(), DType::bf16, {b * nb, bs, hkv, d}),
                     TensorView(vc.data(), DType::bf16, {b * nb, bs, hkv, d}),
                     TensorView(out.data(), DType::bf16, {b, hq, d}),
                     TensorView(table.data(), DType::i32, {b, nb}),
                     TensorView(lens.data(), DType::i32, {b}));
    return out;
  }
};

TEST(TuningDb, TunedDecodeSplitUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t b = 1, hq = 4, hkv = 2, d = 64, bs = 16, len = 700;
  const PagedDecode p(b, hq, hkv, d, bs, len, false, 3);
  auto run = [&] { return p.run(); };
  const auto dflt = run();
  jit::TuningDb db;
  jit::TunedEntry e;
  e.family = "decode_attention";
  e.shape =
      jit::decode_shape_class(path, runtime::num_threads(), d, d, hq, hkv, bs, DType::bf16, b, len);
  e.knobs = {{"splits", 5}};
  e.cpu = runtime::cpu_signature();
  e.version = jit::tuning_db_version();
  db.put(e);
  const uint64_t before = cache_stats().tuned_plans;
  jit::install_tuning_db(db, "split test");
  const auto tuned = run();
  EXPECT_EQ(cache_stats().tuned_plans, before + 1);
  // Five partials merged in another order: the default's result within a few
  // bf16 ulps of the output (|out| <= 1: softmax-weighted v in [-1, 1]).
  for (size_t i = 0; i < dflt.size(); ++i)
    EXPECT_NEAR(runtime::bf16_to_f32(tuned[i]), runtime::bf16_to_f32(dflt[i]), 4.0 / 256) << i;
  jit::install_tuning_db({}, "");
}

// A decode_attention entry's prefetch_chunks (the LLVM kernel's prefetch
// distance) selects another kernel (one more in the cache, or a disk load)
// that gives bit for bit the default's output: over aligned cache blocks
// and over block sizes that are not multiples of 16 (the kernel's ring of
// row-offset lists, sized by the distance), at the shortest and longest
// distance. Out of range: refused at load.
TEST(TuningDb, TunedDecodePrefetchUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar || !jit::family_built(jit::Family::decode_attention))
    GTEST_SKIP() << "no LLVM decode kernel on this path";
  jit::TunedEntry bad;
  bad.family = "decode_attention";
  bad.shape =
      jit::decode_shape_class(path, runtime::num_threads(), 64, 64, 4, 2, 16, DType::bf16, 1, 700);
  bad.knobs = {{"prefetch_chunks", 9}};
  expect_tilejit_error([&] { jit::validate_entry(bad); },
                       "knob prefetch_chunks=9; allowed: 1 .. 8");
  for (const int64_t bs : {16, 5})
    for (const int64_t pf : {1, 8}) {
      SCOPED_TRACE(fmt::format("block size {}, prefetch_chunks {}", bs, pf));
      const int64_t b = 2, hq = 4, hkv = 2, d = 64, len = 700;
      // Every sequence reads its blocks back to front: scattered rows.
      const PagedDecode p(b, hq, hkv, d, bs, len, true, uint32_t(bs * 10 + pf));
      auto run = [&] { return p.run(); };
      const auto dflt = run();
      jit::TuningDb db;
      jit::TunedEntry e = bad;
      e.shape = jit::decode_shape_class(path, runtime::num_threads(), d, d, hq, hkv, bs,
                                        DType::bf16, b, len);
      e.knobs = {{"prefetch_chunks", pf}};
      e.cpu = runtime::cpu_signature();
      e.version = jit::tuning_db_version();
      db.put(e);
      const CacheStats before = cache_stats();
      jit::install_tuning_db(db, "prefetch test");
      EXPECT_EQ(run(), dflt);
      const CacheStats after = cache_stats();
      EXPECT_EQ(after.tuned_plans, before.tuned_plans + 1);
      EXPECT_EQ(after.compiles + after.disk_loads, before.compiles + before.disk_loads + 1)
          << "the tuned distance is another kernel";
      jit::install_tuning_db({}, "");
    }
}

// prefill / extend attention entries: their knobs (rows, key_block; extend
// also splits) are checked against the engine's limits at load, steps
// included, and their shape fields are their families' own. That the
// operators apply them is tested with the attention batteries
// (attention_test Prefill.TunedBlocking, attention_extend_test
// ExtendAttention.TunedBlockingAndSplits), on every path.
TEST(TuningDb, AttentionBlockingKnobsChecked) {
  jit::TunedEntry e;
  e.family = "prefill_attention";
  e.shape = jit::prefill_shape_class(Isa::avx512, 2, 128, 128, 32, 8, true, 1, 2048);
  e.knobs = {{"rows", 32}, {"key_block", 256}};
  EXPECT_NO_THROW(jit::validate_entry(e));
  e.knobs = {{"key_block", 100}};
  expect_tilejit_error([&] { jit::validate_entry(e); },
                       "knob key_block=100; allowed: 32 .. 256, a multiple of 32");
  e.knobs = {{"key_block", 288}};
  expect_tilejit_error([&] { jit::validate_entry(e); }, "knob key_block=288; allowed: 32 .. 256");
  e.knobs = {{"rows", 24}};
  expect_tilejit_error([&] { jit::validate_entry(e); },
                       "knob rows=24; allowed: 16 .. 64, a multiple of 16");
  e.knobs = {{"splits", 2}};
  expect_tilejit_error([&] { jit::validate_entry(e); },
                       "knob 'splits' for family prefill_attention; allowed: rows (16 .. 64, "
                       "multiples of 16), key_block (32 .. 256, multiples of 32)");
  jit::TunedEntry x;
  x.family = "extend_attention";
  x.shape = jit::extend_shape_class(Isa::avx512, 2, 128, 128, 32, 8, 16, DType::bf16, 4, 512, 4096);
  x.knobs = {{"rows", 64}, {"key_block", 64}, {"splits", 4}};
  EXPECT_NO_THROW(jit::validate_entry(x));
  x.knobs = {{"splits", 65}};
  expect_tilejit_error([&] { jit::validate_entry(x); }, "knob splits=65; allowed: 1 .. 64");
  // A prefill shape under the extend family: its fields are not extend's.
  x.shape = e.shape;
  x.knobs = {};
  expect_tilejit_error([&] { jit::validate_entry(x); },
                       "shape field 'causal' is not one of family extend_attention's");
}

// The tuner's cold operands (docs/tuning.md): the last-level cache is read
// from sysfs, and a call's data is copied until the rotation passes 4x it
// (at most 16 copies; one where a copy alone is that big).
TEST(TuneMeasure, ColdCopies) {
  const int64_t llc = tools::llc_bytes();
  EXPECT_GE(llc, int64_t{1} << 20) << "a last-level cache below 1 MiB: sysfs misread?";
  EXPECT_EQ(tools::cold_copies(4 * llc), 1);
  EXPECT_EQ(tools::cold_copies(100 * llc), 1);
  EXPECT_EQ(tools::cold_copies(llc), 4);
  EXPECT_EQ(tools::cold_copies(llc / 2), 8);
  EXPECT_EQ(tools::cold_copies(1), 16);
  EXPECT_EQ(tools::cold_copies(0), 16);
  EXPECT_EQ(tools::cold_copies(llc / 5), 16);  // the cap: 3.2x the cache
  for (int64_t b : {llc / 3, llc / 4, 3 * llc / 2})
    EXPECT_GE(tools::cold_copies(b) * b, 4 * llc) << b;
}

// A fused_experts call's inputs: T tokens of H random bf16 values, each
// routed to K experts (ids, filled by the test) with weight 0.5.
struct MoeCall {
  int64_t T, H, K;
  std::vector<uint16_t> x;
  std::vector<float> tw;
  std::vector<int32_t> ids;
  MoeCall(int64_t t, int64_t h, int64_t k, uint32_t seed)
      : T(t), H(h), K(k), x(size_t(t * h)), tw(size_t(t * k), 0.5f), ids(size_t(t * k)) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> dist(-1, 1);
    for (auto& v : x) v = runtime::f32_to_bf16(dist(rng));
  }
  std::vector<uint16_t> run(const PackedExperts& w13, const PackedExperts& w2,
                            const MoeOptions& opt = {}) const {
    std::vector<uint16_t> out(size_t(T * H));
    fused_experts(TensorView(x.data(), DType::bf16, {T, H}), w13, w2,
                  TensorView(tw.data(), DType::f32, {T, K}),
                  TensorView(ids.data(), DType::i32, {T, K}),
                  TensorView(out.data(), DType::bf16, {T, H}), opt);
    return out;
  }
};

// A moe entry's run_blocks (the streaming phases' task split) is applied to
// bf16 and quantized experts alike, counted, and leaves the result bit for
// bit as it was (the same kernels on the same rows; only the tasks differ).
TEST(TuningDb, TunedMoeRunUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t E = 4, K = 2, H = 320, I = 192, T = 3;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-1, 1);
  MoeCall call(T, H, K, 8);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) call.ids[size_t(t * K + j)] = int32_t((t + j) % E);
  for (const char* fmt : {"bf16", "int4_gptq", "int8"}) {
    SCOPED_TRACE(fmt);
    tools::WorkloadOp o;
    o.op = "moe";
    o.format = fmt;
    if (o.format == "int4_gptq") o.group_size = 64;
    PackedExperts w13, w2;
    if (o.format == "bf16") {
      std::vector<uint16_t> a(size_t(E * 2 * I * H)), b(size_t(E * H * I));
      for (auto& v : a) v = runtime::f32_to_bf16(dist(rng) / 16);
      for (auto& v : b) v = runtime::f32_to_bf16(dist(rng) / 16);
      w13 = pack_experts(TensorView(a.data(), DType::bf16, {E, 2 * I, H}), ExpertProj::gate_up);
      w2 = pack_experts(TensorView(b.data(), DType::bf16, {E, H, I}), ExpertProj::down);
    } else {
      w13 = tools::synthetic_experts(o, E, 2 * I, H, ExpertProj::gate_up, 21);
      w2 = tools::synthetic_experts(o, E, H, I, ExpertProj::down, 22);
    }
    auto run = [&] { return call.run(w13, w2); };
    const auto dflt = run();
    jit::TunedEntry e;
    e.family = "moe";
    e.shape = jit::moe_shape_class(path, runtime::num_threads(), E, K, H, I, T, w13.format());
    e.knobs = {{"run_blocks", 3}};
    e.cpu = runtime::cpu_signature();
    e.version = jit::tuning_db_version();
    jit::TuningDb db;
    db.put(e);
    const uint64_t before = cache_stats().tuned_plans;
    jit::install_tuning_db(db, "moe run test");
    EXPECT_EQ(run(), dflt);
    EXPECT_EQ(cache_stats().tuned_plans, before + 1);
    // Another format's entry is not this one's.
    jit::TuningDb other;
    e.shape = jit::moe_shape_class(
        path, runtime::num_threads(), E, K, H, I, T,
        w13.format() == WeightFormat::bf16 ? WeightFormat::int8 : WeightFormat::bf16);
    other.put(e);
    jit::install_tuning_db(other, "");
    const uint64_t before_other = cache_stats().tuned_plans;
    EXPECT_EQ(run(), dflt);
    EXPECT_EQ(cache_stats().tuned_plans, before_other);
    jit::install_tuning_db({}, "");
  }
}

// A moe entry's w4a8_rows (int4 experts' route under int4_route automatic,
// per expert by its rows) and prefetch (the experts' Xbyak AVX-512 kernels).
// w4a8_rows = 1 gives bit for bit what int4_route = w4a8 gives, 0 what w4a16
// gives; a prefetch distance moves no arithmetic (bit for bit the default)
// but compiles the experts' kernels anew (the distance is in their keys).
// Refused: w4a8_rows off int4, prefetch on the llvm path.
TEST(TuningDb, TunedMoeRouteAndPrefetchUsed) {
  const Isa path = runtime::active_isa();
  if (path == Isa::scalar) GTEST_SKIP() << "no JIT path: nothing is tuned";
  const int64_t E = 4, K = 2, H = 320, I = 192, T = 6;
  MoeCall call(T, H, K, 9);
  // Expert 0 on every token (6 rows), the others on two tokens each.
  for (int64_t t = 0; t < T; ++t) {
    call.ids[size_t(t * K)] = 0;
    call.ids[size_t(t * K + 1)] = int32_t(1 + t % 3);
  }
  tools::WorkloadOp o;
  o.op = "moe";
  o.format = "int4_gptq";
  o.group_size = 64;
  const PackedExperts w13 = tools::synthetic_experts(o, E, 2 * I, H, ExpertProj::gate_up, 31);
  const PackedExperts w2 = tools::synthetic_experts(o, E, H, I, ExpertProj::down, 32);
  auto run = [&](Int4Route route) {
    MoeOptions opt;
    opt.int4_route = route;
    return call.run(w13, w2, opt);
  };
  jit::TunedEntry e;
  e.family = "moe";
  e.shape = jit::moe_shape_class(path, runtime::num_threads(), E, K, H, I, T, w13.format());
  e.cpu = runtime::cpu_signature();
  e.version = jit::tuning_db_version();
  auto install = [&](std::map<std::string, int64_t> knobs) {
    e.knobs = std::move(knobs);
    jit::validate_entry(e);
    jit::TuningDb db;
    db.put(e);
    jit::install_tuning_db(db, "moe route test");
  };

  // Refusals: w4a8_rows on another format; prefetch where no Xbyak kernel runs.
  jit::TunedEntry bad = e;
  bad.shape = jit::moe_shape_class(path, 1, E, K, H, I, T, WeightFormat::fp8_e4m3);
  bad.knobs = {{"w4a8_rows", 2}};
  expect_tilejit_error([&] { jit::validate_entry(bad); },
                       "knob w4a8_rows with fmt=fp8_e4m3; allowed: int4_awq, int4_gptq");
  bad.shape = e.shape;
  bad.knobs = {{"w4a8_rows", -1}};
  expect_tilejit_error([&] { jit::validate_entry(bad); },
                       "knob w4a8_rows=-1; allowed: 0 .. 1048576");
  bad.knobs = {{"prefetch", 2000}};
  expect_tilejit_error([&] { jit::validate_entry(bad); }, "knob prefetch=2000; allowed: 0 .. 1024");
  bad.shape = jit::moe_shape_class(Isa::llvm, 1, E, K, H, I, T, WeightFormat::int4_gptq);
  bad.knobs = {{"prefetch", 16}};
  expect_tilejit_error([&] { jit::validate_entry(bad); },
                       "knob prefetch on path=llvm; allowed: on path amx or avx512");
  if (!cpu_info().llvm_backend) {
    bad.shape = jit::moe_shape_class(Isa::llvm, 1, E, K, H, I, T, WeightFormat::int4_gptq);
    bad.knobs = {{"w4a8_rows", 2}};
    expect_tilejit_error(
        [&] { jit::validate_entry(bad); },
        "knob w4a8_rows > 0 on path=llvm: this tilejit is built without the LLVM backend");
  }

  if (ops::w4a8_kernels_usable(path)) {
    const auto w4a8 = run(Int4Route::w4a8), w4a16 = run(Int4Route::w4a16);
    ASSERT_NE(w4a8, w4a16);  // the routes differ, so the checks below can fail
    const uint64_t before = cache_stats().tuned_plans;
    install({{"w4a8_rows", 1}});
    EXPECT_EQ(run(Int4Route::automatic), w4a8);
    // A route asked for is the caller's: the entry does not move it.
    EXPECT_EQ(run(Int4Route::w4a16), w4a16);
    install({{"w4a8_rows", 0}});
    EXPECT_EQ(run(Int4Route::automatic), w4a16);
    // From 3 rows: expert 0 (6 rows) W4A8, the others (2 rows) W4A16 —
    // neither pure route's result.
    install({{"w4a8_rows", 3}});
    const auto mixed = run(Int4Route::automatic);
    EXPECT_NE(mixed, w4a8);
    EXPECT_NE(mixed, w4a16);
    EXPECT_GE(cache_stats().tuned_plans, before + 3);
    jit::install_tuning_db({}, "");
  }

  if (path == Isa::llvm) {
    e.knobs = {{"prefetch", 16}};
    expect_tilejit_error([&] { jit::validate_entry(e); }, "knob prefetch on path=llvm");
    return;
  }
  // At 2 rows per expert every expert but 0 runs the fused decode kernel (amx
  // / avx512 with VBMI) or an AVX-512 plan: a distance of 16 KiB compiles
  // kernels of its own and changes no bit.
  const auto dflt = run(Int4Route::w4a16);
  const uint64_t misses = cache_stats().misses;
  install({{"prefetch", 16}});
  EXPECT_EQ(run(Int4Route::w4a16), dflt);
  EXPECT_GT(cache_stats().misses, misses);
  jit::install_tuning_db({}, "");
}

}  // namespace
}  // namespace tilejit
