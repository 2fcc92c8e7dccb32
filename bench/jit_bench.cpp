// JIT costs: LLVM vs Xbyak emission of one micro-kernel, and the on-disk
// kernel cache's cold start (compile) vs warm start (load) for the whole
// kernel set of a Llama-3-8B layer's GEMMs at M ∈ {1, 16, 512}.
//
// Each cold/warm measurement runs in a forked child, so the in-memory cache
// starts empty every time, as in a new process.
#include <benchmark/benchmark.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/xbyak/emitters.h"
#include "jit/kernel_cache.h"
#include "jit/registry.h"
#include "runtime/exec_memory.h"
#include "runtime/isa.h"

#ifdef TILEJIT_BENCH_HAVE_LLVM
#include "codegen/llvm/llvm_brgemm.h"
#endif

namespace {

using namespace tilejit;

codegen::BrgemmDesc desc7x64(Isa isa) {
  codegen::BrgemmDesc d;
  d.isa = isa;
  d.mr = 7;
  d.nr = 64;
  d.kb = 4096;
  d.bias = codegen::BiasKind::f32;
  d.act = Activation::silu;
  d.out = DType::bf16;
  return d;
}

void BM_XbyakEmitMicrokernel(benchmark::State& state) {
  const codegen::BrgemmDesc d = desc7x64(Isa::avx512);
  for (auto _ : state) {
    const std::vector<uint8_t> code = codegen::xbyak::emit_avx512_brgemm(d);
    runtime::ExecutableMemory mem(code.data(), code.size());
    benchmark::DoNotOptimize(mem.data());
  }
  state.SetLabel(d.name());
}
BENCHMARK(BM_XbyakEmitMicrokernel)->Unit(benchmark::kMicrosecond);

#ifdef TILEJIT_BENCH_HAVE_LLVM
void BM_LlvmCompileMicrokernel(benchmark::State& state) {
  // Optimisation level: the backend's default "kernel" pipeline (docs/llvm-backend.md).
  const codegen::BrgemmDesc d = desc7x64(Isa::llvm);
  for (auto _ : state) {
    codegen::llvm_backend::LlvmKernel k = codegen::llvm_backend::compile_llvm_brgemm(d);
    benchmark::DoNotOptimize(k.entry);
  }
  state.SetLabel(codegen::llvm_backend::llvm_brgemm_name(d));
}
BENCHMARK(BM_LlvmCompileMicrokernel)->Unit(benchmark::kMillisecond)->Iterations(20);
#endif

// Every micro-kernel the Llama layer's GEMMs need at M ∈ {1, 16, 512}.
std::vector<codegen::BrgemmDesc> llama_kernel_set(Isa isa) {
  const int64_t shapes[][2] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  std::vector<codegen::BrgemmDesc> out;
  for (const auto& s : shapes) {
    const codegen::GemmPlan plan = codegen::plan_gemm(
        {s[0], s[1], codegen::BiasKind::none, Activation::none, DType::bf16}, isa);
    for (int64_t m : {1, 16, 512})
      for (const codegen::KernelUse& u : codegen::plan_kernels(plan, m)) out.push_back(u.desc);
  }
  return out;
}

// Seconds a fresh process needs to obtain the kernel set with `dir` as its
// disk cache (-1 on failure).
double child_acquire_seconds(const std::string& dir, Isa isa) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    jit::KernelCache::global().set_disk_dir(dir);
    const auto descs = llama_kernel_set(isa);
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& d : descs) jit::get(d);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const ssize_t w = write(fds[1], &s, sizeof s);
    _exit(w == sizeof s ? 0 : 1);
  }
  close(fds[1]);
  double s = -1;
  if (read(fds[0], &s, sizeof s) != sizeof s) s = -1;
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return s;
}

void BM_LlamaKernelSet(benchmark::State& state) {
  const bool warm = state.range(0) == 1;
  const Isa isa = runtime::active_isa();
  if (isa == Isa::scalar) {
    state.SkipWithError("the scalar path compiles nothing");
    return;
  }
  const std::string dir =
      std::filesystem::temp_directory_path() / ("tilejit-jit-bench-" + std::to_string(getpid()));
  for (auto _ : state) {
    state.PauseTiming();
    std::filesystem::remove_all(dir);
    if (warm && child_acquire_seconds(dir, isa) < 0) state.SkipWithError("fill failed");
    state.ResumeTiming();
    const double s = child_acquire_seconds(dir, isa);
    if (s < 0) state.SkipWithError("child failed");
    state.SetIterationTime(s);
  }
  std::filesystem::remove_all(dir);
  state.counters["kernels"] = static_cast<double>(llama_kernel_set(isa).size());
  state.SetLabel(std::string(warm ? "warm (load from disk)" : "cold (compile)") + ", path " +
                 isa_name(isa));
}
BENCHMARK(BM_LlamaKernelSet)
    ->Arg(0)
    ->Arg(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(5);

}  // namespace

BENCHMARK_MAIN();
