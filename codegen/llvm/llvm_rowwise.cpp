// LLVM IR for the row-wise kernels. Shape of the emitted function:
//
//   for r < rows:                                   runtime count
//     rms_norm, add_rms_norm:
//       pass 1, chunks of 16: v = x, or round(x + residual) stored to residual
//                             Σ v² in f32 within blocks of 8 chunks, the
//                             blocks' sums added in double
//       a row whose sum is not finite or is tiny: Σ v² again, all in double
//       rstd = 1 / sqrt(Σ / h + eps) in double, then f32
//       pass 2, chunks of 16: out = v·rstd·w (v read again: x, or the stored
//                             residual, i.e. what the next layer's add reads)
//     glu, chunks of 16 outputs: out = f(gate, up)
//
// The last chunk of a row whose length is not a multiple of 16 is masked:
// nothing past the row is read or written. f32 squares overflow from
// |x| ≈ 1.8e19 and vanish below 1e-19; the rows where that could matter
// (a sum that is not finite, or a mean + eps below 2^-100) take the double
// sum, so a row of huge or tiny values normalises as the definition does.
#include "codegen/llvm/llvm_rowwise.h"

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"

namespace tilejit::codegen::llvm_backend {

namespace {

constexpr int kLanes = 16;

[[noreturn]] void fail(const RowwiseDesc& d, const std::string& what) {
  throw Error("compile_llvm_rowwise: " + d.name() + ": " + what);
}

void check(const RowwiseDesc& d) {
  const auto need_float = [&](const char* field, DType t) {
    if (t != DType::f32 && t != DType::bf16)
      fail(d, std::string(field) + "=" + dtype_name(t) + "; allowed: f32, bf16");
  };
  need_float("x", d.x);
  need_float("out", d.out);
  if (d.op == RowOp::add_rms_norm) need_float("res", d.res);
  if (d.op != RowOp::glu && d.weight) need_float("w", d.w);
  if (d.h < 1 || d.h > Limits::max_dim)
    fail(d, "h=" + std::to_string(d.h) + "; allowed: 1 .. " + std::to_string(Limits::max_dim));
  switch (d.op) {
    case RowOp::rms_norm:
    case RowOp::add_rms_norm:
      if (d.glu != Glu::none) fail(d, "a norm with a glu; allowed: glu=none");
      return;
    case RowOp::glu:
      if (d.glu == Glu::act_mul) {
        activation_name(d.act);  // an Error for a value outside the enum
        return;
      }
      if (d.glu != Glu::clamped_swiglu) fail(d, "glu=none; allowed: act_mul, clamped_swiglu");
      if (!std::isfinite(d.alpha) || !std::isfinite(d.limit) || d.limit <= 0)
        fail(d, "clamped_swiglu alpha / limit; allowed: finite, limit > 0");
      return;
  }
  fail(d, "op outside RowOp");
}

class RowwiseEmitter : public KernelEmitter {
 public:
  RowwiseEmitter(ModuleContext& mc, const RowwiseDesc& d)
      : KernelEmitter(mc),
        d_(d),
        vm_(b_, kLanes),
        cvt_bf16_(mc.host.avx512bf16 && mc.host.vector_bits >= 512) {}

 private:
  using Args = RowwiseArgs;

  void generate() override {
    emit_loop(
        b_, arg(TILEJIT_ARG(Args, rows)), {},
        [&](llvm::Value* r, const std::vector<llvm::Value*>&) {
          if (d_.op == RowOp::glu)
            glu_row(r);
          else
            norm_row(r);
          return std::vector<llvm::Value*>{};
        },
        "row");
  }

  // Row r of a [rows, ·] operand of dtype t, stride in elements.
  llvm::Value* row_of(llvm::Value* base, DType t, llvm::Value* r, llvm::Value* stride) {
    return b_.CreateGEP(storage(t), base, b_.CreateMul(r, stride));
  }

  llvm::Value* load(llvm::Value* row, DType t, llvm::Value* at, int lanes, int active) {
    return load_f32(row, t, at, lanes, active);
  }

  // v rounded to t, its first `active` lanes stored at row[at]; returns the
  // stored values widened back to f32 (what reading them again gives).
  llvm::Value* store(llvm::Value* row, DType t, llvm::Value* at, llvm::Value* v, int active) {
    llvm::Value* bits = t == DType::bf16 ? to_bf16(v) : v;
    llvm::Value* p = b_.CreateGEP(storage(t), row, at);
    if (active == kLanes)
      b_.CreateAlignedStore(bits, p, align(t));
    else
      b_.CreateMaskedStore(bits, p, align(t), const_mask(kLanes, active));
    return t == DType::bf16 ? vm_.bf16_to_f32(bits) : v;
  }

  // f32 -> bf16 bits, round to nearest even, NaN quieted. With AVX512-BF16
  // one vcvtneps2bf16, which rounds and quiets alike but reads f32
  // subnormals as zero: a vector holding one (tiny rows only) takes the
  // integer rounding, so every host rounds alike. The integer form (9
  // instructions and a vpmovdw store per 16 values) cost rms_norm ~10 % and
  // fused_add_rms_norm, which rounds twice, ~25 % here.
  llvm::Value* to_bf16(llvm::Value* v) {
    if (!cvt_bf16_) return vm_.f32_to_bf16(v);
    llvm::Value* m = vm_.subnormal_lanes(v);
    llvm::Value* sub = b_.CreateICmpNE(b_.CreateBitCast(m, b_.getInt16Ty()), b_.getInt16(0));
    auto* words = llvm::FixedVectorType::get(b_.getInt16Ty(), kLanes);
    return emit_if_else(
        b_, sub, [&] { return std::vector<llvm::Value*>{vm_.f32_to_bf16(v)}; },
        [&] {
          llvm::Value* c =
              b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_cvtneps2bf16_512, {}, {v});
          return std::vector<llvm::Value*>{b_.CreateBitCast(c, words)};
        },
        "subnormal")[0];
  }

  // body(at, active) for every chunk of 16 of a row of n elements: the full
  // chunks in a loop, then the masked tail.
  void for_chunks(int64_t n, const std::function<void(llvm::Value*, int)>& body, const char* name) {
    emit_loop(
        b_, i64(n / kLanes), {},
        [&](llvm::Value* i, const std::vector<llvm::Value*>&) {
          body(b_.CreateMul(i, i64(kLanes)), kLanes);
          return std::vector<llvm::Value*>{};
        },
        name);
    if (n % kLanes) body(i64(n / kLanes * kLanes), static_cast<int>(n % kLanes));
  }

  // acc + the squares of v's lanes lo·8 .. lo·8 + 7, in double.
  llvm::Value* add_squares(llvm::Value* acc, llvm::Value* v, int half) {
    std::vector<int> idx;
    for (int l = 0; l < kLanes / 2; ++l) idx.push_back(half * kLanes / 2 + l);
    llvm::Value* d = b_.CreateFPExt(b_.CreateShuffleVector(v, idx), acc->getType());
    return b_.CreateIntrinsic(llvm::Intrinsic::fma, {acc->getType()}, {d, d, acc});
  }

  using ChunkSource = std::function<llvm::Value*(llvm::Value* at, int active)>;

  // Σ v² over the row's chunks of `src`, in double, as a double. Squares in
  // f32 within blocks of 8 chunks (four accumulators of two chunks each: the
  // fma latency, not the adds, would bound one chain), each block's sum
  // widened and added in double: 7 f32 roundings per lane at most, a
  // relative error ≤ 7·2⁻²⁴ of the sum (all terms are positive). Widening
  // every chunk instead (vcvtps2pd) bounded the loop at ~2 cycles per 16
  // values on this machine.
  llvm::Value* sum_squares_blocked(const ChunkSource& src) {
    constexpr int kBlock = 8;
    auto* fv = llvm::FixedVectorType::get(b_.getFloatTy(), kLanes);
    auto* dv = llvm::FixedVectorType::get(b_.getDoubleTy(), kLanes / 2);
    llvm::Value* fz = llvm::Constant::getNullValue(fv);
    llvm::Value* dz = llvm::Constant::getNullValue(dv);
    // The f32 block sum of `a` added to the double accumulators d.
    const auto fold = [&](const std::vector<llvm::Value*>& a, std::vector<llvm::Value*> d) {
      llvm::Value* f = b_.CreateFAdd(b_.CreateFAdd(a[0], a[1]), b_.CreateFAdd(a[2], a[3]));
      for (int half = 0; half < 2; ++half) {
        std::vector<int> idx;
        for (int l = 0; l < kLanes / 2; ++l) idx.push_back(half * kLanes / 2 + l);
        d[half] = b_.CreateFAdd(d[half], b_.CreateFPExt(b_.CreateShuffleVector(f, idx), dv));
      }
      return d;
    };
    const auto square = [&](llvm::Value* acc, llvm::Value* v) { return vm_.fma(v, v, acc); };
    const int64_t full = d_.h / kLanes, blocks = full / kBlock;
    std::vector<llvm::Value*> d = emit_loop(
        b_, i64(blocks), {dz, dz},
        [&](llvm::Value* i, const std::vector<llvm::Value*>& dc) {
          llvm::Value* base = b_.CreateMul(i, i64(kBlock * kLanes));
          std::vector<llvm::Value*> a(4, fz);
          for (int j = 0; j < kBlock; ++j)
            a[j % 4] = square(a[j % 4], src(b_.CreateAdd(base, i64(j * kLanes)), kLanes));
          return fold(a, dc);
        },
        "sumsq");
    // The last < 8 full chunks and the masked tail: one more block.
    std::vector<llvm::Value*> a(4, fz);
    for (int64_t j = blocks * kBlock; j < full; ++j)
      a[j % 4] = square(a[j % 4], src(i64(j * kLanes), kLanes));
    if (d_.h % kLanes) a[3] = square(a[3], src(i64(full * kLanes), int(d_.h % kLanes)));
    if (full % kBlock || d_.h % kLanes) d = fold(a, d);
    return b_.CreateFAddReduce(llvm::ConstantFP::get(b_.getDoubleTy(), 0.0),
                               b_.CreateFAdd(d[0], d[1]));
  }

  // Σ v² in double throughout (rows the blocked sum cannot hold): two chunks
  // per iteration into four <8 x double> accumulators.
  llvm::Value* sum_squares_double(const ChunkSource& src) {
    auto* dv = llvm::FixedVectorType::get(b_.getDoubleTy(), kLanes / 2);
    llvm::Value* zero = llvm::Constant::getNullValue(dv);
    const int64_t full = d_.h / kLanes;
    std::vector<llvm::Value*> acc = emit_loop(
        b_, i64(full / 2), {zero, zero, zero, zero},
        [&](llvm::Value* i, const std::vector<llvm::Value*>& a) {
          llvm::Value* at = b_.CreateMul(i, i64(2 * kLanes));
          llvm::Value* v0 = src(at, kLanes);
          llvm::Value* v1 = src(b_.CreateAdd(at, i64(kLanes)), kLanes);
          return std::vector<llvm::Value*>{add_squares(a[0], v0, 0), add_squares(a[1], v0, 1),
                                           add_squares(a[2], v1, 0), add_squares(a[3], v1, 1)};
        },
        "sumsq_exact");
    if (full % 2) {
      llvm::Value* v = src(i64((full - 1) * kLanes), kLanes);
      acc[0] = add_squares(acc[0], v, 0);
      acc[1] = add_squares(acc[1], v, 1);
    }
    if (d_.h % kLanes) {
      llvm::Value* v = src(i64(full * kLanes), static_cast<int>(d_.h % kLanes));
      acc[2] = add_squares(acc[2], v, 0);
      acc[3] = add_squares(acc[3], v, 1);
    }
    llvm::Value* sum = b_.CreateFAdd(b_.CreateFAdd(acc[0], acc[1]), b_.CreateFAdd(acc[2], acc[3]));
    return b_.CreateFAddReduce(llvm::ConstantFP::get(b_.getDoubleTy(), 0.0), sum);
  }

  void norm_row(llvm::Value* r) {
    const bool add = d_.op == RowOp::add_rms_norm;
    llvm::Value* x = row_of(arg(TILEJIT_ARG(Args, x)), d_.x, r, arg(TILEJIT_ARG(Args, x_stride)));
    llvm::Value* res = add ? row_of(arg(TILEJIT_ARG(Args, residual)), d_.res, r,
                                    arg(TILEJIT_ARG(Args, res_stride)))
                           : nullptr;
    llvm::Value* out =
        row_of(arg(TILEJIT_ARG(Args, out)), d_.out, r, arg(TILEJIT_ARG(Args, out_stride)));
    // Pass 1's value of a chunk: x, or x + residual rounded to the residual's
    // dtype and stored (the masked lanes of a tail are 0 either way).
    const auto first = [&](llvm::Value* at, int active) {
      llvm::Value* v = load(x, d_.x, at, kLanes, active);
      if (!add) return v;
      return store(res, d_.res, at, b_.CreateFAdd(v, load(res, d_.res, at, kLanes, active)),
                   active);
    };
    // Pass 2's value of a chunk, as stored: x, or the residual written above.
    const auto second = [&](llvm::Value* at, int active) {
      return add ? load(res, d_.res, at, kLanes, active) : load(x, d_.x, at, kLanes, active);
    };
    llvm::Value* fast = sum_squares_blocked(first);
    // The f32 squares overflow from |x| ≈ 1.8e19 and lose |x| < 1e-19: a row
    // whose sum is not finite, or whose mean + eps is below 2^-100 (where a
    // square lost to underflow could matter against eps), is summed again
    // in double from what pass 2 reads. Only such rows pay for it.
    llvm::Value* hd = llvm::ConstantFP::get(b_.getDoubleTy(), double(d_.h));
    llvm::Value* eps = b_.CreateFPExt(arg(TILEJIT_ARG(Args, eps)), b_.getDoubleTy());
    llvm::Value* odd = b_.CreateOr(
        b_.CreateFCmpUGE(fast, llvm::ConstantFP::getInfinity(b_.getDoubleTy())),
        b_.CreateFCmpOLT(b_.CreateFAdd(b_.CreateFDiv(fast, hd), eps),
                         llvm::ConstantFP::get(b_.getDoubleTy(), std::ldexp(1.0, -100))));
    llvm::Value* sum = emit_if_else(
        b_, odd, [&] { return std::vector<llvm::Value*>{sum_squares_double(second)}; },
        [&] { return std::vector<llvm::Value*>{fast}; }, "exact")[0];
    llvm::Value* mean = b_.CreateFDiv(sum, hd);
    llvm::Value* root = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(mean, eps));
    // ≤ 1/sqrt(eps) ≤ 2.7e22 for eps >= the smallest f32: finite in f32.
    llvm::Value* rstd = vm_.splat(b_.CreateFPTrunc(
        b_.CreateFDiv(llvm::ConstantFP::get(b_.getDoubleTy(), 1.0), root), b_.getFloatTy()));

    llvm::Value* w = d_.weight ? arg(TILEJIT_ARG(Args, weight)) : nullptr;
    for_chunks(
        d_.h,
        [&](llvm::Value* at, int active) {
          llvm::Value* y = b_.CreateFMul(second(at, active), rstd);
          if (w) {
            llvm::Value* wv = load(w, d_.w, at, kLanes, active);
            if (d_.plus_one) wv = b_.CreateFAdd(wv, vm_.f32(1.0f));
            y = b_.CreateFMul(y, wv);
          }
          store(out, d_.out, at, y, active);
        },
        "scale");
  }

  void glu_row(llvm::Value* r) {
    llvm::Value* x = row_of(arg(TILEJIT_ARG(Args, x)), d_.x, r, arg(TILEJIT_ARG(Args, x_stride)));
    llvm::Value* out =
        row_of(arg(TILEJIT_ARG(Args, out)), d_.out, r, arg(TILEJIT_ARG(Args, out_stride)));
    for_chunks(
        d_.h,
        [&](llvm::Value* at, int active) {
          llvm::Value *g, *u;
          if (d_.interleaved) {
            // 16 (gate, up) pairs: one <32 x float>, split by even / odd lanes.
            llvm::Value* both = load(x, d_.x, b_.CreateMul(at, i64(2)), 2 * kLanes, 2 * active);
            std::vector<int> even, odd;
            for (int l = 0; l < kLanes; ++l) {
              even.push_back(2 * l);
              odd.push_back(2 * l + 1);
            }
            g = b_.CreateShuffleVector(both, even);
            u = b_.CreateShuffleVector(both, odd);
          } else {
            g = load(x, d_.x, at, kLanes, active);
            u = load(x, d_.x, b_.CreateAdd(at, i64(d_.h)), kLanes, active);
          }
          llvm::Value* y = d_.glu == Glu::act_mul ? vm_.act_mul(d_.act, g, u)
                                                  : vm_.clamped_swiglu(g, u, d_.alpha, d_.limit);
          store(out, d_.out, at, y, active);
        },
        "glu");
  }

  const RowwiseDesc& d_;
  VectorMath vm_;
  const bool cvt_bf16_;  // bf16 rounding through vcvtneps2bf16
};

}  // namespace

LlvmKernel compile_llvm_rowwise(const RowwiseDesc& desc, OptLevel opt) {
  check(desc);
  require_vector_host("compile_llvm_rowwise");
  return compile_emitter<RowwiseEmitter>(desc.name(), opt, desc);
}

}  // namespace tilejit::codegen::llvm_backend
