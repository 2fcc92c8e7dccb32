// The LLVM side of compile_module(): what an IR emitter gets to build into.
// Includes LLVM headers, so only .cpp files of codegen/llvm/ may include it
// (the rest of the project sees llvm_jit.h).
#pragma once

#include <llvm/IR/Function.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <string>

#include "codegen/llvm/llvm_jit.h"

namespace tilejit::codegen::llvm_backend {

struct ModuleContext {
  llvm::LLVMContext& ctx;
  llvm::Module& module;
  const HostTarget& host;

  // Declares `void name(ptr args)` with external linkage and the attributes
  // every tilejit kernel carries: the host CPU and features, 512-bit vectors
  // where AVX-512 is present (so <16 x float> maps to one zmm), nounwind, and
  // no-builtins (loop idioms must not become calls to memset/memcpy: the
  // kernels reference no external symbols). The argument (the args struct)
  // is nocapture readonly; nothing is declared noalias, since outputs may
  // alias inputs (accumulate in place).
  llvm::Function* define_kernel(const std::string& name) const;
};

}  // namespace tilejit::codegen::llvm_backend
