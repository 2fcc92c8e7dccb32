#include "ops/attention_engine.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <tuple>

#include "codegen/brgemm_desc.h"
#include "codegen/packed_layout.h"
#include "codegen/xbyak/emitters.h"
#include "jit/brgemm_kernels.h"
#include "runtime/bf16.h"

// The softmax helpers pass 64-byte vectors by value; they are internal and
// inlined, so GCC's psABI note (reported at the end of the file) concerns no caller.
#pragma GCC diagnostic ignored "-Wpsabi"
// The C++ glue loops (softmax, V repack) are built for AVX-512 / AVX2 too and
// picked at load time: the library itself targets baseline x86-64 (SSE2).
#define TILEJIT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))

namespace tilejit::ops::attn {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int kMaxMr = 32;

// The micro-kernels of one (ISA, D, Dv): a bounded set, looked up lock-free
// after the first use. Scores: mr ∈ [1, mr limit] × nr ∈ {16, 32, 48, 64}
// (Qᵀ is zero-padded to 16 columns). P·V: mr × {kb 32, kb 64} × {64, Dv % 64}.
class Kernels {
 public:
  Kernels(Isa isa, int64_t d, int64_t dv) : isa_(isa), d_(d), dv_(dv) {}

  int score_mr(int nz) const { return mr_limit(nz); }
  int pv_mr() const { return mr_limit(static_cast<int>(std::min<int64_t>(4, (dv_ + 15) / 16))); }

  codegen::BrgemmFn score(int rows, int nz) {
    return get(score_[nz - 1][rows - 1], [&] {
      codegen::BrgemmDesc d = base();
      d.mr = rows;
      d.nr = 16 * nz;
      d.kb = d_;
      return d;
    });
  }
  codegen::BrgemmFn pv(int rows, int64_t kb, bool tail) {
    return get(pv_[kb == 64][tail][rows - 1], [&] {
      codegen::BrgemmDesc d = base();
      d.mr = rows;
      d.nr = tail ? static_cast<int>(dv_ % 64) : 64;
      d.kb = kb;
      d.accumulate = true;
      return d;
    });
  }

 private:
  int mr_limit(int nz) const {
    return isa_ == Isa::amx ? kMaxMr : codegen::xbyak::avx512_brgemm_max_mr(nz);
  }
  codegen::BrgemmDesc base() const {
    codegen::BrgemmDesc d;
    d.isa = isa_;
    d.b_row_bytes = codegen::PackedLayout::kRowBytes;
    d.out = DType::f32;
    return d;
  }
  template <class MakeDesc>
  codegen::BrgemmFn get(std::atomic<codegen::BrgemmFn>& slot, MakeDesc make) {
    if (codegen::BrgemmFn f = slot.load(std::memory_order_acquire)) return f;
    const codegen::BrgemmDesc desc = make();
    const jit::Kernel& k = jit::brgemm_kernel(desc);
    const auto f = k.entry<codegen::BrgemmFn>();
    slot.store(f, std::memory_order_release);
    return f;
  }

  Isa isa_;
  int64_t d_, dv_;
  std::array<std::array<std::atomic<codegen::BrgemmFn>, kMaxMr>, 4> score_{};
  std::array<std::array<std::array<std::atomic<codegen::BrgemmFn>, kMaxMr>, 2>, 2> pv_{};
};

Kernels& kernels_for(Isa isa, int64_t d, int64_t dv) {
  static std::shared_mutex mu;
  static std::map<std::tuple<Isa, int64_t, int64_t>, std::unique_ptr<Kernels>> map;
  const auto key = std::make_tuple(isa, d, dv);
  {
    std::shared_lock lk(mu);
    if (auto it = map.find(key); it != map.end()) return *it->second;
  }
  std::unique_lock lk(mu);
  auto& slot = map[key];
  if (!slot) slot = std::make_unique<Kernels>(isa, d, dv);
  return *slot;
}

// Per-thread scratch, reused across blocks and calls.
struct Scratch {
  std::vector<uint32_t> q_packed;  // Qᵀ in vnni2: [D/2 pairs (padded to 16)][64 columns]
  std::vector<float> s;            // Sᵀ [64 keys][64 rows]
  std::vector<uint16_t> p;         // P [rows][kb] bf16
  std::vector<uint32_t> v_packed;  // V block in vnni2: [Dv/64 blocks][kb/2 pairs][64]
  alignas(64) uint16_t a_tail[32 * 32];
};
thread_local Scratch tls;

int64_t round_up(int64_t x, int64_t m) {
  return (x + m - 1) / m * m;
}

// Qᵀ as a packed "weight" with N = rows, K = D: word (kp, r) holds q_r[2kp], q_r[2kp+1].
void pack_q(const std::vector<QueryRow>& rows, int64_t d) {
  const int64_t pairs = round_up(d, 32) / 2;
  tls.q_packed.assign(static_cast<size_t>(pairs * 64), 0u);
  uint32_t* dst = tls.q_packed.data();
  for (size_t r = 0; r < rows.size(); ++r) {
    const uint16_t* q = rows[r].q;
    for (int64_t kp = 0; kp < d / 2; ++kp) {
      uint32_t w;
      std::memcpy(&w, q + 2 * kp, 4);
      dst[kp * 64 + static_cast<int64_t>(r)] = w;
    }
  }
}

// Keys [j0, j0 + n) of V as a packed weight with N = Dv, K = kb (n padded with zero keys).
TILEJIT_CLONES void pack_v(const RowSource& v, int64_t j0, int64_t n, int64_t kb, int64_t dv) {
  const int64_t pairs = kb / 2, nblocks = (dv + 63) / 64;
  tls.v_packed.resize(static_cast<size_t>(nblocks * pairs * 64));
  uint32_t* dst = tls.v_packed.data();
  for (int64_t kp = 0; kp < pairs; ++kp) {
    const int64_t ja = 2 * kp, jb = 2 * kp + 1;
    const uint16_t* r0 = ja < n ? v.row(j0 + ja) : nullptr;
    const uint16_t* r1 = jb < n ? v.row(j0 + jb) : nullptr;
    for (int64_t nb = 0; nb < nblocks; ++nb) {
      uint32_t* out = dst + (nb * pairs + kp) * 64;
      const int64_t c0 = nb * 64, cols = std::min<int64_t>(64, dv - c0);
      // Branch-free inner loops (they vectorise); zero keys pad the last pair.
      if (r0 && r1) {
        const uint16_t *a = r0 + c0, *b = r1 + c0;
        for (int64_t c = 0; c < cols; ++c) out[c] = uint32_t(a[c]) | (uint32_t(b[c]) << 16);
      } else if (r0) {
        const uint16_t* a = r0 + c0;
        for (int64_t c = 0; c < cols; ++c) out[c] = a[c];
      } else {
        std::memset(out, 0, static_cast<size_t>(cols) * 4);
      }
    }
  }
}

// The softmax glue in GCC vector extensions (16 floats): plain loops with
// selects and a float max reduction do not auto-vectorise without
// -ffast-math.
using F16 = float __attribute__((vector_size(64)));
using I16 = int32_t __attribute__((vector_size(64)));
using U16 = uint32_t __attribute__((vector_size(64)));

[[gnu::always_inline]] inline F16 load16(const float* p) {
  F16 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// e^x for x ≤ 0 (−inf and anything below −87 give exactly 0): x = n·ln2 + f,
// |f| ≤ ln2/2, e^f by a degree-6 polynomial (relative error < 2⁻²²), 2^n by
// the exponent bits.
[[gnu::always_inline]] inline F16 exp_neg(F16 x) {
  const I16 dead = x < -87.f;
  const F16 xc = dead ? F16{} - 87.f : x;
  const F16 t = xc * 1.44269504f + 12582912.f;  // round to nearest via the 1.5·2²³ shifter
  const F16 nf = t - 12582912.f;
  const F16 f = (xc - nf * 0.693359375f) + nf * 2.12194440e-4f;  // ln2 split hi + lo
  F16 p = f * 1.38888889e-3f + 8.33333333e-3f;
  p = p * f + 4.16666667e-2f;
  p = p * f + 1.66666667e-1f;
  p = p * f + 0.5f;
  p = p * f + 1.f;
  p = p * f + 1.f;
  const I16 n = __builtin_convertvector(nf, I16);
  const F16 scale = reinterpret_cast<F16>((n + 127) << 23);
  return dead ? F16{} : p * scale;
}

// Row r of the block: the 64 scores sv (masked keys −inf) → m_new, then
// prow[j] = bf16(exp(sv[j] − m_new)) (nearest even; values in [0, 1], never
// NaN) for j < kb. Returns the block max through bmax (first pass) or the
// sum of the rounded weights (second pass), see the callers.
TILEJIT_CLONES float max_of(const float* x) {
  F16 m = load16(x);
  for (int64_t j = 16; j < kKeyBlock; j += 16) {
    const F16 v = load16(x + j);
    m = m > v ? m : v;
  }
  float mx = m[0];
  for (int l = 1; l < 16; ++l) mx = std::max(mx, m[l]);
  return mx;
}

TILEJIT_CLONES float exp_to_bf16(const float* sv, float mx, uint16_t* prow, int64_t kb) {
  F16 sum{};
  for (int64_t j = 0; j < kb; j += 16) {
    const F16 e = exp_neg(load16(sv + j) - mx);
    const U16 u = reinterpret_cast<U16>(e);
    const U16 h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    for (int l = 0; l < 16; ++l) prow[j + l] = static_cast<uint16_t>(h[l]);
    sum += reinterpret_cast<F16>(h << 16);
  }
  float total = 0;
  for (int l = 0; l < 16; ++l) total += sum[l];
  return total;
}

}  // namespace

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

void attend(Isa isa, const Params& p, const std::vector<QueryRow>& rows, const RowSource& k,
            const RowSource& v, int64_t tk, int64_t j_begin, int64_t j_end, Partial& st) {
  const int64_t m = static_cast<int64_t>(rows.size());
  // The key range any row can see, so blocks above the causal diagonal (or
  // outside every window) are skipped entirely.
  int64_t kmin = std::numeric_limits<int64_t>::max(), kmax = -1;
  int64_t lo[kRowsPerBlock], hi[kRowsPerBlock];
  for (int64_t r = 0; r < m; ++r) {
    visible_keys(p, rows[r].i_pos, tk, lo[r], hi[r]);
    if (lo[r] <= hi[r]) kmin = std::min(kmin, lo[r]), kmax = std::max(kmax, hi[r]);
  }
  const int64_t jb0 = std::max(j_begin, kmin), jb1 = std::min(j_end, kmax + 1);
  if (jb0 >= jb1) return;

  Kernels& ker = kernels_for(isa, p.d, p.dv);
  const int nz = static_cast<int>((m + 15) / 16);
  const int smr = ker.score_mr(nz), pmr = ker.pv_mr();
  const int64_t d_full = p.d / 32 * 32, d_tail = p.d % 32;
  const bool amx_tail = isa == Isa::amx && d_tail != 0;
  pack_q(rows, p.d);
  tls.s.resize(kKeyBlock * 64);
  const void* q_ptr = tls.q_packed.data();
  const int64_t dv_blocks = (p.dv + 63) / 64;
  const bool dv_tail = p.dv % 64 != 0;

  for (int64_t j0 = jb0; j0 < jb1; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, jb1 - j0);
    // Sᵀ[keys × m] = K[keys × D] · Qᵀ, in runs of rows sharing one stride.
    for (int64_t jl = 0; jl < n;) {
      const int64_t run = std::min(n - jl, k.run(j0 + jl));
      for (int64_t r0 = 0; r0 < run; r0 += smr) {
        const int rr = static_cast<int>(std::min<int64_t>(smr, run - r0));
        const uint16_t* a_ptr = k.row(j0 + jl + r0);
        const void* a = a_ptr;
        codegen::BrgemmArgs args{};
        args.a = &a;
        args.b = &q_ptr;
        args.batch = 1;
        args.lda = k.row_stride * 2;
        args.c = tls.s.data() + (jl + r0) * 64;
        args.ldc = 64 * 4;
        if (amx_tail) {
          // AMX K tail: zero-padded copy of the last D % 32 columns of each row.
          std::memset(tls.a_tail, 0, sizeof tls.a_tail);
          for (int r = 0; r < rr; ++r)
            std::memcpy(tls.a_tail + r * 32, a_ptr + r * k.row_stride + d_full, d_tail * 2);
          args.a_tail = tls.a_tail;
        }
        ker.score(rr, nz)(&args);
      }
      jl += run;
    }

    // Online softmax: P row r = exp(s − m_new) as bf16; rescale O and l.
    // Every loop below runs over the whole 64-key block with fixed trip
    // counts and selects instead of branches, so GCC vectorises them: the
    // per-element libm exp and bf16 rounding were most of decode's time.
    const int64_t kb = n <= 32 ? 32 : 64;
    tls.p.resize(static_cast<size_t>(m * kb));
    for (int64_t r = 0; r < m; ++r) {
      uint16_t* prow = tls.p.data() + r * kb;
      const int64_t a = std::max(lo[r], j0) - j0, b = std::min(hi[r], j0 + n - 1) - j0;
      if (a > b) {
        std::memset(prow, 0, static_cast<size_t>(kb) * 2);
        continue;
      }
      alignas(64) float sv[kKeyBlock];
      const float* srow = tls.s.data() + r;
      for (int64_t j = 0; j < kKeyBlock; ++j) sv[j] = srow[j * 64] * p.scale;
      if (p.softcap > 0)
        for (int64_t j = a; j <= b; ++j) sv[j] = p.softcap * std::tanh(sv[j] / p.softcap);
      if (p.slopes) {
        const float slope = p.slopes[rows[r].head * p.slopes_stride];
        const float base = static_cast<float>(j0 - rows[r].i_pos);
        for (int64_t j = 0; j < kKeyBlock; ++j) sv[j] += slope * (base + static_cast<float>(j));
      }
      if (const uint8_t* mask = rows[r].mask) {
        const int64_t mfirst = rows[r].mask_first, mstride = rows[r].mask_stride;
        for (int64_t j = std::max(a, mfirst - j0); j <= b; ++j)
          if (mask[(j0 + j - mfirst) * mstride] == 0) sv[j] = kNegInf;
      }
      for (int64_t j = 0; j < kKeyBlock; ++j) sv[j] = (j >= a && j <= b) ? sv[j] : kNegInf;
      const float bmax = max_of(sv);
      const float m_old = st.mx[r], m_new = std::max(m_old, bmax);
      if (m_new == kNegInf) {  // every score −inf: contributes nothing
        std::memset(prow, 0, static_cast<size_t>(kb) * 2);
        continue;
      }
      if (m_old != m_new && m_old != kNegInf) {
        const float alpha = std::exp(m_old - m_new);
        float* o = st.o.data() + r * st.ldo;
        for (int64_t c = 0; c < p.dv; ++c) o[c] *= alpha;
        st.l[r] *= alpha;
      }
      st.mx[r] = m_new;
      // l sums the rounded weights, so numerator and denominator agree.
      st.l[r] += exp_to_bf16(sv, m_new, prow, kb);
    }

    // O[m × Dv] += P[m × kb] · V[kb × Dv]
    pack_v(v, j0, n, kb, p.dv);
    for (int64_t r0 = 0; r0 < m; r0 += pmr) {
      const int rr = static_cast<int>(std::min<int64_t>(pmr, m - r0));
      const void* a = tls.p.data() + r0 * kb;
      for (int64_t nb = 0; nb < dv_blocks; ++nb) {
        const bool tail = dv_tail && nb == dv_blocks - 1;
        const void* b = tls.v_packed.data() + nb * (kb / 2) * 64;
        float* c = st.o.data() + r0 * st.ldo + nb * 64;
        codegen::BrgemmArgs args{};
        args.a = &a;
        args.b = &b;
        args.batch = 1;
        args.lda = kb * 2;
        args.c = c;
        args.ldc = st.ldo * 4;
        args.acc_in = c;
        args.ld_acc_in = st.ldo * 4;
        ker.pv(rr, kb, tail)(&args);
      }
    }
  }
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
    float l = st.l[r], f = 0;
    if (l > 0) {
      float mx = st.mx[r], scale_o = 1;
      if (p.sinks) {
        // The sink joins the denominator; the max includes it so exp never overflows.
        const float sink = p.sinks[rows[r].head * p.sinks_stride];
        const float m2 = std::max(mx, sink);
        scale_o = std::exp(mx - m2);
        l = l * scale_o + std::exp(sink - m2);
      }
      f = scale_o / l;
    }
    const float* o = st.o.data() + static_cast<int64_t>(r) * st.ldo;
    for (int64_t c = 0; c < p.dv; ++c) out[c] = runtime::f32_to_bf16(o[c] * f);
  }
}

}  // namespace tilejit::ops::attn
