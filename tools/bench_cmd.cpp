// `tilejit bench`: times a .tir program on random inputs and puts the rate
// next to the machine's measured peak.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "jit/peak.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/program/program_runner.h"
#include "tools/program/quant_route.h"
#include "tools/program_io.h"

namespace tilejit::tools {
namespace {

constexpr int kBatches = 7;

void print_first_call(const CacheStats& before, const CacheStats& after) {
  fmt::print("  first call  {} compile{} ({:.2f} ms), {} disk load{}\n",
             after.compiles - before.compiles, after.compiles - before.compiles == 1 ? "" : "s",
             (after.compile_seconds - before.compile_seconds) * 1e3,
             after.disk_loads - before.disk_loads,
             after.disk_loads - before.disk_loads == 1 ? "" : "s");
}

// A program of rope / attention / moe calls: the rate of what it computes.
// FLOP-counted ops (attention over its visible pairs, moe's routed GEMMs) give
// GFLOP/s against the bf16 peak; a program of RoPE alone, which streams
// memory, gives GB/s of what it reads and writes.
// "% of peak" against the path's measured per-core peak (jit/peak.h) times
// the threads; n/a where there is none (scalar, emulated AMX).
void print_pct_of_peak(double gflops, const CpuInfo& cpu) {
  const double core = jit::path_peak_gflops(cpu.isa);
  if (core <= 0) {
    fmt::print("  % of peak   n/a (the {} path has no measured hardware peak)\n",
               cpu.amx_emulated && cpu.isa == Isa::amx ? "emulated amx" : isa_name(cpu.isa));
    return;
  }
  const double peak = core * cpu.num_threads;
  fmt::print(
      "  % of peak   {:.1f}% of {:.1f} GFLOP/s (measured {} bf16 peak {:.1f} per core x {})\n",
      100 * gflops / peak, peak, isa_name(cpu.isa), core, cpu.num_threads);
}

void report_operators(const ProgramRunner& runner, const CpuInfo& cpu, double t, int64_t calls,
                      const CacheStats& before, const CacheStats& after) {
  const OperatorRunner& o = *runner.operators();
  const OperatorWork w = o.work();
  std::vector<std::string> apis;
  for (const OperatorCall& c : o.program().calls) apis.push_back(c.api());
  fmt::print("bench @{}: {} on the {} path, {} thread{}\n", runner.function().name, w.shape,
             isa_name(cpu.isa), cpu.num_threads, cpu.num_threads == 1 ? "" : "s");
  fmt::print("  calls       {} (kernels chosen at run time by the operator{})\n",
             fmt::join(apis, ", then "), apis.size() == 1 ? "" : "s");
  const bool has_rope =
      std::any_of(o.program().calls.begin(), o.program().calls.end(),
                  [](const OperatorCall& c) { return c.kind == ir::OpKind::rope; });
  fmt::print("  time/call   {:.4g} ms (median of {} batches of {} call{}{}{})\n", t * 1e3, kBatches,
             calls, calls == 1 ? "" : "s", apis.size() == 1 ? "" : ", every call of the program",
             has_rope ? "; rope rotates its result in place again, without the copy of q that "
                        "`run` makes first"
                      : "");
  if (w.flops > 0) {
    const double gflops = w.flops / t / 1e9;
    fmt::print("  GFLOP/s     {:.2f} ({:.4g} GFLOP per call; {})\n", gflops, w.flops / 1e9,
               w.counted);
    print_pct_of_peak(gflops, cpu);
  } else {
    fmt::print("  GB/s        {:.2f} ({:.4g} MB per call; {})\n", w.bytes / t / 1e9, w.bytes / 1e6,
               w.counted);
    fmt::print(
        "  % of peak   n/a (memory-bound: compare GB/s with the streaming read bandwidth "
        "of `tilejit llama-layer`)\n");
  }
  print_first_call(before, after);
}

}  // namespace

int run_bench(const BenchOptions& opt) {
  set_threads_option(opt.threads);
  check_seconds_option(opt.seconds);
  const ir::Function f = load_program(opt.file);
  const DimBindings dims = parse_dims(opt.dims, f);
  ProgramRunner runner = make_runner(f, opt.file);
  note_isa_request(opt.isa);

  TensorMap inputs;
  for (int p : f.params) inputs[f.value(p).name] = random_tensor(f, p, dims, opt.seed);
  runner.set_inputs(inputs, dims);
  TensorMap outputs = runner.make_outputs();

  const CpuInfo cpu = cpu_info();
  const CacheStats before = cache_stats();
  runner.run(outputs);  // compiles (or loads from the disk cache) what this shape needs
  const CacheStats after = cache_stats();

  // Batches of calls sized from a first one-call batch; the median of the
  // sized batches, since the machine is shared and noisy.
  using clock = std::chrono::steady_clock;
  std::vector<double> per_call;
  int64_t calls = 1;
  for (int b = 0; b <= kBatches; ++b) {
    const auto t0 = clock::now();
    for (int64_t i = 0; i < calls; ++i) runner.run_for_timing(outputs);
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    if (b == 0) {
      calls = calls_for_budget(opt.seconds / kBatches, s);
      continue;
    }
    per_call.push_back(s / static_cast<double>(calls));
  }
  std::sort(per_call.begin(), per_call.end());
  const double t = per_call[per_call.size() / 2];
  if (runner.operators() != nullptr) {
    report_operators(runner, cpu, t, calls, before, after);
    return 0;
  }
  const double flops = runner.flops();
  const double gflops = flops / t / 1e9;

  const auto& spec = runner.program().spec;
  const int64_t m = inputs.at(f.value(runner.program().x).name).shape.at(0);
  fmt::print("bench @{}: M={} N={} K={} on the {} path, {} thread{}\n", f.name, m, spec.n, spec.k,
             isa_name(cpu.isa), cpu.num_threads, cpu.num_threads == 1 ? "" : "s");
  // What runs at this M (a quantized weight's route: the line named the bf16
  // plan for an fp8 weight running the fused kernel).
  fmt::print("  plan        {}\n", program_route_line(f, runner.program(), cpu.isa, m));
  fmt::print("  time/call   {:.4g} ms (median of {} batches of {} call{})\n", t * 1e3, kBatches,
             calls, calls == 1 ? "" : "s");
  fmt::print("  GFLOP/s     {:.1f} (2·M·N·K = {:.4g} GFLOP per call)\n", gflops, flops / 1e9);
  print_pct_of_peak(gflops, cpu);
  print_first_call(before, after);
  return 0;
}

}  // namespace tilejit::tools
