// `tilejit`: the command-line face of the library.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>

#include "tilejit/tilejit.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"tilejit: a JIT compiler for LLM inference CPU kernels"};
  app.require_subcommand(0, 1);

  tilejit::tools::LlamaJobOptions llama;
  auto* job = app.add_subcommand(
      "llama-layer", "JIT the GEMMs of one Llama-3-8B decoder layer for M in {1, 16, 512}, check "
                     "them against the scalar reference and print speed (the default command)");
  job->add_option("--threads", llama.threads, "threads (default: TILEJIT_NUM_THREADS or cores)");
  job->add_option("--seconds", llama.seconds, "timing budget per shape");
  job->add_flag("!--no-check", llama.check, "skip the reference check");
  auto* cpuinfo = app.add_subcommand("cpuinfo", "detected ISA features, AMX permission, path");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    if (*cpuinfo) return tilejit::tools::run_cpuinfo();
    return tilejit::tools::run_llama_layer_job(llama);
  } catch (const tilejit::Error& e) {
    std::fprintf(stderr, "tilejit: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tilejit: internal error: %s\n", e.what());
    return 2;
  }
}
