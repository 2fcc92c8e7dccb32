// Which kernels a quantized gemm program runs at M, as ops/gemm_quant.cpp
// decides it: the fused decode kernel, the W4A8 route or the dequant route
// (its helper kernel, then the plan's bf16 micro-kernels). One home for the
// tool's texts: `tilejit dump --stage plan` and `tilejit bench`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "codegen/brgemm_desc.h"
#include "codegen/gemm_plan.h"
#include "codegen/quant_desc.h"
#include "ir/program.h"
#include "runtime/isa.h"
#include "tools/program/gemm_program.h"

namespace tilejit::tools {

// The fused decode kernel an fp8 / int4 / MXFP4 gemm of m rows runs instead of
// the dequant route (ops::quant_gemm_fused's rule; K taken as the packed K).
std::optional<codegen::BrgemmDesc> fused_kernel(const GemmProgram& p, Isa isa,
                                                std::optional<int64_t> m,
                                                const codegen::PlanOverrides& tuned);
// The logical K of a quantized gemm program: the weight's [N, K] (spec.k is
// the packed K).
int64_t logical_k(const ir::Function& f, const GemmProgram& p);
// The tuning database entry gemm applies to a quantized program at M (the
// int4 route, the plan's knobs), as ops/gemm_quant.cpp looks it up.
codegen::PlanOverrides quant_program_tuned(const ir::Function& f, const GemmProgram& p, Isa isa,
                                           std::optional<int64_t> m);
// Whether a quantized program runs the W4A8 route at M (ops::w4a8_route, the
// tuned entry's choice under int4_route automatic).
bool program_w4a8(const GemmProgram& p, Isa isa, std::optional<int64_t> m,
                  const codegen::PlanOverrides& tuned);
// One line naming what a gemm program runs at m rows on path isa (bench's
// "plan" line): the plan's kernel, or for a quantized weight the fused
// kernel, the W4A8 route, or the dequant route before the plan's kernel.
std::string program_route_line(const ir::Function& f, const GemmProgram& p, Isa isa, int64_t m);

// The helper kernel of a quantized gemm: dequant (fp8, int4) or act_quant
// (int8), as ops/gemm_quant.cpp asks the registry for it.
struct QuantKernel {
  std::string role;
  std::optional<codegen::DequantDesc> dequant;
  std::optional<codegen::ActQuantDesc> act_quant;
};
// w4a8: the program runs the W4A8 route at the bound M (the dequant kernel
// then writes s8 q − z chunks). The key is that of scales whose products with
// the codes are normal f32 numbers (`_nosub`, every real checkpoint's; the
// pack decides from the scale values, which a program does not have).
std::optional<QuantKernel> quant_kernel(const ir::Function& f, const GemmProgram& p, Isa isa,
                                        bool w4a8);
std::string quant_kernel_name(const QuantKernel& q);

}  // namespace tilejit::tools
