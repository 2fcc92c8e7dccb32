#include "tools/random_data.h"

#include <fmt/format.h>

#include <numeric>
#include <utility>

#include "runtime/bf16.h"
#include "runtime/quant_formats.h"

namespace tilejit::tools {

std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float scale) {
  XorShift r{seed * 0x9E3779B97F4A7C15ull + 1};
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = runtime::f32_to_bf16(r.next() * scale);
  return v;
}

std::vector<uint8_t> fp8_cache_codes(DType cache, const std::vector<uint16_t>& bf16_values,
                                     float scale) {
  const runtime::Fp8Format* f = runtime::fp8_format_of(cache);
  if (f == nullptr)
    throw Error(
        fmt::format("fp8_cache_codes: cache dtype {}; allowed: f8e4m3, f8e5m2", dtype_name(cache)));
  std::vector<uint8_t> codes(bf16_values.size());
  for (size_t i = 0; i < codes.size(); ++i)
    codes[i] = runtime::f32_to_fp8(*f, runtime::bf16_to_f32(bf16_values[i]) / scale);
  return codes;
}

std::vector<uint8_t> e4m3_codes(const std::vector<uint16_t>& bf16_values, float scale) {
  return fp8_cache_codes(DType::f8e4m3, bf16_values, scale);
}

std::vector<int32_t> shuffled_blocks(size_t n, uint64_t seed) {
  std::vector<int32_t> t(n);
  std::iota(t.begin(), t.end(), 0);
  XorShift r{seed};
  for (size_t i = n; i > 1; --i) std::swap(t[i - 1], t[size_t(r.next_u64() % i)]);
  return t;
}

}  // namespace tilejit::tools
