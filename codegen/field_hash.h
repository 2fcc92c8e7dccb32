// A hash over a descriptor's fields() tuple, so a descriptor's hash covers
// exactly the fields its equality compares (a member added to fields() is
// hashed too; none can be skipped by a hand-written hash).
#pragma once

#include <cstddef>
#include <functional>
#include <tuple>
#include <type_traits>

namespace tilejit::codegen {

template <class T>
size_t hash_field(const T& v) {
  using U = std::decay_t<T>;
  if constexpr (std::is_enum_v<U>)
    return std::hash<std::underlying_type_t<U>>()(static_cast<std::underlying_type_t<U>>(v));
  else
    return std::hash<U>()(v);
}

template <class Tuple>
size_t hash_fields(const Tuple& fields) {
  size_t h = 0;
  std::apply([&](const auto&... f) { ((h = h * 1000003u ^ hash_field(f)), ...); }, fields);
  return h;
}

}  // namespace tilejit::codegen
