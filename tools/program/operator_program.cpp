#include "tools/program/operator_program.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "ir/activation.h"
#include "ir/printer.h"
#include "tools/program/gemm_program.h"

namespace tilejit::tools {

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

const char* rope_style_name(RopeStyle s) {
  return s == RopeStyle::neox ? "neox" : "gptj";
}

std::string moe_act_text(const MoeOptions& o) {
  if (!o.clamped_swiglu) return activation_name(o.act);
  return fmt::format("clamped_swiglu(alpha={:g}, limit={:g})", o.swiglu_alpha, o.swiglu_limit);
}

double sm_scale_of(const OperatorCall& c, int64_t d) {
  return c.attention.sm_scale ? double(*c.attention.sm_scale) : 1.0 / std::sqrt(double(d));
}

bool is_operator_op(ir::OpKind k) {
  return k == ir::OpKind::rope || k == ir::OpKind::attention || k == ir::OpKind::decode_attention ||
         k == ir::OpKind::moe;
}

const char* OperatorCall::api() const {
  switch (kind) {
    case ir::OpKind::rope:
      return "tilejit::rope";
    case ir::OpKind::attention:
      return "tilejit::flash_attn_varlen";
    case ir::OpKind::decode_attention:
      return "tilejit::decode_attention";
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
          "no lowering for op '{}' ({}) in a program with rope, attention, decode_attention or "
          "moe ops: each of "
          "those runs as one call of the public API, and a program may chain only them; a gemm "
          "or elementwise op needs a program of its own",
          ir::name(op.kind), ir::print(f, op)));
    OperatorCall c;
    c.op = i;
    c.kind = op.kind;
    const ir::Attrs& a = op.attrs;
    const std::string who = ir::print(f, op);
    if (op.kind == ir::OpKind::attention || op.kind == ir::OpKind::decode_attention) {
      // The per-head tensors follow the positional operands.
      const size_t first = ir::operand_roles(op.kind).size();
      for (size_t n = 0; n < op.operand_names.size(); ++n) {
        const int id = op.operands.at(first + n);
        if (op.operand_names[n] == "sinks") c.attention_operands.sinks = id;
        if (op.operand_names[n] == "alibi_slopes") c.attention_operands.alibi_slopes = id;
      }
    }
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
      case ir::OpKind::decode_attention: {
        // The verifier allowed bf16 q and a bf16, f8e4m3 or f8e5m2 cache (the call's own
        // rule); the new token is the last position, so no causal flag.
        if (auto s = a.get_double("sm_scale")) c.attention.sm_scale = static_cast<float>(*s);
        c.attention.window_left = static_cast<int>(a.get_int("window_left").value_or(-1));
        c.attention.softcap = static_cast<float>(a.get_double("softcap").value_or(0.0));
        c.attention.kv_scales.k_scale = static_cast<float>(a.get_double("k_scale").value_or(1.0));
        c.attention.kv_scales.v_scale = static_cast<float>(a.get_double("v_scale").value_or(1.0));
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
        // Quantized experts' named operands are packed with them; the
        // biases, the shared expert and its weights go into MoeOptions.
        for (size_t n = 0; n < op.operand_names.size(); ++n) {
          const int id = op.operands.at(5 + n);
          const std::string& role = op.operand_names[n];
          if (!is_param(f, id))
            throw Error(fmt::format(
                "{}: operand '{}' (%{}) is computed by the program: the experts' checkpoint "
                "tensors, biases and shared expert must be program inputs, since they are packed "
                "or bound once (pack_experts) when the inputs are bound",
                who, role, f.value(id).name));
          MoeOperands& mo = c.moe_operands;
          if (role == "b13") mo.b13 = id;
          if (role == "b2") mo.b2 = id;
          if (role == "shared_w13") mo.shared_w13 = id;
          if (role == "shared_w2") mo.shared_w2 = id;
          if (role == "shared_weights") mo.shared_weights = id;
          const int proj = role.back() == '2' ? 1 : 0;
          if (role.rfind("scale", 0) == 0) c.moe_quant.scale[proj] = id;
          if (role.rfind("zero", 0) == 0) c.moe_quant.zero[proj] = id;
          if (role.rfind("g_idx", 0) == 0) c.moe_quant.g_idx[proj] = id;
        }
        const DType wdt = f.value(op.operands[1]).type.dtype;
        c.moe_quant.format = weight_format_of(wdt, a);
        c.moe_quant.block_n = a.get_int("block_n").value_or(0);
        c.moe_quant.block_k = a.get_int("block_k").value_or(0);
        c.moe_quant.group_size = a.get_int("group_size").value_or(128);
        c.moe_quant.bits = static_cast<int>(a.get_int("bits").value_or(4));
        c.moe_quant.gptq_v2 = a.get_bool("gptq_v2").value_or(false);
        c.moe.act_quant = a.get_string("act_quant").value_or("dynamic_sym") == "dynamic_asym"
                              ? ActQuant::dynamic_asym
                              : ActQuant::dynamic_sym;
        // The verifier allowed only the three names.
        const std::string route = a.get_string("int4_route").value_or("automatic");
        c.moe.int4_route = route == "w4a8"    ? Int4Route::w4a8
                           : route == "w4a16" ? Int4Route::w4a16
                                              : Int4Route::automatic;
        c.top_k = *a.get_int("top_k");
        c.glu_rows = a.get_string("glu_rows").value_or("halves") == "interleaved"
                         ? GluRows::interleaved
                         : GluRows::halves;
        c.gated = a.get_bool("gated").value_or(true);
        // The verifier allowed only the gated activations or clamped_swiglu
        // (any activation with gated = false).
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

}  // namespace tilejit::tools
