#include "ops/program_runner_ops.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "ir/activation.h"
#include "ir/printer.h"
#include "ops/program_runner.h"
#include "runtime/bf16.h"
#include "runtime/reference_attention.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_moe.h"
#include "runtime/reference_rope.h"
#include "runtime/thread_pool.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_jit.h"
#include "codegen/llvm/llvm_rope.h"
#include "jit/llvm_kernels.h"
#endif

namespace tilejit::ops {
namespace {

// The gated activation of an MoE call as the tool prints it.
std::string moe_act_text(const MoeOptions& o) {
  if (!o.clamped_swiglu) return activation_name(o.act);
  return fmt::format("clamped_swiglu(alpha={:g}, limit={:g})", o.swiglu_alpha, o.swiglu_limit);
}

constexpr double kU = runtime::kF32Unit;

int64_t elem_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

double real_at(const HostTensor& t, int64_t i) {
  return t.dtype == DType::bf16 ? double(runtime::bf16_to_f32(t.data<uint16_t>()[i]))
                                : double(t.data<float>()[i]);
}

int64_t int_at(const HostTensor& t, int64_t i) {
  return t.dtype == DType::i64 ? t.data<int64_t>()[i] : int64_t{t.data<int32_t>()[i]};
}

const ir::Op& op_of(const ir::Function& f, const OperatorCall& c) {
  return f.ops.at(c.op);
}

int operand(const ir::Function& f, const OperatorCall& c, size_t i) {
  return op_of(f, c).operands.at(i);
}

bool is_param(const ir::Function& f, int id) {
  return std::find(f.params.begin(), f.params.end(), id) != f.params.end();
}

bool is_result(const ir::Function& f, int id) {
  return std::find(f.results.begin(), f.results.end(), id) != f.results.end();
}

const char* style_name(RopeStyle s) {
  return s == RopeStyle::neox ? "neox" : "gptj";
}

// A dim of value `id` bound by `dims`: its size, or its symbol when unbound.
std::string dim_text(const ir::Function& f, int id, int i, const DimBindings& dims) {
  const ir::Dim& d = f.value(id).type.dims.at(i);
  if (d.is_static()) return std::to_string(d.value);
  auto it = dims.find(d.symbol);
  return it == dims.end() ? d.str() : std::to_string(it->second);
}

std::string operand_text(const ir::Function& f, int id, const DimBindings& dims) {
  const ir::TensorType& t = f.value(id).type;
  std::string s = fmt::format("%{} {} [", f.value(id).name, dtype_name(t.dtype));
  for (int i = 0; i < t.rank(); ++i) s += (i ? ", " : "") + dim_text(f, id, i, dims);
  return s + "]";
}

// sm_scale as the API applies it (the IR default is the API's: 1/√D).
double sm_scale_of(const OperatorCall& c, int64_t d) {
  return c.attention.sm_scale ? double(*c.attention.sm_scale) : 1.0 / std::sqrt(double(d));
}

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

// Reference values and per-element bounds of one call's result, laid out
// like the result.
struct Expected {
  std::vector<double> ref, tol;
  std::string tolerance;  // the formula, for the report
};

}  // namespace

bool is_operator_op(ir::OpKind k) {
  return k == ir::OpKind::rope || k == ir::OpKind::attention || k == ir::OpKind::moe;
}

const char* OperatorCall::api() const {
  switch (kind) {
    case ir::OpKind::rope:
      return "tilejit::rope";
    case ir::OpKind::attention:
      return "tilejit::flash_attn_varlen";
    default:
      return "tilejit::fused_experts";
  }
}

bool has_operator_ops(const ir::Function& f) {
  return std::any_of(f.ops.begin(), f.ops.end(),
                     [](const ir::Op& op) { return is_operator_op(op.kind); });
}

OperatorProgram match_operator_program(const ir::Function& f) {
  OperatorProgram p;
  for (size_t i = 0; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    if (!is_operator_op(op.kind))
      throw Error(fmt::format(
          "no lowering for op '{}' ({}) in a program with rope, attention or moe ops: each of "
          "those runs as one call of the public API, and a program may chain only them; a gemm "
          "or elementwise op needs a program of its own",
          ir::name(op.kind), ir::print(f, op)));
    OperatorCall c;
    c.op = i;
    c.kind = op.kind;
    const ir::Attrs& a = op.attrs;
    const std::string who = ir::print(f, op);
    switch (op.kind) {
      case ir::OpKind::rope: {
        const DType q = f.value(op.operands[0]).type.dtype;
        if (q != DType::f32 && q != DType::bf16)
          throw Error(fmt::format("{}: operand 'q' (%{}) is {}: tilejit::rope takes f32 or bf16",
                                  who, f.value(op.operands[0]).name, dtype_name(q)));
        c.rope.style =
            a.get_string("style").value_or("neox") == "gptj" ? RopeStyle::gptj : RopeStyle::neox;
        c.rope.rotary_dim = a.get_int("rotary_dim").value_or(0);  // 0: D, the IR default too
        break;
      }
      case ir::OpKind::attention: {
        const DType q = f.value(op.operands[0]).type.dtype;
        if (q != DType::bf16)
          throw Error(fmt::format(
              "{}: operand 'q' (%{}) is {}: tilejit::flash_attn_varlen takes bf16 q, k and v "
              "(and writes a bf16 out)",
              who, f.value(op.operands[0]).name, dtype_name(q)));
        c.attention.causal = a.get_bool("causal").value_or(false);
        if (auto s = a.get_double("sm_scale")) c.attention.sm_scale = static_cast<float>(*s);
        c.attention.window_left = static_cast<int>(a.get_int("window_left").value_or(-1));
        c.attention.window_right = static_cast<int>(a.get_int("window_right").value_or(-1));
        c.attention.softcap = static_cast<float>(a.get_double("softcap").value_or(0.0));
        break;
      }
      default: {  // moe
        for (size_t w : {size_t{1}, size_t{2}})
          if (!is_param(f, op.operands[w]))
            throw Error(fmt::format(
                "{}: operand '{}' (%{}) is computed by the program: the expert weights must be "
                "program inputs, since they are packed once (pack_experts) when the inputs are "
                "bound",
                who, w == 1 ? "w13" : "w2", f.value(op.operands[w]).name));
        c.top_k = *a.get_int("top_k");
        // The verifier allowed only the gated activations or clamped_swiglu.
        const std::string act = a.get_string("activation").value_or("silu");
        c.moe.act = ir::activation_from_name(act).value_or(Activation::silu);
        c.moe.clamped_swiglu = act == "clamped_swiglu";
        c.moe.swiglu_alpha = static_cast<float>(a.get_double("swiglu_alpha").value_or(1.702));
        c.moe.swiglu_limit = static_cast<float>(a.get_double("swiglu_limit").value_or(7.0));
        c.moe.routed_scaling_factor =
            static_cast<float>(a.get_double("routed_scaling_factor").value_or(1.0));
        break;
      }
    }
    p.calls.push_back(c);
  }
  return p;
}

// ---------------------------------------------------------------------------
// dump --stage plan | key

namespace {

// The RoPE kernel name the call will use on a JIT path, when the shapes fix it.
std::string rope_kernel_name(const ir::Function& f, const OperatorCall& c,
                             const DimBindings& dims) {
#ifdef TILEJIT_HAVE_LLVM
  const ir::TensorType& q = f.value(operand(f, c, 0)).type;
  const std::string h = dim_text(f, operand(f, c, 0), 1, dims);
  codegen::llvm_backend::RopeDesc d;
  d.neox = c.rope.style == RopeStyle::neox;
  d.dtype = q.dtype;
  d.cache_dtype = DType::f32;
  d.d = q.dims[2].value;
  d.rotary_dim = c.rope.rotary_dim ? c.rope.rotary_dim : d.d;
  d.hq = q.dims[1].is_static() ? q.dims[1].value : 0;
  d.hk = 0;  // k absent
  d.pos_dtype = f.value(operand(f, c, 1)).type.dtype;
  std::string name = d.name();
  if (!q.dims[1].is_static()) {
    // The head count is in the name; an unbound one is shown as its symbol.
    const std::string placeholder = "_hq0_";
    if (auto at = name.find(placeholder); at != std::string::npos)
      name.replace(at, placeholder.size(), "_hq" + h + "_");
  }
  return name;
#else
  (void)f;
  (void)c;
  (void)dims;
  return "";
#endif
}

// The cache key of an LLVM kernel (jit::llvm_host_key), or the key itself in
// a build without LLVM.
std::string llvm_host_key(const std::string& key) {
#ifdef TILEJIT_HAVE_LLVM
  return jit::llvm_host_key(key);
#else
  return key;
#endif
}

std::string api_text(const ir::Function& f, const OperatorCall& c, const DimBindings& dims) {
  const ir::Op& op = op_of(f, c);
  auto arg = [&](size_t i) { return operand_text(f, op.operands.at(i), dims); };
  const std::string out = operand_text(f, op.result, dims);
  switch (c.kind) {
    case ir::OpKind::rope: {
      const int64_t d = f.value(op.operands[0]).type.dims[2].value;
      return fmt::format(
          "tilejit::rope(q = {} (a copy of %{}, rotated in place), k = none, positions = {}, "
          "cos_sin_cache = {}, {{.style = {}, .rotary_dim = {}}})",
          out, f.value(op.operands[0]).name, arg(1), arg(2), style_name(c.rope.style),
          c.rope.rotary_dim ? c.rope.rotary_dim : d);
    }
    case ir::OpKind::attention: {
      const AttentionOptions& o = c.attention;
      const int64_t d = f.value(op.operands[0]).type.dims[2].value;
      return fmt::format(
          "tilejit::flash_attn_varlen(q = {}, k = {}, v = {}, out = {}, cu_seqlens_q = [0, {}], "
          "cu_seqlens_k = [0, {}], {{.causal = {}, .sm_scale = {:.6g}{}, .window_left = {}, "
          ".window_right = {}, .softcap = {:g}}}): one sequence",
          arg(0), arg(1), arg(2), out, dim_text(f, op.operands[0], 0, dims),
          dim_text(f, op.operands[1], 0, dims), o.causal, sm_scale_of(c, d),
          o.sm_scale ? "" : fmt::format(" (1/√{})", d), o.window_left, o.window_right, o.softcap);
    }
    default:
      return fmt::format(
          "w13p = tilejit::pack_experts({}, gate_up), w2p = tilejit::pack_experts({}, down) once "
          "when the inputs are bound; then tilejit::fused_experts(hidden = {}, w13p, w2p, "
          "topk_weights = {}, topk_ids = {}, out = {}, {{.act = {}}})",
          arg(1), arg(2), arg(0), arg(3), arg(4), out, moe_act_text(c.moe));
  }
}

// What runs on `isa`, and the kernels (named when the shapes fix them).
std::pair<std::string, std::string> path_and_kernels(const ir::Function& f, const OperatorCall& c,
                                                     Isa isa, const DimBindings& dims) {
  const std::string api = c.api();
  if (isa == Isa::scalar) {
    switch (c.kind) {
      case ir::OpKind::rope:
        return {"scalar: the reference, one head row at a time (ops/rope.cpp)",
                "none (no JIT code on the scalar path)"};
      case ir::OpKind::attention:
        return {"scalar: one query head at a time in fp32 (ops/attention_scalar.h)",
                "none (no JIT code on the scalar path)"};
      default:
        return {"scalar: the packed experts read in fp32 (ops/moe.cpp)",
                "none (no JIT code on the scalar path)"};
    }
  }
  switch (c.kind) {
    case ir::OpKind::rope: {
      const std::string name = rope_kernel_name(f, c, dims);
      if (name.empty()) return {"needs a tilejit built with LLVM: the call raises an Error", "-"};
      return {fmt::format("{}: one LLVM-compiled kernel per specialisation (dtype, head size, "
                          "rotary_dim, heads, position dtype); tokens split over the threads",
                          isa_name(isa)),
              name};
    }
    case ir::OpKind::attention:
      return {fmt::format("{}: the attention engine (docs/attention.md): q·kᵀ and P·v on "
                          "brgemm micro-kernels, online softmax over key blocks",
                          isa_name(isa)),
              fmt::format("chosen at run time by {} (brgemm_{} micro-kernels; "
                          "TILEJIT_VERBOSE=1 logs each one compiled)",
                          api, isa_name(isa))};
    default:
      return {fmt::format("{}: gate/up GEMM with the {}-and-mul epilogue, then the down GEMM "
                          "scaled by the routing weights (docs/moe.md)",
                          isa_name(isa), moe_act_text(c.moe)),
              fmt::format("chosen at run time by {} (brgemm_{} micro-kernels; "
                          "TILEJIT_VERBOSE=1 logs each one compiled)",
                          api, isa_name(isa))};
  }
}

std::string call_header(const ir::Function& f, const OperatorProgram& p, size_t i) {
  return fmt::format("call {} of {}: {}\n", i + 1, p.calls.size(),
                     ir::print(f, op_of(f, p.calls[i])));
}

}  // namespace

std::string describe_operator_plan(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims) {
  std::string s = fmt::format(
      "@{}: {} call{} of the public API in program order, on the {} path; no gemm plan (the "
      "operators plan their own work)\n",
      f.name, p.calls.size(), p.calls.size() == 1 ? "" : "s", isa_name(isa));
  for (size_t i = 0; i < p.calls.size(); ++i) {
    const auto [path, kernels] = path_and_kernels(f, p.calls[i], isa, dims);
    s += call_header(f, p, i);
    s += fmt::format("  api          {}\n", api_text(f, p.calls[i], dims));
    s += fmt::format("  path         {}\n", path);
    s += fmt::format("  kernels      {}\n", kernels);
  }
  return s;
}

std::string describe_operator_keys(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims) {
  std::string s;
  for (size_t i = 0; i < p.calls.size(); ++i) {
    const OperatorCall& c = p.calls[i];
    s += call_header(f, p, i);
    const auto [path, kernels] = path_and_kernels(f, c, isa, dims);
    if (isa != Isa::scalar && c.kind == ir::OpKind::rope && kernels != "-") {
      s += fmt::format("  kernel  {}\n", kernels);
      s += fmt::format("  key     {}\n", llvm_host_key(kernels));
    } else {
      s += fmt::format("  kernels {}\n", kernels);
    }
  }
  return s;
}

// ---------------------------------------------------------------------------
// Running

struct OperatorRunner::Bound {
  std::map<int, HostTensor> scratch;  // values between calls that are not results
  // Params with a static strided layout, laid out at those strides.
  struct Strided {
    std::vector<uint8_t> bytes;
    std::vector<int64_t> strides;
  };
  std::map<int, Strided> strided;
  std::vector<PackedExperts> w13, w2;              // per call (moe calls only)
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
  b->cu_q.resize(prog_.calls.size());
  b->cu_k.resize(prog_.calls.size());
  for (size_t i = 0; i < prog_.calls.size(); ++i) {
    const OperatorCall& c = prog_.calls[i];
    if (c.kind == ir::OpKind::moe) {
      // The engine's load-time step: the source weights are plain [E, 2I, H]
      // and [E, H, I], whatever layout the IR names (as a gemm's w is).
      const HostTensor& w13 = inputs.at(f_.value(operand(f_, c, 1)).name);
      const HostTensor& w2 = inputs.at(f_.value(operand(f_, c, 2)).name);
      b->w13[i] = pack_experts(TensorView(w13.data<uint16_t>(), DType::bf16, w13.shape),
                               ExpertProj::gate_up);
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
                          view(op.operands[2], outputs), out, cu_q, cu_k, c.attention);
        break;
      }
      default:
        fused_experts(view(op.operands[0], outputs), bound_->w13[i], bound_->w2[i],
                      view(op.operands[3], outputs), view(op.operands[4], outputs), out, c.moe);
        break;
    }
  }
  // A result that is a param is that input, unchanged.
  for (int r : f_.results)
    if (is_param(f_, r)) outputs.at(f_.value(r).name).bytes = inputs_->at(f_.value(r).name).bytes;
}

// ---------------------------------------------------------------------------
// Checking: one reference per call, on the operands that call read.

namespace {

// Bound of tests/rope_test.cpp, with mag = |x·cos| + |x'·sin|: f32 2⁻²²·mag
// (the product and the fma rounded, doubled for headroom); bf16 one bf16 ulp
// 2⁻⁷·|ref| + 2⁻²¹·mag. Elements past rotary_dim must be bit-exact.
Expected rope_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& pos,
                       const HostTensor& cs) {
  const int64_t t = q.shape[0], h = q.shape[1], d = q.shape[2];
  const int64_t rot = c.rope.rotary_dim ? c.rope.rotary_dim : d;
  const int64_t p = cs.shape[0];
  for (int64_t i = 0; i < t; ++i)
    if (int_at(pos, i) < 0 || int_at(pos, i) >= p)
      throw Error(fmt::format("check: positions[{}] = {} is outside the cache's [0, {})", i,
                              int_at(pos, i), p));
  Expected e;
  e.ref.resize(static_cast<size_t>(q.numel()));
  e.tol.resize(e.ref.size());
  const bool f32 = q.dtype == DType::f32;
  runtime::ReferenceRope r;
  r.neox = c.rope.style == RopeStyle::neox;
  r.rotary_dim = rot;
  runtime::parallel_for(t, [&](int64_t tok) {
    const int64_t at = int_at(pos, tok);
    const auto cache = [&](int64_t, int64_t col) {
      return double(cs.data<float>()[at * rot + col]);
    };
    std::vector<double> in(d), out(d), mag(d);
    for (int64_t hh = 0; hh < h; ++hh) {
      const int64_t base = (tok * h + hh) * d;
      for (int64_t i = 0; i < d; ++i) in[i] = real_at(q, base + i);
      runtime::reference_rope_head(r, d, in.data(), out.data(), cache, mag.data());
      for (int64_t i = 0; i < d; ++i) {
        e.ref[base + i] = out[i];
        e.tol[base + i] = i >= rot ? 0.0 : runtime::rope_output_bound(q.dtype, mag[i], out[i]);
      }
    }
  });
  e.tolerance = f32 ? "f32: 2⁻²²·(|x·cos| + |x'·sin|); exact past rotary_dim"
                    : "bf16: 2⁻⁷·|ref| + 2⁻²¹·(|x·cos| + |x'·sin|); exact past rotary_dim";
  return e;
}

// Bound of tests/attention_test.cpp, 2⁻⁷·max|v| + 2⁻⁸·|ref| (P rounded to
// bf16 before P·v, the bf16 output, headroom for fp32 exp and sums), plus
// what fp32 score errors can do with inputs larger than the tests': a score
// off by δ moves each softmax weight by a factor e^{±2δ}, the output by
// ≤ 5δ·max|v| (δ small), with δ ≤ (D+2)·u·sm_scale·‖q_i‖₁·max|k| for query
// row i (softcap is 1-Lipschitz).
Expected attention_expected(const OperatorCall& c, const HostTensor& q, const HostTensor& k,
                            const HostTensor& v) {
  const int64_t t = q.shape[0], hq = q.shape[1], d = q.shape[2];
  const int64_t s = k.shape[0], hkv = k.shape[1], dv = v.shape[2];
  const int64_t group = hq / hkv;
  const double scale = sm_scale_of(c, d);
  double max_v = 0, max_k = 0;
  for (int64_t i = 0; i < v.numel(); ++i) max_v = std::max(max_v, std::fabs(real_at(v, i)));
  for (int64_t i = 0; i < k.numel(); ++i) max_k = std::max(max_k, std::fabs(real_at(k, i)));
  Expected e;
  e.ref.assign(static_cast<size_t>(t * hq * dv), 0.0);
  e.tol.assign(e.ref.size(), 0.0);
  runtime::parallel_for(hq, [&](int64_t h) {
    const int64_t g = h / group;
    runtime::ReferenceAttentionHead r;
    r.tq = t;
    r.tk = s;
    r.d = d;
    r.dv = dv;
    r.sm_scale = scale;
    r.causal = c.attention.causal;
    r.window_left = c.attention.window_left;
    r.window_right = c.attention.window_right;
    r.softcap = c.attention.softcap;
    r.q_at = [&](int64_t i, int64_t col) { return real_at(q, (i * hq + h) * d + col); };
    r.k_at = [&](int64_t j, int64_t col) { return real_at(k, (j * hkv + g) * d + col); };
    r.v_at = [&](int64_t j, int64_t col) { return real_at(v, (j * hkv + g) * dv + col); };
    std::vector<double> delta(static_cast<size_t>(t));  // per query row: the score bound
    for (int64_t i = 0; i < t; ++i) {
      double q1 = 0;
      for (int64_t cc = 0; cc < d; ++cc) q1 += std::fabs(real_at(q, (i * hq + h) * d + cc));
      delta[i] = double(d + 2) * kU * scale * q1 * max_k;
    }
    r.out = [&](int64_t i, int64_t col, double val) {
      const int64_t at = (i * hq + h) * dv + col;
      e.ref[at] = val;
      e.tol[at] = runtime::attention_output_bound(max_v, val) + 5 * delta[i] * max_v;
    };
    runtime::reference_attention_head(r);
  });
  e.tolerance = "2⁻⁷·max|v| + 2⁻⁸·|ref| + 5·(D+2)·2⁻²⁴·sm_scale·‖q_i‖₁·max|k|·max|v| (fp32 scores)";
  return e;
}

// Bound of tests/moe_test.cpp (see its header for the derivation;
// runtime/reference_error_bounds.h computes it), with its fp32 sums bounded
// by fp32_sum_ulps(n)·u·Σ|t| instead of 8·u·Σ|t|, so that it holds for inputs of
// any sign, not only for zero-mean random ones:
//  1. gate and up: εg = fp32_sum_ulps(H)·u·Σ|x·w|, εu likewise;
//  2.-3. glu(gate, up) in fp32 and the bf16 slack of the activation:
//     runtime::moe_act_slack, pushed through |W2| and the routing weights
//     into act_term;
//  4.-5. down projection and weighted sum, (fp32_sum_ulps(I) + fp32_sum_ulps(k+1))·u·
//     (Σ|terms| + act_term), and the output rounding: runtime::moe_output_bound.
Expected moe_expected(const OperatorCall& c, const HostTensor& hidden, const HostTensor& w13,
                      const HostTensor& w2, const HostTensor& tw, const HostTensor& ti,
                      DType out_dtype) {
  const int64_t t = hidden.shape[0], h = hidden.shape[1];
  const int64_t e_count = w13.shape[0], inter = w2.shape[2], k = tw.shape[1];
  for (int64_t i = 0; i < ti.numel(); ++i)
    if (ti.data<int32_t>()[i] < 0 || ti.data<int32_t>()[i] >= e_count)
      throw Error(fmt::format("check: topk_ids[{}, {}] = {} is outside [0, {})", i / k, i % k,
                              ti.data<int32_t>()[i], e_count));
  runtime::ReferenceGlu glu;
  glu.act = c.moe.act;
  glu.clamped_swiglu = c.moe.clamped_swiglu;
  glu.alpha = c.moe.swiglu_alpha;
  glu.limit = c.moe.swiglu_limit;
  const double eps_h = runtime::fp32_sum_ulps(h) * kU;
  const auto act_slack = [&](const runtime::MoeActPoint& p) {
    return runtime::moe_act_slack(glu, p, eps_h);
  };
  std::vector<float> out(static_cast<size_t>(t * h));
  std::vector<double> abs_sum(out.size()), act_term(out.size());
  runtime::parallel_for(t, [&](int64_t tok) {
    runtime::ReferenceMoeArgs a;
    a.t = 1;
    a.h = h;
    a.i = inter;
    a.e = e_count;
    a.k = k;
    a.hidden = hidden.data<uint16_t>() + tok * h;
    a.ld_hidden = h;
    a.w13 = w13.data<uint16_t>();
    a.w2 = w2.data<uint16_t>();
    a.topk_weights = tw.data<float>() + tok * k;
    a.ld_weights = k;
    a.topk_ids = ti.data<int32_t>() + tok * k;
    a.ld_ids = k;
    a.glu = glu;
    a.routed_scaling_factor = c.moe.routed_scaling_factor;
    a.out = out.data() + tok * h;
    a.ld_out = h;
    a.abs_sum = abs_sum.data() + tok * h;
    a.act_term = act_term.data() + tok * h;
    a.act_slack = act_slack;
    runtime::reference_moe(a);
  });
  Expected e;
  e.ref.resize(out.size());
  e.tol.resize(out.size());
  const double eps_out = (runtime::fp32_sum_ulps(inter) + runtime::fp32_sum_ulps(k + 1)) * kU;
  for (size_t i = 0; i < out.size(); ++i) {
    const double ref = out[i];
    e.ref[i] = ref;
    e.tol[i] = runtime::moe_output_bound(out_dtype, abs_sum[i], act_term[i], eps_out, ref);
  }
  e.tolerance = fmt::format(
      "bf16 out: 2⁻⁸·(|ref| + tol) + tol, tol = fp32 sums of n terms at min(n+2, 6·√(n/3))·"
      "2⁻²⁴·Σ|terms| (H={}, I={}, top_k={}) + the bf16 activations' rounding slack through "
      "|W2| (tests/moe_test.cpp)",
      h, inter, k);
  return e;
}

// Adds one call's comparison to the report.
void compare(CheckReport& rep, double& worst_ratio, const std::string& value_name,
             const HostTensor& got, const Expected& e) {
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double want = e.ref[i], tol = e.tol[i];
    const double g = real_at(got, i);
    double err = std::fabs(g - want);
    if (std::isnan(err)) err = INFINITY;
    ++rep.checked;
    if (!(err <= tol)) ++rep.failures;
    rep.max_abs = std::max(rep.max_abs, err);
    rep.max_rel = std::max(rep.max_rel, err / std::max(std::fabs(want), 1e-6));
    const double ratio = tol > 0 ? err / tol : (err > 0 ? INFINITY : 0.0);
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      std::vector<int64_t> idx(got.shape.size());
      int64_t rest = i;
      for (int dd = static_cast<int>(got.shape.size()) - 1; dd >= 0; --dd) {
        idx[dd] = rest % std::max<int64_t>(1, got.shape[dd]);
        rest /= std::max<int64_t>(1, got.shape[dd]);
      }
      rep.worst_index = idx;
      rep.worst_value = value_name;
      rep.worst_got = g;
      rep.worst_ref = want;
      rep.worst_tol = tol;
    }
  }
}

}  // namespace

CheckReport OperatorRunner::check(const TensorMap& outputs) const {
  if (!bound_) throw Error("OperatorRunner::check: bind() first");
  CheckReport rep;
  double worst_ratio = -1;
  std::vector<std::string> refs, tols;
  for (const OperatorCall& c : prog_.calls) {
    const ir::Op& op = op_of(f_, c);
    auto in = [&](size_t i) -> const HostTensor& { return value(op.operands.at(i), outputs); };
    const HostTensor& got = value(op.result, outputs);
    Expected e;
    const char* ref = "";
    switch (c.kind) {
      case ir::OpKind::rope:
        e = rope_expected(c, in(0), in(1), in(2));
        ref = "runtime/reference_rope.h";
        break;
      case ir::OpKind::attention:
        e = attention_expected(c, in(0), in(1), in(2));
        ref = "runtime/reference_attention.h";
        break;
      default:
        e = moe_expected(c, in(0), in(1), in(2), in(3), in(4), got.dtype);
        ref = "runtime/reference_moe.h";
        break;
    }
    const std::string& name = f_.value(op.result).name;
    compare(rep, worst_ratio, "%" + name, got, e);
    refs.push_back(fmt::format("{} for %{}", ref, name));
    tols.push_back(prog_.calls.size() == 1
                       ? e.tolerance
                       : fmt::format("%{} ({}): {}", name, ir::name(op.kind), e.tolerance));
  }
  rep.reference = fmt::format("{}, in double{}", fmt::join(refs, ", "),
                              prog_.calls.size() > 1
                                  ? "; each call on the operands it read, so each op is held to "
                                    "its own bound"
                                  : "");
  rep.tolerance = fmt::format("{}", fmt::join(tols, "\n               "));
  return rep;
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
                                     rot, dtype_name(qt), style_name(c.rope.style)));
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
  for (ir::OpKind k : {ir::OpKind::rope, ir::OpKind::attention, ir::OpKind::moe}) {
    if (std::none_of(prog_.calls.begin(), prog_.calls.end(),
                     [&](const OperatorCall& c) { return c.kind == k; }))
      continue;
    // A chain with FLOP-counted calls reports GFLOP/s of all of its time.
    const char* rope = w.flops > 0 ? "rope: no FLOPs counted (it streams memory), its time included"
                                   : "rope: q read and written, positions, one cache row per token";
    counted.push_back(k == ir::OpKind::rope ? rope
                      : k == ir::OpKind::attention
                          ? "attention: 2·(D+Dv) FLOP per visible (query, key) pair and head"
                          : "moe: 6·H·I FLOP per routed (token, expert)");
  }
  w.counted = fmt::format("{}", fmt::join(counted, "; "));
  return w;
}

}  // namespace tilejit::ops
