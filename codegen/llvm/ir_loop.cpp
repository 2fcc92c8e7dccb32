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
  std::vector<llvm::Value*> result;
  for (size_t i = 0; i < carried.size(); ++i) {
    llvm::PHINode* p = b.CreatePHI(carried[i]->getType(), 2);
    p->addIncoming(carried[i], pre);
    p->addIncoming(out[i], latch);
    result.push_back(p);
  }
  return result;
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

llvm::Value* load_arg_field(llvm::IRBuilder<>& b, llvm::Value* args, int64_t byte, llvm::Type* t,
                            unsigned align) {
  auto* v =
      b.CreateAlignedLoad(t, b.CreateConstGEP1_64(b.getInt8Ty(), args, byte), llvm::Align(align));
  v->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(b.getContext(), {}));
  return v;
}

}  // namespace tilejit::codegen::llvm_backend
