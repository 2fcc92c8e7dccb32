// Checking a gemm or elementwise program: ProgramRunner::check and check_chain.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "codegen/gemm_plan.h"
#include "ops/quant_weight.h"
#include "runtime/bf16.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_quant.h"
#include "runtime/thread_pool.h"
#include "tools/program/program_runner.h"
#include "tools/program/reference_rows.h"

namespace tilejit::tools {

CheckReport ProgramRunner::check(const TensorMap& outputs) const {
  if (inputs_ == nullptr) throw Error("ProgramRunner::check: set_inputs() first");
  if (ops_) return ops_->check(outputs);
  if (!prog_.epilogue.ops.empty()) return check_chain(outputs);
  if (prog_.quantized()) return check_quantized(outputs);
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
      "L·((K+2)·2⁻²⁴·Σ|x·w| + 2⁻²⁴·|bias|) + 4e-6·max(1,|pre|) + 2⁻²⁴·|ref|{}, K={}, L={}; L·e is "
      "runtime::activation_error "
      "(runtime/reference_error_bounds.h)",
      bf16_out ? ", then ×(1+2⁻⁸) + 2⁻⁷·|ref|" : "", k, runtime::activation_slope_text(a.act));
  for (int64_t i = 0; i < m * n; ++i) {
    const double want = ref[i];
    const double got = y.at(i);
    const double tol = runtime::gemm_output_bound(
        a.act, y.dtype, k, abs_sum[i], std::fabs(reference_bias_at(a, i % n)), pre[i], want);
    if (rep.add(got, want, tol)) rep.worst_index = {i / n, i % n};
  }
  return rep;
}

// A quantized gemm against the exact dequantized weights, decoded here from
// the checkpoint tensors (in double: a code times an f32 / f16 / bf16 scale
// is exact), or for W8A8 against exact integer sums of the codes the
// kernels' activation quantizer makes (runtime::reference_act_quant_row), as
// tests/quant_gemm_test.cpp does. Bounds: runtime/reference_error_bounds.h's
// gemm_output_bound + dequant_weight_bound (fp8, int4; the latter off the
// scalar path, which computes in double) and int8_output_bound (W8A8).
CheckReport ProgramRunner::check_quantized(const TensorMap& outputs) const {
  const ir::Op& g = f_.ops.front();
  const HostTensor& x = input(prog_.x);
  const HostTensor& wq = input(prog_.w);
  const HostTensor& s = input(prog_.scale);
  const HostTensor& y = outputs.at(f_.value(prog_.result).name);
  const ir::TensorType& wt = f_.value(prog_.w).type;
  const int64_t m = x.shape[0], n = wt.dims.at(0).value, k = wt.dims.at(1).value;
  const bool bf16_out = y.dtype == DType::bf16;
  const Activation act = prog_.spec.act;
  const uint16_t* xd = x.data<uint16_t>();
  runtime::ReferenceGemmArgs ba;
  if (prog_.bias >= 0) {
    ba.bias = input(prog_.bias).bytes.data();
    ba.bias_dtype = input(prog_.bias).dtype;
  }
  auto got_at = [&](int64_t i) -> double { return y.at(i); };
  CheckReport rep;

  if (prog_.format == WeightFormat::int8) {
    const ir::Attrs& a = g.attrs;
    const GemmOptions opt = gemm_options();
    const runtime::ActQuantRule rule = ops::act_quant_rule(ops::act_quant_mode(opt.act_quant));
    const auto* w8 = wq.data<int8_t>();
    const bool per_tensor = s.shape.at(0) == 1;
    std::vector<double> want(static_cast<size_t>(m * n)), tol(want.size());
    runtime::parallel_for(m, [&](int64_t i) {
      std::vector<uint8_t> q(static_cast<size_t>(k));
      float sa = 1;
      int32_t za = 0;
      runtime::reference_act_quant_row(rule, xd + i * k, k, k, ops::fixed_inv_scale(opt),
                                       opt.act_scale, opt.act_zero_point, q.data(), &sa, &za);
      for (int64_t j = 0; j < n; ++j) {
        int64_t acc = 0, wabs = 0;
        for (int64_t c = 0; c < k; ++c) {
          const int64_t t = int64_t(q[c] - za) * w8[j * k + c];
          acc += t;
          wabs += t < 0 ? -t : t;
        }
        const double sw = s.data<float>()[per_tensor ? 0 : j];
        const double b = reference_bias_at(ba, j);
        const double pre = double(acc) * sa * sw + b;
        const double ref = runtime::reference_activation(act, pre);
        want[i * n + j] = ref;
        tol[i * n + j] = runtime::int8_output_bound(act, y.dtype, double(wabs) * sa * sw,
                                                    std::fabs(b), pre, ref);
      }
    });
    (void)a;
    rep.reference =
        "exact int32 sums of the u8 codes of runtime::reference_act_quant_row and the i8 "
        "weights, times both scales, in double";
    rep.tolerance = fmt::format(
        "int8_output_bound: L·4·2⁻²⁴·(Σ|q·w|·s_x·s_w + |bias|) + 4e-6·max(1,|pre|) + "
        "2⁻²⁴·|ref|{}, K={}, L={}; L·e is runtime::activation_error "
        "(runtime/reference_error_bounds.h)",
        bf16_out ? ", then ×(1+2⁻⁸) + 2⁻⁷·|ref|" : "", k, runtime::activation_slope_text(act));
    for (int64_t i = 0; i < m * n; ++i)
      if (rep.add(got_at(i), want[i], tol[i])) rep.worst_index = {i / n, i % n};
    return rep;
  }

  // The exact logical weight w[n, k] in double.
  std::vector<double> w(static_cast<size_t>(n * k));
  QuantMatrix qm;
  qm.format = prog_.format;
  qm.n = n;
  qm.k = k;
  qm.w = wq.bytes.data();
  qm.scale = s.bytes.data();
  qm.scale_dtype = s.dtype;
  qm.scale_shape = s.shape;
  qm.zero = prog_.zero >= 0 ? input(prog_.zero).data<int32_t>() : nullptr;
  qm.g_idx = prog_.g_idx >= 0 ? input(prog_.g_idx).data<int32_t>() : nullptr;
  qm.block_n = g.attrs.get_int("block_n").value_or(0);
  qm.block_k = g.attrs.get_int("block_k").value_or(0);
  qm.group_size = g.attrs.get_int("group_size").value_or(128);
  qm.gptq_v2 = g.attrs.get_bool("gptq_v2").value_or(false);
  dequantize_exact(qm, w.data());
  // int4 on the W4A8 route (the library's own choice for this path and M):
  // x quantized per row, half a code per element, then the group folds.
  const GemmOptions opt = gemm_options();
  // The library's own rules (ops/quant_weight.h): the automatic route keeps
  // an x holding ±Inf on W4A16; a requested w4a8 quantizes a row holding a
  // non-finite value to NaN (W8A8's rule).
  const bool x_inf = ops::fused_int4_form(prog_.format) && ops::bf16_rows_have_inf(xd, k, m, k);
  const bool w4a8 =
      ops::w4a8_route(prog_.format, k, opt, ops::quant_rows_isa(cpu_info().isa, m), m) &&
      ops::w4a8_keeps_infinities(opt.int4_route, x_inf);
  const int64_t groups = s.shape.at(0);  // int4 scales are [G, N]
  const bool dequantized = cpu_info().isa != Isa::scalar && !w4a8;
  std::vector<double> want(static_cast<size_t>(m * n)), tol(want.size());
  runtime::parallel_for(m, [&](int64_t i) {
    if (w4a8) {
      bool finite = true;
      for (int64_t c = 0; c < k; ++c)
        finite = finite && std::isfinite(runtime::bf16_to_f32(xd[i * k + c]));
      if (!finite) {  // quantized to a NaN scale: the whole row is NaN
        for (int64_t j = 0; j < n; ++j) want[i * n + j] = NAN, tol[i * n + j] = 0;
        return;
      }
    }
    float sa = 0;
    if (w4a8) {
      std::vector<uint8_t> q(static_cast<size_t>(k));
      int32_t za = 0;
      runtime::reference_act_quant_row(ops::act_quant_rule(ops::act_quant_mode(opt.act_quant)),
                                       xd + i * k, k, k, ops::fixed_inv_scale(opt), opt.act_scale,
                                       opt.act_zero_point, q.data(), &sa, &za);
    }
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0, sum_abs = 0, w_abs = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double t = double(runtime::bf16_to_f32(xd[i * k + c])) * w[j * k + c];
        acc += t;
        sum_abs += std::fabs(t);
        w_abs += std::fabs(w[j * k + c]);
      }
      const double b = reference_bias_at(ba, j);
      const double pre = acc + b;
      const double ref = runtime::reference_activation(act, pre);
      want[i * n + j] = ref;
      double t = runtime::gemm_output_bound(act, y.dtype, k, sum_abs, std::fabs(b), pre, ref);
      // The kernels round each w to bf16 (tests/quant_gemm_test.cpp: ×1.01
      // for the bf16 output's rounding of the moved value).
      if (dequantized)
        t += runtime::dequant_weight_bound(act, sum_abs, pre) * (bf16_out ? 1.01 : 1);
      if (w4a8)
        t += runtime::w4a8_activation_bound(act, sa, w_abs, pre) +
             runtime::w4a8_output_bound(act, y.dtype, groups, sum_abs + 0.51 * sa * w_abs,
                                        std::fabs(b), pre, ref);
      tol[i * n + j] = t;
    }
  });
  rep.reference =
      "the exact dequantized weights (decoded from the checkpoint tensors), double "
      "accumulation";
  rep.tolerance = fmt::format(
      "gemm_output_bound (L·((K+2)·2⁻²⁴·Σ|x·w| + 2⁻²⁴·|bias|) + 4e-6·max(1,|pre|) + "
      "2⁻²⁴·|ref|{}){}, K={}, L={}; L·e is runtime::activation_error "
      "(runtime/reference_error_bounds.h)",
      bf16_out ? ", then ×(1+2⁻⁸) + 2⁻⁷·|ref|" : "",
      dequantized ? " + dequant_weight_bound (L·(2⁻⁸ + 2⁻²³)·Σ|x·w|: w rounded to bf16)"
      : w4a8      ? " + W4A8 (x quantized per row): w4a8_activation_bound (L·0.51·s_x·Σ|w|) + "
                    "w4a8_output_bound ((G+4)·2⁻²⁴ of the group sums)"
                  : "",
      k, runtime::activation_slope_text(act));
  for (int64_t i = 0; i < m * n; ++i)
    if (rep.add(got_at(i), want[i], tol[i])) rep.worst_index = {i / n, i % n};
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
  // Only f32, bf16 and f16 values have a reference here.
  for (const ir::Value& v : f.values) {
    if (prog_.has_gemm && (v.id == prog_.x || v.id == prog_.w)) continue;
    const DType t = v.type.dtype;
    if (!(t == DType::f32 || t == DType::bf16 || t == DType::f16))
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
        val[p] = input(p).at(index(f.value(p).type, r, c));
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
          case ir::OpKind::gelu_erf:
          case ir::OpKind::relu2: {
            const Activation act = ir::activation_of(op.kind);
            v = runtime::reference_activation(act, a);
            t = runtime::activation_error(act, a, ta) +
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
            // f32 values are f32 (the IR's rule): an overflow is ±Inf and an
            // underflow 0 here too, as in the kernels (a relu2 of 2e19 is +Inf).
            v = static_cast<float>(v);
            break;
        }
        // A value made from non-finite operands, or one that is itself ±Inf /
        // NaN, follows IEEE on every path: exact (its bound was Inf or NaN,
        // and relu(−Inf) = 0 came with a NaN bound that failed it).
        bool exact = !std::isfinite(v);
        if (op.kind != ir::OpKind::gemm)
          for (int operand : op.operands) exact = exact || !std::isfinite(val[operand]);
        val[o] = v;
        err[o] = exact ? 0.0 : t;
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
    const bool bcast = rt.rank() < rank;  // [N] (or a scalar): row 0 holds it
    for (int64_t r = 0; r < (bcast ? 1 : rows); ++r)
      for (int64_t c = 0; c < (rt.rank() == 0 ? 1 : n); ++c) {
        const int64_t i = r * n + c;
        if (rep.add(y.at(index(rt, r, c)), want[q][i], tol[q][i]))
          rep.worst_index = unflatten(index(rt, r, c), y.shape);
      }
  }
  return rep;
}

}  // namespace tilejit::tools
