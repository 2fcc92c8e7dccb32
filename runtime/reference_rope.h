// The scalar RoPE reference: the oracle of the rope tests and the scalar
// path. One head row at a time, in double, element by element straight from
// the definition in docs/rope.md; no code shared with the JIT path.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

namespace tilejit::runtime {

struct ReferenceRope {
  bool neox = true;                    // else gptj (interleaved pairs)
  int64_t rotary_dim = 0;              // even, <= the head size
  int64_t ndim = 1;                    // equal chunks of the rotary part, one position stream each
  std::vector<int64_t> mrope_section;  // frequency sections, one stream each (ndim == 1)
  bool mrope_interleaved = false;      // 3 sections dealt out round-robin (docs/rope.md)
};

// Interleaved M-RoPE, written as sglang's apply_interleaved_rope (mrope.py)
// writes it: start from the t row everywhere, then overwrite the slices
// [1 : 3·h : 3] from the h row and [2 : 3·w : 3] from the w row.
inline int64_t reference_interleaved_stream(const std::vector<int64_t>& sec, int64_t j) {
  int64_t stream = 0;
  for (int64_t i = 1; i < 3 * sec[1]; i += 3)
    if (i == j) stream = 1;
  for (int64_t i = 2; i < 3 * sec[2]; i += 3)
    if (i == j) stream = 2;
  return stream;
}

// The position stream that frequency j of chunk c reads.
inline int64_t reference_rope_stream(const ReferenceRope& r, int64_t chunk, int64_t j) {
  if (r.ndim > 1) return chunk;
  if (r.mrope_interleaved) return reference_interleaved_stream(r.mrope_section, j);
  int64_t end = 0;
  for (size_t s = 0; s < r.mrope_section.size(); ++s) {
    end += r.mrope_section[s];
    if (j < end) return static_cast<int64_t>(s);
  }
  return 0;
}

// Rotates one head: x [D] in, out [D] (out[i] = x[i] past rotary_dim).
// cache(stream, col) returns column col of the cos/sin row at that stream's
// position. mag[i] (if non-null) receives |x_i·cos| + |x_partner·sin|, the
// scale of the two terms, which the tests' error bound uses.
inline void reference_rope_head(const ReferenceRope& r, int64_t d, const double* x, double* out,
                                const std::function<double(int64_t, int64_t)>& cache,
                                double* mag = nullptr) {
  const int64_t width = r.rotary_dim / r.ndim;  // one stream's rotary width W
  const int64_t half = width / 2;
  for (int64_t i = 0; i < d; ++i) {
    if (i >= r.rotary_dim) {
      out[i] = x[i];
      if (mag) mag[i] = std::abs(x[i]);
      continue;
    }
    const int64_t c = i / width, l = i % width, base = c * width;
    int64_t j = 0, partner = 0;
    double sign = 0;  // out = x_i·cos + sign·x_partner·sin
    if (r.neox) {
      const bool first = l < half;
      j = first ? l : l - half;
      partner = base + (first ? l + half : l - half);
      sign = first ? -1 : 1;
    } else {
      const bool even = l % 2 == 0;
      j = l / 2;
      partner = base + (even ? l + 1 : l - 1);
      sign = even ? -1 : 1;
    }
    const int64_t s = reference_rope_stream(r, c, j);
    const double cs = cache(s, j), sn = cache(s, half + j);
    out[i] = x[i] * cs + sign * x[partner] * sn;
    if (mag) mag[i] = std::abs(x[i] * cs) + std::abs(x[partner] * sn);
  }
}

}  // namespace tilejit::runtime
