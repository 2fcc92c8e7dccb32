// x86-64 disassembly of a machine-code buffer with LLVM's MC layer, behind an
// LLVM-free interface: `tilejit dump --stage asm` shows the bytes the Xbyak
// emitters produce (or any other code) without an external objdump.
//
//   std::string text = codegen::llvm_backend::disassemble(bytes.data(), bytes.size(), 0, "");
//
// Every line is "  <address>:  <hex bytes>  <instruction>"; bytes that do not
// decode print as "(bad)" and the listing goes on at the next byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tilejit::codegen::llvm_backend {

enum class AsmSyntax { intel, att };

// `address` is the address of code[0] as printed (branch targets are shown as
// addresses, so pass where the code runs, or 0 for offsets).
// `cpu_features_hint` is an LLVM feature string ("+avx512f,+amx-tile"); empty
// selects every feature the tilejit emitters use (AVX-512 BF16/FP16, AMX).
// Throws tilejit::Error when the X86 target is not in this LLVM build.
std::string disassemble(const uint8_t* code, size_t size, uint64_t address,
                        const std::string& cpu_features_hint, AsmSyntax syntax = AsmSyntax::intel);

}  // namespace tilejit::codegen::llvm_backend
