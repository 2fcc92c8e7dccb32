// A compiled kernel: its name (which spells its specialization), its canonical
// key, the backend that made it, and its machine code — W^X memory for Xbyak
// code, a JITDylib kept alive for LLVM code.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/exec_memory.h"

namespace tilejit::jit {

struct Kernel {
  std::string name;
  std::string key;
  std::string backend;  // "xbyak" or "llvm"
  const void* entry_ptr = nullptr;
  size_t size = 0;                  // code bytes of the entry function
  runtime::ExecutableMemory code;   // Xbyak kernels
  std::shared_ptr<void> keepalive;  // LLVM kernels: owns the code
  double compile_us = 0;            // wall time to emit (or load) and publish

  template <class Fn>
  Fn entry() const {
    return reinterpret_cast<Fn>(const_cast<void*>(entry_ptr));
  }
};

// A kernel just built, and the bytes the on-disk cache keeps for it.
struct BuiltKernel {
  std::unique_ptr<Kernel> kernel;
  std::vector<uint8_t> payload;
};

// How to make a kernel: compile it, or rebuild it from a stored payload.
struct KernelRecipe {
  std::function<BuiltKernel()> compile;
  std::function<std::unique_ptr<Kernel>(std::vector<uint8_t>)> load;
};

// Places position-independent Xbyak bytes in executable memory.
std::unique_ptr<Kernel> make_xbyak_kernel(const std::vector<uint8_t>& bytes);
// The recipe of an Xbyak kernel whose bytes come from `emit`.
KernelRecipe xbyak_recipe(std::function<std::vector<uint8_t>()> emit);

}  // namespace tilejit::jit
