// AMX batch-reduce GEMM micro-kernel: bf16 × bf16 → f32 (tdpbf16ps) or
// u8 × i8 → i32 (tdpbusd).
//
// C[mr ≤ 32 × nr ≤ 64] in up to 2 × 4 accumulator tiles of 16×16 f32 / i32. With two
// row tiles the eight tile registers hold 2×2 accumulators + 2 A + 2 B, so the
// 64 columns are done in two passes; with one row tile, 1×4 accumulators + 1 A
// + 3 rotating B tiles do them in one. The accumulators stay in tiles across
// the whole K loop and are stored once to a stack scratch, from which the
// shared AVX-512 epilogue applies bias/activation/conversion and masked stores.
// M tails are tile rows; N tails are masked stores (B is zero-padded to 64
// columns); K tails use a zero-padded copy of A's last 32 columns (a_tail) and
// B's zero-padded K rows, so no tile load reads past a row. A kernel with a K
// tail (kb % 32 ≠ 0) must be called with batch == 1. With desc.a_packed, A
// comes in the PackedA tile layout instead (contiguous tiles, K zero-padded):
// no K tail step, any batch.
//
// Int8 kernels have the same blocking, tile shapes and prefetches: a K step
// is 64 bytes of A either way (32 bf16 or 64 u8) and a B tile 16 k-group rows
// (pairs or quads) of 64 bytes; they take packed A only (kb rounds up to
// whole K steps of 64, A and B being zero-padded to them), keep int32 sums
// in the tiles and finish with Avx512Epilogue::apply_int8_and_store (raw
// int32 sums with out = i32: stored straight from whole tiles), or with a
// GLU Avx512Epilogue::apply_int8_glu_and_store from the scratch of all passes.
//
// W4A8 (desc.w4a8, the contract in codegen/brgemm_desc.h): the int8 tiles
// over row-major A (lda apart; kb a multiple of 64, so no K tail), and at the
// end of each scale group (a batch item whose args.w4a8_scales entry is not
// null) the pass's int32 tiles are stored to the scratch, folded into an f32
// block on the stack (mr × the computed columns) as
// float(acc − a_zero·comp)·a_scale·scale + f, in that order, and zeroed. The
// f32 block starts at acc_in or at −0 and ends in the f32 epilogue.
#include <algorithm>

#include "codegen/packed_layout.h"
#include "codegen/xbyak/amx_tile_config.h"
#include "codegen/xbyak/avx512_epilogue.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/w4a8_fold.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;

constexpr int kPrefetchLinesPerStep = 8;

// The tile blocking of a descriptor: row tiles, column tiles, column tiles
// per pass (2 with two row tiles, else 4) and passes.
struct AmxShape {
  int mt, nt, ntp_max, passes;
  explicit AmxShape(const BrgemmDesc& d)
      : mt((d.mr + 15) / 16),
        nt((d.computed_cols() + 15) / 16),
        ntp_max(mt == 2 ? 2 : 4),
        passes((nt + ntp_max - 1) / ntp_max) {}
};

class AmxBrgemm : public JitGenerator {
 public:
  explicit AmxBrgemm(const BrgemmDesc& d)
      : d_(d), int8_(d.a_type == DType::u8 && !d.w4a8), w4a8_(d.w4a8) {
    const AmxShape shape(d);
    mt_ = shape.mt;
    nt_ = shape.nt;
    ntp_max_ = shape.ntp_max;
    b_slots_ = 8 - mt_ * ntp_max_ - mt_;
    generate();
  }

 private:
  int rows(int i) const { return std::min(16, d_.mr - 16 * i); }
  Xbyak::Tmm acc(int i, int j) const { return Xbyak::Tmm(i * ntp_max_ + j); }
  Xbyak::Tmm a_tile(int i) const { return Xbyak::Tmm(mt_ * ntp_max_ + i); }
  Xbyak::Tmm b_tile(int n) const { return Xbyak::Tmm(mt_ * ntp_max_ + mt_ + n % b_slots_); }

  // The GLU epilogue from the scratch: row r's gate vector j and up vector j + 2.
  template <class Slot>
  void glu_epilogue(Slot slot) {
    Avx512Epilogue epi(*this, epi_desc(), {zmm2, zmm3, zmm4, zmm5});
    const int tail_cols = d_.nr % 16;
    if (tail_cols != 0) {
      mov(edx, (1u << tail_cols) - 1);
      kmovw(k1, edx);
    }
    mov(rdx, arg(offsetof(BrgemmArgs, c)));
    mov(r14, arg(offsetof(BrgemmArgs, ldc)));
    mov(r12, arg(offsetof(BrgemmArgs, bias)));
    if (epi_desc().accumulate) {
      mov(r8, arg(offsetof(BrgemmArgs, acc_in)));
      mov(r9, arg(offsetof(BrgemmArgs, ld_acc_in)));
    }
    // Int8: the scales and zero points (rax, rbx, rcx, r10 are free after the last pass).
    const Avx512Epilogue::Int8Regs q{rax, rbx, rcx, r10};
    if (int8_) {
      mov(q.a_scale, arg(offsetof(BrgemmArgs, a_scale)));
      mov(q.a_zero, arg(offsetof(BrgemmArgs, a_zero)));
      mov(q.b_scale, arg(offsetof(BrgemmArgs, b_scale)));
      mov(q.b_comp, arg(offsetof(BrgemmArgs, b_comp)));
    }
    const int nout = (d_.nr + 15) / 16;
    for (int r = 0; r < d_.mr; ++r) {
      for (int j = 0; j < nout; ++j) {
        if (w4a8_) {
          vmovups(zmm0, f_slot(r, j));
          vmovups(zmm1, f_slot(r, j + 2));
        } else {
          vmovups(zmm0, ptr[rsp + slot(r / 16, j) * 1024 + (r % 16) * 64]);
          vmovups(zmm1, ptr[rsp + slot(r / 16, j + 2) * 1024 + (r % 16) * 64]);
        }
        const Xbyak::Opmask* tail = j == nout - 1 && tail_cols != 0 ? &k1 : nullptr;
        if (int8_)
          epi.apply_int8_glu_and_store(zmm0, zmm1, j, r, q, rdx, r12, tail, r8);
        else
          epi.apply_glu_and_store(zmm0, zmm1, j, rdx, r12, tail, r8);
      }
      if (r + 1 < d_.mr) {
        add(rdx, r14);
        if (epi_desc().accumulate) add(r8, r9);
      }
    }
  }

  // What the epilogue sees: W4A8's folded f32 sums (acc_in already in them).
  BrgemmDesc epi_desc() const {
    BrgemmDesc e = d_;
    if (w4a8_) {
      e.a_type = e.b_type = DType::bf16;
      e.acc_type = DType::f32;
      e.accumulate = false;
    }
    return e;
  }

  // W4A8: the f32 block after the tile scratch (rsp-relative), row r,
  // column vector j of the computed columns.
  Xbyak::Address f_slot(int r, int j) const {
    return ptr[rsp + f_offset_ + (int64_t{r} * nt_ + j) * 64];
  }

  // W4A8, after a batch item of pass p that ends a scale group: the pass's
  // int32 tiles go to the scratch (slots 0.., 1 KiB each), are folded into
  // f and zeroed.
  void w4a8_group_end(int p, int ntp) {
    Xbyak::Label skip;
    fold_.group_end(r12, r14, r10, skip);
    for (int i = 0; i < mt_; ++i)
      for (int j = 0; j < ntp; ++j)
        tilestored(ptr[rsp + r13 + (i * ntp_max_ + j) * 1024], acc(i, j));
    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < ntp; ++j) {
        vmovdqu32(zmm0, ptr[rsp + ((r / 16) * ntp_max_ + j) * 1024 + (r % 16) * 64]);
        fold_.fold(zmm0, zmm1, r, p * ntp_max_ + j);
      }
    for (int i = 0; i < mt_; ++i)
      for (int j = 0; j < ntp; ++j) tilezero(acc(i, j));
    L(skip);
  }

  const Xbyak::Label& config() {
    AmxTileConfig cfg;
    for (int i = 0; i < mt_; ++i) {
      for (int j = 0; j < ntp_max_; ++j) cfg.set(acc(i, j).getIdx(), rows(i), 64);
      cfg.set(a_tile(i).getIdx(), rows(i), 64);
    }
    for (int s = 0; s < b_slots_; ++s) cfg.set(b_tile(s).getIdx(), 16, 64);
    return blob_label(cfg.bytes.data(), cfg.bytes.size());
  }

  void dot(const Xbyak::Tmm& c, const Xbyak::Tmm& a, const Xbyak::Tmm& b) {
    if (d_.a_type == DType::u8)
      tdpbusd(c, a, b);
    else
      tdpbf16ps(c, a, b);
  }

  // One K step (64 bytes of A): A tiles from [a_row0 / a_row16 + stride], B tiles from b.
  void k_step(int ntp, const Xbyak::Reg64& a0, const Xbyak::Reg64& a1, const Xbyak::Reg64& a_stride,
              int64_t a1_disp) {
    // Packed A: the cache lines of the K step `dist` steps ahead (this pass's
    // A rows and B columns) are prefetched into L1, spread between the dot
    // products, so the tile loads hit L1 instead of waiting on L2.
    std::vector<Xbyak::Address> pf;
    constexpr int dist = 1;
    if (d_.a_packed && dist > 0) {
      for (int r = 0; r < d_.mr; ++r) pf.push_back(ptr[a0 + dist * PackedA::kStepBytes + r * 64]);
      for (int r = 0; r < 16; ++r)
        for (int j = 0; j < ntp; ++j)
          pf.push_back(ptr[rsi + dist * 16 * d_.b_row_bytes + r * d_.b_row_bytes + j * 64]);
    }
    // Then 8 lines of args.b_prefetch (r12) into L2.
    const size_t n_l1 = pf.size();
    if (d_.a_packed)
      for (int l = 0; l < kPrefetchLinesPerStep; ++l) pf.push_back(ptr[r12 + l * 64]);
    const size_t per_dot = (pf.size() + mt_ * ntp - 1) / (mt_ * ntp);
    size_t next = 0;
    tileloadd(a_tile(0), ptr[a0 + a_stride]);
    if (mt_ == 2) tileloadd(a_tile(1), ptr[a1 + a_stride + a1_disp]);
    for (int j = 0; j < ntp; ++j) {
      tileloadd(b_tile(j), ptr[rsi + r11 + j * 64]);
      for (int i = 0; i < mt_; ++i) {
        dot(acc(i, j), a_tile(i), b_tile(j));
        for (size_t q = 0; q < per_dot && next < pf.size(); ++q, ++next) {
          if (next < n_l1)
            prefetcht0(pf[next]);
          else
            prefetcht1(pf[next]);
        }
      }
    }
  }

  void generate() {
    const Xbyak::Label& cfg = config();
    // Packed A is zero-padded to whole K steps: no tail step.
    const int64_t ks = d_.k_step();
    const int64_t kfull = d_.a_packed ? (d_.kb + ks - 1) / ks : d_.kb / ks;
    const bool ktail = !d_.a_packed && d_.kb % ks != 0;
    const int64_t a_step = d_.a_packed ? PackedA::kStepBytes : 64;
    // A GLU pairs column tiles of different passes (gate 0..1, up 2..3), so
    // its scratch keeps every pass and the epilogue runs after the last one.
    const bool glu = d_.glu != Glu::none;
    // W4A8: the pass's int32 tiles (unpaired slots), then the f32 block.
    f_offset_ = mt_ * (glu && !w4a8_ ? nt_ : ntp_max_) * 1024;
    const int scratch = static_cast<int>(f_offset_ + (w4a8_ ? int64_t{d_.mr} * nt_ * 64 : 0));
    auto slot = [&](int i, int p, int j) {
      return glu ? i * nt_ + p * ntp_max_ + j : i * ntp_max_ + j;
    };

    push_callee_saved();
    mov(rbp, rsp);
    sub(rsp, scratch);
    and_(rsp, -64);
    ldtilecfg(ptr[rip + cfg]);                 // this thread's tile state is ours: always load it
    mov(r15, arg(offsetof(BrgemmArgs, lda)));  // lda
    mov(r11, d_.b_row_bytes);                  // B tile row stride
    mov(r13, 64);                              // a_tail and scratch row stride
    if (w4a8_) fold_.init(nt_, zmm0);

    // Whole 16-column tiles (no N tail, no GLU pairing): the fp32 partial
    // sums of earlier K chunks are loaded straight into the accumulators, and
    // a plain fp32 result (the partial sums of a first or middle chunk, an f32
    // GEMM without bias or activation) is stored straight from them, without
    // the stack scratch and the vector epilogue.
    const bool whole_tiles = !glu && d_.nr % 16 == 0 && !w4a8_;
    const bool acc_tiles = whole_tiles && d_.accumulate;
    // (Int8: only the raw int32 sums, out = i32, which takes no bias or act.)
    const bool direct_store = whole_tiles && d_.out == (int8_ ? DType::i32 : DType::f32) &&
                              d_.bias == BiasKind::none && d_.act == Activation::none;
    BrgemmDesc epi_d = epi_desc();
    epi_d.accumulate = epi_d.accumulate && !acc_tiles;  // else added in the tiles already

    const int passes = AmxShape(d_).passes;
    for (int p = 0; p < passes; ++p) {
      const int ntp = std::min(ntp_max_, nt_ - p * ntp_max_);
      if (acc_tiles) {
        mov(r8, arg(offsetof(BrgemmArgs, acc_in)));     // acc_in
        mov(r9, arg(offsetof(BrgemmArgs, ld_acc_in)));  // its row stride
        if (mt_ == 2) {
          mov(rdx, r9);
          shl(rdx, 4);
          add(rdx, r8);  // row 16
        }
        for (int i = 0; i < mt_; ++i)
          for (int j = 0; j < ntp; ++j)
            tileloadd(acc(i, j), ptr[(i == 0 ? r8 : rdx) + r9 + (p * ntp_max_ + j) * 64]);
      } else {
        for (int i = 0; i < mt_; ++i)
          for (int j = 0; j < ntp; ++j) tilezero(acc(i, j));
      }
      Xbyak::Label batch_loop, batch_done, k_loop;
      if (w4a8_) {
        mov(r12, arg(offsetof(BrgemmArgs, w4a8_scales)));
        mov(r14, arg(offsetof(BrgemmArgs, w4a8_comps)));
      }
      if (d_.a_packed) {
        // r12: this pass's share of args.b_prefetch, advanced by r14 per K
        // step; without one, r12 walks nothing (the stack, stride 0).
        Xbyak::Label have, set;
        mov(r12, arg(offsetof(BrgemmArgs, b_prefetch)));
        mov(r14d, kPrefetchLinesPerStep * 64);
        test(r12, r12);
        jnz(have);
        mov(r12, rsp);
        xor_(r14d, r14d);
        jmp(set);
        L(have);
        if (p > 0) add(r12, p * kfull * kPrefetchLinesPerStep * 64);
        L(set);
      }
      mov(r8, arg(offsetof(BrgemmArgs, a)));
      mov(r9, arg(offsetof(BrgemmArgs, b)));
      mov(r10, arg(offsetof(BrgemmArgs, batch)));
      test(r10, r10);
      jle(batch_done, T_NEAR);
      L(batch_loop);
      {
        mov(rax, ptr[r8]);
        mov(rsi, ptr[r9]);
        if (p > 0) add(rsi, p * ntp_max_ * 64);
        if (mt_ == 2 && !d_.a_packed) {
          mov(rbx, r15);
          shl(rbx, 4);
          add(rbx, rax);  // row 16 of A
        }
        if (kfull > 0) {
          mov(rcx, kfull);
          L(k_loop);
          if (d_.a_packed)
            k_step(ntp, rax, rax, r13, 1024);  // tiles of 16 rows × 64 bytes, back to back
          else
            k_step(ntp, rax, rbx, r15, 0);
          add(rax, a_step);
          if (d_.a_packed) add(r12, r14);
          if (mt_ == 2 && !d_.a_packed) add(rbx, 64);
          add(rsi, 16 * d_.b_row_bytes);
          dec(rcx);
          jnz(k_loop, T_NEAR);
        }
        if (w4a8_) w4a8_group_end(p, ntp);
        add(r8, 8);
        add(r9, 8);
        dec(r10);
        jnz(batch_loop, T_NEAR);
      }
      if (ktail) {
        // rsi already points at the zero-padded K rows of the (only) B block.
        mov(rdx, arg(offsetof(BrgemmArgs, a_tail)));
        k_step(ntp, rdx, rdx, r13, 16 * 64);
      }
      L(batch_done);
      if (direct_store) {
        mov(rdx, arg(offsetof(BrgemmArgs, c)));    // C
        mov(r14, arg(offsetof(BrgemmArgs, ldc)));  // ldc
        if (mt_ == 2) {
          mov(rax, r14);
          shl(rax, 4);
          add(rax, rdx);  // row 16
        }
        for (int i = 0; i < mt_; ++i)
          for (int j = 0; j < ntp; ++j)
            tilestored(ptr[(i == 0 ? rdx : rax) + r14 + (p * ntp_max_ + j) * 64], acc(i, j));
        continue;
      }
      if (w4a8_) {
        if (glu || p + 1 < passes) continue;  // the epilogue reads f after the last pass
      } else {
        for (int i = 0; i < mt_; ++i)
          for (int j = 0; j < ntp; ++j)
            tilestored(ptr[rsp + r13 + slot(i, p, j) * 1024], acc(i, j));
        if (glu) continue;
      }

      Avx512Epilogue epi(*this, epi_d, {zmm1, zmm2, zmm3, zmm4});
      const int tail_cols = d_.nr % 16;
      if (tail_cols != 0) {
        mov(edx, (1u << tail_cols) - 1);
        kmovw(k1, edx);
      }
      mov(rdx, arg(offsetof(BrgemmArgs, c)));     // C
      mov(r14, arg(offsetof(BrgemmArgs, ldc)));   // ldc
      mov(r12, arg(offsetof(BrgemmArgs, bias)));  // bias
      if (epi_d.accumulate) {
        mov(r8, arg(offsetof(BrgemmArgs, acc_in)));  // acc_in row (the lists are reloaded per pass)
        mov(r9, arg(offsetof(BrgemmArgs, ld_acc_in)));
      }
      // Int8: the scales and zero points (rax, rbx, rcx, r10 are reloaded by
      // the next pass).
      const Avx512Epilogue::Int8Regs q{rax, rbx, rcx, r10};
      if (int8_ && d_.out != DType::i32) {
        mov(q.a_scale, arg(offsetof(BrgemmArgs, a_scale)));
        mov(q.a_zero, arg(offsetof(BrgemmArgs, a_zero)));
        mov(q.b_scale, arg(offsetof(BrgemmArgs, b_scale)));
        mov(q.b_comp, arg(offsetof(BrgemmArgs, b_comp)));
      }
      // (W4A8: every column vector from f, after the last pass.)
      const int p0 = w4a8_ ? 0 : p, ntp_epi = w4a8_ ? nt_ : ntp;
      for (int r = 0; r < d_.mr; ++r) {
        for (int j = 0; j < ntp_epi; ++j) {
          const int col_vec = w4a8_ ? j : p0 * ntp_max_ + j;
          const bool last = col_vec == nt_ - 1 && tail_cols != 0;
          if (w4a8_)
            vmovups(zmm0, f_slot(r, col_vec));
          else
            vmovups(zmm0, ptr[rsp + slot(r / 16, p, j) * 1024 + (r % 16) * 64]);
          if (int8_)
            epi.apply_int8_and_store(zmm0, col_vec, r, q, rdx, r12, last ? &k1 : nullptr, r8);
          else
            epi.apply_and_store(zmm0, col_vec, rdx, r12, last ? &k1 : nullptr, r8);
        }
        if (r + 1 < d_.mr) {
          add(rdx, r14);
          if (epi_d.accumulate) add(r8, r9);
        }
      }
    }
    if (glu) glu_epilogue([&](int i, int col_vec) { return slot(i, 0, col_vec); });
    mov(rsp, rbp);
    // Leave the thread's tile state clean for the host (its own AMX code,
    // signal frames, context switches: live tile data is 8 KiB more XSAVE
    // state). Measured free: gemm M = 16 / 256 at N = K = 4096 and a
    // 32 × 512 × 512 GEMM of 8 calls all within run-to-run noise.
    tilerelease();
    vzeroupper();
    pop_callee_saved();
    ret();
  }

  const BrgemmDesc& d_;
  const bool int8_;  // the int8 epilogue (W4A8 folds into f32 instead)
  const bool w4a8_;
  int mt_ = 1, nt_ = 1, ntp_max_ = 4, b_slots_ = 3;
  int64_t f_offset_ = 0;
  // (After d_: it keeps a reference to it.)
  W4A8Fold fold_{*this, d_, [this](int r, int j) { return f_slot(r, j); }};
};

}  // namespace

int64_t amx_b_prefetch_bytes(const BrgemmDesc& d) {
  if (!d.a_packed) return 0;
  return int64_t(AmxShape(d).passes) * ((d.kb + d.k_step() - 1) / d.k_step()) *
         kPrefetchLinesPerStep * 64;
}

std::vector<uint8_t> emit_amx_brgemm(const BrgemmDesc& d) {
  AmxBrgemm g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
