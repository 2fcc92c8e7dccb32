// The subcommands of the `tilejit` tool.
#pragma once

namespace tilejit::tools {

struct LlamaJobOptions {
  int threads = 0;          // 0: library default
  double seconds = 0.3;     // timing budget per shape
  bool check = true;        // compare against the scalar reference
};

int run_llama_layer_job(const LlamaJobOptions& opt);
int run_cpuinfo();

}  // namespace tilejit::tools
