// The int8 (W8A8) brgemm micro-kernels of the Xbyak rows: u8 activations ×
// i8 weights → int32 sums, AMX (tdpbusd, A in the PackedA tile layout) and
// AVX-512 (vpdpbusd, row-major A), through jit::get(desc) on the path of the
// TILEJIT_ISA variant (tests/CMakeLists.txt registers one per path; a case
// of another path, or of a path this CPU/OS lacks, is skipped with the reason).
//
// The contract (codegen/brgemm_desc.h, BrgemmDesc's types and BrgemmArgs'
// int8 fields; codegen/packed_layout.h, Int8Layout):
//   acc[r][c] = Σ_batch Σ_k a[r][k]·b[k][c]  (+ acc_in[r][c] with accumulate), int32;
//   out = i32: acc itself (a partial K chunk);
//   out = f32 / bf16: act(float(acc − a_zero[r]·b_comp[c])·a_scale[r]·b_scale[c] + bias[c]).
//
// The cases, per path (M: the path's most rows for the block, AMX 32,
// AVX-512 avx512_brgemm_max_mr(nz)):
//   m_*       every mr 1..M at nr 64 and 17;
//   n_*       nr 1 15 16 17 33 48 63 64 at full M and at 5 rows;
//   k_*       kb 4 8 60 64 68 128 132 1024 (AMX rounds kb up to its K step of
//             64: the zero padding of A and B must contribute nothing), out i32
//             and f32, on the full tile and on a sub-tile;
//   batch_*   batch 3 with and without acc_in;
//   epi_*     every activation × bias (none, f32, bf16) × out (f32, bf16) ×
//             acc_in (off, on), zero points 0 / 128 / random cycling, on two shapes;
//   i32_*     raw sums: acc_in off, own buffer, in place over C, padded ldc;
//   stride_*  lda and ldc larger than the row;
//   extreme_* a = 255 and b = −128 (or 127) everywhere at kb 1024 × batch 3:
//             |Σ| ≈ 1.0e8 in int32 (a pairwise int16 product sum such as
//             vpmaddubsw's would saturate), zero points 0 and 128;
//   wrap_*    Σ = 255·127·71680 > 2^31 in one accumulator: the int32 sum
//             wraps mod 2^32 as tdpbusd's and vpdpbusd's do (vpdpbusds
//             would saturate at 2^31 − 1: the kernels must not use it).
//   glu*      the GLU epilogue (gate columns 0..31, up 32..63 of the block;
//             see the section's comment): every kind (act_mul with silu,
//             gelu_tanh, gelu_erf; clamped_swiglu) × bias × out f32 / bf16,
//             nr 1 17 31 32, every mr, K tails, batch 3 with int32 acc_in,
//             zero points 0 / 128 / random.
// Plus the registry's refusals (kb % 4, GLU with i32 out or nr > 32, i32 out
// with bias/act, mixed dtypes, AMX int8 without a_packed) and the
// descriptor's name.
//
// Traps (as tests/brgemm_test_util.h): every A block, B block, a_scale,
// a_zero, b_scale, b_comp, bias and acc_in ends at a PROT_NONE page
// (GuardedBuffer), so a read past it faults; A's row padding, acc_in's row
// padding and B's columns past nr hold garbage; C is surrounded by
// kBrgemmGuard sentinel elements and its row padding is sentinel: a store
// outside C[mr × nr] fails the case.
//
// Reference: exact int64 sums of the u8·s8 products, then the epilogue in
// double. Tolerance:
//  - out i32: bit-exact (integer arithmetic, nothing rounds).
//  - out f32: with P = (acc − z·comp)·a_scale·b_scale exact, the kernel rounds
//    three times before the bias (float(t) is exact below 2^24 in magnitude,
//    else one rounding; then two f32 multiplies), each ≤ u = 2⁻²⁴ relative,
//    so its product is within ((1+u)³ − 1)·|P| ≤ 3.01·u·|P|; the bias add
//    rounds once more, ≤ u·(|P|(1 + 3.01u) + |bias|): the pre-activation is
//    within e = 4.01·u·|P| + 1.01·u·|bias|. The activation stretches that by
//    its Lipschitz constant and adds its vector-math error
//    (runtime/reference_error_bounds.h: activation_lipschitz,
//    activation_math_error); the final f32 rounding of none/relu adds u·|ref|.
//  - out bf16: the f32 bound scaled by 1 + 2⁻⁸, plus one bf16 ulp of the
//    reference (bf16_ulp_bound): the rounding to bf16 of a value near a
//    rounding boundary may fall either way.
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "runtime/cpu_features.h"
#include "runtime/reference_error_bounds.h"
#include "tests/support/activations.h"
#include "tilejit/error.h"

namespace tilejit::test {
namespace {

using codegen::Int8Layout;

enum class Zero { none, half, random };  // a_zero: 0, 128, or per row in [0, 255]
enum class Fill { random, min, max };    // a, b random; a = 255 with b = −128 / 127

struct Int8Case {
  Isa path = Isa::avx512;
  std::string group;
  int mr = 1, nr = 64;
  int64_t kb = 4;
  int batch = 1;
  int64_t lda_pad = 0, ldc_pad = 0;  // bytes / elements past the row
  Activation act = Activation::none;
  BiasKind bias = BiasKind::none;
  DType out = DType::f32;
  Acc acc = Acc::off;  // alias: out i32 only (acc_in is int32)
  Zero zero = Zero::random;
  Fill fill = Fill::random;
  bool shared_blocks = false;  // every batch item reads the same A and B block

  BrgemmDesc desc() const {
    BrgemmDesc d;
    d.isa = path;
    d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.b_row_bytes = Int8Layout::kRowBytes;
    d.a_packed = path == Isa::amx;
    d.accumulate = acc != Acc::off;
    d.bias = bias, d.act = act, d.out = out;
    return d;
  }
  std::string str() const {
    std::string s = fmt::format("{}_m{}n{}k{}", group, mr, nr, kb);
    if (batch > 1) s += fmt::format("_b{}", batch);
    if (lda_pad) s += fmt::format("_lda{}", kb + lda_pad);
    if (ldc_pad) s += fmt::format("_ldc{}", nr + ldc_pad);
    s += fmt::format("_{}", activation_name(act));
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    s += zero == Zero::none ? "_z0" : zero == Zero::half ? "_z128" : "_zrand";
    if (acc == Acc::separate) s += "_accin";
    if (acc == Acc::alias) s += "_accinplace";
    if (fill == Fill::min) s += "_a255bm128";
    if (fill == Fill::max) s += "_a255b127";
    return s + "_" + dtype_name(out);
  }
};

void PrintTo(const Int8Case& c, std::ostream* os) {
  *os << isa_name(c.path) << "/" << c.str();
}

// ---------------------------------------------------------------------------
// Inputs.

constexpr uint8_t kGarbage = 0xa5;

struct Int8Data {
  Int8Case c;
  int64_t lda = 0, ldc = 0, ld_acc = 0;  // bytes (A), elements (C, acc_in)
  std::vector<std::vector<uint8_t>> x;   // [blocks][mr × kb]
  std::vector<std::vector<int8_t>> w;    // [blocks][nr × kb]
  std::vector<float> a_scale, b_scale;   // [mr], [64] (0 past nr)
  std::vector<int32_t> a_zero, b_comp;   // [mr], [64] (0 past nr)
  std::vector<float> bias;               // [nr], bf16-exact for a bf16 bias
  std::vector<int32_t> acc_in;           // [mr × nr]
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::vector<const void*> a_list, b_list;  // [batch]
  const void* bias_ptr = nullptr;
  const int32_t* acc_ptr = nullptr;  // Acc::separate
  const float *a_scale_ptr = nullptr, *b_scale_ptr = nullptr;
  const int32_t *a_zero_ptr = nullptr, *b_comp_ptr = nullptr;

  int blocks() const { return c.shared_blocks ? 1 : c.batch; }
  GuardedBuffer& buffer(size_t bytes) {
    bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(bytes, 1)));
    return *bufs.back();
  }
  template <class T>
  const T* guarded_copy(const std::vector<T>& v) {
    GuardedBuffer& b = buffer(v.size() * sizeof(T));
    std::memcpy(b.data(), v.data(), v.size() * sizeof(T));
    return b.as<T>();
  }
};

Int8Data make_data(const Int8Case& c) {
  Int8Data d;
  d.c = c;
  d.lda = c.kb + c.lda_pad;
  d.ldc = c.nr + c.ldc_pad;
  d.ld_acc = c.acc == Acc::alias ? d.ldc : c.nr + 5;
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.str())));
  auto uniform_int = [&](int lo, int hi) {
    return std::uniform_int_distribution<int>(lo, hi)(rng);
  };
  auto uniform = [&](double lo, double hi) {
    return std::uniform_real_distribution<double>(lo, hi)(rng);
  };
  const Int8Layout layout{Int8Layout::kBlockN, c.kb};
  const codegen::PackedA pa{c.kb / 2};  // byte geometry: 64 u8 per 32-"element" K step
  for (int b = 0; b < d.blocks(); ++b) {
    std::vector<uint8_t> x(size_t(c.mr * c.kb));
    std::vector<int8_t> w(size_t(Int8Layout::kBlockN * c.kb));  // garbage past nr
    for (auto& v : x) v = c.fill == Fill::random ? uint8_t(uniform_int(0, 255)) : uint8_t(255);
    for (size_t i = 0; i < w.size(); ++i) {
      const bool real = int64_t(i) < c.nr * c.kb;
      w[i] = !real || c.fill == Fill::random ? int8_t(uniform_int(-128, 127))
             : c.fill == Fill::min           ? int8_t(-128)
                                             : int8_t(127);
    }
    if (c.path == Isa::amx) {
      // The PackedA tile layout in bytes, K zero-padded to the step of 64;
      // rows past mr garbage.
      const size_t bytes = size_t(pa.bytes(c.mr));
      uint8_t* p = d.buffer(bytes).as<uint8_t>();
      std::fill(p, p + bytes, kGarbage);
      for (int r = 0; r < c.mr; ++r)
        for (int64_t k = 0; k < pa.k_steps() * 64; ++k)
          p[pa.offset(r, k / 2) + k % 2] = k < c.kb ? x[size_t(r * c.kb + k)] : 0;
      d.a_list.push_back(p);
    } else {
      // Row-major, rows of lda bytes (padding garbage); the last row ends at the guard.
      const size_t bytes = size_t((c.mr - 1) * d.lda + c.kb);
      uint8_t* p = d.buffer(bytes).as<uint8_t>();
      std::fill(p, p + bytes, kGarbage);
      for (int r = 0; r < c.mr; ++r) std::memcpy(p + r * d.lda, &x[size_t(r * c.kb)], size_t(c.kb));
      d.a_list.push_back(p);
    }
    // One packed 64-column block (Int8Layout), K padding zero.
    const size_t b_bytes = size_t(layout.block_bytes());
    int8_t* bp = d.buffer(b_bytes).as<int8_t>();
    std::fill(bp, bp + b_bytes, int8_t(0));
    for (int n = 0; n < Int8Layout::kBlockN; ++n)
      for (int64_t k = 0; k < c.kb; ++k) bp[layout.index(n, k)] = w[size_t(n * c.kb + k)];
    d.b_list.push_back(bp);
    d.x.push_back(std::move(x));
    d.w.push_back(std::move(w));
  }
  while (int(d.a_list.size()) < c.batch) {
    d.a_list.push_back(d.a_list[0]);
    d.b_list.push_back(d.b_list[0]);
  }
  // Scales giving pre-activations of a few units (the activations' interesting range).
  const double ktot = double(c.kb) * c.batch;
  const double s = std::sqrt(5.0 / (74.0 * 100.0 * std::sqrt(ktot)));
  for (int r = 0; r < c.mr; ++r) {
    d.a_scale.push_back(float(s * uniform(0.5, 1.5)));
    d.a_zero.push_back(c.zero == Zero::none ? 0 : c.zero == Zero::half ? 128 : uniform_int(0, 255));
  }
  d.b_scale.assign(64, 0.0f);
  d.b_comp.assign(64, 0);
  for (int n = 0; n < c.nr; ++n) {
    d.b_scale[size_t(n)] = float(s * uniform(0.5, 1.5) * (uniform_int(0, 3) == 0 ? -1 : 1));
    int64_t comp = 0;  // Σ_k b[k][n] over the whole K of the call
    for (int b = 0; b < c.batch; ++b)
      for (int64_t k = 0; k < c.kb; ++k) comp += d.w[size_t(b % d.blocks())][size_t(n * c.kb + k)];
    d.b_comp[size_t(n)] = int32_t(comp);
  }
  d.a_scale_ptr = d.guarded_copy(d.a_scale);
  d.a_zero_ptr = d.guarded_copy(d.a_zero);
  d.b_scale_ptr = d.guarded_copy(d.b_scale);
  d.b_comp_ptr = d.guarded_copy(d.b_comp);
  if (c.bias == BiasKind::f32) {
    for (int n = 0; n < c.nr; ++n) d.bias.push_back(float(uniform(-5, 5)));
    d.bias_ptr = d.guarded_copy(d.bias);
  } else if (c.bias == BiasKind::bf16) {
    std::vector<uint16_t> h;
    for (int n = 0; n < c.nr; ++n) h.push_back(f32_to_bf16(float(uniform(-5, 5))));
    for (uint16_t v : h) d.bias.push_back(bf16_to_f32(v));
    d.bias_ptr = d.guarded_copy(h);
  }
  if (c.acc != Acc::off) {
    for (int i = 0; i < c.mr * c.nr; ++i) d.acc_in.push_back(uniform_int(-(1 << 22), 1 << 22));
    if (c.acc == Acc::separate) {
      const size_t elems = size_t((c.mr - 1) * d.ld_acc + c.nr);
      int32_t* p = d.buffer(elems * 4).as<int32_t>();
      std::fill(p, p + elems, int32_t(0x5a5a5a5a));
      for (int r = 0; r < c.mr; ++r)
        for (int n = 0; n < c.nr; ++n) p[r * d.ld_acc + n] = d.acc_in[size_t(r * c.nr + n)];
      d.acc_ptr = p;
    }
  }
  return d;
}

// ---------------------------------------------------------------------------
// The run, the reference, the check.

size_t out_bytes(DType t) {
  return t == DType::bf16 ? 2 : 4;
}

// Runs fn; returns C [mr × ldc] with kBrgemmGuard sentinel elements on each side.
std::vector<uint8_t> run(const Int8Data& d, BrgemmFn fn) {
  const Int8Case& c = d.c;
  const size_t es = out_bytes(c.out);
  std::vector<uint8_t> buf = sentinel_c(c.mr, d.ldc, es);
  uint8_t* cp = buf.data() + kBrgemmGuard * es;
  if (c.acc == Acc::alias)
    for (int r = 0; r < c.mr; ++r)
      std::memcpy(cp + r * d.ldc * 4, &d.acc_in[size_t(r * c.nr)], size_t(c.nr) * 4);
  BrgemmArgs args{};
  args.a = d.a_list.data();
  args.b = d.b_list.data();
  args.batch = c.batch;
  args.lda = d.lda;
  args.c = cp;
  args.ldc = d.ldc * int64_t(es);
  args.bias = d.bias_ptr;
  if (c.acc == Acc::separate) args.acc_in = reinterpret_cast<const float*>(d.acc_ptr);
  if (c.acc == Acc::alias) args.acc_in = reinterpret_cast<const float*>(cp);
  args.ld_acc_in = d.ld_acc * 4;
  args.a_scale = d.a_scale_ptr;
  args.a_zero = d.a_zero_ptr;
  args.b_scale = d.b_scale_ptr;
  args.b_comp = d.b_comp_ptr;
  fn(&args);
  return buf;
}

// The exact Σ_batch Σ_k a·b (+ acc_in) of output [r][n].
int64_t exact_sum(const Int8Data& d, int r, int n) {
  const Int8Case& c = d.c;
  int64_t s = 0;
  for (int b = 0; b < c.batch; ++b) {
    const std::vector<uint8_t>& x = d.x[size_t(b % d.blocks())];
    const std::vector<int8_t>& w = d.w[size_t(b % d.blocks())];
    for (int64_t k = 0; k < c.kb; ++k)
      s += int64_t(x[size_t(r * c.kb + k)]) * int64_t(w[size_t(n * c.kb + k)]);
  }
  if (c.acc != Acc::off) s += d.acc_in[size_t(r * c.nr + n)];
  return s;
}

::testing::AssertionResult check(const Int8Data& d, const std::vector<uint8_t>& got) {
  const Int8Case& c = d.c;
  const size_t es = out_bytes(c.out);
  const uint8_t* body = got.data() + kBrgemmGuard * int64_t(es);
  constexpr double u = runtime::kF32Unit;
  int64_t bad = 0;
  std::string msg;
  double worst = 0;
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < c.nr; ++n) {
      const int64_t sum = exact_sum(d, r, n);
      const int64_t e = r * d.ldc + n;
      if (c.out == DType::i32) {
        // The int32 sum, wrapping mod 2^32 (the wrap cases) like the hardware.
        const int32_t want = int32_t(uint32_t(uint64_t(sum)));
        int32_t g;
        std::memcpy(&g, body + e * 4, 4);
        if (g != want && bad++ < 5)
          msg += fmt::format("\n  C[{}, {}] = {}, reference {}", r, n, g, want);
        continue;
      }
      const int64_t t = sum - int64_t(d.a_zero[size_t(r)]) * d.b_comp[size_t(n)];
      if (t < INT32_MIN || t > INT32_MAX)
        return ::testing::AssertionFailure() << c.str() << ": test inputs overflow int32";
      const double p = double(t) * double(d.a_scale[size_t(r)]) * double(d.b_scale[size_t(n)]);
      const double bias = c.bias != BiasKind::none ? d.bias[size_t(n)] : 0.0;
      const double pre = p + bias;
      const double want = runtime::reference_activation(c.act, pre);
      double tol = runtime::activation_error(c.act, pre,
                                             4.01 * u * std::fabs(p) + 1.01 * u * std::fabs(bias)) +
                   runtime::activation_math_error(c.act, pre) + u * std::fabs(want);
      if (c.out == DType::bf16)
        tol = tol * (1 + std::ldexp(1.0, -8)) + runtime::bf16_ulp_bound(want);
      const double g = read_out(body, c.out, e);
      const double err = std::fabs(g - want);
      if (std::isfinite(g) && tol > 0) worst = std::max(worst, err / tol);
      if (!std::isfinite(g) || !(err <= tol)) {
        if (bad++ < 5)
          msg += fmt::format(
              "\n  C[{}, {}] = {}, reference {} (int sum {}, t {}), |err| {:.3g} > "
              "tol {:.3g}",
              r, n, g, want, sum, t, err, tol);
      }
    }
  std::string tmsg;
  const int64_t touched = touched_outside_c(got, es, c.mr, d.ldc, c.nr, &tmsg);
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess() << "worst err/tol " << worst;
  auto res = ::testing::AssertionFailure() << isa_name(c.path) << "/" << c.str() << ": ";
  if (bad) res << bad << " of " << c.mr * c.nr << " outputs wrong" << msg;
  if (touched) res << "\n" << touched << " elements outside C[mr × nr] were written" << tmsg;
  return res;
}

// ---------------------------------------------------------------------------
// The cases of one path.

int max_mr(Isa path, int nr) {
  if (path == Isa::amx) return 32;
  return codegen::xbyak::avx512_brgemm_max_mr((nr + 15) / 16);
}

std::vector<Int8Case> cases(Isa path) {
  std::vector<Int8Case> v;
  std::set<std::string> seen;
  auto add = [&](Int8Case c) {
    c.path = path;
    if (path == Isa::amx && c.lda_pad != 0) c.lda_pad = 0;  // packed A: lda is unused
    if (seen.insert(c.str()).second) v.push_back(c);
  };
  const DType outs[] = {DType::i32, DType::f32, DType::bf16};
  const int m64 = max_mr(path, 64);
  // m: every row count at a full and a tailed column block.
  int i = 0;
  for (int nr : {64, 17})
    for (int mr = 1; mr <= max_mr(path, nr); ++mr) {
      Int8Case c;
      c.group = "m";
      c.mr = mr, c.nr = nr, c.kb = 68;
      c.out = outs[i++ % 3];
      add(c);
    }
  // n: every sub-tile of the block, at full M and at 5 rows.
  i = 0;
  for (int nr : {1, 15, 16, 17, 33, 48, 63, 64})
    for (int mr : {max_mr(path, nr), 5})
      for (int64_t kb : {4, 132}) {
        Int8Case c;
        c.group = "n";
        c.mr = mr, c.nr = nr, c.kb = kb;
        c.out = outs[i++ % 3];
        add(c);
      }
  // k: below, at and past the AMX K step, large.
  for (int64_t kb : {4, 8, 60, 64, 68, 128, 132, 1024})
    for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}})
      for (DType out : {DType::i32, DType::f32}) {
        Int8Case c;
        c.group = "k";
        c.mr = mr, c.nr = nr, c.kb = kb, c.out = out;
        add(c);
      }
  // batch 3.
  for (int64_t kb : {4, 64, 68, 132})
    for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}})
      for (Acc acc : {Acc::off, Acc::separate})
        for (DType out : {DType::i32, DType::f32}) {
          Int8Case c;
          c.group = "batch";
          c.mr = mr, c.nr = nr, c.kb = kb, c.batch = 3, c.acc = acc, c.out = out;
          add(c);
        }
  // Every epilogue on an N-tailed sub-tile and on a full tile with batch 2
  // (AMX: the epilogue from the scratch either way: an f32 output is scaled).
  const std::vector<Activation> acts = testing_support::all_activations();
  const Zero zeros[] = {Zero::none, Zero::half, Zero::random};
  i = 0;
  for (int shape = 0; shape < 2; ++shape)
    for (Activation act : acts)
      for (BiasKind bias : {BiasKind::none, BiasKind::f32, BiasKind::bf16})
        for (DType out : {DType::f32, DType::bf16})
          for (Acc acc : {Acc::off, Acc::separate}) {
            Int8Case c;
            c.group = "epi";
            if (shape == 0)
              c.mr = 3, c.nr = 17, c.kb = 68;
            else
              c.mr = m64, c.nr = 64, c.kb = 128, c.batch = 2;
            c.act = act, c.bias = bias, c.out = out, c.acc = acc;
            c.zero = zeros[i++ % 3];
            add(c);
          }
  // Raw int32 sums: acc_in off, own buffer, in place over C; whole tiles
  // (AMX: acc_in loaded into and C stored from the tiles) and a tail.
  for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{5, 33}, std::pair{17, 48}})
    for (Acc acc : {Acc::off, Acc::separate, Acc::alias})
      for (int64_t ldc_pad : {0, 11}) {
        Int8Case c;
        c.group = "i32";
        c.mr = std::min(mr, max_mr(path, nr)), c.nr = nr, c.kb = 132, c.batch = 2;
        c.acc = acc, c.ldc_pad = ldc_pad, c.out = DType::i32;
        add(c);
      }
  // Strided A and C.
  for (auto [mr, nr, kb] : {std::tuple{m64, 64, int64_t(132)}, std::tuple{5, 17, int64_t(68)}})
    for (auto [lp, cp] : {std::pair{7, 0}, std::pair{0, 11}, std::pair{7, 11}})
      for (DType out : {DType::i32, DType::bf16}) {
        Int8Case c;
        c.group = "stride";
        c.mr = mr, c.nr = nr, c.kb = kb, c.lda_pad = lp, c.ldc_pad = cp, c.out = out;
        c.act = out == DType::bf16 ? Activation::silu : Activation::none;
        add(c);
      }
  // Extreme values at a large K.
  for (Fill fill : {Fill::min, Fill::max})
    for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}})
      for (DType out : outs)
        for (Zero zero : {Zero::none, Zero::half}) {
          if (out == DType::i32 && zero == Zero::half) continue;  // i32 takes no zero point
          Int8Case c;
          c.group = "extreme";
          c.mr = mr, c.nr = nr, c.kb = 1024, c.batch = 3;
          c.fill = fill, c.out = out, c.zero = zero;
          c.bias = out == DType::bf16 ? BiasKind::f32 : BiasKind::none;
          add(c);
        }
  // One accumulator past 2^31 (mr·nz = 8 keeps the AVX-512 kernel at one
  // accumulator copy, so the dot products themselves cross it): 70 batch
  // items of the same block.
  for (auto [mr, nr] : {std::pair{2, 64}, std::pair{1, 17}}) {
    Int8Case c;
    c.group = "wrap";
    c.mr = mr, c.nr = nr, c.kb = 1024, c.batch = 70, c.shared_blocks = true;
    c.fill = Fill::max, c.out = DType::i32;
    add(c);
  }
  return v;
}

// ---------------------------------------------------------------------------
// The suite.

class Int8Brgemm : public ::testing::TestWithParam<Int8Case> {};

TEST_P(Int8Brgemm, MatchesReference) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const Int8Case& c = GetParam();
  const Isa active = cpu_info().isa;
  if (c.path != active)
    GTEST_SKIP() << "a case of the " << isa_name(c.path) << " path; this run's path is "
                 << isa_name(active) << " (int8 brgemm kernels: amx, avx512)";
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, c.path);
  ASSERT_NE(row, nullptr);
  const runtime::Feature int8_feature =
      c.path == Isa::amx ? runtime::Feature::amx_int8 : runtime::Feature::avx512_vnni;
  if (!jit::row_runs_here(*row) || !runtime::detected_features().contains({int8_feature}))
    GTEST_SKIP() << "brgemm row " << isa_name(c.path) << " with int8 needs " << row->needs.str()
                 << " + " << runtime::feature_name(int8_feature) << ", usable here "
                 << runtime::detected_features().str();
  const Int8Data d = make_data(c);
  const jit::Kernel& k = jit::get(c.desc());
  EXPECT_TRUE(check(d, run(d, k.entry<BrgemmFn>())));
}

std::string case_name(const ::testing::TestParamInfo<Int8Case>& info) {
  return info.param.str();
}

INSTANTIATE_TEST_SUITE_P(amx, Int8Brgemm, ::testing::ValuesIn(cases(Isa::amx)), case_name);
INSTANTIATE_TEST_SUITE_P(avx512, Int8Brgemm, ::testing::ValuesIn(cases(Isa::avx512)), case_name);

// ---------------------------------------------------------------------------
// The int8 GLU epilogue (BrgemmDesc::glu with a = u8; its statement:
// BrgemmArgs in codegen/brgemm_desc.h). The block holds 64 columns (gate
// 0..31, up 32..63), the kernel computes all 64 and stores nr ≤ 32 outputs.
// The inputs are make_data's for the full 64-column block (every A, B,
// scale, zero, compensation, bias and acc_in array guarded); b_scale, b_comp
// and bias are 0 in the columns no output uses (nr..31, 32+nr..63), as a
// pack pads them.
//
// Scalar statement (the oracle), per output [r][j], j < nr, for col in
// {j, 32 + j}: the exact int64 sum (+ acc_in), t = sum − a_zero[r]·b_comp[col]
// (asserted inside int32), then in float and in the contract's order
// v = float(t); v *= a_scale[r]; v *= b_scale[col]; v += bias[col]: gate and up,
// bit for bit the kernel's f32 values (the same integer steps and the same
// correctly rounded f32 operations). ref = reference_glu(gate, up) in double.
// Tolerance: the kernel's f32 glu of those exact gate and up is within εa of
// ref, εa = runtime::moe_act_error with no input error (its vectorised
// exp / erf / tanh approximations and a few f32 roundings); an f32 output
// must be within εa; a bf16 output is that value rounded to nearest even,
// which moves it by at most half a bf16 ulp, so within one bf16 ulp of ref
// (bf16_ulp_bound) plus εa.

struct GluInt8Case {
  Int8Case base;  // the 64-column block's inputs (base.nr = 64)
  int nr = 32;    // outputs
  Glu glu = Glu::act_mul;

  BrgemmDesc desc() const {
    BrgemmDesc d = base.desc();
    d.nr = nr;
    d.glu = glu;
    if (glu == Glu::clamped_swiglu) d.glu_alpha = kGluAlpha, d.glu_limit = kSwigluLimit;
    return d;
  }
  std::string str() const {
    std::string s = base.str();
    s.replace(s.find("n64"), 3, fmt::format("n{}", nr));
    return fmt::format("glu{}_{}", glu == Glu::clamped_swiglu ? "swiglu" : "", s);
  }
  // The pre-activations have a standard deviation of a few units: a small
  // limit makes both clamps bite.
  static constexpr float kSwigluLimit = 2.5f;
};

void PrintTo(const GluInt8Case& c, std::ostream* os) {
  *os << isa_name(c.base.path) << "/" << c.str();
}

Int8Data make_glu_data(const GluInt8Case& c) {
  Int8Data d = make_data(c.base);
  auto used = [&](int col) { return col % 32 < c.nr; };
  for (int col = 0; col < 64; ++col)
    if (!used(col)) {
      d.b_scale[size_t(col)] = 0;
      d.b_comp[size_t(col)] = 0;
      if (!d.bias.empty()) d.bias[size_t(col)] = 0;
    }
  d.b_scale_ptr = d.guarded_copy(d.b_scale);
  d.b_comp_ptr = d.guarded_copy(d.b_comp);
  if (c.base.bias == BiasKind::f32) {
    d.bias_ptr = d.guarded_copy(d.bias);
  } else if (c.base.bias == BiasKind::bf16) {
    std::vector<uint16_t> h;
    for (float v : d.bias) h.push_back(f32_to_bf16(v));  // exact: bf16 values
    d.bias_ptr = d.guarded_copy(h);
  }
  return d;
}

// Runs fn with C [mr × ldc], ldc = nr + 3 (the padding and guards sentinel).
std::vector<uint8_t> run_glu(const GluInt8Case& c, const Int8Data& d, BrgemmFn fn, int64_t ldc) {
  const size_t es = out_bytes(c.base.out);
  std::vector<uint8_t> buf = sentinel_c(c.base.mr, ldc, es);
  BrgemmArgs args{};
  args.a = d.a_list.data();
  args.b = d.b_list.data();
  args.batch = c.base.batch;
  args.lda = d.lda;
  args.c = buf.data() + kBrgemmGuard * es;
  args.ldc = ldc * int64_t(es);
  args.bias = d.bias_ptr;
  if (c.base.acc == Acc::separate) args.acc_in = reinterpret_cast<const float*>(d.acc_ptr);
  args.ld_acc_in = d.ld_acc * 4;
  args.a_scale = d.a_scale_ptr;
  args.a_zero = d.a_zero_ptr;
  args.b_scale = d.b_scale_ptr;
  args.b_comp = d.b_comp_ptr;
  fn(&args);
  return buf;
}

::testing::AssertionResult check_glu(const GluInt8Case& c, const Int8Data& d,
                                     const std::vector<uint8_t>& got, int64_t ldc) {
  const Int8Case& b = c.base;
  const size_t es = out_bytes(b.out);
  const uint8_t* body = got.data() + kBrgemmGuard * int64_t(es);
  runtime::ReferenceGlu rg;
  rg.act = b.act;
  rg.clamped_swiglu = c.glu == Glu::clamped_swiglu;
  rg.alpha = double(kGluAlpha);
  rg.limit = double(GluInt8Case::kSwigluLimit);
  int64_t bad = 0;
  std::string msg;
  for (int r = 0; r < b.mr; ++r)
    for (int j = 0; j < c.nr; ++j) {
      float pre[2];
      for (int h = 0; h < 2; ++h) {
        const int col = j + 32 * h;
        const int64_t t =
            exact_sum(d, r, col) - int64_t(d.a_zero[size_t(r)]) * d.b_comp[size_t(col)];
        if (t < INT32_MIN || t > INT32_MAX)
          return ::testing::AssertionFailure() << c.str() << ": test inputs overflow int32";
        float v = float(int32_t(t));
        v *= d.a_scale[size_t(r)];
        v *= d.b_scale[size_t(col)];
        if (b.bias != BiasKind::none) v += d.bias[size_t(col)];
        pre[h] = v;
      }
      const double want = runtime::reference_glu(rg, pre[0], pre[1]);
      runtime::MoeActPoint pt;
      pt.gate = pre[0], pt.up = pre[1], pt.act = want;
      double tol = runtime::moe_act_error(rg, pt, 0.0);
      if (b.out == DType::bf16) tol += runtime::bf16_ulp_bound(want);
      const double g = read_out(body, b.out, r * ldc + j);
      if (!std::isfinite(g) || !(std::fabs(g - want) <= tol)) {
        if (bad++ < 5)
          msg += fmt::format(
              "\n  C[{}, {}] = {}, reference {} (gate {}, up {}), |err| {:.3g} > "
              "tol {:.3g}",
              r, j, g, want, pre[0], pre[1], std::fabs(g - want), tol);
      }
    }
  std::string tmsg;
  const int64_t touched = touched_outside_c(got, es, b.mr, ldc, c.nr, &tmsg);
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess();
  auto res = ::testing::AssertionFailure() << isa_name(b.path) << "/" << c.str() << ": ";
  if (bad) res << bad << " of " << b.mr * c.nr << " outputs wrong" << msg;
  if (touched) res << "\n" << touched << " elements outside C[mr × nr] were written" << tmsg;
  return res;
}

std::vector<GluInt8Case> glu_cases(Isa path) {
  std::vector<GluInt8Case> v;
  std::set<std::string> seen;
  struct Kind {
    Glu glu;
    Activation act;
  };
  const Kind kinds[] = {{Glu::act_mul, Activation::silu},
                        {Glu::act_mul, Activation::gelu_tanh},
                        {Glu::act_mul, Activation::gelu_erf},
                        {Glu::clamped_swiglu, Activation::none}};
  const BiasKind biases[] = {BiasKind::none, BiasKind::f32, BiasKind::bf16};
  const Zero zeros[] = {Zero::random, Zero::half, Zero::none};
  const DType outs[] = {DType::bf16, DType::f32};
  int i = 0;
  // One case; the GLU kind, bias, zero point and out rotate with i unless given.
  auto add = [&](const std::string& group, int mr, int nr, int64_t kb, int batch, Acc acc,
                 int kind = -1, int bias = -1, int out = -1) {
    GluInt8Case c;
    const Kind k = kinds[kind >= 0 ? kind : i % 4];
    c.glu = k.glu, c.nr = nr;
    c.base.path = path;
    c.base.group = group;
    c.base.mr = mr, c.base.nr = 64, c.base.kb = kb, c.base.batch = batch;
    c.base.act = k.act;
    c.base.bias = biases[bias >= 0 ? bias : (i / 4) % 3];
    c.base.zero = zeros[(i / 3) % 3];
    c.base.out = outs[out >= 0 ? out : (i / 2) % 2];
    c.base.acc = acc;
    ++i;
    if (seen.insert(c.str()).second) v.push_back(c);
  };
  const int mmax = path == Isa::amx ? 32 : codegen::xbyak::avx512_brgemm_max_mr(4);
  // Every GLU kind × bias × out on an N-tailed decode block, zero points rotating.
  for (int kind = 0; kind < 4; ++kind)
    for (int bias = 0; bias < 3; ++bias)
      for (int out = 0; out < 2; ++out) add("gluepi", 3, 17, 68, 1, Acc::off, kind, bias, out);
  // nr tails at a few row counts, K rotating.
  const int64_t kbs[] = {4, 68, 132};
  int q = 0;
  for (int nr : {1, 17, 31, 32})
    for (int mr : {1, 5, mmax}) add("glun", mr, nr, kbs[q++ % 3], 1, Acc::off);
  // Every row count (AMX: tile row tails) at an N tail.
  for (int mr = 1; mr <= mmax; ++mr) add("glum", mr, 17, 68, 1, Acc::off);
  // K tails (AMX: K rounds up to its step of 64) at the full block.
  for (int64_t kb : {4, 8, 60, 64, 68, 128, 132, 1024}) add("gluk", mmax, 32, kb, 1, Acc::off);
  // Batch and int32 acc_in (the partial sums of earlier K chunks, 64 columns).
  for (Acc acc : {Acc::off, Acc::separate})
    for (auto [mr, nr] : {std::pair{mmax, 32}, std::pair{3, 17}, std::pair{2, 1}})
      add("glubatch", mr, nr, 132, 3, acc);
  return v;
}

class Int8GluBrgemm : public ::testing::TestWithParam<GluInt8Case> {};

TEST_P(Int8GluBrgemm, MatchesScalarStatement) {
  TILEJIT_SKIP_IF_ISA_MISSING();
  const GluInt8Case& c = GetParam();
  const Isa path = c.base.path;
  const Isa active = cpu_info().isa;
  if (path != active)
    GTEST_SKIP() << "a case of the " << isa_name(path) << " path; this run's path is "
                 << isa_name(active) << " (int8 brgemm kernels: amx, avx512)";
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, path);
  ASSERT_NE(row, nullptr);
  const runtime::Feature int8_feature =
      path == Isa::amx ? runtime::Feature::amx_int8 : runtime::Feature::avx512_vnni;
  if (!jit::row_runs_here(*row) || !runtime::detected_features().contains({int8_feature}))
    GTEST_SKIP() << "brgemm row " << isa_name(path) << " with int8 needs " << row->needs.str()
                 << " + " << runtime::feature_name(int8_feature) << ", usable here "
                 << runtime::detected_features().str();
  const Int8Data d = make_glu_data(c);
  const int64_t ldc = c.nr + 3;
  const jit::Kernel& k = jit::get(c.desc());
  EXPECT_TRUE(check_glu(c, d, run_glu(c, d, k.entry<BrgemmFn>(), ldc), ldc));
}

std::string glu_case_name(const ::testing::TestParamInfo<GluInt8Case>& info) {
  return info.param.str();
}

INSTANTIATE_TEST_SUITE_P(amx, Int8GluBrgemm, ::testing::ValuesIn(glu_cases(Isa::amx)),
                         glu_case_name);
INSTANTIATE_TEST_SUITE_P(avx512, Int8GluBrgemm, ::testing::ValuesIn(glu_cases(Isa::avx512)),
                         glu_case_name);

// ---------------------------------------------------------------------------
// The descriptor and the registry's refusals (checked before any code is
// emitted: they run on every machine).

BrgemmDesc int8_desc(Isa isa) {
  Int8Case c;
  c.path = isa;
  c.mr = 4, c.nr = 64, c.kb = 256;
  return c.desc();
}

// jit::get(d) raises a tilejit::Error (not an internal one) naming `needles`.
void expect_refused(const BrgemmDesc& d, std::initializer_list<const char*> needles) {
  try {
    jit::get(d);
    ADD_FAILURE() << d.key() << " was accepted";
  } catch (const InternalError& e) {
    ADD_FAILURE() << d.key() << ": an internal error instead of the caller's: " << e.what();
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "'" << n << "' missing from: " << what;
  }
}

TEST(Int8BrgemmDesc, NameAndKey) {
  BrgemmDesc d = int8_desc(Isa::avx512);
  d.a_packed = false;
  d.out = DType::bf16;
  EXPECT_EQ(d.name(), "brgemm_avx512_u8xi8_i32acc_m4n64k256_bf16out");
  EXPECT_NE(d.key().find("a=u8;b=i8;zeros=0;acc=i32;mr=4;nr=64;kb=256;"), std::string::npos)
      << d.key();
  d = int8_desc(Isa::amx);
  d.out = DType::i32;
  EXPECT_EQ(d.name(), "brgemm_amx_u8xi8_i32acc_m4n64k256_apack_i32out");
  // A GLU is part of the name and key: each kind and its constants.
  BrgemmDesc g = int8_desc(Isa::avx512);
  g.nr = 32, g.out = DType::bf16;
  BrgemmDesc plain = g;
  g.glu = Glu::act_mul, g.act = Activation::silu;
  BrgemmDesc sw = g;
  sw.glu = Glu::clamped_swiglu, sw.act = Activation::none, sw.glu_alpha = 1.702f,
  sw.glu_limit = 7.0f;
  BrgemmDesc sw2 = sw;
  sw2.glu_limit = 6.0f;
  const std::set<std::string> names = {plain.name(), g.name(), sw.name(), sw2.name()};
  const std::set<std::string> keys = {plain.key(), g.key(), sw.key(), sw2.key()};
  EXPECT_EQ(names.size(), 4u) << g.name() << " " << sw.name() << " " << sw2.name();
  EXPECT_EQ(keys.size(), 4u);
  EXPECT_NE(g.name().find("and_mul"), std::string::npos) << g.name();
}

TEST(Int8BrgemmErrors, KbNotMultipleOf4) {
  for (Isa isa : {Isa::amx, Isa::avx512}) {
    BrgemmDesc d = int8_desc(isa);
    d.kb = 6;
    expect_refused(d, {"kb=6", "multiple of 4"});
  }
}

TEST(Int8BrgemmErrors, GluWithI32OutOrMoreThan32Columns) {
  for (Isa isa : {Isa::amx, Isa::avx512}) {
    BrgemmDesc d = int8_desc(isa);
    d.nr = 17;
    d.glu = Glu::act_mul;
    d.act = Activation::silu;
    d.out = DType::i32;  // a GLU is a final epilogue: no raw partial sums
    expect_refused(d, {"out=i32", "glu=and_mul", "glu=none"});
    d.out = DType::bf16;
    d.nr = 33;
    expect_refused(d, {"nr > 32"});
  }
}

TEST(Int8BrgemmErrors, I32OutWithBiasOrAct) {
  for (Isa isa : {Isa::amx, Isa::avx512}) {
    BrgemmDesc d = int8_desc(isa);
    d.out = DType::i32;
    d.bias = BiasKind::f32;
    expect_refused(d, {"out=i32", "bias=f32", "allowed: bias=none act=none"});
    d.bias = BiasKind::none;
    d.act = Activation::relu;
    expect_refused(d, {"out=i32", "act=relu"});
  }
}

TEST(Int8BrgemmErrors, MixedOrOtherDtypes) {
  struct T {
    DType a, b, acc;
  };
  for (Isa isa : {Isa::amx, Isa::avx512})
    for (T t : {T{DType::u8, DType::bf16, DType::i32}, T{DType::bf16, DType::i8, DType::f32},
                T{DType::u8, DType::i8, DType::f32}, T{DType::i8, DType::i8, DType::i32},
                T{DType::u8, DType::u8, DType::i32}}) {
      BrgemmDesc d = int8_desc(isa);
      d.a_type = t.a, d.b_type = t.b, d.acc_type = t.acc;
      const std::string fields =
          fmt::format("a={} b={} acc={}", dtype_name(t.a), dtype_name(t.b), dtype_name(t.acc));
      expect_refused(d, {fields.c_str(), "a=u8 b=i8 acc=i32", "a=bf16 b=bf16 acc=f32"});
    }
  // Outputs: bf16 kernels take f32 | bf16, int8 ones i32 | f32 | bf16.
  BrgemmDesc d = int8_desc(Isa::avx512);
  d.out = DType::f16;
  expect_refused(d, {"out=f16", "i32, f32, bf16"});
  d = BrgemmDesc{};
  d.out = DType::i32;
  expect_refused(d, {"out=i32", "f32, bf16"});
}

TEST(Int8BrgemmErrors, AmxWithoutPackedA) {
  BrgemmDesc d = int8_desc(Isa::amx);
  d.a_packed = false;
  expect_refused(d, {"a_packed=0", "allowed: a_packed"});
}

}  // namespace
}  // namespace tilejit::test
