// LLVM IR for the attention engine's online-softmax step. Shape of the
// emitted function (nz vectors of 16 query rows each, all groups together in
// every loop iteration for instruction-level parallelism):
//
//   bm = max over keys j of Sᵀ[j]              masked: visible keys of j < n only
//   bm ·= scale; upd = bm > ref + τ            (τ: kSoftmaxLazyRescale)
//   if any(upd):                               new reference where it moved
//     α = 2^((ref − new)·log2 e); ref = new; if any ref was finite: l ·= α, Oᵀ ·= α
//   for key pairs (j, j+1) < kb:
//     e = 2^(s·scale·log2 e − ref·log2 e)      masked: 0 outside [lo, hi] or past n
//     Pᵀ word = bf16(e_j) | bf16(e_j+1) << 16  round to nearest even
//     l += the rounded weights                 so numerator and denominator agree
//
// On AVX-512 hosts 2^n is one vscalefps and the bf16 pair one vcvtne2ps2bf16
// plus an interleaving shuffle (vpermw); elsewhere both are integer bit
// operations on the same values, so every host rounds alike.
#include "codegen/llvm/llvm_softmax.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <cmath>
#include <utility>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {

namespace {

constexpr unsigned kLanes = 16;
constexpr float kLog2e = 1.44269504088896341f;
// Below this 2^x is exactly 0 in both exp2 forms (one vscalefps underflow, or
// the exponent-bit construction, whose 2^−127 has all-zero bits).
constexpr float kExp2ClampScalef = -200.0f;
constexpr float kExp2ClampBits = -127.0f;

using Vals = std::vector<llvm::Value*>;

class SoftmaxEmitter : public KernelEmitter {
 public:
  SoftmaxEmitter(ModuleContext& mc, const SoftmaxStepDesc& d)
      : KernelEmitter(mc), nz_(d.nz), vm_(b_, kLanes) {
    scalef_ = mc.host.avx512f;
    cvtbf16_ = mc.host.avx512bf16;
  }

 private:
  using Args = SoftmaxStepArgs;

  void generate() override {
    j0_ = b_.CreateTrunc(arg(TILEJIT_ARG(Args, j0)), b_.getInt32Ty());
    llvm::Value* scale = arg(TILEJIT_ARG(Args, scale));
    llvm::Value* masked = b_.CreateICmpNE(arg(TILEJIT_ARG(Args, masked)), b_.getInt32(0));
    scale_ = vm_.splat(scale);
    for (int g = 0; g < nz_; ++g) {
      lo_.push_back(load(i32v(), arg(TILEJIT_ARG(Args, lo)), g * kLanes));
      hi_.push_back(load(i32v(), arg(TILEJIT_ARG(Args, hi)), g * kLanes));
    }

    // Pass 1: the block max of every row.
    // Rounding is monotonic, so for sm_scale >= 0 max(s)·scale is bit for bit
    // the max of the scaled scores: the scaled pass (a multiply per score)
    // only serves a negative scale.
    llvm::Value* neg = b_.CreateFCmpOLT(scale, llvm::ConstantFP::get(b_.getFloatTy(), 0.0));
    const Vals bm = branch(
        neg,
        [&] {
          return branch(
              masked, [&] { return block_max(true, true); },
              [&] { return block_max(false, true); });
        },
        [&] {
          Vals m = branch(
              masked, [&] { return block_max(true, false); },
              [&] { return block_max(false, false); });
          for (llvm::Value*& v : m) v = b_.CreateFMul(v, scale_);
          return m;
        });

    // The reference: moves only where the max outgrew it by more than τ.
    Vals ref, nref, upd;
    llvm::Value* any_upd = b_.getFalse();
    for (int g = 0; g < nz_; ++g) {
      llvm::Value* bmg = bm[g];
      ref.push_back(load(f32v(), arg(TILEJIT_ARG(Args, m)), g * kLanes));
      upd.push_back(b_.CreateFCmpOGT(bmg, b_.CreateFAdd(ref[g], vm_.f32(kSoftmaxLazyRescale))));
      nref.push_back(b_.CreateSelect(upd[g], bmg, ref[g]));
      any_upd = b_.CreateOr(any_upd, any(upd[g]));
    }
    ref = branch(
        any_upd,
        [&] {
          rescale(ref, nref, upd);
          return nref;
        },
        [&] { return ref; });

    // Pass 2: weights, bf16 pairs, sums.
    Vals off;
    for (int g = 0; g < nz_; ++g) {
      // A row with no visible key yet keeps ref = −inf; its weights are 0 anyway.
      llvm::Value* none = b_.CreateFCmpOEQ(ref[g], vm_.f32(-INFINITY));
      off.push_back(b_.CreateSelect(none, vm_.f32(0.0f), ref[g]));
    }
    const Vals sum = branch(
        masked, [&] { return weights(off, true); }, [&] { return weights(off, false); });
    for (int g = 0; g < nz_; ++g)
      store(b_.CreateFAdd(load(f32v(), arg(TILEJIT_ARG(Args, l)), g * kLanes), sum[g]),
            arg(TILEJIT_ARG(Args, l)), g * kLanes);
  }

  llvm::Type* f32v() const { return vm_.f32v(); }
  llvm::Type* i32v() const { return vm_.i32v(); }
  // 16 elements at base[offset] (elements of the vector's type).
  llvm::Value* load(llvm::Type* vt, llvm::Value* base, llvm::Value* offset) {
    auto* et = llvm::cast<llvm::VectorType>(vt)->getElementType();
    return b_.CreateAlignedLoad(vt, b_.CreateGEP(et, base, offset), llvm::Align(4));
  }
  llvm::Value* load(llvm::Type* vt, llvm::Value* base, int64_t offset) {
    return load(vt, base, i64(offset));
  }
  void store(llvm::Value* v, llvm::Value* base, llvm::Value* offset) {
    auto* et = llvm::cast<llvm::VectorType>(v->getType())->getElementType();
    b_.CreateAlignedStore(v, b_.CreateGEP(et, base, offset), llvm::Align(4));
  }
  void store(llvm::Value* v, llvm::Value* base, int64_t offset) { store(v, base, i64(offset)); }

  // Element offset of row j, group g of a [·][64] operand.
  llvm::Value* at(llvm::Value* j, int g) {
    return b_.CreateAdd(b_.CreateMul(j, i64(kSoftmaxRows)), i64(g * kLanes));
  }

  llvm::Value* any(llvm::Value* mask) {
    return b_.CreateICmpNE(b_.CreateBitCast(mask, b_.getInt16Ty()), b_.getInt16(0));
  }

  // if (cond) then() else otherwise(), both returning nz values; returns their phis.
  Vals branch(llvm::Value* cond, const Branch& then, const Branch& otherwise) {
    return emit_if_else(b_, cond, then, otherwise, "if");
  }

  // Rows of group g that see key j0 + j.
  llvm::Value* visible(llvm::Value* j, int g) {
    llvm::Value* key = vm_.splat(b_.CreateAdd(j0_, b_.CreateTrunc(j, b_.getInt32Ty())));
    return b_.CreateAnd(b_.CreateICmpSGE(key, lo_[g]), b_.CreateICmpSLE(key, hi_[g]));
  }

  // The block max of each row over its visible keys' scores: scaled first
  // when `scaled` (a negative sm_scale), else unscaled.
  Vals block_max(bool masked, bool scaled) {
    Vals init(nz_, vm_.f32(-INFINITY));
    return emit_loop(
        b_, masked ? arg(TILEJIT_ARG(Args, n)) : arg(TILEJIT_ARG(Args, kb)), init,
        [&](llvm::Value* j, const Vals& bm) {
          Vals out;
          for (int g = 0; g < nz_; ++g) {
            llvm::Value* v = load(f32v(), arg(TILEJIT_ARG(Args, s)), at(j, g));
            if (scaled) v = b_.CreateFMul(v, scale_);
            llvm::Value* take = b_.CreateFCmpOGT(v, bm[g]);  // vmaxps
            if (masked) take = b_.CreateAnd(take, visible(j, g));
            out.push_back(b_.CreateSelect(take, v, bm[g]));
          }
          return out;
        },
        masked ? "max_masked" : "max");
  }

  // α = e^(ref − new) where the reference moved (0 for a row's first visible
  // block: ref = −inf, and its O and l are still 0), 1 elsewhere.
  void rescale(const Vals& ref, const Vals& nref, const Vals& upd) {
    Vals alpha;
    llvm::Value* any_live = b_.getFalse();
    for (int g = 0; g < nz_; ++g) {
      llvm::Value* e = exp2(b_.CreateFMul(b_.CreateFSub(ref[g], nref[g]), vm_.f32(kLog2e)), true);
      alpha.push_back(b_.CreateSelect(upd[g], e, vm_.f32(1.0f)));
      any_live = b_.CreateOr(any_live, any(b_.CreateFCmpONE(ref[g], vm_.f32(-INFINITY))));
      store(nref[g], arg(TILEJIT_ARG(Args, m)), g * kLanes);
    }
    branch(
        any_live,
        [&] {
          for (int g = 0; g < nz_; ++g)
            store(b_.CreateFMul(load(f32v(), arg(TILEJIT_ARG(Args, l)), g * kLanes), alpha[g]),
                  arg(TILEJIT_ARG(Args, l)), g * kLanes);
          emit_loop(
              b_, arg(TILEJIT_ARG(Args, dv)), {},
              [&](llvm::Value* c, const Vals&) {
                for (int g = 0; g < nz_; ++g) {
                  llvm::Value* o = at(c, g);
                  store(b_.CreateFMul(load(f32v(), arg(TILEJIT_ARG(Args, ot)), o), alpha[g]),
                        arg(TILEJIT_ARG(Args, ot)), o);
                }
                return Vals{};
              },
              "rescale_o");
          return Vals{};
        },
        [&] { return Vals{}; });
  }

  // 2^x, x = n + f with n = round(x), |f| ≤ 1/2; 2^f by a degree-5 polynomial
  // (rel. error < 3·10⁻⁶, far below the bf16 rounding of P). clamp: x may be
  // −inf (masked or −inf scores), which must give exactly 0. A NaN x (a NaN
  // score) must stay NaN, so the clamp is "x < lo ? lo : x" (vmaxps with x
  // second: x86 returns the second operand when one is NaN), never the other
  // way round, which would turn a NaN score into a weight of 0 and hide it.
  llvm::Value* exp2(llvm::Value* x, bool clamp) {
    if (clamp || !scalef_) {
      const float lo = scalef_ ? kExp2ClampScalef : kExp2ClampBits;
      x = b_.CreateSelect(b_.CreateFCmpOLT(x, vm_.f32(lo)), vm_.f32(lo), x);
    }
    llvm::Value* n = b_.CreateUnaryIntrinsic(llvm::Intrinsic::roundeven, x);
    llvm::Value* f = b_.CreateFSub(x, n);
    llvm::Value* p = vm_.f32(1.33335581e-3f);
    for (float c : {9.61812911e-3f, 5.55041087e-2f, 2.40226507e-1f, 6.93147181e-1f, 1.0f})
      p = vm_.fma(p, f, vm_.f32(c));
    if (scalef_)
      return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_mask_scalef_ps_512, {},
                                {p, n, vm_.f32(0.0f), b_.getInt16(0xffff), b_.getInt32(4)});
    // n ≥ −127: (n + 127) << 23 is 2^n, and exactly 0 at −127. fptosi of a
    // NaN n is poison in LLVM IR; frozen, it is some integer, and p (NaN
    // then) keeps the product NaN.
    llvm::Value* ni = b_.CreateFreeze(b_.CreateFPToSI(n, i32v()));
    llvm::Value* bits = b_.CreateShl(b_.CreateAdd(ni, vm_.i32(127)), vm_.i32(23));
    return b_.CreateFMul(p, b_.CreateBitCast(bits, f32v()));
  }

  // The Pᵀ word of weights e0 (key j, low half) and e1 (key j + 1, high half),
  // each rounded to bf16 (nearest even; finite, ≥ 0), and their rounded sum.
  std::pair<llvm::Value*, llvm::Value*> pack(llvm::Value* e0, llvm::Value* e1) {
    llvm::Value* hi_mask = vm_.i32(0xffff0000u);
    llvm::Value *word, *r0, *r1;
    if (cvtbf16_) {
      // Words 0..15 = bf16(e0), 16..31 = bf16(e1); interleave to (e0[i], e1[i]) pairs.
      llvm::Value* both =
          b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_cvtne2ps2bf16_512, {}, {e1, e0});
      both = b_.CreateBitCast(both, llvm::FixedVectorType::get(b_.getInt16Ty(), 32));
      std::vector<int> idx;
      for (unsigned i = 0; i < kLanes; ++i) idx.push_back(int(i)), idx.push_back(int(i + kLanes));
      word = b_.CreateBitCast(b_.CreateShuffleVector(both, idx), i32v());
      r0 = b_.CreateShl(word, vm_.i32(16));
      r1 = b_.CreateAnd(word, hi_mask);
    } else {
      auto round = [&](llvm::Value* e) {
        llvm::Value* u = b_.CreateBitCast(e, i32v());
        llvm::Value* odd = b_.CreateAnd(b_.CreateLShr(u, vm_.i32(16)), vm_.i32(1));
        return b_.CreateAnd(b_.CreateAdd(u, b_.CreateAdd(odd, vm_.i32(0x7fff))), hi_mask);
      };
      r0 = round(e0);
      r1 = round(e1);
      word = b_.CreateOr(b_.CreateLShr(r0, vm_.i32(16)), r1);
    }
    llvm::Value* sum = b_.CreateFAdd(b_.CreateBitCast(r0, f32v()), b_.CreateBitCast(r1, f32v()));
    return {word, sum};
  }

  // log2 of key j's weight in group g: (s·scale − ref)·log2e, the scaled
  // score rounded as block_max rounded it and ref subtracted before the
  // log2e scaling (no FMA: IRBuilder sets no contract flag), so the key that
  // set ref gets exactly 2^0 = 1 and a row's sum is at least 1. The FMA form
  // s·(scale·log2e) − ref·log2e rounded its two products apart: at scaled
  // scores near 2^31 the difference was hundreds of units off and every
  // weight of a row flushed to 0.
  llvm::Value* exponent(llvm::Value* j, int g, llvm::Value* ref) {
    llvm::Value* x = b_.CreateFMul(load(f32v(), arg(TILEJIT_ARG(Args, s)), at(j, g)), scale_);
    return b_.CreateFMul(b_.CreateFSub(x, ref), vm_.f32(kLog2e));
  }

  Vals weights(const Vals& off, bool masked) {
    Vals init(nz_, vm_.f32(0.0f));
    return emit_loop(
        b_, b_.CreateLShr(arg(TILEJIT_ARG(Args, kb)), i64(1)), init,
        [&](llvm::Value* kp, const Vals& sum) {
          llvm::Value* j = b_.CreateShl(kp, i64(1));
          llvm::Value* j1 = b_.CreateAdd(j, i64(1));
          Vals out;
          for (int g = 0; g < nz_; ++g) {
            llvm::Value* e0 = exp2(exponent(j, g, off[g]), masked);
            llvm::Value* e1 = exp2(exponent(j1, g, off[g]), masked);
            if (masked) {
              llvm::Value* in0 = vm_.splat(b_.CreateICmpSLT(j, arg(TILEJIT_ARG(Args, n))));
              llvm::Value* in1 = vm_.splat(b_.CreateICmpSLT(j1, arg(TILEJIT_ARG(Args, n))));
              e0 = b_.CreateSelect(b_.CreateAnd(visible(j, g), in0), e0, vm_.f32(0.0f));
              e1 = b_.CreateSelect(b_.CreateAnd(visible(j1, g), in1), e1, vm_.f32(0.0f));
            }
            const auto [word, rounded] = pack(e0, e1);
            store(word, arg(TILEJIT_ARG(Args, pt)),
                  b_.CreateAdd(b_.CreateMul(kp, i64(kSoftmaxRows)), i64(g * kLanes)));
            out.push_back(b_.CreateFAdd(sum[g], rounded));
          }
          return out;
        },
        masked ? "weights_masked" : "weights");
  }

  int nz_;
  VectorMath vm_;
  bool scalef_ = false, cvtbf16_ = false;
  llvm::Value* j0_ = nullptr;
  llvm::Value* scale_ = nullptr;
  Vals lo_, hi_;
};

}  // namespace

LlvmKernel compile_llvm_softmax_step(const SoftmaxStepDesc& desc, OptLevel opt) {
  if (desc.nz < 1 || desc.nz > 4)
    throw Error("compile_llvm_softmax_step: nz=" + std::to_string(desc.nz) +
                "; allowed: 1..4 (16-row groups of a 64-row block)");
  require_vector_host("compile_llvm_softmax_step");
  return compile_emitter<SoftmaxEmitter>(desc.name(), opt, desc);
}

}  // namespace tilejit::codegen::llvm_backend
