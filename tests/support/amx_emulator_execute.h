// Executor of decoded AMX instructions (test support, see amx_emulator.h):
// the tile registers and configuration of one thread, and the Intel SDM
// semantics of every instruction on them, with the checks hardware makes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tests/support/amx_emulator_decode.h"

namespace tilejit::test::amx {

// Palette 1: 8 tiles of at most 16 rows x 64 bytes.
constexpr int kTiles = 8;
constexpr int kMaxRows = 16;
constexpr int kMaxColsb = 64;

struct TileConfig {
  uint8_t palette = 0;  // 0: no configuration (init state, after TILERELEASE)
  uint8_t start_row = 0;
  uint16_t colsb[kTiles] = {};
  uint8_t rows[kTiles] = {};
  bool operator==(const TileConfig&) const = default;
};

struct TileState {
  alignas(64) uint8_t data[kTiles][kMaxRows][kMaxColsb];
  TileConfig cfg;
};

// Appends text and numbers to a fixed buffer, always NUL-terminated, never
// allocating (it runs inside a signal handler).
class FixedText {
 public:
  FixedText(char* buf, size_t cap) : buf_(buf), cap_(cap) { buf_[0] = '\0'; }
  FixedText& str(const char* s);
  FixedText& dec(int64_t v);
  FixedText& hex(uint64_t v);      // 0x...
  FixedText& byte_hex(uint8_t v);  // two digits
  size_t size() const { return len_; }

 private:
  void put(char c);
  char* buf_;
  size_t cap_;
  size_t len_ = 0;
};

// What hardware would raise, and the rule that failed (text built without
// allocating: it is written from inside a signal handler).
struct Fault {
  const char* exception = "";  // "#UD" or "#GP"
  char rule[200] = {};
};

// The 64-byte memory form of a configuration, as LDTILECFG reads and
// STTILECFG writes it.
TileConfig parse_config(const uint8_t bytes[64]);
void serialize_config(const TileConfig& cfg, uint8_t bytes[64]);

// LDTILECFG's #GP rules (checked against hardware, see amx_emulator_test):
// palette 0 or 1 (0 releases, whatever the other bytes hold); bytes 2..15
// zero; tiles 0..7 with rows <= 16, colsb <= 64, rows and colsb both zero or
// both non-zero; tiles 8..15 all zero. start_row is not checked.
bool check_config(const uint8_t bytes[64], Fault* fault);

// LDTILECFG of a valid configuration: every tile zeroed.
void load_config(TileState* state, const TileConfig& cfg);

// Executes one instruction on `state`. gpr holds the general registers in
// x86 encoding order, next_rip the address right after the instruction (the
// base of RIP-relative operands). Memory operands are read and written in
// place. Returns false, with *fault filled and `state` untouched, where
// hardware raises #UD or #GP.
bool execute(const Insn& insn, const uint64_t gpr[16], uint64_t next_rip, TileState* state,
             Fault* fault);

// True where this CPU runs the executor (it uses AVX-512F/BW, F16C, FMA).
bool executor_supported();

}  // namespace tilejit::test::amx
