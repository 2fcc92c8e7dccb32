#include "ops/gemm_ir.h"

#include "codegen/gemm_lowering.h"
#include "ir/activation.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace tilejit::ops {

ir::Function build_gemm_ir(const codegen::GemmSpec& spec) {
  using ir::Dim;
  using ir::Layout;
  using ir::TensorType;
  ir::Builder b("gemm");
  // M is symbolic: one program (and one set of kernels) serves every batch size.
  const int x = b.param("x", TensorType::make(DType::bf16, {Dim::sym("M"), Dim::fixed(spec.k)},
                                              Layout::strided({std::nullopt, 1})));
  const int w = b.param("w", TensorType::make(DType::bf16, {Dim::fixed(spec.n), Dim::fixed(spec.k)},
                                              Layout::vnni2(64, 2)));
  int bias = -1;
  if (spec.bias != codegen::BiasKind::none) {
    const DType bt = spec.bias == codegen::BiasKind::f32 ? DType::f32 : DType::bf16;
    bias = b.param("bias", TensorType::make(bt, {Dim::fixed(spec.n)}));
  }
  int v = b.gemm(x, w);
  if (bias >= 0) v = b.add(v, bias);
  if (const ir::ActivationInfo* a = ir::find_activation(spec.act); a && a->op)
    v = b.unary(*a->op, v);
  if (spec.out != DType::f32) v = b.cast(v, spec.out);
  b.ret({v});
  return b.finish();
}

LoweredGemm lower_gemm_spec(const codegen::GemmSpec& spec, Isa isa) {
  const ir::Function f = build_gemm_ir(spec);
  ir::verify(f);
  return {codegen::lower_gemm(f, isa), ir::print(f)};
}

}  // namespace tilejit::ops
