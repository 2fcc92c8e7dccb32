#include "codegen/gemm_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <tuple>

#include "codegen/xbyak/emitters.h"
#include "tilejit/error.h"

namespace tilejit::codegen {

GemmPlan plan_gemm(const GemmSpec& spec, Isa isa) {
  // The blocking below divides by K chunks and N blocks: an empty GEMM has no
  // plan (the verifier and pack_weight refuse N or K of 0 before this).
  if (spec.n < 1 || spec.k < 1)
    throw Error(fmt::format("plan_gemm: N={} K={}; allowed: N >= 1 and K >= 1", spec.n, spec.k));
  GemmPlan p;
  p.spec = spec;
  p.isa = isa;
  p.nb =
      static_cast<int>(spec.glu != Glu::none ? PackedLayout::kBlockN / 2 : PackedLayout::kBlockN);
  p.n_tail = static_cast<int>(spec.n % p.nb);
  // A B panel is kc/2 rows of 256 bytes: 2048-deep chunks are 256 KiB, a
  // quarter of a 1 MiB L2, leaving room for A blocks and the partial sums
  // (int8: kc/4 rows, so 4096-deep chunks are the same 256 KiB).
  if (spec.b_type != DType::bf16 && spec.b_type != DType::i8)
    throw Error(fmt::format("plan_gemm: b_type={}; allowed: bf16, i8", dtype_name(spec.b_type)));
  const int64_t step = amx_k_step_of(spec.int8() ? DType::u8 : DType::bf16);
  if (spec.max_kc < step || spec.max_kc % step != 0)
    throw Error(fmt::format("plan_gemm: max_kc={}; allowed: a multiple of {}", spec.max_kc, step));
  if (spec.int8() && spec.k % 4 != 0)
    throw Error(
        fmt::format("plan_gemm: an int8 GEMM with k={}; allowed: k a multiple of 4", spec.k));
  const int64_t kMaxChunk = spec.max_kc * (spec.int8() ? 2 : 1);
  // Ceiling divisions written so that no sum can overflow, whatever K (up to INT64_MAX).
  p.k_chunks = spec.k / kMaxChunk + (spec.k % kMaxChunk != 0);
  const int64_t per_chunk = spec.k / p.k_chunks + (spec.k % p.k_chunks != 0);  // <= 2048
  // Chunks are whole AMX K steps, so only the last one has a K tail.
  p.kc = p.k_chunks == 1 ? spec.k : (per_chunk + step - 1) / step * step;
  switch (isa) {
    case Isa::amx:
      // Two row tiles: every B tile loaded feeds two tdpbf16ps.
      p.mr = 32;
      p.a_packed = true;
      break;
    case Isa::llvm:  // same register blocking; LLVM allocates the registers
    case Isa::avx512: {
      // The widest N block sets the register budget for the rows.
      // (A GLU computes the whole 64-column block.)
      const int nz = spec.glu != Glu::none
                         ? 4
                         : static_cast<int>(std::min<int64_t>(4, spec.n / 16 + (spec.n % 16 != 0)));
      p.mr = xbyak::avx512_brgemm_max_mr(nz);
      break;
    }
    case Isa::scalar:
      p.mr = 1;
      break;
  }
  return p;
}

Isa gemm_isa_for_rows(Isa path, int64_t m, const PlanOverrides& o, bool invariant) {
  constexpr int64_t kAmxMinRows = 3;
  if (invariant) return path;
  // A tuned ISA at or below the path (the lattice: scalar < llvm < avx512 < amx).
  if (o.isa && *o.isa <= path && *o.isa != Isa::scalar) return *o.isa;
  return path == Isa::amx && m < kAmxMinRows ? Isa::avx512 : path;
}

void check_prefetch_kib(int kib, Isa isa) {
  if (kib == -1 || !BrgemmDesc::prefetch_allowed(kib, isa))
    throw Error(fmt::format("plan_gemm: tuned prefetch={} on isa={}; allowed: {}", kib,
                            isa_name(isa), BrgemmDesc::prefetch_allowed_text()));
}

GemmPlan plan_gemm(const GemmSpec& spec, Isa isa, const PlanOverrides& o) {
  GemmSpec s = spec;
  if (o.max_kc) s.max_kc = *o.max_kc;
  GemmPlan p = plan_gemm(s, isa);
  if (o.isa && *o.isa == Isa::scalar)
    throw Error(
        fmt::format("plan_gemm: tuned isa={}; allowed: amx, avx512, llvm", isa_name(*o.isa)));
  if (o.mr) {
    // AMX: two 16-row tiles per call, and PackedA's 32-row blocks are what a
    // task's first row must start (the M tails still run 1..31 rows).
    const int lo = isa == Isa::amx ? 32 : 1, hi = p.mr;
    if (*o.mr < lo || *o.mr > hi)
      throw Error(fmt::format("plan_gemm: tuned mr={} for {}; allowed: {}", *o.mr, p.name(),
                              lo == hi ? fmt::format("{}", hi) : fmt::format("{} .. {}", lo, hi)));
    p.tuned_mr = *o.mr != p.mr;
    p.mr = *o.mr;
  }
  if (o.task_rows) {
    constexpr int64_t kMaxTaskRows = 4096;
    if (*o.task_rows < p.mr || *o.task_rows % p.mr != 0 || *o.task_rows > kMaxTaskRows)
      throw Error(
          fmt::format("plan_gemm: tuned task_rows={} for {}; allowed: a multiple of mr={} up to {}",
                      *o.task_rows, p.name(), p.mr, kMaxTaskRows));
    p.tuned_task_rows = *o.task_rows;
  }
  if (o.prefetch_kib) {
    check_prefetch_kib(*o.prefetch_kib, isa);
    p.tuned_prefetch_kib = *o.prefetch_kib;
  }
  if (!o.empty()) p.tuned_entry = o.entry.empty() ? "(unnamed)" : o.entry;
  return p;
}

int64_t GemmPlan::task_rows() const {
  if (tuned_task_rows > 0) return tuned_task_rows;
  return std::max<int64_t>(1, 256 / mr) * mr;
}

GemmPlan::Schedule GemmPlan::schedule(int64_t m, int64_t threads) const {
  Schedule s;
  s.m = m;
  s.n_blocks = spec.n / nb + (spec.n % nb != 0);
  s.task_rows = task_rows();
  // Where the column blocks alone cannot feed the threads, M is cut into
  // row chunks of about equal size, at least enough for them: one column
  // block (N <= 64: a MoE router, a small tensor-parallel shard) and M <= 256
  // was one task, run by one thread while the other waited (an outside
  // tester's find), and M = 256 two tasks of 252 and 4 rows. Whole mr
  // blocks; a tuned task_rows stays as the entry gives it.
  if (tuned_task_rows == 0 && threads > 1 && m > mr && s.n_blocks < threads) {
    // A multiple of threads / gcd(n_blocks, threads) chunks: n_blocks · chunks
    // tasks then split evenly over the threads (3 equal chunks of M = 512 on
    // 2 threads ran 2 on one).
    const int64_t step = threads / std::gcd(s.n_blocks, threads);
    const int64_t chunks = ((m + s.task_rows - 1) / s.task_rows + step - 1) / step * step;
    const int64_t rows = (m + chunks - 1) / chunks;
    s.task_rows = std::max<int64_t>(mr, (rows + mr - 1) / mr * mr);
  }
  // K chunked or not is decided for the whole M (as variants_for says).
  s.k_passes = k_chunks_for(m);
  s.ld_partial = s.k_passes > 1 ? s.n_blocks * nb * 4 : 0;
  const int64_t row_bytes = (a_packed ? packed_a().k_steps() * 64 : 0) + s.ld_partial;
  s.slice_rows =
      row_bytes == 0
          ? std::max<int64_t>(m, 1)
          : std::max<int64_t>(1, Schedule::kScratchBytes / (row_bytes * s.task_rows)) * s.task_rows;
  return s;
}

std::string GemmPlan::Schedule::str() const {
  auto n = [](int64_t v, const char* one, const char* many) {
    return fmt::format("{} {}", v, v == 1 ? one : many);
  };
  const int64_t slice = std::min(slice_rows, m);
  return fmt::format("M={}: {} of {} rows, each {} of {} rows x {} = {} tasks per K pass; {}", m,
                     n(slices(), "slice", "slices"), slice,
                     n(row_chunks(slice), "row chunk", "row chunks"), task_rows,
                     n(n_blocks, "column block", "column blocks"), row_chunks(slice) * n_blocks,
                     n(k_passes, "K pass", "K passes"));
}

std::vector<GemmPlan::Variant> GemmPlan::variants_for(int64_t m) const {
  std::vector<Variant> out;
  std::vector<int> col_variants;
  if (spec.n >= nb) col_variants.push_back(nb);
  if (n_tail != 0) col_variants.push_back(n_tail);
  std::vector<int> row_variants;
  if (m >= mr) row_variants.push_back(mr);
  if (m % mr != 0) row_variants.push_back(static_cast<int>(m % mr));
  std::vector<Chunk> chunks = {Chunk::whole};
  if (k_chunks_for(m) > 1) {  // as schedule(m, threads).k_passes, for any threads
    chunks = {Chunk::first, Chunk::last};
    if (k_chunks > 2) chunks.push_back(Chunk::middle);
  }
  for (int rows : row_variants)
    for (int cols : col_variants)
      for (Chunk c : chunks) out.push_back({rows, cols, c});
  return out;
}

int64_t GemmPlan::chunk_k(Chunk c) const {
  switch (c) {
    case Chunk::whole:
      return spec.k;
    case Chunk::first:
    case Chunk::middle:
      return kc;
    case Chunk::last:
      return spec.k - (k_chunks - 1) * kc;
  }
  return spec.k;
}

BrgemmDesc GemmPlan::ukernel(int rows, int cols, Chunk chunk) const {
  BrgemmDesc d;
  d.isa = isa;
  d.mr = rows;
  d.nr = cols;
  d.kb = chunk_k(chunk);
  d.b_row_bytes = PackedLayout::kRowBytes;  // = Int8Layout::kRowBytes
  if (spec.int8()) {
    d.a_type = DType::u8;
    d.b_type = DType::i8;
    d.acc_type = DType::i32;
  }
  const bool epilogue = chunk == Chunk::whole || chunk == Chunk::last;
  d.bias = epilogue ? spec.bias : BiasKind::none;
  d.act = epilogue ? spec.act : Activation::none;
  d.out = epilogue ? spec.out : spec.int8() ? DType::i32 : DType::f32;
  d.accumulate = chunk == Chunk::middle || chunk == Chunk::last;
  // int8 sums are exact in int32: any chain split gives the same bits.
  d.one_chain = spec.invariant && !spec.int8();
  d.a_packed = a_packed;
  d.prefetch_kib = tuned_prefetch_kib;
  if (spec.glu != Glu::none) {
    // Partial chunks carry all 64 pre-activation columns; the last one pairs them.
    if (epilogue) {
      d.glu = spec.glu;
      d.glu_alpha = spec.glu_alpha;
      d.glu_limit = spec.glu_limit;
    } else {
      d.nr = static_cast<int>(PackedLayout::kBlockN);
    }
  }
  return d;
}

// The plan's name: its ISA and blocking, then the spec's fields, e.g.
// "gemm_avx512_bf16_f32acc_m7n64k4096_nt40_biasbf16_silu_bf16out".
std::string GemmPlan::name() const {
  std::string s = fmt::format("gemm_{}_{}_m{}n{}k{}", isa_name(isa),
                              spec.int8() ? "u8xi8_i32acc" : "bf16_f32acc", mr, nb, spec.k);
  if (n_tail != 0) s += fmt::format("_nt{}", n_tail);
  // The spec's own name less its "gemmn..k.." head (N and K are spelled above).
  const std::string spec_name = desc_name(spec);
  s += spec_name.substr(spec_name.find('_') == std::string::npos ? spec_name.size()
                                                                 : spec_name.find('_'));
  return s;
}

// "gemm;isa=avx512;n=..;k=..;..": the ISA and every field of the spec (the
// rest of the plan follows from them).
std::string GemmPlan::key() const {
  const std::string spec_key = desc_key(spec);
  // A tuned mr or prefetch distance changes the micro-kernels; a tuned task
  // split does not.
  return fmt::format("gemm;isa={}{}{}{}", isa_name(isa), spec_key.substr(spec_key.find(';')),
                     tuned_mr ? fmt::format(";mr={}", mr) : "",
                     tuned_prefetch_kib >= 0 ? fmt::format(";pf={}", tuned_prefetch_kib) : "");
}

std::string GemmPlan::str() const {
  std::string s = fmt::format("plan {}\n", name());
  s += fmt::format("  isa          {}\n", isa_name(isa));
  s += fmt::format("  problem      M=? (symbolic) N={} K={}\n", spec.n, spec.k);
  s += fmt::format(
      "  blocking     BM={} BN={} BK={} KC={}{} ({} accumulators in {})\n", mr, nb,
      isa == Isa::amx ? amx_k_step_of(spec.int8() ? DType::u8 : DType::bf16) : spec.k_group(), kc,
      k_chunks > 1 ? fmt::format(" x {} chunks, partial sums in a scratch", k_chunks)
                   : " (whole K per call)",
      spec.int8() ? "int32" : "fp32", isa == Isa::amx ? "tiles" : "zmm registers");
  s += fmt::format(
      "  tails        M: {}..{} rows by kernel variant; N: {}; K: {}\n", 1, mr - 1,
      n_tail ? fmt::format("{} columns, masked stores", n_tail) : "none",
      a_packed ? (spec.k % 32 ? fmt::format("{} (zero-padded packed A)", spec.k % 32) : "none")
               : (spec.k % 2 ? "odd k (zero-extended A)" : "none"));
  s += fmt::format("  epilogue     bias={} act={} out={}\n", bias_kind_name(spec.bias),
                   activation_name(spec.act), dtype_name(spec.out));
  if (a_packed) s += "  activations  repacked per call into 32-row AMX tile blocks (PackedA)\n";
  s += fmt::format("  weights      packed {}",
                   spec.int8() ? "i8_vnni4_n64k64" : "bf16_vnni2_n64k32");
  if (!tuned_entry.empty())
    s += fmt::format("\n  tuned        entry {}: mr={}{} task_rows={} max_kc={}{}", tuned_entry, mr,
                     tuned_mr ? " (tuned)" : "", task_rows(), spec.max_kc,
                     tuned_prefetch_kib >= 0 ? fmt::format(" prefetch={} KiB", tuned_prefetch_kib)
                                             : std::string());
  return s;
}

const char* bias_kind_name(BiasKind b) {
  switch (b) {
    case BiasKind::none:
      return "none";
    case BiasKind::f32:
      return "f32";
    case BiasKind::bf16:
      return "bf16";
  }
  return "?";
}

const char* glu_name(Glu g) {
  switch (g) {
    case Glu::none:
      return "none";
    case Glu::act_mul:
      return "and_mul";
    case Glu::clamped_swiglu:
      return "clamped_swiglu";
  }
  return "?";
}

namespace {

const char* chunk_name(GemmPlan::Chunk c) {
  switch (c) {
    case GemmPlan::Chunk::whole:
      return "whole K";
    case GemmPlan::Chunk::first:
      return "first K chunk";
    case GemmPlan::Chunk::middle:
      return "middle K chunk";
    case GemmPlan::Chunk::last:
      return "last K chunk";
  }
  return "?";
}

}  // namespace

std::vector<KernelUse> plan_kernels(const GemmPlan& plan, std::optional<int64_t> m) {
  using Chunk = GemmPlan::Chunk;
  const bool full_block = plan.spec.n >= plan.nb;
  const bool tail_block = plan.n_tail != 0;
  // (chunk, -rows, n_tail): main blocks before tails, K chunks in order.
  std::set<std::tuple<int, int, bool>> uses;
  auto add = [&](Chunk c, int rows) {
    if (full_block) uses.insert({static_cast<int>(c), -rows, false});
    if (tail_block) uses.insert({static_cast<int>(c), -rows, true});
  };
  if (!m) {
    add(Chunk::whole, plan.mr);
    if (plan.k_chunks > 1) {
      add(Chunk::first, plan.mr);
      if (plan.k_chunks > 2) add(Chunk::middle, plan.mr);
      add(Chunk::last, plan.mr);
    }
  } else {
    // What the GEMM driver runs for m rows, from the plan's own list.
    for (const auto& v : plan.variants_for(*m))
      uses.insert({static_cast<int>(v.chunk), -v.rows, v.cols != plan.nb});
  }
  std::vector<KernelUse> out;
  for (const auto& [c, neg_rows, tail] : uses) {
    const int rows = -neg_rows;
    const Chunk chunk = static_cast<Chunk>(c);
    std::string role;
    if (rows == plan.mr)
      role = tail ? fmt::format("N tail ({} cols)", plan.n_tail) : "main block";
    else
      role = tail ? fmt::format("M tail ({} row{}) x N tail ({} cols)", rows, rows == 1 ? "" : "s",
                                plan.n_tail)
                  : fmt::format("M tail ({} row{})", rows, rows == 1 ? "" : "s");
    if (chunk != Chunk::whole) role += fmt::format(", {}", chunk_name(chunk));
    out.push_back({role, plan.ukernel(rows, tail ? plan.n_tail : plan.nb, chunk)});
  }
  return out;
}

}  // namespace tilejit::codegen
