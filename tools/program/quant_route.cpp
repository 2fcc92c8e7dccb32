#include "tools/program/quant_route.h"

#include <fmt/format.h>

#include "ops/quant_weight.h"

namespace tilejit::tools {

std::optional<QuantKernel> quant_kernel(const ir::Function& f, const GemmProgram& p, Isa isa,
                                        bool w4a8) {
  if (!p.quantized() || isa == Isa::scalar) return std::nullopt;
  const Isa kisa = isa == Isa::llvm ? Isa::llvm : Isa::avx512;
  QuantKernel q;
  if (p.format == WeightFormat::int8) {
    const std::string m = f.ops.front().attrs.get_string("act_quant").value_or("dynamic_sym");
    q.role = "act_quant: x rows -> u8 codes with per-row scales (each call)";
    q.act_quant = codegen::ActQuantDesc{kisa, m == "fixed"          ? codegen::ActQuantMode::fixed
                                              : m == "dynamic_asym" ? codegen::ActQuantMode::asym
                                                                    : codegen::ActQuantMode::sym};
  } else {
    q.role = w4a8 ? "dequant: a K chunk of the column block's codes -> s8 q - z chunks (W4A8)"
                  : "dequant: a K chunk of the column block's codes -> bf16 packed rows";
    q.dequant = codegen::DequantDesc{kisa, weight_code_dtype(p.format), p.zero >= 0,
                                     /*normal_products=*/true, w4a8 ? DType::i8 : DType::bf16};
  }
  return q;
}
std::string quant_kernel_name(const QuantKernel& q) {
  return q.dequant ? q.dequant->name() : q.act_quant->name();
}
// The fused decode kernel an fp8 / int4 gemm of m rows runs instead of the
// dequant route (ops::quant_gemm_fused's rule; K taken as the packed K).
std::optional<codegen::BrgemmDesc> fused_kernel(const GemmProgram& p, Isa isa,
                                                std::optional<int64_t> m,
                                                const codegen::PlanOverrides& tuned) {
  // M = 0: the gemm returns before any kernel (nothing to show).
  if (!p.quantized() || p.format == WeightFormat::int8 || !m || *m < 1) return std::nullopt;
  const Isa run = ops::quant_rows_isa(isa, *m);
  if (!ops::quant_gemm_fused(run, *m)) return std::nullopt;
  return ops::quant_fused_desc(weight_code_dtype(p.format), p.zero >= 0, p.spec.k, p.spec, *m, run,
                               tuned);
}

// The logical K of a quantized gemm program: the weight's [N, K] (spec.k is
// the packed K).
int64_t logical_k(const ir::Function& f, const GemmProgram& p) {
  return f.value(p.w).type.dims.back().value;
}

// The tuning database entry gemm applies to a quantized program at M (the
// int4 route, the plan's knobs), as ops/gemm_quant.cpp looks it up.
codegen::PlanOverrides quant_program_tuned(const ir::Function& f, const GemmProgram& p, Isa isa,
                                           std::optional<int64_t> m) {
  if (!p.quantized() || !m) return {};
  return ops::quant_tuned(p.format, p.spec.n, logical_k(f, p), p.spec.bias, p.spec.act, p.spec.out,
                          isa, *m);
}

// Whether a quantized program runs the W4A8 route at M (ops::w4a8_route, the
// tuned entry's choice under int4_route automatic).
bool program_w4a8(const GemmProgram& p, Isa isa, std::optional<int64_t> m,
                  const codegen::PlanOverrides& tuned) {
  return m && ops::w4a8_route(p.format, p.spec.k, p.int4_route, ops::quant_rows_isa(isa, *m), *m,
                              "gemm", tuned);
}

std::string program_route_line(const ir::Function& f, const GemmProgram& p, Isa isa, int64_t m) {
  if (isa == Isa::scalar) return "scalar reference (no JIT code)";
  const std::string plan = codegen::plan_gemm(p.spec, isa).name();
  if (!p.quantized()) return plan;
  const codegen::PlanOverrides tuned = quant_program_tuned(f, p, isa, m);
  if (const auto fd = fused_kernel(p, isa, m, tuned))
    return fmt::format("{} (fused: reads the codes; no dequant)", fd->name());
  const bool w4a8 = program_w4a8(p, isa, m, tuned);
  const auto q = quant_kernel(f, p, isa, w4a8);
  if (w4a8)
    return fmt::format("W4A8: {}, then u8 x s8 kernels (`tilejit dump --stage plan` names them)",
                       q ? quant_kernel_name(*q) : std::string("?"));
  return fmt::format("{}, then {}", q ? quant_kernel_name(*q) : std::string("?"), plan);
}

}  // namespace tilejit::tools
