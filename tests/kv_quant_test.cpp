// The kv_quant kernel (store_kv's bf16 -> e4m3 / e5m2 conversion; contract
// in codegen/kv_quant_desc.h), Xbyak AVX-512 where the CPU has the avx512
// path and LLVM where built, each for both cache formats, bit for bit
// against runtime::f32_to_fp8:
//   - every one of the 65536 bf16 patterns (NaN, ±Inf, subnormals, ±0
//     included) under scales that move the values across e4m3's whole range
//     (1, 0.125, 3.7, 2^-120, 2^100, a subnormal scale), as rows of every
//     length 1..70 (the 16-lane steps and every tail) and several heads with
//     row strides, the rows ending at a guard page (nothing read past them);
//   - nothing written outside the head rows (canaries between and after);
//   - the caller's MXCSR: round-down and DAZ + FTZ, the reference computed
//     under the same mode (the division follows MXCSR, the subnormal rounding
//     does not);
//   - heads = 0 and d = 0 write nothing.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "codegen/kv_quant_desc.h"
#include "codegen/xbyak/emitters.h"
#include "jit/kernel.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "test_util.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_kv_quant.h"
#endif

namespace tilejit::test {
namespace {

using codegen::KvQuantArgs;
using codegen::KvQuantDesc;
using codegen::KvQuantFn;

struct KqKernel {
  std::string name;
  KvQuantFn fn = nullptr;
  std::shared_ptr<void> keepalive;
  const runtime::Fp8Format* format = &runtime::kE4m3;
};

std::vector<KqKernel> kv_quant_kernels() {
  std::vector<KqKernel> v;
  for (DType code : {DType::f8e4m3, DType::f8e5m2}) {
    const runtime::Fp8Format* f = runtime::fp8_format_of(code);
    if (cpu_info().max_isa >= Isa::avx512) {
      std::shared_ptr<jit::Kernel> k = jit::make_xbyak_kernel(
          codegen::xbyak::emit_kv_quant(KvQuantDesc{.isa = Isa::avx512, .code = code}));
      v.push_back({std::string("xbyak ") + dtype_name(code), k->entry<KvQuantFn>(), k, f});
    }
#ifdef TILEJIT_HAVE_LLVM
    const CpuInfo info = cpu_info();
    if (info.llvm_backend && info.avx2 && info.fma) {
      const KvQuantDesc d{.isa = Isa::llvm, .code = code};
      auto k = std::make_shared<codegen::llvm_backend::LlvmKernel>(
          codegen::llvm_backend::compile_llvm_kv_quant(d));
      EXPECT_EQ(k->name, d.name());
      v.push_back({std::string("llvm ") + dtype_name(code), k->fn<KvQuantFn>(), k, f});
    }
#endif
  }
  return v;
}

// An unknown code format is an Error, not a kernel for some other format.
TEST(KvQuantKernel, RefusesANonFp8Code) {
  if (cpu_info().max_isa >= Isa::avx512) {
    EXPECT_THROW(codegen::xbyak::emit_kv_quant(KvQuantDesc{.isa = Isa::avx512, .code = DType::i8}),
                 Error);
  }
#ifdef TILEJIT_HAVE_LLVM
  const CpuInfo info = cpu_info();
  if (info.llvm_backend && info.avx2 && info.fma) {
    EXPECT_THROW(codegen::llvm_backend::compile_llvm_kv_quant(
                     KvQuantDesc{.isa = Isa::llvm, .code = DType::bf16}),
                 Error);
  }
#endif
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The reference: what store_kv's scalar path computes.
uint8_t reference(const runtime::Fp8Format& f, uint16_t x, float s) {
  return runtime::f32_to_fp8(f, runtime::bf16_to_f32(x) / s);
}

constexpr uint8_t kCanary = 0xA5;

// Converts `heads` rows of d elements taken from `pattern` (cycled from
// `first`) with per-head scales, and checks every byte of the output buffer.
// Returns the number of mismatches (each reported once, up to a few).
int64_t check(const KqKernel& kern, int64_t heads, int64_t d, const std::vector<float>& scales,
              uint32_t first) {
  const int64_t x_head = d + 3, out_head = d + 5;  // strides past the row: gaps to watch
  const int64_t x_elems = heads > 0 ? (heads - 1) * x_head + d : 0;
  GuardedBuffer xb(static_cast<size_t>(std::max<int64_t>(x_elems, 1)) * 2);
  auto* x = xb.as<uint16_t>();
  for (int64_t i = 0; i < x_elems; ++i) x[i] = static_cast<uint16_t>(first + i * 7919u);
  std::vector<uint8_t> out(static_cast<size_t>(heads * out_head + 64), kCanary);
  const KvQuantArgs a{x, x_head, out.data(), out_head, scales.data(), heads, d};
  kern.fn(&a);
  int64_t bad = 0;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t e = 0; e < out_head; ++e) {
      const uint8_t got = out[static_cast<size_t>(h * out_head + e)];
      const uint8_t want =
          e < d ? reference(*kern.format, x[h * x_head + e], scales[static_cast<size_t>(h)])
                : kCanary;
      if (got != want && ++bad <= 4)
        ADD_FAILURE() << kern.name << " heads " << heads << " d " << d << " head " << h
                      << " element " << e << ": got 0x" << std::hex << int(got) << ", want 0x"
                      << int(want)
                      << (e < d ? " (x 0x" + std::to_string(x[h * x_head + e]) + ")"
                                : std::string(" (a byte past the row was written)"));
    }
  for (size_t i = static_cast<size_t>(heads * out_head); i < out.size(); ++i)
    if (out[i] != kCanary && ++bad <= 4) ADD_FAILURE() << kern.name << ": wrote past the rows";
  return bad;
}

const std::vector<float>& scale_set() {
  // Powers of two (the multiply route: 1/s exact) at both ends of it, 2^127
  // just past it, and scales that divide.
  static const std::vector<float> s = {
      1.0f,
      0.125f,
      3.7f,
      std::ldexp(1.0f, -120),
      std::ldexp(1.0f, 100),
      std::ldexp(1.0f, -126),
      std::ldexp(1.0f, 126),
      std::ldexp(1.0f, 127),
      from_bits(0x00012345u)};  // an f32 subnormal  // an f32 subnormal
  return s;
}

TEST(KvQuantKernel, EveryBf16PatternUnderEveryScale) {
  const auto kernels = kv_quant_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no JIT path here";
  for (const KqKernel& k : kernels)
    for (float s : scale_set()) {
      // All 65536 patterns in one head row of 65536 (16-lane steps, no tail).
      GuardedBuffer xb(65536 * 2);
      auto* x = xb.as<uint16_t>();
      for (uint32_t i = 0; i < 65536; ++i) x[i] = static_cast<uint16_t>(i);
      std::vector<uint8_t> out(65536);
      const KvQuantArgs a{x, 65536, out.data(), 65536, &s, 1, 65536};
      k.fn(&a);
      int bad = 0;
      for (uint32_t i = 0; i < 65536; ++i)
        if (out[i] != reference(*k.format, static_cast<uint16_t>(i), s) && ++bad <= 4)
          ADD_FAILURE() << k.name << " scale " << s << " x 0x" << std::hex << i << ": got 0x"
                        << int(out[i]) << ", want 0x"
                        << int(reference(*k.format, static_cast<uint16_t>(i), s));
      EXPECT_EQ(bad, 0) << k.name << " scale " << s;
    }
}

TEST(KvQuantKernel, EveryTailAndHeadStride) {
  const auto kernels = kv_quant_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no JIT path here";
  for (const KqKernel& k : kernels)
    for (int64_t heads : {1, 3, 8})
      for (int64_t d = 1; d <= 70; ++d) {
        std::vector<float> scales;
        for (int64_t h = 0; h < heads; ++h)
          scales.push_back(scale_set()[static_cast<size_t>(h) % scale_set().size()]);
        EXPECT_EQ(check(k, heads, d, scales, static_cast<uint32_t>(d * 131 + heads)), 0);
      }
}

TEST(KvQuantKernel, NothingToDo) {
  const auto kernels = kv_quant_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no JIT path here";
  for (const KqKernel& k : kernels) {
    EXPECT_EQ(check(k, 0, 16, {}, 1), 0);
    EXPECT_EQ(check(k, 4, 0, {1, 1, 1, 1}, 1), 0);
  }
}

// Pairs (x, s) whose quotient x / s lies within an f32 ulp of a point where
// the format's rounding changes (the tie 1 + 2^-(M+1) above 1, M its mantissa
// bits: 1 + 1/16 between e4m3's 0x38 and 0x39): s = x / tie rounded to f32.
// Which code they store depends on how the division rounds.
std::vector<std::pair<uint16_t, float>> tie_pairs(const runtime::Fp8Format& f) {
  const double tie = 1 + std::ldexp(1.0, -(f.man_bits + 1));
  std::vector<std::pair<uint16_t, float>> v;
  for (uint32_t m = 0; m < 128; ++m)
    for (uint32_t e : {0x3F80u, 0x4000u, 0x4100u, 0x3E00u}) {
      const auto x = static_cast<uint16_t>(e | m);
      v.emplace_back(x, static_cast<float>(double(runtime::bf16_to_f32(x)) / tie));
    }
  return v;
}

// The reference under the current MXCSR (out of line: computed after the
// mode is set).
[[gnu::noinline]] std::vector<uint8_t> references(
    const runtime::Fp8Format& f, const std::vector<std::pair<uint16_t, float>>& p) {
  std::vector<uint8_t> r;
  for (const auto& [x, s] : p) r.push_back(reference(f, x, s));
  return r;
}

// The caller's MXCSR: the division rounds as it says (as the reference's
// does); the rounding to a subnormal code does not depend on it.
void follows_mxcsr(const runtime::Fp8Format& f, const std::vector<KqKernel>& all_kernels);

TEST(KvQuantKernel, FollowsTheCallersMxcsrLikeTheReference) {
  const auto kernels = kv_quant_kernels();
  if (kernels.empty()) GTEST_SKIP() << "no JIT path here";
  for (const runtime::Fp8Format* f : {&runtime::kE4m3, &runtime::kE5m2}) follows_mxcsr(*f, kernels);
}

void follows_mxcsr(const runtime::Fp8Format& f, const std::vector<KqKernel>& all_kernels) {
  std::vector<KqKernel> kernels;
  for (const KqKernel& k : all_kernels)
    if (k.format == &f) kernels.push_back(k);
  const auto pairs = tie_pairs(f);
  const int64_t d = 17;  // one full 16-lane step and a tail of one
  std::vector<uint16_t> x;
  std::vector<float> scales;
  for (const auto& [xv, s] : pairs) {
    x.insert(x.end(), d, xv);
    scales.push_back(s);
  }
  const unsigned saved = _mm_getcsr();
  std::vector<std::vector<uint8_t>> by_mode;
  for (unsigned mode : {0u, unsigned(_MM_ROUND_DOWN), unsigned(_MM_ROUND_UP)}) {
    _mm_setcsr((saved & ~0x6000u) | mode);
    by_mode.push_back(references(f, pairs));
    for (const KqKernel& k : kernels) {
      std::vector<uint8_t> out(x.size());
      const KvQuantArgs a{
          x.data(), d, out.data(), d, scales.data(), static_cast<int64_t>(pairs.size()), d};
      k.fn(&a);
      int bad = 0;
      for (size_t i = 0; i < out.size(); ++i)
        if (out[i] != by_mode.back()[i / d] && ++bad <= 4)
          ADD_FAILURE() << k.name << " MXCSR rounding " << std::hex << mode << " x 0x"
                        << pairs[i / d].first << ": got 0x" << int(out[i]) << ", want 0x"
                        << int(by_mode.back()[i / d]);
      EXPECT_EQ(bad, 0);
    }
    _mm_setcsr(saved);
  }
  // The pairs do tell the modes apart (else this test could not fail).
  EXPECT_NE(by_mode[1], by_mode[2]);
  // Power-of-two scales (the kernel multiplies by 1/s): quotients that
  // underflow to subnormals round by the mode too, as the division does.
  std::vector<std::pair<uint16_t, float>> all;
  for (float sc : {1.0f, std::ldexp(1.0f, 100), std::ldexp(1.0f, 126), std::ldexp(1.0f, -126)})
    for (uint32_t i = 0; i < 65536; ++i) all.emplace_back(static_cast<uint16_t>(i), sc);
  std::vector<uint16_t> xs;
  std::vector<float> ss;
  for (const auto& [xv, sc] : all) {
    xs.push_back(xv);
    ss.push_back(sc);
  }
  for (unsigned mode : {unsigned(_MM_ROUND_DOWN), unsigned(_MM_ROUND_UP), 0x8040u}) {
    _mm_setcsr((saved & ~0xE040u) | mode);
    const std::vector<uint8_t> want = references(f, all);
    for (const KqKernel& k : kernels) {
      std::vector<uint8_t> out(xs.size());
      // One element a head, each with its own scale.
      const KvQuantArgs a{xs.data(), 1, out.data(), 1, ss.data(), static_cast<int64_t>(xs.size()),
                          1};
      k.fn(&a);
      EXPECT_EQ(out, want) << k.name << " MXCSR " << std::hex << mode;
    }
    _mm_setcsr(saved);
  }
  // DAZ + FTZ with subnormal scales and quotients.
  _mm_setcsr(saved | 0x8040u);
  for (const KqKernel& k : kernels)
    for (float s : {std::ldexp(1.0f, -120), from_bits(0x00012345u), 3.7f})
      EXPECT_EQ(check(k, 2, 37, {s, s}, 0x0001u), 0) << "DAZ + FTZ, scale " << s;
  _mm_setcsr(saved);
}

}  // namespace
}  // namespace tilejit::test
