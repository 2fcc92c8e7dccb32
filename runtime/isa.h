// The ISA lattice: usable = CPUID and OS permission, capped by TILEJIT_ISA.
#pragma once

#include "tilejit/tilejit.h"

namespace tilejit::runtime {

// Best path the hardware and OS allow.
Isa max_supported_isa();
// The active path: min(max_supported_isa(), TILEJIT_ISA). Read once.
Isa active_isa();
// Parses "amx" | "avx512" | "scalar"; throws Error naming TILEJIT_ISA otherwise.
Isa parse_isa(const char* text, const char* what);

}  // namespace tilejit::runtime
