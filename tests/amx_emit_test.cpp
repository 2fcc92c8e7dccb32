// The AMX emitter on any machine: every tail shape emits, the tile
// configuration matches the plan, and the code holds the instructions the
// design promises. (The AMX kernels against the reference, every tail and
// epilogue: tests/brgemm_battery_test's amx instances, on tile hardware or
// under the emulator; whole GEMMs: gemm_test_amx.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "codegen/xbyak/emitters.h"

namespace tilejit::codegen {
namespace {

// The 64-byte tile configuration is the only 64-byte-aligned blob starting
// with palette 1 whose reserved bytes 2..15 are zero; find it by that shape.
const uint8_t* find_tile_config(const std::vector<uint8_t>& code) {
  for (size_t off = 0; off + 64 <= code.size(); off += 64) {
    const uint8_t* p = code.data() + off;
    if (p[0] != 1 || p[1] != 0) continue;
    if (std::all_of(p + 2, p + 16, [](uint8_t b) { return b == 0; }) && p[48] != 0) return p;
  }
  return nullptr;
}

int count(const std::vector<uint8_t>& code, std::initializer_list<uint8_t> pattern) {
  const std::vector<uint8_t> pat(pattern);
  int n = 0;
  for (size_t i = 0; i + pat.size() <= code.size(); ++i)
    n += std::equal(pat.begin(), pat.end(), code.begin() + i);
  return n;
}

TEST(AmxEmit, EveryTailShapeEmitsWithAMatchingTileConfig) {
  for (bool a_packed : {false, true})
    for (int mr : {1, 5, 15, 16, 17, 31, 32})
      for (int nr : {1, 15, 16, 17, 33, 64})
        for (int64_t kb : {1, 2, 31, 32, 33, 100, 4096}) {
          BrgemmDesc d;
          d.isa = Isa::amx;
          d.a_packed = a_packed;
          d.mr = mr;
          d.nr = nr;
          d.kb = kb;
          d.bias = BiasKind::f32;
          d.act = Activation::gelu_erf;
          d.out = DType::bf16;
          const std::vector<uint8_t> code = xbyak::emit_amx_brgemm(d);
          SCOPED_TRACE(d.name());
          const uint8_t* cfg = find_tile_config(code);
          ASSERT_NE(cfg, nullptr);
          const int mt = (mr + 15) / 16;
          const int ntp = mt == 2 ? 2 : 4;
          // Accumulators and A tiles: rows of their 16-row slice, 64 bytes wide.
          for (int i = 0; i < mt; ++i) {
            const int rows = std::min(16, mr - 16 * i);
            for (int j = 0; j < ntp; ++j) {
              EXPECT_EQ(cfg[48 + i * ntp + j], rows);
              EXPECT_EQ(cfg[16 + 2 * (i * ntp + j)], 64);
            }
            EXPECT_EQ(cfg[48 + mt * ntp + i], rows);
          }
          // B tiles: 16 k-pair rows of 64 bytes.
          for (int t = mt * ntp + mt; t < 8; ++t) {
            EXPECT_EQ(cfg[48 + t], 16);
            EXPECT_EQ(cfg[16 + 2 * t], 64);
          }
          // ldtilecfg (C4 E2 78 49 + a RIP-relative ModRM 05) is loaded by the
          // kernel itself, once, and tilerelease (C4 E2 78 49 C0) leaves the
          // thread's tile state clean, once.
          EXPECT_EQ(count(code, {0xC4, 0xE2, 0x78, 0x49, 0x05}), 1);
          EXPECT_EQ(count(code, {0xC4, 0xE2, 0x78, 0x49, 0xC0}), 1);
        }
}

// The MoE gate/up kernel: 64 columns computed, nr ≤ 32 outputs stored after
// the last pass (the gate and up tiles of a row live in different passes).
TEST(AmxEmit, GluEpilogueEmitsForEveryTail) {
  for (Glu glu : {Glu::act_mul, Glu::clamped_swiglu})
    for (int mr : {1, 16, 17, 32})
      for (int nr : {1, 16, 17, 32})
        for (bool acc : {false, true}) {
          BrgemmDesc d;
          d.isa = Isa::amx;
          d.mr = mr;
          d.nr = nr;
          d.kb = 100;
          d.bias = BiasKind::f32;
          d.act = Activation::silu;
          d.out = DType::bf16;
          d.accumulate = acc;
          d.glu = glu;
          d.glu_alpha = 1.702f;
          d.glu_limit = 7.0f;
          SCOPED_TRACE(d.name());
          const std::vector<uint8_t> code = xbyak::emit_amx_brgemm(d);
          const uint8_t* cfg = find_tile_config(code);
          ASSERT_NE(cfg, nullptr);
          EXPECT_EQ(count(code, {0xC4, 0xE2, 0x78, 0x49, 0x05}), 1);  // ldtilecfg [rip + disp]
          EXPECT_EQ(count(code, {0xC4, 0xE2, 0x78, 0x49, 0xC0}), 1);  // tilerelease
          // Every row of every A tile is configured 64 bytes wide, as for a plain kernel.
          EXPECT_EQ(cfg[16], 64);
        }
}

TEST(AmxEmit, GluKernelNameAndKeySpellTheGatedActivation) {
  BrgemmDesc d;
  d.isa = Isa::amx;
  d.mr = 32;
  d.nr = 17;
  d.kb = 2880;
  d.out = DType::bf16;
  d.act = Activation::gelu_tanh;
  d.glu = Glu::act_mul;
  EXPECT_EQ(d.name(), "brgemm_amx_bf16_f32acc_m32n17k2880_gelu_tanh_and_mul_bf16out");
  BrgemmDesc s = d;
  s.glu = Glu::clamped_swiglu;
  s.glu_alpha = 1.702f;
  s.glu_limit = 7.0f;
  EXPECT_NE(s.key(), d.key());
  BrgemmDesc s2 = s;
  s2.glu_limit = 6.0f;
  EXPECT_NE(s2.key(), s.key());  // the clamp is baked into the code
}

TEST(AmxEmit, KernelNameSpellsTheSpecialization) {
  BrgemmDesc d;
  d.isa = Isa::amx;
  d.mr = 32;
  d.nr = 17;
  d.kb = 4096;
  d.bias = BiasKind::bf16;
  d.act = Activation::silu;
  d.out = DType::bf16;
  EXPECT_EQ(d.name(), "brgemm_amx_bf16_f32acc_m32n17k4096_biasbf16_silu_bf16out");
}

}  // namespace
}  // namespace tilejit::codegen
