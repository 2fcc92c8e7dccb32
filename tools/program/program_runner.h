// Runs an IR program (the text a user writes, not a C++ call) on host tensors:
// what `tilejit run` and `tilejit bench` execute, and what `tilejit dump`
// lowers. Two families run, both through the public API, so the tool
// measures exactly what an engine gets: a gemm chain (gemm → add bias →
// activation → cast; pack_weight + gemm), and programs of rope, attention and
// moe ops, one API call per op (tools/program/operator_program.h).
// With the LLVM backend (TILEJIT_HAVE_LLVM) a gemm may be followed by any
// elementwise chain (add, mul, relu, silu, gelu_tanh, gelu_erf, relu2, cast): the
// longest prefix codegen::match_gemm accepts runs as the fused gemm, the rest
// as one loop compiled by codegen/llvm/llvm_elementwise.h; and a program with
// no gemm at all that is such a chain runs as that loop alone.
//
//   tools::ProgramRunner r(ir::parse(text, "linear.tir"));   // verify + match
//   r.set_inputs(inputs);                                  // bind ?M, check shapes, pack w
//   auto outputs = r.make_outputs();
//   r.run(outputs);                                        // active ISA path
//   tools::CheckReport c = r.check(outputs);                 // scalar reference
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ir/program.h"
#include "jit/kernel.h"
#include "tilejit/tilejit.h"
#include "tools/program/check_report.h"
#include "tools/program/gemm_program.h"
#include "tools/program/host_tensor.h"
#include "tools/program/operator_runner.h"

namespace tilejit::tools {

class ProgramRunner {
 public:
  // Verifies f (throws the verifier's first diagnostic) and matches it.
  explicit ProgramRunner(ir::Function f);

  const ir::Function& function() const { return f_; }
  // The gemm program; empty (no ops) for an operator program.
  const GemmProgram& program() const { return prog_; }
  // The packed weight (after set_inputs; empty for an operator program).
  const PackedWeight& packed_weight() const { return packed_w_; }
  // The rope / attention / moe calls, or null for a gemm or elementwise program.
  const OperatorRunner* operators() const { return ops_.get(); }

  // Checks every input against its param's type (dtype, rank, static dims,
  // symbolic dims consistent across inputs and with `preset`) and binds the
  // symbols; packs w. Inputs must outlive run(). Errors name the input, its
  // shape and the expected one.
  void set_inputs(const TensorMap& inputs, const DimBindings& preset = {});
  const DimBindings& bindings() const { return dims_; }

  // Zeroed outputs of the bound result types, by result name.
  TensorMap make_outputs() const;
  // Runs on the active ISA path (tilejit::gemm, or the operator calls).
  void run(TensorMap& outputs);
  // run() for `tilejit bench`: the same calls, but an in-place operator
  // (rope) works on its previous result instead of a fresh copy of its input
  // (OperatorRunner::run_in_place). Outputs are not checkable afterwards.
  void run_for_timing(TensorMap& outputs);
  // Compares `outputs` with runtime::reference_gemm on the same inputs; with
  // an elementwise rest, followed by a double evaluation of every op of the
  // source (see check_chain in check_gemm.cpp for the tolerance). An operator
  // program: OperatorRunner::check.
  CheckReport check(const TensorMap& outputs) const;
  // 2·M·N·K of the bound problem (of the gemm; throws for a program without
  // one); an operator program: OperatorRunner::work().flops.
  double flops() const;

 private:
  const HostTensor& input(int value_id) const;
  void run_epilogue(const HostTensor* gemm_out, TensorMap& outputs);
  CheckReport check_chain(const TensorMap& outputs) const;
  // A quantized gemm: pack_weight(Int8Weight / Fp8Weight / Int4Weight) of
  // the inputs, the options it runs with, and its check (check_gemm.cpp).
  PackedWeight pack_quantized() const;
  GemmOptions gemm_options() const;
  CheckReport check_quantized(const TensorMap& outputs) const;

  ir::Function f_;
  GemmProgram prog_;
  const TensorMap* inputs_ = nullptr;
  DimBindings dims_;
  PackedWeight packed_w_;
  std::vector<uint16_t> x_strided_;               // x copied to the IR's static row stride, if any
  int64_t x_ld_ = 0;                              // that stride, in elements
  const jit::Kernel* epilogue_kernel_ = nullptr;  // from the registry, at construction
  HostTensor gemm_out_;                  // the fused gemm's result when an epilogue follows
  std::unique_ptr<OperatorRunner> ops_;  // set for a rope / attention / moe program
};

}  // namespace tilejit::tools
