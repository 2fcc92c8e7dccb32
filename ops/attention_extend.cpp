// tilejit::extend_attention (sglang's extend): new tokens of each sequence
// attend to the sequence's prefix in the paged cache and causally (or through
// a speculative-decoding tree mask) to each other. The new tokens' K/V come
// from k_new / v_new or from the cache right after the prefix.
//
// Tasks are (sequence, kv head, block of ≤ 64 rows), rows (new token, head of
// the group) position-major as in prefill, each running the block engine over
// the cached keys and then over the new keys. Without `deterministic`, few
// tasks and long prefixes split the key range (split-KV, as in decode); with
// it, every row's keys are visited in one fixed order by one task, so the
// result does not depend on the thread count.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <vector>

#include "jit/tuning_db.h"
#include "ops/attention_checks.h"
#include "ops/attention_decode_kernel.h"
#include "ops/attention_descs.h"
#include "ops/attention_engine.h"
#include "ops/attention_fp8.h"
#include "ops/attention_scalar.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/isa.h"
#include "runtime/per_thread.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"
#include "runtime/batch_invariant.h"

namespace tilejit {

using ops::shape_str;
namespace attn = ops::attn;

namespace {

void check_new_rows(const char* op, const char* arg, const TensorView& t, int64_t tokens,
                    int64_t hkv, int64_t head_dim) {
  attn::check_bf16_rows(op, arg, t, 3);
  if (t.shape != std::vector<int64_t>{tokens, hkv, head_dim})
    throw Error(fmt::format("{}: {} has shape {}; allowed: [T, Hkv, {}] = [{}, {}, {}]", op, arg,
                            shape_str(t.shape), head_dim, tokens, hkv, head_dim));
}

}  // namespace

void extend_attention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& qo_indptr,
                      const TensorView& block_table, const TensorView& prefix_lens,
                      const AttentionOptions& caller_opt, const ExtendOptions& caller_ext) {
  runtime::api_guard("extend_attention", [&] {
    // Batch-invariant mode implies the deterministic extend.
    ExtendOptions ext = caller_ext;
    ext.deterministic = ext.deterministic || runtime::batch_invariant();
    // The options as the kernels read them (bf16 sinks / slopes widened below).
    attn::HeadVectors head_vectors(caller_opt);
    const AttentionOptions& opt = head_vectors.options;
    constexpr const char* op = "extend_attention";
    const attn::PagedDims dims = attn::check_paged_attention(op, "T", q, k_cache, v_cache, out);
    const int64_t tokens = dims.rows, hq = dims.hq, d = dims.d, dv = dims.dv, hkv = dims.hkv;
    const int64_t num_blocks = dims.num_blocks, bs = dims.block_size;
    if (ext.k_new.has_value() != ext.v_new.has_value())
      throw Error(
          fmt::format("{}: k_new is {}, v_new is {}; allowed: both given or both absent "
                      "(the new K/V already in the cache)",
                      op, ext.k_new ? "given" : "absent", ext.v_new ? "given" : "absent"));
    const bool in_cache = !ext.k_new;
    if (!in_cache) {
      check_new_rows(op, "k_new", *ext.k_new, tokens, hkv, d);
      check_new_rows(op, "v_new", *ext.v_new, tokens, hkv, dv);
    }
    attn::check_options(op, opt);
    head_vectors.check_and_widen(op, hq);
    const attn::KvScales kvs =
        attn::check_kv_scales(op, "opt.kv_scales", k_cache, v_cache, opt.kv_scales, hkv);
    const auto qo = attn::read_cu_seqlens(op, "qo_indptr", qo_indptr, tokens);
    const int64_t batch = static_cast<int64_t>(qo.size()) - 1;
    ops::check_view(op, "block_table", block_table, 2);
    ops::check_dtype(op, "block_table", block_table, {DType::i32});
    ops::check_view(op, "prefix_lens", prefix_lens, 1);
    ops::check_dtype(op, "prefix_lens", prefix_lens, {DType::i32});
    if (block_table.shape[0] != batch)
      throw Error(fmt::format(
          "{}: block_table has shape {}; allowed: [B, max_blocks] with B = {} (qo_indptr)", op,
          shape_str(block_table.shape), batch));
    if (prefix_lens.shape[0] != batch)
      throw Error(fmt::format("{}: prefix_lens has shape {}; allowed: [B] = [{}] (qo_indptr)", op,
                              shape_str(prefix_lens.shape), batch));

    // The caches and the new K/V may share memory with each other and with q
    // (all are only read); out is written while every input is read.
    // Aliasing against the caller's views (bf16 sinks too, not their f32 copy).
    attn::check_attention_out(op, out, caller_opt,
                              {{"q", &q},
                               {"k_cache", &k_cache},
                               {"v_cache", &v_cache},
                               {"qo_indptr", &qo_indptr},
                               {"block_table", &block_table},
                               {"prefix_lens", &prefix_lens},
                               {"k_new", ops::opt_view(ext.k_new)},
                               {"v_new", ops::opt_view(ext.v_new)}});

    // Per sequence: prefix length, cached keys (checked against the table's
    // capacity and every block index they use, before any key is read), and
    // the offset of its n² tree-mask block.
    const int64_t max_blocks = block_table.shape[1];
    // Saturating: a table wider than any int32 length needs is not an error.
    const int64_t capacity = ops::saturating_mul(max_blocks, bs);
    const auto* prefix_p = static_cast<const int32_t*>(prefix_lens.data);
    std::vector<int64_t> prefix(static_cast<size_t>(batch)),
        mask_off(static_cast<size_t>(batch) + 1);
    std::vector<int64_t> cached_keys(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t pre = prefix_p[b * prefix_lens.strides[0]], n = qo[b + 1] - qo[b];
      if (pre < 0) throw Error(fmt::format("{}: prefix_lens[{}]={}; allowed: >= 0", op, b, pre));
      const int64_t cached = in_cache ? pre + n : pre;
      if (cached > capacity) {
        if (in_cache)
          throw Error(
              fmt::format("{}: prefix_lens[{}] + new tokens = {} + {} = {}; allowed: <= "
                          "max_blocks·block_size = {} (k_new absent: the new K/V are in the cache)",
                          op, b, pre, n, cached, capacity));
        throw Error(fmt::format("{}: prefix_lens[{}]={}; allowed: <= max_blocks·block_size = {}",
                                op, b, pre, capacity));
      }
      attn::check_block_ids(op, block_table, b, cached, bs, num_blocks);
      prefix[b] = pre;
      cached_keys[b] = cached;
      mask_off[b + 1] = mask_off[b] + n * n;
    }
    const uint8_t* mask = nullptr;
    int64_t mask_stride = 1;
    if (ext.tree_mask) {
      const TensorView& m = *ext.tree_mask;
      ops::check_view(op, "tree_mask", m, 1);
      ops::check_dtype(op, "tree_mask", m, {DType::u8});
      if (m.shape[0] != mask_off[batch])
        throw Error(fmt::format(
            "{}: tree_mask has shape {}; allowed: [Σ n_b²] = [{}] (n_b = new tokens of sequence b)",
            op, shape_str(m.shape), mask_off[batch]));
      ops::check_disjoint(op, "out", out, "tree_mask", m);
      mask = static_cast<const uint8_t*>(m.data);
      mask_stride = m.strides[0];
    }
    if (tokens == 0) return;

    attn::Params p = attn::make_params(opt, d, dv);
    // Causal among the new tokens unless the tree mask replaces that rule; the
    // prefix keys lie before every new token, so causality never hides them.
    p.causal = mask == nullptr;
    const int64_t g = hq / hkv;
    const auto* qd = static_cast<const uint16_t*>(q.data);
    auto* od = static_cast<uint16_t*>(out.data);

    // The plan, chosen before any work: the path, and on a JIT path the
    // engine's blocking, tasks and split count.
    const Isa isa = runtime::active_isa();
    int64_t longest = 0, longest_new = 0;
    for (int64_t b = 0; b < batch; ++b)
      if (qo[b + 1] > qo[b])
        longest = std::max(longest, prefix[b] + qo[b + 1] - qo[b]),
        longest_new = std::max(longest_new, qo[b + 1] - qo[b]);
    const int64_t threads = runtime::num_threads();
    // A tuning database entry for this shape class sets the blocking (as in
    // prefill) and the split count. Not under `deterministic`: an entry is per
    // thread count, and the key block and splits change the order of the sums.
    const jit::TunedEntry* tuned = nullptr;
    if (isa != Isa::scalar && !ext.deterministic && jit::tuning_db_active())
      tuned =
          jit::find_tuned("extend_attention",
                          jit::extend_shape_class(isa, static_cast<int>(threads), d, dv, hq, hkv,
                                                  bs, kvs.code, batch, longest_new, longest));
    const attn::Blocking blocking = attn::tuned_blocking(tuned);
    p.key_block = blocking.key_block;
    const int64_t block_rows = blocking.rows;

    // Sequences with one new token (an engine's decode tokens inside a mixed
    // batch) run the LLVM decode kernel where this path has it: all heads of
    // the token at once, as decode_attention does; the block engine, tiled for
    // 64-row query blocks, took 2-3x decode's time on them. The others run
    // the engine in row blocks.
    const bool decode_kernel = isa != Isa::scalar && ops::decode_attention_llvm_kernel(isa, g);
    std::vector<int64_t> singles;
    std::vector<char> is_single(static_cast<size_t>(batch), 0);
    int64_t longest_engine = 0, longest_single = 0, single_keys = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t n = qo[b + 1] - qo[b];
      if (decode_kernel && n == 1) {
        singles.push_back(b);
        is_single[b] = 1;
        longest_single = std::max(longest_single, prefix[b] + 1);
        single_keys += prefix[b] + 1;
      } else if (n > 0) {
        longest_engine = std::max(longest_engine, prefix[b] + n);
      }
    }
    using Task = attn::RowBlock;
    std::vector<Task> tasks;
    if (isa != Isa::scalar)
      for (const Task& t : attn::row_blocks(qo, g, hkv, block_rows))
        if (!is_single[t.b]) tasks.push_back(t);
    const int64_t ntasks = static_cast<int64_t>(tasks.size());
    const int64_t nsingles = static_cast<int64_t>(singles.size());
    // Key-range splits of an engine task and of a one-token sequence: the
    // rule of decode for both (the units of the two kinds share the pool),
    // with decode's long-context rule for the one-token sequences.
    int64_t splits = 1, single_splits = 1;
    if (const auto tuned_splits = tuned ? tuned->knob("splits") : std::nullopt) {
      splits = single_splits = *tuned_splits;
    } else if (isa != Isa::scalar && !ext.deterministic) {
      splits = attn::default_splits(ntasks + nsingles, threads, longest_engine);
      single_splits = attn::default_splits(ntasks + nsingles, threads, longest_single, single_keys);
    }
    namespace lb = codegen::llvm_backend;
    std::optional<lb::DecodeAttentionDesc> desc;
    if (nsingles > 0)
      desc = ops::decode_attention_desc(d, dv, g, bs, p.softcap > 0, p.slopes != nullptr, kvs.code);
    ops::log_call(op, isa, [&] {
      std::string runs = isa == Isa::scalar ? "plan=reference"
                                            : ops::attention_engine_plan(
                                                  isa, block_rows, p.key_block, ntasks, splits);
      if (desc)
        runs += fmt::format(" one_token_seqs={} kernel={} splits={}", nsingles, desc->name(),
                            single_splits);
      // The engine reads bf16 rows (attention_fp8.h); the decode kernel the codes.
      if (kvs.fp8 && ntasks > 0) runs += " copy=bf16";
      if (tuned) runs += " tuned=" + tuned->id();
      return ops::CallLine{
          fmt::format("T={} B={} Hq={} Hkv={} D={} Dv={} bs={} max_new={} max_keys={} cache={} "
                      "new_kv={} mask={}{}",
                      tokens, batch, hq, hkv, d, dv, bs, longest_new, longest,
                      dtype_name(k_cache.dtype), in_cache ? "cache" : "k_new",
                      mask ? "tree" : "causal", ext.deterministic ? " deterministic" : ""),
          std::move(runs)};
    });

    // An fp8 cache: the blocks the call reads converted exactly to bf16
    // (attention_fp8.h). The cached keys' K scale is folded into the score
    // scale of the engine's cached-key pass (pc[h]); their V scale multiplies
    // that pass's O before the new keys' pass is merged in (O is linear in V),
    // so K and V are read as code · scale exactly.
    attn::Bf16CacheCopy copy;
    if (kvs.fp8) {
      std::vector<int64_t> engine_keys = cached_keys;  // the one-token sequences read the codes
      for (int64_t b : singles) engine_keys[b] = 0;
      copy = attn::dequantize_cache(k_cache, v_cache, block_table, engine_keys);
    }
    const TensorView& kc_view = kvs.fp8 ? copy.k_cache : k_cache;
    const TensorView& vc_view = kvs.fp8 ? copy.v_cache : v_cache;
    const TensorView& bt = kvs.fp8 ? copy.block_table : block_table;
    // (pc[h].v_scale is read by the decode kernel's caller only: the engine's
    // passes leave O unscaled, the finish takes p.)
    std::vector<attn::Params> pc(static_cast<size_t>(hkv));  // p's key block too
    for (int64_t h = 0; h < hkv; ++h) pc[h] = attn::head_params(p, kvs, h);
    auto cache_source = [&](bool is_v, int64_t b, int64_t h) {
      return attn::paged_rows(is_v ? vc_view : kc_view, bt, b, h);
    };
    // New token i of sequence b is key prefix[b] + i.
    auto new_source = [&](const TensorView& t, int64_t b, int64_t h) {
      attn::RowSource s;
      s.base = static_cast<const uint16_t*>(t.data) + qo[b] * t.strides[0] + h * t.strides[1];
      s.row_stride = t.strides[0];
      s.first = prefix[b];
      return s;
    };
    auto query_row = [&](int64_t b, int64_t i, int64_t head) {
      attn::QueryRow r{qd + (qo[b] + i) * q.strides[0] + head * q.strides[1], prefix[b] + i, head};
      if (mask) {
        r.mask = mask + (mask_off[b] + i * (qo[b + 1] - qo[b])) * mask_stride;
        r.mask_first = prefix[b];
        r.mask_stride = mask_stride;
      }
      return r;
    };
    auto keys_of = [&](int64_t b) { return prefix[b] + qo[b + 1] - qo[b]; };
    // Keys [0, cached_end) come from the cache, the rest from k_new / v_new.
    auto cached_end = [&](int64_t b) { return in_cache ? keys_of(b) : prefix[b]; };

    // Output rows of sequence b holding a NaN or an Inf, recomputed by the
    // reference (the NaN/Inf rule of ops/attention_scalar.h).
    auto repair = [&](int64_t b, const std::vector<attn::QueryRow>& qr,
                      const std::vector<uint16_t*>& orows) {
      attn::repair_nonfinite(orows, dv, [&](size_t r) {
        const int64_t h = qr[r].head / g, split = cached_end(b);
        const attn::RowSource kc = cache_source(false, b, h), vc = cache_source(true, b, h);
        attn::RowSource kn, vn;
        if (!in_cache) kn = new_source(*ext.k_new, b, h), vn = new_source(*ext.v_new, b, h);
        // A one-token sequence over an fp8 cache has no bf16 copy: its codes,
        // a row at a time.
        const bool codes = kvs.fp8 && is_single[b];
        std::vector<uint16_t> kb, vb;
        auto cached_row = [&](bool is_v, int64_t j) {
          if (codes)
            return attn::fp8_row(is_v ? v_cache : k_cache, block_table, b, h, j, is_v ? vb : kb);
          return is_v ? vc.row(j) : kc.row(j);
        };
        attn::scalar_row(
            p, qr[r], keys_of(b),
            [&](int64_t j) { return j < split ? cached_row(false, j) : kn.row(j); },
            [&](int64_t j) { return j < split ? cached_row(true, j) : vn.row(j); }, orows[r],
            [&](int64_t j) { return j < split ? double(kvs.k[h]) : 1.0; },
            [&](int64_t j) { return j < split ? double(kvs.v[h]) : 1.0; });
      });
    };

    if (isa == Isa::scalar) {
      runtime::parallel_for(tokens * hq, [&](int64_t t) {
        const int64_t tok = t / hq, head = t % hq;
        const int64_t b = std::upper_bound(qo.begin(), qo.end(), tok) - qo.begin() - 1;
        const int64_t h = head / g;
        const attn::RowSource kc = cache_source(false, b, h), vc = cache_source(true, b, h);
        attn::RowSource kn, vn;
        if (!in_cache) kn = new_source(*ext.k_new, b, h), vn = new_source(*ext.v_new, b, h);
        const int64_t split = cached_end(b);
        attn::scalar_row(
            p, query_row(b, tok - qo[b], head), keys_of(b),
            [&](int64_t j) { return j < split ? kc.row(j) : kn.row(j); },
            [&](int64_t j) { return j < split ? vc.row(j) : vn.row(j); },
            od + tok * out.strides[0] + head * out.strides[1],
            [&](int64_t j) { return j < split ? double(kvs.k[h]) : 1.0; },
            [&](int64_t j) { return j < split ? double(kvs.v[h]) : 1.0; });
      });
      return;
    }

    const int64_t dv_padded = attn::padded_dv(dv);

    auto rows_of = [&](const Task& task, std::vector<attn::QueryRow>& qr,
                       std::vector<uint16_t*>& orows) {
      const int64_t n = qo[task.b + 1] - qo[task.b];
      const int64_t rows = std::min(block_rows, n * g - task.r0);
      qr.resize(static_cast<size_t>(rows));
      orows.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = (task.r0 + r) / g, head = task.h * g + (task.r0 + r) % g;
        qr[r] = query_row(task.b, i, head);
        orows[r] = od + (qo[task.b] + i) * out.strides[0] + head * out.strides[1];
      }
    };
    // Keys [j0, j1) of a task: the cached part, then the new part (fixed order).
    auto run = [&](const Task& task, const std::vector<attn::QueryRow>& qr, int64_t j0, int64_t j1,
                   attn::Partial& st) {
      const int64_t b = task.b, h = task.h, tk = keys_of(b), split = cached_end(b);
      const int64_t rows = static_cast<int64_t>(qr.size());
      if (j0 < split) {
        attn::attend(isa, pc[h], qr, cache_source(false, b, h), cache_source(true, b, h), tk, j0,
                     std::min(j1, split), st);
        // st holds only the cached keys (the callers reset it): O in V's scale.
        if (kvs.fp8 && kvs.v[h] != 1.0f)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < dv; ++c) st.o[r * st.ldo + c] *= kvs.v[h];
      }
      if (!in_cache && j1 > split) {
        if (!kvs.fp8 || j0 >= split) {
          attn::attend(isa, p, qr, new_source(*ext.k_new, b, h), new_source(*ext.v_new, b, h), tk,
                       std::max(j0, split), j1, st);
        } else {  // fp8: the new keys in a state of their own, merged in
          attn::Partial& fresh = runtime::per_thread<attn::Partial>([] {});
          fresh.reset(rows, st.ldo);
          attn::attend(isa, p, qr, new_source(*ext.k_new, b, h), new_source(*ext.v_new, b, h), tk,
                       split, j1, fresh);
          attn::merge(st, fresh, rows, dv);
        }
      }
    };

    // The one-token sequences: the decode kernel over the cached keys the
    // token sees, then (k_new given) its own key folded in as a one-key state.
    std::optional<attn::DecodeKernel> kernel;
    if (desc) kernel.emplace(*desc, p, pc, kvs.fp8, q, k_cache, v_cache, block_table);
    auto single_rows = [&](int64_t b, std::vector<attn::QueryRow>& qr,
                           std::vector<uint16_t*>& orows) {
      qr.resize(static_cast<size_t>(hq));
      orows.resize(static_cast<size_t>(hq));
      for (int64_t head = 0; head < hq; ++head) {
        qr[head] = query_row(b, 0, head);
        orows[head] = od + qo[b] * out.strides[0] + head * out.strides[1];
      }
    };
    auto run_single = [&](int64_t b, int64_t j0, int64_t j1, attn::Partial& st) {
      const int64_t pre = prefix[b], tk = pre + 1;
      // The token sees itself unless its 1×1 tree mask says no (windows and
      // causality always leave a query its own position).
      const bool self = mask == nullptr || mask[mask_off[b] * mask_stride] != 0;
      kernel->run(b, qo[b], pre, tk, j0, std::min(j1, in_cache && self ? tk : pre), st);
      if (in_cache || !self || j0 > pre || j1 <= pre) return;
      // Its own key from k_new / v_new: score s (softcap; ALiBi adds 0 at
      // distance 0), weight 1 against a max of s, O = v.
      attn::Partial& own = runtime::per_thread<attn::Partial>([] {});
      own.reset(hq, st.ldo);
      for (int64_t head = 0; head < hq; ++head) {
        const int64_t h = head / g;
        const uint16_t* qrow = qd + qo[b] * q.strides[0] + head * q.strides[1];
        const auto* krow = static_cast<const uint16_t*>(ext.k_new->data) +
                           qo[b] * ext.k_new->strides[0] + h * ext.k_new->strides[1];
        const auto* vrow = static_cast<const uint16_t*>(ext.v_new->data) +
                           qo[b] * ext.v_new->strides[0] + h * ext.v_new->strides[1];
        float dot = 0;
        for (int64_t c = 0; c < d; ++c)
          dot += runtime::bf16_to_f32(qrow[c]) * runtime::bf16_to_f32(krow[c]);
        float x = dot * p.scale;
        if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
        own.mx[head] = x;
        own.l[head] = 1;
        float* o = own.o.data() + head * own.ldo;
        for (int64_t c = 0; c < dv; ++c) o[c] = runtime::bf16_to_f32(vrow[c]);
      }
      attn::merge(st, own, hq, dv);
    };

    // Units: the engine tasks, then the one-token sequences; each split into
    // key-range chunks (units of both kinds share one parallel loop).
    auto unit_rows = [&](int64_t u, std::vector<attn::QueryRow>& qr,
                         std::vector<uint16_t*>& orows) {
      if (u < ntasks) {
        rows_of(tasks[u], qr, orows);
        return tasks[u].b;
      }
      const int64_t b = singles[u - ntasks];
      single_rows(b, qr, orows);
      return b;
    };
    // Keys [j0, j1) of unit u into st, reset here.
    auto unit_run = [&](int64_t u, const std::vector<attn::QueryRow>& qr, int64_t j0, int64_t j1,
                        attn::Partial& st) {
      if (u >= ntasks) return run_single(singles[u - ntasks], j0, j1, st);
      st.reset(static_cast<int64_t>(qr.size()), dv_padded);
      run(tasks[u], qr, j0, j1, st);
    };
    const int64_t units = ntasks + nsingles;

    if (splits == 1 && single_splits == 1) {
      runtime::parallel_for(units, [&](int64_t u) {
        std::vector<attn::QueryRow> qr;
        std::vector<uint16_t*> orows;
        const int64_t b = unit_rows(u, qr, orows);
        attn::Partial& st = runtime::per_thread<attn::Partial>([] {});
        unit_run(u, qr, 0, keys_of(b), st);
        attn::finish(p, qr, st, orows);
        repair(b, qr, orows);
      });
      return;
    }

    // Split-KV: chunk s of a unit covers keys [s·chunk, (s+1)·chunk), chunk a
    // multiple of the engine's key block (of the decode kernel's 16-key chunk
    // for a one-token sequence, so that only a range's ends are masked), then
    // a log-sum-exp merge per unit.
    auto unit_splits = [&](int64_t u) { return u < ntasks ? splits : single_splits; };
    const int64_t engine_items = ntasks * splits;
    const int64_t items = engine_items + nsingles * single_splits;
    auto first_item = [&](int64_t u) {
      return u < ntasks ? u * splits : engine_items + (u - ntasks) * single_splits;
    };
    std::vector<attn::Partial> parts(static_cast<size_t>(items));
    runtime::parallel_for(items, [&](int64_t t) {
      const int64_t u = t < engine_items ? t / splits : ntasks + (t - engine_items) / single_splits;
      const int64_t s = t - first_item(u), n = unit_splits(u);
      std::vector<attn::QueryRow> qr;
      std::vector<uint16_t*> orows;
      const int64_t tk = keys_of(unit_rows(u, qr, orows));
      const attn::KeyRange r =
          attn::split_range(tk, n, s, u < ntasks ? p.key_block : lb::kDecodeChunkKeys);
      unit_run(u, qr, r.j0, r.j1, parts[t]);
    });
    runtime::parallel_for(units, [&](int64_t u) {
      std::vector<attn::QueryRow> qr;
      std::vector<uint16_t*> orows;
      const int64_t b = unit_rows(u, qr, orows);
      attn::Partial& acc = parts[first_item(u)];
      for (int64_t s = 1; s < unit_splits(u); ++s)
        attn::merge(acc, parts[first_item(u) + s], static_cast<int64_t>(qr.size()), dv);
      attn::finish(p, qr, acc, orows);
      repair(b, qr, orows);
    });
  });
}

}  // namespace tilejit
