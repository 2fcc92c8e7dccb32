// DLPack capsule -> tilejit::TensorView for the Python module.
//
// A DlpackTensor borrows one Python argument for the length of one call: it
// asks the object for a DLPack capsule (torch tensors through
// torch._C._to_dlpack, which is a C call, everything else through
// __dlpack__), takes ownership of the DLManagedTensor as the protocol says
// (the capsule is renamed "used_dltensor", the consumer calls the deleter),
// and presents it as a TensorView: strides in elements as DLPack has them,
// byte_offset applied, device checked to be the CPU. The deleter runs in the
// destructor, which the bindings reach with the GIL held (numpy's deleter
// releases a reference to the array).
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "tilejit/tilejit.h"

struct DLManagedTensor;

namespace tilejit::python {

// What raw integer storage of a width stands for. numpy (and torch 1.13)
// have no bfloat16 or float8: a uint16 array holds bf16 when the call says
// dtype="bf16"; a uint8 KV cache or fp8 weight holds e4m3 codes.
struct StorageAs {
  bool u16_is_bf16 = false;   // the call's dtype="bf16"
  bool u8_is_f8e4m3 = false;  // set by the binding for fp8-capable arguments
};

// The dtype="..." keyword of every operator: None or "bf16".
bool parse_dtype_override(const pybind11::handle& dtype);

class DlpackTensor {
 public:
  // arg names the argument in error messages ("x", "k_cache", ...).
  DlpackTensor(const pybind11::handle& obj, const char* arg, StorageAs as = {});
  ~DlpackTensor();
  DlpackTensor(const DlpackTensor&) = delete;
  DlpackTensor& operator=(const DlpackTensor&) = delete;
  DlpackTensor(DlpackTensor&& o) noexcept;
  DlpackTensor& operator=(DlpackTensor&& o) noexcept;

  const TensorView& view() const { return view_; }

 private:
  void init_view(const char* arg, StorageAs as);

  DLManagedTensor* managed_ = nullptr;
  TensorView view_;
};

// An optional tensor argument: None -> nullopt.
std::optional<DlpackTensor> optional_tensor(const pybind11::handle& obj, const char* arg,
                                            StorageAs as = {});
std::optional<TensorView> view_of(const std::optional<DlpackTensor>& t);

}  // namespace tilejit::python
