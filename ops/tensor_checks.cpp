#include "ops/tensor_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "runtime/stride_clash.h"

namespace tilejit::ops {

std::string shape_str(const std::vector<int64_t>& v) {
  // A list option (mrope_section, ...) may hold any number of entries: a
  // message shows the first 8 and the last 2 (100001 entries made 300 KB).
  constexpr size_t kHead = 8, kTail = 2;
  if (v.size() <= kHead + kTail + 1) return fmt::format("[{}]", fmt::join(v, ", "));
  return fmt::format("[{}, ... {} more ..., {}]", fmt::join(v.begin(), v.begin() + kHead, ", "),
                     v.size() - kHead - kTail, fmt::join(v.end() - kTail, v.end(), ", "));
}

namespace {

// Element size in bytes for alignment (u4: 1, two per byte).
int64_t align_of(DType t) {
  return std::max(1, dtype_bits(t) / 8);
}

// Bytes spanned by `elems` consecutive elements of the dtype.
int64_t bytes_of_elems(DType t, int64_t elems) {
  const int bits = dtype_bits(t);
  return bits == 4 ? (elems + 1) / 2 : elems * (bits / 8);
}

// 1 + Σ (shape[i] − 1)·strides[i] over dims from `first` on (elements), or -1
// on overflow. The view must have no zero dim.
int64_t span_elems(const TensorView& t, size_t first) {
  int64_t last = 0;
  for (size_t i = first; i < t.shape.size(); ++i) {
    int64_t step;
    if (__builtin_mul_overflow(t.shape[i] - 1, t.strides[i], &step) ||
        __builtin_add_overflow(last, step, &last))
      return -1;
  }
  // (649658 − 1)·((2^63 − 1)/649657) is exactly INT64_MAX: the +1 overflows too.
  return __builtin_add_overflow(last, 1, &last) ? -1 : last;
}

bool is_empty(const TensorView& t) {
  return std::any_of(t.shape.begin(), t.shape.end(), [](int64_t d) { return d == 0; });
}

uintptr_t address(const TensorView& t) {
  return reinterpret_cast<uintptr_t>(t.data);
}

}  // namespace

void check_view(const char* op, const char* arg, const TensorView& t, size_t rank) {
  try {
    (void)dtype_bits(t.dtype);
  } catch (const Error&) {
    throw Error(fmt::format("{}: {}.dtype={} is not a DType; allowed: a DType enumerator", op, arg,
                            static_cast<int>(t.dtype)));
  }
  if (t.shape.size() != rank)
    throw Error(fmt::format("{}: {} has shape {} (rank {}); allowed: rank {}", op, arg,
                            shape_str(t.shape), t.shape.size(), rank));
  if (t.strides.size() != t.shape.size())
    throw Error(fmt::format("{}: {} has {} strides {} for shape {}; allowed: one stride per dim",
                            op, arg, t.strides.size(), shape_str(t.strides), shape_str(t.shape)));
  for (size_t i = 0; i < rank; ++i) {
    if (t.shape[i] < 0)
      throw Error(fmt::format("{}: {} has shape {}; allowed: non-negative dims", op, arg,
                              shape_str(t.shape)));
    if (t.shape[i] > Limits::max_dim)
      throw Error(fmt::format("{}: {} has shape {}: dim {} = {}; allowed: dims <= {} (2^31 - 1)",
                              op, arg, shape_str(t.shape), i, t.shape[i], Limits::max_dim));
    if (t.strides[i] < 0)
      throw Error(fmt::format("{}: {} has strides {}; allowed: non-negative strides", op, arg,
                              shape_str(t.strides)));
    // Even the stride of a dim of size 1 is multiplied by an element size
    // (a row stride in bytes): bounded like any extent, so that cannot overflow.
    if (t.strides[i] > Limits::max_view_bytes)
      throw Error(fmt::format("{}: {} has strides {}: stride {} = {}; allowed: strides <= 2^56", op,
                              arg, shape_str(t.strides), i, t.strides[i]));
  }
  if (is_empty(t)) return;  // nothing is ever read or written through it
  if (t.data == nullptr)
    throw Error(fmt::format("{}: {} data is null for shape {}; allowed: a valid pointer", op, arg,
                            shape_str(t.shape)));
  const int64_t align = align_of(t.dtype);
  if (address(t) % static_cast<uintptr_t>(align) != 0)
    throw Error(
        fmt::format("{}: {} data {} is not aligned to its {}-byte {} elements; allowed: an "
                    "address that is a multiple of {}",
                    op, arg, t.data, align, dtype_name(t.dtype), align));
  const int64_t span = span_elems(t, 0);
  int64_t bytes = span < 0 ? -1 : bytes_of_elems(t.dtype, std::min(span, Limits::max_view_bytes));
  if (span < 0 || span > Limits::max_view_bytes || bytes > Limits::max_view_bytes ||
      address(t) > std::numeric_limits<uintptr_t>::max() - static_cast<uintptr_t>(bytes))
    throw Error(
        fmt::format("{}: {} has shape {} and strides {}: it would span {} bytes from {}; "
                    "allowed: a view within the address space (at most 2^56 bytes)",
                    op, arg, shape_str(t.shape), shape_str(t.strides),
                    span < 0 ? std::string("more than 2^63") : std::to_string(bytes), t.data));
}

int64_t view_bytes(const TensorView& t) {
  if (t.shape.empty()) return bytes_of_elems(t.dtype, 1);
  if (is_empty(t)) return 0;
  return bytes_of_elems(t.dtype, span_elems(t, 0));
}

void check_writable(const char* op, const char* arg, const TensorView& t) {
  if (is_empty(t)) return;
  // Sufficient condition, dims by increasing stride: each stride steps past
  // everything the smaller-stride dims span (the layouts of real outputs).
  std::vector<size_t> dims;
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (t.shape[i] > 1) dims.push_back(i);
  std::sort(dims.begin(), dims.end(),
            [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
  int64_t inner = 1;  // elements spanned by the dims so far (fits: check_view bounded it)
  for (size_t i : dims) {
    // A conservative rule: a layout that interleaves indices without sharing
    // an element is refused too, so the message says what the layout does,
    // not that an element is written twice.
    if (t.strides[i] < inner)
      throw Error(fmt::format(
          "{}: {} has shape {} and strides {}: {}; allowed: an output whose elements do not "
          "overlap, each stride past the span of the dims with smaller strides (no stride 0, "
          "no interleaved rows)",
          op, arg, shape_str(t.shape), shape_str(t.strides),
          t.strides[i] == 0
              ? fmt::format("dim {} has stride 0 (each of its indices writes the same elements)", i)
              : fmt::format("dim {} (stride {}) steps inside the {} elements that the dims with "
                            "smaller strides span",
                            i, t.strides[i], inner)));
    inner += (t.shape[i] - 1) * t.strides[i];
  }
}

namespace {

// Whether a and b, of one dtype (whole bytes) and the same strides, share a
// byte, exactly: a's elements lie at Σ i_m·s_m, b's at d + Σ j_m·s_m (bytes,
// d = b0 − a0), so they meet iff some δ_m = i_m − j_m ∈ [−(nb_m − 1),
// na_m − 1] puts Σ δ_m·s_m within e of d. Dims from the largest stride
// down; at each, the δ whose remainder the inner dims can still reach (two
// at most when each stride steps past the inner dims' spans, as real layouts
// do). nullopt when a dim would need more than kMaxCandidates, or the
// search more than kMaxVisits steps.
std::optional<bool> same_strides_overlap(const TensorView& a, const TensorView& b, int64_t d) {
  constexpr int64_t kMaxCandidates = 64;
  const int64_t e = bytes_of_elems(a.dtype, 1);
  struct Dim {
    int64_t stride, na, nb;
  };
  std::vector<Dim> dims;
  for (size_t i = 0; i < a.shape.size(); ++i)
    if (a.strides[i] != 0 && (a.shape[i] > 1 || b.shape[i] > 1))
      dims.push_back({bytes_of_elems(a.dtype, a.strides[i]), a.shape[i], b.shape[i]});
  std::sort(dims.begin(), dims.end(),
            [](const Dim& x, const Dim& y) { return x.stride > y.stride; });
  // reach_a[k], reach_b[k]: Σ over dims from k on of (n − 1)·stride.
  std::vector<int64_t> reach_a(dims.size() + 1, 0), reach_b(dims.size() + 1, 0);
  for (size_t k = dims.size(); k-- > 0;) {
    reach_a[k] = reach_a[k + 1] + (dims[k].na - 1) * dims[k].stride;
    reach_b[k] = reach_b[k + 1] + (dims[k].nb - 1) * dims[k].stride;
  }
  auto floor_div = [](int64_t x, int64_t y) {
    return x / y - ((x % y != 0) && ((x < 0) != (y < 0)));
  };
  // Whether Σ_{m >= k} δ_m·s_m can lie in (r − e, r + e). A search past
  // kMaxVisits (strides that do not nest, in many dims) is left undecided.
  constexpr int64_t kMaxVisits = 4096;
  int64_t visits = 0;
  std::optional<bool> undecided;
  auto meet = [&](auto& self, size_t k, int64_t r) -> bool {
    if (k == dims.size()) return r > -e && r < e;
    const Dim& dm = dims[k];
    // δ·s must lie in (r − e − A, r + e + B), A / B the inner dims' reach.
    const int64_t lo = std::max(floor_div(r - e - reach_a[k + 1], dm.stride), -(dm.nb - 1));
    const int64_t hi = std::min(floor_div(r + e + reach_b[k + 1], dm.stride) + 1, dm.na - 1);
    if (hi - lo + 1 > kMaxCandidates || ++visits > kMaxVisits) {
      undecided = true;
      return true;
    }
    for (int64_t delta = lo; delta <= hi; ++delta)
      if (self(self, k + 1, r - delta * dm.stride)) return true;
    return false;
  };
  const bool overlap = meet(meet, 0, d);
  if (undecided) return std::nullopt;
  return overlap;
}

}  // namespace

bool views_overlap(const TensorView& a, const TensorView& b) {
  if (is_empty(a) || is_empty(b)) return false;
  const uintptr_t a0 = address(a), a1 = a0 + static_cast<uintptr_t>(view_bytes(a));
  const uintptr_t b0 = address(b), b1 = b0 + static_cast<uintptr_t>(view_bytes(b));
  if (a1 <= b0 || b1 <= a0) return false;
  // Views of one dtype and the same strides (K and V caches as column halves
  // of one buffer, q / k / v as slices of a fused qkv): exact. The byte
  // ranges intersect and each spans ≤ 2^56 bytes, so the distance fits. A
  // dim of size 1 never steps, so its stride is whatever the other view's
  // is (DLPack exporters rewrite those strides: torch gives a one-head k
  // stride 1 where q's head stride is D).
  if (a.dtype == b.dtype && dtype_bits(a.dtype) % 8 == 0 && a.shape.size() == b.shape.size()) {
    TensorView na = a, nb = b;
    for (size_t i = 0; i < a.shape.size(); ++i) {
      if (na.shape[i] == 1) na.strides[i] = nb.strides[i];
      if (nb.shape[i] == 1) nb.strides[i] = na.strides[i];
    }
    if (na.strides == nb.strides)
      if (const auto exact = same_strides_overlap(na, nb, static_cast<int64_t>(b0 - a0)))
        return *exact;
  }
  // Interleaved views: one outermost period S (bytes) that both repeat with,
  // each one's part of a period an interval [lo mod S, lo mod S + footprint).
  auto period = [](const TensorView& t) -> int64_t {
    if (t.shape.empty() || t.shape[0] < 2) return 0;
    return bytes_of_elems(t.dtype, t.strides[0]);
  };
  auto footprint = [](const TensorView& t) -> int64_t {  // bytes of one index of dim 0
    if (t.shape.size() < 2) return bytes_of_elems(t.dtype, 1);
    return t.shape[0] < 2 ? view_bytes(t) : bytes_of_elems(t.dtype, span_elems(t, 1));
  };
  int64_t pa = period(a), pb = period(b);
  int64_t fa = footprint(a), fb = footprint(b);
  // A view no longer than the other's period (a weight or bias vector in a
  // padded matrix's row padding) lies within one period of it: its part of
  // the period is its whole extent.
  if (pa != 0 && pb != pa && view_bytes(b) <= pa) {
    pb = 0;
    fb = view_bytes(b);
  } else if (pb != 0 && pa != pb && view_bytes(a) <= pb) {
    pa = 0;
    fa = view_bytes(a);
  }
  const int64_t s = pa != 0 ? pa : pb;
  if (s == 0 || (pa != 0 && pb != 0 && pa != pb)) return true;
  if (dtype_bits(a.dtype) == 4 || dtype_bits(b.dtype) == 4) return true;  // half-byte periods
  if (fa > s || fb > s) return true;
  // The byte ranges intersect and each spans ≤ 2^56 bytes, so the distance fits.
  const int64_t diff = static_cast<int64_t>(b0 - a0);
  const int64_t rel = (diff % s + s) % s;
  return rel < fa || rel + fb > s;
}

void check_disjoint(const char* op, const char* out_arg, const TensorView& out, const char* in_arg,
                    const TensorView& in) {
  if (views_overlap(out, in))
    throw Error(fmt::format(
        "{}: {} (data {}, shape {}, strides {}) overlaps {} (data {}, shape {}, strides {}); "
        "allowed: {} in memory that {} does not use",
        op, out_arg, out.data, shape_str(out.shape), shape_str(out.strides), in_arg, in.data,
        shape_str(in.shape), shape_str(in.strides), out_arg, in_arg));
}

void check_output(const char* op, const char* arg, const TensorView& out,
                  std::initializer_list<NamedView> inputs) {
  check_writable(op, arg, out);
  for (const NamedView& in : inputs)
    if (in.view != nullptr) check_disjoint(op, arg, out, in.name, *in.view);
}

int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw Error(fmt::format("{}: {} = {}·{} overflows int64; allowed: a product below 2^63", op,
                            what, a, b));
  return r;
}

int64_t checked_add(const char* op, const char* what, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw Error(
        fmt::format("{}: {} = {} + {} overflows int64; allowed: a sum below 2^63", op, what, a, b));
  return r;
}

void check_finite(const char* op, const char* arg, float value) {
  if (!std::isfinite(value))
    throw Error(fmt::format("{}: {}={}; allowed: a finite value", op, arg, value));
}

int64_t saturating_mul(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<int64_t>::max() : r;
}

void check_count(const char* op, const char* what, int64_t v, int64_t min, int64_t max) {
  if (v < min || v > max)
    throw Error(fmt::format("{}: {}={}; allowed: {} .. {}", op, what, v, min, max));
}

void check_dtype(const char* op, const char* arg, const TensorView& t,
                 std::initializer_list<DType> allowed) {
  std::vector<std::string> names;
  for (DType d : allowed) {
    if (d == t.dtype) return;
    names.push_back(dtype_name(d));
  }
  // A value outside the enum (a C++ caller's cast) is named here too: dtype_name
  // would throw its own Error, naming neither the operator nor the argument.
  std::string got;
  try {
    got = dtype_name(t.dtype);
  } catch (const Error&) {
    got = fmt::format("{} (not a DType enumerator)", static_cast<int>(t.dtype));
  }
  throw Error(fmt::format("{}: {}.dtype={} is not allowed; allowed: {}", op, arg, got,
                          fmt::join(names, ", ")));
}

void check_row_major_rows(const char* op, const char* arg, const TensorView& t) {
  const size_t r = t.shape.size();
  if (r == 0) return;
  if (t.strides[r - 1] != 1 && t.shape[r - 1] > 1)
    throw Error(fmt::format("{}: {} has strides {}; allowed: innermost stride 1", op, arg,
                            shape_str(t.strides)));
  if (r >= 2 && t.shape[r - 2] > 1 && t.strides[r - 2] < t.shape[r - 1])
    throw Error(fmt::format("{}: {} has row stride {} < row length {}; allowed: row stride >= {}",
                            op, arg, t.strides[r - 2], t.shape[r - 1], t.shape[r - 1]));
}

void check_distinct_matrix(const char* op, const char* arg, const TensorView& t) {
  const size_t r = t.shape.size();
  if (r < 2) return;
  std::vector<runtime::StrideAxis> axes;
  for (size_t i = r - 2; i < r; ++i) {
    if (t.shape[i] == 0) return;  // no elements (the caller's shape check)
    if (t.shape[i] > 1) axes.push_back({i, t.strides[i], t.shape[i]});
  }
  const auto c = runtime::find_stride_clash(axes);
  if (!c) return;
  if (axes.size() == 1)  // one axis of stride 0
    throw Error(fmt::format(
        "{}: {} has strides {}: stride 0 over {} elements; allowed: every element at its own "
        "address",
        op, arg, shape_str(t.strides), c->inner.extent));
  throw Error(fmt::format(
      "{}: {} has shape {} and strides {}, under which two elements share an address; allowed: "
      "strides that give every element its own (row-major rows, or a transposed [K, N] view)",
      op, arg, shape_str(t.shape), shape_str(t.strides)));
}

void check_index_dtype(const char* op, const char* arg, const TensorView& t) {
  check_dtype(op, arg, t, {DType::i32, DType::i64});
}

}  // namespace tilejit::ops
