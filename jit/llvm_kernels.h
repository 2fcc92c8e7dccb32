// How LLVM-compiled kernels enter the kernel cache: their key gains the host
// target, and their stored payload is the relocatable object file.
#pragma once

#include <functional>
#include <string>

#include "codegen/llvm/llvm_jit.h"
#include "jit/kernel.h"

namespace tilejit::jit {

// `key` plus the LLVM host CPU and a hash of its feature string: LLVM code is
// compiled for the host, so another CPU must not load it from disk.
std::string llvm_host_key(const std::string& key);

// The recipe of an LLVM kernel: `compile` builds it; a stored object is
// reloaded by looking up `symbol` in it. An empty symbol means the compile
// alone knows it: it is then stored ahead of the object in the payload.
KernelRecipe llvm_kernel_recipe(std::string symbol,
                                std::function<codegen::llvm_backend::LlvmKernel()> compile);

}  // namespace tilejit::jit
