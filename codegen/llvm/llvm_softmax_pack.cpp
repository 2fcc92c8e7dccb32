// LLVM IR for the attention engine's Qᵀ pack: 16 query rows × 16 bf16 pairs
// per tile, loaded as 16 vectors of 32-bit words (masked past D/2, so the
// K padding is zero), transposed in registers (transpose16) and stored as 16
// contiguous 64-byte rows of the vnni2 B layout. It replaces 4096 scattered
// 4-byte stores per 64-row block at D = 128.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include <vector>

#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/llvm_softmax.h"
#include "codegen/llvm/llvm_softmax_ir.h"
#include "codegen/llvm/module_context.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {
namespace {

constexpr int kLanes = 16;
using Vals = std::vector<llvm::Value*>;

class PackQEmitter {
 public:
  explicit PackQEmitter(ModuleContext& mc) : mc_(mc), b_(mc.ctx), vm_(b_, kLanes) {}

  void emit(const std::string& name) {
    llvm::Function* fn = mc_.define_kernel(name);
    b_.SetInsertPoint(llvm::BasicBlock::Create(mc_.ctx, "entry", fn));
    llvm::Value* args = fn->getArg(0);
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64t = b_.getInt64Ty();
    rows_ = field(args, 0, ptr);
    out_ = field(args, 8, ptr);
    llvm::Value* groups = field(args, 16, i64t);
    words_ = field(args, 24, i64t);
    llvm::Value* pairs = field(args, 32, i64t);
    emit_loop(
        b_, groups, {},
        [&](llvm::Value* g, const Vals&) {
          emit_loop(
              b_, b_.CreateUDiv(pairs, i64(kLanes)), {},
              [&](llvm::Value* t, const Vals&) {
                tile(g, t);
                return Vals{};
              },
              "tiles");
          return Vals{};
        },
        "group");
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  llvm::Value* field(llvm::Value* args, int64_t byte, llvm::Type* t) {
    auto* v =
        b_.CreateAlignedLoad(t, b_.CreateConstGEP1_64(b_.getInt8Ty(), args, byte), llvm::Align(8));
    v->setMetadata(llvm::LLVMContext::MD_invariant_load, llvm::MDNode::get(mc_.ctx, {}));
    return v;
  }

  // Rows 16g.. × pairs 16t..
  void tile(llvm::Value* g, llvm::Value* t) {
    llvm::Type* i32v = vm_.i32v();
    llvm::Value* r0 = b_.CreateMul(g, i64(kLanes));
    llvm::Value* kp0 = b_.CreateMul(t, i64(kLanes));
    // Lanes l with kp0 + l < words hold data.
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < kLanes; ++l) iota.push_back(b_.getInt64(l));
    llvm::Value* lane_kp = b_.CreateAdd(vm_.splat(kp0), llvm::ConstantVector::get(iota));
    llvm::Value* mask = b_.CreateICmpSLT(lane_kp, vm_.splat(words_));
    Vals v;  // v[i] = words kp0.. of row r0 + i
    for (int i = 0; i < kLanes; ++i) {
      llvm::Value* row = b_.CreateAlignedLoad(
          b_.getPtrTy(), b_.CreateGEP(b_.getPtrTy(), rows_, b_.CreateAdd(r0, i64(i))),
          llvm::Align(8));
      llvm::Value* src = b_.CreateGEP(b_.getInt32Ty(), row, kp0);
      v.push_back(
          b_.CreateMaskedLoad(i32v, src, llvm::Align(2), mask, llvm::Constant::getNullValue(i32v)));
    }
    transpose16(b_, v);
    for (int j = 0; j < kLanes; ++j) {
      llvm::Value* at =
          b_.CreateAdd(b_.CreateMul(b_.CreateAdd(kp0, i64(j)), i64(kSoftmaxRows)), r0);
      b_.CreateAlignedStore(v[j], b_.CreateGEP(b_.getInt32Ty(), out_, at), llvm::Align(4));
    }
  }

  ModuleContext& mc_;
  llvm::IRBuilder<> b_;
  VectorMath vm_;
  llvm::Value *rows_ = nullptr, *out_ = nullptr, *words_ = nullptr;
};

}  // namespace

LlvmKernel compile_llvm_softmax_pack_q(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_pack_q");
  return compile_module(
      kSoftmaxPackQName, [&](ModuleContext& mc) { PackQEmitter(mc).emit(kSoftmaxPackQName); }, opt);
}

}  // namespace tilejit::codegen::llvm_backend
