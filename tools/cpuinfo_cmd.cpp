#include <fmt/format.h>

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
  fmt::print("best path       {}\n", isa_name(c.max_isa));
  fmt::print("active path     {} (TILEJIT_ISA caps it)\n", isa_name(c.isa));
  fmt::print("threads         {}\n", c.num_threads);
  return 0;
}

}  // namespace tilejit::tools
