#include "tests/support/amx_emulator_execute.h"

#include <cpuid.h>
#include <immintrin.h>

#include <cstring>
#include <initializer_list>

namespace tilejit::test::amx {

// ---------------------------------------------------------------------------
// FixedText

void FixedText::put(char c) {
  if (len_ + 1 < cap_) {
    buf_[len_++] = c;
    buf_[len_] = '\0';
  }
}

FixedText& FixedText::str(const char* s) {
  while (*s != '\0') put(*s++);
  return *this;
}

FixedText& FixedText::dec(int64_t v) {
  char digits[24];
  int n = 0;
  uint64_t u = v < 0 ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  do {
    digits[n++] = static_cast<char>('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0) put('-');
  while (n > 0) put(digits[--n]);
  return *this;
}

FixedText& FixedText::hex(uint64_t v) {
  static const char kDigits[] = "0123456789abcdef";
  str("0x");
  int shift = 60;
  while (shift > 0 && ((v >> shift) & 0xF) == 0) shift -= 4;
  for (; shift >= 0; shift -= 4) put(kDigits[(v >> shift) & 0xF]);
  return *this;
}

FixedText& FixedText::byte_hex(uint8_t v) {
  static const char kDigits[] = "0123456789abcdef";
  put(kDigits[v >> 4]);
  put(kDigits[v & 0xF]);
  return *this;
}

namespace {

// ---------------------------------------------------------------------------
// Guest memory. Hardware reads and writes exactly colsb bytes of a row;
// masked AVX-512 byte loads and stores do the same (masked-off bytes never
// fault). Not instrumented by ASan: the emulator stands in for hardware, and
// a JIT kernel's own stack frame is not ASan's to judge.

__mmask64 byte_mask(int n) {
  return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1;
}

__attribute__((target("avx512f,avx512bw"), no_sanitize("address"))) void read_guest(uint8_t dst[64],
                                                                                    uint64_t src,
                                                                                    int n) {
  const __m512i v = _mm512_maskz_loadu_epi8(byte_mask(n), reinterpret_cast<const void*>(src));
  _mm512_storeu_si512(dst, v);
}

__attribute__((target("avx512f,avx512bw"), no_sanitize("address"))) void write_guest(
    uint64_t dst, const uint8_t src[64], int n) {
  _mm512_mask_storeu_epi8(reinterpret_cast<void*>(dst), byte_mask(n), _mm512_loadu_si512(src));
}

// ---------------------------------------------------------------------------
// The dot products. The fp32 arithmetic of TDPBF16PS/TDPFP16PS is "FMA with
// DAZ, FTZ, round to nearest even, no MXCSR access": done here with AVX-512
// FMAs under an MXCSR set to exactly that (DAZ | FTZ | RNE | all masked) and
// restored afterwards, so the program's MXCSR is neither used nor changed.
constexpr unsigned kMxcsrDazFtzRne = 0x9FC0;

// NaNs: the SDM does not say which NaN a dot product returns; measured on
// hardware (amx_emulator_test, AmxDot.*Special*): in a multiply-add the first
// NaN among the multiplicands a, b, then the accumulator, quieted; in an
// addition (even + odd, then dst + that) the first NaN among the operands;
// an invalid operation (inf * 0, inf - inf) gives the default NaN FFC00000.
// An x86 FMA picks by operand position, and the compiler chooses among the
// 132/213/231 forms, so the NaN lanes are fixed up explicitly.
__attribute__((target("avx512f"))) inline __m512 quieted(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(x), _mm512_set1_epi32(0x00400000)));
}

__attribute__((target("avx512f"))) inline __mmask16 nan_lanes(__m512 x) {
  return _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
}

__attribute__((target("avx512f"))) inline __m512 amx_fma(__m512 a, __m512 b, __m512 acc) {
  __m512 r = _mm512_fmadd_ps(a, b, acc);
  if (nan_lanes(r) == 0) return r;
  r = _mm512_mask_mov_ps(r, nan_lanes(acc), quieted(acc));
  r = _mm512_mask_mov_ps(r, nan_lanes(b), quieted(b));
  return _mm512_mask_mov_ps(r, nan_lanes(a), quieted(a));
}

__attribute__((target("avx512f"))) inline __m512 amx_add(__m512 x, __m512 y) {
  __m512 r = _mm512_add_ps(x, y);
  if (nan_lanes(r) == 0) return r;
  r = _mm512_mask_mov_ps(r, nan_lanes(y), quieted(y));
  return _mm512_mask_mov_ps(r, nan_lanes(x), quieted(x));
}

// SDM TDPBF16PS: per row m, the even and the odd bf16 products accumulate in
// two separate fp32 temporaries over k (lane n of `even` is temp1[2n], of
// `odd` temp1[2n+1]), then dst[m][n] += (temp1[2n] + temp1[2n+1]).
__attribute__((target("avx512f,avx512bw"), noinline)) void bf16_rows(float c[kMaxRows][16],
                                                                     const uint8_t (*a)[64],
                                                                     const uint8_t (*b)[64],
                                                                     int m_rows, int k_pairs) {
  const __m512i hi_half = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int m = 0; m < m_rows; ++m) {
    __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
    for (int k = 0; k < k_pairs; ++k) {
      uint32_t pair;
      std::memcpy(&pair, a[m] + 4 * k, 4);
      // make_fp32: a bf16 is the upper half of an fp32.
      const __m512 a_even = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(pair << 16)));
      const __m512 a_odd =
          _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int>(pair & 0xFFFF0000u)));
      const __m512i bk = _mm512_loadu_si512(b[k]);
      even = amx_fma(a_even, _mm512_castsi512_ps(_mm512_slli_epi32(bk, 16)), even);
      odd = amx_fma(a_odd, _mm512_castsi512_ps(_mm512_and_si512(bk, hi_half)), odd);
    }
    const __m512 pairs = amx_add(even, odd);
    _mm512_storeu_ps(c[m], amx_add(_mm512_loadu_ps(c[m]), pairs));
  }
}

// fp16 -> fp32 of a whole tile, done before MXCSR gets DAZ: TDPFP16PS keeps
// fp16 denormal inputs (they are normal numbers in fp32).
__attribute__((target("avx512f,avx512bw"), noinline)) void fp16_tile_to_f32(float out[kMaxRows][32],
                                                                            const uint8_t (*t)[64],
                                                                            int rows) {
  for (int r = 0; r < rows; ++r) {
    const __m512i v = _mm512_loadu_si512(t[r]);
    _mm512_storeu_ps(out[r], _mm512_cvtph_ps(_mm512_castsi512_si256(v)));
    _mm512_storeu_ps(out[r] + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(v, 1)));
  }
}

// TDPFP16PS as the hardware does it (amx_emulator_test compares): not the
// SDM pseudo-code's single accumulator seeded with dst, but TDPBF16PS's
// scheme: even and odd products in separate temporaries from zero, then
// dst += (even + odd).
__attribute__((target("avx512f,avx512bw"), noinline)) void fp16_rows(float c[kMaxRows][16],
                                                                     const float (*a)[32],
                                                                     const float (*b)[32],
                                                                     int m_rows, int k_pairs) {
  const __m512i even_idx =
      _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd_idx =
      _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  for (int m = 0; m < m_rows; ++m) {
    __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
    for (int k = 0; k < k_pairs; ++k) {
      const __m512 lo = _mm512_loadu_ps(b[k]), hi = _mm512_loadu_ps(b[k] + 16);
      even = amx_fma(_mm512_set1_ps(a[m][2 * k]), _mm512_permutex2var_ps(lo, even_idx, hi), even);
      odd = amx_fma(_mm512_set1_ps(a[m][2 * k + 1]), _mm512_permutex2var_ps(lo, odd_idx, hi), odd);
    }
    const __m512 pairs = amx_add(even, odd);
    _mm512_storeu_ps(c[m], amx_add(_mm512_loadu_ps(c[m]), pairs));
  }
}

// SDM TDPB[SU][SU]D: dst.dword[n] += the four byte products of a.dword[k]
// and b.dword[n], sign- or zero-extended per operand, wrapping in 32 bits.
void int8_rows(uint32_t c[kMaxRows][16], const uint8_t (*a)[64], const uint8_t (*b)[64], int m_rows,
               int k_dwords, int n_dwords, bool a_signed, bool b_signed) {
  for (int m = 0; m < m_rows; ++m) {
    for (int n = 0; n < n_dwords; ++n) {
      uint32_t acc = c[m][n];
      for (int k = 0; k < k_dwords; ++k) {
        for (int i = 0; i < 4; ++i) {
          const uint8_t x = a[m][4 * k + i], y = b[k][4 * n + i];
          const int32_t xv = a_signed ? static_cast<int8_t>(x) : x;
          const int32_t yv = b_signed ? static_cast<int8_t>(y) : y;
          acc += static_cast<uint32_t>(xv * yv);
        }
      }
      c[m][n] = acc;
    }
  }
}

// ---------------------------------------------------------------------------
// Checks

// The rule text is already in f->rule.
bool fail(Fault* f, const char* exception) {
  f->exception = exception;
  return false;
}

uint64_t effective_address(const MemOperand& m, const uint64_t gpr[16], uint64_t next_rip,
                           bool with_index) {
  uint64_t a = static_cast<uint64_t>(static_cast<int64_t>(m.disp));
  if (m.base == kRipReg) a += next_rip;
  if (m.base >= 0 && m.base < 16) a += gpr[m.base];
  if (with_index && m.index != kNoReg) a += gpr[m.index] << m.scale;
  return a;
}

bool need_config(const TileState& s, Fault* f) {
  if (s.cfg.palette != 0) return true;
  FixedText t(f->rule, sizeof f->rule);
  t.str("no tile configuration loaded (palette 0: no LDTILECFG on this thread, or released)");
  return fail(f, "#UD");
}

bool need_tile(const TileState& s, int tile, Fault* f) {
  if (s.cfg.rows[tile] != 0) return true;
  FixedText t(f->rule, sizeof f->rule);
  t.str("tmm").dec(tile).str(" is not configured (rows 0, colsb 0)");
  return fail(f, "#UD");
}

void zero_tile(TileState* s, int tile) {
  std::memset(s->data[tile], 0, sizeof s->data[tile]);
}

bool check_dot_shapes(const TileState& s, int dst, int src1, int src2, Fault* f) {
  FixedText t(f->rule, sizeof f->rule);
  if (dst == src1 || dst == src2 || src1 == src2) {
    t.str("tile operands must be distinct (tmm").dec(dst).str(", tmm").dec(src1).str(", tmm");
    t.dec(src2).str(")");
    return fail(f, "#UD");
  }
  for (int tile : {dst, src1, src2})
    if (!need_tile(s, tile, f)) return false;
  const TileConfig& c = s.cfg;
  for (int tile : {dst, src1, src2}) {
    if (c.colsb[tile] % 4 != 0) {
      t.str("tmm").dec(tile).str(".colsb (").dec(c.colsb[tile]).str(") is not a multiple of 4");
      return fail(f, "#UD");
    }
  }
  if (c.rows[dst] != c.rows[src1]) {
    t.str("dst.rows (").dec(c.rows[dst]).str(") != src1.rows (").dec(c.rows[src1]).str(")");
    return fail(f, "#UD");
  }
  if (c.colsb[src1] / 4 != c.rows[src2]) {
    t.str("src1.colsb/4 (").dec(c.colsb[src1] / 4).str(") != src2.rows (").dec(c.rows[src2]);
    t.str(")");
    return fail(f, "#UD");
  }
  if (c.colsb[dst] != c.colsb[src2]) {
    t.str("dst.colsb (").dec(c.colsb[dst]).str(") != src2.colsb (").dec(c.colsb[src2]).str(")");
    return fail(f, "#UD");
  }
  return true;
}

// write_row_and_zero / zero_upper_rows of the SDM for a dot product's result.
void finish_dot(TileState* s, int dst, const uint8_t (*rows)[64]) {
  const int m_rows = s->cfg.rows[dst], colsb = s->cfg.colsb[dst];
  for (int m = 0; m < kMaxRows; ++m) {
    uint8_t* row = s->data[dst][m];
    if (m < m_rows) {
      std::memcpy(row, rows[m], colsb);
      std::memset(row + colsb, 0, kMaxColsb - colsb);
    } else {
      std::memset(row, 0, kMaxColsb);
    }
  }
  s->cfg.start_row = 0;
}

bool execute_dot(const Insn& in, TileState* s, Fault* f) {
  const int dst = in.reg, src1 = in.rm, src2 = in.vvvv;
  if (!check_dot_shapes(*s, dst, src1, src2, f)) return false;
  const int m_rows = s->cfg.rows[dst];
  const int k = s->cfg.colsb[src1] / 4, n = s->cfg.colsb[dst] / 4;
  alignas(64) uint8_t c[kMaxRows][64];
  std::memcpy(c, s->data[dst], sizeof c);
  switch (in.op) {
    case Op::tdpbf16ps: {
      const unsigned saved = _mm_getcsr();
      _mm_setcsr(kMxcsrDazFtzRne);
      bf16_rows(reinterpret_cast<float(*)[16]>(c), s->data[src1], s->data[src2], m_rows, k);
      _mm_setcsr(saved);
      break;
    }
    case Op::tdpfp16ps: {
      alignas(64) float a32[kMaxRows][32], b32[kMaxRows][32];
      fp16_tile_to_f32(a32, s->data[src1], m_rows);
      fp16_tile_to_f32(b32, s->data[src2], k);
      const unsigned saved = _mm_getcsr();
      _mm_setcsr(kMxcsrDazFtzRne);
      fp16_rows(reinterpret_cast<float(*)[16]>(c), a32, b32, m_rows, k);
      _mm_setcsr(saved);
      break;
    }
    default: {
      const bool a_signed = in.op == Op::tdpbssd || in.op == Op::tdpbsud;
      const bool b_signed = in.op == Op::tdpbssd || in.op == Op::tdpbusd;
      int8_rows(reinterpret_cast<uint32_t(*)[16]>(c), s->data[src1], s->data[src2], m_rows, k, n,
                a_signed, b_signed);
      break;
    }
  }
  finish_dot(s, dst, c);
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------
// Configuration

TileConfig parse_config(const uint8_t b[64]) {
  TileConfig c;
  c.palette = b[0];
  c.start_row = b[1];
  for (int t = 0; t < kTiles; ++t) {
    c.colsb[t] = static_cast<uint16_t>(b[16 + 2 * t] | (b[17 + 2 * t] << 8));
    c.rows[t] = b[48 + t];
  }
  return c;
}

void serialize_config(const TileConfig& c, uint8_t b[64]) {
  std::memset(b, 0, 64);
  if (c.palette == 0) return;  // STTILECFG of the init state: 64 zero bytes
  b[0] = c.palette;
  b[1] = c.start_row;
  for (int t = 0; t < kTiles; ++t) {
    b[16 + 2 * t] = static_cast<uint8_t>(c.colsb[t] & 0xFF);
    b[17 + 2 * t] = static_cast<uint8_t>(c.colsb[t] >> 8);
    b[48 + t] = c.rows[t];
  }
}

bool check_config(const uint8_t b[64], Fault* f) {
  FixedText t(f->rule, sizeof f->rule);
  if (b[0] == 0) return true;
  if (b[0] != 1) {
    t.str("palette ").dec(b[0]).str(" is not supported (allowed: 0, 1)");
    return fail(f, "#GP");
  }
  for (int i = 2; i < 16; ++i) {
    if (b[i] != 0) {
      t.str("reserved byte ").dec(i).str(" is ").dec(b[i]).str(" (must be 0)");
      return fail(f, "#GP");
    }
  }
  const TileConfig c = parse_config(b);
  for (int i = 0; i < kTiles; ++i) {
    if (c.rows[i] > kMaxRows) {
      t.str("tmm").dec(i).str(".rows ").dec(c.rows[i]).str(" > 16");
      return fail(f, "#GP");
    }
    if (c.colsb[i] > kMaxColsb) {
      t.str("tmm").dec(i).str(".colsb ").dec(c.colsb[i]).str(" > 64");
      return fail(f, "#GP");
    }
    if ((c.rows[i] == 0) != (c.colsb[i] == 0)) {
      t.str("tmm").dec(i).str(" has rows ").dec(c.rows[i]).str(" and colsb ").dec(c.colsb[i]);
      t.str(" (both zero or both non-zero)");
      return fail(f, "#GP");
    }
  }
  for (int i = kTiles; i < 16; ++i) {
    if (b[16 + 2 * i] != 0 || b[17 + 2 * i] != 0 || b[48 + i] != 0) {
      t.str("tile ").dec(i).str(" does not exist in palette 1 (its rows/colsb must be 0)");
      return fail(f, "#GP");
    }
  }
  return true;
}

void load_config(TileState* s, const TileConfig& cfg) {
  s->cfg = cfg;
  std::memset(s->data, 0, sizeof s->data);
}

bool executor_supported() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d) == 0) return false;
  const bool avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave) return false;
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  const bool os_zmm = (lo & 0xE6) == 0xE6;
  return avx512f && avx512bw && os_zmm;
}

// ---------------------------------------------------------------------------
// Execution

bool execute(const Insn& in, const uint64_t gpr[16], uint64_t next_rip, TileState* s, Fault* f) {
  switch (in.op) {
    case Op::ldtilecfg: {
      alignas(64) uint8_t bytes[64];
      read_guest(bytes, effective_address(in.mem, gpr, next_rip, true), 64);
      if (!check_config(bytes, f)) return false;
      // Palette 0 is the init state, as after TILERELEASE.
      load_config(s, bytes[0] == 0 ? TileConfig{} : parse_config(bytes));
      return true;
    }
    case Op::sttilecfg: {
      alignas(64) uint8_t bytes[64];
      serialize_config(s->cfg, bytes);
      write_guest(effective_address(in.mem, gpr, next_rip, true), bytes, 64);
      return true;
    }
    case Op::tilerelease:
      load_config(s, TileConfig{});
      return true;
    case Op::tilezero:
      if (!need_config(*s, f) || !need_tile(*s, in.reg, f)) return false;
      zero_tile(s, in.reg);
      s->cfg.start_row = 0;
      return true;
    case Op::tileloadd:
    case Op::tileloaddt1:
    case Op::tilestored: {
      if (!need_config(*s, f) || !need_tile(*s, in.reg, f)) return false;
      const int t = in.reg, rows = s->cfg.rows[t], colsb = s->cfg.colsb[t];
      // sibmem: the index register is the row stride, not part of the address.
      const uint64_t begin = effective_address(in.mem, gpr, next_rip, false);
      const uint64_t stride = in.mem.index == kNoReg ? 0 : gpr[in.mem.index] << in.mem.scale;
      if (in.op == Op::tilestored) {
        for (int r = s->cfg.start_row; r < rows; ++r)
          write_guest(begin + uint64_t(r) * stride, s->data[t][r], colsb);
      } else {
        // Rows below start_row (a restarted load) keep their contents.
        for (int r = s->cfg.start_row; r < rows; ++r)
          read_guest(s->data[t][r], begin + uint64_t(r) * stride, colsb);
        for (int r = rows; r < kMaxRows; ++r) std::memset(s->data[t][r], 0, kMaxColsb);
      }
      s->cfg.start_row = 0;
      return true;
    }
    case Op::tdpbf16ps:
    case Op::tdpfp16ps:
    case Op::tdpbssd:
    case Op::tdpbsud:
    case Op::tdpbusd:
    case Op::tdpbuud:
      if (!need_config(*s, f)) return false;
      return execute_dot(in, s, f);
  }
  return false;
}

}  // namespace tilejit::test::amx
