// The streaming read over zmm (AVX-512F) or ymm (AVX2) registers, chosen at
// run time (function targets: the file itself is built for the baseline).
#include "dram_bandwidth.h"

#include <immintrin.h>

#include <thread>
#include <vector>

namespace tilejit::bench {
namespace {

// Four independent accumulators, 256 bytes per iteration: enough loads in
// flight for the hardware prefetchers to run ahead at full DRAM speed.
__attribute__((target("avx512f"))) uint64_t sum_range_zmm(const uint8_t* p, size_t bytes) {
  __m512i s0 = _mm512_set1_epi64(0), s1 = s0, s2 = s0, s3 = s0;
  for (size_t i = 0; i < bytes; i += 256) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(p + i));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + i + 64));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + i + 128));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + i + 192));
  }
  s0 = _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3));
  return static_cast<uint64_t>(_mm512_reduce_add_epi64(s0));
}

__attribute__((target("avx2"))) uint64_t sum_range_ymm(const uint8_t* p, size_t bytes) {
  __m256i s[8];
  for (__m256i& v : s) v = _mm256_setzero_si256();
  for (size_t i = 0; i < bytes; i += 256)
    for (int j = 0; j < 8; ++j)
      s[j] = _mm256_add_epi64(
          s[j], _mm256_load_si256(reinterpret_cast<const __m256i*>(p + i + 32 * size_t(j))));
  for (int j = 1; j < 8; ++j) s[0] = _mm256_add_epi64(s[0], s[j]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

uint64_t sum_range(const uint8_t* p, size_t bytes) {
  static const bool zmm = __builtin_cpu_supports("avx512f");
  return zmm ? sum_range_zmm(p, bytes) : sum_range_ymm(p, bytes);
}

}  // namespace

bool stream_read_usable() {
  return __builtin_cpu_supports("avx512f") || __builtin_cpu_supports("avx2");
}

uint64_t stream_read(const void* buf, size_t bytes, int threads) {
  const auto* p = static_cast<const uint8_t*>(buf);
  if (threads <= 1) return sum_range(p, bytes);
  const size_t per = bytes / 256 / threads * 256;
  std::vector<uint64_t> sums(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) {
    const size_t begin = per * t;
    const size_t len = t == threads - 1 ? bytes - begin : per;
    pool.emplace_back([&sums, p, begin, len, t] { sums[t] = sum_range(p + begin, len); });
  }
  sums[0] = sum_range(p, per);
  uint64_t total = 0;
  for (auto& th : pool) th.join();
  for (uint64_t s : sums) total += s;
  return total;
}

}  // namespace tilejit::bench
