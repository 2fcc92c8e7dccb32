// LLVM-compiled kernels through the process-wide kernel cache: one recipe for
// every LLVM kernel family (brgemm, RoPE, decode attention, ...).
#pragma once

#include <functional>
#include <string>

#include "codegen/llvm/llvm_jit.h"
#include "jit/kernel.h"

namespace tilejit::jit {

// The cached kernel `name`, compiled once by `compile` on a miss (or relinked
// from the on-disk cache). LLVM code is compiled for exactly this host's CPU
// and features, so they join `key` here.
const Kernel& llvm_kernel(const std::string& key, const std::string& name,
                          const std::function<codegen::llvm_backend::LlvmKernel()>& compile);

}  // namespace tilejit::jit
