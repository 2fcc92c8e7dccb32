// libFuzzer harness: the public API (include/tilejit/tilejit.h) driven by a
// fuzzed description of one call: the operator, its shapes, strides, dtypes,
// options, and where each tensor lives in a bounded arena (aliasing,
// overlap, misalignment, null data and hostile sizes included).
//
// The contract under test: every call either raises tilejit::Error, or
// returns having written only its outputs, with the result the scalar path
// (TILEJIT_ISA=scalar) gives within a bound justified by the dtypes. The
// scalar path runs in a child process (this binary again, with
// TILEJIT_ISA=scalar; the path is chosen once per process) that decodes the
// same input and sends back its arena. Run with TILEJIT_ISA=scalar itself,
// the harness checks the scalar path alone (no oracle): that is how a
// finding of the child is reproduced in one process.
//
// Cases that would be legitimate but run for long (the contract allows a
// lot of work within its limits) are skipped before the call: the harness
// estimates the work from the shapes and calls only when it is small, or
// when some size is past Limits, where the call must fail fast.
#include <fuzzer/FuzzedDataProvider.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "runtime/bf16.h"
#include "tilejit/tilejit.h"

namespace {

using namespace tilejit;

constexpr size_t kArenaBytes = size_t(256) << 10;
// A call is made only when the estimated work (multiply-adds, elements
// moved) is below this, unless some size is past the contract's limits.
constexpr double kMaxWork = 4e6;

[[noreturn]] void die(const std::string& what) {
  fuzz::die("api_fuzzer", what);
}

// ---------------------------------------------------------------------------
// The arena: kArenaBytes between two PROT_NONE pages, so a kernel that reads
// or writes outside the tensors it was given faults (or shows as a changed
// byte outside the outputs) instead of touching the harness's heap.

struct Arena {
  uint8_t* base = nullptr;
  Arena() {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, kArenaBytes + 2 * page, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    auto* b = static_cast<uint8_t*>(p);
    mprotect(b, page, PROT_NONE);
    mprotect(b + page + kArenaBytes, page, PROT_NONE);
    base = b + page;
  }
};

Arena& arena() {
  static Arena a;
  return a;
}

// ---------------------------------------------------------------------------
// One tensor of the call, as the fuzzed description places it.

enum class Fill { values, ints, zeros };

struct Tensor {
  std::string name;
  DType dtype = DType::bf16;
  std::vector<int64_t> shape, strides;
  bool output = false;
  Fill fill = Fill::values;
  int64_t offset = 0;      // bytes from the arena base of element 0
  bool null = false;       // data = nullptr
  bool hostile = false;    // a view that cannot exist: extent overflows or > Limits
  bool violates = false;   // breaks a rule of the contract (dims, strides, alignment)
  int64_t lo = 0, hi = 0;  // byte range [lo, hi) the view spans, relative to the base
  TensorView view() const {
    return TensorView(null ? nullptr : arena().base + offset, dtype, shape, strides);
  }
};

// Bytes per element from the library's dtype_bits (u4 and the 8-bit types:
// 1); a DType outside the enum, which the harness makes on purpose, also 1.
int64_t elem_bytes(DType t) {
  try {
    return std::max(1, dtype_bits(t) / 8);
  } catch (const Error&) {
    return 1;
  }
}

constexpr int64_t kHostile[] = {int64_t{1} << 31,
                                (int64_t{1} << 32) + 2,
                                int64_t{1} << 40,
                                int64_t{1} << 60,
                                int64_t{1} << 62,
                                std::numeric_limits<int64_t>::max(),
                                -1,
                                std::numeric_limits<int64_t>::min(),
                                (int64_t{1} << 31) - 1};

class Case {
 public:
  explicit Case(FuzzedDataProvider& fdp) : fdp_(fdp) {}

  FuzzedDataProvider& fdp() { return fdp_; }

  // A dim: mostly one of `menu`, sometimes a hostile value.
  int64_t dim(std::initializer_list<int64_t> menu) {
    const int r = fdp_.ConsumeIntegralInRange(0, 63);
    if (r == 0) return fdp_.PickValueInArray(kHostile);
    if (r == 1) return 0;
    const int64_t pick = fdp_.ConsumeIntegralInRange<int64_t>(0, int64_t(menu.size()) - 1);
    return *(menu.begin() + pick);
  }
  int64_t small(int64_t lo, int64_t hi) {
    if (fdp_.ConsumeIntegralInRange(0, 63) == 0) return fdp_.PickValueInArray(kHostile);
    return fdp_.ConsumeIntegralInRange<int64_t>(lo, hi);
  }

  // Adds a tensor; the description may perturb its dtype, rank, strides,
  // placement (alias, overlap, misalignment) or make it null.
  Tensor& add(std::string name, DType dtype, std::vector<int64_t> shape, bool output,
              Fill fill = Fill::values) {
    Tensor t;
    t.name = std::move(name);
    t.dtype = dtype;
    t.shape = std::move(shape);
    t.output = output;
    t.fill = fill;
    const int mutation = fdp_.ConsumeIntegralInRange(0, 47);
    if (mutation == 0) t.dtype = static_cast<DType>(fdp_.ConsumeIntegralInRange(0, 9));
    if (mutation == 1 && !t.shape.empty()) t.shape.pop_back();
    if (mutation == 2) t.shape.push_back(fdp_.ConsumeIntegralInRange(1, 3));
    const int64_t eb = elem_bytes(t.dtype);
    // Row-major strides, rows padded by a few elements one time in four.
    t.strides.assign(t.shape.size(), 1);
    const int64_t pad =
        fdp_.ConsumeIntegralInRange(0, 3) == 0 ? fdp_.ConsumeIntegralInRange(1, 9) : 0;
    __int128 acc = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
      // Saturated: the strides of a shape whose size overflows stay hostile.
      const __int128 cap = std::numeric_limits<int64_t>::max();
      t.strides[i] = static_cast<int64_t>(std::min(acc, cap));
      const int64_t d = std::max<int64_t>(t.shape[i], 1);
      acc = std::min(acc * (__int128(d) + (i + 1 == t.shape.size() ? pad : 0)), cap);
    }
    if (!t.shape.empty()) {
      const size_t which = fdp_.ConsumeIntegralInRange<size_t>(0, t.shape.size() - 1);
      if (mutation == 3) t.strides[which] = 0;
      if (mutation == 4) t.strides[which] = fdp_.PickValueInArray(kHostile);
      if (mutation == 5) t.strides[which] = -t.strides[which];
      if (mutation == 6 && t.shape.size() >= 2) std::swap(t.strides[0], t.strides[1]);
    }
    if (mutation == 7) t.null = true;
    span(t);
    // Placement: after the previous tensor, or on top of an earlier one.
    int64_t at = (cursor_ + 63) / 64 * 64;
    if (mutation == 8 && !tensors_.empty()) {
      const Tensor& o = tensors_[fdp_.ConsumeIntegralInRange<size_t>(0, tensors_.size() - 1)];
      at = o.offset + (fdp_.ConsumeBool() ? 0 : fdp_.ConsumeIntegralInRange<int64_t>(0, 64) * eb);
    }
    if (mutation == 9) at += fdp_.ConsumeIntegralInRange(1, int(eb > 1 ? eb - 1 : 1));
    t.offset = at - t.lo;
    if (!t.hostile) cursor_ = std::max(cursor_, t.offset + t.hi);
    // An empty view (a zero dim) points at nothing: null or misaligned data is fine there.
    bool empty = false;
    for (int64_t d : t.shape) empty = empty || d == 0;
    t.violates = (!empty && (t.hostile || t.null || (eb > 1 && t.offset % eb != 0))) ||
                 static_cast<int>(t.dtype) > static_cast<int>(DType::i64);
    for (size_t i = 0; i < t.shape.size(); ++i)
      t.violates = t.violates || t.shape[i] < 0 || t.strides[i] < 0 || t.shape[i] > Limits::max_dim;
    tensors_.push_back(t);
    return tensors_.back();
  }

  // Whether every tensor lies inside the arena (or is one the library must
  // refuse without touching it): otherwise the case cannot be built.
  bool fits() const {
    for (const Tensor& t : tensors_)
      if (!t.hostile && !t.null && (t.offset + t.lo < 0 || t.offset + t.hi > int64_t(kArenaBytes)))
        return false;
    return true;
  }
  bool any_violation() const {
    for (const Tensor& t : tensors_)
      if (t.violates) return true;
    return false;
  }
  const std::vector<Tensor>& tensors() const { return tensors_; }
  Tensor& operator[](size_t i) { return tensors_[i]; }

  std::string describe() const {
    std::string s;
    for (const Tensor& t : tensors_) {
      s += "  " + t.name + (t.output ? " (out)" : "") + ": " +
           (static_cast<int>(t.dtype) <= 8 ? std::string(dtype_name(t.dtype))
                                           : "dtype(" + std::to_string(int(t.dtype)) + ")") +
           " shape [";
      for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
      s += "] strides [";
      for (size_t i = 0; i < t.strides.size(); ++i)
        s += (i ? ", " : "") + std::to_string(t.strides[i]);
      s += "] offset " + std::to_string(t.offset) + (t.null ? " null" : "") +
           (t.hostile ? " hostile" : "") + "\n";
    }
    return s;
  }

 private:
  // The byte range a view spans (negative strides reach below element 0);
  // hostile when it overflows or passes Limits::max_view_bytes.
  static void span(Tensor& t) {
    const int64_t eb = elem_bytes(t.dtype);
    __int128 lo = 0, hi = 0;
    bool empty = false;
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (t.shape[i] <= 0) empty = true;
      // Each term clamped to ±2^100, so that four of them cannot overflow.
      const __int128 big = __int128(1) << 100;
      const __int128 reach = std::max(
          -big, std::min(big, (__int128(std::max<int64_t>(t.shape[i], 1)) - 1) * t.strides[i]));
      (reach < 0 ? lo : hi) += reach;
    }
    if (empty) {
      t.lo = t.hi = 0;
      return;
    }
    lo *= eb;
    hi = (hi + 1) * eb;
    const __int128 limit = Limits::max_view_bytes;
    if (hi - lo > limit || lo < -limit) {
      t.hostile = true;
      t.lo = t.hi = 0;
      return;
    }
    t.lo = static_cast<int64_t>(lo);
    t.hi = static_cast<int64_t>(hi);
  }

  FuzzedDataProvider& fdp_;
  std::vector<Tensor> tensors_;
  int64_t cursor_ = 0;
};

// ---------------------------------------------------------------------------
// Filling the arena: a background pattern, then each tensor's elements
// (values in [-1, 1] for float tensors, small ints for index tensors; each
// operator then writes plausible contents into its index tensors).

uint64_t g_rng = 1;
uint64_t next_rand() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

// f(byte offset, row-major element number) for every element of t.
template <class F>
void for_each_elem(const Tensor& t, F f) {
  if (t.hostile || t.null) return;
  int64_t n = 1;
  for (int64_t d : t.shape) {
    if (d <= 0) return;
    if (n > int64_t(kArenaBytes) * 4 / d) return;  // only a huge stride-0 view gets here
    n *= d;
  }
  std::vector<int64_t> idx(t.shape.size(), 0);
  const int64_t eb = elem_bytes(t.dtype);
  for (int64_t e = 0; e < n; ++e) {
    int64_t off = t.offset;
    for (size_t i = 0; i < idx.size(); ++i) off += idx[i] * t.strides[i] * eb;
    f(off, e);
    for (size_t i = idx.size(); i-- > 0;) {
      if (++idx[i] < t.shape[i]) break;
      idx[i] = 0;
    }
  }
}

// A value for an integer element: clamped to ±limit (NaN → 0), since a
// double out of the integer's range is undefined behaviour to convert.
int64_t to_int(double v, double limit) {
  if (std::isnan(v)) return 0;
  return static_cast<int64_t>(std::clamp(v, -limit, limit));
}

void store_elem(DType t, int64_t off, double v) {
  uint8_t* p = arena().base + off;
  switch (t) {
    case DType::f32: {
      const float f = static_cast<float>(v);
      std::memcpy(p, &f, 4);
      break;
    }
    case DType::bf16: {
      const uint16_t h = runtime::f32_to_bf16(static_cast<float>(v));
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::i32: {
      const auto i = static_cast<int32_t>(to_int(v, 2147483647.0));
      std::memcpy(p, &i, 4);
      break;
    }
    case DType::i64: {
      const int64_t i = to_int(v, 9.2e18);
      std::memcpy(p, &i, 8);
      break;
    }
    default:
      *p = static_cast<uint8_t>(to_int(v, 9.2e18));
  }
}

double load_elem(const uint8_t* base, DType t, int64_t off) {
  const uint8_t* p = base + off;
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return runtime::bf16_to_f32(h);
    }
    case DType::i32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case DType::i64: {
      int64_t i;
      std::memcpy(&i, p, 8);
      return static_cast<double>(i);
    }
    default:
      return *p;
  }
}

void fill_arena(const Case& c, uint64_t seed) {
  std::memset(arena().base, 0xa5, kArenaBytes);  // bf16 0xa5a5, f32 ~ -2.9e-16: finite
  g_rng = seed * 0x9e3779b97f4a7c15ull | 1;
  for (const Tensor& t : c.tensors()) {
    if (t.fill == Fill::zeros) continue;
    for_each_elem(t, [&](int64_t off, int64_t) {
      const double u = static_cast<double>(next_rand() >> 11) * 0x1p-53;
      // Float values are bf16-exact, so an f32 tensor's bytes read through an
      // overlapping bf16 view (or the reverse) are still small finite numbers.
      const double v = runtime::bf16_to_f32(runtime::f32_to_bf16(static_cast<float>(2 * u - 1)));
      store_elem(t.dtype, off, t.fill == Fill::ints ? std::floor(u * 8) : v);
    });
  }
}

// Writes value(e) into the e-th element (row-major order) of t.
void set_elems(const Tensor& t, const std::function<double(int64_t)>& value) {
  for_each_elem(t, [&](int64_t off, int64_t e) { store_elem(t.dtype, off, value(e)); });
}

double max_abs(const Tensor& t) {
  double m = 0;
  for_each_elem(t, [&](int64_t off, int64_t) {
    const double v = load_elem(arena().base, t.dtype, off);
    if (std::isfinite(v)) m = std::max(m, std::fabs(v));
  });
  return m;
}

// ---------------------------------------------------------------------------
// The operators. Each builds its tensors from the description and returns
// the call: how much work it is, the index contents to write after the fill,
// how far two correct paths may differ on each output, and the call itself.

struct Bound {
  double abs = 0, rel = 0;  // |a − b| ≤ abs + rel·max(|a|, |b|)
};

struct Call {
  std::string op;
  double work = 0;
  std::function<void()> index_fill = [] {};
  std::function<void()> run;
  std::function<Bound(const Tensor&)> bound;  // per output tensor, from the inputs
};

// a·b, saturated to the int64 range (hostile dims multiply past it).
int64_t sat_mul(int64_t a, int64_t b) {
  const __int128 p = __int128(a) * b;
  const __int128 hi = std::numeric_limits<int64_t>::max(), lo = std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(std::max(lo, std::min(hi, p)));
}

int64_t sat_add(int64_t a, int64_t b) {
  const __int128 p = __int128(a) + b;
  const __int128 hi = std::numeric_limits<int64_t>::max(), lo = std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(std::max(lo, std::min(hi, p)));
}

int64_t clamp_dim(int64_t d) {
  return std::max<int64_t>(0, std::min<int64_t>(d, 1 << 20));
}
double product(std::initializer_list<int64_t> dims) {
  double p = 1;
  for (int64_t d : dims) p *= static_cast<double>(clamp_dim(d));
  return p;
}

// An enum value: mostly one of the n valid ones, sometimes out of range.
template <class E>
E fuzz_enum(FuzzedDataProvider& f, int n) {
  return static_cast<E>(f.ConsumeIntegralInRange(0, 15) == 0 ? f.ConsumeIntegralInRange(-1, n + 3)
                                                             : f.ConsumeIntegralInRange(0, n - 1));
}

Call make_gemm(Case& c) {
  auto& f = c.fdp();
  const int64_t m = c.dim({1, 2, 3, 5, 8, 16, 17, 31, 32, 33});
  const int64_t n = c.dim({1, 3, 16, 17, 32, 63, 64, 65, 80});
  const int64_t k = c.dim({1, 2, 16, 31, 32, 33, 64, 80});
  c.add("x", DType::bf16, {m, k}, false);
  c.add("w", DType::bf16, {n, k}, false);
  c.add("y", f.ConsumeBool() ? DType::f32 : DType::bf16, {m, n}, true);
  const int bias = f.ConsumeIntegralInRange(0, 2);
  if (bias) c.add("bias", bias == 1 ? DType::f32 : DType::bf16, {n}, false);
  const auto act = fuzz_enum<Activation>(f, 5);
  Call call;
  call.op = "gemm act=" + std::to_string(int(act));
  call.work = product({m, n, k}) + product({n, k});
  call.run = [&c, bias, act] {
    GemmOptions opt;
    if (bias) opt.bias = c[3].view();
    opt.act = act;
    const PackedWeight w = pack_weight(c[1].view());
    gemm(c[0].view(), w, c[2].view(), opt);
  };
  call.bound = [&c, k, bias](const Tensor& y) {
    // Each path is within (K+2)·u·Σ|x·w| + u·|bias| of the exact value
    // (tests/test_util.h), stretched by the activation (|act'| ≤ 1.13) and
    // its fp32 evaluation (4e-6 relative); Σ|x·w| ≤ K·max|x|·max|w|.
    const double u = 0x1p-24, s = double(k) * max_abs(c[0]) * max_abs(c[1]);
    const double b = bias ? max_abs(c[3]) : 0;
    const double one = 1.13 * ((double(k) + 2) * u * s + u * b) + 4e-6 * (1 + s + b);
    return Bound{2 * one, y.dtype == DType::bf16 ? 0x1p-7 : 2 * u};
  };
  return call;
}

Call make_rope(Case& c) {
  auto& f = c.fdp();
  const int64_t t = c.dim({1, 2, 3, 7, 16});
  const int64_t hq = c.dim({1, 2, 4});
  const int64_t hk = c.dim({1, 2});
  const int64_t d = c.dim({2, 8, 16, 32, 64, 80, 128});
  const DType dt = f.ConsumeBool() ? DType::f32 : DType::bf16;
  const bool with_k = f.ConsumeBool();
  RopeOptions opt;
  opt.style = fuzz_enum<RopeStyle>(f, 2);
  const int rd = f.ConsumeIntegralInRange(0, 3);
  const int64_t dd = clamp_dim(d);
  opt.rotary_dim = rd == 0 ? 0 : rd == 1 ? dd / 2 / 2 * 2 : rd == 2 ? dd : c.small(0, 130);
  const int64_t rot = opt.rotary_dim == 0 ? dd : opt.rotary_dim;
  int64_t streams = 1, width = rot;
  const int mode = f.ConsumeIntegralInRange(0, 5);
  if (mode == 4) {  // multidimensional
    opt.ndim = f.ConsumeIntegralInRange(0, 4);
    streams = std::max(opt.ndim, 1);
    width = rot / streams;
  } else if (mode == 5) {  // M-RoPE
    const int64_t half = std::max<int64_t>(rot / 2, 0);
    const int64_t a = f.ConsumeIntegralInRange<int64_t>(0, half);
    const int64_t b = f.ConsumeIntegralInRange<int64_t>(0, half - a);
    opt.mrope_section = {a, b, half - a - b};
    if (f.ConsumeIntegralInRange(0, 7) == 0) opt.mrope_section[0] = c.small(-2, 200);
    opt.mrope_interleaved = f.ConsumeBool();  // Qwen3-VL's frequency-interleaved rows
    streams = 3;
  } else if (f.ConsumeIntegralInRange(0, 15) == 0) {
    opt.mrope_interleaved = true;  // without three sections: an Error
  }
  const int64_t p = c.dim({1, 4, 16, 64});
  const bool pos64 = f.ConsumeBool();
  const bool pos_1d = streams == 1 && f.ConsumeBool();
  c.add("q", dt, {t, hq, d}, true);
  if (with_k) c.add("k", f.ConsumeIntegralInRange(0, 15) == 0 ? DType::f32 : dt, {t, hk, d}, true);
  const size_t pi = with_k ? 2 : 1;
  c.add("positions", pos64 ? DType::i64 : DType::i32,
        pos_1d ? std::vector<int64_t>{t} : std::vector<int64_t>{streams, t}, false, Fill::ints);
  c.add("cos_sin", f.ConsumeBool() ? DType::f32 : DType::bf16, {p, width}, false);
  const bool wild = f.ConsumeIntegralInRange(0, 15) == 0;
  Call call;
  call.op = "rope style=" + std::to_string(int(opt.style)) +
            " rotary_dim=" + std::to_string(opt.rotary_dim) + " ndim=" + std::to_string(opt.ndim) +
            " mrope_section=" + std::to_string(opt.mrope_section.size()) +
            (opt.mrope_interleaved ? " interleaved" : "");
  call.work = product({t, sat_add(hq, hk), d}) * double(streams);
  call.index_fill = [&c, pi, p, wild] {
    // Positions in [0, P), unless the description asks for wild ones.
    set_elems(c[pi], [&](int64_t e) {
      return wild ? static_cast<double>(static_cast<int64_t>(next_rand() % 9) - 2) * 17
                  : static_cast<double>((e * 7 + 3) % std::max<int64_t>(clamp_dim(p), 1));
    });
  };
  call.run = [&c, with_k, opt, pi] {
    const TensorView k = with_k ? c[1].view() : TensorView();
    rope(c[0].view(), with_k ? &k : nullptr, c[pi].view(), c[pi + 1].view(), opt);
  };
  call.bound = [&c, pi](const Tensor& out) {
    // Each rotated element is x·cos ± y·sin in fp32: a few ulps of
    // 2·max|x|·max|cos_sin| (|x| ≤ 1 from the fill); a bf16 result rounds
    // once more on each path.
    const double mag = 2 * std::max(1.0, max_abs(c[pi + 1]));
    const bool bf = out.dtype == DType::bf16;
    return Bound{0x1p-19 * mag + (bf ? 0x1p-8 * mag : 0), bf ? 0x1p-7 : 0x1p-21};
  };
  return call;
}

// The row-wise ops on [T, h] rows: rms_norm, fused_add_rms_norm,
// act_and_mul, layer_norm (with the add, a bias, or neither) and
// rms_norm_gated; the norms sometimes in place (out is x itself, the one
// aliasing they allow).
Call make_rowwise(Case& c) {
  auto& f = c.fdp();
  enum Kind { kRms, kAddRms, kGlu, kLayer, kGated };
  const int kind = f.ConsumeIntegralInRange(0, 4);
  const bool add = kind == kAddRms || (kind == kLayer && f.ConsumeBool());
  const int64_t t = c.dim({1, 2, 3, 7, 16});
  const int64_t h = c.dim({1, 2, 7, 16, 17, 33, 64, 100});
  const auto dtype = [&f] { return f.ConsumeBool() ? DType::f32 : DType::bf16; };
  const bool in_place = kind != kGlu && f.ConsumeBool();
  NormOptions nopt;
  if (f.ConsumeIntegralInRange(0, 7) == 0) {
    const float odd[] = {0.0f,
                         -1e-6f,
                         std::numeric_limits<float>::quiet_NaN(),
                         std::numeric_limits<float>::infinity(),
                         std::numeric_limits<float>::denorm_min(),
                         0.5f};
    nopt.eps = f.PickValueInArray(odd);
  }
  nopt.weight_plus_one = f.ConsumeIntegralInRange(0, 3) == 0;
  const bool with_w = kind != kGlu && f.ConsumeIntegralInRange(0, 3) != 0;
  const bool with_b = kind == kLayer && f.ConsumeBool();
  GluOptions gopt;
  gopt.act = fuzz_enum<Activation>(f, 6);
  gopt.rows = fuzz_enum<GluRows>(f, 2);
  gopt.clamped_swiglu = f.ConsumeIntegralInRange(0, 3) == 0;
  if (f.ConsumeIntegralInRange(0, 15) == 0) gopt.swiglu_limit = f.ConsumeBool() ? 0.0f : -1.0f;
  GatedNormOptions gnopt;
  gnopt.norm = nopt;
  gnopt.act = gopt.act;
  gnopt.norm_before_gate = f.ConsumeBool();
  // The gate first: activations the vector math computes exactly (none,
  // relu), so that the bound below stays the norm's (silu's error, divided
  // by a small rms, is no fixed bound).
  if (const int a = static_cast<int>(gnopt.act); !gnopt.norm_before_gate && a >= 1 && a <= 5)
    gnopt.act = Activation::relu;  // out-of-range values stay: they must be refused
  c.add("x", dtype(), {t, kind == kGlu ? sat_mul(h, 2) : h}, in_place);
  size_t ri = 0, wi = 0, bi = 0, gi = 0, oi = 0;
  if (add) {
    ri = c.tensors().size();
    c.add("residual", dtype(), {t, h}, true);
  }
  if (with_w) {
    wi = c.tensors().size();
    c.add("weight", dtype(), {h}, false);
  }
  if (with_b) {
    bi = c.tensors().size();
    c.add("bias", dtype(), {h}, false);
  }
  if (kind == kGated) {
    gi = c.tensors().size();
    c.add("gate", dtype(), {t, h}, false);
  }
  if (!in_place) {
    oi = c.tensors().size();
    c.add("out", dtype(), {t, h}, true);
  }
  const char* names[] = {"rms_norm", "fused_add_rms_norm", "act_and_mul", "layer_norm",
                         "rms_norm_gated"};
  Call call;
  call.op = std::string(kind == kLayer && add ? "fused_add_layer_norm" : names[kind]) +
            (in_place ? " in place" : "") + (with_w ? " weight" : "") + (with_b ? " bias" : "") +
            (nopt.weight_plus_one ? " plus_one" : "") + " eps=" + std::to_string(nopt.eps) +
            (kind == kGlu ? " act=" + std::to_string(int(gopt.act)) +
                                " rows=" + std::to_string(int(gopt.rows)) +
                                (gopt.clamped_swiglu ? " swiglu" : "")
                          : "") +
            (kind == kGated ? " act=" + std::to_string(int(gnopt.act)) +
                                  (gnopt.norm_before_gate ? "" : " gate first")
                            : "");
  call.work = product({t, h}) * 3;
  call.run = [&c, kind, add, in_place, with_w, with_b, ri, wi, bi, gi, oi, nopt, gopt, gnopt] {
    const TensorView x = c[0].view();
    const TensorView out = in_place ? x : c[oi].view();
    const TensorView w = with_w ? c[wi].view() : TensorView();
    const TensorView b = with_b ? c[bi].view() : TensorView();
    const TensorView* wp = with_w ? &w : nullptr;
    const TensorView* bp = with_b ? &b : nullptr;
    switch (kind) {
      case kRms:
        return rms_norm(x, wp, out, nopt);
      case kAddRms:
        return fused_add_rms_norm(x, c[ri].view(), wp, out, nopt);
      case kGlu:
        return act_and_mul(x, out, gopt);
      case kLayer:
        if (add) return fused_add_layer_norm(x, c[ri].view(), wp, bp, out, nopt);
        return layer_norm(x, wp, bp, out, nopt);
      default:
        return rms_norm_gated(x, c[gi].view(), wp, out, gnopt);
    }
  };
  call.bound = [&c, kind, add, ri, gnopt](const Tensor& out) {
    const bool bf = out.dtype == DType::bf16;
    // The residual: an f32 sum rounded once to its dtype on both paths.
    if (add && &out == &c[ri]) return Bound{0, 0};
    // A norm: v·rstd·w, rounded once by the scalar path (from double) and
    // in f32 steps by the kernel (docs/rowwise.md: 8 units); a bf16 result
    // may round to the other neighbour. act_and_mul: the vector math's
    // 4e-6·max(1, |gate|)·|up| with |x| ≤ 1, and the same roundings; the
    // gated norm's gate after the norm: that error times |n| ≤ sqrt(h)·|w|
    // ≤ 10. The layer norm: the bias and the centred value's roundings, a
    // few units of |b| + |(v - mean)·rstd·w| ≤ 11.
    double abs = 1e-30;
    if (kind == kGlu) abs = 2e-5;
    if (kind == kLayer) abs = 1e-5;
    if (kind == kGated && gnopt.norm_before_gate) abs = 1e-4;
    return Bound{abs, bf ? 0x1p-7 : 0x1p-20};
  };
  return call;
}

// The options every attention call takes; sinks and alibi slopes become
// tensors of the case (their indices are returned).
struct AttnExtras {
  AttentionOptions opt;
  int sinks = -1, alibi = -1;
  AttentionOptions with(Case& c) const {
    AttentionOptions o = opt;
    if (sinks >= 0) o.sinks = c[sinks].view();
    if (alibi >= 0) o.alibi_slopes = c[alibi].view();
    return o;
  }
};

AttnExtras fuzz_attention_options(Case& c, int64_t hq) {
  auto& f = c.fdp();
  AttnExtras x;
  x.opt.causal = f.ConsumeBool();
  if (f.ConsumeIntegralInRange(0, 3) == 0)
    x.opt.sm_scale = f.ConsumeIntegralInRange(0, 15) == 0
                         ? std::numeric_limits<float>::quiet_NaN()
                         : f.ConsumeFloatingPointInRange(-2.f, 2.f);
  if (f.ConsumeIntegralInRange(0, 3) == 0) x.opt.window_left = f.ConsumeIntegralInRange(-2, 9);
  if (f.ConsumeIntegralInRange(0, 3) == 0) x.opt.window_right = f.ConsumeIntegralInRange(-2, 9);
  if (f.ConsumeIntegralInRange(0, 3) == 0)
    x.opt.softcap = f.ConsumeFloatingPointInRange(-1.f, 30.f);
  if (f.ConsumeIntegralInRange(0, 3) == 0) {
    x.sinks = static_cast<int>(c.tensors().size());
    c.add("sinks", DType::f32, {hq}, false);
  }
  if (f.ConsumeIntegralInRange(0, 3) == 0) {
    x.alibi = static_cast<int>(c.tensors().size());
    c.add("alibi_slopes", DType::f32, {hq}, false);
  }
  return x;
}

Bound attention_bound(const Tensor& v) {
  // tests/attention_test.cpp: each path is within 2⁻⁷·max|v| + 2⁻⁸·|ref|.
  return Bound{2 * 0x1p-7 * std::max(max_abs(v), 1e-30), 2 * 0x1p-8};
}

// A sequence-length vector: plausible (the lengths given) or wild.
std::function<double(int64_t)> prefix_sums(const std::vector<int64_t>& len, bool wild) {
  return [len, wild](int64_t e) {
    if (wild) return static_cast<double>(static_cast<int64_t>(next_rand() % 50) - 5);
    int64_t s = 0;
    for (int64_t i = 0; i < e && i < int64_t(len.size()); ++i) s += len[i];
    return static_cast<double>(s);
  };
}

Call make_flash(Case& c) {
  auto& f = c.fdp();
  const int64_t b = c.small(1, 3);
  const int64_t hkv = c.dim({1, 2});
  const int64_t g = c.dim({1, 2, 3});
  const int64_t hq = f.ConsumeIntegralInRange(0, 15) == 0 ? c.dim({1, 3, 5}) : sat_mul(hkv, g);
  const int64_t d = c.dim({16, 32, 48, 64, 80, 128, 256, 8, 24});
  const int64_t dv = f.ConsumeIntegralInRange(0, 3) == 0 ? c.dim({16, 32, 64, 128}) : d;
  std::vector<int64_t> lq, lk;
  int64_t tq = 0, tk = 0;
  for (int64_t i = 0; i < std::min<int64_t>(clamp_dim(b), 4); ++i) {
    lq.push_back(f.ConsumeIntegralInRange(0, 9));
    lk.push_back(f.ConsumeIntegralInRange(0, 3) == 0 ? f.ConsumeIntegralInRange(0, 40)
                                                     : lq.back() + f.ConsumeIntegralInRange(0, 9));
    tq += lq.back();
    tk += lk.back();
  }
  c.add("q", DType::bf16, {tq, hq, d}, false);
  c.add("k", DType::bf16, {tk, hkv, d}, false);
  c.add("v", DType::bf16, {tk, hkv, dv}, false);
  c.add("out", DType::bf16, {tq, hq, dv}, true);
  c.add("cu_seqlens_q", DType::i32, {sat_add(b, 1)}, false, Fill::ints);
  c.add("cu_seqlens_k", DType::i32, {sat_add(b, 1)}, false, Fill::ints);
  const AttnExtras x = fuzz_attention_options(c, hq);
  const bool wild = f.ConsumeIntegralInRange(0, 15) == 0;
  Call call;
  call.op = "flash_attn_varlen";
  call.work = product({tq, hq, std::max<int64_t>(tk, 1), sat_add(d, dv)});
  call.index_fill = [&c, lq, lk, wild] {
    set_elems(c[4], prefix_sums(lq, wild));
    set_elems(c[5], prefix_sums(lk, wild));
  };
  call.run = [&c, x] {
    flash_attn_varlen(c[0].view(), c[1].view(), c[2].view(), c[3].view(), c[4].view(), c[5].view(),
                      x.with(c));
  };
  call.bound = [&c](const Tensor&) { return attention_bound(c[2]); };
  return call;
}

Call make_decode(Case& c) {
  auto& f = c.fdp();
  const int64_t b = c.small(1, 3);
  const int64_t hkv = c.dim({1, 2});
  const int64_t g = c.dim({1, 2, 4});
  const int64_t hq = f.ConsumeIntegralInRange(0, 15) == 0 ? c.dim({1, 3, 5}) : sat_mul(hkv, g);
  const int64_t d = c.dim({16, 32, 64, 80, 128, 8});
  const int64_t dv = f.ConsumeIntegralInRange(0, 3) == 0 ? c.dim({16, 32, 64}) : d;
  const int64_t nb = c.small(1, 6), bs = c.dim({1, 2, 4, 16}), mb = c.small(1, 4);
  c.add("q", DType::bf16, {b, hq, d}, false);
  c.add("k_cache", DType::bf16, {nb, bs, hkv, d}, false);
  c.add("v_cache", DType::bf16, {nb, bs, hkv, dv}, false);
  c.add("out", DType::bf16, {b, hq, dv}, true);
  c.add("block_table", DType::i32, {b, mb}, false, Fill::ints);
  c.add("seq_lens", DType::i32, {b}, false, Fill::ints);
  const AttnExtras x = fuzz_attention_options(c, hq);
  const bool wild = f.ConsumeIntegralInRange(0, 15) == 0;
  Call call;
  call.op = "decode_attention";
  call.work = product({b, hq, mb, bs, sat_add(d, dv)});
  call.index_fill = [&c, nb, bs, mb, wild] {
    const int64_t cap = clamp_dim(mb) * clamp_dim(bs);
    set_elems(c[4], [&](int64_t) {
      return static_cast<double>(wild ? int64_t(next_rand() % 12) - 3
                                      : int64_t(next_rand() % std::max<int64_t>(clamp_dim(nb), 1)));
    });
    set_elems(c[5], [&](int64_t) {
      return static_cast<double>(wild ? int64_t(next_rand() % 80) - 8
                                      : 1 + int64_t(next_rand() % std::max<int64_t>(cap, 1)));
    });
  };
  call.run = [&c, x] {
    decode_attention(c[0].view(), c[1].view(), c[2].view(), c[3].view(), c[4].view(), c[5].view(),
                     x.with(c));
  };
  call.bound = [&c](const Tensor&) { return attention_bound(c[2]); };
  return call;
}

Call make_store_kv(Case& c) {
  auto& f = c.fdp();
  const int64_t t = c.small(0, 9);
  const int64_t hkv = c.dim({1, 2});
  const int64_t d = c.dim({16, 32, 64, 8, 3});
  const int64_t dv = f.ConsumeBool() ? d : c.dim({16, 32});
  const int64_t nb = c.small(1, 4), bs = c.dim({1, 2, 4, 16});
  c.add("k", DType::bf16, {t, hkv, d}, false);
  c.add("v", DType::bf16, {t, hkv, dv}, false);
  c.add("k_cache", DType::bf16, {nb, bs, hkv, d}, true);
  c.add("v_cache", DType::bf16, {nb, bs, hkv, dv}, true);
  c.add("slot_mapping", f.ConsumeBool() ? DType::i64 : DType::i32, {t}, false, Fill::ints);
  const bool wild = f.ConsumeIntegralInRange(0, 15) == 0;
  Call call;
  call.op = "store_kv";
  call.work = product({t, hkv, sat_add(d, dv)});
  call.index_fill = [&c, nb, bs, wild] {
    // Distinct slots (two tokens into one slot would race), some skipped (−1).
    const int64_t slots = clamp_dim(nb) * clamp_dim(bs);
    set_elems(c[4], [&](int64_t e) {
      if (wild) return static_cast<double>(int64_t(next_rand() % 40) - 4);
      if (next_rand() % 5 == 0) return -1.0;
      return static_cast<double>(slots > 0 ? (e * 7919) % slots : 0);
    });
  };
  call.run = [&c] { store_kv(c[0].view(), c[1].view(), c[2].view(), c[3].view(), c[4].view()); };
  call.bound = [](const Tensor&) { return Bound{0, 0}; };  // a copy: exact
  return call;
}

Call make_topk(Case& c) {
  auto& f = c.fdp();
  const int64_t t = c.small(0, 5);
  const int64_t e = c.dim({1, 2, 8, 16, 60, 64});
  const int64_t k = f.ConsumeIntegralInRange(0, 7) == 0
                        ? c.small(0, 70)
                        : f.ConsumeIntegralInRange<int64_t>(
                              1, std::max<int64_t>(1, std::min<int64_t>(clamp_dim(e), 8)));
  const int kind = f.ConsumeIntegralInRange(0, 2);
  const bool renormalize = f.ConsumeBool();
  c.add("logits", f.ConsumeBool() ? DType::f32 : DType::bf16, {t, e}, false);
  c.add("topk_weights", DType::f32, {t, k}, true);
  c.add("topk_ids", DType::i32, {t, k}, true);
  GroupedTopkOptions g;
  if (kind == 2) {
    g.score = fuzz_enum<RouterScore>(f, 2);
    g.num_expert_group = static_cast<int>(c.dim({1, 2, 4, 8}));
    g.topk_group = f.ConsumeIntegralInRange(0, 4);
    g.renormalize = renormalize;
    g.routed_scaling_factor = f.ConsumeBool() ? 1.f : f.ConsumeFloatingPointInRange(0.f, 3.f);
    if (f.ConsumeBool()) c.add("correction_bias", DType::f32, {e}, false);
  }
  const bool bias = c.tensors().size() > 3;
  Call call;
  call.op = kind == 0 ? "topk_softmax" : kind == 1 ? "topk_sigmoid" : "grouped_topk";
  call.work = product({t, e}) * 8;
  call.run = [&c, kind, renormalize, g, bias]() mutable {
    if (kind == 0) return topk_softmax(c[0].view(), c[1].view(), c[2].view(), renormalize);
    if (kind == 1) return topk_sigmoid(c[0].view(), c[1].view(), c[2].view(), renormalize);
    if (bias) g.correction_bias = c[3].view();
    grouped_topk(c[0].view(), c[1].view(), c[2].view(), g);
  };
  call.bound = [](const Tensor& out) {
    // Ids exactly; weights are exp or σ and a sum in fp32 on either path.
    return out.dtype == DType::i32 ? Bound{0, 0} : Bound{0x1p-20, 0x1p-18};
  };
  return call;
}

// ---------------------------------------------------------------------------
// One case: decode, build, fill, call.

enum class Outcome : uint8_t { ok, error, skipped };

struct Result {
  Outcome outcome = Outcome::skipped;
  std::string message;
};

constexpr int kOps = 7;

struct Prepared {
  std::unique_ptr<FuzzedDataProvider> fdp;
  std::unique_ptr<Case> c;
  Call call;
  bool callable = false;
};

// Decodes and builds the case; the arena holds its inputs afterwards.
Prepared prepare(const uint8_t* data, size_t size) {
  Prepared p;
  p.fdp = std::make_unique<FuzzedDataProvider>(data, size);
  p.c = std::make_unique<Case>(*p.fdp);
  const int op = p.fdp->ConsumeIntegralInRange(0, kOps - 1);
  const uint64_t seed = p.fdp->ConsumeIntegral<uint64_t>();
  Case& c = *p.c;
  switch (op) {
    case 0:
      p.call = make_gemm(c);
      break;
    case 1:
      p.call = make_rope(c);
      break;
    case 2:
      p.call = make_flash(c);
      break;
    case 3:
      p.call = make_decode(c);
      break;
    case 4:
      p.call = make_store_kv(c);
      break;
    case 5:
      p.call = make_rowwise(c);
      break;
    default:
      p.call = make_topk(c);
      break;
  }
  // A case that cannot be laid out in the arena, or a legitimate one that
  // would run for long, is not called. A case that breaks the contract is
  // called whatever its size: it must fail fast.
  if (!c.fits()) return p;
  if (p.call.work > kMaxWork && !c.any_violation()) return p;
  fill_arena(c, seed);
  p.call.index_fill();
  p.callable = true;
  return p;
}

Result run(Prepared& p) {
  Result r;
  if (!p.callable) return r;
  try {
    p.call.run();
    r.outcome = Outcome::ok;
  } catch (const Error& e) {
    r.outcome = Outcome::error;
    r.message = e.what();
  }
  return r;
}

// ---------------------------------------------------------------------------
// The scalar oracle: a child process (this binary, TILEJIT_ISA=scalar) that
// answers one case at a time over two pipes.

bool read_all(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}
bool write_all(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

[[noreturn]] void oracle_loop(int in, int out) {
  std::vector<uint8_t> input;
  while (true) {
    uint32_t n;
    if (!read_all(in, &n, 4)) _exit(0);
    input.resize(n);
    if (!read_all(in, input.data(), n)) _exit(0);
    Prepared p = prepare(input.data(), input.size());
    const Result r = run(p);
    const auto outcome = static_cast<uint8_t>(r.outcome);
    const auto len = static_cast<uint32_t>(r.message.size());
    if (!write_all(out, &outcome, 1) || !write_all(out, &len, 4) ||
        !write_all(out, r.message.data(), len) || !write_all(out, arena().base, kArenaBytes))
      _exit(0);
  }
}

struct Oracle {
  pid_t pid = -1;
  int to = -1, from = -1;
};
Oracle g_oracle;
bool g_self_scalar = false;  // this process is the scalar path: no oracle

void start_oracle() {
  int a[2], b[2];
  if (pipe(a) != 0 || pipe(b) != 0) die("pipe");
  const pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(a[1]);
    ::close(b[0]);
    const std::string fds = std::to_string(a[0]) + "," + std::to_string(b[1]);
    setenv("TILEJIT_FUZZ_ORACLE_FDS", fds.c_str(), 1);
    setenv("TILEJIT_ISA", "scalar", 1);
    char* const argv[] = {const_cast<char*>("api_fuzzer_scalar_oracle"), nullptr};
    execv("/proc/self/exe", argv);
    _exit(127);
  }
  ::close(a[0]);
  ::close(b[1]);
  signal(SIGPIPE, SIG_IGN);
  g_oracle = {pid, a[1], b[0]};
}

Result ask_oracle(const uint8_t* data, size_t size, std::vector<uint8_t>* arena_out) {
  if (g_oracle.pid < 0) start_oracle();
  const auto n = static_cast<uint32_t>(size);
  const char* dead =
      "the scalar path (the oracle child, TILEJIT_ISA=scalar) died on this input; reproduce it "
      "in one process with TILEJIT_ISA=scalar and the same input";
  if (!write_all(g_oracle.to, &n, 4) || !write_all(g_oracle.to, data, size)) die(dead);
  // The child gets the harness's own timeout budget; past it, it hangs.
  // libFuzzer's -timeout is a SIGALRM every timeout/2 + 1 s, which cuts a
  // poll short with EINTR: that is no answer yet, so wait out the rest.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(25);
  for (;;) {
    pollfd pfd{g_oracle.from, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    const int rc = poll(&pfd, 1, static_cast<int>(std::max<int64_t>(0, left.count())));
    if (rc > 0) break;
    if (rc < 0 && errno == EINTR && left.count() > 0) continue;
    die("the scalar path (oracle child) hangs on this input");
  }
  Result r;
  uint8_t outcome;
  uint32_t len;
  if (!read_all(g_oracle.from, &outcome, 1) || !read_all(g_oracle.from, &len, 4)) die(dead);
  r.outcome = static_cast<Outcome>(outcome);
  r.message.resize(len);
  arena_out->resize(kArenaBytes);
  if (!read_all(g_oracle.from, r.message.data(), len) ||
      !read_all(g_oracle.from, arena_out->data(), kArenaBytes))
    die(dead);
  return r;
}

// ---------------------------------------------------------------------------
// The comparison.

std::string where(const Prepared& p) {
  return p.call.op + "\n" + p.c->describe();
}

// The bound of each output, from the inputs as they are before the call (an
// output may overwrite an input it aliases).
std::vector<Bound> bounds_of(const Prepared& p) {
  std::vector<Bound> b;
  for (const Tensor& t : p.c->tensors()) b.push_back(t.output ? p.call.bound(t) : Bound{});
  return b;
}

void compare(const Prepared& p, const std::vector<Bound>& bounds,
             const std::vector<uint8_t>& before, const uint8_t* got, const uint8_t* ref) {
  // Which bytes are output elements (of which tensor).
  std::vector<int16_t> owner(kArenaBytes, -1);
  const auto& ts = p.c->tensors();
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].output) continue;
    for_each_elem(ts[i], [&](int64_t off, int64_t) {
      for (int64_t b = 0; b < elem_bytes(ts[i].dtype); ++b) owner[off + b] = int16_t(i);
    });
  }
  for (size_t b = 0; b < kArenaBytes; ++b) {
    if (owner[b] >= 0) continue;
    if (got[b] != before[b])
      die("the call wrote outside its outputs (arena byte " + std::to_string(b) + ")\n" + where(p));
    if (ref != nullptr && ref[b] != before[b])
      die("the scalar path wrote outside its outputs (arena byte " + std::to_string(b) + ")\n" +
          where(p));
  }
  if (ref == nullptr) return;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].output) continue;
    const Bound bd = bounds[i];
    for_each_elem(ts[i], [&](int64_t off, int64_t e) {
      if (owner[off] != int16_t(i)) return;  // an element another output also covers
      const double a = load_elem(got, ts[i].dtype, off), r = load_elem(ref, ts[i].dtype, off);
      const bool same_nan = std::isnan(a) && std::isnan(r);
      const bool ok = same_nan || a == r ||
                      (std::isfinite(a) && std::isfinite(r) &&
                       std::fabs(a - r) <= bd.abs + bd.rel * std::max(std::fabs(a), std::fabs(r)));
      if (!ok)
        die("result differs from the scalar path: " + ts[i].name + " element " + std::to_string(e) +
            " = " + std::to_string(a) + ", scalar " + std::to_string(r) + " (bound " +
            std::to_string(bd.abs) + " + " + std::to_string(bd.rel) + "·|v|)\n" + where(p));
    });
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (const char* fds = std::getenv("TILEJIT_FUZZ_ORACLE_FDS")) {
    int in = -1, out = -1;
    if (std::sscanf(fds, "%d,%d", &in, &out) != 2) die("TILEJIT_FUZZ_ORACLE_FDS");
    oracle_loop(in, out);
  }
  // The path is chosen once per process; the oracle is needed unless this
  // process is the scalar path itself.
  g_self_scalar = tilejit::cpu_info().isa == tilejit::Isa::scalar;
  std::fprintf(stderr, "api_fuzzer: path %s, %s\n", tilejit::isa_name(tilejit::cpu_info().isa),
               g_self_scalar ? "no oracle (this is the scalar path)"
                             : "compared with the scalar path in a child process");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Prepared p = prepare(data, size);
  if (!p.callable) return 0;
  // TILEJIT_FUZZ_DESCRIBE=1: the case before the call, for a finding that
  // dies inside it (a sanitizer report names the line, this the input).
  static const bool describe = std::getenv("TILEJIT_FUZZ_DESCRIBE") != nullptr;
  if (describe) std::fprintf(stderr, "api_fuzzer case: %s", where(p).c_str());
  const std::vector<uint8_t> before(arena().base, arena().base + kArenaBytes);
  const std::vector<Bound> bounds = bounds_of(p);
  const Result mine = run(p);
  if (mine.outcome == Outcome::ok && p.c->any_violation())
    die("a call with a view the contract refuses (negative dim or stride, past Limits, "
        "misaligned, null, bad dtype) returned without an Error\n" +
        where(p));
  if (g_self_scalar) {
    if (mine.outcome == Outcome::ok) compare(p, bounds, before, arena().base, nullptr);
    return 0;
  }
  std::vector<uint8_t> theirs;
  const Result ref = ask_oracle(data, size, &theirs);
  if (mine.outcome != ref.outcome)
    die(std::string(mine.outcome == Outcome::ok
                        ? "the path accepted a call the scalar path refuses"
                        : "the path refused a call the scalar path accepts") +
        ": " + (mine.outcome == Outcome::ok ? ref.message : mine.message) + "\n" + where(p));
  if (mine.outcome == Outcome::ok) compare(p, bounds, before, arena().base, theirs.data());
  return 0;
}
