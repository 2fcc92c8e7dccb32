// `tilejit tune`: searches plan knobs for the shapes of a workload, keeps a
// candidate only where it beats the default plan by more than the measured
// noise on the whole operator call, writes the tuning database, then runs
// every operator of the workload once with the chosen plans so that every
// kernel is in the on-disk cache (docs/tuning.md).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <set>
#include <sstream>

#include "codegen/attention_blocking.h"
#include "codegen/gemm_plan.h"
#include "codegen/xbyak/emitters.h"
#include "ir/activation.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/attention_checks.h"
#include "ops/attention_engine.h"
#include "ops/quant_weight.h"
#include "runtime/cpu_features.h"
#include "runtime/isa.h"
#include "tilejit/tilejit.h"
#include "tools/commands.h"
#include "tools/file_limits.h"
#include "tools/npy.h"
#include "tools/program_io.h"
#include "tools/random_data.h"
#include "tools/tune_measure.h"
#include "tools/tune_workload.h"

namespace tilejit::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Knobs = std::map<std::string, int64_t>;

// The KV cache dtype of a decode / extend op (parse_workload checked the name).
DType kv_dtype(const WorkloadOp& o) {
  for (DType t : ops::attn::kKvCacheDtypes)
    if (o.kv == dtype_name(t)) return t;
  throw Error(fmt::format("{}: kv: \"{}\"; allowed: {}", o.name, o.kv,
                          fmt::join(kv_cache_dtype_names(), ", ")));
}
// " kv=f8e4m3" / " kv=f8e5m2" for a label (nothing for the bf16 default).
std::string kv_label(const WorkloadOp& o) {
  return kv_dtype(o) == DType::bf16 ? "" : " kv=" + o.kv;
}

// One tuned entry (or, for prefill, one warm-up call): an op of the
// workload at one count (and sequence length).
struct Point {
  size_t op = 0;
  int64_t count = 0, seq = 0;
  std::string family;  // "" = warm-up only (no knob to tune)
  jit::ShapeClass shape;
  std::string label;
  std::vector<Knobs> candidates;
  std::string pruned;  // what the cost model dropped, for the report
};

Activation act_of(const std::string& s) {
  return *ir::activation_from_name(s);
}
codegen::BiasKind bias_of(const std::string& s) {
  return s == "f32"    ? codegen::BiasKind::f32
         : s == "bf16" ? codegen::BiasKind::bf16
                       : codegen::BiasKind::none;
}
WeightFormat format_of(const std::string& s) {
  return *jit::weight_format_from_name(s);
}
bool quantized(const WorkloadOp& o) {
  return format_of(o.format) != WeightFormat::bf16;
}
// The spec of the plan the op's GEMM runs: a quantized weight's as
// ops::quant_gemm_spec makes it (int8: s8 codes, K in groups of four; the
// dequant route: the packed K of its bf16 tiles, for the cost model).
codegen::GemmSpec gemm_spec(const WorkloadOp& o) {
  codegen::GemmSpec s{o.n, o.k, bias_of(o.bias), act_of(o.act),
                      o.out == "f32" ? DType::f32 : DType::bf16};
  if (o.format == "int8") {
    s.b_type = DType::i8;
    s.k = (s.k + 3) / 4 * 4;
  } else if (quantized(o)) {
    s.k = (s.k + 1) / 2 * 2;  // about k_packed (K plus the pads of odd group runs)
  }
  return s;
}

// ---- the search space and the cost model -----------------------------------------

// A relative cost (no unit): compute at the ISA's rate with rows padded to
// the blocking, times the load imbalance of the tasks over the threads, plus
// the weight re-reads of every row chunk and a per-task overhead. Only used
// to drop candidates that cannot win; the timing decides.
double gemm_model(Isa isa, int64_t m, int64_t n, int64_t k, int mr, int64_t task_rows,
                  int threads) {
  // bf16 flops per cycle per core, AMX at the 4x over AVX-512 its small-M
  // kernels reach (tile loads and stores, the A repack), not its 16x peak.
  const double rate = isa == Isa::amx ? 256 : 64;
  const int64_t tile_rows = isa == Isa::amx ? 16 : mr;
  const int64_t padded = (m + tile_rows - 1) / tile_rows * tile_rows;
  const int64_t n_blocks = (n + 63) / 64, chunks = (m + task_rows - 1) / task_rows;
  const int64_t tasks = n_blocks * chunks;
  const double per_thread = std::ceil(double(tasks) / threads) / (double(tasks) / threads);
  const double compute = 2.0 * padded * n * k / rate / std::min<int64_t>(threads, tasks);
  // B is streamed once per row chunk (16 bytes per cycle per core), and per
  // micro-kernel call on AVX-512 (B reloaded for every mr rows, from L2).
  const double weights = 2.0 * n * k * chunks / 16 / threads +
                         (isa == Isa::amx ? 0 : 2.0 * n * k * (padded / mr) / 64 / threads);
  return std::max(compute * per_thread, weights) + 2000.0 * tasks / threads;
}

std::vector<Knobs> gemm_candidates(const WorkloadOp& o, Isa path, int64_t m, int threads,
                                   std::string* pruned) {
  const codegen::GemmSpec spec = gemm_spec(o);
  const Isa dflt_isa = codegen::gemm_isa_for_rows(path, m);
  std::vector<Isa> isas = {dflt_isa};
  if (path == Isa::amx) isas.push_back(dflt_isa == Isa::amx ? Isa::avx512 : Isa::amx);
  // The LLVM backend's kernels for the same blocking (Xbyak vs LLVM).
  // Not for quantized weights: their routes take no llvm knob (tuning_db.cpp).
  if ((path == Isa::amx || path == Isa::avx512) && cpu_info().llvm_backend && !quantized(o))
    isas.push_back(Isa::llvm);
  struct Cand {
    Knobs knobs;
    double cost;
    std::string effective;  // what the plan does at this M: duplicates dropped
  };
  std::vector<Cand> all;
  double default_cost = 0;
  for (Isa isa : isas) {
    const codegen::GemmPlan base = codegen::plan_gemm(spec, isa);
    std::set<int> mrs = {base.mr};
    if (isa != Isa::amx && m >= 2)
      for (int v : {4, 6, 8})
        if (v < base.mr) mrs.insert(v);
    for (int mr : mrs) {
      std::set<int64_t> trs = {0};  // 0: the heuristic
      for (int64_t t : {32, 64, 128, 512})
        if (t < m) trs.insert(std::max<int64_t>(1, t / mr) * mr);
      std::set<int64_t> kcs = {0};
      if (spec.k > 1024 && m > mr && !quantized(o))  // a quantized route's K chunk is its own
        for (int64_t v : {1024, 4096}) kcs.insert(v);
      for (int64_t tr : trs)
        for (int64_t kc : kcs) {
          codegen::PlanOverrides ov;
          if (mr != base.mr) ov.mr = mr;
          if (tr) ov.task_rows = tr;
          if (kc) ov.max_kc = kc;
          codegen::GemmPlan p;
          try {
            p = codegen::plan_gemm(spec, isa, ov);
          } catch (const Error&) {
            continue;  // a value this plan does not take
          }
          const auto sched = p.schedule(m, threads);
          Cand c;
          if (ov.mr) c.knobs["mr"] = mr;
          if (ov.task_rows) c.knobs["task_rows"] = tr;
          if (ov.max_kc) c.knobs["max_kc"] = kc;
          if (isa == Isa::llvm)
            c.knobs["llvm"] = 1;
          else if (isa != dflt_isa)
            c.knobs["amx"] = isa == Isa::amx;
          c.cost = gemm_model(isa, m, spec.n, spec.k, p.mr, sched.task_rows, threads);
          c.effective = fmt::format("{} mr{} rc{} kp{} kc{}", isa_name(isa), p.mr,
                                    sched.row_chunks(std::min(sched.slice_rows, m)), sched.k_passes,
                                    sched.k_passes > 1 ? p.kc : 0);
          if (c.knobs.empty()) default_cost = c.cost;
          all.push_back(c);
        }
    }
  }
  // The default's effective plan and duplicates of one another go.
  std::set<std::string> seen;
  for (const Cand& c : all)
    if (c.knobs.empty()) seen.insert(c.effective);
  std::vector<Cand> uniq;
  for (const Cand& c : all)
    if (!c.knobs.empty() && seen.insert(c.effective).second) uniq.push_back(c);
  // Cost model: keep those within 3x of the best modeled cost (the default
  // included), at most 6, cheapest first, and the 3 cheapest whatever their
  // cost (the model is coarse). The cheapest plan of each ISA / backend is
  // kept first: the model cannot tell Xbyak's kernels from LLVM's, a tie
  // must not leave one of them untimed.
  double best = default_cost;
  for (const Cand& c : uniq) best = std::min(best, c.cost);
  // Cheapest first, ties in generation order. (std::sort over an index, not
  // std::stable_sort: with clang 19 over libstdc++ 12, stable_sort of this
  // type instantiates the deprecated get_temporary_buffer, an error under
  // -Werror.)
  {
    std::vector<size_t> order(uniq.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return uniq[a].cost < uniq[b].cost || (uniq[a].cost == uniq[b].cost && a < b);
    });
    std::vector<Cand> sorted;
    sorted.reserve(uniq.size());
    for (size_t i : order) sorted.push_back(uniq[i]);
    uniq = std::move(sorted);
  }
  std::vector<Knobs> out;
  std::vector<bool> taken(uniq.size(), false);
  std::set<std::string> isa_seen;
  for (size_t i = 0; i < uniq.size(); ++i) {
    const std::string isa = uniq[i].effective.substr(0, uniq[i].effective.find(' '));
    if (isa_seen.insert(isa).second && (uniq[i].cost <= 3 * best || out.size() < 3)) {
      out.push_back(uniq[i].knobs);
      taken[i] = true;
    }
  }
  for (size_t i = 0; i < uniq.size() && out.size() < 6; ++i)
    if (!taken[i] && (uniq[i].cost <= 3 * best || out.size() < 3)) {
      out.push_back(uniq[i].knobs);
      taken[i] = true;
    }
  const int dropped = static_cast<int>(std::count(taken.begin(), taken.end(), false));
  *pruned = fmt::format("{} distinct plans, {} pruned by the cost model", uniq.size(), dropped);
  return out;
}

// Prefetch distances of the Xbyak AVX-512 kernels the default runs at this
// M (the plan's, or the fused quantized decode kernel's): none, half and
// twice the default. The cost model has no term for them (they trade DRAM
// latency against L2 pollution, which depends on the CPU's own
// prefetchers), so all three are timed. On the AMX path only where the
// default already runs AVX-512 (M <= 2), with amx=0 (tuning_db.cpp's rule).
std::vector<Knobs> prefetch_candidates(Isa path, Isa rows_isa, bool fused) {
  if (rows_isa != Isa::avx512) return {};
  codegen::BrgemmDesc d;
  if (fused) d.b_type = DType::u4;
  const int dflt = d.effective_prefetch_kib();
  std::vector<Knobs> out;
  for (int kib : {0, dflt / 2, dflt * 2}) {
    Knobs k{{"prefetch", kib}};
    if (path == Isa::amx) k["amx"] = 0;
    out.push_back(k);
  }
  return out;
}

std::vector<Knobs> decode_candidates(const WorkloadOp& o, int64_t batch, int64_t seq, int threads,
                                     std::string* pruned) {
  // Tasks are sequences x splits (the LLVM kernel); a split costs a merge of
  // hq x dv partials and must keep >= 64 keys.
  (void)o;
  struct Cand {
    int64_t s;
    double cost;
  };
  std::vector<Cand> all;
  for (int64_t s : {1, 2, 3, 4, 6, 8, 16}) {
    if (s > 1 && seq / s < 64) continue;
    const int64_t tasks = batch * s;
    const double per_thread = std::ceil(double(tasks) / threads) / (double(tasks) / threads);
    const double work = double(batch) * seq / std::min<int64_t>(threads, tasks) * per_thread;
    all.push_back({s, work + 32.0 * batch * s});
  }
  double best = 1e300;
  for (const Cand& c : all) best = std::min(best, c.cost);
  std::vector<Knobs> out;
  int dropped = 0;
  for (const Cand& c : all) {
    if (c.cost > 1.5 * best) {
      ++dropped;
      continue;
    }
    out.push_back({{"splits", c.s}});
  }
  *pruned = fmt::format("{} split counts, {} pruned by the cost model", all.size(), dropped);
  // The LLVM kernel's prefetch distance (default 2 chunks of 16 keys): half,
  // twice and four times it, with the default split. No cost model term (it
  // trades DRAM latency against L2 room), so all are timed.
  if (cpu_info().llvm_backend)
    for (int64_t c : {int64_t{1}, int64_t{4}, int64_t{8}}) out.push_back({{"prefetch_chunks", c}});
  return out;
}

// Prefill and extend attention: the block engine's blocking. rows (query
// rows per task) only matters where the default's tasks balance badly over
// the threads (fewer than 4 per thread); a key block only where the longest
// sequence has more keys than the default block (else it is the same
// schedule). extend also times the split counts other than its default
// (ops::attn::default_splits) that leave at most 4 tasks per thread and
// chunks of at least attn::kMinSplitKeys keys.
std::vector<Knobs> blocking_candidates(const WorkloadOp& o, int64_t new_rows, int64_t keys,
                                       int threads, bool extend, std::string* pruned) {
  const codegen::AttentionBlocking dflt;
  const int64_t g = o.hq / o.hkv;
  auto tasks = [&](int64_t rows) { return o.hkv * ((new_rows * g + rows - 1) / rows); };
  std::vector<Knobs> out;
  int tried = 0, dropped = 0;
  for (int64_t r : {int64_t{16}, int64_t{32}}) {
    ++tried;
    if (tasks(dflt.rows) >= 4 * threads || tasks(r) == tasks(dflt.rows)) {
      ++dropped;
      continue;
    }
    out.push_back({{"rows", r}});
  }
  for (int64_t kb : {int64_t{64}, int64_t{256}}) {
    ++tried;
    if (keys <= std::min(kb, dflt.key_block)) {
      ++dropped;
      continue;
    }
    out.push_back({{"key_block", kb}});
  }
  const int64_t dflt_splits = ops::attn::default_splits(tasks(dflt.rows), threads, keys);
  if (extend)
    for (int64_t sp : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
      ++tried;
      if (sp == dflt_splits || tasks(dflt.rows) * sp > 4 * threads ||
          (sp > 1 && keys / sp < ops::attn::kMinSplitKeys)) {
        ++dropped;
        continue;
      }
      out.push_back({{"splits", sp}});
    }
  *pruned = fmt::format("{} blockings, {} pruned by the cost model", tried, dropped);
  return out;
}

// The expert of token r's j-th slot in the tuner's MoE calls: k distinct
// experts per token spread over all E (a fixed pseudo-random pattern).
int32_t tune_moe_expert(int64_t r, int64_t j, int64_t e, int64_t topk) {
  return int32_t((r * 7919 + j * (e / topk + 1)) % e);
}

std::vector<Knobs> moe_candidates(const WorkloadOp& o, Isa path, int64_t t, int threads,
                                  std::string* pruned) {
  // Runs of column blocks per streaming task: longer runs read weights
  // sequentially, shorter ones balance better; beyond blocks / threads a
  // thread would idle.
  const int64_t touched = std::min(o.e, t * o.topk);
  const int64_t blocks = touched * ((2 * o.i + 31) / 32 / 2);
  std::vector<Knobs> out;
  int dropped = 0;
  for (int64_t r : {1, 2, 4, 8, 16}) {
    if (r > 1 && blocks / r < threads) {
      ++dropped;
      continue;
    }
    out.push_back({{"run_blocks", r}});
  }
  std::string why = fmt::format("5 run lengths, {} pruned (fewer tasks than threads)", dropped);
  // The rows each expert gets in the tuner's calls, which decide its route.
  std::vector<int64_t> rows(size_t(o.e), 0);
  for (int64_t r = 0; r < t; ++r)
    for (int64_t j = 0; j < o.topk; ++j) ++rows[size_t(tune_moe_expert(r, j, o.e, o.topk))];
  const WeightFormat wf = format_of(o.format);
  // int4 experts: W4A8 from another row count than the automatic rule's
  // (ops::w4a8_route per expert). A threshold is tried only if it moves some
  // expert of these calls to the other route, and once per distinct set.
  if (is_int4(wf) && ops::w4a8_kernels_usable(path) && std::max(o.h, o.i) <= ops::kW4A8MaxK) {
    std::set<std::vector<bool>> seen;
    std::vector<bool> dflt;
    for (int64_t n : rows)
      dflt.push_back(n > 0 && ops::w4a8_route(wf, o.h, Int4Route::automatic,
                                              codegen::gemm_isa_for_rows(path, n), n, "tune"));
    seen.insert(dflt);
    int tried = 0;
    for (int64_t w : {0, 1, 2, 4, 8, 16, 32}) {
      ++tried;
      std::vector<bool> route;
      for (int64_t n : rows) route.push_back(n > 0 && w > 0 && n >= w);
      if (seen.insert(route).second) out.push_back({{"w4a8_rows", w}});
    }
    why += fmt::format("; {} W4A8 thresholds, {} change no expert's route", tried,
                       tried + 1 - int(seen.size()));
  }
  // The experts' Xbyak AVX-512 kernels' prefetch distance (none, half and
  // twice the default of the kernel most experts run: the fused decode
  // kernel's or the brgemm's), where they run: on avx512, and on amx where
  // the experts' rows leave AMX (<= 2 rows) or take the fused kernel.
  int64_t most = 0;
  for (int64_t n : rows) most = std::max(most, n);
  const Isa rows_isa = codegen::gemm_isa_for_rows(path, std::max<int64_t>(most, 1));
  const bool fused = quantized(o) && wf != WeightFormat::int8 &&
                     ops::quant_gemm_fused(path, std::max<int64_t>(most, 1));
  if (path != Isa::llvm && path != Isa::scalar && (rows_isa == Isa::avx512 || fused)) {
    codegen::BrgemmDesc d;
    if (fused) d.b_type = DType::u4;
    const int dflt = d.effective_prefetch_kib();
    for (int kib : {0, dflt / 2, dflt * 2}) out.push_back({{"prefetch", kib}});
    why += "; 3 prefetch distances";
  }
  *pruned = why;
  return out;
}

std::vector<Point> plan_points(const Workload& w, Isa path, int threads) {
  std::vector<Point> pts;
  // One entry per shape class of a family across the whole workload: a
  // second op of the same shape (two identical ops, q_proj and o_proj of one
  // size) is warm-up only (it was tuned twice, the second run overwriting
  // the first's entry).
  std::set<std::string> tuned_classes;
  for (size_t i = 0; i < w.ops.size(); ++i) {
    const WorkloadOp& o = w.ops[i];
    // Labels are printed in progress lines: a name's control bytes escaped.
    const std::string name = one_line(o.name);
    if (o.op == "gemm") {
      for (int64_t m : o.m) {
        Point p{i, m, 0};
        p.label = fmt::format("gemm {} N={} K={} M={}", name, o.n, o.k, m);
        if (quantized(o)) p.label += " " + o.format;
        p.shape = jit::gemm_shape_class(path, threads, o.n, o.k, bias_of(o.bias), act_of(o.act),
                                        o.out == "f32" ? DType::f32 : DType::bf16, m,
                                        format_of(o.format));
        // One entry per bucket: a second M of the same bucket is warm-up only.
        if (path != Isa::scalar &&
            tuned_classes.insert(w.ops[i].op + ":" + p.shape.text()).second) {
          p.family = "gemm";
          const Isa rows_isa = codegen::gemm_isa_for_rows(path, m);
          const WeightFormat wf = format_of(o.format);
          const bool int4 = is_int4(wf);
          // int4: the automatic route's choice at this M (ops::w4a8_route);
          // the other route is a candidate (knob w4a8) where W4A8 can run.
          const bool dflt_w4a8 =
              int4 && ops::w4a8_route(wf, o.k, Int4Route::automatic, rows_isa, m, "tune");
          const bool other_route =
              int4 && ops::w4a8_kernels_usable(rows_isa) && o.k <= ops::kW4A8MaxK;
          if (dflt_w4a8) {
            // W4A8 has no plan knob: only W4A16 (its default plan) against it.
            p.pruned = "W4A8 (the automatic route) has no plan knob: W4A16 tried";
            p.candidates.push_back({{"w4a8", 0}});
          } else {
            // fp8 / int4 / mxfp4 at decode M run the fused kernel: no plan,
            // no plan knob (the default is timed, an entry without knobs written).
            const bool fused =
                quantized(o) && o.format != "int8" && ops::quant_gemm_fused(rows_isa, m);
            if (fused)
              p.pruned = "the fused decode kernel: no plan knob, its prefetch distance tried";
            else
              p.candidates = gemm_candidates(o, path, m, threads, &p.pruned);
            for (Knobs& k : prefetch_candidates(path, rows_isa, fused))
              p.candidates.push_back(std::move(k));
            // int4 in the Xbyak fused kernel: the other arithmetic (vdpbf16ps
            // or f32 FMAs) than the one this CPU's rule picks (a knob of the
            // buckets of one call, <= kFusedMaxMr rows: tuning_db.cpp).
            if (fused && int4 && path != Isa::llvm && m <= ops::kFusedMaxMr)
              p.candidates.push_back(
                  {{"u4_dot", runtime::bf16_dot_at_fma_rate(runtime::cpu_features()) ? 0 : 1}});
            // int4: W4A16's knobs name their route (w4a8=0: refused at load
            // without it, since the automatic rule takes W4A8 at some M).
            if (int4)
              for (Knobs& k : p.candidates) k["w4a8"] = 0;
            if (other_route) p.candidates.push_back({{"w4a8", 1}});
          }
        }
        pts.push_back(p);
      }
    } else if (o.op == "decode_attention") {
      for (int64_t b : o.m)
        for (int64_t s : o.seq_len) {
          Point p{i, b, s};
          p.label = fmt::format("decode_attention {} B={} ctx={} Hq={} Hkv={} D={}{}", name, b, s,
                                o.hq, o.hkv, o.d, kv_label(o));
          p.shape = jit::decode_shape_class(path, threads, o.d, o.dv, o.hq, o.hkv, o.block_size,
                                            kv_dtype(o), b, s);
          if (path != Isa::scalar &&
              tuned_classes.insert(w.ops[i].op + ":" + p.shape.text()).second) {
            p.family = "decode_attention";
            p.candidates = decode_candidates(o, b, s, threads, &p.pruned);
          }
          pts.push_back(p);
        }
    } else if (o.op == "moe") {
      for (int64_t t : o.m) {
        Point p{i, t, 0};
        p.label = fmt::format("moe {} E={} k={} H={} I={} T={}", name, o.e, o.topk, o.h, o.i, t);
        if (quantized(o)) p.label += " " + o.format;
        p.shape =
            jit::moe_shape_class(path, threads, o.e, o.topk, o.h, o.i, t, format_of(o.format));
        if (path != Isa::scalar &&
            tuned_classes.insert(w.ops[i].op + ":" + p.shape.text()).second) {
          p.family = "moe";
          p.candidates = moe_candidates(o, path, t, threads, &p.pruned);
        }
        pts.push_back(p);
      }
    } else if (o.op == "rope") {  // warm-up only
      for (int64_t t : o.m) {
        Point p{i, t, 0};
        p.label =
            fmt::format("rope {} T={} Hq={} Hk={} D={} {}", name, t, o.hq, o.hkv, o.d, o.style);
        pts.push_back(p);
      }
    } else if (o.op == "extend_attention") {
      for (int64_t s : o.seq_len) {
        Point p{i, 1, s};
        p.label = fmt::format("extend_attention {} new={} prefix={} Hq={} Hkv={} D={}{}", name, s,
                              o.prefix_len, o.hq, o.hkv, o.d, kv_label(o));
        p.shape = jit::extend_shape_class(path, threads, o.d, o.dv, o.hq, o.hkv, o.block_size,
                                          kv_dtype(o), 1, s, o.prefix_len + s);
        if (path != Isa::scalar &&
            tuned_classes.insert(w.ops[i].op + ":" + p.shape.text()).second) {
          p.family = "extend_attention";
          p.candidates = blocking_candidates(o, s, o.prefix_len + s, threads, true, &p.pruned);
        }
        pts.push_back(p);
      }
    } else {  // prefill_attention
      for (int64_t s : o.seq_len) {
        Point p{i, 1, s};
        p.label =
            fmt::format("prefill_attention {} T={} Hq={} Hkv={} D={}", name, s, o.hq, o.hkv, o.d);
        p.shape = jit::prefill_shape_class(path, threads, o.d, o.dv, o.hq, o.hkv, o.causal, 1, s);
        if (path != Isa::scalar &&
            tuned_classes.insert(w.ops[i].op + ":" + p.shape.text()).second) {
          p.family = "prefill_attention";
          p.candidates = blocking_candidates(o, s, s, threads, false, &p.pruned);
        }
        pts.push_back(p);
      }
    }
  }
  return pts;
}

// ---- the operator calls ----------------------------------------------------------

// The weights of one op, shared by its points (packed once, as at model load).
struct OpWeights {
  std::vector<PackedWeight> w;  // a gemm's weight and its copies (cold_copies)
  PackedExperts w13, w2;
};

// Buffers of one call, kept alive by the returned closure.
struct CallBuffers {
  std::vector<uint16_t> a, b, c, d;
  std::vector<float> f;
  std::vector<int32_t> i, j;
  std::vector<uint8_t> k8, v8;  // an fp8 KV cache's codes
};

// The scale of the tuner's fp8 KV caches: the random values (in ±1) are
// stored as fp8(x / scale) (store_kv's rule), well inside the range of e4m3
// (±448) and e5m2 (±57344).
constexpr float kFp8CacheScale = 1.0f / 64;

// A paged K or V cache [blocks, bs, Hkv, d] of op's kv dtype: random bf16
// values in ±1, or their e4m3 / e5m2 codes (into `codes`).
TensorView kv_cache(const WorkloadOp& o, int64_t blocks, int64_t bs, int64_t d, uint64_t seed,
                    std::vector<uint16_t>& values, std::vector<uint8_t>& codes) {
  values = random_bf16(size_t(blocks * bs * o.hkv * d), seed, 1.0f);
  const DType kv = kv_dtype(o);
  if (kv == DType::bf16) return TensorView(values.data(), DType::bf16, {blocks, bs, o.hkv, d});
  codes = fp8_cache_codes(kv, values, kFp8CacheScale);
  values = {};
  return TensorView(codes.data(), kv, {blocks, bs, o.hkv, d});
}

// The options of a call over op's cache: its scales when it is fp8.
AttentionOptions cache_options(const WorkloadOp& o) {
  AttentionOptions opt;
  if (kv_dtype(o) != DType::bf16) opt.kv_scales.k_scale = opt.kv_scales.v_scale = kFp8CacheScale;
  return opt;
}

// The operands a rotation of calls cycles through (cold_copies): each call
// takes the next one. Copies of the closure share the position.
template <class T>
struct Rotation {
  std::vector<T> items;
  std::shared_ptr<size_t> pos = std::make_shared<size_t>(0);
  const T& next() const { return items[(*pos)++ % items.size()]; }
};

// One call of op at point p. cold: the calls rotate over copies of their
// streamed data (cold_copies), so each reads it from DRAM as an engine's
// call does; the warm-up, which runs one call, passes false.
std::function<void()> make_call(const WorkloadOp& o, const Point& p, OpWeights& ow, bool cold) {
  auto buf = std::make_shared<CallBuffers>();
  const uint64_t seed = 1000 + p.op * 97 + uint64_t(p.count) * 13 + uint64_t(p.seq);
  if (o.op == "gemm") {
    // Copies of the weight (the same shape and format, other random codes).
    auto add_weight = [&] {
      const uint64_t s = 5000 + p.op * 97 + ow.w.size() * 7919;
      if (quantized(o)) {
        ow.w.push_back(synthetic_weight(o, o.n, o.k, s));
      } else {
        const auto w = random_bf16(size_t(o.n * o.k), s, 1.0f / 16);
        ow.w.push_back(pack_weight(TensorView(w.data(), DType::bf16, {o.n, o.k})));
      }
    };
    if (ow.w.empty()) add_weight();
    const size_t copies = cold ? size_t(cold_copies(int64_t(ow.w[0].packed_bytes()))) : size_t{1};
    while (ow.w.size() < copies) add_weight();
    Rotation<const PackedWeight*> ws;
    for (size_t i = 0; i < copies; ++i) ws.items.push_back(&ow.w[i]);
    const int64_t m = p.count;
    buf->a = random_bf16(size_t(m * o.k), seed + 1, 1.0f);
    const DType out = o.out == "f32" ? DType::f32 : DType::bf16;
    buf->c.resize(size_t(m * o.n) * (out == DType::f32 ? 2 : 1));
    GemmOptions opt;
    opt.act = act_of(o.act);
    if (o.bias == "f32") {
      buf->f.assign(size_t(o.n), 0.5f);
      opt.bias = TensorView(buf->f.data(), DType::f32, {o.n});
    } else if (o.bias == "bf16") {
      buf->b = random_bf16(size_t(o.n), seed + 2, 1.0f);
      opt.bias = TensorView(buf->b.data(), DType::bf16, {o.n});
    }
    const TensorView x(buf->a.data(), DType::bf16, {m, o.k});
    const TensorView y(buf->c.data(), out, {m, o.n});
    return [buf, x, y, ws, opt] { gemm(x, *ws.next(), y, opt); };
  }
  if (o.op == "decode_attention") {
    const int64_t b = p.count, len = p.seq, bs = o.block_size;
    const int64_t per_seq = (len + bs - 1) / bs, nb = b * per_seq;
    // A cache of `copies` times the blocks a call reads; each call's table
    // names another nb of them (cold), in an engine's steady-state order.
    const int64_t row_bytes = o.hkv * (o.d + o.dv) * (kv_dtype(o) == DType::bf16 ? 2 : 1);
    const int64_t copies = cold ? cold_copies(nb * bs * row_bytes) : 1;
    const TensorView kc = kv_cache(o, copies * nb, bs, o.d, seed, buf->a, buf->k8);
    const TensorView vc = kv_cache(o, copies * nb, bs, o.dv, seed + 1, buf->b, buf->v8);
    buf->c = random_bf16(size_t(b * o.hq * o.d), seed + 2, 1.0f);
    buf->d.resize(size_t(b * o.hq * o.dv));
    buf->i = shuffled_blocks(size_t(copies * nb), seed);
    buf->j.assign(size_t(b), int32_t(len));
    const TensorView q(buf->c.data(), DType::bf16, {b, o.hq, o.d});
    const TensorView out(buf->d.data(), DType::bf16, {b, o.hq, o.dv});
    Rotation<TensorView> tables;
    for (int64_t c = 0; c < copies; ++c)
      tables.items.emplace_back(buf->i.data() + c * nb, DType::i32,
                                std::vector<int64_t>{b, per_seq});
    const TensorView lens(buf->j.data(), DType::i32, {b});
    return [buf, q, kc, vc, out, tables, lens, opt = cache_options(o)] {
      decode_attention(q, kc, vc, out, tables.next(), lens, opt);
    };
  }
  if (o.op == "moe") {
    if (ow.w13.empty() && quantized(o)) {
      ow.w13 = synthetic_experts(o, o.e, 2 * o.i, o.h, ExpertProj::gate_up, seed);
      ow.w2 = synthetic_experts(o, o.e, o.h, o.i, ExpertProj::down, seed + 1);
    } else if (ow.w13.empty()) {
      auto w13 = random_bf16(size_t(o.e * 2 * o.i * o.h), seed, 1.0f / 16);
      ow.w13 = pack_experts(TensorView(w13.data(), DType::bf16, {o.e, 2 * o.i, o.h}),
                            ExpertProj::gate_up);
      w13 = {};
      const auto w2 = random_bf16(size_t(o.e * o.h * o.i), seed + 1, 1.0f / 16);
      ow.w2 = pack_experts(TensorView(w2.data(), DType::bf16, {o.e, o.h, o.i}), ExpertProj::down);
    }
    const int64_t t = p.count;
    buf->a = random_bf16(size_t(t * o.h), seed + 2, 1.0f);
    buf->d.resize(size_t(t * o.h));
    // Routing: tune_moe_expert's pattern (what moe_candidates counted), equal weights.
    buf->f.assign(size_t(t * o.topk), 1.0f / float(o.topk));
    // Cold: the calls rotate the experts (ids shifted by 1 per copy: the same
    // rows per expert, other experts, whose weights come from DRAM).
    const int64_t touched = std::min(o.e, t * o.topk);
    const int64_t copies =
        cold ? std::min(o.e, cold_copies(int64_t(ow.w13.packed_bytes() + ow.w2.packed_bytes()) /
                                         o.e * touched))
             : 1;
    buf->i.resize(size_t(copies * t * o.topk));
    for (int64_t c = 0; c < copies; ++c)
      for (int64_t r = 0; r < t; ++r)
        for (int64_t j = 0; j < o.topk; ++j)
          buf->i[size_t((c * t + r) * o.topk + j)] =
              int32_t((tune_moe_expert(r, j, o.e, o.topk) + c) % o.e);
    const TensorView x(buf->a.data(), DType::bf16, {t, o.h});
    const TensorView tw(buf->f.data(), DType::f32, {t, o.topk});
    Rotation<TensorView> ids;
    for (int64_t c = 0; c < copies; ++c)
      ids.items.emplace_back(buf->i.data() + c * t * o.topk, DType::i32,
                             std::vector<int64_t>{t, o.topk});
    const TensorView out(buf->d.data(), DType::bf16, {t, o.h});
    const PackedExperts* w13 = &ow.w13;
    const PackedExperts* w2 = &ow.w2;
    return [buf, x, tw, ids, out, w13, w2] { fused_experts(x, *w13, *w2, tw, ids.next(), out); };
  }
  if (o.op == "rope") {
    // In place on q [T, Hq, D] and k [T, Hk, D]; positions 0..T-1 of a
    // cache of T rows (the kernel does not depend on the values).
    const int64_t t = p.count, rd = o.rotary_dim ? o.rotary_dim : o.d;
    const DType dt = o.dtype == "f32" ? DType::f32 : DType::bf16;
    const DType ct = o.cache == "f32" ? DType::f32 : DType::bf16;
    const int64_t qn = t * o.hq * o.d, kn = t * o.hkv * o.d;
    const int words = dt == DType::f32 ? 2 : 1, cwords = ct == DType::f32 ? 2 : 1;
    buf->a = random_bf16(size_t(qn * words), seed, 1.0f);
    buf->b = random_bf16(size_t(kn * words), seed + 1, 1.0f);
    // f32 tensors are pairs of these bf16 words: the high word (a value in
    // ±1) sets the f32's sign and exponent, so every value is finite.
    buf->c = random_bf16(size_t(t * rd * cwords), seed + 2, 1.0f);
    buf->i.resize(size_t(t));
    std::iota(buf->i.begin(), buf->i.end(), 0);
    const TensorView q(buf->a.data(), dt, {t, o.hq, o.d});
    const TensorView k(buf->b.data(), dt, {t, o.hkv, o.d});
    const TensorView pos(buf->i.data(), DType::i32, {t});
    const TensorView cache(buf->c.data(), ct, {t, rd});
    RopeOptions ropt;
    ropt.style = o.style == "gptj" ? RopeStyle::gptj : RopeStyle::neox;
    ropt.rotary_dim = o.rotary_dim;
    const bool with_k = o.hkv > 0;
    return
        [buf, q, k, pos, cache, ropt, with_k] { rope(q, with_k ? &k : nullptr, pos, cache, ropt); };
  }
  if (o.op == "extend_attention") {
    // One sequence: p.seq new tokens (k_new / v_new) over a cached prefix.
    const int64_t n = p.seq, pre = o.prefix_len, bs = o.block_size;
    const int64_t blocks = std::max<int64_t>((pre + bs - 1) / bs, 1);
    const TensorView kc = kv_cache(o, blocks, bs, o.d, seed, buf->a, buf->k8);
    const TensorView vc = kv_cache(o, blocks, bs, o.dv, seed + 1, buf->b, buf->v8);
    buf->c = random_bf16(size_t(n * (o.hq + o.hkv) * o.d + n * o.hkv * o.dv), seed + 2, 1.0f);
    buf->d.resize(size_t(n * o.hq * o.dv));
    buf->i = shuffled_blocks(size_t(blocks), seed);
    buf->j = {0, int32_t(n), int32_t(pre)};  // qo_indptr, then prefix_lens
    uint16_t* qp = buf->c.data();
    const TensorView q(qp, DType::bf16, {n, o.hq, o.d});
    const TensorView out(buf->d.data(), DType::bf16, {n, o.hq, o.dv});
    const TensorView indptr(buf->j.data(), DType::i32, {2});
    const TensorView table(buf->i.data(), DType::i32, {1, blocks});
    const TensorView prefix(buf->j.data() + 2, DType::i32, {1});
    ExtendOptions ext;
    ext.k_new = TensorView(qp + n * o.hq * o.d, DType::bf16, {n, o.hkv, o.d});
    ext.v_new = TensorView(qp + n * (o.hq + o.hkv) * o.d, DType::bf16, {n, o.hkv, o.dv});
    return [buf, q, kc, vc, out, indptr, table, prefix, ext, opt = cache_options(o)] {
      extend_attention(q, kc, vc, out, indptr, table, prefix, opt, ext);
    };
  }
  // prefill_attention: one sequence of p.seq tokens.
  const int64_t s = p.seq;
  buf->a = random_bf16(size_t(s * o.hq * o.d), seed, 1.0f);
  buf->b = random_bf16(size_t(s * o.hkv * o.d), seed + 1, 1.0f);
  buf->c = random_bf16(size_t(s * o.hkv * o.dv), seed + 2, 1.0f);
  buf->d.resize(size_t(s * o.hq * o.dv));
  buf->i = {0, int32_t(s)};
  const TensorView q(buf->a.data(), DType::bf16, {s, o.hq, o.d});
  const TensorView k(buf->b.data(), DType::bf16, {s, o.hkv, o.d});
  const TensorView v(buf->c.data(), DType::bf16, {s, o.hkv, o.dv});
  const TensorView out(buf->d.data(), DType::bf16, {s, o.hq, o.dv});
  const TensorView cu(buf->i.data(), DType::i32, {2});
  AttentionOptions aopt;
  aopt.causal = o.causal;
  return [buf, q, k, v, out, cu, aopt] { flash_attn_varlen(q, k, v, out, cu, cu, aopt); };
}

std::string knobs_str(const Knobs& k) {
  return k.empty() ? "default" : jit::knobs_text(k);
}

jit::TunedEntry make_entry(const Point& p, const Knobs& k) {
  jit::TunedEntry e;
  e.family = p.family;
  e.shape = p.shape;
  e.knobs = k;
  e.cpu = runtime::cpu_signature();
  e.version = jit::tuning_db_version();
  return e;
}

// Makes the operator calls use `k` for p's shape class (none: the default).
void select_plan(const Point& p, const Knobs& k) {
  jit::TuningDb db;
  if (!k.empty()) db.entries.push_back(make_entry(p, k));
  jit::install_tuning_db(std::move(db), "");  // "": not logged (once per sample)
}

// A report row, printed at the end.
struct Result {
  std::string label, choice;
  double dflt = 0, tuned = 0, noise = 0;
  double best_ratio = 1;  // the fastest candidate's median / the default's (first run)
  int tried = 0;
  bool kept = false;
};

// --verify: every entry of the database with knobs, default against tuned
// in a process of its own (no selection bias: only these two plans, timed
// interleaved), the medians, their MADs and the ratio.
int verify(const Workload& w, const std::vector<Point>& pts, const jit::TuningDb& db, int rounds,
           Clock::time_point deadline) {
  const jit::TuningDb cur = db.current();
  fmt::print("\n{:<64} {:>18} {:>18} {:>7} {}\n", "entry", "default (MAD)", "tuned (MAD)", "ratio",
             "knobs");
  std::map<size_t, OpWeights> weights;
  int64_t verified = 0;
  for (const Point& p : pts) {
    if (p.family.empty()) continue;
    const jit::TunedEntry* e = cur.find(jit::TunedEntry{p.family, p.shape}.id());
    if (e == nullptr || e->knobs.empty()) continue;
    for (auto it = weights.begin(); it != weights.end();)
      it = it->first == p.op ? std::next(it) : weights.erase(it);
    const std::function<void()> call = make_call(w.ops[p.op], p, weights[p.op], true);
    std::vector<Contender> cs = {{[&] { select_plan(p, {}); }, {}},
                                 {[&] { select_plan(p, e->knobs); }, {}}};
    if (measure_interleaved(cs, call, rounds, rounds, 0, deadline, [] {}) != Stop::none) {
      fmt::print("tilejit tune --verify: stopped (^C or budget)\n");
      return 130;
    }
    const Stats d = stats_of(cs[0].samples), t = stats_of(cs[1].samples);
    fmt::print("{:<64} {:>18} {:>18} {:>7.3f} {} ({} interleaved rounds)\n", p.label,
               fmt::format("{} ({})", us_str(d.median), us_str(d.mad)),
               fmt::format("{} ({})", us_str(t.median), us_str(t.mad)), t.median / d.median,
               knobs_str(e->knobs), d.samples);
    ++verified;
  }
  fmt::print("{} tuned entries verified; the other entries run the default plan\n", verified);
  return 0;
}

}  // namespace

int run_tune(const TuneOptions& opt) {
  set_threads_option(opt.threads);
  if (opt.workload.empty() == opt.model_config.empty())
    throw UsageError("give a WORKLOAD file or --model-config config.json (one of them)");
  if (opt.model_config.empty() && !opt.kv_cache_dtype.empty())
    throw UsageError(
        "--kv-cache-dtype goes with --model-config (a workload file names each op's kv)");
  const double budget = parse_budget(opt.budget);
  const auto deadline = Clock::now() + std::chrono::microseconds(int64_t(budget * 1e6));
  Workload w;
  if (!opt.model_config.empty()) {
    w = workload_from_model_config(
        CappedFile(opt.model_config).read_all(kMaxModelConfigBytes, "model config"),
        opt.model_config, opt.kv_cache_dtype.empty() ? WorkloadOp{}.kv : opt.kv_cache_dtype);
    if (!opt.save_workload.empty()) {
      // As `run --output` writes: a FIFO with no reader is an Error, not a hang.
      write_output_file(opt.save_workload, workload_json(w));
      fmt::print("tilejit tune: wrote the workload of {} to {}\n", opt.model_config,
                 opt.save_workload);
      return 0;
    }
  } else {
    w = load_workload(opt.workload);
  }
  const CpuInfo cpu = cpu_info();
  const Isa path = cpu.isa;
  const int threads = num_threads();
  // Every kernel the run compiles (the search's too) is offered to the disk
  // cache: those not stored are counted from here.
  const CacheStats at_start = cache_stats();

  // The database so far: an existing file is kept (other machines' entries
  // too) and updated entry by entry.
  jit::TuningDb db;
  std::error_code ec;  // a name the system refuses (too long) is the probe's Error below
  const bool db_exists = std::filesystem::exists(opt.out, ec);
  if (db_exists) db = jit::TuningDb::load(opt.out);
  // --verify times the entries of a database: none there is an error, not
  // "0 tuned entries verified".
  if (opt.verify && !db_exists)
    throw Error(
        fmt::format("--verify: the tuning database {} does not exist; allowed: a "
                    "database tune wrote (--out)",
                    opt.out));
  // The search writes the database after every entry: a path it cannot
  // write (no directory, a read-only file system, a name too long) is found
  // now, not after the first measurement.
  if (!opt.verify && !opt.no_search) {
    try {
      jit::check_db_writable(opt.out);
    } catch (const Error& e) {
      throw Error(fmt::format("--out {}: cannot write the tuning database: {}", opt.out, e.what()));
    }
  }
  std::set<std::string> done_ids;
  for (const jit::TunedEntry& e : db.current().entries) done_ids.insert(e.id());

  std::vector<Point> pts = plan_points(w, path, threads);
  std::vector<size_t> todo;
  int64_t resumed = 0;
  for (size_t i = 0; i < pts.size(); ++i) {
    if (pts[i].family.empty() || opt.no_search) continue;
    if (opt.resume && done_ids.count(jit::TunedEntry{pts[i].family, pts[i].shape}.id())) {
      ++resumed;
      continue;
    }
    todo.push_back(i);
  }
  fmt::print(
      "tilejit tune: workload {} ({} ops, {} entries to tune{}), path {}{}, {} threads, budget "
      "{}, database {}\n",
      one_line(w.name), w.ops.size(), todo.size(),
      resumed ? fmt::format(", {} already in the database (--resume)", resumed) : "",
      isa_name(path), cpu.amx_emulated ? " (AMX EMULATED: times are the emulator's)" : "", threads,
      duration_str(budget), opt.out);
  // Off: the variable empty, or set to a directory the library could not
  // use (a regular file, no permission), which must not read as "set empty".
  const char* cache_env = std::getenv("TILEJIT_CACHE_DIR");
  fmt::print("kernel cache {}\n",
             !cache_stats().disk_dir.empty() ? cache_stats().disk_dir
             : cache_env != nullptr && *cache_env != '\0'
                 ? fmt::format("off (TILEJIT_CACHE_DIR={} is not a usable directory: the warm-up "
                               "fills nothing)",
                               one_line(cache_env))
                 : std::string("off (TILEJIT_CACHE_DIR=)"));
  fmt::print(
      "cold operands: gemm weights, touched experts and decode KV rows rotate over copies past "
      "4 x the {} MiB last-level cache, so each call reads them from DRAM as an engine's does\n",
      llc_bytes() >> 20);
  // Interleaving keeps default and candidates on equal terms under load, but
  // a loaded machine widens the noise (fewer wins pass the rule) and favours
  // finer task splits: say so.
  double load = 0;
  if (std::ifstream la("/proc/loadavg"); la >> load && load > 0.5)
    fmt::print(
        "note: load average {:.2f} before tuning: other processes compete for the cores; "
        "timings are noisier and a win under load may not be one on a quiet machine\n",
        load);
  std::fflush(stdout);

  install_sigint_handler();
  if (opt.verify) return verify(w, pts, db, opt.rounds, deadline);
  Progress progress(static_cast<int64_t>(todo.size()), budget);
  std::vector<Result> results;
  Stop stop = Stop::none;
  std::map<size_t, OpWeights> weights;
  const double per_entry = todo.empty() ? 0 : std::clamp(budget / double(todo.size()), 0.5, 20.0);
  for (size_t ti = 0; ti < todo.size() && stop == Stop::none; ++ti) {
    const Point& p = pts[todo[ti]];
    const WorkloadOp& o = w.ops[p.op];
    // Only this op's weights stay in memory.
    for (auto it = weights.begin(); it != weights.end();)
      it = it->first == p.op ? std::next(it) : weights.erase(it);
    progress.start(static_cast<int64_t>(ti), p.label);
    const std::function<void()> call = make_call(o, p, weights[p.op], true);
    Result res{p.label, "default"};
    res.tried = static_cast<int>(p.candidates.size());
    // 1. The default against every candidate, interleaved.
    std::vector<Contender> cs;
    cs.push_back({[&] { select_plan(p, {}); }, {}});
    for (const Knobs& k : p.candidates) cs.push_back({[&p, &k] { select_plan(p, k); }, {}});
    stop =
        measure_interleaved(cs, call, 5, 15, per_entry * 0.6, deadline, [&] { progress.tick(); });
    if (stop != Stop::none) break;
    const Stats d = stats_of(cs[0].samples);
    size_t best = 0;
    for (size_t c = 1; c < cs.size(); ++c)
      if (stats_of(cs[c].samples).median < stats_of(cs[best].samples).median) best = c;
    Knobs chosen;
    Stats sd = d, sc = d;
    res.best_ratio = best ? stats_of(cs[best].samples).median / d.median : 1.0;
    if (best != 0 && beats(d, stats_of(cs[best].samples))) {
      // 2. The winner again, against the default alone: the best of several
      // noisy medians is biased low, a fresh interleaved run is not.
      const Knobs& k = p.candidates[best - 1];
      std::vector<Contender> confirm = {{[&] { select_plan(p, {}); }, {}},
                                        {[&] { select_plan(p, k); }, {}}};
      stop = measure_interleaved(confirm, call, 5, 9, per_entry * 0.4, deadline,
                                 [&] { progress.tick(); });
      if (stop != Stop::none) break;
      sd = stats_of(confirm[0].samples);
      sc = stats_of(confirm[1].samples);
      if (beats(sd, sc)) chosen = k;
      res.choice =
          chosen.empty() ? fmt::format("default ({} did not hold up)", knobs_str(k)) : knobs_str(k);
    } else {
      sc = best ? stats_of(cs[best].samples) : d;
      res.choice =
          best ? fmt::format("default (best {} within noise)", knobs_str(p.candidates[best - 1]))
               : "default";
    }
    select_plan(p, {});
    jit::TunedEntry e = make_entry(p, chosen);
    e.default_us = sd.median * 1e6;
    e.tuned_us = (chosen.empty() ? sd.median : sc.median) * 1e6;
    e.noise_us = noise_of(sd, sc) * 1e6;
    e.candidates = static_cast<int64_t>(p.candidates.size());
    db.put(e);
    db.save(opt.out);  // after every entry: a kill leaves every finished one
    res.dflt = sd.median;
    res.tuned = chosen.empty() ? sd.median : sc.median;
    res.noise = noise_of(sd, sc);
    res.kept = !chosen.empty();
    progress.done(fmt::format(
        "{}: default {} ± {}, {} -> {} ({}; {} candidates: {})", p.label, us_str(sd.median),
        us_str(sd.mad), res.kept ? "kept" : "not kept", res.choice,
        res.kept ? fmt::format("tuned/default {:.3f}", res.tuned / res.dflt) : "defaults stay",
        res.tried, p.pruned));
    // What was tried, each with its median / the default's (first run).
    std::string tried;
    for (size_t c = 1; c < cs.size(); ++c)
      tried += fmt::format("{}{} {:.3f}", tried.empty() ? "" : "; ", knobs_str(p.candidates[c - 1]),
                           stats_of(cs[c].samples).median / d.median);
    // Ratios, said so: an outside tester read "0.99 ... 1.49" as milliseconds
    // beside the default's "2.377 ms" and took the keep rule for broken.
    if (!tried.empty()) fmt::print("    tried: {} (each: median / the default's)\n", tried);
    results.push_back(res);
  }
  progress.clear();
  if (!opt.no_search) db.save(opt.out);
  if (stop == Stop::interrupted) {
    fmt::print(
        "tilejit tune: interrupted: the entry in progress was abandoned; {} entries written to "
        "{} (valid); `--resume` continues\n",
        results.size(), opt.out);
    return 130;
  }
  if (stop == Stop::budget)
    fmt::print(
        "tilejit tune: budget of {} reached: {} of {} entries tuned (the others keep the default "
        "plans); `--resume` continues\n",
        duration_str(budget), results.size(), todo.size());

  // The report.
  if (!results.empty()) {
    // ratio: tuned / default (a kept entry: from the confirmation run; else
    // 1, the default runs); best: the fastest candidate / default in the
    // first run, kept or not.
    fmt::print("\n{:<64} {:>11} {:>11} {:>7} {:>6} {:>5} {}\n", "entry", "default", "tuned",
               "ratio", "best", "tried", "choice");
    for (const Result& r : results)
      fmt::print("{:<64} {:>11} {:>11} {:>7.3f} {:>6.3f} {:>5} {}\n", r.label, us_str(r.dflt),
                 us_str(r.tuned), r.tuned / r.dflt, r.best_ratio, r.tried, r.choice);
  }

  // Warm-up: every operator of the workload once, with the chosen plans, so
  // that each kernel it needs is in the on-disk cache.
  jit::install_tuning_db(db, opt.out);
  const CacheStats before = cache_stats();
  weights.clear();
  int64_t calls = 0;
  for (const Point& p : pts) {
    if (stop_requested(Clock::time_point::max()) == Stop::interrupted) {
      // --no-search writes no database: say only what it does have.
      fmt::print(
          "tilejit tune: interrupted during the warm-up: {}the kernel cache has the kernels of "
          "the first {} calls\n",
          opt.no_search ? "" : fmt::format("the database {} is complete, ", opt.out), calls);
      return 130;
    }
    for (auto it = weights.begin(); it != weights.end();)
      it = it->first == p.op ? std::next(it) : weights.erase(it);
    make_call(w.ops[p.op], p, weights[p.op], false)();
    ++calls;
  }
  const CacheStats after = cache_stats();
  fmt::print(
      "\nwarm-up: {} operator calls: {} kernels compiled, {} loaded from the disk cache ({}); "
      "{} tuned plans applied\n",
      calls, after.compiles - before.compiles, after.disk_loads - before.disk_loads,
      after.disk_dir.empty() ? "off" : after.disk_dir, after.tuned_plans - before.tuned_plans);
  // Compiled but not stored (a read-only or full file system, a file size
  // limit), in the search or the warm-up: the next process compiles them
  // again, which is what the warm-up is for. (The search compiles most of
  // them: counting the warm-up alone said nothing when it compiled none.)
  const uint64_t compiled = after.compiles - at_start.compiles,
                 stored = after.disk_stores - at_start.disk_stores;
  if (!after.disk_dir.empty() && compiled > stored)
    fmt::print(
        "warning: the kernel cache {} could not be filled: {} of the {} kernels compiled were not "
        "stored (a read-only or full file system, or ulimit -f?); a later process compiles them "
        "again\n",
        after.disk_dir, compiled - stored, compiled);
  return 0;
}

}  // namespace tilejit::tools
