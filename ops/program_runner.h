// Runs an IR program (the text a user writes, not a C++ call) on host tensors:
// what `tilejit run` and `tilejit bench` execute, and what `tilejit dump`
// lowers. Two families run, both through the public API, so the tool
// measures exactly what an engine gets: a gemm chain (gemm → add bias →
// activation → cast; pack_weight + gemm), and programs of rope, attention and
// moe ops, one API call per op (ops/program_runner_ops.h).
// With the LLVM backend (TILEJIT_HAVE_LLVM) a gemm may be followed by any
// elementwise chain (add, mul, relu, silu, gelu_tanh, gelu_erf, cast): the
// longest prefix codegen::match_gemm accepts runs as the fused gemm, the rest
// as one loop compiled by codegen/llvm/llvm_elementwise.h; and a program with
// no gemm at all that is such a chain runs as that loop alone.
//
//   ops::ProgramRunner r(ir::parse(text, "linear.tir"));   // verify + match
//   r.set_inputs(inputs);                                  // bind ?M, check shapes, pack w
//   auto outputs = r.make_outputs();
//   r.run(outputs);                                        // active ISA path
//   ops::CheckReport c = r.check(outputs);                 // scalar reference
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "codegen/llvm/llvm_jit.h"
#include "ir/program.h"
#include "ops/program_runner_ops.h"
#include "tilejit/tilejit.h"

namespace tilejit::ops {

// The largest tensor the runner holds (an input read from a .npy file, a
// generated input, a result, a scratch between calls): shapes from a .tir
// file, --dim or a .npy header past it are refused before any allocation.
inline constexpr int64_t kMaxHostTensorBytes = int64_t(16) << 30;

// The bytes of a dense tensor of `shape` with `item_bytes`-byte elements,
// computed with overflow checks: Error naming `what`, the shape and the cap
// when a dim is negative or the product overflows int64 or exceeds
// kMaxHostTensorBytes.
int64_t dense_bytes(const std::vector<int64_t>& shape, int64_t item_bytes, const std::string& what);

// An owned, dense, C-order host tensor of an IR dtype (bf16 as its bit pattern).
struct HostTensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;

  // Error (dense_bytes, kMaxHostTensorBytes) naming `what` when the shape is too large.
  static HostTensor zeros(DType dtype, std::vector<int64_t> shape,
                          const std::string& what = "a tensor");
  int64_t numel() const;
  template <class T>
  T* data() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* data() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

// Inputs and outputs by value name (without the '%').
using TensorMap = std::map<std::string, HostTensor>;
// Values of the symbolic dims ("M" -> 512).
using DimBindings = std::map<std::string, int64_t>;

// A verified function recognised as a gemm chain, and how the runner feeds it.
struct GemmProgram {
  // The function codegen lowers: the source with a row-major w re-typed to
  // packed<vnni2, n_block=64, k_pair=2>, since the runner packs w itself.
  ir::Function lowered;
  bool w_packed_by_runner = false;  // w is row-major in the source
  codegen::GemmSpec spec;
  int x = -1, w = -1, bias = -1;  // param value ids (bias -1: none)
  int result = -1;                // the returned value id (of `lowered`)

  // The elementwise rest, run by the LLVM elementwise compiler (empty ops: none).
  // For a gemm program its first param is the fused gemm's result (`result`,
  // [M, N]); the others are params of the source (names prefixed "v"). For a
  // program without a gemm (has_gemm false) it is the whole source function;
  // then x is its param of largest rank, w is -1 and spec holds only n (k = 0).
  bool has_gemm = true;
  ir::Function epilogue;
  std::vector<int> epilogue_inputs;  // per epilogue param: the source value id
};

// Recognises a gemm program in a verified function. Throws tilejit::Error:
// for rope, attention and moe ops (they run as operator calls: see
// match_operator_program), or codegen::match_gemm's message for a chain that cannot be fused
// (without LLVM, or when what follows the gemm is not elementwise). A program without a gemm is
// refused unless allow_elementwise (the runner's case: `tilejit dump` has no gemm plan to show for
// it); built without LLVM it is always refused.
GemmProgram match_program(const ir::Function& f, bool allow_elementwise = false);

// The dims of `t` with symbols replaced by their bindings ("?M" unbound → -1).
std::vector<int64_t> bind_shape(const ir::TensorType& t, const DimBindings& dims);
// "[?M, 1024]" (the IR dims) and "[7, 1024]".
std::string dims_str(const ir::TensorType& t);
std::string shape_str(const std::vector<int64_t>& shape);

// One micro-kernel a plan needs, with why (for `tilejit dump --stage key|asm`).
struct KernelUse {
  std::string role;  // "main block", "N tail", "M tail (3 rows)", ... + chunk
  codegen::BrgemmDesc desc;
};
// Without m: the main block and N tail variants (and K-chunk variants when the
// plan chunks K). With m: exactly the variants ops/gemm.cpp's driver calls for
// that M, M tails included.
std::vector<KernelUse> plan_kernels(const codegen::GemmPlan& plan, std::optional<int64_t> m);

// The result of comparing outputs with the scalar reference.
struct CheckReport {
  double max_abs = 0;  // max |got - ref|
  double max_rel = 0;  // max |got - ref| / max(|ref|, 1e-6)
  int64_t failures = 0;
  int64_t checked = 0;
  // The element with the largest error / tolerance ratio.
  std::vector<int64_t> worst_index;
  std::string worst_value;  // "%o": the result holding it, when several are compared
  double worst_got = 0, worst_ref = 0, worst_tol = 0;
  std::string tolerance;  // the formula used, for the report
  std::string reference;  // what the outputs were compared with
  bool pass() const { return failures == 0; }
};

class ProgramRunner {
 public:
  // Verifies f (throws the verifier's first diagnostic) and matches it.
  explicit ProgramRunner(ir::Function f);

  const ir::Function& function() const { return f_; }
  // The gemm program; empty (no ops) for an operator program.
  const GemmProgram& program() const { return prog_; }
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
  // source (see check_chain in the .cpp for the tolerance). An operator
  // program: OperatorRunner::check.
  CheckReport check(const TensorMap& outputs) const;
  // 2·M·N·K of the bound problem (of the gemm; throws for a program without
  // one); an operator program: OperatorRunner::work().flops.
  double flops() const;

 private:
  const HostTensor& input(int value_id) const;
  void run_epilogue(const HostTensor* gemm_out, TensorMap& outputs);
  CheckReport check_chain(const TensorMap& outputs) const;

  ir::Function f_;
  GemmProgram prog_;
  const TensorMap* inputs_ = nullptr;
  DimBindings dims_;
  PackedWeight packed_w_;
  std::vector<uint16_t> x_strided_;  // x copied to the IR's static row stride, if any
  int64_t x_ld_ = 0;                 // that stride, in elements
  codegen::llvm_backend::LlvmKernel epilogue_kernel_;  // compiled once, at construction
  HostTensor gemm_out_;                  // the fused gemm's result when an epilogue follows
  std::unique_ptr<OperatorRunner> ops_;  // set for a rope / attention / moe program
};

}  // namespace tilejit::ops
