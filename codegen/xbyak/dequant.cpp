// AVX-512 dequant kernel (DequantArgs, codegen/quant_desc.h): `rows` k-pair
// rows of fp8 e4m3, int4 or MXFP4 e2m1 codes -> bf16 packed rows, 4 × 16
// columns a row (and, out = i8, int4 codes -> W4A8's s8 chunk: DequantI8Kernel
// below).
//
//   int4: vpmovzxbd 16 code bytes; even = b & 0xF, odd = b >> 4; minus the
//         zero points (int32, exact), vcvtdq2ps, × scale; vcvtne2ps2bf16 puts
//         the 16 even then the 16 odd words in one zmm, vpermw interleaves them.
//   mxfp4: as int4, but v = a 16-entry f32 table of the e2m1 values, looked up
//         by vpermps (it reads the low 4 bits of each index: b for even, b >> 4
//         for odd), × the e8m0 scale 2^(e − 127), made from the group's u8
//         exponent row when the group changes (DequantArgs::scales).
//   fp8:  32 code bytes are already in output order (e0, o0, e1, o1, ...):
//         vpmovzxbw, build f16 bits ((b & 0x80) << 8) | ((b & 0x7F) << 7), which
//         are the e4m3 value × 2^-8 exactly (subnormals included); vcvtph2ps,
//         × 256 (exact), × the scales duplicated per column pair
//         (vpmovzxdq + vmovsldup), vcvtne2ps2bf16 of the two halves in order.
//
// The scale (and zero) vectors of a row's group stay in registers and are
// reloaded only when groups[r] changes. vcvtne2ps2bf16 rounds like
// runtime::f32_to_bf16 (RNE, NaN quiet, Inf kept) except that it flushes f32
// subnormal inputs to zero: each product pair is classified (vfpclassps) and a
// row holding a subnormal product (tiny scales only) is redone on an exact
// path that rounds in integer arithmetic.
#include <array>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <vector>

#include "codegen/quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/jit_generator.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;
using Xbyak::Zmm;

constexpr uint8_t kClassSubnormal = 0x20;  // vfpclassps: denormal
constexpr int kPrefetchBytes = 8192;       // code bytes ahead (L2), as the fused kernel

class DequantKernel : public JitGenerator {
 public:
  explicit DequantKernel(const DequantDesc& d)
      : fp8_(d.code == DType::f8e4m3),
        mx_(d.code == DType::f4e2m1),
        zeros_(d.zeros),
        check_(!d.normal_products) {
    if (d.code != DType::f8e4m3 && d.code != DType::u4 && d.code != DType::f4e2m1)
      throw std::invalid_argument("emit_dequant: code must be f8e4m3, u4 or f4e2m1");
    if (zeros_ && d.code != DType::u4)
      throw std::invalid_argument("emit_dequant: zero points are for u4 codes only");
    generate();
  }

 private:
  // Registers.
  const Xbyak::Reg64 codes_ = rsi, groups_ = rdx, scales_ = r8, zp_ = r9, out_ = r10, rows_ = rcx;
  const Xbyak::Reg64 cur_ = r11;  // the group whose vectors are loaded (-1: none)
  // int4: S(i) scales of columns 16i.., Z(i) int32 zero points; fp8: SD(j)
  // scales of columns 8j..8j+7, each twice.
  Zmm S(int i) const { return Zmm(16 + i); }
  Zmm Z(int i) const { return Zmm(20 + i); }
  Zmm SD(int j) const { return Zmm(16 + j); }
  const Zmm c_mask_ = Zmm(24);   // int4: 0xF; fp8: 0xBF80 words
  const Zmm c_perm_ = Zmm(25);   // int4: vpermw interleave index
  const Zmm c_256_ = Zmm(25);    // fp8: 256.0f
  const Zmm c_eight_ = Zmm(26);  // int4 without zeros: 8
  const Zmm c_e2m1_ = Zmm(26);   // mxfp4: the 16 e2m1 values (f32)
  // Temporaries of chunk i: T(i, 0..2) (chunk i < 4 uses 3i..3i+2).
  Zmm T(int i, int j) const { return Zmm(3 * i + j); }

  int row_bytes() const { return fp8_ ? 128 : 64; }

  void load_group() {
    // rax = groups[r] (sign-extended).
    if (fp8_) {
      mov(rdi, rax);
      shl(rdi, 8);  // 64 f32
      add(rdi, scales_);
      // × 256 (the f16 trick's exponent offset) folded in once per group:
      // exact, a power of two, unless it overflows — and then v·256·s
      // overflows as v·s would not, so only with the per-product check off
      // (normal_products scales are far below 2^120).
      for (int j = 0; j < 8; ++j) {
        vpmovzxdq(SD(j), yword[rdi + 32 * j]);
        vmovsldup(SD(j), SD(j));
        if (!check_) vmulps(SD(j), SD(j), c_256_);
      }
      return;
    }
    mov(rdi, rax);
    if (mx_) {
      // MXFP4: the group's 64 e8m0 exponent bytes (a quarter of an f32 row).
      shl(rdi, 6);
      add(rdi, scales_);
      for (int i = 0; i < 4; ++i) {
        vpmovzxbd(S(i), xword[rdi + 16 * i]);
        e8m0_to_f32(S(i), k2);
      }
      return;
    }
    shl(rdi, 8);
    add(rdi, scales_);
    for (int i = 0; i < 4; ++i) vmovups(S(i), ptr[rdi + 64 * i]);
    if (zeros_) {
      mov(rdi, rax);
      shl(rdi, 6);  // 64 u8
      add(rdi, zp_);
      for (int i = 0; i < 4; ++i) vpmovzxbd(Z(i), xword[rdi + 16 * i]);
    }
  }

  // The f32 products of chunk i (16 columns): int4 even in T(i,0), odd in
  // T(i,1); fp8 output elements 32i..32i+15 in T(i,0), 32i+16.. in T(i,1).
  void products(int i) {
    const Zmm a = T(i, 0), b = T(i, 1), t = T(i, 2);
    if (fp8_) {
      vpmovzxbw(t, yword[codes_ + 32 * i]);
      vpsllw(t, t, 8);
      vpsraw(t, t, 1);
      vpandd(t, t, c_mask_);
      vcvtph2ps(a, Xbyak::Ymm(t.getIdx()));
      vextracti64x4(Xbyak::Ymm(b.getIdx()), t, 1);
      vcvtph2ps(b, Xbyak::Ymm(b.getIdx()));
      if (check_) {
        vmulps(a, a, c_256_);
        vmulps(b, b, c_256_);
      }
      vmulps(a, a, SD(2 * i));
      vmulps(b, b, SD(2 * i + 1));
      return;
    }
    vpmovzxbd(t, xword[codes_ + 16 * i]);
    if (mx_) {
      vpermps(a, t, c_e2m1_);  // the low nibble (vpermps reads bits 0..3 of the index)
      vpsrld(b, t, 4);
      vpermps(b, b, c_e2m1_);
      vmulps(a, a, S(i));
      vmulps(b, b, S(i));
      return;
    }
    vpandd(a, t, c_mask_);
    vpsrld(b, t, 4);
    const Zmm z = zeros_ ? Z(i) : c_eight_;
    vpsubd(a, a, z);
    vpsubd(b, b, z);
    vcvtdq2ps(a, a);
    vcvtdq2ps(b, b);
    vmulps(a, a, S(i));
    vmulps(b, b, S(i));
  }

  // runtime::f32_to_bf16 of every lane of x into the low 16 bits of r
  // (high bits zero); t is clobbered.
  void exact_bf16(const Zmm& r, const Zmm& x, const Zmm& t) {
    vpsrld(t, x, 16);
    vpandd(r, t, bcst_u32(1));
    vpaddd(r, r, x);
    vpaddd(r, r, bcst_u32(0x7FFF));
    vpsrld(r, r, 16);
    // NaN: the high half with the quiet bit set, not rounded.
    vpandd(x, x, bcst_u32(0x7FFFFFFF));
    vpcmpud(k3, x, bcst_u32(0x7F800000), 6);  // > : NaN
    vpord(r | k3, t, bcst_u32(0x40));
  }

  void generate() {
    mov(codes_, arg(offsetof(DequantArgs, codes)));
    mov(groups_, arg(offsetof(DequantArgs, groups)));
    mov(scales_, arg(offsetof(DequantArgs, scales)));
    if (zeros_) mov(zp_, arg(offsetof(DequantArgs, zeros)));
    mov(out_, arg(offsetof(DequantArgs, out)));
    mov(rows_, arg(offsetof(DequantArgs, rows)));
    Xbyak::Label done, row_loop, have_group, next_row, exact_row;
    test(rows_, rows_);
    jle(done, T_NEAR);

    if (fp8_) {
      mov(eax, 0xBF80BF80);
      vpbroadcastd(c_mask_, eax);
      vbroadcastss(c_256_, f32_const(256.0f));
    } else {
      mov(eax, 0xF);
      vpbroadcastd(c_mask_, eax);
      if (mx_) {
        const std::array<float, 16> table = e2m1_table();
        vmovups(c_e2m1_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(table.data()),
                                              sizeof(float) * table.size())]);
      } else if (!zeros_) {
        mov(eax, 8);
        vpbroadcastd(c_eight_, eax);
      }
      uint16_t idx[32];
      for (int c = 0; c < 16; ++c) {
        idx[2 * c] = static_cast<uint16_t>(c);
        idx[2 * c + 1] = static_cast<uint16_t>(16 + c);
      }
      vmovdqu16(c_perm_, ptr[rip + blob_label(reinterpret_cast<const uint8_t*>(idx), sizeof idx)]);
    }
    mov(cur_, -1);

    L(row_loop);
    movsxd(rax, dword[groups_]);
    cmp(rax, cur_);
    je(have_group, T_NEAR);
    mov(cur_, rax);
    load_group();
    L(have_group);
    // The codes stream from DRAM when a cold weight is dequantized (MoE
    // prefill: each expert's block once per call): pull them into L2 well
    // ahead, one cache line per 64 code bytes (prefetches never fault past
    // the chunk's end).
    for (int line = 0; line < row_bytes() / 64; ++line)
      prefetcht1(ptr[codes_ + kPrefetchBytes + 64 * line]);
    for (int i = 0; i < 4; ++i) {
      products(i);
      const Zmm a = T(i, 0), b = T(i, 1);
      if (check_) {
        vfpclassps(k1, a, kClassSubnormal);
        vfpclassps(k2, b, kClassSubnormal);
        kortestw(k1, k2);
        jnz(exact_row, T_NEAR);
      }
      // Words 0..15 = bf16(a), 16..31 = bf16(b): in order for fp8; int4
      // interleaves the even and odd halves.
      vcvtne2ps2bf16(a, b, a);
      if (!fp8_) vpermw(a, c_perm_, a);
      vmovups(ptr[out_ + 64 * i], a);
    }
    L(next_row);
    add(codes_, row_bytes());
    add(groups_, 4);
    add(out_, 256);
    dec(rows_);
    jnz(row_loop, T_NEAR);
    L(done);
    vzeroupper();
    ret();

    // The row again, rounding in integer arithmetic (f32 subnormal products).
    L(exact_row);
    for (int i = 0; i < 4; ++i) {
      products(i);
      const Zmm a = T(i, 0), b = T(i, 1), t = T(i, 2);
      const Zmm ra = Zmm(12), rb = Zmm(13);
      exact_bf16(ra, a, t);
      exact_bf16(rb, b, t);
      if (fp8_) {
        vpmovdw(yword[out_ + 64 * i], ra);
        vpmovdw(yword[out_ + 64 * i + 32], rb);
      } else {
        vpslld(rb, rb, 16);
        vpord(ra, ra, rb);
        vmovups(ptr[out_ + 64 * i], ra);
      }
    }
    jmp(next_row, T_NEAR);
  }

  static std::array<float, 16> e2m1_table() {
    std::array<float, 16> t{};
    for (int q = 0; q < 16; ++q) t[size_t(q)] = e2m1_code_value(q);
    return t;
  }

  bool fp8_, mx_, zeros_, check_;
};

// out = i8 (W4A8, u4 codes; the contract in codegen/quant_desc.h): per quad
// row j, k-pair rows r0 = 2j and r1 = 2j + 1 (absent for an odd count: its
// bytes 0), per 16 columns: the code bytes widened to dwords (vpmovzxbd),
// the nibbles minus the row's zero points in int32 (exact), their sum added
// to the column sums, and the dword (e0, o0, e1, o1) of each column put
// together by shifts that drop all but each value's low byte (its s8 code).
class DequantI8Kernel : public JitGenerator {
 public:
  explicit DequantI8Kernel(const DequantDesc& d) : zeros_(d.zeros) {
    if (d.code != DType::u4)
      throw std::invalid_argument("emit_dequant: out i8 is for u4 codes only");
    generate();
  }

 private:
  const Xbyak::Reg64 codes_ = rsi, groups_ = rdx, zp_ = r9, out_ = r10, quads_ = rcx;
  const Xbyak::Reg64 z0_ = rax, z1_ = r11;  // the two rows' zero-point rows
  Zmm Sum(int i) const { return Zmm(16 + i); }
  const Zmm c_mask_ = Zmm(24);   // 0xF
  const Zmm c_byte_ = Zmm(25);   // 0xFF
  const Zmm c_eight_ = Zmm(26);  // the zero point without zeros

  // The zero-point row of the group of the k-pair row at groups_ + 4·r.
  void zero_row(const Xbyak::Reg64& dst, int r) {
    if (!zeros_) return;
    movsxd(dst, dword[groups_ + 4 * r]);
    shl(dst, 6);
    add(dst, zp_);
  }

  // The 16 columns i of one k-pair row (r = 0 or 1 of the quad): even and
  // odd codes minus the zero points, as int32 in e and o.
  void nibbles(int r, int i, const Zmm& e, const Zmm& o, const Zmm& z) {
    vpmovzxbd(o, xword[codes_ + 64 * r + 16 * i]);
    vpandd(e, o, c_mask_);
    vpsrld(o, o, 4);
    if (zeros_) {
      vpmovzxbd(z, xword[(r == 0 ? z0_ : z1_) + 16 * i]);
      vpsubd(e, e, z);
      vpsubd(o, o, z);
    } else {
      vpsubd(e, e, c_eight_);
      vpsubd(o, o, c_eight_);
    }
  }

  void quad(bool two_rows) {
    zero_row(z0_, 0);
    if (two_rows) zero_row(z1_, 1);
    for (int line = 0; line < 2; ++line) prefetcht1(ptr[codes_ + kPrefetchBytes + 64 * line]);
    const Zmm e0 = Zmm(0), o0 = Zmm(1), e1 = Zmm(2), o1 = Zmm(3), z = Zmm(4), t = Zmm(5);
    for (int i = 0; i < 4; ++i) {
      nibbles(0, i, e0, o0, z);
      vpaddd(Sum(i), Sum(i), e0);
      vpaddd(Sum(i), Sum(i), o0);
      vpandd(e0, e0, c_byte_);
      vpslld(o0, o0, 24);
      vpsrld(o0, o0, 16);  // byte 1
      vpord(e0, e0, o0);
      if (two_rows) {
        nibbles(1, i, e1, o1, z);
        vpaddd(Sum(i), Sum(i), e1);
        vpaddd(Sum(i), Sum(i), o1);
        vpslld(t, e1, 24);
        vpsrld(t, t, 8);              // byte 2
        vpslld(o1, o1, 24);           // byte 3
        vpternlogd(e0, t, o1, 0xFE);  // e0 | t | o1
      }
      vmovups(ptr[out_ + 64 * i], e0);
    }
  }

  void generate() {
    mov(codes_, arg(offsetof(DequantArgs, codes)));
    mov(groups_, arg(offsetof(DequantArgs, groups)));
    if (zeros_) mov(zp_, arg(offsetof(DequantArgs, zeros)));
    mov(out_, arg(offsetof(DequantArgs, out)));
    mov(r8, arg(offsetof(DequantArgs, rows)));
    for (int i = 0; i < 4; ++i) vpxord(Sum(i), Sum(i), Sum(i));
    mov(eax, 0xF);
    vpbroadcastd(c_mask_, eax);
    mov(eax, 0xFF);
    vpbroadcastd(c_byte_, eax);
    if (!zeros_) {
      mov(eax, 8);
      vpbroadcastd(c_eight_, eax);
    }
    Xbyak::Label quad_loop, pairs_done, done;
    mov(quads_, r8);
    sar(quads_, 1);  // whole quads (rows >= 0)
    jle(pairs_done, T_NEAR);
    L(quad_loop);
    quad(true);
    add(codes_, 128);
    add(groups_, 8);
    add(out_, 256);
    dec(quads_);
    jnz(quad_loop, T_NEAR);
    L(pairs_done);
    test(r8, 1);
    jz(done, T_NEAR);
    quad(false);  // the odd last k-pair row: the quad's second half is 0
    L(done);
    mov(rax, arg(offsetof(DequantArgs, comp)));
    Xbyak::Label no_comp;
    test(rax, rax);
    jz(no_comp, T_NEAR);
    for (int i = 0; i < 4; ++i) vmovups(ptr[rax + 64 * i], Sum(i));
    L(no_comp);
    vzeroupper();
    ret();
  }

  bool zeros_;
};

}  // namespace

std::vector<uint8_t> emit_dequant(const DequantDesc& d) {
  if (d.out == DType::i8) {
    DequantI8Kernel g(d);
    return g.finish();
  }
  if (d.out != DType::bf16) throw std::invalid_argument("emit_dequant: out must be bf16 or i8");
  DequantKernel g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
