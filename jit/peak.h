// The machine's measured bf16 peak, from the register-only JIT probes (no
// datasheet numbers): what "% of peak" means everywhere in tilejit (the
// benchmarks, `tilejit bench`, the main job).
#pragma once

#include "tilejit/tilejit.h"

namespace tilejit::jit {

// Median over `reps` runs of ~50 ms of the probe on the calling thread, in
// GFLOP/s, timed with the thread's CPU clock (the probe touches no memory, so
// CPU time is the core's own speed, also on a busy machine). op = u8: the
// int8 peak (tdpbusd / vpdpbusd / vpmaddwd), in int8 GOP/s. isa = amx runs
// the tile probe; any other the host's best vector dot product (vdpbf16ps or
// vfmadd231ps on zmm or ymm: what the avx512 and llvm kernels run).
double measure_peak_gflops(Isa isa, int reps = 7, DType op = DType::bf16);

// The per-core peak of the path `isa` (measure_peak_gflops, once per process
// and (isa, op)), or 0 where there is no hardware peak to measure: scalar,
// and AMX when it is emulated (the probe would crawl and mean nothing).
double path_peak_gflops(Isa isa, DType op = DType::bf16);

}  // namespace tilejit::jit
