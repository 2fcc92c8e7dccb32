#include <fmt/format.h>

#include <string>

#include "jit/registry.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"

namespace tilejit::tools {

int run_cpuinfo() {
  const CpuInfo c = cpu_info();
  auto yes = [](bool b) { return b ? "yes" : "no"; };
  fmt::print("vendor          {}\n", c.vendor);
  fmt::print("avx512f/bw/vl   {}/{}/{}\n", yes(c.avx512f), yes(c.avx512bw), yes(c.avx512vl));
  fmt::print("avx512_bf16     {}\n", yes(c.avx512_bf16));
  fmt::print("avx512_fp16     {}\n", yes(c.avx512_fp16));
  fmt::print("amx tile/bf16/int8 {}/{}/{}\n", yes(c.amx_tile), yes(c.amx_bf16), yes(c.amx_int8));
  fmt::print("amx permitted   {}\n", yes(c.amx_permitted));
  if (c.amx_emulated) fmt::print("amx emulated    yes (TILEJIT_AMX_EMULATE)\n");
  // Under emulation the AMX path runs, but not on tile hardware: say so
  // wherever the path is named.
  auto path = [&](Isa isa) {
    return std::string(isa_name(isa)) + (isa == Isa::amx && c.amx_emulated ? " (emulated)" : "");
  };
  fmt::print("best path       {}\n", path(c.max_isa));
  fmt::print("active path     {} (TILEJIT_ISA caps it)\n", path(c.isa));
  fmt::print("threads         {} (TILEJIT_NUM_THREADS overrides)\n", c.num_threads);
  const std::string dir = cache_stats().disk_dir;
  fmt::print("kernel cache    {} (TILEJIT_CACHE_DIR overrides, empty = off)\n",
             dir.empty() ? std::string("off: memory only") : dir);
  fmt::print("cpu features    {}\n", runtime::detected_features().str());
  fmt::print("usable features {} (the active path's, TILEJIT_ISA caps them)\n",
             runtime::usable_features().str());
  // The registry's table: which family runs on which path, made by which
  // backend, needing what; "runs here" is the features test alone.
  fmt::print("kernel rows     family / path / backend / runs here / needs\n");
  for (const jit::KernelRow& r : jit::kernel_rows())
    fmt::print("  {:<17}{:<8}{:<7}{:<4} {}\n", jit::family_name(r.family), path(r.path),
               runtime::backend_name(r.backend), yes(jit::row_runs_here(r)), r.needs.str());
  return 0;
}

}  // namespace tilejit::tools
