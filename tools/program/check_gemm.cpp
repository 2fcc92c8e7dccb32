// Checking a gemm or elementwise program: ProgramRunner::check and check_chain.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/thread_pool.h"
#include "tools/program/program_runner.h"
#include "tools/program/reference_rows.h"

namespace tilejit::tools {

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
  a.n = n;
  a.k = k;
  if (prog_.bias >= 0) {
    a.bias = input(prog_.bias).bytes.data();
    a.bias_dtype = input(prog_.bias).dtype;
  }
  a.act = prog_.spec.act;
  reference_gemm_rows(a, xd, wd, m, ref.data(), abs_sum.data(), pre.data());

  CheckReport rep;
  rep.reference = "runtime/reference_gemm.h, double accumulation";
  rep.tolerance = fmt::format(
      "L·((K+2)·2⁻²⁴·Σ|x·w| + 2⁻²⁴·|bias|) + 4e-6·max(1,|pre|) + 2⁻²⁴·|ref|{}, K={}, L={} "
      "(runtime/reference_error_bounds.h)",
      bf16_out ? ", then ×(1+2⁻⁸) + 2⁻⁷·|ref|" : "", k, runtime::activation_lipschitz(a.act));
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = ref[i];
    const double got = bf16_out ? runtime::bf16_to_f32(y.data<uint16_t>()[i]) : y.data<float>()[i];
    const double tol = runtime::gemm_output_bound(
        a.act, y.dtype, k, abs_sum[i], std::fabs(reference_bias_at(a, i % n)), pre[i], want);
    if (rep.add(got, want, tol)) rep.worst_index = {i / n, i % n};
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
    a.n = n;
    a.k = k;
    reference_gemm_rows(a, xd, wd, rows, gref.data(), abs_sum.data());
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
        if (rep.add(read(y, index(rt, r, c)), want[q][i], tol[q][i]))
          rep.worst_index = unflatten(index(rt, r, c), y.shape);
      }
  }
  return rep;
}

}  // namespace tilejit::tools
