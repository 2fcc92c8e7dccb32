#include "codegen/gemm_lowering.h"
#include "runtime/lazy_statics.h"

#include <fmt/format.h>

#include "ir/activation.h"
#include "ir/printer.h"

namespace tilejit::codegen {
namespace {

// The chain a GEMM plan fuses; the activations are those of ir/activation.h
// that have an op.
const std::string& chain() {
  static const std::string& s = *new std::string([] {
    std::string acts;
    for (const ir::ActivationInfo& r : ir::kActivations) {
      if (!r.op) continue;
      if (!acts.empty()) acts += '|';
      acts += ir::name(*r.op);
    }
    return fmt::format(
        "allowed: gemm(x: ?xK bf16, w: NxK bf16 packed<vnni2, n_block=64>) → add(bias: [N] "
        "f32|bf16)? → {}? → cast(to = bf16|f32)? → return",
        acts);
  }());  // immortal: read by threads that may outlive static destruction
  return s;
}
const bool g_fork_hook = runtime::on_fork_complete([] { (void)chain(); });

[[noreturn]] void reject(const ir::Function& f, const ir::Op& op, const std::string& why) {
  throw Error(fmt::format("lower gemm: {}: {}; {}", ir::print(f, op), why, chain()));
}

bool is_param(const ir::Function& f, int id) {
  for (int p : f.params)
    if (p == id) return true;
  return false;
}

}  // namespace

GemmSpec match_gemm(const ir::Function& f) {
  if (f.ops.empty() || f.ops.front().kind != ir::OpKind::gemm)
    throw Error(
        fmt::format("lower gemm: function @{} does not start with a gemm; {}", f.name, chain()));
  const ir::Op& g = f.ops.front();
  const ir::TensorType& w = f.value(g.operands.at(1)).type;
  if (!w.layout.is_packed("vnni2") || w.layout.param("n_block").value_or(0) != 64)
    reject(f, g, fmt::format("operand w has layout '{}'", w.layout.str()));
  GemmSpec spec;
  spec.n = w.dims.at(0).value;
  spec.k = w.dims.at(1).value;
  int current = g.result;
  enum Stage { kBias, kAct, kCast, kDone } stage = kBias;
  for (size_t i = 1; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    if (op.operands.empty() || op.operands[0] != current)
      reject(f, op, "it does not consume the previous result of the chain");
    if (op.kind == ir::OpKind::add && stage <= kBias) {
      const int b = op.operands.at(1);
      const ir::TensorType& bt = f.value(b).type;
      if (!is_param(f, b) || bt.rank() != 1)
        reject(f, op, "the added operand is not a [N] bias parameter");
      spec.bias = bt.dtype == DType::bf16 ? BiasKind::bf16 : BiasKind::f32;
      stage = kAct;
    } else if (ir::activation_of(op.kind) != Activation::none && stage <= kAct) {
      spec.act = ir::activation_of(op.kind);
      stage = kCast;
    } else if (op.kind == ir::OpKind::cast && stage <= kCast) {
      spec.out = f.value(op.result).type.dtype;
      if (spec.out != DType::bf16 && spec.out != DType::f32)
        reject(f, op, fmt::format("cast to {} is not a GEMM output type", dtype_name(spec.out)));
      stage = kDone;
    } else {
      reject(f, op, "this op cannot be fused here");
    }
    current = op.result;
  }
  if (f.results.size() != 1 || f.results[0] != current)
    throw Error(
        fmt::format("lower gemm: @{} must return the end of the chain; {}", f.name, chain()));
  return spec;
}

GemmPlan lower_gemm(const ir::Function& f, Isa isa) {
  return plan_gemm(match_gemm(f), isa);
}

}  // namespace tilejit::codegen
