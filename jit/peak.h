// The machine's measured bf16 peak, from the register-only JIT probes (no
// datasheet numbers): what "% of peak" means everywhere in tilejit.
#pragma once

#include "tilejit/tilejit.h"

namespace tilejit::jit {

// Median over `reps` runs of the probe on the calling thread, in GFLOP/s.
// op = u8: the int8 peak (tdpbusd / vpdpbusd), in int8 GOP/s.
double measure_peak_gflops(Isa isa, int reps = 5, DType op = DType::bf16);

}  // namespace tilejit::jit
