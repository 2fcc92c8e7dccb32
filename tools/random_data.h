// Synthetic inputs of the tools' workloads (the main job, `tilejit tune`):
// random bf16 tensors, their fp8 KV-cache codes, and a paged cache's block
// table in the order an allocator leaves blocks after a while.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::tools {

// xorshift64: the 235M-element gate/up weight of the main job would take
// seconds with mt19937.
struct XorShift {
  uint64_t s;
  uint64_t next_u64() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  // Uniform in [-1, 1).
  float next() {
    return static_cast<float>(static_cast<int64_t>(next_u64() >> 40) - (1 << 23)) / float(1 << 23);
  }
};

// n bf16 values uniform in ±scale (rounded to nearest), from `seed`.
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale);

// The codes an fp8 KV cache of dtype `cache` (f8e4m3 or f8e5m2; an Error
// for any other) stores for bf16 values with `scale`: store_kv's rule,
// fp8(x / scale) (runtime::f32_to_fp8 of the cache's format).
std::vector<uint8_t> fp8_cache_codes(DType cache, const std::vector<uint16_t>& bf16_values,
                                     float scale);
// fp8_cache_codes of an f8e4m3 cache.
std::vector<uint8_t> e4m3_codes(const std::vector<uint16_t>& bf16_values, float scale);

// Block ids 0 .. n − 1 shuffled (Fisher–Yates, from `seed`): a paged cache's
// blocks as an allocator hands them out after a while, not in address order.
// Decode reads a cache block by block, so the order changes what the memory
// system sees (docs/attention.md: 16-key blocks in order decode ~1.6x faster
// than shuffled ones on the Zen 5 host); timings use this one.
std::vector<int32_t> shuffled_blocks(size_t n, uint64_t seed);

}  // namespace tilejit::tools
