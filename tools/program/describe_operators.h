// Describing an operator program for `tilejit dump`: the public API calls it
// makes and the kernels they use, without running anything.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "codegen/llvm/llvm_decode_attention.h"
#include "codegen/llvm/llvm_rope.h"
#include "codegen/quant_desc.h"
#include "jit/kernel.h"

#include "tools/program/host_tensor.h"
#include "tools/program/operator_program.h"

namespace tilejit::tools {

// What `tilejit dump --stage plan` and `--stage key` print for such a program
// on path `isa`, with the symbolic dims bound by `dims` where given: per call,
// the API call and its arguments; the kernels, named where the name follows
// from the shapes alone (RoPE's one LLVM kernel), otherwise said to be chosen
// at run time by the operator. Lines end with '\n'.
std::string describe_operator_plan(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims);
std::string describe_operator_keys(const ir::Function& f, const OperatorProgram& p, Isa isa,
                                   const DimBindings& dims);
// The descriptor of a RoPE call's kernel when the shapes fix it (a static or
// bound head count, an LLVM build, a JIT path), for `--stage asm`.
std::optional<codegen::llvm_backend::RopeDesc> call_rope_kernel(const ir::Function& f,
                                                                const OperatorCall& c, Isa isa,
                                                                const DimBindings& dims);

// The descriptor of a decode_attention call's LLVM kernel (the operator's own,
// ops::decode_attention_desc) when the shapes fix it: an LLVM build, a JIT
// path, a static or bound block size and head counts. Without a tuning
// database entry: one may change its prefetch distance at run time.
std::optional<codegen::llvm_backend::DecodeAttentionDesc> call_decode_kernel(
    const ir::Function& f, const OperatorCall& c, Isa isa, const DimBindings& dims);

// A helper kernel of a moe call with quantized experts, for one projection
// ("w13" or "w2"): the act_quant kernel (int8: the rows quantized per token)
// or the dequant kernel (fp8, int4: K chunks to bf16 for the dequant route;
// the general variant: whether the _normal one runs follows from the scales'
// values when the experts are packed).
struct MoeHelperKernel {
  std::string proj;
  std::optional<codegen::DequantDesc> dequant;
  std::optional<codegen::ActQuantDesc> act_quant;
  std::string name() const;
  std::string key() const;
  const jit::Kernel& code() const;  // jit::get: compiles it once
};
// Per projection, on a JIT path (none on scalar, none for bf16 experts).
std::vector<MoeHelperKernel> call_moe_quant_kernels(const ir::Function& f, const OperatorCall& c,
                                                    Isa isa);

}  // namespace tilejit::tools
