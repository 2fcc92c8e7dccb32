// LLVM IR for the attention engine's block finish: Oᵀ [dv][64] (query rows
// along the lanes, as the P·V micro-kernel leaves it) back to bf16 output
// rows, scaled by each row's 1/l. Per 16 rows × 16 columns: 16 loads, a
// 16 × 16 transpose in registers (transpose16), one multiply, one bf16
// conversion and one 32-byte store per row.
#include <llvm/IR/IRBuilder.h>

#include <utility>
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

class FinishEmitter {
 public:
  explicit FinishEmitter(ModuleContext& mc) : mc_(mc), b_(mc.ctx), vm_(b_, kLanes) {}

  void emit(const std::string& name) {
    llvm::Function* fn = mc_.define_kernel(name);
    b_.SetInsertPoint(llvm::BasicBlock::Create(mc_.ctx, "entry", fn));
    llvm::Value* args = fn->getArg(0);
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64t = b_.getInt64Ty();
    ot_ = field(args, 0, ptr);
    f_ = field(args, 8, ptr);
    out_ = field(args, 16, ptr);
    rows_ = field(args, 24, i64t);
    llvm::Value* dv = field(args, 32, i64t);
    bad_ = field(args, 40, ptr);
    llvm::Value* groups = b_.CreateUDiv(b_.CreateAdd(rows_, i64(kLanes - 1)), i64(kLanes));
    emit_tile_loops(
        b_, groups, b_.CreateUDiv(dv, i64(kLanes)),
        [&](llvm::Value* g, llvm::Value* cb) { tile(g, cb); }, "group", "cols");
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  llvm::Value* field(llvm::Value* args, int64_t byte, llvm::Type* t) {
    return load_arg_field(b_, args, byte, t, 8);
  }

  // Rows 16g.. × columns 16cb..: transpose, scale, convert, store.
  void tile(llvm::Value* g, llvm::Value* cb) {
    llvm::Type* f32v = vm_.f32v();
    llvm::Value* r0 = b_.CreateMul(g, i64(kLanes));
    llvm::Value* c0 = b_.CreateMul(cb, i64(kLanes));
    Vals v;  // v[i] = Oᵀ row c0 + i, lanes = rows r0..
    for (int i = 0; i < kLanes; ++i) {
      llvm::Value* at = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(c0, i64(i)), i64(kSoftmaxRows)), r0);
      v.push_back(
          b_.CreateAlignedLoad(f32v, b_.CreateGEP(b_.getFloatTy(), ot_, at), llvm::Align(4)));
    }
    // Before the transpose the lanes are rows: bad[rows] += 0·Σ v[i] is NaN
    // exactly where a row's 16 values hold a NaN or an Inf (a tree of adds,
    // one multiply per tile: the NaN/Inf rule's check without a pass over out).
    Vals sum = v;
    while (sum.size() > 1) {
      Vals next;
      for (size_t i = 0; i + 1 < sum.size(); i += 2)
        next.push_back(b_.CreateFAdd(sum[i], sum[i + 1]));
      sum = std::move(next);
    }
    llvm::Value* bad_at = b_.CreateGEP(b_.getFloatTy(), bad_, r0);
    llvm::Value* bad = b_.CreateAlignedLoad(f32v, bad_at, llvm::Align(4));
    b_.CreateAlignedStore(vm_.fma(sum[0], vm_.f32(0.0f), bad), bad_at, llvm::Align(4));
    transpose16(b_, v);
    llvm::Value* fv =
        b_.CreateAlignedLoad(f32v, b_.CreateGEP(b_.getFloatTy(), f_, r0), llvm::Align(4));
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    for (int r = 0; r < kLanes; ++r) {
      llvm::Value* row = b_.CreateAdd(r0, i64(r));
      auto* store = llvm::BasicBlock::Create(mc_.ctx, "store", fn);
      auto* next = llvm::BasicBlock::Create(mc_.ctx, "next", fn);
      b_.CreateCondBr(b_.CreateICmpSLT(row, rows_), store, next);
      b_.SetInsertPoint(store);
      llvm::Value* scale = vm_.splat(b_.CreateExtractElement(fv, b_.getInt32(r)));
      llvm::Value* bits = vm_.f32_to_bf16(b_.CreateFMul(v[r], scale));
      llvm::Value* dst = b_.CreateAlignedLoad(b_.getPtrTy(), b_.CreateGEP(b_.getPtrTy(), out_, row),
                                              llvm::Align(8));
      b_.CreateAlignedStore(bits, b_.CreateGEP(b_.getInt16Ty(), dst, c0), llvm::Align(2));
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
    }
  }

  ModuleContext& mc_;
  llvm::IRBuilder<> b_;
  VectorMath vm_;
  llvm::Value *ot_ = nullptr, *f_ = nullptr, *out_ = nullptr, *rows_ = nullptr, *bad_ = nullptr;
};

}  // namespace

LlvmKernel compile_llvm_softmax_finish(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_finish");
  return compile_module(
      kSoftmaxFinishName, [&](ModuleContext& mc) { FinishEmitter(mc).emit(kSoftmaxFinishName); },
      opt);
}

}  // namespace tilejit::codegen::llvm_backend
