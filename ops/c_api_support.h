// What every function of the C API (include/tilejit/tilejit_c.h) shares:
// the call wrapper that turns every C++ exception into a status and the
// calling thread's last-error message, and the conversions of the C structs
// into the C++ API's types. The C functions are thin: the checks and the
// semantics are the C++ operators' own (one home), plus what only a C
// caller can get wrong (NULL pointers, an options struct not set up by its
// _init function, an ndim past TILEJIT_MAX_NDIM).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tilejit/tilejit.h"
#include "tilejit/tilejit_c.h"

namespace tilejit::c_api {

// Stores msg (truncated to the buffer with "...") as the thread's last error.
// Never allocates: it runs while handling std::bad_alloc.
void set_last_error(const char* prefix, const char* msg, const char* more = "") noexcept;

// A C argument the C layer itself refuses (a NULL pointer, a tensor
// description, an options struct's size), before any operator sees it: call()
// puts the C function's name in front, as the operators name theirs.
class CArgError : public Error {
 public:
  using Error::Error;
};

// Runs body for the C function fn (its __func__); TILEJIT_OK, or the status of
// what it threw with its message recorded. A thread's cancellation
// (abi::__forced_unwind) passes through: swallowing it would end the process.
tilejit_status call(const char* fn, void (*body)(void*), void* ctx);
template <class F>
tilejit_status call(const char* fn, F&& body) {
  return call(
      fn, [](void* f) { (*static_cast<std::remove_reference_t<F>*>(f))(); },
      const_cast<void*>(static_cast<const void*>(&body)));
}

// An argument a C caller passed as NULL where the call needs one.
template <class T>
T& deref(T* p, const char* arg) {
  if (p == nullptr) throw CArgError(std::string(arg) + " is NULL; allowed: a pointer to a value");
  return *p;
}

// The int a C enum field holds, read without assuming it is one of the
// enumerators (a C caller may store any int there).
template <class E>
int enum_value(const E& e) {
  static_assert(std::is_enum_v<E> && sizeof(E) == sizeof(int));
  int v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}
// A C enum as the C++ enum of the same values (both int-sized; the C++
// functions refuse a value outside their enum, naming it).
template <class To, class From>
To to_enum(const From& e) {
  static_assert(std::is_same_v<std::underlying_type_t<To>, int>);
  return static_cast<To>(enum_value(e));
}

// The struct_size values of an options struct's earlier published layouts
// (each the current layout's first fields: fields are only ever appended), so
// a caller compiled against an older tilejit_c.h keeps working; none for a
// struct that never grew.
template <class T>
struct EarlierLayouts {
  static constexpr std::array<uint32_t, 0> sizes{};
};
// tilejit_moe_options before shared_weights (C API version 1's first layout).
template <>
struct EarlierLayouts<tilejit_moe_options> {
  static constexpr std::array<uint32_t, 1> sizes{
      static_cast<uint32_t>(offsetof(tilejit_moe_options, shared_weights))};
};

// An options struct, copied: NULL means the defaults (nullopt). Its
// struct_size is this header's sizeof(T), or an earlier layout's (the fields
// it lacks take init's defaults); any other (a zeroed or uninitialised
// struct) is an Error naming the init function.
template <class T>
std::optional<T> options(const T* opt, const char* arg, const char* init_name, void (*init)(T*)) {
  if (opt == nullptr) return std::nullopt;
  if (opt->struct_size == sizeof(T)) return *opt;
  std::string allowed = std::to_string(sizeof(T));
  for (const uint32_t size : EarlierLayouts<T>::sizes) {
    if (opt->struct_size == size) {
      T full;
      init(&full);
      std::memcpy(static_cast<void*>(&full), opt, size);
      full.struct_size = sizeof(T);
      return full;
    }
    allowed += " or " + std::to_string(size) + " (an earlier header's)";
  }
  throw CArgError(std::string(arg) + ".struct_size = " + std::to_string(opt->struct_size) +
                  "; allowed: " + allowed + " (set by " + init_name + ")");
}

// A tensor argument (arg names it in messages).
TensorView view(const tilejit_tensor* t, const char* arg);
// An optional tensor: NULL is absent.
std::optional<TensorView> optional_view(const tilejit_tensor* t, const char* arg);

Int8Weight int8_weight(const tilejit_int8_weight& w, const std::string& arg);
Fp8Weight fp8_weight(const tilejit_fp8_weight& w, const std::string& arg);
Int4Weight int4_weight(const tilejit_int4_weight& w, const std::string& arg);
Mxfp4Weight mxfp4_weight(const tilejit_mxfp4_weight& w, const std::string& arg);

// An array of count C descriptions (one per expert), converted by conv.
template <class C, class F>
auto weight_array(const C* w, int64_t count, const char* arg, F conv) {
  if (count < 1 || count > Limits::max_experts)
    throw CArgError(std::string("num_experts = ") + std::to_string(count) + "; allowed: 1.." +
                    std::to_string(Limits::max_experts));
  deref(w, arg);
  std::vector<decltype(conv(*w, std::string()))> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t e = 0; e < count; ++e)
    out.push_back(conv(w[e], std::string(arg) + "[" + std::to_string(e) + "]"));
  return out;
}

KvCacheScales kv_scales(const tilejit_kv_cache_scales& s);

}  // namespace tilejit::c_api

// The handles: a C++ object and the strings the C caller reads through them.
struct tilejit_packed_weight {
  tilejit::PackedWeight w;
  std::string layout;
};
struct tilejit_packed_experts {
  tilejit::PackedExperts w;
  std::string layout;
};

namespace tilejit::c_api {

// A tilejit_pack_* function: packs through make() into a new handle
// (tilejit_packed_weight or tilejit_packed_experts); *out is NULL on failure.
template <class Handle, class F>
tilejit_status make_handle(const char* fn, Handle** out, F make) {
  if (out != nullptr) *out = nullptr;
  return call(fn, [&] {
    deref(out, "out");
    auto handle = std::make_unique<Handle>();
    handle->w = make();
    handle->layout = handle->w.layout();
    *out = handle.release();
  });
}

}  // namespace tilejit::c_api
