// Shared pieces of the Python bindings: the per-family bind functions
// module.cpp calls, the string <-> enum tables of the keyword arguments (the
// one home of their Python spellings), and argument helpers.
#pragma once

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>
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
void bind_rowwise(pybind11::module_& m);
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

// An integer argument (or dict field, list entry) as the C++ parameter of
// type T takes it: any Python int (or object with __index__: numpy and
// 0-d torch integers, bool) whose value fits T; else an Error naming arg,
// the value (or its type) and T's range. The one home of the rule: every
// integer parameter of the bindings is a py::handle read through it, so an
// out-of-range value is never pybind11's "incompatible function arguments"
// TypeError (which printed every argument's repr). T: int or int64_t.
template <class T>
T int_arg(const pybind11::handle& obj, std::string_view arg);

// A dict argument (an int4 expert's {"qweight": ..., "n": ...}): the one
// reader of dicts, so every field's error names it as arg['key'].
class DictArg {
 public:
  // obj must be a dict whose keys are among `allowed`, with every key of
  // `required`; what_dict says what arg holds ("a dict with qweight, ...").
  DictArg(const pybind11::handle& obj, std::string arg, std::initializer_list<const char*> allowed,
          std::initializer_list<const char*> required, std::string_view what_dict);
  // The field, None when absent.
  pybind11::object get(const char* key) const;
  // arg['key'], the name errors give the field.
  std::string name(const char* key) const;
  // An integer field through int_arg; `fallback` when absent.
  template <class T>
  T int_field(const char* key, T fallback) const {
    pybind11::object v = get(key);
    return v.is_none() ? fallback : int_arg<T>(v, name(key));
  }

 private:
  pybind11::dict dict_;
  std::string arg_;
};

// A list argument of integers (mrope_section, Buffer's shape): a list,
// tuple or other sequence (not a str), each entry through int_arg (named
// arg[i]).
std::vector<int64_t> int64_list_arg(const pybind11::handle& obj, std::string_view arg);

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
