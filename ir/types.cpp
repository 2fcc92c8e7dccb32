#include "ir/types.h"
#include "runtime/lazy_statics.h"

#include <algorithm>
#include <array>

#include "ir/text_util.h"
#include "runtime/dtype_list.h"
#include "runtime/stride_clash.h"

namespace tilejit::ir {

namespace {

// The formats the IR knows. Adding a packed weight layout means adding a row
// here (and its parameter rules in check_packed below).
const std::array<PackedFormat, 1>& packed_formats() {
  // Immortal: read by threads that may outlive static destruction.
  static const std::array<PackedFormat, 1>& formats = *new std::array<PackedFormat, 1>{
      PackedFormat{"vnni2", {"n_block", "k_pair"}, {DType::bf16}, 2},
  };
  return formats;
}
const bool g_fork_hook = runtime::on_fork_complete([] { (void)packed_formats(); });

void check_packed(const TensorType& t, std::vector<std::string>& problems) {
  const Layout& l = t.layout;
  if (!l.strides.empty()) problems.push_back("a packed layout has no strides");
  const PackedFormat* f = find_packed_format(l.format);
  if (f == nullptr) {
    problems.push_back(cat("unknown packed format '", l.format, "' (known: vnni2)"));
    return;
  }
  for (const auto& [name, value] : l.params) {
    if (std::find(f->params.begin(), f->params.end(), name) == f->params.end()) {
      problems.push_back(cat("packed<", f->name, "> has no parameter '", name, "'"));
    } else if (value < 1) {
      problems.push_back(
          cat("packed<", f->name, "> parameter ", name, "=", value, " must be positive"));
    }
  }
  for (std::string_view p : f->params) {
    if (!l.param(p)) problems.push_back(cat("packed<", f->name, "> needs parameter '", p, "'"));
  }
  if (auto k_pair = l.param("k_pair"); f->name == "vnni2" && k_pair && *k_pair != 2) {
    problems.push_back(
        cat("packed<vnni2> needs k_pair=2 (pairs of bf16 along K), got k_pair=", *k_pair));
  }
  if (std::find(f->dtypes.begin(), f->dtypes.end(), t.dtype) == f->dtypes.end()) {
    problems.push_back(cat("packed<", f->name, "> does not apply to dtype ", dtype_name(t.dtype)));
  }
  if (t.rank() < f->min_rank) {
    problems.push_back(
        cat("packed<", f->name, "> needs rank >= ", f->min_rank, ", got rank ", t.rank()));
  }
}

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : runtime::kAllDTypes) {
    if (name == dtype_name(t)) return t;
  }
  return std::nullopt;
}

std::string known_dtypes_text() {
  return join(runtime::kAllDTypes, ", ", [](DType t) { return std::string(dtype_name(t)); });
}

bool is_identifier(std::string_view s) {
  if (s.empty() || is_digit(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return is_ident_char(c); });
}

Dim Dim::fixed(int64_t value) {
  if (value < 0) throw Error(cat("Dim::fixed: size ", value, " is negative"));
  return Dim{value, {}};
}

Dim Dim::sym(std::string name) {
  if (!is_identifier(name)) {
    throw Error(cat("Dim::sym: '", name, "' is not an identifier ([A-Za-z_][A-Za-z0-9_]*)"));
  }
  if (name.find('x') != std::string::npos) {
    throw Error(
        cat("Dim::sym: symbol '", name,
            "' contains 'x', which separates dims in the text form (tensor<?Mx4096xbf16>)"));
  }
  return Dim{0, std::move(name)};
}

std::string Dim::str() const {
  return is_static() ? std::to_string(value) : "?" + symbol;
}

Layout Layout::strided(std::vector<Stride> strides) {
  for (const Stride& s : strides) {
    if (s && *s < 0) throw Error(cat("Layout::strided: stride ", *s, " is negative"));
  }
  Layout l;
  l.strides = std::move(strides);
  return l;
}

Layout Layout::packed(std::string format, std::vector<Param> params) {
  if (!is_identifier(format)) {
    throw Error(cat("Layout::packed: format '", format, "' is not an identifier"));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (params[i].first == params[j].first) {
        throw Error(cat("Layout::packed: parameter '", params[i].first, "' given twice"));
      }
    }
  }
  // Canonical order: a known format's declared order, else by name.
  auto rank_of = [f = find_packed_format(format)](const std::string& name) -> size_t {
    if (f == nullptr) return 0;
    auto it = std::find(f->params.begin(), f->params.end(), name);
    return static_cast<size_t>(it - f->params.begin());
  };
  std::stable_sort(params.begin(), params.end(), [&](const Param& a, const Param& b) {
    size_t ra = rank_of(a.first), rb = rank_of(b.first);
    return ra != rb ? ra < rb : a.first < b.first;
  });
  Layout l;
  l.kind = LayoutKind::packed;
  l.format = std::move(format);
  l.params = std::move(params);
  return l;
}

Layout Layout::vnni2(int64_t n_block, int64_t k_pair) {
  return packed("vnni2", {{"n_block", n_block}, {"k_pair", k_pair}});
}

std::optional<int64_t> Layout::param(std::string_view name) const {
  for (const auto& [n, v] : params) {
    if (n == name) return v;
  }
  return std::nullopt;
}

std::string Layout::str() const {
  if (kind == LayoutKind::packed) {
    std::string s = "packed<" + format;
    for (const auto& [n, v] : params) s += cat(", ", n, "=", v);
    return s + ">";
  }
  if (strides.empty()) return "";
  std::string s = "strided<[";
  for (size_t i = 0; i < strides.size(); ++i) {
    if (i) s += ", ";
    s += strides[i] ? std::to_string(*strides[i]) : "?";
  }
  return s + "]>";
}

TensorType TensorType::make(DType dtype, std::vector<Dim> dims, Layout layout) {
  TensorType t{dtype, std::move(dims), std::move(layout)};
  std::vector<std::string> problems;
  check_type(t, problems);
  if (!problems.empty()) throw Error(cat(t.str(), ": ", problems.front()));
  return t;
}

std::string TensorType::str() const {
  std::string s = "tensor<";
  for (const Dim& d : dims) s += d.str() + "x";
  s += dtype_name(dtype);
  if (std::string l = layout.str(); !l.empty()) s += ", " + l;
  return s + ">";
}

namespace {

// Strides that give two elements one address (rows closer than a row's
// length, a stride 0 over a dim of 2 or more) describe no tensor an input
// file can be laid out into: the tool would have to drop values. Checked
// where strides and extents are static: taken in increasing stride order,
// each stride must step over everything the smaller ones span.
void check_no_overlap(const TensorType& t, std::vector<std::string>& problems) {
  std::vector<runtime::StrideAxis> axes;
  for (size_t i = 0; i < t.dims.size(); ++i) {
    const Dim& d = t.dims[i];
    if (d.is_static() && d.value == 0) return;    // no elements
    if (d.is_static() && d.value == 1) continue;  // its stride is never used
    if (!t.layout.strides[i]) return;             // unknown: the view check at run time
    axes.push_back({i, *t.layout.strides[i], d.is_static() ? d.value : -1});
  }
  const auto c = runtime::find_stride_clash(std::move(axes));
  if (!c) return;
  if (c->zero)
    problems.push_back(cat("stride 0 on dim ", c->inner.dim, " of extent ",
                           t.dims[c->inner.dim].str(),
                           " gives its elements one address; allowed: strides under which every "
                           "element has its own address"));
  else
    problems.push_back(cat("strides ", t.layout.str(), " overlap: dim ", c->outer.dim, "'s stride ",
                           c->outer.stride, " is less than the ", c->inner.extent, " × ",
                           c->inner.stride, " elements dim ", c->inner.dim,
                           " spans; allowed: strides under which every element has its own "
                           "address"));
}

}  // namespace

void check_type(const TensorType& t, std::vector<std::string>& problems) {
  for (const Dim& d : t.dims) {
    if (d.is_static() && d.value < 0) problems.push_back(cat("dim ", d.value, " is negative"));
    // Every operator refuses larger dims (check_view): refused where the
    // type is written, so that no stage multiplies two of them into an overflow.
    if (d.is_static() && d.value > Limits::max_dim)
      problems.push_back(cat("dim ", d.value, " is larger than ", Limits::max_dim,
                             ", the largest dim an operator takes (tilejit::Limits::max_dim)"));
    if (!d.is_static() && (!is_identifier(d.symbol) || d.symbol.find('x') != std::string::npos)) {
      problems.push_back(cat("dim symbol '", d.symbol, "' is not an identifier without 'x'"));
    }
  }
  if (t.layout.kind == LayoutKind::packed) {
    check_packed(t, problems);
    return;
  }
  const auto& s = t.layout.strides;
  if (!t.layout.format.empty() || !t.layout.params.empty()) {
    problems.push_back("a row_major layout has no format or parameters");
  }
  if (!s.empty() && s.size() != t.dims.size()) {
    problems.push_back(cat("layout has ", s.size(), " strides for rank ", t.rank()));
  }
  for (const auto& st : s) {
    if (st && *st < 0) problems.push_back(cat("stride ", *st, " is negative"));
  }
  if (problems.empty() && s.size() == t.dims.size()) check_no_overlap(t, problems);
}

const PackedFormat* find_packed_format(std::string_view name) {
  for (const PackedFormat& f : packed_formats()) {
    if (f.name == name) return &f;
  }
  return nullptr;
}

}  // namespace tilejit::ir
