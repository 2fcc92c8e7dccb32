#include "codegen/llvm/emitter_base.h"

#include <vector>

#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {

void KernelEmitter::emit(const std::string& name) {
  fn_ = mc_.define_kernel(name);
  entry_ = llvm::BasicBlock::Create(mc_.ctx, "entry", fn_);
  b_.SetInsertPoint(entry_);
  generate();
  b_.CreateRetVoid();
}

namespace {
llvm::LoadInst* load_invariant(llvm::IRBuilder<>& b, llvm::Type* t, llvm::Value* p, unsigned align,
                               const llvm::Twine& name) {
  llvm::LoadInst* v = b.CreateAlignedLoad(t, p, llvm::Align(align), name);
  v->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(b.getContext(), {}));
  return v;
}
}  // namespace

llvm::Value* KernelEmitter::invariant_load(llvm::Type* t, llvm::Value* p, unsigned align,
                                           const llvm::Twine& name) {
  return load_invariant(b_, t, p, align, name);
}

llvm::Value* KernelEmitter::const_mask(int lanes, int active) {
  std::vector<llvm::Constant*> m;
  for (int l = 0; l < lanes; ++l) m.push_back(b_.getInt1(l < active));
  return llvm::ConstantVector::get(m);
}

llvm::Value* KernelEmitter::load_f32(llvm::Value* p, DType t, llvm::Value* at, int lanes,
                                     int active) {
  llvm::Type* et = storage(t);
  auto* vt = llvm::FixedVectorType::get(et, lanes);
  llvm::Value* q = b_.CreateGEP(et, p, at);
  llvm::Value* raw = active == lanes
                         ? static_cast<llvm::Value*>(b_.CreateAlignedLoad(vt, q, align(t)))
                         : b_.CreateMaskedLoad(vt, q, align(t), const_mask(lanes, active),
                                               llvm::Constant::getNullValue(vt));
  if (t == DType::f32) return raw;
  return VectorMath(b_, static_cast<unsigned>(lanes)).bf16_to_f32(raw);
}

llvm::Value* KernelEmitter::load_field(int64_t offset, llvm::Type* t, unsigned align,
                                       const char* name) {
  if (auto it = fields_.find(offset); it != fields_.end()) return it->second.load;
  // In the entry block, between the loaded fields below and above this one
  // (or first of all): the loads stay in offset order ahead of other code.
  llvm::IRBuilder<> at(mc_.ctx);
  auto above = fields_.upper_bound(offset);
  if (above != fields_.end())
    at.SetInsertPoint(above->second.first);
  else if (!fields_.empty() && fields_.rbegin()->second.load->getNextNode() != nullptr)
    at.SetInsertPoint(fields_.rbegin()->second.load->getNextNode());
  else if (fields_.empty() && !entry_->empty())
    at.SetInsertPoint(&entry_->front());
  else
    at.SetInsertPoint(entry_);
  llvm::Value* p = at.CreateConstGEP1_64(at.getInt8Ty(), fn_->getArg(0), offset);
  llvm::LoadInst* v = load_invariant(at, t, p, align, name);
  auto* first = llvm::dyn_cast<llvm::Instruction>(p);
  fields_.emplace(offset, Loaded{first != nullptr ? first : v, v});
  return v;
}

}  // namespace tilejit::codegen::llvm_backend
