// AVX-512 act_quant kernel (ActQuantArgs, codegen/quant_desc.h): bf16 rows ->
// u8 codes with a per-row scale and zero point, two passes over each row.
//
//   range:    32 bf16 a step (masked tail): the integer max of bits & 0x7FFF
//             (sym: that is max |x|; every mode: >= 0x7F80 means a NaN or Inf),
//             asym also the f32 min / max of the even and odd elements
//             (vminps / vmaxps with x first, so a NaN lane keeps the running
//             value, as std::min / std::max do in the reference).
//   params:   scalar f32 divisions and the zero point, in the contract's order.
//   quantize: 16 a step (masked tail): vpmovzxwd, << 16, × inv, clamp to
//             ±512 (constant first: a NaN stays NaN and converts to INT_MIN,
//             as the reference's conversion does), vcvtps2dq {rn-sae} (RNE
//             whatever MXCSR says), + zero,
//             clamp to the code range, vpmovdb to memory.
// Then zeros from k to k_padded. A row with a NaN / Inf gets scale NaN and
// q = zero (a broadcast fill) instead of the quantize pass.
#include <cstddef>
#include <vector>

#include "codegen/quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/jit_generator.h"
#include "runtime/reference_quant.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;
using Xbyak::Xmm;
using Xbyak::Ymm;
using Xbyak::Zmm;

class ActQuantKernel : public JitGenerator {
 public:
  explicit ActQuantKernel(const ActQuantDesc& d) : mode_(d.mode) { generate(); }

 private:
  // Row state.
  const Xbyak::Reg64 x_ = r8, ldx_ = r9, rows_ = rcx, k_ = r10, kp_ = r11, out_ = rdx,
                     ld_out_ = rsi, scale_ = rbx, zero_ = r12, fixed_zero_ = r13, j_ = r14,
                     z_ = r15;
  // Vector constants and accumulators (zmm16+: EVEX only, never clobbered by
  // the scalar code in xmm0..7).
  const Zmm c_abs_ = Zmm(16);     // 0x7FFF words
  const Zmm c_neg512_ = Zmm(17);  // -512.0f
  const Zmm c_pos512_ = Zmm(18);  // 512.0f
  const Zmm v_inv_ = Zmm(19);
  const Zmm v_zero_ = Zmm(20);
  const Zmm c_lo_q_ = Zmm(21);
  const Zmm c_hi_q_ = Zmm(22);
  const Zmm acc_max_ = Zmm(23);  // u16 max of |bits|
  const Zmm acc_lo_ = Zmm(24);   // asym: f32 min
  const Zmm acc_hi_ = Zmm(25);   // asym: f32 max
  const Zmm c_odd_ = Zmm(26);    // 0xFFFF0000

  void broadcast(const Zmm& z, uint32_t v) {
    mov(eax, v);
    vpbroadcastd(z, eax);
  }

  // One range step of 32 bf16 in t (zero lanes are neutral).
  void range_step(const Zmm& t) {
    if (mode_ == ActQuantMode::asym) {
      const Zmm e = Zmm(1), o = Zmm(2);
      vpslld(e, t, 16);
      vpandd(o, t, c_odd_);
      vminps(acc_lo_, e, acc_lo_);
      vmaxps(acc_hi_, e, acc_hi_);
      vminps(acc_lo_, o, acc_lo_);
      vmaxps(acc_hi_, o, acc_hi_);
    }
    vpandd(t, t, c_abs_);
    vpmaxuw(acc_max_, acc_max_, t);
  }

  // Leaves max_k (bits & 0x7FFF) in eax; asym: min in xmm0, max in xmm1.
  void range_pass() {
    vpxord(acc_max_, acc_max_, acc_max_);
    if (mode_ == ActQuantMode::asym) {
      vpxord(acc_lo_, acc_lo_, acc_lo_);
      vpxord(acc_hi_, acc_hi_, acc_hi_);
    }
    Xbyak::Label loop, tail, done;
    const Zmm t = Zmm(0);
    xor_(j_, j_);
    L(loop);
    lea(rax, ptr[j_ + 32]);
    cmp(rax, k_);
    jg(tail, T_NEAR);
    vmovdqu16(t, ptr[x_ + j_ * 2]);
    range_step(t);
    mov(j_, rax);
    jmp(loop, T_NEAR);
    L(tail);
    mov(rax, k_);
    sub(rax, j_);
    jle(done, T_NEAR);
    mov(edi, -1);
    bzhi(edi, edi, eax);
    kmovd(k1, edi);
    vmovdqu16(t | k1 | T_z, ptr[x_ + j_ * 2]);
    range_step(t);
    L(done);

    // Horizontal reductions (low registers: VEX forms are fine there).
    const Zmm a = Zmm(0), b = Zmm(1);
    vmovdqa64(a, acc_max_);
    vextracti64x4(Ymm(1), a, 1);
    vpmaxuw(Ymm(0), Ymm(0), Ymm(1));
    vextracti128(Xmm(1), Ymm(0), 1);
    vpmaxuw(Xmm(0), Xmm(0), Xmm(1));
    vpshufd(Xmm(1), Xmm(0), 0x4E);
    vpmaxuw(Xmm(0), Xmm(0), Xmm(1));
    vpshufd(Xmm(1), Xmm(0), 0xB1);
    vpmaxuw(Xmm(0), Xmm(0), Xmm(1));
    vpsrld(Xmm(1), Xmm(0), 16);
    vpmaxuw(Xmm(0), Xmm(0), Xmm(1));
    vmovd(eax, Xmm(0));
    movzx(eax, ax);
    if (mode_ != ActQuantMode::asym) return;
    // No lane is NaN or -0 (only a strictly smaller / larger x replaces the
    // +0 start), so the lane order does not matter.
    reduce_f32(a, acc_lo_, true);
    reduce_f32(b, acc_hi_, false);
  }

  void reduce_f32(const Zmm& r, const Zmm& acc, bool min) {
    const auto op = [&](const Xmm& d, const Xmm& s1, const Xmm& s2) {
      if (min)
        vminps(d, s1, s2);
      else
        vmaxps(d, s1, s2);
    };
    const Zmm t = Zmm(2);
    const Ymm ry = Ymm(r.getIdx()), ty = Ymm(t.getIdx());
    const Xmm rx = Xmm(r.getIdx()), tx = Xmm(t.getIdx());
    vextractf64x4(ty, acc, 1);
    vmovaps(ry, Ymm(acc.getIdx()));
    op(ry, ry, ty);
    vextractf128(tx, ry, 1);
    op(rx, rx, tx);
    vpermilps(tx, rx, 0x4E);
    op(rx, rx, tx);
    vpermilps(tx, rx, 0xB1);
    op(rx, rx, tx);
  }

  // Computes inv (xmm4), s (xmm5) and the zero point (z_) from the range
  // (eax, xmm0, xmm1); jumps to `nonfinite` for a row with a NaN / Inf.
  void params(Xbyak::Label& nonfinite) {
    const Xmm lo = Xmm(0), hi = Xmm(1), r = Xmm(2), t = Xmm(3), inv = Xmm(4), s = Xmm(5);
    Xbyak::Label have;
    switch (mode_) {
      case ActQuantMode::sym:
        mov(z_.cvt32(), 128);
        cmp(eax, 0x7F80);
        jae(nonfinite, T_NEAR);
        vmovss(inv, f32_const(1.0f));
        vmovss(s, inv);
        test(eax, eax);
        jz(have, T_NEAR);
        shl(eax, 16);
        vmovd(r, eax);                                        // a
        vmaxss(r, r, f32_const(runtime::kActQuantMinRange));  // runtime::act_quant_step
        vmovss(t, f32_const(127.0f));
        vdivss(inv, t, r);
        vdivss(s, r, t);
        L(have);
        break;
      case ActQuantMode::asym: {
        mov(edi, eax);  // keep the finite test
        vsubss(r, hi, lo);
        vmovss(inv, f32_const(1.0f));
        vmovss(s, inv);
        vxorps(t, t, t);
        vucomiss(r, t);  // r >= 0, never NaN
        je(have, T_NEAR);
        vmaxss(r, r, f32_const(runtime::kActQuantMinRange));  // runtime::act_quant_step
        vmovss(t, f32_const(255.0f));
        vdivss(inv, t, r);
        vdivss(s, r, t);
        L(have);
        // zero = clamp(rne(-lo · inv), 0, 255); NaN converts to INT_MIN -> 0.
        vmulss(t, lo, inv);
        vmovd(eax, t);
        xor_(eax, 0x80000000);
        vmovd(t, eax);
        vcvtss2si(eax, t | T_rn_sae);  // RNE whatever MXCSR says
        xor_(z_.cvt32(), z_.cvt32());
        test(eax, eax);
        cmovns(z_.cvt32(), eax);
        mov(eax, 255);
        cmp(z_.cvt32(), eax);
        cmovg(z_.cvt32(), eax);
        cmp(edi, 0x7F80);
        jae(nonfinite, T_NEAR);
        break;
      }
      case ActQuantMode::fixed:
        mov(z_.cvt32(), fixed_zero_.cvt32());
        cmp(eax, 0x7F80);
        jae(nonfinite, T_NEAR);
        vmovss(inv, dword[rsp + kInvSlot]);
        vmovss(s, dword[rsp + kScaleSlot]);
        break;
    }
  }

  // out[j, end) = the byte in xmm v (j_ advanced in 16 steps, masked last).
  void fill(const Xmm& v, const Xbyak::Reg64& end) {
    Xbyak::Label loop, tail, done;
    L(loop);
    mov(rax, end);
    sub(rax, j_);
    jle(done, T_NEAR);
    cmp(rax, 16);
    jl(tail, T_NEAR);
    vmovdqu8(ptr[out_ + j_], v);
    add(j_, 16);
    jmp(loop, T_NEAR);
    L(tail);
    mov(edi, 0xFFFF);
    bzhi(edi, edi, eax);
    kmovw(k2, edi);
    vmovdqu8(ptr[out_ + j_] | k2, v);
    L(done);
  }

  // q of 16 bf16 (zero-extended to dwords in v), to the u8 store.
  void quantize(const Zmm& v) {
    vpslld(v, v, 16);
    vmulps(v, v, v_inv_);
    vmaxps(v, c_neg512_, v);     // (-512 > v) ? -512 : v   (NaN: v)
    vminps(v, c_pos512_, v);     // (512 < v) ? 512 : v     (NaN: v)
    vcvtps2dq(v | T_rn_sae, v);  // RNE whatever the caller's MXCSR says
    vpaddd(v, v, v_zero_);
    vpmaxsd(v, v, c_lo_q_);
    vpminsd(v, v, c_hi_q_);
  }

  void quantize_pass() {
    vbroadcastss(v_inv_, Xmm(4));
    vpbroadcastd(v_zero_, z_.cvt32());
    const Zmm v = Zmm(0);
    Xbyak::Label loop, tail, done;
    xor_(j_, j_);
    L(loop);
    lea(rax, ptr[j_ + 16]);
    cmp(rax, k_);
    jg(tail, T_NEAR);
    vpmovzxwd(v, yword[x_ + j_ * 2]);
    quantize(v);
    vpmovdb(ptr[out_ + j_], v);
    mov(j_, rax);
    jmp(loop, T_NEAR);
    L(tail);
    mov(rax, k_);
    sub(rax, j_);
    jle(done, T_NEAR);
    mov(edi, 0xFFFF);
    bzhi(edi, edi, eax);
    kmovw(k1, edi);
    vmovdqu16(Ymm(1) | k1 | T_z, ptr[x_ + j_ * 2]);  // never past the row
    vpmovzxwd(v, Ymm(1));
    quantize(v);
    vpmovdb(ptr[out_ + j_] | k1, v);
    L(done);
  }

  static constexpr int kInvSlot = 0, kScaleSlot = 4, kFrame = 8;

  void generate() {
    push_callee_saved();
    sub(rsp, kFrame);
    mov(rows_, arg(offsetof(ActQuantArgs, rows)));
    Xbyak::Label row_loop, nonfinite, row_done, done;
    test(rows_, rows_);
    jle(done, T_NEAR);
    mov(x_, arg(offsetof(ActQuantArgs, x)));
    mov(ldx_, arg(offsetof(ActQuantArgs, ldx)));
    add(ldx_, ldx_);  // bytes
    mov(k_, arg(offsetof(ActQuantArgs, k)));
    mov(kp_, arg(offsetof(ActQuantArgs, k_padded)));
    mov(out_, arg(offsetof(ActQuantArgs, out)));
    mov(ld_out_, arg(offsetof(ActQuantArgs, ld_out)));
    mov(scale_, arg(offsetof(ActQuantArgs, scale)));
    mov(zero_, arg(offsetof(ActQuantArgs, zero)));
    if (mode_ == ActQuantMode::fixed) {
      const auto f32_field = [this](size_t off) { return dword[rdi + static_cast<uint32_t>(off)]; };
      mov(eax, f32_field(offsetof(ActQuantArgs, inv_scale)));
      mov(dword[rsp + kInvSlot], eax);
      mov(eax, f32_field(offsetof(ActQuantArgs, fixed_scale)));
      mov(dword[rsp + kScaleSlot], eax);
      mov(fixed_zero_.cvt32(), f32_field(offsetof(ActQuantArgs, fixed_zero)));
    }
    broadcast(c_abs_, 0x7FFF7FFF);
    broadcast(c_neg512_, 0xC4000000);  // -512.0f
    broadcast(c_pos512_, 0x44000000);  // 512.0f
    broadcast(c_lo_q_, mode_ == ActQuantMode::sym ? 1 : 0);
    broadcast(c_hi_q_, 255);
    if (mode_ == ActQuantMode::asym) broadcast(c_odd_, 0xFFFF0000);

    L(row_loop);
    range_pass();
    params(nonfinite);
    vmovss(dword[scale_], Xmm(5));
    mov(dword[zero_], z_.cvt32());
    quantize_pass();
    mov(j_, k_);
    jmp(row_done, T_NEAR);

    L(nonfinite);
    mov(dword[scale_], 0x7FC00000);  // quiet NaN
    mov(dword[zero_], z_.cvt32());
    vpbroadcastb(Xmm(0), z_.cvt8());
    xor_(j_, j_);
    fill(Xmm(0), k_);
    mov(j_, k_);

    L(row_done);
    vpxord(Xmm(0), Xmm(0), Xmm(0));
    fill(Xmm(0), kp_);
    add(x_, ldx_);
    add(out_, ld_out_);
    add(scale_, 4);
    add(zero_, 4);
    dec(rows_);
    jnz(row_loop, T_NEAR);

    L(done);
    vzeroupper();
    add(rsp, kFrame);
    pop_callee_saved();
    ret();
  }

  ActQuantMode mode_;
};

}  // namespace

std::vector<uint8_t> emit_act_quant(const ActQuantDesc& d) {
  ActQuantKernel g(d);
  return g.finish();
}

}  // namespace tilejit::codegen::xbyak
