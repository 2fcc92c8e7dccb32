// MoE routing: topk_softmax, topk_sigmoid and grouped_topk (docs/moe.md).
//
// Plain C++, not a JIT path: routing touches T·E scores once (E ≤ a few
// hundred), which is noise next to the expert GEMMs that follow, so it is
// written for clarity and exactness rather than emitted per shape. Scores are
// computed in double, so the selection and the weights match the test's
// double-precision reference up to the final f32 rounding of the weights.
//
// Output order: the k experts of a token are written best first (by the
// selection key), ties broken by the lower expert id, as torch.topk(sorted=True)
// orders them in the engines this replaces.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"

namespace tilejit {

using ops::shape_str;

namespace {

// Tokens per thread-pool task: a task costs a std::function call and an atomic
// claim, a token's routing a few hundred exps; 16 tokens amortise the former
// and still give enough tasks to balance a prefill batch over the cores.
constexpr int64_t kTokensPerTask = 16;

struct RoutingCall {
  int64_t t = 0, e = 0, k = 0;
};

RoutingCall check_routing(const char* op, const TensorView& logits, const TensorView& weights,
                          const TensorView& ids) {
  ops::check_view(op, "logits", logits, 2);
  ops::check_dtype(op, "logits", logits, {DType::f32, DType::bf16});
  ops::check_row_major_rows(op, "logits", logits);
  ops::check_view(op, "topk_weights", weights, 2);
  ops::check_dtype(op, "topk_weights", weights, {DType::f32});
  ops::check_row_major_rows(op, "topk_weights", weights);
  ops::check_view(op, "topk_ids", ids, 2);
  ops::check_dtype(op, "topk_ids", ids, {DType::i32});
  ops::check_row_major_rows(op, "topk_ids", ids);
  RoutingCall c;
  c.t = logits.shape[0];
  c.e = logits.shape[1];
  c.k = ids.shape[1];
  if (c.e < 1)
    throw Error(fmt::format("{}: logits has shape {} (E = {} experts); allowed: E >= 1", op,
                            shape_str(logits.shape), c.e));
  if (ids.shape[0] != c.t)
    throw Error(fmt::format("{}: topk_ids has shape {}; allowed: [T, k] with T = {} (logits {})",
                            op, shape_str(ids.shape), c.t, shape_str(logits.shape)));
  if (weights.shape != ids.shape)
    throw Error(fmt::format("{}: topk_weights has shape {}; allowed: the shape of topk_ids {}", op,
                            shape_str(weights.shape), shape_str(ids.shape)));
  if (c.k < 1 || c.k > c.e)
    throw Error(fmt::format("{}: k = {} (topk_ids {}); allowed: 1 <= k <= E = {}", op, c.k,
                            shape_str(ids.shape), c.e));
  ops::check_count(op, "E (logits.shape[1])", c.e, 1, Limits::max_experts);
  // Both outputs are written while the logits are read.
  ops::check_output(op, "topk_weights", weights, {{"logits", &logits}, {"topk_ids", &ids}});
  ops::check_output(op, "topk_ids", ids, {{"logits", &logits}});
  return c;
}

// Logits row t as doubles (bf16 and f32 both convert exactly).
void load_row(const TensorView& logits, int64_t t, std::vector<double>& row) {
  const int64_t e = logits.shape[1];
  const int64_t off = t * logits.strides[0];
  if (logits.dtype == DType::f32) {
    const float* p = static_cast<const float*>(logits.data) + off;
    for (int64_t i = 0; i < e; ++i) row[i] = p[i];
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(logits.data) + off;
    for (int64_t i = 0; i < e; ++i) row[i] = runtime::bf16_to_f32(p[i]);
  }
}

// Non-finite logits (docs/moe.md, "NaN and Inf"): NaN ranks below every
// number, −inf included, so a NaN expert is chosen only when fewer than k
// experts have a number, and the comparison stays a strict weak order.
inline bool ranks_above(double a, double b) {
  if (std::isnan(b)) return !std::isnan(a);
  return a > b;  // false when a is NaN
}
inline bool ranks_equal(double a, double b) {
  return std::isnan(a) ? std::isnan(b) : a == b;
}

// Sorts the first k entries of idx (a permutation of candidates) by key,
// descending, the lower id first on ties.
void select_top(std::vector<int32_t>& idx, int64_t k, const std::vector<double>& key) {
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [&](int32_t a, int32_t b) {
    const double ka = key[a], kb = key[b];
    return ranks_above(ka, kb) || (ranks_equal(ka, kb) && a < b);
  });
}

// select_top over logits (exact doubles of f32 / bf16 values), by integer
// keys: the logit's f32 bits mapped so that unsigned order is numeric order
// (NaN lowest, −0 as +0 so they tie), the complement of the id below them
// (a tie goes to the lower id). The same order as ranks_above / ranks_equal.
// Branch-free where the data decides: a logit's sign is a coin flip, and a
// branch on it (or a NaN-aware double compare, or partial_sort's heap)
// mispredicted about once a key: the routers took ~0.9 µs a token at E = 64.
// For k <= kMaxPassTopK, k passes of a max over the keys (4 independent
// chains, the winner's key zeroed), which costs k·E compares and no
// misprediction; larger k: partial_sort.
constexpr int64_t kMaxPassTopK = 16;
void select_top_logits(std::vector<int32_t>& idx, int64_t k, const std::vector<double>& logit,
                       std::vector<uint64_t>& keys) {
  const auto e = static_cast<int64_t>(idx.size());
  for (int64_t i = 0; i < e; ++i) {
    const float f = static_cast<float>(logit[i]) + 0.0f;  // −0 + 0 = +0
    uint32_t b;
    std::memcpy(&b, &f, sizeof b);
    // Negative: all bits flipped; positive: the sign bit set; NaN: 0.
    const auto neg = static_cast<uint32_t>(static_cast<int32_t>(b) >> 31);
    const uint32_t ord = (b ^ (neg | 0x80000000u)) & -static_cast<uint32_t>(f == f);
    keys[i] = uint64_t{ord} << 32 | (0xFFFFFFFFu - static_cast<uint32_t>(i));
  }
  auto id_of = [](uint64_t key) { return static_cast<int32_t>(0xFFFFFFFFu - uint32_t(key)); };
  if (k > kMaxPassTopK) {
    std::partial_sort(keys.begin(), keys.begin() + k, keys.end(), std::greater<>());
    for (int64_t j = 0; j < k; ++j) idx[j] = id_of(keys[j]);
    return;
  }
  // Every key is > 0 (its id part is), so a zeroed key is never a max again.
  for (int64_t j = 0; j < k; ++j) {
    uint64_t m[4] = {0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 4 <= e; i += 4)
      for (int l = 0; l < 4; ++l) m[l] = std::max(m[l], keys[i + l]);
    for (; i < e; ++i) m[0] = std::max(m[0], keys[i]);
    const int32_t id = id_of(std::max(std::max(m[0], m[1]), std::max(m[2], m[3])));
    idx[j] = id;
    keys[id] = 0;
  }
}

// In place: logits -> softmax probabilities (max subtracted for range).
// IEEE where IEEE has an answer, the limit where it would give 0/0 or
// ∞ − ∞ instead: a NaN logit makes every probability of the token NaN (its
// denominator sees it); +inf logits share probability 1 equally, the rest
// get 0; a row of only −inf logits is uniform (the limit of equal logits).
// Ranking (nan_poisons false): the softmax of the numbers alone, NaN logits
// left NaN, so a NaN ranks below every probability and the others keep the
// order of their logits (grouped_topk's selection keys: its ids are then the
// best numbers, as topk_softmax's are, while its weights are all NaN).
void softmax(std::vector<double>& s, int64_t e, bool nan_poisons = true) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  double mx = -inf;
  bool nan = false;
  for (int64_t i = 0; i < e; ++i) {
    nan = nan || std::isnan(s[i]);
    if (!std::isnan(s[i])) mx = std::max(mx, s[i]);
  }
  if (nan && nan_poisons) {
    std::fill(s.begin(), s.begin() + e, std::numeric_limits<double>::quiet_NaN());
    return;
  }
  if (mx == inf || mx == -inf)
    for (int64_t i = 0; i < e; ++i)
      if (!std::isnan(s[i])) s[i] = s[i] == mx ? 0.0 : -inf;  // the tied top at 0
  double sum = 0;
  for (int64_t i = 0; i < e; ++i) {
    s[i] = std::exp(s[i] - (mx == inf || mx == -inf ? 0.0 : mx));
    if (!std::isnan(s[i])) sum += s[i];
  }
  for (int64_t i = 0; i < e; ++i) s[i] /= sum;
}

void sigmoid(std::vector<double>& s, int64_t e) {
  for (int64_t i = 0; i < e; ++i) s[i] = 1.0 / (1.0 + std::exp(-s[i]));
}

// The scores of the k chosen experts idx[0..k) only, in place in s (the
// others are left as logits): what write_row reads when the softmax weights
// are renormalized over the chosen experts, where softmax's denominator
// cancels (p_j / Σ_chosen p = e_j / Σ_chosen e, e = exp(l − max)), and for
// σ, which is per expert. k exps instead of E: the routers' cost was E exps
// in double per token. The rules of softmax() carry over: a NaN logit
// anywhere makes the token's weights NaN; +inf logits share the weight, the
// rest get 0; an all −inf row is uniform. The selection put the largest
// number first (NaN ranks last), so s[idx[0]] is the max.
void chosen_scores(bool use_softmax, std::vector<double>& s, int64_t e,
                   const std::vector<int32_t>& idx, int64_t k) {
  if (!use_softmax) {
    for (int64_t j = 0; j < k; ++j) s[idx[j]] = 1.0 / (1.0 + std::exp(-s[idx[j]]));
    return;
  }
  bool nan = false;
  for (int64_t i = 0; i < e; ++i) nan = nan || std::isnan(s[i]);
  const double mx = s[idx[0]];
  for (int64_t j = 0; j < k; ++j) {
    double& v = s[idx[j]];
    if (nan)
      v = std::numeric_limits<double>::quiet_NaN();
    else if (std::isinf(mx))
      v = v == mx ? 1.0 : 0.0;  // exp(0) for the tied top, exp(−inf) for the rest
    else
      v = std::exp(v - mx);
  }
}

// Writes the k chosen experts of token t: weight = score · scale, divided by
// the sum of the chosen scores when renormalizing (skipped if that sum is 0,
// e.g. every σ underflowed: dividing would turn the row into NaN). A NaN in
// that sum (a chosen σ(NaN)) makes every weight of the token NaN, as a NaN
// logit does under softmax: the others' shares are undefined.
void write_row(const TensorView& weights, const TensorView& ids, int64_t t, int64_t k,
               const std::vector<int32_t>& chosen, const std::vector<double>& score,
               bool renormalize, double scale) {
  float* w = static_cast<float*>(weights.data) + t * weights.strides[0];
  int32_t* id = static_cast<int32_t*>(ids.data) + t * ids.strides[0];
  double sum = 0;
  for (int64_t j = 0; j < k; ++j) sum += score[chosen[j]];
  const double norm = renormalize && (sum > 0 || std::isnan(sum)) ? scale / sum : scale;
  for (int64_t j = 0; j < k; ++j) {
    id[j] = chosen[j];
    w[j] = static_cast<float>(score[chosen[j]] * norm);
  }
}

// TILEJIT_VERBOSE's line: routing runs no JIT kernel on any path.
void log_routing(const char* op, const RoutingCall& c) {
  ops::log_call(op, runtime::active_isa(), [&] {
    return ops::CallLine{fmt::format("T={} E={} k={}", c.t, c.e, c.k), "plan=c++"};
  });
}

// Plain top-k: both scores are monotone in the logit, so the selection runs on
// the logits themselves (exact ties, no rounding of exp can merge two experts).
void plain_topk(const char* op, bool use_softmax, const TensorView& logits,
                const TensorView& weights, const TensorView& ids, bool renormalize) {
  const RoutingCall c = check_routing(op, logits, weights, ids);
  log_routing(op, c);
  const int64_t tasks = (c.t + kTokensPerTask - 1) / kTokensPerTask;
  runtime::parallel_for(tasks, [&](int64_t task) {
    std::vector<double> row(c.e);
    std::vector<int32_t> idx(c.e);
    std::vector<uint64_t> keys(c.e);
    const int64_t end = std::min(c.t, (task + 1) * kTokensPerTask);
    for (int64_t t = task * kTokensPerTask; t < end; ++t) {
      load_row(logits, t, row);
      select_top_logits(idx, c.k, row, keys);
      if (use_softmax && !renormalize)
        softmax(row, c.e);  // the weights are the probabilities: the whole denominator
      else
        chosen_scores(use_softmax, row, c.e, idx, c.k);
      write_row(weights, ids, t, c.k, idx, row, renormalize, 1.0);
    }
  });
}

}  // namespace

void topk_softmax(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, bool renormalize) {
  runtime::api_guard("topk_softmax", [&] {
    plain_topk("topk_softmax", true, logits, topk_weights, topk_ids, renormalize);
  });
}

void topk_sigmoid(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, bool renormalize) {
  runtime::api_guard("topk_sigmoid", [&] {
    plain_topk("topk_sigmoid", false, logits, topk_weights, topk_ids, renormalize);
  });
}

void grouped_topk(const TensorView& logits, const TensorView& topk_weights,
                  const TensorView& topk_ids, const GroupedTopkOptions& opt) {
  runtime::api_guard("grouped_topk", [&] {
    constexpr const char* op = "grouped_topk";
    const RoutingCall c = check_routing(op, logits, topk_weights, topk_ids);
    log_routing(op, c);
    const int64_t groups = opt.num_expert_group;
    if (groups < 1 || c.e % groups != 0)
      throw Error(
          fmt::format("{}: num_expert_group = {} with E = {} experts; allowed: >= 1 and dividing E",
                      op, groups, c.e));
    if (opt.topk_group < 1 || opt.topk_group > groups)
      throw Error(
          fmt::format("{}: topk_group = {}; allowed: 1 <= topk_group <= num_expert_group = {}", op,
                      opt.topk_group, groups));
    const int64_t group_size = c.e / groups;
    if (c.k > opt.topk_group * group_size)
      throw Error(
          fmt::format("{}: k = {} (topk_ids {}); allowed: k <= topk_group * E / num_expert_group = "
                      "{} * {} = {}",
                      op, c.k, shape_str(topk_ids.shape), opt.topk_group, group_size,
                      opt.topk_group * group_size));
    if (opt.score != RouterScore::softmax && opt.score != RouterScore::sigmoid)
      throw Error(fmt::format("{}: score = {}; allowed: softmax, sigmoid", op,
                              static_cast<int>(opt.score)));
    ops::check_finite(op, "routed_scaling_factor", opt.routed_scaling_factor);
    const TensorView* bias = opt.correction_bias ? &*opt.correction_bias : nullptr;
    if (bias != nullptr) {
      ops::check_view(op, "correction_bias", *bias, 1);
      ops::check_dtype(op, "correction_bias", *bias, {DType::f32});
      if (bias->shape[0] != c.e)
        throw Error(fmt::format("{}: correction_bias has shape {}; allowed: [E] = [{}]", op,
                                shape_str(bias->shape), c.e));
      ops::check_disjoint(op, "topk_weights", topk_weights, "correction_bias", *bias);
      ops::check_disjoint(op, "topk_ids", topk_ids, "correction_bias", *bias);
      // A checkpoint parameter, not data: a NaN would keep its expert (and
      // often its group) out of every selection, an Inf pick it always,
      // whatever the logits say. A corrupt checkpoint is refused, as NaN
      // weight codes and KV scales are.
      for (int64_t i = 0; i < c.e; ++i) {
        const float b = static_cast<const float*>(bias->data)[i * bias->strides[0]];
        if (!std::isfinite(b))
          throw Error(
              fmt::format("{}: correction_bias[{}] = {}; allowed: a finite value", op, i, b));
      }
    }

    const int64_t tasks = (c.t + kTokensPerTask - 1) / kTokensPerTask;
    runtime::parallel_for(tasks, [&](int64_t task) {
      std::vector<double> score(c.e), key(c.e), group_score(groups);
      std::vector<int32_t> idx, gidx(groups);
      idx.reserve(c.e);
      const int64_t end = std::min(c.t, (task + 1) * kTokensPerTask);
      for (int64_t t = task * kTokensPerTask; t < end; ++t) {
        load_row(logits, t, score);
        if (opt.score == RouterScore::softmax) {
          key = score;
          softmax(key, c.e, /*nan_poisons=*/false);
          softmax(score, c.e);
        } else {
          sigmoid(score, c.e);
          key = score;
        }
        for (int64_t i = 0; i < c.e; ++i) {
          if (bias != nullptr)
            key[i] += static_cast<const float*>(bias->data)[i * bias->strides[0]];
        }
        // Group scores: with a correction bias, the sum of the group's best two
        // keys (DeepSeek-V3; the one key when a group holds a single expert);
        // without, the group's best score.
        for (int64_t g = 0; g < groups; ++g) {
          const double* kg = key.data() + g * group_size;
          if (bias != nullptr) {
            // The best two by rank (NaN, the lowest rank, is also "none yet"):
            // a NaN key counts only in a group with fewer than two numbers,
            // whose score is then NaN, ranking last.
            double first = std::numeric_limits<double>::quiet_NaN(), second = first;
            for (int64_t i = 0; i < group_size; ++i) {
              const double v = kg[i];
              if (ranks_above(v, first)) {
                second = first;
                first = v;
              } else if (ranks_above(v, second)) {
                second = v;
              }
            }
            group_score[g] = group_size >= 2 ? first + second : first;
          } else {
            double best = kg[0];
            for (int64_t i = 1; i < group_size; ++i)
              if (ranks_above(kg[i], best)) best = kg[i];
            group_score[g] = best;
          }
          gidx[g] = static_cast<int32_t>(g);
        }
        select_top(gidx, opt.topk_group, group_score);
        // Candidates: the experts of the kept groups only (never a masked-out
        // expert, whatever its score).
        idx.clear();
        for (int64_t gi = 0; gi < opt.topk_group; ++gi)
          for (int64_t i = 0; i < group_size; ++i)
            idx.push_back(static_cast<int32_t>(gidx[gi] * group_size + i));
        select_top(idx, c.k, key);
        write_row(topk_weights, topk_ids, t, c.k, idx, score, opt.renormalize,
                  opt.routed_scaling_factor);
      }
    });
  });
}

}  // namespace tilejit
