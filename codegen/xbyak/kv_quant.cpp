// AVX-512 kv_quant kernel (KvQuantArgs, codegen/kv_quant_desc.h): one token's
// bf16 K or V rows -> e4m3 or e5m2 cache bytes, 16 elements a step (a masked
// step for the tail: nothing past a row is read or written).
//
// The steps are runtime::f32_to_fp8's branch-free rule in 16 lanes, with the
// format's constants (runtime::Fp8Format; e4m3's shown, e5m2's: 21, 2^-14,
// 65536, 57344, 0x7B):
//   x = bf16 << 16;  q = x / s  (vdivps);  a = |q| bits; sign = q >> 24 & 0x80
//   normal    (r >> 20) − 960 with r = a + 0x7FFFF + (a >> 20 & 1)  (mantissa to 3 bits, RNE;
//             the exponent rebiased from 127 to 7)
//   a < 2^-6  m = rne(|q| · 512) (vcvtps2dq {rn-sae}: exact, 0..8)    (subnormal codes)
//   a >= 448  0x7E (±Inf too);  then | sign;  a NaN: 0x7F
// vpmovdb stores the 16 codes. The division is the cost (one vdivps per 16
// codes); the rest is integer work on the four vector ports. A power-of-two
// scale (1.0 among them) multiplies by its exact reciprocal instead: the
// same quotient, bit for bit, at the multiply's rate.
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "codegen/kv_quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "codegen/xbyak/jit_generator.h"
#include "runtime/quant_formats.h"

namespace tilejit::codegen::xbyak {
namespace {

using namespace Xbyak::util;
using Xbyak::Zmm;

class KvQuantKernel : public JitGenerator {
 public:
  explicit KvQuantKernel(const runtime::Fp8Format& f) : f_(f) { generate(); }

 private:
  const Xbyak::Reg64 x_ = r8, x_head_ = r9, out_ = r10, out_head_ = r11, scales_ = rdx,
                     heads_ = rsi, d_ = rbx, j_ = rax, t_ = rcx;
  const runtime::Fp8Format f_;
  const int shift_ = 23 - f_.man_bits;  // f32 mantissa bits below the code's
  // Constants (zmm16+), the head's scale and the step's temporaries (zmm0..4).
  const Zmm c_abs_ = Zmm(16), c_one_ = Zmm(17), c_round_ = Zmm(18), c_bias_ = Zmm(19),
            c_sub_ = Zmm(20), c_512_ = Zmm(21), c_sat_ = Zmm(22), c_7e_ = Zmm(23), c_inf_ = Zmm(24),
            c_7f_ = Zmm(25), c_sign_ = Zmm(26), scale_ = Zmm(27);

  void broadcast(const Zmm& z, uint32_t v) {
    mov(t_.cvt32(), v);
    vpbroadcastd(z, t_.cvt32());
  }

  // 16 codes from x_ + 2·j_ to out_ + j_ (under k1 when masked); `mul`:
  // scale_ holds 1/s of a power-of-two s, and x·(1/s) is x/s exactly.
  void step(bool masked, bool mul) {
    const Zmm q = Zmm(0), a = Zmm(1), sign = Zmm(2), code = Zmm(3), m = Zmm(4);
    if (masked)
      vpmovzxwd(q | k1 | T_z, ptr[x_ + j_ * 2]);
    else
      vpmovzxwd(q, ptr[x_ + j_ * 2]);
    vpslld(q, q, 16);
    if (mul)
      vmulps(q, q, scale_);  // the same exact value, so the same rounding
    else
      vdivps(q, q, scale_);  // MXCSR's rounding, as the reference's division
    vpandd(a, q, c_abs_);
    vpsrld(sign, q, 24);
    vpandd(sign, sign, c_sign_);
    // Normal codes.
    vpsrld(code, a, shift_);
    vpandd(code, code, c_one_);
    vpaddd(code, code, a);
    vpaddd(code, code, c_round_);
    vpsrld(code, code, shift_);
    vpsubd(code, code, c_bias_);
    // Subnormal codes (|q| below the least normal), exact: |q|·sub_scale
    // < 2^man_bits rounded to an integer.
    vpcmpud(k2, a, c_sub_, 1);  // a < normal_bits
    vmulps(m, a, c_512_);
    vcvtps2dq(code | k2, m | T_rn_sae);
    vpcmpud(k3, a, c_sat_, 5);  // a >= max_bits: saturate, ±Inf and NaN included
    vmovdqa32(code | k3, c_7e_);
    vpord(code, code, sign);
    vpcmpud(k4, a, c_inf_, 6);  // a > 0x7F800000: NaN
    vmovdqa32(code | k4, c_7f_);
    if (masked)
      vpmovdb(ptr[out_ + j_] | k1, code);
    else
      vpmovdb(ptr[out_ + j_], code);
  }

  // One head's row: full 16-lane steps, then the masked tail.
  void row(bool mul) {
    Xbyak::Label loop, tail, end;
    xor_(j_, j_);
    L(loop);
    lea(t_, ptr[j_ + 16]);
    cmp(t_, d_);
    jg(tail, T_NEAR);
    step(false, mul);
    mov(j_, t_);
    jmp(loop, T_NEAR);
    L(tail);
    mov(t_, d_);
    sub(t_, j_);
    jle(end, T_NEAR);
    // k1 = the low (d − j) < 16 lanes (rdi: the arguments are loaded).
    mov(edi, 1);
    shlx(edi, edi, t_.cvt32());
    dec(edi);
    kmovw(k1, edi);
    step(true, mul);
    L(end);
  }

  void generate() {
    push(rbx);
    mov(x_, arg(offsetof(KvQuantArgs, x)));
    mov(x_head_, arg(offsetof(KvQuantArgs, x_head)));
    add(x_head_, x_head_);  // bytes
    mov(out_, arg(offsetof(KvQuantArgs, out)));
    mov(out_head_, arg(offsetof(KvQuantArgs, out_head)));
    mov(scales_, arg(offsetof(KvQuantArgs, scales)));
    mov(heads_, arg(offsetof(KvQuantArgs, heads)));
    mov(d_, arg(offsetof(KvQuantArgs, d)));
    broadcast(c_abs_, 0x7FFFFFFFu);
    broadcast(c_one_, 1);
    broadcast(c_round_, (1u << (shift_ - 1)) - 1);
    broadcast(c_bias_, static_cast<uint32_t>(127 - f_.bias) << f_.man_bits);
    broadcast(c_sub_, f_.normal_bits);
    uint32_t sub_scale_bits;
    std::memcpy(&sub_scale_bits, &f_.sub_scale, 4);
    broadcast(c_512_, sub_scale_bits);
    broadcast(c_sat_, f_.max_bits);
    broadcast(c_7e_, f_.max_code);
    broadcast(c_inf_, 0x7F800000u);
    broadcast(c_7f_, 0x7F);
    broadcast(c_sign_, 0x80);

    Xbyak::Label head, div_row, next, done;
    test(heads_, heads_);
    jle(done, T_NEAR);
    L(head);
    // A power-of-two scale 2^(e − 127) with e in [1, 253] (1.0, sglang's
    // default, among them): 1/s = 2^(127 − e) is a normal float, and x·(1/s)
    // the exact x/s, so a multiply (several per cycle) replaces the divide
    // (the step's bound). Any other scale divides.
    mov(eax, dword[scales_]);
    mov(ecx, eax);
    and_(ecx, 0x7FFFFF);
    jnz(div_row, T_NEAR);
    mov(ecx, eax);
    shr(ecx, 23);
    and_(ecx, 0xFF);
    dec(ecx);  // e − 1, in [0, 252] when e is in [1, 253]
    cmp(ecx, 252);
    ja(div_row, T_NEAR);
    mov(edi, 253);  // the exponent field of 1/s: 254 − e
    sub(edi, ecx);
    shl(edi, 23);
    and_(eax, 0x80000000u);
    or_(eax, edi);
    vpbroadcastd(scale_, eax);
    row(true);
    jmp(next, T_NEAR);
    L(div_row);
    vbroadcastss(scale_, dword[scales_]);
    row(false);
    L(next);
    add(x_, x_head_);
    add(out_, out_head_);
    add(scales_, 4);
    dec(heads_);
    jnz(head, T_NEAR);
    L(done);
    vzeroupper();
    pop(rbx);
    ret();
  }
};

}  // namespace

std::vector<uint8_t> emit_kv_quant(const KvQuantDesc& d) {
  const runtime::Fp8Format* f = runtime::fp8_format_of(d.code);
  if (!f)
    throw Error(std::string("kv_quant: code=") + dtype_name(d.code) + "; allowed: f8e4m3, f8e5m2");
  KvQuantKernel k(*f);
  return k.finish();
}

}  // namespace tilejit::codegen::xbyak
