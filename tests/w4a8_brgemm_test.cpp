// The Xbyak W4A8 group kernels (BrgemmDesc::w4a8; codegen/xbyak/avx512_brgemm.cpp
// and amx_brgemm.cpp) against the contract of codegen/brgemm_desc.h, on the
// path of the TILEJIT_ISA variant (avx512, or amx: natively or under the
// project's emulator; the other variants skip):
//
//   per scale group g (the batch items up to one whose w4a8_scales entry is
//   not null; null lists: one group, b_scale / b_comp, over the whole batch)
//     t_g[r][c] = Σ_{items of g} Σ_k a[r][k]·b[k][c] − a_zero[r]·comp_g[c]   (int32)
//     f[r][c]   = float(t_g)·a_scale[r]·scale_g[c] + f[r][c]                 (f32, this order)
//   f starting at acc_in (accumulate) or −0; then + bias, act, out.
//
// The reference does the same f32 operations in the same order, so with act
// none or relu the output is compared bit for bit (f32, and its bf16 RNE).
// Cases: every mr of the path's plan range at full and tail nr, kb of the
// path's unit (16 on AVX-512, 64 on AMX) and larger, 1-4 groups of 1-3 items
// with null entries inside, the null-list form, acc_in, bias f32 / bf16,
// out f32 / bf16. B values in [−16, 15] (q − z of int4), A in [0, 255] with
// a = 255 runs; C is surrounded by sentinels (a store outside C[mr × nr]
// fails), every input ends at a PROT_NONE page.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "test_util.h"

namespace tilejit::test {
namespace {

using codegen::Int8Layout;

struct W4A8Case {
  int mr = 1, nr = 64;
  int64_t kb = 16;
  std::vector<int> groups;  // items per scale group; empty: the null-list form (one group)
  int null_items = 1;       // the null-list form's batch
  bool accumulate = false;
  BiasKind bias = BiasKind::none;
  Activation act = Activation::none;
  DType out = DType::f32;

  int batch() const {
    if (groups.empty()) return null_items;
    int b = 0;
    for (int g : groups) b += g;
    return b;
  }
  BrgemmDesc desc(Isa path) const {
    BrgemmDesc d;
    d.isa = path;
    d.a_type = DType::u8, d.b_type = DType::i8, d.acc_type = DType::i32;
    d.w4a8 = true;
    d.mr = mr, d.nr = nr, d.kb = kb;
    d.b_row_bytes = Int8Layout::kRowBytes;
    d.accumulate = accumulate;
    d.bias = bias, d.act = act, d.out = out;
    return d;
  }
  std::string str() const {
    std::string s = fmt::format("m{}n{}k{}_", mr, nr, kb);
    if (groups.empty()) s += fmt::format("nulllists{}", null_items);
    for (size_t i = 0; i < groups.size(); ++i) s += fmt::format("{}g{}", i ? "_" : "", groups[i]);
    if (accumulate) s += "_accin";
    if (bias != BiasKind::none) s += fmt::format("_bias{}", codegen::bias_kind_name(bias));
    return s + fmt::format("_{}_{}", activation_name(act), dtype_name(out));
  }
};

std::vector<W4A8Case> cases(Isa path) {
  std::vector<W4A8Case> v;
  const bool amx = path == Isa::amx;
  const int64_t unit = amx ? 64 : 16;
  const std::vector<std::vector<int>> shapes = {{1}, {2, 1}, {1, 3, 2}, {1, 1, 1, 1}, {}};
  const int nrs[] = {64, 17, 1, 48, 33, 63};
  int i = 0;
  auto add = [&](int mr) {
    W4A8Case c;
    c.mr = mr;
    c.nr = nrs[i % 6];
    c.kb = unit * (1 + i % 3);
    c.groups = shapes[size_t(i % 5)];
    c.null_items = 1 + i % 3;
    c.accumulate = i % 2 == 1;
    c.bias = i % 3 == 0 ? BiasKind::none : i % 3 == 1 ? BiasKind::f32 : BiasKind::bf16;
    c.act = i % 4 == 3 ? Activation::relu : Activation::none;
    c.out = i % 5 < 2 ? DType::bf16 : DType::f32;
    ++i;
    v.push_back(c);
  };
  const int max_mr = amx ? 32 : 7;  // AVX-512: the zmm budget at nz = 4 (avx512_brgemm_max_mr)
  for (int mr = 1; mr <= max_mr; ++mr) add(mr);
  for (int mr : {1, 5, 16, 17, 32}) {
    if (mr > max_mr) continue;
    for (int k = 0; k < 5; ++k) add(mr);
  }
  return v;
}

std::string run_case(const W4A8Case& c, BrgemmFn fn) {
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.str())));
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const int batch = c.batch();
  const int64_t lda = (c.kb + 63) / 64 * 64 + 64, ldc = c.nr + 7, ld_acc = 64 + 5;
  std::vector<std::unique_ptr<GuardedBuffer>> bufs;
  auto make = [&](size_t bytes) {
    bufs.push_back(std::make_unique<GuardedBuffer>(std::max<size_t>(bytes, 1)));
    return bufs.back()->as<uint8_t>();
  };
  // Operands: x[b][r][k] u8, w[b][n][k] in [−16, 15] for the 64 columns.
  std::vector<std::vector<uint8_t>> x(static_cast<size_t>(batch));
  std::vector<std::vector<int8_t>> w(static_cast<size_t>(batch));
  std::vector<const void*> a_list, b_list;
  for (int b = 0; b < batch; ++b) {
    x[b].resize(size_t(c.mr * c.kb));
    w[b].resize(size_t(64 * c.kb));
    for (auto& e : x[b]) e = uint8_t(uni(0, 3) == 0 ? 255 : uni(0, 255));
    for (auto& e : w[b]) e = int8_t(uni(0, 4) == 0 ? (uni(0, 1) ? -16 : 15) : uni(-16, 15));
    uint8_t* ap = make(size_t((c.mr - 1) * lda + c.kb));
    for (int64_t i = 0; i < (c.mr - 1) * lda + c.kb; ++i) ap[i] = uint8_t(uni(0, 255));
    for (int r = 0; r < c.mr; ++r) std::memcpy(ap + r * lda, &x[b][size_t(r * c.kb)], size_t(c.kb));
    a_list.push_back(ap);
    const Int8Layout layout{64, c.kb};
    auto* bp = reinterpret_cast<int8_t*>(make(size_t(c.kb / 4 * Int8Layout::kRowBytes)));
    for (int n = 0; n < 64; ++n)
      for (int64_t k = 0; k < c.kb; ++k) bp[layout.index(n, k)] = w[b][size_t(n * c.kb + k)];
    b_list.push_back(bp);
  }
  // Groups: [first item, end) and per group its scale and column-sum rows.
  std::vector<std::pair<int, int>> spans;
  if (c.groups.empty()) {
    spans.emplace_back(0, batch);
  } else {
    int b0 = 0;
    for (int g : c.groups) spans.emplace_back(b0, b0 + g), b0 += g;
  }
  auto* a_scale = reinterpret_cast<float*>(make(size_t(c.mr) * 4));
  auto* a_zero = reinterpret_cast<int32_t*>(make(size_t(c.mr) * 4));
  for (int r = 0; r < c.mr; ++r) {
    a_scale[r] = float(uni(1, 1000)) * 0x1p-16f;
    a_zero[r] = uni(0, 5) == 0 ? 128 : uni(0, 255);
  }
  std::vector<float*> g_scale;
  std::vector<int32_t*> g_comp;
  for (auto [b0, b1] : spans) {
    auto* s = reinterpret_cast<float*>(make(64 * 4));
    auto* comp = reinterpret_cast<int32_t*>(make(64 * 4));
    for (int n = 0; n < 64; ++n) {
      int32_t sum = 0;
      for (int b = b0; b < b1; ++b)
        for (int64_t k = 0; k < c.kb; ++k) sum += w[b][size_t(n * c.kb + k)];
      comp[n] = n < c.nr ? sum : 0;  // the contract pads with 0
      s[n] = n < c.nr ? float(uni(-1000, 1000)) * 0x1p-12f : 0.0f;
    }
    g_scale.push_back(s);
    g_comp.push_back(comp);
  }
  std::vector<const float*> scale_list(static_cast<size_t>(batch), nullptr);
  std::vector<const int32_t*> comp_list(static_cast<size_t>(batch), nullptr);
  for (size_t g = 0; g < spans.size(); ++g) {
    scale_list[size_t(spans[g].second - 1)] = g_scale[g];
    comp_list[size_t(spans[g].second - 1)] = g_comp[g];
  }
  std::vector<float> bias(size_t(c.nr), 0.0f);
  const void* bias_ptr = nullptr;
  if (c.bias == BiasKind::f32) {
    auto* p = reinterpret_cast<float*>(make(size_t(c.nr) * 4));
    for (int n = 0; n < c.nr; ++n) p[n] = bias[n] = float(uni(-5000, 5000)) / 1024.0f;
    bias_ptr = p;
  } else if (c.bias == BiasKind::bf16) {
    auto* p = reinterpret_cast<uint16_t*>(make(size_t(c.nr) * 2));
    for (int n = 0; n < c.nr; ++n) {
      p[n] = runtime::f32_to_bf16(float(uni(-5000, 5000)) / 1024.0f);
      bias[n] = runtime::bf16_to_f32(p[n]);
    }
    bias_ptr = p;
  }
  // acc_in: f32 rows of ld_acc (junk past nr, which the kernel may not use).
  std::vector<float> f(size_t(c.mr * c.nr), -0.0f);
  const float* acc_in = nullptr;
  if (c.accumulate) {
    auto* p = reinterpret_cast<float*>(make(size_t((c.mr - 1) * ld_acc + c.nr) * 4));
    for (int64_t i = 0; i < (c.mr - 1) * ld_acc + c.nr; ++i) p[i] = float(uni(-1000, 1000));
    for (int r = 0; r < c.mr; ++r)
      for (int n = 0; n < c.nr; ++n) f[size_t(r * c.nr + n)] = p[r * ld_acc + n];
    acc_in = p;
  }
  // The reference, in the contract's f32 order.
  for (size_t g = 0; g < spans.size(); ++g)
    for (int r = 0; r < c.mr; ++r)
      for (int n = 0; n < c.nr; ++n) {
        int64_t t = 0;
        for (int b = spans[g].first; b < spans[g].second; ++b)
          for (int64_t k = 0; k < c.kb; ++k)
            t += int64_t(x[b][size_t(r * c.kb + k)]) * w[b][size_t(n * c.kb + k)];
        t -= int64_t(a_zero[r]) * g_comp[g][n];
        float v = static_cast<float>(static_cast<int32_t>(t));
        v *= a_scale[r];
        v *= g_scale[g][n];
        f[size_t(r * c.nr + n)] = v + f[size_t(r * c.nr + n)];
      }

  const size_t es = c.out == DType::bf16 ? 2 : 4;
  std::vector<uint8_t> cbuf = sentinel_c(c.mr, ldc, es);
  uint8_t* cp = cbuf.data() + kBrgemmGuard * es;
  BrgemmArgs args{};
  args.a = a_list.data();
  args.b = b_list.data();
  args.batch = batch;
  args.lda = lda;
  args.c = cp;
  args.ldc = ldc * int64_t(es);
  args.bias = bias_ptr;
  args.acc_in = acc_in;
  args.ld_acc_in = ld_acc * 4;
  args.a_scale = a_scale;
  args.a_zero = a_zero;
  if (c.groups.empty()) {
    args.b_scale = g_scale[0];
    args.b_comp = g_comp[0];
  } else {
    args.w4a8_scales = scale_list.data();
    args.w4a8_comps = comp_list.data();
  }
  fn(&args);

  int bad = 0;
  std::string msg;
  for (int r = 0; r < c.mr; ++r)
    for (int n = 0; n < c.nr; ++n) {
      float v = f[size_t(r * c.nr + n)];
      if (c.bias != BiasKind::none) v += bias[n];
      if (c.act == Activation::relu) v = v > 0 ? v : 0.0f;
      uint32_t want, got = 0;
      if (c.out == DType::bf16) {
        want = runtime::f32_to_bf16(v);
        std::memcpy(&got, cp + (r * ldc + n) * 2, 2);
      } else {
        std::memcpy(&want, &v, 4);
        std::memcpy(&got, cp + (r * ldc + n) * 4, 4);
      }
      if (got != want && bad++ < 5)
        msg += fmt::format("\n  C[{}, {}] bits {:#x}, the contract's f32 order gives {:#x} ({})", r,
                           n, got, want, v);
    }
  bad += static_cast<int>(touched_outside_c(cbuf, es, c.mr, ldc, c.nr, &msg));
  return bad == 0 ? "" : fmt::format("{} mismatches:{}", bad, msg);
}

TEST(W4A8Brgemm, XbyakKernelsMatchTheContract) {
  const Isa path = runtime::active_isa();
  if (path != Isa::amx && path != Isa::avx512)
    GTEST_SKIP() << "the Xbyak W4A8 kernels run on the amx and avx512 paths; this is "
                 << isa_name(path);
  for (const W4A8Case& c : cases(path)) {
    SCOPED_TRACE(fmt::format("{} {}", isa_name(path), c.str()));
    const BrgemmFn fn = jit::get(c.desc(path)).entry<BrgemmFn>();
    EXPECT_EQ(run_case(c, fn), "");
  }
}

}  // namespace
}  // namespace tilejit::test
