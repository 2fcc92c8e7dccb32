// The int8 (W8A8: u8 A × i8 B → i32) batch-reduce GEMM micro-kernel of the
// LLVM backend (codegen/llvm/llvm_brgemm.h) against an exact reference, over
// the tails of the contract (codegen/brgemm_desc.h: BrgemmDesc's dtypes,
// BrgemmArgs' a_scale / a_zero / b_scale / b_comp; B in the Int8Layout of
// codegen/packed_layout.h), every epilogue, zero points 0 / 128 / random and
// extreme operands (a = 255 against b = −128 over long K: any saturating
// step, e.g. vpmaddubsw, would show). Both dot products run: the host's best
// (vpdpbusd where the target has VNNI) and the widened i32 multiply (imul);
// the ctest run llvm_int8_test_avx2 narrows the target to AVX2
// (TILEJIT_LLVM_CPU=x86-64-v3), llvm_int8_test_avxvnni to Alder Lake's
// (AVX2 + AVX-VNNI: the 256-bit vpdpbusd).
//
// Reference and tolerances:
//  - the sums Σ_k a·b (+ acc_in) in int64, exact; out i32 must equal them bit
//    for bit (they stay inside int32 by construction: |Σ| ≤ 255·128·3072);
//  - out f32 / bf16: t = sums − a_zero·b_comp exactly, then in double
//    p = t·a_scale·b_scale, pre = p + bias, act(pre). The kernel rounds three
//    times on the way to p (float(t), two multiplies: within 3u·|p|, u = 2⁻²⁴,
//    plus second order) and once adding the bias (u·|pre| ≤ u·(|p| + |bias|)):
//    runtime::gemm_output_bound(act, out, 2, |p|, |bias|, pre, act(pre)),
//    i.e. 4u·|p| + u·|bias| through the activation's Lipschitz constant, plus
//    its vector-math error, plus a bf16 ulp for bf16 out;
//  - and where the epilogue is exact past the bias (act none, relu) the
//    output must also equal, bit for bit, the contract's f32 order computed
//    here in float: v = float(t); v *= a_scale; v *= b_scale; v += bias.
//
// The GLU epilogue (act_mul with silu / gelu_tanh / gelu_erf, clamped_swiglu)
// has its own sweep and statement (Int8GluBrgemm, below).
//
// Traps: every A block, B block (exactly kb/4 k-quad rows), the scale, zero,
// compensation, bias and acc_in arrays end at a PROT_NONE page; A row padding
// is random bytes (a kernel reading it gets wrong sums); C is surrounded by
// sentinels, its row padding too: a store outside C[mr × nr] fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/llvm/llvm_brgemm.h"
#include "codegen/llvm/llvm_jit.h"
#include "codegen/llvm/mc_disassembler.h"
#include "codegen/packed_layout.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "test_util.h"
#include "tests/support/activations.h"

namespace tilejit::test {
namespace {

namespace lb = codegen::llvm_backend;
using codegen::BiasKind;
using codegen::BrgemmArgs;
using codegen::BrgemmDesc;
using codegen::BrgemmFn;
using codegen::Int8Layout;

enum class Zero { none, z128, random };
enum class Values { random, extreme };

struct Int8Case {
  std::string group;
  int mr = 1, nr = 64;
  int64_t kb = 4;
  int batch = 1;
  bool accumulate = false;
  bool in_place = false;  // acc_in aliases C (out i32)
  DType out = DType::f32;
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  Zero zero = Zero::random;
  Values values = Values::random;
  lb::BrgemmDot dot = lb::BrgemmDot::best;
  // W4A8 (BrgemmDesc::w4a8): B in [−16, 15], kb % 16 == 0, acc_in f32 added
  // after the scaling.
  bool w4a8 = false;

  BrgemmDesc desc() const {
    BrgemmDesc d;
    d.isa = Isa::llvm;
    d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.b_row_bytes = Int8Layout::kRowBytes;
    d.accumulate = accumulate;
    d.bias = bias, d.act = act, d.out = out;
    d.w4a8 = w4a8;
    return d;
  }
  std::string str() const {
    std::string s = fmt::format("{}_m{}n{}k{}", group, mr, nr, kb);
    if (batch > 1) s += fmt::format("_b{}", batch);
    s += fmt::format("_{}", activation_name(act));
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    if (accumulate) s += in_place ? "_accinplace" : "_accin";
    s += zero == Zero::none ? "_z0" : zero == Zero::z128 ? "_z128" : "_zrand";
    if (values == Values::extreme) s += "_extreme";
    if (dot == lb::BrgemmDot::imul) s += "_imul";
    if (w4a8) s += "_w4a8";
    return s + "_" + dtype_name(out);
  }
};

void PrintTo(const Int8Case& c, std::ostream* os) {
  *os << c.str();
}

constexpr int64_t kGuard = 64;  // sentinel elements before and after C

struct Buffers {
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  template <class T>
  T* make(size_t elems) {
    bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(elems * sizeof(T), 1)));
    return bufs.back()->as<T>();
  }
};

// Runs one case on `fn` and checks it; returns the failure text, or "".
std::string run_case(const Int8Case& c, BrgemmFn fn) {
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>{}(c.str()));
  std::mt19937 rng(seed);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t lda = c.kb + 3, ldc = c.nr + 7, ld_acc = c.nr + 5;
  const int64_t kq = c.kb / 4;
  Buffers mem;

  // Operands: x[b][r][k] u8, w[b][n][k] i8 for the 64 columns of the block.
  std::vector<std::vector<uint8_t>> x(size_t(c.batch));
  std::vector<std::vector<int8_t>> w(size_t(c.batch));
  std::vector<const void*> a_list, b_list;
  for (int b = 0; b < c.batch; ++b) {
    x[b].resize(size_t(c.mr * c.kb));
    w[b].resize(size_t(64 * c.kb));
    for (int r = 0; r < c.mr; ++r)
      for (int64_t k = 0; k < c.kb; ++k)
        x[b][size_t(r * c.kb + k)] =
            uint8_t(c.values == Values::extreme ? 255 : (k % 7 == 0 ? 255 : uni(0, 255)));
    for (int n = 0; n < 64; ++n)
      for (int64_t k = 0; k < c.kb; ++k)
        w[b][size_t(n * c.kb + k)] =
            c.w4a8 ? int8_t(c.values == Values::extreme ? (n % 2 == 0 ? -16 : 15)
                                                        : (k % 5 == 0 ? -16 : uni(-16, 15)))
                   : int8_t(c.values == Values::extreme ? (n % 2 == 0 ? -128 : 127)
                                                        : (k % 5 == 0 ? -128 : uni(-128, 127)));
    // A: rows of lda bytes, the padding random; the last row ends at the guard.
    const size_t a_bytes = size_t((c.mr - 1) * lda + c.kb);
    uint8_t* ap = mem.make<uint8_t>(a_bytes);
    for (size_t i = 0; i < a_bytes; ++i) ap[i] = uint8_t(uni(0, 255));
    for (int r = 0; r < c.mr; ++r) std::memcpy(ap + r * lda, x[b].data() + r * c.kb, size_t(c.kb));
    a_list.push_back(ap);
    // B: exactly the kq k-quad rows the kernel reads, in the Int8Layout.
    const Int8Layout layout{64, c.kb};
    int8_t* bp = mem.make<int8_t>(size_t(kq * Int8Layout::kRowBytes));
    for (int n = 0; n < 64; ++n)
      for (int64_t k = 0; k < c.kb; ++k) bp[layout.index(n, k)] = w[b][size_t(n * c.kb + k)];
    b_list.push_back(bp);
  }

  // Exact sums, acc_in, compensation, zero points.
  std::vector<int64_t> sum(size_t(c.mr * c.nr), 0);
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < c.nr; ++n)
      for (int b = 0; b < c.batch; ++b)
        for (int64_t k = 0; k < c.kb; ++k)
          sum[size_t(r * c.nr + n)] +=
              int64_t(x[b][size_t(r * c.kb + k)]) * int64_t(w[b][size_t(n * c.kb + k)]);
  std::vector<int32_t> acc_in(size_t(c.mr * c.nr), 0);
  std::vector<float> acc_in_f(size_t(c.mr * c.nr), 0.0f);  // W4A8: f32, after the scaling
  if (c.accumulate && !c.w4a8)
    for (auto& v : acc_in) v = uni(-(1 << 20), 1 << 20);
  if (c.accumulate && c.w4a8)
    for (auto& v : acc_in_f) v = float(uni(-8000, 8000) / 1000.0);
  int32_t* comp = mem.make<int32_t>(64);
  for (int n = 0; n < 64; ++n) {
    int64_t s = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int64_t k = 0; k < c.kb; ++k) s += w[b][size_t(n * c.kb + k)];
    comp[n] = n < c.nr ? int32_t(s) : 0;  // the contract pads with 0
  }
  int32_t* zero = mem.make<int32_t>(size_t(c.mr));
  for (int r = 0; r < c.mr; ++r)
    zero[r] = c.zero == Zero::none ? 0 : c.zero == Zero::z128 ? 128 : uni(0, 255);
  std::vector<int64_t> t(size_t(c.mr * c.nr));
  int64_t tmax = 1;
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < c.nr; ++n) {
      const size_t i = size_t(r * c.nr + n);
      const int64_t s = sum[i] + acc_in[i];
      if (s > std::numeric_limits<int32_t>::max() || s < std::numeric_limits<int32_t>::min())
        return "test bug: the sums leave int32";
      t[i] = s - int64_t(zero[r]) * comp[n];
      tmax = std::max(tmax, std::abs(t[i]));
    }
  // Scales: pre-activations up to ~8, split randomly between rows and columns.
  const double s0 = std::sqrt(8.0 / double(tmax));
  float* a_scale = mem.make<float>(size_t(c.mr));
  float* b_scale = mem.make<float>(64);
  for (int r = 0; r < c.mr; ++r) a_scale[r] = float(s0 * (0.5 + uni(0, 1000) / 1000.0));
  for (int n = 0; n < 64; ++n)
    b_scale[n] = n < c.nr ? float(s0 * (0.5 + uni(0, 1000) / 1000.0)) : 0.0f;
  std::vector<float> bias(size_t(c.nr), 0.0f);
  const void* bias_ptr = nullptr;
  if (c.bias == BiasKind::f32) {
    float* p = mem.make<float>(size_t(c.nr));
    for (int n = 0; n < c.nr; ++n) p[n] = bias[n] = float(uni(-5000, 5000) / 1000.0);
    bias_ptr = p;
  } else if (c.bias == BiasKind::bf16) {
    uint16_t* p = mem.make<uint16_t>(size_t(c.nr));
    for (int n = 0; n < c.nr; ++n) {
      p[n] = runtime::f32_to_bf16(float(uni(-5000, 5000) / 1000.0));
      bias[n] = runtime::bf16_to_f32(p[n]);
    }
    bias_ptr = p;
  }

  // C between sentinels; acc_in separate (rows of ld_acc, padding junk) or in C.
  const size_t es = c.out == DType::bf16 ? 2 : 4;
  const int64_t elems = c.mr * ldc + 2 * kGuard;
  std::vector<uint8_t> cbuf(size_t(elems) * es);
  for (int64_t e = 0; e < elems; ++e) {
    if (es == 4)
      std::memcpy(&cbuf[size_t(e) * 4], &kSentinelF32, 4);
    else
      std::memcpy(&cbuf[size_t(e) * 2], &kSentinelBf16, 2);
  }
  uint8_t* cp = cbuf.data() + kGuard * es;
  BrgemmArgs args{};
  if (c.accumulate) {
    if (c.in_place) {
      for (int r = 0; r < c.mr; ++r)
        std::memcpy(cp + r * ldc * 4, &acc_in[size_t(r * c.nr)], size_t(c.nr) * 4);
      args.acc_in = reinterpret_cast<const float*>(cp);
      args.ld_acc_in = ldc * 4;
    } else {
      const size_t n = size_t((c.mr - 1) * ld_acc + c.nr);
      int32_t* p = mem.make<int32_t>(n);
      for (size_t i = 0; i < n; ++i) p[i] = uni(-1000000000, 1000000000);
      for (int r = 0; r < c.mr; ++r)
        std::memcpy(p + r * ld_acc,
                    c.w4a8 ? static_cast<const void*>(&acc_in_f[size_t(r * c.nr)])
                           : static_cast<const void*>(&acc_in[size_t(r * c.nr)]),
                    size_t(c.nr) * 4);
      args.acc_in = reinterpret_cast<const float*>(p);
      args.ld_acc_in = ld_acc * 4;
    }
  }
  args.a = a_list.data();
  args.b = b_list.data();
  args.batch = c.batch;
  args.lda = lda;
  args.c = cp;
  args.ldc = ldc * int64_t(es);
  args.bias = bias_ptr;
  args.a_scale = a_scale;
  args.a_zero = zero;
  args.b_scale = b_scale;
  args.b_comp = comp;
  fn(&args);

  // Check.
  int64_t bad = 0;
  std::string msg;
  auto fail = [&](const std::string& m) {
    if (bad++ < 5) msg += "\n  " + m;
  };
  const bool exact_epilogue = c.act == Activation::none || c.act == Activation::relu;
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < c.nr; ++n) {
      const size_t i = size_t(r * c.nr + n);
      const int64_t e = r * ldc + n;
      if (c.out == DType::i32) {
        int32_t got;
        std::memcpy(&got, cp + e * 4, 4);
        const int64_t want = sum[i] + acc_in[i];
        if (got != want) fail(fmt::format("C[{}, {}] = {}, exact {}", r, n, got, want));
        continue;
      }
      const double got = read_out(cp, c.out, e);
      const double p = double(t[i]) * a_scale[r] * b_scale[n];
      // W4A8: the f32 acc_in joins after the scaling (one more rounding).
      const double pre = p + double(acc_in_f[i]) + bias[n];
      const double v = runtime::reference_activation(c.act, pre);
      const double tol = runtime::gemm_output_bound(c.act, c.out, c.w4a8 ? 3 : 2,
                                                    std::fabs(p) + std::fabs(acc_in_f[i]),
                                                    std::fabs(bias[n]), pre, v);
      if (!std::isfinite(got) || !(std::fabs(got - v) <= tol))
        fail(fmt::format("C[{}, {}] = {}, reference {}, |err| {:.3g} > tol {:.3g}", r, n, got, v,
                         std::fabs(got - v), tol));
      if (exact_epilogue) {
        float f = static_cast<float>(static_cast<int32_t>(t[i]));
        f *= a_scale[r];
        f *= b_scale[n];
        if (c.w4a8 && c.accumulate) f += acc_in_f[i];
        if (c.bias != BiasKind::none) f += bias[n];
        if (c.act == Activation::relu) f = f > 0 ? f : 0.0f;
        const double want =
            c.out == DType::bf16 ? double(runtime::bf16_to_f32(runtime::f32_to_bf16(f))) : f;
        if (got != want)
          fail(fmt::format("C[{}, {}] = {}, the contract's f32 order gives {}", r, n, got, want));
      }
    }
  int64_t touched = 0;
  for (int64_t e = 0; e < elems; ++e) {
    const int64_t idx = e - kGuard;
    const bool inside = idx >= 0 && idx < c.mr * ldc && idx % ldc < c.nr;
    const bool sentinel = es == 4 ? std::memcmp(&cbuf[size_t(e) * 4], &kSentinelF32, 4) == 0
                                  : std::memcmp(&cbuf[size_t(e) * 2], &kSentinelBf16, 2) == 0;
    if (!inside && !sentinel && touched++ < 5)
      msg += fmt::format("\n  C element at offset {} from C[0, 0] (ldc {}) written", idx, ldc);
  }
  if (bad == 0 && touched == 0) return "";
  return fmt::format("{}: {} of {} outputs wrong, {} outside C written{}", c.str(), bad,
                     c.mr * c.nr, touched, msg);
}

const int kNr[] = {1, 15, 16, 17, 33, 63, 64};
const int64_t kKb[] = {4, 8, 60, 64, 68, 132, 1024};
const std::vector<Activation> kActs = testing_support::all_activations();
const BiasKind kBiases[] = {BiasKind::none, BiasKind::f32, BiasKind::bf16};
const DType kOuts[] = {DType::i32, DType::f32, DType::bf16};
const Zero kZeros[] = {Zero::none, Zero::z128, Zero::random};

// Rotates the epilogue through its values (i: the case's index).
void rotate_epilogue(Int8Case& c, int i) {
  c.out = kOuts[i % 3];
  c.zero = kZeros[(i / 3) % 3];
  c.batch = (i / 2) % 2 ? 3 : 1;
  c.accumulate = (i / 5) % 2 != 0;
  if (c.out != DType::i32) {
    c.act = kActs[size_t(i / 7) % kActs.size()];
    c.bias = kBiases[(i / 4) % 3];
  } else {
    c.in_place = c.accumulate && (i / 11) % 2 != 0;
  }
}

std::vector<Int8Case> shape_sweep() {
  std::vector<Int8Case> v;
  int i = 0;
  // Every mr with every nr, kb rotating; the full nr × kb grid at three mr.
  for (int mr = 1; mr <= 32; ++mr)
    for (int ni = 0; ni < 7; ++ni) {
      Int8Case c;
      c.group = "rows";
      c.mr = mr, c.nr = kNr[ni], c.kb = kKb[(mr + ni) % 7];
      rotate_epilogue(c, i++);
      v.push_back(c);
    }
  for (int mr : {1, 6, 32})
    for (int nr : kNr)
      for (int64_t kb : kKb) {
        Int8Case c;
        c.group = "grid";
        c.mr = mr, c.nr = nr, c.kb = kb;
        rotate_epilogue(c, i++);
        v.push_back(c);
      }
  return v;
}

// Every epilogue on two shapes: a decode block with an N tail and a full one.
std::vector<Int8Case> epilogue_sweep() {
  std::vector<Int8Case> v;
  int i = 0;
  for (auto [mr, nr, kb] : {std::tuple{3, 17, int64_t{68}}, std::tuple{13, 64, int64_t{60}}})
    for (DType out : kOuts)
      for (Activation act : kActs)
        for (BiasKind bias : kBiases)
          for (bool acc : {false, true})
            for (int batch : {1, 3}) {
              if (out == DType::i32 && (act != Activation::none || bias != BiasKind::none))
                continue;
              Int8Case c;
              c.group = "epi";
              c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch;
              c.out = out, c.act = act, c.bias = bias, c.accumulate = acc;
              c.in_place = acc && out == DType::i32 && batch == 3;
              c.zero = kZeros[i++ % 3];
              v.push_back(c);
            }
  return v;
}

// a = 255 against b = −128 / 127 over K up to 3072: sums near −10⁸.
std::vector<Int8Case> extreme_sweep() {
  std::vector<Int8Case> v;
  for (DType out : kOuts)
    for (auto [mr, nr, kb, batch] :
         {std::tuple{1, 64, int64_t{1024}, 3}, std::tuple{7, 33, int64_t{1024}, 3},
          std::tuple{32, 64, int64_t{1024}, 1}, std::tuple{4, 17, int64_t{132}, 1}})
      for (bool acc : {false, true}) {
        Int8Case c;
        c.group = "extreme";
        c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch, c.out = out, c.accumulate = acc;
        c.values = Values::extreme;
        c.zero = out == DType::i32 ? Zero::none : Zero::random;
        v.push_back(c);
      }
  return v;
}

// The imul variant (the host's best already where the target lacks VNNI).
std::vector<Int8Case> imul_sweep() {
  std::vector<Int8Case> v;
  int i = 0;
  for (int mr : {1, 2, 5, 8, 13, 32})
    for (int nr : {1, 17, 64})
      for (int64_t kb : {int64_t{4}, int64_t{68}, int64_t{1024}}) {
        Int8Case c;
        c.group = "imul";
        c.mr = mr, c.nr = nr, c.kb = kb;
        rotate_epilogue(c, i++);
        c.dot = lb::BrgemmDot::imul;
        v.push_back(c);
      }
  for (Int8Case c : extreme_sweep()) {
    c.dot = lb::BrgemmDot::imul;
    v.push_back(c);
  }
  return v;
}

// W4A8 kernels (B in [−16, 15], kb a multiple of 16, f32 acc_in): every mr
// with rotating nr / kb / epilogues, and the extremes a = 255 against
// b = −16 / 15 (the 16-bit sums of four k-quads at ±32640, one step from
// overflow: a kernel that summed more would fail), on the host's best dot
// product and the widening one.
std::vector<Int8Case> w4a8_sweep() {
  std::vector<Int8Case> v;
  const int64_t kbs[] = {16, 32, 48, 128, 1024};
  int i = 0;
  for (lb::BrgemmDot dot : {lb::BrgemmDot::best, lb::BrgemmDot::imul})
    for (int mr = 1; mr <= 32; mr += (mr < 8 ? 1 : 5)) {
      Int8Case c;
      c.group = "w4a8";
      c.w4a8 = true, c.dot = dot;
      c.mr = mr, c.nr = kNr[i % 7], c.kb = kbs[i % 5];
      rotate_epilogue(c, i++);
      if (c.out == DType::i32) c.out = DType::f32;
      c.in_place = false;  // acc_in is f32 here, C may be bf16
      v.push_back(c);
      c.values = Values::extreme;
      c.zero = Zero::random;
      v.push_back(c);
    }
  return v;
}

class Int8Brgemm : public ::testing::TestWithParam<Int8Case> {};

TEST_P(Int8Brgemm, MatchesExactReference) {
  const Int8Case& c = GetParam();
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc(), {.dot = c.dot});
  const std::string err = run_case(c, k.fn<BrgemmFn>());
  EXPECT_EQ(err, "");
}

std::string case_name(const ::testing::TestParamInfo<Int8Case>& info) {
  return info.param.str();
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8Brgemm, ::testing::ValuesIn(shape_sweep()), case_name);
INSTANTIATE_TEST_SUITE_P(Epilogues, Int8Brgemm, ::testing::ValuesIn(epilogue_sweep()), case_name);
INSTANTIATE_TEST_SUITE_P(Extreme, Int8Brgemm, ::testing::ValuesIn(extreme_sweep()), case_name);
INSTANTIATE_TEST_SUITE_P(Imul, Int8Brgemm, ::testing::ValuesIn(imul_sweep()), case_name);
INSTANTIATE_TEST_SUITE_P(W4A8, Int8Brgemm, ::testing::ValuesIn(w4a8_sweep()), case_name);

// ---------------------------------------------------------------------------
// The int8 GLU epilogue (BrgemmDesc::glu with a = u8; its statement:
// BrgemmArgs in codegen/brgemm_desc.h): the block's 64 columns are gate
// 0..31 and up 32..63, the kernel computes all 64 and stores nr ≤ 32
// outputs; b_scale, b_comp, bias and acc_in cover the 64 columns (0 in the
// columns no output uses, as a pack pads them; acc_in's row padding junk).
//
// Scalar statement (the oracle), per output [r][j], for col in {j, 32 + j}:
// the exact int64 sum (+ acc_in), t = sum − a_zero[r]·b_comp[col] (asserted
// inside int32), then in float in the contract's order v = float(t);
// v *= a_scale[r]; v *= b_scale[col]; v += bias[col]: gate and up, bit for
// bit the kernel's (the same integer steps and correctly rounded f32
// operations); ref = reference_glu(gate, up) in double. Tolerance: the
// kernel's f32 glu of those exact gate and up is within εa of ref
// (runtime::moe_act_error with no input error: the vectorised exp / erf /
// tanh approximations and a few f32 roundings); f32 out within εa; bf16 out
// is that value rounded to nearest even, at most half a bf16 ulp away, so
// within one bf16 ulp of ref (bf16_ulp_bound) plus εa.

struct GluCase {
  std::string group;
  int mr = 1, nr = 32;
  int64_t kb = 4;
  int batch = 1;
  bool accumulate = false;
  DType out = DType::bf16;
  BiasKind bias = BiasKind::none;
  codegen::Glu glu = codegen::Glu::act_mul;
  Activation act = Activation::silu;  // act_mul's
  Zero zero = Zero::random;
  lb::BrgemmDot dot = lb::BrgemmDot::best;
  // W4A8's last-group call (fused_experts' int4 gate/up): B in [−16, 15],
  // kb % 16 == 0, acc_in f32 added after the scaling, before the bias.
  bool w4a8 = false;

  static constexpr float kAlpha = 1.702f, kLimit = 2.5f;  // the clamps bite at ±2.5

  BrgemmDesc desc() const {
    BrgemmDesc d;
    d.isa = Isa::llvm;
    d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.b_row_bytes = Int8Layout::kRowBytes;
    d.accumulate = accumulate;
    d.w4a8 = w4a8;
    d.bias = bias, d.out = out, d.glu = glu;
    if (glu == codegen::Glu::clamped_swiglu)
      d.glu_alpha = kAlpha, d.glu_limit = kLimit;
    else
      d.act = act;
    return d;
  }
  std::string str() const {
    std::string s = fmt::format("{}_m{}n{}k{}", group, mr, nr, kb);
    if (batch > 1) s += fmt::format("_b{}", batch);
    s += glu == codegen::Glu::clamped_swiglu ? std::string("_swiglu")
                                             : fmt::format("_{}_and_mul", activation_name(act));
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    if (accumulate) s += "_accin";
    s += zero == Zero::none ? "_z0" : zero == Zero::z128 ? "_z128" : "_zrand";
    if (dot == lb::BrgemmDot::imul) s += "_imul";
    if (w4a8) s += "_w4a8";
    return s + "_" + dtype_name(out);
  }
};

void PrintTo(const GluCase& c, std::ostream* os) {
  *os << c.str();
}

// Runs one GLU case on `fn` and checks it; returns the failure text, or "".
std::string run_glu_case(const GluCase& c, BrgemmFn fn) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.str())));
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int64_t lda = c.kb + 3, ldc = c.nr + 7, ld_acc = 64 + 5;
  const int64_t kq = c.kb / 4;
  auto used = [&](int col) { return col % 32 < c.nr; };
  Buffers mem;
  std::vector<std::vector<uint8_t>> x(size_t(c.batch));
  std::vector<std::vector<int8_t>> w(size_t(c.batch));
  std::vector<const void*> a_list, b_list;
  for (int b = 0; b < c.batch; ++b) {
    x[b].resize(size_t(c.mr * c.kb));
    w[b].resize(size_t(64 * c.kb));
    for (auto& v : x[b]) v = uint8_t(uni(0, 255));
    for (auto& v : w[b]) v = int8_t(c.w4a8 ? uni(-16, 15) : uni(-128, 127));
    const size_t a_bytes = size_t((c.mr - 1) * lda + c.kb);
    uint8_t* ap = mem.make<uint8_t>(a_bytes);
    for (size_t i = 0; i < a_bytes; ++i) ap[i] = uint8_t(uni(0, 255));  // row padding junk
    for (int r = 0; r < c.mr; ++r) std::memcpy(ap + r * lda, x[b].data() + r * c.kb, size_t(c.kb));
    a_list.push_back(ap);
    const Int8Layout layout{64, c.kb};
    int8_t* bp = mem.make<int8_t>(size_t(kq * Int8Layout::kRowBytes));
    for (int n = 0; n < 64; ++n)
      for (int64_t k = 0; k < c.kb; ++k) bp[layout.index(n, k)] = w[b][size_t(n * c.kb + k)];
    b_list.push_back(bp);
  }
  // acc_in [mr][64] (rows of ld_acc, padding junk), compensation, zero points.
  std::vector<int32_t> acc_in(size_t(c.mr * 64), 0);
  std::vector<float> acc_in_f(size_t(c.mr * 64), 0.0f);  // W4A8: f32, after the scaling
  int32_t* acc_ptr = nullptr;
  if (c.accumulate && c.w4a8) {
    const size_t n = size_t((c.mr - 1) * ld_acc + 64);
    auto* f = mem.make<float>(n);
    for (size_t i = 0; i < n; ++i) f[i] = float(uni(-1000000, 1000000));  // padding junk
    for (int r = 0; r < c.mr; ++r)
      for (int n2 = 0; n2 < 64; ++n2)
        f[r * ld_acc + n2] = acc_in_f[size_t(r * 64 + n2)] = float(uni(-3000, 3000) / 1000.0);
    acc_ptr = reinterpret_cast<int32_t*>(f);
  } else if (c.accumulate) {
    const size_t n = size_t((c.mr - 1) * ld_acc + 64);
    acc_ptr = mem.make<int32_t>(n);
    for (size_t i = 0; i < n; ++i) acc_ptr[i] = uni(-1000000000, 1000000000);
    for (int r = 0; r < c.mr; ++r)
      for (int n2 = 0; n2 < 64; ++n2)
        acc_ptr[r * ld_acc + n2] = acc_in[size_t(r * 64 + n2)] = uni(-(1 << 20), 1 << 20);
  }
  int32_t* comp = mem.make<int32_t>(64);
  for (int n = 0; n < 64; ++n) {
    int64_t s = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int64_t k = 0; k < c.kb; ++k) s += w[b][size_t(n * c.kb + k)];
    comp[n] = used(n) ? int32_t(s) : 0;
  }
  int32_t* zero = mem.make<int32_t>(size_t(c.mr));
  for (int r = 0; r < c.mr; ++r)
    zero[r] = c.zero == Zero::none ? 0 : c.zero == Zero::z128 ? 128 : uni(0, 255);
  // t = Σ (+ acc_in) − a_zero·comp, exact.
  std::vector<int64_t> t(size_t(c.mr * 64), 0);
  int64_t tmax = 1;
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < 64; ++n) {
      if (!used(n)) continue;
      int64_t s = acc_in[size_t(r * 64 + n)];
      for (int b = 0; b < c.batch; ++b)
        for (int64_t k = 0; k < c.kb; ++k)
          s += int64_t(x[b][size_t(r * c.kb + k)]) * int64_t(w[b][size_t(n * c.kb + k)]);
      if (s > std::numeric_limits<int32_t>::max() || s < std::numeric_limits<int32_t>::min())
        return "test bug: the sums leave int32";
      t[size_t(r * 64 + n)] = s - int64_t(zero[r]) * comp[n];
      if (t[size_t(r * 64 + n)] > std::numeric_limits<int32_t>::max() ||
          t[size_t(r * 64 + n)] < std::numeric_limits<int32_t>::min())
        return "test bug: t leaves int32";
      tmax = std::max(tmax, std::abs(t[size_t(r * 64 + n)]));
    }
  // Scales: gate and up up to ~8 before the bias.
  const double s0 = std::sqrt(8.0 / double(tmax));
  float* a_scale = mem.make<float>(size_t(c.mr));
  float* b_scale = mem.make<float>(64);
  for (int r = 0; r < c.mr; ++r) a_scale[r] = float(s0 * (0.5 + uni(0, 1000) / 1000.0));
  for (int n = 0; n < 64; ++n)
    b_scale[n] =
        used(n) ? float(s0 * (0.5 + uni(0, 1000) / 1000.0) * (uni(0, 3) == 0 ? -1 : 1)) : 0.0f;
  std::vector<float> bias(64, 0.0f);
  const void* bias_ptr = nullptr;
  if (c.bias == BiasKind::f32) {
    float* p = mem.make<float>(64);
    for (int n = 0; n < 64; ++n) p[n] = bias[n] = used(n) ? float(uni(-3000, 3000) / 1000.0) : 0;
    bias_ptr = p;
  } else if (c.bias == BiasKind::bf16) {
    uint16_t* p = mem.make<uint16_t>(64);
    for (int n = 0; n < 64; ++n) {
      p[n] = runtime::f32_to_bf16(used(n) ? float(uni(-3000, 3000) / 1000.0) : 0.0f);
      bias[n] = runtime::bf16_to_f32(p[n]);
    }
    bias_ptr = p;
  }

  const size_t es = c.out == DType::bf16 ? 2 : 4;
  std::vector<uint8_t> cbuf = sentinel_c(c.mr, ldc, es);
  BrgemmArgs args{};
  args.a = a_list.data();
  args.b = b_list.data();
  args.batch = c.batch;
  args.lda = lda;
  args.c = cbuf.data() + kBrgemmGuard * es;
  args.ldc = ldc * int64_t(es);
  args.bias = bias_ptr;
  args.acc_in = reinterpret_cast<const float*>(acc_ptr);
  args.ld_acc_in = ld_acc * 4;
  args.a_scale = a_scale;
  args.a_zero = zero;
  args.b_scale = b_scale;
  args.b_comp = comp;
  fn(&args);

  runtime::ReferenceGlu rg;
  rg.act = c.act;
  rg.clamped_swiglu = c.glu == codegen::Glu::clamped_swiglu;
  rg.alpha = double(GluCase::kAlpha);
  rg.limit = double(GluCase::kLimit);
  const uint8_t* body = cbuf.data() + kBrgemmGuard * es;
  int64_t bad = 0;
  std::string msg;
  for (int r = 0; r < c.mr; ++r)
    for (int j = 0; j < c.nr; ++j) {
      float pre[2];
      for (int h = 0; h < 2; ++h) {
        const int col = j + 32 * h;
        float v = float(int32_t(t[size_t(r * 64 + col)]));
        v *= a_scale[r];
        v *= b_scale[col];
        if (c.w4a8 && c.accumulate) v += acc_in_f[size_t(r * 64 + col)];
        if (c.bias != BiasKind::none) v += bias[size_t(col)];
        pre[h] = v;
      }
      const double want = runtime::reference_glu(rg, pre[0], pre[1]);
      runtime::MoeActPoint pt;
      pt.gate = pre[0], pt.up = pre[1], pt.act = want;
      double tol = runtime::moe_act_error(rg, pt, 0.0);
      if (c.out == DType::bf16) tol += runtime::bf16_ulp_bound(want);
      const double got = read_out(body, c.out, r * ldc + j);
      if (!std::isfinite(got) || !(std::fabs(got - want) <= tol))
        if (bad++ < 5)
          msg += fmt::format(
              "\n  C[{}, {}] = {}, reference {} (gate {}, up {}), |err| {:.3g} > "
              "tol {:.3g}",
              r, j, got, want, pre[0], pre[1], std::fabs(got - want), tol);
    }
  std::string tmsg;
  const int64_t touched = touched_outside_c(cbuf, es, c.mr, ldc, c.nr, &tmsg);
  if (bad == 0 && touched == 0) return "";
  return fmt::format("{}: {} of {} outputs wrong, {} outside C written{}{}", c.str(), bad,
                     c.mr * c.nr, touched, msg, tmsg);
}

std::vector<GluCase> glu_sweep() {
  std::vector<GluCase> v;
  struct Kind {
    codegen::Glu glu;
    Activation act;
  };
  const Kind kinds[] = {{codegen::Glu::act_mul, Activation::silu},
                        {codegen::Glu::act_mul, Activation::gelu_tanh},
                        {codegen::Glu::act_mul, Activation::gelu_erf},
                        {codegen::Glu::clamped_swiglu, Activation::none}};
  const DType outs[] = {DType::bf16, DType::f32};
  int i = 0;
  auto add = [&](const std::string& group, int mr, int nr, int64_t kb, int batch, bool acc,
                 int kind = -1, int bias = -1, int out = -1) {
    GluCase c;
    c.group = group;
    c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch, c.accumulate = acc;
    const Kind k = kinds[kind >= 0 ? kind : i % 4];
    c.glu = k.glu, c.act = k.glu == codegen::Glu::act_mul ? k.act : Activation::silu;
    c.bias = kBiases[bias >= 0 ? bias : (i / 4) % 3];
    c.out = outs[out >= 0 ? out : (i / 2) % 2];
    c.zero = kZeros[(i / 3) % 3];
    ++i;
    v.push_back(c);
  };
  // Every kind × bias × out on an N-tailed decode block.
  for (int kind = 0; kind < 4; ++kind)
    for (int bias = 0; bias < 3; ++bias)
      for (int out = 0; out < 2; ++out) add("gluepi", 3, 17, 68, 1, false, kind, bias, out);
  // nr tails × row counts (row blocks and their tails), K rotating.
  int q = 0;
  for (int nr : {1, 17, 31, 32})
    for (int mr : {1, 2, 5, 13, 32}) add("glun", mr, nr, kKb[q++ % 7], 1, false);
  // K tails at the full block.
  for (int64_t kb : kKb) add("gluk", 6, 32, kb, 1, false);
  // Batch 3 and int32 acc_in.
  for (bool acc : {false, true})
    for (auto [mr, nr] : {std::pair{7, 32}, std::pair{3, 17}, std::pair{32, 1}})
      add("glubatch", mr, nr, 132, 3, acc);
  // The widened i32 multiply (the host's best already where the target lacks VNNI).
  const size_t n = v.size();
  for (size_t k = 0; k < n; k += 3) {
    GluCase c = v[k];
    c.dot = lb::BrgemmDot::imul;
    v.push_back(c);
  }
  // W4A8's last group with a GLU: every kind, f32 acc_in or none, row and N
  // tails, kb multiples of 16 and a batch.
  const size_t before = v.size();
  for (auto [mr, nr, kb, batch] :
       {std::tuple{1, 32, 16, 1}, std::tuple{4, 17, 32, 1}, std::tuple{7, 32, 128, 2},
        std::tuple{3, 1, 144, 1}, std::tuple{13, 31, 64, 3}, std::tuple{32, 32, 48, 1}})
    for (bool acc : {false, true}) add("gluw4a8", mr, nr, kb, batch, acc);
  for (size_t k = before; k < v.size(); ++k) v[k].w4a8 = true;
  return v;
}

class Int8GluBrgemm : public ::testing::TestWithParam<GluCase> {};

TEST_P(Int8GluBrgemm, MatchesScalarStatement) {
  const GluCase& c = GetParam();
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc(), {.dot = c.dot});
  EXPECT_EQ(run_glu_case(c, k.fn<BrgemmFn>()), "");
}

std::string glu_case_name(const ::testing::TestParamInfo<GluCase>& info) {
  return info.param.str();
}

INSTANTIATE_TEST_SUITE_P(Glu, Int8GluBrgemm, ::testing::ValuesIn(glu_sweep()), glu_case_name);

bool target_has(const std::string& f) {
  return ("," + lb::host_target().features + ",").find(",+" + f + ",") != std::string::npos;
}

std::string kernel_asm(const lb::LlvmKernel& k) {
  return lb::disassemble(static_cast<const uint8_t*>(k.entry), k.code_size, 0,
                         lb::host_target().features);
}

// The instruction selection: vpdpbusd where the target has VNNI, never the
// saturating vpmaddubsw.
TEST(Int8BrgemmCode, VpdpbusdWhereTheTargetHasVnni) {
  Int8Case c;
  c.mr = 4, c.nr = 64, c.kb = 256;
  const lb::LlvmKernel best = lb::compile_llvm_brgemm(c.desc());
  const lb::LlvmKernel imul = lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::imul});
  ASSERT_GT(best.code_size, 0u);
  ASSERT_GT(imul.code_size, 0u);
  const std::string b = kernel_asm(best), m = kernel_asm(imul);
  const bool vnni = target_has("avx512vnni") || target_has("avxvnni");
  EXPECT_EQ(b.find("vpdpbusd") != std::string::npos, vnni) << b;
  EXPECT_EQ(m.find("vpdpbusd"), std::string::npos) << m;
  EXPECT_EQ(b.find("vpmaddubsw"), std::string::npos) << b;
  EXPECT_EQ(m.find("vpmaddubsw"), std::string::npos) << m;
  EXPECT_NE(best.name, imul.name);
}

// W4A8 with several scale groups in one call (BrgemmArgs::w4a8_scales /
// w4a8_comps, what ops/gemm_w4a8.cpp passes per K chunk): each group's exact
// int32 sums are folded in turn, f = float(t_g)·a_scale·scale_g + f from
// acc_in or −0, then the bias: checked bit for bit against that float order,
// on the best dot and the widening one, with groups of 1 to 3 batch items,
// N tails, acc_in, and the extremes a = 255 against b = −16 / 15.
TEST(Int8BrgemmW4A8, GroupsFoldedInOneCall) {
  struct Shape {
    int mr, nr;
    int64_t kb;
    std::vector<int> group_items;  // batch items per group, in order
    bool accumulate, extreme;
  };
  const Shape shapes[] = {
      {1, 64, 32, {1, 1, 1}, false, false},   {3, 37, 16, {2, 1, 3}, true, false},
      {7, 64, 128, {1, 2}, true, false},      {5, 17, 48, {3}, false, false},
      {8, 64, 64, {1, 1, 2, 1}, false, true}, {2, 1, 16, {1, 4}, true, false},
  };
  for (lb::BrgemmDot dot : {lb::BrgemmDot::best, lb::BrgemmDot::imul})
    for (const Shape& sh : shapes) {
      int batch = 0;
      for (int g : sh.group_items) batch += g;
      const std::string what =
          fmt::format("mr {} nr {} kb {} groups {} acc {} extreme {} dot {}", sh.mr, sh.nr, sh.kb,
                      sh.group_items.size(), sh.accumulate, sh.extreme, static_cast<int>(dot));
      SCOPED_TRACE(what);
      BrgemmDesc d;
      d.isa = Isa::llvm;
      d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
      d.mr = sh.mr, d.nr = sh.nr, d.kb = sh.kb, d.w4a8 = true, d.accumulate = sh.accumulate;
      d.b_row_bytes = Int8Layout::kRowBytes, d.bias = BiasKind::f32, d.out = DType::f32;
      const lb::LlvmKernel k = lb::compile_llvm_brgemm(d, {.dot = dot});
      std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(what)));
      auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
      Buffers mem;
      const int64_t lda = sh.kb + 5, ldc = sh.nr + 3;
      const Int8Layout layout{64, sh.kb};
      std::vector<const void*> a_list, b_list;
      std::vector<std::vector<uint8_t>> x(static_cast<size_t>(batch));
      std::vector<std::vector<int8_t>> w(static_cast<size_t>(batch));
      for (int b = 0; b < batch; ++b) {
        x[b].resize(size_t(sh.mr * lda));
        for (auto& v : x[b]) v = uint8_t(sh.extreme ? 255 : uni(0, 255));
        w[b].resize(size_t(64 * sh.kb));
        for (int n = 0; n < 64; ++n)
          for (int64_t kk = 0; kk < sh.kb; ++kk)
            w[b][size_t(n * sh.kb + kk)] =
                int8_t(sh.extreme ? (n % 2 == 0 ? -16 : 15) : uni(-16, 15));
        uint8_t* ap = mem.make<uint8_t>(x[b].size());
        std::memcpy(ap, x[b].data(), x[b].size());
        a_list.push_back(ap);
        int8_t* bp = mem.make<int8_t>(size_t(sh.kb / 4 * Int8Layout::kRowBytes));
        for (int n = 0; n < 64; ++n)
          for (int64_t kk = 0; kk < sh.kb; ++kk)
            bp[layout.index(n, kk)] = w[b][size_t(n * sh.kb + kk)];
        b_list.push_back(bp);
      }
      float* a_scale = mem.make<float>(size_t(sh.mr));
      int32_t* a_zero = mem.make<int32_t>(size_t(sh.mr));
      for (int r = 0; r < sh.mr; ++r) {
        a_scale[r] = float(uni(1, 1000)) / 65536.0f;
        a_zero[r] = sh.extreme ? 0 : uni(0, 255);
      }
      float* bias = mem.make<float>(size_t(sh.nr));
      for (int n = 0; n < sh.nr; ++n) bias[n] = float(uni(-100, 100)) / 64.0f;
      float* acc_in = mem.make<float>(size_t(sh.mr * 64));
      for (int i = 0; i < sh.mr * 64; ++i) acc_in[i] = float(uni(-8000, 8000)) / 1000.0f;
      // Per group: its scale and column-sum rows ([64], 0 past nr), set on
      // its last item.
      std::vector<const float*> scale_rows(static_cast<size_t>(batch), nullptr);
      std::vector<const int32_t*> comp_rows(static_cast<size_t>(batch), nullptr);
      std::vector<std::pair<int, int>> groups;  // [first item, end item)
      for (int g = 0, b0 = 0; g < int(sh.group_items.size());
           b0 += sh.group_items[size_t(g)], ++g) {
        const int b1 = b0 + sh.group_items[size_t(g)];
        groups.emplace_back(b0, b1);
        float* sc = mem.make<float>(64);
        int32_t* cp = mem.make<int32_t>(64);
        for (int n = 0; n < 64; ++n) {
          int64_t sum = 0;
          for (int b = b0; b < b1; ++b)
            for (int64_t kk = 0; kk < sh.kb; ++kk) sum += w[b][size_t(n * sh.kb + kk)];
          sc[n] = n < sh.nr ? float(uni(1, 1000)) / 4096.0f : 0.0f;
          cp[n] = n < sh.nr ? int32_t(sum) : 0;
        }
        scale_rows[size_t(b1 - 1)] = sc;
        comp_rows[size_t(b1 - 1)] = cp;
      }
      float* c = mem.make<float>(size_t(sh.mr * ldc));
      BrgemmArgs args{};
      args.a = a_list.data(), args.b = b_list.data(), args.batch = batch;
      args.lda = lda, args.c = c, args.ldc = ldc * 4, args.bias = bias;
      args.acc_in = acc_in, args.ld_acc_in = 64 * 4;
      args.a_scale = a_scale, args.a_zero = a_zero;
      args.w4a8_scales = scale_rows.data(), args.w4a8_comps = comp_rows.data();
      k.fn<BrgemmFn>()(&args);
      int bad = 0;
      for (int r = 0; r < sh.mr && bad < 3; ++r)
        for (int n = 0; n < sh.nr; ++n) {
          float f = sh.accumulate ? acc_in[r * 64 + n] : -0.0f;
          for (size_t g = 0; g < groups.size(); ++g) {
            int64_t t = 0;
            for (int b = groups[g].first; b < groups[g].second; ++b)
              for (int64_t kk = 0; kk < sh.kb; ++kk)
                t += int64_t(x[b][size_t(r * lda + kk)]) * w[b][size_t(n * sh.kb + kk)];
            const int32_t* cp = comp_rows[size_t(groups[g].second - 1)];
            const float* sc = scale_rows[size_t(groups[g].second - 1)];
            float v = float(int32_t(t - int64_t(a_zero[r]) * cp[n]));
            v *= a_scale[r];
            v *= sc[n];
            f = v + f;
          }
          f += bias[n];
          const float got = c[r * ldc + n];
          if (std::memcmp(&got, &f, sizeof f) != 0 && bad++ < 3)
            ADD_FAILURE() << fmt::format("C[{}, {}] = {}, the fold order gives {}", r, n, got, f);
        }
    }
}

// W4A8 without VNNI multiplies bytes directly (vpmaddubsw: its B cannot
// saturate the s16 pairs); with VNNI it is the W8A8 kernel's vpdpbusd.
TEST(Int8BrgemmCode, W4A8UsesVpmaddubswWithoutVnni) {
  Int8Case c;
  c.mr = 4, c.nr = 64, c.kb = 128, c.w4a8 = true;
  const std::string b = kernel_asm(lb::compile_llvm_brgemm(c.desc()));
  const std::string m = kernel_asm(lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::imul}));
  const bool vnni = target_has("avx512vnni") || target_has("avxvnni");
  EXPECT_EQ(b.find("vpmaddubsw") != std::string::npos, !vnni) << b;
  EXPECT_EQ(b.find("vpdpbusd") != std::string::npos, vnni) << b;
  EXPECT_NE(m.find("vpmaddubsw"), std::string::npos) << m;
}

TEST(Int8BrgemmErrors, OutOfContractDescriptorsRaise) {
  Int8Case c;
  BrgemmDesc d = c.desc();
  d.kb = 6;  // not a multiple of 4
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.out = DType::i32, d.bias = BiasKind::f32;  // raw sums take no epilogue
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.out = DType::i32, d.act = Activation::silu;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.b_type = DType::u8;  // u8 × u8 is not a kernel
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.acc_type = DType::f32;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.glu = codegen::Glu::act_mul, d.nr = 32, d.act = Activation::silu;
  d.out = DType::i32;  // a GLU is a final epilogue: no raw sums
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d.out = DType::bf16, d.nr = 33;  // a GLU stores at most 32 columns
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d = c.desc();
  d.out = DType::i8;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  // W4A8: kb a multiple of 16, a scaled output, the int8 dtypes.
  d = c.desc();
  d.w4a8 = true, d.kb = 24;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d.kb = 32, d.out = DType::i32;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);
  d.out = DType::bf16, d.glu = codegen::Glu::act_mul, d.nr = 33, d.act = Activation::silu;
  EXPECT_THROW(lb::compile_llvm_brgemm(d), Error);  // a GLU stores at most 32 columns
  BrgemmDesc w4;
  w4.w4a8 = true, w4.kb = 32;  // bf16 dtypes
  EXPECT_THROW(lb::compile_llvm_brgemm(w4), Error);
  // The dot products of the other dtype.
  EXPECT_THROW(lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::fma}), Error);
  EXPECT_THROW(lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::dpbf16}), Error);
  EXPECT_THROW(lb::compile_llvm_brgemm(BrgemmDesc{}, {.dot = lb::BrgemmDot::imul}), Error);
  EXPECT_THROW(lb::compile_llvm_brgemm(BrgemmDesc{}, {.dot = lb::BrgemmDot::vpdpbusd}), Error);
  // bf16 out of an i32 kernel... and i32 out of a bf16 one.
  BrgemmDesc bf;
  bf.out = DType::i32;
  EXPECT_THROW(lb::compile_llvm_brgemm(bf), Error);
  if (!target_has("avx512vnni") && !target_has("avxvnni"))
    EXPECT_THROW(lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::vpdpbusd}), Error);
  else
    EXPECT_NO_THROW(lb::compile_llvm_brgemm(c.desc(), {.dot = lb::BrgemmDot::vpdpbusd}));
}

TEST(Int8BrgemmName, SpellsTheDtypes) {
  Int8Case c;
  c.mr = 7, c.nr = 64, c.kb = 4096, c.out = DType::bf16;
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc());
  EXPECT_EQ(k.name, lb::llvm_brgemm_name(c.desc()));
  EXPECT_NE(k.name.find("u8"), std::string::npos) << k.name;
  EXPECT_NE(k.name.find("i32acc"), std::string::npos) << k.name;
}

}  // namespace
}  // namespace tilejit::test
