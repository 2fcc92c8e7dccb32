// LLVM IR for fused elementwise chains of the tensor IR.
//
// Shape of the emitted function:
//
//   for row < rows:                                   runtime (or static) count
//     row addresses of every parameter and result
//     for chunk < N / 16:                             static count
//       values[param] = load <16 x T>, widen to f32  (column stride 1: one vector
//                                                      load; else 16 scalar loads)
//       values[op]    = op(values[operands]), rounded to the op's dtype
//       store every result, narrowed to its dtype
//     the N % 16 tail once more with masked loads and stores
#include "codegen/llvm/llvm_elementwise.h"

#include <llvm/IR/IRBuilder.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "codegen/llvm/emitter_base.h"
#include "codegen/llvm/ir_loop.h"
#include "codegen/llvm/vector_math.h"
#include "ir/verifier.h"

namespace tilejit::codegen::llvm_backend {
namespace {

constexpr int kLanes = 16;

[[noreturn]] void fail(const ir::Function& f, const std::string& what) {
  throw Error("compile_llvm_elementwise: function @" + f.name + ": " + what);
}

std::string value_ref(const ir::Function& f, int id) {
  return "%" + f.value(id).name;
}

std::string shape_str(const std::vector<ir::Dim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + dims[i].str();
  return s + "]";
}

// Where the elements of one parameter or result live, relative to the
// [rows, N] iteration space. A stride is static (compiled in) or dynamic
// (read from ElementwiseArgs), in elements.
struct Access {
  DType dtype = DType::f32;
  bool broadcast = false;  // an [N] tensor in a space of rank ≥ 2: row stride 0
  std::optional<int64_t> row_stride, col_stride;
};

// The checked description of f as a [rows, N] loop nest.
struct Plan {
  std::vector<ir::Dim> space;  // S
  int64_t n = 1;
  std::optional<int64_t> static_rows;
  std::vector<Access> params;   // by position in f.params
  std::vector<Access> results;  // by position in f.results (strides: see emit)
};

Plan make_plan(const ir::Function& f) {
  Plan p;
  for (const ir::Op& op : f.ops) {
    if (!ir::is_elementwise(op.kind))
      fail(f, value_ref(f, op.result) + " = " + ir::name(op.kind) +
                  " is not elementwise: the LLVM elementwise compiler takes add, mul, relu, "
                  "silu, gelu_tanh, gelu_erf, relu2 and cast");
  }
  for (const ir::Value& v : f.values)
    if (v.type.rank() > static_cast<int>(p.space.size())) p.space = v.type.dims;
  if (!p.space.empty()) {
    const ir::Dim& last = p.space.back();
    if (!last.is_static())
      fail(f, "the last dim of " + shape_str(p.space) + " is symbolic (" + last.str() +
                  "): N must be static");
    p.n = last.value;
    int64_t rows = 1;
    bool all_static = true;
    for (size_t d = 0; d + 1 < p.space.size(); ++d) {
      if (p.space[d].is_static())
        rows *= p.space[d].value;
      else
        all_static = false;
    }
    if (all_static) p.static_rows = rows;
  } else {
    p.static_rows = 1;
  }
  const bool full_is_vector = p.space.size() <= 1;
  for (const ir::Value& v : f.values) {
    const auto& d = v.type.dims;
    const bool bcast = d.size() == 1 && !p.space.empty() && d[0] == p.space.back();
    if (d != p.space && !bcast)
      fail(f, value_ref(f, v.id) + " has shape " + shape_str(d) +
                  ": every value must have the shape " + shape_str(p.space) +
                  " of the iteration space or be broadcast over its rows as [" +
                  (p.space.empty() ? std::string("N") : p.space.back().str()) + "]");
  }

  for (int id : f.params) {
    const ir::Value& v = f.value(id);
    const ir::TensorType& t = v.type;
    Access a;
    a.dtype = t.dtype;
    if (t.dtype == DType::u4)
      fail(f, "parameter " + value_ref(f, id) +
                  " has dtype u4, which the elementwise compiler does not read");
    if (t.layout.kind != ir::LayoutKind::row_major)
      fail(f, "parameter " + value_ref(f, id) + " has the packed layout " + t.layout.str() +
                  ": elementwise kernels read row-major tensors");
    const int rank = t.rank();
    a.broadcast = rank == 1 && !full_is_vector;
    if (t.layout.strides.empty()) {  // contiguous
      a.col_stride = 1;
      a.row_stride = a.broadcast ? 0 : p.n;
    } else {
      const auto& s = t.layout.strides;
      a.col_stride = rank >= 1 ? s[rank - 1] : std::optional<int64_t>(1);
      if (a.broadcast || rank <= 1)
        a.row_stride = 0;
      else
        a.row_stride = s[rank - 2];
      // Leading dims collapse into rows only if each stride is the next one
      // times its dim: then row r of the collapsed space is at r·stride[rank-2].
      for (int dd = 0; dd + 2 < rank; ++dd) {
        const bool ok = s[dd] && s[dd + 1] && t.dims[dd + 1].is_static() &&
                        *s[dd] == *s[dd + 1] * t.dims[dd + 1].value;
        if (!ok)
          fail(f, "parameter " + value_ref(f, id) + " has layout " + t.layout.str() +
                      ": its leading dims do not collapse into rows (stride of dim " +
                      std::to_string(dd) + " must be static and equal the stride of dim " +
                      std::to_string(dd + 1) + " times its static size)");
      }
    }
    p.params.push_back(a);
  }
  for (int id : f.results) {
    const ir::TensorType& t = f.value(id).type;
    Access a;
    a.dtype = t.dtype;
    a.broadcast = t.rank() == 1 && !full_is_vector;
    a.col_stride = 1;
    p.results.push_back(a);
  }
  return p;
}

llvm::Type* storage_type(llvm::IRBuilder<>& b, DType t) {
  switch (t) {
    case DType::f32:
      return b.getFloatTy();
    case DType::bf16:
    case DType::f16:
      return b.getInt16Ty();
    case DType::i8:
    case DType::u8:
    case DType::f8e4m3:
      return b.getInt8Ty();
    case DType::i32:
      return b.getInt32Ty();
    case DType::u4:
    case DType::f4e2m1:
    case DType::f8e5m2:
    case DType::i64:
      break;
  }
  return b.getInt8Ty();
}

class ElementwiseEmitter : public KernelEmitter {
 public:
  ElementwiseEmitter(ModuleContext& mc, const ir::Function& f, const Plan& p)
      : KernelEmitter(mc), f_(f), p_(p), vm_(b_, kLanes) {}

 private:
  using Args = ElementwiseArgs;

  void generate() override {
    load_bases();
    llvm::Value* rows = p_.static_rows ? i64(*p_.static_rows) : arg(TILEJIT_ARG(Args, rows));
    emit_loop(
        b_, rows, {},
        [&](llvm::Value* row, const std::vector<llvm::Value*>&) {
          row_body(row);
          return std::vector<llvm::Value*>{};
        },
        "row");
  }

  // Element i of an array the arguments point to (`t`: ptr or i64).
  llvm::Value* element(llvm::Value* array, int64_t i, llvm::Type* t) {
    return invariant_load(t, b_.CreateGEP(t, array, i64(i)), 8);
  }
  llvm::Value* stride(const std::optional<int64_t>& s, int64_t index) {
    if (s) return i64(*s);
    return element(arg(TILEJIT_ARG(Args, param_strides)), index, b_.getInt64Ty());
  }

  // The addresses and strides of every parameter and result.
  void load_bases() {
    llvm::Type* ptr = b_.getPtrTy();
    llvm::Value* params = arg(TILEJIT_ARG(Args, params));
    llvm::Value* results = arg(TILEJIT_ARG(Args, results));
    llvm::Value* rstrides = arg(TILEJIT_ARG(Args, result_row_strides));
    for (size_t i = 0; i < p_.params.size(); ++i) {
      const Access& a = p_.params[i];
      param_base_.push_back(element(params, int64_t(i), ptr));
      param_rs_.push_back(stride(a.row_stride, 2 * int64_t(i)));
      param_cs_.push_back(stride(a.col_stride, 2 * int64_t(i) + 1));
    }
    for (size_t i = 0; i < p_.results.size(); ++i)
      result_base_.push_back(element(results, int64_t(i), ptr));
    // Result row strides: from the array when it is given, else contiguous.
    // A branch, not a select: the array must not be read when it is null.
    llvm::BasicBlock* from = b_.GetInsertBlock();
    llvm::Function* fn = from->getParent();
    auto* given = llvm::BasicBlock::Create(mc_.ctx, "rstrides", fn);
    auto* join = llvm::BasicBlock::Create(mc_.ctx, "rstrides.join", fn);
    b_.CreateCondBr(b_.CreateIsNull(rstrides), join, given);
    b_.SetInsertPoint(given);
    std::vector<llvm::Value*> loaded;
    for (size_t i = 0; i < p_.results.size(); ++i)
      loaded.push_back(element(rstrides, int64_t(i), b_.getInt64Ty()));
    b_.CreateBr(join);
    b_.SetInsertPoint(join);
    for (size_t i = 0; i < p_.results.size(); ++i) {
      if (p_.results[i].broadcast) {
        result_rs_.push_back(i64(0));
        continue;
      }
      llvm::PHINode* phi = b_.CreatePHI(b_.getInt64Ty(), 2);
      phi->addIncoming(i64(p_.n), from);
      phi->addIncoming(loaded[i], given);
      result_rs_.push_back(phi);
    }
  }

  llvm::Value* elem_ptr(llvm::Value* row_base, DType t, llvm::Value* index) {
    return b_.CreateGEP(storage_type(b_, t), row_base, index);
  }

  void row_body(llvm::Value* row) {
    param_row_.clear();
    result_row_.clear();
    for (size_t i = 0; i < p_.params.size(); ++i)
      param_row_.push_back(
          elem_ptr(param_base_[i], p_.params[i].dtype, b_.CreateMul(row, param_rs_[i])));
    for (size_t i = 0; i < p_.results.size(); ++i)
      result_row_.push_back(
          elem_ptr(result_base_[i], p_.results[i].dtype, b_.CreateMul(row, result_rs_[i])));
    const int64_t full = p_.n / kLanes;
    emit_loop(
        b_, i64(full), {},
        [&](llvm::Value* c, const std::vector<llvm::Value*>&) {
          chunk(b_.CreateMul(c, i64(kLanes)), kLanes);
          return std::vector<llvm::Value*>{};
        },
        "col");
    if (p_.n % kLanes != 0) chunk(i64(full * kLanes), static_cast<int>(p_.n % kLanes));
  }

  llvm::Value* mask(int lanes) {
    std::vector<llvm::Constant*> m;
    for (int l = 0; l < kLanes; ++l) m.push_back(b_.getInt1(l < lanes));
    return llvm::ConstantVector::get(m);
  }

  // The raw storage of `lanes` elements of parameter i from column c0.
  llvm::Value* load_raw(size_t i, llvm::Value* c0, int lanes) {
    const Access& a = p_.params[i];
    llvm::Type* et = storage_type(b_, a.dtype);
    auto* vt = llvm::FixedVectorType::get(et, kLanes);
    const llvm::Align align(et->getPrimitiveSizeInBits() / 8);
    if (a.col_stride && *a.col_stride == 1) {
      llvm::Value* p = elem_ptr(param_row_[i], a.dtype, c0);
      if (lanes == kLanes) return b_.CreateAlignedLoad(vt, p, align);
      return b_.CreateMaskedLoad(vt, p, align, mask(lanes), llvm::Constant::getNullValue(vt));
    }
    llvm::Value* v = llvm::Constant::getNullValue(vt);
    for (int l = 0; l < lanes; ++l) {
      llvm::Value* idx = b_.CreateMul(b_.CreateAdd(c0, i64(l)), param_cs_[i]);
      v = b_.CreateInsertElement(
          v, b_.CreateAlignedLoad(et, elem_ptr(param_row_[i], a.dtype, idx), align), uint64_t(l));
    }
    return v;
  }

  llvm::Value* widen(llvm::Value* raw, DType t) {
    switch (t) {
      case DType::f32:
        return raw;
      case DType::bf16:
        return vm_.bf16_to_f32(raw);
      case DType::f16:
        return vm_.f16_to_f32(raw);
      case DType::i8:
      case DType::i32:
        return b_.CreateSIToFP(raw, vm_.f32v());
      case DType::u8:
        return b_.CreateUIToFP(raw, vm_.f32v());
      case DType::f8e4m3:
        return vm_.f8e4m3_to_f32(raw);
      case DType::u4:
      case DType::f4e2m1:
      case DType::f8e5m2:
      case DType::i64:
        break;
    }
    return raw;
  }

  // The bits of v in dtype t (bf16 or f16), rounded to nearest even.
  llvm::Value* narrow(llvm::Value* v, DType t) {
    return t == DType::bf16 ? vm_.f32_to_bf16(v) : vm_.f32_to_f16(v);
  }
  llvm::Value* widen_bits(llvm::Value* bits, DType t) {
    return t == DType::bf16 ? vm_.bf16_to_f32(bits) : vm_.f16_to_f32(bits);
  }

  void store(size_t k, llvm::Value* v, llvm::Value* c0, int lanes) {
    const Access& a = p_.results[k];
    llvm::Type* et = storage_type(b_, a.dtype);
    const llvm::Align align(et->getPrimitiveSizeInBits() / 8);
    llvm::Value* p = elem_ptr(result_row_[k], a.dtype, c0);
    if (lanes == kLanes)
      b_.CreateAlignedStore(v, p, align);
    else
      b_.CreateMaskedStore(v, p, align, mask(lanes));
  }

  void chunk(llvm::Value* c0, int lanes) {
    std::map<int, llvm::Value*> vals;  // value id -> f32 vector (exact in the value's dtype)
    std::map<int, llvm::Value*> bits;  // value id -> its bf16 / f16 bits, where computed
    std::map<int, size_t> param_index;
    for (size_t i = 0; i < f_.params.size(); ++i) param_index[f_.params[i]] = i;
    auto get = [&](int id) -> llvm::Value* {
      auto it = vals.find(id);
      if (it != vals.end()) return it->second;
      const size_t i = param_index.at(id);  // ops are in order: only params are not yet there
      llvm::Value* v = widen(load_raw(i, c0, lanes), p_.params[i].dtype);
      vals[id] = v;
      return v;
    };
    for (const ir::Op& op : f_.ops) {
      const DType out = f_.value(op.result).type.dtype;
      llvm::Value* v = nullptr;
      switch (op.kind) {
        case ir::OpKind::add:
          v = b_.CreateFAdd(get(op.operands[0]), get(op.operands[1]));
          break;
        case ir::OpKind::mul:
          v = b_.CreateFMul(get(op.operands[0]), get(op.operands[1]));
          break;
        case ir::OpKind::cast:
          v = get(op.operands[0]);
          break;
        default:
          v = vm_.activation(ir::activation_of(op.kind), get(op.operands[0]));
          break;
      }
      if (out == DType::bf16 || out == DType::f16) {
        // Rounded where defined, so later ops see what memory would hold.
        bits[op.result] = narrow(v, out);
        v = widen_bits(bits[op.result], out);
      }
      vals[op.result] = v;
    }
    // Every load before the first store: a result may overwrite a parameter
    // in place.
    std::vector<llvm::Value*> out;
    for (size_t k = 0; k < f_.results.size(); ++k) {
      const int id = f_.results[k];
      const DType t = p_.results[k].dtype;
      if (auto p = param_index.find(id); p != param_index.end())
        out.push_back(load_raw(p->second, c0, lanes));  // a parameter returned as is: its bits
      else if (auto it = bits.find(id); it != bits.end())
        out.push_back(it->second);
      else
        out.push_back(t == DType::f32 ? vals.at(id) : narrow(vals.at(id), t));
    }
    for (size_t k = 0; k < out.size(); ++k) store(k, out[k], c0, lanes);
  }

  const ir::Function& f_;
  const Plan& p_;
  VectorMath vm_;
  std::vector<llvm::Value*> param_base_, param_rs_, param_cs_, result_base_, result_rs_;
  std::vector<llvm::Value*> param_row_, result_row_;
};

}  // namespace

LlvmKernel compile_llvm_elementwise(const ir::Function& f, OptLevel opt) {
  ir::verify(f);
  const Plan plan = make_plan(f);
  require_vector_host("compile_llvm_elementwise");
  const std::string name = "elementwise_" + f.name + "_n" + std::to_string(plan.n);
  return compile_emitter<ElementwiseEmitter>(name, opt, f, plan);
}

}  // namespace tilejit::codegen::llvm_backend
