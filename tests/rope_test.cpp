// tilejit::rope against the double-precision reference (runtime/reference_rope.h)
// on the active ISA path.
//
// Error bound per rotated element, with mag = |x·cos| + |x'·sin| (x' the pair
// partner; the reference reports it):
//  - f32 out: |got − ref| ≤ 2⁻²²·mag. The kernel rounds the product x'·sin
//    (≤ 2⁻²⁴·|x'·sin|) and then the fma (≤ 2⁻²⁴·|result| ≤ 2⁻²⁴·mag): 2⁻²³·mag
//    in all, doubled for headroom. Inputs and cache values are exact in both.
//  - bf16 out: |got − ref| ≤ 2⁻⁷·|ref| + 2⁻²¹·mag: one bf16 ulp of the result
//    (rounding the f32 value costs at most half of one) plus the f32 error above.
// Elements past rotary_dim, and all memory around the views, must keep their bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/reference_error_bounds.h"
#include "runtime/reference_rope.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

enum class Mode { plain, ndim2, mrope };

struct RopeCase {
  RopeStyle style = RopeStyle::neox;
  DType dtype = DType::bf16, cache_dtype = DType::f32;
  int64_t d = 128, rotary_dim = 0;  // 0: d
  int64_t hq = 4, hk = 2;           // hk 0: k absent
  Mode mode = Mode::plain;
  std::vector<int64_t> sections;  // mrope
  bool interleaved = false;       // mrope: Qwen3-VL's interleaved sections
  int64_t t = 7, max_position = 50;
  bool fused = false;      // q and k as views of one [T, (Hq + 2·Hk)·D + pad] qkv buffer
  int64_t head_pad = 0;    // fused: extra elements between heads
  int64_t cache_pad = 0;   // extra elements per cache row
  int64_t pos_stride = 1;  // token stride of positions
  DType pos_dtype = DType::i32;
};

int64_t rd_of(const RopeCase& c) {
  return c.rotary_dim ? c.rotary_dim : c.d;
}

std::string case_str(const RopeCase& c) {
  std::ostringstream s;
  s << (c.style == RopeStyle::neox ? "neox" : "gptj") << "_" << dtype_name(c.dtype) << "_cache"
    << dtype_name(c.cache_dtype) << "_d" << c.d << "_rd" << rd_of(c) << "_hq" << c.hq << "_hk"
    << c.hk
    << (c.mode == Mode::ndim2   ? "_nd2"
        : c.mode == Mode::mrope ? (c.interleaved ? "_mropeil" : "_mrope")
                                : "")
    << "_t" << c.t << (c.fused ? "_fused" : "") << (c.pos_dtype == DType::i64 ? "_pos64" : "");
  return s.str();
}

void PrintTo(const RopeCase& c, std::ostream* os) {
  *os << case_str(c);
}

int64_t streams_of(const RopeCase& c) {
  return c.mode == Mode::ndim2 ? 2 : c.mode == Mode::mrope ? int64_t(c.sections.size()) : 1;
}

RopeOptions options_of(const RopeCase& c) {
  RopeOptions o;
  o.style = c.style;
  o.rotary_dim = c.rotary_dim;
  if (c.mode == Mode::ndim2) o.ndim = 2;
  if (c.mode == Mode::mrope) o.mrope_section = c.sections;
  o.mrope_interleaved = c.interleaved;
  return o;
}

double read(DType t, const void* p, int64_t at) {
  if (t == DType::f32) return static_cast<const float*>(p)[at];
  return bf16_to_f32(static_cast<const uint16_t*>(p)[at]);
}
void write(DType t, void* p, int64_t at, double v) {
  if (t == DType::f32)
    static_cast<float*>(p)[at] = static_cast<float>(v);
  else
    static_cast<uint16_t*>(p)[at] = f32_to_bf16(static_cast<float>(v));
}

// A real cos/sin table: θ_i(p) = p·10000^(−2i/W).
void fill_cache(void* cache, DType t, int64_t rows, int64_t width, int64_t row_stride) {
  for (int64_t p = 0; p < rows; ++p)
    for (int64_t i = 0; i < width / 2; ++i) {
      const double th = double(p) * std::pow(10000.0, -2.0 * double(i) / double(width));
      write(t, cache, p * row_stride + i, std::cos(th));
      write(t, cache, p * row_stride + width / 2 + i, std::sin(th));
    }
}

void run_case(const RopeCase& c) {
  SCOPED_TRACE(case_str(c));
  const int64_t rd = rd_of(c), ndim = c.mode == Mode::ndim2 ? 2 : 1, width = rd / ndim;
  const int64_t eb = dtype_bits(c.dtype) / 8, S = streams_of(c);
  const uint32_t seed =
      seed_of({c.d, rd, c.hq, c.hk, int64_t(c.mode), int64_t(c.style), int64_t(c.dtype),
               int64_t(c.cache_dtype), c.t, int64_t(c.interleaved)});
  // Activations: one buffer for q (and k, when fused), ending at a guard page.
  const int64_t hstride = c.d + c.head_pad;
  const int64_t qrow = c.fused ? (c.hq + 2 * c.hk) * hstride + 8 : c.hq * hstride;
  const int64_t krow = c.hk * hstride;
  GuardedBuffer qbuf(size_t(std::max<int64_t>(1, c.t * qrow * eb)));
  GuardedBuffer kbuf(size_t(std::max<int64_t>(1, c.t * krow * eb)));
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> ud(-2, 2);
  for (int64_t i = 0; i < c.t * qrow; ++i) write(c.dtype, qbuf.data(), i, ud(rng));
  for (int64_t i = 0; i < c.t * krow; ++i) write(c.dtype, kbuf.data(), i, ud(rng));
  TensorView q(qbuf.data(), c.dtype, {c.t, c.hq, c.d}, {qrow, hstride, 1});
  TensorView k;
  if (c.fused)
    k = TensorView(static_cast<char*>(qbuf.data()) + c.hq * hstride * eb, c.dtype, {c.t, c.hk, c.d},
                   {qrow, hstride, 1});
  else
    k = TensorView(kbuf.data(), c.dtype, {c.t, c.hk, c.d}, {krow, hstride, 1});

  const int64_t cstride = width + c.cache_pad;
  GuardedBuffer cbuf(size_t(c.max_position * cstride * dtype_bits(c.cache_dtype) / 8));
  fill_cache(cbuf.data(), c.cache_dtype, c.max_position, width, cstride);
  TensorView cache(cbuf.data(), c.cache_dtype, {c.max_position, width}, {cstride, 1});

  // Positions end at a guard page too: an int64 table read as int32 (or the
  // reverse) reads the wrong rows, and a kernel reading past it faults.
  const int64_t pb = dtype_bits(c.pos_dtype) / 8, npos = S * c.t * c.pos_stride;
  GuardedBuffer pbuf(size_t(std::max<int64_t>(1, npos * pb)));
  std::vector<int64_t> pos(static_cast<size_t>(npos));
  std::uniform_int_distribution<int64_t> pd(0, c.max_position - 1);
  for (auto& p : pos) p = pd(rng);
  if (c.t > 0) pos[0] = c.max_position - 1;  // the last row is reachable
  for (int64_t i = 0; i < npos; ++i) {
    if (c.pos_dtype == DType::i64)
      pbuf.as<int64_t>()[i] = pos[size_t(i)];
    else
      pbuf.as<int32_t>()[i] = int32_t(pos[size_t(i)]);
  }
  TensorView positions =
      S == 1 && c.mode == Mode::plain
          ? TensorView(pbuf.data(), c.pos_dtype, {c.t}, {c.pos_stride})
          : TensorView(pbuf.data(), c.pos_dtype, {S, c.t}, {c.t * c.pos_stride, c.pos_stride});

  std::vector<uint8_t> q0(qbuf.bytes()), k0(kbuf.bytes());
  std::memcpy(q0.data(), qbuf.data(), q0.size());
  std::memcpy(k0.data(), kbuf.data(), k0.size());
  rope(q, c.hk ? &k : nullptr, positions, cache, options_of(c));

  runtime::ReferenceRope r;
  r.neox = c.style == RopeStyle::neox;
  r.rotary_dim = rd;
  r.ndim = ndim;
  r.mrope_section = c.mode == Mode::mrope ? c.sections : std::vector<int64_t>{};
  r.mrope_interleaved = c.interleaved;
  std::vector<double> x(c.d), ref(c.d), mag(c.d);
  // Bytes the call may change: the rotary part of every q / k head.
  std::vector<uint8_t> qmay(q0.size()), kmay(k0.size());
  int failures = 0;
  auto check_heads = [&](const TensorView& v, const std::vector<uint8_t>& before,
                         std::vector<uint8_t>& may, const void* buf_base, const char* which) {
    const int64_t off =
        (static_cast<const char*>(v.data) - static_cast<const char*>(buf_base)) / eb;
    for (int64_t t = 0; t < c.t; ++t) {
      const auto row = [&](int64_t s, int64_t col) {
        return read(c.cache_dtype, cbuf.data(),
                    pos[s * c.t * c.pos_stride + t * c.pos_stride] * cstride + col);
      };
      for (int64_t h = 0; h < v.shape[1]; ++h) {
        const int64_t base = off + t * v.strides[0] + h * v.strides[1];
        for (int64_t i = 0; i < c.d; ++i) x[i] = read(c.dtype, before.data(), base + i);
        runtime::reference_rope_head(r, c.d, x.data(), ref.data(), row, mag.data());
        for (int64_t i = 0; i < rd; ++i) {
          for (int64_t b = 0; b < eb; ++b) may[size_t((base + i) * eb + b)] = 1;
          const double got = read(c.dtype, buf_base, base + i);
          const double tol = runtime::rope_output_bound(c.dtype, mag[i], ref[i]);
          if (!(std::fabs(got - ref[i]) <= tol) && ++failures <= 5)
            ADD_FAILURE() << which << "[" << t << "][" << h << "][" << i << "] = " << got
                          << ", want " << ref[i] << " ± " << tol;
        }
      }
    }
  };
  check_heads(q, q0, qmay, qbuf.data(), "q");
  if (c.hk) {
    if (c.fused)
      check_heads(k, q0, qmay, qbuf.data(), "k");
    else
      check_heads(k, k0, kmay, kbuf.data(), "k");
  }
  auto untouched = [&](const uint8_t* now, const std::vector<uint8_t>& before,
                       const std::vector<uint8_t>& may, const char* which) {
    for (size_t i = 0; i < before.size(); ++i)
      if (!may[i] && now[i] != before[i]) {
        ADD_FAILURE() << which << " byte " << i << " outside the rotary parts changed";
        return;
      }
  };
  untouched(static_cast<const uint8_t*>(qbuf.data()), q0, qmay, "q buffer");
  untouched(static_cast<const uint8_t*>(kbuf.data()), k0, kmay, "k buffer");
}

// ---------------------------------------------------------------------------
// The battery: style × dtype × cache dtype × full/partial × D × mode × k absent.

// Partial rotary: ~60 % of D, a multiple of 4 (ndim 2 needs it), mostly not of 16.
int64_t partial_rd(int64_t d) {
  return d * 6 / 10 / 4 * 4;
}

// M-RoPE sections of rd/2 pairs in the 1 : 1.5 : 1.5 proportion of [16, 24, 24].
std::vector<int64_t> sections_of(int64_t rd) {
  const int64_t half = rd / 2, s0 = half / 4, s1 = (half - s0) / 2;
  return {s0, s1, half - s0 - s1};
}

std::vector<RopeCase> battery() {
  std::vector<RopeCase> v;
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj})
    for (DType dt : {DType::f32, DType::bf16})
      for (DType ct : {DType::f32, DType::bf16})
        for (bool partial : {false, true})
          for (int64_t d : {64, 72, 80, 128, 160, 256})
            for (Mode m : {Mode::plain, Mode::ndim2, Mode::mrope})
              for (int64_t hk : {0, 2}) {
                RopeCase c;
                c.style = st, c.dtype = dt, c.cache_dtype = ct, c.d = d, c.mode = m, c.hk = hk;
                c.rotary_dim = partial ? partial_rd(d) : 0;
                if (m == Mode::mrope) c.sections = sections_of(rd_of(c));
                c.hq = hk ? 3 : 2;
                v.push_back(c);
              }
  return v;
}

class RopeBattery : public IsaTestWithParam<RopeCase> {};
TEST_P(RopeBattery, MatchesReference) {
  run_case(GetParam());
}
INSTANTIATE_TEST_SUITE_P(All, RopeBattery, ::testing::ValuesIn(battery()),
                         [](const auto& p) { return case_str(p.param); });

class Rope : public IsaTest {};

TEST_F(Rope, QwenMropeSections16x24x24) {
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj}) {
    RopeCase c;
    c.style = st, c.d = 128, c.mode = Mode::mrope, c.sections = {16, 24, 24}, c.hq = 4, c.hk = 1;
    run_case(c);
  }
}

// Interleaved M-RoPE (Qwen3-VL): the streams alternate at every frequency,
// so each kernel block blends its cos/sin lanes from three rows. Sections:
// Qwen3-VL's [24, 20, 20] (D = 128, a t-only tail of 4 frequencies), odd
// sizes on a partial rotary of 2·15 (h's 3·7 reaches past R/2 = 15: its
// slice ends at the table's end, as in sglang), a long t-only tail ([13, 3,
// 4]: the last block has one stream, plain loads) and h, w larger than t.
// Every style × q/k dtype × cache dtype; token counts 1 and 33 (several
// chunks per thread); fused qkv views with strided positions.
TEST_F(Rope, InterleavedMrope) {
  struct Shape {
    int64_t d, rd;
    std::vector<int64_t> sections;
  };
  const Shape shapes[] = {
      {128, 0, {24, 20, 20}}, {40, 30, {5, 7, 3}}, {48, 40, {13, 3, 4}}, {80, 80, {6, 17, 17}}};
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj})
    for (DType dt : {DType::f32, DType::bf16})
      for (DType ct : {DType::f32, DType::bf16})
        for (const Shape& sh : shapes) {
          RopeCase c;
          c.style = st, c.dtype = dt, c.cache_dtype = ct, c.d = sh.d, c.rotary_dim = sh.rd;
          c.mode = Mode::mrope, c.sections = sh.sections, c.interleaved = true;
          c.hq = 3, c.hk = 1, c.t = sh.d == 128 ? 33 : 1, c.max_position = 300;
          run_case(c);
        }
  RopeCase fused;
  fused.d = 128, fused.hq = 4, fused.hk = 2, fused.t = 9, fused.mode = Mode::mrope;
  fused.sections = {24, 20, 20}, fused.interleaved = true;
  fused.fused = true, fused.head_pad = 6, fused.cache_pad = 2, fused.pos_stride = 3;
  fused.pos_dtype = DType::i64;
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj}) {
    fused.style = st;
    run_case(fused);
  }
}

// The reference's stream map on Qwen3-VL's sections, spelled out: the
// oracle itself must deal t, h, w round-robin (t = 24, h = w = 20 of 64),
// with frequencies 60..63 left to t.
TEST_F(Rope, ReferenceInterleavedStreamsOfQwen3Vl) {
  const std::vector<int64_t> sec = {24, 20, 20};
  int64_t count[3] = {0, 0, 0};
  for (int64_t j = 0; j < 64; ++j) {
    const int64_t s = runtime::reference_interleaved_stream(sec, j);
    ++count[s];
    EXPECT_EQ(s, j < 60 ? j % 3 : 0) << "frequency " << j;
  }
  EXPECT_EQ(count[0], 24);
  EXPECT_EQ(count[1], 20);
  EXPECT_EQ(count[2], 20);
}

// The interleaving changes the emitted kernel, so it is part of the key:
// the same shape with and without it compiles two kernels, and the results
// differ (streams hold different positions).
TEST_F(Rope, InterleavedIsItsOwnKernel) {
  if (cpu_info().isa == Isa::scalar || !cpu_info().llvm_backend) GTEST_SKIP() << "no kernel";
  const int64_t t = 2, d = 16;
  std::vector<float> q0(t * d), q1;
  for (size_t i = 0; i < q0.size(); ++i) q0[i] = float(i % 7) - 3.0f;
  q1 = q0;
  std::vector<float> cache(8 * d);
  fill_cache(cache.data(), DType::f32, 8, d, d);
  std::vector<int32_t> pos = {1, 2, 3, 4, 5, 6};  // t, h, w rows differ
  const TensorView pv(pos.data(), DType::i32, {3, t}), cv(cache.data(), DType::f32, {8, d});
  RopeOptions o;
  o.mrope_section = {2, 3, 3};
  rope({q0.data(), DType::f32, {t, 1, d}}, nullptr, pv, cv, o);
  const uint64_t before = cache_stats().compiles;
  o.mrope_interleaved = true;
  rope({q1.data(), DType::f32, {t, 1, d}}, nullptr, pv, cv, o);
  EXPECT_EQ(cache_stats().compiles, before + 1);
  EXPECT_NE(q0, q1);
}

TEST_F(Rope, GemmaVision2d) {
  for (DType dt : {DType::f32, DType::bf16}) {
    RopeCase c;
    c.dtype = dt, c.d = 160, c.mode = Mode::ndim2, c.hq = 4, c.hk = 4, c.t = 9;
    run_case(c);
  }
}

TEST_F(Rope, FusedQkvViewsAndStrides) {
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj})
    for (DType dt : {DType::f32, DType::bf16})
      for (int64_t pad : {0, 6}) {
        RopeCase c;
        c.style = st, c.dtype = dt, c.d = 80, c.rotary_dim = 40, c.hq = 4, c.hk = 2;
        c.fused = true, c.head_pad = pad, c.cache_pad = pad, c.pos_stride = pad ? 3 : 1;
        run_case(c);
        c.mode = Mode::mrope, c.sections = {4, 8, 8};
        run_case(c);
      }
}

TEST_F(Rope, SmallAndOddShapes) {
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj})
    for (int64_t rd : {2, 4, 6, 18, 34}) {
      RopeCase c;
      c.style = st, c.d = 36, c.rotary_dim = rd, c.hq = 1, c.hk = 1;
      run_case(c);
    }
  RopeCase tiny;
  tiny.d = 2, tiny.hq = 1, tiny.hk = 0;
  run_case(tiny);
}

TEST_F(Rope, TokenCounts) {
  for (int64_t t : {0, 1, 2, 33, 301}) {
    RopeCase c;
    c.t = t, c.d = 64, c.hq = 8, c.hk = 2, c.max_position = 4096;
    run_case(c);
  }
}

TEST_F(Rope, CompilesOncePerShape) {
  RopeCase c;
  c.d = 96, c.rotary_dim = 48, c.hq = 5, c.hk = 1;
  run_case(c);
  const uint64_t compiles = cache_stats().compiles;
  run_case(c);
  c.t = 40;  // the token count is a runtime argument
  run_case(c);
  EXPECT_EQ(cache_stats().compiles, compiles);
}

// bf16 results that are f32 subnormals round to nearest even like any other
// (the AVX-512 BF16 conversion would flush them to zero; the kernel takes the
// integer rounding for such a head). Inputs m·2⁻¹³³ (bf16 subnormals) times
// cos = 0.75, sin = 0.5 give exact f32 results, so the expected bits are the
// RNE of the exact value. Head 1 of q and head 0 of k are subnormal, the rest
// normal (values m·2⁻⁶), so both paths run in one call.
TEST_F(Rope, SubnormalResultsRoundToNearestEven) {
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj}) {
    const int64_t t = 3, hq = 3, hk = 2, d = 128;
    std::vector<uint16_t> q(t * hq * d), k(t * hk * d);
    std::vector<double> qx(q.size()), kx(k.size());
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> m(-127, 127);
    const auto fill = [&](std::vector<uint16_t>& bits, std::vector<double>& x, int64_t heads,
                          int64_t tiny_head) {
      for (size_t i = 0; i < bits.size(); ++i) {
        const bool tiny = int64_t(i / d) % heads == tiny_head;
        x[i] = std::ldexp(m(rng), tiny ? -133 : -6);
        bits[i] = f32_to_bf16(static_cast<float>(x[i]));
        ASSERT_EQ(double(bf16_to_f32(bits[i])), x[i]);
      }
    };
    fill(q, qx, hq, 1);
    fill(k, kx, hk, 0);
    std::vector<float> cache(2 * d);
    for (int64_t r = 0; r < 2; ++r)
      for (int64_t i = 0; i < d / 2; ++i) cache[r * d + i] = 0.75f, cache[r * d + d / 2 + i] = 0.5f;
    std::vector<int32_t> pos = {1, 0, 1};
    TensorView qv(q.data(), DType::bf16, {t, hq, d}), kv(k.data(), DType::bf16, {t, hk, d});
    RopeOptions opt;
    opt.style = st;
    rope(qv, &kv, TensorView(pos.data(), DType::i32, {t}),
         TensorView(cache.data(), DType::f32, {2, d}), opt);
    const auto check = [&](const std::vector<uint16_t>& got, const std::vector<double>& x,
                           const char* name) {
      for (size_t i = 0; i < got.size(); ++i) {
        const int64_t l = int64_t(i % d), row = int64_t(i) - l;
        const bool first = st == RopeStyle::neox ? l < d / 2 : l % 2 == 0;
        const int64_t partner =
            st == RopeStyle::neox ? (first ? l + d / 2 : l - d / 2) : (first ? l + 1 : l - 1);
        const double exact = x[i] * 0.75 + (first ? -0.5 : 0.5) * x[row + partner];
        ASSERT_EQ(got[i], f32_to_bf16(static_cast<float>(exact)))
            << name << " element " << i << " exact " << exact << " style " << int(st);
      }
    };
    check(q, qx, "q");
    check(k, kx, "k");
  }
}

// int64 positions (what PyTorch engines pass): every mode and style, strided
// and fused views, enough tokens for several chunks per thread (each chunk's
// positions pointer is offset in bytes of the index dtype).
TEST_F(Rope, Int64Positions) {
  for (RopeStyle st : {RopeStyle::neox, RopeStyle::gptj})
    for (DType dt : {DType::f32, DType::bf16})
      for (Mode m : {Mode::plain, Mode::ndim2, Mode::mrope}) {
        RopeCase c;
        c.style = st, c.dtype = dt, c.mode = m, c.pos_dtype = DType::i64;
        c.d = 80, c.rotary_dim = 48, c.hq = 4, c.hk = 2, c.t = 67, c.max_position = 3000;
        if (m == Mode::mrope) c.sections = sections_of(48);
        run_case(c);
        c.fused = true, c.head_pad = 4, c.cache_pad = 2, c.pos_stride = 3, c.t = 5;
        run_case(c);
      }
  RopeCase llama;  // Llama-3-8B geometry, a prefill chunk
  llama.d = 128, llama.hq = 32, llama.hk = 8, llama.t = 129, llama.max_position = 8192;
  llama.pos_dtype = DType::i64;
  run_case(llama);
}

// The index width is part of the kernel: an i64 call compiles its own kernel
// once (the i32 one of the same shape is not reused for it) and then reuses it.
TEST_F(Rope, Int64CompilesOncePerShape) {
  RopeCase c;
  c.d = 112, c.rotary_dim = 64, c.hq = 3, c.hk = 1;
  run_case(c);
  const uint64_t after_i32 = cache_stats().compiles;
  c.pos_dtype = DType::i64;
  run_case(c);
  const uint64_t after_i64 = cache_stats().compiles;
  // Without LLVM every path runs the scalar reference: nothing compiles.
  if (cpu_info().isa != Isa::scalar && cpu_info().llvm_backend) {
    EXPECT_EQ(after_i64, after_i32 + 1);
  }
  c.t = 40;
  run_case(c);
  EXPECT_EQ(cache_stats().compiles, after_i64);
}

// ---------------------------------------------------------------------------
// Errors: raised before anything is read or written.

struct ErrorFixture {
  std::vector<float> q = std::vector<float>(2 * 2 * 8, 1.0f),
                     k = std::vector<float>(2 * 1 * 8, 1.0f);
  std::vector<float> cache = std::vector<float>(10 * 8, 0.5f);
  std::vector<int32_t> pos = {1, 2, 3, 4, 5, 6};
  TensorView qv{q.data(), DType::f32, {2, 2, 8}};
  TensorView kv{k.data(), DType::f32, {2, 1, 8}};
  TensorView cv{cache.data(), DType::f32, {10, 8}};
  TensorView pv{pos.data(), DType::i32, {2}};
};

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no tilejit::Error; wanted one mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST_F(Rope, Errors) {
  ErrorFixture f;
  auto call = [&](const TensorView& q, const TensorView* k, const TensorView& p,
                  const TensorView& c, RopeOptions o = {}) { rope(q, k, p, c, o); };
  std::vector<uint16_t> h(64);
  expect_error([&] { call({h.data(), DType::f16, {2, 2, 8}}, &f.kv, f.pv, f.cv); }, "q.dtype=f16");
  expect_error(
      [&] {
        call(f.qv, nullptr, f.pv, {h.data(), DType::f16, {4, 8}});
      },
      "cos_sin_cache.dtype=f16");
  expect_error(
      [&] {
        call(f.qv, &f.kv, {f.pos.data(), DType::f32, {2}}, f.cv);
      },
      "positions.dtype=f32");
  expect_error([&] { call(f.qv, nullptr, f.pv, f.cv, {.rotary_dim = 0, .ndim = 0}); }, "ndim=0");
  TensorView k_bf16(h.data(), DType::bf16, {2, 1, 8});
  expect_error([&] { call(f.qv, &k_bf16, f.pv, f.cv); }, "k.dtype=bf16");
  expect_error([&] { call({f.q.data(), DType::f32, {4, 8}}, nullptr, f.pv, f.cv); }, "rank 3");
  expect_error([&] { call({f.q.data(), DType::f32, {2, 2, 7}}, nullptr, f.pv, f.cv); }, "D=7");
  TensorView k_bad_d(f.k.data(), DType::f32, {2, 2, 4});
  expect_error([&] { call(f.qv, &k_bad_d, f.pv, f.cv); }, "k has shape [2, 2, 4]");
  TensorView k_bad_t(f.k.data(), DType::f32, {1, 1, 8});
  expect_error([&] { call(f.qv, &k_bad_t, f.pv, f.cv); }, "k has shape [1, 1, 8]");
  expect_error([&] { call(f.qv, nullptr, f.pv, f.cv, {.rotary_dim = 10}); }, "rotary_dim=10");
  expect_error([&] { call(f.qv, nullptr, f.pv, f.cv, {.rotary_dim = 5}); }, "rotary_dim=5");
  expect_error([&] { call(f.qv, nullptr, f.pv, f.cv, {.rotary_dim = 6, .ndim = 2}); },
               "rotary_dim=6");
  expect_error(
      [&] {
        call(f.qv, nullptr, {f.pos.data(), DType::i32, {3}}, f.cv);
      },
      "positions has shape [3]");
  expect_error(
      [&] {
        call(f.qv, nullptr, {f.pos.data(), DType::i32, {2, 2}}, f.cv);
      },
      "positions has shape [2, 2]");
  // A rank other than 1 or 2 names both forms (it said "allowed: rank 2").
  expect_error(
      [&] {
        call(f.qv, nullptr, {f.pos.data(), DType::i32, {}}, f.cv);
      },
      "positions has rank 0; allowed: [T] = [2] or [1, 2]");
  expect_error(
      [&] {
        call(f.qv, nullptr, f.pv, {f.cache.data(), DType::f32, {20, 4}});
      },
      "cos_sin_cache has shape [20, 4]");
  // A long list option is elided in the message (100001 entries made 300 KB).
  {
    std::vector<int64_t> many(100001, 1);
    try {
      call(f.qv, nullptr, f.pv, f.cv, {.mrope_section = many});
      ADD_FAILURE() << "no Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(
                    "mrope_section=[1, 1, 1, 1, 1, 1, 1, 1, ... 99991 more ..., 1, 1]; allowed"),
                std::string::npos)
          << e.what();
      EXPECT_LT(std::string(e.what()).size(), 400u);
    }
  }
  expect_error(
      [&] {
        call(f.qv, nullptr, f.pv, f.cv, {.mrope_section = {1, 2}});
      },
      "mrope_section=[1, 2]");
  expect_error(
      [&] {
        call(f.qv, nullptr, f.pv, f.cv, {.ndim = 2, .mrope_section = {2, 2}});
      },
      "mrope_section with ndim=2");
  expect_error(
      [&] {
        call(f.qv, nullptr, {f.pos.data(), DType::i32, {2, 2}}, f.cv,
             {.mrope_section = {2, 2}, .mrope_interleaved = true});
      },
      "mrope_interleaved=true with mrope_section=[2, 2]; allowed: 3 sections");
  expect_error([&] { call(f.qv, nullptr, f.pv, f.cv, {.mrope_interleaved = true}); },
               "mrope_interleaved=true with mrope_section=[]");
  expect_error(
      [&] {
        call(f.qv, nullptr, f.pv, f.cv, {.mrope_section = {1, 2, 2}, .mrope_interleaved = true});
      },
      "mrope_section=[1, 2, 2]; allowed: positive sizes summing to rotary_dim/2 = 4");
  TensorView q_col(f.q.data(), DType::f32, {2, 2, 4}, {16, 8, 2});
  expect_error(
      [&] {
        call(q_col, nullptr, f.pv, {f.cache.data(), DType::f32, {20, 4}});
      },
      "innermost stride 1");
  // Out of range positions: an Error, and q / k keep their values.
  for (int32_t bad : {-1, 10}) {
    f.pos[1] = bad;
    expect_error([&] { call(f.qv, &f.kv, f.pv, f.cv); }, "positions[0][1]=" + std::to_string(bad));
    for (float v : f.q) ASSERT_EQ(v, 1.0f);
    for (float v : f.k) ASSERT_EQ(v, 1.0f);
  }
  // Index dtypes other than i32 / i64.
  for (DType bad : {DType::u8, DType::i8, DType::f32})
    expect_error(
        [&] {
          call(f.qv, &f.kv, {f.pos.data(), bad, {2}}, f.cv);
        },
        std::string("positions.dtype=") + dtype_name(bad) + " is not allowed; allowed: i32, i64");
}

// int64 positions are range-checked whole: values that would be in range
// once truncated to 32 bits (2^32 + 1 → 1, 2^40 → 0) are errors too, and
// nothing is read or written. The cache is a PROT_NONE page: a read of it faults.
TEST_F(Rope, Int64PositionsOutOfRange) {
  ErrorFixture f;
  GuardedBuffer guard(1);
  // 10 rows of 8 floats "in" the guard page: any cache read faults.
  const TensorView no_cache(static_cast<char*>(guard.data()) + 1, DType::f32, {10, 8});
  std::vector<int64_t> pos = {3, 4, 5, 6};
  const int64_t cases[] = {-1,
                           10,  // max_position
                           int64_t{1} << 40,
                           (int64_t{1} << 32) + 1,
                           -(int64_t{1} << 32),
                           std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()};
  for (int64_t bad : cases) {
    for (size_t at : {size_t{0}, size_t{1}}) {
      pos = {3, 4, 5, 6};
      pos[at] = bad;
      expect_error(
          [&] {
            rope(f.qv, &f.kv, {pos.data(), DType::i64, {2}}, no_cache);
          },
          "positions[0][" + std::to_string(at) + "]=" + std::to_string(bad) +
              "; allowed: [0, max_position = 10)");
      // Two streams (ndim = 2, cache width 4): the stream index is named.
      pos = {3, 4, 5, 6};
      pos[2 + at] = bad;
      expect_error(
          [&] {
            rope(f.qv, &f.kv, {pos.data(), DType::i64, {2, 2}},
                 {static_cast<char*>(guard.data()) + 1, DType::f32, {10, 4}},
                 {.rotary_dim = 8, .ndim = 2});
          },
          "positions[1][" + std::to_string(at) + "]=" + std::to_string(bad));
    }
  }
  for (float v : f.q) ASSERT_EQ(v, 1.0f);
  for (float v : f.k) ASSERT_EQ(v, 1.0f);
  // In range, the same call runs (on a real cache).
  pos = {0, 9, 5, 6};
  rope(f.qv, &f.kv, {pos.data(), DType::i64, {2}}, f.cv);
  EXPECT_NE(f.q[0], 1.0f);
}

}  // namespace
}  // namespace tilejit::test
