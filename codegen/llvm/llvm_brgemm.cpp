// LLVM IR for the batch-reduce GEMM micro-kernel.
//
// Shape of the emitted function (mirrors codegen/xbyak/avx512_brgemm.cpp):
//
//   for each row block (mb rows; mr split into blocks that fit the registers):
//     acc[set][row][col vec] = 0                      <16 x float>, SSA phis
//     for i < args->batch:                            runtime loop
//       for k-pair groups of unroll_ (static count): loop, unroll_ pairs unrolled
//         B: nz loads of 16 column pairs (<16 x i32>), widened to even / odd f32
//         A: per row, one i32 (a bf16 pair) widened and splat
//         acc += a_even·b_even + a_odd·b_odd          llvm.fma (or one dpbf16ps)
//       remaining pairs unrolled; odd K: the last A element alone (zero-extended,
//       never reading past the row), with B's even half only
//     fold the sets; accumulate, bias, activation, f32 / bf16 (RNE) store,
//     with masked loads/stores on the N tail so columns ≥ nr are never touched.
//
// The int8 kernel (u8 A × i8 B → i32, W8A8) has the same shape over k-quad
// rows (4 K elements, Int8Layout): B's column vectors are <16 x i32> of 4
// int8 each, A's quad one i32 splat, the sums <16 x i32> and exact:
// llvm.x86.avx512.vpdpbusd (512 bits, or 256 twice on AVX-VNNI) where the
// target has it, else the bytes widened to 16 bits (zext A, sext B) and
// multiplied-added in pairs by vpmaddwd into i32 (never vpmaddubsw on 8-bit
// weights: it saturates; the W4A8 kernel's 4-bit-range B cannot make it
// saturate, so there it does: k_quad16). Its epilogue is integer up to the
// zero-point correction, then BrgemmArgs' f32 scaling (or the raw sums, out i32;
// W4A8: plus the f32 acc_in of the earlier scale groups);
// with a GLU, gate and up are each scaled so before the same gated function
// as the bf16 kernel's (codegen/brgemm_desc.h states it).
//
// The k-split sets give each k-pair's products independent accumulators when a
// block has too few to hide the FMA latency (decode shapes).
#include "codegen/llvm/llvm_brgemm.h"

#include <llvm/Analysis/VectorUtils.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/IntrinsicsX86.h>

#include <algorithm>
#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"
#include "ir/activation.h"

namespace tilejit::codegen::llvm_backend {
namespace {

constexpr int kLanes = 16;  // f32 lanes per accumulator vector: 16 columns
constexpr int kMaxMr = 32;

// Register blocking, from the host's register file: rows per block and, per
// block, the accumulator sets (independent copies that the k-pairs rotate
// through when a block has too few accumulators to cover the latency of the
// dot-product instruction; they are added up before the epilogue).
class Blocking {
 public:
  // dpbf16: any one-instruction dot product (vdpbf16ps, vpdpbusd); otherwise
  // a widening one (fp32 FMAs, int8 bytes widened to i32).
  // one_chain (BrgemmDesc::one_chain): a single set, whatever the rows.
  Blocking(int nz, bool dpbf16, const HostTarget& host, bool one_chain)
      : nz_(nz),
        dpbf16_(dpbf16),
        one_chain_(one_chain),
        w_(std::max(1, 512 / host.vector_bits)),
        regs_(host.vector_regs) {
    // Live besides the accumulators: fma keeps B's even and odd halves of
    // every column vector (2·nz) and one row's two A splats; dpbf16 keeps nz B
    // vectors and one A splat (LLVM keeps a splat used nz times in a register
    // rather than folding it into each instruction as a {1to16} operand).
    fixed_ = dpbf16 ? nz + 2 : (2 * nz + 2) * w_;
  }

  int sets(int mb) const {
    int s = 1;
    if (one_chain_) return s;  // batch-invariant: one K order for every mb
    if (dpbf16_) {
      // The Xbyak kernel's rule (avx512_brgemm_ksplit), so that both kernels
      // add the products in the same order and agree bit for bit.
      while (s < 4 && s * mb * nz_ < 8 && 2 * s * mb * nz_ + nz_ <= regs_) s *= 2;
    } else {
      // 8 register-sized chains cover the FMA latency (4 cycles, 2 per cycle).
      while (s < 4 && s * mb * nz_ * w_ < 8 && 2 * s * mb * nz_ * w_ + fixed_ <= regs_) s *= 2;
    }
    return s;
  }

  // The most rows whose accumulators fit in the registers with the rest.
  int max_rows(int mr) const {
    for (int mb = std::min(mr, kMaxMr); mb > 1; --mb)
      if (sets(mb) * mb * nz_ * w_ + fixed_ <= regs_) return mb;
    return 1;
  }

 private:
  int nz_;
  bool dpbf16_;
  bool one_chain_;
  int w_;  // registers per <16 x float>: 1 zmm, 2 ymm or 4 xmm
  int regs_;
  int fixed_ = 0;
};

// The int8 dot product of a k-quad (see IntDot in compile_llvm_brgemm).
enum class IntDot { none, vpdpbusd512, vpdpbusd256, imul };

class BrgemmEmitter : public KernelEmitter {
 public:
  BrgemmEmitter(ModuleContext& mc, const BrgemmDesc& d, bool dpbf16, IntDot idot)
      : KernelEmitter(mc),
        d_(d),
        dpbf16_(dpbf16),
        idot_(idot),
        int8_(idot != IntDot::none),
        vnni_(idot == IntDot::vpdpbusd512 || idot == IntDot::vpdpbusd256),
        fold_(int8_ && d.w4a8),
        quant_(d.b_type == DType::u4 || d.b_type == DType::f8e4m3 || d.b_type == DType::f4e2m1),
        vm_(b_, kLanes) {
    nz_ = (d.computed_cols() + kLanes - 1) / kLanes;
  }

 private:
  // Offsets are guarded by the static_asserts of codegen/brgemm_desc.h.
  using Args = BrgemmArgs;

  void generate() override {
    sums_ = b_.CreateAlloca(acc_vt(), b_.getInt32(d_.mr * nz_), "sums");
    sums_->setAlignment(llvm::Align(64));
    if (fold_) {
      fsums_ = b_.CreateAlloca(vm_.f32v(), b_.getInt32(d_.mr * nz_), "fsums");
      fsums_->setAlignment(llvm::Align(64));
    }
    if (quant_) {
      quant_passes();
      epilogue();
      return;
    }

    // Column groups of nzg vectors, each with its own pass over K. With 32
    // registers all columns fit in one group (B is loaded once per k-pair for
    // the whole block). With 16 (AVX2), widening B for 4 column vectors takes
    // every register, so each 16-column vector gets its own pass with more
    // rows to share B's widening (measured: 84 against 71 GFLOP/s for 7 × 64
    // on Zen 4 ymm; a single row is faster in one pass).
    const int w = std::max(1, 512 / mc_.host.vector_bits);
    // (AVX-VNNI's ymm vpdpbusd has the same register pressure as fma.)
    const bool split = !one_op_dot() || idot_ == IntDot::vpdpbusd256;
    nzg_ = split && w >= 2 && d_.mr >= 2 ? 1 : nz_;
    const Blocking blk(nzg_, one_op_dot(), mc_.host, d_.one_chain);
    const int mb = blk.max_rows(d_.mr);
    // mr rows in nblocks blocks of `big` or `big - 1` rows, the big ones first.
    const int nblocks = (d_.mr + mb - 1) / mb;
    const int big = (d_.mr + nblocks - 1) / nblocks;
    const int n_big = d_.mr - nblocks * (big - 1);
    auto no_carry = std::vector<llvm::Value*>{};
    emit_loop(
        b_, i64(nz_ / nzg_), no_carry,
        [&](llvm::Value* group, const std::vector<llvm::Value*>&) {
          j0_ = b_.CreateMul(group, i64(nzg_));
          emit_loop(
              b_, i64(n_big), no_carry,
              [&](llvm::Value* iv, const std::vector<llvm::Value*>&) {
                row_block(b_.CreateMul(iv, i64(big)), big, blk.sets(big));
                return no_carry;
              },
              "rowblk");
          if (big > 1) {
            emit_loop(
                b_, i64(nblocks - n_big), no_carry,
                [&](llvm::Value* iv, const std::vector<llvm::Value*>&) {
                  row_block(b_.CreateAdd(i64(int64_t(n_big) * big), b_.CreateMul(iv, i64(big - 1))),
                            big - 1, blk.sets(big - 1));
                  return no_carry;
                },
                "rowblk.small");
          }
          return no_carry;
        },
        "colgroup");
    epilogue();
  }

  llvm::Type* ptr_ty() { return b_.getPtrTy(); }
  // The accumulator vector: <16 x float>, or <16 x i32> for int8.
  llvm::Type* acc_vt() const { return int8_ ? vm_.i32v() : vm_.f32v(); }
  // A dot product in one instruction per B vector (vdpbf16ps, vpdpbusd).
  bool one_op_dot() const { return dpbf16_ || vnni_; }
  llvm::Value* byte_gep(llvm::Value* p, llvm::Value* off) {
    return b_.CreateGEP(b_.getInt8Ty(), p, off);
  }
  llvm::Value* byte_gep(llvm::Value* p, int64_t off) { return byte_gep(p, i64(off)); }
  // Index of accumulator (set, row, column vector) in the flat carried list.
  size_t ai(int s, int r, int j) const { return (size_t(s) * mbs_ + r) * nzg_ + j; }

  void row_block(llvm::Value* row0, int mbs, int sets) {
    mbs_ = mbs;
    sets_ = sets;
    // k-pairs per loop iteration: a multiple of the set cycle (dpbf16 uses one
    // set per pair, fma two); unrolling further only adds compile time (same
    // GFLOP/s with 2 and 4 pairs, measured).
    unroll_ = one_op_dot() ? std::max(2, sets) : 2;
    std::vector<llvm::Value*> acc(size_t(sets_) * mbs * nzg_,
                                  llvm::Constant::getNullValue(acc_vt()));
    if (fold_) init_fsums(row0);
    acc = emit_loop(
        b_, arg(TILEJIT_ARG(Args, batch)), acc,
        [&](llvm::Value* i, const std::vector<llvm::Value*>& in) {
          return batch_item(i, row0, in);
        },
        "batch");
    // W4A8: the last item ended a group, whose fold left the sums at zero.
    if (fold_) return;
    for (int r = 0; r < mbs; ++r) {
      for (int j = 0; j < nzg_; ++j) {
        llvm::Value* v = acc[ai(0, r, j)];
        for (int s = 1; s < sets_; ++s)
          v = int8_ ? b_.CreateAdd(v, acc[ai(s, r, j)]) : b_.CreateFAdd(v, acc[ai(s, r, j)]);
        b_.CreateAlignedStore(v, sums_slot(b_.CreateAdd(row0, i64(r)), b_.CreateAdd(j0_, i64(j))),
                              llvm::Align(64));
      }
    }
  }

  // &sums[row][j]: the block sums go through a stack buffer so that one
  // epilogue loop serves every row; unrolled per row, the activation code
  // (dozens of instructions per vector) would dominate compile time.
  llvm::Value* sums_slot(llvm::Value* row, llvm::Value* j) {
    return b_.CreateGEP(acc_vt(), sums_, b_.CreateAdd(b_.CreateMul(row, i64(nz_)), j));
  }

  std::vector<llvm::Value*> batch_item(llvm::Value* i, llvm::Value* row0,
                                       std::vector<llvm::Value*> acc) {
    llvm::Value* a = b_.CreateAlignedLoad(
        ptr_ty(), b_.CreateGEP(ptr_ty(), arg(TILEJIT_ARG(Args, a)), i), llvm::Align(8));
    b_ptr_ = b_.CreateAlignedLoad(ptr_ty(), b_.CreateGEP(ptr_ty(), arg(TILEJIT_ARG(Args, b)), i),
                                  llvm::Align(8));
    a_rows_.clear();
    for (int r = 0; r < mbs_; ++r)
      a_rows_.push_back(
          byte_gep(a, b_.CreateMul(b_.CreateAdd(row0, i64(r)), arg(TILEJIT_ARG(Args, lda)))));

    if (int8_ && d_.w4a8 && !vnni_) {
      // W4A8 without VNNI: four k-quads a step, summed in 16 bits (k_quad16).
      const int64_t steps = d_.kb / 16;  // check_desc: kb % 16 == 0
      acc = emit_loop(
          b_, i64(steps), acc,
          [&](llvm::Value* it, const std::vector<llvm::Value*>& in) {
            std::vector<llvm::Value*> cur = in;
            k_quad16(b_.CreateMul(it, i64(4)), cur);
            return cur;
          },
          "kloop16");
      return fold_at_group_end(i, row0, acc);
    }
    if (int8_) {
      const int64_t kq = d_.kb / 4;  // check_desc: kb % 4 == 0
      acc = emit_loop(
          b_, i64(kq / unroll_), acc,
          [&](llvm::Value* it, const std::vector<llvm::Value*>& in) {
            std::vector<llvm::Value*> cur = in;
            llvm::Value* q0 = b_.CreateMul(it, i64(unroll_));
            for (int u = 0; u < unroll_; ++u) k_quad(b_.CreateAdd(q0, i64(u)), u, cur);
            return cur;
          },
          "kloop");
      const int64_t rem = kq % unroll_;
      for (int64_t u = 0; u < rem; ++u) k_quad(i64(kq - rem + u), static_cast<int>(u), acc);
      return fold_ ? fold_at_group_end(i, row0, acc) : acc;
    }
    const int64_t kp = d_.kb / 2;
    acc = emit_loop(
        b_, i64(kp / unroll_), acc,
        [&](llvm::Value* it, const std::vector<llvm::Value*>& in) {
          std::vector<llvm::Value*> cur = in;
          llvm::Value* p0 = b_.CreateMul(it, i64(unroll_));
          for (int u = 0; u < unroll_; ++u) k_pair(b_.CreateAdd(p0, i64(u)), u, cur);
          return cur;
        },
        "kloop");
    const int64_t rem = kp % unroll_;
    for (int64_t u = 0; u < rem; ++u) k_pair(i64(kp - rem + u), static_cast<int>(u), acc);
    if (d_.kb % 2 != 0) odd_k(i64(kp), acc);
    return acc;
  }

  // W4A8: the f32 sums of this row block's groups start at acc_in (the
  // earlier K chunks) or at −0 (the additive identity of every float, so the
  // first fold's value is kept bit for bit).
  void init_fsums(llvm::Value* row0) {
    const int tail = d_.nr % kLanes;
    const bool glu = d_.glu != Glu::none;
    for (int r = 0; r < mbs_; ++r) {
      llvm::Value* row = b_.CreateAdd(row0, i64(r));
      llvm::Value* in_row = d_.accumulate
                                ? byte_gep(arg(TILEJIT_ARG(Args, acc_in)),
                                           b_.CreateMul(row, arg(TILEJIT_ARG(Args, ld_acc_in))))
                                : nullptr;
      for (int j = 0; j < nzg_; ++j) {
        llvm::Value* jj = b_.CreateAdd(j0_, i64(j));
        llvm::Value* v = vm_.f32(-0.0f);
        if (in_row != nullptr) {
          // acc_in covers the columns the epilogue reads (a GLU's 64, else
          // nr): lanes of column c < nr, loaded under a mask built from the
          // vector's runtime index when nr has a tail.
          llvm::Value* p = byte_gep(in_row, b_.CreateMul(jj, i64(64)));
          if (glu || tail == 0) {
            v = b_.CreateAlignedLoad(vm_.f32v(), p, llvm::Align(4));
          } else {
            std::vector<llvm::Constant*> iota;
            for (int l = 0; l < kLanes; ++l) iota.push_back(b_.getInt64(uint64_t(l)));
            llvm::Value* cols = b_.CreateAdd(llvm::ConstantVector::get(iota),
                                             vm_.splat(b_.CreateMul(jj, i64(kLanes))));
            llvm::Value* mask = b_.CreateICmpULT(cols, vm_.splat(i64(d_.nr)));
            v = b_.CreateMaskedLoad(vm_.f32v(), p, llvm::Align(4), mask,
                                    llvm::Constant::getNullValue(vm_.f32v()));
          }
        }
        b_.CreateAlignedStore(v, fsum_slot(row, jj), llvm::Align(64));
      }
    }
  }
  llvm::Value* fsum_slot(llvm::Value* row, llvm::Value* j) {
    return b_.CreateGEP(vm_.f32v(), fsums_, b_.CreateAdd(b_.CreateMul(row, i64(nz_)), j));
  }

  // W4A8: after batch item i, if a scale group ends there (its w4a8_scales
  // entry is not null; without the arrays: the last item, with b_scale and
  // b_comp), fold the group's exact int32 sums into the f32 ones,
  //   f = float(acc − a_zero·comp)·a_scale·scale + f,
  // and start the next group at zero.
  std::vector<llvm::Value*> fold_at_group_end(llvm::Value* i, llvm::Value* row0,
                                              const std::vector<llvm::Value*>& acc) {
    llvm::Type* ptr = ptr_ty();
    llvm::Value* scales = arg(TILEJIT_ARG(Args, w4a8_scales));
    llvm::Value* comps = arg(TILEJIT_ARG(Args, w4a8_comps));
    llvm::Value* null = llvm::ConstantPointerNull::get(b_.getPtrTy());
    llvm::Value* last = b_.CreateICmpEQ(i, b_.CreateSub(arg(TILEJIT_ARG(Args, batch)), i64(1)));
    const std::vector<llvm::Value*> rows = emit_if_else(
        b_, b_.CreateICmpNE(scales, null),
        [&] {
          return std::vector<llvm::Value*>{
              b_.CreateAlignedLoad(ptr, b_.CreateGEP(ptr, scales, i), llvm::Align(8)),
              b_.CreateAlignedLoad(ptr, b_.CreateGEP(ptr, comps, i), llvm::Align(8))};
        },
        [&] {
          return std::vector<llvm::Value*>{
              b_.CreateSelect(last, arg(TILEJIT_ARG(Args, b_scale)), null),
              b_.CreateSelect(last, arg(TILEJIT_ARG(Args, b_comp)), null)};
        },
        "w4a8.rows");
    llvm::Value* scale = rows[0];
    llvm::Value* comp = rows[1];
    return emit_if_else(
        b_, b_.CreateICmpNE(scale, null),
        [&] {
          for (int r = 0; r < mbs_; ++r) {
            llvm::Value* row = b_.CreateAdd(row0, i64(r));
            llvm::Value* a_zero = vm_.splat(b_.CreateAlignedLoad(
                b_.getInt32Ty(), b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, a_zero)), row),
                llvm::Align(4)));
            llvm::Value* a_scale = vm_.splat(b_.CreateAlignedLoad(
                b_.getFloatTy(),
                b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, a_scale)), row),
                llvm::Align(4)));
            for (int j = 0; j < nzg_; ++j) {
              llvm::Value* jj = b_.CreateAdd(j0_, i64(j));
              llvm::Value* off = b_.CreateMul(jj, i64(64));
              llvm::Value* v = acc[ai(0, r, j)];
              for (int s = 1; s < sets_; ++s) v = b_.CreateAdd(v, acc[ai(s, r, j)]);
              llvm::Value* cv =
                  b_.CreateAlignedLoad(vm_.i32v(), byte_gep(comp, off), llvm::Align(4));
              llvm::Value* sv =
                  b_.CreateAlignedLoad(vm_.f32v(), byte_gep(scale, off), llvm::Align(4));
              llvm::Value* f =
                  b_.CreateSIToFP(b_.CreateSub(v, b_.CreateMul(a_zero, cv)), vm_.f32v());
              f = b_.CreateFMul(b_.CreateFMul(f, a_scale), sv);
              llvm::Value* slot = fsum_slot(row, jj);
              f = b_.CreateFAdd(f, b_.CreateAlignedLoad(vm_.f32v(), slot, llvm::Align(64)));
              b_.CreateAlignedStore(f, slot, llvm::Align(64));
            }
          }
          return std::vector<llvm::Value*>(acc.size(), llvm::Constant::getNullValue(acc_vt()));
        },
        [&] { return acc; }, "w4a8.fold");
  }

  // Column vector j of the current column group in k-pair row `pair` of B.
  llvm::Value* load_b_row(llvm::Value* pair, int j) {
    llvm::Value* col = b_.CreateMul(b_.CreateAdd(j0_, i64(j)), i64(64));
    llvm::Value* p = byte_gep(b_ptr_, b_.CreateAdd(b_.CreateMul(pair, i64(d_.b_row_bytes)), col));
    return b_.CreateAlignedLoad(vm_.i32v(), p, llvm::Align(4));
  }
  // The bf16 pair of row r at k-pair `pair`, as one i32 (A rows are 2-byte aligned).
  llvm::Value* load_a_pair(int r, llvm::Value* pair) {
    return b_.CreateAlignedLoad(b_.getInt32Ty(), byte_gep(a_rows_[r], b_.CreateMul(pair, i64(4))),
                                llvm::Align(2));
  }
  llvm::Value* as_float(llvm::Value* i32) { return b_.CreateBitCast(i32, b_.getFloatTy()); }

  llvm::Value* dpbf16(llvm::Value* acc, llvm::Value* a_i32v, llvm::Value* b_i32v) {
    auto* bf = llvm::FixedVectorType::get(b_.getBFloatTy(), 2 * kLanes);
    return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512bf16_dpbf16ps_512, {},
                              {acc, b_.CreateBitCast(b_i32v, bf), b_.CreateBitCast(a_i32v, bf)});
  }

  void k_pair(llvm::Value* pair, int u, std::vector<llvm::Value*>& acc) {
    if (dpbf16_) {
      const int s = u % sets_;
      std::vector<llvm::Value*> bv;
      for (int j = 0; j < nzg_; ++j) bv.push_back(load_b_row(pair, j));
      for (int r = 0; r < mbs_; ++r) {
        llvm::Value* a = vm_.splat(load_a_pair(r, pair));
        for (int j = 0; j < nzg_; ++j) acc[ai(s, r, j)] = dpbf16(acc[ai(s, r, j)], a, bv[j]);
      }
      return;
    }
    // Even k in the low half of each 32-bit lane, odd k in the high half:
    // a shift and a mask make both exact f32 values.
    const int se = (2 * u) % sets_, so = (2 * u + 1) % sets_;
    std::vector<llvm::Value*> be, bo;
    for (int j = 0; j < nzg_; ++j) {
      llvm::Value* raw = load_b_row(pair, j);
      be.push_back(b_.CreateBitCast(b_.CreateShl(raw, vm_.i32(16)), vm_.f32v()));
      bo.push_back(b_.CreateBitCast(b_.CreateAnd(raw, vm_.i32(0xffff0000u)), vm_.f32v()));
    }
    for (int r = 0; r < mbs_; ++r) {
      llvm::Value* a = load_a_pair(r, pair);
      llvm::Value* ae = vm_.splat(as_float(b_.CreateShl(a, b_.getInt32(16))));
      llvm::Value* ao = vm_.splat(as_float(b_.CreateAnd(a, b_.getInt32(0xffff0000u))));
      for (int j = 0; j < nzg_; ++j) {
        acc[ai(se, r, j)] = vm_.fma(ae, be[j], acc[ai(se, r, j)]);
        acc[ai(so, r, j)] = vm_.fma(ao, bo[j], acc[ai(so, r, j)]);
      }
    }
  }

  // vpdpbusd: acc[i] += Σ_{4 bytes} u8(a) · s8(b) per i32 lane, exact (no saturation).
  llvm::Value* vpdpbusd(llvm::Value* acc, llvm::Value* a_i32v, llvm::Value* b_i32v) {
    if (idot_ == IntDot::vpdpbusd512)
      return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_vpdpbusd_512, {},
                                {acc, a_i32v, b_i32v});
    return on_ymm_halves(llvm::Intrinsic::x86_avx512_vpdpbusd_256, {acc, a_i32v, b_i32v});
  }

  // The 256-bit intrinsic `id` on the low and the high halves of 512-bit
  // operands, the two results joined (AVX-VNNI's vpdpbusd, AVX2's vpmaddwd).
  llvm::Value* on_ymm_halves(llvm::Intrinsic::ID id, const std::vector<llvm::Value*>& ops) {
    llvm::Value* r[2];
    for (int h = 0; h < 2; ++h) {
      std::vector<llvm::Value*> hv;
      for (llvm::Value* v : ops) {
        const int n =
            static_cast<int>(llvm::cast<llvm::FixedVectorType>(v->getType())->getNumElements());
        hv.push_back(b_.CreateShuffleVector(v, iota_mask(h * n / 2, n / 2)));
      }
      r[h] = b_.CreateIntrinsic(id, {}, hv);
    }
    return llvm::concatenateVectors(b_, r);
  }

  // One k-quad row of the int8 kernel: 4 K elements of every row and column.
  void k_quad(llvm::Value* quad, int u, std::vector<llvm::Value*>& acc) {
    if (vnni_) {
      const int s = u % sets_;
      std::vector<llvm::Value*> bv;
      for (int j = 0; j < nzg_; ++j) bv.push_back(load_b_row(quad, j));
      for (int r = 0; r < mbs_; ++r) {
        // The quad's 4 u8 of row r (A rows are byte-aligned).
        llvm::Value* a = vm_.splat(b_.CreateAlignedLoad(
            b_.getInt32Ty(), byte_gep(a_rows_[r], b_.CreateMul(quad, i64(4))), llvm::Align(1)));
        for (int j = 0; j < nzg_; ++j) acc[ai(s, r, j)] = vpdpbusd(acc[ai(s, r, j)], a, bv[j]);
      }
      return;
    }
    // Widened to 16 bits: each B dword's bytes (b0, b1, b2, b3) as the
    // sign-extended word pairs (b0, b2) (shl, sra) and (b1, b3) (sra), A's
    // quad likewise as zero-extended (a0, a2) and (a1, a3), then one
    // vpmaddwd per pair: a0·b0 + a2·b2 and a1·b1 + a3·b3 in i32, exact
    // (|a·b| <= 255·128, no pair sum near the instruction's one saturating
    // case), 16 products an instruction where i32 multiplies (vpmulld) gave 8
    // at a quarter of the rate.
    auto* w16 = llvm::FixedVectorType::get(b_.getInt16Ty(), 2 * kLanes);
    std::vector<llvm::Value*> lo, hi;
    for (int j = 0; j < nzg_; ++j) {
      llvm::Value* raw = b_.CreateBitCast(load_b_row(quad, j), w16);
      llvm::Value* eight = llvm::ConstantInt::get(w16, 8);
      lo.push_back(b_.CreateAShr(b_.CreateShl(raw, eight), eight));
      hi.push_back(b_.CreateAShr(raw, eight));
    }
    for (int r = 0; r < mbs_; ++r) {
      llvm::Value* a32 = b_.CreateAlignedLoad(
          b_.getInt32Ty(), byte_gep(a_rows_[r], b_.CreateMul(quad, i64(4))), llvm::Align(1));
      llvm::Value* a_lo =
          b_.CreateBitCast(vm_.splat(b_.CreateAnd(a32, b_.getInt32(0x00ff00ff))), w16);
      llvm::Value* a_hi = b_.CreateBitCast(
          vm_.splat(b_.CreateAnd(b_.CreateLShr(a32, b_.getInt32(8)), b_.getInt32(0x00ff00ff))),
          w16);
      for (int half = 0; half < 2; ++half) {
        const int s = (2 * u + half) % sets_;
        for (int j = 0; j < nzg_; ++j)
          acc[ai(s, r, j)] = b_.CreateAdd(
              acc[ai(s, r, j)], pmaddwd(half ? a_hi : a_lo, half ? hi[static_cast<size_t>(j)]
                                                                 : lo[static_cast<size_t>(j)]));
      }
    }
  }

  // Four k-quad rows of a W4A8 kernel (B in [−16, 15], BrgemmDesc::w4a8):
  // vpmaddubsw multiplies u8 A by s8 B and adds adjacent pairs into s16
  // (|pair| <= 2·255·16 = 8160, never saturating); the four quads' pair sums
  // add in 16 bits (<= 32640, exact); vpmaddwd by ones then adds each
  // column's two pairs into its i32 lane. 9 vector ops per 128 products of a
  // column vector and row where the widening path (k_quad) takes 16.
  void k_quad16(llvm::Value* quad0, std::vector<llvm::Value*>& acc) {
    auto* b8 = llvm::FixedVectorType::get(b_.getInt8Ty(), 4 * kLanes);
    auto* w16 = llvm::FixedVectorType::get(b_.getInt16Ty(), 2 * kLanes);
    std::vector<std::vector<llvm::Value*>> bq(4);
    for (int u = 0; u < 4; ++u)
      for (int j = 0; j < nzg_; ++j)
        bq[u].push_back(b_.CreateBitCast(load_b_row(b_.CreateAdd(quad0, i64(u)), j), b8));
    llvm::Value* ones = llvm::ConstantInt::get(w16, 1);
    for (int r = 0; r < mbs_; ++r) {
      std::vector<llvm::Value*> a;
      for (int u = 0; u < 4; ++u)
        a.push_back(b_.CreateBitCast(
            vm_.splat(b_.CreateAlignedLoad(
                b_.getInt32Ty(),
                byte_gep(a_rows_[r], b_.CreateMul(b_.CreateAdd(quad0, i64(u)), i64(4))),
                llvm::Align(1))),
            b8));
      for (int j = 0; j < nzg_; ++j) {
        llvm::Value* s16 = pmaddubsw(a[0], bq[0][j]);
        for (int u = 1; u < 4; ++u) s16 = b_.CreateAdd(s16, pmaddubsw(a[u], bq[u][j]));
        acc[ai(0, r, j)] = b_.CreateAdd(acc[ai(0, r, j)], pmaddwd(s16, ones));
      }
    }
  }

  // vpmaddubsw over <4·kLanes x i8> (u8, s8) -> <2·kLanes x i16>: one zmm
  // instruction with AVX512-BW, else ymm halves.
  llvm::Value* pmaddubsw(llvm::Value* a, llvm::Value* b) {
    if (mc_.host.vector_bits >= 512 && mc_.host.avx512bw)
      return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_pmaddubs_w_512, {}, {a, b});
    return on_ymm_halves(llvm::Intrinsic::x86_avx2_pmadd_ub_sw, {a, b});
  }

  // vpmaddwd over <2·kLanes x i16> -> <kLanes x i32>: one zmm instruction
  // with AVX512-BW, else ymm halves.
  llvm::Value* pmaddwd(llvm::Value* a, llvm::Value* b) {
    if (mc_.host.vector_bits >= 512 && mc_.host.avx512bw)
      return b_.CreateIntrinsic(llvm::Intrinsic::x86_avx512_pmaddw_d_512, {}, {a, b});
    return on_ymm_halves(llvm::Intrinsic::x86_avx2_pmadd_wd, {a, b});
  }

  // The last, unpaired k: read only its own bf16 (its neighbour may lie past
  // the row, or be NaN), and multiply with the even half of B's row.
  void odd_k(llvm::Value* pair, std::vector<llvm::Value*>& acc) {
    std::vector<llvm::Value*> bv;
    for (int j = 0; j < nzg_; ++j) bv.push_back(load_b_row(pair, j));
    for (int r = 0; r < mbs_; ++r) {
      llvm::Value* a16 = b_.CreateAlignedLoad(
          b_.getInt16Ty(), byte_gep(a_rows_[r], b_.CreateMul(pair, i64(4))), llvm::Align(2));
      llvm::Value* a32 = b_.CreateZExt(a16, b_.getInt32Ty());
      for (int j = 0; j < nzg_; ++j) {
        if (dpbf16_) {
          // Zero in A's odd half: B's odd half (packing padding) adds 0.
          acc[ai(0, r, j)] = dpbf16(acc[ai(0, r, j)], vm_.splat(a32), bv[j]);
        } else {
          llvm::Value* ae = vm_.splat(as_float(b_.CreateShl(a32, b_.getInt32(16))));
          llvm::Value* be = b_.CreateBitCast(b_.CreateShl(bv[j], vm_.i32(16)), vm_.f32v());
          acc[ai(0, r, j)] = vm_.fma(ae, be, acc[ai(0, r, j)]);
        }
      }
    }
  }

  // ---- the fused W4A16 / W8A16 decode kernel (b = u4, f8e4m3, f4e2m1) ------
  //
  // Passes over K, one per (column group, row block) (the static lists
  // below: a pass keeps rows·vectors <16 x float> group sums
  // live, at most half the register file), each walking the k-pair rows in runs of one
  // scale group (q_groups[kp]; act-order and odd groups are runs like any
  // other), then folding the run into sums[row][vector]:
  //   u4:    in nibble planes (below): acc_j += a_even·q_even, then
  //          acc_j += a_odd·q_odd (q the nibble, exact in f32, ×256 in
  //          planes 1, 3), Σa += a_even + a_odd;
  //          fold: sums += s ⊙ (acc − z ⊙ Σa)   (z: zeros, or 8)
  //   e2m1:  the nibbles as f16 bits S<<15 | (q & 7)<<9, i.e. the e2m1 value
  //          × 2⁻¹⁴ exactly (vcvtph2ps), into acc as u4; fold: sums += s ⊙ (acc·2¹⁴)
  //   e4m3:  a column's code pair read as one i16, each code made f16 bits
  //          S 0 EEEE MMM 0000000 (even: (w << 8) >>ₐ 1, odd: w >>ₐ 1, then
  //          & 0xBF80), i.e. the e4m3 value × 2⁻⁸ exactly (subnormals too:
  //          f16 denormals, converted exactly whatever MXCSR says), into acc
  //          as u4; fold: sums += s ⊙ (acc·2⁸)
  // No weight is rounded: the bound is runtime::quant_brgemm_output_bound's,
  // as for the Xbyak kernel. The last, unpaired k of an odd kb is a run of
  // its own with A's odd half zero (its code partner is padding).
  struct QuantPass {
    int j0, nv;    // first column vector, vectors
    int row0, mb;  // first row, rows
  };

  std::vector<QuantPass> quant_pass_list() const {
    // Group sums per pass: one per row and vector, each kLanes·32 bits.
    const int w = std::max(1, (kLanes * 32) / mc_.host.vector_bits);
    const int cap = std::max(1, mc_.host.vector_regs / 2 / w);  // rows × vectors
    if (planes()) {
      // All 64 columns (4 nibble planes) of mb rows per pass.
      const int mbp = std::max(1, std::min(d_.mr, cap / 4));
      std::vector<QuantPass> passes;
      for (int r0 = 0; r0 < d_.mr; r0 += mbp)
        passes.push_back({0, 4, r0, std::min(mbp, d_.mr - r0)});
      return passes;
    }
    int mb = std::min(d_.mr, cap);
    const int blocks = (d_.mr + mb - 1) / mb;
    mb = (d_.mr + blocks - 1) / blocks;
    const int nvg = std::max(1, std::min(nz_, cap / mb));
    std::vector<QuantPass> passes;
    for (int j0 = 0; j0 < nz_; j0 += nvg)
      for (int r0 = 0; r0 < d_.mr; r0 += mb)
        passes.push_back({j0, std::min(nvg, nz_ - j0), r0, std::min(mb, d_.mr - r0)});
    return passes;
  }

  void quant_passes() {
    if (planes()) {
      planes_ = b_.CreateAlloca(vm_.f32v(), b_.getInt32(d_.mr * 4), "planes");
      planes_->setAlignment(llvm::Align(64));
    }
    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < (planes() ? 4 : nz_); ++j)
        b_.CreateAlignedStore(llvm::Constant::getNullValue(vm_.f32v()), quant_slot(r, j),
                              llvm::Align(64));
    a_rows_.clear();
    llvm::Value* a = b_.CreateAlignedLoad(ptr_ty(), arg(TILEJIT_ARG(Args, a)), llvm::Align(8));
    for (int r = 0; r < d_.mr; ++r)
      a_rows_.push_back(byte_gep(a, b_.CreateMul(i64(r), arg(TILEJIT_ARG(Args, lda)))));
    b_ptr_ = b_.CreateAlignedLoad(ptr_ty(), arg(TILEJIT_ARG(Args, b)), llvm::Align(8));
    const int64_t full = d_.kb / 2;
    for (const QuantPass& qp : quant_pass_list()) {
      if (full > 0) quant_runs(qp, full);
      if (d_.kb % 2 != 0) {
        // The unpaired last k: one run of its own (a fold is linear, so its
        // group may repeat the one before).
        llvm::Value* g = load_group(i64(full));
        std::vector<llvm::Value*> acc = zero_run(qp);
        quant_pair(qp, i64(full), /*odd_only=*/true, acc);
        quant_fold(qp, g, acc);
      }
    }
    if (planes()) unpermute_planes();
  }

  // ---- u4 in nibble planes ---------------------------------------------------
  //
  // A k-pair row of u4 codes is 64 bytes, one per column (low nibble even k);
  // read as <16 x i32>, lane l holds columns 4l .. 4l + 3. Plane j (0..3)
  // is column 4l + j of every lane: its even nibble is bits 8j..8j+3, its
  // odd one 8j+4..8j+7. Masks and three shifts (x >> 4, >> 16, >> 20) put
  // each at bit 0 (planes 0, 2) or 8 (planes 1, 3), vcvtdq2ps makes it exact
  // f32 (q or 256·q), so a row's 128 weights cost one load, 3 shifts, 8 ands,
  // 8 conversions and 8 FMAs per <16 x float>, with no byte widening (on
  // AVX2 the shuffle ports bounded the widened form: llvm-mca, znver3). Plane
  // sums go to planes_[row][j]; the fold takes the scales and zero points of
  // the plane's columns (a stride-4 shuffle, once per run) and 2⁻⁸ for planes
  // 1 and 3 (exact); unpermute_planes() puts the columns back in order for
  // the epilogue. The 256·q terms leave the f32 range 2⁸ earlier than q·a
  // would (|a| ≳ 2¹⁰⁴).
  // e2m1 (MXFP4) codes take planes of i16 words instead: the row read as
  // 32 words (word i = columns 2i, 2i + 1), each nibble shifted to the top of
  // its word, >>ₐ 3 and & 0x8E00: f16 bits S 000 mag 000000000, the e2m1
  // value × 2⁻¹⁴ (vcvtph2ps); accumulator j = 2h + p holds columns
  // 32h + 2l + p (lane l).
  bool planes() const { return d_.b_type == DType::u4 || d_.b_type == DType::f4e2m1; }
  // The column of lane l of plane accumulator j.
  int plane_column(int j, int l) const {
    return d_.b_type == DType::u4 ? 4 * l + j : 32 * (j / 2) + 2 * l + j % 2;
  }

  // Where the fold accumulates: planes_[row][j] (u4, e2m1) or sums[row][vector j] (e4m3).
  llvm::Value* quant_slot(int r, int j) {
    if (planes()) return b_.CreateGEP(vm_.f32v(), planes_, i64(int64_t(r) * 4 + j));
    return sums_slot(i64(r), i64(j));
  }

  // The 16 lanes plane_column(j, l) of a 64-lane vector (v0..v3 concatenated).
  llvm::Value* plane_lanes(const std::vector<llvm::Value*>& v, int j) {
    llvm::Value* all = llvm::concatenateVectors(b_, v);
    std::vector<int> m;
    for (int l = 0; l < kLanes; ++l) m.push_back(plane_column(j, l));
    return b_.CreateShuffleVector(all, m);
  }
  static std::vector<int> iota_mask(int start, int n) {
    std::vector<int> m;
    for (int i = 0; i < n; ++i) m.push_back(start + i);
    return m;
  }

  // sums[row][v] lane c = column 16v + c: the (plane, lane) plane_column names.
  void unpermute_planes() {
    std::vector<int> where(64);  // column -> index in the 64 concatenated plane lanes
    for (int j = 0; j < 4; ++j)
      for (int l = 0; l < kLanes; ++l) where[size_t(plane_column(j, l))] = j * kLanes + l;
    for (int r = 0; r < d_.mr; ++r) {
      std::vector<llvm::Value*> p;
      for (int j = 0; j < 4; ++j)
        p.push_back(b_.CreateAlignedLoad(vm_.f32v(), quant_slot(r, j), llvm::Align(64)));
      llvm::Value* all = llvm::concatenateVectors(b_, p);
      for (int v = 0; v < nz_; ++v) {
        std::vector<int> m;
        for (int c = 0; c < kLanes; ++c) m.push_back(where[size_t(16 * v + c)]);
        b_.CreateAlignedStore(b_.CreateShuffleVector(all, m), sums_slot(i64(r), i64(v)),
                              llvm::Align(64));
      }
    }
  }

  // The 8 plane vectors (even j, odd j for j = 0..3) of k-pair row kp, as
  // exact f32 (q for planes 0, 2; 256·q for planes 1, 3).
  std::vector<llvm::Value*> plane_decode(llvm::Value* kp) {
    llvm::Value* row = byte_gep(b_ptr_, b_.CreateMul(kp, i64(d_.b_row_bytes)));
    if (d_.b_type == DType::f4e2m1) {
      llvm::Value* w = b_.CreateAlignedLoad(vec(b_.getInt16Ty(), 32), row, llvm::Align(2));
      auto c16 = [&](int v) { return llvm::ConstantInt::get(w->getType(), v); };
      // The nibble at bit b as 32 f32 values (column 2i + b / 8 in lane i).
      auto nib = [&](int b) {
        llvm::Value* t = b == 12 ? w : b_.CreateShl(w, c16(12 - b));
        llvm::Value* h = b_.CreateAnd(b_.CreateAShr(t, c16(3)), c16(0x8E00));
        return half_to_f32(h, 32);
      };
      auto half = [&](llvm::Value* v32, int h) {
        return b_.CreateShuffleVector(v32, iota_mask(16 * h, 16));
      };
      llvm::Value* e0 = nib(0);  // even k of the low-byte columns
      llvm::Value* o0 = nib(4);
      llvm::Value* e1 = nib(8);  // the high-byte columns
      llvm::Value* o1 = nib(12);
      // Plane j = 2h + p: (even, odd) of its columns.
      return {half(e0, 0), half(o0, 0), half(e1, 0), half(o1, 0),
              half(e0, 1), half(o0, 1), half(e1, 1), half(o1, 1)};
    }
    llvm::Value* x = b_.CreateAlignedLoad(vm_.i32v(), row, llvm::Align(4));
    llvm::Value* x4 = b_.CreateLShr(x, vm_.i32(4));
    llvm::Value* x16 = b_.CreateLShr(x, vm_.i32(16));
    llvm::Value* x20 = b_.CreateLShr(x, vm_.i32(20));
    auto f = [&](llvm::Value* v, uint32_t mask) {
      return b_.CreateSIToFP(b_.CreateAnd(v, vm_.i32(mask)), vm_.f32v());
    };
    return {f(x, 0xF),   f(x4, 0xF),  f(x, 0xF00),   f(x4, 0xF00),
            f(x16, 0xF), f(x20, 0xF), f(x16, 0xF00), f(x20, 0xF00)};
  }

  llvm::Value* load_group(llvm::Value* kp) {
    return b_.CreateSExt(
        invariant_load(b_.getInt32Ty(),
                       b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, q_groups)), kp), 4),
        b_.getInt64Ty());
  }

  // The carried values of one run: one group sum per (row, vector), then Σa
  // per row (u4). The even and the odd products go into the same sum (2
  // dependent FMAs per k-pair: with 8 such chains in a pass the FMA ports,
  // not the latency, bound it), so a row's 64 columns fit one AVX2 pass.
  std::vector<llvm::Value*> zero_run(const QuantPass& qp) {
    std::vector<llvm::Value*> v(size_t(qp.mb * qp.nv), llvm::Constant::getNullValue(vm_.f32v()));
    if (d_.b_type == DType::u4)
      for (int r = 0; r < qp.mb; ++r) v.push_back(llvm::ConstantFP::get(b_.getFloatTy(), 0.0));
    return v;
  }
  size_t qi(const QuantPass& qp, int r, int j) const { return size_t(r) * qp.nv + j; }

  // for (kp = 0; kp < full;) { g = groups[kp]; run while groups[kp] == g; fold }
  void quant_runs(const QuantPass& qp, int64_t full) {
    llvm::LLVMContext& ctx = b_.getContext();
    llvm::Function* f = b_.GetInsertBlock()->getParent();
    llvm::BasicBlock* pre = b_.GetInsertBlock();
    auto* head = llvm::BasicBlock::Create(ctx, "run", f);
    auto* body = llvm::BasicBlock::Create(ctx, "run.pair", f);
    auto* fold = llvm::BasicBlock::Create(ctx, "run.fold", f);
    auto* exit = llvm::BasicBlock::Create(ctx, "run.end", f);
    llvm::Type* i64t = b_.getInt64Ty();
    b_.CreateBr(head);

    b_.SetInsertPoint(head);
    llvm::PHINode* kp = b_.CreatePHI(i64t, 2, "run.kp");
    kp->addIncoming(i64(0), pre);
    llvm::Value* g = load_group(kp);
    b_.CreateBr(body);

    b_.SetInsertPoint(body);
    llvm::PHINode* p = b_.CreatePHI(i64t, 2, "run.p");
    p->addIncoming(kp, head);
    const std::vector<llvm::Value*> init = zero_run(qp);
    std::vector<llvm::PHINode*> phis;
    std::vector<llvm::Value*> acc;
    for (llvm::Value* v : init) {
      llvm::PHINode* ph = b_.CreatePHI(v->getType(), 2);
      ph->addIncoming(v, head);
      phis.push_back(ph);
      acc.push_back(ph);
    }
    quant_prefetch(qp, p);
    quant_pair(qp, p, /*odd_only=*/false, acc);
    llvm::Value* next = b_.CreateAdd(p, i64(1));
    // groups[min(next, full − 1)]: never read past the table.
    llvm::Value* more = b_.CreateICmpSLT(next, i64(full));
    llvm::Value* ng = load_group(b_.CreateSelect(more, next, i64(full - 1)));
    llvm::Value* same = b_.CreateAnd(more, b_.CreateICmpEQ(ng, g));
    llvm::BasicBlock* latch = b_.GetInsertBlock();
    p->addIncoming(next, latch);
    for (size_t i = 0; i < phis.size(); ++i) phis[i]->addIncoming(acc[i], latch);
    b_.CreateCondBr(same, body, fold);

    b_.SetInsertPoint(fold);
    quant_fold(qp, g, acc);
    kp->addIncoming(next, b_.GetInsertBlock());
    b_.CreateCondBr(more, head, exit);
    b_.SetInsertPoint(exit);
  }

  // The code row of k-pair `kp` streams from DRAM at M = 1: the first pass
  // pulls the row kPrefetchRows ahead (one line per 64 code bytes).
  void quant_prefetch(const QuantPass& qp, llvm::Value* kp) {
    if (qp.j0 != 0 || qp.row0 != 0) return;
    constexpr int64_t kPrefetchBytes = 4096;
    const int64_t rb = d_.b_row_bytes;
    llvm::Value* ahead =
        byte_gep(b_ptr_, b_.CreateAdd(b_.CreateMul(kp, i64(rb)), i64(kPrefetchBytes)));
    for (int64_t off = 0; off < rb; off += 64)
      b_.CreateIntrinsic(llvm::Intrinsic::prefetch, {b_.getPtrTy()},
                         {byte_gep(ahead, off), b_.getInt32(0), b_.getInt32(2), b_.getInt32(1)});
  }

  llvm::FixedVectorType* vec(llvm::Type* t, int n) { return llvm::FixedVectorType::get(t, n); }

  // f16 bits (<n x i16>) -> f32, exactly: vcvtph2ps on F16C hosts (fpext),
  // else VectorMath's integer conversion.
  llvm::Value* half_to_f32(llvm::Value* h16, int n) {
    if (mc_.host.f16c)
      return b_.CreateFPExt(b_.CreateBitCast(h16, vec(b_.getHalfTy(), n)), vec(b_.getFloatTy(), n));
    VectorMath vmn(b_, static_cast<unsigned>(n));
    return vmn.f16_to_f32(h16);
  }

  // Column vector j (16 columns) of e4m3 k-pair row kp as (even k, odd k)
  // f32 vectors: a column's code pair read as one i16 (even code in the low
  // byte), each code to f16 bits S 0 EEEE MMM 0000000 by a shift to the
  // top, an arithmetic shift by 1 (the sign into bit 14 too) and a mask.
  std::pair<llvm::Value*, llvm::Value*> e4m3_decode(llvm::Value* kp, int j) {
    llvm::Value* row = byte_gep(b_ptr_, b_.CreateMul(kp, i64(d_.b_row_bytes)));
    llvm::Value* w =
        b_.CreateAlignedLoad(vec(b_.getInt16Ty(), 16), byte_gep(row, i64(32 * j)), llvm::Align(2));
    auto c16 = [&](int v) { return llvm::ConstantInt::get(w->getType(), v); };
    llvm::Value* he = b_.CreateAnd(b_.CreateAShr(b_.CreateShl(w, c16(8)), c16(1)), c16(0xBF80));
    llvm::Value* ho = b_.CreateAnd(b_.CreateAShr(w, c16(1)), c16(0xBF80));
    return {half_to_f32(he, 16), half_to_f32(ho, 16)};
  }

  // One k-pair row of the pass: decode, multiply-add, Σa.
  void quant_pair(const QuantPass& qp, llvm::Value* kp, bool odd_only,
                  std::vector<llvm::Value*>& acc) {
    std::vector<std::pair<llvm::Value*, llvm::Value*>> v;
    if (planes()) {
      const std::vector<llvm::Value*> pl = plane_decode(kp);
      for (int j = 0; j < 4; ++j) v.push_back({pl[size_t(2 * j)], pl[size_t(2 * j + 1)]});
    } else {
      for (int j = 0; j < qp.nv; ++j) v.push_back(e4m3_decode(kp, qp.j0 + j));
    }
    for (int r = 0; r < qp.mb; ++r) {
      llvm::Value* pair;
      if (odd_only)
        pair = b_.CreateZExt(
            b_.CreateAlignedLoad(b_.getInt16Ty(),
                                 byte_gep(a_rows_[size_t(qp.row0 + r)], b_.CreateMul(kp, i64(4))),
                                 llvm::Align(2)),
            b_.getInt32Ty());
      else
        pair = load_a_pair(qp.row0 + r, kp);
      llvm::Value* ae = as_float(b_.CreateShl(pair, b_.getInt32(16)));
      llvm::Value* ao = as_float(b_.CreateAnd(pair, b_.getInt32(0xffff0000u)));
      llvm::Value* a0 = vm_.splat(ae);
      llvm::Value* a1 = vm_.splat(ao);
      for (int j = 0; j < qp.nv; ++j) {
        const size_t i = qi(qp, r, j);
        acc[i] = vm_.fma(a0, v[size_t(j)].first, acc[i]);
        acc[i] = vm_.fma(a1, v[size_t(j)].second, acc[i]);
      }
      if (d_.b_type == DType::u4) {
        const size_t si = size_t(qp.mb * qp.nv + r);
        acc[si] = b_.CreateFAdd(acc[si], b_.CreateFAdd(ae, ao));
      }
    }
  }

  // sums[row][vector] += s ⊙ d of the run (header above).
  void quant_fold(const QuantPass& qp, llvm::Value* g, const std::vector<llvm::Value*>& acc) {
    llvm::Value* grow = b_.CreateMul(g, i64(64));
    llvm::Value* srow = b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, q_scales)), grow);
    std::vector<llvm::Value*> s_all, z_all;
    if (planes()) {
      for (int v = 0; v < 4; ++v) {
        // MXFP4's q_scales are its e8m0 bytes, 64 per group row.
        s_all.push_back(
            d_.b_type == DType::f4e2m1
                ? vm_.e8m0_to_f32(invariant_load(
                      vec(b_.getInt8Ty(), int(vm_.lanes())),
                      byte_gep(arg(TILEJIT_ARG(Args, q_scales)), b_.CreateAdd(grow, i64(16 * v))),
                      1))
                : invariant_load(vm_.f32v(), b_.CreateGEP(b_.getFloatTy(), srow, i64(16 * v)), 4));
        if (d_.b_type == DType::u4)
          z_all.push_back(
              d_.b_zeros
                  ? b_.CreateUIToFP(
                        b_.CreateZExt(invariant_load(vec(b_.getInt8Ty(), 16),
                                                     byte_gep(arg(TILEJIT_ARG(Args, q_zeros)),
                                                              b_.CreateAdd(grow, i64(16 * v))),
                                                     1),
                                      vm_.i32v()),
                        vm_.f32v())
                  : vm_.f32(8.0f));
      }
    }
    for (int j = 0; j < qp.nv; ++j) {
      const int64_t c0 = 16 * int64_t(qp.j0 + j);
      llvm::Value* s =
          planes() ? plane_lanes(s_all, j)
                   : invariant_load(vm_.f32v(), b_.CreateGEP(b_.getFloatTy(), srow, i64(c0)), 4);
      llvm::Value* z = nullptr;
      if (d_.b_type == DType::u4) z = plane_lanes(z_all, j);
      for (int r = 0; r < qp.mb; ++r) {
        llvm::Value* a0 = acc[qi(qp, r, j)];
        llvm::Value* dv;
        if (d_.b_type == DType::f8e4m3) {
          dv = b_.CreateFMul(a0, vm_.f32(256.0f));
        } else if (d_.b_type == DType::f4e2m1) {
          dv = b_.CreateFMul(a0, vm_.f32(16384.0f));
        } else {
          llvm::Value* sa = vm_.splat(acc[size_t(qp.mb * qp.nv + r)]);
          // Planes 1 and 3 hold 256·q (exact ×2⁻⁸).
          if (j % 2 == 1) a0 = b_.CreateFMul(a0, vm_.f32(0x1p-8f));  // planes 1, 3: 256·q
          dv = vm_.fma(b_.CreateFNeg(z), sa, a0);
        }
        llvm::Value* slot = quant_slot(qp.row0 + r, qp.j0 + j);
        llvm::Value* cur = b_.CreateAlignedLoad(vm_.f32v(), slot, llvm::Align(64));
        b_.CreateAlignedStore(vm_.fma(s, dv, cur), slot, llvm::Align(64));
      }
    }
  }

  llvm::Value* tail_mask(int lanes) {
    std::vector<llvm::Constant*> m;
    for (int l = 0; l < kLanes; ++l) m.push_back(b_.getInt1(l < lanes));
    return llvm::ConstantVector::get(m);
  }
  // A load of 16 elements of `t` at p, masked to the first `lanes` (masked-off
  // lanes are neither read nor faulted on, and read as zero).
  llvm::Value* load(llvm::Type* t, llvm::Value* p, int lanes, unsigned align) {
    if (lanes == kLanes) return b_.CreateAlignedLoad(t, p, llvm::Align(align));
    return b_.CreateMaskedLoad(t, p, llvm::Align(align), tail_mask(lanes),
                               llvm::Constant::getNullValue(t));
  }
  void store(llvm::Value* v, llvm::Value* p, int lanes, unsigned align) {
    if (lanes == kLanes)
      b_.CreateAlignedStore(v, p, llvm::Align(align));
    else
      b_.CreateMaskedStore(v, p, llvm::Align(align), tail_mask(lanes));
  }

  // The gated function of a GLU epilogue (see BrgemmDesc::glu).
  llvm::Value* gated(llvm::Value* g, llvm::Value* u) {
    if (d_.glu == Glu::act_mul) return vm_.act_mul(d_.act, g, u);
    return vm_.clamped_swiglu(g, u, d_.glu_alpha, d_.glu_limit);
  }

  // Output vector j = act(column vector j), or with a GLU f(gate vector j, up
  // vector j + 2), whose inputs (acc_in, bias) cover the padded 64-column block
  // unmasked; only the stores of the last output vector are masked.
  void epilogue() {
    const bool glu = d_.glu != Glu::none;
    const int tail = d_.nr % kLanes;
    const int nout = (d_.nr + kLanes - 1) / kLanes;
    auto in_lanes = [&](int j) { return !glu && j == nz_ - 1 && tail != 0 ? tail : kLanes; };
    auto out_lanes = [&](int j) { return j == nout - 1 && tail != 0 ? tail : kLanes; };
    // Bias vectors once, before any store (LLVM cannot know C does not alias them).
    std::vector<llvm::Value*> bias(size_t(nz_), nullptr);
    for (int j = 0; j < nz_ && d_.bias != BiasKind::none; ++j) {
      if (d_.bias == BiasKind::f32)
        bias[j] = load(vm_.f32v(), byte_gep(arg(TILEJIT_ARG(Args, bias)), j * 64), in_lanes(j), 4);
      else
        bias[j] = vm_.bf16_to_f32(
            load(vm_.i16v(), byte_gep(arg(TILEJIT_ARG(Args, bias)), j * 32), in_lanes(j), 2));
    }
    // int8: the per-column scale and zero-point compensation ([64] each).
    std::vector<llvm::Value*> b_scale(size_t(nz_), nullptr), b_comp(size_t(nz_), nullptr);
    const bool scaled = int8_ && d_.out != DType::i32 && !fold_;
    for (int j = 0; j < nz_ && scaled; ++j) {
      b_scale[j] =
          load(vm_.f32v(), byte_gep(arg(TILEJIT_ARG(Args, b_scale)), j * 64), in_lanes(j), 4);
      b_comp[j] =
          load(vm_.i32v(), byte_gep(arg(TILEJIT_ARG(Args, b_comp)), j * 64), in_lanes(j), 4);
    }
    const int out_bytes = d_.out == DType::bf16 ? 2 : 4;
    emit_loop(
        b_, i64(d_.mr), {},
        [&](llvm::Value* row, const std::vector<llvm::Value*>&) {
          llvm::Value* c_row =
              byte_gep(arg(TILEJIT_ARG(Args, c)), b_.CreateMul(row, arg(TILEJIT_ARG(Args, ldc))));
          llvm::Value* in_row = d_.accumulate
                                    ? byte_gep(arg(TILEJIT_ARG(Args, acc_in)),
                                               b_.CreateMul(row, arg(TILEJIT_ARG(Args, ld_acc_in))))
                                    : nullptr;
          llvm::Value* a_zero = nullptr;
          llvm::Value* a_scale = nullptr;
          if (scaled) {
            a_zero = vm_.splat(b_.CreateAlignedLoad(
                b_.getInt32Ty(), b_.CreateGEP(b_.getInt32Ty(), arg(TILEJIT_ARG(Args, a_zero)), row),
                llvm::Align(4)));
            a_scale = vm_.splat(b_.CreateAlignedLoad(
                b_.getFloatTy(),
                b_.CreateGEP(b_.getFloatTy(), arg(TILEJIT_ARG(Args, a_scale)), row),
                llvm::Align(4)));
          }
          // int8: the exact sums (+ int32 acc_in); raw for out i32, else
          // float(acc − a_zero·b_comp) · a_scale · b_scale, then the bias.
          auto int_input = [&](int j) {
            // W4A8: the folded groups' f32 sums (acc_in already in them).
            if (fold_) {
              llvm::Value* f =
                  b_.CreateAlignedLoad(vm_.f32v(), fsum_slot(row, i64(j)), llvm::Align(64));
              return bias[j] != nullptr ? b_.CreateFAdd(f, bias[j]) : f;
            }
            llvm::Value* v =
                b_.CreateAlignedLoad(vm_.i32v(), sums_slot(row, i64(j)), llvm::Align(64));
            if (d_.accumulate)
              v = b_.CreateAdd(v, load(vm_.i32v(), byte_gep(in_row, j * 64), in_lanes(j), 4));
            if (!scaled) return v;
            v = b_.CreateSub(v, b_.CreateMul(a_zero, b_comp[j]));
            llvm::Value* f = b_.CreateSIToFP(v, vm_.f32v());
            f = b_.CreateFMul(b_.CreateFMul(f, a_scale), b_scale[j]);
            if (bias[j] != nullptr) f = b_.CreateFAdd(f, bias[j]);
            return f;
          };
          auto input = [&](int j) {
            if (int8_) return int_input(j);
            llvm::Value* v =
                b_.CreateAlignedLoad(vm_.f32v(), sums_slot(row, i64(j)), llvm::Align(64));
            if (d_.accumulate)
              v = b_.CreateFAdd(v, load(vm_.f32v(), byte_gep(in_row, j * 64), in_lanes(j), 4));
            if (bias[j] != nullptr) v = b_.CreateFAdd(v, bias[j]);
            return v;
          };
          for (int j = 0; j < nout; ++j) {
            llvm::Value* v = glu                    ? gated(input(j), input(j + 2))
                             : d_.out == DType::i32 ? input(j)
                                                    : vm_.activation(d_.act, input(j));
            if (d_.out == DType::bf16) v = vm_.f32_to_bf16(v);
            store(v, byte_gep(c_row, j * kLanes * out_bytes), out_lanes(j), out_bytes);
          }
          return std::vector<llvm::Value*>{};
        },
        "epilogue");
  }

  const BrgemmDesc& d_;
  bool dpbf16_;
  IntDot idot_;
  bool int8_, vnni_;
  bool fold_;   // W4A8: each scale group's int32 sums folded into f32 ones (fsums_)
  bool quant_;  // b = u4, f8e4m3 or f4e2m1: the fused decode kernel (quant_passes)
  VectorMath vm_;
  int nz_ = 1;                 // column vectors of C
  int nzg_ = 1;                // column vectors per group (one pass over K each)
  llvm::Value* j0_ = nullptr;  // first column vector of the group being emitted
  int sets_ = 1, mbs_ = 1;     // the row block being emitted
  int unroll_ = 2;
  llvm::Value* b_ptr_ = nullptr;
  llvm::AllocaInst* sums_ = nullptr;
  llvm::AllocaInst* fsums_ = nullptr;   // W4A8: [mr][nz] f32 sums of the folded groups
  llvm::AllocaInst* planes_ = nullptr;  // u4 fused kernel: [mr][4 planes]
  std::vector<llvm::Value*> a_rows_;
};

void check_desc(const BrgemmDesc& d) {
  auto bad = [&](const std::string& what) {
    throw Error("compile_llvm_brgemm: " + what + " (kernel " + llvm_brgemm_name(d) + ")");
  };
  if (d.mr < 1 || d.mr > kMaxMr) bad("mr = " + std::to_string(d.mr) + " is outside [1, 32]");
  if (d.nr < 1 || d.nr > 64) bad("nr = " + std::to_string(d.nr) + " is outside [1, 64]");
  if (d.kb < 0) bad("kb = " + std::to_string(d.kb) + " is negative");
  const bool int8 = d.a_type == DType::u8;
  const bool types_bf16 =
      d.a_type == DType::bf16 && d.b_type == DType::bf16 && d.acc_type == DType::f32;
  const bool types_int8 = int8 && d.b_type == DType::i8 && d.acc_type == DType::i32;
  const bool quant =
      d.b_type == DType::u4 || d.b_type == DType::f8e4m3 || d.b_type == DType::f4e2m1;
  const bool types_quant = quant && d.a_type == DType::bf16 && d.acc_type == DType::f32;
  if (!types_bf16 && !types_int8 && !types_quant)
    bad(std::string("a/b/acc types ") + dtype_name(d.a_type) + "/" + dtype_name(d.b_type) + "/" +
        dtype_name(d.acc_type) +
        " are not supported (bf16/bf16/f32, u8/i8/i32, or bf16/u4|f8e4m3|f4e2m1/f32)");
  if (d.b_zeros && d.b_type != DType::u4) bad("zero points (zeros = 1) are for b = u4 only");
  if (quant) {
    // The fused decode kernel: one batch item of the whole K, codes rows of
    // 64 (u4, e2m1) or 128 (e4m3) bytes.
    if (d.accumulate || d.a_packed) bad("a quantized B takes no acc_in and no packed A");
    if (d.kb < 1) bad("kb = " + std::to_string(d.kb) + " must be >= 1 with a quantized B");
    const int64_t row = d.b_type == DType::f8e4m3 ? 128 : 64;
    if (d.b_row_bytes != row)
      bad("b_row_bytes = " + std::to_string(d.b_row_bytes) + " must be " + std::to_string(row) +
          " for b = " + dtype_name(d.b_type));
  }
  if (int8 && d.kb % 4 != 0)
    bad("kb = " + std::to_string(d.kb) + " is not a multiple of 4 (int8 k-quads)");
  if (d.w4a8 && (!types_int8 || d.kb % 16 != 0 || d.out == DType::i32))
    bad("w4a8 takes a=u8 b=i8 acc=i32, kb a multiple of 16 and out f32 or bf16");
  if (d.glu != Glu::none && d.nr > 32)
    bad("a GLU stores nr = " + std::to_string(d.nr) + " > 32 columns");
  const int64_t need = (d.computed_cols() + kLanes - 1) / kLanes * 64;
  if (!quant && (d.b_row_bytes < need || d.b_row_bytes % 4 != 0))
    bad("b_row_bytes = " + std::to_string(d.b_row_bytes) +
        " must be a multiple of 4 and at least " + std::to_string(need) + " for " +
        std::to_string(d.computed_cols()) + " columns");
  if (d.out == DType::i32 && int8) {
    if (d.bias != BiasKind::none || d.act != Activation::none || d.glu != Glu::none)
      bad("out = i32 stores the raw int32 sums: no bias, activation or GLU");
  } else if (d.out != DType::f32 && d.out != DType::bf16) {
    bad(std::string("out = ") + dtype_name(d.out) + " is not supported (f32 or bf16" +
        (int8 ? ", or i32" : "") + ")");
  }
  if (d.bias != BiasKind::none && d.bias != BiasKind::f32 && d.bias != BiasKind::bf16)
    bad("bias kind " + std::to_string(static_cast<int>(d.bias)) + " is not none, f32 or bf16");
  if (ir::find_activation(d.act) == nullptr)
    bad("activation " + std::to_string(static_cast<int>(d.act)) + " is not supported");
}

}  // namespace

std::string llvm_brgemm_name(const BrgemmDesc& d) {
  BrgemmDesc n = d;
  n.isa = Isa::scalar;  // any value: its spelling is replaced below
  const std::string s = n.name();
  const std::string prefix = std::string("brgemm_") + isa_name(n.isa);
  return "brgemm_llvm" + s.substr(prefix.size());
}

namespace {

bool has_feature(const HostTarget& host, const std::string& f) {
  const std::string list = "," + host.features + ",";
  return list.find(",+" + f + ",") != std::string::npos;
}

// The int8 dot product for the target: vpdpbusd where it has AVX512-VNNI
// (zmm) or AVX-VNNI (ymm, twice), else the widened i32 multiply-adds.
IntDot int8_dot(const BrgemmDesc& d, const LlvmBrgemmOptions& options, const HostTarget& host) {
  const bool zmm = host.vector_bits >= 512 && has_feature(host, "avx512vnni");
  const bool ymm = has_feature(host, "avxvnni") ||
                   (has_feature(host, "avx512vnni") && has_feature(host, "avx512vl"));
  const IntDot best = zmm ? IntDot::vpdpbusd512 : ymm ? IntDot::vpdpbusd256 : IntDot::imul;
  switch (options.dot) {
    case BrgemmDot::best:
      return best;
    case BrgemmDot::imul:
      return IntDot::imul;
    case BrgemmDot::vpdpbusd:
      if (best == IntDot::imul)
        throw Error(
            "compile_llvm_brgemm: dot = vpdpbusd needs AVX512-VNNI or AVX-VNNI, which "
            "this host (" +
            host.cpu + ") lacks");
      return best;
    default:
      throw Error("compile_llvm_brgemm: dot = fma / dpbf16 is for bf16 kernels; the int8 kernel " +
                  llvm_brgemm_name(d) + " takes best, vpdpbusd or imul");
  }
}

}  // namespace

LlvmKernel compile_llvm_brgemm(const BrgemmDesc& d, const LlvmBrgemmOptions& options) {
  check_desc(d);
  require_vector_host("compile_llvm_brgemm");
  const HostTarget& host = host_target();
  if (d.a_type == DType::u8) {
    const IntDot idot = int8_dot(d, options, host);
    std::string name = llvm_brgemm_name(d);
    if (options.dot != BrgemmDot::best) name += idot == IntDot::imul ? "_imul" : "_vpdpbusd";
    return compile_emitter<BrgemmEmitter>(name, options.opt, d, false, idot);
  }
  if (d.b_type != DType::bf16) {
    // The fused quantized decode kernel: f32 FMAs on exact weights.
    if (options.dot != BrgemmDot::best && options.dot != BrgemmDot::fma)
      throw Error("compile_llvm_brgemm: the quantized kernel " + llvm_brgemm_name(d) +
                  " takes dot = best or fma");
    return compile_emitter<BrgemmEmitter>(llvm_brgemm_name(d), options.opt, d, false, IntDot::none);
  }
  if (options.dot != BrgemmDot::best && options.dot != BrgemmDot::fma &&
      options.dot != BrgemmDot::dpbf16)
    throw Error("compile_llvm_brgemm: dot = vpdpbusd / imul is for int8 kernels; the bf16 kernel " +
                llvm_brgemm_name(d) + " takes best, fma or dpbf16");
  const bool dpbf16 =
      options.dot == BrgemmDot::dpbf16 || (options.dot == BrgemmDot::best && host.avx512bf16);
  if (dpbf16 && !host.avx512bf16)
    throw Error("compile_llvm_brgemm: dot = dpbf16 needs AVX512-BF16, which this host (" +
                host.cpu + ") lacks");
  // A forced variant is spelled in the name; the default is the host's best.
  std::string name = llvm_brgemm_name(d);
  if (options.dot != BrgemmDot::best) name += dpbf16 ? "_dpbf16" : "_fma";
  return compile_emitter<BrgemmEmitter>(name, options.opt, d, dpbf16, IntDot::none);
}

}  // namespace tilejit::codegen::llvm_backend
