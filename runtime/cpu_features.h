// CPU feature detection (CPUID + XCR0) and the Linux AMX permission request.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

namespace tilejit::runtime {

// The CPU features kernels are selected on, as bits of a FeatureSet. Each
// bit means "usable": the CPUID bit and the OS state it needs (XCR0, the AMX
// permission; emulated AMX counts as usable).
enum class Feature : uint32_t {
  avx2,
  fma,
  avx512f,
  avx512bw,
  avx512vl,
  avx512dq,
  avx512_bf16,
  avx512_fp16,
  avx512_vnni,
  avx512_vbmi,
  amx_tile,
  amx_bf16,
  amx_int8,
  count_
};
const char* feature_name(Feature f);

class FeatureSet {
 public:
  constexpr FeatureSet() = default;
  constexpr FeatureSet(std::initializer_list<Feature> fs) {
    for (Feature f : fs) bits_ |= bit(f);
  }
  constexpr bool has(Feature f) const { return (bits_ & bit(f)) != 0; }
  constexpr bool contains(FeatureSet o) const { return (bits_ & o.bits_) == o.bits_; }
  constexpr FeatureSet operator|(FeatureSet o) const { return from_bits(bits_ | o.bits_); }
  constexpr FeatureSet operator&(FeatureSet o) const { return from_bits(bits_ & o.bits_); }
  constexpr FeatureSet without(FeatureSet o) const { return from_bits(bits_ & ~o.bits_); }
  constexpr bool operator==(const FeatureSet&) const = default;
  constexpr uint32_t bits() const { return bits_; }
  // "avx512f avx512bw ..." ("none" when empty).
  std::string str() const;

 private:
  static constexpr uint32_t bit(Feature f) { return 1u << static_cast<uint32_t>(f); }
  static constexpr FeatureSet from_bits(uint32_t b) {
    FeatureSet s;
    s.bits_ = b;
    return s;
  }
  uint32_t bits_ = 0;
};

struct CpuFeatures {
  std::string vendor;
  bool avx2 = false, fma = false;  // with YMM state enabled in XCR0
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512_bf16 = false, avx512_fp16 = false, avx512_vnni = false, avx512_vbmi = false;
  bool amx_tile = false, amx_bf16 = false, amx_int8 = false;
  bool os_avx512 = false;      // XCR0 enables opmask + ZMM state
  bool os_amx_xcr0 = false;    // XCR0 enables XTILECFG + XTILEDATA
  bool amx_permitted = false;  // arch_prctl(ARCH_REQ_XCOMP_PERM) granted
  // AMX instructions run under the test-support emulator (TILEJIT_AMX_EMULATE,
  // see register_amx_emulator): the AMX path is usable, the permission is not
  // requested (so that on an AMX CPU the instructions trap).
  bool amx_emulated = false;
};

// Detected once (thread-safe); the AMX permission is requested at most once.
const CpuFeatures& cpu_features();
// cpu_features() as a set of usable features.
FeatureSet detected_features();

// Identifies the CPU for on-disk caches: vendor, family/model/stepping and the
// feature bits the emitters depend on, e.g. "AuthenticAMD-25-17-1-f1bw1vl1bf161fp160amx000".
std::string cpu_signature();

// Whether vdpbf16ps zmm issues at about the rate of an FMA (AMD Zen 4 / 5:
// one slot), rather than taking two cycles of both FMA ports (the Intel
// Xeons measured): the fused int4 decode kernel then multiplies bf16 pairs
// (BrgemmDesc::u4_bf16_dot) instead of converting A to f32 for FMAs.
bool bf16_dot_at_fma_rate(const CpuFeatures& f);

// Whether the Xbyak fused quantized decode kernel runs on this CPU: its int4
// codes come from vpmultishiftqb (AVX512-VBMI: every AVX512-BF16 CPU but
// Cooper Lake has it). Without it the amx / avx512 paths take the dequant
// route at every M (ops::quant_gemm_fused), and a tuned u4_dot has nothing
// to apply to.
bool xbyak_fused_quant_kernel(const CpuFeatures& f);

// TILEJIT_AMX_EMULATE: 0 or unset (off), 1 (emulate), auto (emulate where
// the CPU/OS cannot run AMX natively). Any other value throws tilejit::Error.
enum class AmxEmulation { off, on, automatic };
AmxEmulation amx_emulation_choice();

// Test support: an AMX emulator linked into the binary (tests/support/
// amx_emulator.cpp, never part of the library) registers its installer from
// a static constructor. cpu_features() calls it once when TILEJIT_AMX_EMULATE
// asks for emulation; it returns whether the emulator is in place.
using AmxEmulatorInstaller = bool (*)();
void register_amx_emulator(AmxEmulatorInstaller install);

// Requests XTILEDATA permission for the process. Idempotent and thread-safe;
// returns whether tile instructions may be executed. Under emulation it
// returns false without asking: a granted permission would make every tile
// instruction run natively, bypassing the emulator for the whole process.
bool request_amx_permission();

}  // namespace tilejit::runtime
