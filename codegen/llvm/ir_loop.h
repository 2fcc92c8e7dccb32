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

// for (i < outer) for (j < inner) body(i, j): the 2-D tile walk of the
// attention glue kernels (counts are i64, may be runtime values ≤ 0).
void emit_tile_loops(llvm::IRBuilder<>& b, llvm::Value* outer, llvm::Value* inner,
                     const std::function<void(llvm::Value* i, llvm::Value* j)>& body,
                     const std::string& outer_name, const std::string& inner_name);

using Branch = std::function<std::vector<llvm::Value*>()>;

// if (cond) then() else otherwise() at the builder's insertion point (blocks
// `name`, `name`.else and the join, `name`.end); leaves the builder in the
// join and returns the phis of the values both sides return (the same number
// and types).
std::vector<llvm::Value*> emit_if_else(llvm::IRBuilder<>& b, llvm::Value* cond, const Branch& then,
                                       const Branch& otherwise, const std::string& name);

// Phis at the builder's insertion point (the head of a block that `from_a`
// and `from_b` branch to) joining a[i] from from_a with bv[i] from from_b.
std::vector<llvm::Value*> join_values(llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& a,
                                      llvm::BasicBlock* from_a, const std::vector<llvm::Value*>& bv,
                                      llvm::BasicBlock* from_b);

}  // namespace tilejit::codegen::llvm_backend
