#include "ops/program_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <tuple>

#include "codegen/gemm_lowering.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_elementwise.h"
#endif
#include "ir/builder.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/tensor_checks.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "runtime/thread_pool.h"

namespace tilejit::ops {
namespace {

constexpr const char* kLowered =
    "a program must be a gemm chain (gemm → add bias → activation → cast) or a chain of "
    "rope, attention and moe ops";

int64_t elem_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

#ifdef TILEJIT_HAVE_LLVM
// ops[from..] of f as a function of its own: `first` (if >= 0) becomes the
// first param, typed `first_type`, then every param of f those ops read, in
// f's order (each named "v" + its name in f: a number is no param name). Strides are dropped (the
// runner's tensors are dense); a packed layout is kept so that the elementwise compiler names it.
// Returns the function and, per param, the value id of f it stands for.
ir::Function elementwise_part(const ir::Function& f, size_t from, int first,
                              const ir::TensorType& first_type, std::vector<int>& inputs) {
  ir::Builder b(f.name + (first >= 0 ? "_epilogue" : ""));
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
  return b.finish();
}

#endif  // TILEJIT_HAVE_LLVM

const char* chunk_name(codegen::GemmPlan::Chunk c) {
  switch (c) {
    case codegen::GemmPlan::Chunk::whole:
      return "whole K";
    case codegen::GemmPlan::Chunk::first:
      return "first K chunk";
    case codegen::GemmPlan::Chunk::middle:
      return "middle K chunk";
    case codegen::GemmPlan::Chunk::last:
      return "last K chunk";
  }
  return "?";
}

}  // namespace

int64_t dense_bytes(const std::vector<int64_t>& shape, int64_t item_bytes,
                    const std::string& what) {
  int64_t n = item_bytes;
  bool overflow = false;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(fmt::format("{} has shape {}: a dim is negative", what, shape_str(shape)));
    overflow = overflow || __builtin_mul_overflow(n, d, &n);
  }
  // A zero dim makes an empty tensor whatever the other dims multiply to.
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  if (overflow || n > kMaxHostTensorBytes)
    throw Error(fmt::format(
        "{} has shape {} of {}-byte elements: {} bytes; allowed: at most {} GiB (the tool's cap "
        "on one tensor)",
        what, shape_str(shape), item_bytes,
        overflow ? std::string("more than 2^63") : std::to_string(n), kMaxHostTensorBytes >> 30));
  return n;
}

HostTensor HostTensor::zeros(DType dtype, std::vector<int64_t> shape, const std::string& what) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<size_t>(dense_bytes(t.shape, elem_bytes(dtype), what)), 0);
  return t;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GemmProgram match_program(const ir::Function& f, bool allow_elementwise) {
  for (const ir::Op& op : f.ops)
    if (is_operator_op(op.kind))
      throw Error(fmt::format(
          "no gemm lowering for op '{}' ({}): rope, attention and moe run as calls of the "
          "public API (match_operator_program), not as a gemm chain",
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

std::vector<int64_t> bind_shape(const ir::TensorType& t, const DimBindings& dims) {
  std::vector<int64_t> s;
  for (const ir::Dim& d : t.dims) {
    if (d.is_static()) {
      s.push_back(d.value);
    } else {
      auto it = dims.find(d.symbol);
      s.push_back(it == dims.end() ? -1 : it->second);
    }
  }
  return s;
}

std::string dims_str(const ir::TensorType& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.dims.size(); ++i) s += (i ? ", " : "") + t.dims[i].str();
  return s + "]";
}

std::vector<KernelUse> plan_kernels(const codegen::GemmPlan& plan, std::optional<int64_t> m) {
  using Chunk = codegen::GemmPlan::Chunk;
  const bool full_block = plan.spec.n >= plan.nb;
  const bool tail_block = plan.n_tail != 0;
  // (chunk, -rows, n_tail): main blocks before tails, K chunks in order.
  std::set<std::tuple<int, int, bool>> uses;
  auto add = [&](Chunk c, int rows) {
    if (full_block) uses.insert({static_cast<int>(c), -rows, false});
    if (tail_block) uses.insert({static_cast<int>(c), -rows, true});
  };
  if (!m) {
    add(Chunk::whole, plan.mr);
    if (plan.k_chunks > 1) {
      add(Chunk::first, plan.mr);
      if (plan.k_chunks > 2) add(Chunk::middle, plan.mr);
      add(Chunk::last, plan.mr);
    }
  } else {
    // What the GEMM driver runs for m rows, from the plan's own list.
    for (const auto& v : plan.variants_for(*m))
      uses.insert({static_cast<int>(v.chunk), -v.rows, v.cols != plan.nb});
  }
  std::vector<KernelUse> out;
  for (const auto& [c, neg_rows, tail] : uses) {
    const int rows = -neg_rows;
    const Chunk chunk = static_cast<Chunk>(c);
    std::string role;
    if (rows == plan.mr)
      role = tail ? fmt::format("N tail ({} cols)", plan.n_tail) : "main block";
    else
      role = tail ? fmt::format("M tail ({} row{}) x N tail ({} cols)", rows, rows == 1 ? "" : "s",
                                plan.n_tail)
                  : fmt::format("M tail ({} row{})", rows, rows == 1 ? "" : "s");
    if (chunk != Chunk::whole) role += fmt::format(", {}", chunk_name(chunk));
    out.push_back({role, plan.ukernel(rows, tail ? plan.n_tail : plan.nb, chunk)});
  }
  return out;
}

ProgramRunner::ProgramRunner(ir::Function f) : f_(std::move(f)) {
  ir::verify(f_);
  if (has_operator_ops(f_)) {
    ops_ = std::make_unique<OperatorRunner>(f_, match_operator_program(f_));
    return;
  }
  prog_ = match_program(f_, /*allow_elementwise=*/true);
#ifdef TILEJIT_HAVE_LLVM
  if (!prog_.epilogue.ops.empty())
    epilogue_kernel_ = codegen::llvm_backend::compile_llvm_elementwise(prog_.epilogue);
#endif
}

const HostTensor& ProgramRunner::input(int value_id) const {
  return inputs_->at(f_.value(value_id).name);
}

void ProgramRunner::set_inputs(const TensorMap& inputs, const DimBindings& preset) {
  std::vector<std::string> names;
  for (int p : f_.params) names.push_back(f_.value(p).name);
  for (const auto& [name, t] : inputs)
    if (std::find(names.begin(), names.end(), name) == names.end())
      throw Error(fmt::format("unknown input '{}': the inputs of @{} are {}", name, f_.name,
                              fmt::join(names, ", ")));

  DimBindings dims = preset;
  std::map<std::string, std::string> source;  // symbol -> who bound it, for messages
  for (const auto& [s, v] : preset) source[s] = "the given dims";
  for (int p : f_.params) {
    const ir::Value& v = f_.value(p);
    auto it = inputs.find(v.name);
    if (it == inputs.end())
      throw Error(fmt::format("missing input '{}' ({})", v.name, v.type.str()));
    const HostTensor& t = it->second;
    if (t.dtype != v.type.dtype)
      throw Error(fmt::format("input '{}' is {}; expected {} ({})", v.name, dtype_name(t.dtype),
                              dtype_name(v.type.dtype), v.type.str()));
    bool ok = static_cast<int>(t.shape.size()) == v.type.rank();
    for (int i = 0; ok && i < v.type.rank(); ++i)
      ok = !v.type.dims[i].is_static() || v.type.dims[i].value == t.shape[i];
    if (!ok)
      throw Error(fmt::format("input '{}' has shape {}; expected {} ({})", v.name,
                              shape_str(t.shape), dims_str(v.type), v.type.str()));
    for (int i = 0; i < v.type.rank(); ++i) {
      const ir::Dim& d = v.type.dims[i];
      if (d.is_static()) continue;
      auto [b, fresh] = dims.emplace(d.symbol, t.shape[i]);
      if (fresh) {
        source[d.symbol] = fmt::format("input '{}'", v.name);
      } else if (b->second != t.shape[i]) {
        throw Error(
            fmt::format("input '{}' has shape {}: its dim {} is ?{} = {}, but ?{} = {} "
                        "from {}; expected {}",
                        v.name, shape_str(t.shape), i, d.symbol, t.shape[i], d.symbol, b->second,
                        source[d.symbol], shape_str(bind_shape(v.type, dims))));
      }
    }
    const int64_t need =
        dense_bytes(t.shape, elem_bytes(t.dtype), fmt::format("input '{}'", v.name));
    if (static_cast<int64_t>(t.bytes.size()) != need)
      throw Error(fmt::format("input '{}' holds {} bytes; its shape {} needs {}", v.name,
                              t.bytes.size(), shape_str(t.shape), need));
  }
  inputs_ = &inputs;
  dims_ = std::move(dims);
  if (ops_) {
    ops_->bind(inputs, dims_);
    return;
  }
  if (!prog_.has_gemm) return;
  if (!prog_.epilogue.ops.empty()) {
    const ir::TensorType& gt = f_.value(prog_.result).type;
    gemm_out_ = HostTensor::zeros(gt.dtype, bind_shape(gt, dims_),
                                  fmt::format("the gemm result %{}", f_.value(prog_.result).name));
  }

  // x at the IR's static row stride, when it has one wider than K: the
  // kernels then read rows of a wider buffer, as the program says.
  const HostTensor& x = input(prog_.x);
  const ir::Layout& xl = f_.value(prog_.x).type.layout;
  x_strided_.clear();
  const int64_t m = x.shape[0], k = x.shape[1];
  if (!xl.strides.empty() && xl.strides[0] && *xl.strides[0] > k) {
    const int64_t ld = x_ld_ = *xl.strides[0];
    x_strided_.assign(static_cast<size_t>(dense_bytes({m, ld}, 2,
                                                      fmt::format("input '{}' at its row stride {}",
                                                                  f_.value(prog_.x).name, ld)) /
                                          2),
                      0);
    for (int64_t i = 0; i < m; ++i)
      std::memcpy(x_strided_.data() + i * ld, x.data<uint16_t>() + i * k, size_t(k) * 2);
  }
  const HostTensor& w = input(prog_.w);
  packed_w_ = pack_weight(TensorView(w.data<uint16_t>(), DType::bf16, w.shape));
}

TensorMap ProgramRunner::make_outputs() const {
  TensorMap out;
  for (int r : f_.results) {
    const ir::Value& v = f_.value(r);
    std::vector<int64_t> shape = bind_shape(v.type, dims_);
    for (size_t i = 0; i < shape.size(); ++i)
      if (shape[i] < 0)
        throw Error(fmt::format("result '{}' ({}) has dim {} = {} that no input binds", v.name,
                                v.type.str(), i, v.type.dims[i].str()));
    out[v.name] =
        HostTensor::zeros(v.type.dtype, std::move(shape), fmt::format("result '{}'", v.name));
  }
  return out;
}

void ProgramRunner::run_epilogue(const HostTensor* gemm_out, TensorMap& outputs) {
#ifdef TILEJIT_HAVE_LLVM
  using namespace codegen::llvm_backend;
  const ir::Function& e = prog_.epilogue;
  // The iteration space: the bound shape of the largest value, as rows x n.
  int rank = 0;
  std::vector<int64_t> space;
  for (const ir::Value& v : e.values)
    if (space.empty() || v.type.rank() > rank) {
      rank = v.type.rank();
      space = bind_shape(v.type, dims_);
    }
  int64_t rows = 1, n = 1;
  for (int i = 0; i + 1 < rank; ++i) rows *= space[i];
  if (rank >= 1) n = space.back();
  if (rows == 0 || n == 0) return;
  // Per param and result: base address and elements between rows (0: an [N]
  // broadcast over the rows, read or written in place).
  struct Operand {
    uint8_t* base;
    int64_t row_elems, elem;
  };
  auto operand = [&](const ir::TensorType& t, uint8_t* base) {
    const bool full = t.rank() == rank && rank >= 2;
    return Operand{base, full ? n : 0, elem_bytes(t.dtype)};
  };
  std::vector<Operand> ins, outs;
  for (size_t i = 0; i < e.params.size(); ++i) {
    const int src = prog_.epilogue_inputs[i];
    const HostTensor& t = (gemm_out != nullptr && src == prog_.result) ? *gemm_out : input(src);
    ins.push_back(operand(e.value(e.params[i]).type, const_cast<uint8_t*>(t.bytes.data())));
  }
  bool in_place = false;  // an [N] result: written by every row, so one task
  for (size_t i = 0; i < e.results.size(); ++i) {
    HostTensor& t = outputs.at(f_.value(f_.results.at(i)).name);
    outs.push_back(operand(e.value(e.results[i]).type, t.bytes.data()));
    in_place = in_place || (outs.back().row_elems == 0 && rank >= 2);
  }
  const ElementwiseFn fn = epilogue_kernel_.fn<ElementwiseFn>();
  const int64_t chunk = in_place ? rows : std::max<int64_t>(1, 16384 / std::max<int64_t>(n, 1));
  const int64_t tasks = (rows + chunk - 1) / chunk;
  auto task = [&](int64_t t) {
    const int64_t r0 = t * chunk, nr = std::min(chunk, rows - r0);
    std::vector<const void*> p;
    std::vector<void*> r;
    for (const Operand& o : ins) p.push_back(o.base + r0 * o.row_elems * o.elem);
    for (const Operand& o : outs) r.push_back(o.base + r0 * o.row_elems * o.elem);
    const ElementwiseArgs args{p.data(), r.data(), nr, nullptr, nullptr};
    fn(&args);
  };
  if (tasks == 1)
    task(0);
  else
    runtime::parallel_for(tasks, task);
#else
  (void)gemm_out;
  (void)outputs;
  throw Error("ProgramRunner: elementwise ops need the LLVM backend (TILEJIT_WITH_LLVM)");
#endif
}

void ProgramRunner::run(TensorMap& outputs) {
  if (inputs_ == nullptr) throw Error("ProgramRunner::run: set_inputs() first");
  if (ops_) {
    ops_->run(outputs);
    return;
  }
  if (!prog_.has_gemm) {
    run_epilogue(nullptr, outputs);
    return;
  }
  const bool epilogue = !prog_.epilogue.ops.empty();
  const HostTensor& x = input(prog_.x);
  const int64_t m = x.shape[0], k = x.shape[1];
  const TensorView xv = x_strided_.empty()
                            ? TensorView(x.data<uint16_t>(), DType::bf16, {m, k})
                            : TensorView(x_strided_.data(), DType::bf16, {m, k}, {x_ld_, 1});
  HostTensor& y = epilogue ? gemm_out_ : outputs.at(f_.value(prog_.result).name);
  GemmOptions opt;
  if (prog_.bias >= 0) {
    const HostTensor& b = input(prog_.bias);
    opt.bias = TensorView(b.data<uint8_t>(), b.dtype, b.shape);
  }
  opt.act = prog_.spec.act;
  gemm(xv, packed_w_, TensorView(y.bytes.data(), y.dtype, y.shape), opt);
  if (epilogue) run_epilogue(&gemm_out_, outputs);
}

void ProgramRunner::run_for_timing(TensorMap& outputs) {
  if (ops_ && inputs_ != nullptr) return ops_->run_in_place(outputs);
  run(outputs);
}

CheckReport ProgramRunner::check(const TensorMap& outputs) const {
  if (inputs_ == nullptr) throw Error("ProgramRunner::check: set_inputs() first");
  if (ops_) return ops_->check(outputs);
  if (!prog_.epilogue.ops.empty()) return check_chain(outputs);
  const HostTensor& x = input(prog_.x);
  const HostTensor& w = input(prog_.w);
  const HostTensor& y = outputs.at(f_.value(prog_.result).name);
  const int64_t m = x.shape[0], k = x.shape[1], n = w.shape[0];
  const uint16_t* xd = x.data<uint16_t>();
  const uint16_t* wd = w.data<uint16_t>();
  const bool bf16_out = y.dtype == DType::bf16;

  // The reference result before any rounding to the output type: the bound
  // below then covers the JIT's own rounding and nothing of the reference's.
  std::vector<float> ref(static_cast<size_t>(m * n));
  std::vector<double> abs_sum(static_cast<size_t>(m * n)), pre(abs_sum.size());
  runtime::ReferenceGemmArgs a;
  a.ldx = k;
  a.m = 1;
  a.n = n;
  a.k = k;
  if (prog_.bias >= 0) {
    a.bias = input(prog_.bias).bytes.data();
    a.bias_dtype = input(prog_.bias).dtype;
  }
  a.act = prog_.spec.act;
  a.y_dtype = DType::f32;
  a.ldy = n;
  const auto bias_at = [&](int64_t j) -> double {
    if (a.bias == nullptr) return 0;
    return a.bias_dtype == DType::f32
               ? static_cast<const float*>(a.bias)[j]
               : runtime::bf16_to_f32(static_cast<const uint16_t*>(a.bias)[j]);
  };
  // O(M·N·K) in double: rows over the pool.
  runtime::parallel_for(m, [&](int64_t i) {
    runtime::ReferenceGemmArgs row = a;
    row.x = xd + i * k;
    row.y = ref.data() + i * n;
    runtime::reference_gemm(row, [&](int64_t r, int64_t c) { return wd[r * k + c]; });
    for (int64_t j = 0; j < n; ++j) {
      // Σ|x·w| and the pre-activation (bias included) for the bound.
      double s = 0, p = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double t =
            double(runtime::bf16_to_f32(xd[i * k + kk])) * runtime::bf16_to_f32(wd[j * k + kk]);
        s += std::fabs(t);
        p += t;
      }
      abs_sum[i * n + j] = s;
      pre[i * n + j] = p + bias_at(j);
    }
  });

  CheckReport rep;
  rep.reference = "runtime/reference_gemm.h, double accumulation";
  rep.tolerance = fmt::format(
      "L·((K+2)·2⁻²⁴·Σ|x·w| + 2⁻²⁴·|bias|) + 4e-6·max(1,|pre|) + 2⁻²⁴·|ref|{}, K={}, L={} "
      "(runtime/reference_error_bounds.h)",
      bf16_out ? ", then ×(1+2⁻⁸) + 2⁻⁷·|ref|" : "", k, runtime::activation_lipschitz(a.act));
  double worst_ratio = -1;
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = ref[i];
    const double got = bf16_out ? runtime::bf16_to_f32(y.data<uint16_t>()[i]) : y.data<float>()[i];
    const double tol = runtime::gemm_output_bound(a.act, y.dtype, k, abs_sum[i],
                                                  std::fabs(bias_at(i % n)), pre[i], want);
    double err = std::fabs(got - want);
    if (std::isnan(err)) err = INFINITY;
    ++rep.checked;
    if (!(err <= tol)) ++rep.failures;
    rep.max_abs = std::max(rep.max_abs, err);
    rep.max_rel = std::max(rep.max_rel, err / std::max(std::fabs(want), 1e-6));
    if (err / tol > worst_ratio) {
      worst_ratio = err / tol;
      rep.worst_index = {i / n, i % n};
      rep.worst_got = got;
      rep.worst_ref = want;
      rep.worst_tol = tol;
    }
  }
  return rep;
}

// The whole function against a double evaluation: the gemm by
// runtime::reference_gemm (no bias, no activation, f32), then every op of the
// source in double, a bf16 value rounded where it is defined (as the kernels
// do). Each value carries a bound on |got - ref|: the gemm's
// (K+2)·2⁻²⁴·Σ|x·w|; add: the operands' bounds summed; mul: |b|·tol_a +
// |a|·tol_b + tol_a·tol_b; add and mul also + 2⁻²³·|v| (their f32 rounding);
// an activation: its Lipschitz constant (relu 1, silu 1.1, gelu 1.13) times
// it + 4e-6·max(1,|in| + tol_in) (the vector math at its input; none for relu; the constants are
// runtime/reference_error_bounds.h's); a value of dtype bf16: + 2⁻⁷·|v|
// (one ulp: the kernel and the reference may round to neighbours), f16: +
// 2⁻¹⁰·|v| + 2⁻²⁴ (the reference is not rounded).
CheckReport ProgramRunner::check_chain(const TensorMap& outputs) const {
  const ir::Function& f = f_;
  // The iteration space [rows, n].
  std::vector<int64_t> space;
  int rank = -1;
  if (prog_.has_gemm) {
    space = bind_shape(f.value(f.ops.front().result).type, dims_);
    rank = 2;
  } else {
    for (const ir::Value& v : f.values)
      if (v.type.rank() > rank) {
        rank = v.type.rank();
        space = bind_shape(v.type, dims_);
      }
  }
  int64_t rows = 1, n = 1;
  for (int i = 0; i + 1 < rank; ++i) rows *= space[i];
  if (rank >= 1) n = space.back();
  auto index = [&](const ir::TensorType& t, int64_t r, int64_t c) -> int64_t {
    if (t.rank() == rank) return r * n + c;
    return t.rank() == 1 ? c : 0;
  };
  // Only f32, bf16 (and f16 results) have a reference here.
  for (const ir::Value& v : f.values) {
    if (prog_.has_gemm && (v.id == prog_.x || v.id == prog_.w)) continue;
    const DType t = v.type.dtype;
    const bool is_param = std::find(f.params.begin(), f.params.end(), v.id) != f.params.end();
    if (!(t == DType::f32 || t == DType::bf16 || (t == DType::f16 && !is_param)))
      throw Error(fmt::format(
          "check: %{} is {}: the elementwise reference reads and computes f32, bf16 and f16 "
          "values only",
          v.name, v.type.str()));
  }

  int64_t k = 0;
  std::vector<float> gref;
  std::vector<double> abs_sum;
  if (prog_.has_gemm) {
    const HostTensor& x = input(prog_.x);
    const HostTensor& w = input(prog_.w);
    k = x.shape[1];
    const uint16_t* xd = x.data<uint16_t>();
    const uint16_t* wd = w.data<uint16_t>();
    gref.resize(static_cast<size_t>(rows * n));
    abs_sum.resize(static_cast<size_t>(rows * n));
    runtime::ReferenceGemmArgs a;
    a.ldx = k;
    a.m = 1;
    a.n = n;
    a.k = k;
    a.act = Activation::none;
    a.y_dtype = DType::f32;
    a.ldy = n;
    runtime::parallel_for(rows, [&](int64_t i) {
      runtime::ReferenceGemmArgs row = a;
      row.x = xd + i * k;
      row.y = gref.data() + i * n;
      runtime::reference_gemm(row, [&](int64_t r, int64_t c) { return wd[r * k + c]; });
      for (int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          s += std::fabs(double(runtime::bf16_to_f32(xd[i * k + kk])) *
                         runtime::bf16_to_f32(wd[j * k + kk]));
        abs_sum[i * n + j] = s;
      }
    });
  }

  auto read = [](const HostTensor& t, int64_t i) -> double {
    return t.dtype == DType::bf16 ? double(runtime::bf16_to_f32(t.data<uint16_t>()[i]))
                                  : double(t.data<float>()[i]);
  };
  const size_t nres = f.results.size();
  // Per result, per element of the space: reference and bound.
  std::vector<std::vector<double>> want(nres), tol(nres);
  for (size_t q = 0; q < nres; ++q) {
    want[q].assign(static_cast<size_t>(rows * n), 0);
    tol[q].assign(static_cast<size_t>(rows * n), 0);
  }
  runtime::parallel_for(rows, [&](int64_t r) {
    std::vector<double> val(f.values.size()), err(f.values.size());
    for (int64_t c = 0; c < n; ++c) {
      for (int p : f.params) {
        if (prog_.has_gemm && (p == prog_.x || p == prog_.w)) continue;
        val[p] = read(input(p), index(f.value(p).type, r, c));
        err[p] = 0;
      }
      for (const ir::Op& op : f.ops) {
        const int o = op.result;
        double v = 0, t = 0;
        const double a = op.kind == ir::OpKind::gemm ? 0 : val[op.operands.at(0)];
        const double ta = op.kind == ir::OpKind::gemm ? 0 : err[op.operands.at(0)];
        switch (op.kind) {
          case ir::OpKind::gemm:
            v = gref[r * n + c];
            t = runtime::dot_bound(k, abs_sum[r * n + c]);
            break;
          case ir::OpKind::add: {
            const double b = val[op.operands.at(1)], tb = err[op.operands.at(1)];
            v = a + b;
            t = ta + tb + std::ldexp(std::fabs(v), -23);
            break;
          }
          case ir::OpKind::mul: {
            const double b = val[op.operands.at(1)], tb = err[op.operands.at(1)];
            v = a * b;
            t = ta * std::fabs(b) + tb * std::fabs(a) + ta * tb + std::ldexp(std::fabs(v), -23);
            break;
          }
          case ir::OpKind::relu:
          case ir::OpKind::silu:
          case ir::OpKind::gelu_tanh:
          case ir::OpKind::gelu_erf: {
            const Activation act = ir::activation_of(op.kind);
            v = runtime::reference_activation(act, a);
            t = runtime::activation_lipschitz(act) * ta +
                runtime::activation_math_error(act, std::fabs(a) + ta);
            break;
          }
          default:  // cast
            v = a;
            t = ta;
            break;
        }
        switch (f.value(o).type.dtype) {
          case DType::bf16:
            v = runtime::bf16_to_f32(runtime::f32_to_bf16(static_cast<float>(v)));
            t += std::ldexp(std::fabs(v), -7);
            break;
          case DType::f16:
            t += std::ldexp(std::fabs(v), -10) + std::ldexp(1.0, -24);
            break;
          default:
            if (op.kind == ir::OpKind::cast) v = static_cast<float>(v);
            break;
        }
        val[o] = v;
        err[o] = t;
      }
      for (size_t q = 0; q < nres; ++q) {
        want[q][r * n + c] = val[f.results[q]];
        tol[q][r * n + c] = err[f.results[q]];
      }
    }
  });

  CheckReport rep;
  rep.reference =
      prog_.has_gemm ? "runtime/reference_gemm.h, then each op in double" : "each op in double";
  const std::string chain =
      "add: + 2⁻²³·|v|; mul: |b|·tol_a + |a|·tol_b + 2⁻²³·|v|; relu: ×1; silu: ×1.1, gelu: "
      "×1.13, + 4e-6·max(1,|in|+tol_in); each bf16 value: + 2⁻⁷·|v|";
  rep.tolerance = prog_.has_gemm
                      ? fmt::format(
                            "(K+2)·2⁻²⁴·Σ|x·w| for the gemm, K={}, carried through the "
                            "chain ({})",
                            k, chain)
                      : fmt::format("0 for the inputs, carried through the chain ({})", chain);
  double worst_ratio = -1;
  for (size_t q = 0; q < nres; ++q) {
    const ir::TensorType& rt = f.value(f.results[q]).type;
    const HostTensor& y = outputs.at(f.value(f.results[q]).name);
    if (y.dtype != DType::f32 && y.dtype != DType::bf16)
      throw Error(fmt::format("check: result %{} is {}: compared only as f32 or bf16",
                              f.value(f.results[q]).name, rt.str()));
    const bool bcast = rt.rank() < rank;  // [N] (or a scalar): row 0 holds it
    for (int64_t r = 0; r < (bcast ? 1 : rows); ++r)
      for (int64_t c = 0; c < (rt.rank() == 0 ? 1 : n); ++c) {
        const int64_t i = r * n + c;
        const double wv = want[q][i];
        const double got = read(y, index(rt, r, c));
        const double tl = tol[q][i];
        double e = std::fabs(got - wv);
        if (std::isnan(e)) e = INFINITY;
        ++rep.checked;
        if (!(e <= tl)) ++rep.failures;
        rep.max_abs = std::max(rep.max_abs, e);
        rep.max_rel = std::max(rep.max_rel, e / std::max(std::fabs(wv), 1e-6));
        const double ratio = tl > 0 ? e / tl : (e > 0 ? INFINITY : 0);
        if (ratio > worst_ratio) {
          worst_ratio = ratio;
          std::vector<int64_t> idx;
          int64_t flat = index(rt, r, c);
          for (int d = rt.rank() - 1; d >= 0; --d) {
            const int64_t sz = std::max<int64_t>(1, y.shape[d]);
            idx.insert(idx.begin(), flat % sz);
            flat /= sz;
          }
          rep.worst_index = idx;
          rep.worst_got = got;
          rep.worst_ref = wv;
          rep.worst_tol = tl;
        }
      }
  }
  return rep;
}

double ProgramRunner::flops() const {
  if (inputs_ == nullptr) return 0;
  if (ops_) return ops_->work().flops;
  if (!prog_.has_gemm)
    throw Error(fmt::format(
        "@{} has no gemm: `tilejit bench` reports gemm GFLOP/s and a gemm plan, which an "
        "elementwise program has not (`tilejit run` runs it)",
        f_.name));
  const HostTensor& x = input(prog_.x);
  return 2.0 * double(x.shape[0]) * double(prog_.spec.n) * double(prog_.spec.k);
}

}  // namespace tilejit::ops
