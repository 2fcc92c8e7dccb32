// tilejit._core: the extension module under `import tilejit` (the package's
// __init__.py adds output allocation and returns the caller's tensor kind).
#include <pybind11/pybind11.h>

#include <fmt/format.h>
#include <exception>
#include <new>
#include <stdexcept>

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
  // and Python spell them alike.
  static const EnumTable<Activation> t = [] {
    EnumTable<Activation> r;
    for (Activation a : {Activation::none, Activation::relu, Activation::silu,
                         Activation::gelu_tanh, Activation::gelu_erf})
      r.emplace_back(activation_name(a), a);
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
  static const EnumTable<ExpertProj> t = {{"gate_up", ExpertProj::gate_up},
                                          {"down", ExpertProj::down}};
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
    for (DType d : {DType::f32, DType::bf16, DType::f16, DType::i8, DType::u8, DType::i32,
                    DType::f8e4m3, DType::u4, DType::i64, DType::f4e2m1})
      r.emplace_back(dtype_name(d), d);
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
template <class T>
const T& packed_arg(const py::handle& obj, const char* arg, const char* type, const char* maker) {
  if (!py::isinstance<T>(obj)) {
    throw Error(
        fmt::format("{}: expected a tilejit.{} (from tilejit.{}), got '{}'", arg, type, maker,
                    py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>()));
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
  bind_buffer(m);
  bind_gemm(m);
  bind_attention(m);
  bind_rope(m);
  bind_moe(m);
}
