// Elementwise chains of the tensor IR compiled by LLVM into one fused loop.
//
//   func @f(%x: tensor<?Mx4096xbf16>, %b: tensor<4096xf32>) -> (tensor<?Mx4096xbf16>) {
//     %0 = add %x, %b ; %1 = silu %0 ; %2 = cast %1 {to = bf16} ; return %2 }
//
// becomes `void f(const ElementwiseArgs*)`: for each row, for each 16 columns,
// load every parameter once, evaluate the ops in f32 registers (rounding to
// bf16 / f16 where a value has that dtype), store every result. LLVM-free:
// the rest of the project includes this header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "codegen/llvm/llvm_jit.h"
#include "ir/program.h"

namespace tilejit::codegen::llvm_backend {

// The call arguments. The iteration space is the shape S of f's largest value:
// every value has shape S or, broadcast over the rows, [N] with N = S's last
// dim (static). Rows = the product of S's leading dims (1 for rank ≤ 1).
struct ElementwiseArgs {
  const void* const* params;  // [params]: address of element 0 of each, in f.params order
  void* const* results;       // [results]: address of element 0 of each, in f.results order
  // Rows to process. Used only when a leading dim of S is symbolic (?M); when
  // all are static the compiled kernel uses their product.
  int64_t rows;
  // [params][2]: {row stride, column stride} in elements, read only for
  // strides the parameter's type leaves dynamic ("strided<[?, ?]>"); may be
  // null when no parameter has one. Static and contiguous strides are compiled in.
  const int64_t* param_strides;
  // [results]: elements between result rows, or null for contiguous rows (N).
  // Results shaped [N] in a space of rank ≥ 2 are written once per row, in place.
  const int64_t* result_row_strides;
};
static_assert(offsetof(ElementwiseArgs, params) == 0 && offsetof(ElementwiseArgs, results) == 8 &&
              offsetof(ElementwiseArgs, rows) == 16 &&
              offsetof(ElementwiseArgs, param_strides) == 24 &&
              offsetof(ElementwiseArgs, result_row_strides) == 32);

using ElementwiseFn = void (*)(const ElementwiseArgs*);

// Verifies f (ir::verify), checks that it is an elementwise chain this
// compiler covers, and compiles it. Throws tilejit::Error naming the op,
// value or parameter otherwise: an op other than add, mul, relu, silu,
// gelu_tanh, gelu_erf, relu2, cast; a value whose shape is neither S nor [N]; a
// symbolic N; a u4 parameter; leading dims of rank ≥ 3 that strides do not
// let collapse into rows.
//
// Arithmetic is f32 (the IR's rule); a value of dtype bf16 or f16 is rounded
// to nearest even at its definition, so later ops see what memory would hold.
// Casts go through f32: i8, u8, f16, bf16 and fp8 e4m3 convert exactly, an i32
// rounds to f32 first (so i32 -> bf16 rounds twice).
LlvmKernel compile_llvm_elementwise(const ir::Function& f, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
