// The subcommands of the `tilejit` tool (docs/tool.md). Each returns the
// process exit code: 0 success, 1 failure (bad input, a stage that cannot be
// produced, a --check FAIL); they throw tilejit::Error for main to report
// (exit 1), or UsageError for a bad command line (exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tilejit/error.h"

namespace tilejit::tools {

// A command line the tool cannot act on: an option value out of range or
// malformed, a name the program does not have, an argument missing. main
// reports it as CLI11's own parse errors are reported, with exit code 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

struct LlamaJobOptions {
  int threads = 0;       // 0: library default
  double seconds = 0.3;  // timing budget per shape
  bool check = true;     // compare against the scalar reference
  // The layer GEMMs' weight format: bf16, int8 (W8A8, per-channel scales),
  // fp8 (e4m3, 128x128 block scales) or int4 (GPTQ, groups of 128, zero points).
  std::string weights = "bf16";
  // The MoE block's expert formats, one moe_experts row per format and M:
  // bf16, int8, fp8 (per-channel), fp8_block (128x128), int4 (GPTQ g128 zp),
  // awq (g128 zp), mxfp4, or all.
  std::vector<std::string> moe_weights = {"bf16", "int4"};
  // "dense": only the Llama layer; "moe": only the MoE block; "": both.
  std::string only;
  // A tuning database to load (tilejit::load_tuning_db); rows whose plan
  // came from it say "tuned".
  std::string tuning_db;
};

struct DumpOptions {
  std::string file;               // .tir path, "-" = stdin
  std::string stage = "all";      // ir | verified | plan | key | asm | all
  std::vector<std::string> dims;  // "M=512"
  std::string isa;                // "" = active path; else plan for this one
  std::string syntax = "intel";   // asm syntax: intel | att
};

struct RunOptions {
  std::string file;
  std::vector<std::string> inputs;   // "NAME=FILE.npy"
  std::vector<std::string> outputs;  // "NAME=FILE.npy"
  std::vector<std::string> dims;     // "M=7" (with --random-inputs)
  bool check = false;
  bool random_inputs = false;
  uint64_t seed = 0;
  std::string save_inputs;  // directory for the inputs as .npy
  std::string isa;          // --isa as given (main sets TILEJIT_ISA from it)
};

struct BenchOptions {
  std::string file;
  std::vector<std::string> dims;
  int threads = 0;
  double seconds = 1.0;
  uint64_t seed = 1;
  std::string isa;
};

// Hidden test helper: writes a .npy file of random values.
struct GenNpyOptions {
  std::string file;
  std::string dtype = "<f4";
  std::vector<int64_t> shape;
  uint64_t seed = 1;
};

// `tilejit tune` (docs/tuning.md).
struct TuneOptions {
  std::string workload;                     // a workload JSON file, or
  std::string model_config;                 // a Hugging Face config.json to build it from
  std::string save_workload;                // with --model-config: also write the workload here
  std::string kv_cache_dtype;               // with --model-config: the paged KV cache's dtype
  std::string out = "tilejit_tuning.json";  // the database (read, updated, rewritten)
  std::string budget = "10m";
  int threads = 0;
  bool resume = false;     // skip entries already in the database
  bool no_search = false;  // only the warm-up (fill the kernel cache with the DB's plans)
  bool verify = false;     // time each tuned entry against the default, write nothing
  int rounds = 9;          // --verify: interleaved rounds
};

int run_llama_layer_job(const LlamaJobOptions& opt);
int run_tune(const TuneOptions& opt);
int run_cpuinfo();
int run_dump(const DumpOptions& opt);
int run_program(const RunOptions& opt);
int run_bench(const BenchOptions& opt);
int run_gen_npy(const GenNpyOptions& opt);

}  // namespace tilejit::tools
