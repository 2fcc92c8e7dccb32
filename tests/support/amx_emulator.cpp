#include "tests/support/amx_emulator.h"

#include <cpuid.h>
#include <signal.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "runtime/cpu_features.h"
#include "tests/support/amx_emulator_decode.h"
#include "tests/support/amx_emulator_execute.h"

namespace tilejit::test::amx {
namespace {

// Per thread, as the hardware state is. Initial-exec TLS: the handler must
// not reach the lazy TLS allocator (malloc) on a thread's first fault.
struct ThreadState {
  TileState tiles;
  // Hardware-config mode: whether `tiles` mirrors the configuration in
  // TILECFG (set once this thread has adopted one).
  bool synced = false;
};
constinit thread_local ThreadState t_state __attribute__((tls_model("initial-exec"))) = {};

std::atomic<uint64_t> g_count{0};
std::atomic<bool> g_installed{false};
std::mutex g_install_mutex;
struct sigaction g_prev_sigill;
struct sigaction g_prev_sigsegv;
bool g_hw_config = false;
unsigned g_tilecfg_offset = 0;  // of XTILECFG in the standard-format XSAVE image

// ucontext gregs index of each general register, in x86 encoding order.
constexpr int kGreg[16] = {REG_RAX, REG_RCX, REG_RDX, REG_RBX, REG_RSP, REG_RBP, REG_RSI, REG_RDI,
                           REG_R8,  REG_R9,  REG_R10, REG_R11, REG_R12, REG_R13, REG_R14, REG_R15};

const char* const kRegName[16] = {"rax", "rcx", "rdx", "rbx", "rsp", "rbp", "rsi", "rdi",
                                  "r8",  "r9",  "r10", "r11", "r12", "r13", "r14", "r15"};

void print_operands(FixedText& t, const Insn& in) {
  auto mem = [&](const MemOperand& m) {
    t.str("[");
    const char* sep = "";
    if (m.base == kRipReg) {
      t.str("rip");
      sep = " + ";
    } else if (m.base != kNoReg) {
      t.str(kRegName[m.base]);
      sep = " + ";
    }
    if (m.index != kNoReg) {
      t.str(sep).str(kRegName[m.index]);
      if (m.scale != 0) t.str("*").dec(1 << m.scale);
      sep = " + ";
    }
    if (m.disp != 0 || *sep == '\0') t.str(sep).dec(m.disp);
    t.str("]");
  };
  switch (in.op) {
    case Op::ldtilecfg:
    case Op::sttilecfg:
      mem(in.mem);
      break;
    case Op::tilerelease:
      break;
    case Op::tilezero:
      t.str("tmm").dec(in.reg);
      break;
    case Op::tileloadd:
    case Op::tileloaddt1:
      t.str("tmm").dec(in.reg).str(", ");
      mem(in.mem);
      break;
    case Op::tilestored:
      mem(in.mem);
      t.str(", tmm").dec(in.reg);
      break;
    default:
      t.str("tmm").dec(in.reg).str(", tmm").dec(in.rm).str(", tmm").dec(in.vvvv);
      break;
  }
}

// What hardware would do is kill the process; so does this, after saying why.
[[noreturn]] void die(const char* exception, const Insn* in, const uint8_t* rip, int length,
                      const char* rule) {
  char buf[512];
  FixedText t(buf, sizeof buf);
  t.str("tilejit AMX emulator: ").str(exception).str(" at ");
  if (in != nullptr) {
    t.str(op_name(in->op)).str(" ");
    print_operands(t, *in);
  } else {
    t.str("an AMX opcode");
  }
  t.str(" (rip ").hex(reinterpret_cast<uint64_t>(rip)).str(", bytes");
  for (int i = 0; i < length; ++i) t.str(" ").byte_hex(rip[i]);
  t.str("): ").str(rule).str("\n");
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, buf, t.size());
  std::abort();
}

void chain(const struct sigaction& prev, int sig, siginfo_t* si, void* ctx) {
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, si, ctx);
      return;
    }
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: restore it, then a fault happens again when the
  // instruction re-executes, and a signal someone sent is sent again.
  struct sigaction dfl = {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  if (si->si_code <= 0) raise(sig);
}

// The XTILECFG image in the signal frame's XSAVE area, or null when the
// frame has none (then the component is in its init state: no config).
uint8_t* frame_tilecfg(ucontext_t* uc, bool* present) {
  *present = false;
  auto* x = reinterpret_cast<uint8_t*>(uc->uc_mcontext.fpregs);
  if (x == nullptr) return nullptr;
  // struct _fpx_sw_bytes in the FXSAVE area's software-reserved bytes.
  uint32_t magic = 0, xstate_size = 0;
  uint64_t xfeatures = 0, xstate_bv = 0;
  std::memcpy(&magic, x + 464, 4);
  std::memcpy(&xfeatures, x + 472, 8);
  std::memcpy(&xstate_size, x + 480, 4);
  if (magic != 0x46505853u /*FP_XSTATE_MAGIC1*/ || ((xfeatures >> 17) & 1) == 0 ||
      xstate_size < g_tilecfg_offset + 64)
    return nullptr;
  std::memcpy(&xstate_bv, x + 512, 8);
  *present = true;
  return ((xstate_bv >> 17) & 1) != 0 ? x + g_tilecfg_offset : nullptr;
}

// Hardware-config mode: brings this thread's emulated state in line with
// the TILECFG the program loaded natively.
void sync_from_frame(ucontext_t* uc, ThreadState* ts, const Insn& in, const uint8_t* rip) {
  bool present = false;
  const uint8_t* image = frame_tilecfg(uc, &present);
  if (!present)
    die("internal error", &in, rip, in.length,
        "the signal frame holds no XSAVE image with XTILECFG; cannot see the tile configuration");
  TileState& s = ts->tiles;
  if (image == nullptr || image[0] == 0) {  // init state: never configured, or released
    s.cfg = TileConfig{};
    ts->synced = false;
    return;
  }
  TileConfig hw = parse_config(image);
  const bool marked = hw.start_row == kStartRowMarker;
  if (marked) hw.start_row = 0;
  if (!marked || !ts->synced || !(hw == s.cfg)) {
    load_config(&s, hw);  // a fresh LDTILECFG: tiles zeroed
    ts->synced = true;
  }
}

void mark_frame(ucontext_t* uc, const TileState& s) {
  bool present = false;
  uint8_t* image = frame_tilecfg(uc, &present);
  if (image != nullptr && s.cfg.palette != 0) image[1] = kStartRowMarker;
}

void on_sigill(int sig, siginfo_t* si, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  greg_t* g = uc->uc_mcontext.gregs;
  const auto* rip = reinterpret_cast<const uint8_t*>(g[REG_RIP]);
  // Only faults raised by an instruction are ours, not a SIGILL sent by kill().
  if (si->si_code <= 0) return chain(g_prev_sigill, sig, si, ctx);
  Insn in;
  const char* why = "";
  switch (decode(rip, &in, &why)) {
    case DecodeResult::not_amx:
      return chain(g_prev_sigill, sig, si, ctx);
    case DecodeResult::invalid:
      die("#UD", nullptr, rip, 5, why);
    case DecodeResult::ok:
      break;
  }
  ThreadState& ts = t_state;
  if (g_hw_config) sync_from_frame(uc, &ts, in, rip);
  uint64_t gpr[16];
  for (int i = 0; i < 16; ++i) gpr[i] = static_cast<uint64_t>(g[kGreg[i]]);
  Fault fault;
  if (!execute(in, gpr, reinterpret_cast<uint64_t>(rip) + in.length, &ts.tiles, &fault))
    die(fault.exception, &in, rip, in.length, fault.rule);
  if (g_hw_config) mark_frame(uc, ts.tiles);
  g[REG_RIP] += in.length;
  g_count.fetch_add(1, std::memory_order_relaxed);
}

// Hardware-config mode: LDTILECFG runs natively, so its #GP arrives as a
// SIGSEGV (si_code SI_KERNEL) at the instruction. Say which rule failed,
// as the emulated LDTILECFG does, instead of a bare segmentation fault.
void on_sigsegv(int sig, siginfo_t* si, void* ctx) {
  auto* uc = static_cast<ucontext_t*>(ctx);
  const auto* rip = reinterpret_cast<const uint8_t*>(uc->uc_mcontext.gregs[REG_RIP]);
  Insn in;
  const char* why = "";
  if (si->si_code == SI_KERNEL && decode(rip, &in, &why) == DecodeResult::ok &&
      in.op == Op::ldtilecfg) {
    greg_t* g = uc->uc_mcontext.gregs;
    uint64_t gpr[16];
    for (int i = 0; i < 16; ++i) gpr[i] = static_cast<uint64_t>(g[kGreg[i]]);
    // The config is re-checked by executing the LDTILECFG on a scratch state.
    static thread_local TileState scratch __attribute__((tls_model("initial-exec")));
    Fault fault;
    if (!execute(in, gpr, reinterpret_cast<uint64_t>(rip) + in.length, &scratch, &fault))
      die(fault.exception, &in, rip, in.length, fault.rule);
  }
  chain(g_prev_sigsegv, sig, si, ctx);
}

bool hardware_has_amx_config() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  if (((d >> 24) & 1) == 0) return false;  // AMX-TILE
  if (__get_cpuid(1, &a, &b, &c, &d) == 0 || ((c >> 27) & 1) == 0) return false;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  if ((lo & (3u << 17)) != (3u << 17)) return false;  // XTILECFG + XTILEDATA enabled
  __cpuid_count(0xD, 17, a, b, c, d);
  g_tilecfg_offset = b;
  return a == 64;
}

void install_handler(int sig, void (*fn)(int, siginfo_t*, void*), struct sigaction* prev) {
  struct sigaction sa = {};
  sa.sa_sigaction = fn;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, prev);
}

// The runtime calls install_emulator when TILEJIT_AMX_EMULATE asks for
// emulation. A priority constructor: registered before any other static
// initializer of the binary could ask for the CPU features.
__attribute__((constructor(101))) void register_with_runtime() {
  runtime::register_amx_emulator(&install_emulator);
}

// TILEJIT_AMX_EMULATE_STATS=1: how much ran under the emulator, at exit.
void print_stats() {
  std::fprintf(stderr, "tilejit AMX emulator: %llu instructions emulated\n",
               static_cast<unsigned long long>(emulated_instructions()));
}

}  // namespace

bool install_emulator() {
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (g_installed.load()) return true;
  if (!executor_supported()) {
    static const char msg[] =
        "tilejit AMX emulator: not installed: it needs AVX-512F/BW (with OS support)\n";
    [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
    return false;
  }
  g_hw_config = hardware_has_amx_config();
  install_handler(SIGILL, &on_sigill, &g_prev_sigill);
  if (g_hw_config) install_handler(SIGSEGV, &on_sigsegv, &g_prev_sigsegv);
  g_installed.store(true);
  const char* stats = std::getenv("TILEJIT_AMX_EMULATE_STATS");
  if (stats != nullptr && std::strcmp(stats, "1") == 0) std::atexit(&print_stats);
  return true;
}

bool emulator_installed() {
  return g_installed.load();
}

uint64_t emulated_instructions() {
  return g_count.load(std::memory_order_relaxed);
}

bool config_in_hardware() {
  return g_hw_config;
}

}  // namespace tilejit::test::amx
