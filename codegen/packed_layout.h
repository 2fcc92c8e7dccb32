// The packed bf16 weight layout shared by the AMX and AVX-512 micro-kernels.
//
//   packed[nb][kp][c][2] = w[nb*64 + c][2*kp + parity]      ("vnni2, n64, k32-padded")
//
// nb: column block of 64 output features; kp: k-pair row; c: column within the
// block. One k-pair row of a block is 256 bytes: four 64-byte AMX B-tile rows
// (16 columns × 2 bf16) side by side, or four zmm loads for vdpbf16ps. N is
// zero-padded to a multiple of 64 and K to a multiple of 32 (one AMX K step),
// so tile loads of the last block never leave the buffer and padded products
// are exact zeros.
#pragma once

#include <cstdint>

#include "tilejit/tilejit.h"

namespace tilejit::codegen {

// The K granularities, one home: a VNNI group of B holds 4 bytes of K (2 bf16,
// 4 int8), an AMX tile row holds 64 bytes of K (32 bf16, 64 int8).
inline int k_group_of(DType b) {
  return dtype_bits(b) >= 32 ? 1 : 32 / dtype_bits(b);
}
inline int amx_k_step_of(DType a) {
  return 512 / dtype_bits(a);
}

struct PackedLayout {
  static constexpr int64_t kBlockN = 64;  // columns per block
  // K is padded to a multiple of one AMX K step (amx_k_step_of(bf16)).
  static constexpr int64_t kPadK = 32;
  static constexpr int64_t kRowBytes = kBlockN * 2 * 2;  // one k-pair row

  int64_t n = 0, k = 0;

  int64_t n_blocks() const { return (n + kBlockN - 1) / kBlockN; }
  int64_t k_padded() const { return (k + kPadK - 1) / kPadK * kPadK; }
  int64_t k_pairs() const { return k_padded() / 2; }
  int64_t block_elems() const { return k_pairs() * kBlockN * 2; }
  int64_t total_elems() const { return n_blocks() * block_elems(); }
  // Element index of w[row, col] in the packed buffer.
  int64_t index(int64_t row, int64_t col) const {
    const int64_t nb = row / kBlockN, c = row % kBlockN;
    return nb * block_elems() + (col / 2) * kBlockN * 2 + c * 2 + (col % 2);
  }
};

// The packed int8 weight layout of the W8A8 kernels (vpdpbusd, tdpbusd):
//
//   packed[nb][kq][c][4] = w[nb*64 + c][4*kq + j]            ("vnni4, n64, k64-padded")
//
// The same geometry as PackedLayout with 4 int8 in a VNNI group instead of 2
// bf16: a k-quad row of a block is 256 bytes (64 columns × 4), N padded to 64
// and K to 64 (one AMX int8 K step) with zeros.
struct Int8Layout {
  static constexpr int64_t kBlockN = 64;
  static constexpr int64_t kPadK = 64;  // amx_k_step_of(u8)
  static constexpr int64_t kRowBytes = kBlockN * 4;

  int64_t n = 0, k = 0;

  int64_t n_blocks() const { return (n + kBlockN - 1) / kBlockN; }
  int64_t k_padded() const { return (k + kPadK - 1) / kPadK * kPadK; }
  int64_t k_quads() const { return k_padded() / 4; }
  int64_t block_bytes() const { return k_quads() * kRowBytes; }
  int64_t total_bytes() const { return n_blocks() * block_bytes(); }
  // Byte offset of w[row, col].
  int64_t index(int64_t row, int64_t col) const {
    return row / kBlockN * block_bytes() + (col / 4) * kRowBytes + (row % kBlockN) * 4 + col % 4;
  }
};

// The AMX tile layout of an activation (A) operand, packed per call by the
// GEMM drivers so that the AMX kernel's tile loads are contiguous 1 KiB reads:
//
//   packed[mb][ks][r][c] = a[mb*32 + r][ks*32 + c]     (zero past K)
//
// mb: block of 32 rows; ks: K step of 32; one K step of a block is 2 KiB (two
// 16-row tiles of 64-byte rows). Row-major A with a large row stride puts the
// 16 rows of one tile load in 16 pages and in the same L1 set (K = 4096: an
// 8 KiB stride), so every A tile came from L2 with a TLB walk per row.
struct PackedA {
  static constexpr int64_t kBlockRows = 32;
  static constexpr int64_t kStepBytes = kBlockRows * 64;  // one K step of a block

  int64_t k = 0;

  int64_t k_steps() const { return (k + 31) / 32; }
  int64_t block_bytes() const { return k_steps() * kStepBytes; }
  // Bytes of the packed copy of `rows` rows.
  int64_t bytes(int64_t rows) const { return (rows + kBlockRows - 1) / kBlockRows * block_bytes(); }
  // Byte offset of a[row, col].
  int64_t offset(int64_t row, int64_t col) const {
    return row / kBlockRows * block_bytes() + col / 32 * kStepBytes + row % kBlockRows * 64 +
           col % 32 * 2;
  }
};

}  // namespace tilejit::codegen
