// The operator families of the IR that run as calls of the public API, one
// call per op, so `tilejit run` and `tilejit bench` measure exactly what an
// engine gets (docs/tool.md, "Which programs run"):
//
//   rope       %o = rope %q, %pos, %cos_sin    q copied to %o, then tilejit::rope in place (no k)
//   attention  %o = attention %q, %k, %v       tilejit::flash_attn_varlen, one sequence:
//                                              cu_seqlens_q = [0, T], cu_seqlens_k = [0, S]
//   moe        %o = moe %h, %w13, %w2, %tw, %ti  pack_experts (w13, w2 given row-major), then
//                                              tilejit::fused_experts
//
// A program may chain these ops (examples/rope_attention.tir: rope, then
// attention on its result): the calls run in program order, each writing its
// value into a buffer the next call reads. Mixing them with gemm or
// elementwise ops is refused: those run through a different lowering.
//
// check() compares every op's result with its scalar reference
// (runtime/reference_rope.h, reference_attention.h, reference_moe.h), computed
// in double from the operands that call actually read. A chain is therefore
// checked call by call, each op under its own bound, and no error is carried
// from one op to the next.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/program.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

struct HostTensor;
struct CheckReport;
using TensorMap = std::map<std::string, HostTensor>;
using DimBindings = std::map<std::string, int64_t>;

// True for rope, attention and moe: the ops an OperatorProgram runs.
bool is_operator_op(ir::OpKind k);

// One IR op and the public call that runs it, its attributes resolved to the
// API's options (the IR defaults applied).
struct OperatorCall {
  size_t op = 0;  // index into f.ops
  ir::OpKind kind = ir::OpKind::rope;
  RopeOptions rope;
  AttentionOptions attention;
  MoeOptions moe;
  int64_t top_k = 0;

  // "tilejit::rope", "tilejit::flash_attn_varlen", "tilejit::fused_experts".
  const char* api() const;
};

struct OperatorProgram {
  std::vector<OperatorCall> calls;  // in program order
};

// Whether f (verified) has any rope, attention or moe op.
bool has_operator_ops(const ir::Function& f);
// Matches a verified function made only of rope, attention and moe ops.
// Throws tilejit::Error naming the op and the rule for what the public API
// cannot take: another op in the same program, an operand dtype the call does
// not accept (attention: bf16 q/k/v; rope: f32 or bf16 q), or a moe weight
// that is not a program input (weights are packed once, when inputs are bound).
OperatorProgram match_operator_program(const ir::Function& f);

// What `tilejit dump --stage plan` and `--stage key` print for such a program
// on path `isa`, with the symbolic dims bound by `dims` where given: per call,
// the API call and its arguments; the kernels, named where the name follows
// from the shapes alone (RoPE's one LLVM kernel), otherwise said to be chosen
// at run time by the operator. Lines end with '\n'.
std::string describe_operator_plan(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims);
std::string describe_operator_keys(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims);

// The work of one run, for `tilejit bench`.
struct OperatorWork {
  double flops = 0;     // attention: visible (query, key) pairs only; moe: the routed GEMMs
  double bytes = 0;     // rope (memory-bound): q read and written, positions, cache rows
  std::string shape;    // "rope T=10 H=32 D=128 rotary_dim=128", one entry per call, "; "-joined
  std::string counted;  // how flops or bytes were counted, for the calls present
};

// Runs an OperatorProgram on host tensors; owned by ops::ProgramRunner.
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

  ir::Function f_;
  OperatorProgram prog_;
  const TensorMap* inputs_ = nullptr;
  DimBindings dims_;
  std::unique_ptr<Bound> bound_;
};

}  // namespace tilejit::ops
