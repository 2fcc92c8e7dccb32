#include "tools/program/operator_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <map>

#include "ir/printer.h"

namespace tilejit::tools {
namespace {

// Keys visible to query row i of a (T queries, S keys) sequence: the API's
// rule (tilejit.h, AttentionOptions) with bottom-right alignment.
int64_t visible_keys(const AttentionOptions& o, int64_t t, int64_t s, int64_t i) {
  const int64_t i_pos = s - t + i;
  int64_t lo = 0, hi = s - 1;
  if (o.causal) hi = std::min(hi, i_pos);
  if (o.window_left >= 0) lo = std::max<int64_t>(lo, i_pos - o.window_left);
  if (o.window_right >= 0) hi = std::min<int64_t>(hi, i_pos + o.window_right);
  return std::max<int64_t>(0, hi - lo + 1);
}

}  // namespace

QuantMatrix expert_matrix(const ir::Function& f, const OperatorCall& c, const TensorMap& inputs,
                          int proj, int64_t e) {
  const MoeQuant& mq = c.moe_quant;
  const ir::TensorType& wt = f.value(operand(f, c, proj == 0 ? 1 : 2)).type;
  const int64_t experts = wt.dims.at(0).value;
  // One expert's slice of a [E, ...] input.
  auto slice = [&](int id, std::vector<int64_t>* shape) -> const uint8_t* {
    const HostTensor& h = inputs.at(f.value(id).name);
    if (shape != nullptr) *shape = std::vector<int64_t>(h.shape.begin() + 1, h.shape.end());
    return h.bytes.data() + static_cast<size_t>(e) * (h.bytes.size() / size_t(experts));
  };
  QuantMatrix m;
  m.format = mq.format;
  m.n = wt.dims.at(1).value;
  m.k = wt.dims.at(2).value;
  m.w = slice(operand(f, c, proj == 0 ? 1 : 2), nullptr);
  m.scale = slice(mq.scale[proj], &m.scale_shape);
  m.scale_dtype = f.value(mq.scale[proj]).type.dtype;
  if (mq.zero[proj] >= 0) m.zero = reinterpret_cast<const int32_t*>(slice(mq.zero[proj], nullptr));
  if (mq.g_idx[proj] >= 0)
    m.g_idx = reinterpret_cast<const int32_t*>(slice(mq.g_idx[proj], nullptr));
  m.block_n = mq.block_n;
  m.block_k = mq.block_k;
  m.group_size = mq.group_size;
  m.gptq_v2 = mq.gptq_v2;
  return m;
}

PackedExperts pack_quant_experts(const ir::Function& f, const OperatorCall& c,
                                 const TensorMap& inputs, int proj) {
  const MoeQuant& mq = c.moe_quant;
  const int64_t experts = f.value(operand(f, c, 1)).type.dims.at(0).value;
  const ExpertProj p = proj == 0 ? c.w13_proj() : ExpertProj::down;
  const GluRows rows = proj == 0 ? c.glu_rows : GluRows::halves;
  auto view = [](const void* data, DType t, std::vector<int64_t> shape) {
    return TensorView(const_cast<void*>(data), t, std::move(shape));
  };
  std::vector<Int8Weight> i8;
  std::vector<Fp8Weight> f8;
  std::vector<Int4Weight> u4;
  std::vector<Mxfp4Weight> mx;
  for (int64_t e = 0; e < experts; ++e) {
    const QuantMatrix m = expert_matrix(f, c, inputs, proj, e);
    const TensorView sv = view(m.scale, m.scale_dtype, m.scale_shape);
    switch (mq.format) {
      case WeightFormat::int8:
        i8.push_back(Int8Weight{view(m.w, DType::i8, {m.n, m.k}), sv});
        break;
      case WeightFormat::fp8_e4m3:
        f8.push_back(Fp8Weight{view(m.w, DType::f8e4m3, {m.n, m.k}), sv, m.block_n, m.block_k});
        break;
      case WeightFormat::mxfp4:
        mx.push_back(Mxfp4Weight{view(m.w, DType::u8, {m.n, (m.k + 1) / 2}), sv, m.k});
        break;
      default: {
        Int4Weight q;
        const bool awq = mq.format == WeightFormat::int4_awq;
        q.format = awq ? Int4Format::awq : Int4Format::gptq;
        q.qweight = view(m.w, DType::i32,
                         awq ? std::vector<int64_t>{m.k, (m.n + 7) / 8}
                             : std::vector<int64_t>{(m.k + 7) / 8, m.n});
        q.scales = sv;
        if (m.zero != nullptr)
          q.qzeros = view(m.zero, DType::i32, {m.scale_shape.at(0), (m.n + 7) / 8});
        if (m.g_idx != nullptr) q.g_idx = view(m.g_idx, DType::i32, {m.k});
        q.bits = mq.bits;
        q.group_size = m.group_size;
        q.gptq_v2 = m.gptq_v2;
        q.n = m.n;
        q.k = m.k;
        u4.push_back(q);
        break;
      }
    }
  }
  if (mq.format == WeightFormat::int8) return pack_experts(i8, p, rows);
  if (mq.format == WeightFormat::fp8_e4m3) return pack_experts(f8, p, rows);
  if (mq.format == WeightFormat::mxfp4) return pack_experts(mx, p, rows);
  return pack_experts(u4, p, rows);
}

struct OperatorRunner::Bound {
  std::map<int, HostTensor> scratch;  // values between calls that are not results
  // Params with a static strided layout, laid out at those strides.
  struct Strided {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> strides;
  };
  std::map<int, Strided> strided;
  std::vector<PackedExperts> w13, w2;              // per call (moe calls only)
  std::vector<PackedExperts> s13, s2;              // the shared expert, where a moe call has one
  std::vector<std::array<int32_t, 2>> cu_q, cu_k;  // per call (attention calls only)
};

OperatorRunner::OperatorRunner(ir::Function f, OperatorProgram p)
    : f_(std::move(f)), prog_(std::move(p)) {}

OperatorRunner::~OperatorRunner() = default;

void OperatorRunner::bind(const TensorMap& inputs, const DimBindings& dims) {
  inputs_ = &inputs;
  dims_ = dims;
  auto b = std::make_unique<Bound>();
  for (int id : f_.params) {
    const ir::TensorType& t = f_.value(id).type;
    if (t.layout.kind != ir::LayoutKind::row_major || t.layout.strides.empty()) continue;
    // Strides as the IR states them, a '?' one dense over the dims inside it:
    // the calls then read the rows of a wider buffer, as the program says.
    const HostTensor& h = inputs.at(f_.value(id).name);
    const int r = t.rank();
    if (h.numel() == 0) continue;
    std::vector<int64_t> st(r), dense(r);
    bool differs = false, overflow = false;
    for (int i = r - 1; i >= 0; --i) {
      dense[i] = i == r - 1 ? 1 : dense[i + 1] * h.shape[i + 1];
      const auto& s = t.layout.strides[i];
      st[i] = s ? *s : 1;
      if (!s && i != r - 1) overflow |= __builtin_mul_overflow(st[i + 1], h.shape[i + 1], &st[i]);
      differs = differs || st[i] != dense[i];
    }
    if (!differs) continue;
    // Static strides come from the .tir text: their span is checked like a shape.
    int64_t span = 1;
    for (int i = 0; i < r; ++i) {
      int64_t step = 0;
      overflow |= __builtin_mul_overflow(h.shape[i] - 1, st[i], &step);
      overflow |= __builtin_add_overflow(span, step, &span);
    }
    const int64_t eb = elem_bytes(h.dtype);
    const std::string what =
        fmt::format("input '{}' at its strides {}", f_.value(id).name, shape_str(st));
    if (overflow) throw Error(fmt::format("{} spans more than 2^63 elements", what));
    Bound::Strided& out = b->strided[id];
    out.bytes.assign(static_cast<size_t>(dense_bytes({span}, eb, what)), 0);
    out.strides = st;
    for (int64_t flat = 0; flat < h.numel(); ++flat) {
      int64_t rest = flat, off = 0;
      for (int i = r - 1; i >= 0; --i) {
        off += (rest % h.shape[i]) * st[i];
        rest /= h.shape[i];
      }
      std::memcpy(out.bytes.data() + off * eb, h.bytes.data() + flat * eb, size_t(eb));
    }
  }
  for (const ir::Op& op : f_.ops) {
    if (is_param(f_, op.result) || is_result(f_, op.result)) continue;
    const ir::TensorType& t = f_.value(op.result).type;
    b->scratch[op.result] = HostTensor::zeros(t.dtype, bind_shape(t, dims_),
                                              fmt::format("%{}", f_.value(op.result).name));
  }
  b->w13.resize(prog_.calls.size());
  b->w2.resize(prog_.calls.size());
  b->s13.resize(prog_.calls.size());
  b->s2.resize(prog_.calls.size());
  b->cu_q.resize(prog_.calls.size());
  b->cu_k.resize(prog_.calls.size());
  for (size_t i = 0; i < prog_.calls.size(); ++i) {
    const OperatorCall& c = prog_.calls[i];
    if (c.kind == ir::OpKind::moe) {
      // The bf16 shared expert, [2·Is, H] and [H, Is]: one-expert packs.
      if (c.moe_operands.shared()) {
        const HostTensor& s13 = inputs.at(f_.value(c.moe_operands.shared_w13).name);
        const HostTensor& s2 = inputs.at(f_.value(c.moe_operands.shared_w2).name);
        b->s13[i] = pack_experts(
            TensorView(s13.data<uint16_t>(), DType::bf16, {1, s13.shape[0], s13.shape[1]}),
            c.w13_proj(), c.glu_rows);
        b->s2[i] = pack_experts(
            TensorView(s2.data<uint16_t>(), DType::bf16, {1, s2.shape[0], s2.shape[1]}),
            ExpertProj::down);
      }
      // The engine's load-time step: the source weights are plain [E, 2I, H]
      // and [E, H, I], whatever layout the IR names (as a gemm's w is).
      if (c.moe_quant.quantized()) {
        b->w13[i] = pack_quant_experts(f_, c, inputs, 0);
        b->w2[i] = pack_quant_experts(f_, c, inputs, 1);
        continue;
      }
      const HostTensor& w13 = inputs.at(f_.value(operand(f_, c, 1)).name);
      const HostTensor& w2 = inputs.at(f_.value(operand(f_, c, 2)).name);
      b->w13[i] = pack_experts(TensorView(w13.data<uint16_t>(), DType::bf16, w13.shape),
                               c.w13_proj(), c.glu_rows);
      b->w2[i] =
          pack_experts(TensorView(w2.data<uint16_t>(), DType::bf16, w2.shape), ExpertProj::down);
    } else if (c.kind == ir::OpKind::attention) {
      const int64_t t = bind_shape(f_.value(operand(f_, c, 0)).type, dims_).at(0);
      const int64_t s = bind_shape(f_.value(operand(f_, c, 1)).type, dims_).at(0);
      if (t > INT32_MAX || s > INT32_MAX)
        throw Error(
            fmt::format("{}: T={} S={}: cu_seqlens are int32", ir::print(f_, op_of(f_, c)), t, s));
      b->cu_q[i] = {0, static_cast<int32_t>(t)};
      b->cu_k[i] = {0, static_cast<int32_t>(s)};
    }
  }
  bound_ = std::move(b);
}

AttentionOptions OperatorRunner::attention_options(const OperatorCall& c,
                                                   const TensorMap& outputs) const {
  AttentionOptions o = c.attention;
  if (c.attention_operands.sinks >= 0) o.sinks = view(c.attention_operands.sinks, outputs);
  if (c.attention_operands.alibi_slopes >= 0)
    o.alibi_slopes = view(c.attention_operands.alibi_slopes, outputs);
  return o;
}

const HostTensor& OperatorRunner::value(int id, const TensorMap& outputs) const {
  const std::string& name = f_.value(id).name;
  if (is_param(f_, id)) return inputs_->at(name);
  if (is_result(f_, id)) return outputs.at(name);
  return bound_->scratch.at(id);
}

TensorView OperatorRunner::view(int id, const TensorMap& outputs) const {
  if (auto it = bound_->strided.find(id); it != bound_->strided.end()) {
    const HostTensor& h = inputs_->at(f_.value(id).name);
    return TensorView(const_cast<uint8_t*>(it->second.bytes.data()), h.dtype, h.shape,
                      it->second.strides);
  }
  const HostTensor& h = value(id, outputs);
  return TensorView(const_cast<uint8_t*>(h.bytes.data()), h.dtype, h.shape);
}

void OperatorRunner::run(TensorMap& outputs) {
  run_calls(outputs, /*copy_rope_input=*/true);
}

void OperatorRunner::run_in_place(TensorMap& outputs) {
  run_calls(outputs, /*copy_rope_input=*/false);
}

void OperatorRunner::run_calls(TensorMap& outputs, bool copy_rope_input) {
  if (!bound_) throw Error("OperatorRunner::run: bind() first");
  for (size_t i = 0; i < prog_.calls.size(); ++i) {
    const OperatorCall& c = prog_.calls[i];
    const ir::Op& op = op_of(f_, c);
    // Calls write their results through views of tensors this runner owns
    // (outputs or scratch), never into an input.
    const TensorView out = view(op.result, outputs);
    switch (c.kind) {
      case ir::OpKind::rope: {
        // tilejit::rope works in place: the result starts as a copy of q.
        if (copy_rope_input) {
          const HostTensor& q = value(op.operands[0], outputs);
          std::memcpy(out.data, q.bytes.data(), q.bytes.size());
        }
        rope(out, nullptr, view(op.operands[1], outputs), view(op.operands[2], outputs), c.rope);
        break;
      }
      case ir::OpKind::attention: {
        const TensorView cu_q(bound_->cu_q[i].data(), DType::i32, {2});
        const TensorView cu_k(bound_->cu_k[i].data(), DType::i32, {2});
        flash_attn_varlen(view(op.operands[0], outputs), view(op.operands[1], outputs),
                          view(op.operands[2], outputs), out, cu_q, cu_k,
                          attention_options(c, outputs));
        break;
      }
      case ir::OpKind::decode_attention:
        decode_attention(view(op.operands[0], outputs), view(op.operands[1], outputs),
                         view(op.operands[2], outputs), out, view(op.operands[3], outputs),
                         view(op.operands[4], outputs), attention_options(c, outputs));
        break;
      default: {
        MoeOptions o = c.moe;
        const MoeOperands& mo = c.moe_operands;
        if (mo.b13 >= 0) o.b13 = view(mo.b13, outputs);
        if (mo.b2 >= 0) o.b2 = view(mo.b2, outputs);
        if (mo.shared()) {
          o.shared_w13 = &bound_->s13[i];
          o.shared_w2 = &bound_->s2[i];
        }
        if (mo.shared_weights >= 0) o.shared_weights = view(mo.shared_weights, outputs);
        fused_experts(view(op.operands[0], outputs), bound_->w13[i], bound_->w2[i],
                      view(op.operands[3], outputs), view(op.operands[4], outputs), out, o);
        break;
      }
    }
  }
  // A result that is a param is that input, unchanged.
  for (int r : f_.results)
    if (is_param(f_, r)) outputs.at(f_.value(r).name).bytes = inputs_->at(f_.value(r).name).bytes;
}

OperatorWork OperatorRunner::work() const {
  OperatorWork w;
  std::vector<std::string> shapes;
  for (const OperatorCall& c : prog_.calls) {
    const ir::Op& op = op_of(f_, c);
    auto shape = [&](size_t i) { return bind_shape(f_.value(op.operands.at(i)).type, dims_); };
    switch (c.kind) {
      case ir::OpKind::rope: {
        const auto q = shape(0);
        const int64_t rot = c.rope.rotary_dim ? c.rope.rotary_dim : q[2];
        const DType qt = f_.value(op.operands[0]).type.dtype;
        const DType pt = f_.value(op.operands[1]).type.dtype;
        // q read and written once, one position and one cache row per token.
        w.bytes += double(q[0]) * (2.0 * q[1] * q[2] * elem_bytes(qt) + elem_bytes(pt) + rot * 4.0);
        shapes.push_back(fmt::format("rope T={} H={} D={} rotary_dim={} {} {}", q[0], q[1], q[2],
                                     rot, dtype_name(qt), rope_style_name(c.rope.style)));
        break;
      }
      case ir::OpKind::attention: {
        const auto q = shape(0), k = shape(1), v = shape(2);
        double pairs = 0;
        for (int64_t i = 0; i < q[0]; ++i)
          pairs += double(visible_keys(c.attention, q[0], k[0], i));
        // Visible (query, key) pairs only: 2·D for q·k, 2·Dv for P·v, per head.
        w.flops += double(q[1]) * pairs * 2.0 * double(q[2] + v[2]);
        shapes.push_back(fmt::format("attention T={} S={} Hq={} Hkv={} D={} Dv={}{}", q[0], k[0],
                                     q[1], k[1], q[2], v[2], c.attention.causal ? " causal" : ""));
        break;
      }
      case ir::OpKind::decode_attention: {
        // Memory-bound: the K and V rows of every visible key, per kv head,
        // read once; q read and out written.
        if (!bound_) throw Error("OperatorRunner::work: bind() first (decode reads seq_lens)");
        const auto q = shape(0), kc = shape(1), vc = shape(2);
        const HostTensor& lens = value(op.operands[4], TensorMap{});
        const DType cache = f_.value(op.operands[1]).type.dtype;
        double keys = 0;
        for (int64_t b = 0; b < q[0]; ++b)
          keys += double(visible_keys(c.attention, 1, lens.data<int32_t>()[b], 0));
        w.bytes += keys * double(kc[2]) * double(kc[3] + vc[3]) * elem_bytes(cache) +
                   double(q[0] * q[1]) * double(q[2] + vc[3]) * 2.0;
        shapes.push_back(fmt::format("decode_attention B={} Hq={} Hkv={} D={} Dv={} block={} {}",
                                     q[0], q[1], kc[2], q[2], vc[3], kc[1], dtype_name(cache)));
        break;
      }
      default: {
        const auto h = shape(0), w2 = shape(2);
        // Per routed (token, expert): 2·H·2I for gate/up, 2·I·H for down.
        w.flops += 6.0 * double(h[0]) * double(c.top_k) * double(h[1]) * double(w2[2]);
        shapes.push_back(fmt::format("moe T={} E={} top_k={} H={} I={} {}", h[0], w2[0], c.top_k,
                                     h[1], w2[2], moe_act_text(c.moe)));
        break;
      }
    }
  }
  w.shape = fmt::format("{}", fmt::join(shapes, "; "));
  std::vector<std::string> counted;
  for (ir::OpKind k :
       {ir::OpKind::rope, ir::OpKind::attention, ir::OpKind::decode_attention, ir::OpKind::moe}) {
    if (std::none_of(prog_.calls.begin(), prog_.calls.end(),
                     [&](const OperatorCall& c) { return c.kind == k; }))
      continue;
    // A chain with FLOP-counted calls reports GFLOP/s of all of its time.
    const char* rope = w.flops > 0 ? "rope: no FLOPs counted (it streams memory), its time included"
                                   : "rope: q read and written, positions, one cache row per token";
    const char* decode =
        w.flops > 0 ? "decode_attention: no FLOPs counted (it streams the cache), its time included"
                    : "decode_attention: the K and V rows of each visible key, q and out";
    counted.push_back(k == ir::OpKind::rope ? rope
                      : k == ir::OpKind::attention
                          ? "attention: 2·(D+Dv) FLOP per visible (query, key) pair and head"
                      : k == ir::OpKind::decode_attention
                          ? decode
                          : "moe: 6·H·I FLOP per routed (token, expert)");
  }
  w.counted = fmt::format("{}", fmt::join(counted, "; "));
  return w;
}

}  // namespace tilejit::tools
