// tilejit::fused_experts: argument checks, token grouping, and the two GEMM
// phases of a mixture-of-experts layer on the brgemm micro-kernels.
//
//   1. Route: a counting sort of the T·k (token, slot) pairs by expert gives
//      each expert a contiguous run of rows; its tokens' hidden rows are
//      gathered into that run (the micro-kernels take evenly strided A rows).
//   2. Gate/up: per (expert, row chunk, 32-output block) task, one GEMM whose
//      epilogue is the act-and-mul (Glu): the packed block holds 32 gate and
//      the matching 32 up columns, paired in registers, stored once as bf16.
//   3. Down: per 64-column block of H task, every expert's rows in turn: the
//      micro-kernel's f32 tile (+ b2) is scaled by the routing weight and
//      added into the task's [T, 64] f32 accumulator while it is hot, so no
//      [T·k, H] tensor is ever written; the block is stored once, in the
//      output dtype. A shared expert is one more group with weight 1.
// Every task of phase 2 is an (expert, N-block) pair and every task of phase
// 3 covers all experts of one N-block, so a single hot expert still spreads
// over every core.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/packed_layout.h"
#include "ir/activation.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/packed_experts_impl.h"
#include "ops/tensor_checks.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

namespace tilejit {
namespace {

constexpr const char* kOp = "fused_experts";

const PackedExperts::Impl& need_experts(const PackedExperts& w, const char* arg, ExpertProj proj) {
  if (w.empty())
    throw Error(fmt::format(
        "{}: {} is an empty PackedExperts; allowed: experts from pack_experts()", kOp, arg));
  if (w.impl()->proj != proj)
    throw Error(fmt::format("{}: {} was packed as ExpertProj::{}; allowed: ExpertProj::{}", kOp,
                            arg, proj == ExpertProj::gate_up ? "down" : "gate_up",
                            proj == ExpertProj::gate_up ? "gate_up" : "down"));
  return *w.impl();
}

void check_bias(const std::optional<TensorView>& b, const char* arg, int64_t e, int64_t n) {
  if (!b) return;
  ops::check_view(kOp, arg, *b, 2);
  ops::check_dtype(kOp, arg, *b, {DType::f32});
  ops::check_row_major_rows(kOp, arg, *b);
  if (b->shape[0] != e || b->shape[1] != n)
    throw Error(fmt::format("{}: {} has shape {}; allowed: [{}, {}]", kOp, arg,
                            ops::shape_str(b->shape), e, n));
}

struct Dims {
  int64_t T = 0, H = 0, I = 0, E = 0, k = 0;
};

Dims check_args(const TensorView& hidden, const PackedExperts::Impl& w13,
                const PackedExperts::Impl& w2, const TensorView& weights, const TensorView& ids,
                const TensorView& out, const MoeOptions& opt) {
  ops::check_view(kOp, "hidden", hidden, 2);
  ops::check_dtype(kOp, "hidden", hidden, {DType::bf16});
  ops::check_row_major_rows(kOp, "hidden", hidden);
  ops::check_view(kOp, "out", out, 2);
  ops::check_dtype(kOp, "out", out, {DType::bf16, DType::f32});
  ops::check_row_major_rows(kOp, "out", out);
  ops::check_view(kOp, "topk_weights", weights, 2);
  ops::check_dtype(kOp, "topk_weights", weights, {DType::f32});
  ops::check_view(kOp, "topk_ids", ids, 2);
  ops::check_dtype(kOp, "topk_ids", ids, {DType::i32});
  Dims d;
  d.T = hidden.shape[0];
  d.H = hidden.shape[1];
  d.E = w13.experts;
  d.I = w13.n;
  d.k = ids.shape[1];
  if (w13.k != d.H)
    throw Error(
        fmt::format("{}: hidden has shape {} but w13 takes H = {}; allowed: hidden.shape[1] "
                    "== w13.k()",
                    kOp, ops::shape_str(hidden.shape), w13.k));
  if (w2.experts != d.E)
    throw Error(fmt::format("{}: w2 has {} experts; allowed: w13's {}", kOp, w2.experts, d.E));
  if (w2.n != d.H || w2.k != d.I)
    throw Error(fmt::format("{}: w2 is [E, {}, {}]; allowed: [E, H, I] = [E, {}, {}]", kOp, w2.n,
                            w2.k, d.H, d.I));
  if (out.shape[0] != d.T || out.shape[1] != d.H)
    throw Error(fmt::format("{}: out has shape {}; allowed: [T, H] = [{}, {}]", kOp,
                            ops::shape_str(out.shape), d.T, d.H));
  if (ids.shape[0] != d.T || d.k < 1)
    throw Error(fmt::format("{}: topk_ids has shape {}; allowed: [T, k] = [{}, k >= 1]", kOp,
                            ops::shape_str(ids.shape), d.T));
  if (weights.shape != ids.shape)
    throw Error(fmt::format("{}: topk_weights has shape {}; allowed: topk_ids' shape {}", kOp,
                            ops::shape_str(weights.shape), ops::shape_str(ids.shape)));
  if (d.k > d.E)
    throw Error(fmt::format("{}: topk_ids has shape {}; allowed: k <= E = {}", kOp,
                            ops::shape_str(ids.shape), d.E));
  if (opt.clamped_swiglu) {
    if (!std::isfinite(opt.swiglu_alpha) || !std::isfinite(opt.swiglu_limit) ||
        opt.swiglu_limit <= 0)
      throw Error(fmt::format("{}: clamped swiglu alpha={} limit={}; allowed: finite, limit > 0",
                              kOp, opt.swiglu_alpha, opt.swiglu_limit));
  } else if (!ir::is_gated_activation(opt.act)) {
    throw Error(
        fmt::format("{}: act={} is not a gated activation; allowed: {}, or clamped_swiglu = true",
                    kOp, ir::activation_str(opt.act), ir::activation_list(true)));
  }
  check_bias(opt.b13, "b13", d.E, 2 * d.I);
  check_bias(opt.b2, "b2", d.E, d.H);
  // out is accumulated into while every input is still read.
  ops::check_output(kOp, "out", out,
                    {{"hidden", &hidden},
                     {"topk_weights", &weights},
                     {"topk_ids", &ids},
                     {"b13", ops::opt_view(opt.b13)},
                     {"b2", ops::opt_view(opt.b2)}});
  if ((opt.shared_w13 == nullptr) != (opt.shared_w2 == nullptr))
    throw Error(
        fmt::format("{}: only one of shared_w13 / shared_w2 is given; allowed: both or none", kOp));
  if (opt.shared_w13 != nullptr) {
    const auto& s13 = need_experts(*opt.shared_w13, "shared_w13", ExpertProj::gate_up);
    const auto& s2 = need_experts(*opt.shared_w2, "shared_w2", ExpertProj::down);
    if (s13.experts != 1 || s2.experts != 1)
      throw Error(fmt::format("{}: the shared expert packs hold {} and {} experts; allowed: 1", kOp,
                              s13.experts, s2.experts));
    if (s13.k != d.H || s2.n != d.H || s2.k != s13.n)
      throw Error(
          fmt::format("{}: shared expert is [2·{}, {}] / [{}, {}]; allowed: [2·Is, H] / "
                      "[H, Is] with H = {}",
                      kOp, s13.n, s13.k, s2.n, s2.k, d.H));
  }
  // Every id is checked before anything is read through it.
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t e =
          static_cast<const int32_t*>(ids.data)[t * ids.strides[0] + j * ids.strides[1]];
      if (e < 0 || e >= d.E)
        throw Error(fmt::format("{}: topk_ids[{}, {}] = {} is out of range; allowed: [0, {})", kOp,
                                t, j, e, d.E));
    }
  return d;
}

// ---- the scalar path ---------------------------------------------------------

float gated(const MoeOptions& opt, float g, float u) {
  if (opt.clamped_swiglu) {
    g = std::min(g, opt.swiglu_limit);
    u = std::clamp(u, -opt.swiglu_limit, opt.swiglu_limit);
    return g / (1.0f + std::exp(-opt.swiglu_alpha * g)) * (u + 1.0f);
  }
  switch (opt.act) {
    case Activation::silu:
      return g / (1.0f + std::exp(-g)) * u;
    case Activation::gelu_tanh:
      return 0.5f * g * (1.0f + std::tanh(0.7978845608f * (g + 0.044715f * g * g * g))) * u;
    default:
      return 0.5f * g * (1.0f + std::erf(g * 0.70710678f)) * u;
  }
}

// One expert on one token, accumulated into acc[H] with weight w: reads the
// packed layouts element by element (the oracle-grade fallback, no JIT).
void scalar_expert(const PackedExperts::Impl& w13, const PackedExperts::Impl& w2, int64_t e,
                   const uint16_t* x, const float* b13, const float* b2, float w,
                   const MoeOptions& opt, std::vector<float>& act, float* acc) {
  using runtime::bf16_to_f32;
  const int64_t H = w13.k, I = w13.n;
  const auto* p13 = reinterpret_cast<const uint16_t*>(w13.expert(e));
  const auto* p2 = reinterpret_cast<const uint16_t*>(w2.expert(e));
  act.resize(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    const int64_t pg = i / 32 * 64 + i % 32;  // packed rows of gate i and up i
    float g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      const float xv = bf16_to_f32(x[h]);
      g += xv * bf16_to_f32(p13[w13.layout.index(pg, h)]);
      u += xv * bf16_to_f32(p13[w13.layout.index(pg + 32, h)]);
    }
    if (b13 != nullptr) {
      g += b13[i];
      u += b13[I + i];
    }
    // The JIT path stores the activation as bf16: round it the same way.
    act[i] = bf16_to_f32(runtime::f32_to_bf16(gated(opt, g, u)));
  }
  for (int64_t h = 0; h < H; ++h) {
    float s = b2 != nullptr ? b2[h] : 0.0f;
    for (int64_t i = 0; i < I; ++i) s += act[i] * bf16_to_f32(p2[w2.layout.index(h, i)]);
    acc[h] += w * s;
  }
}

void store_row(const float* acc, const TensorView& out, int64_t t, int64_t c0, int64_t n) {
  if (out.dtype == DType::f32) {
    std::memcpy(static_cast<float*>(out.data) + t * out.strides[0] + c0, acc, n * sizeof(float));
  } else {
    auto* o = static_cast<uint16_t*>(out.data) + t * out.strides[0] + c0;
    for (int64_t c = 0; c < n; ++c) o[c] = runtime::f32_to_bf16(acc[c]);
  }
}

void run_scalar(const Dims& d, const TensorView& hidden, const PackedExperts::Impl& w13,
                const PackedExperts::Impl& w2, const TensorView& weights, const TensorView& ids,
                const TensorView& out, const MoeOptions& opt) {
  runtime::parallel_for(d.T, [&](int64_t t) {
    std::vector<float> acc(static_cast<size_t>(d.H), 0.0f), act;
    const auto* x = static_cast<const uint16_t*>(hidden.data) + t * hidden.strides[0];
    for (int64_t j = 0; j < d.k; ++j) {
      const int32_t e =
          static_cast<const int32_t*>(ids.data)[t * ids.strides[0] + j * ids.strides[1]];
      const float w =
          static_cast<const float*>(weights.data)[t * weights.strides[0] + j * weights.strides[1]];
      const float* b13 =
          opt.b13 ? static_cast<const float*>(opt.b13->data) + e * opt.b13->strides[0] : nullptr;
      const float* b2 =
          opt.b2 ? static_cast<const float*>(opt.b2->data) + e * opt.b2->strides[0] : nullptr;
      scalar_expert(w13, w2, e, x, b13, b2, w * opt.routed_scaling_factor, opt, act, acc.data());
    }
    if (opt.shared_w13 != nullptr)
      scalar_expert(*opt.shared_w13->impl(), *opt.shared_w2->impl(), 0, x, nullptr, nullptr, 1.0f,
                    opt, act, acc.data());
    store_row(acc.data(), out, t, 0, d.H);
  });
}

// ---- the JIT path ----------------------------------------------------------------

// A run of rows that share one expert's weights.
struct Group {
  const PackedExperts::Impl* w13 = nullptr;
  const PackedExperts::Impl* w2 = nullptr;
  int64_t expert = 0;
  const uint8_t* a = nullptr;  // first A row (gathered rows, or hidden itself)
  int64_t lda = 0;
  int64_t rows = 0;
  int64_t row0 = 0;            // first row in row_token / row_weight / the act buffer
  uint16_t* act = nullptr;     // act(gate)·up rows of this group, bf16
  int64_t ld_act = 0;          // bytes between act rows
  const float* b13 = nullptr;  // permuted: 64 per packed block (32 gate, 32 up)
  const float* b2 = nullptr;   // [H]
  ops::GemmExecutable* up = nullptr;
  ops::GemmExecutable* down = nullptr;
  // AMX (plan.a_packed): the group's A rows and act rows repacked into the
  // PackedA tile layout, once per call, before the tasks that read them.
  const uint8_t* a_packed = nullptr;
  const uint8_t* act_packed = nullptr;
};

// The K of a group's gate/up (H) or down (its own I: the shared expert's
// may differ from the routed ones') GEMM.
int64_t group_k(const Group& g, bool act) {
  return (act ? g.down : g.up)->plan().spec.k;
}

// Packs every group's rows of one operand (A = hidden rows, or act) into the
// PackedA layout, each group from a 32-row block boundary of one scratch,
// and points the group's `field` there.
void pack_groups(std::vector<Group>& groups, bool act, int slot, const uint8_t* Group::*field) {
  std::vector<int64_t> off(groups.size() + 1, 0);
  for (size_t i = 0; i < groups.size(); ++i)
    off[i + 1] = off[i] + codegen::PackedA{group_k(groups[i], act)}.bytes(groups[i].rows);
  uint8_t* buf = ops::packed_a_scratch(slot, off.back());
  runtime::parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t i) {
    Group& g = groups[i];
    const int64_t k = group_k(g, act);
    if (act)
      ops::pack_a_rows(reinterpret_cast<const uint8_t*>(g.act), g.ld_act, g.rows, k, buf + off[i]);
    else
      ops::pack_a_rows(g.a, g.lda, g.rows, k, buf + off[i]);
    g.*field = buf + off[i];
  });
}

codegen::GemmSpec gate_up_spec(int64_t I, int64_t H, bool bias, const MoeOptions& opt) {
  codegen::GemmSpec s;
  s.n = I;
  s.k = H;
  s.bias = bias ? codegen::BiasKind::f32 : codegen::BiasKind::none;
  s.out = DType::bf16;
  if (opt.clamped_swiglu) {
    s.glu = codegen::Glu::clamped_swiglu;
    s.glu_alpha = opt.swiglu_alpha;
    s.glu_limit = opt.swiglu_limit;
  } else {
    s.glu = codegen::Glu::act_mul;
    s.act = opt.act;
  }
  return s;
}

codegen::GemmSpec down_spec(int64_t H, int64_t I, bool bias) {
  codegen::GemmSpec s;
  s.n = H;
  s.k = I;
  s.bias = bias ? codegen::BiasKind::f32 : codegen::BiasKind::none;
  s.out = DType::f32;
  return s;
}

// Per-call scratch, reused by the calling thread across calls.
struct Scratch {
  std::vector<int32_t> row_token;
  std::vector<float> row_weight;
  std::vector<uint16_t> a;    // gathered hidden rows
  std::vector<uint16_t> act;  // gate/up outputs
  std::vector<float> b13;     // permuted biases of the active experts
};

void run_jit(const Dims& d, Isa isa, const TensorView& hidden, const PackedExperts::Impl& w13,
             const PackedExperts::Impl& w2, const TensorView& weights, const TensorView& ids,
             const TensorView& out, const MoeOptions& opt) {
  // A named reference: lambdas running on pool threads must see this thread's
  // scratch, not their own thread_local instance.
  thread_local Scratch tls_scratch;
  Scratch& sc = tls_scratch;
  const int64_t T = d.T, H = d.H, I = d.I, E = d.E, K = d.k;
  const int64_t routed = T * K;
  const int64_t I_pad = (I + 31) / 32 * 32;  // act rows 64-byte aligned

  // 1. Counting sort of the (token, slot) pairs by expert.
  std::vector<int64_t> start(static_cast<size_t>(E + 1), 0);
  auto id_at = [&](int64_t t, int64_t j) {
    return static_cast<const int32_t*>(ids.data)[t * ids.strides[0] + j * ids.strides[1]];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) ++start[id_at(t, j) + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  const bool shared = opt.shared_w13 != nullptr;
  sc.row_token.resize(static_cast<size_t>(routed + (shared ? T : 0)));
  sc.row_weight.resize(sc.row_token.size());
  {
    std::vector<int64_t> fill(start.begin(), start.end() - 1);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < K; ++j) {
        const int64_t r = fill[id_at(t, j)]++;
        sc.row_token[r] = static_cast<int32_t>(t);
        sc.row_weight[r] = opt.routed_scaling_factor *
                           static_cast<const float*>(
                               weights.data)[t * weights.strides[0] + j * weights.strides[1]];
      }
  }

  // Groups: the active experts, then the shared expert on every token.
  const bool b13 = opt.b13.has_value(), b2 = opt.b2.has_value();
  ops::GemmExecutable& up = ops::gemm_executable(gate_up_spec(I, H, b13, opt), isa);
  ops::GemmExecutable& down = ops::gemm_executable(down_spec(H, I, b2), isa);
  std::vector<Group> groups;
  const int64_t n_up_blocks = (I + 31) / 32;
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += start[e + 1] > start[e];
  sc.a.resize(static_cast<size_t>(routed * H));
  sc.act.resize(static_cast<size_t>(routed * I_pad));
  if (b13) sc.b13.assign(static_cast<size_t>(active * n_up_blocks * 64), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    if (start[e + 1] == start[e]) continue;
    Group g;
    g.w13 = &w13;
    g.w2 = &w2;
    g.expert = e;
    g.row0 = start[e];
    g.rows = start[e + 1] - start[e];
    g.a = reinterpret_cast<const uint8_t*>(sc.a.data() + g.row0 * H);
    g.lda = H * 2;
    g.act = sc.act.data() + g.row0 * I_pad;
    g.ld_act = I_pad * 2;
    if (b13) {
      // The bias in the packed block order: 32 gate entries, then the 32 up ones.
      float* pb = sc.b13.data() + static_cast<int64_t>(groups.size()) * n_up_blocks * 64;
      const float* src = static_cast<const float*>(opt.b13->data) + e * opt.b13->strides[0];
      for (int64_t i = 0; i < I; ++i) {
        pb[i / 32 * 64 + i % 32] = src[i];
        pb[i / 32 * 64 + 32 + i % 32] = src[I + i];
      }
      g.b13 = pb;
    }
    if (b2) g.b2 = static_cast<const float*>(opt.b2->data) + e * opt.b2->strides[0];
    g.up = &up;
    g.down = &down;
    groups.push_back(g);
  }
  std::vector<uint16_t> shared_act;
  if (shared) {
    const auto& s13 = *opt.shared_w13->impl();
    const auto& s2 = *opt.shared_w2->impl();
    const int64_t Is_pad = (s13.n + 31) / 32 * 32;
    shared_act.resize(static_cast<size_t>(T * Is_pad));
    Group g;
    g.w13 = &s13;
    g.w2 = &s2;
    g.row0 = routed;
    g.rows = T;
    g.a = static_cast<const uint8_t*>(hidden.data);  // every token, in order: no gather
    g.lda = hidden.strides[0] * 2;
    g.act = shared_act.data();
    g.ld_act = Is_pad * 2;
    g.up = &ops::gemm_executable(gate_up_spec(s13.n, H, false, opt), isa);
    g.down = &ops::gemm_executable(down_spec(H, s13.n, false), isa);
    for (int64_t t = 0; t < T; ++t) {
      sc.row_token[routed + t] = static_cast<int32_t>(t);
      sc.row_weight[routed + t] = 1.0f;
    }
    groups.push_back(g);
  }

  // Gather the routed rows (hidden may be strided; the runs must be dense).
  const auto* hb = static_cast<const uint16_t*>(hidden.data);
  constexpr int64_t kGatherRows = 64;
  runtime::parallel_for((routed + kGatherRows - 1) / kGatherRows, [&](int64_t c) {
    const int64_t r1 = std::min(routed, (c + 1) * kGatherRows);
    for (int64_t r = c * kGatherRows; r < r1; ++r)
      std::memcpy(sc.a.data() + r * H, hb + sc.row_token[r] * hidden.strides[0], H * 2);
  });

  // 2. Gate/up with the act-and-mul epilogue: (group, row chunk, block) tasks.
  struct UpTask {
    int32_t g;
    int32_t block;
    int64_t m0, rows;
  };
  std::vector<UpTask> up_tasks;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    const int64_t chunk = g.up->plan().task_rows();
    const int64_t blocks = (g.w13->n + 31) / 32;
    for (int64_t m0 = 0; m0 < g.rows; m0 += chunk)
      for (int64_t b = 0; b < blocks; ++b)
        up_tasks.push_back(
            {static_cast<int32_t>(gi), static_cast<int32_t>(b), m0, std::min(chunk, g.rows - m0)});
  }
  if (up.plan().a_packed) pack_groups(groups, false, 2, &Group::a_packed);
  runtime::parallel_for(static_cast<int64_t>(up_tasks.size()), [&](int64_t ti) {
    const UpTask& t = up_tasks[ti];
    const Group& g = groups[t.g];
    const int64_t blocks = (g.w13->n + 31) / 32;
    ops::RowBlockJob job;
    job.a = g.a_packed != nullptr ? g.a_packed + codegen::PackedA{H}.offset(t.m0, 0)
                                  : g.a + t.m0 * g.lda;
    job.lda = g.lda;
    job.rows = t.rows;
    job.b_block = g.w13->expert(g.expert) + t.block * g.w13->block_bytes();
    job.c = reinterpret_cast<uint8_t*>(g.act) + t.m0 * g.ld_act + t.block * 32 * 2;
    job.ldc = g.ld_act;
    job.bias = g.b13 != nullptr ? g.b13 + t.block * 64 : nullptr;
    job.n_tail = t.block == blocks - 1 && g.w13->n % 32 != 0;
    ops::run_row_block(*g.up, job);
  });

  // 3. Down projection + weighted sum, one 64-column block of H per task.
  const int64_t n_down_blocks = (H + 63) / 64;
  if (down.plan().a_packed) pack_groups(groups, true, 3, &Group::act_packed);
  runtime::parallel_for(n_down_blocks, [&](int64_t nb) {
    const int64_t c0 = nb * 64, ncols = std::min<int64_t>(64, H - c0);
    thread_local std::vector<float> acc, tile;
    acc.assign(static_cast<size_t>(T * 64), 0.0f);
    constexpr int64_t kTileRows = 64;
    tile.resize(static_cast<size_t>(kTileRows * 64));
    for (const Group& g : groups) {
      for (int64_t m0 = 0; m0 < g.rows; m0 += kTileRows) {
        const int64_t rows = std::min(kTileRows, g.rows - m0);
        ops::RowBlockJob job;
        job.a = g.act_packed != nullptr
                    ? g.act_packed + codegen::PackedA{group_k(g, true)}.offset(m0, 0)
                    : reinterpret_cast<const uint8_t*>(g.act) + m0 * g.ld_act;
        job.lda = g.ld_act;
        job.rows = rows;
        job.b_block = g.w2->expert(g.expert) + nb * g.w2->block_bytes();
        job.c = reinterpret_cast<uint8_t*>(tile.data());
        job.ldc = 64 * 4;
        job.bias = g.b2 != nullptr ? g.b2 + c0 : nullptr;
        job.n_tail = ncols < 64;
        ops::run_row_block(*g.down, job);
        // The weighted sum, while the tile is in L1.
        for (int64_t r = 0; r < rows; ++r) {
          const float w = sc.row_weight[g.row0 + m0 + r];
          float* dst = acc.data() + sc.row_token[g.row0 + m0 + r] * 64;
          const float* src = tile.data() + r * 64;
          for (int64_t c = 0; c < ncols; ++c) dst[c] += w * src[c];
        }
      }
    }
    for (int64_t t = 0; t < T; ++t) store_row(acc.data() + t * 64, out, t, c0, ncols);
  });
}

}  // namespace

void fused_experts(const TensorView& hidden, const PackedExperts& w13, const PackedExperts& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const MoeOptions& opt) {
  const auto& p13 = need_experts(w13, "w13", ExpertProj::gate_up);
  const auto& p2 = need_experts(w2, "w2", ExpertProj::down);
  const Dims d = check_args(hidden, p13, p2, topk_weights, topk_ids, out, opt);
  if (d.T == 0) return;
  const Isa isa = runtime::active_isa();
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr, "tilejit: fused_experts T=%lld H=%lld I=%lld E=%lld k=%lld path=%s\n",
                 static_cast<long long>(d.T), static_cast<long long>(d.H),
                 static_cast<long long>(d.I), static_cast<long long>(d.E),
                 static_cast<long long>(d.k), isa_name(isa));
  if (isa == Isa::scalar) return run_scalar(d, hidden, p13, p2, topk_weights, topk_ids, out, opt);
  run_jit(d, isa, hidden, p13, p2, topk_weights, topk_ids, out, opt);
}

}  // namespace tilejit
