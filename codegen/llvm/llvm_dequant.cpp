// LLVM IR for the dequantization kernel (codegen/quant_desc.h). Shape of the
// emitted function:
//
//   for r < rows:                                    runtime count
//     g = groups[r]; s = scales + 64·g; z = zeros + 64·g
//     for each L columns c0 (L = 16 with AVX-512, else 8; unrolled, 64 / L):
//       fp8:  2L code bytes, split into even / odd k by shuffles
//       int4: L code bytes, low nibble even k, high nibble odd k
//       mxfp4: as int4; e2m1 nibble -> f32 by bit arithmetic and a select
//       v = exact f32 value of each; w = v · s[c0..]        (one multiply)
//       even / odd bf16 (RNE, NaN quiet) interleaved into 2L outputs, stored
//   out = i8 (W4A8, u4 only): per pair of k-pair rows, q − z of both as the
//   bytes of one dword per column (the int8 k-quad layout), no scale; the
//   column sums carried through the loop and stored once (generate_i8)
//
// Every step is exact or one IEEE operation, as the contract writes it, and
// none depends on MXCSR's DAZ / FTZ beyond that multiply (which the scalar
// reference shares): e4m3 codes are converted by VectorMath::f8e4m3_to_f32
// (integer arithmetic and normal f32 operands), the bf16 rounding is integer arithmetic
// (vcvtneps2bf16 would flush subnormal products to zero).
#include "codegen/llvm/llvm_dequant.h"

#include <llvm/IR/IRBuilder.h>

#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {
namespace {

constexpr int kCols = 64;  // columns of a packed row

class DequantEmitter : public KernelEmitter {
 public:
  DequantEmitter(ModuleContext& mc, const DequantDesc& d)
      : KernelEmitter(mc),
        d_(d),
        lanes_(mc.host.vector_bits >= 512 ? 16 : 8),
        vm_(b_, static_cast<unsigned>(lanes_)) {}

 private:
  using Args = DequantArgs;

  void generate() override {
    if (d_.out == DType::i8) return generate_i8();
    emit_loop(
        b_, arg(TILEJIT_ARG(Args, rows)), {},
        [&](llvm::Value* r, const std::vector<llvm::Value*>&) {
          row(r);
          return std::vector<llvm::Value*>{};
        },
        "row");
  }

  llvm::Value* byte_gep(llvm::Value* p, llvm::Value* off) {
    return b_.CreateGEP(b_.getInt8Ty(), p, off);
  }
  llvm::FixedVectorType* vec(llvm::Type* t, int n) { return llvm::FixedVectorType::get(t, n); }
  std::vector<int> iota(int start, int step) {
    std::vector<int> v;
    for (int l = 0; l < lanes_; ++l) v.push_back(start + step * l);
    return v;
  }

  // e2m1 nibbles (<L x i32> in 0..15) -> f32, exactly: with m = q & 7 (two
  // exponent bits, one mantissa bit), m >= 2 is the normal value
  // (1 + (m & 1)/2) · 2^((m >> 1) − 1), whose f32 bits are (m << 22) + (126 << 23);
  // m < 2 is m · 0.5; bit 3 the sign (0x8 is −0).
  llvm::Value* e2m1_to_f32(llvm::Value* q) {
    llvm::Value* mag = b_.CreateAnd(q, vm_.i32(7));
    llvm::Value* normal = b_.CreateAdd(b_.CreateShl(mag, vm_.i32(22)), vm_.i32(126u << 23));
    llvm::Value* sub = b_.CreateBitCast(
        b_.CreateFMul(b_.CreateSIToFP(mag, vm_.f32v()), vm_.f32(0.5f)), vm_.i32v());
    llvm::Value* m = b_.CreateSelect(b_.CreateICmpULT(mag, vm_.i32(2)), sub, normal);
    llvm::Value* sign = b_.CreateShl(b_.CreateAnd(q, vm_.i32(8)), vm_.i32(28));
    return b_.CreateBitCast(b_.CreateOr(m, sign), vm_.f32v());
  }

  void row(llvm::Value* r) {
    llvm::Value* g = b_.CreateSExt(
        b_.CreateAlignedLoad(b_.getInt32Ty(),
                             b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, groups)), r),
                             llvm::Align(4)),
        b_.getInt64Ty());
    llvm::Value* grow = b_.CreateMul(g, i64(kCols));  // element index of the group's row
    // f32 scales, or MXFP4's e8m0 bytes (DequantArgs::scales).
    const bool e8m0 = d_.code == DType::f4e2m1;
    llvm::Value* scale_row =
        e8m0 ? byte_gep(arg(TILEJIT_ARG(Args, scales)), grow)
             : b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, scales)), grow);
    llvm::Value* zero_row =
        d_.zeros ? b_.CreateGEP(b_.getInt8Ty(), arg(TILEJIT_ARG(Args, zeros)), grow) : nullptr;
    const bool fp8 = d_.code == DType::f8e4m3;
    llvm::Value* code_row =
        byte_gep(arg(TILEJIT_ARG(Args, codes)), b_.CreateMul(r, i64(fp8 ? 2 * kCols : kCols)));
    llvm::Value* out_row =
        b_.CreateGEP(b_.getInt16Ty(), arg(TILEJIT_ARG(Args, out)), b_.CreateMul(r, i64(2 * kCols)));
    llvm::Type* i8 = b_.getInt8Ty();
    for (int c0 = 0; c0 < kCols; c0 += lanes_) {
      llvm::Value* s =
          e8m0 ? vm_.e8m0_to_f32(b_.CreateAlignedLoad(vec(b_.getInt8Ty(), lanes_),
                                                      byte_gep(scale_row, i64(c0)), llvm::Align(1)))
               : b_.CreateAlignedLoad(vm_.f32v(), b_.CreateGEP(b_.getFloatTy(), scale_row, i64(c0)),
                                      llvm::Align(4));
      llvm::Value *ve, *vo;
      if (fp8) {
        llvm::Value* bytes = b_.CreateAlignedLoad(vec(i8, 2 * lanes_),
                                                  byte_gep(code_row, i64(2 * c0)), llvm::Align(1));
        ve = vm_.f8e4m3_to_f32(b_.CreateShuffleVector(bytes, iota(0, 2)));
        vo = vm_.f8e4m3_to_f32(b_.CreateShuffleVector(bytes, iota(1, 2)));
      } else if (d_.code == DType::f4e2m1) {
        llvm::Value* bytes = b_.CreateZExt(
            b_.CreateAlignedLoad(vec(i8, lanes_), byte_gep(code_row, i64(c0)), llvm::Align(1)),
            vm_.i32v());
        ve = e2m1_to_f32(b_.CreateAnd(bytes, vm_.i32(0xF)));
        vo = e2m1_to_f32(b_.CreateLShr(bytes, vm_.i32(4)));
      } else {
        llvm::Value* bytes = b_.CreateZExt(
            b_.CreateAlignedLoad(vec(i8, lanes_), byte_gep(code_row, i64(c0)), llvm::Align(1)),
            vm_.i32v());
        llvm::Value* z = vm_.i32(8);
        if (zero_row != nullptr)
          z = b_.CreateZExt(
              b_.CreateAlignedLoad(vec(i8, lanes_), byte_gep(zero_row, i64(c0)), llvm::Align(1)),
              vm_.i32v());
        // q − z is exact in i32 and in f32 (|q − z| ≤ 255).
        ve = b_.CreateSIToFP(b_.CreateSub(b_.CreateAnd(bytes, vm_.i32(0xF)), z), vm_.f32v());
        vo = b_.CreateSIToFP(b_.CreateSub(b_.CreateLShr(bytes, vm_.i32(4)), z), vm_.f32v());
      }
      llvm::Value* we = vm_.f32_to_bf16(b_.CreateFMul(ve, s));
      llvm::Value* wo = vm_.f32_to_bf16(b_.CreateFMul(vo, s));
      std::vector<int> interleave;
      for (int l = 0; l < lanes_; ++l) interleave.push_back(l), interleave.push_back(lanes_ + l);
      b_.CreateAlignedStore(b_.CreateShuffleVector(we, wo, interleave),
                            b_.CreateGEP(b_.getInt16Ty(), out_row, i64(2 * c0)), llvm::Align(2));
    }
  }

  // out = i8 (W4A8): per quad row j (k-pair rows r0 = 2j and r1 = 2j + 1;
  // r1 = rows is the missing row of an odd count, read as r0 and masked to
  // 0), per L columns: the dword of column c is the bytes (q − z) of
  // (r0 even, r0 odd, r1 even, r1 odd); the column sums ride the loop.
  void generate_i8() {
    llvm::Value* rows = arg(TILEJIT_ARG(Args, rows));
    llvm::Value* quads = b_.CreateUDiv(b_.CreateAdd(rows, i64(1)), i64(2));
    std::vector<llvm::Value*> sums(kCols / lanes_, llvm::Constant::getNullValue(vm_.i32v()));
    sums = emit_loop(
        b_, quads, sums,
        [&](llvm::Value* j, const std::vector<llvm::Value*>& in) {
          std::vector<llvm::Value*> cur = in;
          llvm::Value* r0 = b_.CreateMul(j, i64(2));
          llvm::Value* r1 = b_.CreateAdd(r0, i64(1));
          llvm::Value* has_r1 = b_.CreateICmpULT(r1, rows);
          r1 = b_.CreateSelect(has_r1, r1, r0);
          llvm::Value* keep = b_.CreateSelect(has_r1, vm_.i32(-1), vm_.i32(0));
          llvm::Value* out_row =
              byte_gep(arg(TILEJIT_ARG(Args, out)), b_.CreateMul(j, i64(4 * kCols)));
          for (int c0 = 0, v = 0; c0 < kCols; c0 += lanes_, ++v) {
            llvm::Value *e0, *o0, *e1, *o1;
            nibbles(r0, c0, &e0, &o0);
            nibbles(r1, c0, &e1, &o1);
            e1 = b_.CreateAnd(e1, keep);
            o1 = b_.CreateAnd(o1, keep);
            cur[v] = b_.CreateAdd(cur[v], b_.CreateAdd(b_.CreateAdd(e0, o0), b_.CreateAdd(e1, o1)));
            auto byte = [&](llvm::Value* x, int at) {
              return b_.CreateShl(b_.CreateAnd(x, vm_.i32(0xFF)), vm_.i32(8 * at));
            };
            llvm::Value* word = b_.CreateOr(b_.CreateOr(byte(e0, 0), byte(o0, 1)),
                                            b_.CreateOr(byte(e1, 2), byte(o1, 3)));
            b_.CreateAlignedStore(word, byte_gep(out_row, i64(4 * c0)), llvm::Align(4));
          }
          return cur;
        },
        "quad");
    // comp, when given: the column sums (the zero-point compensation).
    llvm::Value* comp = arg(TILEJIT_ARG(Args, comp));
    llvm::Function* fn = b_.GetInsertBlock()->getParent();
    llvm::BasicBlock* store_bb = llvm::BasicBlock::Create(b_.getContext(), "comp", fn);
    llvm::BasicBlock* done_bb = llvm::BasicBlock::Create(b_.getContext(), "done", fn);
    b_.CreateCondBr(b_.CreateIsNotNull(comp), store_bb, done_bb);
    b_.SetInsertPoint(store_bb);
    for (int v = 0; v < kCols / lanes_; ++v)
      b_.CreateAlignedStore(sums[v], b_.CreateGEP(b_.getInt32Ty(), comp, i64(v * lanes_)),
                            llvm::Align(4));
    b_.CreateBr(done_bb);
    b_.SetInsertPoint(done_bb);
  }

  // The u4 codes of k-pair row r, columns c0 .. c0 + L − 1, minus their
  // zero points (the row's group; 8 without zeros): even and odd k, as i32.
  void nibbles(llvm::Value* r, int c0, llvm::Value** even, llvm::Value** odd) {
    llvm::Value* g = b_.CreateSExt(
        b_.CreateAlignedLoad(b_.getInt32Ty(),
                             b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, groups)), r),
                             llvm::Align(4)),
        b_.getInt64Ty());
    llvm::Type* i8 = b_.getInt8Ty();
    llvm::Value* code_row = byte_gep(arg(TILEJIT_ARG(Args, codes)), b_.CreateMul(r, i64(kCols)));
    llvm::Value* bytes = b_.CreateZExt(
        b_.CreateAlignedLoad(vec(i8, lanes_), byte_gep(code_row, i64(c0)), llvm::Align(1)),
        vm_.i32v());
    llvm::Value* z = vm_.i32(8);
    if (d_.zeros) {
      llvm::Value* zero_row = byte_gep(arg(TILEJIT_ARG(Args, zeros)), b_.CreateMul(g, i64(kCols)));
      z = b_.CreateZExt(
          b_.CreateAlignedLoad(vec(i8, lanes_), byte_gep(zero_row, i64(c0)), llvm::Align(1)),
          vm_.i32v());
    }
    *even = b_.CreateSub(b_.CreateAnd(bytes, vm_.i32(0xF)), z);
    *odd = b_.CreateSub(b_.CreateLShr(bytes, vm_.i32(4)), z);
  }

  const DequantDesc& d_;
  int lanes_;
  VectorMath vm_;
};

void check(const DequantDesc& d) {
  auto bad = [&](const std::string& what) {
    throw Error("compile_llvm_dequant: " + what + " (kernel " + llvm_dequant_name(d) + ")");
  };
  if (d.code != DType::f8e4m3 && d.code != DType::u4 && d.code != DType::f4e2m1)
    bad(std::string("code = ") + dtype_name(d.code) + " is not supported (f8e4m3, u4 or f4e2m1)");
  if (d.zeros && d.code != DType::u4) bad("zero points are for u4 codes only");
  if (d.out != DType::bf16 && !(d.out == DType::i8 && d.code == DType::u4))
    bad(std::string("out = ") + dtype_name(d.out) + " with code = " + dtype_name(d.code) +
        " is not supported (bf16, or i8 with u4 codes)");
}

}  // namespace

std::string llvm_dequant_name(const DequantDesc& d) {
  DequantDesc n = d;
  n.isa = Isa::scalar;  // any value: its spelling is replaced below
  const std::string s = n.name();
  const std::string prefix = std::string("dequant_") + isa_name(n.isa);
  return "dequant_llvm" + s.substr(prefix.size());
}

LlvmKernel compile_llvm_dequant(const DequantDesc& d, OptLevel opt) {
  check(d);
  require_vector_host("compile_llvm_dequant");
  return compile_emitter<DequantEmitter>(llvm_dequant_name(d), opt, d);
}

}  // namespace tilejit::codegen::llvm_backend
