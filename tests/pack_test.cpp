// PackedWeight: exact pack/unpack round trips for odd shapes and strided rows,
// the packed bytes against the documented layout (codegen/packed_layout.h),
// idempotent packing, the layout tag and size, copy/move semantics, and the
// empty weight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace tilejit::test
