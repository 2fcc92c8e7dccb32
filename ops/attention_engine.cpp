#include "ops/attention_engine.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <utility>

#include "codegen/brgemm_desc.h"
#include "codegen/llvm/llvm_softmax.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "jit/registry.h"
#include "jit/tuning_db.h"
#include "ops/attention_scalar.h"
#include "runtime/aligned_buffer.h"
#include "runtime/bf16.h"
#include "runtime/cpu_features.h"
#include "runtime/lazy_statics.h"
#include "runtime/per_thread.h"
#include "runtime/verbose.h"

// The softmax helpers pass 64-byte vectors by value; they are internal and
// inlined, so GCC's psABI note (reported at the end of the file) concerns no caller.
#pragma GCC diagnostic ignored "-Wpsabi"
// The C++ softmax step (builds without LLVM) is built for AVX-512 / AVX2 too
// and picked once at run time (softmax_step_cxx below): the library itself
// targets baseline x86-64 (SSE2). Not target_clones: its ifunc resolver runs
// during relocation, before ThreadSanitizer's runtime is up, and crashes there.

namespace tilejit::ops::attn {
namespace {

namespace lb = codegen::llvm_backend;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kLog2e = 1.44269504088896341f;
constexpr int kMaxMr = 32;
constexpr int kLanes = 16;  // query rows per vector
// The weights of a row are exp(s − ref); ref follows the row's max only when
// that max exceeds it by more than 2⁸ in weight (harmless in fp32 and bf16),
// so most key blocks skip rescaling O (FlashAttention-4's conditional rescale).
constexpr float kLazyRescale = lb::kSoftmaxLazyRescale;

// The micro-kernels of one (ISA, D), from the kernel registry. One block
// calls a handful of variants thousands of times (per key block × row chunk),
// so the object remembers the last few it was given: a repeat costs a compare
// of a packed variant number, not a descriptor hash. It lives for one call
// on the stack; the registry's front cache serves the next call. Scores
// Sᵀ = K·Qᵀ: mr ∈ [1, mr limit] × nr ∈ {16, 32, 48, 64} (Qᵀ is zero-padded to
// 16 columns). Oᵀ += Vᵀ·Pᵀ: the same mr × nr × kb ∈ {32, 64, ..., key block}
// (the block's keys rounded up to 32), accumulating in place.
class Kernels {
 public:
  Kernels(Isa isa, int64_t d) : isa_(isa), d_(d) {}

  int mr_limit(int nz) const {
    return isa_ == Isa::amx ? kMaxMr : codegen::xbyak::avx512_brgemm_max_mr(nz);
  }

  codegen::BrgemmFn score(int rows, int nz) {
    return get(variant(0, rows, nz, 0, false), [&] {
      codegen::BrgemmDesc d = base();
      d.mr = rows;
      d.nr = kLanes * nz;
      d.kb = d_;
      return d;
    });
  }
  // accumulate = false: the first block of an empty state stores C instead
  // of adding to it (no zeroing of Oᵀ, no reading it back).
  codegen::BrgemmFn pv(int rows, int nz, int64_t kb, bool accumulate) {
    return get(variant(1, rows, nz, kb, accumulate), [&] {
      codegen::BrgemmDesc d = base();
      d.mr = rows;
      d.nr = kLanes * nz;
      d.kb = kb;
      d.accumulate = accumulate;
      return d;
    });
  }

 private:
  codegen::BrgemmDesc base() const {
    codegen::BrgemmDesc d;
    d.isa = isa_;
    d.b_row_bytes = codegen::PackedLayout::kRowBytes;
    d.out = DType::f32;
    return d;
  }
  // Every descriptor field that varies between this object's kernels, packed
  // (rows ≤ 32, nz ≤ 4, kb ≤ 256 for P·V): equal numbers, equal descriptors.
  static_assert(Blocking::kKeyBlockMax < 1024, "kb has 10 bits in the variant number");
  static uint32_t variant(int kind, int rows, int nz, int64_t kb, bool acc) {
    return static_cast<uint32_t>(kind) | static_cast<uint32_t>(rows) << 1 |
           static_cast<uint32_t>(nz) << 7 | static_cast<uint32_t>(kb) << 10 |
           static_cast<uint32_t>(acc) << 20;
  }
  template <class MakeDesc>
  codegen::BrgemmFn get(uint32_t v, MakeDesc make) {
    for (const Memo& m : memo_)
      if (m.fn != nullptr && m.variant == v) return m.fn;
    const auto fn = jit::get(make()).template entry<codegen::BrgemmFn>();
    memo_[next_++ % memo_.size()] = {v, fn};
    return fn;
  }

  struct Memo {
    uint32_t variant = 0;
    codegen::BrgemmFn fn = nullptr;
  };
  Isa isa_;
  int64_t d_;
  std::array<Memo, 8> memo_{};
  size_t next_ = 0;
};

// Calls f(r0, rows) over [0, n) in ⌈n / max⌉ near-equal chunks: 64 rows at
// mr ≤ 7 become 4 × 7 + 6 × 6 rather than 9 × 7 + 1, whose one-row call runs
// at a fraction of the FMA throughput.
template <class F>
void for_chunks(int64_t n, int max, F f) {
  const int64_t parts = (n + max - 1) / max;
  for (int64_t i = 0, r0 = 0; i < parts; ++i) {
    const int64_t rows = (n - r0 + (parts - i) - 1) / (parts - i);
    f(r0, static_cast<int>(rows));
    r0 += rows;
  }
}

// A grow-only 64-byte aligned array.
template <class T>
struct AlignedArray {
  std::unique_ptr<std::byte[], runtime::FreeDeleter> mem;
  size_t cap = 0;
  T* get(size_t n) {
    if (n > cap) {
      mem = runtime::aligned_alloc_bytes(n * sizeof(T));
      cap = n;
    }
    return reinterpret_cast<T*>(mem.get());
  }
};

// Per-thread scratch, reused across blocks and calls. Sized by the key
// block on use (heap, not thread_local arrays: up to 96 KiB at 256 keys).
struct Scratch {
  std::vector<uint32_t> q_packed;  // Qᵀ vnni2: [D/2 pairs (padded)][64 rows]
  AlignedArray<float> s;           // Sᵀ [key block][64 rows]
  AlignedArray<uint32_t> pt;       // Pᵀ vnni2: [key block / 2 pairs][64 rows]
  alignas(64) float m[kRowsPerBlock], l[kRowsPerBlock];      // reference max, sum
  alignas(64) int32_t lo[kRowsPerBlock], hi[kRowsPerBlock];  // visible keys per row
  AlignedArray<float> ot;                                    // Oᵀ [Dv][64 rows]
  AlignedArray<uint16_t> vt;  // Vᵀ of one key block [Dv][key block]
  // K rows of one key block gathered from small cache blocks [key block][D].
  AlignedArray<uint16_t> kg;
  alignas(64) uint16_t a_tail[32 * 32];
};
// This thread's scratch (runtime::per_thread: no TLS destructor to register).
Scratch& this_thread_scratch() {
  return runtime::per_thread<Scratch>([] {});
}

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// An LLVM glue kernel of the registry, or null when this build has no LLVM:
// the caller then runs its C++ code (TILEJIT_VERBOSE says so once). Any
// Error from the registry propagates: the descriptors are the engine's own,
// so a failure is a bug to see, not a case to hide.
template <class Fn, class Desc>
Fn glue_kernel(jit::Family family, const Desc& desc) {
  if (jit::family_built(family)) return jit::get(desc).template entry<Fn>();
  static std::once_flag logged;
  runtime::log_fallback_once(logged, std::string("attention: no ") + jit::family_name(family) +
                                         " kernels in this build (no LLVM): C++ glue");
  return nullptr;
}

// Qᵀ as a packed "weight" with N = rows, K = D: word (kp, r) holds q_r[2kp],
// q_r[2kp+1]; pairs past D/2 are 0 (AMX reads K padded to 32).
void pack_q(const std::vector<QueryRow>& rows, int64_t d) {
  Scratch& tls = this_thread_scratch();
  static const uint16_t kZeroRow[kMaxHeadDim] = {};
  const int64_t pairs = round_up(d, 32) / 2;
  const int64_t m = static_cast<int64_t>(rows.size());
  if (const auto fn = glue_kernel<lb::SoftmaxPackQFn>(
          jit::Family::softmax_glue, lb::SoftmaxGlueDesc{lb::SoftmaxGlue::pack_q})) {
    // Columns past the last 16-row group are never read (nr = 16·groups).
    tls.q_packed.resize(static_cast<size_t>(pairs * 64));
    const uint16_t* ptrs[kRowsPerBlock];
    const int64_t groups = (m + kLanes - 1) / kLanes;
    for (int64_t r = 0; r < groups * kLanes; ++r) ptrs[r] = r < m ? rows[r].q : kZeroRow;
    const lb::SoftmaxPackQArgs args{ptrs, tls.q_packed.data(), groups, d / 2, pairs};
    fn(&args);
    return;
  }
  tls.q_packed.assign(static_cast<size_t>(pairs * 64), 0u);
  uint32_t* dst = tls.q_packed.data();
  for (int64_t r = 0; r < m; ++r) {
    const uint16_t* q = rows[r].q;
    for (int64_t kp = 0; kp < d / 2; ++kp) {
      uint32_t w;
      std::memcpy(&w, q + 2 * kp, 4);
      dst[kp * 64 + r] = w;
    }
  }
}

// The softmax glue in GCC vector extensions, 16 query rows per vector: plain
// loops with selects do not auto-vectorise without -ffast-math.
using F16 = float __attribute__((vector_size(64)));
using I16 = int32_t __attribute__((vector_size(64)));
using U16 = uint32_t __attribute__((vector_size(64)));

template <class V, class T>
[[gnu::always_inline]] inline V load_v(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class V, class T>
[[gnu::always_inline]] inline void store_v(T* p, V v) {
  std::memcpy(p, &v, sizeof v);
}
[[gnu::always_inline]] inline bool any(I16 m) {
  int32_t r = 0;
  for (int l = 0; l < kLanes; ++l) r |= m[l];
  return r != 0;
}

// 2^x for x ≤ 8 (the lazy reference bounds it); x ≤ −127 (−inf included)
// gives exactly 0: x = n + f, |f| ≤ 1/2, 2^f by a degree-5 polynomial (rel.
// error < 3·10⁻⁶, far below P's bf16 rounding), 2^n by the exponent bits.
// A NaN x (NaN score) stays NaN: the clamp keeps it, and p carries it.
[[gnu::always_inline]] inline F16 exp2v(F16 x) {
  x = x < -127.f ? F16{} - 127.f : x;
  const F16 nf = (x + 12582912.f) - 12582912.f;  // round to nearest via the 1.5·2²³ shifter
  const F16 f = x - nf;
  F16 p = f * 1.33335581e-3f + 9.61812911e-3f;
  p = p * f + 5.55041087e-2f;
  p = p * f + 2.40226507e-1f;
  p = p * f + 6.93147181e-1f;
  p = p * f + 1.f;
  // Converting a NaN to int is undefined: NaN lanes take n = 0 (p is NaN there).
  const I16 n = __builtin_convertvector(nf == nf ? nf : F16{}, I16);
  return p * reinterpret_cast<F16>((n + 127) << 23);
}

// Of a function's copies per target (the C++ softmax step, the score pass),
// the one this CPU runs: AVX-512 with the OS state, else AVX2, else baseline.
template <class Fn>
Fn copy_for_cpu(Fn avx512, Fn avx2, Fn baseline) {
  const runtime::CpuFeatures& f = runtime::cpu_features();
  if (f.avx512f && f.os_avx512) return avx512;
  if (f.avx2) return avx2;
  return baseline;
}

// softcap·tanh(x / softcap) for 16 scores: tanh(y) = 1 − 2/(e^{2y} + 1), e^{2y}
// by exp2v with 2y·log2 e clamped to ≤ 64 (tanh is 1 in f32 long before).
// Absolute error ≲ 10⁻⁶·softcap (exp2v's 3·10⁻⁶), far below what P's bf16
// rounding moves; ±Inf give ±softcap, NaN stays NaN.
[[gnu::always_inline]] inline F16 softcap_v(F16 x, float cap) {
  F16 t = x * (2.f * kLog2e / cap);
  t = t > 64.f ? F16{} + 64.f : t;
  return cap * (1.f - 2.f / (exp2v(t) + 1.f));
}

// The final scores of Sᵀ rows j < n (key j0 + j), groups g < nz: s·scale,
// then softcap·tanh(· / softcap) when softcap > 0, then with ALiBi (slope
// non-null) + slope[r]·(key − i_pos[r]) per row r, in that order. One copy
// per ISA as the step below (the generic one ran the vectors as SSE).
// Measured (T 1024, D 128, causal, 2 threads): softcap 6.3x the plain
// prefill with a std::tanh per score, 2.4x as generic vectors, 1.2x so;
// ALiBi 1.3-1.5x as a per-row scalar pass.
struct ScoreTransform {
  float scale = 1, cap = 0;
  int64_t j0 = 0;
  const float* slope = nullptr;  // [64] per row, or null: no ALiBi
  const int32_t* i_pos = nullptr;
};
[[gnu::always_inline]] inline void scale_scores_body(float* s, int64_t n, int nz,
                                                     const ScoreTransform& t) {
  for (int64_t j = 0; j < n; ++j)
    for (int64_t r0 = 0; r0 < nz * kLanes; r0 += kLanes) {
      float* at = s + j * kRowsPerBlock + r0;
      F16 x = load_v<F16>(at) * t.scale;
      if (t.cap > 0) x = softcap_v(x, t.cap);
      if (t.slope != nullptr) {
        // key − i_pos as an int (|·| < 2^31), converted as the scalar
        // static_cast<float> of it: the same float.
        const I16 dist = static_cast<int32_t>(t.j0 + j) - load_v<I16>(t.i_pos + r0);
        x += load_v<F16>(t.slope + r0) * __builtin_convertvector(dist, F16);
      }
      store_v(at, x);
    }
}
__attribute__((target("avx512f"))) void scale_scores_avx512(float* s, int64_t n, int nz,
                                                            const ScoreTransform& t) {
  scale_scores_body(s, n, nz, t);
}
__attribute__((target("avx2"))) void scale_scores_avx2(float* s, int64_t n, int nz,
                                                       const ScoreTransform& t) {
  scale_scores_body(s, n, nz, t);
}
void scale_scores_baseline(float* s, int64_t n, int nz, const ScoreTransform& t) {
  scale_scores_body(s, n, nz, t);
}
auto scale_scores_copy() {
  static const auto fn =
      copy_for_cpu(scale_scores_avx512, scale_scores_avx2, scale_scores_baseline);
  return fn;
}
void scale_scores(float* s, int64_t n, int nz, const ScoreTransform& t) {
  scale_scores_copy()(s, n, nz, t);
}

// The online-softmax step (contract: codegen/llvm/llvm_softmax.h) in C++ for
// builds without LLVM; the JIT kernel does the same with vscalefps and
// vcvtne2ps2bf16 where the host has them.
// The weights of one 16-row group for keys j < kb (pass 2 of the step):
// Masked keeps only keys in [lo, hi_n] (hi_n ≤ the block's last key), with
// all-vector masks so GCC keeps it in zmm registers.
// A weight e^(s·scale − ref): the scaled score and ref rounded alike, then
// subtracted (no FMA may fuse them: this file is built with
// -ffp-contract=off, CMakeLists.txt), so the key that set
// ref gets exactly e^0 = 1 and the row's sum is at least 1. The FMA form
// s·(scale·log2e) − ref·log2e rounds its two products apart: at scaled
// scores near 2^31 their difference was hundreds of units off and every
// weight of a row flushed to 0 (a row of zeros, not a convex combination of v).
[[gnu::always_inline]] inline F16 weight(const float* s, F16 scale, F16 ref) {
  const F16 x = load_v<F16>(s) * scale;
  const F16 d = x - ref;
  return exp2v(d * kLog2e);
}

template <bool Masked>
[[gnu::always_inline]] inline F16 weights(const lb::SoftmaxStepArgs& a, int64_t r0, F16 scale,
                                          F16 ref, I16 lo, I16 hi_n) {
  F16 sum{};
  for (int64_t j = 0; j < a.kb; j += 2) {
    F16 e0 = weight(a.s + j * 64 + r0, scale, ref);
    F16 e1 = weight(a.s + (j + 1) * 64 + r0, scale, ref);
    if constexpr (Masked) {
      const I16 k0 = I16{} + static_cast<int32_t>(a.j0 + j), k1 = k0 + 1;
      e0 = ((k0 >= lo) & (k0 <= hi_n)) ? e0 : F16{};
      e1 = ((k1 >= lo) & (k1 <= hi_n)) ? e1 : F16{};
    }
    // bf16 round to nearest even (weights are finite and ≥ 0); key j in the
    // low half of the pair word, key j + 1 in the high half.
    const U16 u0 = reinterpret_cast<U16>(e0), u1 = reinterpret_cast<U16>(e1);
    const U16 h0 = (u0 + 0x7fffu + ((u0 >> 16) & 1u)) & 0xffff0000u;
    const U16 h1 = (u1 + 0x7fffu + ((u1 >> 16) & 1u)) & 0xffff0000u;
    store_v(a.pt + j / 2 * 64 + r0, (h0 >> 16) | h1);
    // l sums the rounded weights, so numerator and denominator agree.
    sum += reinterpret_cast<F16>(h0) + reinterpret_cast<F16>(h1);
  }
  return sum;
}

// The body of softmax_step_cxx, inlined into one copy per target. Its
// interface has no vector types: the helpers pass 64-byte vectors by value,
// which clang refuses across functions of different targets (a different ABI),
// but accepts once they are inlined into a caller of the same target.
[[gnu::always_inline]] inline void softmax_step_body(const lb::SoftmaxStepArgs& a, int nz) {
  const F16 scale = F16{} + a.scale;
  const bool masked = a.masked != 0;
  for (int64_t g = 0; g < nz; ++g) {
    const int64_t r0 = g * kLanes;
    const I16 lo = load_v<I16>(a.lo + r0), hi = load_v<I16>(a.hi + r0);
    const I16 last = I16{} + static_cast<int32_t>(a.j0 + a.n - 1);
    const I16 hi_n = hi < last ? hi : last;
    // The block max of each row's scaled scores (masked keys excluded), bit
    // for bit the x that weight() computes for its key. Rounding is
    // monotonic, so for sm_scale >= 0 that is max(s)·scale: the multiply per
    // score only serves a negative scale.
    const bool neg = a.scale < 0;
    F16 bm = F16{} + kNegInf;
    if (masked) {
      for (int64_t j = 0; j < a.n; ++j) {
        F16 v = load_v<F16>(a.s + j * 64 + r0);
        if (neg) v *= scale;
        const I16 key = I16{} + static_cast<int32_t>(a.j0 + j);
        bm = ((key >= lo) & (key <= hi) & (v > bm)) ? v : bm;
      }
    } else {
      for (int64_t j = 0; j < a.kb; ++j) {
        F16 v = load_v<F16>(a.s + j * 64 + r0);
        if (neg) v *= scale;
        bm = v > bm ? v : bm;
      }
    }
    if (!neg) bm *= scale;
    F16 ref = load_v<F16>(a.m + r0);
    const I16 upd = bm > ref + kLazyRescale;
    if (any(upd)) {
      // alpha = e^(ref − new): 0 for a row's first visible block (ref = −inf,
      // and O, l are still 0 there), 1 for rows that keep their reference.
      const F16 nref = upd ? bm : ref;
      const F16 alpha = upd ? exp2v((ref - nref) * kLog2e) : F16{} + 1.f;
      if (any(ref != kNegInf)) {
        store_v(a.l + r0, load_v<F16>(a.l + r0) * alpha);
        for (int64_t col = 0; col < a.dv; ++col) {
          float* o = a.ot + col * 64 + r0;
          store_v(o, load_v<F16>(o) * alpha);
        }
      }
      ref = nref;
      store_v(a.m + r0, ref);
    }
    // A row with no visible key yet keeps ref = −inf; its weights are 0 anyway.
    const F16 r = ref == kNegInf ? F16{} : ref;
    const F16 sum = masked ? weights<true>(a, r0, scale, r, lo, hi_n)
                           : weights<false>(a, r0, scale, r, lo, hi_n);
    store_v(a.l + r0, load_v<F16>(a.l + r0) + sum);
  }
}

__attribute__((target("avx512f"))) void softmax_step_avx512(const lb::SoftmaxStepArgs& a, int nz) {
  softmax_step_body(a, nz);
}
__attribute__((target("avx2"))) void softmax_step_avx2(const lb::SoftmaxStepArgs& a, int nz) {
  softmax_step_body(a, nz);
}
void softmax_step_baseline(const lb::SoftmaxStepArgs& a, int nz) {
  softmax_step_body(a, nz);
}

// The copy for this CPU, chosen on first use.
auto softmax_step_copy() {
  static const auto fn =
      copy_for_cpu(softmax_step_avx512, softmax_step_avx2, softmax_step_baseline);
  return fn;
}
void softmax_step_cxx(const lb::SoftmaxStepArgs& a, int nz) {
  softmax_step_copy()(a, nz);
}
const bool g_fork_hooks = runtime::on_fork_complete([] { (void)scale_scores_copy(); }) &&
                          runtime::on_fork_complete([] { (void)softmax_step_copy(); });

// The step kernel for nz groups (compiled once per nz and host), or null:
// the C++ loop above (no LLVM in this build).
lb::SoftmaxStepFn softmax_step_kernel(int nz) {
  return glue_kernel<lb::SoftmaxStepFn>(jit::Family::softmax_step, lb::SoftmaxStepDesc{nz});
}

void softmax_step(const lb::SoftmaxStepArgs& a, int nz, lb::SoftmaxStepFn fn) {
  if (fn)
    fn(&a);
  else
    softmax_step_cxx(a, nz);
}

lb::SoftmaxTransposeVFn transpose_v_kernel() {
  return glue_kernel<lb::SoftmaxTransposeVFn>(jit::Family::softmax_glue,
                                              lb::SoftmaxGlueDesc{lb::SoftmaxGlue::transpose_v});
}

// transpose_v with its kernel (or null) already looked up.
void transpose_v_with(lb::SoftmaxTransposeVFn fn, const RowSource& v, int64_t j0, int64_t n,
                      int64_t dv, uint16_t* out, int64_t ld) {
  static const uint16_t kZeroRow[kMaxHeadDim] = {};
  // In runs of up to 128 keys (16-key tiles, padding rows point at zeros).
  constexpr int64_t kRun = 128;
  for (int64_t jb = 0; jb < n; jb += kRun) {
    const int64_t nj = std::min(kRun, n - jb), padded = round_up(nj, 16);
    const uint16_t* rows[kRun];
    for (int64_t j = 0; j < padded; ++j) rows[j] = j < nj ? v.row(j0 + jb + j) : kZeroRow;
    if (fn && dv % kLanes == 0) {
      const lb::SoftmaxTransposeVArgs args{rows, out + jb, ld, nj, dv};
      fn(&args);
      continue;
    }
    for (int64_t c = 0; c < dv; ++c) {
      uint16_t* o = out + c * ld + jb;
      for (int64_t j = 0; j < padded; ++j) o[j] = rows[j][c];
    }
  }
}

// Rows of a paged source in runs too short for the score GEMM's row blocks.
bool scattered(const RowSource& s) {
  return s.table != nullptr && s.block_size % 16 != 0;
}

// Asks for the K rows and Vᵀ columns of keys [j0, j0 + n) in L2 while the
// current block computes: past ~1 MB of K and V per kv head (T ≳ 2k at D =
// 128) they come from L3, where the micro-kernels' broadcast loads of A would
// wait for them (measured +2% at T = 8192, neutral at 2048).
//
// With scattered rows (a paged cache whose blocks hold fewer than 16 keys
// or not a multiple of 16) the V rows are asked for too: no hardware
// prefetcher follows a block table row by row.
void prefetch_block(const Params& p, const RowSource& k, const RowSource& v, const TransposedV* vt,
                    int64_t j0, int64_t n) {
  if (n <= 0) return;
  for (int64_t j = 0; j < n; ++j) {
    const char* row = reinterpret_cast<const char*>(k.row(j0 + j));
    for (int64_t b = 0; b < p.d * 2; b += 64) __builtin_prefetch(row + b, 0, 2);
  }
  if (vt == nullptr && scattered(v))
    for (int64_t j = 0; j < n; ++j) {
      const char* row = reinterpret_cast<const char*>(v.row(j0 + j));
      for (int64_t b = 0; b < p.dv * 2; b += 64) __builtin_prefetch(row + b, 0, 2);
    }
  if (vt == nullptr) return;
  for (int64_t c = 0; c < p.dv; ++c) {
    const char* col = reinterpret_cast<const char*>(vt->base + c * vt->ld + (j0 - vt->first));
    for (int64_t b = 0; b < n * 2; b += 64) __builtin_prefetch(col + b, 0, 2);
  }
}

}  // namespace

void transpose_v(const RowSource& v, int64_t j0, int64_t n, int64_t dv, uint16_t* out, int64_t ld) {
  transpose_v_with(transpose_v_kernel(), v, j0, n, dv, out, ld);
}

Params make_params(const AttentionOptions& opt, int64_t d, int64_t dv) {
  Params p;
  p.d = d;
  p.dv = dv;
  p.scale = opt.sm_scale ? *opt.sm_scale : static_cast<float>(1.0 / std::sqrt(double(d)));
  p.softcap = opt.softcap;
  p.causal = opt.causal;
  p.window_left = opt.window_left;
  p.window_right = opt.window_right;
  if (opt.sinks) {
    p.sinks = static_cast<const float*>(opt.sinks->data);
    p.sinks_stride = opt.sinks->strides[0];
  }
  if (opt.alibi_slopes) {
    p.slopes = static_cast<const float*>(opt.alibi_slopes->data);
    p.slopes_stride = opt.alibi_slopes->strides[0];
  }
  return p;
}

void Partial::reset(int64_t rows, int64_t dv_padded) {
  ldo = dv_padded;
  mx.assign(static_cast<size_t>(rows), kNegInf);
  l.assign(static_cast<size_t>(rows), 0.f);
  o.assign(static_cast<size_t>(rows * dv_padded), 0.f);
}

void visible_keys(const Params& p, int64_t i_pos, int64_t tk, int64_t& lo, int64_t& hi) {
  lo = p.window_left >= 0 ? std::max<int64_t>(0, i_pos - p.window_left) : 0;
  hi = tk - 1;
  if (p.causal) hi = std::min(hi, i_pos);
  if (p.window_right >= 0) hi = std::min(hi, i_pos + p.window_right);
}

namespace {

// attend() on the per-thread transposed state (tls.m, tls.l, tls.ot), which
// starts from `init` or, without it, empty. Returns false, touching nothing,
// when no row sees any key of [j_begin, j_end).
bool run_blocks(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
                const RowSource& v, int64_t tk, int64_t j_begin, int64_t j_end,
                const TransposedV* vt, const Partial* init) {
  Scratch& tls = this_thread_scratch();
  const int64_t m = static_cast<int64_t>(rows.size());
  const int nz = static_cast<int>((m + kLanes - 1) / kLanes);
  const int64_t mp = int64_t(nz) * kLanes;
  // The visible interval of every row (padded rows see nothing), and the key
  // range any row can see, so blocks above the causal diagonal (or outside
  // every window) are skipped entirely.
  int64_t kmin = std::numeric_limits<int64_t>::max(), kmax = -1;
  int64_t lo_max = std::numeric_limits<int64_t>::min(),
          hi_min = std::numeric_limits<int64_t>::max();
  for (int64_t r = 0; r < mp; ++r) {
    int64_t lo = 1, hi = 0;
    if (r < m) {
      visible_keys(p, rows[r].i_pos, tk, lo, hi);
      if (lo <= hi) kmin = std::min(kmin, lo), kmax = std::max(kmax, hi);
      lo_max = std::max(lo_max, lo), hi_min = std::min(hi_min, hi);
    }
    tls.lo[r] = static_cast<int32_t>(lo);
    tls.hi[r] = static_cast<int32_t>(hi);
  }
  const int64_t jb0 = std::max(j_begin, kmin), jb1 = std::min(j_end, kmax + 1);
  if (jb0 >= jb1) return false;

  // The state, transposed: reference and sum per row, Oᵀ [Dv][64].
  float* ot = tls.ot.get(static_cast<size_t>(p.dv * kRowsPerBlock));
  bool fresh = true;
  for (int64_t r = 0; r < mp; ++r) {
    tls.m[r] = init && r < m ? init->mx[r] : kNegInf;
    tls.l[r] = init && r < m ? init->l[r] : 0.f;
    fresh = fresh && tls.m[r] == kNegInf;
  }
  // Fresh: Oᵀ is written by the first block's P·V (accumulate off), and the
  // softmax step leaves it alone until then (every reference is −inf).
  bool accumulate = !fresh;
  if (!fresh) {
    for (int64_t c = 0; c < p.dv; ++c)
      for (int64_t r = 0; r < kRowsPerBlock; ++r)
        ot[c * kRowsPerBlock + r] = r < m ? init->o[r * init->ldo + c] : 0.f;
  }

  Kernels ker(isa, p.d);
  // The glue kernels of this call, looked up once (not per key block).
  const lb::SoftmaxStepFn step_fn = softmax_step_kernel(nz);
  const lb::SoftmaxTransposeVFn transpose_fn = transpose_v_kernel();
  const int mr = ker.mr_limit(nz);
  const int64_t d_full = p.d / 32 * 32, d_tail = p.d % 32;
  const bool amx_tail = isa == Isa::amx && d_tail != 0;
  // Scale, softcap, ALiBi and tree masks other than the visible interval go
  // through a C++ pass over the scores first (rare options, not the fast path).
  const bool slow = p.softcap > 0 || p.slopes != nullptr ||
                    std::any_of(rows.begin(), rows.end(), [](const QueryRow& r) { return r.mask; });
  pack_q(rows, p.d);
  const bool gather_k = scattered(k);
  const int64_t key_block = p.key_block;
  if (!Blocking::key_block_allowed(key_block))  // set from a validated tuning entry
    throw Error(fmt::format("attention: key block {}; allowed: a multiple of {} in [{}, {}]",
                            key_block, Blocking::kKeyBlockStep, Blocking::kKeyBlockStep,
                            Blocking::kKeyBlockMax));
  float* const s_buf = tls.s.get(static_cast<size_t>(key_block * kRowsPerBlock));
  uint32_t* const pt_buf = tls.pt.get(static_cast<size_t>(key_block / 2 * kRowsPerBlock));
  const void* q_ptr = tls.q_packed.data();
  const void* pt_ptr = pt_buf;

  // The slow pass's per-row ALiBi terms, once for every key block.
  ScoreTransform transform{p.scale, p.softcap};
  alignas(64) float slope[kRowsPerBlock] = {};
  alignas(64) int32_t i_pos[kRowsPerBlock] = {};
  if (p.slopes != nullptr) {
    for (int64_t r = 0; r < m; ++r) {
      slope[r] = p.slopes[rows[r].head * p.slopes_stride];
      i_pos[r] = static_cast<int32_t>(rows[r].i_pos);
    }
    transform.slope = slope, transform.i_pos = i_pos;
  }

  for (int64_t j0 = jb0; j0 < jb1; j0 += key_block) {
    const int64_t n = std::min(key_block, jb1 - j0);
    prefetch_block(p, k, v, vt, j0 + key_block, std::min(key_block, jb1 - j0 - key_block));
    // Rows scattered over small cache blocks (block size 1, 8, ...) are
    // gathered first, so the score GEMM runs on whole row blocks rather than
    // one call per cache block.
    RowSource kd = k;
    if (gather_k) {
      uint16_t* dst = tls.kg.get(static_cast<size_t>(key_block * p.d));
      for (int64_t j = 0; j < n; ++j)
        std::memcpy(dst + j * p.d, k.row(j0 + j), static_cast<size_t>(p.d) * 2);
      kd = RowSource{dst, p.d};
      kd.first = j0;
    }
    const RowSource& ks = kd;
    // Sᵀ[keys × m] = K[keys × D] · Qᵀ, in runs of rows sharing one stride.
    for (int64_t jl = 0; jl < n;) {
      const int64_t run = std::min(n - jl, ks.run(j0 + jl));
      for_chunks(run, mr, [&](int64_t r0, int rr) {
        const uint16_t* a_ptr = ks.row(j0 + jl + r0);
        const void* a = a_ptr;
        codegen::BrgemmArgs args{};
        args.a = &a;
        args.b = &q_ptr;
        args.batch = 1;
        args.lda = ks.row_stride * 2;
        args.c = s_buf + (jl + r0) * kRowsPerBlock;
        args.ldc = kRowsPerBlock * 4;
        if (amx_tail) {
          // AMX K tail: zero-padded copy of the last D % 32 columns of each row.
          std::memset(tls.a_tail, 0, sizeof tls.a_tail);
          for (int r = 0; r < rr; ++r)
            std::memcpy(tls.a_tail + r * 32, a_ptr + r * ks.row_stride + d_full, d_tail * 2);
          args.a_tail = tls.a_tail;
        }
        ker.score(rr, nz)(&args);
      });
      jl += run;
    }

    const int64_t kb = round_up(n, 32);
    lb::SoftmaxStepArgs step{s_buf, pt_buf, ot, tls.m, tls.l,   tls.lo, tls.hi,
                             j0,    n,      kb, p.dv,  p.scale, 1};
    if (slow) {
      // Final scores in place (masked keys −inf), then a step with scale 1.
      // Scale, softcap and ALiBi 16 rows a vector over the nz groups (rows
      // past m are scratch the step ignores): a std::tanh per score made
      // softcap prefill 3.6-6.7x slower than without it (an outside tester's find).
      transform.j0 = j0;
      scale_scores(s_buf, n, nz, transform);
      // Tree masks (speculative decoding's drafts): a per-row pass.
      for (int64_t r = 0; r < m; ++r) {
        const QueryRow& row = rows[r];
        if (row.mask == nullptr) continue;
        for (int64_t j = 0; j < n; ++j) {
          const int64_t key = j0 + j;
          if (key >= row.mask_first && row.mask[(key - row.mask_first) * row.mask_stride] == 0)
            s_buf[j * kRowsPerBlock + r] = kNegInf;
        }
      }
      step.scale = 1.f;
    } else {
      step.masked = n != kb || j0 < lo_max || j0 + n - 1 > hi_min;
    }
    softmax_step(step, nz, step_fn);

    // Oᵀ[Dv × m] += Vᵀ[Dv × kb] · Pᵀ[kb × m]; Vᵀ columns past n are zeros
    // (the weights there are 0, and 0 · NaN would not be).
    const uint16_t* a_base;
    int64_t lda;
    if (vt) {
      a_base = vt->base + (j0 - vt->first);
      lda = vt->ld;
    } else {
      uint16_t* blk = tls.vt.get(static_cast<size_t>(p.dv * key_block));
      transpose_v_with(transpose_fn, v, j0, n, p.dv, blk, key_block);
      if (n < kb)
        for (int64_t c = 0; c < p.dv; ++c)
          std::memset(blk + c * key_block + n, 0, static_cast<size_t>(kb - n) * 2);
      a_base = blk;
      lda = key_block;
    }
    for_chunks(p.dv, mr, [&](int64_t c0, int rr) {
      const void* a = a_base + c0 * lda;
      float* c = ot + c0 * kRowsPerBlock;
      codegen::BrgemmArgs args{};
      args.a = &a;
      args.b = &pt_ptr;
      args.batch = 1;
      args.lda = lda * 2;
      args.c = c;
      args.ldc = kRowsPerBlock * 4;
      if (accumulate) {
        args.acc_in = c;
        args.ld_acc_in = kRowsPerBlock * 4;
      }
      ker.pv(rr, nz, kb, accumulate)(&args);
    });
    accumulate = true;
  }

  return true;
}

// 1/l per row, with a sink joining the denominator (against max(m, sink), so
// exp never overflows); 0 for a row that saw no key; NaN when l is (a NaN
// score), so the row's output is NaN whatever O holds.
float out_factor(const Params& p, const QueryRow& row, float mx, float l) {
  if (l == 0.f) return 0.f;
  float scale_o = 1;
  if (p.sinks) {
    const float sink = p.sinks[row.head * p.sinks_stride];
    const float m2 = std::max(mx, sink);
    scale_o = std::exp(mx - m2);
    l = l * scale_o + std::exp(sink - m2);
  }
  return scale_o / l * p.v_scale;
}

// out rows from the transposed state: the LLVM kernel, else plain loops.
// Returns the rows (bit r) whose output may hold a NaN or an Inf: their O
// or their factor is not finite (the NaN/Inf rule, ops/attention_scalar.h).
uint64_t finish_transposed(const Params& p, const std::vector<QueryRow>& rows,
                           const std::vector<uint16_t*>& out_rows) {
  Scratch& tls = this_thread_scratch();
  const auto fn = glue_kernel<lb::SoftmaxFinishFn>(jit::Family::softmax_glue,
                                                   lb::SoftmaxGlueDesc{lb::SoftmaxGlue::finish});
  const int64_t m = static_cast<int64_t>(rows.size());
  alignas(64) float f[kRowsPerBlock] = {};
  for (int64_t r = 0; r < m; ++r) f[r] = out_factor(p, rows[r], tls.m[r], tls.l[r]);
  const float* ot = tls.ot.get(static_cast<size_t>(p.dv * kRowsPerBlock));
  uint64_t bad_rows = 0;
  if (fn && p.dv % kLanes == 0) {
    // bad[r] starts as 0·f[r] and the kernel adds 0·ΣO: each is 0 or NaN, so
    // one OR of the exponent bits over the block (a few vector ops, no
    // per-row branch) says whether any row needs the rule at all.
    alignas(64) float bad[kRowsPerBlock];
    for (int64_t r = 0; r < kRowsPerBlock; ++r) bad[r] = 0.f * f[r];
    const lb::SoftmaxFinishArgs args{ot, f, out_rows.data(), m, p.dv, bad};
    fn(&args);
    uint32_t exp_bits = 0;
    for (int64_t r = 0; r < kRowsPerBlock; ++r) {
      uint32_t u;
      std::memcpy(&u, &bad[r], 4);
      exp_bits |= u & 0x7f800000u;
    }
    if (exp_bits == 0) return 0;
    for (int64_t r = 0; r < m; ++r)
      if (std::isnan(bad[r])) bad_rows |= uint64_t{1} << r;
    return bad_rows;
  }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < p.dv; ++c)
      out_rows[r][c] = runtime::f32_to_bf16(ot[c * kRowsPerBlock + r] * f[r]);
    if (nonfinite_bf16(out_rows[r], p.dv)) bad_rows |= uint64_t{1} << r;
  }
  return bad_rows;
}

}  // namespace

void attend(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
            const RowSource& v, int64_t tk, int64_t j_begin, int64_t j_end, Partial& st,
            const TransposedV* vt) {
  if (!run_blocks(isa, p, rows, k, v, tk, j_begin, j_end, vt, &st)) return;
  Scratch& tls = this_thread_scratch();
  const float* ot = tls.ot.get(static_cast<size_t>(p.dv * kRowsPerBlock));
  for (size_t r = 0; r < rows.size(); ++r) {
    st.mx[r] = tls.m[r];
    st.l[r] = tls.l[r];
    float* o = st.o.data() + static_cast<int64_t>(r) * st.ldo;
    for (int64_t c = 0; c < p.dv; ++c) o[c] = ot[c * kRowsPerBlock + static_cast<int64_t>(r)];
  }
}

void attend_finish(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
                   const RowSource& v, int64_t tk, const TransposedV* vt,
                   const std::vector<uint16_t*>& out_rows) {
  if (!run_blocks(isa, p, rows, k, v, tk, 0, tk, vt, nullptr)) {
    for (uint16_t* out : out_rows) std::fill(out, out + p.dv, uint16_t{0});
    return;
  }
  // The NaN/Inf rule (ops/attention_scalar.h), with the rows found by the
  // finish kernel instead of a pass over the output (≈2% of a short prefill).
  const uint64_t bad_rows = finish_transposed(p, rows, out_rows);
  for (size_t r = 0; r < rows.size(); ++r)
    if (bad_rows >> r & 1)
      scalar_row(
          p, rows[r], tk, [&](int64_t j) { return k.row(j); }, [&](int64_t j) { return v.row(j); },
          out_rows[r]);
}

void merge(Partial& a, const Partial& b, int64_t rows, int64_t dv) {
  for (int64_t r = 0; r < rows; ++r) {
    const float mb = b.mx[r];
    if (mb == kNegInf) continue;
    const float ma = a.mx[r], mn = std::max(ma, mb);
    const float fa = ma == kNegInf ? 0.f : std::exp(ma - mn), fb = std::exp(mb - mn);
    float* oa = a.o.data() + r * a.ldo;
    const float* ob = b.o.data() + r * b.ldo;
    for (int64_t c = 0; c < dv; ++c) oa[c] = oa[c] * fa + ob[c] * fb;
    a.l[r] = a.l[r] * fa + b.l[r] * fb;
    a.mx[r] = mn;
  }
}

void finish(const Params& p, const std::vector<QueryRow>& rows, const Partial& st,
            const std::vector<uint16_t*>& out_rows) {
  for (size_t r = 0; r < rows.size(); ++r) {
    uint16_t* out = out_rows[r];
    const float f = out_factor(p, rows[r], st.mx[r], st.l[r]);
    const float* o = st.o.data() + static_cast<int64_t>(r) * st.ldo;
    for (int64_t c = 0; c < p.dv; ++c) out[c] = runtime::f32_to_bf16(o[c] * f);
  }
}

Blocking tuned_blocking(const jit::TunedEntry* tuned) {
  Blocking b;
  if (tuned) {
    b.rows = tuned->knob("rows").value_or(b.rows);
    b.key_block = tuned->knob("key_block").value_or(b.key_block);
  }
  return b;
}

}  // namespace tilejit::ops::attn
