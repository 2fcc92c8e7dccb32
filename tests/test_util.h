// Shared helpers of the tilejit tests: seeded bf16 data, guarded buffers, the
// ISA skip rule, and one function that runs tilejit::gemm and the scalar
// reference (runtime/reference_gemm.h) on the same inputs and compares them
// under the error bound stated below.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "codegen/gemm_plan.h"
#include "runtime/bf16.h"
#include "runtime/reference_error_bounds.h"
#include "runtime/reference_gemm.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {

using runtime::bf16_to_f32;
using runtime::f32_to_bf16;

// Which sanitizer this binary is built with (GCC's macros, clang's features).
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kUnderTsan = true;
#elif defined(__has_feature)
inline constexpr bool kUnderTsan = __has_feature(thread_sanitizer);
#else
inline constexpr bool kUnderTsan = false;
#endif
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kUnderAsan = true;
#elif defined(__has_feature)
inline constexpr bool kUnderAsan = __has_feature(address_sanitizer);
#else
inline constexpr bool kUnderAsan = false;
#endif

// ---------------------------------------------------------------------------
// Random data

// n bf16 values drawn uniformly from [lo, hi] (then rounded to bf16), seeded.
inline std::vector<uint16_t> random_bf16(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<uint16_t> v(n);
  for (auto& e : v) e = f32_to_bf16(d(rng));
  return v;
}

inline std::vector<float> random_f32(size_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& e : v) e = d(rng);
  return v;
}

// n bytes drawn uniformly from [lo, hi], seeded (quantized codes and scales).
inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, int lo, int hi) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  std::vector<uint8_t> v(n);
  for (auto& e : v) e = static_cast<uint8_t>(d(rng));
  return v;
}

// A small stable hash to derive a per-case seed from its parameters.
// f() must throw a tilejit::Error whose message mentions `needle` (the
// argument or value it names).
template <class F>
void expect_tilejit_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no Error; expected one mentioning \"" << needle << "\"";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message \"" << e.what() << "\" does not mention \"" << needle << "\"";
  }
}

inline uint32_t seed_of(std::initializer_list<int64_t> parts) {
  uint64_t h = 1469598103934665603ull;
  for (int64_t p : parts) {
    h ^= static_cast<uint64_t>(p) + 0x9e3779b97f4a7c15ull;
    h *= 1099511628211ull;
  }
  return static_cast<uint32_t>(h ^ (h >> 32));
}

// ---------------------------------------------------------------------------
// A buffer whose last byte is immediately followed by a PROT_NONE page, so a
// kernel that reads past the end of an input (x rows, bias tail) faults
// instead of silently reading neighbouring memory.
//
// A fault kills the test binary (the kernel may run on a pool thread, so it
// cannot be turned into a gtest failure); the handler below says why, and the
// last "[ RUN ]" line of the output names the test.
inline void on_guard_fault(int sig) {
  static const char msg[] =
      "\n*** tilejit test: SIGSEGV. If the fault is in JIT code, a kernel read past the end of "
      "an input (x rows or bias live right before a PROT_NONE guard page); the test is the last "
      "[ RUN ] line above.\n";
  [[maybe_unused]] auto n = write(2, msg, sizeof msg - 1);
  signal(sig, SIG_DFL);
  raise(sig);
}

class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes) : bytes_(bytes) {
    static const bool installed = [] {
      struct sigaction sa {};
      sa.sa_handler = on_guard_fault;
      sa.sa_flags = SA_RESETHAND;
      sigemptyset(&sa.sa_mask);
      return sigaction(SIGSEGV, &sa, nullptr) == 0;
    }();
    (void)installed;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t body = (bytes + page - 1) / page * page;
    mapped_ = body + page;
    void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
    base_ = static_cast<uint8_t*>(p);
    if (mprotect(base_ + body, page, PROT_NONE) != 0) std::abort();
    data_ = base_ + body - bytes;
  }
  ~GuardedBuffer() { munmap(base_, mapped_); }
  GuardedBuffer(const GuardedBuffer&) = delete;
  GuardedBuffer& operator=(const GuardedBuffer&) = delete;

  void* data() { return data_; }
  size_t bytes() const { return bytes_; }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }

 private:
  uint8_t* base_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t mapped_ = 0, bytes_ = 0;
};

// ---------------------------------------------------------------------------
// The skip rule (XNNPACK's): a test binary is registered in ctest once per
// TILEJIT_ISA value; when the CPU (or OS) lacks the requested path, the active
// path is lower, and the JIT tests of that variant are skipped, not failed.

// The path TILEJIT_ISA asks for, if it names one.
inline std::optional<Isa> requested_isa() {
  const char* env = std::getenv("TILEJIT_ISA");
  if (env == nullptr) return std::nullopt;
  const std::string s = env;
  for (Isa isa : {Isa::amx, Isa::avx512, Isa::llvm, Isa::scalar})
    if (s == isa_name(isa)) return isa;
  return std::nullopt;
}

// Empty when the requested path is active, else the reason to skip.
inline std::string missing_isa_reason() {
  const auto want = requested_isa();
  if (!want) return "";
  const CpuInfo info = cpu_info();
  if (info.isa == *want) return "";
  return std::string("ISA path unavailable: TILEJIT_ISA=") + isa_name(*want) +
         " requested, but this CPU/OS provides at most the " + isa_name(info.max_isa) +
         " path (missing: " + isa_name(*want) + ")";
}

#define TILEJIT_SKIP_IF_ISA_MISSING()                                        \
  do {                                                                       \
    const std::string tilejit_skip_ = ::tilejit::test::missing_isa_reason(); \
    if (!tilejit_skip_.empty()) GTEST_SKIP() << tilejit_skip_;               \
  } while (0)

// Fixtures whose SetUp applies the skip rule.
class IsaTest : public ::testing::Test {
 protected:
  void SetUp() override { TILEJIT_SKIP_IF_ISA_MISSING(); }
};
template <class P>
class IsaTestWithParam : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override { TILEJIT_SKIP_IF_ISA_MISSING(); }
};

// ---------------------------------------------------------------------------
// One GEMM problem, its run through tilejit::gemm and through the reference.

enum class Bias { none, f32, bf16 };
inline const char* bias_name(Bias b) {
  switch (b) {
    case Bias::none:
      return "nobias";
    case Bias::f32:
      return "biasf32";
    case Bias::bf16:
      return "biasbf16";
  }
  return "?";
}

struct GemmProblem {
  int64_t m = 1, n = 1, k = 1;
  int64_t ldx = 0;          // x row stride in elements (0: k)
  int64_t ldy = 0;          // y row stride in elements (0: n)
  std::vector<uint16_t> x;  // [m, k] contiguous; copied into a strided buffer for the call
  std::vector<uint16_t> w;  // [n, k] contiguous
  Bias bias = Bias::none;
  std::vector<float> bias_f32;      // [n] when bias == f32
  std::vector<uint16_t> bias_bf16;  // [n] when bias == bf16
  Activation act = Activation::none;
  DType out = DType::f32;
};

// Random inputs whose pre-activations reach both tails of the activations:
// x, w uniform in [-a, a] with a² = 15/√K, so x·w over K terms has a standard
// deviation of √K·a²/3 = 5 for every K; bias uniform in [-5, 5]. Typical
// pre-activations therefore span about [-15, 15].
inline GemmProblem random_problem(int64_t m, int64_t n, int64_t k,
                                  Activation act = Activation::none, Bias bias = Bias::none,
                                  DType out = DType::f32, int64_t ldx = 0, int64_t ldy = 0) {
  GemmProblem p;
  p.m = m, p.n = n, p.k = k, p.ldx = ldx, p.ldy = ldy;
  p.act = act, p.bias = bias, p.out = out;
  const uint32_t seed = seed_of({m, n, k, static_cast<int64_t>(act), static_cast<int64_t>(bias),
                                 out == DType::f32 ? 0 : 1, ldx, ldy});
  const float a = static_cast<float>(std::sqrt(15.0 / std::sqrt(static_cast<double>(k))));
  p.x = random_bf16(static_cast<size_t>(m * k), seed, -a, a);
  p.w = random_bf16(static_cast<size_t>(n * k), seed + 1, -a, a);
  if (bias == Bias::f32) p.bias_f32 = random_f32(static_cast<size_t>(n), seed + 2, -5, 5);
  if (bias == Bias::bf16) p.bias_bf16 = random_bf16(static_cast<size_t>(n), seed + 2, -5, 5);
  return p;
}

// The error bound of one output y[i, j] against the reference: the model of
// runtime/reference_error_bounds.h (dot product through the activation's
// Lipschitz constant, vector math, the reference's rounding, a bf16 ulp),
// where each term's justification is stated.
inline double gemm_tolerance(Activation act, DType out, int64_t k, double sum_abs, double bias_abs,
                             double pre, double v) {
  return runtime::gemm_output_bound(act, out, k, sum_abs, bias_abs, pre, v);
}

inline std::string problem_str(const GemmProblem& p) {
  std::ostringstream os;
  os << "M=" << p.m << " N=" << p.n << " K=" << p.k << " ldx=" << (p.ldx ? p.ldx : p.k)
     << " ldy=" << (p.ldy ? p.ldy : p.n) << " act=" << activation_name(p.act)
     << " bias=" << bias_name(p.bias) << " out=" << dtype_name(p.out);
  return os.str();
}

// Sentinels written into every y element the gemm must not touch (NaN bit
// patterns, so a stray read would also show).
constexpr uint32_t kSentinelF32 = 0x7fa5a5a5u;
constexpr uint16_t kSentinelBf16 = 0x7fa5u;

// Element idx of an output buffer of dtype `out` (f32 or bf16), as a double.
inline double read_out(const uint8_t* base, DType out, int64_t idx) {
  if (out == DType::f32) {
    float f;
    std::memcpy(&f, base + idx * 4, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, base + idx * 2, 2);
  return bf16_to_f32(h);
}

// What a run produced, for tests that compare runs with each other.
struct GemmOutput {
  std::vector<uint8_t> y_bytes;  // the [M, N] result rows, packed (bit-exact)
};

// Runs tilejit::gemm (with `packed`, or a fresh pack of p.w) and the reference
// on the same inputs; checks every output against the bound above, that no
// output is NaN or infinite, that y's padding columns and the guard zones
// before and after y are untouched. x and the bias live in guarded buffers
// (reading past them faults, see GuardedBuffer); x's padding columns hold NaN, so a kernel that
// multiplies them in produces NaN.
inline ::testing::AssertionResult run_and_compare(const GemmProblem& p,
                                                  const PackedWeight* packed = nullptr,
                                                  GemmOutput* output = nullptr) {
  const int64_t M = p.m, N = p.n, K = p.k;
  const int64_t ldx = p.ldx ? p.ldx : K, ldy = p.ldy ? p.ldy : N;
  const size_t ysz = p.out == DType::f32 ? 4 : 2;

  // x: rows of ldx elements, the last row ends at the guard page.
  const size_t x_elems = static_cast<size_t>(M > 0 ? (M - 1) * ldx + K : 0);
  GuardedBuffer xbuf(x_elems * 2);
  uint16_t* xg = xbuf.as<uint16_t>();
  for (size_t e = 0; e < x_elems; ++e) xg[e] = 0x7fc1;  // NaN in the padding
  for (int64_t i = 0; i < M; ++i)
    std::memcpy(xg + i * ldx, p.x.data() + i * K, static_cast<size_t>(K) * 2);

  std::optional<GuardedBuffer> bbuf;
  GemmOptions opt;
  opt.act = p.act;
  if (p.bias == Bias::f32) {
    bbuf.emplace(static_cast<size_t>(N) * 4);
    std::memcpy(bbuf->data(), p.bias_f32.data(), static_cast<size_t>(N) * 4);
    opt.bias = TensorView(bbuf->data(), DType::f32, {N});
  } else if (p.bias == Bias::bf16) {
    bbuf.emplace(static_cast<size_t>(N) * 2);
    std::memcpy(bbuf->data(), p.bias_bf16.data(), static_cast<size_t>(N) * 2);
    opt.bias = TensorView(bbuf->data(), DType::bf16, {N});
  }

  // y: a guard zone of 64 elements on each side, everything sentinel-filled.
  constexpr int64_t kGuard = 64;
  const int64_t y_elems = M * ldy;
  std::vector<uint8_t> ybuf(static_cast<size_t>(y_elems + 2 * kGuard) * ysz);
  for (size_t e = 0; e < ybuf.size() / ysz; ++e) {
    if (ysz == 4)
      std::memcpy(&ybuf[e * 4], &kSentinelF32, 4);
    else
      std::memcpy(&ybuf[e * 2], &kSentinelBf16, 2);
  }
  uint8_t* y = ybuf.data() + kGuard * ysz;

  PackedWeight local;
  if (packed == nullptr) {
    local = pack_weight(TensorView(p.w.data(), DType::bf16, {N, K}));
    packed = &local;
  }
  try {
    gemm(TensorView(xg, DType::bf16, {M, K}, {ldx, 1}), *packed,
         TensorView(y, p.out, {M, N}, {ldy, 1}), opt);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << problem_str(p) << ": gemm threw: " << e.what();
  }

  // The oracle, on contiguous copies of the same inputs.
  std::vector<uint8_t> ref(static_cast<size_t>(M * N) * ysz);
  runtime::ReferenceGemmArgs a;
  a.x = p.x.data();
  a.ldx = K;
  a.m = M, a.n = N, a.k = K;
  a.bias = p.bias == Bias::f32    ? static_cast<const void*>(p.bias_f32.data())
           : p.bias == Bias::bf16 ? static_cast<const void*>(p.bias_bf16.data())
                                  : nullptr;
  a.bias_dtype = p.bias == Bias::bf16 ? DType::bf16 : DType::f32;
  a.act = p.act;
  a.y = ref.data();
  a.y_dtype = p.out;
  a.ldy = N;
  const uint16_t* w = p.w.data();
  runtime::reference_gemm(a, [&](int64_t n, int64_t k) { return w[n * K + k]; });

  // Per-output pre-activation and Σ|x·w| in double, for the bound.
  std::vector<double> xf(static_cast<size_t>(M * K)), wf(static_cast<size_t>(N * K));
  for (size_t e = 0; e < xf.size(); ++e) xf[e] = bf16_to_f32(p.x[e]);
  for (size_t e = 0; e < wf.size(); ++e) wf[e] = bf16_to_f32(p.w[e]);

  int64_t bad = 0;
  std::ostringstream msg;
  double worst = 0;  // max |err| / tol
  for (int64_t i = 0; i < M; ++i) {
    for (int64_t j = 0; j < N; ++j) {
      const double* xr = &xf[static_cast<size_t>(i * K)];
      const double* wr = &wf[static_cast<size_t>(j * K)];
      double s0 = 0, s1 = 0, a0 = 0, a1 = 0;
      int64_t kk = 0;
      for (; kk + 1 < K; kk += 2) {
        const double p0 = xr[kk] * wr[kk], p1 = xr[kk + 1] * wr[kk + 1];
        s0 += p0, s1 += p1;
        a0 += std::fabs(p0), a1 += std::fabs(p1);
      }
      if (kk < K) {
        const double p0 = xr[kk] * wr[kk];
        s0 += p0, a0 += std::fabs(p0);
      }
      const double b = p.bias == Bias::f32 ? double(p.bias_f32[static_cast<size_t>(j)])
                       : p.bias == Bias::bf16
                           ? double(bf16_to_f32(p.bias_bf16[static_cast<size_t>(j)]))
                           : 0.0;
      const double pre = s0 + s1 + b;
      const double v = runtime::reference_activation(p.act, pre);
      const double tol = gemm_tolerance(p.act, p.out, K, a0 + a1, std::fabs(b), pre, v);
      const double got = read_out(y, p.out, i * ldy + j);
      const double want = read_out(ref.data(), p.out, i * N + j);
      const double err = std::fabs(got - want);
      const bool ok = std::isfinite(got) && err <= tol;
      if (std::isfinite(got) && tol > 0) worst = std::max(worst, err / tol);
      if (!ok) {
        if (bad < 5)
          msg << "\n  y[" << i << ", " << j << "] = " << got << ", reference " << want << ", |err| "
              << err << " > tol " << tol << " (pre-activation " << pre << ")";
        ++bad;
      }
    }
  }

  // Padding columns of y and the guard zones must be untouched.
  int64_t touched = 0;
  std::ostringstream tmsg;
  auto is_sentinel = [&](int64_t idx) {  // idx relative to y[0]
    const uint8_t* e = y + idx * static_cast<int64_t>(ysz);
    return ysz == 4 ? std::memcmp(e, &kSentinelF32, 4) == 0
                    : std::memcmp(e, &kSentinelBf16, 2) == 0;
  };
  for (int64_t idx = -kGuard; idx < y_elems + kGuard; ++idx) {
    const bool inside = idx >= 0 && idx < y_elems && idx % ldy < N;
    if (!inside && !is_sentinel(idx)) {
      if (touched < 5)
        tmsg << "\n  y element at offset " << idx << " from y[0, 0], row stride " << ldy;
      ++touched;
    }
  }

  if (bad == 0 && touched == 0) {
    if (output != nullptr) {
      output->y_bytes.clear();
      for (int64_t i = 0; i < M; ++i)
        output->y_bytes.insert(output->y_bytes.end(), y + i * ldy * ysz, y + (i * ldy + N) * ysz);
    }
    return ::testing::AssertionSuccess() << problem_str(p) << " worst err/tol " << worst;
  }
  auto r = ::testing::AssertionFailure()
           << problem_str(p) << " (active path " << isa_name(cpu_info().isa) << "): ";
  if (bad) r << bad << " of " << M * N << " outputs outside the bound" << msg.str();
  if (touched) r << "\n" << touched << " elements outside y[M, N] were written:" << tmsg.str();
  return r;
}

// f() must raise tilejit::Error whose message contains every part (the
// argument, the value, what is allowed); anything else fails with the reason.
template <class F>
::testing::AssertionResult throws_with(F&& f, std::initializer_list<const char*> parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string m = e.what();
    for (const char* part : parts)
      if (m.find(part) == std::string::npos)
        return ::testing::AssertionFailure() << "message \"" << m << "\" lacks \"" << part << "\"";
    return ::testing::AssertionSuccess() << m;
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "not a tilejit::Error: " << e.what();
  }
  return ::testing::AssertionFailure() << "did not throw";
}

// The keys of the micro-kernels tilejit::gemm runs for m rows of `spec` with
// `active` the active path, from the plan's own list (gemm_isa_for_rows,
// GemmPlan::variants_for): what a compile count is checked against.
inline std::set<std::string> gemm_kernel_keys(const codegen::GemmSpec& spec, Isa active,
                                              int64_t m) {
  std::set<std::string> keys;
  const Isa path = codegen::gemm_isa_for_rows(active, m);
  if (path == Isa::scalar) return keys;
  const codegen::GemmPlan plan = codegen::plan_gemm(spec, path);
  for (const auto& v : plan.variants_for(m))
    keys.insert(plan.ukernel(v.rows, v.cols, v.chunk).key());
  return keys;
}

// One MLA decode call, DeepSeek's cache layout: a single latent kv head, V
// the first dv columns of K; `len` keys over `blocks` cache blocks of `block`
// rows, the block table in reverse order; q and the cache from `seed`.
// Returns out [1, hq, dv]; errors are the caller's to catch.
inline std::vector<uint16_t> mla_decode(int64_t hq, int64_t block, int64_t blocks, int64_t len,
                                        uint32_t seed, int64_t d = 576, int64_t dv = 512) {
  const std::vector<uint16_t> q = random_bf16(static_cast<size_t>(hq * d), seed);
  const std::vector<uint16_t> kv = random_bf16(static_cast<size_t>(blocks * block * d), seed + 1);
  std::vector<uint16_t> out(static_cast<size_t>(hq * dv), 0);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[i] = static_cast<int32_t>(blocks - 1 - i);
  const std::vector<int32_t> lens = {static_cast<int32_t>(len)};
  decode_attention(TensorView(q.data(), DType::bf16, {1, hq, d}),
                   TensorView(kv.data(), DType::bf16, {blocks, block, 1, d}),
                   TensorView(const_cast<uint16_t*>(kv.data()), DType::bf16, {blocks, block, 1, dv},
                              {block * d, d, d, 1}),
                   TensorView(out.data(), DType::bf16, {1, hq, dv}),
                   TensorView(table.data(), DType::i32, {1, blocks}),
                   TensorView(lens.data(), DType::i32, {1}));
  return out;
}

}  // namespace tilejit::test
