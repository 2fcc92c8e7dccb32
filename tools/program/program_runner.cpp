#include "tools/program/program_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "codegen/llvm/llvm_elementwise.h"
#include "ir/verifier.h"
#include "jit/registry.h"
#include "runtime/thread_pool.h"

namespace tilejit::tools {

ProgramRunner::ProgramRunner(ir::Function f) : f_(std::move(f)) {
  ir::verify(f_);
  if (has_operator_ops(f_)) {
    ops_ = std::make_unique<OperatorRunner>(f_, match_operator_program(f_));
    return;
  }
  prog_ = match_program(f_, /*allow_elementwise=*/true);
  if (!prog_.epilogue.ops.empty()) epilogue_kernel_ = &jit::get_elementwise(prog_.epilogue);
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
    // A u4 weight or zero point is held as its checkpoint's int32 tensor, an
    // f4e2m1 weight as its code bytes.
    const std::optional<CheckpointStorage> stored = checkpoint_storage(f_, p);
    const DType want = stored ? stored->dtype : v.type.dtype;
    if (t.dtype != want)
      throw Error(fmt::format("input '{}' is {}; expected {} ({}{}{})", v.name, dtype_name(t.dtype),
                              dtype_name(want), v.type.str(), stored ? ": its " : "",
                              stored ? stored->what : ""));
    if (stored && t.shape != stored->shape)
      throw Error(fmt::format("input '{}' has shape {}; expected {} (the {} of {})", v.name,
                              shape_str(t.shape), shape_str(stored->shape), stored->what,
                              v.type.str()));
    bool ok = stored || static_cast<int>(t.shape.size()) == v.type.rank();
    for (int i = 0; ok && !stored && i < v.type.rank(); ++i)
      ok = !v.type.dims[i].is_static() || v.type.dims[i].value == t.shape[i];
    if (!ok)
      throw Error(fmt::format("input '{}' has shape {}; expected {} ({})", v.name,
                              shape_str(t.shape), dims_str(v.type), v.type.str()));
    if (stored) {
      const int64_t need =
          dense_bytes(t.shape, elem_bytes(stored->dtype), fmt::format("input '{}'", v.name));
      if (static_cast<int64_t>(t.bytes.size()) != need)
        throw Error(fmt::format("input '{}' holds {} bytes; its shape {} needs {}", v.name,
                                t.bytes.size(), shape_str(t.shape), need));
      continue;
    }
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
  if (prog_.quantized()) {
    packed_w_ = pack_quantized();
    return;
  }
  packed_w_ = pack_weight(TensorView(w.data<uint16_t>(), DType::bf16, w.shape));
}

PackedWeight ProgramRunner::pack_quantized() const {
  const ir::Op& g = f_.ops.front();
  const HostTensor& w = input(prog_.w);
  const HostTensor& s = input(prog_.scale);
  const ir::TensorType& wt = f_.value(prog_.w).type;
  const int64_t n = wt.dims.at(0).value, k = wt.dims.at(1).value;
  const TensorView sv(s.data<uint8_t>(), s.dtype, s.shape);
  switch (prog_.format) {
    case WeightFormat::int8:
      return pack_weight(Int8Weight{TensorView(w.data<uint8_t>(), DType::i8, {n, k}), sv});
    case WeightFormat::fp8_e4m3: {
      Fp8Weight q{TensorView(w.data<uint8_t>(), DType::f8e4m3, {n, k}), sv};
      q.block_n = g.attrs.get_int("block_n").value_or(0);
      q.block_k = g.attrs.get_int("block_k").value_or(0);
      return pack_weight(q);
    }
    case WeightFormat::mxfp4: {
      Mxfp4Weight q{TensorView(w.data<uint8_t>(), DType::u8, w.shape), sv};
      q.k = k;
      return pack_weight(q);
    }
    default: {
      Int4Weight q;
      q.format = prog_.format == WeightFormat::int4_awq ? Int4Format::awq : Int4Format::gptq;
      q.qweight = TensorView(w.data<uint8_t>(), DType::i32, w.shape);
      q.scales = sv;
      if (prog_.zero >= 0) {
        const HostTensor& z = input(prog_.zero);
        q.qzeros = TensorView(z.data<uint8_t>(), DType::i32, z.shape);
      }
      if (prog_.g_idx >= 0) {
        const HostTensor& gi = input(prog_.g_idx);
        q.g_idx = TensorView(gi.data<uint8_t>(), DType::i32, gi.shape);
      }
      q.bits = static_cast<int>(g.attrs.get_int("bits").value_or(4));
      q.group_size = g.attrs.get_int("group_size").value_or(128);
      q.gptq_v2 = g.attrs.get_bool("gptq_v2").value_or(false);
      q.n = n;
      q.k = k;
      return pack_weight(q);
    }
  }
}

GemmOptions ProgramRunner::gemm_options() const {
  GemmOptions opt;
  if (prog_.bias >= 0) {
    const HostTensor& b = input(prog_.bias);
    opt.bias = TensorView(b.data<uint8_t>(), b.dtype, b.shape);
  }
  opt.act = prog_.spec.act;
  if (prog_.format == WeightFormat::int8) {
    const ir::Attrs& a = f_.ops.front().attrs;
    const std::string mode = a.get_string("act_quant").value_or("dynamic_sym");
    opt.act_quant = mode == "fixed"          ? ActQuant::fixed
                    : mode == "dynamic_asym" ? ActQuant::dynamic_asym
                                             : ActQuant::dynamic_sym;
    opt.act_scale = static_cast<float>(a.get_double("act_scale").value_or(0));
    opt.act_zero_point = static_cast<int>(a.get_int("act_zero_point").value_or(128));
  }
  opt.int4_route = prog_.int4_route;
  return opt;
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
  const ElementwiseFn fn = epilogue_kernel_->entry<ElementwiseFn>();
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
  const GemmOptions opt = gemm_options();
  gemm(xv, packed_w_, TensorView(y.bytes.data(), y.dtype, y.shape), opt);
  if (epilogue) run_epilogue(&gemm_out_, outputs);
}

void ProgramRunner::run_for_timing(TensorMap& outputs) {
  if (ops_ && inputs_ != nullptr) return ops_->run_in_place(outputs);
  run(outputs);
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

}  // namespace tilejit::tools
