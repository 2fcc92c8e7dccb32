#include "dlpack_tensor.h"

#include <cpuid.h>
#include <dlpack/dlpack.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <utility>

namespace py = pybind11;

namespace tilejit::python {
namespace {

const char* device_name(int type) {
  switch (type) {
    case kDLCPU:
      return "CPU";
    case kDLCUDA:
      return "CUDA";
    case kDLCUDAHost:
      return "CUDAHost";
    case kDLOpenCL:
      return "OpenCL";
    case kDLVulkan:
      return "Vulkan";
    case kDLMetal:
      return "Metal";
    case kDLROCM:
      return "ROCm";
    case kDLROCMHost:
      return "ROCmHost";
    case kDLCUDAManaged:
      return "CUDAManaged";
    default:
      return "unknown";
  }
}

[[noreturn]] void refuse_device(const char* arg, int type, int id) {
  throw Error(
      fmt::format("{}: a tensor on DLPack device ({}, {}) ({}); tilejit runs on CPU memory only "
                  "(device type kDLCPU = 1)",
                  arg, type, id, device_name(type)));
}

// The one table of DLPack dtypes the module accepts. `as` reinterprets raw
// storage (see StorageAs).
std::optional<DType> map_dtype(const DLDataType& t, StorageAs as) {
  if (t.lanes != 1) return std::nullopt;
  switch (t.code) {
    case kDLFloat:
      if (t.bits == 32) return DType::f32;
      if (t.bits == 16) return DType::f16;
      break;
    case kDLBfloat:
      if (t.bits == 16) return DType::bf16;
      break;
    case kDLInt:
      if (t.bits == 8) return DType::i8;
      if (t.bits == 32) return DType::i32;
      if (t.bits == 64) return DType::i64;
      if (t.bits == 16 && as.u16_is_bf16) return DType::bf16;
      break;
    case kDLUInt:
      if (t.bits == 8) return as.u8_as;
      if (t.bits == 16 && as.u16_is_bf16) return DType::bf16;
      break;
    default:
      break;
  }
  return std::nullopt;
}

[[noreturn]] void refuse_dtype(const char* arg, const DLDataType& t) {
  const bool u16 = (t.code == kDLUInt || t.code == kDLInt) && t.bits == 16 && t.lanes == 1;
  throw Error(fmt::format(
      "{}: DLPack dtype (code {}, {} bits, {} lanes) has no tilejit type{}; allowed: float32, "
      "float16, bfloat16, int8, uint8, int32, int64, and uint16 with dtype=\"bf16\"",
      arg, t.code, t.bits, t.lanes,
      u16 ? " (a uint16 array holding bfloat16 needs dtype=\"bf16\")" : ""));
}

// A module the caller has imported (never imported here), or null.
py::object imported(const char* name) {
  PyObject* mod = PyImport_GetModule(py::str(name).ptr());
  if (mod == nullptr) PyErr_Clear();
  return py::reinterpret_steal<py::object>(mod);
}

// torch.Tensor with torch._C._to_dlpack, and numpy.ndarray, once their
// modules are imported: the fast paths. Borrowed for the life of the process.
struct Hooks {
  PyObject* torch_tensor = nullptr;
  PyObject* torch_to_dlpack = nullptr;
  PyObject* ndarray = nullptr;
};

const Hooks& hooks() {
  static Hooks h;
  if (h.torch_tensor == nullptr) {
    py::object torch = imported("torch");
    // A partly imported torch lacks them until its import finishes.
    if (torch && py::hasattr(torch, "Tensor") && py::hasattr(torch, "_C") &&
        py::hasattr(torch.attr("_C"), "_to_dlpack")) {
      h.torch_to_dlpack = py::object(torch.attr("_C").attr("_to_dlpack")).release().ptr();
      h.torch_tensor = py::object(torch.attr("Tensor")).release().ptr();
    }
  }
  if (h.ndarray == nullptr) {
    py::object np = imported("numpy");
    if (np && py::hasattr(np, "ndarray"))
      h.ndarray = py::object(np.attr("ndarray")).release().ptr();
  }
  return h;
}

bool is_instance(const py::handle& obj, PyObject* type) {
  return type != nullptr && PyObject_TypeCheck(obj.ptr(), reinterpret_cast<PyTypeObject*>(type));
}

std::string type_name(const py::handle& obj) {
  return py::str(py::type::handle_of(obj).attr("__qualname__")).cast<std::string>();
}

// The producer's exception as text, the Python error cleared.
std::string python_error_text(py::error_already_set& e) {
  std::string text = e.what();
  e.restore();
  PyErr_Clear();
  return text;
}

py::object export_capsule(const py::handle& obj, const char* arg, StorageAs& as) {
  const Hooks& h = hooks();
  if (is_instance(obj, h.torch_tensor)) {
    // torch's __dlpack__ is Python code (and refuses tensors that require
    // grad); _to_dlpack is the C function under it.
    try {
      return py::reinterpret_borrow<py::object>(h.torch_to_dlpack)(obj);
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("{}: torch could not export the tensor through DLPack: {}", arg,
                              python_error_text(e)));
    }
  }
  // numpy arrays live in CPU memory: no __dlpack_device__ round trip.
  const bool cpu_known = is_instance(obj, h.ndarray);
  if (!cpu_known && !py::hasattr(obj, "__dlpack__")) {
    throw Error(fmt::format(
        "{}: an object of type '{}' is not a DLPack tensor (no __dlpack__ method); pass a torch "
        "tensor, a numpy array or another object with __dlpack__ / __dlpack_device__",
        arg, type_name(obj)));
  }
  if (!cpu_known && py::hasattr(obj, "__dlpack_device__")) {
    int type = 0, id = 0;
    try {
      py::tuple dev = obj.attr("__dlpack_device__")();
      type = dev[0].cast<int>();
      id = dev[1].cast<int>();
    } catch (py::error_already_set& e) {
      throw Error(fmt::format("{}: __dlpack_device__() of '{}' failed: {}", arg, type_name(obj),
                              python_error_text(e)));
    } catch (const py::cast_error&) {
      throw Error(fmt::format("{}: __dlpack_device__() of '{}' did not return (int, int)", arg,
                              type_name(obj)));
    }
    if (type != kDLCPU) refuse_device(arg, type, id);
  }
  try {
    return obj.attr("__dlpack__")();
  } catch (py::error_already_set& e) {
    std::string text = python_error_text(e);
    // ml_dtypes' bfloat16 numpy arrays: numpy cannot export the dtype; the
    // same bytes as uint16 are bf16.
    if (py::hasattr(obj, "dtype") && py::hasattr(obj, "view") &&
        py::str(obj.attr("dtype")).cast<std::string>() == "bfloat16") {
      as.u16_is_bf16 = true;
      try {
        return obj.attr("view")("uint16").attr("__dlpack__")();
      } catch (py::error_already_set& e2) {
        text = python_error_text(e2);
      }
    }
    throw Error(fmt::format("{}: __dlpack__() of '{}' failed: {}", arg, type_name(obj), text));
  }
}

}  // namespace

bool parse_dtype_override(const py::handle& dtype) {
  if (dtype.is_none()) return false;
  if (PyUnicode_Check(dtype.ptr()) && PyUnicode_CompareWithASCIIString(dtype.ptr(), "bf16") == 0)
    return true;
  throw Error(fmt::format(
      "dtype: {} is not allowed; allowed: None (the tensors' own dtypes) or \"bf16\" (uint16 "
      "arrays hold bfloat16)",
      py::repr(dtype).cast<std::string>()));
}

namespace {

// What a _core._Exported holds (bind_dlpack).
struct Exported {
  DlpackTensor tensor;
  py::tuple shape;
};

// The _Exported type, set once by bind_dlpack: compared by pointer, the
// cheapest test on every tensor argument.
PyTypeObject* exported_type = nullptr;

const Exported* as_exported(const py::handle& obj) {
  if (exported_type == nullptr || Py_TYPE(obj.ptr()) != exported_type) return nullptr;
  return &obj.cast<const Exported&>();
}

void delete_managed(DLManagedTensor* m) {
  if (m->deleter != nullptr) m->deleter(m);
}

// The end of the user address space: 2^47 (4-level paging), 2^56 on a CPU
// with 5-level paging (LA57), where Linux maps memory above 2^47 for
// processes that ask for it.
uintptr_t user_space_end() {
  static const uintptr_t end = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    const bool la57 = __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (c & (1u << 16)) != 0;
    return uintptr_t{1} << (la57 ? 56 : 47);
  }();
  return end;
}

}  // namespace

DlpackTensor::DlpackTensor(const py::handle& obj, const char* arg, StorageAs as) {
  if (const Exported* e = as_exported(obj)) {
    managed_ = e->tensor.managed_;
    exported_as_ = e->tensor.exported_as_;
  } else {
    py::object capsule = export_capsule(obj, arg, exported_as_);
    if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
      throw Error(
          fmt::format("{}: __dlpack__() of '{}' did not return an unused \"dltensor\" capsule", arg,
                      type_name(obj)));
    }
    // The protocol: the consumer renames the capsule and calls the deleter
    // itself (the capsule's own destructor then leaves the tensor alone),
    // also when the tensor is refused below.
    managed_.reset(static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor")),
                   delete_managed);
    PyCapsule_SetName(capsule.ptr(), "used_dltensor");
  }
  as.u16_is_bf16 = as.u16_is_bf16 || exported_as_.u16_is_bf16;
  init_view(arg, as);
}

void DlpackTensor::init_view(const char* arg, StorageAs as) {
  const DLTensor& t = managed_->dl_tensor;
  if (t.device.device_type != kDLCPU) refuse_device(arg, t.device.device_type, t.device.device_id);
  std::optional<DType> dt = map_dtype(t.dtype, as);
  if (!dt) refuse_dtype(arg, t.dtype);
  // Before the shape and strides arrays are read, which are ndim entries
  // deep. A producer declaring more dims than its arrays hold, up to the
  // cap, cannot be told from an honest one.
  if (t.ndim < 0 || static_cast<size_t>(t.ndim) > kMaxDlpackRank)
    throw Error(fmt::format("{}: DLPack ndim {} is not allowed; allowed: 0 to {} dims", arg, t.ndim,
                            kMaxDlpackRank));
  const auto ndim = static_cast<size_t>(t.ndim);
  if (ndim > 0 && t.shape == nullptr)
    throw Error(fmt::format("{}: DLPack shape is a null pointer for ndim {}; allowed: ndim dims",
                            arg, ndim));
  // data + byte_offset, checked only as far as arithmetic can tell: no
  // wrap, and inside the user address space (an address past it would fault
  // on the first access). A producer can always hand out a pointer to
  // memory it does not own; nothing here can tell that.
  const auto base = reinterpret_cast<uintptr_t>(t.data);
  uintptr_t first = 0;
  if (t.data == nullptr && t.byte_offset != 0)
    throw Error(
        fmt::format("{}: DLPack data is null with byte_offset {}; allowed: byte_offset 0 "
                    "with null data",
                    arg, t.byte_offset));
  if (__builtin_add_overflow(base, t.byte_offset, &first) || first >= user_space_end())
    throw Error(fmt::format(
        "{}: DLPack data {:#x} + byte_offset {} is past the user address space (which ends at "
        "{:#x}); allowed: data + byte_offset below {:#x}",
        arg, base, t.byte_offset, user_space_end(), user_space_end()));
  view_.data = reinterpret_cast<void*>(first);
  view_.dtype = *dt;
  view_.shape.assign(t.shape, t.shape + ndim);
  // The shape first: the strides derived below (or the producer's) would
  // otherwise take the blame for a negative dim.
  for (size_t i = 0; i < ndim; ++i)
    if (view_.shape[i] < 0)
      throw Error(fmt::format("{}: DLPack shape [{}] has dim {} = {}; allowed: dims >= 0", arg,
                              fmt::join(view_.shape, ", "), i, view_.shape[i]));
  if (t.strides != nullptr) {
    view_.strides.assign(t.strides, t.strides + ndim);
  } else {  // NULL strides: compact row-major
    view_.strides.resize(ndim);
    int64_t s = 1;
    for (size_t i = ndim; i-- > 0;) {
      view_.strides[i] = s;
      if (i > 0 && __builtin_mul_overflow(s, view_.shape[i], &s))
        throw Error(fmt::format(
            "{}: DLPack shape [{}] with NULL strides (row-major): the strides overflow int64; "
            "allowed: dims whose product is below 2^63",
            arg, fmt::join(view_.shape, ", ")));
    }
  }
}

std::optional<DlpackTensor> optional_tensor(const py::handle& obj, const char* arg, StorageAs as) {
  if (obj.is_none()) return std::nullopt;
  return std::optional<DlpackTensor>(std::in_place, obj, arg, as);
}

std::optional<TensorView> view_of(const std::optional<DlpackTensor>& t) {
  if (!t) return std::nullopt;
  return t->view();
}

void bind_dlpack(py::module_& m) {
  py::class_<Exported> cls(m, "_Exported",
                           "A DLPack tensor exported once (tilejit's Python layer passes it in "
                           "the producer's place).");
  cls.def_readonly("shape", &Exported::shape);
  exported_type = reinterpret_cast<PyTypeObject*>(cls.ptr());
  // The largest dim of any tensor (the Python layer checks an output's
  // dims against it before allocating).
  m.attr("_MAX_DIM") = Limits::max_dim;
  m.def("_export", [](const py::handle& t, const std::string& arg, const py::handle& dtype) {
    // Any dtype the call may read: the call maps it again with its own rules.
    StorageAs as{parse_dtype_override(dtype), DType::f8e4m3};
    DlpackTensor d(t, arg.c_str(), as);
    py::tuple shape = py::cast(d.view().shape);
    return Exported{std::move(d), std::move(shape)};
  });
}

}  // namespace tilejit::python
