#include "runtime/isa.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/cpu_features.h"

namespace tilejit::runtime {

Isa parse_isa(const char* text, const char* what) {
  if (std::strcmp(text, "amx") == 0) return Isa::amx;
  if (std::strcmp(text, "avx512") == 0) return Isa::avx512;
  if (std::strcmp(text, "scalar") == 0) return Isa::scalar;
  throw Error(std::string(what) + "='" + text + "' is not an ISA path; allowed: amx, avx512, scalar");
}

Isa max_supported_isa() {
  const CpuFeatures& f = cpu_features();
  // The AVX-512 path needs vdpbf16ps (AVX512-BF16) plus BW/VL for masked 16-bit stores.
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512_bf16;
  if (avx512 && f.amx_tile && f.amx_bf16 && f.amx_permitted) return Isa::amx;
  if (avx512) return Isa::avx512;
  return Isa::scalar;
}

Isa active_isa() {
  static const Isa isa = [] {
    Isa best = max_supported_isa();
    const char* env = std::getenv("TILEJIT_ISA");
    if (env == nullptr || *env == '\0') return best;
    Isa cap = parse_isa(env, "TILEJIT_ISA");
    return cap < best ? cap : best;
  }();
  return isa;
}

}  // namespace tilejit::runtime
