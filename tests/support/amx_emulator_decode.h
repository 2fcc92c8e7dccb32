// Decoder of the AMX instructions (test support, see amx_emulator.h): the
// bytes at a faulting RIP to an operation, its tile registers and its memory
// operand, with the encoding rules hardware enforces by #UD.
#pragma once

#include <cstdint>

namespace tilejit::test::amx {

enum class Op : uint8_t {
  ldtilecfg,
  sttilecfg,
  tilerelease,
  tilezero,
  tileloadd,
  tileloaddt1,
  tilestored,
  tdpbf16ps,
  tdpfp16ps,
  tdpbssd,
  tdpbsud,
  tdpbusd,
  tdpbuud,
};

const char* op_name(Op op);

// A general register number in x86 encoding order (0 = rax ... 4 = rsp ...
// 15 = r15), or one of these.
constexpr int kNoReg = -1;
constexpr int kRipReg = 16;

// base + (index << scale) + disp. For the tile loads and stores the index is
// the row stride (no index: stride 0); RIP-relative addresses are relative
// to the end of the instruction.
struct MemOperand {
  int base = kNoReg;
  int index = kNoReg;
  int scale = 0;
  int32_t disp = 0;
};

struct Insn {
  Op op = Op::tilerelease;
  int length = 0;  // bytes, so the emulator can step over it
  // Tile registers: the ModRM.reg operand (destination, or the source of
  // TILESTORED), ModRM.rm (src1 of TDP*) and VEX.vvvv (src2 of TDP*).
  int reg = 0, rm = 0, vvvv = 0;
  bool has_mem = false;
  MemOperand mem;
};

enum class DecodeResult {
  ok,
  not_amx,  // some other instruction: not ours to handle
  invalid,  // an AMX opcode in a form hardware refuses with #UD
};

// Decodes the instruction at `code`. Reads only bytes the instruction
// occupies (so stops after the first byte of anything that is not a 3-byte
// VEX). On `invalid`, *why names the rule.
DecodeResult decode(const uint8_t* code, Insn* out, const char** why);

}  // namespace tilejit::test::amx
