// PackedWeight: exact pack/unpack round trips for odd shapes and strided rows,
// the packed bytes against the documented layout (codegen/packed_layout.h),
// idempotent packing, the layout tag and size, copy/move semantics, and the
// empty weight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "ops/packed_weight_impl.h"
#include "test_util.h"

namespace tilejit::test {
namespace {

using ::testing::HasSubstr;

constexpr uint16_t kPad = 0xBEEF;  // sentinel in row padding

// w [N, K] with row stride ldw, in a guarded buffer (packing must not read past
// the last row's K elements); padding columns hold kPad.
struct StridedWeight {
  StridedWeight(int64_t n, int64_t k, int64_t ld, uint32_t seed)
      : n_(n), k_(k), ld_(ld), buf((n - 1) * ld * 2 + k * 2), values(random_bf16(n * k, seed)) {
    uint16_t* d = buf.as<uint16_t>();
    for (int64_t e = 0; e < (n - 1) * ld + k; ++e) d[e] = kPad;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) d[i * ld + j] = values[i * k + j];
  }
  TensorView view() { return TensorView(buf.data(), DType::bf16, {n_, k_}, {ld_, 1}); }
  int64_t n_, k_, ld_;
  GuardedBuffer buf;
  std::vector<uint16_t> values;  // contiguous [N, K]
};

// Unpacks into a [N, K] buffer of row stride ld (padding sentinel-filled),
// checks the padding survived, and returns the rows contiguous.
std::vector<uint16_t> unpack_strided(const PackedWeight& p, int64_t ld) {
  const int64_t n = p.n(), k = p.k();
  std::vector<uint16_t> out(static_cast<size_t>(n * ld), kPad);
  p.unpack(TensorView(out.data(), DType::bf16, {n, k}, {ld, 1}));
  std::vector<uint16_t> rows;
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = k; j < ld; ++j)
      EXPECT_EQ(out[i * ld + j], kPad) << "unpack wrote padding at row " << i << " col " << j;
    rows.insert(rows.end(), out.begin() + i * ld, out.begin() + i * ld + k);
  }
  return rows;
}

int64_t round_up(int64_t v, int64_t m) {
  return (v + m - 1) / m * m;
}

// A [K, N] weight (x @ W, HF's Conv1D and its [E, H, 2I] experts) packs as
// the logical [N, K] through the view {N, K} with strides {1, N}: the same
// packed weight as its transposed copy, bit for bit (it needed a copy).
TEST(PackedWeight, ATransposedViewPacksAsItsCopy) {
  for (auto [n, k] : {std::pair<int64_t, int64_t>{70, 130}, {1, 33}, {129, 1}}) {
    std::vector<uint16_t> kn = random_bf16(static_cast<size_t>(k * n), 5);  // [K, N]
    std::vector<uint16_t> nk(kn.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < k; ++j) nk[i * k + j] = kn[j * n + i];
    const PackedWeight a = pack_weight(TensorView(kn.data(), DType::bf16, {n, k}, {1, n}));
    const PackedWeight b = pack_weight(TensorView(nk.data(), DType::bf16, {n, k}));
    EXPECT_EQ(unpack_strided(a, k), nk) << n << "x" << k;
    EXPECT_EQ(unpack_strided(b, k), nk);
  }
  // Experts: GPT-OSS's gate_up_proj [E, H, 2I] interleaved, as {E, 2I, H}.
  const int64_t E = 3, H = 40, I = 24;
  std::vector<uint16_t> hf = random_bf16(static_cast<size_t>(E * H * 2 * I), 6);
  std::vector<uint16_t> copy(hf.size());
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < 2 * I; ++r)
      for (int64_t c = 0; c < H; ++c) copy[(e * 2 * I + r) * H + c] = hf[(e * H + c) * 2 * I + r];
  const PackedExperts pa =
      pack_experts(TensorView(hf.data(), DType::bf16, {E, 2 * I, H}, {H * 2 * I, 1, 2 * I}),
                   ExpertProj::gate_up, GluRows::interleaved);
  const PackedExperts pb = pack_experts(TensorView(copy.data(), DType::bf16, {E, 2 * I, H}),
                                        ExpertProj::gate_up, GluRows::interleaved);
  std::vector<uint16_t> ua(copy.size()), ub(copy.size());
  pa.unpack(TensorView(ua.data(), DType::bf16, {E, 2 * I, H}));
  pb.unpack(TensorView(ub.data(), DType::bf16, {E, 2 * I, H}));
  EXPECT_EQ(ua, copy);
  EXPECT_EQ(ub, copy);
  EXPECT_THROW(pack_experts(TensorView(hf.data(), DType::bf16, {E, 2 * I, H}, {0, 1, 1}),
                            ExpertProj::gate_up),
               Error);
}

using PackShape = std::tuple<int64_t, int64_t>;  // N, K

class PackRoundTrip : public ::testing::TestWithParam<PackShape> {};

TEST_P(PackRoundTrip, ContiguousAndStridedRowsAreExact) {
  const auto [n, k] = GetParam();
  for (int64_t ld : {k, k + 1, k + 13}) {
    StridedWeight w(n, k, ld, seed_of({n, k, ld}));
    const PackedWeight p = pack_weight(w.view());
    EXPECT_EQ(p.n(), n);
    EXPECT_EQ(p.k(), k);
    EXPECT_EQ(p.dtype(), DType::bf16);
    EXPECT_EQ(unpack_strided(p, k), w.values) << "ldw=" << ld << " unpacked contiguous";
    EXPECT_EQ(unpack_strided(p, k + 5), w.values) << "ldw=" << ld << " unpacked strided";
  }
}

TEST_P(PackRoundTrip, LayoutTagAndSize) {
  const auto [n, k] = GetParam();
  StridedWeight w(n, k, k, 7);
  const PackedWeight p = pack_weight(w.view());
  EXPECT_EQ(p.layout(), "bf16_vnni2_n64k32");
  // N padded to the 64-column block, K to the 32-step, 2 bytes each.
  EXPECT_EQ(p.packed_bytes(), static_cast<size_t>(round_up(n, 64) * round_up(k, 32) * 2));
}

// The bytes follow the documented layout, independently of PackedLayout::index:
//   packed[nb][kp][c][2] = w[nb*64 + c][2*kp + parity], zero in every padding slot.
TEST_P(PackRoundTrip, BytesFollowTheDocumentedLayout) {
  const auto [n, k] = GetParam();
  StridedWeight w(n, k, k + 3, 11);
  const PackedWeight p = pack_weight(w.view());
  ASSERT_NE(p.impl(), nullptr);
  const uint16_t* b = p.impl()->bf16();
  const int64_t nblocks = round_up(n, 64) / 64, kpairs = round_up(k, 32) / 2;
  int64_t wrong = 0;
  for (int64_t nb = 0; nb < nblocks; ++nb)
    for (int64_t kp = 0; kp < kpairs; ++kp)
      for (int64_t c = 0; c < 64; ++c)
        for (int64_t par = 0; par < 2; ++par) {
          const int64_t row = nb * 64 + c, col = 2 * kp + par;
          const uint16_t want = row < n && col < k ? w.values[row * k + col] : 0;
          const uint16_t got = b[((nb * kpairs + kp) * 64 + c) * 2 + par];
          if (got != want && wrong++ < 5)
            ADD_FAILURE() << "packed[" << nb << "][" << kp << "][" << c << "][" << par
                          << "] = " << got << ", expected " << want;
        }
  EXPECT_EQ(wrong, 0);
}

// Strided rows pack to exactly the bytes of contiguous rows.
TEST_P(PackRoundTrip, StridedRowsPackLikeContiguous) {
  const auto [n, k] = GetParam();
  StridedWeight a(n, k, k, 5), b(n, k, k + 9, 5);
  ASSERT_EQ(a.values, b.values);
  const PackedWeight pa = pack_weight(a.view()), pb = pack_weight(b.view());
  ASSERT_EQ(pa.packed_bytes(), pb.packed_bytes());
  EXPECT_EQ(std::memcmp(pa.impl()->bf16(), pb.impl()->bf16(), pa.packed_bytes()), 0);
}

// Packing a packed weight is a no-op: the same bytes, no second transform.
TEST_P(PackRoundTrip, PackingAPackedWeightIsANoOp) {
  const auto [n, k] = GetParam();
  StridedWeight w(n, k, k, 13);
  const PackedWeight p = pack_weight(w.view());
  const PackedWeight q = pack_weight(p);
  const PackedWeight r = pack_weight(pack_weight(q));
  EXPECT_EQ(q.impl(), p.impl());
  EXPECT_EQ(r.impl(), p.impl());
  EXPECT_EQ(r.layout(), p.layout());
  EXPECT_EQ(r.packed_bytes(), p.packed_bytes());
  EXPECT_EQ(unpack_strided(r, k), w.values);
}

std::string pack_name(const ::testing::TestParamInfo<PackShape>& info) {
  return "n" + std::to_string(std::get<0>(info.param)) + "_k" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(OddShapes, PackRoundTrip,
                         ::testing::Combine(::testing::Values(1, 3, 17, 64, 65, 100),
                                            ::testing::Values(1, 3, 17, 64, 65, 100)),
                         pack_name);

// The packed bytes are a copy: changing the source afterwards changes nothing.
TEST(PackedWeight, OwnsACopyOfTheData) {
  StridedWeight w(17, 30, 30, 3);
  const PackedWeight p = pack_weight(w.view());
  const std::vector<uint16_t> original = w.values;
  uint16_t* d = w.buf.as<uint16_t>();
  for (int64_t e = 0; e < 17 * 30; ++e) d[e] = 0x3f80;
  EXPECT_EQ(unpack_strided(p, 30), original);
}

TEST(PackedWeight, CopySharesTheBytesAndOutlivesTheOriginal) {
  StridedWeight w(65, 17, 17, 4);
  PackedWeight copy;
  EXPECT_TRUE(copy.empty());
  {
    const PackedWeight p = pack_weight(w.view());
    PackedWeight c2(p);
    EXPECT_EQ(c2.impl(), p.impl());
    copy = c2;  // copy assignment
    EXPECT_EQ(copy.impl(), p.impl());
  }
  ASSERT_FALSE(copy.empty());
  EXPECT_EQ(copy.n(), 65);
  EXPECT_EQ(copy.k(), 17);
  EXPECT_EQ(unpack_strided(copy, 17), w.values);
  // Self-assignment keeps the weight.
  PackedWeight& alias = copy;
  copy = alias;
  EXPECT_EQ(unpack_strided(copy, 17), w.values);
}

TEST(PackedWeight, MoveTransfersAndEmptiesTheSource) {
  StridedWeight w(3, 100, 100, 5);
  PackedWeight p = pack_weight(w.view());
  const auto* impl = p.impl();
  PackedWeight moved(std::move(p));
  EXPECT_EQ(moved.impl(), impl);
  EXPECT_TRUE(p.empty());  // NOLINT(bugprone-use-after-move): the state is specified
  PackedWeight assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.impl(), impl);
  EXPECT_TRUE(moved.empty());  // NOLINT(bugprone-use-after-move)
  EXPECT_EQ(unpack_strided(assigned, 100), w.values);
  // A moved-from weight is reusable.
  p = pack_weight(w.view());
  EXPECT_EQ(unpack_strided(p, 100), w.values);
}

TEST(PackedWeight, EmptyRaisesErrorEverywhere) {
  const PackedWeight e;
  EXPECT_TRUE(e.empty());
  EXPECT_EQ(e.impl(), nullptr);
  std::vector<uint16_t> out(16);
  EXPECT_THROW(e.n(), Error);
  EXPECT_THROW(e.k(), Error);
  EXPECT_THROW(e.dtype(), Error);
  EXPECT_THROW(e.layout(), Error);
  EXPECT_THROW(e.packed_bytes(), Error);
  EXPECT_THROW(e.unpack(TensorView(out.data(), DType::bf16, {4, 4})), Error);
  EXPECT_THROW(pack_weight(e), Error);
  try {
    e.layout();
  } catch (const Error& err) {
    EXPECT_THAT(err.what(), HasSubstr("empty"));
  }
  try {
    pack_weight(e);
  } catch (const Error& err) {
    EXPECT_THAT(err.what(), HasSubstr("pack_weight"));
    EXPECT_THAT(err.what(), HasSubstr("empty"));
  }
  std::vector<uint16_t> x(4 * 4);
  std::vector<float> y(4 * 4);
  EXPECT_THROW(
      gemm(TensorView(x.data(), DType::bf16, {4, 4}), e, TensorView(y.data(), DType::f32, {4, 4})),
      Error);
}

// A refused unpack leaves every output as it was (an outside tester's C API
// run: the weight tensor was written, then the scales view refused): all
// outputs are checked before any is written, for each quantized format and
// across a PackedExperts' experts.
TEST(PackedWeight, ARefusedUnpackWritesNothing) {
  constexpr int64_t N = 24, K = 64;
  auto untouched = [](const std::vector<uint8_t>& v) {
    return std::all_of(v.begin(), v.end(), [](uint8_t b) { return b == 0xEE; });
  };
  std::vector<uint8_t> codes(N * K), wout(N * K, 0xEE);
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<uint8_t>(i * 37 % 120);
  std::vector<float> scales(N, 0.01f), sout(N + 1, 0.f);
  const TensorView bad_scales(sout.data(), DType::f32, {N + 1});

  const PackedWeight w8 =
      pack_weight(Int8Weight{{codes.data(), DType::i8, {N, K}}, {scales.data(), DType::f32, {N}}});
  EXPECT_THROW(w8.unpack(Int8Weight{{wout.data(), DType::i8, {N, K}}, bad_scales}), Error);
  EXPECT_TRUE(untouched(wout)) << "int8";

  Fp8Weight f;
  f.weight = TensorView(codes.data(), DType::f8e4m3, {N, K});
  f.scales = TensorView(scales.data(), DType::f32, {N});
  const PackedWeight w8f = pack_weight(f);
  Fp8Weight fo;
  fo.weight = TensorView(wout.data(), DType::f8e4m3, {N, K});
  fo.scales = bad_scales;
  EXPECT_THROW(w8f.unpack(fo), Error);
  EXPECT_TRUE(untouched(wout)) << "fp8";

  std::vector<int32_t> qw(K / 8 * N, 0x12345678), qz(2 * N / 8, 0x33333333), gi(K);
  for (int64_t k = 0; k < K; ++k) gi[k] = static_cast<int32_t>(k % 2);
  std::vector<uint16_t> sc(2 * N, 0x2000);
  Int4Weight q;
  q.qweight = TensorView(qw.data(), DType::i32, {K / 8, N});
  q.scales = TensorView(sc.data(), DType::f16, {2, N});
  q.qzeros = TensorView(qz.data(), DType::i32, {2, N / 8});
  q.g_idx = TensorView(gi.data(), DType::i32, {K});
  q.group_size = 32;
  const PackedWeight w4 = pack_weight(q);
  std::vector<uint8_t> qwo(qw.size() * 4, 0xEE), sco(sc.size() * 2, 0xEE), qzo(qz.size() * 4, 0xEE);
  std::vector<int32_t> gio(K + 1);
  Int4Weight qo = q;
  qo.qweight = TensorView(qwo.data(), DType::i32, {K / 8, N});
  qo.scales = TensorView(sco.data(), DType::f16, {2, N});
  qo.qzeros = TensorView(qzo.data(), DType::i32, {2, N / 8});
  qo.g_idx = TensorView(gio.data(), DType::i32, {K + 1});  // the last output refused
  EXPECT_THROW(w4.unpack(qo), Error);
  EXPECT_TRUE(untouched(qwo) && untouched(sco) && untouched(qzo)) << "int4";

  std::vector<uint8_t> blocks(N * K / 2, 0x21), mxs(N * K / 32, 127);
  const PackedWeight wm = pack_weight(
      Mxfp4Weight{{blocks.data(), DType::u8, {N, K / 2}}, {mxs.data(), DType::u8, {N, K / 32}}, 0});
  std::vector<uint8_t> bo(blocks.size(), 0xEE), mso(mxs.size() + 1);
  EXPECT_THROW(
      wm.unpack(Mxfp4Weight{
          {bo.data(), DType::u8, {N, K / 2}}, {mso.data(), DType::u8, {N, K / 32 + 1}}, 0}),
      Error);
  EXPECT_TRUE(untouched(bo)) << "mxfp4";

  // Experts: expert 1's scales refused, expert 0's outputs untouched.
  const std::vector<Int8Weight> experts(
      2, Int8Weight{{codes.data(), DType::i8, {N, K}}, {scales.data(), DType::f32, {N}}});
  const PackedExperts pe = pack_experts(experts, ExpertProj::down);
  std::vector<uint8_t> w0(N * K, 0xEE), w1(N * K, 0xEE);
  std::vector<float> s0(N, -1.f);
  const std::vector<Int8Weight> eo = {
      {{w0.data(), DType::i8, {N, K}}, {s0.data(), DType::f32, {N}}},
      {{w1.data(), DType::i8, {N, K}}, bad_scales}};
  try {
    pe.unpack(eo);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("expert 1"));
  }
  EXPECT_TRUE(untouched(w0) && untouched(w1)) << "experts";
  EXPECT_EQ(s0, std::vector<float>(N, -1.f));
}

}  // namespace
}  // namespace tilejit::test
