// fp8 (e4m3 or e5m2) KV caches on the attention paths that read bf16 rows
// (the block engine of extend and of the non-LLVM decode, and the scalar
// path): the blocks a call reads are converted, exactly and unscaled (every
// e4m3 and e5m2 value, ±Inf included, is a bf16 number), into a bf16 copy with its own block table;
// the scales are applied in fp32 (K's folded into the score scale, V's into the output factor,
// Params::v_scale), so those paths compute on the exact values code · scale. The LLVM decode kernel
// reads the codes in place instead.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ops/attention_checks.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/thread_pool.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops::attn {

// bf16 of every code of an fp8 cache dtype (f8e4m3 or f8e5m2), from the one
// home of the conversion (runtime::fp8_to_f32).
inline const std::array<uint16_t, 256>& fp8_bf16_table(DType code) {
  auto make = [](const runtime::Fp8Format& f) {
    std::array<uint16_t, 256> r{};
    for (int c = 0; c < 256; ++c)
      r[static_cast<size_t>(c)] =
          runtime::f32_to_bf16(runtime::fp8_to_f32(f, static_cast<uint8_t>(c)));
    return r;
  };
  static const std::array<uint16_t, 256> e4m3 = make(runtime::kE4m3), e5m2 = make(runtime::kE5m2);
  return code == DType::f8e5m2 ? e5m2 : e4m3;
}

// The bf16 copy: caches [used blocks, block_size, Hkv, D / Dv] and the block
// table [B, max_blocks] pointing into them (entries a sequence does not use
// are 0, never read).
struct Bf16CacheCopy {
  std::vector<uint16_t> k, v;
  std::vector<int32_t> table;
  TensorView k_cache, v_cache, block_table;
};

// Blocks of sequence b holding keys [0, keys[b]) (entries already checked).
inline Bf16CacheCopy dequantize_cache(const TensorView& k_cache, const TensorView& v_cache,
                                      const TensorView& block_table,
                                      const std::vector<int64_t>& keys) {
  const int64_t batch = block_table.shape[0], max_blocks = block_table.shape[1];
  const int64_t bs = k_cache.shape[1], hkv = k_cache.shape[2], d = k_cache.shape[3];
  const int64_t dv = v_cache.shape[3];
  const auto* table = static_cast<const int32_t*>(block_table.data);
  Bf16CacheCopy c;
  c.table.assign(static_cast<size_t>(batch * max_blocks), 0);
  std::vector<int64_t> src;  // copy block i <- cache block src[i]
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < (keys[b] + bs - 1) / bs; ++i) {
      c.table[b * max_blocks + i] = static_cast<int32_t>(src.size());
      src.push_back(table[b * block_table.strides[0] + i * block_table.strides[1]]);
    }
  const int64_t n = static_cast<int64_t>(src.size());
  c.k.resize(static_cast<size_t>(n * bs * hkv * d));
  c.v.resize(static_cast<size_t>(n * bs * hkv * dv));
  const auto& lut = fp8_bf16_table(k_cache.dtype);  // v_cache's too (check_kv_scales)
  auto convert = [&](const TensorView& cache, int64_t width, uint16_t* dst, int64_t i) {
    const auto* base = static_cast<const uint8_t*>(cache.data) + src[i] * cache.strides[0];
    for (int64_t r = 0; r < bs; ++r)
      for (int64_t h = 0; h < hkv; ++h) {
        const uint8_t* row = base + r * cache.strides[1] + h * cache.strides[2];
        uint16_t* out = dst + ((i * bs + r) * hkv + h) * width;
        for (int64_t e = 0; e < width; ++e) out[e] = lut[row[e]];
      }
  };
  runtime::parallel_for(n, [&](int64_t i) {
    convert(k_cache, d, c.k.data(), i);
    convert(v_cache, dv, c.v.data(), i);
  });
  c.k_cache = TensorView(c.k.data(), DType::bf16, {n, bs, hkv, d});
  c.v_cache = TensorView(c.v.data(), DType::bf16, {n, bs, hkv, dv});
  c.block_table = TensorView(c.table.data(), DType::i32, {batch, max_blocks});
  return c;
}

// Row j of kv head h of sequence b in an fp8 paged cache, as bf16 in buf
// (valid until the next call with buf): the rare reference recomputations.
inline const uint16_t* fp8_row(const TensorView& cache, const TensorView& block_table, int64_t b,
                               int64_t h, int64_t j, std::vector<uint16_t>& buf) {
  const int64_t bs = cache.shape[1], width = cache.shape[3];
  const int64_t blk = static_cast<const int32_t*>(
      block_table.data)[b * block_table.strides[0] + (j / bs) * block_table.strides[1]];
  const uint8_t* row = static_cast<const uint8_t*>(cache.data) + blk * cache.strides[0] +
                       (j % bs) * cache.strides[1] + h * cache.strides[2];
  const auto& lut = fp8_bf16_table(cache.dtype);
  buf.resize(static_cast<size_t>(width));
  for (int64_t e = 0; e < width; ++e) buf[static_cast<size_t>(e)] = lut[row[e]];
  return buf.data();
}

// Params of kv head h: the K scale folded into the score scale, the V scale
// into the output factor.
inline Params head_params(const Params& p, const KvScales& s, int64_t h) {
  Params r = p;
  r.scale = p.scale * s.k[static_cast<size_t>(h)];
  r.v_scale = s.v[static_cast<size_t>(h)];
  return r;
}

}  // namespace tilejit::ops::attn
