// Builds a Function op by op. Every op method checks the op's rules and infers
// its result type at once, so a bad program fails at the line that made it,
// with a message naming the op, the operand and the rule:
//
//   ir::Builder b("linear");
//   int x = b.param("x", TensorType::make(DType::bf16, {Dim::sym("M"), Dim::fixed(4096)}));
//   int w = b.param("w", TensorType::make(DType::bf16, {Dim::fixed(4096), Dim::fixed(4096)},
//                                         Layout::vnni2()));
//   int y = b.cast(b.unary(OpKind::silu, b.gemm(x, w)), DType::bf16);
//   b.ret({y});
//   ir::Function f = b.finish();   // verified
#pragma once

#include <string>
#include <unordered_set>
#include <vector>

#include "ir/program.h"

namespace tilejit::ir {

class Builder {
 public:
  explicit Builder(std::string func_name);

  // Parameters come before the first op (ids are params first, then results).
  // Throws on a bad or duplicate name or an ill-formed type.
  int param(std::string name, TensorType type);

  int gemm(int x, int w);
  // A quantized gemm: w is i8, f8e4m3 or u4 with its scale and, for u4, an
  // optional zero point and g_idx (-1: absent); attrs as docs/ir.md says.
  int gemm_quant(int x, int w, int scale, Attrs attrs = {}, int zero = -1, int g_idx = -1);
  int add(int a, int b);
  int mul(int a, int b);
  // act is relu, silu, gelu_tanh, gelu_erf or relu2.
  int unary(OpKind act, int x);
  int cast(int x, DType to);
  int attention(int q, int k, int v, Attrs attrs = {});
  int rope(int q, int positions, int cos_sin, Attrs attrs = {});
  int moe(int hidden, int w13, int w2, int topk_weights, int topk_ids, Attrs attrs);
  // Any op kind; the typed methods above forward here. The result is named by
  // the next free number ("0", "1", ...).
  // `named`: the roles of the operands past the positional ones.
  int op(OpKind kind, std::vector<int> operands, Attrs attrs = {},
         std::vector<std::string> named = {});

  void ret(std::vector<int> values);

  const Value& value(int id) const;
  const TensorType& type(int id) const { return value(id).type; }

  // Verifies and hands over the function; the builder is spent afterwards.
  Function finish();

 private:
  void check_open(const char* what) const;
  const Value& operand(const char* op, int id) const;

  Function f_;
  std::unordered_set<std::string> names_;
  int next_number_ = 0;
  bool returned_ = false;
  bool finished_ = false;
};

}  // namespace tilejit::ir
