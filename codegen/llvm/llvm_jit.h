// The LLVM ORC JIT of tilejit, behind an LLVM-free interface.
//
// One process-wide LLJIT for the host: target triple, CPU name and feature
// string come from the running machine, so kernels use AVX-512 (or AVX2) where
// present. A compile builds one LLVM module through a callback, optimises it
// with the new pass manager, generates a relocatable object with the host
// TargetMachine, and links that object into its own JITDylib. The object bytes
// are handed back too: they are what an on-disk cache stores, and
// load_object_file() links them again without recompiling.
//
// LLVM types appear only in codegen/llvm/module_context.h, which only .cpp files
// of codegen/llvm/ include. Every LLVM failure surfaces as tilejit::Error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tilejit/error.h"

namespace tilejit::codegen::llvm_backend {

// A linked kernel. Copies share the code; it is unlinked (its JITDylib removed)
// when the last copy goes away, so `entry` is valid while any copy lives.
struct LlvmKernel {
  std::string name;                  // the symbol, which spells the specialization
  void* entry = nullptr;             // address of the function `name`
  std::shared_ptr<void> keepalive;   // owns the JITDylib that holds the code
  double compile_us = 0;             // IR build + optimise + codegen + link, wall time
  std::vector<uint8_t> object_file;  // the relocatable ELF object (for a disk cache)
  size_t code_size = 0;              // bytes of the function itself (0 if unknown)

  template <class Fn>
  Fn fn() const {
    return reinterpret_cast<Fn>(entry);
  }
};

// What the JIT compiles for: the host, as LLVM sees it.
struct HostTarget {
  std::string triple;    // "x86_64-pc-linux-gnu"
  std::string cpu;       // "znver4"
  std::string features;  // "+avx512f,+avx512bf16,...,-amx-tile,..."
  bool avx2 = false, fma = false, f16c = false;
  bool avx512f = false, avx512bw = false, avx512bf16 = false;
  int vector_bits = 128;  // widest vector register: 512, 256 or 128
  int vector_regs = 16;   // architectural vector registers (32 with AVX-512)
  // The 512-bit vcvtneps2bf16 / vcvtne2ps2bf16 the kernels' bf16 stores use
  // (the target has AVX512-BF16 and is not narrowed below 512-bit vectors).
  bool bf16_convert() const { return avx512bf16 && vector_bits >= 512; }
};

// Initialises LLVM's native target and creates the JIT on first use
// (thread-safe); throws tilejit::Error if LLVM cannot target the host.
// TILEJIT_LLVM_CPU=<cpu name> (read then, e.g. x86-64-v3) narrows the target
// to that CPU's features, which must all be the host's: it runs the portable
// AVX2 code on an AVX-512 machine (tests do).
const HostTarget& host_target();

// fork(): a thread inside LLVM at the fork left its locks (ORC's session, the
// JIT's creation) taken in the child, which then hung on its first compile.
// before_fork waits for the compiles in flight and holds new ones back;
// after_fork (parent and child) lets them go. The kernel cache's fork
// handlers call them, before taking their own locks (a compile takes those
// when it ends).
void before_fork();
void after_fork(bool child);

// Throws tilejit::Error naming `who` unless the target has AVX2 and FMA, the
// floor of the LLVM kernels (below it llvm.fma becomes a libm call).
void require_vector_host(const char* who);

// The optimisation a compile applies, all with the new pass manager's
// PassBuilder on the module, then the host TargetMachine's codegen:
//  - kernel (the default): a short function pipeline (SROA, EarlyCSE,
//    InstCombine, SimplifyCFG, LICM) + codegen at CodeGenOptLevel::Default.
//    The emitters hand LLVM explicitly vectorised, register-blocked loops, so
//    the full O2 pipeline finds nothing more to speed up (same GFLOP/s,
//    measured) and costs twice the compile time.
//  - O0..O3: the default per-module pipelines at that level + codegen at the
//    matching CodeGenOptLevel (None, Less, Default, Aggressive).
enum class OptLevel { O0, O1, O2, O3, kernel };

// The module under construction; defined in module_context.h (LLVM types).
struct ModuleContext;

// Builds a module with `emit` (which must define an externally visible
// function named `symbol`), verifies, optimises, compiles and links it.
// Thread-safe: each compile has its own LLVMContext and TargetMachine; only
// linking goes through the shared JIT, which is safe for concurrent use.
// Throws tilejit::Error with LLVM's message on any failure (including a module
// that fails the IR verifier); exceptions thrown by `emit` propagate.
LlvmKernel compile_module(const std::string& symbol,
                          const std::function<void(ModuleContext&)>& emit,
                          OptLevel opt = OptLevel::kernel);

// Links an object produced by compile_module (same host, same tilejit build)
// and returns the kernel `symbol` from it: the disk-cache path, no compile.
LlvmKernel load_object_file(const std::string& symbol, std::vector<uint8_t> object_file);

}  // namespace tilejit::codegen::llvm_backend
