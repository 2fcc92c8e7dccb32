#include "bind.h"

namespace tilejit::python {
void bind_rope(pybind11::module_&) {}
}  // namespace tilejit::python
