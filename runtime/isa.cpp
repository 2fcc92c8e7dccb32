#include "runtime/isa.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/cpu_features.h"

namespace tilejit::runtime {

Isa parse_isa(const char* text, const char* what) {
  if (std::strcmp(text, "amx") == 0) return Isa::amx;
  if (std::strcmp(text, "avx512") == 0) return Isa::avx512;
  if (std::strcmp(text, "llvm") == 0) return Isa::llvm;
  if (std::strcmp(text, "scalar") == 0) return Isa::scalar;
  throw Error(std::string(what) + "='" + text +
              "' is not an ISA path; allowed: amx, avx512, llvm, scalar");
}

Backend backend_choice() {
  static const Backend b = [] {
    const char* env = std::getenv("TILEJIT_BACKEND");
    if (env == nullptr || *env == '\0') return Backend::any;
    if (std::strcmp(env, "xbyak") == 0) return Backend::xbyak;
    if (std::strcmp(env, "llvm") == 0) return Backend::llvm;
    throw Error(std::string("TILEJIT_BACKEND='") + env +
                "' is not a backend; allowed: xbyak, llvm");
  }();
  return b;
}

Isa max_supported_isa() {
  const CpuFeatures& f = cpu_features();
  // The AVX-512 path needs vdpbf16ps (AVX512-BF16) plus BW/VL for masked 16-bit stores.
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16;
  // Emulated AMX (TILEJIT_AMX_EMULATE) counts as present, on any CPU.
  const bool amx = (f.amx_tile && f.amx_bf16 && f.amx_permitted) || f.amx_emulated;
  if (avx512 && amx) return Isa::amx;
  if (avx512) return Isa::avx512;
#ifdef TILEJIT_HAVE_LLVM
  // The LLVM kernels are portable vector code; below AVX2 + FMA they would be
  // slower than worth a compile.
  if (f.avx2 && f.fma) return Isa::llvm;
#endif
  return Isa::scalar;
}

Isa active_isa() {
  static const Isa isa = [] {
    Isa path = max_supported_isa();
    const char* env = std::getenv("TILEJIT_ISA");
    if (env != nullptr && *env != '\0') path = std::min(path, parse_isa(env, "TILEJIT_ISA"));
#ifndef TILEJIT_HAVE_LLVM
    if (path == Isa::llvm) path = Isa::scalar;  // capped at a path this build lacks
#endif
    switch (backend_choice()) {
      case Backend::any:
        break;
      case Backend::xbyak:
        if (path == Isa::llvm) path = Isa::scalar;
        break;
      case Backend::llvm:
#ifdef TILEJIT_HAVE_LLVM
        if (path > Isa::llvm) path = Isa::llvm;
#else
        throw Error(
            "TILEJIT_BACKEND='llvm' but this tilejit was built without LLVM; allowed: xbyak");
#endif
        break;
    }
    return path;
  }();
  return isa;
}

}  // namespace tilejit::runtime
