// Row-wise layer kernels compiled by LLVM: RMSNorm and LayerNorm (alone, or
// after the residual add), the gated RMSNorm, and the gated activation
// act(gate)·up of an MLP, one row of a token at a time, specialised on the
// row length and every dtype
// (semantics: docs/rowwise.md). LLVM-free: the rest of the project includes
// this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "codegen/brgemm_desc.h"
#include "codegen/kernel_desc.h"
#include "codegen/llvm/llvm_jit.h"
#include "tilejit/tilejit.h"

namespace tilejit::codegen::llvm_backend {

enum class RowOp {
  rms_norm,        // out = x·rstd(x)·w
  add_rms_norm,    // residual = x + residual (rounded to its dtype); out = residual·rstd·w
  glu,             // out = f(gate, up), gate and up the two halves (or interleaved) of x
  layer_norm,      // out = (x - mean)·rstd·w + b
  add_layer_norm,  // residual = x + residual; out = layer_norm(residual)
  gated_rms_norm,  // out = rms_norm(x)·w·act(gate), or rms_norm(x·act(gate))·w
};
// Inline: the ops layer names kernels in builds without LLVM too.
inline const char* row_op_name(RowOp op) {
  switch (op) {
    case RowOp::rms_norm:
      return "rms_norm";
    case RowOp::add_rms_norm:
      return "add_rms_norm";
    case RowOp::glu:
      return "glu";
    case RowOp::layer_norm:
      return "layer_norm";
    case RowOp::add_layer_norm:
      return "add_layer_norm";
    case RowOp::gated_rms_norm:
      return "gated_rms_norm";
  }
  return "?";
}
// The ops that read and write a residual; the LayerNorms (centred rows).
inline bool adds_residual(RowOp op) {
  return op == RowOp::add_rms_norm || op == RowOp::add_layer_norm;
}
inline bool centres_rows(RowOp op) {
  return op == RowOp::layer_norm || op == RowOp::add_layer_norm;
}
inline std::string field_text(RowOp op) {
  return row_op_name(op);
}

// What the emitted bytes depend on. eps is an argument, not a field: a
// model's eps would otherwise compile one more kernel per value.
struct RowwiseDesc {
  static constexpr const char* kFamily = "rowwise_llvm";
  RowOp op = RowOp::rms_norm;
  DType x = DType::bf16;              // x rows: f32 or bf16
  DType res = DType::bf16;            // the add norms' residual: f32 or bf16 (else unused)
  DType out = DType::bf16;            // f32 or bf16
  int64_t h = 0;                      // norm: the row length; glu: out's row (x has 2h)
  bool weight = true;                 // norms: a [h] weight multiplies the normalised row
  DType w = DType::bf16;              // its dtype, f32 or bf16
  bool plus_one = false;              // Gemma: the weight is applied as (1 + w)
  bool bias = false;                  // layer norms: a [h] bias added last
  DType b = DType::bf16;              // its dtype, f32 or bf16
  DType g = DType::bf16;              // gated_rms_norm: the gate's dtype, f32 or bf16
  bool gate_first = false;            // gated_rms_norm: x·act(gate) is normalised
  Glu glu = Glu::none;                // glu: act_mul or clamped_swiglu (norms: none)
  Activation act = Activation::none;  // act_mul, gated_rms_norm: the gate's activation
  float alpha = 0, limit = 0;         // clamped_swiglu only
  bool interleaved = false;           // glu: x's row is g0 u0 g1 u1 ... (else gate | up)

  static constexpr auto field_list() {
    using D = RowwiseDesc;
    using enum NameRule;
    return std::make_tuple(
        field("op", &D::op, "_"), field("x", &D::x, "_"),
        field("res", &D::res, "_res", unless_default), field("out", &D::out, "_", "out"),
        field("h", &D::h, "_h"), field("weight", &D::weight, "", "_nowt", choice),
        field("w", &D::w, "_w", unless_default), field("plus1", &D::plus_one, "_plus1", flag),
        field("bias", &D::bias, "_bias", flag), field("b", &D::b, "_b", unless_default),
        field("g", &D::g, "_gate", unless_default),
        field("gate_first", &D::gate_first, "_gatefirst", flag),
        field("glu", &D::glu, "_", unless_default), field("act", &D::act, "_", unless_default),
        field("alpha", &D::alpha, "_a", unless_default),
        field("limit", &D::limit, "_l", unless_default),
        field("il", &D::interleaved, "_interleaved", flag));
  }
  bool operator==(const RowwiseDesc& o) const { return same_fields(*this, o); }
  // rowwise_llvm_rms_norm_bf16_bf16out_h4096 (the key holds every field).
  std::string name() const { return desc_name(*this); }
};
static_assert(fields_cover<RowwiseDesc>(), "a RowwiseDesc member is missing from field_list()");

// The call: `rows` rows from the given pointers; strides in elements.
struct RowwiseArgs {
  const void* x;
  void* residual;  // the add norms: read and written
  const void* weight;
  void* out;
  int64_t rows;
  int64_t x_stride, res_stride, out_stride;
  float eps;         // norms: > 0 (the ops layer checks it)
  const void* bias;  // layer norms with a bias
  const void* gate;  // gated_rms_norm: rows of the gate
  int64_t gate_stride;
};
static_assert(offsetof(RowwiseArgs, rows) == 32 && offsetof(RowwiseArgs, eps) == 64 &&
              offsetof(RowwiseArgs, gate_stride) == 88);

using RowwiseFn = void (*)(const RowwiseArgs*);

// Checks the descriptor (Error naming the field) and compiles it.
LlvmKernel compile_llvm_rowwise(const RowwiseDesc& desc, OptLevel opt = OptLevel::kernel);

}  // namespace tilejit::codegen::llvm_backend
