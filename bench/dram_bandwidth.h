// Sustainable DRAM read bandwidth of this machine: a streaming AVX-512 (or AVX2) sum over
// a buffer far larger than the last-level cache. Measurement code for the
// benchmarks (the yardstick for cold-weight decode), not a JIT path.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tilejit::bench {

// Reads bytes [0, bytes) of `buf` (64-byte aligned, bytes a multiple of 256)
// once, split evenly over `threads` threads (the caller is one of them).
// Returns a checksum so the loads cannot be elided.
// Whether this CPU runs stream_read (AVX-512F or AVX2).
bool stream_read_usable();
uint64_t stream_read(const void* buf, size_t bytes, int threads);

}  // namespace tilejit::bench
