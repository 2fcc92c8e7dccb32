// The fused W4A16 / W8A16 decode micro-kernel (BrgemmDesc with b = u4 or
// f8e4m3, a = bf16, acc = f32, mr ≤ 4): it reads the packed quantized codes of
// one 64-column block (ops/packed_weight_impl.h, QuantTables: the k-pair
// order) and the group tables of BrgemmArgs (q_groups, q_scales, q_zeros)
// directly, instead of dequantizing a K chunk to bf16 first:
//
//   y[r][c] = act(Σ_g s[g][c]·Σ_{k ∈ g} a[r][k]·(q[k][c] − z[g][c]) + bias[c])
//
// The weights are never dequantized to f32. Per k-pair row and 16 columns the
// codes become 32 bf16 words in VNNI order (even k, odd k per column) that are
// exact small numbers, and vdpbf16ps multiplies them with the broadcast A pair
// (products exact in f32) into per-group accumulators acc_g:
//
//   int4: vpmovzxbd the 16 code bytes (d = byte), vpmaddwd by 4097 (d | d << 12:
//         the low word's bits 0..3 = q_even, bit 4 = a bit of q_odd; the high
//         word's bits 0..3 = q_odd), vpermw with table[i] = bf16(i & 15), or
//         bf16((i & 15) − 8) without zero points: 3 ops for 32 weights.
//   fp8:  vpmovsxbw the 32 code bytes (already in VNNI order); normals
//         (exponent field e ≠ 0) are (w << 4) & 0x87F0 | (112 << 7): sign,
//         e | 112 = e + 112 and the mantissa, i.e. the e4m3 value × 2^-8
//         exactly; zero and subnormals (e = 0, found by vptestnmw against
//         0x78) come from an 8-entry vpermw table of bf16(m·2^-17) under that
//         mask, and the sign is or-ed in last: 6 ops for 32 weights. The 2^8
//         is given back when a group is folded (acc_g·256, exact).
//
// When q_groups[kp] changes (and at the end) the group is folded into the
// f32 accumulators: acc += s ⊙ acc_g (fp8: (acc_g·256) ⊙ s), and with zero
// points acc −= (z·s) ⊙ Σa, where Σa is the group's sum of the A row
// (vdpbf16ps with bf16 ones, all lanes equal); without zero points the
// int4 table already holds q − 8, so no Σa is needed. The fold is a called
// subroutine, the group test one cmp + branch per k-pair row.
//
// Registers: acc_g mr × nz, Σa mr (u4 with zeros) — ks of each (k-pair rows
// alternate between them) while mr·nz < 8, since vdpbf16ps's latency (~8
// cycles) would otherwise bound a decode row —, the table, the constants,
// B temporaries (nz, fp8 2·nz) and one A register for the odd last pair; the
// f32 accumulators acc take mr × nz more when they fit in the 32 zmm, else
// they live in a 64-byte aligned stack block (mr·nz·64 bytes) and the fold
// loads, updates and stores them. The code stream is prefetched
// kPrefetchBytes ahead into L2 (the M = 1 case streams it from DRAM).
//
// A is read two bf16 (one dword) per k-pair; for an odd kb the last pair's
// single A element is zero-extended from a word load, never reading past the
// row (its code partner is padding and multiplies 0).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "codegen/xbyak/avx512_epilogue.h"
#include "codegen/xbyak/emitters.h"
#include "runtime/bf16.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;
using Xbyak::Zmm;

class QuantBrgemm : public JitGenerator {
 public:
  explicit QuantBrgemm(const BrgemmDesc& d)
      : d_(d),
        fp8_(d.b_type == DType::f8e4m3),
        zp_(d.b_type == DType::u4 && d.b_zeros),
        nz_((d.nr + 15) / 16),
        row_bytes_(fp8_ ? 128 : 64) {
    if (d.b_type != DType::u4 && d.b_type != DType::f8e4m3)
      throw std::invalid_argument("emit_quant_brgemm: b must be u4 or f8e4m3");
    if (d.mr < 1 || d.mr > 4 || d.nr < 1 || d.nr > 64 || d.kb < 1)
      throw std::invalid_argument("emit_quant_brgemm: mr 1..4, nr 1..64, kb >= 1");
    if (d.accumulate || d.glu != Glu::none || d.a_packed)
      throw std::invalid_argument("emit_quant_brgemm: no acc_in, GLU or packed A");
    plan_registers();
    generate();
  }

 private:
  static constexpr int kUnroll = 4;                // k-pair rows per loop iteration
  static constexpr int64_t kPrefetchBytes = 8192;  // code bytes ahead (L2)

  void plan_registers() {
    const int rn = d_.mr * nz_;
    const int btemps = fp8_ ? 2 * nz_ : nz_;
    // Everything but acc: ks sets of acc_g and Σa, table, constants (int4:
    // 4097 and, with zeros, the ones; fp8: 0x87F0), B temporaries, the odd
    // pair's A.
    auto fixed = [&](int ks) { return ks * rn + (zp_ ? ks * d_.mr + 1 : 0) + 2 + btemps + 1; };
    // vdpbf16ps has a latency of ~8 cycles at one per cycle: keep 8
    // independent chains where the registers allow, by alternating k-pair
    // rows between ks sets of acc_g (and Σa), summed at the fold.
    ks_ = 1;
    while (ks_ < 4 && 2 * ks_ * rn <= 8 && fixed(2 * ks_) + rn <= 32) ks_ *= 2;
    acc_in_regs_ = fixed(ks_) + rn <= 32;
    int next = 0;
    if (acc_in_regs_) next += rn;  // acc(r, j) = zmm(r·nz + j)
    accg0_ = next, next += ks_ * rn;
    if (zp_) sum0_ = next, next += ks_ * d_.mr;
    table_ = Zmm(next++);
    cst_ = Zmm(next++);  // int4: 4097 dwords; fp8: 0x87F0 words
    if (zp_) ones_ = Zmm(next++);
    b0_ = next, next += btemps;
    a_odd_ = Zmm(next++);
    if (next > 32) throw std::logic_error("emit_quant_brgemm: register plan overflow");
  }

  Zmm acc(int r, int j) const { return Zmm(r * nz_ + j); }  // acc_in_regs_ only
  Zmm accg(int s, int r, int j) const { return Zmm(accg0_ + (s * d_.mr + r) * nz_ + j); }
  Zmm sum(int s, int r) const { return Zmm(sum0_ + s * d_.mr + r); }
  Zmm breg(int j, int t = 0) const { return Zmm(b0_ + (fp8_ ? 2 * j + t : j)); }
  int64_t acc_mem_off(int r, int j) const { return (r * nz_ + j) * 64; }

  // A pair address of row r at byte offset `off` of the current k-pair.
  Xbyak::RegExp a_exp(int r, int64_t off) const {
    switch (r) {
      case 0:
        return a_ + off;
      case 1:
        return a_ + lda_ + off;
      case 2:
        return a_ + lda_ * 2 + off;
      default:
        return a_ + lda3_ + off;
    }
  }

  // The 32 bf16 words of columns 16j.. of the code row at b_ + off into breg(j).
  void convert(int j, int64_t off) {
    const Zmm w = breg(j);
    if (!fp8_) {
      vpmovzxbd(w, xword[b_ + off + 16 * j]);
      vpmaddwd(w, w, cst_);  // d + d·4096: q_odd into the high word's low bits
      vpermw(w, w, table_);
      return;
    }
    const Zmm x = breg(j, 1);
    vpmovsxbw(x, yword[b_ + off + 32 * j]);
    vpsllw(w, x, 4);
    vpternlogd(w, cst_, bcst_u32(0x38003800u), 0xEA);  // (w & 0x87F0) | 0x3800
    vptestnmw(k2, x, ptr[rip + *mask78_]);             // exponent field 0
    vpermw(w | k2, x, table_);                         // bf16(m·2^-17), m = x & 7
    vpternlogd(w, x, bcst_u32(0x80008000u), 0xF8);     // w | (x & sign)
  }

  // One k-pair row at k-pair offset u (bytes u·4 of A, u·row_bytes of codes).
  void k_pair(int64_t u) {
    const int set = static_cast<int>(u % ks_);
    const int64_t boff = u * row_bytes_;
    for (int line = 0; line < row_bytes_ / 64; ++line)
      prefetcht1(ptr[b_ + boff + kPrefetchBytes + 64 * line]);
    for (int j = 0; j < nz_; ++j) convert(j, boff);
    for (int r = 0; r < d_.mr; ++r) {
      const Xbyak::Address a = ptr_b[a_exp(r, u * 4)];
      for (int j = 0; j < nz_; ++j) vdpbf16ps(accg(set, r, j), breg(j), a);
      if (zp_) vdpbf16ps(sum(set, r), ones_, a);
    }
  }

  // The last, unpaired k of an odd kb: the A element zero-extended.
  void odd_pair(int64_t u) {
    const int64_t boff = u * row_bytes_;
    for (int j = 0; j < nz_; ++j) convert(j, boff);
    for (int r = 0; r < d_.mr; ++r) {
      movzx(ebx, word[a_exp(r, u * 4)]);
      vpbroadcastd(a_odd_, ebx);
      for (int j = 0; j < nz_; ++j) vdpbf16ps(accg(0, r, j), breg(j), a_odd_);
      if (zp_) vdpbf16ps(sum(0, r), ones_, a_odd_);
    }
  }

  // Before the k-pair row at offset u: fold the group when q_groups changes.
  void group_check(int64_t u) {
    Xbyak::Label same;
    cmp(cur_, dword[groups_ + u * 4]);
    je(same, T_NEAR);
    call(fold_);
    mov(cur_, dword[groups_ + u * 4]);
    L(same);
  }

  // The fold subroutine: acc += s ⊙ acc_g (− (z·s) ⊙ Σa) for group cur_;
  // acc_g and Σa zeroed. Clobbers r11, r12 and the B temporaries.
  void emit_fold() {
    L(fold_);
    movsxd(r11, cur_);
    if (zp_) {
      mov(r12, r11);
      shl(r12, 6);  // 64 u8 per zero row
      add(r12, zeros_);
    }
    shl(r11, 8);  // 64 f32 per scale row
    add(r11, scales_);
    const Zmm zs = breg(0);
    const Zmm t = fp8_ ? breg(0, 1) : a_odd_;
    // The k-split sets summed into set 0 first.
    for (int s = 1; s < ks_; ++s) {
      for (int r = 0; r < d_.mr; ++r) {
        for (int j = 0; j < nz_; ++j) {
          vaddps(accg(0, r, j), accg(0, r, j), accg(s, r, j));
          vpxord(accg(s, r, j), accg(s, r, j), accg(s, r, j));
        }
        if (zp_) {
          vaddps(sum(0, r), sum(0, r), sum(s, r));
          vpxord(sum(s, r), sum(s, r), sum(s, r));
        }
      }
    }
    for (int j = 0; j < nz_; ++j) {
      if (zp_) {
        vpmovzxbd(zs, xword[r12 + 16 * j]);
        vcvtdq2ps(zs, zs);
        vmulps(zs, zs, ptr[r11 + 64 * j]);  // z·s, one rounding
      }
      for (int r = 0; r < d_.mr; ++r) {
        const Zmm g = accg(0, r, j);
        if (fp8_) vmulps(g, g, bcst(256.0f));  // exact: the codes' 2^-8
        const Zmm a = acc_in_regs_ ? acc(r, j) : t;
        if (!acc_in_regs_) vmovaps(a, ptr[accm_ + acc_mem_off(r, j)]);
        vfmadd231ps(a, g, ptr[r11 + 64 * j]);
        if (zp_) vfnmadd231ps(a, sum(0, r), zs);
        if (!acc_in_regs_) vmovaps(ptr[accm_ + acc_mem_off(r, j)], a);
        vpxord(g, g, g);
      }
    }
    if (zp_)
      for (int r = 0; r < d_.mr; ++r) vpxord(sum(0, r), sum(0, r), sum(0, r));
    ret();
  }

  void load_constants() {
    if (fp8_) {
      mov(r11d, 0x87F087F0u);
      vpbroadcastd(cst_, r11d);
      uint16_t tab[32] = {};
      for (int m = 1; m < 8; ++m) tab[m] = runtime::f32_to_bf16(std::ldexp(float(m), -17));
      vmovdqu16(table_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(tab), sizeof tab)]);
      uint16_t m78[32];
      std::fill(std::begin(m78), std::end(m78), uint16_t(0x78));
      mask78_ = &blob_label(reinterpret_cast<const uint8_t*>(m78), sizeof m78);
      return;
    }
    mov(r11d, 4097);
    vpbroadcastd(cst_, r11d);
    if (zp_) {
      mov(r11d, 0x3F803F80u);  // bf16 1.0 pairs
      vpbroadcastd(ones_, r11d);
    }
    uint16_t tab[32];
    for (int i = 0; i < 32; ++i) tab[i] = runtime::f32_to_bf16(float((i & 15) - (zp_ ? 0 : 8)));
    vmovdqu16(table_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(tab), sizeof tab)]);
  }

  void generate() {
    push_callee_saved();
    mov(rbp, rsp);
    if (!acc_in_regs_) {
      sub(rsp, d_.mr * nz_ * 64 + 64);
      and_(rsp, -64);
      mov(accm_, rsp);
    }
    mov(lda_, arg(offsetof(BrgemmArgs, lda)));
    if (d_.mr == 4) lea(lda3_, ptr[lda_ + lda_ * 2]);
    mov(r11, arg(offsetof(BrgemmArgs, a)));
    mov(a_, ptr[r11]);
    mov(r11, arg(offsetof(BrgemmArgs, b)));
    mov(b_, ptr[r11]);
    mov(groups_, arg(offsetof(BrgemmArgs, q_groups)));
    mov(scales_, arg(offsetof(BrgemmArgs, q_scales)));
    if (zp_) mov(zeros_, arg(offsetof(BrgemmArgs, q_zeros)));
    load_constants();

    for (int r = 0; r < d_.mr; ++r)
      for (int j = 0; j < nz_; ++j) {
        for (int s = 0; s < ks_; ++s) vpxord(accg(s, r, j), accg(s, r, j), accg(s, r, j));
        if (acc_in_regs_) {
          vpxord(acc(r, j), acc(r, j), acc(r, j));
        }
      }
    if (!acc_in_regs_) {
      const Zmm z = breg(0);
      vpxord(z, z, z);
      for (int r = 0; r < d_.mr; ++r)
        for (int j = 0; j < nz_; ++j) vmovaps(ptr[accm_ + acc_mem_off(r, j)], z);
    }
    if (zp_)
      for (int s = 0; s < ks_; ++s)
        for (int r = 0; r < d_.mr; ++r) vpxord(sum(s, r), sum(s, r), sum(s, r));
    mov(cur_, dword[groups_]);

    const int64_t full = d_.kb / 2;
    const bool odd = d_.kb % 2 != 0;
    const int64_t iters = full / kUnroll, rem = full % kUnroll;
    if (iters > 0) {
      Xbyak::Label loop;
      mov(rcx, iters);
      L(loop);
      for (int u = 0; u < kUnroll; ++u) {
        group_check(u);
        k_pair(u);
      }
      add(a_, kUnroll * 4);
      add(b_, kUnroll * row_bytes_);
      add(groups_, kUnroll * 4);
      dec(rcx);
      jnz(loop, T_NEAR);
    }
    for (int64_t u = 0; u < rem; ++u) {
      group_check(u);
      k_pair(u);
    }
    if (odd) {
      group_check(rem);
      odd_pair(rem);
    }
    call(fold_);

    // Epilogue: bias, activation, conversion, (masked) store, row by row.
    // Temporaries: registers past acc (acc_g and the rest are free now).
    const int first = acc_in_regs_ ? d_.mr * nz_ : 1;
    Avx512Epilogue epi(*this, d_, {Zmm(first), Zmm(first + 1), Zmm(first + 2), Zmm(first + 3)});
    const int tail_cols = d_.nr % 16;
    if (tail_cols != 0) {
      mov(edx, (1u << tail_cols) - 1);
      kmovw(k1, edx);
    }
    mov(rsi, arg(offsetof(BrgemmArgs, c)));
    mov(r11, arg(offsetof(BrgemmArgs, ldc)));
    mov(r14, arg(offsetof(BrgemmArgs, bias)));
    for (int r = 0; r < d_.mr; ++r) {
      for (int j = 0; j < nz_; ++j) {
        const bool last = j == nz_ - 1 && tail_cols != 0;
        Zmm v = Zmm(0);
        if (acc_in_regs_)
          v = acc(r, j);
        else
          vmovaps(v, ptr[accm_ + acc_mem_off(r, j)]);
        epi.apply_and_store(v, j, rsi, r14, last ? &k1 : nullptr, r8);
      }
      if (r + 1 < d_.mr) add(rsi, r11);
    }
    mov(rsp, rbp);
    vzeroupper();
    pop_callee_saved();
    ret();

    emit_fold();
  }

  const BrgemmDesc& d_;
  const bool fp8_, zp_;
  const int nz_;
  const int row_bytes_;
  bool acc_in_regs_ = true;
  int ks_ = 1, accg0_ = 0, sum0_ = 0, b0_ = 0;
  Zmm table_, cst_, ones_, a_odd_;
  const Xbyak::Label* mask78_ = nullptr;
  Xbyak::Label fold_;
  // Scalars.
  const Xbyak::Reg64 a_ = rax, b_ = rsi, lda_ = r15, lda3_ = r14, groups_ = rdx;
  const Xbyak::Reg64 scales_ = r9, zeros_ = r10, accm_ = r13;
  const Xbyak::Reg32 cur_ = r8d;
};

}  // namespace

std::vector<uint8_t> emit_quant_brgemm(const BrgemmDesc& d) {
  QuantBrgemm g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
