// Matching a gemm chain: which part of a verified function runs as the fused
// tilejit::gemm (codegen::match_gemm) and which as the LLVM elementwise loop.
#pragma once

#include <optional>
#include <vector>

#include "codegen/gemm_plan.h"
#include "ir/program.h"

namespace tilejit::tools {

// A verified function recognised as a gemm chain, and how the runner feeds it.
struct GemmProgram {
  // The function codegen lowers: the source with a row-major w re-typed to
  // packed<vnni2, n_block=64, k_pair=2>, since the runner packs w itself.
  ir::Function lowered;
  bool w_packed_by_runner = false;  // w is row-major in the source
  codegen::GemmSpec spec;
  int x = -1, w = -1, bias = -1;  // param value ids (bias -1: none)
  // A quantized weight (w is i8, f8e4m3 or u4): its format and the gemm's
  // named operands (param value ids, -1: absent). `lowered` then has a bf16
  // packed w of the same [N, K] and no named operands, and spec is the plan
  // tilejit::gemm runs: i8: b_type = i8, k rounded up to 4; f8e4m3 / u4: the
  // bf16 plan over k_packed (= K for groups of even size; the runner takes
  // the packed weight's), next to the dequant kernel.
  WeightFormat format = WeightFormat::bf16;
  int scale = -1, zero = -1, g_idx = -1;
  // u4: the gemm's int4_route attribute (GemmOptions::int4_route).
  Int4Route int4_route = Int4Route::automatic;
  bool quantized() const { return format != WeightFormat::bf16; }
  int result = -1;  // the returned value id (of `lowered`)

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

// The weight format of a gemm or moe weight of dtype wt (its op's
// attributes give int4's checkpoint layout): bf16 for a bf16 weight.
WeightFormat weight_format_of(DType wt, const ir::Attrs& attrs);
// The packed codes' dtype of a quantized format (the dequant and fused
// kernels' b / code type): i8, f8e4m3, u4 or f4e2m1.
DType weight_code_dtype(WeightFormat f);
// The public checkpoint struct pack_weight / pack_experts take for it
// ("Int4Weight"), for the tool's texts.
const char* checkpoint_struct_name(WeightFormat f);

// How a 4-bit param is held: as its checkpoint tensor.
struct CheckpointStorage {
  DType dtype;
  std::vector<int64_t> shape;
  const char* what;  // for messages: "int32-packed checkpoint tensor"
};
// A u4 param (a quantized gemm's w or zero) is held as its checkpoint's
// int32 tensor: qweight [ceil(K/8), N] (gptq) or [K, ceil(N/8)] (awq), qzeros
// [G, ceil(N/8)]; a moe op's u4 experts and zero13 / zero2 the same with a
// leading [E]. An f4e2m1 param (MXFP4 weights) as u8 bytes, two codes each
// (low nibble first), its last dim K stored as ceil(K/2). nullopt for any
// other param.
std::optional<CheckpointStorage> checkpoint_storage(const ir::Function& f, int id);

}  // namespace tilejit::tools
