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

// The cache key llvm_kernel() gives `key`: it joined with the host's LLVM CPU
// and a hash of its feature string ("<key>;llvm_cpu=znver4;llvm_features=<16
// hex digits>"). Exported so the tool prints the key the cache uses
// (tests/tool_test.sh compares it with TILEJIT_VERBOSE's log).
std::string llvm_host_key(const std::string& key);

}  // namespace tilejit::jit
