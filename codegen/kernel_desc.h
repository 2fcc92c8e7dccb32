// The kernel descriptor concept: a descriptor declares its fields once, in a
// list with names, and its key text, kernel name, hash and equality are all
// generated from that list, so a field cannot be left out of one of them.
//
// A descriptor D provides
//   static constexpr const char* kFamily = "brgemm";
//   static constexpr auto field_list() {
//     return std::make_tuple(field("isa", &D::isa, "_"), field("mr", &D::mr, "_m"), ...);
//   }
// listing every data member in declaration order, and
//   static_assert(codegen::fields_cover<D>());
// after the struct: the tripwire. It recomputes the struct's size from the
// listed member types; a member added to the struct but not to the list (or a
// list out of declaration order) changes that size and stops the build.
//
// Key text:  "brgemm;isa=avx512;mr=7;..."  every field, always, exact (floats
//            as %a); the compile-once and disk caches key on it.
// Name:      "brgemm_avx512_bf16_f32acc_m7n64k4096_silu_bf16out": the family,
//            then each field as pre + value + post under its NameRule; it
//            names the kernel in dumps, logs and perf maps.
#pragma once

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstddef>
#include <functional>
#include <string>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::codegen {

// How a field appears in the kernel name.
enum class NameRule {
  always,          // pre + value + post
  unless_default,  // omitted when equal to the default-constructed descriptor's
  flag,            // bool: pre when true, nothing when false
  choice,          // bool: pre when true, post when false
  never,           // key only (implied by other fields, or noise in a name)
};

template <class D, class T>
struct Field {
  const char* key;
  T D::*member;
  const char* pre = "";
  const char* post = "";
  NameRule rule = NameRule::always;
};

template <class D, class T>
constexpr Field<D, T> field(const char* key, T D::*member, const char* pre = "",
                            const char* post = "", NameRule rule = NameRule::always) {
  return {key, member, pre, post, rule};
}
template <class D, class T>
constexpr Field<D, T> field(const char* key, T D::*member, const char* pre, NameRule rule) {
  return {key, member, pre, "", rule};
}

// ---- value texts (key and name); enums are spelled by their name functions.
inline std::string field_text(Isa v) {
  return isa_name(v);
}
inline std::string field_text(DType v) {
  return dtype_name(v);
}
inline std::string field_text(Activation v) {
  return activation_name(v);
}
inline std::string field_text(bool v) {
  return v ? "1" : "0";
}
template <class T>
requires std::is_integral_v<T> std::string field_text(T v) {
  return std::to_string(v);
}
// Exact bits in keys: the value is baked into the code. std::to_chars, not
// fmt's "{:a}" (libfmt 9 formats hex floats through snprintf, which follows
// the host's LC_NUMERIC: under de_DE a key read "0x1,b3b646p+0", so a host
// that set a locale missed every float-keyed kernel that the C-locale
// `tilejit tune` had cached).
inline std::string field_text(float v) {
  char buf[64];
  const double d = v;
  const bool neg = std::signbit(d);
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, neg ? -d : d, std::chars_format::hex);
  std::string digits(buf, ec == std::errc() ? end : buf);
  if (std::isfinite(d)) digits.insert(0, "0x");
  return neg ? "-" + digits : digits;
}
inline std::string field_text(const std::vector<int64_t>& v) {
  return fmt::format("{}", fmt::join(v, "x"));
}
// Names spell floats readably; everything else as in the key.
template <class T>
std::string field_name_text(const T& v) {
  if constexpr (std::is_floating_point_v<T>)
    return fmt::format("{}", v);
  else
    return field_text(v);
}

template <class T>
size_t field_hash(const T& v) {
  if constexpr (std::is_enum_v<T>)
    return std::hash<std::underlying_type_t<T>>()(static_cast<std::underlying_type_t<T>>(v));
  else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    size_t h = v.size();
    for (int64_t x : v) h = h * 1000003u ^ std::hash<int64_t>()(x);
    return h;
  } else
    return std::hash<T>()(v);
}

// ---- what the list generates.
template <class D>
auto tie_fields(const D& d) {
  return std::apply([&](const auto&... f) { return std::tie(d.*(f.member)...); }, D::field_list());
}

template <class D>
bool same_fields(const D& a, const D& b) {
  return tie_fields(a) == tie_fields(b);
}

// The family is not hashed: containers hold one descriptor type each.
template <class D>
size_t desc_hash(const D& d) {
  size_t h = 0;
  std::apply([&](const auto&... f) { ((h = h * 1000003u ^ field_hash(d.*(f.member))), ...); },
             D::field_list());
  return h;
}

template <class D>
std::string desc_key(const D& d) {
  std::string s = D::kFamily;
  std::apply(
      [&](const auto&... f) {
        ((s += fmt::format(";{}={}", f.key, field_text(d.*(f.member)))), ...);
      },
      D::field_list());
  return s;
}

template <class D>
std::string desc_name(const D& d) {
  static const D& defaults = *new D{};  // immortal: threads may outlive static destruction
  std::string s = D::kFamily;
  auto one = [&](const auto& f) {
    const auto& v = d.*(f.member);
    switch (f.rule) {
      case NameRule::never:
        return;
      case NameRule::unless_default:
        if (v == defaults.*(f.member)) return;
        break;
      case NameRule::flag:
      case NameRule::choice:
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>)
          s += v ? f.pre : (f.rule == NameRule::choice ? f.post : "");
        return;
      case NameRule::always:
        break;
    }
    s += f.pre;
    s += field_name_text(v);
    s += f.post;
  };
  std::apply([&](const auto&... f) { (one(f), ...); }, D::field_list());
  return s;
}

// The tripwire: the size a struct of exactly the listed member types, in list
// order, would have under the usual layout rules.
template <class D>
constexpr bool fields_cover() {
  size_t size = 0, align = 1;
  auto add = [&]<class T>(T D::*) {
    size = (size + alignof(T) - 1) / alignof(T) * alignof(T) + sizeof(T);
    align = alignof(T) > align ? alignof(T) : align;
  };
  std::apply([&](const auto&... f) { (add(f.member), ...); }, D::field_list());
  size = (size + align - 1) / align * align;
  return size == sizeof(D);
}

// Hash functor for unordered containers keyed on a descriptor.
struct DescHash {
  template <class D>
  size_t operator()(const D& d) const {
    return desc_hash(d);
  }
};

}  // namespace tilejit::codegen
