// tilejit._core: the extension module under `import tilejit` (the package's
// __init__.py adds output allocation and returns the caller's tensor kind).
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {

template <class E>
E parse_enum(const char* arg, std::string_view value, const EnumTable<E>& table) {
  for (const auto& [name, e] : table)
    if (name == value) return e;
  std::string allowed;
  for (const auto& [name, e] : table) allowed += (allowed.empty() ? "" : ", ") + std::string(name);
  throw Error(fmt::format("{}: \"{}\" is not allowed; allowed: {}", arg, value, allowed));
}

template <class E>
std::string_view enum_name(E value, const EnumTable<E>& table) {
  for (const auto& [name, e] : table)
    if (e == value) return name;
  throw InternalError(fmt::format("enum value {} has no Python name", static_cast<int>(value)));
}

#define TILEJIT_INSTANTIATE(E)                                                  \
  template E parse_enum<E>(const char*, std::string_view, const EnumTable<E>&); \
  template std::string_view enum_name<E>(E, const EnumTable<E>&);
TILEJIT_INSTANTIATE(Activation)
TILEJIT_INSTANTIATE(ActQuant)
TILEJIT_INSTANTIATE(Int4Route)
TILEJIT_INSTANTIATE(RopeStyle)
TILEJIT_INSTANTIATE(ExpertProj)
TILEJIT_INSTANTIATE(GluRows)
TILEJIT_INSTANTIATE(RouterScore)
TILEJIT_INSTANTIATE(Int4Format)
TILEJIT_INSTANTIATE(DType)
#undef TILEJIT_INSTANTIATE

const EnumTable<Activation>& activation_table() {
  // The names are the library's (activation_name), so the IR text, the tool
  // and Python spell them alike; so is the list: every value activation_name
  // knows (it refuses the first value past the enum's last).
  static const EnumTable<Activation> t = [] {
    EnumTable<Activation> r;
    for (int i = 0;; ++i) {
      const auto a = static_cast<Activation>(i);
      try {
        r.emplace_back(activation_name(a), a);
      } catch (const Error&) {
        break;
      }
    }
    return r;
  }();
  return t;
}
const EnumTable<ActQuant>& act_quant_table() {
  static const EnumTable<ActQuant> t = {{"dynamic_sym", ActQuant::dynamic_sym},
                                        {"dynamic_asym", ActQuant::dynamic_asym},
                                        {"fixed", ActQuant::fixed}};
  return t;
}
const EnumTable<Int4Route>& int4_route_table() {
  static const EnumTable<Int4Route> t = {
      {"automatic", Int4Route::automatic}, {"w4a16", Int4Route::w4a16}, {"w4a8", Int4Route::w4a8}};
  return t;
}
const EnumTable<RopeStyle>& rope_style_table() {
  static const EnumTable<RopeStyle> t = {{"neox", RopeStyle::neox}, {"gptj", RopeStyle::gptj}};
  return t;
}
const EnumTable<ExpertProj>& expert_proj_table() {
  static const EnumTable<ExpertProj> t = {
      {"gate_up", ExpertProj::gate_up}, {"down", ExpertProj::down}, {"up", ExpertProj::up}};
  return t;
}
const EnumTable<GluRows>& glu_rows_table() {
  static const EnumTable<GluRows> t = {{"halves", GluRows::halves},
                                       {"interleaved", GluRows::interleaved}};
  return t;
}
const EnumTable<RouterScore>& router_score_table() {
  static const EnumTable<RouterScore> t = {{"softmax", RouterScore::softmax},
                                           {"sigmoid", RouterScore::sigmoid}};
  return t;
}
const EnumTable<Int4Format>& int4_format_table() {
  static const EnumTable<Int4Format> t = {{"gptq", Int4Format::gptq}, {"awq", Int4Format::awq}};
  return t;
}
const EnumTable<DType>& dtype_table() {
  static const EnumTable<DType> t = [] {
    EnumTable<DType> r;
    // Every value the library names (dtype_name refuses the first one past
    // the enum): its list is the one home, this module sees only the API.
    for (int i = 0;; ++i) {
      try {
        r.emplace_back(dtype_name(static_cast<DType>(i)), static_cast<DType>(i));
      } catch (const Error&) {
        break;
      }
    }
    return r;
  }();
  return t;
}

std::string_view str_arg(const py::handle& obj, const char* arg) {
  if (!py::isinstance<py::str>(obj)) {
    throw Error(fmt::format("{}: expected a str, got {}", arg, py::repr(obj).cast<std::string>()));
  }
  Py_ssize_t size = 0;
  const char* s = PyUnicode_AsUTF8AndSize(obj.ptr(), &size);
  if (s == nullptr) throw py::error_already_set();
  return {s, static_cast<size_t>(size)};
}

namespace {

std::string type_qualname(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// The value of an int for a message: its digits, or its size when it is too
// long to print (Python 3.11 refuses str() past 4300 digits).
std::string int_text(const py::handle& v) {
  const auto bits = v.attr("bit_length")().cast<int64_t>();
  if (bits > 256) return fmt::format("an int of {} bits", bits);
  return py::str(v).cast<std::string>();
}

}  // namespace

template <class T>
T int_arg(const py::handle& obj, std::string_view arg) {
  constexpr auto lo = static_cast<long long>(std::numeric_limits<T>::min());
  constexpr auto hi = static_cast<long long>(std::numeric_limits<T>::max());
  // Fast path: an exact int that fits (every call of the hot operators).
  if (PyLong_CheckExact(obj.ptr())) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj.ptr(), &overflow);
    if (overflow == 0 && v >= lo && v <= hi) return static_cast<T>(v);
  }
  // A float has no __index__: 2.0 is refused, as pybind11 refused it.
  if (!PyIndex_Check(obj.ptr())) {
    std::string value = type_qualname(obj);
    if (PyFloat_Check(obj.ptr())) value += " " + py::repr(obj).cast<std::string>();
    throw Error(fmt::format("{}: expected an int, got {}; allowed: an int from {} to {}", arg,
                            value, lo, hi));
  }
  auto index = py::reinterpret_steal<py::object>(PyNumber_Index(obj.ptr()));
  if (!index) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(index.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || v < lo || v > hi)
    throw Error(fmt::format("{}: {} is out of range; allowed: an int from {} to {}", arg,
                            int_text(index), lo, hi));
  return static_cast<T>(v);
}
template int int_arg<int>(const py::handle&, std::string_view);
template int64_t int_arg<int64_t>(const py::handle&, std::string_view);

std::vector<int64_t> int64_list_arg(const py::handle& obj, std::string_view arg) {
  // Any sequence but a string, as pybind11's std::vector caster took (a
  // range, a numpy array).
  if (!py::isinstance<py::sequence>(obj) || py::isinstance<py::str>(obj) ||
      py::isinstance<py::bytes>(obj))
    throw Error(fmt::format("{}: expected a list of ints, got {}; allowed: a list or tuple of ints",
                            arg, type_qualname(obj)));
  py::sequence seq = py::reinterpret_borrow<py::sequence>(obj);
  std::vector<int64_t> r;
  r.reserve(py::len(seq));
  for (size_t i = 0; i < py::len(seq); ++i)
    r.push_back(int_arg<int64_t>(seq[i], fmt::format("{}[{}]", arg, i)));
  return r;
}

DictArg::DictArg(const py::handle& obj, std::string arg, std::initializer_list<const char*> allowed,
                 std::initializer_list<const char*> required, std::string_view what_dict)
    : arg_(std::move(arg)) {
  auto list = [](std::initializer_list<const char*> keys) {
    std::string s;
    for (const char* k : keys) s += fmt::format("{}{}", s.empty() ? "" : ", ", k);
    return s;
  };
  if (!py::isinstance<py::dict>(obj))
    throw Error(fmt::format("{}: expected {}; got {}", arg_, what_dict, type_qualname(obj)));
  dict_ = py::reinterpret_borrow<py::dict>(obj);
  for (auto kv : dict_) {
    const bool known = py::isinstance<py::str>(kv.first) &&
                       std::any_of(allowed.begin(), allowed.end(), [&](const char* k) {
                         return PyUnicode_CompareWithASCIIString(kv.first.ptr(), k) == 0;
                       });
    if (!known)
      throw Error(fmt::format("{}: key {} is not allowed; allowed: {}", arg_,
                              py::repr(kv.first).cast<std::string>(), list(allowed)));
  }
  for (const char* k : required)
    if (!dict_.contains(k))
      throw Error(fmt::format("{}: key '{}' is missing; required: {}", arg_, k, list(required)));
}

py::object DictArg::get(const char* key) const {
  PyObject* v = PyDict_GetItemString(dict_.ptr(), key);  // borrowed, no exception
  return v == nullptr ? py::none() : py::reinterpret_borrow<py::object>(v);
}

std::string DictArg::name(const char* key) const {
  return fmt::format("{}['{}']", arg_, key);
}

namespace {
template <class T>
const T& packed_arg(const py::handle& obj, const char* arg, const char* type, const char* maker) {
  if (!py::isinstance<T>(obj)) {
    throw Error(fmt::format("{}: expected a tilejit.{} (from tilejit.{}), got '{}'", arg, type,
                            maker, type_qualname(obj)));
  }
  return obj.cast<const T&>();
}
}  // namespace

const PackedWeight& packed_weight_arg(const py::handle& obj, const char* arg) {
  return packed_arg<PackedWeight>(obj, arg, "PackedWeight", "pack_weight");
}
const PackedExperts& packed_experts_arg(const py::handle& obj, const char* arg) {
  return packed_arg<PackedExperts>(obj, arg, "PackedExperts", "pack_experts");
}

void refuse_pickle(const char* type) {
  throw Error(fmt::format(
      "tilejit.{} cannot be pickled: its packed bytes are laid out for this machine's kernels "
      "(ISA, block sizes) and this tilejit build; save the checkpoint tensors and pack them "
      "again after loading",
      type));
}

void refuse_new(const char* type) {
  throw py::type_error(fmt::format(
      "tilejit.{0} cannot be created directly; allowed: the {0} that tilejit.{1} returns", type,
      std::string_view(type) == "PackedWeight" ? "pack_weight()" : "pack_experts*()"));
}

}  // namespace tilejit::python

PYBIND11_MODULE(_core, m) {
  using namespace tilejit::python;
  m.doc() = "tilejit's operators on DLPack tensors (see docs/python.md)";
  m.attr("__version__") = TILEJIT_VERSION;

  // Never destroyed: a static py::object would be released after the
  // interpreter is gone.
  static auto* error = new py::exception<tilejit::Error>(m, "Error");
  static auto* internal_error =
      new py::exception<tilejit::InternalError>(m, "InternalError", error->ptr());
  // tilejit::Error (InternalError first, it is one) keeps its text; any other
  // C++ exception becomes a tilejit.Error too, so no bad argument reaches
  // the interpreter as anything but a Python exception. pybind11's own
  // exceptions and MemoryError keep their types (rethrown to its translator).
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tilejit::InternalError& e) {
      (*internal_error)(e.what());
    } catch (const tilejit::Error& e) {
      (*error)(e.what());
    } catch (const py::error_already_set&) {
      throw;
    } catch (const py::builtin_exception&) {
      throw;
    } catch (const std::bad_alloc&) {
      throw;
    } catch (const std::exception& e) {
      (*error)(e.what());
    }
  });

  bind_info(m);
  bind_dlpack(m);
  bind_buffer(m);
  bind_gemm(m);
  bind_attention(m);
  bind_rope(m);
  bind_rowwise(m);
  bind_moe(m);
}
