// An AMX emulator for tests: runs tilejit's AMX kernels on a CPU without AMX
// (every tile instruction raises #UD there), and on an AMX CPU whose process
// did not ask for the XTILEDATA permission, so the emulator can be checked
// against the hardware it stands in for.
//
// A SIGILL handler decodes the instruction at the faulting RIP
// (amx_emulator_decode.h), executes it on this thread's emulated tile state
// (amx_emulator_execute.h) with the Intel SDM semantics, and steps over it.
// Where hardware would fault (#GP at LDTILECFG, #UD at a tile operation) it
// prints the instruction, its address and the rule that failed, and aborts:
// a crash, as on hardware, but one that says why.
//
// Switched on by TILEJIT_AMX_EMULATE (runtime/cpu_features.cpp): 1 always,
// auto where the CPU/OS cannot run AMX natively. Linking this code into a
// binary only registers the installer with the runtime; nothing changes
// unless the variable asks for it. It is never part of libtilejit.
//
// Semantics: the SDM's, where the hardware agrees; where it does not, the
// hardware's (amx_emulator_test compares bit for bit on an AMX CPU): NaN
// selection (the SDM is silent) and TDPFP16PS's accumulation order (see
// amx_emulator_execute.cpp).
//
// What traps on an AMX CPU without the permission (measured on an Intel Xeon
// with AMX-BF16/INT8/FP16, Linux 6.18; experiments behind the comment, the
// AmxLoadStore.* and AmxFaults.* tests check the consequences):
// Linux arms XFD for XTILEDATA, so every instruction that touches tile data
// (TILEZERO, TILELOADD(T1), TILESTORED, TDP*) raises #NM, delivered as
// SIGILL at the instruction (ILL_ILLOPC the first time; later ones arrive
// as ILL_ILLOPN because the signal frame holds the tile state in its init
// form). LDTILECFG, STTILECFG and TILERELEASE touch only XTILECFG, which XFD
// does not cover: they run natively, with the hardware's own #GP checks.
// So on such a CPU the configuration lives in hardware: the handler reads it
// from the XSAVE image in the signal frame. To see whether an LDTILECFG ran
// since the last emulated instruction (it zeroes every tile), the handler
// leaves a marker in TILECFG.start_row of the frame (restored by sigreturn;
// LDTILECFG does not check start_row, and neither does XRSTOR): a config
// without the marker was loaded afresh. The one visible difference: a
// native STTILECFG stores start_row = 0xA5 instead of 0.
//
// Speed: one signal round trip per instruction, ~3.5 us (tilezero,
// tileloadd) to ~4.3 us (tdpbf16ps 16x16x32) here, ~230-280 k instructions/s
// (amx_emulator_test's AmxSpeed). Fast enough: every amx ctest variant
// together emulates ~6.5 M instructions in ~50 s on 2 cores, so the known
// speedup (patching the trapped instruction into a jump to a stub) is not
// done. TILEJIT_AMX_EMULATE_STATS=1 prints the count at exit.
#pragma once

#include <cstdint>

namespace tilejit::test::amx {

// Installs the handler (idempotent, thread-safe); chains to whatever SIGILL
// handler was there before for faults that are not AMX instructions. Returns
// false, with a line on stderr, where the executor cannot run (it needs
// AVX-512F/BW). Normally called by the runtime (TILEJIT_AMX_EMULATE).
bool install_emulator();
bool emulator_installed();

// AMX instructions emulated so far, all threads.
uint64_t emulated_instructions();

// True on an AMX CPU without the permission: LDTILECFG/STTILECFG/TILERELEASE
// run natively and the configuration is read from the signal frame.
bool config_in_hardware();

// The marker left in TILECFG.start_row (see above).
constexpr uint8_t kStartRowMarker = 0xA5;

}  // namespace tilejit::test::amx
