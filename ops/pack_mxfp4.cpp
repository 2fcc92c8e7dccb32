// pack_weight for MXFP4 (OCP Microscaling fp4, as GPT-OSS ships its MoE
// experts), its unpack (blocks and scales back, bit for bit) and its checks.
// The packed form is int4's (ops/packed_weight_impl.h QuantTables): the e2m1
// codes in the bf16 layout's k-pair order, 64 bytes a k-pair row, low nibble
// the even k; group size 32, so the packed K order is the identity and a
// k-pair row r takes scale row r / 16; the f32 scale table [nb][G][64] holds
// 2^(e − 127) (exact in f32 for every e in [0, 254]: e = 0 is the subnormal
// 2^-127). docs/quantized.md.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "ops/pack_quant_util.h"
#include "ops/packed_weight_impl.h"
#include "ops/quant_weight.h"
#include "ops/tensor_checks.h"
#include "runtime/quant_formats.h"

#include "runtime/api_guard.h"

namespace tilejit {

namespace ops {
namespace {

constexpr int64_t kBlockN = codegen::PackedLayout::kBlockN;
constexpr int64_t kMxBlock = 32;  // values per e8m0 scale (OCP MX)
constexpr uint8_t kE8m0Nan = 0xFF;

// The byte j (0 .. ceil(K/2) − 1) of row n of a checked blocks view: [N, B]
// or [N, G, 16] (the same bytes, byte j at block j / 16, offset j % 16).
uint8_t block_byte(const TensorView& b, int64_t n, int64_t j) {
  const auto* p = static_cast<const uint8_t*>(b.data);
  if (b.shape.size() == 2) return p[n * b.strides[0] + j * b.strides[1]];
  return p[n * b.strides[0] + j / 16 * b.strides[1] + j % 16 * b.strides[2]];
}

uint8_t* block_byte_out(const TensorView& b, int64_t n, int64_t j) {
  auto* p = static_cast<uint8_t*>(b.data);
  if (b.shape.size() == 2) return p + n * b.strides[0] + j * b.strides[1];
  return p + n * b.strides[0] + j / 16 * b.strides[1] + j % 16 * b.strides[2];
}

// blocks' N and the K it holds (32 a block for the 3-D form, 2 a byte for
// the 2-D one); an Error for any other shape or dtype.
void check_blocks(const char* op, const TensorView& b, int64_t* n, int64_t* k_full) {
  const size_t rank = b.shape.size();
  if (rank != 2 && rank != 3)
    throw Error(fmt::format(
        "{}: blocks has rank {} (shape {}); allowed: u8 [N, K/32, 16] (GPT-OSS's *_blocks of "
        "one matrix) or u8 [N, K/2]",
        op, rank, shape_str(b.shape)));
  check_view(op, "blocks", b, rank);
  check_dtype(op, "blocks", b, {DType::u8});
  if (b.shape[0] < 1 || b.shape[1] < 1 || (rank == 3 && b.shape[2] != 16))
    throw Error(fmt::format(
        "{}: blocks has shape {}; allowed: [N, K/32, 16] or [N, K/2] with N >= 1 and K >= 1", op,
        shape_str(b.shape)));
  *n = b.shape[0];
  *k_full = rank == 3 ? b.shape[1] * kMxBlock : b.shape[1] * 2;
}

// Whether a 2-D blocks row of `width` bytes holds a K-code row: ceil(K/2)
// bytes, or the ceil(K/32) whole blocks of a padded checkpoint (GPT-OSS's
// [N, G, 16] reshaped to [N, 16·G]).
bool mx_row_bytes_ok(int64_t width, int64_t K) {
  return width == (K + 1) / 2 || width == (K + kMxBlock - 1) / kMxBlock * 16;
}

// The logical K of a description: k, or all that blocks holds; an Error
// unless blocks holds exactly the bytes of ceil(K/32) blocks (3-D) or a row
// mx_row_bytes_ok takes (2-D).
int64_t logical_k(const char* op, const TensorView& b, int64_t k, int64_t k_full) {
  const int64_t K = k != 0 ? k : k_full;
  const bool ok = b.shape.size() == 3
                      ? K >= 1 && K <= k_full && (K + kMxBlock - 1) / kMxBlock == k_full / kMxBlock
                      : K >= 1 && K <= k_full && mx_row_bytes_ok(b.shape[1], K);
  if (!ok)
    throw Error(fmt::format(
        "{}: k={} with blocks {}; allowed: K in [{}, {}]{} (0: {}; a K that is not a multiple of "
        "32 is padded: its last block's codes past K are ignored)",
        op, k, shape_str(b.shape), k_full - (b.shape.size() == 3 ? kMxBlock : 2) + 1, k_full,
        b.shape.size() == 2 && k_full % (2 * kMxBlock) == 0
            ? fmt::format(" or [{}, {}] (whole 32-code blocks)", k_full - kMxBlock + 1, k_full)
            : "",
        k_full));
  return K;
}

}  // namespace

PackedWeight pack_mxfp4(const Mxfp4Weight& w, std::vector<int64_t> row_of) {
  const char* op = "pack_weight(mxfp4)";
  int64_t N = 0, k_full = 0;
  check_blocks(op, w.blocks, &N, &k_full);
  const int64_t K = logical_k(op, w.blocks, w.k, k_full);
  const int64_t G = (K + kMxBlock - 1) / kMxBlock;
  check_view(op, "scales", w.scales, 2);
  check_dtype(op, "scales", w.scales, {DType::u8});
  if (w.scales.shape[0] != N || w.scales.shape[1] != G)
    throw Error(fmt::format("{}: scales has shape {}; allowed: [N, ceil(K/32)] = [{}, {}] (K={})",
                            op, shape_str(w.scales.shape), N, G, K));
  // NaN scales first: nothing is allocated for a bad checkpoint.
  const auto* sc = static_cast<const uint8_t*>(w.scales.data);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < G; ++g) {
      const uint8_t e = sc[n * w.scales.strides[0] + g * w.scales.strides[1]];
      if (e == kE8m0Nan)
        throw Error(fmt::format(
            "{}: scales[{}, {}] = 0x{:02x} is the e8m0 NaN code; allowed: exponents 0x00..0xfe "
            "(scale 2^(e - 127))",
            op, n, g, e));
    }

  auto impl = std::make_shared<PackedWeight::Impl>();
  impl->format = WeightFormat::mxfp4;
  impl->dtype = DType::f4e2m1;
  impl->layout = {N, K};
  auto q = std::make_unique<QuantTables>();
  q->set_row_map(std::move(row_of), N);
  q->code_row_bytes = 64;
  q->group_size = kMxBlock;
  q->scales_in = save(w.scales);
  std::vector<int32_t> group_of(static_cast<size_t>(K));
  for (int64_t k = 0; k < K; ++k) group_of[k] = static_cast<int32_t>(k / kMxBlock);
  uint8_t* codes = place_tables(*impl, std::move(q), group_of, G);
  QuantTables& t = *impl->quant;
  const codegen::PackedLayout geo = impl->run_layout();
  // The identity order (groups of 32 are even): position k is channel k.
  for (int64_t n = 0; n < N; ++n) {
    const int64_t pr = t.packed_row(n);
    uint8_t* col = codes + pr / kBlockN * impl->code_block_bytes() + pr % kBlockN;
    for (int64_t j = 0; j < (K + 1) / 2; ++j) {
      uint8_t b = block_byte(w.blocks, n, j);
      if (2 * j + 1 == K) b &= 0x0F;  // the odd K's last byte: its high nibble is past K
      col[j * 64] = b;
    }
  }
  // The e8m0 bytes themselves (padding columns: e = 0 on zero codes, i.e.
  // weight 0); the kernels make 2^(e − 127) once per group.
  const size_t entries = static_cast<size_t>(geo.n_blocks() * G * kBlockN);
  t.scales = zeroed(entries);
  t.scale_entry_bytes = 1;
  auto* s = reinterpret_cast<uint8_t*>(t.scales.get());
  std::vector<float> values(entries, 0.0f);  // for normal_products
  for (int64_t n = 0; n < N; ++n) {
    const int64_t pr = t.packed_row(n);
    for (int64_t g = 0; g < G; ++g) {
      const size_t at = static_cast<size_t>((pr / kBlockN * G + g) * kBlockN + pr % kBlockN);
      s[at] = sc[n * w.scales.strides[0] + g * w.scales.strides[1]];
      values[at] = runtime::e8m0_to_f32(s[at]);
    }
  }
  t.normal_products = normal_products(values.data(), entries, DType::f4e2m1);
  impl->layout_name = quant_layout_name(*impl);
  return PackedWeight(std::move(impl));
}

}  // namespace ops

PackedWeight pack_weight(const Mxfp4Weight& w) {
  return runtime::api_guard("pack_weight",
                            [&]() -> PackedWeight { return ops::pack_mxfp4(w, {}); });
}

namespace ops {

void check_unpack(const PackedWeight::Impl* impl, const Mxfp4Weight& out) {
  const char* op = "PackedWeight::unpack(mxfp4)";
  const PackedWeight::Impl& p = need_format(impl, op, {WeightFormat::mxfp4});
  const int64_t N = p.layout.n, K = p.layout.k;
  int64_t n_out = 0, k_full = 0;
  check_blocks(op, out.blocks, &n_out, &k_full);
  check_writable(op, "blocks", out.blocks);
  const int64_t bytes = (K + 1) / 2, G = (K + kMxBlock - 1) / kMxBlock;
  const bool three_d = out.blocks.shape.size() == 3;
  if (n_out != N || (three_d ? out.blocks.shape[1] != G : !mx_row_bytes_ok(out.blocks.shape[1], K)))
    throw Error(fmt::format(
        "{}: blocks has shape {}; allowed: [{}, {}, 16], [{}, {}] or [{}, {}] (as packed)", op,
        shape_str(out.blocks.shape), N, G, N, bytes, N, G * 16));
  if (out.k != 0 && out.k != K)
    throw Error(fmt::format("{}: k={}; allowed: 0 or {} (as packed)", op, out.k, K));
  check_restore(op, "scales", p.quant->scales_in, out.scales);
}

}  // namespace ops

void PackedWeight::unpack(const Mxfp4Weight& out) const {
  const char* op = "PackedWeight::unpack(mxfp4)";
  ops::check_unpack(impl_.get(), out);
  const Impl& p = *impl_;
  const ops::QuantTables& q = *p.quant;
  const int64_t N = p.layout.n, K = p.layout.k;
  const int64_t bytes = (K + 1) / 2, G = (K + ops::kMxBlock - 1) / ops::kMxBlock;
  const bool three_d = out.blocks.shape.size() == 3;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t pr = q.packed_row(n);
    const uint8_t* col = p.bytes() + pr / 64 * p.code_block_bytes() + pr % 64;
    // Bytes past K (the padding of a last partial block) come back as 0.
    for (int64_t j = 0; j < (three_d ? G * 16 : out.blocks.shape[1]); ++j)
      *ops::block_byte_out(out.blocks, n, j) = j < bytes ? col[j * 64] : 0;
  }
  ops::restore(op, "scales", q.scales_in, out.scales);
}

}  // namespace tilejit
