// The ISA lattice: usable = CPUID and OS permission, capped by TILEJIT_ISA.
#pragma once

#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// Best path the hardware and OS allow.
Isa max_supported_isa();
// The active path: min(max_supported_isa(), TILEJIT_ISA). Read once.
Isa active_isa();
// Parses "amx" | "avx512" | "llvm" | "scalar"; throws Error naming `what` otherwise.
Isa parse_isa(const char* text, const char* what);

// Which code generator serves a path: Xbyak for AMX and AVX-512, LLVM for the
// llvm path. TILEJIT_BACKEND=llvm moves a JIT path onto LLVM (where the CPU
// can run it); TILEJIT_BACKEND=xbyak forbids the LLVM path.
enum class Backend { any, xbyak, llvm };
Backend backend_choice();  // TILEJIT_BACKEND, read once; Error on a bad value

}  // namespace tilejit::runtime
