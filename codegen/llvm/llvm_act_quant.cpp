// LLVM IR for act_quant. Shape of the emitted function:
//
//   for i < rows:
//     range:    full 16-lane chunks of x[i] (plain loads), then one masked
//               tail (never past the row): umax of bits & 0x7FFF (max |x| for
//               sym, and the NaN / Inf test: >= 0x7F80), asym also the f32
//               min / max as std::min / std::max write them (fcmp + select:
//               a NaN x keeps the running value)
//     params:   scalar f32, in the contract's order
//     quantize: the same chunks: x · inv, clamp to ±512, rint, + zero, clamp
//               to the code range; a row with a NaN / Inf stores the zero point
//     zeros from k to k_padded
// A NaN product converts to INT_MIN in the reference (x86 cvt): here the
// clamp sends it to −512, which reaches the same low code-range clamp; the
// zero point (not clamped to ±512 first) maps NaN and |v| >= 2^31 to 0 alike.
#include "codegen/llvm/llvm_act_quant.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"
#include "runtime/reference_quant.h"

namespace tilejit::codegen::llvm_backend {

namespace {

constexpr int kLanes = 16;

class ActQuantEmitter : public KernelEmitter {
 public:
  ActQuantEmitter(ModuleContext& mc, const ActQuantDesc& d)
      : KernelEmitter(mc), d_(d), vm_(b_, kLanes) {}

 private:
  using Args = ActQuantArgs;

  void generate() override {
    emit_loop(
        b_, arg(TILEJIT_ARG(Args, rows)), {},
        [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
          row(i);
          return std::vector<llvm::Value*>{};
        },
        "row");
  }

  llvm::Type* i16v() { return llvm::FixedVectorType::get(b_.getInt16Ty(), kLanes); }
  llvm::Type* i8v() { return llvm::FixedVectorType::get(b_.getInt8Ty(), kLanes); }
  llvm::Value* f32(float v) { return llvm::ConstantFP::get(b_.getFloatTy(), v); }
  llvm::Value* i32(int32_t v) { return b_.getInt32(static_cast<uint32_t>(v)); }

  llvm::Value* load_chunk(llvm::Value* row, llvm::Value* at, llvm::Value* mask) {
    llvm::Value* p = b_.CreateGEP(b_.getInt16Ty(), row, at);
    if (mask == nullptr) return b_.CreateAlignedLoad(i16v(), p, llvm::Align(2));
    return b_.CreateMaskedLoad(i16v(), p, llvm::Align(2), mask,
                               llvm::Constant::getNullValue(i16v()));
  }

  // std::min(a, x) = x < a ? x : a; std::max(a, x) = a < x ? x : a.
  llvm::Value* min_of(llvm::Value* a, llvm::Value* x) {
    return b_.CreateSelect(b_.CreateFCmpOLT(x, a), x, a);
  }
  llvm::Value* max_of(llvm::Value* a, llvm::Value* x) {
    return b_.CreateSelect(b_.CreateFCmpOLT(a, x), x, a);
  }

  // Range accumulators: {umax |bits|, lo, hi}.
  std::vector<llvm::Value*> range_step(const std::vector<llvm::Value*>& acc, llvm::Value* bits) {
    std::vector<llvm::Value*> out = acc;
    llvm::Value* mag = b_.CreateAnd(bits, b_.CreateVectorSplat(kLanes, b_.getInt16(0x7FFF)));
    out[0] = b_.CreateBinaryIntrinsic(llvm::Intrinsic::umax, acc[0], mag);
    if (d_.mode == ActQuantMode::asym) {
      llvm::Value* x = vm_.bf16_to_f32(bits);
      out[1] = min_of(acc[1], x);
      out[2] = max_of(acc[2], x);
    }
    return out;
  }

  // clamp(v, −512, 512) with NaN -> −512, then roundeven (vroundps with an
  // immediate mode: RNE whatever the caller's MXCSR says; rint followed it) and
  // the i32 conversion.
  llvm::Value* rne_clamped(llvm::Value* v, llvm::Type* it) {
    llvm::Value* c = b_.CreateSelect(b_.CreateFCmpOLT(f32like(v, 512), v), f32like(v, 512), v);
    c = b_.CreateSelect(b_.CreateFCmpOGE(c, f32like(v, -512)), c, f32like(v, -512));
    return b_.CreateFPToSI(b_.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, c), it);
  }
  llvm::Value* f32like(llvm::Value* v, float c) {
    if (v->getType()->isVectorTy()) return vm_.f32(c);
    return f32(c);
  }

  llvm::Value* quantize(llvm::Value* bits, llvm::Value* inv, llvm::Value* zero, int lo_q) {
    llvm::Value* p = b_.CreateFMul(vm_.bf16_to_f32(bits), vm_.splat(inv));
    llvm::Value* q = b_.CreateAdd(rne_clamped(p, vm_.i32v()), vm_.splat(zero));
    q = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, q, vm_.i32(static_cast<uint32_t>(lo_q)));
    q = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, q, vm_.i32(255));
    return b_.CreateTrunc(q, i8v());
  }

  void row(llvm::Value* i) {
    llvm::Value* k = arg(TILEJIT_ARG(Args, k));
    llvm::Value* xrow = b_.CreateGEP(b_.getInt16Ty(), arg(TILEJIT_ARG(Args, x)),
                                     b_.CreateMul(i, arg(TILEJIT_ARG(Args, ldx))));
    llvm::Value* orow = b_.CreateGEP(b_.getInt8Ty(), arg(TILEJIT_ARG(Args, out)),
                                     b_.CreateMul(i, arg(TILEJIT_ARG(Args, ld_out))));
    llvm::Value* full = b_.CreateAShr(k, i64(4));  // whole chunks
    llvm::Value* tail_at = b_.CreateShl(full, i64(4));
    llvm::Value* tail_mask = vm_.lane_mask(b_.CreateSub(k, tail_at));

    // Range.
    std::vector<llvm::Value*> acc = {llvm::Constant::getNullValue(i16v())};
    if (d_.mode == ActQuantMode::asym) {
      acc.push_back(llvm::Constant::getNullValue(vm_.f32v()));
      acc.push_back(llvm::Constant::getNullValue(vm_.f32v()));
    }
    acc = emit_loop(
        b_, full, acc,
        [&](llvm::Value* c, const std::vector<llvm::Value*>& a) {
          return range_step(a, load_chunk(xrow, b_.CreateShl(c, i64(4)), nullptr));
        },
        "range");
    acc = range_step(acc, load_chunk(xrow, tail_at, tail_mask));
    llvm::Value* amax = b_.CreateIntMaxReduce(acc[0], /*IsSigned=*/false);
    llvm::Value* finite = b_.CreateICmpULT(amax, b_.getInt16(0x7F80));

    // Parameters.
    llvm::Value *inv = nullptr, *s = nullptr, *zero = nullptr;
    int lo_q = 0;
    switch (d_.mode) {
      case ActQuantMode::sym: {
        llvm::Value* a = b_.CreateBitCast(
            b_.CreateShl(b_.CreateZExt(amax, b_.getInt32Ty()), i32(16)), b_.getFloatTy());
        llvm::Value* is0 = b_.CreateICmpEQ(amax, b_.getInt16(0));
        a = b_.CreateMaxNum(a, f32(runtime::kActQuantMinRange));  // runtime::act_quant_step
        inv = b_.CreateSelect(is0, f32(1), b_.CreateFDiv(f32(127), a));
        s = b_.CreateSelect(is0, f32(1), b_.CreateFDiv(a, f32(127)));
        zero = i32(128);
        lo_q = 1;
        break;
      }
      case ActQuantMode::asym: {
        // No lane is NaN or −0 (only a strictly smaller / larger x replaces
        // the +0 start): the reduction order does not matter.
        llvm::Value* lo = b_.CreateFPMinReduce(acc[1]);
        llvm::Value* hi = b_.CreateFPMaxReduce(acc[2]);
        llvm::Value* r = b_.CreateFSub(hi, lo);
        llvm::Value* r0 = b_.CreateFCmpOEQ(r, f32(0));
        r = b_.CreateMaxNum(r, f32(runtime::kActQuantMinRange));  // runtime::act_quant_step
        inv = b_.CreateSelect(r0, f32(1), b_.CreateFDiv(f32(255), r));
        s = b_.CreateSelect(r0, f32(1), b_.CreateFDiv(r, f32(255)));
        // rne_to_int(−lo · inv) with no ±512 clamp: the reference's x86
        // conversion gives INT_MIN (then 0) for NaN and |t| >= 2^31.
        llvm::Value* t = b_.CreateFMul(b_.CreateFNeg(lo), inv);
        llvm::Value* valid =
            b_.CreateFCmpOLT(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, t), f32(2147483648.0f));
        llvm::Value* z = b_.CreateFPToSI(
            b_.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, b_.CreateSelect(valid, t, f32(0))),
            b_.getInt32Ty());
        z = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smax, z, i32(0));
        z = b_.CreateBinaryIntrinsic(llvm::Intrinsic::smin, z, i32(255));
        zero = b_.CreateSelect(valid, z, i32(0));
        break;
      }
      case ActQuantMode::fixed:
        inv = arg(TILEJIT_ARG(Args, inv_scale));
        s = arg(TILEJIT_ARG(Args, fixed_scale));
        zero = arg(TILEJIT_ARG(Args, fixed_zero));
        break;
    }
    s = b_.CreateSelect(finite, s, llvm::ConstantFP::getQNaN(b_.getFloatTy()));
    b_.CreateAlignedStore(s, b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, scale)), i),
                          llvm::Align(4));
    b_.CreateAlignedStore(zero, b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, zero)), i),
                          llvm::Align(4));

    // Quantize (a row with a NaN / Inf: the zero point everywhere).
    llvm::Value* zfill = b_.CreateVectorSplat(kLanes, b_.CreateTrunc(zero, b_.getInt8Ty()));
    const auto chunk = [&](llvm::Value* at, llvm::Value* mask) {
      llvm::Value* q =
          b_.CreateSelect(finite, quantize(load_chunk(xrow, at, mask), inv, zero, lo_q), zfill);
      llvm::Value* p = b_.CreateGEP(b_.getInt8Ty(), orow, at);
      if (mask == nullptr)
        b_.CreateAlignedStore(q, p, llvm::Align(1));
      else
        b_.CreateMaskedStore(q, p, llvm::Align(1), mask);
    };
    emit_loop(
        b_, full, {},
        [&](llvm::Value* c, const std::vector<llvm::Value*>&) {
          chunk(b_.CreateShl(c, i64(4)), nullptr);
          return std::vector<llvm::Value*>{};
        },
        "quantize");
    chunk(tail_at, tail_mask);

    // Zeros from k to k_padded.
    emit_loop(
        b_, b_.CreateSub(arg(TILEJIT_ARG(Args, k_padded)), k), {},
        [&](llvm::Value* j, const std::vector<llvm::Value*>&) {
          b_.CreateStore(b_.getInt8(0), b_.CreateGEP(b_.getInt8Ty(), orow, b_.CreateAdd(k, j)));
          return std::vector<llvm::Value*>{};
        },
        "pad");
  }

  const ActQuantDesc& d_;
  VectorMath vm_;
};

}  // namespace

LlvmKernel compile_llvm_act_quant(const codegen::ActQuantDesc& d, OptLevel opt) {
  require_vector_host("compile_llvm_act_quant");
  return compile_emitter<ActQuantEmitter>(d.name(), opt, d);
}

}  // namespace tilejit::codegen::llvm_backend
