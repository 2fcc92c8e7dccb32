// The attention block engine shared by prefill (flash_attn_varlen), extend
// and the non-LLVM decode: one block of ≤ 64 query rows of one kv head against
// a key range, in key blocks of 128, with an fp32 online softmax. Everything
// runs transposed, rows of the query block along the vector lanes:
//
//   Sᵀ[keys × m] = K[keys × D] · Qᵀ      JIT brgemm, A = K rows in place, B = Qᵀ packed once
//   Pᵀ = softmax step of Sᵀ, bf16 vnni2  vectorised across the m rows (no gathers,
//                                         no horizontal reductions), written directly
//                                         as the packed B operand of the next GEMM
//   Oᵀ[Dv × m] += Vᵀ[Dv × keys] · Pᵀ     JIT brgemm, A = V transposed (per call for
//                                         prefill, per key block otherwise)
//
// Only Q (once per query block) and V are rearranged, because AMX / vdpbf16ps
// need the reduced dimension in pairs: K's pairs are its own row elements.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "codegen/attention_blocking.h"
#include "tilejit/tilejit.h"

namespace tilejit::jit {
struct TunedEntry;
}

namespace tilejit::ops::attn {

// Query rows per block at most (one packed B block): the row stride of the
// engine's transposed state. A task may take fewer (Blocking::rows).
inline constexpr int64_t kRowsPerBlock = codegen::AttentionBlocking::kRowsMax;
using Blocking = codegen::AttentionBlocking;
// The blocking of prefill and extend: a tuning database entry's rows /
// key_block knobs (docs/tuning.md) where it sets them, else the defaults.
Blocking tuned_blocking(const jit::TunedEntry* tuned);
inline constexpr int64_t kMaxHeadDim = Limits::max_head_dim;

// Where key (or value) row j of one kv head lives: a dense tensor, or a paged
// cache addressed through one sequence's block-table row.
struct RowSource {
  const uint16_t* base = nullptr;  // row 0 of the head (dense) / block 0 + head offset (paged)
  int64_t row_stride = 0;          // elements between rows inside a run
  const int32_t* table = nullptr;  // paged: block indices (already range-checked)
  int64_t table_stride = 1;
  int64_t block_size = 0;
  int64_t block_stride = 0;  // elements between cache blocks
  int64_t first = 0;         // dense: key index of the row at base (extend's new tokens)

  const uint16_t* row(int64_t j) const {
    if (table == nullptr) return base + (j - first) * row_stride;
    const int64_t blk = table[(j / block_size) * table_stride];
    return base + blk * block_stride + (j % block_size) * row_stride;
  }
  // Rows from j on that share row_stride (to the end of the cache block).
  int64_t run(int64_t j) const {
    return table == nullptr ? std::numeric_limits<int64_t>::max() : block_size - j % block_size;
  }
};

// Kv head h of sequence b in a paged cache [num_blocks, block_size, Hkv, D]
// through row b of block_table (int32 [B, max_blocks], entries range-checked).
inline RowSource paged_rows(const TensorView& cache, const TensorView& block_table, int64_t b,
                            int64_t h) {
  RowSource s;
  s.base = static_cast<const uint16_t*>(cache.data) + h * cache.strides[2];
  s.row_stride = cache.strides[1];
  s.table = static_cast<const int32_t*>(block_table.data) + b * block_table.strides[0];
  s.table_stride = block_table.strides[1];
  s.block_size = cache.shape[1];
  s.block_stride = cache.strides[0];
  return s;
}

struct Params {
  int64_t d = 0, dv = 0;
  float scale = 1;
  float softcap = 0;
  bool causal = false;
  int64_t window_left = -1, window_right = -1;
  const float* sinks = nullptr;  // [Hq] or null (strided: sinks_stride)
  int64_t sinks_stride = 1;
  const float* slopes = nullptr;  // [Hq] or null
  int64_t slopes_stride = 1;
  // fp8 KV cache (KvCacheScales): the output is v_scale · Σ p·v over the V
  // values read; the K scale is folded into `scale` (per kv head: tasks of
  // one kv head take a Params of their own).
  float v_scale = 1;
  // Keys per online-softmax step (Blocking::key_block_allowed). The default
  // 128 rather than 64 halves the P·V micro-kernel's accumulator loads and
  // stores per FMA (+2-5% prefill); a tuning database may set another.
  int64_t key_block = Blocking{}.key_block;
};

// The split-KV rule of decode and extend (without a tuned count): tasks too
// few for the pool (fewer than 2 per thread) split each sequence's keys into
// chunks merged afterwards, enough for 2 tasks per thread, each chunk at
// least kMinSplitKeys keys so that a split pays for its merge. With tasks
// enough, a caller that gives the keys of all sequences (`total`) still
// splits when the longest holds more than a thread's share of them (a long
// context among short ones ran on one thread: 2 threads gained nothing):
// into ceil(longest · threads / total) chunks, at most threads.
inline constexpr int64_t kMinSplitKeys = 256;
inline int64_t default_splits(int64_t tasks, int64_t threads, int64_t longest, int64_t total = 0) {
  if (threads <= 1 || tasks <= 0) return 1;
  const int64_t by_keys = longest / kMinSplitKeys;
  if (tasks < 2 * threads)
    return std::max<int64_t>(1, std::min((2 * threads + tasks - 1) / tasks, by_keys));
  if (total <= 0) return 1;
  // longest ≤ total ≤ B · 2^31 keys and threads ≤ 4096: the product fits.
  const int64_t share = (longest * threads + total - 1) / total;
  return std::max<int64_t>(1, std::min({share, threads, by_keys}));
}

// Keys [j0, j1) of split s of `splits` over a range of `keys` keys: chunks of
// ceil(keys / splits) rounded up to `step` (the engine's key block, or the
// decode kernel's 16-key chunk, so a split boundary never cuts a step in
// two); the last chunks may be short or empty. The one rule of decode's and
// extend's split-KV.
struct KeyRange {
  int64_t j0, j1;
};
inline KeyRange split_range(int64_t keys, int64_t splits, int64_t s, int64_t step) {
  const int64_t chunk = ((keys + splits - 1) / splits + step - 1) / step * step;
  const int64_t j0 = std::min(keys, s * chunk);
  return {j0, std::min(keys, j0 + chunk)};
}

// The unit of work of prefill and extend: rows [r0, r0 + block rows) of
// sequence b's kv head h, its rows (query position, head of the group)
// position-major, so a block holds whole groups and consecutive positions.
struct RowBlock {
  int64_t b, h, r0;
};
// Every row block of a batch whose query tokens have prefix sums `cu_q`
// [B+1], groups of `g` heads per kv head: sequence by sequence, head by head.
inline std::vector<RowBlock> row_blocks(const std::vector<int64_t>& cu_q, int64_t g, int64_t hkv,
                                        int64_t block_rows) {
  std::vector<RowBlock> blocks;
  for (size_t b = 0; b + 1 < cu_q.size(); ++b) {
    const int64_t rows = (cu_q[b + 1] - cu_q[b]) * g;
    for (int64_t h = 0; h < hkv; ++h)
      for (int64_t r0 = 0; r0 < rows; r0 += block_rows)
        blocks.push_back({static_cast<int64_t>(b), h, r0});
  }
  return blocks;
}

// Params of a call (scale defaults to 1/√D; head vectors may be strided).
Params make_params(const AttentionOptions& opt, int64_t d, int64_t dv);

struct QueryRow {
  const uint16_t* q = nullptr;  // D contiguous bf16
  int64_t i_pos = 0;            // position among the sequence's keys
  int64_t head = 0;             // query head (sinks, ALiBi slope)
  // Tree mask (extend, speculative decoding): key j >= mask_first is visible
  // only where mask[j − mask_first] != 0; keys before mask_first are not masked.
  const uint8_t* mask = nullptr;
  int64_t mask_first = 0;
  int64_t mask_stride = 1;
};

// Floats between the rows of a Partial's O: dv rounded up to whole 64-float
// blocks (the engine's transposed O and the decode kernel both write such rows).
inline int64_t padded_dv(int64_t dv) {
  return (dv + 63) / 64 * 64;
}

// Unnormalised online-softmax state of ≤ 64 rows: running max, running sum,
// and the fp32 O accumulator [rows × ldo].
struct Partial {
  std::vector<float> mx, l, o;
  int64_t ldo = 0;
  void reset(int64_t rows, int64_t dv_padded);
};

// Visible key interval [lo, hi] (inclusive; empty when lo > hi) of a query at
// i_pos in a sequence of tk keys.
void visible_keys(const Params& p, int64_t i_pos, int64_t tk, int64_t& lo, int64_t& hi);

// V of one kv head already transposed (prefill transposes it once per call):
// Vᵀ[c][j] at base[c·ld + j − first], with zeros from column tk − first up to
// at least column tk − first + p.key_block, so a key block may run past tk
// (transposed_v_ld gives such a row length).
struct TransposedV {
  const uint16_t* base = nullptr;
  int64_t ld = 0;
  int64_t first = 0;
};
// The row length of a TransposedV of nk keys: nk rounded up to the key
// block, plus one block (a block may start at any visible key).
inline int64_t transposed_v_ld(int64_t nk, int64_t key_block) {
  return (nk + key_block - 1) / key_block * key_block + key_block;
}

// Writes Vᵀ of keys [j0, j0 + n) into out[c·ld + (j − j0)], c < dv, and
// zeros in the columns up to n rounded up to 16 (ld must leave room for them).
void transpose_v(const RowSource& v, int64_t j0, int64_t n, int64_t dv, uint16_t* out, int64_t ld);

// Runs rows (≤ kRowsPerBlock) over keys [j_begin, j_end) of a sequence of tk
// keys, accumulating into st (which must be reset by the caller). Key blocks
// no row can see are skipped without touching memory. With vt, V is read from
// that transposed copy instead of v. st.mx is the reference the weights are
// taken against: it follows the running max lazily (only when the max grows
// by more than 2⁸ in weight), so it may lie below the true max; merge and
// finish need only that l and o are relative to it.
void attend(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
            const RowSource& v, int64_t tk, int64_t j_begin, int64_t j_end, Partial& st,
            const TransposedV* vt = nullptr);

// attend() over all tk keys from an empty state, then finish() straight into
// out_rows from the engine's transposed state (no row-major Partial: the
// prefill path, where one call sees every key of its rows).
void attend_finish(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
                   const RowSource& v, int64_t tk, const TransposedV* vt,
                   const std::vector<uint16_t*>& out_rows);

// Folds partial b into a (log-sum-exp merge), row by row.
void merge(Partial& a, const Partial& b, int64_t rows, int64_t dv);

// out row r = O_r / (l_r [+ exp(sink − m_r)]) as bf16; 0 for a row that saw no key.
void finish(const Params& p, const std::vector<QueryRow>& rows, const Partial& st,
            const std::vector<uint16_t*>& out_rows);

}  // namespace tilejit::ops::attn
