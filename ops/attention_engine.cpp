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
void pack_v(const RowSource& v, int64_t j0, int64_t n, int64_t kb, int64_t dv) {
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
  std::vector<int64_t> lo(static_cast<size_t>(m)), hi(static_cast<size_t>(m));
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
    const int64_t kb = n <= 32 ? 32 : 64;
    tls.p.assign(static_cast<size_t>(m * kb), 0);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t a = std::max(lo[r], j0) - j0, b = std::min(hi[r], j0 + n - 1) - j0;
      if (a > b) continue;
      const float slope = p.slopes ? p.slopes[rows[r].head * p.slopes_stride] : 0.f;
      const uint8_t* mask = rows[r].mask;
      const int64_t mfirst = rows[r].mask_first, mstride = rows[r].mask_stride;
      float sv[kKeyBlock];
      float bmax = kNegInf;
      for (int64_t j = a; j <= b; ++j) {
        float x = tls.s[j * 64 + r] * p.scale;
        if (p.softcap > 0) x = p.softcap * std::tanh(x / p.softcap);
        if (slope != 0) x += slope * static_cast<float>(j0 + j - rows[r].i_pos);
        if (mask && j0 + j >= mfirst && mask[(j0 + j - mfirst) * mstride] == 0) x = kNegInf;
        sv[j] = x;
        bmax = std::max(bmax, x);
      }
      const float m_old = st.mx[r], m_new = std::max(m_old, bmax);
      if (m_new == kNegInf) continue;  // every score −inf: contributes nothing
      if (m_old != m_new && m_old != kNegInf) {
        const float alpha = std::exp(m_old - m_new);
        float* o = st.o.data() + r * st.ldo;
        for (int64_t c = 0; c < p.dv; ++c) o[c] *= alpha;
        st.l[r] *= alpha;
      }
      st.mx[r] = m_new;
      uint16_t* prow = tls.p.data() + r * kb;
      float sum = 0;
      for (int64_t j = a; j <= b; ++j) {
        // l sums the rounded weights, so numerator and denominator agree.
        const uint16_t h = runtime::f32_to_bf16(std::exp(sv[j] - m_new));
        prow[j] = h;
        sum += runtime::bf16_to_f32(h);
      }
      st.l[r] += sum;
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
