// LLVM IR for kv_quant (codegen/kv_quant_desc.h). Shape of the emitted function:
//
//   for h < heads:
//     full 16-lane chunks of the head's row (plain loads and stores), then one
//     masked chunk for the tail (never past the row):
//       q = bf16_to_f32(x) / scale[h]   (fdiv: the caller's rounding mode, as
//                                        the reference's division; a
//                                        power-of-two scale multiplies by its
//                                        exact reciprocal instead, as the
//                                        Xbyak kernel: the same q bit for bit)
//       runtime::f32_to_fp8's rule (the desc's code format) on the bits of q, lane by lane (integer
//       ops and selects; the subnormal codes by roundeven, which lowers to a
//       rounding instruction with an immediate mode, not MXCSR's)
//       trunc to i8, store
#include "codegen/llvm/llvm_kv_quant.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>

#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"
#include "runtime/quant_formats.h"

namespace tilejit::codegen::llvm_backend {

namespace {

constexpr int kLanes = 16;

class KvQuantEmitter : public KernelEmitter {
 public:
  KvQuantEmitter(ModuleContext& mc, const KvQuantDesc& d)
      : KernelEmitter(mc), f_(format(d)), vm_(b_, kLanes) {}

 private:
  using Args = KvQuantArgs;

  void generate() override {
    emit_loop(
        b_, arg(TILEJIT_ARG(Args, heads)), {},
        [&](llvm::Value* h, const std::vector<llvm::Value*>&) {
          head(h);
          return std::vector<llvm::Value*>{};
        },
        "head");
  }

  llvm::Type* i8v() { return llvm::FixedVectorType::get(b_.getInt8Ty(), kLanes); }

  static const runtime::Fp8Format& format(const KvQuantDesc& d) {
    const runtime::Fp8Format* f = runtime::fp8_format_of(d.code);
    if (!f)
      throw Error(std::string("kv_quant: code=") + dtype_name(d.code) +
                  "; allowed: f8e4m3, f8e5m2");
    return *f;
  }

  // runtime::f32_to_fp8(f_, ·) of each lane of q (<16 x float>), as <16 x i8>.
  llvm::Value* to_fp8(llvm::Value* q) {
    const uint32_t shift = 23 - f_.man_bits;
    llvm::Value* u = b_.CreateBitCast(q, vm_.i32v());
    llvm::Value* a = b_.CreateAnd(u, vm_.i32(0x7FFFFFFFu));
    llvm::Value* sign = b_.CreateAnd(b_.CreateLShr(u, vm_.i32(24)), vm_.i32(0x80));
    // Normal: the mantissa rounded to man_bits bits (nearest even), rebiased.
    llvm::Value* r = b_.CreateAdd(b_.CreateAdd(a, vm_.i32((1u << (shift - 1)) - 1)),
                                  b_.CreateAnd(b_.CreateLShr(a, vm_.i32(shift)), vm_.i32(1)));
    llvm::Value* normal =
        b_.CreateSub(b_.CreateLShr(r, vm_.i32(shift)),
                     vm_.i32(static_cast<uint32_t>(127 - f_.bias) << f_.man_bits));
    // Subnormal (a below the least normal): rne(|q|·sub_scale), exact; other
    // lanes use the least normal so the conversion stays defined.
    llvm::Value* is_sub = b_.CreateICmpULT(a, vm_.i32(f_.normal_bits));
    llvm::Value* mag =
        b_.CreateBitCast(b_.CreateSelect(is_sub, a, vm_.i32(f_.normal_bits)), vm_.f32v());
    llvm::Value* m =
        b_.CreateFPToSI(b_.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven,
                                                b_.CreateFMul(mag, vm_.f32(f_.sub_scale))),
                        vm_.i32v());
    llvm::Value* code = b_.CreateSelect(is_sub, m, normal);
    code = b_.CreateSelect(b_.CreateICmpUGE(a, vm_.i32(f_.max_bits)), vm_.i32(f_.max_code), code);
    code = b_.CreateOr(code, sign);
    code = b_.CreateSelect(b_.CreateICmpUGT(a, vm_.i32(0x7F800000u)), vm_.i32(0x7F), code);
    return b_.CreateTrunc(code, i8v());
  }

  void head(llvm::Value* h) {
    llvm::Value* xrow = b_.CreateGEP(b_.getInt16Ty(), arg(TILEJIT_ARG(Args, x)),
                                     b_.CreateMul(h, arg(TILEJIT_ARG(Args, x_head))));
    llvm::Value* orow = b_.CreateGEP(b_.getInt8Ty(), arg(TILEJIT_ARG(Args, out)),
                                     b_.CreateMul(h, arg(TILEJIT_ARG(Args, out_head))));
    llvm::Value* s = b_.CreateAlignedLoad(
        b_.getFloatTy(), b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, scales)), h),
        llvm::Align(4));
    // A power-of-two scale 2^(e − 127) with e in [1, 253] (1.0, sglang's
    // default, among them): 1/s = 2^(127 − e) is a normal float and x·(1/s)
    // the exact x/s in every rounding mode, so a multiply replaces the
    // divide (the row's bound); any other scale divides.
    llvm::Value* sbits = b_.CreateBitCast(s, b_.getInt32Ty());
    llvm::Value* e = b_.CreateAnd(b_.CreateLShr(sbits, b_.getInt32(23)), b_.getInt32(0xFF));
    llvm::Value* pow2 =
        b_.CreateAnd(b_.CreateICmpEQ(b_.CreateAnd(sbits, b_.getInt32(0x7FFFFF)), b_.getInt32(0)),
                     b_.CreateICmpULE(b_.CreateSub(e, b_.getInt32(1)), b_.getInt32(252)));
    llvm::Value* recip = b_.CreateBitCast(
        b_.CreateOr(b_.CreateAnd(sbits, b_.getInt32(0x80000000u)),
                    b_.CreateShl(b_.CreateSub(b_.getInt32(254), e), b_.getInt32(23))),
        b_.getFloatTy());
    emit_if_else(
        b_, pow2,
        [&] {
          row(xrow, orow, vm_.splat(recip), true);
          return std::vector<llvm::Value*>{};
        },
        [&] {
          row(xrow, orow, vm_.splat(s), false);
          return std::vector<llvm::Value*>{};
        },
        "pow2");
  }

  // The codes of one head's row: q = x·sv (sv = 1/s exactly) or x / sv.
  void row(llvm::Value* xrow, llvm::Value* orow, llvm::Value* sv, bool multiply) {
    llvm::Value* d = arg(TILEJIT_ARG(Args, d));
    const auto chunk = [&](llvm::Value* at, llvm::Value* mask) {
      llvm::Value* src = b_.CreateGEP(b_.getInt16Ty(), xrow, at);
      llvm::Value* bits = nullptr;
      if (mask == nullptr)
        bits = b_.CreateAlignedLoad(vm_.i16v(), src, llvm::Align(2));
      else
        bits = b_.CreateMaskedLoad(vm_.i16v(), src, llvm::Align(2), mask,
                                   llvm::Constant::getNullValue(vm_.i16v()));
      llvm::Value* x = vm_.bf16_to_f32(bits);
      llvm::Value* codes = to_fp8(multiply ? b_.CreateFMul(x, sv) : b_.CreateFDiv(x, sv));
      llvm::Value* dst = b_.CreateGEP(b_.getInt8Ty(), orow, at);
      if (mask == nullptr)
        b_.CreateAlignedStore(codes, dst, llvm::Align(1));
      else
        b_.CreateMaskedStore(codes, dst, llvm::Align(1), mask);
    };
    llvm::Value* full = b_.CreateAShr(d, i64(4));
    llvm::Value* tail_at = b_.CreateShl(full, i64(4));
    emit_loop(
        b_, full, {},
        [&](llvm::Value* c, const std::vector<llvm::Value*>&) {
          chunk(b_.CreateShl(c, i64(4)), nullptr);
          return std::vector<llvm::Value*>{};
        },
        "chunk");
    chunk(tail_at, vm_.lane_mask(b_.CreateSub(d, tail_at)));
  }

  const runtime::Fp8Format& f_;
  VectorMath vm_;
};

}  // namespace

LlvmKernel compile_llvm_kv_quant(const codegen::KvQuantDesc& d, OptLevel opt) {
  require_vector_host("compile_llvm_kv_quant");
  return compile_emitter<KvQuantEmitter>(d.name(), opt, d);
}

}  // namespace tilejit::codegen::llvm_backend
