#include "runtime/cpu_features.h"

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "runtime/env_text.h"
#include "runtime/lazy_statics.h"
#include "tilejit/error.h"

namespace tilejit::runtime {
namespace {

struct Regs {
  uint32_t eax, ebx, ecx, edx;
};

Regs cpuid(uint32_t leaf, uint32_t sub = 0) {
  Regs r{};
  __cpuid_count(leaf, sub, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

uint64_t xgetbv0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

bool bit(uint32_t v, int b) {
  return (v >> b) & 1u;
}

// Linux arch_prctl codes; not in every libc's headers.
constexpr long kArchGetXcompPerm = 0x1022;
constexpr long kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool amx_granted_now() {
  uint64_t mask = 0;
  if (syscall(SYS_arch_prctl, kArchGetXcompPerm, &mask) != 0) return false;
  return (mask >> kXfeatureXtiledata) & 1u;
}

// Set once, from a static constructor of the binary, before anything runs.
AmxEmulatorInstaller g_amx_emulator = nullptr;

bool request_permission_once() {
  // Function-local static: the request runs once even if many threads race here.
  static const bool granted = [] {
    if (amx_granted_now()) return true;
    // Refused on kernels before 5.16 (EINVAL) and when some thread of the
    // process has a sigaltstack too small for the AMX signal frame (ENOSPC):
    // then the AMX path is not usable and the next path serves, said once.
    if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
      const int err = errno;
      std::fprintf(stderr,
                   "tilejit: AMX permission refused by the OS (arch_prctl(ARCH_REQ_XCOMP_PERM): "
                   "%s%s); using the next path\n",
                   std::strerror(err),
                   err == ENOSPC ? ": a thread's sigaltstack is too small for AMX state" : "");
      return false;
    }
    return amx_granted_now();
  }();
  return granted;
}

// Whether AMX is to be emulated, and the emulator is in place.
bool use_amx_emulator(const CpuFeatures& f) {
  const AmxEmulation choice = amx_emulation_choice();
  if (choice == AmxEmulation::off) return false;
  // auto: only where the CPU (CPUID) or the OS (XCR0) lacks AMX. Not decided
  // by requesting the permission: that would grant it to the whole process.
  const bool native = f.amx_tile && f.amx_bf16 && f.os_amx_xcr0;
  if (choice == AmxEmulation::automatic && native) return false;
  if (g_amx_emulator == nullptr) {
    std::fprintf(stderr,
                 "tilejit: TILEJIT_AMX_EMULATE=%s ignored: no AMX emulator is linked into this "
                 "binary (tests/support/amx_emulator)\n",
                 choice == AmxEmulation::on ? "1" : "auto");
    return false;
  }
  return g_amx_emulator();
}

CpuFeatures detect() {
  CpuFeatures f;
  Regs v = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor + 0, &v.ebx, 4);
  std::memcpy(vendor + 4, &v.edx, 4);
  std::memcpy(vendor + 8, &v.ecx, 4);
  f.vendor = vendor;
  const uint32_t max_leaf = v.eax;
  if (max_leaf < 7) return f;

  Regs l1 = cpuid(1);
  const bool osxsave = bit(l1.ecx, 27);
  const uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  // Bits 1,2 (SSE, AVX), 5,6,7 (opmask, ZMM_Hi256, Hi16_ZMM).
  f.os_avx512 = (xcr0 & 0xE6) == 0xE6;
  // Bits 17, 18 (XTILECFG, XTILEDATA).
  f.os_amx_xcr0 = (xcr0 & (3ull << 17)) == (3ull << 17);

  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  f.fma = bit(l1.ecx, 12) && os_ymm;
  Regs l7 = cpuid(7, 0);
  f.avx2 = bit(l7.ebx, 5) && os_ymm;
  f.avx512f = bit(l7.ebx, 16) && f.os_avx512;
  f.avx512dq = bit(l7.ebx, 17) && f.os_avx512;
  f.avx512bw = bit(l7.ebx, 30) && f.os_avx512;
  f.avx512vl = bit(l7.ebx, 31) && f.os_avx512;
  f.avx512_vnni = bit(l7.ecx, 11) && f.os_avx512;
  f.avx512_vbmi = bit(l7.ecx, 1) && f.os_avx512;
  f.avx512_fp16 = bit(l7.edx, 23) && f.os_avx512;
  f.amx_bf16 = bit(l7.edx, 22);
  f.amx_tile = bit(l7.edx, 24);
  f.amx_int8 = bit(l7.edx, 25);
  if (l7.eax >= 1) {
    Regs l71 = cpuid(7, 1);
    f.avx512_bf16 = bit(l71.eax, 5) && f.os_avx512;
  }
  f.amx_emulated = use_amx_emulator(f);
  if (!f.amx_emulated && f.amx_tile && f.os_amx_xcr0) f.amx_permitted = request_permission_once();
  return f;
}

}  // namespace

AmxEmulation amx_emulation_choice() {
  const char* env = std::getenv("TILEJIT_AMX_EMULATE");
  if (env == nullptr || *env == '\0' || std::strcmp(env, "0") == 0) return AmxEmulation::off;
  if (std::strcmp(env, "1") == 0) return AmxEmulation::on;
  if (std::strcmp(env, "auto") == 0) return AmxEmulation::automatic;
  throw Error(std::string("TILEJIT_AMX_EMULATE='") + shown_env_value(env) +
              "' is not an emulation mode; allowed: 0, 1, auto");
}

void register_amx_emulator(AmxEmulatorInstaller install) {
  g_amx_emulator = install;
}

bool request_amx_permission() {
  if (cpu_features().amx_emulated) return false;
  return request_permission_once();
}

bool bf16_dot_at_fma_rate(const CpuFeatures& f) {
  return f.vendor == "AuthenticAMD" && f.avx512_bf16;
}

bool xbyak_fused_quant_kernel(const CpuFeatures& f) {
  return f.avx512_vbmi;
}

std::string cpu_signature() {
  const CpuFeatures& f = cpu_features();
  const Regs l1 = cpuid(1);
  const uint32_t family = ((l1.eax >> 8) & 0xf) + ((l1.eax >> 20) & 0xff);
  const uint32_t model = ((l1.eax >> 4) & 0xf) | (((l1.eax >> 16) & 0xf) << 4);
  const uint32_t stepping = l1.eax & 0xf;
  auto b = [](bool v) { return v ? '1' : '0'; };
  std::string s = f.vendor + "-" + std::to_string(family) + "-" + std::to_string(model) + "-" +
                  std::to_string(stepping) + "-f";
  s += b(f.avx512f);
  s += "bw";
  s += b(f.avx512bw);
  s += "vl";
  s += b(f.avx512vl);
  s += "bf16";
  s += b(f.avx512_bf16);
  s += "fp16";
  s += b(f.avx512_fp16);
  s += "amx";
  s += b(f.amx_tile);
  s += b(f.amx_bf16);
  s += b(f.amx_int8);
  return s;
}

const CpuFeatures& cpu_features() {
  // Immortal (it holds strings): threads may outlive static destruction.
  static const CpuFeatures& f = *new CpuFeatures(detect());
  return f;
}

const char* feature_name(Feature f) {
  switch (f) {
    case Feature::avx2:
      return "avx2";
    case Feature::fma:
      return "fma";
    case Feature::avx512f:
      return "avx512f";
    case Feature::avx512bw:
      return "avx512bw";
    case Feature::avx512vl:
      return "avx512vl";
    case Feature::avx512dq:
      return "avx512dq";
    case Feature::avx512_bf16:
      return "avx512_bf16";
    case Feature::avx512_fp16:
      return "avx512_fp16";
    case Feature::avx512_vnni:
      return "avx512_vnni";
    case Feature::avx512_vbmi:
      return "avx512_vbmi";
    case Feature::amx_tile:
      return "amx_tile";
    case Feature::amx_bf16:
      return "amx_bf16";
    case Feature::amx_int8:
      return "amx_int8";
    case Feature::count_:
      break;
  }
  return "?";
}

std::string FeatureSet::str() const {
  std::string s;
  for (uint32_t i = 0; i < static_cast<uint32_t>(Feature::count_); ++i)
    if (has(static_cast<Feature>(i))) {
      if (!s.empty()) s += ' ';
      s += feature_name(static_cast<Feature>(i));
    }
  return s.empty() ? "none" : s;
}

FeatureSet detected_features() {
  static const FeatureSet set = [] {
    const CpuFeatures& f = cpu_features();
    // AMX state is usable natively with the permission, or under the emulator.
    const bool amx_os = f.amx_permitted || f.amx_emulated;
    FeatureSet s;
    auto add = [&](bool on, Feature x) {
      if (on) s = s | FeatureSet{x};
    };
    add(f.avx2, Feature::avx2);
    add(f.fma, Feature::fma);
    add(f.avx512f, Feature::avx512f);
    add(f.avx512bw, Feature::avx512bw);
    add(f.avx512vl, Feature::avx512vl);
    add(f.avx512dq, Feature::avx512dq);
    add(f.avx512_bf16, Feature::avx512_bf16);
    add(f.avx512_fp16, Feature::avx512_fp16);
    add(f.avx512_vnni, Feature::avx512_vnni);
    add(f.avx512_vbmi, Feature::avx512_vbmi);
    add((f.amx_tile && amx_os) || f.amx_emulated, Feature::amx_tile);
    add((f.amx_bf16 && amx_os) || f.amx_emulated, Feature::amx_bf16);
    add((f.amx_int8 && amx_os) || f.amx_emulated, Feature::amx_int8);
    return s;
  }();
  return set;
}

namespace {
const bool g_fork_hooks = on_fork_complete([] { (void)cpu_features(); }) &&
                          on_fork_complete([] { (void)detected_features(); });
}  // namespace

}  // namespace tilejit::runtime
