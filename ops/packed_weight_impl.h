// The inside of a PackedWeight: the layout tag and the packed bytes, and for
// quantized formats the tables the kernels read and the checkpoint's own
// small tensors (kept verbatim, so unpack() gives them back bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "codegen/packed_layout.h"
#include "runtime/aligned_buffer.h"
#include "tilejit/tilejit.h"

namespace tilejit {

namespace ops {

// A copy of a small input tensor (scales, qzeros, g_idx), row-major.
struct SavedTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  bool present = false;
};

// What the fp8 / int4 kernels read besides the codes (docs/quantized.md,
// "Packed layouts"): the codes sit in the bf16 layout's k-pair order,
//   fp8:  codes[nb][kp][c][2] bytes (128 a k-pair row)
//   int4: codes[nb][kp][c] bytes, low nibble = even k (64 a k-pair row)
// over the packed K order (k_packed positions: the input channels sorted by
// group for act-order, with a zero-activation padding position after a group
// of odd length, so no k-pair straddles two groups), padded to 32.
struct QuantTables {
  // The packed column (block row_of[n] / 64, column row_of[n] % 64) of
  // logical output row n: empty for the identity; MoE gate_up experts place
  // gate row i and up row i in one block's halves (ops/packed_experts_impl.h).
  // Always a permutation into [0, ceil(N/64)·64); the other columns stay
  // zero codes with zero scales, i.e. weight 0.
  std::vector<int64_t> row_of;
  int64_t packed_row(int64_t n) const { return row_of.empty() ? n : row_of[n]; }
  // Takes the map for an N-row weight; Error unless it is such a permutation
  // (an internal caller's bug, never a checkpoint's).
  void set_row_map(std::vector<int64_t> map, int64_t n);

  int64_t k_packed = 0;         // GEMM inner dimension after reordering (>= K)
  int64_t code_row_bytes = 0;   // 128 (fp8) or 64 (int4)
  int64_t n_groups = 1;         // G: scale rows per column block
  std::vector<int32_t> groups;  // [k_pairs] the scale row of each k-pair row
  // f32 [nb][G][64]; MXFP4: its e8m0 exponent bytes u8 [nb][G][64] (the
  // kernels make 2^(e − 127) per group: a quarter of the bytes an f32 table
  // streams in decode).
  std::unique_ptr<std::byte[], runtime::FreeDeleter> scales;
  int64_t scale_entry_bytes = 4;  // 4 (f32), 1 (e8m0)
  // The scale rows [G][64] of column block `block`, as the kernels take them.
  const float* scale_rows(int64_t block) const {
    return reinterpret_cast<const float*>(scales.get() + block * n_groups * 64 * scale_entry_bytes);
  }
  std::unique_ptr<std::byte[], runtime::FreeDeleter> zeros;  // u8 [nb][G][64] (int4 with zeros)
  // perm[p] = the input channel at packed position p, −1 for padding; empty
  // when the order is the identity (no gather of x).
  std::vector<int32_t> perm;
  std::vector<int64_t> pos_of;  // [K] packed position of channel k
  // No scale can make a subnormal product (DequantDesc::normal_products).
  bool normal_products = true;
  // int8: per column, padded to whole blocks.
  std::unique_ptr<std::byte[], runtime::FreeDeleter> col_scale;  // f32 [nb·64]
  std::unique_ptr<std::byte[], runtime::FreeDeleter> col_comp;   // i32 [nb·64] Σ_k w[n][k]

  // The checkpoint's description, for unpack / dequantize.
  Int4Format int4_format = Int4Format::gptq;
  bool gptq_v2 = false;
  int64_t group_size = 0;
  int64_t block_n = 0, block_k = 0;
  std::vector<int64_t> qweight_shape;
  SavedTensor scales_in, qzeros_in, g_idx_in;
};

}  // namespace ops

struct PackedWeight::Impl {
  // The tag a gemm checks before reading the bytes: format + block parameters.
  static constexpr const char* kLayoutName = "bf16_vnni2_n64k32";
  std::string layout_name = kLayoutName;
  DType dtype = DType::bf16;
  WeightFormat format = WeightFormat::bf16;
  // n, k: the logical weight. bf16: the packed geometry; fp8 / int4: the
  // bf16 blocks of {n, quant.k_packed} that the dequant kernel produces;
  // int8: see int8.
  codegen::PackedLayout layout;
  codegen::Int8Layout int8;
  std::unique_ptr<std::byte[], runtime::FreeDeleter> data;
  size_t data_bytes = 0;
  std::unique_ptr<ops::QuantTables> quant;  // null for bf16

  // Set when the bytes live in a buffer shared with other weights instead of
  // `data`: a quantized PackedExperts moves all its experts' codes into one
  // allocation, so experts smaller than a 2 MiB page still stream from huge
  // pages (ops/pack_experts_quant.cpp).
  std::shared_ptr<const std::byte> shared;
  const std::byte* shared_at = nullptr;
  const std::byte* base() const { return shared_at != nullptr ? shared_at : data.get(); }
  const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(base()); }
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(base()); }
  // The bf16 geometry the kernels run on (K = k_packed for fp8 / int4).
  codegen::PackedLayout run_layout() const {
    return quant ? codegen::PackedLayout{layout.n, quant->k_packed} : layout;
  }
  int64_t code_block_bytes() const { return run_layout().k_pairs() * quant->code_row_bytes; }
};

}  // namespace tilejit
