#include "tools/program/gemm_program.h"

#include <fmt/format.h>

#include <map>
#include <set>

#include "codegen/gemm_lowering.h"
#include "ir/builder.h"
#include "ir/printer.h"
#include "tools/program/operator_program.h"

namespace tilejit::tools {
namespace {

constexpr const char* kLowered =
    "a program must be a gemm chain (gemm → add bias → activation → cast) or a chain of "
    "rope, attention, decode_attention and moe ops";

#ifdef TILEJIT_HAVE_LLVM
// ops[from..] of f as a function of its own: `first` (if >= 0) becomes the
// first param, typed `first_type`, then every param of f those ops read, in
// f's order; every value keeps its name in f. Strides are dropped (the
// runner's tensors are dense); a packed layout is kept so that the elementwise compiler names it.
// Returns the function and, per param, the value id of f it stands for.
ir::Function elementwise_part(const ir::Function& f, size_t from, int first,
                              const ir::TensorType& first_type, std::vector<int>& inputs) {
  ir::Builder b(f.name);
  std::map<int, int> id;  // f value id -> builder value id
  inputs.clear();
  auto dense = [](ir::TensorType t) {
    if (t.layout.kind == ir::LayoutKind::row_major) t.layout = ir::Layout::row_major();
    return t;
  };
  if (first >= 0) {
    id[first] = b.param("v" + f.value(first).name, dense(first_type));
    inputs.push_back(first);
  }
  std::set<int> used;
  for (size_t i = from; i < f.ops.size(); ++i)
    for (int o : f.ops[i].operands) used.insert(o);
  for (int r : f.results) used.insert(r);
  for (int p : f.params)
    if (used.count(p) && !id.count(p)) {
      id[p] = b.param("v" + f.value(p).name, dense(f.value(p).type));
      inputs.push_back(p);
    }
  for (size_t i = from; i < f.ops.size(); ++i) {
    const ir::Op& op = f.ops[i];
    std::vector<int> operands;
    for (int o : op.operands) operands.push_back(id.at(o));
    id[op.result] = b.op(op.kind, operands, op.attrs);
  }
  std::vector<int> results;
  for (int r : f.results) results.push_back(id.at(r));
  b.ret(results);
  ir::Function e = b.finish();
  // The elementwise compiler's errors name e's values: give each the name of
  // the value of f it stands for (unique in f, so in e), not the builder's
  // "v" + name or number, so that a user reads "%x" of their own program.
  for (size_t i = 0; i < inputs.size(); ++i)
    e.values.at(e.params.at(i)).name = f.value(inputs[i]).name;
  for (size_t i = from; i < f.ops.size(); ++i)
    e.values.at(e.ops.at(i - from).result).name = f.value(f.ops[i].result).name;
  return e;
}

#endif  // TILEJIT_HAVE_LLVM

// A gemm with a quantized weight: the chain after it must fuse (bias,
// activation, cast), as tilejit::gemm runs it in one call.
GemmProgram match_quantized(const ir::Function& f, GemmProgram p) {
  const ir::Op& g = f.ops.front();
  const DType wdt = f.value(p.w).type.dtype;
  p.format = weight_format_of(wdt, g.attrs);
  // The verifier allowed only these three values (ir/ops.cpp).
  const std::string route = g.attrs.get_string("int4_route").value_or("automatic");
  p.int4_route = route == "w4a8"    ? Int4Route::w4a8
                 : route == "w4a16" ? Int4Route::w4a16
                                    : Int4Route::automatic;
  for (size_t i = 0; i < g.operand_names.size(); ++i) {
    const int id = g.operands.at(2 + i);
    if (g.operand_names[i] == "scale") p.scale = id;
    if (g.operand_names[i] == "zero") p.zero = id;
    if (g.operand_names[i] == "g_idx") p.g_idx = id;
  }
  ir::Op& lg = p.lowered.ops.front();
  lg.operands.resize(2);
  lg.operand_names.clear();
  lg.attrs = {};
  ir::TensorType& wt = p.lowered.values.at(p.w).type;
  wt = ir::TensorType{DType::bf16, wt.dims, ir::Layout::vnni2()};
  p.w_packed_by_runner = true;
  try {
    p.spec = codegen::match_gemm(p.lowered);
  } catch (const Error& e) {
    throw Error(fmt::format(
        "{} (a gemm with a quantized weight runs as one tilejit::gemm call: only a fused "
        "bias, activation and cast may follow it)",
        e.what()));
  }
  if (p.format == WeightFormat::int8) {
    p.spec.k = (p.spec.k + 3) / 4 * 4;
    p.spec.b_type = DType::i8;
  }
  if (p.spec.bias != codegen::BiasKind::none) p.bias = f.ops.at(1).operands.at(1);
  p.result = p.lowered.results.at(0);
  return p;
}

}  // namespace

namespace {

std::optional<std::vector<int64_t>> u4_storage_shape(const ir::Function& f, int id) {
  for (const ir::Op& op : f.ops) {
    if (op.kind == ir::OpKind::moe && op.operands.size() >= 3) {
      // Quantized experts: the same per expert, with a leading [E].
      const bool awq = op.attrs.get_string("format").value_or("") == "awq";
      for (int proj = 0; proj < 2; ++proj) {
        const auto& wd = f.value(op.operands[1 + proj]).type.dims;
        if (wd.size() != 3) continue;
        const int64_t e = wd[0].value, n = wd[1].value, k = wd[2].value;
        if (op.operands[1 + proj] == id) {
          if (awq) return std::vector<int64_t>{e, k, (n + 7) / 8};
          return std::vector<int64_t>{e, (k + 7) / 8, n};
        }
        const char* zero = proj == 0 ? "zero13" : "zero2";
        for (size_t i = 0; i < op.operand_names.size(); ++i)
          if (op.operand_names[i] == zero && op.operands.at(5 + i) == id) {
            const auto& zd = f.value(id).type.dims;
            return std::vector<int64_t>{e, zd.size() == 3 ? zd[1].value : 0, (n + 7) / 8};
          }
      }
      continue;
    }
    if (op.kind != ir::OpKind::gemm || op.operands.size() < 2) continue;
    const bool awq = op.attrs.get_string("format").value_or("") == "awq";
    const auto& wd = f.value(op.operands[1]).type.dims;
    const int64_t n = wd.at(0).value, k = wd.at(1).value;
    if (op.operands[1] == id) {
      if (awq) return std::vector<int64_t>{k, (n + 7) / 8};
      return std::vector<int64_t>{(k + 7) / 8, n};
    }
    for (size_t i = 0; i < op.operand_names.size(); ++i)
      if (op.operand_names[i] == "zero" && op.operands.at(2 + i) == id)
        return std::vector<int64_t>{f.value(id).type.dims.at(0).value, (n + 7) / 8};
  }
  return std::nullopt;
}

}  // namespace

WeightFormat weight_format_of(DType wt, const ir::Attrs& attrs) {
  switch (wt) {
    case DType::i8:
      return WeightFormat::int8;
    case DType::f8e4m3:
      return WeightFormat::fp8_e4m3;
    case DType::f4e2m1:
      return WeightFormat::mxfp4;
    case DType::u4:
      return attrs.get_string("format").value_or("gptq") == "awq" ? WeightFormat::int4_awq
                                                                  : WeightFormat::int4_gptq;
    default:
      return WeightFormat::bf16;
  }
}

DType weight_code_dtype(WeightFormat f) {
  switch (f) {
    case WeightFormat::int8:
      return DType::i8;
    case WeightFormat::fp8_e4m3:
      return DType::f8e4m3;
    case WeightFormat::mxfp4:
      return DType::f4e2m1;
    case WeightFormat::int4_awq:
    case WeightFormat::int4_gptq:
      return DType::u4;
    default:
      return DType::bf16;
  }
}

const char* checkpoint_struct_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::int8:
      return "Int8Weight";
    case WeightFormat::fp8_e4m3:
      return "Fp8Weight";
    case WeightFormat::mxfp4:
      return "Mxfp4Weight";
    case WeightFormat::int4_awq:
    case WeightFormat::int4_gptq:
      return "Int4Weight";
    default:
      return "TensorView";
  }
}

std::optional<CheckpointStorage> checkpoint_storage(const ir::Function& f, int id) {
  const ir::TensorType& t = f.value(id).type;
  if (t.dtype == DType::f4e2m1 && t.rank() >= 1) {
    std::vector<int64_t> shape;
    for (const ir::Dim& d : t.dims) shape.push_back(d.value);
    shape.back() = (shape.back() + 1) / 2;
    return CheckpointStorage{DType::u8, shape, "MXFP4 code bytes (two codes a byte)"};
  }
  if (t.dtype != DType::u4) return std::nullopt;
  if (auto shape = u4_storage_shape(f, id))
    return CheckpointStorage{DType::i32, *shape, "int32-packed checkpoint tensor"};
  return std::nullopt;
}

GemmProgram match_program(const ir::Function& f, bool allow_elementwise) {
  for (const ir::Op& op : f.ops)
    if (is_operator_op(op.kind))
      throw Error(fmt::format(
          "no gemm lowering for op '{}' ({}): rope, attention, decode_attention and moe run as "
          "calls of the public API (match_operator_program), not as a gemm chain",
          ir::name(op.kind), ir::print(f, op)));
  if (f.ops.empty())
    throw Error(fmt::format("no lowering for @{}: it has no ops; {}", f.name, kLowered));
  if (f.ops.front().kind != ir::OpKind::gemm) {
#ifdef TILEJIT_HAVE_LLVM
    bool all_elementwise = true;
    for (const ir::Op& op : f.ops) all_elementwise = all_elementwise && ir::is_elementwise(op.kind);
    if (all_elementwise && !allow_elementwise)
      throw Error(fmt::format(
          "@{} has no gemm, so no gemm plan, key or asm to show; `tilejit run` executes this "
          "elementwise program as one loop compiled by the LLVM backend",
          f.name));
    if (all_elementwise) {
      GemmProgram p;
      p.has_gemm = false;
      p.lowered = f;
      p.epilogue = elementwise_part(f, 0, -1, {}, p.epilogue_inputs);
      for (int q : f.params)
        if (p.x < 0 || f.value(q).type.rank() > f.value(p.x).type.rank()) p.x = q;
      for (const ir::Value& v : f.values)
        if (!v.type.dims.empty() && v.type.dims.back().is_static())
          p.spec.n = v.type.dims.back().value;
      p.spec.k = 0;
      p.result = f.results.at(0);
      return p;
    }
#endif
    (void)allow_elementwise;
    throw Error(fmt::format(
        "no lowering for op '{}' yet ({}): elementwise ops run only as a gemm's fused epilogue; {}",
        ir::name(f.ops.front().kind), ir::print(f, f.ops.front()), kLowered));
  }

  GemmProgram p;
  p.lowered = f;
  const ir::Op& g = f.ops.front();
  p.x = g.operands.at(0);
  p.w = g.operands.at(1);
  const DType wdt = f.value(p.w).type.dtype;
  if (wdt != DType::bf16) return match_quantized(f, std::move(p));
  // The runner packs w with pack_weight whatever its IR layout, so a
  // row-major weight lowers as the packed one the kernels read.
  ir::TensorType& wt = p.lowered.values.at(p.w).type;
  if (wt.layout.kind == ir::LayoutKind::row_major) {
    wt.layout = ir::Layout::vnni2();
    p.w_packed_by_runner = true;
  }
#ifdef TILEJIT_HAVE_LLVM
  try {
    p.spec = codegen::match_gemm(p.lowered);
  } catch (const Error& e) {
    const std::string full_error = e.what();
    // The longest prefix the fused gemm takes whose inner values nothing
    // after it reads; the rest must be elementwise, else today's message.
    bool rest_elementwise = true;
    for (size_t i = 1; i < f.ops.size(); ++i)
      rest_elementwise = rest_elementwise && ir::is_elementwise(f.ops[i].kind);
    if (!rest_elementwise) throw;
    for (size_t len = f.ops.size() - 1; len >= 1; --len) {
      const int end = f.ops[len - 1].result;
      std::set<int> inner;
      for (size_t i = 0; i + 1 < len; ++i) inner.insert(f.ops[i].result);
      bool leaks = false;
      for (size_t i = len; i < f.ops.size(); ++i)
        for (int o : f.ops[i].operands) leaks = leaks || inner.count(o);
      for (int r : f.results) leaks = leaks || inner.count(r);
      if (leaks) continue;
      ir::Function prefix = p.lowered;
      prefix.ops.resize(len);
      prefix.results = {end};
      codegen::GemmSpec spec;
      try {
        spec = codegen::match_gemm(prefix);
      } catch (const Error&) {
        if (len == 1) throw Error(full_error);
        continue;
      }
      p.spec = spec;
      p.lowered = std::move(prefix);
      p.epilogue = elementwise_part(f, len, end, f.value(end).type, p.epilogue_inputs);
      break;
    }
  }
#else
  p.spec = codegen::match_gemm(p.lowered);
#endif
  if (p.spec.bias != codegen::BiasKind::none) p.bias = f.ops.at(1).operands.at(1);
  p.result = p.lowered.results.at(0);
  return p;
}

}  // namespace tilejit::tools
