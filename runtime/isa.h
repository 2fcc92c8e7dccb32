// The ISA lattice, as CPU features × code generator.
//
// What a kernel may use is a FeatureSet (runtime/cpu_features.h): the CPUID
// bits the OS lets us use. Which program makes it is a Backend. The public
// `Isa` is a view of the pair that names the paths users pick with
// TILEJIT_ISA: amx and avx512 are Xbyak code needing those features, llvm is
// LLVM code for the host (needing AVX2 + FMA), scalar is the C++ reference.
// The active path is the best one whose features are usable, capped by
// TILEJIT_ISA and adjusted by TILEJIT_BACKEND.
#pragma once

#include "runtime/cpu_features.h"
#include "tilejit/tilejit.h"

namespace tilejit::runtime {

enum class Backend { reference, xbyak, llvm };
const char* backend_name(Backend b);

// The features a path's kernels need, and the backend that makes them.
FeatureSet isa_features(Isa isa);
Backend isa_backend(Isa isa);

// Best path the hardware and OS allow.
Isa max_supported_isa();
// The active path: min(max_supported_isa(), TILEJIT_ISA). Read once.
Isa active_isa();
// The features the operators' kernels may use: CPUID ∧ OS permission
// (detected_features) ∧ the TILEJIT_ISA cap, i.e. the features of the
// active path and the paths below it.
FeatureSet usable_features();
// Parses "amx" | "avx512" | "llvm" | "scalar"; throws Error naming `what` otherwise.
Isa parse_isa(const char* text, const char* what);

// TILEJIT_BACKEND=llvm moves a JIT path onto LLVM (where the CPU can run it);
// TILEJIT_BACKEND=xbyak forbids the LLVM path.
enum class BackendChoice { any, xbyak, llvm };
BackendChoice backend_choice();  // TILEJIT_BACKEND, read once; Error on a bad value

}  // namespace tilejit::runtime
