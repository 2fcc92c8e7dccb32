#include "ops/program_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <tuple>

#include "codegen/gemm_lowering.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "ops/tensor_checks.h"
#include "runtime/bf16.h"
#include "runtime/reference_gemm.h"
#include "runtime/thread_pool.h"

namespace tilejit::ops {
namespace {

constexpr const char* kLowered =
    "today a program must be a gemm chain: gemm → add bias → activation → cast";

int64_t elem_bytes(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

bool is_later_family(ir::OpKind k) {
  return k == ir::OpKind::attention || k == ir::OpKind::rope || k == ir::OpKind::moe;
}

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

HostTensor HostTensor::zeros(DType dtype, std::vector<int64_t> shape) {
  HostTensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.assign(static_cast<size_t>(t.numel() * elem_bytes(dtype)), 0);
  return t;
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

GemmProgram match_program(const ir::Function& f) {
  for (const ir::Op& op : f.ops)
    if (is_later_family(op.kind))
      throw Error(fmt::format(
          "no lowering for op '{}' yet ({}): attention, rope and moe get theirs in later "
          "issues; {}",
          ir::name(op.kind), ir::print(f, op), kLowered));
  if (f.ops.empty())
    throw Error(fmt::format("no lowering for @{}: it has no ops; {}", f.name, kLowered));
  if (f.ops.front().kind != ir::OpKind::gemm)
    throw Error(fmt::format(
        "no lowering for op '{}' yet ({}): elementwise ops run only as a gemm's fused epilogue; {}",
        ir::name(f.ops.front().kind), ir::print(f, f.ops.front()), kLowered));

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
  p.spec = codegen::match_gemm(p.lowered);
  if (p.spec.bias != codegen::BiasKind::none) p.bias = f.ops.at(1).operands.at(1);
  p.result = f.results.at(0);
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
    // Mirrors the task split of ops/gemm.cpp: M chunks of ~256 rows; K is
    // chunked only in tasks that hold more than one M block.
    const int64_t mr = plan.mr;
    const int64_t m_blocks = (*m + mr - 1) / mr;
    const int64_t chunk_blocks = std::max<int64_t>(1, 256 / mr);
    for (int64_t b0 = 0; b0 < m_blocks; b0 += chunk_blocks) {
      const int64_t b1 = std::min(m_blocks, b0 + chunk_blocks);
      const int64_t k_chunks = b1 - b0 > 1 ? plan.k_chunks : 1;
      for (int64_t kc = 0; kc < k_chunks; ++kc) {
        const Chunk c = k_chunks == 1        ? Chunk::whole
                        : kc == 0            ? Chunk::first
                        : kc == k_chunks - 1 ? Chunk::last
                                             : Chunk::middle;
        // Blocks of one task share a row count except the last block of M.
        add(c, static_cast<int>(std::min<int64_t>(mr, *m - b0 * mr)));
        add(c, static_cast<int>(std::min<int64_t>(mr, *m - (b1 - 1) * mr)));
      }
    }
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
  prog_ = match_program(f_);
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
    if (static_cast<int64_t>(t.bytes.size()) != t.numel() * elem_bytes(t.dtype))
      throw Error(fmt::format("input '{}' holds {} bytes; its shape {} needs {}", v.name,
                              t.bytes.size(), shape_str(t.shape), t.numel() * elem_bytes(t.dtype)));
  }
  inputs_ = &inputs;
  dims_ = std::move(dims);

  // x at the IR's static row stride, when it has one wider than K: the
  // kernels then read rows of a wider buffer, as the program says.
  const HostTensor& x = input(prog_.x);
  const ir::Layout& xl = f_.value(prog_.x).type.layout;
  x_strided_.clear();
  const int64_t m = x.shape[0], k = x.shape[1];
  if (!xl.strides.empty() && xl.strides[0] && *xl.strides[0] > k) {
    const int64_t ld = x_ld_ = *xl.strides[0];
    x_strided_.assign(static_cast<size_t>(m * ld), 0);
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
    out[v.name] = HostTensor::zeros(v.type.dtype, std::move(shape));
  }
  return out;
}

void ProgramRunner::run(TensorMap& outputs) {
  if (inputs_ == nullptr) throw Error("ProgramRunner::run: set_inputs() first");
  const HostTensor& x = input(prog_.x);
  const int64_t m = x.shape[0], k = x.shape[1];
  const TensorView xv = x_strided_.empty()
                            ? TensorView(x.data<uint16_t>(), DType::bf16, {m, k})
                            : TensorView(x_strided_.data(), DType::bf16, {m, k}, {x_ld_, 1});
  HostTensor& y = outputs.at(f_.value(prog_.result).name);
  GemmOptions opt;
  if (prog_.bias >= 0) {
    const HostTensor& b = input(prog_.bias);
    opt.bias = TensorView(b.data<uint8_t>(), b.dtype, b.shape);
  }
  opt.act = prog_.spec.act;
  gemm(xv, packed_w_, TensorView(y.bytes.data(), y.dtype, y.shape), opt);
}

CheckReport ProgramRunner::check(const TensorMap& outputs) const {
  if (inputs_ == nullptr) throw Error("ProgramRunner::check: set_inputs() first");
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
  std::vector<double> abs_sum(static_cast<size_t>(m * n));
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
  // O(M·N·K) in double: rows over the pool.
  runtime::parallel_for(m, [&](int64_t i) {
    runtime::ReferenceGemmArgs row = a;
    row.x = xd + i * k;
    row.y = ref.data() + i * n;
    runtime::reference_gemm(row, [&](int64_t r, int64_t c) { return wd[r * k + c]; });
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        s += std::fabs(double(runtime::bf16_to_f32(xd[i * k + kk])) *
                       runtime::bf16_to_f32(wd[j * k + kk]));
      abs_sum[i * n + j] = s;
    }
  });

  CheckReport rep;
  rep.tolerance = fmt::format("{}(K+2)·2⁻²⁴·Σ|x·w| + 4e-6·max(1,|ref|), K={}",
                              bf16_out ? "2⁻⁷·|ref| + " : "", k);
  double worst_ratio = -1;
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = ref[i];
    const double got = bf16_out ? runtime::bf16_to_f32(y.data<uint16_t>()[i]) : y.data<float>()[i];
    const double tol = (bf16_out ? std::ldexp(std::fabs(want), -7) : 0.0) +
                       double(k + 2) * std::ldexp(abs_sum[i], -24) +
                       4e-6 * std::max(1.0, std::fabs(want));
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

double ProgramRunner::flops() const {
  if (inputs_ == nullptr) return 0;
  const HostTensor& x = input(prog_.x);
  return 2.0 * double(x.shape[0]) * double(prog_.spec.n) * double(prog_.spec.k);
}

}  // namespace tilejit::ops
