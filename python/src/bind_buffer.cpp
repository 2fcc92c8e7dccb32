// tilejit.Buffer: the output tensor the convenience forms allocate when the
// caller's tensors are neither torch nor numpy. Owns 64-byte aligned,
// zeroed, row-major memory and exports it through DLPack (__dlpack__,
// __dlpack_device__), so torch.from_dlpack / numpy.from_dlpack and every
// tilejit call read it without a copy.
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>

#include "bind.h"

namespace py = pybind11;

namespace tilejit::python {
namespace {

struct Buffer {
  std::shared_ptr<void> data;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
};

// The DLPack type of a dtype, none for the 4-bit ones (DLPack has no
// sub-byte type a consumer would read as this layout).
std::optional<DLDataType> dl_dtype_of(DType t) {
  switch (t) {
    case DType::f32:
      return DLDataType{kDLFloat, 32, 1};
    case DType::f16:
      return DLDataType{kDLFloat, 16, 1};
    case DType::bf16:
      return DLDataType{kDLBfloat, 16, 1};
    case DType::i8:
      return DLDataType{kDLInt, 8, 1};
    case DType::u8:
    case DType::f8e4m3:  // DLPack 0.6 has no float8: the codes as bytes
    case DType::f8e5m2:
      return DLDataType{kDLUInt, 8, 1};
    case DType::i32:
      return DLDataType{kDLInt, 32, 1};
    case DType::i64:
      return DLDataType{kDLInt, 64, 1};
    default:
      return std::nullopt;
  }
}

// The dtypes a Buffer holds: dtype_table's names that have a DLPack type.
const EnumTable<DType>& buffer_dtype_table() {
  static const EnumTable<DType> table = [] {
    EnumTable<DType> t;
    for (const auto& row : dtype_table())
      if (dl_dtype_of(row.second)) t.push_back(row);
    return t;
  }();
  return table;
}

DLDataType dl_dtype(DType t) {
  if (const auto d = dl_dtype_of(t)) return *d;
  std::string allowed;
  for (const auto& [name, _] : buffer_dtype_table())
    allowed += fmt::format("{}{}", allowed.empty() ? "" : ", ", name);
  throw Error(
      fmt::format("Buffer: dtype \"{}\" has no DLPack type; allowed: {}", dtype_name(t), allowed));
}

// The buffer protocol's format of the storage: numpy has no bf16 or fp8, so
// their bits show as uint16 / uint8 (what numpy callers pass with dtype="bf16").
const char* buffer_format(DType t) {
  switch (t) {
    case DType::f32:
      return "f";
    case DType::f16:
      return "e";
    case DType::bf16:
      return "H";
    case DType::i8:
      return "b";
    case DType::u8:
    case DType::f8e4m3:
    case DType::f8e5m2:
      return "B";
    case DType::i32:
      return "i";
    case DType::i64:
      return "q";
    default:
      throw Error(fmt::format("Buffer: dtype \"{}\" has no buffer format", dtype_name(t)));
  }
}

// What a capsule's DLManagedTensor owns: a reference to the storage and the
// shape and strides arrays DLTensor points to.
struct Export {
  DLManagedTensor managed{};
  std::shared_ptr<void> data;
  std::vector<int64_t> shape, strides;
};

void delete_export(DLManagedTensor* self) {
  delete static_cast<Export*>(self->manager_ctx);
}

// A capsule that was never consumed still owns its tensor (the protocol).
void capsule_destructor(PyObject* capsule) {
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m->deleter != nullptr) m->deleter(m);
  }
}

py::object to_dlpack(const Buffer& b) {
  auto* e = new Export;
  e->data = b.data;
  e->shape = b.shape;
  e->strides = b.strides;
  DLTensor& t = e->managed.dl_tensor;
  t.data = b.data.get();
  t.device = {kDLCPU, 0};
  t.ndim = static_cast<int>(b.shape.size());
  t.dtype = dl_dtype(b.dtype);
  t.shape = e->shape.data();
  t.strides = e->strides.data();
  t.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_export;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (cap == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::object>(cap);
}

Buffer make_buffer(const std::vector<int64_t>& shape, std::string_view dtype) {
  Buffer b;
  b.dtype = parse_enum("dtype", dtype, buffer_dtype_table());
  if (shape.size() > kMaxDlpackRank)
    throw Error(
        fmt::format("Buffer: shape has {} dims; allowed: at most {} (what tilejit reads "
                    "back through DLPack)",
                    shape.size(), kMaxDlpackRank));
  b.shape = shape;
  b.strides.resize(shape.size());
  int64_t n = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] < 0 || shape[i] > Limits::max_dim)
      throw Error(fmt::format("Buffer: shape[{}] = {} is not allowed; allowed: 0 to {}", i,
                              shape[i], Limits::max_dim));
    b.strides[i] = n;
    n *= shape[i];
    if (n > Limits::max_view_bytes)
      throw Error(fmt::format("Buffer: {} elements exceed the limit of {} bytes", n,
                              Limits::max_view_bytes));
  }
  const size_t bytes = static_cast<size_t>(n) * dtype_bits(b.dtype) / 8;
  const size_t rounded = (bytes + 63) / 64 * 64 + 64;  // never 0, a multiple of the alignment
  void* p = std::aligned_alloc(64, rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  b.data = std::shared_ptr<void>(p, std::free);
  return b;
}

}  // namespace

void bind_buffer(py::module_& m) {
  py::class_<Buffer>(m, "Buffer", py::buffer_protocol(),
                     "A tilejit-allocated CPU tensor (zeroed, row-major) that speaks DLPack "
                     "and the buffer protocol (bf16 as uint16, f8e4m3 / f8e5m2 as uint8).")
      .def_buffer([](Buffer& b) {
        std::vector<py::ssize_t> shape(b.shape.begin(), b.shape.end()), strides;
        const py::ssize_t item = dtype_bits(b.dtype) / 8;
        for (int64_t s : b.strides) strides.push_back(s * item);
        return py::buffer_info(b.data.get(), item, buffer_format(b.dtype),
                               static_cast<py::ssize_t>(shape.size()), shape, strides);
      })
      .def(py::init([](const py::handle& shape, const py::handle& dtype) {
             return make_buffer(int64_list_arg(shape, "Buffer: shape"), str_arg(dtype, "dtype"));
           }),
           py::arg("shape"), py::arg("dtype") = "f32")
      .def_property_readonly("shape", [](const Buffer& b) { return py::tuple(py::cast(b.shape)); })
      .def_property_readonly("dtype", [](const Buffer& b) { return dtype_name(b.dtype); })
      .def_property_readonly("strides",
                             [](const Buffer& b) { return py::tuple(py::cast(b.strides)); })
      .def_property_readonly(
          "data_ptr", [](const Buffer& b) { return reinterpret_cast<uintptr_t>(b.data.get()); })
      .def(
          "__dlpack__", [](const Buffer& b, const py::object&) { return to_dlpack(b); },
          py::arg("stream") = py::none())
      .def("__dlpack_device__", [](const Buffer&) { return py::make_tuple(int{kDLCPU}, 0); })
      .def("__repr__", [](const Buffer& b) {
        std::string s;
        for (int64_t d : b.shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
        return fmt::format("tilejit.Buffer(shape=({}), dtype=\"{}\")", s, dtype_name(b.dtype));
      });
}

}  // namespace tilejit::python
