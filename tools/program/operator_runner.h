// Running an operator program (tools/program/operator_program.h): one call
// of the public API per op, in program order, on host tensors.
#pragma once

#include <memory>
#include <string>

#include "tools/program/check_report.h"
#include "tools/program/host_tensor.h"
#include "tools/program/operator_program.h"
#include "tools/program/reference_rows.h"

namespace tilejit::tools {

// The work of one run, for `tilejit bench`.
struct OperatorWork {
  double flops = 0;     // attention: visible (query, key) pairs only; moe: the routed GEMMs
  double bytes = 0;     // rope (memory-bound): q read and written, positions, cache rows
  std::string shape;    // "rope T=10 H=32 D=128 rotary_dim=128", one entry per call, "; "-joined
  std::string counted;  // how flops or bytes were counted, for the calls present
};

// Expert e's checkpoint tensors of projection proj (0: w13, 1: w2) of a moe
// call with quantized experts: dense views at expert e of the [E, ...]
// inputs (u4 ones held as their int32 checkpoint tensors), what the pack
// and the check both read.
QuantMatrix expert_matrix(const ir::Function& f, const OperatorCall& c, const TensorMap& inputs,
                          int proj, int64_t e);
// pack_experts of every expert's expert_matrix (tilejit::pack_experts of one
// Int8Weight / Fp8Weight / Int4Weight per expert, GluRows::halves).
PackedExperts pack_quant_experts(const ir::Function& f, const OperatorCall& c,
                                 const TensorMap& inputs, int proj);

// Runs an OperatorProgram on host tensors; owned by ProgramRunner.
class OperatorRunner {
 public:
  OperatorRunner(ir::Function f, OperatorProgram p);
  ~OperatorRunner();

  const OperatorProgram& program() const { return prog_; }
  // `inputs` are checked and bound by the caller (ProgramRunner::set_inputs)
  // and must outlive run(). Packs the moe weights, allocates the values
  // between calls, lays out operands with a static strided layout at those
  // strides.
  void bind(const TensorMap& inputs, const DimBindings& dims);
  void run(TensorMap& outputs);
  // run() for timing: a rope call rotates its result again in place instead
  // of first copying q into it, so only the API call is timed (what an engine
  // pays: its rope works on its own q buffer). The outputs are then no longer
  // checkable; call run() before check().
  void run_in_place(TensorMap& outputs);
  CheckReport check(const TensorMap& outputs) const;
  OperatorWork work() const;

 private:
  struct Bound;
  void run_calls(TensorMap& outputs, bool copy_rope_input);
  const HostTensor& value(int id, const TensorMap& outputs) const;
  TensorView view(int id, const TensorMap& outputs) const;
  // The call's AttentionOptions with its sinks / alibi_slopes operands bound.
  AttentionOptions attention_options(const OperatorCall& c, const TensorMap& outputs) const;

  ir::Function f_;
  OperatorProgram prog_;
  const TensorMap* inputs_ = nullptr;
  DimBindings dims_;
  std::unique_ptr<Bound> bound_;
};

}  // namespace tilejit::tools
