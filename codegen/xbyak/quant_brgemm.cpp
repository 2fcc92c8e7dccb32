// The fused W4A16 / W8A16 decode micro-kernel (BrgemmDesc with b = u4,
// f4e2m1 (MXFP4) or f8e4m3, a = bf16, acc = f32, mr ≤ 4): it reads the packed quantized codes of
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
//         bf16((i & 15) − 8) without zero points: 3 ops for 32 weights
//         (blocks of nr ≤ 48 only).
//   mxfp4: the same 3 ops with table[i] = bf16(e2m1(i & 15)) (exact: 0,
//         ±0.5 .. ±6); no zero points, so the fold is acc += s ⊙ acc_g with
//         s = 2^(e − 127), made at the fold from the group's e8m0 bytes
//         (q_scales holds them: 64 bytes a group row, not 256 of f32). Full
//         blocks (nz = 4) load the code row once and take 2 ops per 32
//         weights: vpmultishiftqb puts each nibble in the low bits of its
//         word in the column order of the table-free int4 path below (undone
//         the same way), vpermw looks it up (M = 1 hot 1.28x faster than the
//         3-op form on Zen 5).
//   int4, full blocks (nz = 4), table-free: bf16(16 + q) = 0x4180 | q << 3,
//         f32(16 + q) = 0x41800000 | q << 19. The code row is loaded once;
//         vpmultishiftqb moves each nibble into place (a qword's 8 bytes =
//         8 columns feed the 2 dword lanes of that qword in each of 4
//         outputs, so output t lane 2i+e is column 8i + 2t + e: a column
//         permutation, undone once on acc at the end, the scales and zero
//         points gathered into it at the fold) and vpternlogd masks it and
//         ors in the exponent: 2 ops per 16 or 32 weights, no table.
//         mr ≤ 3 (and mr·K small enough for a stack copy) uses f32 FMAs
//         unless the descriptor asks for vdpbf16ps (u4_bf16_dot, the CPUs
//         where it issues at the FMA rate):
//         A is converted once to f32 [a_even, a_odd, a_even + a_odd] per
//         k-pair, and every k-pair row is 8 × (vpmultishiftqb, vpternlogd,
//         vfmadd231ps) + one Σa add — on the Intel Xeons vdpbf16ps costs ~2
//         cycles of both vector ports, the FMAs half of that per weight; on
//         AMD Zen 5 the 4 × (vpmultishiftqb, vpternlogd, vdpbf16ps) of the
//         bf16 form take half the time of the 8 FMA triples (a register-only
//         probe: 1.15 against 2.35 ns per 128 weights). mr = 4 keeps
//         vdpbf16ps on the bf16 pairs. 16 + q needs the Σa of every group:
//         the fold computes d = acc_g − (16 + z)·Σa (one fma, exact integer
//         16 + z, 24 without zero points; exactly 0 when every q = z) and
//         acc += s ⊙ d.
//   fp8:  vpmovsxbw the 32 code bytes (already in VNNI order); normals
//         (exponent field e ≠ 0) are (w << 4) & 0x87F0 | (112 << 7): sign,
//         e | 112 = e + 112 and the mantissa, i.e. the e4m3 value × 2^-8
//         exactly; zero and subnormals (e = 0, found by vptestnmw against
//         0x78) come from an 8-entry vpermw table of bf16(m·2^-17) under that
//         mask, and the sign is or-ed in last: 6 ops for 32 weights. The 2^8
//         is given back when a group is folded (acc_g·256, exact).
//
// When q_groups[kp] changes (and at the end) the group is folded into the
// f32 accumulators (the table-free fold above; otherwise as follows):
// acc += s ⊙ acc_g (fp8: (acc_g·256) ⊙ s), with zero points
// acc += s ⊙ (acc_g − z ⊙ Σa), where Σa is the group's sum of the A row
// (vdpbf16ps with bf16 ones, all lanes equal); without zero points the
// int4 table already holds q − 8, so no Σa is needed. The fold is a called
// subroutine, the group test one cmp + branch per k-pair row.
//
// Registers: acc_g mr × nz, Σa mr (u4 with zeros) — ks of each (k-pair rows
// alternate between them) while mr·nz < 8, since vdpbf16ps's latency (~8
// cycles) would otherwise bound a decode row —, the table, the constants,
// B temporaries (nz, fp8 2·nz) and one A register for the odd last pair
// (table-free: it holds the code row; the FMA variant: 8 controls, 4 B
// temporaries, 3 A registers, the f32 A copy on the stack); the
// f32 accumulators acc take mr × nz more when they fit in the 32 zmm, else
// they live in a 64-byte aligned stack block (mr·nz·64 bytes) and the fold
// loads, updates and stores them. The code stream is prefetched
// prefetch_bytes() ahead into L2 (the M = 1 case streams it from DRAM).
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
        mx_(d.b_type == DType::f4e2m1),
        zp_(d.b_type == DType::u4 && d.b_zeros),
        nz_((d.computed_cols() + 15) / 16),
        ms_(nz_ == 4 && (d.b_type == DType::u4 || d.b_type == DType::f4e2m1)),
        tf_(d.b_type == DType::u4 && ms_),
        sa_(zp_ || tf_),
        row_bytes_(fp8_ ? 128 : 64) {
    if (d.b_type != DType::u4 && d.b_type != DType::f8e4m3 && d.b_type != DType::f4e2m1)
      throw std::invalid_argument("emit_quant_brgemm: b must be u4, f8e4m3 or f4e2m1");
    if (d.mr < 1 || d.mr > BrgemmDesc::kQuantMaxMr || d.nr < 1 ||
        d.nr > (d.glu != Glu::none ? 32 : 64) || d.kb < 1)
      throw std::invalid_argument("emit_quant_brgemm: mr 1..4, nr 1..64 (GLU: 1..32), kb >= 1");
    if (d.accumulate || d.a_packed)
      throw std::invalid_argument("emit_quant_brgemm: no acc_in or packed A");
    plan_registers();
    generate();
  }

 private:
  static constexpr int kUnroll = 4;  // k-pair rows per loop iteration
  // Code bytes prefetched ahead into L2: BrgemmDesc::prefetch_kib, by
  // default 8 KiB (0: none).
  int64_t prefetch_bytes() const { return int64_t{d_.effective_prefetch_kib()} * 1024; }

  // The f32 FMA variant of the table-free int4 path: A converted to f32 in
  // args.q_scratch, [a_even, a_odd, a_even + a_odd, 0] per k-pair and row.
  int64_t fp_row_bytes() const { return fp_row_bytes_of(d_); }

 public:
  static int64_t fp_row_bytes_of(const BrgemmDesc& d) { return ((d.kb + 1) / 2 + 7) / 8 * 8 * 16; }
  static constexpr int64_t kFpBufferMax = 128 * 1024;
  // Whether a descriptor takes the f32 FMA variant (then its scratch).
  static bool fp_variant(const BrgemmDesc& d) {
    // one_chain (batch-invariant mode): every mr sums with vdpbf16ps, as
    // mr = 4 does (the f32 FMAs would round otherwise).
    if (d.u4_bf16_dot || d.one_chain) return false;
    const int nz = (d.computed_cols() + 15) / 16;
    const bool table_free = d.b_type == DType::u4 && nz == 4;
    return table_free && d.mr * fp_row_bytes_of(d) <= kFpBufferMax && d.mr * nz + d.mr + 17 <= 32;
  }

 private:
  void plan_registers_fp() {
    const int rn = d_.mr * nz_;
    // acc_g, Σa, 8 multishift controls, mask, or-word, 4 B temporaries, 3 A.
    auto fixed = [&](int ks) { return ks * rn + ks * d_.mr + 10 + 4 + 3; };
    ks_ = 1;
    while (ks_ < 4 && 2 * ks_ * rn <= 8 && fixed(2 * ks_) + rn <= 32) ks_ *= 2;
    acc_in_regs_ = fixed(ks_) + rn <= 32;
    int next = 0;
    if (acc_in_regs_) next += rn;
    accg0_ = next, next += ks_ * rn;
    sum0_ = next, next += ks_ * d_.mr;
    for (int t = 0; t < 8; ++t) ctrl_[t] = Zmm(next++);
    orc_ = Zmm(next++);
    cst_ = Zmm(next++);
    b0_ = next, next += 4;
    ae_ = Zmm(next++);
    ao_ = Zmm(next++);
    a_odd_ = Zmm(next++);
    if (next > 32) throw std::logic_error("emit_quant_brgemm: register plan overflow");
  }

  void plan_registers() {
    const int rn = d_.mr * nz_;
    fp_ = fp_variant(d_);
    if (fp_) {
      plan_registers_fp();
      return;
    }
    const int btemps = fp8_ ? 2 * nz_ : nz_;
    // Everything but acc: ks sets of acc_g and Σa, table, constants (int4:
    // 4097 and, with zeros, the ones; fp8: 0x87F0), B temporaries, the odd
    // pair's A.
    // Table-free int4: 4 multishift controls and the 0x41804180 word instead
    // of the table.
    const int consts = ms_ ? 6 : 2;
    auto fixed = [&](int ks) { return ks * rn + (sa_ ? ks * d_.mr + 1 : 0) + consts + btemps + 1; };
    // vdpbf16ps has a latency of ~8 cycles at one per cycle: keep 8
    // independent chains where the registers allow, by alternating k-pair
    // rows between ks sets of acc_g (and Σa), summed at the fold. one_chain
    // (batch-invariant mode): one set whatever mr, so a row's sums do not
    // depend on the rows beside it.
    ks_ = 1;
    while (!d_.one_chain && ks_ < 4 && 2 * ks_ * rn <= 8 && fixed(2 * ks_) + rn <= 32) ks_ *= 2;
    acc_in_regs_ = fixed(ks_) + rn <= 32;
    int next = 0;
    if (acc_in_regs_) next += rn;  // acc(r, j) = zmm(r·nz + j)
    accg0_ = next, next += ks_ * rn;
    if (sa_) sum0_ = next, next += ks_ * d_.mr;
    if (ms_)
      for (int t = 0; t < 4; ++t) ctrl_[t] = Zmm(next++);
    if (tf_)
      orc_ = Zmm(next++);
    else
      table_ = Zmm(next++);
    cst_ = Zmm(next++);  // int4: 4097 dwords (tf: 0x00780078); fp8: 0x87F0 words
    if (sa_) ones_ = Zmm(next++);
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
    if (ms_) {
      // Output j lane 2i+e: column 8i + 2j + e (byte 2j+e of code qword i).
      vpmultishiftqb(w, ctrl_[j], a_odd_);  // the row in a_odd_
      if (tf_)
        vpternlogd(w, cst_, orc_, 0xEA);  // (w & 0x00780078) | 0x41804180
      else
        vpermw(w, w, table_);  // the nibble in each word's bits 0..3
      return;
    }
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

  // One k-pair row of the FMA variant: W(t, par) = f32(16 + q) of k parity
  // par, columns in the table-free order of output t.
  void k_pair_fp(int64_t u) {
    const int set = static_cast<int>(u % ks_);
    const int64_t boff = u * 64, aoff = u * 16;
    if (prefetch_bytes() > 0) prefetcht1(ptr[b_ + boff + prefetch_bytes()]);
    if (d_.mr == 1) {
      vbroadcastss(ae_, ptr[a_ + aoff]);
      vbroadcastss(ao_, ptr[a_ + aoff + 4]);
    }
    for (int r = 0; r < d_.mr; ++r) vaddps(sum(set, r), sum(set, r), ptr_b[a_exp(r, aoff + 8)]);
    vmovdqu8(a_odd_, zword[b_ + boff]);  // the code row, once (a memory operand per
                                         // vpmultishiftqb costs ~15 %)
    for (int t = 0; t < 4; ++t) {
      const Zmm we = breg(2 * (t % 2)), wo = breg(2 * (t % 2) + 1);
      vpmultishiftqb(we, ctrl_[2 * t], a_odd_);
      vpternlogd(we, cst_, orc_, 0xEA);  // (w & 0x00780000) | 0x41800000
      vpmultishiftqb(wo, ctrl_[2 * t + 1], a_odd_);
      vpternlogd(wo, cst_, orc_, 0xEA);
      for (int r = 0; r < d_.mr; ++r) {
        if (d_.mr == 1) {
          vfmadd231ps(accg(set, r, t), we, ae_);
          vfmadd231ps(accg(set, r, t), wo, ao_);
        } else {
          vfmadd231ps(accg(set, r, t), we, ptr_b[a_exp(r, aoff)]);
          vfmadd231ps(accg(set, r, t), wo, ptr_b[a_exp(r, aoff + 4)]);
        }
      }
    }
  }

  // A rows to f32 on the stack (at a_, rows fp_row_bytes apart): per k-pair
  // [a_even, a_odd, a_even + a_odd, a_even + a_odd]; an odd kb's last a_odd
  // is 0 (masked load: nothing past the row is read).
  void convert_a_fp(const Xbyak::Reg64& src, const Xbyak::Reg64& dst) {
    const Zmm x = zmm0, y = zmm1, o0 = zmm2, o1 = zmm3;
    uint32_t idx[2][16];
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 16; ++l) {
        const int pr = 4 * h + l / 4, c = l % 4;
        idx[h][l] = uint32_t(c < 2 ? 2 * pr + c : 16 + 2 * pr);
      }
    const Xbyak::Label& i0 = blob_label(reinterpret_cast<const uint8_t*>(idx[0]), 64);
    const Xbyak::Label& i1 = blob_label(reinterpret_cast<const uint8_t*>(idx[1]), 64);
    auto chunk = [&]() {
      vpslld(x, x, 16);
      vpermilps(y, x, 0xB1);
      vaddps(y, y, x);
      vmovdqu32(o0, ptr[rip + i0]);
      vpermi2ps(o0, x, y);
      vmovups(ptr[dst], o0);
      vmovdqu32(o1, ptr[rip + i1]);
      vpermi2ps(o1, x, y);
      vmovups(ptr[dst + 64], o1);
    };
    const int64_t chunks = d_.kb / 16, tail = d_.kb % 16;
    if (chunks > 0) {
      Xbyak::Label l;
      mov(rcx, chunks);
      L(l);
      vpmovzxwd(x, yword[src]);
      chunk();
      add(src, 32);
      add(dst, 128);
      dec(rcx);
      jnz(l, T_NEAR);
    }
    if (tail > 0) {
      mov(ecx, (1u << tail) - 1);
      kmovw(k6, ecx);
      vpmovzxwd(x | k6 | T_z, yword[src]);
      chunk();
    }
  }

  // One k-pair row at k-pair offset u (bytes u·4 of A, u·row_bytes of codes).
  void k_pair(int64_t u) {
    if (fp_) {
      k_pair_fp(u);
      return;
    }
    if (ms_) vmovdqu8(a_odd_, zword[b_ + u * row_bytes_]);  // the code row, once
    const int set = static_cast<int>(u % ks_);
    const int64_t boff = u * row_bytes_;
    if (prefetch_bytes() > 0)
      for (int line = 0; line < row_bytes_ / 64; ++line)
        prefetcht1(ptr[b_ + boff + prefetch_bytes() + 64 * line]);
    for (int j = 0; j < nz_; ++j) convert(j, boff);
    for (int r = 0; r < d_.mr; ++r) {
      const Xbyak::Address a = ptr_b[a_exp(r, u * 4)];
      for (int j = 0; j < nz_; ++j) vdpbf16ps(accg(set, r, j), breg(j), a);
      if (sa_) vdpbf16ps(sum(set, r), ones_, a);
    }
  }

  // The last, unpaired k of an odd kb: the A element zero-extended.
  void odd_pair(int64_t u) {
    const int64_t boff = u * row_bytes_;
    if (ms_) vmovdqu8(a_odd_, zword[b_ + boff]);
    for (int j = 0; j < nz_; ++j) convert(j, boff);
    for (int r = 0; r < d_.mr; ++r) {
      movzx(ebx, word[a_exp(r, u * 4)]);
      vpbroadcastd(a_odd_, ebx);
      for (int j = 0; j < nz_; ++j) vdpbf16ps(accg(0, r, j), breg(j), a_odd_);
      if (sa_) vdpbf16ps(sum(0, r), ones_, a_odd_);
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

  // The fold subroutine: acc += s ⊙ (acc_g − z ⊙ Σa) for group cur_;
  // acc_g and Σa zeroed. Clobbers r11, r12 and the B temporaries.
  void emit_fold() {
    L(fold_);
    movsxd(r11, cur_);
    if (zp_) {
      mov(r12, r11);
      shl(r12, 6);  // 64 u8 per zero row
      add(r12, zeros_);
    }
    shl(r11, mx_ ? 6 : 8);  // 64 f32 per scale row; MXFP4: 64 e8m0 bytes
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
        if (sa_) {
          vaddps(sum(0, r), sum(0, r), sum(s, r));
          vpxord(sum(s, r), sum(s, r), sum(s, r));
        }
      }
    }
    if (ms_) {
      emit_fold_ms(t);
      ret();
      return;
    }
    for (int j = 0; j < nz_; ++j) {
      if (zp_) {
        vpmovzxbd(zs, xword[r12 + 16 * j]);
        vcvtdq2ps(zs, zs);  // z, exact
      }
      if (mx_) {
        vpmovzxbd(zs, xword[r11 + 16 * j]);
        e8m0_to_f32(zs, k2);  // s = 2^(e − 127)
      }
      for (int r = 0; r < d_.mr; ++r) {
        const Zmm g = accg(0, r, j);
        if (fp8_) vmulps(g, g, bcst(256.0f));  // exact: the codes' 2^-8
        // The group's own sum first, d = acc_g − z·Σa (one rounding; exactly
        // 0 when every q = z), then acc += s·d: adding s·acc_g and z·s·Σa to
        // acc one after the other lost acc to their cancellation when s is
        // large (found by quant_pack_fuzzer).
        if (zp_) vfnmadd231ps(g, sum(0, r), zs);
        const Zmm a = acc_in_regs_ ? acc(r, j) : t;
        if (!acc_in_regs_) vmovaps(a, ptr[accm_ + acc_mem_off(r, j)]);
        if (mx_)
          vfmadd231ps(a, g, zs);
        else
          vfmadd231ps(a, g, ptr[r11 + 64 * j]);
        if (!acc_in_regs_) vmovaps(ptr[accm_ + acc_mem_off(r, j)], a);
        vpxord(g, g, g);
      }
    }
    if (zp_)
      for (int r = 0; r < d_.mr; ++r) vpxord(sum(0, r), sum(0, r), sum(0, r));
    ret();
  }

  // The table-free fold (output j lane 2i+e = column 8i + 2j + e): the scales
  // and zero points gathered into that order, d = acc_g − (16 + z)·Σa (one
  // rounding; exact 0 when every q = z) and acc += s ⊙ d.
  void emit_fold_ms(const Zmm& t) {
    const Zmm s = breg(0), y = breg(1), idx = breg(2), zf = breg(3);
    if (tf_ && !zp_) vbroadcastss(zf, f32_const(24.0f));
    for (int j = 0; j < 4; ++j) {
      if (mx_) {
        // The group's e8m0 bytes of columns 8i + 2j + e into lane 2i+e.
        vmovdqu8(s, ptr[rip + *zidx_[j]]);
        vpermb(s | k5 | T_z, s, ptr[r11]);
        e8m0_to_f32(s, k2);
      } else {
        vmovdqu32(idx, ptr[rip + *sidx_[j]]);
        vmovups(s, ptr[r11]);
        vpermt2ps(s, idx, ptr[r11 + 64]);
        vmovups(y, ptr[r11 + 128]);
        vpermt2ps(y, idx, ptr[r11 + 192]);
        vblendmps(s | k4, s, y);
      }
      if (zp_) {
        vmovdqu8(zf, ptr[rip + *zidx_[j]]);
        vpermb(zf | k5 | T_z, zf, ptr[r12]);
        vcvtdq2ps(zf, zf);
        vaddps(zf, zf, bcst(16.0f));
      }
      for (int r = 0; r < d_.mr; ++r) {
        const Zmm g = accg(0, r, j);
        if (tf_) vfnmadd231ps(g, sum(0, r), zf);
        const Zmm a = acc_in_regs_ ? acc(r, j) : t;
        if (!acc_in_regs_) vmovaps(a, ptr[accm_ + acc_mem_off(r, j)]);
        vfmadd231ps(a, g, s);
        if (!acc_in_regs_) vmovaps(ptr[accm_ + acc_mem_off(r, j)], a);
        vpxord(g, g, g);
      }
    }
    if (tf_)
      for (int r = 0; r < d_.mr; ++r) vpxord(sum(0, r), sum(0, r), sum(0, r));
  }

  // acc from the table-free column order back to the natural one.
  void unpermute_acc() {
    mov(edx, 0xF0F0);
    kmovw(k3, edx);
    const int base = acc_in_regs_ ? d_.mr * nz_ : 4;
    const Zmm y = Zmm(base + 4);
    for (int r = 0; r < d_.mr; ++r) {
      Zmm tt[4];
      for (int t = 0; t < 4; ++t) {
        tt[t] = acc_in_regs_ ? acc(r, t) : Zmm(t);
        if (!acc_in_regs_) vmovaps(tt[t], ptr[accm_ + acc_mem_off(r, t)]);
      }
      for (int j = 0; j < 4; ++j) {
        const Zmm x = Zmm(base + j);
        vmovdqu32(x, ptr[rip + *uidx_[j]]);
        vmovdqa32(y, x);
        vpermi2ps(x, tt[0], tt[1]);
        vpermi2ps(y, tt[2], tt[3]);
        vblendmps(x | k3, x, y);
      }
      for (int j = 0; j < 4; ++j) {
        if (acc_in_regs_)
          vmovaps(acc(r, j), Zmm(base + j));
        else
          vmovaps(ptr[accm_ + acc_mem_off(r, j)], Zmm(base + j));
      }
    }
  }

  void load_constants_fp() {
    // Output (t, par): the dword of lane 2i+e takes the nibble par of byte
    // p = 2t+e of qword i into bits 19..22 (its byte 2's bits 3..6).
    for (int t = 0; t < 4; ++t)
      for (int par = 0; par < 2; ++par) {
        uint64_t c = 0;
        for (int e = 0; e < 2; ++e) {
          const int p = 2 * t + e;
          c |= uint64_t((8 * p + 4 * par - 3) & 63) << (8 * (4 * e + 2));
        }
        mov(r11, c);
        vpbroadcastq(ctrl_[2 * t + par], r11);
      }
    mov(r11d, 0x00780000u);
    vpbroadcastd(cst_, r11d);
    mov(r11d, 0x41800000u);  // f32 16.0; | q << 19 makes 16 + q
    vpbroadcastd(orc_, r11d);
    set_fold_tables();
  }

  void load_constants_tf() {
    // Multishift controls: for output j, the dword of lane 2i+e takes byte
    // p = 2j+e of qword i: its low word's low byte the bits 8p−3.. (q_even in
    // bits 3..6), its high word's low byte the bits 8p+1.. (q_odd in 3..6).
    for (int j = 0; j < 4; ++j) {
      uint64_t c = 0;
      for (int e = 0; e < 2; ++e) {
        const int p = 2 * j + e;
        c |= uint64_t((8 * p - 3) & 63) << (8 * (4 * e));
        c |= uint64_t((8 * p + 1) & 63) << (8 * (4 * e + 2));
      }
      mov(r11, c);
      vpbroadcastq(ctrl_[j], r11);
    }
    mov(r11d, 0x00780078u);
    vpbroadcastd(cst_, r11d);
    mov(r11d, 0x41804180u);  // bf16 16.0 pairs; | q << 3 makes 16 + q
    vpbroadcastd(orc_, r11d);
    mov(r11d, 0x3F803F80u);  // bf16 1.0 pairs
    vpbroadcastd(ones_, r11d);
    set_fold_tables();
  }

  // MXFP4 in the multishift order: for output j, the dword of lane 2i+e
  // takes byte p = 2j+e of qword i; its low word's low byte the bits 8p..
  // (q_even in bits 0..3), its high word's low byte the bits 8p+4.. (q_odd);
  // vpermw then reads bits 0..4 of each word: the table repeats its 16
  // values.
  void load_constants_ms() {
    for (int j = 0; j < 4; ++j) {
      uint64_t c = 0;
      for (int e = 0; e < 2; ++e) {
        const int p = 2 * j + e;
        c |= uint64_t(8 * p) << (8 * (4 * e));
        c |= uint64_t(8 * p + 4) << (8 * (4 * e + 2));
      }
      mov(r11, c);
      vpbroadcastq(ctrl_[j], r11);
    }
    load_e2m1_table();
    set_fold_tables();
  }

  void load_e2m1_table() {
    uint16_t tab[32];
    for (int i = 0; i < 32; ++i) tab[i] = runtime::f32_to_bf16(e2m1_code_value(i & 15));
    vmovdqu16(table_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(tab), sizeof tab)]);
  }

  void set_fold_tables() {
    mov(r11d, 0xFF00);
    kmovw(k4, r11d);
    mov(r11, 0x1111111111111111ull);
    kmovq(k5, r11);
    for (int j = 0; j < 4; ++j) {
      uint32_t sidx[16], uidx[16];
      uint8_t zidx[64] = {};
      for (int l = 0; l < 16; ++l) {
        const int i = l / 2, e = l % 2;
        sidx[l] = uint32_t(8 * (i % 4) + 2 * j + e);
        zidx[4 * l] = uint8_t(8 * i + 2 * j + e);
        const int t = (l % 8) / 2;
        uidx[l] = uint32_t(4 * j + 2 * (l / 8) + l % 2 + 16 * (t % 2));
      }
      sidx_[j] = &blob_label(reinterpret_cast<const uint8_t*>(sidx), sizeof sidx);
      zidx_[j] = &blob_label(zidx, sizeof zidx);
      uidx_[j] = &blob_label(reinterpret_cast<const uint8_t*>(uidx), sizeof uidx);
    }
  }

  void load_constants() {
    if (fp_) {
      load_constants_fp();
      return;
    }
    if (tf_) {
      load_constants_tf();
      return;
    }
    if (ms_) {
      load_constants_ms();
      return;
    }
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
    for (int i = 0; i < 32; ++i)
      tab[i] = runtime::f32_to_bf16(d_.b_type == DType::f4e2m1 ? e2m1_code_value(i & 15)
                                                               : float((i & 15) - (zp_ ? 0 : 8)));
    vmovdqu16(table_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(tab), sizeof tab)]);
  }

  void generate() {
    push_callee_saved();
    mov(rbp, rsp);
    const int64_t acc_bytes = acc_in_regs_ ? 0 : d_.mr * nz_ * 64;
    if (acc_bytes > 0) {
      sub(rsp, acc_bytes + 64);
      and_(rsp, -64);
      mov(accm_, rsp);
    }
    mov(lda_, arg(offsetof(BrgemmArgs, lda)));
    mov(r11, arg(offsetof(BrgemmArgs, a)));
    mov(a_, ptr[r11]);
    if (fp_) {
      for (int r = 0; r < d_.mr; ++r) {
        mov(r11, a_);
        if (r > 0) {
          mov(r12, lda_);
          imul(r12, r12, r);
          add(r11, r12);
        }
        mov(r12, arg(offsetof(BrgemmArgs, q_scratch)));
        if (r > 0) add(r12, r * fp_row_bytes());
        convert_a_fp(r11, r12);
      }
      mov(a_, arg(offsetof(BrgemmArgs, q_scratch)));
      mov(lda_, fp_row_bytes());
    }
    if (d_.mr == 4) lea(lda3_, ptr[lda_ + lda_ * 2]);
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
    if (sa_)
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
      add(a_, kUnroll * (fp_ ? 16 : 4));
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
      if (fp_)
        k_pair_fp(rem);  // a_odd = 0 in the f32 copy
      else
        odd_pair(rem);
    }
    call(fold_);
    if (ms_) unpermute_acc();

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
    // With a GLU the ceil(nr/16) <= 2 gate vectors, each paired with the up
    // vector two further on (the block's columns 32..63).
    const bool glu = d_.glu != Glu::none;
    const int nout = glu ? (d_.nr + 15) / 16 : nz_;
    for (int r = 0; r < d_.mr; ++r) {
      for (int j = 0; j < nout; ++j) {
        const bool last = j == nout - 1 && tail_cols != 0;
        Zmm v = Zmm(0), u = Zmm(first + 4);
        if (acc_in_regs_) {
          v = acc(r, j);
          if (glu) u = acc(r, j + 2);
        } else {
          vmovaps(v, ptr[accm_ + acc_mem_off(r, j)]);
          if (glu) vmovaps(u, ptr[accm_ + acc_mem_off(r, j + 2)]);
        }
        if (glu)
          epi.apply_glu_and_store(v, u, j, rsi, r14, last ? &k1 : nullptr, r8);
        else
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
  const bool fp8_, mx_, zp_;
  const int nz_;
  const bool ms_, tf_, sa_;
  bool fp_ = false;
  const int row_bytes_;
  bool acc_in_regs_ = true;
  int ks_ = 1, accg0_ = 0, sum0_ = 0, b0_ = 0;
  Zmm table_, cst_, ones_, a_odd_, orc_;
  Zmm ctrl_[8], ae_, ao_;
  const Xbyak::Label* mask78_ = nullptr;
  const Xbyak::Label* sidx_[4] = {};
  const Xbyak::Label* zidx_[4] = {};
  const Xbyak::Label* uidx_[4] = {};
  Xbyak::Label fold_;
  // Scalars.
  const Xbyak::Reg64 a_ = rax, b_ = rsi, lda_ = r15, lda3_ = r14, groups_ = rdx;
  const Xbyak::Reg64 scales_ = r9, zeros_ = r10, accm_ = r13;
  const Xbyak::Reg32 cur_ = r8d;
};

}  // namespace

int64_t quant_brgemm_scratch_bytes(const BrgemmDesc& d) {
  return QuantBrgemm::fp_variant(d) ? d.mr * QuantBrgemm::fp_row_bytes_of(d) : 0;
}

std::vector<uint8_t> emit_quant_brgemm(const BrgemmDesc& d) {
  QuantBrgemm g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
