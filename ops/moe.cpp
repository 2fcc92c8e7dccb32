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
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/packed_layout.h"
#include "ir/activation.h"
#include "jit/tuning_db.h"
#include "ops/gemm_executable.h"
#include "ops/gemm_task.h"
#include "ops/moe_quant.h"
#include "ops/packed_experts_impl.h"
#include "ops/quant_weight.h"
#include "ops/tensor_checks.h"
#include "runtime/batch_invariant.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "runtime/per_thread.h"
#include "runtime/reference_gemm.h"
#include "runtime/reference_quant.h"
#include "runtime/scratch_limits.h"
#include "runtime/thread_pool.h"
#include "runtime/verbose.h"

#include "runtime/api_guard.h"

namespace tilejit {
namespace {

constexpr const char* kOp = "fused_experts";

// Token t's weight of the shared expert: MoeOptions::shared_weights[t], or 1.
float shared_weight(const MoeOptions& opt, int64_t t) {
  if (!opt.shared_weights) return 1.0f;
  return static_cast<const float*>(opt.shared_weights->data)[t * opt.shared_weights->strides[0]];
}

// The experts of one projection: w2's packed as down; w13's as gate_up or,
// for a non-gated MLP, up (`first`: w13's, or the routed w13's proj for the
// shared expert, which must match it).
const PackedExperts::Impl& need_experts(const PackedExperts& w, const char* arg, ExpertProj proj,
                                        std::optional<ExpertProj> first = std::nullopt) {
  using Impl = PackedExperts::Impl;
  if (w.empty())
    throw Error(fmt::format(
        "{}: {} is an empty PackedExperts; allowed: experts from pack_experts()", kOp, arg));
  const ExpertProj got = w.impl()->proj;
  if (proj == ExpertProj::down) {
    if (got != ExpertProj::down)
      throw Error(fmt::format("{}: {} was packed as ExpertProj::{}; allowed: ExpertProj::down", kOp,
                              arg, Impl::proj_name(got)));
  } else if (first) {
    if (got != *first)
      throw Error(fmt::format(
          "{}: {} was packed as ExpertProj::{}; allowed: ExpertProj::{}, as w13 (a gated and a "
          "non-gated MLP take one activation rule each)",
          kOp, arg, Impl::proj_name(got), Impl::proj_name(*first)));
  } else if (got == ExpertProj::down) {
    throw Error(fmt::format(
        "{}: {} was packed as ExpertProj::down; allowed: ExpertProj::gate_up, or ExpertProj::up "
        "(a non-gated MLP)",
        kOp, arg));
  }
  return *w.impl();
}

void check_bias(const std::optional<TensorView>& b, const char* arg, int64_t e, int64_t n) {
  if (!b) return;
  ops::check_view(kOp, arg, *b, 2);
  ops::check_dtype(kOp, arg, *b, {DType::f32, DType::bf16});  // bf16: GPT-OSS's checkpoints
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
  // f32, or bf16 (a bf16 router's softmax); int32 ids, or int64 (torch.topk's).
  ops::check_dtype(kOp, "topk_weights", weights, {DType::f32, DType::bf16});
  ops::check_view(kOp, "topk_ids", ids, 2);
  ops::check_index_dtype(kOp, "topk_ids", ids);
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
  if (w13.format != w2.format)
    throw Error(fmt::format("{}: w13 is {} ({}) but w2 is {} ({}); allowed: both in one format",
                            kOp, weight_format_name(w13.format), w13.layout_name,
                            weight_format_name(w2.format), w2.layout_name));
  const bool any_int8 = w13.format == WeightFormat::int8 ||
                        (opt.shared_w13 != nullptr && opt.shared_w13->impl() != nullptr &&
                         opt.shared_w13->impl()->format == WeightFormat::int8);
  if (opt.act_quant == ActQuant::fixed) {
    if (!any_int8)
      throw Error(fmt::format(
          "{}: act_quant=fixed with {} experts and no int8 shared expert; allowed: fixed only "
          "with int8 (W8A8) experts (other formats do not quantize activations)",
          kOp, weight_format_name(w13.format)));
    ops::check_fixed_act_quant(kOp, "act_scale13", opt.act_scale13, "act_zero_point13",
                               opt.act_zero_point13);
    ops::check_fixed_act_quant(kOp, "act_scale2", opt.act_scale2, "act_zero_point2",
                               opt.act_zero_point2);
  } else {
    ops::check_act_quant(kOp, opt.act_quant);
  }
  ops::check_int4_route(opt.int4_route, kOp);
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
  ops::check_finite(kOp, "routed_scaling_factor", opt.routed_scaling_factor);
  if (!w13.gated()) {
    // A non-gated MLP (w13 packed ExpertProj::up): act(up) alone.
    if (opt.clamped_swiglu)
      throw Error(fmt::format(
          "{}: clamped_swiglu with w13 packed as ExpertProj::up; allowed: a gated w13 (gate_up), "
          "or a plain act ({}) for a non-gated one",
          kOp, ir::activation_list(false)));
    ir::check_activation(kOp, opt.act);
  } else if (opt.clamped_swiglu) {
    if (!std::isfinite(opt.swiglu_alpha) || !std::isfinite(opt.swiglu_limit) ||
        opt.swiglu_limit <= 0)
      throw Error(fmt::format("{}: clamped swiglu alpha={} limit={}; allowed: finite, limit > 0",
                              kOp, opt.swiglu_alpha, opt.swiglu_limit));
  } else if (!ir::is_gated_activation(opt.act)) {
    throw Error(
        fmt::format("{}: act={} is not a gated activation; allowed: {}, or clamped_swiglu = true",
                    kOp, ir::activation_str(opt.act), ir::activation_list(true)));
  }
  check_bias(opt.b13, "b13", d.E, w13.gated() ? 2 * d.I : d.I);
  check_bias(opt.b2, "b2", d.E, d.H);
  // out is accumulated into while every input is still read.
  ops::check_output(kOp, "out", out,
                    {{"hidden", &hidden},
                     {"topk_weights", &weights},
                     {"topk_ids", &ids},
                     {"b13", ops::opt_view(opt.b13)},
                     {"b2", ops::opt_view(opt.b2)},
                     {"shared_weights", ops::opt_view(opt.shared_weights)}});
  if ((opt.shared_w13 == nullptr) != (opt.shared_w2 == nullptr))
    throw Error(
        fmt::format("{}: only one of shared_w13 / shared_w2 is given; allowed: both or none", kOp));
  if (opt.shared_weights) {
    if (opt.shared_w13 == nullptr)
      throw Error(fmt::format(
          "{}: shared_weights given without a shared expert; allowed: with shared_w13 / shared_w2",
          kOp));
    ops::check_view(kOp, "shared_weights", *opt.shared_weights, 1);
    ops::check_dtype(kOp, "shared_weights", *opt.shared_weights, {DType::f32, DType::bf16});
    if (opt.shared_weights->shape[0] != d.T)
      throw Error(fmt::format("{}: shared_weights has shape {}; allowed: [T] = [{}]", kOp,
                              ops::shape_str(opt.shared_weights->shape), d.T));
  }
  if (opt.shared_w13 != nullptr) {
    const auto& s13 = need_experts(*opt.shared_w13, "shared_w13", ExpertProj::gate_up, w13.proj);
    const auto& s2 = need_experts(*opt.shared_w2, "shared_w2", ExpertProj::down);
    if (s13.format != s2.format)
      throw Error(
          fmt::format("{}: shared_w13 is {} but shared_w2 is {}; allowed: both in one format", kOp,
                      weight_format_name(s13.format), weight_format_name(s2.format)));
    if (s13.experts != 1 || s2.experts != 1)
      throw Error(fmt::format("{}: the shared expert packs hold {} and {} experts; allowed: 1", kOp,
                              s13.experts, s2.experts));
    if (s13.k != d.H || s2.n != d.H || s2.k != s13.n) {
      const char* rows = s13.gated() ? "2·" : "";
      throw Error(fmt::format(
          "{}: shared expert is [{}{}, {}] / [{}, {}]; allowed: [{}Is, H] / [H, Is] with H = {}",
          kOp, rows, s13.n, s13.k, s2.n, s2.k, rows, d.H));
    }
  }
  // Every id is checked before anything is read through it.
  for (int64_t t = 0; t < d.T; ++t)
    for (int64_t j = 0; j < d.k; ++j) {
      // Widened: an int64 id past 2^31 is refused by its value, not wrapped.
      const int64_t e = ops::index_at(ids, t * ids.strides[0] + j * ids.strides[1]);
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

// Weight (logical row r, column c) of expert e of any format, in double.
double expert_weight(const PackedExperts::Impl& w, int64_t e, int64_t r, int64_t c) {
  if (!w.quant.empty()) return ops::weight_value(w.q(e), r, c);
  const int64_t p = w.proj == ExpertProj::gate_up ? w.glu_packed_row(r) : r;
  return runtime::bf16_to_f32(reinterpret_cast<const uint16_t*>(w.expert(e))[w.layout.index(p, c)]);
}

// A projection's input row as its kernels see it: the bf16 values, or for
// int8 weights and int4 ones on the W4A8 route (forced: the automatic route
// runs W4A16 on this path) their per-token quantization (the act_quant
// kernels' rule, runtime/reference_quant.h) as (q − z)·s.
std::vector<double> projection_input(const PackedExperts::Impl& w, const uint16_t* x, int64_t k,
                                     const MoeOptions& opt, bool down) {
  std::vector<double> in(static_cast<size_t>(k));
  if (w.format != WeightFormat::int8 &&
      !ops::w4a8_route(w.format, w.k, opt.int4_route, Isa::scalar, 1, kOp)) {
    for (int64_t i = 0; i < k; ++i) in[i] = runtime::bf16_to_f32(x[i]);
    return in;
  }
  std::vector<uint8_t> q(static_cast<size_t>(k));
  float s = 0;
  int32_t z = 0;
  const ops::RowQuant rq = ops::row_quant(opt, down);
  const runtime::ActQuantRule rule = ops::act_quant_rule(ops::act_quant_mode(rq.mode));
  runtime::reference_act_quant_row(rule, x, k, k, ops::fixed_inv_scale(rq.mode, rq.scale), rq.scale,
                                   rq.zero, q.data(), &s, &z);
  for (int64_t i = 0; i < k; ++i) in[i] = double(int32_t(q[i]) - z) * double(s);
  return in;
}

// One expert on one token, accumulated into acc[H] with weight w: reads the
// packed weights element by element (the oracle-grade fallback, no JIT).
void scalar_expert(const PackedExperts::Impl& w13, const PackedExperts::Impl& w2, int64_t e,
                   const uint16_t* x, const float* b13, const float* b2, float w,
                   const MoeOptions& opt, float* acc) {
  const int64_t H = w13.k, I = w13.n;
  const std::vector<double> xin = projection_input(w13, x, H, opt, false);
  std::vector<uint16_t> act(static_cast<size_t>(I));
  for (int64_t i = 0; i < I; ++i) {
    if (!w13.gated()) {  // act(up) of a non-gated MLP
      double u = b13 != nullptr ? b13[i] : 0.0;
      for (int64_t h = 0; h < H; ++h) u += xin[h] * expert_weight(w13, e, i, h);
      act[i] = runtime::f32_to_bf16(
          static_cast<float>(runtime::reference_activation(opt.act, static_cast<float>(u))));
      continue;
    }
    double g = 0, u = 0;
    for (int64_t h = 0; h < H; ++h) {
      g += xin[h] * expert_weight(w13, e, w13.gate_row(i), h);
      u += xin[h] * expert_weight(w13, e, w13.up_row(i), h);
    }
    if (b13 != nullptr) {  // in w13's row order (halves or interleaved)
      g += b13[w13.gate_row(i)];
      u += b13[w13.up_row(i)];
    }
    // The JIT path stores the activation as bf16: round it the same way.
    act[i] = runtime::f32_to_bf16(gated(opt, static_cast<float>(g), static_cast<float>(u)));
  }
  const std::vector<double> ain = projection_input(w2, act.data(), I, opt, true);
  for (int64_t h = 0; h < H; ++h) {
    double s = b2 != nullptr ? b2[h] : 0.0;
    for (int64_t i = 0; i < I; ++i) s += ain[i] * expert_weight(w2, e, h, i);
    acc[h] += w * static_cast<float>(s);
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
    std::vector<float> acc(static_cast<size_t>(d.H), 0.0f);
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
      scalar_expert(w13, w2, e, x, b13, b2, w * opt.routed_scaling_factor, opt, acc.data());
    }
    if (opt.shared_w13 != nullptr)
      scalar_expert(*opt.shared_w13->impl(), *opt.shared_w2->impl(), 0, x, nullptr, nullptr,
                    shared_weight(opt, t), opt, acc.data());
    store_row(acc.data(), out, t, 0, d.H);
  });
}

// ---- the JIT path ----------------------------------------------------------------

// Groups of at most this many rows stream their expert's weights once
// (decode): their tasks take runs of consecutive column blocks.
constexpr int64_t kStreamingRows = 16;

// One projection's input rows of a group, as its ExpertGemm reads them.
struct Operand {
  const uint8_t* rows = nullptr;    // row-major: bf16 (the weight's K order) or u8 (int8)
  int64_t ld = 0;                   // bytes between rows
  const uint8_t* packed = nullptr;  // AMX (a_packed plans): the PackedA tile copy
  const float* scale = nullptr;     // int8: per row
  const int32_t* zero = nullptr;
};

// A run of rows that share one expert's weights.
struct Group {
  const PackedExperts::Impl* w13 = nullptr;
  const PackedExperts::Impl* w2 = nullptr;
  int64_t expert = 0;
  int64_t rows = 0;
  int64_t row0 = 0;            // first row in row_token / row_weight / the row buffers
  const float* b13 = nullptr;  // permuted: 64 per packed block (32 gate, 32 up)
  const float* b2 = nullptr;   // [H]
  ops::ExpertGemm up, down;
  Operand in_up, in_down;
  uint16_t* act = nullptr;  // act(gate)·up rows of this group, bf16, natural order
  int64_t ld_act = 0;       // bytes between act rows
};

// Packs every group's operand of one projection whose plan reads the PackedA
// tile layout, each group from a 32-row block boundary of one scratch.
void pack_operands(std::vector<Group>& groups, bool down, int slot) {
  std::vector<int64_t> off(groups.size() + 1, 0);
  for (size_t i = 0; i < groups.size(); ++i) {
    const ops::ExpertGemm& gm = down ? groups[i].down : groups[i].up;
    off[i + 1] = off[i] + (gm.a_packed() ? gm.packed_a().bytes(groups[i].rows) : 0);
  }
  if (off.back() == 0) return;
  uint8_t* buf = ops::packed_a_scratch(slot, off.back());
  runtime::parallel_for(static_cast<int64_t>(groups.size()), [&](int64_t i) {
    Group& g = groups[i];
    const ops::ExpertGemm& gm = down ? g.down : g.up;
    if (!gm.a_packed()) return;
    Operand& op = down ? g.in_down : g.in_up;
    ops::pack_a_rows(op.rows, op.ld, g.rows, gm.packed_a().k, buf + off[i]);
    op.packed = buf + off[i];
  });
}

// The first projection's GEMM: gate_up with the act-and-mul epilogue, or a
// non-gated up projection (ExpertProj::up) with the plain act epilogue.
codegen::GemmSpec gate_up_spec(const PackedExperts::Impl& w13, int64_t H, bool bias,
                               const MoeOptions& opt) {
  codegen::GemmSpec s;
  s.n = w13.n;
  s.k = H;
  s.bias = bias ? codegen::BiasKind::f32 : codegen::BiasKind::none;
  s.out = DType::bf16;
  s.invariant = runtime::batch_invariant();
  if (!w13.gated()) {
    s.act = opt.act;
  } else if (opt.clamped_swiglu) {
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
  s.invariant = runtime::batch_invariant();
  return s;
}

// Per-call scratch, reused by the calling thread across calls.
struct Scratch {
  std::vector<int32_t> row_token;
  std::vector<float> row_weight;
  std::vector<uint16_t> a;            // gathered hidden rows
  std::vector<uint16_t> a_g;          // the same in the up weights' K order (act-order)
  std::vector<uint16_t> act;          // gate/up outputs
  std::vector<uint16_t> act_g;        // act rows in the down weights' K order (act-order)
  std::vector<uint8_t> q_up, q_down;  // int8: u8 rows of a / act
  std::vector<float> s_up, s_down;    // int8: their per-row scales
  std::vector<int32_t> z_up, z_down;  // and zero points
  std::vector<float> b13;             // permuted biases of the active experts

  // What a call leaves behind: past runtime::kScratchKeepBytes (one large
  // prefill: T 8192, k 8, H 4096 gathers 512 MiB) the buffers are freed.
  void trim() {
    auto bytes = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    const size_t held = bytes(row_token) + bytes(row_weight) + bytes(a) + bytes(a_g) + bytes(act) +
                        bytes(act_g) + bytes(q_up) + bytes(q_down) + bytes(s_up) + bytes(s_down) +
                        bytes(z_up) + bytes(z_down) + bytes(b13);
    if (!runtime::scratch_kept(held)) *this = Scratch{};
  }
};

size_t sz(int64_t v) {
  return static_cast<size_t>(v);
}

// Fills each group's operand for one projection from its bf16 source rows
// (src(g): the group's first row, ld_src elements apart): gathered into the
// weight's packed K order when it has one (act-order), or quantized to u8
// rows for int8 weights and the W4A8 route (gathered into its quad K order
// first unless that is the rows' own); else the source rows themselves.
template <class Src>
void prepare_operands(std::vector<Group>& groups, bool down, Isa isa, const ops::RowQuant& aq,
                      std::vector<uint16_t>& gathered, std::vector<uint8_t>& q,
                      std::vector<float>& scale, std::vector<int32_t>& zero, int64_t total_rows,
                      Src src, int64_t ld_src) {
  int64_t ldg = 0, ldq = 0;
  for (const Group& g : groups) {
    const ops::ExpertGemm& gm = down ? g.down : g.up;
    const bool quad = gm.w4a8() != nullptr && !gm.w4a8()->identity();
    if (gm.perm() != nullptr || quad) ldg = std::max(ldg, (gm.a_cols() + 31) / 32 * 32);
    if (gm.int8()) ldq = std::max(ldq, (gm.a_cols() + 63) / 64 * 64);
  }
  if (ldg > 0) gathered.resize(sz(total_rows * ldg));
  if (ldq > 0) {
    q.resize(sz(total_rows * ldq));
    scale.resize(sz(total_rows));
    zero.resize(sz(total_rows));
  }
  for (Group& g : groups) {
    const ops::ExpertGemm& gm = down ? g.down : g.up;
    Operand& op = down ? g.in_down : g.in_up;
    if (gm.perm() != nullptr) {
      op.rows = reinterpret_cast<const uint8_t*>(gathered.data() + g.row0 * ldg);
      op.ld = ldg * 2;
    } else if (gm.int8()) {
      op.rows = q.data() + g.row0 * ldq;
      op.ld = ldq;
      op.scale = scale.data() + g.row0;
      op.zero = zero.data() + g.row0;
    } else {
      op.rows = reinterpret_cast<const uint8_t*>(src(g));
      op.ld = ld_src * 2;
    }
  }
  if (ldg == 0 && ldq == 0) return;
  // Tasks of up to 16 rows of one group.
  constexpr int64_t kRows = 16;
  std::vector<std::pair<int32_t, int64_t>> tasks;
  for (size_t gi = 0; gi < groups.size(); ++gi)
    for (int64_t r = 0; r < groups[gi].rows; r += kRows)
      tasks.emplace_back(static_cast<int32_t>(gi), r);
  runtime::parallel_for(static_cast<int64_t>(tasks.size()), [&](int64_t ti) {
    const Group& g = groups[tasks[ti].first];
    const ops::ExpertGemm& gm = down ? g.down : g.up;
    const int64_t r0 = tasks[ti].second, r1 = std::min(g.rows, r0 + kRows);
    const uint16_t* s0 = src(g) + r0 * ld_src;
    if (const std::vector<int32_t>* perm = gm.perm()) {
      for (int64_t r = r0; r < r1; ++r) {
        const uint16_t* s = s0 + (r - r0) * ld_src;
        uint16_t* d = gathered.data() + (g.row0 + r) * ldg;
        for (int64_t j = 0; j < gm.a_cols(); ++j) d[j] = (*perm)[j] >= 0 ? s[(*perm)[j]] : 0;
      }
    } else if (gm.int8()) {
      const uint16_t* in = s0;
      int64_t ld_in = ld_src, k = down ? g.w2->k : g.w13->k;
      if (const ops::W4A8Kernels* w4 = gm.w4a8(); w4 != nullptr && !w4->identity()) {
        // W4A8: the rows in the quad K order, then quantized from there.
        const PackedWeight::Impl& p = (down ? g.w2 : g.w13)->q(g.expert);
        uint16_t* d = gathered.data() + (g.row0 + r0) * ldg;
        for (int64_t r = r0; r < r1; ++r)
          w4->gather_row(p, s0 + (r - r0) * ld_src, d + (r - r0) * ldg);
        in = d, ld_in = ldg, k = w4->k_quad();
      }
      ops::quantize_rows(aq, isa, in, ld_in, r1 - r0, k, q.data() + (g.row0 + r0) * ldq, ldq,
                         scale.data() + g.row0 + r0, zero.data() + g.row0 + r0);
    }
  });
}

void run_jit(const Dims& d, Isa isa, const TensorView& hidden, const PackedExperts::Impl& w13,
             const PackedExperts::Impl& w2, const TensorView& weights, const TensorView& ids,
             const TensorView& out, const MoeOptions& opt) {
  // A named reference: lambdas running on pool threads must see this thread's
  // scratch, not their own per-thread instance.
  Scratch& sc = runtime::per_thread<Scratch>([] {});
  struct TrimOnReturn {
    Scratch& s;
    ~TrimOnReturn() { s.trim(); }
  } trim_on_return{sc};
  const int64_t T = d.T, H = d.H, I = d.I, E = d.E, K = d.k;
  const int64_t routed = T * K;

  // 1. Counting sort of the (token, slot) pairs by expert.
  std::vector<int64_t> start(static_cast<size_t>(E + 1), 0);
  auto id_at = [&](int64_t t, int64_t j) {
    return static_cast<const int32_t*>(ids.data)[t * ids.strides[0] + j * ids.strides[1]];
  };
  for (int64_t t = 0; t < T; ++t)
    for (int64_t j = 0; j < K; ++j) ++start[id_at(t, j) + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  const bool shared = opt.shared_w13 != nullptr;
  const int64_t total = routed + (shared ? T : 0);
  sc.row_token.resize(sz(total));
  sc.row_weight.resize(sz(total));
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
    for (int64_t t = 0; t < T && shared; ++t) {
      sc.row_token[routed + t] = static_cast<int32_t>(t);
      sc.row_weight[routed + t] = shared_weight(opt, t);
    }
  }

  // A tuning database entry for experts of this format and shape class
  // (docs/tuning.md, family moe): run_blocks sets the run length of both
  // streaming phases below (the task split only); w4a8_rows the int4
  // experts' route under int4_route automatic (experts routed at least that
  // many rows run W4A8, 0: none does) and prefetch the distance of the
  // experts' Xbyak AVX-512 kernels (no arithmetic changes).
  const int64_t threads = runtime::num_threads();
  const jit::TunedEntry* tuned = nullptr;
  if (jit::tuning_db_active())
    tuned = jit::find_tuned("moe", jit::moe_shape_class(isa, static_cast<int>(threads), d.E, d.k,
                                                        d.H, d.I, d.T, w13.format));
  auto expert_tuned = [&](int64_t rows) {
    codegen::PlanOverrides o;
    if (tuned == nullptr) return o;
    if (auto w = tuned->knob("w4a8_rows")) o.w4a8 = *w > 0 && rows >= *w;
    if (auto pf = tuned->knob("prefetch")) o.prefetch_kib = static_cast<int>(*pf);
    o.entry = tuned->id();
    return o;
  };

  // Groups: the active experts, then the shared expert on every token.
  const bool b13 = opt.b13.has_value(), b2 = opt.b2.has_value();
  // Scanned only when an int4 projection could take the fused kernel or
  // W4A8 (an Inf in hidden keeps int4 experts on W4A16's IEEE results).
  const bool any_int4 = ops::fused_int4_form(w13.format) || ops::fused_int4_form(w2.format) ||
                        (shared && (ops::fused_int4_form(opt.shared_w13->impl()->format) ||
                                    ops::fused_int4_form(opt.shared_w2->impl()->format)));
  const bool hidden_has_inf =
      any_int4 &&
      ops::bf16_rows_have_inf(static_cast<const uint16_t*>(hidden.data), hidden.strides[0], T, H);
  // Per expert: whether a token routed to it holds the ±Inf (only those
  // experts leave the fused kernel / W4A8, so a token's ±Inf moves no token
  // that shares none of its experts).
  std::vector<uint8_t> token_inf;
  if (hidden_has_inf) {
    token_inf.resize(sz(T));
    for (int64_t t = 0; t < T; ++t)
      token_inf[sz(t)] = ops::bf16_rows_have_inf(
          static_cast<const uint16_t*>(hidden.data) + t * hidden.strides[0], H, 1, H);
  }
  auto rows_have_inf = [&](int64_t r0, int64_t rows) {
    for (int64_t r = r0; r < r0 + rows && hidden_has_inf; ++r)
      if (token_inf[sz(sc.row_token[sz(r)])]) return true;
    return false;
  };
  std::vector<Group> groups;
  const int64_t n_up_blocks = w13.output_blocks();
  int64_t active = 0;
  for (int64_t e = 0; e < E; ++e) active += start[e + 1] > start[e];
  if (b13) sc.b13.assign(sz(active * n_up_blocks * 64), 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    if (start[e + 1] == start[e]) continue;
    Group g;
    g.w13 = &w13;
    g.w2 = &w2;
    g.expert = e;
    g.row0 = start[e];
    g.rows = start[e + 1] - start[e];
    if (b13) {
      // The bias in the packed block order: 32 gate entries, then the 32 up
      // ones; b13 comes in w13's row order (GPT-OSS's interleaved bias with
      // interleaved rows: it was read as halves, a silently wrong bias). A
      // non-gated w13's is in its own order already.
      float* pb = sc.b13.data() + static_cast<int64_t>(groups.size()) * n_up_blocks * 64;
      const float* src = static_cast<const float*>(opt.b13->data) + e * opt.b13->strides[0];
      for (int64_t i = 0; i < I; ++i) {
        if (!w13.gated()) {
          pb[i] = src[i];
          continue;
        }
        pb[i / 32 * 64 + i % 32] = src[w13.gate_row(i)];
        pb[i / 32 * 64 + 32 + i % 32] = src[w13.up_row(i)];
      }
      g.b13 = pb;
    }
    if (b2) g.b2 = static_cast<const float*>(opt.b2->data) + e * opt.b2->strides[0];
    const codegen::PlanOverrides et = expert_tuned(g.rows);
    const bool g_inf = rows_have_inf(g.row0, g.rows);
    g.up = ops::ExpertGemm(w13, e, gate_up_spec(w13, H, b13, opt), g.rows, isa, opt.int4_route, et,
                           g_inf);
    // The down inputs come from the gate / up outputs: an Inf in hidden
    // reaches them (one the activation makes from finite inputs does not
    // count here: docs/reliability.md).
    g.down = ops::ExpertGemm(w2, e, down_spec(H, I, b2), g.rows, isa, opt.int4_route, et, g_inf);
    groups.push_back(std::move(g));
  }
  if (shared) {
    Group g;
    g.w13 = opt.shared_w13->impl();
    g.w2 = opt.shared_w2->impl();
    g.row0 = routed;
    g.rows = T;
    const codegen::PlanOverrides et = expert_tuned(T);
    g.up = ops::ExpertGemm(*g.w13, 0, gate_up_spec(*g.w13, H, false, opt), T, isa, opt.int4_route,
                           et, hidden_has_inf);
    g.down = ops::ExpertGemm(*g.w2, 0, down_spec(H, g.w13->n, false), T, isa, opt.int4_route, et,
                             hidden_has_inf);
    groups.push_back(std::move(g));
  }

  // The gate/up inputs: hidden's rows of each group (gathered: the runs must
  // be dense), then in the weights' K order or quantized as they need.
  sc.a.resize(sz(total * H));
  const auto* hb = static_cast<const uint16_t*>(hidden.data);
  constexpr int64_t kGatherRows = 64;
  runtime::parallel_for((total + kGatherRows - 1) / kGatherRows, [&](int64_t c) {
    const int64_t r1 = std::min(total, (c + 1) * kGatherRows);
    for (int64_t r = c * kGatherRows; r < r1; ++r)
      std::memcpy(sc.a.data() + r * H, hb + sc.row_token[r] * hidden.strides[0], H * 2);
  });
  prepare_operands(
      groups, false, isa, ops::row_quant(opt, false), sc.a_g, sc.q_up, sc.s_up, sc.z_up, total,
      [&](const Group& g) { return static_cast<const uint16_t*>(sc.a.data() + g.row0 * H); }, H);
  pack_operands(groups, false, ops::kMoeA);

  // The act rows: one stride for every group (the shared expert's I may differ).
  int64_t ld_act = (I + 31) / 32 * 32;
  for (const Group& g : groups) ld_act = std::max(ld_act, (g.w13->n + 31) / 32 * 32);
  sc.act.resize(sz(total * ld_act));
  for (Group& g : groups) {
    g.act = sc.act.data() + g.row0 * ld_act;
    g.ld_act = ld_act * 2;
  }

  // 2. Gate/up with the act-and-mul epilogue: (group, row chunk, run of
  // blocks) tasks. Decode-sized groups stream their weights: a run of
  // consecutive blocks per task keeps each thread's reads sequential (the
  // kernels' prefetch runs on into the next block), as many as still gives
  // every thread a few tasks.
  int64_t streaming_blocks = 0;
  for (const Group& g : groups)
    if (g.rows <= kStreamingRows) streaming_blocks += g.w13->output_blocks();
  // The entry's run length: the same kernels on the same rows, so the same result.
  // (A plain 0 for "none": GCC 12 saw the optional's value maybe
  // uninitialized where it is read below.)
  const int64_t tuned_run = tuned != nullptr ? tuned->knob("run_blocks").value_or(0) : 0;
  const int64_t run_blocks =
      tuned_run > 0 ? tuned_run : std::clamp<int64_t>(streaming_blocks / (4 * threads), 1, 8);
  struct UpTask {
    int32_t g;
    int32_t block, blocks;
    int64_t m0, rows;
  };
  std::vector<UpTask> up_tasks;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    const int64_t chunk = g.up.task_rows();
    const int64_t blocks = g.w13->output_blocks();
    const int64_t run = g.rows <= kStreamingRows ? run_blocks : 1;
    for (int64_t m0 = 0; m0 < g.rows; m0 += chunk)
      for (int64_t b = 0; b < blocks; b += run)
        up_tasks.push_back({static_cast<int32_t>(gi), static_cast<int32_t>(b),
                            static_cast<int32_t>(std::min(run, blocks - b)), m0,
                            std::min(chunk, g.rows - m0)});
  }
  runtime::parallel_for(static_cast<int64_t>(up_tasks.size()), [&](int64_t ti) {
    const UpTask& t = up_tasks[ti];
    const Group& g = groups[t.g];
    const int64_t blocks = g.w13->output_blocks(), per = g.w13->outputs_per_block();
    for (int64_t b = t.block; b < t.block + t.blocks; ++b) {
      ops::RowBlockJob job;
      job.a = g.in_up.packed != nullptr ? g.in_up.packed + g.up.packed_a().offset(t.m0, 0)
                                        : g.in_up.rows + t.m0 * g.in_up.ld;
      job.lda = g.in_up.ld;
      job.rows = t.rows;
      job.c = reinterpret_cast<uint8_t*>(g.act) + t.m0 * g.ld_act + b * per * 2;
      job.ldc = g.ld_act;
      job.bias = g.b13 != nullptr ? g.b13 + b * 64 : nullptr;
      job.n_tail = b == blocks - 1 && g.w13->n % per != 0;
      if (g.in_up.scale != nullptr) {
        job.a_scale = g.in_up.scale + t.m0;
        job.a_zero = g.in_up.zero + t.m0;
      }
      g.up.run(job, b);
    }
  });

  // The down inputs: the act rows, reordered or quantized as the weights need.
  prepare_operands(
      groups, true, isa, ops::row_quant(opt, true), sc.act_g, sc.q_down, sc.s_down, sc.z_down,
      total, [&](const Group& g) { return static_cast<const uint16_t*>(g.act); }, ld_act);
  pack_operands(groups, true, ops::kMoeAct);

  // 3. Down projection + weighted sum, a run of 64-column blocks of H per
  // task (one, unless every group streams its weights: then each group's
  // run of blocks is one sequential read, as in phase 2).
  const int64_t n_down_blocks = (H + 63) / 64;
  const int64_t down_run =
      T <= kStreamingRows
          ? (tuned_run > 0 ? tuned_run : std::clamp<int64_t>(n_down_blocks / (4 * threads), 1, 8))
          : 1;
  runtime::parallel_for((n_down_blocks + down_run - 1) / down_run, [&](int64_t task) {
    const int64_t nb0 = task * down_run, nb1 = std::min(n_down_blocks, nb0 + down_run);
    const int64_t width = (nb1 - nb0) * 64;
    auto& acc = runtime::per_thread<std::vector<float>>([] {});
    auto& tile = runtime::per_thread<std::vector<float>>([] {});
    acc.assign(sz(T * width), 0.0f);
    constexpr int64_t kTileRows = 64;
    tile.resize(sz(kTileRows * 64));
    for (const Group& g : groups) {
      for (int64_t nb = nb0; nb < nb1; ++nb) {
        const int64_t c0 = nb * 64, ncols = std::min<int64_t>(64, H - c0);
        for (int64_t m0 = 0; m0 < g.rows; m0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, g.rows - m0);
          ops::RowBlockJob job;
          job.a = g.in_down.packed != nullptr ? g.in_down.packed + g.down.packed_a().offset(m0, 0)
                                              : g.in_down.rows + m0 * g.in_down.ld;
          job.lda = g.in_down.ld;
          job.rows = rows;
          job.c = reinterpret_cast<uint8_t*>(tile.data());
          job.ldc = 64 * 4;
          job.bias = g.b2 != nullptr ? g.b2 + c0 : nullptr;
          job.n_tail = ncols < 64;
          if (g.in_down.scale != nullptr) {
            job.a_scale = g.in_down.scale + m0;
            job.a_zero = g.in_down.zero + m0;
          }
          g.down.run(job, nb);
          // The weighted sum, while the tile is in L1.
          for (int64_t r = 0; r < rows; ++r) {
            const float w = sc.row_weight[g.row0 + m0 + r];
            float* dst = acc.data() + sc.row_token[g.row0 + m0 + r] * width + (nb - nb0) * 64;
            const float* src = tile.data() + r * 64;
            for (int64_t c = 0; c < ncols; ++c) dst[c] += w * src[c];
          }
        }
      }
    }
    for (int64_t t = 0; t < T; ++t)
      store_row(acc.data() + t * width, out, t, nb0 * 64, std::min(width, H - nb0 * 64));
    if (!runtime::scratch_kept(acc.capacity() * sizeof(float))) acc = {};
  });
}

// The call's tensors as the kernels read them: f32 routing weights, int32
// ids, and f32 biases and shared weights in the options; the caller's views
// when they are that already, else dense copies (bf16 values widen exactly).
struct KernelInputs {
  KernelInputs(const TensorView& w, const TensorView& i, const MoeOptions& opt, int64_t t,
               int64_t k)
      : weights(w), ids(i), options(opt) {
    if (w.dtype == DType::bf16) weights = widen(w, w_);
    if (i.dtype == DType::i64) {
      i_.resize(sz(t * k));
      for (int64_t r = 0; r < t; ++r)
        for (int64_t j = 0; j < k; ++j)
          i_[sz(r * k + j)] =
              static_cast<int32_t>(ops::index_at(i, r * i.strides[0] + j * i.strides[1]));
      ids = TensorView(i_.data(), DType::i32, {t, k});
    }
    // Biases [E, n]: only the rows of the experts the call routes to (a
    // decode step touches k of E), the others left unread.
    const bool bf16_bias =
        (opt.b13 && opt.b13->dtype == DType::bf16) || (opt.b2 && opt.b2->dtype == DType::bf16);
    std::vector<char> used;
    if (bf16_bias) {
      used.assign(sz(opt.b13 ? opt.b13->shape[0] : opt.b2->shape[0]), 0);
      for (int64_t r = 0; r < t; ++r)
        for (int64_t j = 0; j < k; ++j)
          used[sz(ops::index_at(i, r * i.strides[0] + j * i.strides[1]))] = 1;
    }
    if (opt.b13 && opt.b13->dtype == DType::bf16) options.b13 = widen(*opt.b13, b13_, &used);
    if (opt.b2 && opt.b2->dtype == DType::bf16) options.b2 = widen(*opt.b2, b2_, &used);
    if (opt.shared_weights && opt.shared_weights->dtype == DType::bf16)
      options.shared_weights = widen(*opt.shared_weights, sw_);
  }
  TensorView weights, ids;
  MoeOptions options;

 private:
  // A bf16 view of rank 1 or 2 as a dense f32 copy held in `buf`; with
  // `rows`, only the rows marked there (the rest of buf is never read).
  static TensorView widen(const TensorView& v, std::unique_ptr<float[]>& buf,
                          const std::vector<char>* rows_used = nullptr) {
    const int64_t rows = v.shape.size() == 2 ? v.shape[0] : 1, cols = v.shape.back();
    const int64_t rs = v.shape.size() == 2 ? v.strides[0] : 0, cs = v.strides.back();
    buf = std::make_unique_for_overwrite<float[]>(sz(rows * cols));
    const auto* src = static_cast<const uint16_t*>(v.data);
    for (int64_t r = 0; r < rows; ++r) {
      if (rows_used != nullptr && !(*rows_used)[sz(r)]) continue;
      for (int64_t c = 0; c < cols; ++c)
        buf[sz(r * cols + c)] = runtime::bf16_to_f32(src[r * rs + c * cs]);
    }
    return TensorView(buf.get(), DType::f32, v.shape);
  }
  std::unique_ptr<float[]> w_, b13_, b2_, sw_;
  std::vector<int32_t> i_;
};

}  // namespace

void fused_experts(const TensorView& hidden, const PackedExperts& w13, const PackedExperts& w2,
                   const TensorView& topk_weights, const TensorView& topk_ids,
                   const TensorView& out, const MoeOptions& opt) {
  runtime::api_guard("fused_experts", [&] {
    const auto& p13 = need_experts(w13, "w13", ExpertProj::gate_up);  // or up
    const auto& p2 = need_experts(w2, "w2", ExpertProj::down);
    const Dims d = check_args(hidden, p13, p2, topk_weights, topk_ids, out, opt);
    if (d.T == 0) return;
    // int64 ids and bf16 weights, biases and shared weights are read once
    // into dense int32 / f32 copies (the ids are in [0, E) by now):
    // everything below reads one form.
    const KernelInputs in(topk_weights, topk_ids, opt, d.T, d.k);
    const Isa isa = runtime::active_isa();
    if (runtime::verbose_level() > 0)
      std::fprintf(stderr, "tilejit: fused_experts T=%lld H=%lld I=%lld E=%lld k=%lld path=%s\n",
                   static_cast<long long>(d.T), static_cast<long long>(d.H),
                   static_cast<long long>(d.I), static_cast<long long>(d.E),
                   static_cast<long long>(d.k), isa_name(isa));
    // A forced W4A8 route needs its kernels (the llvm path of a build without
    // LLVM has none): the scalar path computes the same W4A8 result, as
    // gemm() does.
    const auto int4 = [](const PackedExperts::Impl* w) {
      return w != nullptr && is_int4(w->format);
    };
    const bool w4a8_scalar =
        opt.int4_route == Int4Route::w4a8 && !ops::w4a8_kernels_usable(isa) &&
        (int4(&p13) || int4(&p2) || (opt.shared_w13 && int4(opt.shared_w13->impl())) ||
         (opt.shared_w2 && int4(opt.shared_w2->impl())));
    if (isa == Isa::scalar || w4a8_scalar)
      return run_scalar(d, hidden, p13, p2, in.weights, in.ids, out, in.options);
    run_jit(d, isa, hidden, p13, p2, in.weights, in.ids, out, in.options);
  });
}

}  // namespace tilejit
