// Tests of the AMX emulator (tests/support/amx_emulator.h): every instruction
// encoded by Xbyak, run under the emulator and compared bit for bit with a
// scalar model written here from the Intel SDM pseudo-code (not sharing code
// with the emulator), and, on a CPU with AMX, with the hardware itself: a
// forked child asks for the XTILEDATA permission and runs the same code
// natively. This process never asks for it (the permission is process-wide
// and inherited by fork), so here every tile instruction traps.
//
// Its own main(): a "host" SIGILL handler is installed before the emulator,
// so the test of chaining has something to chain to.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>
#include <xbyak/xbyak.h>

#include <cpuid.h>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "runtime/cpu_features.h"
#include "tests/support/amx_emulator.h"
#include "tests/support/amx_emulator_decode.h"
#include "tests/support/amx_emulator_execute.h"
#include "tilejit/error.h"

namespace tilejit::test {
namespace {

using Bytes = std::vector<uint8_t>;
namespace emu = tilejit::test::amx;

// Xbyak 6.68 declares Xbyak::util::tmm0..7 as Zmm; these hide them.
const Xbyak::Tmm tmm0(0), tmm1(1), tmm2(2), tmm3(3), tmm4(4), tmm5(5), tmm6(6), tmm7(7);

// ---------------------------------------------------------------------------
// The host's own SIGILL handler, installed by main() before the emulator: it
// counts calls and steps over a ud2.

std::atomic<int> g_host_sigill_calls{0};

void host_sigill(int, siginfo_t* si, void* ctx) {
  g_host_sigill_calls.fetch_add(1);
  if (si->si_code > 0) {
    auto* uc = static_cast<ucontext_t*>(ctx);
    const auto* rip = reinterpret_cast<const uint8_t*>(uc->uc_mcontext.gregs[REG_RIP]);
    if (rip[0] == 0x0F && rip[1] == 0x0B) uc->uc_mcontext.gregs[REG_RIP] += 2;
  }
}

// ---------------------------------------------------------------------------
// Code under test: f(in, out), with rdi = in and rsi = out; rbx, rbp and
// r12..r15 are saved, so a body may use every general register but rsp.

using Fn = void (*)(uint8_t*, uint8_t*);

class Kernel : public Xbyak::CodeGenerator {
 public:
  explicit Kernel(const std::function<void(Kernel&)>& body) : Xbyak::CodeGenerator(1 << 16) {
    for (const auto& r : saved()) push(r);
    body(*this);
    for (auto it = saved().rbegin(); it != saved().rend(); ++it) pop(*it);
    ret();
  }
  Fn fn() { return getCode<Fn>(); }

 private:
  static const std::vector<Xbyak::Reg64>& saved() {
    static const std::vector<Xbyak::Reg64> regs = {Xbyak::util::rbx, Xbyak::util::rbp,
                                                   Xbyak::util::r12, Xbyak::util::r13,
                                                   Xbyak::util::r14, Xbyak::util::r15};
    return regs;
  }
};

bool cpu_has_amx() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool tile = (d >> 24) & 1, bf16 = (d >> 22) & 1, int8 = (d >> 25) & 1;
  const auto& f = runtime::cpu_features();
  return tile && bf16 && int8 && f.os_amx_xcr0;
}

bool cpu_has_amx_fp16() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d) == 0) return false;
  return cpu_has_amx() && ((a >> 21) & 1);
}

#define SKIP_WITHOUT_AMX_HARDWARE() \
  if (!cpu_has_amx()) GTEST_SKIP() << "this CPU has no AMX: nothing to compare the emulator with"

// Runs f under the emulator, in this process.
Bytes run_emulated(Fn f, Bytes in, size_t out_bytes) {
  Bytes out(out_bytes, 0xEE);
  f(in.data(), out.data());
  return out;
}

// Runs f natively in a forked child that asks for the AMX permission; the
// output comes back through a pipe. An empty result means the child died
// (the reason is added as a test failure).
Bytes run_native(Fn f, Bytes in, size_t out_bytes) {
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe failed";
    return {};
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    if (syscall(SYS_arch_prctl, 0x1023 /*ARCH_REQ_XCOMP_PERM*/, 18 /*XTILEDATA*/) != 0) _exit(77);
    Bytes out(out_bytes, 0xEE);
    f(in.data(), out.data());
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = write(fds[1], out.data() + done, out.size() - done);
      if (n <= 0) _exit(78);
      done += static_cast<size_t>(n);
    }
    _exit(0);
  }
  close(fds[1]);
  Bytes out(out_bytes);
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = read(fds[0], out.data() + got, out.size() - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got != out.size()) {
    ADD_FAILURE() << "the native run died: "
                  << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                          : "exit " + std::to_string(WEXITSTATUS(status)));
    return {};
  }
  return out;
}

// First differing byte, as a readable message ("" when equal).
std::string first_difference(const Bytes& want, const Bytes& got, size_t row_bytes = 64) {
  if (want.size() != got.size()) return "sizes differ";
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != got[i]) {
      const size_t at = i & ~size_t{3};
      uint32_t w = 0, g = 0;
      std::memcpy(&w, want.data() + at, std::min<size_t>(4, want.size() - at));
      std::memcpy(&g, got.data() + at, std::min<size_t>(4, got.size() - at));
      char buf[160];
      std::snprintf(buf, sizeof buf, "byte %zu (row %zu, dword %zu): want %08x got %08x", i,
                    i / row_bytes, (i % row_bytes) / 4, w, g);
      return buf;
    }
  }
  return "";
}

// ---------------------------------------------------------------------------
// Tile configurations and the standard test layout of `in`:
//   [0, 64)   the config
//   [64, ...) tile data regions of kRegion bytes each, region r at
//             kData + r * kRegion (room for 16 rows at a stride of 128).

constexpr int kData = 64;
constexpr int kRegion = 16 * 128;
constexpr size_t kInBytes = kData + 4 * kRegion;

struct Shape {
  int rows, colsb;
};

Bytes config_bytes(std::initializer_list<std::pair<int, Shape>> tiles, int palette = 1) {
  Bytes c(64, 0);
  c[0] = static_cast<uint8_t>(palette);
  for (const auto& [t, s] : tiles) {
    c[16 + 2 * t] = static_cast<uint8_t>(s.colsb & 0xFF);
    c[17 + 2 * t] = static_cast<uint8_t>(s.colsb >> 8);
    c[48 + t] = static_cast<uint8_t>(s.rows);
  }
  return c;
}

Bytes make_input(const Bytes& cfg, uint32_t seed) {
  Bytes in(kInBytes);
  std::mt19937 rng(seed);
  for (auto& b : in) b = static_cast<uint8_t>(rng());
  std::copy(cfg.begin(), cfg.end(), in.begin());
  return in;
}

// ---------------------------------------------------------------------------
// The scalar model, from the SDM pseudo-code.

struct ModelTile {
  int rows = 0, colsb = 0;
  uint8_t b[16][64] = {};
  uint16_t u16(int r, int i) const { return uint16_t(b[r][2 * i] | (b[r][2 * i + 1] << 8)); }
  uint32_t u32(int r, int i) const {
    uint32_t v;
    std::memcpy(&v, &b[r][4 * i], 4);
    return v;
  }
  float f32(int r, int i) const {
    float v;
    std::memcpy(&v, &b[r][4 * i], 4);
    return v;
  }
};

// TILELOADD: rows x colsb bytes from base + r * stride; the rest zero.
ModelTile model_load(const uint8_t* base, int64_t stride, Shape s) {
  ModelTile t;
  t.rows = s.rows;
  t.colsb = s.colsb;
  for (int r = 0; r < s.rows; ++r) std::memcpy(t.b[r], base + r * stride, s.colsb);
  return t;
}

float bits_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
// Denormals are zero (inputs) and flush to zero (outputs), sign kept.
float daz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}
float ftz(float x) {
  return daz(x);
}
// "FP32 FMA with DAZ, FTZ, RNE": fmaf rounds once, in the default RNE mode.
// NaNs (not in the SDM; measured on hardware): the first NaN among the
// multiplicands, then the accumulator (for an addition: among the operands in
// order), quieted; an invalid operation gives the default NaN FFC00000.
float quiet(float x) {
  return bits_f32(f32_bits(x) | 0x00400000u);
}
float fma_daz_ftz(float a, float b, float c) {
  for (float x : {a, b, c})
    if (std::isnan(x)) return quiet(x);
  const float r = ftz(std::fmaf(daz(a), daz(b), daz(c)));
  return std::isnan(r) ? bits_f32(0xFFC00000u) : r;
}
float add_daz_ftz(float a, float b) {
  for (float x : {a, b})
    if (std::isnan(x)) return quiet(x);
  const float r = ftz(daz(a) + daz(b));
  return std::isnan(r) ? bits_f32(0xFFC00000u) : r;
}

float make_fp32(uint16_t bf16) {
  return bits_f32(uint32_t(bf16) << 16);
}

// IEEE binary16 -> binary32, exact (denormals become normal fp32 numbers).
float fp16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h >> 15) << 31;
  const int exp = (h >> 10) & 0x1F;
  const uint32_t mant = h & 0x3FF;
  if (exp == 0x1F) return bits_f32(sign | 0x7F800000u | (mant << 13));
  if (exp == 0) {
    const float v = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -v : v;
  }
  return bits_f32(sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13));
}

void store_f32(ModelTile& t, int r, int i, float v) {
  std::memcpy(&t.b[r][4 * i], &v, 4);
}

// SDM TDPBF16PS: temp1[2n+0/1] accumulate the even / odd products over k,
// then dst += (temp1[2n] + temp1[2n+1]).
void model_tdpbf16ps(ModelTile& c, const ModelTile& a, const ModelTile& b) {
  const int k_pairs = a.colsb / 4, n_out = c.colsb / 4;
  for (int m = 0; m < c.rows; ++m) {
    float temp[32] = {};
    for (int k = 0; k < k_pairs; ++k) {
      for (int n = 0; n < n_out; ++n) {
        temp[2 * n] =
            fma_daz_ftz(make_fp32(a.u16(m, 2 * k)), make_fp32(b.u16(k, 2 * n)), temp[2 * n]);
        temp[2 * n + 1] = fma_daz_ftz(make_fp32(a.u16(m, 2 * k + 1)),
                                      make_fp32(b.u16(k, 2 * n + 1)), temp[2 * n + 1]);
      }
    }
    for (int n = 0; n < n_out; ++n) {
      const float pair = add_daz_ftz(temp[2 * n], temp[2 * n + 1]);
      store_f32(c, m, n, add_daz_ftz(c.f32(m, n), pair));
    }
  }
}

// TDPFP16PS: the SDM's and the intrinsics guide's pseudo-code accumulate
// into dst directly (acc += even product, acc += odd product, per k); the
// hardware (checked by Fp16MatchesModelAndHardware) does as TDPBF16PS does:
// even and odd products in separate fp32 temporaries from zero, then dst +=
// (even + odd). fp16 denormal inputs are kept (exact in fp32); output FTZ.
void model_tdpfp16ps(ModelTile& c, const ModelTile& a, const ModelTile& b) {
  const int k_pairs = a.colsb / 4, n_out = c.colsb / 4;
  for (int m = 0; m < c.rows; ++m) {
    float temp[32] = {};
    for (int k = 0; k < k_pairs; ++k) {
      for (int n = 0; n < n_out; ++n) {
        for (int h = 0; h < 2; ++h) {
          temp[2 * n + h] = fma_daz_ftz(fp16_to_f32(a.u16(m, 2 * k + h)),
                                        fp16_to_f32(b.u16(k, 2 * n + h)), temp[2 * n + h]);
        }
      }
    }
    for (int n = 0; n < n_out; ++n) {
      const float pair = add_daz_ftz(temp[2 * n], temp[2 * n + 1]);
      store_f32(c, m, n, add_daz_ftz(c.f32(m, n), pair));
    }
  }
}

void model_int8(ModelTile& c, const ModelTile& a, const ModelTile& b, bool a_signed,
                bool b_signed) {
  for (int m = 0; m < c.rows; ++m) {
    for (int n = 0; n < c.colsb / 4; ++n) {
      uint32_t acc = c.u32(m, n);
      for (int k = 0; k < a.colsb / 4; ++k) {
        for (int i = 0; i < 4; ++i) {
          const int x = a_signed ? int8_t(a.b[m][4 * k + i]) : a.b[m][4 * k + i];
          const int y = b_signed ? int8_t(b.b[k][4 * n + i]) : b.b[k][4 * n + i];
          acc += static_cast<uint32_t>(x * y);
        }
      }
      std::memcpy(&c.b[m][4 * n], &acc, 4);
    }
  }
}

// TILESTORED at a stride of 64 into `out`.
void model_store(const ModelTile& t, Bytes& out, size_t offset) {
  for (int r = 0; r < t.rows; ++r) std::memcpy(out.data() + offset + r * 64, t.b[r], t.colsb);
}

// ---------------------------------------------------------------------------
// The dot-product program: C (tmm0) from region 0, A (tmm1) region 1, B
// (tmm2) region 2, each at a stride of 64; C op= A.B; C stored to out at a
// stride of 64; TILERELEASE.

enum class Dot { bf16, fp16, ssd, sud, usd, uud };

void emit_dot(Xbyak::CodeGenerator& g, Dot op, const Xbyak::Tmm& c, const Xbyak::Tmm& a,
              const Xbyak::Tmm& b) {
  switch (op) {
    case Dot::bf16:
      g.tdpbf16ps(c, a, b);
      break;
    case Dot::fp16:
      g.tdpfp16ps(c, a, b);
      break;
    case Dot::ssd:
      g.tdpbssd(c, a, b);
      break;
    case Dot::sud:
      g.tdpbsud(c, a, b);
      break;
    case Dot::usd:
      g.tdpbusd(c, a, b);
      break;
    case Dot::uud:
      g.tdpbuud(c, a, b);
      break;
  }
}

struct DotCase {
  Dot op;
  int m, k_bytes, n_bytes;  // C is m x n_bytes, A m x k_bytes, B (k_bytes/4) x n_bytes
};

Bytes dot_config(const DotCase& d) {
  return config_bytes(
      {{0, {d.m, d.n_bytes}}, {1, {d.m, d.k_bytes}}, {2, {d.k_bytes / 4, d.n_bytes}}});
}

Kernel dot_kernel(Dot op) {
  using namespace Xbyak::util;
  return Kernel([op](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.mov(rax, 64);
    g.tileloadd(tmm0, g.ptr[rdi + rax + kData]);
    g.tileloadd(tmm1, g.ptr[rdi + rax + kData + kRegion]);
    g.tileloadd(tmm2, g.ptr[rdi + rax + kData + 2 * kRegion]);
    emit_dot(g, op, tmm0, tmm1, tmm2);
    g.tilestored(g.ptr[rsi + rax], tmm0);
    g.tilerelease();
  });
}

Bytes model_dot(const DotCase& d, const Bytes& in) {
  ModelTile c = model_load(in.data() + kData, 64, {d.m, d.n_bytes});
  const ModelTile a = model_load(in.data() + kData + kRegion, 64, {d.m, d.k_bytes});
  const ModelTile b = model_load(in.data() + kData + 2 * kRegion, 64, {d.k_bytes / 4, d.n_bytes});
  switch (d.op) {
    case Dot::bf16:
      model_tdpbf16ps(c, a, b);
      break;
    case Dot::fp16:
      model_tdpfp16ps(c, a, b);
      break;
    case Dot::ssd:
      model_int8(c, a, b, true, true);
      break;
    case Dot::sud:
      model_int8(c, a, b, true, false);
      break;
    case Dot::usd:
      model_int8(c, a, b, false, true);
      break;
    case Dot::uud:
      model_int8(c, a, b, false, false);
      break;
  }
  Bytes out(16 * 64, 0xEE);
  model_store(c, out, 0);
  return out;
}

// Fills C, A, B of the layout with values of `kind` (per element) for a
// floating-point dot product. The generator sees (region, row, element).
using ElemGen = std::function<uint16_t(int region, int row, int elem, std::mt19937& rng)>;

void fill_regions_16bit(Bytes& in, const ElemGen& gen, uint32_t seed) {
  std::mt19937 rng(seed);
  for (int region = 1; region <= 2; ++region)
    for (int r = 0; r < 16; ++r)
      for (int e = 0; e < 32; ++e) {
        const uint16_t v = gen(region, r, e, rng);
        std::memcpy(in.data() + kData + region * kRegion + r * 64 + 2 * e, &v, 2);
      }
}

void fill_c_f32(Bytes& in, const std::function<float(int, int, std::mt19937&)>& gen,
                uint32_t seed) {
  std::mt19937 rng(seed);
  for (int r = 0; r < 16; ++r)
    for (int e = 0; e < 16; ++e) {
      const float v = gen(r, e, rng);
      std::memcpy(in.data() + kData + r * 64 + 4 * e, &v, 4);
    }
}

uint16_t bf16_of(float f) {
  return static_cast<uint16_t>(f32_bits(f) >> 16);  // truncation: exact for the values used
}

// bf16 values that exercise the rules: denormals (DAZ), values whose
// products and sums round, signed zeros, inf and NaN, large magnitudes.
uint16_t special_bf16(std::mt19937& rng) {
  static const uint16_t kSpecial[] = {
      0x0001, 0x8001, 0x007F, 0x0040,  // denormals
      0x0080, 0x8080,                  // smallest normals
      0x0000, 0x8000,                  // +-0
      0x7F80, 0xFF80,                  // +-inf
      0x7FC0, 0xFFC1, 0x7F81,          // quiet NaNs, a signalling NaN
      0x7F7F, 0xFF7F,                  // +-max
      0x3F81, 0xBF81, 0x3FFF, 0x4B00,  // values whose products round
      0x2000, 0x1F80, 0x0100,          // products near the denormal range
  };
  if (rng() % 4 == 0) return kSpecial[rng() % std::size(kSpecial)];
  std::uniform_real_distribution<float> d(-4, 4);
  return static_cast<uint16_t>(f32_bits(d(rng)) >> 16);
}

void expect_model_and_hardware(const DotCase& d, const Bytes& in, bool hardware) {
  Kernel k = dot_kernel(d.op);
  const Bytes want = model_dot(d, in);
  const Bytes emulated = run_emulated(k.fn(), in, 16 * 64);
  EXPECT_EQ(first_difference(want, emulated), "") << "emulator vs SDM model";
  if (hardware) {
    const Bytes native = run_native(k.fn(), in, 16 * 64);
    if (!native.empty()) {
      EXPECT_EQ(first_difference(native, emulated), "") << "emulator vs hardware";
      EXPECT_EQ(first_difference(native, want), "") << "SDM model vs hardware";
    }
  }
}

// ---------------------------------------------------------------------------
// Decoding

struct DecodeCase {
  const char* name;
  std::function<void(Xbyak::CodeGenerator&)> emit;
  emu::Op op;
  int reg, rm, vvvv;
  int base, index, scale;
  int32_t disp;
  bool has_mem;
};

TEST(AmxDecode, EveryInstructionAndAddressingForm) {
  using namespace Xbyak::util;
  using emu::kNoReg;
  using emu::kRipReg;
  using emu::Op;
  // Register numbers: rax 0, rcx 1, rdx 2, rbx 3, rsp 4, rbp 5, rsi 6, rdi 7, r8.. 8..
  const std::vector<DecodeCase> cases = {
      {"ldtilecfg [rip+disp]", [](auto& g) { g.ldtilecfg(g.ptr[rip + 0x1234]); }, Op::ldtilecfg, 0,
       0, 0, kRipReg, kNoReg, 0, 0x1234, true},
      {"ldtilecfg [rax]", [](auto& g) { g.ldtilecfg(g.ptr[rax]); }, Op::ldtilecfg, 0, 0, 0, 0,
       kNoReg, 0, 0, true},
      {"ldtilecfg [r13]", [](auto& g) { g.ldtilecfg(g.ptr[r13]); }, Op::ldtilecfg, 0, 0, 0, 13,
       kNoReg, 0, 0, true},
      {"ldtilecfg [rsp+8]", [](auto& g) { g.ldtilecfg(g.ptr[rsp + 8]); }, Op::ldtilecfg, 0, 0, 0, 4,
       kNoReg, 0, 8, true},
      {"sttilecfg [r9+r10*4-300]", [](auto& g) { g.sttilecfg(g.ptr[r9 + r10 * 4 - 300]); },
       Op::sttilecfg, 0, 0, 0, 9, 10, 2, -300, true},
      {"tilerelease", [](auto& g) { g.tilerelease(); }, Op::tilerelease, 0, 0, 0, kNoReg, kNoReg, 0,
       0, false},
      {"tilezero tmm7", [](auto& g) { g.tilezero(tmm7); }, Op::tilezero, 7, 0, 0, kNoReg, kNoReg, 0,
       0, false},
      {"tileloadd tmm3, [rdi+rax]", [](auto& g) { g.tileloadd(tmm3, g.ptr[rdi + rax]); },
       Op::tileloadd, 3, 0, 0, 7, 0, 0, 0, true},
      {"tileloadd tmm1, [r12+r15*2+100]",
       [](auto& g) { g.tileloadd(tmm1, g.ptr[r12 + r15 * 2 + 100]); }, Op::tileloadd, 1, 0, 0, 12,
       15, 1, 100, true},
      {"tileloaddt1 tmm6, [rbp+r12*8+0x12345]",
       [](auto& g) { g.tileloaddt1(tmm6, g.ptr[rbp + r12 * 8 + 0x12345]); }, Op::tileloaddt1, 6, 0,
       0, 5, 12, 3, 0x12345, true},
      {"tilestored [rsp+r13+1024], tmm5",
       [](auto& g) { g.tilestored(g.ptr[rsp + r13 + 1024], tmm5); }, Op::tilestored, 5, 0, 0, 4, 13,
       0, 1024, true},
      {"tdpbf16ps tmm0, tmm1, tmm2", [](auto& g) { g.tdpbf16ps(tmm0, tmm1, tmm2); }, Op::tdpbf16ps,
       0, 1, 2, kNoReg, kNoReg, 0, 0, false},
      {"tdpfp16ps tmm7, tmm6, tmm5", [](auto& g) { g.tdpfp16ps(tmm7, tmm6, tmm5); }, Op::tdpfp16ps,
       7, 6, 5, kNoReg, kNoReg, 0, 0, false},
      {"tdpbssd tmm2, tmm3, tmm4", [](auto& g) { g.tdpbssd(tmm2, tmm3, tmm4); }, Op::tdpbssd, 2, 3,
       4, kNoReg, kNoReg, 0, 0, false},
      {"tdpbsud tmm1, tmm0, tmm7", [](auto& g) { g.tdpbsud(tmm1, tmm0, tmm7); }, Op::tdpbsud, 1, 0,
       7, kNoReg, kNoReg, 0, 0, false},
      {"tdpbusd tmm4, tmm5, tmm6", [](auto& g) { g.tdpbusd(tmm4, tmm5, tmm6); }, Op::tdpbusd, 4, 5,
       6, kNoReg, kNoReg, 0, 0, false},
      {"tdpbuud tmm6, tmm7, tmm0", [](auto& g) { g.tdpbuud(tmm6, tmm7, tmm0); }, Op::tdpbuud, 6, 7,
       0, kNoReg, kNoReg, 0, 0, false},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    Xbyak::CodeGenerator g;
    c.emit(g);
    emu::Insn in;
    const char* why = "";
    ASSERT_EQ(emu::decode(g.getCode(), &in, &why), emu::DecodeResult::ok) << why;
    EXPECT_EQ(in.length, static_cast<int>(g.getSize()));
    EXPECT_EQ(in.op, c.op);
    EXPECT_EQ(in.has_mem, c.has_mem);
    if (c.op == Op::tilezero || c.op == Op::tileloadd || c.op == Op::tileloaddt1 ||
        c.op == Op::tilestored || !c.has_mem) {
      EXPECT_EQ(in.reg, c.reg);
    }
    if (!c.has_mem && c.op != Op::tilerelease && c.op != Op::tilezero) {
      EXPECT_EQ(in.rm, c.rm);
      EXPECT_EQ(in.vvvv, c.vvvv);
    }
    if (c.has_mem) {
      EXPECT_EQ(in.mem.base, c.base);
      EXPECT_EQ(in.mem.index, c.index);
      EXPECT_EQ(in.mem.scale, c.scale);
      EXPECT_EQ(in.mem.disp, c.disp);
    }
  }
}

TEST(AmxDecode, NoBaseAndNoIndexForms) {
  // tileloadd tmm0, [rax*1 + disp32] with no base (SIB base 101, mod 00) and
  // tileloadd tmm0, [rdi] with no index (SIB index 100): Xbyak emits neither.
  const uint8_t no_base[] = {0xC4, 0xE2, 0x7B, 0x4B, 0x04, 0x05, 0x78, 0x56, 0x34, 0x12};
  const uint8_t no_index[] = {0xC4, 0xE2, 0x7B, 0x4B, 0x04, 0x27};
  emu::Insn in;
  const char* why = "";
  ASSERT_EQ(emu::decode(no_base, &in, &why), emu::DecodeResult::ok) << why;
  EXPECT_EQ(in.length, 10);
  EXPECT_EQ(in.mem.base, emu::kNoReg);
  EXPECT_EQ(in.mem.index, 0);
  EXPECT_EQ(in.mem.disp, 0x12345678);
  ASSERT_EQ(emu::decode(no_index, &in, &why), emu::DecodeResult::ok) << why;
  EXPECT_EQ(in.length, 6);
  EXPECT_EQ(in.mem.base, 7);
  EXPECT_EQ(in.mem.index, emu::kNoReg);
}

TEST(AmxDecode, OtherInstructionsAreNotOurs) {
  using namespace Xbyak::util;
  Xbyak::CodeGenerator g;
  g.ud2();
  g.vpdpbusd(zmm0, zmm1, zmm2);     // EVEX, not VEX
  g.vfmadd231ps(ymm0, ymm1, ymm2);  // VEX map 0F38, another opcode
  const uint8_t* p = g.getCode();
  emu::Insn in;
  const char* why = "";
  EXPECT_EQ(emu::decode(p, &in, &why), emu::DecodeResult::not_amx);
  EXPECT_EQ(emu::decode(p + 2, &in, &why), emu::DecodeResult::not_amx);
  EXPECT_EQ(emu::decode(p + 8, &in, &why), emu::DecodeResult::not_amx);
}

TEST(AmxDecode, InvalidFormsAreRefused) {
  const uint8_t w1[] = {0xC4, 0xE2, 0xFB, 0x49, 0xC0};             // tilezero with W1
  const uint8_t tmm8[] = {0xC4, 0x62, 0x7B, 0x49, 0xC0};           // tilezero tmm8 (VEX.R)
  const uint8_t vvvv[] = {0xC4, 0xE2, 0x3B, 0x49, 0xC0};           // tilezero with vvvv used
  const uint8_t no_sib[] = {0xC4, 0xE2, 0x7B, 0x4B, 0x07};         // tileloadd tmm0, [rdi]
  const uint8_t mem_dot[] = {0xC4, 0xE2, 0x72, 0x5C, 0x04, 0x07};  // tdpbf16ps with memory
  emu::Insn in;
  const char* why = "";
  for (const uint8_t* p : {w1, tmm8, vvvv, no_sib, mem_dot})
    EXPECT_EQ(emu::decode(p, &in, &why), emu::DecodeResult::invalid);
}

// ---------------------------------------------------------------------------
// Executor internals: what no program can observe, the zeroed bytes.

TEST(AmxExecute, LoadZeroesBytesPastColsbAndRowsPastRows) {
  emu::TileState s;
  const Bytes cfg = config_bytes({{3, {5, 6}}});
  emu::Fault f;
  ASSERT_TRUE(emu::check_config(cfg.data(), &f)) << f.rule;
  emu::load_config(&s, emu::parse_config(cfg.data()));
  std::memset(s.data, 0xCC, sizeof s.data);  // garbage, as if left from before
  Bytes mem(16 * 64, 0x11);
  emu::Insn in;
  in.op = emu::Op::tileloadd;
  in.reg = 3;
  in.has_mem = true;
  in.mem.base = 0;
  in.mem.index = 1;
  uint64_t gpr[16] = {};
  gpr[0] = reinterpret_cast<uint64_t>(mem.data());
  gpr[1] = 64;
  ASSERT_TRUE(emu::execute(in, gpr, 0, &s, &f)) << f.rule;
  for (int r = 0; r < 16; ++r)
    for (int b = 0; b < 64; ++b)
      ASSERT_EQ(s.data[3][r][b], (r < 5 && b < 6) ? 0x11 : 0) << "row " << r << " byte " << b;
}

// On a CPU without AMX, LDTILECFG/STTILECFG/TILERELEASE trap and are
// emulated; on this kind of CPU they run natively. Their executor, driven
// directly with decoded Xbyak bytes, RIP-relative operand included.
TEST(AmxExecute, ConfigInstructionsAsOnACpuWithoutAmx) {
  using namespace Xbyak::util;
  Xbyak::CodeGenerator g;
  g.ldtilecfg(g.ptr[rip + 0x40]);  // config 64 bytes past the instruction's end
  g.sttilecfg(g.ptr[rax + rcx * 2 + 8]);
  g.tilerelease();
  const uint8_t* code = g.getCode();
  emu::Insn ld, st, rel;
  const char* why = "";
  ASSERT_EQ(emu::decode(code, &ld, &why), emu::DecodeResult::ok);
  ASSERT_EQ(emu::decode(code + ld.length, &st, &why), emu::DecodeResult::ok);
  ASSERT_EQ(emu::decode(code + ld.length + st.length, &rel, &why), emu::DecodeResult::ok);

  Bytes mem(256, 0);
  const Bytes cfg = config_bytes({{0, {16, 64}}, {6, {2, 10}}});
  std::copy(cfg.begin(), cfg.end(), mem.begin() + 0x40);
  const uint64_t next_rip = reinterpret_cast<uint64_t>(mem.data());  // pretend code address
  uint64_t gpr[16] = {};
  gpr[0] = reinterpret_cast<uint64_t>(mem.data() + 128);
  gpr[1] = 4;  // sttilecfg at mem + 128 + 8 + 8
  emu::TileState s;
  std::memset(s.data, 0xCC, sizeof s.data);
  emu::Fault f;
  ASSERT_TRUE(emu::execute(ld, gpr, next_rip, &s, &f)) << f.rule;
  EXPECT_EQ(s.cfg.rows[6], 2);
  EXPECT_EQ(s.cfg.colsb[6], 10);
  for (size_t i = 0; i < sizeof s.data; ++i)
    ASSERT_EQ(reinterpret_cast<const uint8_t*>(s.data)[i], 0) << "LDTILECFG zeroes the tiles";
  ASSERT_TRUE(emu::execute(st, gpr, 0, &s, &f)) << f.rule;
  EXPECT_EQ(first_difference(cfg, Bytes(mem.begin() + 144, mem.begin() + 208)), "");
  ASSERT_TRUE(emu::execute(rel, gpr, 0, &s, &f)) << f.rule;
  EXPECT_EQ(s.cfg.palette, 0);
  ASSERT_TRUE(emu::execute(st, gpr, 0, &s, &f)) << f.rule;
  EXPECT_EQ(first_difference(Bytes(64, 0), Bytes(mem.begin() + 144, mem.begin() + 208)), "");
  // A bad config is refused and leaves the state alone.
  mem[0x40] = 3;
  EXPECT_FALSE(emu::execute(ld, gpr, next_rip, &s, &f));
  EXPECT_STREQ(f.exception, "#GP");
  EXPECT_STREQ(f.rule, "palette 3 is not supported (allowed: 0, 1)");
  EXPECT_EQ(s.cfg.palette, 0);
}

// ---------------------------------------------------------------------------
// Loads and stores: partial shapes, strides, every displacement form.

TEST(AmxLoadStore, ShapesStridesAndDisplacements) {
  using namespace Xbyak::util;
  struct Case {
    Shape s;
    int64_t stride;
    int32_t disp;
    int scale;
  };
  const Case cases[] = {
      {{16, 64}, 64, 0, 0},  {{16, 64}, 128, 0, 0},  {{3, 5}, 64, 8, 0},
      {{7, 33}, 16, -8, 2},  {{1, 1}, 0, 300, 0},    {{16, 4}, 4, 1000, 0},
      {{9, 63}, 40, 127, 1}, {{12, 64}, 0, -128, 0}, {{16, 64}, -64, 15 * 64 + 100, 0},
  };
  const bool hw = cpu_has_amx();
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.s.rows << "x" << c.s.colsb << " stride " << c.stride
                                      << " disp " << c.disp << " scale " << c.scale);
    // r12 + r13 << scale + disp: r13 as index needs VEX.X, r12 as base needs a SIB.
    Kernel k([&](Kernel& g) {
      g.ldtilecfg(g.ptr[rdi]);
      g.lea(r12, g.ptr[rdi + kData + kRegion]);  // the middle of the input
      g.mov(r13, c.stride >> c.scale);
      g.mov(r14, 64);
      auto src = c.scale == 0   ? g.ptr[r12 + r13 + c.disp]
                 : c.scale == 1 ? g.ptr[r12 + r13 * 2 + c.disp]
                                : g.ptr[r12 + r13 * 4 + c.disp];
      g.tileloadd(tmm4, src);
      g.tilestored(g.ptr[rsi + r14], tmm4);
      // The same rows stored back at the load's own address form, into out + 1024.
      g.lea(r12, g.ptr[rsi + 1024 + 8 * 64]);
      auto dst = c.scale == 0   ? g.ptr[r12 + r13 + c.disp]
                 : c.scale == 1 ? g.ptr[r12 + r13 * 2 + c.disp]
                                : g.ptr[r12 + r13 * 4 + c.disp];
      g.tilestored(dst, tmm4);
      g.tilerelease();
    });
    const Bytes in = make_input(config_bytes({{4, c.s}}), 7);
    Bytes want(4096, 0xEE);
    const ModelTile t = model_load(in.data() + kData + kRegion + c.disp, c.stride, c.s);
    model_store(t, want, 0);
    for (int r = 0; r < c.s.rows; ++r)
      std::memcpy(want.data() + 1024 + 8 * 64 + c.disp + r * c.stride, t.b[r], c.s.colsb);
    const Bytes got = run_emulated(k.fn(), in, 4096);
    EXPECT_EQ(first_difference(want, got), "") << "emulator vs model";
    if (hw) {
      const Bytes native = run_native(k.fn(), in, 4096);
      if (!native.empty()) {
        EXPECT_EQ(first_difference(native, got), "") << "emulator vs hardware";
      }
    }
  }
}

TEST(AmxLoadStore, NoIndexMeansStrideZero) {
  // tileloadd tmm0, [rdi + 64] without an index (raw bytes; Xbyak insists on
  // one): every row reads the same 64 bytes.
  static const uint8_t kLoadNoIndex[] = {0xC4, 0xE2, 0x7B, 0x4B, 0x44, 0x27, 0x40};
  using namespace Xbyak::util;
  Kernel k([](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.db(kLoadNoIndex, sizeof kLoadNoIndex);
    g.mov(rax, 64);
    g.tilestored(g.ptr[rsi + rax], tmm0);
    g.tilerelease();
  });
  const Bytes in = make_input(config_bytes({{0, {16, 64}}}), 3);
  const Bytes got = run_emulated(k.fn(), in, 1024);
  for (int r = 0; r < 16; ++r)
    ASSERT_EQ(std::memcmp(got.data() + r * 64, in.data() + 64, 64), 0) << "row " << r;
  if (cpu_has_amx()) {
    const Bytes native = run_native(k.fn(), in, 1024);
    if (!native.empty()) {
      EXPECT_EQ(first_difference(native, got), "");
    }
  }
}

TEST(AmxLoadStore, TilezeroAndRipRelativeConfig) {
  using namespace Xbyak::util;
  const Bytes cfg = config_bytes({{0, {16, 64}}, {5, {2, 12}}});
  Kernel k([&](Kernel& g) {
    Xbyak::Label cfg_label;
    g.ldtilecfg(g.ptr[rip + cfg_label]);  // what tilejit's kernels emit
    g.mov(rax, 64);
    g.tileloadd(tmm0, g.ptr[rdi + rax + kData]);
    g.tileloadd(tmm5, g.ptr[rdi + rax + kData]);
    g.tilezero(tmm0);
    g.tilestored(g.ptr[rsi + rax], tmm0);
    g.tilestored(g.ptr[rsi + rax + 1024], tmm5);
    g.tilerelease();
    Xbyak::Label done;  // the Kernel epilogue follows: jump over the data
    g.jmp(done, Xbyak::CodeGenerator::T_NEAR);
    g.align(64);
    g.L(cfg_label);
    g.db(cfg.data(), cfg.size());
    g.L(done);
  });
  Bytes in = make_input(Bytes(64, 0), 5);
  Bytes want(2048, 0xEE);
  std::memset(want.data(), 0, 1024);
  for (int r = 0; r < 2; ++r)
    std::memcpy(want.data() + 1024 + r * 64, in.data() + kData + r * 64, 12);
  const Bytes got = run_emulated(k.fn(), in, 2048);
  EXPECT_EQ(first_difference(want, got), "");
  if (cpu_has_amx()) {
    const Bytes native = run_native(k.fn(), in, 2048);
    if (!native.empty()) {
      EXPECT_EQ(first_difference(native, got), "");
    }
  }
}

// A second LDTILECFG zeroes the tiles even when the configuration is the
// same (on an AMX CPU without the permission it runs natively, unseen by the
// emulator: the start_row marker is what tells).
TEST(AmxLoadStore, ReloadingTheConfigZeroesTiles) {
  using namespace Xbyak::util;
  Kernel k([](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.mov(rax, 64);
    g.tileloadd(tmm0, g.ptr[rdi + rax + kData]);
    g.tilestored(g.ptr[rsi + rax], tmm0);
    g.ldtilecfg(g.ptr[rdi]);
    g.tilestored(g.ptr[rsi + rax + 1024], tmm0);
    g.tilerelease();
  });
  const Bytes in = make_input(config_bytes({{0, {16, 64}}}), 9);
  const Bytes got = run_emulated(k.fn(), in, 2048);
  EXPECT_EQ(std::memcmp(got.data(), in.data() + kData, 1024), 0);
  EXPECT_EQ(first_difference(Bytes(1024, 0), Bytes(got.begin() + 1024, got.end())), "");
}

TEST(AmxLoadStore, SttilecfgStoresTheConfig) {
  using namespace Xbyak::util;
  Kernel k([](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.sttilecfg(g.ptr[rsi]);
    g.tilerelease();
    g.sttilecfg(g.ptr[rsi + 64]);  // the init state: 64 zero bytes
  });
  const Bytes cfg = config_bytes({{0, {16, 64}}, {7, {3, 9}}});
  Bytes in = cfg;
  in.resize(kInBytes);
  const Bytes got = run_emulated(k.fn(), in, 128);
  EXPECT_EQ(first_difference(cfg, Bytes(got.begin(), got.begin() + 64)), "");
  EXPECT_EQ(first_difference(Bytes(64, 0), Bytes(got.begin() + 64, got.end())), "");
}

// ---------------------------------------------------------------------------
// Dot products

TEST(AmxDot, Bf16RandomValuesMatchModelAndHardware) {
  const bool hw = cpu_has_amx();
  const DotCase shapes[] = {{Dot::bf16, 16, 64, 64},
                            {Dot::bf16, 3, 20, 28},
                            {Dot::bf16, 1, 4, 4},
                            {Dot::bf16, 16, 8, 64},
                            {Dot::bf16, 7, 64, 12}};
  uint32_t seed = 1;
  for (const DotCase& d : shapes) {
    SCOPED_TRACE(::testing::Message()
                 << "m " << d.m << " k_bytes " << d.k_bytes << " n_bytes " << d.n_bytes);
    Bytes in = make_input(dot_config(d), seed++);
    fill_regions_16bit(
        in,
        [](int, int, int, std::mt19937& rng) {
          std::uniform_real_distribution<float> u(-2, 2);
          return bf16_of(u(rng));
        },
        seed++);
    fill_c_f32(
        in,
        [](int, int, std::mt19937& rng) {
          return std::uniform_real_distribution<float>(-8, 8)(rng);
        },
        seed++);
    expect_model_and_hardware(d, in, hw);
  }
}

TEST(AmxDot, Bf16SpecialValuesMatchModelAndHardware) {
  const bool hw = cpu_has_amx();
  for (uint32_t seed = 100; seed < 112; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const DotCase d{Dot::bf16, 16, 64, 64};
    Bytes in = make_input(dot_config(d), seed);
    fill_regions_16bit(
        in, [](int, int, int, std::mt19937& rng) { return special_bf16(rng); }, seed);
    // C: ordinary values, fp32 denormals (DAZ), zeros of both signs.
    fill_c_f32(
        in,
        [](int r, int e, std::mt19937& rng) {
          switch ((r + e) % 5) {
            case 0:
              return bits_f32(0x00000001u + (rng() & 0x7FFFFF));  // denormal
            case 1:
              return -0.0f;
            default:
              return std::uniform_real_distribution<float>(-8, 8)(rng);
          }
        },
        seed + 1000);
    expect_model_and_hardware(d, in, hw);
  }
}

// Sums that round: with separate even/odd accumulators, the order matters.
TEST(AmxDot, Bf16RoundingOrderMatchesModelAndHardware) {
  const bool hw = cpu_has_amx();
  const DotCase d{Dot::bf16, 16, 64, 64};
  Bytes in = make_input(dot_config(d), 42);
  // Large and small magnitudes mixed, so the result depends on the order.
  fill_regions_16bit(
      in,
      [](int, int, int e, std::mt19937& rng) {
        const float big = (rng() % 2 ? 1 : -1) * std::ldexp(1.0f, int(rng() % 40) - 20);
        return bf16_of(e % 3 == 0 ? big : big * 1.0078125f);
      },
      43);
  fill_c_f32(
      in, [](int, int, std::mt19937& rng) { return std::ldexp(1.0f, int(rng() % 30) - 10); }, 44);
  expect_model_and_hardware(d, in, hw);
}

TEST(AmxDot, Fp16MatchesModelAndHardware) {
  // Not every AMX CPU has AMX-FP16 (Sapphire Rapids lacks it): the hardware
  // check runs only where CPUID says it is there.
  const bool hw = cpu_has_amx_fp16();
  const DotCase shapes[] = {{Dot::fp16, 16, 64, 64}, {Dot::fp16, 5, 12, 40}};
  uint32_t seed = 7;
  for (const DotCase& d : shapes) {
    Bytes in = make_input(dot_config(d), seed++);
    fill_regions_16bit(
        in,
        [](int, int, int, std::mt19937& rng) -> uint16_t {
          static const uint16_t kSpecial[] = {0x0001, 0x83FF, 0x0400, 0x7C00, 0xFC00,
                                              0x7E00, 0x7BFF, 0x8000, 0x3C01, 0x0000};
          if (rng() % 4 == 0) return kSpecial[rng() % std::size(kSpecial)];
          // Finite values of moderate size: sign, exponent 10..20, any mantissa.
          return static_cast<uint16_t>(((rng() & 1) << 15) | ((10 + rng() % 11) << 10) |
                                       (rng() & 0x3FF));
        },
        seed++);
    fill_c_f32(
        in,
        [](int r, int, std::mt19937& rng) {
          return r == 3 ? bits_f32(0x00000100u) : std::uniform_real_distribution<float>(-8, 8)(rng);
        },
        seed++);
    expect_model_and_hardware(d, in, hw);
  }
}

TEST(AmxDot, Int8AllVariantsExtremesMatchModelAndHardware) {
  const bool hw = cpu_has_amx();
  const Dot ops[] = {Dot::ssd, Dot::sud, Dot::usd, Dot::uud};
  uint32_t seed = 500;
  for (Dot op : ops) {
    for (const auto& [m, kb, nb] : {std::tuple{16, 64, 64}, std::tuple{5, 24, 36}}) {
      SCOPED_TRACE(::testing::Message() << "op " << int(op) << " m " << m);
      const DotCase d{op, m, kb, nb};
      Bytes in = make_input(dot_config(d), seed++);
      // Bytes: extremes (0, 1, 127, 128 = -128 signed, 255 = -1 signed) or random.
      std::mt19937 rng(seed++);
      for (int region = 1; region <= 2; ++region) {
        for (int i = 0; i < 1024; ++i) {
          static const uint8_t kExtreme[] = {0, 1, 127, 128, 255};
          uint8_t& b = in[kData + region * kRegion + i];
          b = rng() % 2 ? kExtreme[rng() % 5] : static_cast<uint8_t>(rng());
        }
      }
      // Accumulators near the int32 limits, so the sums wrap.
      for (int i = 0; i < 256; ++i) {
        const uint32_t v = i % 3 == 0 ? 0x7FFFFFF0u : i % 3 == 1 ? 0x80000005u : uint32_t(rng());
        std::memcpy(in.data() + kData + 4 * i, &v, 4);
      }
      expect_model_and_hardware(d, in, hw);
    }
  }
}

// A kernel-like sequence: a 32x32 block of C from K = 96 in three
// rank-32 steps, tiles reused, B at a stride of 128.
TEST(AmxDot, Bf16BrgemmLikeSequenceMatchesHardware) {
  SKIP_WITHOUT_AMX_HARDWARE();
  using namespace Xbyak::util;
  Kernel k([](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    for (int t = 0; t < 4; ++t) g.tilezero(Xbyak::Tmm(t));
    g.mov(rax, 64);
    g.mov(rbx, 128);
    for (int kk = 0; kk < 3; ++kk) {
      // A rows 0..15 and 16..31 (16 x 32 bf16 each) from regions 1/2.
      g.tileloadd(tmm4, g.ptr[rdi + rax + kData + kRegion + kk * 16]);
      g.tileloadd(tmm5, g.ptr[rdi + rax + kData + 2 * kRegion + kk * 16]);
      g.tileloadd(tmm6, g.ptr[rdi + rbx + kData + 3 * kRegion - 8 * kk]);
      g.tileloadd(tmm7, g.ptr[rdi + rbx + kData + 3 * kRegion + 64 - 8 * kk]);
      g.tdpbf16ps(tmm0, tmm4, tmm6);
      g.tdpbf16ps(tmm1, tmm4, tmm7);
      g.tdpbf16ps(tmm2, tmm5, tmm6);
      g.tdpbf16ps(tmm3, tmm5, tmm7);
    }
    for (int t = 0; t < 4; ++t) g.tilestored(g.ptr[rsi + rax + t * 1024], Xbyak::Tmm(t));
    g.tilerelease();
  });
  Bytes cfg = config_bytes({{0, {16, 64}},
                            {1, {16, 64}},
                            {2, {16, 64}},
                            {3, {16, 64}},
                            {4, {16, 64}},
                            {5, {16, 64}},
                            {6, {16, 64}},
                            {7, {16, 64}}});
  Bytes in = make_input(cfg, 77);
  fill_regions_16bit(
      in, [](int, int, int, std::mt19937& rng) { return special_bf16(rng); }, 78);
  std::mt19937 rng(79);
  for (int i = 0; i < kRegion / 2; ++i) {
    const uint16_t v = special_bf16(rng);
    std::memcpy(in.data() + kData + 3 * kRegion + 2 * i, &v, 2);
  }
  const Bytes emulated = run_emulated(k.fn(), in, 4096);
  const Bytes native = run_native(k.fn(), in, 4096);
  if (!native.empty()) {
    EXPECT_EQ(first_difference(native, emulated), "");
  }
}

// ---------------------------------------------------------------------------
// Faults: what hardware refuses, the emulator refuses with a diagnostic.

void run_config_and(const Bytes& cfg, const std::function<void(Kernel&)>& body) {
  using namespace Xbyak::util;
  Kernel k([&](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.mov(rax, 64);
    body(g);
    g.tilerelease();
  });
  Bytes in = make_input(cfg, 1);
  Bytes out(4096);
  k.fn()(in.data(), out.data());
}

using AmxFaultsDeathTest = ::testing::Test;

TEST(AmxFaultsDeathTest, InvalidConfigurations) {
  const auto nothing = [](Kernel&) {};
  struct Case {
    Bytes cfg;
    const char* message;
  };
  std::vector<Case> cases;
  cases.push_back(
      {config_bytes({{0, {16, 64}}}, 2), "#GP at LDTILECFG.*palette 2 is not supported"});
  Bytes reserved = config_bytes({{0, {16, 64}}});
  reserved[9] = 1;
  cases.push_back({reserved, "#GP at LDTILECFG.*reserved byte 9 is 1"});
  cases.push_back({config_bytes({{1, {17, 64}}}), "#GP at LDTILECFG.*tmm1.rows 17 > 16"});
  cases.push_back({config_bytes({{2, {4, 65}}}), "#GP at LDTILECFG.*tmm2.colsb 65 > 64"});
  cases.push_back({config_bytes({{3, {4, 0}}}), "tmm3 has rows 4 and colsb 0"});
  cases.push_back({config_bytes({{4, {0, 8}}}), "tmm4 has rows 0 and colsb 8"});
  Bytes tile9 = config_bytes({{0, {16, 64}}});
  tile9[48 + 9] = 1;
  cases.push_back({tile9, "tile 9 does not exist in palette 1"});
  for (const Case& c : cases) EXPECT_DEATH(run_config_and(c.cfg, nothing), c.message);
}

TEST(AmxFaultsDeathTest, DotShapesAndOperands) {
  using namespace Xbyak::util;
  auto dot = [](const Xbyak::Tmm& c, const Xbyak::Tmm& a, const Xbyak::Tmm& b) {
    return [=](Kernel& g) { g.tdpbf16ps(c, a, b); };
  };
  const auto ok = config_bytes({{0, {16, 64}}, {1, {16, 64}}, {2, {16, 64}}});
  EXPECT_DEATH(run_config_and(config_bytes({{0, {8, 64}}, {1, {16, 64}}, {2, {16, 64}}}),
                              dot(tmm0, tmm1, tmm2)),
               "#UD at TDPBF16PS tmm0, tmm1, tmm2.*dst.rows \\(8\\) != src1.rows \\(16\\)");
  EXPECT_DEATH(run_config_and(config_bytes({{0, {16, 64}}, {1, {16, 32}}, {2, {16, 64}}}),
                              dot(tmm0, tmm1, tmm2)),
               "src1.colsb/4 \\(8\\) != src2.rows \\(16\\)");
  EXPECT_DEATH(run_config_and(config_bytes({{0, {16, 32}}, {1, {16, 64}}, {2, {16, 64}}}),
                              dot(tmm0, tmm1, tmm2)),
               "dst.colsb \\(32\\) != src2.colsb \\(64\\)");
  EXPECT_DEATH(
      run_config_and(config_bytes({{0, {1, 6}}, {1, {1, 4}}, {2, {1, 6}}}), dot(tmm0, tmm1, tmm2)),
      "tmm0.colsb \\(6\\) is not a multiple of 4");
  EXPECT_DEATH(run_config_and(ok, dot(tmm0, tmm0, tmm2)), "tile operands must be distinct");
  EXPECT_DEATH(run_config_and(ok, dot(tmm1, tmm2, tmm2)), "tile operands must be distinct");
  EXPECT_DEATH(run_config_and(ok, dot(tmm0, tmm1, tmm3)), "tmm3 is not configured");
  EXPECT_DEATH(run_config_and(ok, [](Kernel& g) { g.tdpbssd(tmm0, tmm1, tmm1); }),
               "#UD at TDPBSSD.*distinct");
}

TEST(AmxFaultsDeathTest, TileOpsNeedAConfiguration) {
  using namespace Xbyak::util;
  auto run_bare = [](const std::function<void(Kernel&)>& body) {
    Kernel k([&](Kernel& g) { body(g); });
    Bytes in(kInBytes), out(4096);
    k.fn()(in.data(), out.data());
  };
  EXPECT_DEATH(run_bare([](Kernel& g) { g.tilezero(tmm0); }),
               "#UD at TILEZERO tmm0.*no tile configuration loaded");
  EXPECT_DEATH(run_bare([](Kernel& g) {
                 g.ldtilecfg(g.ptr[rdi]);
                 g.tilerelease();
                 g.mov(rax, 64);
                 g.tileloadd(tmm0, g.ptr[rdi + rax]);
               }),
               "#UD at TILELOADD tmm0, \\[rdi \\+ rax\\].*no tile configuration loaded");
  EXPECT_DEATH(run_config_and(config_bytes({{0, {16, 64}}}),
                              [](Kernel& g) { g.tilestored(g.ptr[rsi + rax], tmm1); }),
               "#UD at TILESTORED .*tmm1 is not configured");
}

// LDTILECFG's #GP rules of the emulator are hardware's: the same configs run
// natively (LDTILECFG needs no permission) in a child.
TEST(AmxFaults, ConfigRulesMatchHardware) {
  SKIP_WITHOUT_AMX_HARDWARE();
  using namespace Xbyak::util;
  Kernel k([](Kernel& g) { g.ldtilecfg(g.ptr[rdi]); });
  std::vector<Bytes> cfgs;
  cfgs.push_back(config_bytes({{0, {16, 64}}}));
  cfgs.push_back(config_bytes({{0, {16, 64}}}, 0));
  cfgs.push_back(config_bytes({{0, {16, 64}}}, 2));
  cfgs.push_back(config_bytes({{0, {16, 64}}}, 255));
  for (int byte : {1, 2, 8, 15, 17, 33, 47, 56, 63}) {
    Bytes c = config_bytes({{0, {16, 64}}});
    c[byte] = 1;
    cfgs.push_back(c);
    Bytes p0 = c;  // palette 0: the rest is ignored
    p0[0] = 0;
    cfgs.push_back(p0);
  }
  for (int rows : {0, 1, 16, 17, 255})
    for (int colsb : {0, 1, 3, 64, 65, 256}) cfgs.push_back(config_bytes({{5, {rows, colsb}}}));
  for (const Bytes& c : cfgs) {
    emu::Fault f;
    const bool emulator_ok = emu::check_config(c.data(), &f);
    const pid_t pid = fork();
    if (pid == 0) {
      signal(SIGSEGV, SIG_DFL);  // the emulator's #GP diagnostic is not what is tested here
      Bytes in = c;
      in.resize(kInBytes);
      Bytes out(64);
      k.fn()(in.data(), out.data());
      _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const bool hardware_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    std::string hex;
    for (uint8_t b : c) hex += std::to_string(b) + " ";
    EXPECT_EQ(emulator_ok, hardware_ok) << "config " << hex << "emulator: " << f.rule;
  }
}

// ---------------------------------------------------------------------------
// Threads, chaining, the switch

TEST(AmxThreads, EachThreadHasItsOwnTiles) {
  using namespace Xbyak::util;
  // Part 1 loads the config and tmm0; part 2 (called later) stores tmm0.
  Kernel load([](Kernel& g) {
    g.ldtilecfg(g.ptr[rdi]);
    g.mov(rax, 64);
    g.tileloadd(tmm0, g.ptr[rdi + rax + kData]);
  });
  Kernel store([](Kernel& g) {
    g.mov(rax, 64);
    g.tilestored(g.ptr[rsi + rax], tmm0);
    g.tilerelease();
  });
  std::atomic<int> loaded{0};
  auto worker = [&](uint32_t seed, Shape s, Bytes* out, Bytes* in) {
    *in = make_input(config_bytes({{0, s}}), seed);
    load.fn()(in->data(), nullptr);
    loaded.fetch_add(1);
    while (loaded.load() < 2) std::this_thread::yield();  // both configured, both loaded
    out->assign(1024, 0xEE);
    store.fn()(nullptr, out->data());
  };
  Bytes out1, out2, in1, in2;
  std::thread t1(worker, 11, Shape{16, 64}, &out1, &in1);
  std::thread t2(worker, 22, Shape{4, 8}, &out2, &in2);
  t1.join();
  t2.join();
  Bytes want1(1024, 0xEE), want2(1024, 0xEE);
  model_store(model_load(in1.data() + kData, 64, {16, 64}), want1, 0);
  model_store(model_load(in2.data() + kData, 64, {4, 8}), want2, 0);
  EXPECT_EQ(first_difference(want1, out1), "");
  EXPECT_EQ(first_difference(want2, out2), "");
}

TEST(AmxChain, OtherSigillsReachThePreviousHandler) {
  Xbyak::CodeGenerator g;
  g.ud2();
  g.ret();
  const int before = g_host_sigill_calls.load();
  g.getCode<void (*)()>()();
  EXPECT_EQ(g_host_sigill_calls.load(), before + 1) << "a ud2 is not the emulator's";
  raise(SIGILL);
  EXPECT_EQ(g_host_sigill_calls.load(), before + 2) << "nor a SIGILL sent by raise()";
}

TEST(AmxSwitch, RuntimeSeesEmulatedAmx) {
  const auto& f = runtime::cpu_features();
  EXPECT_TRUE(f.amx_emulated);
  EXPECT_FALSE(f.amx_permitted) << "under emulation the permission is never requested";
  EXPECT_TRUE(emu::emulator_installed());
  EXPECT_EQ(emu::config_in_hardware(), cpu_has_amx());
}

TEST(AmxSwitch, BadValueNamesTheVariable) {
  const std::string saved = std::getenv("TILEJIT_AMX_EMULATE");
  setenv("TILEJIT_AMX_EMULATE", "bogus", 1);
  try {
    runtime::amx_emulation_choice();
    ADD_FAILURE() << "no Error for TILEJIT_AMX_EMULATE=bogus";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("TILEJIT_AMX_EMULATE"), std::string::npos) << m;
    EXPECT_NE(m.find("bogus"), std::string::npos) << m;
    EXPECT_NE(m.find("0, 1, auto"), std::string::npos) << m;
  }
  setenv("TILEJIT_AMX_EMULATE", saved.c_str(), 1);
}

// ---------------------------------------------------------------------------
// Speed: instructions per second through the signal path.

TEST(AmxSpeed, InstructionsPerSecond) {
  using namespace Xbyak::util;
  constexpr int kIters = 2000;
  auto measure = [&](const char* what, const std::function<void(Kernel&)>& step) {
    Kernel k([&](Kernel& g) {
      g.ldtilecfg(g.ptr[rdi]);
      g.mov(rax, 64);
      g.mov(rcx, kIters);
      Xbyak::Label loop;
      g.L(loop);
      step(g);
      g.dec(rcx);
      g.jnz(loop);
      g.tilerelease();
    });
    Bytes in = make_input(config_bytes({{0, {16, 64}}, {1, {16, 64}}, {2, {16, 64}}}), 1);
    fill_regions_16bit(
        in, [](int, int, int, std::mt19937& rng) { return special_bf16(rng); }, 2);
    Bytes out(4096);
    const uint64_t before = emu::emulated_instructions();
    const auto t0 = std::chrono::steady_clock::now();
    k.fn()(in.data(), out.data());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const uint64_t n = emu::emulated_instructions() - before;
    std::printf("[ SPEED    ] %-30s %8.0f instructions/s (%.2f us each)\n", what, n / s,
                1e6 * s / n);
    RecordProperty(what, std::to_string(static_cast<int64_t>(n / s)));
    EXPECT_GE(n, uint64_t(kIters));
  };
  measure("tilezero", [](Kernel& g) { g.tilezero(tmm0); });
  measure("tileloadd 16x64", [](Kernel& g) { g.tileloadd(tmm1, g.ptr[rdi + rax + kData]); });
  measure("tdpbf16ps 16x16x32", [](Kernel& g) { g.tdpbf16ps(tmm0, tmm1, tmm2); });
}

}  // namespace
}  // namespace tilejit::test

int main(int argc, char** argv) {
  // The host's handler first, the emulator (via the runtime) after it.
  struct sigaction sa = {};
  sa.sa_sigaction = &tilejit::test::host_sigill;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGILL, &sa, nullptr);
  setenv("TILEJIT_AMX_EMULATE", "1", 0);  // run by hand, it still tests the emulator
  ::testing::InitGoogleTest(&argc, argv);
  // Death tests re-execute this binary: the child sets the handlers up the
  // same way, instead of inheriting a forked copy of a threaded process.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  if (!tilejit::runtime::cpu_features().amx_emulated) {
    // Its executor (and the AMX kernels, which mix AVX-512 code in) needs
    // AVX-512F/BW: on a CPU without them (AVX2-only hosts) there is nothing
    // it could run, so the test reports itself skipped (ctest SKIP_RETURN_CODE).
    if (!tilejit::test::amx::executor_supported()) {
      std::fprintf(stderr, "amx_emulator_test: skipped: this CPU lacks AVX-512F/BW\n");
      return 77;
    }
    std::fprintf(stderr, "amx_emulator_test: the emulator is not active (TILEJIT_AMX_EMULATE=%s)\n",
                 std::getenv("TILEJIT_AMX_EMULATE"));
    return 1;
  }
  return RUN_ALL_TESTS();
}
