// The brgemm micro-kernel tail battery (XNNPACK's, test/f32-gemm-minmax.yaml):
// one list of cases, instantiated over every brgemm row of the kernel
// registry (jit::kernel_rows(): amx, avx512, llvm; instance prefixes name the
// row's path), each case run through jit::get() and checked against the
// scalar reference (runtime/reference_gemm.h; the GLU math of
// runtime/reference_moe.h). A row this CPU/OS cannot run
// (!jit::row_runs_here) is skipped with the reason, not failed; the AMX row
// runs on tile hardware or under the test-support emulator
// (TILEJIT_AMX_EMULATE, tests/CMakeLists.txt).
//
// The cases, per row (K step: 32 for AMX, one VNNI pair = 2 otherwise; M the
// row's most rows for the block: AMX 32, AVX-512 and LLVM
// avx512_brgemm_max_mr(nz)):
//   k_*      kb equal to the K step, less, greater, divisible by it, odd, large
//            (2065), on the full tile and on an (m, n) sub-tile;
//   n_*      nr 1 15 16 17 31 32 33 48 63 64 at full M and at 5 rows;
//   m_*      mr 1..M at nr 64 and 17 (LLVM also 13, 16, 32: its emitter splits
//            rows into register blocks up to 32);
//   stride_* lda and ldc larger than the row (the A padding is NaN);
//   batch_*  batch 2, 3, 5;
//   epi_*    every activation × bias (none, f32, bf16) × out (f32, bf16) ×
//            acc_in (none, own buffer, in place over C) on two shapes;
//   glu_*    act_mul with every activation and clamped_swiglu, × bias × out ×
//            acc_in, and the GLU over its nr and mr tails.
// AMX cases run with A in the PackedA tile layout (a_packed) and row-major
// (the kernel's a_tail path for a K tail), both where the contract allows
// (row-major A with a K tail takes batch 1); the epilogue cases alternate.
//
// Traps: every A block, B block, a_tail, bias and acc_in ends at a PROT_NONE
// page (GuardedBuffer: reading past it faults); B columns the kernel must not
// use (past nr) and A / acc_in row padding hold NaN; C is surrounded by 64
// sentinel elements on each side and its row padding is sentinel too: a
// store outside C[mr × nr] is a failure.
//
// Tolerance, per output, by dtype (runtime/reference_error_bounds.h):
//  - plain epilogue: gemm_output_bound. bf16 products are exact in fp32; the
//    kernel's fp32 accumulation rounds once per addition, in whatever order its
//    blocking picks, so the error grows with the number of terms
//    (batch·kb, +1 for acc_in): (terms + 2)·u·Σ|a·b| + u·|bias|, u = 2⁻²⁴,
//    stretched by the activation's Lipschitz constant plus its vector-math
//    error; a bf16 output rounds once more: one bf16 ulp (2⁻⁷·|ref|) on top.
//  - GLU: gate and up are such sums (eps = (terms + 2)·u relative to their
//    Σ|terms|); a bf16 output must equal the reference's bf16 value unless the
//    exact value lies within the GLU's error εa of a rounding boundary
//    (runtime::moe_act_slack); an f32 output is within εa itself
//    (runtime::moe_act_error: moe_act_slack's εa before its bf16 step).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"
#include "test_util.h"

namespace tilejit::test {
namespace {

using codegen::BiasKind;
using codegen::BrgemmArgs;
using codegen::BrgemmDesc;
using codegen::BrgemmFn;
using codegen::Glu;
using codegen::PackedA;
using codegen::PackedLayout;

// acc_in: none, its own buffer, or the C buffer itself (in place, f32 out).
enum class Acc { off, separate, alias };

// GPT-OSS's clamped SwiGLU constants: pre-activations here have a standard
// deviation of ~5, so both clamps bite on a good share of the outputs.
constexpr float kGluAlpha = 1.702f, kGluLimit = 7.0f;

struct Case {
  Isa path = Isa::avx512;  // the registry row
  std::string group;
  int mr = 1, nr = 64;
  int64_t kb = 1;
  int batch = 1;
  bool a_packed = false;
  int64_t lda_pad = 0, ldc_pad = 0;  // elements past the row (0: tight)
  Activation act = Activation::none;
  BiasKind bias = BiasKind::none;
  Glu glu = Glu::none;
  DType out = DType::f32;
  Acc acc = Acc::off;

  int cols() const { return glu != Glu::none ? 64 : nr; }  // computed columns
  BrgemmDesc desc() const {
    BrgemmDesc d;
    d.isa = path;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.b_row_bytes = PackedLayout::kRowBytes;
    d.a_packed = a_packed;
    d.accumulate = acc != Acc::off;
    d.bias = bias, d.act = act, d.glu = glu, d.out = out;
    if (glu == Glu::clamped_swiglu) d.glu_alpha = kGluAlpha, d.glu_limit = kGluLimit;
    return d;
  }
  std::string str() const {
    std::string s = fmt::format("{}_m{}n{}k{}", group, mr, nr, kb);
    if (batch > 1) s += fmt::format("_b{}", batch);
    if (path == Isa::amx) s += a_packed ? "_apack" : "_arow";
    if (lda_pad) s += fmt::format("_lda{}", kb + lda_pad);
    if (ldc_pad) s += fmt::format("_ldc{}", nr + ldc_pad);
    if (glu == Glu::clamped_swiglu)
      s += "_clamped_swiglu";
    else
      s += fmt::format("_{}{}", activation_name(act), glu == Glu::act_mul ? "_and_mul" : "");
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    if (acc == Acc::separate) s += "_accin";
    if (acc == Acc::alias) s += "_accinplace";
    return s + "_" + dtype_name(out);
  }
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << isa_name(c.path) << "/" << c.str();
}

// ---------------------------------------------------------------------------
// The case list of one row.

int k_step(Isa path) {
  return path == Isa::amx ? codegen::amx_k_step_of(DType::bf16) : 2;  // one VNNI pair otherwise
}

// The most rows the row's kernels take for `cols` computed columns.
int max_mr(Isa path, int cols) {
  if (path == Isa::amx) return 32;
  return codegen::xbyak::avx512_brgemm_max_mr((cols + 15) / 16);
}

// Under the AMX emulator every tile instruction is a signal round trip
// (~4 us), but a brgemm call executes few of them (tile loads and tdpbf16ps
// per K step of 32, ~50 per case on average here): the whole AMX list is ~30 k
// emulated instructions, well under a second, so the emulated runs take the
// same list as the hardware.
bool amx_emulated() {
  return runtime::cpu_features().amx_emulated;
}

std::vector<Case> battery(Isa path) {
  const int ks = k_step(path);
  std::vector<Case> v;
  std::set<std::string> seen;
  // Adds c (AMX: with packed and with row-major A where the contract allows:
  // row-major A with a K tail takes batch 1), each name once.
  // `apack` (0, 1) picks one of the two; a row-major pick the contract
  // refuses becomes a packed one.
  auto add = [&](Case c, int apack = -1) {
    c.path = path;
    auto row_major_ok = [&] { return c.batch == 1 || c.kb % ks == 0; };
    for (int packed : {1, 0}) {
      if (path != Isa::amx && packed) continue;
      if (path == Isa::amx && apack >= 0 && packed != apack &&
          !(apack == 0 && packed && !row_major_ok()))
        continue;
      c.a_packed = packed;
      if (path == Isa::amx && !packed && !row_major_ok()) continue;
      if (packed && c.lda_pad != 0 && c.ldc_pad == 0) continue;  // lda is unused
      if (seen.insert(c.str()).second) v.push_back(c);
    }
  };
  const int m64 = max_mr(path, 64);
  const int64_t kodd = 37, klarge = 2048 + 17;
  std::vector<int64_t> ks_list = {ks, 1, ks - 1, ks + 1, 2 * ks, 5 * ks, kodd, klarge};

  // k: equal, less, greater, divisible, odd, large; full tile and sub-tile.
  for (int64_t kb : ks_list) {
    if (kb < 1) continue;
    for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}}) {
      Case c;
      c.group = "k";
      c.mr = mr, c.nr = nr, c.kb = kb;
      add(c);
    }
  }
  // n: every sub-tile of the 64-column block, at full M and at 5 rows.
  for (int nr : {1, 15, 16, 17, 31, 32, 33, 48, 63, 64})
    for (int mr : {max_mr(path, nr), 5})
      for (int64_t kb : {int64_t(ks), kodd}) {
        Case c;
        c.group = "n";
        c.mr = mr, c.nr = nr, c.kb = kb;
        add(c);
      }
  // m: every row count of the row, at a full and a tailed column block.
  for (int nr : {64, 17}) {
    std::vector<int> mrs;
    for (int mr = 1; mr <= max_mr(path, nr); ++mr) mrs.push_back(mr);
    if (path == Isa::llvm)
      for (int mr : {13, 16, 32})
        if (mr > max_mr(path, nr)) mrs.push_back(mr);
    for (int mr : mrs) {
      Case c;
      c.group = "m";
      c.mr = mr, c.nr = nr, c.kb = kodd;
      add(c);
    }
  }
  // strided A and C.
  for (auto [mr, nr, kb] : {std::tuple{m64, 64, kodd}, std::tuple{5, 17, int64_t(2 * ks + 1)},
                            std::tuple{1, 33, klarge}})
    for (auto [lp, cp] : {std::pair{7, 0}, std::pair{0, 11}, std::pair{7, 11}}) {
      Case c;
      c.group = "stride";
      c.mr = mr, c.nr = nr, c.kb = kb, c.lda_pad = lp, c.ldc_pad = cp;
      add(c);
    }
  // batch > 1.
  for (int batch : {2, 3, 5})
    for (int64_t kb : {int64_t(ks), int64_t(2 * ks), int64_t(1), kodd})
      for (auto [mr, nr] : {std::pair{m64, 64}, std::pair{3, 17}}) {
        Case c;
        c.group = "batch";
        c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch;
        add(c);
      }
  // Every epilogue, on an N- and K-tailed sub-tile and on a full tile with
  // batch 2 (AMX: there the accumulators load acc_in and store f32 directly).
  const Activation acts[] = {Activation::none, Activation::relu, Activation::silu,
                             Activation::gelu_tanh, Activation::gelu_erf};
  const BiasKind biases[] = {BiasKind::none, BiasKind::f32, BiasKind::bf16};
  int i = 0;
  for (int shape = 0; shape < 2; ++shape)
    for (Activation act : acts)
      for (BiasKind bias : biases)
        for (DType out : {DType::f32, DType::bf16})
          for (Acc acc : {Acc::off, Acc::separate, Acc::alias}) {
            if (acc == Acc::alias && out != DType::f32) continue;
            Case c;
            c.group = "epi";
            if (shape == 0)
              c.mr = 3, c.nr = 17, c.kb = ks + 1;
            else
              c.mr = m64, c.nr = 64, c.kb = 2 * ks, c.batch = 2;
            c.act = act, c.bias = bias, c.out = out, c.acc = acc;
            add(c, i++ % 2);
          }
  // GLU: every gated function × bias × out × acc_in on one shape, then the
  // GLU's own tails (nr ≤ 32 outputs of a 64-column block).
  const int mglu = max_mr(path, 64);
  struct G {
    Glu glu;
    Activation act;
  };
  std::vector<G> glus;
  for (Activation act : acts) glus.push_back({Glu::act_mul, act});
  glus.push_back({Glu::clamped_swiglu, Activation::none});
  i = 0;
  for (const G& g : glus)
    for (BiasKind bias : biases)
      for (DType out : {DType::f32, DType::bf16})
        for (Acc acc : {Acc::off, Acc::separate}) {
          Case c;
          c.group = "glu";
          c.mr = mglu, c.nr = 17, c.kb = ks + 1;
          c.glu = g.glu, c.act = g.act, c.bias = bias, c.out = out, c.acc = acc;
          add(c, i++ % 2);
        }
  i = 0;
  for (int nr : {1, 15, 16, 17, 31, 32})
    for (int mr : {1, 5, mglu})
      for (int64_t kb : {int64_t(ks), kodd}) {
        const G& g = glus[size_t(i) % glus.size()];
        Case c;
        c.group = "glu";
        c.mr = std::min(mr, mglu), c.nr = nr, c.kb = kb;
        c.glu = g.glu, c.act = g.act;
        c.bias = biases[i % 3];
        c.out = (i / 3) % 2 ? DType::bf16 : DType::f32;
        c.acc = (i / 2) % 2 ? Acc::separate : Acc::off;
        c.batch = i % 4 == 3 ? 2 : 1;
        add(c, i++ % 2);
      }
  return v;
}

// The cases of the row serving `path`, or none when this build has no such row.
std::vector<Case> row_cases(Isa path) {
  if (jit::find_row(jit::Family::brgemm, path) == nullptr) return {};
  return battery(path);
}

// ---------------------------------------------------------------------------
// Inputs, the run, the reference, the check.

constexpr uint16_t kNanBf16 = 0x7fc1;
constexpr int64_t kGuard = 64;  // sentinel elements before and after C

struct Data {
  Case c;
  int64_t lda = 0, ldc = 0, ld_acc = 0;  // elements
  std::vector<std::vector<uint16_t>> x;  // [batch][mr × kb] bf16, contiguous
  std::vector<std::vector<uint16_t>> w;  // [batch][cols × kb] bf16, contiguous
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  std::vector<const void*> a_list, b_list;
  const void* a_tail = nullptr;
  std::vector<float> bias;  // [cols], bf16-exact when the bias is bf16
  const void* bias_ptr = nullptr;
  std::vector<float> acc_in;       // [mr × cols], bf16-exact values
  const float* acc_ptr = nullptr;  // Acc::separate
};

GuardedBuffer& new_buffer(Data& d, size_t bytes) {
  d.bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(bytes, 1)));
  return *d.bufs.back();
}

Data make_data(const Case& c) {
  Data d;
  d.c = c;
  const int cols = c.cols();
  d.lda = c.kb + c.lda_pad;
  d.ldc = c.nr + c.ldc_pad;
  d.ld_acc = c.acc == Acc::alias ? d.ldc : cols + 5;
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>{}(c.str()));
  // Pre-activations of standard deviation ~5 whatever K (tests/test_util.h).
  const int64_t ktot = c.kb * c.batch;
  const float a = static_cast<float>(std::sqrt(15.0 / std::sqrt(static_cast<double>(ktot))));
  const PackedLayout layout{PackedLayout::kBlockN, c.kb};
  const PackedA pa{c.kb};
  for (int b = 0; b < c.batch; ++b) {
    d.x.push_back(random_bf16(size_t(c.mr * c.kb), seed + 10 * b, -a, a));
    d.w.push_back(random_bf16(size_t(cols * c.kb), seed + 10 * b + 1, -a, a));
    const std::vector<uint16_t>& x = d.x.back();
    if (c.a_packed) {
      // The PackedA tile layout: K zero-padded to the step; rows past mr NaN.
      GuardedBuffer& buf = new_buffer(d, size_t(pa.bytes(c.mr)));
      uint16_t* p = buf.as<uint16_t>();
      std::fill(p, p + pa.bytes(c.mr) / 2, kNanBf16);
      for (int r = 0; r < c.mr; ++r)
        for (int64_t k = 0; k < pa.k_steps() * 32; ++k)
          p[pa.offset(r, k) / 2] = k < c.kb ? x[size_t(r * c.kb + k)] : 0;
      d.a_list.push_back(p);
    } else {
      // Row-major, rows of lda elements (padding NaN); the last row ends at the guard.
      const size_t elems = size_t((c.mr - 1) * d.lda + c.kb);
      GuardedBuffer& buf = new_buffer(d, elems * 2);
      uint16_t* p = buf.as<uint16_t>();
      std::fill(p, p + elems, kNanBf16);
      for (int r = 0; r < c.mr; ++r)
        std::memcpy(p + r * d.lda, x.data() + r * c.kb, size_t(c.kb) * 2);
      d.a_list.push_back(p);
    }
    // One packed 64-column block, exactly the bytes the kernel may read: K
    // padding rows zero (the layout's promise); columns past `cols` NaN.
    const size_t b_bytes = size_t(layout.k_pairs()) * PackedLayout::kRowBytes;
    uint16_t* bp = new_buffer(d, b_bytes).as<uint16_t>();
    std::fill(bp, bp + b_bytes / 2, uint16_t(0));
    for (int n = 0; n < PackedLayout::kBlockN; ++n)
      for (int64_t k = 0; k < c.kb; ++k)
        bp[layout.index(n, k)] = n < cols ? d.w.back()[size_t(n * c.kb + k)] : kNanBf16;
    d.b_list.push_back(bp);
  }
  // AMX, row-major A with a K tail: the zero-padded copy of the last kb % 32
  // columns, rows of 64 bytes (the contract's a_tail).
  if (c.path == Isa::amx && !c.a_packed && c.kb % 32 != 0) {
    uint16_t* t = new_buffer(d, size_t(c.mr) * 64).as<uint16_t>();
    std::fill(t, t + c.mr * 32, uint16_t(0));
    const int64_t k0 = c.kb / 32 * 32;
    for (int r = 0; r < c.mr; ++r)
      for (int64_t k = k0; k < c.kb; ++k) t[r * 32 + (k - k0)] = d.x.back()[size_t(r * c.kb + k)];
    d.a_tail = t;
  }
  if (c.bias == BiasKind::f32) {
    d.bias = random_f32(size_t(cols), seed + 2, -5, 5);
    GuardedBuffer& buf = new_buffer(d, size_t(cols) * 4);
    std::memcpy(buf.data(), d.bias.data(), size_t(cols) * 4);
    d.bias_ptr = buf.data();
  } else if (c.bias == BiasKind::bf16) {
    const std::vector<uint16_t> h = random_bf16(size_t(cols), seed + 2, -5, 5);
    GuardedBuffer& buf = new_buffer(d, size_t(cols) * 2);
    std::memcpy(buf.data(), h.data(), size_t(cols) * 2);
    for (uint16_t v : h) d.bias.push_back(bf16_to_f32(v));
    d.bias_ptr = buf.data();
  }
  if (c.acc != Acc::off) {
    // bf16-exact, so the reference can take them as more K columns.
    for (uint16_t v : random_bf16(size_t(c.mr * cols), seed + 3, -5, 5))
      d.acc_in.push_back(bf16_to_f32(v));
    if (c.acc == Acc::separate) {
      const size_t elems = size_t((c.mr - 1) * d.ld_acc + cols);
      float* p = new_buffer(d, elems * 4).as<float>();
      std::fill(p, p + elems, std::nanf(""));
      for (int r = 0; r < c.mr; ++r)
        for (int j = 0; j < cols; ++j) p[r * d.ld_acc + j] = d.acc_in[size_t(r * cols + j)];
      d.acc_ptr = p;
    }
  }
  return d;
}

// Runs `fn`; returns C [mr × ldc] with the guard zones, as bytes.
std::vector<uint8_t> run(const Data& d, BrgemmFn fn) {
  const Case& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  const int64_t elems = c.mr * d.ldc + 2 * kGuard;
  std::vector<uint8_t> buf(size_t(elems) * es);
  for (int64_t e = 0; e < elems; ++e) {
    if (es == 4)
      std::memcpy(&buf[size_t(e) * 4], &kSentinelF32, 4);
    else
      std::memcpy(&buf[size_t(e) * 2], &kSentinelBf16, 2);
  }
  uint8_t* cp = buf.data() + kGuard * es;
  if (c.acc == Acc::alias)  // in place: C holds the partial sums on entry
    for (int r = 0; r < c.mr; ++r)
      std::memcpy(cp + r * d.ldc * 4, &d.acc_in[size_t(r * c.nr)], size_t(c.nr) * 4);
  BrgemmArgs args{};
  args.a = d.a_list.data();
  args.b = d.b_list.data();
  args.batch = c.batch;
  args.lda = d.lda * 2;
  args.c = cp;
  args.ldc = d.ldc * int64_t(es);
  args.bias = d.bias_ptr;
  args.a_tail = d.a_tail;
  if (c.acc == Acc::separate) args.acc_in = d.acc_ptr;
  if (c.acc == Acc::alias) args.acc_in = reinterpret_cast<const float*>(cp);
  args.ld_acc_in = d.ld_acc * 4;
  fn(&args);
  return buf;
}

double read_out(const uint8_t* p, DType out, int64_t idx) {
  if (out == DType::f32) {
    float f;
    std::memcpy(&f, p + idx * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + idx * 2, 2);
  return bf16_to_f32(h);
}

// The plain epilogue through runtime::reference_gemm: the batch-reduce is one
// GEMM over the concatenated K of the batch items, and acc_in enters as mr
// more K columns (x = the identity, w[j][k] = acc_in[k][j]; bf16-exact).
std::vector<uint8_t> reference_output(const Data& d) {
  const Case& c = d.c;
  const int64_t kcat = c.batch * c.kb, kref = kcat + (c.acc != Acc::off ? c.mr : 0);
  std::vector<uint16_t> x(size_t(c.mr * kref), 0);
  for (int r = 0; r < c.mr; ++r) {
    for (int b = 0; b < c.batch; ++b)
      std::memcpy(&x[size_t(r * kref + b * c.kb)], d.x[b].data() + r * c.kb, size_t(c.kb) * 2);
    if (c.acc != Acc::off) x[size_t(r * kref + kcat + r)] = f32_to_bf16(1.0f);
  }
  std::vector<uint16_t> bias_bf16;
  for (float v : d.bias) bias_bf16.push_back(f32_to_bf16(v));
  std::vector<uint8_t> y(size_t(c.mr * c.nr) * (c.out == DType::f32 ? 4 : 2));
  runtime::ReferenceGemmArgs r;
  r.x = x.data();
  r.ldx = kref;
  r.m = c.mr, r.n = c.nr, r.k = kref;
  r.bias = c.bias == BiasKind::f32    ? static_cast<const void*>(d.bias.data())
           : c.bias == BiasKind::bf16 ? static_cast<const void*>(bias_bf16.data())
                                      : nullptr;
  r.bias_dtype = c.bias == BiasKind::bf16 ? DType::bf16 : DType::f32;
  r.act = c.act;
  r.y = y.data();
  r.y_dtype = c.out;
  r.ldy = c.nr;
  runtime::reference_gemm(r, [&](int64_t n, int64_t k) -> uint16_t {
    if (k < kcat) return d.w[size_t(k / c.kb)][size_t(n * c.kb + k % c.kb)];
    return f32_to_bf16(d.acc_in[size_t((k - kcat) * c.nr + n)]);
  });
  return y;
}

// Column j's exact pre-activation (acc_in and bias included) in double and
// the Σ|terms| its rounding error scales with.
struct Pre {
  double v = 0, abs = 0, bias = 0;
};
Pre pre_activation(const Data& d, int r, int j) {
  const Case& c = d.c;
  const int cols = c.cols();
  Pre p;
  for (int b = 0; b < c.batch; ++b)
    for (int64_t k = 0; k < c.kb; ++k) {
      const double t = double(bf16_to_f32(d.x[b][size_t(r * c.kb + k)])) *
                       double(bf16_to_f32(d.w[b][size_t(j * c.kb + k)]));
      p.v += t;
      p.abs += std::fabs(t);
    }
  if (c.acc != Acc::off) {
    const double t = d.acc_in[size_t(r * cols + j)];
    p.v += t;
    p.abs += std::fabs(t);
  }
  if (c.bias != BiasKind::none) {
    p.bias = d.bias[size_t(j)];
    p.v += p.bias;
  }
  return p;
}

::testing::AssertionResult check(const Data& d, const std::vector<uint8_t>& got) {
  const Case& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  const uint8_t* body = got.data() + kGuard * int64_t(es);
  const int64_t terms = c.batch * c.kb + (c.acc != Acc::off ? 1 : 0);
  std::vector<uint8_t> ref;
  if (c.glu == Glu::none) ref = reference_output(d);
  runtime::ReferenceGlu glu;
  glu.act = c.act;
  glu.clamped_swiglu = c.glu == Glu::clamped_swiglu;
  glu.alpha = kGluAlpha, glu.limit = kGluLimit;
  int64_t bad = 0;
  std::string msg;
  double worst = 0;
  for (int r = 0; r < c.mr; ++r)
    for (int j = 0; j < c.nr; ++j) {
      double want, tol;
      const double g = read_out(body, c.out, r * d.ldc + j);
      if (c.glu == Glu::none) {
        const Pre p = pre_activation(d, r, j);
        const double v = runtime::reference_activation(c.act, p.v);
        want = read_out(ref.data(), c.out, r * c.nr + j);
        tol = runtime::gemm_output_bound(c.act, c.out, terms, p.abs, std::fabs(p.bias), p.v, v);
      } else {
        const Pre pg = pre_activation(d, r, j), pu = pre_activation(d, r, j + 32);
        runtime::MoeActPoint pt;
        pt.gate = pg.v, pt.up = pu.v;
        pt.gate_abs = pg.abs + std::fabs(pg.bias), pt.up_abs = pu.abs + std::fabs(pu.bias);
        pt.act = runtime::reference_glu(glu, pt.gate, pt.up);
        pt.act_bf16 = bf16_to_f32(f32_to_bf16(static_cast<float>(pt.act)));
        const double eps = runtime::dot_bound(terms, 1.0);  // (terms + 2)·u
        if (c.out == DType::bf16) {
          want = pt.act_bf16;
          tol = runtime::moe_act_slack(glu, pt, eps);
        } else {
          want = pt.act;
          tol = runtime::moe_act_error(glu, pt, eps);
        }
      }
      const double err = std::fabs(g - want);
      if (std::isfinite(g) && tol > 0) worst = std::max(worst, err / tol);
      if (!std::isfinite(g) || !(err <= tol)) {
        if (bad++ < 5)
          msg += fmt::format("\n  C[{}, {}] = {}, reference {}, |err| {:.3g} > tol {:.3g}", r, j, g,
                             want, err, tol);
      }
    }
  int64_t touched = 0;
  std::string tmsg;
  for (int64_t e = 0; e < int64_t(got.size() / es); ++e) {
    const int64_t idx = e - kGuard;
    const bool inside = idx >= 0 && idx < c.mr * d.ldc && idx % d.ldc < c.nr;
    const bool sentinel = es == 4 ? std::memcmp(&got[size_t(e) * 4], &kSentinelF32, 4) == 0
                                  : std::memcmp(&got[size_t(e) * 2], &kSentinelBf16, 2) == 0;
    if (!inside && !sentinel && touched++ < 5)
      tmsg += fmt::format("\n  C element at offset {} from C[0, 0] (ldc {})", idx, d.ldc);
  }
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess() << "worst err/tol " << worst;
  auto res = ::testing::AssertionFailure() << isa_name(c.path) << "/" << c.str() << ": ";
  if (bad) res << bad << " of " << c.mr * c.nr << " outputs outside the bound" << msg;
  if (touched) res << "\n" << touched << " elements outside C[mr × nr] were written" << tmsg;
  return res;
}

// ---------------------------------------------------------------------------
// The suite.

class BrgemmBattery : public ::testing::TestWithParam<Case> {};

TEST_P(BrgemmBattery, MatchesReference) {
  const Case& c = GetParam();
  const jit::KernelRow* row = jit::find_row(jit::Family::brgemm, c.path);
  ASSERT_NE(row, nullptr);
  if (!jit::row_runs_here(*row))
    GTEST_SKIP() << "brgemm row " << isa_name(c.path) << " (" << row->emitter
                 << ") cannot run on this CPU/OS: it needs " << row->needs.str() << ", usable here "
                 << runtime::detected_features().str();
  const Data d = make_data(c);
  const jit::Kernel& k = jit::get(c.desc());
  EXPECT_TRUE(check(d, run(d, k.entry<BrgemmFn>())));
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.str();
}

// One instantiation per brgemm row of the registry, named by its path; the
// test below fails when a row appears that none of them covers.
INSTANTIATE_TEST_SUITE_P(amx, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::amx)), case_name);
INSTANTIATE_TEST_SUITE_P(avx512, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::avx512)),
                         case_name);
INSTANTIATE_TEST_SUITE_P(llvm, BrgemmBattery, ::testing::ValuesIn(row_cases(Isa::llvm)), case_name);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BrgemmBattery);

TEST(BrgemmBatteryRows, EveryBrgemmRowIsInstantiated) {
  const Isa covered[] = {Isa::amx, Isa::avx512, Isa::llvm};
  int rows = 0;
  for (const jit::KernelRow& row : jit::kernel_rows()) {
    if (row.family != jit::Family::brgemm) continue;
    ++rows;
    EXPECT_NE(std::find(std::begin(covered), std::end(covered), row.path), std::end(covered))
        << "brgemm row " << isa_name(row.path) << " (" << row.emitter
        << ") has no instantiation in brgemm_battery_test";
    EXPECT_FALSE(row_cases(row.path).empty());
    std::printf("brgemm row %-6s %-36s %4zu cases, %s here%s\n", isa_name(row.path), row.emitter,
                row_cases(row.path).size(), jit::row_runs_here(row) ? "runs" : "skipped",
                row.path == Isa::amx && amx_emulated() ? " (AMX emulated)" : "");
  }
  EXPECT_GE(rows, 2);  // amx and avx512 in every build, llvm with LLVM
}

}  // namespace
}  // namespace tilejit::test
