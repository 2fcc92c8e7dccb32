// The row-wise ops: rms_norm, fused_add_rms_norm (in place on residual, out
// may be x), layer_norm, fused_add_layer_norm, rms_norm_gated, act_and_mul.
#include <pybind11/pybind11.h>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {

namespace {
NormOptions norm_options(float eps, bool plus_one) {
  NormOptions o;
  o.eps = eps;
  o.weight_plus_one = plus_one;
  return o;
}
}  // namespace

void bind_rowwise(py::module_& m) {
  m.def("rms_norm", [](const py::handle& x, const py::handle& weight, const py::handle& out,
                       float eps, bool plus_one, const py::handle& dtype) {
    const StorageAs as{parse_dtype_override(dtype)};
    const NormOptions o = norm_options(eps, plus_one);
    DlpackTensor tx(x, "x", as), to(out, "out", as);
    std::optional<DlpackTensor> tw = optional_tensor(weight, "weight", as);
    GilRelease release;
    rms_norm(tx.view(), tw ? &tw->view() : nullptr, to.view(), o);
  });
  m.def("fused_add_rms_norm",
        [](const py::handle& x, const py::handle& residual, const py::handle& weight,
           const py::handle& out, float eps, bool plus_one, const py::handle& dtype) {
          const StorageAs as{parse_dtype_override(dtype)};
          const NormOptions o = norm_options(eps, plus_one);
          DlpackTensor tx(x, "x", as), tr(residual, "residual", as), to(out, "out", as);
          std::optional<DlpackTensor> tw = optional_tensor(weight, "weight", as);
          GilRelease release;
          fused_add_rms_norm(tx.view(), tr.view(), tw ? &tw->view() : nullptr, to.view(), o);
        });
  m.def("layer_norm", [](const py::handle& x, const py::handle& weight, const py::handle& bias,
                         const py::handle& out, float eps, bool plus_one, const py::handle& dtype) {
    const StorageAs as{parse_dtype_override(dtype)};
    const NormOptions o = norm_options(eps, plus_one);
    DlpackTensor tx(x, "x", as), to(out, "out", as);
    std::optional<DlpackTensor> tw = optional_tensor(weight, "weight", as);
    std::optional<DlpackTensor> tb = optional_tensor(bias, "bias", as);
    GilRelease release;
    layer_norm(tx.view(), tw ? &tw->view() : nullptr, tb ? &tb->view() : nullptr, to.view(), o);
  });
  m.def("fused_add_layer_norm",
        [](const py::handle& x, const py::handle& residual, const py::handle& weight,
           const py::handle& bias, const py::handle& out, float eps, bool plus_one,
           const py::handle& dtype) {
          const StorageAs as{parse_dtype_override(dtype)};
          const NormOptions o = norm_options(eps, plus_one);
          DlpackTensor tx(x, "x", as), tr(residual, "residual", as), to(out, "out", as);
          std::optional<DlpackTensor> tw = optional_tensor(weight, "weight", as);
          std::optional<DlpackTensor> tb = optional_tensor(bias, "bias", as);
          GilRelease release;
          fused_add_layer_norm(tx.view(), tr.view(), tw ? &tw->view() : nullptr,
                               tb ? &tb->view() : nullptr, to.view(), o);
        });
  m.def("rms_norm_gated", [](const py::handle& x, const py::handle& gate, const py::handle& weight,
                             const py::handle& out, float eps, bool plus_one, const py::handle& act,
                             bool norm_before_gate, const py::handle& dtype) {
    const StorageAs as{parse_dtype_override(dtype)};
    GatedNormOptions o;
    o.norm = norm_options(eps, plus_one);
    o.act = parse_enum("act", str_arg(act, "act"), activation_table());
    o.norm_before_gate = norm_before_gate;
    DlpackTensor tx(x, "x", as), tg(gate, "gate", as), to(out, "out", as);
    std::optional<DlpackTensor> tw = optional_tensor(weight, "weight", as);
    GilRelease release;
    rms_norm_gated(tx.view(), tg.view(), tw ? &tw->view() : nullptr, to.view(), o);
  });
  m.def("act_and_mul", [](const py::handle& x, const py::handle& out, const py::handle& act,
                          bool clamped_swiglu, float swiglu_alpha, float swiglu_limit,
                          const py::handle& rows, const py::handle& dtype) {
    const StorageAs as{parse_dtype_override(dtype)};
    GluOptions o;
    o.act = parse_enum("act", str_arg(act, "act"), activation_table());
    o.clamped_swiglu = clamped_swiglu;
    o.swiglu_alpha = swiglu_alpha;
    o.swiglu_limit = swiglu_limit;
    o.rows = parse_enum("rows", str_arg(rows, "rows"), glu_rows_table());
    DlpackTensor tx(x, "x", as), to(out, "out", as);
    GilRelease release;
    act_and_mul(tx.view(), to.view(), o);
  });
}

}  // namespace tilejit::python
