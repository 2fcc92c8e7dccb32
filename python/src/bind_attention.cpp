#include "bind.h"

namespace tilejit::python {
void bind_attention(pybind11::module_&) {}
}  // namespace tilejit::python
