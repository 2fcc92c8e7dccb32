// LLVM IR for the attention engine's block finish: Oᵀ [dv][64] (query rows
// along the lanes, as the P·V micro-kernel leaves it) back to bf16 output
// rows, scaled by each row's 1/l. Per 16 rows × 16 columns: 16 loads, a
// 16 × 16 transpose in registers (transpose16), one multiply, one bf16
// conversion and one 32-byte store per row.
#include <llvm/IR/IRBuilder.h>

#include <utility>
#include <vector>

#include "codegen/llvm/llvm_softmax.h"
#include "codegen/llvm/llvm_softmax_ir.h"

namespace tilejit::codegen::llvm_backend {
namespace {

class FinishEmitter : public TileWalkEmitter<SoftmaxFinishArgs> {
  using TileWalkEmitter::TileWalkEmitter;

  // 16-row groups (rounded up) × tiles of 16 columns.
  Grid grid() override { return tiles_of(TILEJIT_ARG(Args, rows), TILEJIT_ARG(Args, dv)); }

  // Rows r0.. × columns c0..: transpose, scale, convert, store.
  void tile(llvm::Value* r0, llvm::Value* c0) override {
    Vals v = rows16([&](int i) {  // Oᵀ row c0 + i, lanes = rows r0..
      llvm::Value* at = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(c0, i64(i)), i64(kSoftmaxRows)), r0);
      return b_.CreateAlignedLoad(vm_.f32v(),
                                  b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, ot)), at),
                                  llvm::Align(4));
    });
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
    llvm::Value* bad_at = b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, bad)), r0);
    llvm::Value* bad = b_.CreateAlignedLoad(vm_.f32v(), bad_at, llvm::Align(4));
    b_.CreateAlignedStore(vm_.fma(sum[0], vm_.f32(0.0f), bad), bad_at, llvm::Align(4));
    transpose16(b_, v);
    llvm::Value* fv = b_.CreateAlignedLoad(
        vm_.f32v(), b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, f)), r0), llvm::Align(4));
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    for (int r = 0; r < kTile; ++r) {
      llvm::Value* row = b_.CreateAdd(r0, i64(r));
      auto* store = llvm::BasicBlock::Create(mc_.ctx, "store", fn);
      auto* next = llvm::BasicBlock::Create(mc_.ctx, "next", fn);
      b_.CreateCondBr(b_.CreateICmpSLT(row, arg(TILEJIT_ARG(Args, rows))), store, next);
      b_.SetInsertPoint(store);
      llvm::Value* scale = vm_.splat(b_.CreateExtractElement(fv, b_.getInt32(r)));
      llvm::Value* bits = vm_.f32_to_bf16(b_.CreateFMul(v[r], scale));
      llvm::Value* dst = b_.CreateAlignedLoad(
          b_.getPtrTy(), b_.CreateGEP(b_.getPtrTy(), arg(TILEJIT_ARG(Args, out)), row),
          llvm::Align(8));
      b_.CreateAlignedStore(bits, b_.CreateGEP(b_.getInt16Ty(), dst, c0), llvm::Align(2));
      b_.CreateBr(next);
      b_.SetInsertPoint(next);
    }
  }
};

}  // namespace

LlvmKernel compile_llvm_softmax_finish(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_finish");
  return compile_emitter<FinishEmitter>(kSoftmaxFinishName, opt);
}

}  // namespace tilejit::codegen::llvm_backend
