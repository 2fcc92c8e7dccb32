// The brgemm micro-kernel test harness (codegen/brgemm_desc.h's BrgemmArgs
// ABI), shared by brgemm_battery_test (the tail battery over every registry
// row), llvm_backend_test (the LLVM kernel's API, object files and the
// bit-for-bit Xbyak differential) and glu_kernel_test: one case
// (BrgemmCase), its inputs laid out with traps (make_brgemm_data), the run
// with guard zones around C (run_brgemm), the scalar reference
// (runtime/reference_gemm.h; the GLU math of runtime/reference_moe.h) and the
// check under the bounds of runtime/reference_error_bounds.h (check_brgemm).
//
// Traps: every A block, B block, a_tail, bias and acc_in ends at a PROT_NONE
// page (GuardedBuffer: reading past it faults); B columns the kernel must not
// use (past nr) and A / acc_in row padding hold NaN; C is surrounded by
// kBrgemmGuard sentinel elements on each side and its row padding is
// sentinel too: a store outside C[mr x nr] is a failure.
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_moe.h"
#include "test_util.h"

namespace tilejit::test {

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
inline constexpr float kGluAlpha = 1.702f, kGluLimit = 7.0f;

// One micro-kernel call: the descriptor's fields, the strides, the acc_in
// mode; `group` prefixes the name (a battery's case group).
struct BrgemmCase {
  Isa path = Isa::avx512;  // the registry row
  bool llvm_fma = false;   // llvm: the kernel compiled with the fma dot forced
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
  // The kernel's row as a name: the path, "llvm_fma" for the forced variant.
  std::string row() const { return llvm_fma ? "llvm_fma" : isa_name(path); }
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

inline void PrintTo(const BrgemmCase& c, std::ostream* os) {
  *os << c.row() << "/" << c.str();
}

// ---------------------------------------------------------------------------
// Inputs, the run, the reference, the check.

inline constexpr uint16_t kNanBf16 = 0x7fc1;
inline constexpr int64_t kBrgemmGuard = 64;  // sentinel elements before and after C

struct BrgemmData {
  BrgemmCase c;
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

inline GuardedBuffer& new_brgemm_buffer(BrgemmData& d, size_t bytes) {
  d.bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(bytes, 1)));
  return *d.bufs.back();
}

inline BrgemmData make_brgemm_data(const BrgemmCase& c) {
  BrgemmData d;
  d.c = c;
  const int cols = c.cols();
  d.lda = c.kb + c.lda_pad;
  d.ldc = c.nr + c.ldc_pad;
  d.ld_acc = c.acc == Acc::alias ? d.ldc : cols + 5;
  const uint32_t seed = static_cast<uint32_t>(std::hash<std::string>{}(c.str()));
  // Pre-activations of standard deviation ~5 whatever K (tests/test_util.h).
  const int64_t ktot = std::max<int64_t>(1, c.kb * c.batch);  // batch 0: no inputs
  const float a = static_cast<float>(std::sqrt(15.0 / std::sqrt(static_cast<double>(ktot))));
  const PackedLayout layout{PackedLayout::kBlockN, c.kb};
  const PackedA pa{c.kb};
  for (int b = 0; b < c.batch; ++b) {
    d.x.push_back(random_bf16(size_t(c.mr * c.kb), seed + 10 * b, -a, a));
    d.w.push_back(random_bf16(size_t(cols * c.kb), seed + 10 * b + 1, -a, a));
    const std::vector<uint16_t>& x = d.x.back();
    if (c.a_packed) {
      // The PackedA tile layout: K zero-padded to the step; rows past mr NaN.
      GuardedBuffer& buf = new_brgemm_buffer(d, size_t(pa.bytes(c.mr)));
      uint16_t* p = buf.as<uint16_t>();
      std::fill(p, p + pa.bytes(c.mr) / 2, kNanBf16);
      for (int r = 0; r < c.mr; ++r)
        for (int64_t k = 0; k < pa.k_steps() * 32; ++k)
          p[pa.offset(r, k) / 2] = k < c.kb ? x[size_t(r * c.kb + k)] : 0;
      d.a_list.push_back(p);
    } else {
      // Row-major, rows of lda elements (padding NaN); the last row ends at the guard.
      const size_t elems = size_t((c.mr - 1) * d.lda + c.kb);
      GuardedBuffer& buf = new_brgemm_buffer(d, elems * 2);
      uint16_t* p = buf.as<uint16_t>();
      std::fill(p, p + elems, kNanBf16);
      for (int r = 0; r < c.mr; ++r)
        std::memcpy(p + r * d.lda, x.data() + r * c.kb, size_t(c.kb) * 2);
      d.a_list.push_back(p);
    }
    // One packed 64-column block, exactly the bytes the kernel may read: K
    // padding rows zero (the layout's promise); columns past `cols` NaN.
    const size_t b_bytes = size_t(layout.k_pairs()) * PackedLayout::kRowBytes;
    uint16_t* bp = new_brgemm_buffer(d, b_bytes).as<uint16_t>();
    std::fill(bp, bp + b_bytes / 2, uint16_t(0));
    for (int n = 0; n < PackedLayout::kBlockN; ++n)
      for (int64_t k = 0; k < c.kb; ++k)
        bp[layout.index(n, k)] = n < cols ? d.w.back()[size_t(n * c.kb + k)] : kNanBf16;
    d.b_list.push_back(bp);
  }
  // AMX, row-major A with a K tail: the zero-padded copy of the last kb % 32
  // columns, rows of 64 bytes (the contract's a_tail).
  if (c.path == Isa::amx && !c.a_packed && c.kb % 32 != 0) {
    uint16_t* t = new_brgemm_buffer(d, size_t(c.mr) * 64).as<uint16_t>();
    std::fill(t, t + c.mr * 32, uint16_t(0));
    const int64_t k0 = c.kb / 32 * 32;
    for (int r = 0; r < c.mr; ++r)
      for (int64_t k = k0; k < c.kb; ++k) t[r * 32 + (k - k0)] = d.x.back()[size_t(r * c.kb + k)];
    d.a_tail = t;
  }
  if (c.bias == BiasKind::f32) {
    d.bias = random_f32(size_t(cols), seed + 2, -5, 5);
    GuardedBuffer& buf = new_brgemm_buffer(d, size_t(cols) * 4);
    std::memcpy(buf.data(), d.bias.data(), size_t(cols) * 4);
    d.bias_ptr = buf.data();
  } else if (c.bias == BiasKind::bf16) {
    const std::vector<uint16_t> h = random_bf16(size_t(cols), seed + 2, -5, 5);
    GuardedBuffer& buf = new_brgemm_buffer(d, size_t(cols) * 2);
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
      float* p = new_brgemm_buffer(d, elems * 4).as<float>();
      std::fill(p, p + elems, std::nanf(""));
      for (int r = 0; r < c.mr; ++r)
        for (int j = 0; j < cols; ++j) p[r * d.ld_acc + j] = d.acc_in[size_t(r * cols + j)];
      d.acc_ptr = p;
    }
  }
  return d;
}

// The C buffer of one call: mr rows of ldc elements of `es` bytes (4: f32
// or i32, 2: bf16) between kBrgemmGuard elements on each side, all sentinel.
inline std::vector<uint8_t> sentinel_c(int64_t mr, int64_t ldc, size_t es) {
  const int64_t elems = mr * ldc + 2 * kBrgemmGuard;
  std::vector<uint8_t> buf(size_t(elems) * es);
  for (int64_t e = 0; e < elems; ++e)
    std::memcpy(&buf[size_t(e) * es],
                es == 4 ? static_cast<const void*>(&kSentinelF32)
                        : static_cast<const void*>(&kSentinelBf16),
                es);
  return buf;
}

// The elements of a sentinel_c buffer outside C[mr × nr] (guard zones, row
// padding) that are no longer sentinel; the first five described in *msg.
inline int64_t touched_outside_c(const std::vector<uint8_t>& got, size_t es, int64_t mr,
                                 int64_t ldc, int64_t nr, std::string* msg) {
  int64_t touched = 0;
  for (int64_t e = 0; e < int64_t(got.size() / es); ++e) {
    const int64_t idx = e - kBrgemmGuard;
    const bool inside = idx >= 0 && idx < mr * ldc && idx % ldc < nr;
    const bool sentinel = es == 4 ? std::memcmp(&got[size_t(e) * 4], &kSentinelF32, 4) == 0
                                  : std::memcmp(&got[size_t(e) * 2], &kSentinelBf16, 2) == 0;
    if (!inside && !sentinel && touched++ < 5)
      *msg += fmt::format("\n  C element at offset {} from C[0, 0] (ldc {})", idx, ldc);
  }
  return touched;
}

// Runs `fn`; returns C [mr × ldc] with the guard zones, as bytes.
inline std::vector<uint8_t> run_brgemm(const BrgemmData& d, BrgemmFn fn) {
  const BrgemmCase& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  std::vector<uint8_t> buf = sentinel_c(c.mr, d.ldc, es);
  uint8_t* cp = buf.data() + kBrgemmGuard * es;
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

// The plain epilogue through runtime::reference_gemm: the batch-reduce is one
// GEMM over the concatenated K of the batch items, and acc_in enters as mr
// more K columns (x = the identity, w[j][k] = acc_in[k][j]; bf16-exact).
inline std::vector<uint8_t> brgemm_reference_output(const BrgemmData& d) {
  const BrgemmCase& c = d.c;
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
struct BrgemmPre {
  double v = 0, abs = 0, bias = 0;
};
inline BrgemmPre brgemm_pre_activation(const BrgemmData& d, int r, int j) {
  const BrgemmCase& c = d.c;
  const int cols = c.cols();
  BrgemmPre p;
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

inline ::testing::AssertionResult check_brgemm(const BrgemmData& d,
                                               const std::vector<uint8_t>& got) {
  const BrgemmCase& c = d.c;
  const size_t es = c.out == DType::f32 ? 4 : 2;
  const uint8_t* body = got.data() + kBrgemmGuard * int64_t(es);
  const int64_t terms = c.batch * c.kb + (c.acc != Acc::off ? 1 : 0);
  std::vector<uint8_t> ref;
  if (c.glu == Glu::none) ref = brgemm_reference_output(d);
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
        const BrgemmPre p = brgemm_pre_activation(d, r, j);
        const double v = runtime::reference_activation(c.act, p.v);
        want = read_out(ref.data(), c.out, r * c.nr + j);
        tol = runtime::gemm_output_bound(c.act, c.out, terms, p.abs, std::fabs(p.bias), p.v, v);
      } else {
        const BrgemmPre pg = brgemm_pre_activation(d, r, j),
                        pu = brgemm_pre_activation(d, r, j + 32);
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
  std::string tmsg;
  const int64_t touched = touched_outside_c(got, es, c.mr, d.ldc, c.nr, &tmsg);
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess() << "worst err/tol " << worst;
  auto res = ::testing::AssertionFailure() << c.row() << "/" << c.str() << ": ";
  if (bad) res << bad << " of " << c.mr * c.nr << " outputs outside the bound" << msg;
  if (touched) res << "\n" << touched << " elements outside C[mr × nr] were written" << tmsg;
  return res;
}

// Whether output element e of two runs holds the same bits, a bf16 pair of
// subnormals or zeros excepted (vcvtneps2bf16 flushes subnormal results to
// zero; the LLVM kernel rounds them): what the bit-for-bit differentials
// between the Xbyak and LLVM kernels compare.
inline bool same_output_bits(const uint8_t* a, const uint8_t* b, DType out, int64_t e) {
  const int64_t es = out == DType::f32 ? 4 : 2;
  if (std::memcmp(a + e * es, b + e * es, size_t(es)) == 0) return true;
  const double tiny = std::ldexp(1.0, -126);
  return out == DType::bf16 && std::fabs(read_out(a, out, e)) < tiny &&
         std::fabs(read_out(b, out, e)) < tiny;
}

}  // namespace tilejit::test
