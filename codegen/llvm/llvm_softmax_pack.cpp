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
    emit_tile_loops(
        b_, groups, b_.CreateUDiv(pairs, i64(kLanes)),
        [&](llvm::Value* g, llvm::Value* t) { tile(g, t); }, "group", "tiles");
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  llvm::Value* field(llvm::Value* args, int64_t byte, llvm::Type* t) {
    return load_arg_field(b_, args, byte, t, 8);
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

class TransposeVEmitter {
 public:
  explicit TransposeVEmitter(ModuleContext& mc) : mc_(mc), b_(mc.ctx), vm_(b_, kLanes) {}

  void emit(const std::string& name) {
    llvm::Function* fn = mc_.define_kernel(name);
    b_.SetInsertPoint(llvm::BasicBlock::Create(mc_.ctx, "entry", fn));
    llvm::Value* args = fn->getArg(0);
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Type* i64t = b_.getInt64Ty();
    rows_ = field(args, 0, ptr);
    out_ = field(args, 8, ptr);
    ld_ = field(args, 16, i64t);
    llvm::Value* keys = field(args, 24, i64t);
    llvm::Value* dv = field(args, 32, i64t);
    llvm::Value* key_tiles = b_.CreateUDiv(b_.CreateAdd(keys, i64(kLanes - 1)), i64(kLanes));
    emit_tile_loops(
        b_, key_tiles, b_.CreateUDiv(dv, i64(kLanes)),
        [&](llvm::Value* kt, llvm::Value* ct) { tile(kt, ct); }, "keys", "cols");
    b_.CreateRetVoid();
  }

 private:
  llvm::Value* i64(int64_t v) { return b_.getInt64(static_cast<uint64_t>(v)); }

  llvm::Value* field(llvm::Value* args, int64_t byte, llvm::Type* t) {
    return load_arg_field(b_, args, byte, t, 8);
  }

  // Keys 16kt.. × columns 16ct..
  void tile(llvm::Value* kt, llvm::Value* ct) {
    llvm::Type* i16v = vm_.i16v();
    llvm::Value* j0 = b_.CreateMul(kt, i64(kLanes));
    llvm::Value* c0 = b_.CreateMul(ct, i64(kLanes));
    Vals v;  // v[i] = columns c0.. of key j0 + i, widened
    for (int i = 0; i < kLanes; ++i) {
      llvm::Value* row = b_.CreateAlignedLoad(
          b_.getPtrTy(), b_.CreateGEP(b_.getPtrTy(), rows_, b_.CreateAdd(j0, i64(i))),
          llvm::Align(8));
      llvm::Value* x =
          b_.CreateAlignedLoad(i16v, b_.CreateGEP(b_.getInt16Ty(), row, c0), llvm::Align(2));
      v.push_back(b_.CreateZExt(x, vm_.i32v()));
    }
    transpose16(b_, v);
    for (int c = 0; c < kLanes; ++c) {
      llvm::Value* at = b_.CreateAdd(b_.CreateMul(b_.CreateAdd(c0, i64(c)), ld_), j0);
      b_.CreateAlignedStore(b_.CreateTrunc(v[c], i16v), b_.CreateGEP(b_.getInt16Ty(), out_, at),
                            llvm::Align(2));
    }
  }

  ModuleContext& mc_;
  llvm::IRBuilder<> b_;
  VectorMath vm_;
  llvm::Value *rows_ = nullptr, *out_ = nullptr, *ld_ = nullptr;
};

}  // namespace

LlvmKernel compile_llvm_softmax_transpose_v(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_transpose_v");
  return compile_module(
      kSoftmaxTransposeVName,
      [&](ModuleContext& mc) { TransposeVEmitter(mc).emit(kSoftmaxTransposeVName); }, opt);
}

LlvmKernel compile_llvm_softmax_pack_q(OptLevel opt) {
  require_vector_host("compile_llvm_softmax_pack_q");
  return compile_module(
      kSoftmaxPackQName, [&](ModuleContext& mc) { PackQEmitter(mc).emit(kSoftmaxPackQName); }, opt);
}

}  // namespace tilejit::codegen::llvm_backend
