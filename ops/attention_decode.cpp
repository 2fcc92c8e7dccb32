// tilejit::decode_attention: one new token per sequence over a paged KV cache.
// Tasks are (sequence, kv head, block of ≤ 64 heads of the group); when those
// are too few to fill the pool and sequences are long, each sequence's key
// range is split into chunks whose (max, sum, O) partials are merged with a
// log-sum-exp merge (split-KV, "flash decoding").
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <vector>

#include "jit/registry.h"
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
#include "runtime/lazy_statics.h"
#include "runtime/per_thread.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

#include "runtime/api_guard.h"
#include "runtime/batch_invariant.h"

namespace tilejit {

using ops::shape_str;
namespace attn = ops::attn;

namespace {

// The split count of attn::default_splits for these sequences.
int64_t split_count(int64_t base_tasks, const std::vector<int64_t>& lens) {
  return attn::default_splits(base_tasks, runtime::num_threads(),
                              *std::max_element(lens.begin(), lens.end()),
                              std::accumulate(lens.begin(), lens.end(), int64_t{0}));
}

}  // namespace

namespace ops {
namespace {
const bool g_fork_hook =
    runtime::on_fork_complete([] { (void)attn::fp8_bf16_table(DType::f8e4m3); });
}  // namespace

codegen::llvm_backend::DecodeAttentionDesc decode_attention_desc(int64_t d, int64_t dv, int64_t g,
                                                                 int64_t block_size, bool softcap,
                                                                 bool alibi, DType kv) {
  return {.d = d,
          .dv = dv,
          .g = g,
          .block_size = block_size,
          .ldo = attn::padded_dv(dv),
          .softcap = softcap,
          .alibi = alibi,
          .kv = kv};
}

bool decode_attention_llvm_kernel(Isa isa, int64_t g) {
  return isa != Isa::scalar && jit::family_built(jit::Family::decode_attention) &&
         g <= codegen::llvm_backend::DecodeAttentionDesc::kMaxG;
}

std::string attention_engine_plan(Isa isa, int64_t rows, int64_t key_block, int64_t tasks,
                                  int64_t splits) {
  return fmt::format(
      "plan=attention_engine kernels=brgemm_{} glue={} rows={} key_block={} tasks={} splits={}",
      isa_name(isa), jit::family_built(jit::Family::softmax_step) ? "llvm" : "c++", rows, key_block,
      tasks, splits);
}

}  // namespace ops

void decode_attention(const TensorView& q, const TensorView& k_cache, const TensorView& v_cache,
                      const TensorView& out, const TensorView& block_table,
                      const TensorView& seq_lens, const AttentionOptions& caller_opt,
                      const DecodeOptions& caller_dec) {
  runtime::api_guard("decode_attention", [&] {
    // Batch-invariant mode implies the deterministic decode.
    DecodeOptions dec = caller_dec;
    dec.deterministic = dec.deterministic || runtime::batch_invariant();
    // The options as the kernels read them (bf16 sinks / slopes widened below).
    attn::HeadVectors head_vectors(caller_opt);
    const AttentionOptions& opt = head_vectors.options;
    constexpr const char* op = "decode_attention";
    const attn::PagedDims dims = attn::check_paged_attention(op, "B", q, k_cache, v_cache, out);
    const int64_t batch = dims.rows, hq = dims.hq, d = dims.d, dv = dims.dv, hkv = dims.hkv;
    const int64_t num_blocks = dims.num_blocks, bs = dims.block_size;
    ops::check_view(op, "block_table", block_table, 2);
    ops::check_dtype(op, "block_table", block_table, {DType::i32});
    ops::check_view(op, "seq_lens", seq_lens, 1);
    ops::check_dtype(op, "seq_lens", seq_lens, {DType::i32});
    if (block_table.shape[0] != batch)
      throw Error(fmt::format("{}: block_table has shape {}; allowed: [B, max_blocks] with B = {}",
                              op, shape_str(block_table.shape), batch));
    if (seq_lens.shape[0] != batch)
      throw Error(fmt::format("{}: seq_lens has shape {}; allowed: [B] = [{}]", op,
                              shape_str(seq_lens.shape), batch));
    attn::check_options(op, opt);
    head_vectors.check_and_widen(op, hq);
    const attn::KvScales kvs =
        attn::check_kv_scales(op, "opt.kv_scales", k_cache, v_cache, opt.kv_scales, hkv);

    // k_cache and v_cache may share memory (MLA reads V as the first Dv
    // columns of the K cache); out is written while every input is read.
    // Aliasing against the caller's views (bf16 sinks too, not their f32 copy).
    attn::check_attention_out(op, out, caller_opt,
                              {{"q", &q},
                               {"k_cache", &k_cache},
                               {"v_cache", &v_cache},
                               {"block_table", &block_table},
                               {"seq_lens", &seq_lens}});

    // Every block index a sequence uses is checked before any key is read.
    const int64_t max_blocks = block_table.shape[1];
    // Saturating: a table wider than any int32 length needs is not an error.
    const int64_t capacity = ops::saturating_mul(max_blocks, bs);
    const auto* lens_p = static_cast<const int32_t*>(seq_lens.data);
    std::vector<int64_t> lens(static_cast<size_t>(batch));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens_p[b * seq_lens.strides[0]];
      if (len < 1 || len > capacity)
        throw Error(fmt::format("{}: seq_lens[{}]={}; allowed: 1 .. max_blocks·block_size = {}", op,
                                b, len, capacity));
      attn::check_block_ids(op, block_table, b, len, bs, num_blocks);
      lens[b] = len;
    }
    if (batch == 0) return;

    const attn::Params p = attn::make_params(opt, d, dv);
    // Per kv head: p with an fp8 cache's scales folded in (p itself for bf16).
    std::vector<attn::Params> ph(static_cast<size_t>(hkv));
    for (int64_t h = 0; h < hkv; ++h) ph[h] = attn::head_params(p, kvs, h);
    const int64_t g = hq / hkv;
    const auto* qd = static_cast<const uint16_t*>(q.data);
    auto* od = static_cast<uint16_t*>(out.data);
    const Isa isa = runtime::active_isa();
    const bool llvm_kernel = ops::decode_attention_llvm_kernel(isa, g);
    // A tuning database entry for this shape class sets the split count (the
    // task split only: the same kernels run, the partials merge as always)
    // and the LLVM kernel's prefetch distance (no arithmetic changes).
    const int64_t longest = *std::max_element(lens.begin(), lens.end());
    const jit::TunedEntry* tuned = nullptr;
    if (isa != Isa::scalar && jit::tuning_db_active())
      tuned = jit::find_tuned("decode_attention",
                              jit::decode_shape_class(isa, runtime::num_threads(), d, dv, hq, hkv,
                                                      bs, kvs.code, batch, longest));
    // Deterministic: one task per sequence, a tuned split count ignored (the
    // prefetch distance is kept: it changes no arithmetic).
    const std::optional<int64_t> tuned_splits =
        tuned && !dec.deterministic ? tuned->knob("splits") : std::nullopt;

    // The LLVM kernel's tasks are sequences (all heads at once); the engine's
    // are (sequence, kv head, block of <= 64 heads of the group).
    namespace lb = codegen::llvm_backend;
    std::optional<lb::DecodeAttentionDesc> desc;
    if (llvm_kernel) {
      desc = ops::decode_attention_desc(d, dv, g, bs, p.softcap > 0, p.slopes != nullptr, kvs.code);
      if (tuned)
        if (const auto pf = tuned->knob("prefetch_chunks")) desc->prefetch_chunks = *pf;
    }
    const int64_t row_blocks = (g + attn::kRowsPerBlock - 1) / attn::kRowsPerBlock;
    const int64_t base_tasks = llvm_kernel ? batch : batch * hkv * row_blocks;
    const int64_t splits = isa == Isa::scalar || dec.deterministic
                               ? 1
                               : tuned_splits.value_or(split_count(base_tasks, lens));
    // An fp8 cache on the paths that read bf16 rows: the blocks the call reads,
    // converted exactly (attention_fp8.h); the LLVM kernel reads the codes.
    const bool copied = kvs.fp8 && !llvm_kernel;
    ops::log_call(op, isa, [&] {
      std::string runs =
          isa == Isa::scalar ? "plan=reference"
          : desc ? fmt::format("kernel={} tasks={} splits={}", desc->name(), base_tasks, splits)
                 : ops::attention_engine_plan(isa, std::min(attn::kRowsPerBlock, g), p.key_block,
                                              base_tasks, splits);
      if (copied) runs += " copy=bf16";
      if (dec.deterministic) runs += " deterministic";
      if (tuned) runs += " tuned=" + tuned->id();
      return ops::CallLine{
          fmt::format("B={} Hq={} Hkv={} D={} Dv={} bs={} max_len={} cache={}", batch, hq, hkv, d,
                      dv, bs, longest, dtype_name(k_cache.dtype)),
          std::move(runs)};
    });
    attn::Bf16CacheCopy copy;
    if (copied) copy = attn::dequantize_cache(k_cache, v_cache, block_table, lens);
    const TensorView& kc = copied ? copy.k_cache : k_cache;
    const TensorView& vc = copied ? copy.v_cache : v_cache;
    const TensorView& bt = copied ? copy.block_table : block_table;
    auto source = [&](const TensorView& c, int64_t b, int64_t h) {
      return attn::paged_rows(c, bt, b, h);
    };

    // Output rows of sequence b holding a NaN or an Inf, recomputed by the
    // reference (the NaN/Inf rule of ops/attention_scalar.h).
    auto repair = [&](int64_t b, const std::vector<attn::QueryRow>& qr,
                      const std::vector<uint16_t*>& orows) {
      attn::repair_nonfinite(orows, dv, [&](size_t r) {
        const int64_t h = qr[r].head / g;
        if (kvs.fp8 && !copied) {  // the codes in place, a row at a time
          std::vector<uint16_t> kb, vb;
          attn::scalar_row(
              ph[h], qr[r], lens[b],
              [&](int64_t j) { return attn::fp8_row(k_cache, block_table, b, h, j, kb); },
              [&](int64_t j) { return attn::fp8_row(v_cache, block_table, b, h, j, vb); },
              orows[r]);
          return;
        }
        const attn::RowSource ks = source(kc, b, h);
        const attn::RowSource vs = source(vc, b, h);
        attn::scalar_row(
            ph[h], qr[r], lens[b], [&](int64_t j) { return ks.row(j); },
            [&](int64_t j) { return vs.row(j); }, orows[r]);
      });
    };

    if (isa == Isa::scalar) {
      runtime::parallel_for(batch * hq, [&](int64_t t) {
        const int64_t b = t / hq, h = t % hq;
        attn::scalar_head(ph[h / g], h, 1, lens[b], qd + b * q.strides[0] + h * q.strides[1], 0,
                          source(kc, b, h / g), source(vc, b, h / g),
                          od + b * out.strides[0] + h * out.strides[1], 0);
      });
      return;
    }

    const int64_t dv_padded = attn::padded_dv(dv);
    if (llvm_kernel) {
      // The LLVM kernel: tasks are sequences × splits, all heads at once, so
      // each 16-key chunk reads whole cache rows (every head) instead of
      // 256-byte pieces of them.
      const attn::DecodeKernel kernel(*desc, p, ph, kvs.fp8, q, k_cache, v_cache, block_table);
      auto rows_of = [&](int64_t task, std::vector<attn::QueryRow>& qr,
                         std::vector<uint16_t*>& orows) {
        const int64_t b = task;
        qr.resize(static_cast<size_t>(hq));
        orows.resize(static_cast<size_t>(hq));
        for (int64_t head = 0; head < hq; ++head) {
          qr[head] = {qd + b * q.strides[0] + head * q.strides[1], lens[b] - 1, head};
          orows[head] = od + b * out.strides[0] + head * out.strides[1];
        }
      };
      // Keys [j0, j1) of sequence `task` folded into st (reset by the kernel).
      auto run = [&](int64_t task, int64_t j0, int64_t j1, const std::vector<attn::QueryRow>&,
                     attn::Partial& st) {
        kernel.run(task, task, lens[task] - 1, lens[task], j0, j1, st);
      };
      if (splits == 1) {
        runtime::parallel_for(base_tasks, [&](int64_t t) {
          std::vector<attn::QueryRow> qr;
          std::vector<uint16_t*> orows;
          rows_of(t, qr, orows);
          attn::Partial& st = runtime::per_thread<attn::Partial>([] {});
          run(t, 0, lens[t], qr, st);
          attn::finish(p, qr, st, orows);
          repair(t, qr, orows);
        });
        return;
      }
      std::vector<attn::Partial> parts(static_cast<size_t>(base_tasks * splits));
      runtime::parallel_for(base_tasks * splits, [&](int64_t t) {
        const int64_t task = t / splits, s = t % splits, len = lens[task];
        std::vector<attn::QueryRow> qr;
        std::vector<uint16_t*> orows;
        rows_of(task, qr, orows);
        // Chunks a multiple of 16 keys: the kernel walks 16-key chunks aligned to
        // key 0, so a split boundary never cuts one of them in two (only a
        // range's first and last chunk take the masked code), and with block
        // sizes that are multiples of 16 never splits a cache block's run.
        const attn::KeyRange r = attn::split_range(len, splits, s, lb::kDecodeChunkKeys);
        run(task, r.j0, r.j1, qr, parts[t]);
      });
      runtime::parallel_for(base_tasks, [&](int64_t task) {
        std::vector<attn::QueryRow> qr;
        std::vector<uint16_t*> orows;
        rows_of(task, qr, orows);
        attn::Partial& acc = parts[task * splits];
        for (int64_t s = 1; s < splits; ++s) attn::merge(acc, parts[task * splits + s], hq, dv);
        attn::finish(p, qr, acc, orows);
        repair(task, qr, orows);
      });
      return;
    }

    // Without LLVM: the brgemm engine, in blocks of ≤ 64 rows.
    static std::once_flag logged;
    runtime::log_fallback_once(logged,
                               "decode_attention: no LLVM decode kernel in this build: the brgemm "
                               "attention engine");

    auto rows_of = [&](int64_t task, std::vector<attn::QueryRow>& qr,
                       std::vector<uint16_t*>& orows) {
      const int64_t b = task / (hkv * row_blocks), h = task / row_blocks % hkv;
      const int64_t r0 = task % row_blocks * attn::kRowsPerBlock;
      const int64_t rows = std::min(attn::kRowsPerBlock, g - r0);
      qr.resize(static_cast<size_t>(rows));
      orows.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t head = h * g + r0 + r;
        qr[r] = {qd + b * q.strides[0] + head * q.strides[1], lens[b] - 1, head};
        orows[r] = od + b * out.strides[0] + head * out.strides[1];
      }
      return std::make_pair(b, h);
    };

    if (splits == 1) {
      runtime::parallel_for(base_tasks, [&](int64_t t) {
        std::vector<attn::QueryRow> qr;
        std::vector<uint16_t*> orows;
        const auto [b, h] = rows_of(t, qr, orows);
        attn::Partial& st = runtime::per_thread<attn::Partial>([] {});
        st.reset(static_cast<int64_t>(qr.size()), dv_padded);
        attn::attend(isa, ph[h], qr, source(kc, b, h), source(vc, b, h), lens[b], 0, lens[b], st);
        attn::finish(ph[h], qr, st, orows);
        repair(b, qr, orows);
      });
      return;
    }

    // Split-KV: chunk s of a sequence covers keys [s·chunk, (s+1)·chunk), chunk a
    // multiple of the key block so splits fall on block boundaries.
    std::vector<attn::Partial> parts(static_cast<size_t>(base_tasks * splits));
    runtime::parallel_for(base_tasks * splits, [&](int64_t t) {
      const int64_t task = t / splits, s = t % splits;
      std::vector<attn::QueryRow> qr;
      std::vector<uint16_t*> orows;
      const auto [b, h] = rows_of(task, qr, orows);
      attn::Partial& st = parts[t];
      st.reset(static_cast<int64_t>(qr.size()), dv_padded);
      const attn::KeyRange r = attn::split_range(lens[b], splits, s, p.key_block);
      attn::attend(isa, ph[h], qr, source(kc, b, h), source(vc, b, h), lens[b], r.j0, r.j1, st);
    });
    runtime::parallel_for(base_tasks, [&](int64_t task) {
      std::vector<attn::QueryRow> qr;
      std::vector<uint16_t*> orows;
      const auto [b, h] = rows_of(task, qr, orows);
      attn::Partial& acc = parts[task * splits];
      for (int64_t s = 1; s < splits; ++s)
        attn::merge(acc, parts[task * splits + s], static_cast<int64_t>(qr.size()), dv);
      attn::finish(ph[h], qr, acc, orows);
      repair(b, qr, orows);
    });
  });
}

}  // namespace tilejit
