// The hostile-input battery (issue: hostile input never crashes, hangs,
// overflows or silently computes garbage). Each case is a call a hostile or
// careless engine could make; its expected outcome is either a tilejit::Error
// whose message names the argument (checked by a substring) or a documented
// correct result (checked against the same call on separate buffers).
// Registered once per ISA path: the checks run before any path is chosen, the
// accepted-aliasing results are computed by every path.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ops/tensor_checks.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

constexpr int64_t kBig = int64_t{1} << 40;
constexpr int64_t kMaxDim = Limits::max_dim;

// Runs f and expects an Error whose message contains every needle.
void expect_error(const std::function<void()>& f, std::initializer_list<const char*> needles) {
  try {
    f();
    ADD_FAILURE() << "expected an Error containing \"" << *needles.begin() << "\"";
  } catch (const Error& e) {
    for (const char* n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message: " << e.what() << "\nwanted: " << n;
  }
}

// A small valid world to break one argument of at a time.
struct Bufs {
  std::vector<uint16_t> a = random_bf16(1 << 16, 1);
  std::vector<uint16_t> b = random_bf16(1 << 16, 2);
  std::vector<uint16_t> c = random_bf16(1 << 16, 3);
  std::vector<float> f = random_f32(1 << 14, 4);
  std::vector<int32_t> i32 = std::vector<int32_t>(1 << 12, 0);
  std::vector<int64_t> i64 = std::vector<int64_t>(1 << 12, 0);
};

PackedWeight small_weight(Bufs& s, int64_t n = 64, int64_t k = 64) {
  return pack_weight(TensorView(s.b.data(), DType::bf16, {n, k}));
}

// ---------------------------------------------------------------------------
// 1. Sizes that overflow int64, and absurd counts: an Error before any work.

TEST(HostileSizes, GemmDimsAndExtents) {
  Bufs s;
  const PackedWeight w = small_weight(s);
  TensorView y(s.c.data(), DType::bf16, {5, 64});
  // The segfault: x [2^40, 64] with a 2^40 row stride.
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), DType::bf16, {kBig, 64}, {kBig, 1}), w, y);
      },
      {"gemm: x", "dims <="});
  // Dims within the limit, extent beyond the address space.
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), DType::bf16, {kMaxDim, 64}, {kMaxDim * 8, 1}), w, y);
      },
      {"gemm: x", "address space"});
  // The fuzzer's first find: a row stride of INT64_MAX on a one-row x (its
  // extent is one row) overflowed when turned into bytes.
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), DType::bf16, {1, 64}, {std::numeric_limits<int64_t>::max(), 1}),
             w, TensorView(s.c.data(), DType::bf16, {1, 64}));
      },
      {"gemm: x", "strides <= 2^56"});
  // A last element offset of exactly INT64_MAX (649657 · 14197294936951 = 2^63 − 1).
  expect_error(
      [&] {
        pack_weight(TensorView(s.a.data(), DType::bf16, {649658, 1}, {14197294936951, 1}));
      },
      {"pack_weight: w", "address space"});
  // The row-major constructor saturates instead of overflowing.
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), DType::bf16, {kBig, kBig, kBig}), w, y);
      },
      {"gemm: x"});
  expect_error(
      [&] {
        pack_weight(TensorView(s.a.data(), DType::bf16, {kMaxDim, kMaxDim}));
      },
      {"pack_weight: w", "address space"});
}

TEST(HostileSizes, PackExperts) {
  Bufs s;
  // 65537 experts through an expert stride of 0.
  expect_error(
      [&] {
        pack_experts(TensorView(s.a.data(), DType::bf16, {65537, 2, 16}, {0, 16, 1}),
                     ExpertProj::gate_up);
      },
      {"pack_experts", "E (w.shape[0])=65537"});
  // The largest count with a large expert: the packed size does not fit in
  // memory and is an Error, not std::bad_alloc or a crash.
  std::vector<uint16_t> big(size_t{1} << 24);
  expect_error(
      [&] {
        pack_experts(TensorView(big.data(), DType::bf16, {65536, 4096, 4096}, {0, 4096, 1}),
                     ExpertProj::down);
      },
      {"out of memory"});
}

TEST(HostileSizes, AttentionCounts) {
  Bufs s;
  std::vector<int32_t> cu = {0, 4};
  TensorView cuq(cu.data(), DType::i32, {2});
  TensorView k(s.b.data(), DType::bf16, {4, 1, 64});
  TensorView v(s.c.data(), DType::bf16, {4, 1, 64});
  std::vector<uint16_t> out(4 * 64);
  // Hq = 2^31 - 1 heads through a head stride of 0 (ran > 30 s before).
  expect_error(
      [&] {
        flash_attn_varlen(TensorView(s.a.data(), DType::bf16, {4, kMaxDim, 64}, {64, 0, 1}), k, v,
                          TensorView(out.data(), DType::bf16, {4, kMaxDim, 64}, {0, 0, 1}), cuq,
                          cuq);
      },
      {"Hq=2147483647", "1 .. 4096"});
  // Hq = 2^62: past the dim limit.
  expect_error(
      [&] {
        flash_attn_varlen(
            TensorView(s.a.data(), DType::bf16, {4, int64_t{1} << 62, 64}, {64, 0, 1}), k, v,
            TensorView(out.data(), DType::bf16, {4, 1, 64}), cuq, cuq);
      },
      {"flash_attn_varlen: q", "dims <="});
  // decode with Hq = 2^32 + 2 (hung on scalar; named an internal g before).
  std::vector<int32_t> table(4, 0), lens = {16};
  TensorView kc(s.b.data(), DType::bf16, {4, 16, 1, 64});
  expect_error(
      [&] {
        decode_attention(
            TensorView(s.a.data(), DType::bf16, {1, (int64_t{1} << 32) + 2, 64}, {64, 0, 1}), kc,
            kc, TensorView(out.data(), DType::bf16, {1, 1, 64}),
            TensorView(table.data(), DType::i32, {1, 4}), TensorView(lens.data(), DType::i32, {1}));
      },
      {"decode_attention: q", "dims <="});
  expect_error(
      [&] {
        decode_attention(TensorView(s.a.data(), DType::bf16, {1, 8192, 64}, {64, 0, 1}), kc, kc,
                         TensorView(out.data(), DType::bf16, {1, 8192, 64}, {0, 0, 1}),
                         TensorView(table.data(), DType::i32, {1, 4}),
                         TensorView(lens.data(), DType::i32, {1}));
      },
      {"Hq=8192"});
}

TEST(HostileSizes, AttentionStridesAndTables) {
  Bufs s;
  std::vector<int32_t> cu = {0, 4};
  TensorView cuq(cu.data(), DType::i32, {2});
  TensorView q(s.a.data(), DType::bf16, {4, 1, 64});
  TensorView v(s.c.data(), DType::bf16, {4, 1, 64});
  std::vector<uint16_t> out(4 * 64);
  TensorView o(out.data(), DType::bf16, {4, 1, 64});
  // A 2^62 token stride: pointer arithmetic far outside any object before.
  expect_error(
      [&] {
        flash_attn_varlen(
            q, TensorView(s.b.data(), DType::bf16, {4, 1, 64}, {int64_t{1} << 62, 64, 1}), v, o,
            cuq, cuq);
      },
      {"flash_attn_varlen: k", "strides <= 2^56"});
  // Block tables [B, 2^60]: max_blocks·block_size overflowed int64.
  std::vector<int32_t> table(4, 0), lens = {16}, pre = {0};
  TensorView kc(s.b.data(), DType::bf16, {4, 16, 1, 64});
  TensorView wide(table.data(), DType::i32, {1, int64_t{1} << 60}, {0, 0});
  expect_error(
      [&] {
        decode_attention(TensorView(s.a.data(), DType::bf16, {1, 1, 64}), kc, kc,
                         TensorView(out.data(), DType::bf16, {1, 1, 64}), wide,
                         TensorView(lens.data(), DType::i32, {1}));
      },
      {"decode_attention: block_table", "dims <="});
  std::vector<int32_t> qo = {0, 4};
  expect_error(
      [&] {
        extend_attention(q, kc, kc, o, TensorView(qo.data(), DType::i32, {2}), wide,
                         TensorView(pre.data(), DType::i32, {1}));
      },
      {"extend_attention: block_table", "dims <="});
  // store_kv's capacity num_blocks·block_size from a cache past the address space.
  std::vector<int64_t> slots = {0};
  expect_error(
      [&] {
        store_kv(TensorView(s.a.data(), DType::bf16, {1, 1, 64}),
                 TensorView(s.a.data(), DType::bf16, {1, 1, 64}),
                 TensorView(s.b.data(), DType::bf16, {kMaxDim, kMaxDim, 1, 64}),
                 TensorView(s.c.data(), DType::bf16, {kMaxDim, kMaxDim, 1, 64}),
                 TensorView(slots.data(), DType::i64, {1}));
      },
      {"store_kv: k_cache", "address space"});
  // fused_experts' overlap test on views whose extents overflowed.
  const PackedExperts w13 =
      pack_experts(TensorView(s.a.data(), DType::bf16, {2, 64, 64}), ExpertProj::gate_up);
  const PackedExperts w2 =
      pack_experts(TensorView(s.b.data(), DType::bf16, {2, 64, 32}), ExpertProj::down);
  std::vector<float> tw(2, 0.5f);
  std::vector<int32_t> tid = {0, 1};
  expect_error(
      [&] {
        fused_experts(TensorView(s.c.data(), DType::bf16, {2, 64}, {int64_t{1} << 62, 1}), w13, w2,
                      TensorView(tw.data(), DType::f32, {2, 1}),
                      TensorView(tid.data(), DType::i32, {2, 1}),
                      TensorView(s.f.data(), DType::f32, {2, 64}));
      },
      {"fused_experts: hidden", "strides <= 2^56"});
}

TEST(HostileSizes, BlockTableWiderThanAnyLength) {
  // A block table [1, 2^31 - 1] (stride 0): max_blocks·block_size = 2^35 is a
  // capacity, not an error; only the blocks the sequence uses are read.
  Bufs s;
  std::vector<int32_t> table(1, 0), lens = {17};
  TensorView kc(s.b.data(), DType::bf16, {1, 16, 1, 64});
  std::vector<uint16_t> out(64);
  EXPECT_NO_THROW(decode_attention(TensorView(s.a.data(), DType::bf16, {1, 1, 64}), kc, kc,
                                   TensorView(out.data(), DType::bf16, {1, 1, 64}),
                                   TensorView(table.data(), DType::i32, {1, kMaxDim}, {0, 0}),
                                   TensorView(lens.data(), DType::i32, {1})));
  lens[0] = 33;  // past a two-block table
  expect_error(
      [&] {
        decode_attention(TensorView(s.a.data(), DType::bf16, {1, 1, 64}), kc, kc,
                         TensorView(out.data(), DType::bf16, {1, 1, 64}),
                         TensorView(table.data(), DType::i32, {1, 2}, {0, 0}),
                         TensorView(lens.data(), DType::i32, {1}));
      },
      {"seq_lens[0]=33", "= 32"});
}

TEST(HostileSizes, RopeOptions) {
  Bufs s;
  TensorView q(s.f.data(), DType::f32, {2, 1, 32});
  std::vector<int32_t> pos = {0, 1, 0, 1, 0, 1};
  TensorView cache(s.f.data() + 4096, DType::f32, {8, 32});
  RopeOptions o;
  o.mrope_section = {std::numeric_limits<int64_t>::max(), std::numeric_limits<int64_t>::max(), 2};
  expect_error(
      [&] {
        rope(q, nullptr, TensorView(pos.data(), DType::i32, {3, 2}), cache, o);
      },
      {"mrope_section"});
  RopeOptions n;
  n.ndim = std::numeric_limits<int>::max();
  expect_error([&] { rope(q, nullptr, TensorView(pos.data(), DType::i32, {2}), cache, n); },
               {"ndim=2147483647"});
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {2, 1, 1024}), nullptr,
             TensorView(pos.data(), DType::i32, {2}),
             TensorView(s.f.data() + 4096, DType::f32, {2, 1024}));
      },
      {"D=1024"});
}

TEST(HostileSizes, MoeCounts) {
  Bufs s;
  std::vector<float> logits(70000, 0);
  std::vector<float> w(4);
  std::vector<int32_t> ids(4);
  expect_error(
      [&] {
        topk_softmax(TensorView(logits.data(), DType::f32, {1, 70000}),
                     TensorView(w.data(), DType::f32, {1, 2}),
                     TensorView(ids.data(), DType::i32, {1, 2}));
      },
      {"E (logits.shape[1])=70000"});
}

// ---------------------------------------------------------------------------
// 2. Outputs that alias inputs or themselves.

TEST(HostileAliasing, Gemm) {
  Bufs s;
  const PackedWeight w = small_weight(s);
  TensorView x(s.a.data(), DType::bf16, {5, 64});
  expect_error([&] { gemm(x, w, x); }, {"gemm: y", "overlaps x"});
  // y sharing a row with x, offset into the same buffer.
  expect_error(
      [&] {
        gemm(x, w, TensorView(s.a.data() + 256, DType::bf16, {5, 64}));
      },
      {"overlaps x"});
  std::vector<float> bias(64 * 8);
  GemmOptions o;
  o.bias = TensorView(bias.data(), DType::f32, {64});
  expect_error(
      [&] {
        gemm(x, w, TensorView(bias.data(), DType::f32, {5, 64}, {64, 1}), o);
      },
      {"overlaps bias"});
  // Row stride 0: every row written to one place.
  expect_error(
      [&] {
        gemm(x, w, TensorView(s.c.data(), DType::bf16, {5, 64}, {0, 1}));
      },
      {"gemm: y", "row stride 0"});
  // Column stride 0 (a one-column y broadcast over N): caught as self-overlap.
  std::vector<float> y1(5);
  const PackedWeight w1 = small_weight(s, 1, 64);
  EXPECT_NO_THROW(gemm(x, w1, TensorView(y1.data(), DType::f32, {5, 1}, {1, 0})));
  // The unpack of a weight into a self-overlapping view.
  expect_error(
      [&] {
        w.unpack(TensorView(s.c.data(), DType::bf16, {64, 64}, {0, 1}));
      },
      {"unpack", "out"});
}

TEST(HostileAliasing, Rope) {
  Bufs s;
  TensorView q(s.f.data(), DType::f32, {4, 2, 32});
  std::vector<int32_t> pos = {0, 1, 2, 3};
  TensorView p(pos.data(), DType::i32, {4});
  TensorView cache(s.f.data() + 8192, DType::f32, {8, 32});
  expect_error([&] { rope(q, &q, p, cache); }, {"rope: q", "overlaps k"});
  // positions inside q: validated, then overwritten, then used (segfaulted).
  expect_error(
      [&] {
        rope(q, nullptr, TensorView(reinterpret_cast<int32_t*>(s.f.data()), DType::i32, {4}),
             cache);
      },
      {"overlaps positions"});
  expect_error(
      [&] {
        rope(q, nullptr, p, TensorView(s.f.data(), DType::f32, {8, 32}));
      },
      {"overlaps cos_sin_cache"});
  // A head stride of 0 in q rotates the same row twice.
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {4, 2, 32}, {64, 0, 1}), nullptr, p, cache);
      },
      {"rope: q", "row stride 0"});
  // A token stride of 0.
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {4, 2, 32}, {0, 32, 1}), nullptr, p, cache);
      },
      {"rope: q", "dim 0 has stride 0"});
  // Heads that interleave with the next token's (token stride 8 inside a
  // token's 12-element span): refused, the message saying so.
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {3, 3, 2}, {8, 5, 1}), nullptr,
             TensorView(pos.data(), DType::i32, {3}),
             TensorView(s.f.data() + 8192, DType::f32, {8, 2}));
      },
      {"rope: q", "dim 0 (stride 8) steps inside the 12 elements"});
  // q [2, 3, 2] and a one-head k [2, 1, 2] interleaved in one buffer (token
  // stride 15, q's heads at 0, 5, 10, k at 17): no element shared, whatever
  // stride k's size-1 head dim claims (torch's DLPack gives 1, not 5).
  // Accepted, and the same as on separate buffers.
  const std::vector<int64_t> qs = {15, 5, 1};
  std::vector<float> buf(64), qa(12), ka(4);
  std::vector<int32_t> pos2 = {1, 2};
  const TensorView p2(pos2.data(), DType::i32, {2});
  const TensorView cache2(s.f.data() + 8192, DType::f32, {8, 2});
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = 0.25f * static_cast<float>(i) - 3.0f;
  for (int64_t t = 0; t < 2; ++t) {
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t c = 0; c < 2; ++c) qa[t * 6 + h * 2 + c] = buf[t * 15 + h * 5 + c];
    for (int64_t c = 0; c < 2; ++c) ka[t * 2 + c] = buf[17 + t * 15 + c];
  }
  for (int64_t k_head_stride : {5, 1, 0, 99}) {
    std::vector<float> b = buf;
    TensorView qv(b.data(), DType::f32, {2, 3, 2}, qs);
    TensorView kv(b.data() + 17, DType::f32, {2, 1, 2}, {15, k_head_stride, 1});
    rope(qv, &kv, p2, cache2);
    std::vector<float> q2 = qa, k2 = ka;
    TensorView qc(q2.data(), DType::f32, {2, 3, 2}), kc(k2.data(), DType::f32, {2, 1, 2});
    rope(qc, &kc, p2, cache2);
    for (int64_t t = 0; t < 2; ++t) {
      for (int64_t h = 0; h < 3; ++h)
        for (int64_t c = 0; c < 2; ++c)
          ASSERT_EQ(b[t * 15 + h * 5 + c], q2[t * 6 + h * 2 + c]) << k_head_stride;
      for (int64_t c = 0; c < 2; ++c) ASSERT_EQ(b[17 + t * 15 + c], k2[t * 2 + c]);
    }
  }
}

TEST(HostileAliasing, Attention) {
  Bufs s;
  std::vector<int32_t> cu = {0, 4};
  TensorView cuq(cu.data(), DType::i32, {2});
  TensorView q(s.a.data(), DType::bf16, {4, 2, 64});
  TensorView k(s.b.data(), DType::bf16, {4, 1, 64});
  TensorView v(s.c.data(), DType::bf16, {4, 1, 64});
  expect_error(
      [&] {
        flash_attn_varlen(q, k, v, TensorView(s.b.data(), DType::bf16, {4, 2, 64}), cuq, cuq);
      },
      {"flash_attn_varlen: out", "overlaps k"});
  expect_error(
      [&] {
        flash_attn_varlen(
            q, k, v, TensorView(s.c.data() + 4096, DType::bf16, {4, 2, 64}, {128, 0, 1}), cuq, cuq);
      },
      {"flash_attn_varlen: out", "do not overlap"});
  std::vector<int32_t> table = {0, 1}, lens = {20};
  TensorView kc(s.b.data(), DType::bf16, {2, 16, 1, 64});
  TensorView vc(s.c.data(), DType::bf16, {2, 16, 1, 64});
  TensorView bt(table.data(), DType::i32, {1, 2});
  TensorView sl(lens.data(), DType::i32, {1});
  expect_error(
      [&] {
        decode_attention(TensorView(s.a.data(), DType::bf16, {1, 2, 64}), kc, vc,
                         TensorView(s.b.data() + 64, DType::bf16, {1, 2, 64}), bt, sl);
      },
      {"decode_attention: out", "overlaps k_cache"});
  std::vector<int32_t> tl(1 + 64, 0);  // a block table and out in one buffer
  tl[0] = 1;
  expect_error(
      [&] {
        decode_attention(
            TensorView(s.a.data(), DType::bf16, {1, 2, 64}), kc, vc,
            TensorView(reinterpret_cast<uint16_t*>(tl.data()), DType::bf16, {1, 2, 64}),
            TensorView(tl.data(), DType::i32, {1, 1}), sl);
      },
      {"decode_attention: out", "overlaps block_table"});
}

TEST(HostileAliasing, StoreKv) {
  Bufs s;
  std::vector<int64_t> slots = {0, 3};
  TensorView sm(slots.data(), DType::i64, {2});
  TensorView k(s.a.data(), DType::bf16, {2, 1, 64});
  TensorView v(s.a.data() + 1024, DType::bf16, {2, 1, 64});
  TensorView kc(s.b.data(), DType::bf16, {2, 16, 1, 64});
  expect_error([&] { store_kv(k, v, kc, kc, sm); }, {"store_kv: k_cache", "overlaps v_cache"});
  // A slot stride of 0: every slot of a block is one row.
  expect_error(
      [&] {
        store_kv(k, v, TensorView(s.b.data(), DType::bf16, {2, 16, 1, 64}, {1024, 0, 64, 1}),
                 TensorView(s.c.data(), DType::bf16, {2, 16, 1, 64}), sm);
      },
      {"store_kv: k_cache", "do not overlap"});
  expect_error(
      [&] {
        store_kv(k, v, TensorView(s.a.data(), DType::bf16, {2, 16, 1, 64}),
                 TensorView(s.c.data(), DType::bf16, {2, 16, 1, 64}), sm);
      },
      {"k_cache", "overlaps k"});
}

// The overlap check against brute force: random views of up to 4 dims in one
// buffer, their bytes marked. It may never call overlapping views disjoint
// (a race or a silent wrong answer), and for views of one dtype with the
// same strides it must be exact (an outside tester's store_kv with K and V as
// column halves of one buffer was refused, though no element is shared).
TEST(HostileAliasing, OverlapCheckAgainstBruteForce) {
  std::mt19937 rng(7);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  constexpr int64_t kBytes = 4096;
  alignas(64) static uint8_t buf[kBytes];
  int64_t exact_disjoint = 0, exact_overlap = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const DType dt = std::array{DType::u8, DType::bf16, DType::f32}[pick(0, 2)];
    const int64_t e = dtype_bits(dt) / 8;
    const int rank = pick(1, 4);
    const bool same = pick(0, 3) != 0;
    std::vector<int64_t> strides(rank), shape_a(rank), shape_b(rank);
    for (int i = 0; i < rank; ++i) {
      strides[i] = pick(0, 3) == 0 ? pick(0, 40) : int64_t{1} << (2 * (rank - 1 - i) + pick(0, 2));
      shape_a[i] = pick(1, 4);
      shape_b[i] = same && pick(0, 1) ? shape_a[i] : pick(1, 4);
    }
    std::vector<int64_t> strides_b = strides;
    if (!same)
      for (auto& x : strides_b) x = pick(0, 40);
    // The stride of a dim of size 1 never steps: DLPack exporters rewrite it
    // (torch gives a one-head k stride 1 where q's head stride is D), and the
    // views still count as of the same strides (an outside tester's rope
    // with q and k as disjoint views of one buffer was refused).
    std::vector<int64_t> strides_a = strides;
    if (same)
      for (int i = 0; i < rank; ++i) {
        if (shape_a[i] == 1 && pick(0, 1)) strides_a[i] = pick(0, 40);
        if (shape_b[i] == 1 && pick(0, 1)) strides_b[i] = pick(0, 40);
      }
    auto bytes_of = [&](const std::vector<int64_t>& shape, const std::vector<int64_t>& st,
                        int64_t off) {
      std::vector<bool> m(kBytes, false);
      std::vector<int64_t> idx(rank, 0);
      for (;;) {
        int64_t p = off;
        for (int i = 0; i < rank; ++i) p += idx[i] * st[i] * e;
        for (int64_t b = 0; b < e; ++b) m[p + b] = true;
        int i = rank - 1;
        while (i >= 0 && ++idx[i] == shape[i]) idx[i--] = 0;
        if (i < 0) break;
      }
      return m;
    };
    auto extent = [&](const std::vector<int64_t>& shape, const std::vector<int64_t>& st) {
      int64_t x = e;
      for (int i = 0; i < rank; ++i) x += (shape[i] - 1) * st[i] * e;
      return x;
    };
    const int64_t ea = extent(shape_a, strides_a), eb = extent(shape_b, strides_b);
    if (ea + eb > kBytes) continue;
    const int64_t off_a = pick(0, static_cast<int>((kBytes - ea) / e)) * e;
    const int64_t off_b = std::clamp<int64_t>(off_a + pick(-64, 64) * e, 0, (kBytes - eb) / e * e);
    const auto ma = bytes_of(shape_a, strides_a, off_a), mb = bytes_of(shape_b, strides_b, off_b);
    bool truth = false;
    for (int64_t i = 0; i < kBytes; ++i) truth = truth || (ma[i] && mb[i]);
    const TensorView a(buf + off_a, dt, shape_a, strides_a), b(buf + off_b, dt, shape_b, strides_b);
    const bool said = ops::views_overlap(a, b);
    ASSERT_EQ(said, ops::views_overlap(b, a));
    if (truth) {
      ASSERT_TRUE(said) << "overlapping views called disjoint, iteration " << iter;
    }
    if (same) {
      ASSERT_EQ(said, truth) << "same strides, iteration " << iter;
      (truth ? exact_overlap : exact_disjoint) += 1;
    }
  }
  EXPECT_GT(exact_disjoint, 1000);  // the sweep reaches both answers
  EXPECT_GT(exact_overlap, 1000);

  // store_kv with K and V as column halves of one [blocks, 16, Hkv, 2·D]
  // buffer: no element shared, accepted, and each half written.
  std::vector<uint16_t> kv(2 * 16 * 2 * 128, 0), k(2 * 2 * 64), v(2 * 2 * 64);
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint16_t>(i + 1), v[i] = 0x8000 | i;
  const std::vector<int64_t> slots = {3, 20};
  const std::vector<int64_t> st = {16 * 2 * 128, 2 * 128, 128, 1};
  store_kv(TensorView(k.data(), DType::bf16, {2, 2, 64}),
           TensorView(v.data(), DType::bf16, {2, 2, 64}),
           TensorView(kv.data(), DType::bf16, {2, 16, 2, 64}, st),
           TensorView(kv.data() + 64, DType::bf16, {2, 16, 2, 64}, st),
           TensorView(slots.data(), DType::i64, {2}));
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t c = 0; c < 64; ++c) {
        const int64_t row = slots[t] * 2 * 128 + h * 128;
        ASSERT_EQ(kv[row + c], k[(t * 2 + h) * 64 + c]);
        ASSERT_EQ(kv[row + 64 + c], v[(t * 2 + h) * 64 + c]);
      }
  // Shifted by one element, the halves share a column: refused.
  expect_error(
      [&] {
        store_kv(TensorView(k.data(), DType::bf16, {2, 2, 64}),
                 TensorView(v.data(), DType::bf16, {2, 2, 64}),
                 TensorView(kv.data(), DType::bf16, {2, 16, 2, 64}, st),
                 TensorView(kv.data() + 63, DType::bf16, {2, 16, 2, 64}, st),
                 TensorView(slots.data(), DType::i64, {2}));
      },
      {"store_kv: k_cache", "overlaps v_cache"});
}

TEST(HostileViews, StoreKvIntoEmptyCaches) {
  // The api fuzzer's find: caches with a head size of 0 (empty views, whose
  // pointer is never checked) got rows copied to null + offset / an odd address.
  Bufs s;
  std::vector<int32_t> slots = {0, 5};
  TensorView sm(slots.data(), DType::i32, {2});
  auto* odd = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(s.b.data()) + 1);
  EXPECT_NO_THROW(store_kv(TensorView(s.a.data(), DType::bf16, {2, 1, 0}),
                           TensorView(s.c.data(), DType::bf16, {2, 1, 0}),
                           TensorView(nullptr, DType::bf16, {1, 16, 1, 0}),
                           TensorView(odd, DType::bf16, {1, 16, 1, 0}), sm));
}

TEST(HostileViews, PrefillWithNoQueries) {
  // The api fuzzer's find: Tq = 0 with null q and out and a sequence with
  // keys but no queries; the scalar path formed null + offset row pointers.
  Bufs s;
  std::vector<int32_t> cq = {0, 0}, ck = {0, 2};
  EXPECT_NO_THROW(flash_attn_varlen(
      TensorView(nullptr, DType::bf16, {0, 3, 80}), TensorView(s.b.data(), DType::bf16, {2, 1, 80}),
      TensorView(s.c.data(), DType::bf16, {2, 1, 80}), TensorView(nullptr, DType::bf16, {0, 3, 80}),
      TensorView(cq.data(), DType::i32, {2}), TensorView(ck.data(), DType::i32, {2})));
}

TEST(HostileAliasing, Moe) {
  Bufs s;
  // Row stride 0 in the expert weights.
  expect_error(
      [&] {
        pack_experts(TensorView(s.a.data(), DType::bf16, {2, 64, 64}, {4096, 0, 1}),
                     ExpertProj::down);
      },
      {"pack_experts", "strides [4096, 0, 1]", "two elements share an address"});
  std::vector<float> logits(8 * 16, 0.5f);
  std::vector<float> w(8 * 2);
  std::vector<int32_t> ids(8 * 2);
  TensorView lg(logits.data(), DType::f32, {8, 16});
  // topk_ids written over topk_weights.
  expect_error(
      [&] {
        topk_softmax(lg, TensorView(w.data(), DType::f32, {8, 2}),
                     TensorView(reinterpret_cast<int32_t*>(w.data()), DType::i32, {8, 2}));
      },
      {"topk_weights", "overlaps topk_ids"});
  expect_error(
      [&] {
        topk_sigmoid(lg, TensorView(logits.data(), DType::f32, {8, 2}),
                     TensorView(ids.data(), DType::i32, {8, 2}));
      },
      {"topk_weights", "overlaps logits"});

  const PackedExperts w13 =
      pack_experts(TensorView(s.a.data(), DType::bf16, {2, 64, 64}), ExpertProj::gate_up);
  const PackedExperts w2 =
      pack_experts(TensorView(s.b.data(), DType::bf16, {2, 64, 32}), ExpertProj::down);
  std::vector<float> tw(4, 0.5f);
  std::vector<int32_t> tid = {0, 1, 1, 0};
  TensorView hidden(s.c.data(), DType::bf16, {2, 64});
  expect_error(
      [&] {
        fused_experts(hidden, w13, w2, TensorView(tw.data(), DType::f32, {2, 2}),
                      TensorView(tid.data(), DType::i32, {2, 2}),
                      TensorView(tw.data(), DType::f32, {2, 64}, {0, 0}));
      },
      {"fused_experts: out"});
  std::vector<float> out(2 * 64 + 4);
  expect_error(
      [&] {
        fused_experts(hidden, w13, w2, TensorView(out.data() + 64, DType::f32, {2, 2}),
                      TensorView(tid.data(), DType::i32, {2, 2}),
                      TensorView(out.data(), DType::f32, {2, 64}));
      },
      {"fused_experts: out", "overlaps topk_weights"});
  expect_error(
      [&] {
        fused_experts(hidden, w13, w2, TensorView(tw.data(), DType::f32, {2, 2}),
                      TensorView(tid.data(), DType::i32, {2, 3}),
                      TensorView(out.data(), DType::f32, {2, 64}));
      },
      {"topk_weights"});
}

// ---------------------------------------------------------------------------
// 3. Alignment, 6. enums and API edges.

TEST(HostileViews, Misaligned) {
  Bufs s;
  const PackedWeight w = small_weight(s);
  auto* odd = reinterpret_cast<uint16_t*>(reinterpret_cast<char*>(s.a.data()) + 1);
  expect_error(
      [&] {
        gemm(TensorView(odd, DType::bf16, {5, 64}), w,
             TensorView(s.c.data(), DType::bf16, {5, 64}));
      },
      {"gemm: x", "not aligned"});
  expect_error([&] { pack_weight(TensorView(odd, DType::bf16, {64, 64})); }, {"not aligned"});
  auto* f2 = reinterpret_cast<float*>(reinterpret_cast<char*>(s.f.data()) + 2);
  std::vector<int32_t> pos = {0, 1};
  expect_error(
      [&] {
        rope(TensorView(f2, DType::f32, {2, 1, 32}), nullptr,
             TensorView(pos.data(), DType::i32, {2}),
             TensorView(s.f.data() + 4096, DType::f32, {8, 32}));
      },
      {"rope: q", "4-byte"});
  auto* i64 = reinterpret_cast<int64_t*>(reinterpret_cast<char*>(s.i64.data()) + 4);
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {2, 1, 32}), nullptr,
             TensorView(i64, DType::i64, {2}), TensorView(s.f.data() + 4096, DType::f32, {8, 32}));
      },
      {"positions", "8-byte"});
}

TEST(HostileViews, Enums) {
  Bufs s;
  std::vector<int32_t> pos = {0, 1};
  RopeOptions o;
  o.style = static_cast<RopeStyle>(7);
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {2, 1, 32}), nullptr,
             TensorView(pos.data(), DType::i32, {2}),
             TensorView(s.f.data() + 4096, DType::f32, {8, 32}), o);
      },
      {"RopeStyle(7)"});
  expect_error([&] { (void)dtype_name(static_cast<DType>(77)); }, {"DType(77)"});
  expect_error([&] { (void)activation_name(static_cast<Activation>(9)); }, {"Activation(9)"});
  expect_error([&] { (void)isa_name(static_cast<Isa>(-1)); }, {"Isa(-1)"});
  const PackedWeight w = small_weight(s);
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), static_cast<DType>(77), {5, 64}), w,
             TensorView(s.c.data(), DType::bf16, {5, 64}));
      },
      {"gemm: x.dtype=77"});
  // An index tensor checked by its allowed dtypes before its view (rope's
  // positions): named with the operator and the argument, not by dtype_name.
  expect_error(
      [&] {
        rope(TensorView(s.f.data(), DType::f32, {2, 1, 32}), nullptr,
             TensorView(s.i32.data(), static_cast<DType>(77), {2}),
             TensorView(s.f.data() + 4096, DType::f32, {8, 32}));
      },
      {"rope: positions.dtype=77 (not a DType enumerator)", "allowed: i32, i64"});
  GemmOptions g;
  g.act = static_cast<Activation>(9);
  expect_error(
      [&] {
        gemm(TensorView(s.a.data(), DType::bf16, {5, 64}), w,
             TensorView(s.c.data(), DType::bf16, {5, 64}), g);
      },
      {"act=9"});
  // The null-data case the contract promises to reject can be written.
  expect_error(
      [&] {
        gemm(TensorView(nullptr, DType::bf16, {5, 64}), w,
             TensorView(s.c.data(), DType::bf16, {5, 64}));
      },
      {"gemm: x data is null"});
  // A null view of an empty shape is fine: M = 0 does nothing.
  EXPECT_NO_THROW(gemm(TensorView(nullptr, DType::bf16, {0, 64}), w,
                       TensorView(nullptr, DType::bf16, {0, 64})));
}

// ---------------------------------------------------------------------------
// Aliasing the contract allows: fused buffers engines really pass, computed
// on every path, equal to the same call on separate copies.

class AllowedAliasing : public IsaTest {};

TEST_F(AllowedAliasing, RopeOnViewsOfOneQkvBuffer) {
  const int64_t T = 7, Hq = 4, Hk = 2, D = 64, W = (Hq + 2 * Hk) * D;
  std::vector<uint16_t> qkv = random_bf16(T * W, 11);
  std::vector<uint16_t> qs(T * Hq * D), ks(T * Hk * D);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&qs[t * Hq * D], &qkv[t * W], Hq * D * 2);
    std::memcpy(&ks[t * Hk * D], &qkv[t * W + Hq * D], Hk * D * 2);
  }
  std::vector<float> cache = random_f32(16 * D, 12);
  std::vector<int32_t> pos = {3, 1, 4, 1, 5, 9, 2};
  TensorView p(pos.data(), DType::i32, {T});
  TensorView c(cache.data(), DType::f32, {16, D});
  TensorView q(qkv.data(), DType::bf16, {T, Hq, D}, {W, D, 1});
  TensorView k(qkv.data() + Hq * D, DType::bf16, {T, Hk, D}, {W, D, 1});
  rope(q, &k, p, c);
  TensorView q2(qs.data(), DType::bf16, {T, Hq, D});
  TensorView k2(ks.data(), DType::bf16, {T, Hk, D});
  rope(q2, &k2, p, c);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(0, std::memcmp(&qs[t * Hq * D], &qkv[t * W], Hq * D * 2)) << "q token " << t;
    EXPECT_EQ(0, std::memcmp(&ks[t * Hk * D], &qkv[t * W + Hq * D], Hk * D * 2)) << "k token " << t;
  }
}

TEST_F(AllowedAliasing, PrefillOnViewsOfOneQkvBuffer) {
  const int64_t T = 37, Hq = 4, Hkv = 2, D = 64, W = (Hq + 2 * Hkv) * D;
  std::vector<uint16_t> qkv = random_bf16(T * W, 21);
  std::vector<uint16_t> qs(T * Hq * D), ks(T * Hkv * D), vs(T * Hkv * D);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(&qs[t * Hq * D], &qkv[t * W], Hq * D * 2);
    std::memcpy(&ks[t * Hkv * D], &qkv[t * W + Hq * D], Hkv * D * 2);
    std::memcpy(&vs[t * Hkv * D], &qkv[t * W + (Hq + Hkv) * D], Hkv * D * 2);
  }
  std::vector<int32_t> cu = {0, 30, 37};
  TensorView c(cu.data(), DType::i32, {3});
  std::vector<uint16_t> o1(T * Hq * D), o2(T * Hq * D);
  AttentionOptions opt;
  opt.causal = true;
  flash_attn_varlen(TensorView(qkv.data(), DType::bf16, {T, Hq, D}, {W, D, 1}),
                    TensorView(qkv.data() + Hq * D, DType::bf16, {T, Hkv, D}, {W, D, 1}),
                    TensorView(qkv.data() + (Hq + Hkv) * D, DType::bf16, {T, Hkv, D}, {W, D, 1}),
                    TensorView(o1.data(), DType::bf16, {T, Hq, D}), c, c, opt);
  flash_attn_varlen(TensorView(qs.data(), DType::bf16, {T, Hq, D}),
                    TensorView(ks.data(), DType::bf16, {T, Hkv, D}),
                    TensorView(vs.data(), DType::bf16, {T, Hkv, D}),
                    TensorView(o2.data(), DType::bf16, {T, Hq, D}), c, c, opt);
  EXPECT_EQ(o1, o2);
}

TEST_F(AllowedAliasing, DecodeWithVAsColumnsOfTheKCache) {
  // MLA: V is the first Dv columns of each cached K row.
  const int64_t nb = 3, bs = 16, D = 96, Dv = 64, Hq = 4, B = 2;
  std::vector<uint16_t> kc = random_bf16(nb * bs * D, 31);
  std::vector<uint16_t> vc(nb * bs * Dv);
  for (int64_t r = 0; r < nb * bs; ++r) std::memcpy(&vc[r * Dv], &kc[r * D], Dv * 2);
  std::vector<uint16_t> q = random_bf16(B * Hq * D, 32);
  std::vector<int32_t> table = {2, 0, 1, 0}, lens = {29, 7};
  std::vector<uint16_t> o1(B * Hq * Dv), o2(B * Hq * Dv);
  TensorView qv(q.data(), DType::bf16, {B, Hq, D});
  TensorView bt(table.data(), DType::i32, {B, 2});
  TensorView sl(lens.data(), DType::i32, {B});
  TensorView k(kc.data(), DType::bf16, {nb, bs, 1, D});
  decode_attention(qv, k, TensorView(kc.data(), DType::bf16, {nb, bs, 1, Dv}, {bs * D, D, D, 1}),
                   TensorView(o1.data(), DType::bf16, {B, Hq, Dv}), bt, sl);
  decode_attention(qv, k, TensorView(vc.data(), DType::bf16, {nb, bs, 1, Dv}),
                   TensorView(o2.data(), DType::bf16, {B, Hq, Dv}), bt, sl);
  EXPECT_EQ(o1, o2);
}

TEST_F(AllowedAliasing, StoreKvMlaFormWritesKOnce) {
  // sglang's MLA pool: v_buffer = k_buffer[..., :Dv], value = key[..., :Dv].
  // Only k is written (it holds v); the result equals a store into separate
  // caches, and a v that is not k's columns still overlaps (an Error).
  const int64_t nb = 2, bs = 8, D = 96, Dv = 64, T = 3;
  std::vector<uint16_t> kc(nb * bs * D, 0), ref_k(nb * bs * D, 0), ref_v(nb * bs * Dv, 0);
  std::vector<uint16_t> key = random_bf16(T * D, 51), other = random_bf16(T * Dv, 52);
  std::vector<int64_t> slots = {3, -1, 12};
  TensorView sm(slots.data(), DType::i64, {T});
  TensorView k(key.data(), DType::bf16, {T, 1, D});
  TensorView v(key.data(), DType::bf16, {T, 1, Dv}, {D, D, 1});
  TensorView kcv(kc.data(), DType::bf16, {nb, bs, 1, D});
  TensorView vcv(kc.data(), DType::bf16, {nb, bs, 1, Dv}, {bs * D, D, D, 1});
  store_kv(k, v, kcv, vcv, sm);
  store_kv(k, v, TensorView(ref_k.data(), DType::bf16, {nb, bs, 1, D}),
           TensorView(ref_v.data(), DType::bf16, {nb, bs, 1, Dv}), sm);
  EXPECT_EQ(kc, ref_k);
  for (int64_t r = 0; r < nb * bs; ++r)
    EXPECT_EQ(0, std::memcmp(&kc[r * D], &ref_v[r * Dv], Dv * 2)) << "slot " << r;
  // A v that is a copy of k's columns (an engine that gathered both): the
  // Error says what the MLA form needs (it said only "overlaps").
  expect_error(
      [&] {
        store_kv(k, TensorView(other.data(), DType::bf16, {T, 1, Dv}), kcv, vcv, sm);
      },
      {"store_kv: v_cache is the first 64 columns of k_cache (the MLA form)",
       "is not the first 64 columns of k", "v a view of k's first Dv columns"});
  // fp8: one store of the shared columns, so K's and V's scales must agree.
  std::vector<uint8_t> c8(nb * bs * D);
  TensorView k8(c8.data(), DType::f8e4m3, {nb, bs, 1, D});
  TensorView v8(c8.data(), DType::f8e4m3, {nb, bs, 1, Dv}, {bs * D, D, D, 1});
  KvCacheScales sc;
  sc.k_scale = 0.5f, sc.v_scale = 0.25f;
  expect_error([&] { store_kv(k, v, k8, v8, sm, sc); }, {"store_kv: v_cache", "(MLA)"});
  sc.v_scale = 0.5f;
  store_kv(k, v, k8, v8, sm, sc);
}

TEST_F(AllowedAliasing, StoreKvIntoHalvesOfOneBlockBuffer) {
  // [num_blocks, 2, block_size, Hkv, D]: K then V inside each block.
  const int64_t nb = 2, bs = 16, H = 2, D = 32, blk = 2 * bs * H * D;
  std::vector<uint16_t> kv(nb * blk, 0), kcs(nb * bs * H * D, 0), vcs(nb * bs * H * D, 0);
  std::vector<uint16_t> k = random_bf16(3 * H * D, 41), v = random_bf16(3 * H * D, 42);
  std::vector<int32_t> slots = {5, -1, 20};
  TensorView kt(k.data(), DType::bf16, {3, H, D}), vt(v.data(), DType::bf16, {3, H, D});
  TensorView sm(slots.data(), DType::i32, {3});
  store_kv(kt, vt, TensorView(kv.data(), DType::bf16, {nb, bs, H, D}, {blk, H * D, D, 1}),
           TensorView(kv.data() + bs * H * D, DType::bf16, {nb, bs, H, D}, {blk, H * D, D, 1}), sm);
  store_kv(kt, vt, TensorView(kcs.data(), DType::bf16, {nb, bs, H, D}),
           TensorView(vcs.data(), DType::bf16, {nb, bs, H, D}), sm);
  for (int64_t b = 0; b < nb; ++b) {
    EXPECT_EQ(0, std::memcmp(&kv[b * blk], &kcs[b * bs * H * D], bs * H * D * 2)) << b;
    EXPECT_EQ(0, std::memcmp(&kv[b * blk + bs * H * D], &vcs[b * bs * H * D], bs * H * D * 2)) << b;
  }
}

}  // namespace
}  // namespace tilejit::test
