#include "runtime/isa.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/cpu_features.h"
#include "runtime/env_text.h"
#include "runtime/lazy_statics.h"

namespace tilejit::runtime {

Isa parse_isa(const char* text, const char* what) {
  if (std::strcmp(text, "amx") == 0) return Isa::amx;
  if (std::strcmp(text, "avx512") == 0) return Isa::avx512;
  if (std::strcmp(text, "llvm") == 0) return Isa::llvm;
  if (std::strcmp(text, "scalar") == 0) return Isa::scalar;
  throw Error(std::string(what) + "='" + shown_env_value(text) +
              "' is not an ISA path; allowed: amx, avx512, llvm, scalar");
}

BackendChoice backend_choice() {
  static const BackendChoice b = [] {
    const char* env = std::getenv("TILEJIT_BACKEND");
    if (env == nullptr || *env == '\0') return BackendChoice::any;
    if (std::strcmp(env, "xbyak") == 0) return BackendChoice::xbyak;
    if (std::strcmp(env, "llvm") == 0) return BackendChoice::llvm;
    throw Error(std::string("TILEJIT_BACKEND='") + shown_env_value(env) +
                "' is not a backend; allowed: xbyak, llvm");
  }();
  return b;
}

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::reference:
      return "reference";
    case Backend::xbyak:
      return "xbyak";
    case Backend::llvm:
      return "llvm";
  }
  return "?";
}

FeatureSet isa_features(Isa isa) {
  // The AVX-512 path needs vdpbf16ps (AVX512-BF16) plus BW/VL for masked
  // 16-bit stores, and vpdpbusd (AVX512-VNNI) for its W8A8 kernels; the AMX
  // path runs its small-M GEMMs and epilogues on it, and W8A8 on tdpbusd.
  // (Every CPU with AVX512-BF16 has VNNI, every AMX-BF16 one AMX-INT8.)
  constexpr FeatureSet avx512{Feature::avx512f, Feature::avx512bw, Feature::avx512vl,
                              Feature::avx512_bf16, Feature::avx512_vnni};
  switch (isa) {
    case Isa::amx:
      return avx512 | FeatureSet{Feature::amx_tile, Feature::amx_bf16, Feature::amx_int8};
    case Isa::avx512:
      return avx512;
    case Isa::llvm:
      // The LLVM kernels are portable vector code; below AVX2 + FMA they
      // would be slower than worth a compile.
      return {Feature::avx2, Feature::fma};
    case Isa::scalar:
      return {};
  }
  return {};
}

Backend isa_backend(Isa isa) {
  switch (isa) {
    case Isa::amx:
    case Isa::avx512:
      return Backend::xbyak;
    case Isa::llvm:
      return Backend::llvm;
    case Isa::scalar:
      return Backend::reference;
  }
  return Backend::reference;
}

Isa max_supported_isa() {
  const FeatureSet have = detected_features();
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::llvm}) {
#ifndef TILEJIT_HAVE_LLVM
    if (isa_backend(isa) == Backend::llvm) continue;
#endif
    if (have.contains(isa_features(isa))) return isa;
  }
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
      case BackendChoice::any:
        break;
      case BackendChoice::xbyak:
        if (path == Isa::llvm) path = Isa::scalar;
        break;
      case BackendChoice::llvm:
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

FeatureSet usable_features() {
  FeatureSet cap;
  for (Isa isa : {Isa::scalar, Isa::llvm, Isa::avx512, Isa::amx})
    if (isa <= active_isa()) cap = cap | isa_features(isa);
  return detected_features() & cap;
}

namespace {
const bool g_fork_hooks = on_fork_complete([] { (void)backend_choice(); }) &&
                          on_fork_complete([] { (void)active_isa(); }) &&
                          on_fork_complete([] { (void)usable_features(); });
}  // namespace

}  // namespace tilejit::runtime
