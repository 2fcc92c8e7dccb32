#include "tests/support/amx_emulator_decode.h"

namespace tilejit::test::amx {

const char* op_name(Op op) {
  switch (op) {
    case Op::ldtilecfg:
      return "LDTILECFG";
    case Op::sttilecfg:
      return "STTILECFG";
    case Op::tilerelease:
      return "TILERELEASE";
    case Op::tilezero:
      return "TILEZERO";
    case Op::tileloadd:
      return "TILELOADD";
    case Op::tileloaddt1:
      return "TILELOADDT1";
    case Op::tilestored:
      return "TILESTORED";
    case Op::tdpbf16ps:
      return "TDPBF16PS";
    case Op::tdpfp16ps:
      return "TDPFP16PS";
    case Op::tdpbssd:
      return "TDPBSSD";
    case Op::tdpbsud:
      return "TDPBSUD";
    case Op::tdpbusd:
      return "TDPBUSD";
    case Op::tdpbuud:
      return "TDPBUUD";
  }
  return "?";
}

namespace {

DecodeResult fail(const char** why, const char* text) {
  *why = text;
  return DecodeResult::invalid;
}

}  // namespace

DecodeResult decode(const uint8_t* code, Insn* out, const char** why) {
  *why = "";
  // Every AMX instruction is 3-byte VEX: C4, then ~R ~X ~B m-mmmm, then
  // W ~vvvv L pp, then the opcode. Map 0F38 is m-mmmm = 00010.
  if (code[0] != 0xC4) return DecodeResult::not_amx;
  const uint8_t p1 = code[1];
  if ((p1 & 0x1F) != 0x02) return DecodeResult::not_amx;
  const uint8_t p2 = code[2];
  const uint8_t opcode = code[3];
  if (opcode != 0x49 && opcode != 0x4B && opcode != 0x5C && opcode != 0x5E)
    return DecodeResult::not_amx;
  const int vex_r = (~p1 >> 7) & 1, vex_x = (~p1 >> 6) & 1, vex_b = (~p1 >> 5) & 1;
  const int w = p2 >> 7, l = (p2 >> 2) & 1, pp = p2 & 3;
  const int vvvv = (~p2 >> 3) & 0xF;
  // Opcodes 49/4B/5C/5E of map 0F38 with W1 or L1 are not other
  // instructions either: hardware refuses them.
  if (w != 0) return fail(why, "VEX.W must be 0");
  if (l != 0) return fail(why, "VEX.L must be 0");

  const uint8_t modrm = code[4];
  const int mod = modrm >> 6, reg3 = (modrm >> 3) & 7, rm3 = modrm & 7;
  Insn in;
  int len = 5;
  in.has_mem = mod != 3;
  if (in.has_mem) {
    MemOperand& m = in.mem;
    bool disp32 = mod == 2;
    if (rm3 == 4) {
      const uint8_t sib = code[len++];
      m.scale = sib >> 6;
      const int index = ((sib >> 3) & 7) | (vex_x << 3);
      m.index = index == 4 ? kNoReg : index;  // SIB index 100 without VEX.X: none
      const int base3 = sib & 7;
      if (base3 == 5 && mod == 0) {
        m.base = kNoReg;  // [index*s + disp32]
        disp32 = true;
      } else {
        m.base = base3 | (vex_b << 3);
      }
    } else if (rm3 == 5 && mod == 0) {
      m.base = kRipReg;  // [rip + disp32]
      disp32 = true;
    } else {
      m.base = rm3 | (vex_b << 3);
    }
    if (mod == 1) {
      m.disp = static_cast<int8_t>(code[len]);
      len += 1;
    } else if (disp32) {
      uint32_t d = 0;
      for (int i = 0; i < 4; ++i) d |= uint32_t(code[len + i]) << (8 * i);
      m.disp = static_cast<int32_t>(d);
      len += 4;
    }
  }
  in.length = len;
  // Only tmm0..tmm7 exist: a register operand with the VEX extension bit set
  // is #UD (checked on hardware for VEX.R; taken to hold for B and vvvv too).
  auto tile_reg = [&](int low3, int ext) { return ext ? -1 : low3; };
  auto need_vvvv_unused = [&]() { return vvvv == 0; };  // encoded 1111

  switch (opcode) {
    case 0x49:
      if (in.has_mem) {
        if (pp != 0 && pp != 1) return fail(why, "opcode 49 with a memory operand needs pp 0 or 1");
        if (reg3 != 0 || vex_r) return fail(why, "LDTILECFG/STTILECFG need ModRM.reg = 0");
        if (!need_vvvv_unused()) return fail(why, "VEX.vvvv must be 1111");
        in.op = pp == 0 ? Op::ldtilecfg : Op::sttilecfg;
      } else if (pp == 0) {
        if (modrm != 0xC0 || vex_r || vex_b) return fail(why, "TILERELEASE must be ModRM C0");
        if (!need_vvvv_unused()) return fail(why, "VEX.vvvv must be 1111");
        in.op = Op::tilerelease;
      } else if (pp == 3) {
        if (rm3 != 0 || vex_b) return fail(why, "TILEZERO needs ModRM.rm = 0");
        if (!need_vvvv_unused()) return fail(why, "VEX.vvvv must be 1111");
        in.op = Op::tilezero;
        in.reg = tile_reg(reg3, vex_r);
        if (in.reg < 0) return fail(why, "tile register above tmm7");
      } else {
        return fail(why, "opcode 49 register form needs pp 0 or 3");
      }
      break;
    case 0x4B:
      if (!in.has_mem) return fail(why, "tile load/store needs a memory operand");
      if (rm3 != 4) return fail(why, "tile load/store needs SIB addressing (sibmem)");
      if (!need_vvvv_unused()) return fail(why, "VEX.vvvv must be 1111");
      if (pp == 3) {
        in.op = Op::tileloadd;
      } else if (pp == 1) {
        in.op = Op::tileloaddt1;
      } else if (pp == 2) {
        in.op = Op::tilestored;
      } else {
        return fail(why, "opcode 4B needs pp 1, 2 or 3");
      }
      in.reg = tile_reg(reg3, vex_r);
      if (in.reg < 0) return fail(why, "tile register above tmm7");
      break;
    case 0x5C:
    case 0x5E:
      if (in.has_mem) return fail(why, "tile dot product takes register operands only");
      if (opcode == 0x5C) {
        if (pp == 2) {
          in.op = Op::tdpbf16ps;
        } else if (pp == 3) {
          in.op = Op::tdpfp16ps;
        } else {
          return fail(why, "opcode 5C needs pp 2 or 3");
        }
      } else {
        static constexpr Op kInt8[4] = {Op::tdpbuud, Op::tdpbusd, Op::tdpbsud, Op::tdpbssd};
        in.op = kInt8[pp];
      }
      in.reg = tile_reg(reg3, vex_r);
      in.rm = tile_reg(rm3, vex_b);
      in.vvvv = tile_reg(vvvv & 7, vvvv >> 3);
      if (in.reg < 0 || in.rm < 0 || in.vvvv < 0) return fail(why, "tile register above tmm7");
      break;
  }
  *out = in;
  return DecodeResult::ok;
}

}  // namespace tilejit::test::amx
