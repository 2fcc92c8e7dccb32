#include "codegen/llvm/ir_loop.h"

namespace tilejit::codegen::llvm_backend {

std::vector<llvm::Value*> emit_loop(llvm::IRBuilder<>& b, llvm::Value* count,
                                    std::vector<llvm::Value*> carried, const LoopBody& body,
                                    const std::string& name) {
  auto* constant = llvm::dyn_cast<llvm::ConstantInt>(count);
  if (constant != nullptr && constant->getSExtValue() <= 0) return carried;
  const bool guarded = constant == nullptr;

  llvm::LLVMContext& ctx = b.getContext();
  llvm::BasicBlock* pre = b.GetInsertBlock();
  llvm::Function* f = pre->getParent();
  auto* header = llvm::BasicBlock::Create(ctx, name, f);
  auto* exit = llvm::BasicBlock::Create(ctx, name + ".end", f);
  llvm::Type* i64 = b.getInt64Ty();
  if (guarded)
    b.CreateCondBr(b.CreateICmpSGT(count, llvm::ConstantInt::get(i64, 0)), header, exit);
  else
    b.CreateBr(header);

  b.SetInsertPoint(header);
  llvm::PHINode* iv = b.CreatePHI(i64, 2, name + ".iv");
  iv->addIncoming(llvm::ConstantInt::get(i64, 0), pre);
  std::vector<llvm::PHINode*> phis;
  std::vector<llvm::Value*> in;
  for (llvm::Value* v : carried) {
    llvm::PHINode* p = b.CreatePHI(v->getType(), 2);
    p->addIncoming(v, pre);
    phis.push_back(p);
    in.push_back(p);
  }
  std::vector<llvm::Value*> out = body(iv, in);
  llvm::BasicBlock* latch = b.GetInsertBlock();
  llvm::Value* next = b.CreateAdd(iv, llvm::ConstantInt::get(i64, 1));
  iv->addIncoming(next, latch);
  for (size_t i = 0; i < phis.size(); ++i) phis[i]->addIncoming(out[i], latch);
  b.CreateCondBr(b.CreateICmpSLT(next, count), header, exit);

  b.SetInsertPoint(exit);
  if (!guarded) return out;
  return join_values(b, carried, pre, out, latch);
}

void emit_tile_loops(llvm::IRBuilder<>& b, llvm::Value* outer, llvm::Value* inner,
                     const std::function<void(llvm::Value* i, llvm::Value* j)>& body,
                     const std::string& outer_name, const std::string& inner_name) {
  using Vals = std::vector<llvm::Value*>;
  emit_loop(
      b, outer, {},
      [&](llvm::Value* i, const Vals&) {
        emit_loop(
            b, inner, {},
            [&](llvm::Value* j, const Vals&) {
              body(i, j);
              return Vals{};
            },
            inner_name);
        return Vals{};
      },
      outer_name);
}

std::vector<llvm::Value*> emit_if_else(llvm::IRBuilder<>& b, llvm::Value* cond, const Branch& then,
                                       const Branch& otherwise, const std::string& name) {
  llvm::LLVMContext& ctx = b.getContext();
  llvm::Function* f = b.GetInsertBlock()->getParent();
  auto* yes = llvm::BasicBlock::Create(ctx, name, f);
  auto* no = llvm::BasicBlock::Create(ctx, name + ".else", f);
  auto* join = llvm::BasicBlock::Create(ctx, name + ".end", f);
  b.CreateCondBr(cond, yes, no);
  b.SetInsertPoint(yes);
  const std::vector<llvm::Value*> from_yes = then();
  llvm::BasicBlock* yes_end = b.GetInsertBlock();
  b.CreateBr(join);
  b.SetInsertPoint(no);
  const std::vector<llvm::Value*> from_no = otherwise();
  llvm::BasicBlock* no_end = b.GetInsertBlock();
  b.CreateBr(join);
  b.SetInsertPoint(join);
  return join_values(b, from_yes, yes_end, from_no, no_end);
}

std::vector<llvm::Value*> join_values(llvm::IRBuilder<>& b, const std::vector<llvm::Value*>& a,
                                      llvm::BasicBlock* from_a, const std::vector<llvm::Value*>& bv,
                                      llvm::BasicBlock* from_b) {
  std::vector<llvm::Value*> joined;
  for (size_t i = 0; i < a.size(); ++i) {
    llvm::PHINode* p = b.CreatePHI(a[i]->getType(), 2);
    p->addIncoming(a[i], from_a);
    p->addIncoming(bv[i], from_b);
    joined.push_back(p);
  }
  return joined;
}

}  // namespace tilejit::codegen::llvm_backend
