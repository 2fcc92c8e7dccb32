// tilejit::flash_attn_varlen: checks, then tasks of (sequence, kv head, block
// of ≤ 64 query rows) on the thread pool, each running the block engine.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "jit/tuning_db.h"
#include "ops/attention_checks.h"
#include "ops/attention_descs.h"
#include "ops/attention_engine.h"
#include "ops/attention_scalar.h"
#include "ops/tensor_checks.h"
#include "ops/verbose_log.h"
#include "runtime/aligned_buffer.h"
#include "runtime/isa.h"
#include "runtime/per_thread.h"
#include "runtime/scratch_limits.h"
#include "runtime/thread_pool.h"

#include "runtime/api_guard.h"

namespace tilejit {

using ops::shape_str;
namespace attn = ops::attn;

void flash_attn_varlen(const TensorView& q, const TensorView& k, const TensorView& v,
                       const TensorView& out, const TensorView& cu_seqlens_q,
                       const TensorView& cu_seqlens_k, const AttentionOptions& caller_opt) {
  runtime::api_guard("flash_attn_varlen", [&] {
    // The options as the kernels read them (bf16 sinks / slopes widened below).
    attn::HeadVectors head_vectors(caller_opt);
    const AttentionOptions& opt = head_vectors.options;
    constexpr const char* op = "flash_attn_varlen";
    attn::check_bf16_rows(op, "q", q, 3);
    attn::check_bf16_rows(op, "k", k, 3);
    attn::check_bf16_rows(op, "v", v, 3);
    attn::check_bf16_rows(op, "out", out, 3);
    const int64_t tq = q.shape[0], hq = q.shape[1], d = q.shape[2];
    const int64_t tk = k.shape[0], hkv = k.shape[1], dv = v.shape[2];
    attn::check_head_dim(op, "D (q.shape[2])", d);
    attn::check_head_dim(op, "Dv (v.shape[2])", dv);
    attn::check_head_counts(op, hq, "q", hkv, "k");
    if (k.shape[2] != d)
      throw Error(fmt::format("{}: k has shape {}; allowed: [Tk, Hkv, D] with D = {} (q)", op,
                              shape_str(k.shape), d));
    if (v.shape[0] != tk || v.shape[1] != hkv)
      throw Error(fmt::format("{}: v has shape {}; allowed: [Tk, Hkv, Dv] = [{}, {}, Dv]", op,
                              shape_str(v.shape), tk, hkv));
    if (out.shape != std::vector<int64_t>{tq, hq, dv})
      throw Error(fmt::format("{}: out has shape {}; allowed: [Tq, Hq, Dv] = [{}, {}, {}]", op,
                              shape_str(out.shape), tq, hq, dv));
    attn::check_options(op, opt);
    const KvCacheScales& kvs = opt.kv_scales;
    if (kvs.k_scale != 1 || kvs.v_scale != 1 || kvs.k_head_scales || kvs.v_head_scales)
      throw Error(
          fmt::format("{}: opt.kv_scales set (k_scale={}, v_scale={}{}); allowed: the "
                      "defaults (KV-cache scales apply to decode / extend over an f8e4m3 "
                      "cache)",
                      op, kvs.k_scale, kvs.v_scale,
                      kvs.k_head_scales || kvs.v_head_scales ? ", head scales" : ""));
    head_vectors.check_and_widen(op, hq);
    const auto cq = attn::read_cu_seqlens(op, "cu_seqlens_q", cu_seqlens_q, tq);
    const auto ck = attn::read_cu_seqlens(op, "cu_seqlens_k", cu_seqlens_k, tk);
    if (cq.size() != ck.size())
      throw Error(
          fmt::format("{}: cu_seqlens_q has {} entries, cu_seqlens_k {}; allowed: the same "
                      "B+1",
                      op, cq.size(), ck.size()));
    const int64_t batch = static_cast<int64_t>(cq.size()) - 1;
    for (int64_t b = 0; b < batch; ++b)
      if (cq[b + 1] - cq[b] > ck[b + 1] - ck[b])
        throw Error(
            fmt::format("{}: sequence {} has {} queries and {} keys; allowed: queries <= "
                        "keys (queries are the last positions, bottom-right aligned)",
                        op, b, cq[b + 1] - cq[b], ck[b + 1] - ck[b]));

    // q, k and v may share memory (views of one fused qkv tensor); out is
    // written while they are read.
    // Aliasing against the caller's views (bf16 sinks too, not their f32 copy).
    attn::check_attention_out(op, out, caller_opt,
                              {{"q", &q},
                               {"k", &k},
                               {"v", &v},
                               {"cu_seqlens_q", &cu_seqlens_q},
                               {"cu_seqlens_k", &cu_seqlens_k}});
    // No query rows: nothing to write, and q / out may be null (empty views'
    // pointers are not checked), so no row address may be formed from them.
    if (tq == 0) return;
    attn::Params p = attn::make_params(opt, d, dv);
    const int64_t g = hq / hkv;
    const auto* qd = static_cast<const uint16_t*>(q.data);
    const auto* kd = static_cast<const uint16_t*>(k.data);
    const auto* vd = static_cast<const uint16_t*>(v.data);
    auto* od = static_cast<uint16_t*>(out.data);
    auto sources = [&](int64_t b, int64_t h) {
      attn::RowSource ks{kd + ck[b] * k.strides[0] + h * k.strides[1], k.strides[0]};
      attn::RowSource vs{vd + ck[b] * v.strides[0] + h * v.strides[1], v.strides[0]};
      return std::make_pair(ks, vs);
    };

    const Isa isa = runtime::active_isa();
    // The TILEJIT_VERBOSE line: these shapes, then what runs.
    int64_t longest = 0;
    for (int64_t b = 0; b < batch; ++b) longest = std::max(longest, ck[b + 1] - ck[b]);
    auto log_call = [&](auto&& runs) {
      ops::log_call(op, isa, [&] {
        return ops::CallLine{
            fmt::format("Tq={} Tk={} B={} Hq={} Hkv={} D={} Dv={} max_keys={} causal={}", tq, tk,
                        batch, hq, hkv, d, dv, longest, opt.causal ? 1 : 0),
            runs()};
      });
    };
    if (isa == Isa::scalar) {
      log_call([] { return std::string("plan=reference"); });
      runtime::parallel_for(batch * hq, [&](int64_t t) {
        const int64_t b = t / hq, h = t % hq;
        const auto [ks, vs] = sources(b, h / g);
        attn::scalar_head(p, h, cq[b + 1] - cq[b], ck[b + 1] - ck[b],
                          qd + cq[b] * q.strides[0] + h * q.strides[1], q.strides[0], ks, vs,
                          od + cq[b] * out.strides[0] + h * out.strides[1], out.strides[0]);
      });
      return;
    }

    // A tuning database entry for this shape class sets the blocking: rows per
    // task (the task split only: each row's arithmetic is the same) and the
    // key block (the online softmax's steps: sums in another order).
    const jit::TunedEntry* tuned = nullptr;
    if (jit::tuning_db_active())
      tuned = jit::find_tuned("prefill_attention",
                              jit::prefill_shape_class(isa, runtime::num_threads(), d, dv, hq, hkv,
                                                       opt.causal, batch, longest));
    const attn::Blocking blocking = attn::tuned_blocking(tuned);
    p.key_block = blocking.key_block;
    const int64_t block_rows = blocking.rows;

    using Task = attn::RowBlock;
    std::vector<Task> tasks = attn::row_blocks(cq, g, hkv, block_rows);
    // Every task sees all its keys: no split-KV in prefill.
    log_call([&] {
      return ops::attention_engine_plan(isa, block_rows, p.key_block,
                                        static_cast<int64_t>(tasks.size()), 1) +
             (tuned ? " tuned=" + tuned->id() : "");
    });
    // Longer sequences first (they cost the most); within a sequence, one kv
    // head after the other, so a thread's consecutive tasks reuse that head's K
    // and Vᵀ from its L2 (interleaving the heads sent every K/V read to L3:
    // 5% slower at T = 2048); causal blocks late in the sequence first.
    if (opt.causal) {
      auto cost = [&](int64_t b) { return (ck[b + 1] - ck[b]) * (cq[b + 1] - cq[b]); };
      std::stable_sort(tasks.begin(), tasks.end(), [&](const Task& x, const Task& y) {
        if (x.b != y.b) return cost(x.b) > cost(y.b) || (cost(x.b) == cost(y.b) && x.b < y.b);
        if (x.h != y.h) return x.h < y.h;
        return x.r0 > y.r0;
      });
    }
    // Per (sequence, kv head), once for every query block of the sequence:
    //  - Vᵀ [Dv][ld]: the P·V GEMM reads Vᵀ rows as its A operand. Columns are
    //    zero-padded up to a multiple of the key block plus one block (a block
    //    may start at any visible key and run key_block keys).
    //  - K [nk][D] contiguous: the score GEMM's A rows, 256 bytes apart instead
    //    of Hkv·D·2 (one 4 KiB page per two keys at Hkv = 8, D = 128, so each key
    //    block of K missed the L1 TLB 64 times): +2-3% for one copy of K.
    // Both live in one buffer (huge pages when ≥ 2 MiB) kept per calling thread
    // and reused across calls, unless it grew past runtime::kScratchKeepBytes.
    // Only for a (sequence, kv head) whose rows take more than one task: the
    // copies pay off by being read again. A short sequence's single task reads
    // K and V in place (Vᵀ padded to a whole key block plus one is 64 KiB at
    // D 128 even for one key: 1024 one-token sequences × 8 heads wrote 512 MiB
    // of padding per call, 80-110x the time of one 256-token sequence of the
    // same FLOPs, an outside tester's find).
    struct Prepared {
      std::vector<int64_t> offset;  // per (sequence, kv head): element offset of its Vᵀ, then K
      std::unique_ptr<std::byte[], runtime::FreeDeleter> buf;
      size_t bytes = 0;
      uint16_t* ensure(size_t n) {
        if (n > bytes) buf = runtime::aligned_alloc_bytes(n), bytes = n;
        return reinterpret_cast<uint16_t*>(buf.get());
      }
    };
    Prepared& prep = runtime::per_thread<Prepared>([] {});
    prep.offset.assign(static_cast<size_t>(batch * hkv), -1);  // -1: read in place
    int64_t total = 0;
    for (int64_t b = 0; b < batch; ++b) {
      if ((cq[b + 1] - cq[b]) * g <= block_rows) continue;  // one task: no copy
      for (int64_t h = 0; h < hkv; ++h) {
        prep.offset[b * hkv + h] = total;
        const int64_t nk = ck[b + 1] - ck[b];
        total += dv * attn::transposed_v_ld(nk, p.key_block) + nk * d;
      }
    }
    uint16_t* vt_all = prep.ensure(static_cast<size_t>(total) * 2);
    // (prep is this thread's; the pool's workers see it through these pointers.)
    const int64_t* vt_offset = prep.offset.data();
    runtime::parallel_for(batch * hkv, [&](int64_t t) {
      if (vt_offset[t] < 0) return;
      const int64_t b = t / hkv, h = t % hkv, nk = ck[b + 1] - ck[b];
      const int64_t ld = attn::transposed_v_ld(nk, p.key_block);
      uint16_t* dst = vt_all + vt_offset[t];
      attn::transpose_v(sources(b, h).second, 0, nk, dv, dst, ld);
      for (int64_t c = 0; c < dv; ++c)
        std::memset(dst + c * ld + nk, 0, static_cast<size_t>(ld - nk) * 2);
      uint16_t* kdst = dst + dv * ld;
      const attn::RowSource ks = sources(b, h).first;
      for (int64_t j = 0; j < nk; ++j)
        std::memcpy(kdst + j * d, ks.row(j), static_cast<size_t>(d) * 2);
    });

    runtime::parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t t) {
      const Task& task = tasks[t];
      const int64_t nq = cq[task.b + 1] - cq[task.b], nk = ck[task.b + 1] - ck[task.b];
      const int64_t rows = std::min(block_rows, nq * g - task.r0);
      std::vector<attn::QueryRow> qr(static_cast<size_t>(rows));
      std::vector<uint16_t*> orows(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = (task.r0 + r) / g, h = task.h * g + (task.r0 + r) % g;
        qr[r] = {qd + (cq[task.b] + i) * q.strides[0] + h * q.strides[1], nk - nq + i, h};
        orows[r] = od + (cq[task.b] + i) * out.strides[0] + h * out.strides[1];
      }
      // The next task's query rows (usually this thread's next, or its
      // neighbour's) into L2: packing Qᵀ otherwise waits on their misses.
      if (t + 1 < static_cast<int64_t>(tasks.size())) {
        const Task& nt = tasks[t + 1];
        const int64_t nrows = std::min(block_rows, (cq[nt.b + 1] - cq[nt.b]) * g - nt.r0);
        for (int64_t r = 0; r < nrows; ++r) {
          const int64_t i = (nt.r0 + r) / g, h = nt.h * g + (nt.r0 + r) % g;
          const char* row =
              reinterpret_cast<const char*>(qd + (cq[nt.b] + i) * q.strides[0] + h * q.strides[1]);
          for (int64_t b = 0; b < d * 2; b += 64) __builtin_prefetch(row + b, 0, 2);
        }
      }
      const auto [ks0, vs] = sources(task.b, task.h);
      const int64_t off = vt_offset[task.b * hkv + task.h];
      if (off < 0) return attn::attend_finish(isa, p, qr, ks0, vs, nk, nullptr, orows);
      const int64_t ldv = attn::transposed_v_ld(nk, p.key_block);
      const attn::TransposedV vt{vt_all + off, ldv, 0};
      const attn::RowSource ks{vt.base + dv * ldv, d};
      attn::attend_finish(isa, p, qr, ks, vs, nk, &vt, orows);
    });
    if (!runtime::scratch_kept(prep.bytes)) prep.buf.reset(), prep.bytes = 0;
  });
}

}  // namespace tilejit
