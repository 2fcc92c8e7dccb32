// The scalar attention reference: the oracle of the attention tests and the
// last fallback. One sequence, one query head at a time, in double; written
// for clarity and sharing no code with the JIT paths. Semantics: see
// AttentionOptions in include/tilejit/tilejit.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

namespace tilejit::runtime {

struct ReferenceAttentionHead {
  int64_t tq = 0, tk = 0;  // queries and keys of the sequence
  int64_t d = 0, dv = 0;
  double sm_scale = 1;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  double softcap = 0;
  bool has_sink = false;
  double sink = 0;         // this head's sink logit
  double alibi_slope = 0;  // 0: no ALiBi
  // q_at(i, c): element c of query row i; k_at(j, c), v_at(j, c) likewise.
  std::function<double(int64_t, int64_t)> q_at, k_at, v_at;
  // Receives out[i][c] for c < dv.
  std::function<void(int64_t, int64_t, double)> out;
};

inline bool reference_key_visible(const ReferenceAttentionHead& h, int64_t i_pos, int64_t j) {
  if (h.causal && j > i_pos) return false;
  if (h.window_left >= 0 && j < i_pos - h.window_left) return false;
  if (h.window_right >= 0 && j > i_pos + h.window_right) return false;
  return true;
}

inline void reference_attention_head(const ReferenceAttentionHead& h) {
  std::vector<double> s(static_cast<size_t>(h.tk));
  std::vector<double> acc(static_cast<size_t>(h.dv));
  for (int64_t i = 0; i < h.tq; ++i) {
    const int64_t i_pos = h.tk - h.tq + i;
    double mx = h.has_sink ? h.sink : -std::numeric_limits<double>::infinity();
    bool any = false;
    for (int64_t j = 0; j < h.tk; ++j) {
      if (!reference_key_visible(h, i_pos, j)) continue;
      double dot = 0;
      for (int64_t c = 0; c < h.d; ++c) dot += h.q_at(i, c) * h.k_at(j, c);
      double v = dot * h.sm_scale;
      if (h.softcap > 0) v = h.softcap * std::tanh(v / h.softcap);
      v += h.alibi_slope * static_cast<double>(j - i_pos);
      s[j] = v;
      mx = std::max(mx, v);
      any = true;
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    // NaN and ±Inf (docs/reliability.md): IEEE arithmetic throughout. A NaN
    // score (NaN in q or k, Inf·0, Inf − Inf) never enters mx but makes its
    // weight, the denominator and so the whole row NaN; a +inf score makes
    // the row NaN (exp(inf − inf)); a −inf score is a weight of exactly 0, and
    // a row whose visible scores are all −inf (and no finite sink) is a row
    // that sees no key: 0, as FlashAttention gives, not 0/0. A V element
    // reaches only its own output column, of the rows that see its key.
    const double shift = mx == -std::numeric_limits<double>::infinity() ? 0.0 : mx;
    if (any) {
      double denom = h.has_sink ? std::exp(h.sink - shift) : 0.0;
      for (int64_t j = 0; j < h.tk; ++j) {
        if (!reference_key_visible(h, i_pos, j)) continue;
        const double p = std::exp(s[j] - shift);
        denom += p;
        for (int64_t c = 0; c < h.dv; ++c) acc[c] += p * h.v_at(j, c);
      }
      for (auto& a : acc) a = denom == 0 ? 0.0 : a / denom;
    }
    for (int64_t c = 0; c < h.dv; ++c) h.out(i, c, acc[c]);
  }
}

}  // namespace tilejit::runtime
