// DLPack capsule -> tilejit::TensorView for the Python module.
//
// A DlpackTensor borrows one Python argument for the length of one call: it
// asks the object for a DLPack capsule (torch tensors through
// torch._C._to_dlpack, which is a C call, everything else through
// __dlpack__), takes ownership of the DLManagedTensor as the protocol says
// (the capsule is renamed "used_dltensor", the consumer calls the deleter),
// and presents it as a TensorView: strides in elements as DLPack has them,
// byte_offset applied, device checked to be the CPU, and ndim, shape and
// data + byte_offset checked before they are used. The deleter runs when the
// last DlpackTensor (or Exported) sharing the tensor is destroyed, which the
// bindings reach with the GIL held (numpy's deleter releases a reference to
// the array).
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <optional>

#include "tilejit/tilejit.h"

struct DLManagedTensor;

namespace tilejit::python {

// The most dims a DLPack tensor may declare (numpy 2's NPY_MAXDIMS; no
// operator takes more than 4). Checked before the shape and strides arrays
// are read: they are read ndim entries deep, so a producer declaring more
// dims than its arrays hold would make the reader run past them.
constexpr size_t kMaxDlpackRank = 64;

// What raw integer storage of a width stands for. numpy (and torch 1.13)
// have no bfloat16 or float8: a uint16 array holds bf16 when the call says
// dtype="bf16"; a uint8 fp8 weight holds e4m3 codes, a uint8 KV cache e4m3
// codes or, with the call's cache_dtype="f8e5m2", e5m2 codes.
struct StorageAs {
  bool u16_is_bf16 = false;  // the call's dtype="bf16"
  DType u8_as = DType::u8;   // set by the binding for fp8-capable arguments: f8e4m3 or f8e5m2
};

// The dtype="..." keyword of every operator: None or "bf16".
bool parse_dtype_override(const pybind11::handle& dtype);

class DlpackTensor {
 public:
  // arg names the argument in error messages ("x", "k_cache", ...). obj may
  // be an Exported (below): then its tensor is read again, not re-exported.
  DlpackTensor(const pybind11::handle& obj, const char* arg, StorageAs as = {});
  DlpackTensor(const DlpackTensor&) = delete;
  DlpackTensor& operator=(const DlpackTensor&) = delete;
  DlpackTensor(DlpackTensor&&) noexcept = default;
  DlpackTensor& operator=(DlpackTensor&&) noexcept = default;

  const TensorView& view() const { return view_; }

 private:
  void init_view(const char* arg, StorageAs as);

  // Shared with an Exported; the producer's deleter runs when the last
  // owner is gone (with the GIL held: the bindings destroy their tensors
  // after re-taking it, and an Exported dies in Python's garbage collection).
  std::shared_ptr<DLManagedTensor> managed_;
  StorageAs exported_as_;  // what the export found (ml_dtypes bfloat16: uint16 is bf16)
  TensorView view_;
};

// tilejit._core._Exported: a DLPack tensor exported once, for the Python
// layer. A producer that is neither a torch tensor nor a numpy array has no
// .shape tilejit may trust, so the layer reads the shape (to size an
// output) or the shape and dtype (what pack_* packed, for unpack) from the
// export, then passes the Exported to the call in the producer's place:
// __dlpack__ runs once per tilejit call, as a producer handing out a single
// capsule needs. Every DlpackTensor made from it shares its DLManagedTensor.
// Registers _Exported and _export(t, arg, dtype) -> _Exported (.shape).
void bind_dlpack(pybind11::module_& m);

// An optional tensor argument: None -> nullopt.
std::optional<DlpackTensor> optional_tensor(const pybind11::handle& obj, const char* arg,
                                            StorageAs as = {});
std::optional<TensorView> view_of(const std::optional<DlpackTensor>& t);

}  // namespace tilejit::python
