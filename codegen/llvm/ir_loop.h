// Counted loops in LLVM IR with loop-carried SSA values (the accumulators of
// a micro-kernel stay in registers across iterations instead of going through
// memory). Includes LLVM headers: for .cpp files of codegen/llvm/ only.
#pragma once

#include <llvm/IR/IRBuilder.h>

#include <functional>
#include <string>
#include <vector>

namespace tilejit::codegen::llvm_backend {

using LoopBody = std::function<std::vector<llvm::Value*>(llvm::Value* iv,
                                                         const std::vector<llvm::Value*>& carried)>;

// Emits `for (iv = 0; iv < count; ++iv) carried = body(iv, carried);` at the
// builder's insertion point (count is i64) and leaves the builder after the
// loop; returns the carried values as they are after it. A constant count of
// zero or less emits nothing; a runtime count is guarded, so it may be ≤ 0.
std::vector<llvm::Value*> emit_loop(llvm::IRBuilder<>& b, llvm::Value* count,
                                    std::vector<llvm::Value*> carried, const LoopBody& body,
                                    const std::string& name);

}  // namespace tilejit::codegen::llvm_backend
