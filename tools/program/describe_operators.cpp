#include "tools/program/describe_operators.h"

#include <fmt/format.h>

#include <optional>

#include "codegen/quant_desc.h"
#include "ir/printer.h"
#include "jit/registry.h"
#include "ops/attention_descs.h"
#include "ops/quant_weight.h"
#include "ops/rope_desc.h"
#include "runtime/quant_formats.h"
#include "tools/program/gemm_program.h"

namespace tilejit::tools {
namespace {

// A dim of value `id` bound by `dims`: its size, or its symbol when unbound.
std::string dim_text(const ir::Function& f, int id, int i, const DimBindings& dims) {
  const ir::Dim& d = f.value(id).type.dims.at(i);
  if (d.is_static()) return std::to_string(d.value);
  auto it = dims.find(d.symbol);
  return it == dims.end() ? d.str() : std::to_string(it->second);
}

// The same dim's size when it is static or bound; nullopt when unbound.
std::optional<int64_t> dim_size(const ir::Function& f, int id, int i, const DimBindings& dims) {
  const ir::Dim& d = f.value(id).type.dims.at(i);
  if (d.is_static()) return d.value;
  auto it = dims.find(d.symbol);
  if (it == dims.end()) return std::nullopt;
  return it->second;
}

// A decode_attention call's query heads per kv head, when the head counts
// are static or bound (the verifier made Hq a multiple of Hkv).
std::optional<int64_t> decode_group(const ir::Function& f, const OperatorCall& c,
                                    const DimBindings& dims) {
  const auto hq = dim_size(f, operand(f, c, 0), 1, dims);
  const auto hkv = dim_size(f, operand(f, c, 1), 2, dims);
  if (!hq || !hkv || *hkv < 1) return std::nullopt;
  return *hq / *hkv;
}

std::string operand_text(const ir::Function& f, int id, const DimBindings& dims) {
  const ir::TensorType& t = f.value(id).type;
  std::string s = fmt::format("%{} {} [", f.value(id).name, dtype_name(t.dtype));
  for (int i = 0; i < t.rank(); ++i) s += (i ? ", " : "") + dim_text(f, id, i, dims);
  return s + "]";
}

// The RoPE kernel descriptor the call will use on a JIT path (hq 0 when the
// head count is symbolic).
codegen::llvm_backend::RopeDesc call_rope_desc(const ir::Function& f, const OperatorCall& c) {
  const ir::TensorType& q = f.value(operand(f, c, 0)).type;
  RopeOptions opt;
  opt.style = c.rope.style;
  opt.rotary_dim = c.rope.rotary_dim;
  // The runner passes no k and an f32 cache.
  return ops::rope_desc(opt, q.dtype, DType::f32, q.dims[2].value,
                        q.dims[1].is_static() ? q.dims[1].value : 0, 0,
                        f.value(operand(f, c, 1)).type.dtype);
}

// `text` with the descriptor's hq spelled as the bound or symbolic head count
// when the IR leaves it symbolic.
std::string with_heads(std::string text, const std::string& from, const std::string& to) {
  if (auto at = text.find(from); at != std::string::npos) text.replace(at, from.size(), to);
  return text;
}

// The RoPE kernel name the call will use on a JIT path, when the shapes fix
// it ("" without LLVM: there is no RoPE kernel, the scalar path runs).
std::string call_rope_kernel_name(const ir::Function& f, const OperatorCall& c,
                                  const DimBindings& dims) {
  if (!jit::family_built(jit::Family::rope)) return "";
  const bool symbolic = !f.value(operand(f, c, 0)).type.dims[1].is_static();
  const std::string name = call_rope_desc(f, c).name();
  return symbolic ? with_heads(name, "_hq0_", "_hq" + dim_text(f, operand(f, c, 0), 1, dims) + "_")
                  : name;
}

// Its cache key (jit::cache_key), spelled the same way.
std::string call_rope_kernel_key(const ir::Function& f, const OperatorCall& c,
                                 const DimBindings& dims) {
  const bool symbolic = !f.value(operand(f, c, 0)).type.dims[1].is_static();
  const std::string key = jit::cache_key(call_rope_desc(f, c));
  return symbolic ? with_heads(key, ";hq=0;", ";hq=" + dim_text(f, operand(f, c, 0), 1, dims) + ";")
                  : key;
}

}  // namespace

std::string MoeHelperKernel::name() const {
  return dequant ? dequant->name() : act_quant->name();
}
std::string MoeHelperKernel::key() const {
  return dequant ? dequant->key() : act_quant->key();
}
const jit::Kernel& MoeHelperKernel::code() const {
  return dequant ? jit::get(*dequant) : jit::get(*act_quant);
}

std::vector<MoeHelperKernel> call_moe_quant_kernels(const ir::Function& f, const OperatorCall& c,
                                                    Isa isa) {
  (void)f;
  std::vector<MoeHelperKernel> out;
  const MoeQuant& q = c.moe_quant;
  if (c.kind != ir::OpKind::moe || !q.quantized() || isa == Isa::scalar) return out;
  // As ops/moe_quant.cpp asks the registry: avx512 serves amx.
  const Isa kisa = isa == Isa::llvm ? Isa::llvm : Isa::avx512;
  for (int proj = 0; proj < 2; ++proj) {
    MoeHelperKernel k;
    k.proj = proj == 0 ? "w13" : "w2";
    if (q.format == WeightFormat::int8) {
      k.act_quant = codegen::ActQuantDesc{kisa, c.moe.act_quant == ActQuant::dynamic_asym
                                                    ? codegen::ActQuantMode::asym
                                                    : codegen::ActQuantMode::sym};
    } else {
      k.dequant = codegen::DequantDesc{kisa, weight_code_dtype(q.format), q.zero[proj] >= 0};
    }
    out.push_back(k);
  }
  return out;
}

namespace {

std::string api_text(const ir::Function& f, const OperatorCall& c, const DimBindings& dims) {
  const ir::Op& op = op_of(f, c);
  auto arg = [&](size_t i) { return operand_text(f, op.operands.at(i), dims); };
  const std::string out = operand_text(f, op.result, dims);
  // AttentionOptions' per-head tensors, when the op names them.
  std::string head_vectors;
  if (c.attention_operands.sinks >= 0)
    head_vectors += ", .sinks = " + operand_text(f, c.attention_operands.sinks, dims);
  if (c.attention_operands.alibi_slopes >= 0)
    head_vectors += ", .alibi_slopes = " + operand_text(f, c.attention_operands.alibi_slopes, dims);
  switch (c.kind) {
    case ir::OpKind::rope: {
      const int64_t d = f.value(op.operands[0]).type.dims[2].value;
      return fmt::format(
          "tilejit::rope(q = {} (a copy of %{}, rotated in place), k = none, positions = {}, "
          "cos_sin_cache = {}, {{.style = {}, .rotary_dim = {}}})",
          out, f.value(op.operands[0]).name, arg(1), arg(2), rope_style_name(c.rope.style),
          c.rope.rotary_dim ? c.rope.rotary_dim : d);
    }
    case ir::OpKind::attention: {
      const AttentionOptions& o = c.attention;
      const int64_t d = f.value(op.operands[0]).type.dims[2].value;
      return fmt::format(
          "tilejit::flash_attn_varlen(q = {}, k = {}, v = {}, out = {}, cu_seqlens_q = [0, {}], "
          "cu_seqlens_k = [0, {}], {{.causal = {}, .sm_scale = {:.6g}{}, .window_left = {}, "
          ".window_right = {}, .softcap = {:g}{}}}): one sequence",
          arg(0), arg(1), arg(2), out, dim_text(f, op.operands[0], 0, dims),
          dim_text(f, op.operands[1], 0, dims), o.causal, sm_scale_of(c, d),
          o.sm_scale ? "" : fmt::format(" (1/√{})", d), o.window_left, o.window_right, o.softcap,
          head_vectors);
    }
    case ir::OpKind::decode_attention: {
      const AttentionOptions& o = c.attention;
      const int64_t d = f.value(op.operands[0]).type.dims[2].value;
      const std::string scales =
          runtime::fp8_format_of(f.value(op.operands[1]).type.dtype) != nullptr
              ? fmt::format(", .kv_scales = {{.k_scale = {:g}, .v_scale = {:g}}}",
                            o.kv_scales.k_scale, o.kv_scales.v_scale)
              : "";
      return fmt::format(
          "tilejit::decode_attention(q = {}, k_cache = {}, v_cache = {}, out = {}, block_table = "
          "{}, seq_lens = {}, {{.sm_scale = {:.6g}{}, .window_left = {}, .softcap = {:g}{}{}}}): "
          "one new token per sequence",
          arg(0), arg(1), arg(2), out, arg(3), arg(4), sm_scale_of(c, d),
          o.sm_scale ? "" : fmt::format(" (1/√{})", d), o.window_left, o.softcap, scales,
          head_vectors);
    }
    default: {
      const char* glu_rows = c.glu_rows == GluRows::interleaved ? ", GluRows::interleaved" : "";
      const char* proj13 = c.gated ? "gate_up" : "up";  // ExpertProj of w13
      // MoeOptions' tensors (named operands) and the bf16 shared expert's packs.
      const MoeOperands& mo = c.moe_operands;
      std::string opts, shared_packs;
      if (mo.b13 >= 0) opts += ", .b13 = " + operand_text(f, mo.b13, dims);
      if (mo.b2 >= 0) opts += ", .b2 = " + operand_text(f, mo.b2, dims);
      if (c.moe.routed_scaling_factor != 1.0f)
        opts += fmt::format(", .routed_scaling_factor = {:g}", c.moe.routed_scaling_factor);
      if (mo.shared()) {
        opts += ", .shared_w13 = &sp13, .shared_w2 = &sp2";
        shared_packs = fmt::format(
            ", sp13 = tilejit::pack_experts({} as [1, {}Is, H], {}{}), sp2 = "
            "tilejit::pack_experts({} as [1, H, Is], down)",
            operand_text(f, mo.shared_w13, dims), c.gated ? "2·" : "", proj13, glu_rows,
            operand_text(f, mo.shared_w2, dims));
      }
      if (mo.shared_weights >= 0)
        opts += ", .shared_weights = " + operand_text(f, mo.shared_weights, dims);
      if (c.moe_quant.quantized()) {
        // One checkpoint description per expert, views at e of the [E, ...] inputs.
        const MoeQuant& q = c.moe_quant;
        const char* desc = checkpoint_struct_name(q.format);
        auto named = [&](int proj) {
          std::string n = "scales " + operand_text(f, q.scale[proj], dims);
          if (q.zero[proj] >= 0) n += ", qzeros " + operand_text(f, q.zero[proj], dims);
          if (q.g_idx[proj] >= 0) n += ", g_idx " + operand_text(f, q.g_idx[proj], dims);
          return n;
        };
        std::string params;
        if (q.format == WeightFormat::fp8_e4m3 && q.block_n > 0)
          params = fmt::format(", block {}x{}", q.block_n, q.block_k);
        if (is_int4(q.format))
          params = fmt::format(", {}, group_size {}{}", weight_format_name(q.format), q.group_size,
                               q.gptq_v2 ? ", gptq_v2" : "");
        return fmt::format(
            "w13p = tilejit::pack_experts(E {} of {} with {}{}, {}{}), w2p = "
            "tilejit::pack_experts(E {} of {} with {}{}, down){} once when the inputs are bound; "
            "then tilejit::fused_experts(hidden = {}, w13p, w2p, topk_weights = {}, topk_ids = {}, "
            "out = {}, {{.act = {}{}{}}})",
            desc, arg(1), named(0), params, proj13, glu_rows, desc, arg(2), named(1), params,
            shared_packs, arg(0), arg(3), arg(4), out, moe_act_text(c.moe),
            q.format == WeightFormat::int8
                ? fmt::format(", .act_quant = {}", c.moe.act_quant == ActQuant::dynamic_asym
                                                       ? "dynamic_asym"
                                                       : "dynamic_sym")
                : "",
            opts);
      }
      return fmt::format(
          "w13p = tilejit::pack_experts({}, {}{}), w2p = tilejit::pack_experts({}, down){} "
          "once when the inputs are bound; then tilejit::fused_experts(hidden = {}, w13p, w2p, "
          "topk_weights = {}, topk_ids = {}, out = {}, {{.act = {}{}}})",
          arg(1), proj13, glu_rows, arg(2), shared_packs, arg(0), arg(3), arg(4), out,
          moe_act_text(c.moe), opts);
    }
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
      case ir::OpKind::decode_attention:
        return {
            "scalar: one query head at a time in fp32 over the cache rows (an fp8 cache "
            "through an exact bf16 copy of the blocks the call reads)",
            "none (no JIT code on the scalar path)"};
      default:
        return {"scalar: the packed experts read in fp32 (ops/moe.cpp)",
                "none (no JIT code on the scalar path)"};
    }
  }
  switch (c.kind) {
    case ir::OpKind::rope: {
      const std::string name = call_rope_kernel_name(f, c, dims);
      if (name.empty()) return {"needs a tilejit built with LLVM: the call raises an Error", "-"};
      return {fmt::format("{}: one LLVM-compiled kernel per specialisation (dtype, head size, "
                          "rotary_dim, heads, position dtype); tokens split over the threads",
                          isa_name(isa)),
              name};
    }
    case ir::OpKind::decode_attention: {
      // An unknown group (unbound heads) is taken as one the kernel runs.
      if (!ops::decode_attention_llvm_kernel(isa, decode_group(f, c, dims).value_or(1)))
        return {
            fmt::format("{}: the attention engine's decode ({}; an fp8 cache through an "
                        "exact bf16 copy of the blocks it reads)",
                        isa_name(isa),
                        jit::family_built(jit::Family::decode_attention)
                            ? "more query heads per kv head than the LLVM kernel unrolls"
                            : "no LLVM in this build"),
            fmt::format("chosen at run time by {} (brgemm_{} micro-kernels)", api, isa_name(isa))};
      const auto d = call_decode_kernel(f, c, isa, dims);
      return {fmt::format("{}: one LLVM-compiled kernel per specialisation (D, Dv, query heads "
                          "per kv head, block size, softcap, cache dtype): tasks are sequences "
                          "x KV splits, all heads of a 16-key chunk at once, the splits' "
                          "partials merged (docs/attention.md)",
                          isa_name(isa)),
              d ? d->name() : "fixed once the block size and head counts are bound (--dim)"};
    }
    case ir::OpKind::attention:
      return {fmt::format("{}: the attention engine (docs/attention.md): q·kᵀ and P·v on "
                          "brgemm micro-kernels, online softmax over key blocks",
                          isa_name(isa)),
              fmt::format("chosen at run time by {} (brgemm_{} micro-kernels; "
                          "TILEJIT_VERBOSE=1 logs each one compiled)",
                          api, isa_name(isa))};
    default: {
      // w13's epilogue: the act-and-mul of a gated MLP, or act alone.
      const std::string w13_epilogue =
          c.gated ? fmt::format("{}-and-mul epilogue", moe_act_text(c.moe))
                  : fmt::format("plain {} epilogue (non-gated)", moe_act_text(c.moe));
      if (c.moe_quant.quantized()) {
        // ops/moe_quant.h's routes, per (expert, projection) and the expert's rows;
        // the helper kernels named as the registry names them (avx512 serves amx).
        const MoeQuant& q = c.moe_quant;
        const std::vector<MoeHelperKernel> helpers = call_moe_quant_kernels(f, c, isa);
        std::string routes;
        if (q.format == WeightFormat::int8) {
          routes = fmt::format(
              "w13 and w2 each: int8: the expert's rows quantized per token by {}, then the "
              "u8 x s8 kernels (brgemm_{}_u8xi8_i32acc_m<rows>n64...) with the scaled (w13: and "
              "{}) epilogue",
              helpers.at(0).name(), isa_name(isa), c.gated ? "GLU" : "activation");
        } else {
          const std::string fused = fmt::format(
              "<= {} rows for the expert: the {}fused decode kernel (exact weights; "
              "ops::quant_gemm_fused), else the dequant route",
              ops::fused_max_rows(isa), isa == Isa::llvm ? "LLVM " : "");
          for (const MoeHelperKernel& k : helpers)
            routes += fmt::format(
                "{}{}: {}: per K chunk {} (or its _normal variant, by the scales) fills bf16 "
                "packed rows for brgemm_{}_bf16_f32acc_m<rows>n64...",
                routes.empty() ? "" : "; ", k.proj, fused, k.name(), isa_name(isa));
          if (is_int4(q.format)) {
            // The automatic rule's first row count on this path (ops::w4a8_automatic).
            int64_t from = 0;
            for (int64_t m = 1; m <= 64 && from == 0; ++m)
              if (ops::w4a8_automatic(isa, m)) from = m;
            const std::string when = c.moe.int4_route == Int4Route::w4a8    ? "w4a8: every expert"
                                     : c.moe.int4_route == Int4Route::w4a16 ? "w4a16: no expert"
                                     : from > 0
                                         ? fmt::format("automatic: experts with >= {} rows", from)
                                         : "automatic: no expert on this path";
            routes += fmt::format(
                "; int4_route {} (ops::w4a8_route) take W4A8 instead: the rows quantized per "
                "token into the weight's quad K order, then LLVM u8 x int4 brgemm calls per "
                "K chunk folding each scale group, the {} in the last",
                when, c.gated ? "GLU" : "activation");
          }
        }
        return {fmt::format("{}: {} experts, per (expert, projection) one route by the "
                            "expert's routed rows: w13 ({}, {}), then w2 "
                            "(down, scaled by the routing weights) (docs/moe.md, \"Quantized "
                            "experts\")",
                            isa_name(isa), weight_format_name(c.moe_quant.format),
                            c.gated ? "gate_up" : "up", w13_epilogue),
                fmt::format("{}; chosen at run time by {} (TILEJIT_VERBOSE=1 logs each one "
                            "compiled)",
                            routes, api)};
      }
      return {fmt::format("{}: {} GEMM with the {}, then the down GEMM "
                          "scaled by the routing weights (docs/moe.md)",
                          isa_name(isa), c.gated ? "gate/up" : "up", w13_epilogue),
              fmt::format("chosen at run time by {} (brgemm_{} micro-kernels; "
                          "TILEJIT_VERBOSE=1 logs each one compiled)",
                          api, isa_name(isa))};
    }
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
    const std::vector<MoeHelperKernel> helpers = call_moe_quant_kernels(f, c, isa);
    for (const MoeHelperKernel& k : helpers) {
      s += fmt::format("  kernel  {} ({}: {})\n", k.name(), k.proj,
                       k.act_quant ? "act_quant, each call" : "dequant route");
      s += fmt::format("  key     {}\n", k.key());
    }
    if (!helpers.empty()) {
      s += fmt::format("  kernels {}\n", kernels);
    } else if (const auto d = call_decode_kernel(f, c, isa, dims)) {
      s += fmt::format("  kernel  {}\n", d->name());
      s += fmt::format("  key     {}\n", jit::cache_key(*d));
    } else if (isa != Isa::scalar && c.kind == ir::OpKind::rope && kernels != "-") {
      s += fmt::format("  kernel  {}\n", kernels);
      s += fmt::format("  key     {}\n", call_rope_kernel_key(f, c, dims));
    } else {
      s += fmt::format("  kernels {}\n", kernels);
    }
  }
  return s;
}

std::optional<codegen::llvm_backend::DecodeAttentionDesc> call_decode_kernel(
    const ir::Function& f, const OperatorCall& c, Isa isa, const DimBindings& dims) {
  if (c.kind != ir::OpKind::decode_attention) return std::nullopt;
  const int q = operand(f, c, 0), kc = operand(f, c, 1), vc = operand(f, c, 2);
  const auto g = decode_group(f, c, dims);
  const auto bs = dim_size(f, kc, 1, dims);
  if (!g || *g < 1 || !bs || *bs < 1 || !ops::decode_attention_llvm_kernel(isa, *g))
    return std::nullopt;
  return ops::decode_attention_desc(f.value(q).type.dims[2].value, f.value(vc).type.dims[3].value,
                                    *g, *bs, c.attention.softcap > 0, /*alibi=*/false,
                                    f.value(kc).type.dtype);
}

std::optional<codegen::llvm_backend::RopeDesc> call_rope_kernel(const ir::Function& f,
                                                                const OperatorCall& c, Isa isa,
                                                                const DimBindings& dims) {
  if (isa == Isa::scalar || c.kind != ir::OpKind::rope || !jit::family_built(jit::Family::rope))
    return std::nullopt;
  codegen::llvm_backend::RopeDesc d = call_rope_desc(f, c);
  if (d.hq == 0) {  // symbolic heads: the kernel exists once they are bound
    const auto h = dim_size(f, operand(f, c, 0), 1, dims);
    if (!h) return std::nullopt;
    d.hq = *h;
  }
  return d;
}

}  // namespace tilejit::tools
