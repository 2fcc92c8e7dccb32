// The operator families of the IR that run as calls of the public API, one
// call per op, so `tilejit run` and `tilejit bench` measure exactly what an
// engine gets (docs/tool.md, "Which programs run"):
//
//   rope       %o = rope %q, %pos, %cos_sin    q copied to %o, then tilejit::rope in place (no k)
//   attention  %o = attention %q, %k, %v       tilejit::flash_attn_varlen, one sequence:
//                                              cu_seqlens_q = [0, T], cu_seqlens_k = [0, S]
//   decode_attention  %o = decode_attention %q, %k_cache, %v_cache, %block_table, %seq_lens
//                                              tilejit::decode_attention over the paged cache
//                                              as given (bf16, or f8e4m3 / f8e5m2 with k_scale,
//                                              v_scale)
//   moe        %o = moe %h, %w13, %w2, %tw, %ti  pack_experts (w13, w2 given row-major), then
//                                              tilejit::fused_experts; quantized experts
//                                              (scale13 = ..., scale2 = ...): pack_experts of
//                                              one Int8Weight / Fp8Weight / Int4Weight per
//                                              expert, views into the [E, ...] inputs
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
#include <string>
#include <vector>

#include "ir/program.h"
#include "tilejit/tilejit.h"

namespace tilejit::tools {

// True for rope, attention, decode_attention and moe: the ops an
// OperatorProgram runs.
bool is_operator_op(ir::OpKind k);

// A moe call's quantized experts (docs/ir.md, "Quantized experts"): the
// format, and per projection (0: w13, 1: w2) the value ids of its named
// operands (-1: absent) and the checkpoint parameters of the attributes.
struct MoeQuant {
  WeightFormat format = WeightFormat::bf16;
  int scale[2] = {-1, -1}, zero[2] = {-1, -1}, g_idx[2] = {-1, -1};
  int64_t block_n = 0, block_k = 0;  // fp8 block scales
  int64_t group_size = 128;          // int4
  int bits = 4;
  bool gptq_v2 = false;
  bool quantized() const { return format != WeightFormat::bf16; }
};

// A moe call's MoeOptions tensors (docs/ir.md): value ids of its named
// operands b13, b2, shared_w13, shared_w2, shared_weights (-1: absent). The
// shared expert is bf16 [2·Is, H] / [H, Is], its rows stacked as w13's.
struct MoeOperands {
  int b13 = -1, b2 = -1, shared_w13 = -1, shared_w2 = -1, shared_weights = -1;
  bool shared() const { return shared_w13 >= 0; }
};

// An attention call's per-head tensors (named operands sinks, alibi_slopes;
// -1: absent): AttentionOptions::sinks / alibi_slopes.
struct AttentionOperands {
  int sinks = -1, alibi_slopes = -1;
};

// One IR op and the public call that runs it, its attributes resolved to the
// API's options (the IR defaults applied).
struct OperatorCall {
  size_t op = 0;  // index into f.ops
  ir::OpKind kind = ir::OpKind::rope;
  RopeOptions rope;
  AttentionOptions attention;
  MoeOptions moe;
  MoeQuant moe_quant;
  MoeOperands moe_operands;
  AttentionOperands attention_operands;
  GluRows glu_rows = GluRows::halves;  // moe: how w13 stacks its gate and up rows
  bool gated = true;                   // moe: false: w13 is a non-gated up projection
  // moe: how w13 is packed (ExpertProj::gate_up, or up when !gated).
  ExpertProj w13_proj() const { return gated ? ExpertProj::gate_up : ExpertProj::up; }
  int64_t top_k = 0;

  // "tilejit::rope", "tilejit::flash_attn_varlen", "tilejit::fused_experts".
  const char* api() const;
};

struct OperatorProgram {
  std::vector<OperatorCall> calls;  // in program order
};

// Whether f (verified) has any of those ops.
bool has_operator_ops(const ir::Function& f);
// Matches a verified function made only of those ops.
// Throws tilejit::Error naming the op and the rule for what the public API
// cannot take: another op in the same program, an operand dtype the call does
// not accept (attention: bf16 q/k/v; rope: f32 or bf16 q), or a moe weight
// that is not a program input (weights are packed once, when inputs are bound).
OperatorProgram match_operator_program(const ir::Function& f);

// Small facts of a call the describing, running and checking code share.
const ir::Op& op_of(const ir::Function& f, const OperatorCall& c);
int operand(const ir::Function& f, const OperatorCall& c, size_t i);  // value id of operand i
bool is_param(const ir::Function& f, int id);
bool is_result(const ir::Function& f, int id);
// "neox" or "gptj".
const char* rope_style_name(RopeStyle s);
// The gated activation of an MoE call as the tool prints it.
std::string moe_act_text(const MoeOptions& o);
// sm_scale as the API applies it (the IR default is the API's: 1/√D).
double sm_scale_of(const OperatorCall& c, int64_t d);

}  // namespace tilejit::tools
