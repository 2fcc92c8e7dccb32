// LLVM IR for the attention engine's operand packing:
//  - Qᵀ: 16 query rows × 16 bf16 pairs per tile, loaded as 16 vectors of
//    32-bit words (masked past D/2, so the K padding is zero), transposed in
//    registers (transpose16) and stored as 16 contiguous 64-byte rows of the
//    vnni2 B layout; it replaces 4096 scattered 4-byte stores per 64-row block
//    at D = 128.
//  - Vᵀ: 16 keys × 16 columns per tile, widened to 32 bits, transposed,
//    narrowed, stored as 16 runs of 32 bytes; it replaces one 2-byte store
//    per element.
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include <vector>

#include "codegen/llvm/llvm_softmax.h"
#include "codegen/llvm/llvm_softmax_ir.h"

namespace tilejit::codegen::llvm_backend {
namespace {

class PackQEmitter : public TileWalkEmitter<SoftmaxPackQArgs> {
  using TileWalkEmitter::TileWalkEmitter;

  // 16-row groups × tiles of 16 pairs.
  Grid grid() override {
    return {arg(TILEJIT_ARG(Args, groups)), tiles(arg(TILEJIT_ARG(Args, pairs)))};
  }

  // Rows r0.. × pairs kp0..
  void tile(llvm::Value* r0, llvm::Value* kp0) override {
    llvm::Type* i32v = vm_.i32v();
    // Lanes l with kp0 + l < words hold data.
    std::vector<llvm::Constant*> iota;
    for (int l = 0; l < kTile; ++l) iota.push_back(b_.getInt64(l));
    llvm::Value* lane_kp = b_.CreateAdd(vm_.splat(kp0), llvm::ConstantVector::get(iota));
    llvm::Value* mask = b_.CreateICmpSLT(lane_kp, vm_.splat(arg(TILEJIT_ARG(Args, words))));
    Vals v = rows16([&](int i) {  // words kp0.. of row r0 + i
      llvm::Value* row = b_.CreateAlignedLoad(
          b_.getPtrTy(),
          b_.CreateGEP(b_.getPtrTy(), arg(TILEJIT_ARG(Args, rows)), b_.CreateAdd(r0, i64(i))),
          llvm::Align(8));
      llvm::Value* src = b_.CreateGEP(b_.getInt32Ty(), row, kp0);
      return b_.CreateMaskedLoad(i32v, src, llvm::Align(2), mask,
                                 llvm::Constant::getNullValue(i32v));
    });
    transpose16(b_, v);
    for (int j = 0; j < kTile; ++j) {
      llvm::Value* at =
          b_.CreateAdd(b_.CreateMul(b_.CreateAdd(kp0, i64(j)), i64(kSoftmaxRows)), r0);
      b_.CreateAlignedStore(v[j], b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, out)), at),
                            llvm::Align(4));
    }
  }
};

class TransposeVEmitter : public TileWalkEmitter<SoftmaxTransposeVArgs> {
  using TileWalkEmitter::TileWalkEmitter;

  // Tiles of 16 keys (rounded up) × tiles of 16 columns.
  Grid grid() override { return tiles_of(TILEJIT_ARG(Args, keys), TILEJIT_ARG(Args, dv)); }

  // Keys j0.. × columns c0..
  void tile(llvm::Value* j0, llvm::Value* c0) override {
    llvm::Type* i16v = vm_.i16v();
    Vals v = rows16([&](int i) {  // columns c0.. of key j0 + i, widened
      llvm::Value* row = b_.CreateAlignedLoad(
          b_.getPtrTy(),
          b_.CreateGEP(b_.getPtrTy(), arg(TILEJIT_ARG(Args, rows)), b_.CreateAdd(j0, i64(i))),
          llvm::Align(8));
      llvm::Value* x =
          b_.CreateAlignedLoad(i16v, b_.CreateGEP(b_.getInt16Ty(), row, c0), llvm::Align(2));
      return b_.CreateZExt(x, vm_.i32v());
    });
    transpose16(b_, v);
    for (int c = 0; c < kTile; ++c) {
      llvm::Value* at =
          b_.CreateAdd(b_.CreateMul(b_.CreateAdd(c0, i64(c)), arg(TILEJIT_ARG(Args, ld))), j0);
      b_.CreateAlignedStore(b_.CreateTrunc(v[c], i16v),
                            b_.CreateGEP(b_.getInt16Ty(), arg(TILEJIT_ARG(Args, out)), at),
                            llvm::Align(2));
    }
  }
};

}  // namespace

LlvmKernel compile_llvm_softmax_transpose_v(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_transpose_v");
  return compile_emitter<TransposeVEmitter>(kSoftmaxTransposeVName, opt);
}

LlvmKernel compile_llvm_softmax_pack_q(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_pack_q");
  return compile_emitter<PackQEmitter>(kSoftmaxPackQName, opt);
}

}  // namespace tilejit::codegen::llvm_backend
