// `tilejit`: the command-line face of the library (docs/tool.md).
//
// Exit codes: 0 success; 1 an error in the input (IR, .npy, shapes), a stage
// that cannot be produced, or a --check FAIL; 2 a usage error; 3 an internal
// error.
#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <system_error>

#include "jit/disk_cache.h"
#include "jit/kernel_cache.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/program_io.h"

namespace {

// Repeatable options take one value per occurrence (`-i x=a.npy -i w=b.npy`),
// so a .tir file after them is never read as one more value.

using tilejit::tools::BenchOptions;
using tilejit::tools::DumpOptions;
using tilejit::tools::GenNpyOptions;
using tilejit::tools::RunOptions;

const char* const kIsaHelp =
    "ISA path cap: amx, avx512, llvm or scalar (sets TILEJIT_ISA for this process; the active path "
    "is the best one at or below it)";

// A seed is any uint64 written in decimal: CLI11 alone would take "-1" (as
// 2^64 - 1) and wrap "18446744073709551616" to 0.
const CLI::Validator kSeed(
    [](std::string& s) {
      uint64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      return ec == std::errc() && end == s.data() + s.size()
                 ? std::string()
                 : "'" + s + "' is not a seed; allowed: an integer in [0, 18446744073709551615]";
    },
    "UINT64");

// A file the tool writes (tune --out, --save-workload): "" names none.
const CLI::Validator kFilePath(
    [](std::string& s) {
      return s.empty() ? std::string("'' is not a file; allowed: a path") : std::string();
    },
    "FILE");

// A directory the tool writes into (--save-inputs): "" named none and wrote
// nothing, silently.
const CLI::Validator kDirPath(
    [](std::string& s) {
      return s.empty() ? std::string("'' is not a directory; allowed: a path") : std::string();
    },
    "DIR");

// --threads of bench, tune and llama-layer: 1 or more (the option absent
// is the default; 0 is not a way to say it). The upper bound is
// set_num_threads', which names it when the option is applied.
const CLI::Validator kThreads(
    [](std::string& s) {
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      return ec == std::errc() && end == s.data() + s.size() && v >= 1
                 ? std::string()
                 : "'" + s +
                       "' is not a thread count; allowed: an integer >= 1 (absent: "
                       "TILEJIT_NUM_THREADS or the CPUs the process may run on)";
    },
    "N >= 1");

void add_dump(CLI::App& app, DumpOptions& o) {
  auto* c = app.add_subcommand("dump",
                               "print the stages of a .tir program: parsed IR, verified "
                               "types, kernel plan, specialization keys, disassembly");
  c->add_option("file", o.file, "the .tir program ('-' reads stdin)")->required();
  c->add_option("--stage", o.stage, "ir | verified | plan | key | asm | all (default)")
      ->check(CLI::IsMember({"ir", "verified", "plan", "key", "asm", "all"}));
  c->add_option("--dim", o.dims, "bind a symbolic dim, e.g. M=512 (adds the M-tail kernels)")
      ->allow_extra_args(false);
  c->add_option("--isa", o.isa,
                "plan and emit for this path (default: the active one); emitting needs no "
                "hardware support, so --isa amx shows AMX code on any machine")
      ->check(CLI::IsMember({"amx", "avx512", "llvm", "scalar"}));
  c->add_option("--syntax", o.syntax, "assembly syntax: intel (default) or att")
      ->check(CLI::IsMember({"intel", "att"}));
}

void add_run(CLI::App& app, RunOptions& o) {
  auto* c = app.add_subcommand("run", "run a .tir program on .npy inputs and write its outputs");
  c->add_option("file", o.file, "the .tir program ('-' reads stdin)")->required();
  c->add_option("--input,-i", o.inputs, "NAME=FILE.npy for the parameter %NAME (repeatable)")
      ->allow_extra_args(false);
  c->add_option("--output,-o", o.outputs, "NAME=FILE.npy for the result %NAME (repeatable)")
      ->allow_extra_args(false);
  c->add_flag("--check", o.check,
              "compare with the scalar reference; prints errors and PASS/FAIL (exit 1 on FAIL)");
  c->add_option("--isa", o.isa, kIsaHelp)
      ->check(CLI::IsMember({"amx", "avx512", "llvm", "scalar"}));
  c->add_option("--random-inputs", o.seed,
                "generate every input not given by --input from this seed")
      ->check(kSeed)
      ->each([&o](const std::string&) { o.random_inputs = true; });
  c->add_option("--dim", o.dims, "bind a symbolic dim for generated inputs, e.g. M=7")
      ->allow_extra_args(false);
  c->add_option("--save-inputs", o.save_inputs,
                "write every input (given or generated) to DIR/NAME.npy")
      ->check(kDirPath);
}

void add_bench(CLI::App& app, BenchOptions& o) {
  auto* c = app.add_subcommand("bench",
                               "time a .tir program on random inputs: GFLOP/s, % of "
                               "the measured peak, time per call");
  c->add_option("file", o.file, "the .tir program ('-' reads stdin)")->required();
  c->add_option("--dim", o.dims, "bind a symbolic dim, e.g. M=512 (every one must be bound)")
      ->allow_extra_args(false);
  c->add_option("--threads", o.threads, "threads (default: TILEJIT_NUM_THREADS or cores)")
      ->check(kThreads);
  c->add_option("--seconds", o.seconds, "timing budget (default 1)");
  c->add_option("--seed", o.seed, "seed of the random inputs (default 1)")->check(kSeed);
  c->add_option("--isa", o.isa, kIsaHelp)
      ->check(CLI::IsMember({"amx", "avx512", "llvm", "scalar"}));
}

void add_gen_npy(CLI::App& app, GenNpyOptions& o) {
  // Hidden (empty group): a test helper, not part of the documented surface.
  auto* c = app.add_subcommand("gen-npy", "write a random .npy file (test helper)");
  c->group("");
  c->add_option("file", o.file, "output path")->required();
  c->add_option("--dtype", o.dtype, "<f4 | <i4 | |u1 | |i1 | <u2");
  c->add_option("--shape", o.shape, "dims, comma separated (none: a scalar)")->delimiter(',');
  c->add_option("--seed", o.seed, "seed")->check(kSeed);
}

void add_tune(CLI::App& app, tilejit::tools::TuneOptions& o) {
  auto* c = app.add_subcommand(
      "tune",
      "search plan knobs for a workload's shapes, keep those that beat the default on the whole "
      "operator call, write the tuning database, and fill the kernel cache (docs/tuning.md)");
  c->add_option("workload", o.workload, "the workload JSON (examples/tune/*.json)");
  auto* config = c->add_option("--model-config", o.model_config,
                               "build the workload from a Hugging Face config.json instead");
  c->add_option("--save-workload", o.save_workload,
                "with --model-config: write the workload it builds to this file and stop")
      ->check(kFilePath)
      ->needs(config);
  c->add_option("--kv-cache-dtype", o.kv_cache_dtype,
                "with --model-config: the engine's paged KV cache dtype for the decode and "
                "extend ops (bf16, f8e4m3, f8e5m2; default bf16)");
  c->add_option("--out", o.out, "the tuning database (default tilejit_tuning.json)")
      ->check(kFilePath);
  c->add_option("--budget", o.budget, "time budget of the search, e.g. 90s, 10m (default 10m)");
  c->add_option("--threads", o.threads, "threads (default: TILEJIT_NUM_THREADS or cores)")
      ->check(kThreads);
  c->add_flag("--resume", o.resume, "skip the entries the database already holds");
  c->add_flag("--no-search", o.no_search,
              "only the warm-up: run the workload once with the database's plans");
  auto* verify = c->add_flag("--verify", o.verify,
                             "time every tuned entry of the database against the default plan "
                             "(interleaved, medians) and write nothing");
  c->add_option("--rounds", o.rounds, "--verify: interleaved rounds (default 9)")
      ->check(CLI::Range(5, 1000))
      ->needs(verify);
}

// The tool keeps compiled kernels across runs: TILEJIT_CACHE_DIR when set
// (empty = off), else the per-user cache directory. With the variable set
// the library already opened that directory (and warned, once, if it is not
// usable): opening it again would only repeat the warning.
void set_up_disk_cache() {
  if (std::getenv("TILEJIT_CACHE_DIR") != nullptr) return;
  tilejit::jit::KernelCache::global().set_disk_dir(tilejit::jit::default_user_cache_dir());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tilejit: a JIT compiler for LLM inference CPU kernels"};
  app.require_subcommand(0, 1);

  tilejit::tools::LlamaJobOptions llama;
  auto* job = app.add_subcommand(
      "llama-layer",
      "JIT one Llama-3-8B decoder layer op by op (GEMMs for M in {1, 16, 512}, RoPE on q/k, "
      "decode and prefill attention), check each against the scalar reference and print "
      "speed (the default command)");
  job->add_option("--threads", llama.threads, "threads (default: TILEJIT_NUM_THREADS or cores)")
      ->check(kThreads);
  job->add_option("--seconds", llama.seconds, "timing budget per shape");
  job->add_flag("!--no-check", llama.check, "skip the reference check");
  job->add_option("--weights", llama.weights,
                  "the GEMMs' weight format: bf16 (default), int8 (W8A8, per-channel scales), "
                  "fp8 (e4m3, 128x128 block scales), int4 (GPTQ g128 with zero points)")
      ->check(CLI::IsMember({"bf16", "int8", "fp8", "int4"}));
  job->add_option("--moe-weights", llama.moe_weights,
                  "the MoE block's expert formats, comma-separated, one moe_experts row each: "
                  "bf16, int8 (W8A8), fp8 (per-channel), fp8_block (128x128), int4 (GPTQ g128 "
                  "zp), awq (g128 zp), mxfp4, all (default: bf16,int4)")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "int8", "fp8", "fp8_block", "int4", "awq", "mxfp4", "all"}));
  job->add_option("--only", llama.only, "run only the Llama layer (dense) or the MoE block (moe)")
      ->check(CLI::IsMember({"dense", "moe"}));
  job->add_option("--tuning-db", llama.tuning_db,
                  "load this tuning database (`tilejit tune`); rows that ran a tuned plan say so");
  app.add_subcommand(
      "cpuinfo", "detected ISA features, AMX permission, active path, threads, kernel cache dir");
  DumpOptions dump;
  add_dump(app, dump);
  RunOptions run;
  add_run(app, run);
  BenchOptions bench;
  add_bench(app, bench);
  GenNpyOptions gen;
  add_gen_npy(app, gen);
  tilejit::tools::TuneOptions tune;
  add_tune(app, tune);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, naming the subcommand whose options were being read.
    std::string who = "tilejit";
    for (const CLI::App* sub : app.get_subcommands()) who += " " + sub->get_name();
    std::fprintf(stderr, "%s: error: %s (see %s --help)\n", who.c_str(),
                 tilejit::tools::one_line(e.what()).c_str(), who.c_str());
    return 2;
  }

  const CLI::App* sub = app.get_subcommands().empty() ? nullptr : app.get_subcommands().front();
  const std::string name = sub ? sub->get_name() : "llama-layer";
  // Output that could not be written (a closed stdout, /dev/full) is an
  // error of the run, exit 1, in every subcommand: the output is what it
  // was run for. (A pipe closed early ends the process by SIGPIPE, as it
  // does any filter's.)
  auto stdout_failed = [&] {
    if (std::fflush(stdout) == 0 && !std::ferror(stdout)) return false;
    std::fprintf(stderr, "tilejit %s: error: cannot write to standard output: %s\n", name.c_str(),
                 std::strerror(errno));
    return true;
  };
  try {
    const int rc = [&] {
      // TILEJIT_ISA is read once, at the library's first ISA query: set it before any call.
      const std::string isa = name == "run" ? run.isa : name == "bench" ? bench.isa : "";
      if (!isa.empty()) setenv("TILEJIT_ISA", isa.c_str(), 1);
      if (name == "gen-npy") return tilejit::tools::run_gen_npy(gen);
      set_up_disk_cache();
      if (name == "cpuinfo") return tilejit::tools::run_cpuinfo();
      if (name == "dump") return tilejit::tools::run_dump(dump);
      if (name == "run") return tilejit::tools::run_program(run);
      if (name == "bench") return tilejit::tools::run_bench(bench);
      if (name == "tune") return tilejit::tools::run_tune(tune);
      return tilejit::tools::run_llama_layer_job(llama);
    }();
    return stdout_failed() ? 1 : rc;
  } catch (const tilejit::tools::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tilejit %s: error: %s (see tilejit %s --help)\n", name.c_str(),
                 tilejit::tools::one_line(e.what()).c_str(), name.c_str());
    return 2;
  } catch (const tilejit::Error& e) {
    std::fflush(stdout);
    // IR parse errors already read "file:line:col: error: ..."; file errors
    // start with the file name.
    const std::string what = tilejit::tools::one_line(e.what());
    if (what.find(": error: ") != std::string::npos)
      std::fprintf(stderr, "%s\n", what.c_str());
    else
      std::fprintf(stderr, "tilejit %s: error: %s\n", name.c_str(), what.c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    // Every tensor is capped (kMaxHostTensorBytes), but the caps may still
    // exceed this machine's memory: an error in the input's size, not a bug.
    std::fflush(stdout);
    std::fprintf(stderr,
                 "tilejit %s: error: out of memory: the tensors of this program and shape do not "
                 "fit in this machine's memory\n",
                 name.c_str());
    return 1;
  } catch (const std::system_error& e) {
    // fmt::print throws one when stdout refuses a write.
    if (stdout_failed()) return 1;
    std::fprintf(stderr, "tilejit %s: error: %s\n", name.c_str(),
                 tilejit::tools::one_line(e.what()).c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tilejit %s: internal error: %s\n", name.c_str(),
                 tilejit::tools::one_line(e.what()).c_str());
    return 3;
  }
}
