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

// The field at byte offset `byte` of a kernel's argument struct. The struct is
// never written while the kernel runs, so the load is marked invariant (LLVM
// may hoist it out of any loop). `align` is the field's alignment.
llvm::Value* load_arg_field(llvm::IRBuilder<>& b, llvm::Value* args, int64_t byte, llvm::Type* t,
                            unsigned align = 8);

}  // namespace tilejit::codegen::llvm_backend
