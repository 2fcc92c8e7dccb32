// AVX-512 batch-reduce GEMM micro-kernel for CPUs without AMX: bf16 × bf16 →
// f32 (vdpbf16ps) or u8 × i8 → i32 (vpdpbusd, the non-saturating one).
//
// Register blocking: mr rows × nz zmm columns of fp32 / int32 accumulators
// (nz = ceil(nr/16) ≤ 4), ksplit copies of them when mr·nz is too small to
// hide the dot-product latency (decode shapes), nz registers of B per k-group
// (4 bytes of K: a bf16 pair or an int8 quad). bf16 A is broadcast straight
// from memory as the {1to16} operand; vpdpbusd takes its unsigned bytes (A)
// only from a register, so int8 A is broadcast (vpbroadcastd, 4 bytes) into
// one register per row, and where the accumulators leave too few registers
// for all nz B vectors the last ones are read from memory by each
// vpdpbusd. A rows are addressed from one base register per three rows
// ([base], [base+lda], [base+2·lda]). Int8 kernels then apply the
// zero-point compensation and scales of Avx512Epilogue::apply_int8_and_store
// (with a GLU, apply_int8_glu_and_store: gate and up scaled, then the GLU).
//
// W4A8 (desc.w4a8, the contract in codegen/brgemm_desc.h): the same int8
// loop, and at the end of each scale group (a batch item whose
// args.w4a8_scales entry is not null) the group's int32 sums are folded into
// f32 sums kept in a stack block (mr × the computed columns, in L1):
// float(acc − a_zero·comp)·a_scale·scale + f, in that order, and the
// accumulators restart at zero. The f32 sums start at acc_in or at −0 and
// end in the f32 epilogue (bias, activation or GLU, the store).
#include <algorithm>
#include <stdexcept>
#include <vector>

#include "codegen/xbyak/avx512_epilogue.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/w4a8_fold.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;

class Avx512Brgemm : public JitGenerator {
 public:
  explicit Avx512Brgemm(const BrgemmDesc& d)
      : d_(d), int8_(d.a_type == DType::u8), w4a8_(d.w4a8), epi_d_(d) {
    if (w4a8_) {
      // The epilogue sees the folded f32 sums (acc_in already in them).
      epi_d_.a_type = epi_d_.b_type = DType::bf16;
      epi_d_.acc_type = DType::f32;
      epi_d_.accumulate = false;
    }
    nz_ = (d.computed_cols() + 15) / 16;
    ksplit_ = d.one_chain ? 1 : avx512_brgemm_ksplit(d.mr, nz_);
    // Int8: one register holds the broadcast A row; B gets what is left.
    b_regs_ = int8_ ? std::min(nz_, 32 - ksplit_ * d.mr * nz_ - 1) : nz_;
    generate();
  }

 private:
  static constexpr int kUnroll = 4;  // k-groups per loop iteration (multiple of ksplit)
  // B rows (k-groups) prefetched ahead: BrgemmDesc::prefetch_kib, by default
  // 32 KiB (128 rows of 256 bytes).
  int64_t prefetch_rows() const {
    return int64_t{d_.effective_prefetch_kib()} * 1024 / d_.b_row_bytes;
  }

  Xbyak::Zmm acc(int s, int r, int j) const { return Xbyak::Zmm(s * d_.mr * nz_ + r * nz_ + j); }
  Xbyak::Zmm breg(int j) const { return Xbyak::Zmm(ksplit_ * d_.mr * nz_ + j); }
  Xbyak::Zmm a_reg() const { return Xbyak::Zmm(ksplit_ * d_.mr * nz_ + b_regs_); }  // int8
  // A element address of row r at byte offset `off` of the current k position.
  Xbyak::RegExp a_exp(int r, int64_t off) const {
    const Xbyak::Reg64& base = abase_[r / 3];
    switch (r % 3) {
      case 0:
        return base + off;
      case 1:
        return base + lda_ + off;
      default:
        return base + lda_ * 2 + off;
    }
  }
  Xbyak::Address a_addr(int r, int64_t off) { return ptr_b[a_exp(r, off)]; }

  void k_pair(int64_t u, int set) {
    // B for this k-group: nz vectors of 16 column pairs (quads), b_regs_ of
    // them in registers.
    for (int j = 0; j < b_regs_; ++j) vmovups(breg(j), ptr[b_ + u * d_.b_row_bytes + j * 64]);
    // B lines 128 k-pairs (32 KiB, the default) ahead into L2: the hardware prefetchers
    // alone left a cold M = 1 decode at 67-70 % of the DRAM read rate on the
    // AMX Xeon; with this it reaches 97-99 % (and hot or compute-bound calls
    // gained 2-6 %). Prefetches past the panel's end are harmless.
    if (const int64_t ahead = prefetch_rows(); ahead > 0)
      for (int j = 0; j < nz_; ++j) prefetcht1(ptr[b_ + (u + ahead) * d_.b_row_bytes + j * 64]);
    if (int8_) {
      for (int r = 0; r < d_.mr; ++r) {
        vpbroadcastd(a_reg(), dword[a_exp(r, u * 4)]);
        for (int j = 0; j < nz_; ++j) {
          if (j < b_regs_)
            vpdpbusd(acc(set, r, j), a_reg(), breg(j));
          else
            vpdpbusd(acc(set, r, j), a_reg(), ptr[b_ + u * d_.b_row_bytes + j * 64]);
        }
      }
      return;
    }
    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < nz_; ++j) vdpbf16ps(acc(set, r, j), breg(j), a_addr(r, u * 4));
  }

  // W4A8: the stack slot of the f32 sums of row r, vector j.
  Xbyak::Address f_slot(int r, int j) const { return ptr[rsp + (r * nz_ + j) * 64]; }
  int64_t f_bytes() const { return int64_t{d_.mr} * nz_ * 64; }

  // W4A8, after a batch item that ends a scale group: fold every
  // accumulator (the k-split copies added first) and restart them.
  void w4a8_group_end() {
    Xbyak::Label skip;
    fold_.group_end(r11, r14, r10, skip);
    for (int s = 1; s < ksplit_; ++s)
      for (int r = 0; r < d_.mr; ++r)
        for (int j = 0; j < nz_; ++j) {
          vpaddd(acc(0, r, j), acc(0, r, j), acc(s, r, j));
          vpxord(acc(s, r, j), acc(s, r, j), acc(s, r, j));
        }
    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < nz_; ++j) {
        fold_.fold(acc(0, r, j), a_reg(), r, j);
        vpxord(acc(0, r, j), acc(0, r, j), acc(0, r, j));
      }
    L(skip);
  }

  void advance(int64_t pairs) {
    for (int i = 0; i < (d_.mr + 2) / 3; ++i) add(abase_[i], pairs * 4);
    add(b_, pairs * d_.b_row_bytes);
  }

  void generate() {
    push_callee_saved();
    if (w4a8_) {
      sub(rsp, f_bytes());
      fold_.init(nz_, acc(0, 0, 0));  // (the accumulators are zeroed below)
      mov(r11, arg(offsetof(BrgemmArgs, w4a8_scales)));
      mov(r14, arg(offsetof(BrgemmArgs, w4a8_comps)));
    }
    const int nbase = (d_.mr + 2) / 3;
    const Xbyak::Reg64 bases[] = {rax, rbx, r12, r13};
    for (int i = 0; i < nbase; ++i) abase_[i] = bases[i];

    mov(lda_, arg(offsetof(BrgemmArgs, lda)));
    mov(r8, arg(offsetof(BrgemmArgs, a)));       // A list
    mov(r9, arg(offsetof(BrgemmArgs, b)));       // B list
    mov(r10, arg(offsetof(BrgemmArgs, batch)));  // batch count
    for (int s = 0; s < ksplit_; ++s)
      for (int r = 0; r < d_.mr; ++r)
        for (int j = 0; j < nz_; ++j) vpxord(acc(s, r, j), acc(s, r, j), acc(s, r, j));

    // k-groups of 4 bytes: bf16 pairs (an odd kb leaves one k), int8 quads
    // (kb is a multiple of 4).
    const int64_t kp = d_.kb / d_.k_group();
    const bool odd = !int8_ && d_.kb % 2 != 0;
    Xbyak::Label batch_loop, batch_done, k_loop;
    test(r10, r10);
    jle(batch_done, T_NEAR);
    L(batch_loop);
    {
      mov(abase_[0], ptr[r8]);
      mov(b_, ptr[r9]);
      lea(rdx, ptr[lda_ + lda_ * 2]);  // 3·lda
      for (int i = 1; i < nbase; ++i) lea(abase_[i], ptr[abase_[i - 1] + rdx]);

      const int64_t iters = kp / kUnroll;
      if (iters > 0) {
        mov(rcx, iters);
        L(k_loop);
        for (int u = 0; u < kUnroll; ++u) k_pair(u, u % ksplit_);
        advance(kUnroll);
        dec(rcx);
        jnz(k_loop, T_NEAR);
      }
      const int64_t rem = kp % kUnroll;
      for (int64_t u = 0; u < rem; ++u) k_pair(u, static_cast<int>(u % ksplit_));
      if (odd) {
        // The last, unpaired k: zero-extend the single bf16 of each A row (its
        // neighbour may lie past the row or be NaN), pair it with B's row whose
        // second half is packing padding (zero).
        const Xbyak::Zmm a1 = breg(0);
        for (int r = 0; r < d_.mr; ++r) {
          movzx(edx, word[a_exp(r, rem * 4)]);
          vpbroadcastd(a1, edx);
          for (int j = 0; j < nz_; ++j)
            vdpbf16ps(acc(0, r, j), a1, ptr[b_ + rem * d_.b_row_bytes + j * 64]);
        }
      }
      if (w4a8_) w4a8_group_end();
      add(r8, 8);
      add(r9, 8);
      dec(r10);
      jnz(batch_loop, T_NEAR);
    }
    L(batch_done);

    // W4A8: the folded f32 sums (the k-split copies are in them).
    if (w4a8_)
      for (int r = 0; r < d_.mr; ++r)
        for (int j = 0; j < nz_; ++j) vmovups(acc(0, r, j), f_slot(r, j));
    // Epilogue: fold the k-split copies, then bias/activation/convert/store row by row.
    for (int s = 1; s < ksplit_ && !w4a8_; ++s)
      for (int r = 0; r < d_.mr; ++r)
        for (int j = 0; j < nz_; ++j) {
          if (int8_)
            vpaddd(acc(0, r, j), acc(0, r, j), acc(s, r, j));
          else
            vaddps(acc(0, r, j), acc(0, r, j), acc(s, r, j));
        }
    const int first_free = d_.mr * nz_;
    Avx512Epilogue epi(*this, epi_d_,
                       {Xbyak::Zmm(first_free), Xbyak::Zmm(first_free + 1),
                        Xbyak::Zmm(first_free + 2), Xbyak::Zmm(first_free + 3)});
    const int tail_cols = d_.nr % 16;
    if (tail_cols != 0) {
      mov(edx, (1u << tail_cols) - 1);
      kmovw(k1, edx);
    }
    mov(rsi, arg(offsetof(BrgemmArgs, c)));     // C row pointer
    mov(r11, arg(offsetof(BrgemmArgs, ldc)));   // ldc
    mov(r14, arg(offsetof(BrgemmArgs, bias)));  // bias
    if (epi_d_.accumulate) {
      mov(r8, arg(offsetof(BrgemmArgs, acc_in)));     // acc_in row
      mov(r9, arg(offsetof(BrgemmArgs, ld_acc_in)));  // its stride
    }
    // Int8: the scales and zero points (the A base registers are free now).
    const Avx512Epilogue::Int8Regs q{rax, rbx, r12, r13};
    const bool int8_epi = int8_ && !w4a8_;  // W4A8 stores f32 sums
    if (int8_epi && d_.out != DType::i32) {
      mov(q.a_scale, arg(offsetof(BrgemmArgs, a_scale)));
      mov(q.a_zero, arg(offsetof(BrgemmArgs, a_zero)));
      mov(q.b_scale, arg(offsetof(BrgemmArgs, b_scale)));
      mov(q.b_comp, arg(offsetof(BrgemmArgs, b_comp)));
    }
    // Output vectors: nz_, or with a GLU the ceil(nr/16) ≤ 2 gate vectors,
    // each paired with the up vector two further on.
    const int nout = d_.glu != Glu::none ? (d_.nr + 15) / 16 : nz_;
    for (int r = 0; r < d_.mr; ++r) {
      for (int j = 0; j < nout; ++j) {
        const bool last = j == nout - 1 && tail_cols != 0;
        if (int8_epi && d_.glu != Glu::none)
          epi.apply_int8_glu_and_store(acc(0, r, j), acc(0, r, j + 2), j, r, q, rsi, r14,
                                       last ? &k1 : nullptr, r8);
        else if (int8_epi)
          epi.apply_int8_and_store(acc(0, r, j), j, r, q, rsi, r14, last ? &k1 : nullptr, r8);
        else if (d_.glu != Glu::none)
          epi.apply_glu_and_store(acc(0, r, j), acc(0, r, j + 2), j, rsi, r14, last ? &k1 : nullptr,
                                  r8);
        else
          epi.apply_and_store(acc(0, r, j), j, rsi, r14, last ? &k1 : nullptr, r8);
      }
      if (r + 1 < d_.mr) {
        add(rsi, r11);
        if (epi_d_.accumulate) add(r8, r9);
      }
    }
    vzeroupper();
    if (w4a8_) add(rsp, f_bytes());
    pop_callee_saved();
    ret();
  }

  const BrgemmDesc& d_;
  const bool int8_, w4a8_;
  BrgemmDesc epi_d_;  // what the epilogue sees (W4A8: f32 sums)
  // (After d_: it keeps a reference to it.)
  W4A8Fold fold_{*this, d_, [this](int r, int j) { return f_slot(r, j); }};
  int nz_ = 1, ksplit_ = 1, b_regs_ = 1;
  Xbyak::Reg64 abase_[4];
  const Xbyak::Reg64 lda_ = r15;
  const Xbyak::Reg64 b_ = rsi;
};

}  // namespace

int avx512_brgemm_ksplit(int mr, int nz) {
  // vdpbf16ps has a latency of several cycles: keep at least 8 independent
  // accumulator chains, within the 32 zmm registers (B takes nz of them).
  int ks = 1;
  while (ks < 4 && ks * mr * nz < 8 && 2 * ks * mr * nz + nz <= 32) ks *= 2;
  return ks;
}

int avx512_brgemm_max_mr(int nz) {
  // mr·nz accumulators + max(nz B registers, 4 epilogue temporaries) ≤ 32;
  // 12 rows is the most the four A base registers address.
  return std::min(12, (32 - std::max(nz, 4)) / nz);
}

std::vector<uint8_t> emit_avx512_brgemm(const BrgemmDesc& d) {
  Avx512Brgemm g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
