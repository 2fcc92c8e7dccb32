// LLVM IR for the row-wise kernels. Shape of the emitted function:
//
//   for r < rows:                                   runtime count
//     rms_norm, add_rms_norm, gated_rms_norm:
//       pass 1, chunks of 16: v = x, round(x + residual) stored to residual,
//                             or x·act(gate) (the gate first)
//                             Σ v² in f32 within blocks of 8 chunks, the
//                             blocks' sums added in double
//       a row whose sum is not finite or is tiny: Σ v² again, all in double
//       rstd = 1 / sqrt(Σ / h + eps) in double, then f32
//       pass 2, chunks of 16: out = v·rstd·w (·act(gate)) (v read again: x,
//                             or the stored residual, i.e. what the next
//                             layer's add reads)
//     layer_norm, add_layer_norm:
//       pass 1: v as above, Σ v and Σ v² (blocked) -> mean, m = mean in f32
//       a row whose mean² ≤ var = Σv²/h - mean² (and no sum lost):
//         pass 2: out = (v - m)·rstd·w + b
//       else pass 2: d = v - m, Σ d and Σ d² -> var = (Σd² - (Σd)²/h) / h
//         a row a sum lost: mean, Σ (v - mean)² and pass 3 in double
//         pass 3: out = (d - Σd/h)·rstd·w + b
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

#include <algorithm>
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
  if (adds_residual(d.op)) need_float("res", d.res);
  if (d.op != RowOp::glu && d.weight) need_float("w", d.w);
  if (d.h < 1 || d.h > Limits::max_dim)
    fail(d, "h=" + std::to_string(d.h) + "; allowed: 1 .. " + std::to_string(Limits::max_dim));
  if (d.bias && !centres_rows(d.op)) fail(d, "a bias; allowed: the layer norms only");
  if (d.bias) need_float("b", d.b);
  if (d.gate_first && d.op != RowOp::gated_rms_norm)
    fail(d, "gate_first; allowed: gated_rms_norm only");
  switch (d.op) {
    case RowOp::rms_norm:
    case RowOp::add_rms_norm:
    case RowOp::layer_norm:
    case RowOp::add_layer_norm:
    case RowOp::gated_rms_norm:
      if (d.glu != Glu::none) fail(d, "a norm with a glu; allowed: glu=none");
      if (d.op == RowOp::gated_rms_norm) {
        need_float("g", d.g);
        activation_name(d.act);  // an Error for a value outside the enum
      }
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
      : KernelEmitter(mc), d_(d), vm_(b_, kLanes), cvt_bf16_(mc.host.bf16_convert()) {}

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

  using ChunkSource = std::function<llvm::Value*(llvm::Value* at, int active)>;
  // acc + a chunk's term (<16 x float>), for the blocked sums.
  using Term = std::function<llvm::Value*(llvm::Value* acc, llvm::Value* v)>;
  // acc + a half chunk's term in double (<8 x double>); `active` of its 8
  // lanes hold row values (the rest are 0, or must be masked by the term).
  using DoubleTerm = std::function<llvm::Value*(llvm::Value* acc, llvm::Value* v, int active)>;

  // Σ term(v) over the row's chunks of `src`, each term's sum a double.
  // In f32 within blocks of 8 chunks (four accumulators of two chunks each
  // per term: the fma latency, not the adds, would bound one chain), each
  // block's sum widened and added in double: 7 f32 roundings per lane at
  // most, a relative error ≤ 7·2⁻²⁴ of Σ|term|. Widening every chunk
  // instead (vcvtps2pd) bounded the loop at ~2 cycles per 16 values here.
  std::vector<llvm::Value*> sums_blocked(const ChunkSource& src, const std::vector<Term>& terms) {
    constexpr int kBlock = 8;
    const size_t nt = terms.size();
    auto* fv = llvm::FixedVectorType::get(b_.getFloatTy(), kLanes);
    auto* dv = llvm::FixedVectorType::get(b_.getDoubleTy(), kLanes / 2);
    llvm::Value* fz = llvm::Constant::getNullValue(fv);
    llvm::Value* dz = llvm::Constant::getNullValue(dv);
    using Accs = std::vector<llvm::Value*>;  // [term][4] f32, or [term][2] double
    // The f32 block sums of `a` added to the double accumulators d.
    const auto fold = [&](const Accs& a, Accs d) {
      for (size_t t = 0; t < nt; ++t) {
        llvm::Value* const* at = &a[4 * t];
        llvm::Value* f = b_.CreateFAdd(b_.CreateFAdd(at[0], at[1]), b_.CreateFAdd(at[2], at[3]));
        for (int half = 0; half < 2; ++half)
          d[2 * t + half] = b_.CreateFAdd(d[2 * t + half], b_.CreateFPExt(half_of(f, half), dv));
      }
      return d;
    };
    const auto add = [&](Accs& a, int64_t j, llvm::Value* v) {
      for (size_t t = 0; t < nt; ++t) a[4 * t + j % 4] = terms[t](a[4 * t + j % 4], v);
    };
    const int64_t full = d_.h / kLanes, blocks = full / kBlock;
    Accs d = emit_loop(
        b_, i64(blocks), Accs(2 * nt, dz),
        [&](llvm::Value* i, const Accs& dc) {
          llvm::Value* base = b_.CreateMul(i, i64(kBlock * kLanes));
          Accs a(4 * nt, fz);
          for (int j = 0; j < kBlock; ++j)
            add(a, j, src(b_.CreateAdd(base, i64(j * kLanes)), kLanes));
          return fold(a, dc);
        },
        "sums");
    // The last < 8 full chunks and the masked tail: one more block.
    Accs a(4 * nt, fz);
    for (int64_t j = blocks * kBlock; j < full; ++j) add(a, j, src(i64(j * kLanes), kLanes));
    if (d_.h % kLanes) add(a, 3, src(i64(full * kLanes), int(d_.h % kLanes)));
    if (full % kBlock || d_.h % kLanes) d = fold(a, d);
    std::vector<llvm::Value*> out;
    for (size_t t = 0; t < nt; ++t) out.push_back(reduce(b_.CreateFAdd(d[2 * t], d[2 * t + 1])));
    return out;
  }

  // Σ term(v) in double throughout (rows the blocked sums cannot hold):
  // each chunk's halves widened, one accumulator per half.
  llvm::Value* sum_double(const ChunkSource& src, const DoubleTerm& term) {
    auto* dv = llvm::FixedVectorType::get(b_.getDoubleTy(), kLanes / 2);
    llvm::Value* zero = llvm::Constant::getNullValue(dv);
    const auto add = [&](std::vector<llvm::Value*> acc, llvm::Value* v, int active) {
      for (int half = 0; half < 2; ++half) {
        const int act = std::clamp(active - half * kLanes / 2, 0, kLanes / 2);
        if (act > 0) acc[half] = term(acc[half], b_.CreateFPExt(half_of(v, half), dv), act);
      }
      return acc;
    };
    const int64_t full = d_.h / kLanes;
    std::vector<llvm::Value*> acc = emit_loop(
        b_, i64(full), {zero, zero},
        [&](llvm::Value* i, const std::vector<llvm::Value*>& a) {
          return add(a, src(b_.CreateMul(i, i64(kLanes)), kLanes), kLanes);
        },
        "sum_exact");
    if (d_.h % kLanes)
      acc = add(acc, src(i64(full * kLanes), int(d_.h % kLanes)), int(d_.h % kLanes));
    return reduce(b_.CreateFAdd(acc[0], acc[1]));
  }

  // Lanes 8·half .. 8·half + 7 of a <16 x float>.
  llvm::Value* half_of(llvm::Value* v, int half) {
    std::vector<int> idx;
    for (int l = 0; l < kLanes / 2; ++l) idx.push_back(half * kLanes / 2 + l);
    return b_.CreateShuffleVector(v, idx);
  }
  llvm::Value* reduce(llvm::Value* v) {
    return b_.CreateFAddReduce(llvm::ConstantFP::get(b_.getDoubleTy(), 0.0), v);
  }
  llvm::Value* f64(double v) { return llvm::ConstantFP::get(b_.getDoubleTy(), v); }

  // The squares' terms: v² in f32 (fma), in double.
  Term square() {
    return [&](llvm::Value* acc, llvm::Value* v) { return vm_.fma(v, v, acc); };
  }
  static llvm::Value* square_d(llvm::IRBuilder<>& b, llvm::Value* acc, llvm::Value* v) {
    return b.CreateIntrinsic(llvm::Intrinsic::fma, {acc->getType()}, {v, v, acc});
  }

  // A row the f32 sums may have lost: a sum that is not finite (f32 squares
  // overflow from |x| ≈ 1.8e19, sums from 3.4e38; NaN too), or a mean + eps
  // below 2^-100 (where squares lost to underflow below 1e-19 could matter
  // against eps). Only such rows pay for the sums in double.
  llvm::Value* lost(const std::vector<llvm::Value*>& sums, llvm::Value* var, llvm::Value* eps) {
    llvm::Value* odd = b_.CreateFCmpOLT(b_.CreateFAdd(var, eps), f64(std::ldexp(1.0, -100)));
    for (llvm::Value* s : sums)
      odd = b_.CreateOr(odd, b_.CreateFCmpUGE(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, s),
                                              llvm::ConstantFP::getInfinity(b_.getDoubleTy())));
    return odd;
  }

  // y·w (or (1 + w)) + b for the chunk at `at`, as the descriptor has them.
  llvm::Value* affine(llvm::Value* y, llvm::Value* at, int active) {
    if (d_.weight) {
      llvm::Value* wv = load(arg(TILEJIT_ARG(Args, weight)), d_.w, at, kLanes, active);
      if (d_.plus_one) wv = b_.CreateFAdd(wv, vm_.f32(1.0f));
      y = b_.CreateFMul(y, wv);
    }
    if (d_.bias) y = b_.CreateFAdd(y, load(arg(TILEJIT_ARG(Args, bias)), d_.b, at, kLanes, active));
    return y;
  }

  void norm_row(llvm::Value* r) {
    const bool add = adds_residual(d_.op), centre = centres_rows(d_.op);
    const bool gated = d_.op == RowOp::gated_rms_norm;
    llvm::Value* x = row_of(arg(TILEJIT_ARG(Args, x)), d_.x, r, arg(TILEJIT_ARG(Args, x_stride)));
    llvm::Value* res = add ? row_of(arg(TILEJIT_ARG(Args, residual)), d_.res, r,
                                    arg(TILEJIT_ARG(Args, res_stride)))
                           : nullptr;
    llvm::Value* gate =
        gated ? row_of(arg(TILEJIT_ARG(Args, gate)), d_.g, r, arg(TILEJIT_ARG(Args, gate_stride)))
              : nullptr;
    llvm::Value* out =
        row_of(arg(TILEJIT_ARG(Args, out)), d_.out, r, arg(TILEJIT_ARG(Args, out_stride)));
    const auto act_gate = [&](llvm::Value* at, int active) {
      return vm_.activation(d_.act, load(gate, d_.g, at, kLanes, active));
    };
    // The row's value v of a chunk as pass 2 reads it: x, the stored
    // residual (what the next layer's add reads), or x·act(gate) (the gate
    // first). The masked lanes of a tail are 0.
    const auto second = [&](llvm::Value* at, int active) -> llvm::Value* {
      if (add) return load(res, d_.res, at, kLanes, active);
      llvm::Value* v = load(x, d_.x, at, kLanes, active);
      return gated && d_.gate_first ? b_.CreateFMul(v, act_gate(at, active)) : v;
    };
    // Pass 1's: the same, but the residual is formed here: x + residual
    // rounded to the residual's dtype, stored.
    const auto first = [&](llvm::Value* at, int active) -> llvm::Value* {
      if (!add) return second(at, active);
      llvm::Value* v = load(x, d_.x, at, kLanes, active);
      return store(res, d_.res, at, b_.CreateFAdd(v, load(res, d_.res, at, kLanes, active)),
                   active);
    };
    llvm::Value* hd = f64(double(d_.h));
    llvm::Value* eps = b_.CreateFPExt(arg(TILEJIT_ARG(Args, eps)), b_.getDoubleTy());
    // rstd as an f32 splat from var + eps in double: ≤ 1/sqrt(eps) ≤ 2.7e22
    // for eps >= the smallest f32, finite in f32.
    const auto rstd_of = [&](llvm::Value* var) {
      return b_.CreateFDiv(f64(1.0),
                           b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(var, eps)));
    };
    const auto scale_pass = [&](const std::function<llvm::Value*(llvm::Value*, int)>& scaled) {
      for_chunks(
          d_.h,
          [&](llvm::Value* at, int active) {
            llvm::Value* y = affine(scaled(at, active), at, active);
            if (gated && !d_.gate_first) y = b_.CreateFMul(y, act_gate(at, active));
            store(out, d_.out, at, y, active);
          },
          "scale");
    };
    if (!centre) {
      llvm::Value* fast = sums_blocked(first, {square()})[0];
      llvm::Value* sum = emit_if_else(
          b_, lost({fast}, b_.CreateFDiv(fast, hd), eps),
          [&] {
            return std::vector<llvm::Value*>{sum_double(
                second,
                [&](llvm::Value* acc, llvm::Value* v, int) { return square_d(b_, acc, v); })};
          },
          [&] { return std::vector<llvm::Value*>{fast}; }, "exact")[0];
      llvm::Value* rstd =
          vm_.splat(b_.CreateFPTrunc(rstd_of(b_.CreateFDiv(sum, hd)), b_.getFloatTy()));
      scale_pass(
          [&](llvm::Value* at, int active) { return b_.CreateFMul(second(at, active), rstd); });
      return;
    }
    // LayerNorm. Pass 1 sums v and v²: where mean² ≤ var (the rows of a
    // model's hidden states, centred near 0), var = Σv²/h - mean² loses
    // little (≤ ~34 units of var: docs/rowwise.md) and pass 2 is the output,
    // as for rms_norm. Other rows (far from 0 against their spread) take the
    // corrected two-pass sum: with m the f32 mean, the deviations d = v - m,
    // Σd² less (Σd)²/h is h·var whatever m's rounding, and c = Σd/h (m's
    // own error) is taken off each deviation again.
    const Term add_v = [&](llvm::Value* acc, llvm::Value* v) { return b_.CreateFAdd(acc, v); };
    const std::vector<llvm::Value*> s1 = sums_blocked(first, {add_v, square()});
    llvm::Value* sum_v = s1[0];
    llvm::Value* mean1 = b_.CreateFDiv(sum_v, hd);
    llvm::Value* mean_sq = b_.CreateFDiv(s1[1], hd);
    llvm::Value* var1 =
        b_.CreateMaxNum(b_.CreateFSub(mean_sq, b_.CreateFMul(mean1, mean1)), f64(0.0));
    llvm::Value* m = b_.CreateFPTrunc(mean1, b_.getFloatTy());
    llvm::Value* mv = vm_.splat(m);
    // Ordered compares: a NaN sum is not fast (lost() sends it to double).
    llvm::Value* fast = b_.CreateAnd(b_.CreateNot(lost({sum_v, s1[1]}, var1, eps)),
                                     b_.CreateFCmpOLE(mean_sq, b_.CreateFMul(var1, f64(2.0))));
    const auto fast_path = [&] {
      llvm::Value* rstd = vm_.splat(b_.CreateFPTrunc(rstd_of(var1), b_.getFloatTy()));
      scale_pass([&](llvm::Value* at, int active) {
        return b_.CreateFMul(b_.CreateFSub(second(at, active), mv), rstd);
      });
      return std::vector<llvm::Value*>{};
    };
    emit_if_else(
        b_, fast, fast_path,
        [&] {
          const auto deviation = [&](llvm::Value* at, int active) {
            llvm::Value* dv = b_.CreateFSub(second(at, active), mv);
            if (active == kLanes) return dv;
            return b_.CreateSelect(const_mask(kLanes, active), dv, vm_.f32(0.0f));
          };
          const std::vector<llvm::Value*> s = sums_blocked(deviation, {add_v, square()});
          llvm::Value* c = b_.CreateFDiv(s[0], hd);
          llvm::Value* var = b_.CreateFDiv(b_.CreateFSub(s[1], b_.CreateFMul(s[0], c)), hd);
          var = b_.CreateMaxNum(var, f64(0.0));  // the correction's rounding may pass 0
          emit_if_else(
              b_, lost({sum_v, s[0], s[1]}, var, eps),
              [&] {
                // In double: the mean, the squared deviations from it, and the
                // output's centred value (v - m in f32 may overflow for such rows).
                llvm::Value* mean =
                    b_.CreateFDiv(sum_double(second, [&](llvm::Value* acc, llvm::Value* v,
                                                         int) { return b_.CreateFAdd(acc, v); }),
                                  hd);
                auto* dv = llvm::FixedVectorType::get(b_.getDoubleTy(), kLanes / 2);
                llvm::Value* md = b_.CreateVectorSplat(kLanes / 2, mean);
                llvm::Value* var_d = b_.CreateFDiv(
                    sum_double(second,
                               [&](llvm::Value* acc, llvm::Value* v, int active) {
                                 llvm::Value* dev = b_.CreateFSub(v, md);
                                 if (active < kLanes / 2)
                                   dev = b_.CreateSelect(const_mask(kLanes / 2, active), dev,
                                                         llvm::Constant::getNullValue(dv));
                                 return square_d(b_, acc, dev);
                               }),
                    hd);
                llvm::Value* rstd = b_.CreateVectorSplat(kLanes / 2, rstd_of(var_d));
                scale_pass([&](llvm::Value* at, int active) {
                  llvm::Value* v = second(at, active);
                  llvm::Value* h0 =
                      b_.CreateFMul(b_.CreateFSub(b_.CreateFPExt(half_of(v, 0), dv), md), rstd);
                  llvm::Value* h1 =
                      b_.CreateFMul(b_.CreateFSub(b_.CreateFPExt(half_of(v, 1), dv), md), rstd);
                  std::vector<int> idx;
                  for (int l = 0; l < kLanes; ++l) idx.push_back(l);
                  return b_.CreateFPTrunc(b_.CreateShuffleVector(h0, h1, idx),
                                          llvm::FixedVectorType::get(b_.getFloatTy(), kLanes));
                });
                return std::vector<llvm::Value*>{};
              },
              [&] {
                llvm::Value* rstd = vm_.splat(b_.CreateFPTrunc(rstd_of(var), b_.getFloatTy()));
                llvm::Value* cv = vm_.splat(b_.CreateFPTrunc(c, b_.getFloatTy()));
                scale_pass([&](llvm::Value* at, int active) {
                  return b_.CreateFMul(b_.CreateFSub(b_.CreateFSub(second(at, active), mv), cv),
                                       rstd);
                });
                return std::vector<llvm::Value*>{};
              },
              "exact");
          return std::vector<llvm::Value*>{};
        },
        "layer_fast");
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
