// Shared pieces of the Python bindings: the per-family bind functions
// module.cpp calls, the string <-> enum tables of the keyword arguments (the
// one home of their Python spellings), and argument helpers.
#pragma once

#include <pybind11/pybind11.h>

#include <string_view>
#include <utility>
#include <vector>

#include "dlpack_tensor.h"
#include "tilejit/tilejit.h"

namespace tilejit::python {

// py::gil_scoped_release with a destructor that may throw. At interpreter
// exit Python 3.11 ends a daemon thread inside PyEval_RestoreThread with
// pthread_exit; its forced unwind through a noexcept destructor (pybind11's)
// was std::terminate, an abort of the whole process. Through this one it
// unwinds to pybind11's dispatcher, which rethrows abi::__forced_unwind, and
// the thread ends as Python meant it to.
class GilRelease {
 public:
  GilRelease() : state_(PyEval_SaveThread()) {}
  ~GilRelease() noexcept(false) { PyEval_RestoreThread(state_); }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

void bind_info(pybind11::module_& m);
void bind_buffer(pybind11::module_& m);
void bind_gemm(pybind11::module_& m);
void bind_attention(pybind11::module_& m);
void bind_rope(pybind11::module_& m);
void bind_moe(pybind11::module_& m);

template <class E>
using EnumTable = std::vector<std::pair<std::string_view, E>>;

const EnumTable<Activation>& activation_table();
const EnumTable<ActQuant>& act_quant_table();
const EnumTable<Int4Route>& int4_route_table();
const EnumTable<RopeStyle>& rope_style_table();
const EnumTable<ExpertProj>& expert_proj_table();
const EnumTable<GluRows>& glu_rows_table();
const EnumTable<RouterScore>& router_score_table();
const EnumTable<Int4Format>& int4_format_table();
const EnumTable<DType>& dtype_table();  // the names of dtype_name()

// value looked up in table; an Error naming arg, the value and the allowed names.
template <class E>
E parse_enum(const char* arg, std::string_view value, const EnumTable<E>& table);
template <class E>
std::string_view enum_name(E value, const EnumTable<E>& table);

// A keyword string argument ("act", "format", ...): a str, else an Error.
std::string_view str_arg(const pybind11::handle& obj, const char* arg);

// The PackedWeight / PackedExperts behind an argument, an Error naming the
// argument when it is something else (a tensor passed where the packed
// weight goes).
const PackedWeight& packed_weight_arg(const pybind11::handle& obj, const char* arg);
const PackedExperts& packed_experts_arg(const pybind11::handle& obj, const char* arg);

// The __reduce_ex__ of both packed types: packed bytes are tied to the
// machine and build that made them.
[[noreturn]] void refuse_pickle(const char* type);
// The __new__ of both packed types: an instance made by __new__ alone has
// no C++ object behind it (pybind11 constructs it in __init__, which these
// types do not have), so every method would read uninitialised memory. The
// library makes its instances without __new__ (pybind11 allocates them
// directly), so refusing it costs nothing.
[[noreturn]] void refuse_new(const char* type);

}  // namespace tilejit::python
