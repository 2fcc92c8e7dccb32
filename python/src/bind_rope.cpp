// rope: in place on q and k.
#include <pybind11/pybind11.h>

#include <vector>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {

void bind_rope(py::module_& m) {
  m.def("rope", [](const py::handle& q, const py::handle& k, const py::handle& positions,
                   const py::handle& cos_sin_cache, const py::handle& style,
                   const py::handle& rotary_dim, const py::handle& ndim,
                   const py::handle& mrope_section, const py::handle& dtype, bool il) {
    const StorageAs as{parse_dtype_override(dtype)};
    RopeOptions o;
    o.style = parse_enum("style", str_arg(style, "style"), rope_style_table());
    o.rotary_dim = int_arg<int64_t>(rotary_dim, "rotary_dim");
    o.ndim = int_arg<int>(ndim, "ndim");
    o.mrope_interleaved = il;
    if (!mrope_section.is_none()) o.mrope_section = int64_list_arg(mrope_section, "mrope_section");
    DlpackTensor tq(q, "q", as), tp(positions, "positions", as),
        tc(cos_sin_cache, "cos_sin_cache", as);
    std::optional<DlpackTensor> tk = optional_tensor(k, "k", as);
    GilRelease release;
    rope(tq.view(), tk ? &tk->view() : nullptr, tp.view(), tc.view(), o);
  });
}

}  // namespace tilejit::python
