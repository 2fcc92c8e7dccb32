// Tensor types of the IR: dims (static or named-symbolic), layouts, and the
// TensorType that ties a dtype, a shape and a layout together.
//
//   auto x = TensorType::make(DType::bf16, {Dim::sym("M"), Dim::fixed(4096)});
//   auto w = TensorType::make(DType::bf16, {Dim::fixed(4096), Dim::fixed(4096)},
//                             Layout::vnni2());
//   x.str() == "tensor<?Mx4096xbf16>"
//
// The structs are plain and public (they are copied into keys and compared); the
// factories are the validating way to build them, and check_type() states every
// well-formedness rule in one place for values built by hand.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tilejit/tilejit.h"

namespace tilejit::ir {

// Inverse of tilejit::dtype_name ("bf16" -> DType::bf16).
std::optional<DType> dtype_from_name(std::string_view name);
// The names dtype_from_name knows, for messages ("f32, bf16, ...").
std::string known_dtypes_text();

// One dimension: a static size, or a named runtime size ("M"). Two dims are the
// same only if both are the same constant or the same symbol: symbols are how
// the IR says "these sizes are equal" without knowing them.
struct Dim {
  int64_t value = 0;   // the size when static
  std::string symbol;  // non-empty when symbolic

  // Throws tilejit::Error on a negative size.
  static Dim fixed(int64_t value);
  // Throws tilejit::Error unless name is an identifier without a lowercase 'x'
  // ('x' separates dims in the text form: tensor<?Mx4096xbf16>).
  static Dim sym(std::string name);

  bool is_static() const { return symbol.empty(); }
  std::string str() const;  // "4096" or "?M"
  bool operator==(const Dim&) const = default;
};

enum class LayoutKind { row_major, packed };

// How the elements are laid out in memory.
//  - row_major: strides in elements; empty = contiguous. A stride may be dynamic
//    (std::nullopt, printed "?"), e.g. a row stride known only at run time.
//  - packed: a named blocked format with integer parameters, e.g. "vnni2" with
//    n_block=64, k_pair=2: the bf16 GEMM weight layout [ceil(N/64)][ceil(K/2)][64][2].
//    The dims of a packed tensor stay the logical ones ([N, K]).
struct Layout {
  using Stride = std::optional<int64_t>;
  using Param = std::pair<std::string, int64_t>;

  LayoutKind kind = LayoutKind::row_major;
  std::vector<Stride> strides;  // row_major only
  std::string format;           // packed only
  std::vector<Param> params;    // packed only, canonical order (see packed())

  static Layout row_major() { return {}; }
  // Throws on a negative stride.
  static Layout strided(std::vector<Stride> strides);
  // Throws on an empty format or a duplicate parameter. Parameters of a known
  // format are put in its declared order, others sorted by name, so that equal
  // layouts compare and print equal.
  static Layout packed(std::string format, std::vector<Param> params);
  // The bf16 GEMM weight layout.
  static Layout vnni2(int64_t n_block = 64, int64_t k_pair = 2);

  bool is_contiguous() const { return kind == LayoutKind::row_major && strides.empty(); }
  bool is_packed(std::string_view fmt) const { return kind == LayoutKind::packed && format == fmt; }
  std::optional<int64_t> param(std::string_view name) const;
  // "" for contiguous, "strided<[?, 1]>", "packed<vnni2, n_block=64, k_pair=2>".
  std::string str() const;
  bool operator==(const Layout&) const = default;
};

struct TensorType {
  DType dtype = DType::f32;
  std::vector<Dim> dims;
  Layout layout;

  // Validating factory: throws tilejit::Error with the first check_type() problem.
  static TensorType make(DType dtype, std::vector<Dim> dims, Layout layout = {});

  int rank() const { return static_cast<int>(dims.size()); }
  // "tensor<?Mx4096xbf16>", "tensor<4096x4096xbf16, packed<vnni2, n_block=64, k_pair=2>>".
  std::string str() const;
  bool operator==(const TensorType&) const = default;
};

// Appends every well-formedness problem of `t` (stride count vs rank, unknown
// packed format, missing or bad format parameters, ...). Empty = well formed.
void check_type(const TensorType& t, std::vector<std::string>& problems);

// A packed format the IR knows: its required parameters (in canonical order),
// and the dtypes and minimum rank it applies to.
struct PackedFormat {
  std::string_view name;
  std::vector<std::string_view> params;
  std::vector<DType> dtypes;
  int min_rank;
};
const PackedFormat* find_packed_format(std::string_view name);

// True for [A-Za-z_][A-Za-z0-9_]*.
bool is_identifier(std::string_view s);

}  // namespace tilejit::ir
