// Batch-invariant mode (tilejit::set_batch_invariant, TILEJIT_BATCH_INVARIANT):
// on every path, a row of gemm / gemm_batched / fused_experts on bf16 weights
// gives the same bits whatever M and the other rows are (each row computed
// alone, M = 1, is the reference), and so does a sequence of decode_attention
// whatever the batch and the thread count. The shapes reach the places where
// the default kernels change a row's summation order with M: K past one K
// chunk (2048: K-chunked from two row blocks on), 1-row M tails (extra
// accumulator sets), M ≤ 2 on the AMX path (the AVX-512 kernels), N tails.
// One test shows the default mode is not invariant on these shapes (so the
// comparison can fail) where the JIT paths run. Weight-quantized GEMMs and
// experts (fp8, int4 W4A16 and automatic, MXFP4) likewise: the default mode
// routes them by M (the fused kernel to M 16, the dequant route above; int4
// automatic W4A8 from a few rows), the mode keeps one route for every M.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

// Sets the mode for a scope (the tests leave the process as they found it).
class Mode {
 public:
  explicit Mode(bool on) : saved_(batch_invariant()) { set_batch_invariant(on); }
  ~Mode() { set_batch_invariant(saved_); }
  Mode(const Mode&) = delete;
  Mode& operator=(const Mode&) = delete;

 private:
  bool saved_;
};

struct GemmCase {
  int64_t n, k;
  bool bias;
  Activation act;
};

// Outputs of gemm(x[0:m], pw) (n columns of K k; out bf16 or f32) that
// differ from the same row computed alone, over every m of ms.
int64_t row_mismatches(const PackedWeight& pw, int64_t n, int64_t k, const GemmOptions& opt,
                       DType out, const std::vector<int64_t>& ms, int threads) {
  const int64_t max_m = ms.back();
  const auto x = random_bf16(static_cast<size_t>(max_m * k), 11, -2, 2);
  const int saved = num_threads();
  set_num_threads(threads);
  const int64_t elem = out == DType::f32 ? 4 : 2;
  auto y_view = [&](std::vector<uint8_t>& y, int64_t r0, int64_t m) {
    return TensorView(y.data() + r0 * n * elem, out, {m, n});
  };
  // Each row alone.
  std::vector<uint8_t> alone(static_cast<size_t>(max_m * n * elem));
  for (int64_t r = 0; r < max_m; ++r)
    gemm(TensorView(const_cast<uint16_t*>(x.data()) + r * k, DType::bf16, {1, k}), pw,
         y_view(alone, r, 1), opt);
  int64_t bad = 0;
  for (int64_t m : ms) {
    std::vector<uint8_t> y(static_cast<size_t>(m * n * elem));
    gemm(TensorView(const_cast<uint16_t*>(x.data()), DType::bf16, {m, k}), pw, y_view(y, 0, m),
         opt);
    for (int64_t i = 0; i < m * n; ++i)
      bad += std::memcmp(y.data() + i * elem, alone.data() + i * elem, size_t(elem)) != 0;
  }
  set_num_threads(saved);
  return bad;
}

int64_t gemm_row_mismatches(const GemmCase& c, const std::vector<int64_t>& ms, int threads) {
  const auto w = random_bf16(static_cast<size_t>(c.n * c.k), 12, -1, 1);
  const auto b = random_bf16(static_cast<size_t>(c.n), 13, -1, 1);
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {c.n, c.k}));
  GemmOptions opt;
  opt.act = c.act;
  if (c.bias) opt.bias = TensorView(b.data(), DType::bf16, {c.n});
  return row_mismatches(pw, c.n, c.k, opt, DType::bf16, ms, threads);
}

// The checkpoint tensors of one quantized [n, k] weight (kept alive for
// packing), for each of the formats whose default route follows M.
struct QuantTensors {
  std::vector<uint8_t> codes, zeros, mx_scales;
  std::vector<float> scales;
};

enum class QFormat { fp8_channel, int4_gptq_zp, int4_awq_sym, mxfp4 };

int64_t int4_group(QFormat f) {
  return f == QFormat::int4_gptq_zp ? 64 : 128;
}

const char* qformat_name(QFormat f) {
  switch (f) {
    case QFormat::fp8_channel:
      return "fp8 per channel";
    case QFormat::int4_gptq_zp:
      return "int4 GPTQ g64 zero points";
    case QFormat::int4_awq_sym:
      return "int4 AWQ g128 symmetric";
    case QFormat::mxfp4:
      break;
  }
  return "MXFP4";
}

// Random checkpoint tensors of format f for an [n, k] weight (k: a multiple
// of 8 for int4, GPTQ packs K by 8; n: of 8, AWQ and the zeros pack N by 8).
void fill(QFormat f, int64_t n, int64_t k, uint32_t seed, QuantTensors& t) {
  switch (f) {
    case QFormat::fp8_channel:
      t.codes = random_bytes(size_t(n * k), seed, 0, 255);
      for (auto& c : t.codes)
        if ((c & 0x7F) == 0x7F) c = 0x3C;  // no NaN codes (packing refuses them)
      t.scales = random_f32(size_t(n), seed + 1, 0.01f, 0.03f);
      return;
    case QFormat::int4_gptq_zp:
    case QFormat::int4_awq_sym: {
      const int64_t groups = (k + int4_group(f) - 1) / int4_group(f);
      t.codes = random_bytes(size_t(n * k / 2), seed, 0, 255);
      t.scales = random_f32(size_t(groups * n), seed + 1, 0.01f, 0.03f);
      if (f == QFormat::int4_gptq_zp)
        t.zeros = random_bytes(size_t(groups * n / 2), seed + 2, 0, 255);
      return;
    }
    case QFormat::mxfp4:
      break;
  }
  const int64_t kb = (k + 31) / 32;
  t.codes = random_bytes(size_t(n * kb * 16), seed, 0, 255);
  t.mx_scales = random_bytes(size_t(n * kb), seed + 1, 120, 127);
}

Fp8Weight fp8_desc(QuantTensors& t, int64_t n, int64_t k) {
  return {TensorView(t.codes.data(), DType::f8e4m3, {n, k}),
          TensorView(t.scales.data(), DType::f32, {n})};
}

Int4Weight int4_desc(QFormat f, QuantTensors& t, int64_t n, int64_t k) {
  const bool gptq = f == QFormat::int4_gptq_zp;
  const int64_t groups = (k + int4_group(f) - 1) / int4_group(f);
  Int4Weight w;
  w.format = gptq ? Int4Format::gptq : Int4Format::awq;
  w.group_size = int4_group(f);
  w.qweight = gptq ? TensorView(t.codes.data(), DType::i32, {k / 8, n})
                   : TensorView(t.codes.data(), DType::i32, {k, n / 8});
  w.scales = TensorView(t.scales.data(), DType::f32, {groups, n});
  if (gptq) w.qzeros = TensorView(t.zeros.data(), DType::i32, {groups, n / 8});
  return w;
}

Mxfp4Weight mxfp4_desc(QuantTensors& t, int64_t n, int64_t k) {
  const int64_t kb = (k + 31) / 32;
  return {TensorView(t.codes.data(), DType::u8, {n, kb, 16}),
          TensorView(t.mx_scales.data(), DType::u8, {n, kb}), k};
}

PackedWeight quant_weight(QFormat f, int64_t n, int64_t k, uint32_t seed, QuantTensors& t) {
  fill(f, n, k, seed, t);
  switch (f) {
    case QFormat::fp8_channel:
      return pack_weight(fp8_desc(t, n, k));
    case QFormat::int4_gptq_zp:
    case QFormat::int4_awq_sym:
      return pack_weight(int4_desc(f, t, n, k));
    case QFormat::mxfp4:
      break;
  }
  return pack_weight(mxfp4_desc(t, n, k));
}

// E experts of format f, each [n, k], packed for proj.
PackedExperts quant_experts(QFormat f, ExpertProj proj, int64_t n, int64_t k, uint32_t seed,
                            std::vector<QuantTensors>& t) {
  std::vector<Fp8Weight> v8;
  std::vector<Int4Weight> v4;
  std::vector<Mxfp4Weight> vmx;
  for (size_t e = 0; e < t.size(); ++e) {
    fill(f, n, k, seed + uint32_t(e) * 8, t[e]);
    if (f == QFormat::fp8_channel)
      v8.push_back(fp8_desc(t[e], n, k));
    else if (f == QFormat::mxfp4)
      vmx.push_back(mxfp4_desc(t[e], n, k));
    else
      v4.push_back(int4_desc(f, t[e], n, k));
  }
  if (f == QFormat::fp8_channel) return pack_experts(v8, proj);
  if (f == QFormat::mxfp4) return pack_experts(vmx, proj);
  return pack_experts(v4, proj);
}

constexpr QFormat kQFormats[] = {QFormat::fp8_channel, QFormat::int4_gptq_zp, QFormat::int4_awq_sym,
                                 QFormat::mxfp4};

class BatchInvariant : public IsaTest {};

TEST_F(BatchInvariant, GemmRowsAreTheSameAloneOrInAnyM) {
  Mode on(true);
  const bool emulated = cpu_info().amx_emulated;
  // K 2600: two K chunks; K 96: one; N 200: a 64-column tail of 8.
  const std::vector<GemmCase> cases = {{200, 2600, true, Activation::silu},
                                       {64, 96, false, Activation::none},
                                       {136, 2112, false, Activation::gelu_tanh}};
  const std::vector<int64_t> ms =
      emulated ? std::vector<int64_t>{2, 3, 9, 33}
               : std::vector<int64_t>{2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 33, 64, 65, 100};
  for (const GemmCase& c : cases)
    for (int threads : {1, 2}) {
      if (emulated && (c.k > 2200 || threads == 2)) continue;  // ~10 k instructions/ms emulated
      SCOPED_TRACE("N " + std::to_string(c.n) + " K " + std::to_string(c.k) + " threads " +
                   std::to_string(threads));
      EXPECT_EQ(gemm_row_mismatches(c, ms, threads), 0);
    }
}

// The default mode is not batch invariant on these shapes (docs/reliability.md:
// the K split from two row blocks on, the 1-row tails' accumulator sets), so
// the comparison above can fail: it sees the difference where the mode is off.
TEST_F(BatchInvariant, DefaultModeDiffersOnTheSameShapes) {
  const Isa isa = cpu_info().isa;
  if (isa == Isa::scalar) GTEST_SKIP() << "the reference is invariant in either mode";
  if (cpu_info().amx_emulated) GTEST_SKIP() << "too slow emulated";
  Mode off(false);
  const std::vector<int64_t> ms = {2, 3, 5, 7, 8, 9, 13, 16, 17, 31, 33, 64, 65, 100};
  EXPECT_GT(gemm_row_mismatches({200, 2600, true, Activation::silu}, ms, 1), 0);
}

// fp8, int4 (int4_route automatic: W4A16 at every M in the mode) and MXFP4
// weights, f32 out (every bit of the sums shows), across the default mode's
// route changes: the fused kernel's 1-4 row groups to M 16, W4A8 from a few
// rows (int4 automatic), the dequant route above with its shallow K chunks
// to M 16; K 2600 (two default K chunks) and 200, N tails.
TEST_F(BatchInvariant, QuantizedGemmRowsAreTheSameAloneOrInAnyM) {
  Mode on(true);
  const bool emulated = cpu_info().amx_emulated;
  const std::vector<int64_t> ms =
      emulated ? std::vector<int64_t>{2, 5, 17}
               : std::vector<int64_t>{2, 3, 4, 5, 8, 9, 13, 16, 17, 33, 64, 70};
  struct Shape {
    int64_t n, k;
  };
  for (const Shape sh : {Shape{200, 2600}, Shape{72, 200}})
    for (QFormat f : kQFormats)
      for (int threads : {1, 2}) {
        if (emulated && (sh.k > 1000 || threads == 2)) continue;
        QuantTensors t;
        const PackedWeight pw = quant_weight(f, sh.n, sh.k, 61, t);
        const auto b = random_f32(size_t(sh.n), 62, -1, 1);
        GemmOptions opt;
        opt.act = Activation::silu;
        opt.bias = TensorView(const_cast<float*>(b.data()), DType::f32, {sh.n});
        SCOPED_TRACE(std::string(qformat_name(f)) + " N " + std::to_string(sh.n) + " K " +
                     std::to_string(sh.k) + " threads " + std::to_string(threads));
        EXPECT_EQ(row_mismatches(pw, sh.n, sh.k, opt, DType::f32, ms, threads), 0);
      }
}

// ... and the default mode is not invariant on them (the route changes at
// M 16 / 17 on the paths with a fused kernel), so that comparison can fail.
TEST_F(BatchInvariant, QuantizedDefaultModeDiffersOnTheSameShapes) {
  const Isa isa = cpu_info().isa;
  if (isa == Isa::scalar) GTEST_SKIP() << "the reference is invariant in either mode";
  if (cpu_info().amx_emulated) GTEST_SKIP() << "too slow emulated";
  Mode off(false);
  for (QFormat f : kQFormats) {
    QuantTensors t;
    const PackedWeight pw = quant_weight(f, 200, 2600, 61, t);
    SCOPED_TRACE(qformat_name(f));
    EXPECT_GT(row_mismatches(pw, 200, 2600, GemmOptions{}, DType::f32, {2, 5, 17, 33}, 1), 0);
  }
}

TEST_F(BatchInvariant, GemmBatchedEntriesMatchAlone) {
  Mode on(true);
  const int64_t batch = 3, n = 72, k = 2200;
  const int64_t m = cpu_info().amx_emulated ? 3 : 11;
  const auto x = random_bf16(static_cast<size_t>(batch * m * k), 21, -2, 2);
  std::vector<std::vector<uint16_t>> w;
  std::vector<PackedWeight> pw;
  for (int64_t b = 0; b < batch; ++b) {
    w.push_back(random_bf16(static_cast<size_t>(n * k), 22 + static_cast<uint32_t>(b), -1, 1));
    pw.push_back(pack_weight(TensorView(w.back().data(), DType::bf16, {n, k})));
  }
  std::vector<uint16_t> y(static_cast<size_t>(batch * m * n));
  gemm_batched(TensorView(const_cast<uint16_t*>(x.data()), DType::bf16, {batch, m, k}), pw,
               TensorView(y.data(), DType::bf16, {batch, m, n}));
  int64_t bad = 0;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t r = 0; r < m; ++r) {
      std::vector<uint16_t> one(static_cast<size_t>(n));
      gemm(TensorView(const_cast<uint16_t*>(x.data()) + (b * m + r) * k, DType::bf16, {1, k}),
           pw[static_cast<size_t>(b)], TensorView(one.data(), DType::bf16, {1, n}));
      for (int64_t j = 0; j < n; ++j) bad += one[j] != y[(b * m + r) * n + j];
    }
  EXPECT_EQ(bad, 0);
}

// Routing of T tokens over 4 experts, top 2: token t to experts t % 2 and
// 2 + t % 2 (each expert many rows in a batch, one alone).
struct Routes {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
Routes alternating_routes(int64_t T) {
  Routes r;
  for (int64_t t = 0; t < T; ++t) {
    r.ids.insert(r.ids.end(), {static_cast<int32_t>(t % 2), static_cast<int32_t>(2 + t % 2)});
    r.weights.insert(r.weights.end(), {0.625f, 0.375f});
  }
  return r;
}

// Tokens t (those `checked` says) of fused_experts over hidden [T, H] whose
// output differs from the same token's computed alone; out: the batch's.
int64_t token_mismatches(const PackedExperts& p13, const PackedExperts& p2,
                         const std::vector<uint16_t>& hidden, int64_t H, const Routes& r,
                         std::vector<uint16_t>& out,
                         const std::function<bool(int64_t)>& checked = nullptr) {
  const int64_t topk = 2, T = static_cast<int64_t>(hidden.size()) / H;
  auto call = [&](int64_t t0, int64_t n, uint16_t* y) {
    fused_experts(TensorView(hidden.data() + t0 * H, DType::bf16, {n, H}), p13, p2,
                  TensorView(r.weights.data() + t0 * topk, DType::f32, {n, topk}),
                  TensorView(r.ids.data() + t0 * topk, DType::i32, {n, topk}),
                  TensorView(y, DType::bf16, {n, H}));
  };
  out.assign(static_cast<size_t>(T * H), 0);
  call(0, T, out.data());
  int64_t bad = 0;
  std::vector<uint16_t> one(static_cast<size_t>(H));
  for (int64_t t = 0; t < T; ++t) {
    if (checked && !checked(t)) continue;
    call(t, 1, one.data());
    for (int64_t j = 0; j < H; ++j) bad += one[j] != out[t * H + j];
  }
  return bad;
}

// A token's fused_experts output alone equals its output in a batch whose
// other tokens route to the same experts (so each expert sees 1 row alone
// and many rows in the batch).
TEST_F(BatchInvariant, FusedExpertsTokenAloneOrInABatch) {
  Mode on(true);
  const int64_t E = 4, H = 128, I = 96;
  const int64_t T = cpu_info().amx_emulated ? 5 : 37;
  const auto w13 = random_bf16(static_cast<size_t>(E * 2 * I * H), 31, -0.5f, 0.5f);
  const auto w2 = random_bf16(static_cast<size_t>(E * H * I), 32, -0.5f, 0.5f);
  const PackedExperts p13 =
      pack_experts(TensorView(w13.data(), DType::bf16, {E, 2 * I, H}), ExpertProj::gate_up);
  const PackedExperts p2 =
      pack_experts(TensorView(w2.data(), DType::bf16, {E, H, I}), ExpertProj::down);
  const auto hidden = random_bf16(static_cast<size_t>(T * H), 33, -2, 2);
  std::vector<uint16_t> out;
  EXPECT_EQ(token_mismatches(p13, p2, hidden, H, alternating_routes(T), out), 0);
}

// The same with quantized experts (fp8, int4 automatic, MXFP4): a token's
// experts see 1 row alone and ~T / 2 rows in the batch (the fused kernel
// against the dequant route or W4A8 in the default mode).
TEST_F(BatchInvariant, QuantizedExpertsTokenAloneOrInABatch) {
  Mode on(true);
  const int64_t E = 4, H = 128, I = 96;
  const int64_t T = cpu_info().amx_emulated ? 5 : 45;
  for (QFormat f : kQFormats) {
    SCOPED_TRACE(qformat_name(f));
    std::vector<QuantTensors> t13(E), t2(E);
    const PackedExperts p13 = quant_experts(f, ExpertProj::gate_up, 2 * I, H, 71, t13);
    const PackedExperts p2 = quant_experts(f, ExpertProj::down, H, I, 91, t2);
    const auto hidden = random_bf16(static_cast<size_t>(T * H), 33, -2, 2);
    std::vector<uint16_t> out;
    EXPECT_EQ(token_mismatches(p13, p2, hidden, H, alternating_routes(T), out), 0);
  }
}

// int4 rows holding an ±Inf take the dequant route (IEEE infinities; the
// fused kernel's int4 form would make NaN of them): in the mode each run of
// such rows on its own, so the other rows keep the bits they have alone,
// and the Inf row its own (with ±Inf outputs, not only NaN).
TEST_F(BatchInvariant, Int4InfRowMovesNoOtherRow) {
  if (cpu_info().isa == Isa::scalar) GTEST_SKIP() << "the reference takes no route";
  Mode on(true);
  const int64_t n = 72, k = 256;
  const int64_t m = cpu_info().amx_emulated ? 6 : 40;
  for (QFormat f : {QFormat::int4_gptq_zp, QFormat::int4_awq_sym}) {
    SCOPED_TRACE(qformat_name(f));
    QuantTensors t;
    const PackedWeight pw = quant_weight(f, n, k, 81, t);
    auto x = random_bf16(static_cast<size_t>(m * k), 82, -2, 2);
    for (int64_t r : {int64_t{2}, int64_t{3}, m - 1})  // a run of two, and the last row
      x[static_cast<size_t>(r * k + 5 + r)] = r % 2 == 0 ? 0x7F80 : 0xFF80;  // ±Inf
    std::vector<float> y(static_cast<size_t>(m * n)), one(static_cast<size_t>(n));
    gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::f32, {m, n}));
    int64_t bad = 0, inf_outputs = 0;
    for (int64_t r = 0; r < m; ++r) {
      gemm(TensorView(x.data() + r * k, DType::bf16, {1, k}), pw,
           TensorView(one.data(), DType::f32, {1, n}));
      bad += std::memcmp(one.data(), y.data() + r * n, size_t(n) * 4) != 0;
      for (int64_t j = 0; j < n; ++j) inf_outputs += std::isinf(y[size_t(r * n + j)]);
    }
    EXPECT_EQ(bad, 0);
    EXPECT_GT(inf_outputs, 0) << "the Inf rows' IEEE ±Inf outputs";
  }
}

// In fused_experts only the experts routed a token holding an ±Inf leave
// the fused kernel: the tokens routed to other experts keep their bits, and
// so does the Inf token (its experts take the dequant route alone or not).
TEST_F(BatchInvariant, Int4InfTokenMovesNoTokenOnOtherExperts) {
  if (cpu_info().isa == Isa::scalar) GTEST_SKIP() << "the reference takes no route";
  Mode on(true);
  const int64_t E = 4, H = 128, I = 96;
  const int64_t T = cpu_info().amx_emulated ? 6 : 24, inf_token = 1;
  std::vector<QuantTensors> t13(E), t2(E);
  const PackedExperts p13 =
      quant_experts(QFormat::int4_gptq_zp, ExpertProj::gate_up, 2 * I, H, 71, t13);
  const PackedExperts p2 = quant_experts(QFormat::int4_gptq_zp, ExpertProj::down, H, I, 91, t2);
  auto hidden = random_bf16(static_cast<size_t>(T * H), 34, -2, 2);
  hidden[static_cast<size_t>(inf_token * H + 9)] = 0x7F80;
  // The first half of the tokens on experts 0 / 1, the rest on 2 / 3.
  Routes r;
  for (int64_t i = 0; i < T; ++i) {
    r.ids.insert(r.ids.end(), {i < T / 2 ? 0 : 2, i < T / 2 ? 1 : 3});
    r.weights.insert(r.weights.end(), {0.5f, 0.5f});
  }
  // The tokens sharing an expert with the Inf token may move; no other.
  std::vector<uint16_t> out;
  EXPECT_EQ(token_mismatches(p13, p2, hidden, H, r, out,
                             [&](int64_t i) { return i >= T / 2 || i == inf_token; }),
            0);
  int64_t inf_outputs = 0;
  for (int64_t j = 0; j < H; ++j) inf_outputs += (out[inf_token * H + j] & 0x7FFF) >= 0x7F80;
  EXPECT_GT(inf_outputs, 0) << "the Inf token's outputs";
}

// The mode implies decode's deterministic form: a sequence alone on one
// thread equals it beside a long sequence on two threads (which would split
// the long one's keys, and with them the task layout, without it).
TEST_F(BatchInvariant, DecodeSequenceAloneOrInABatch) {
  Mode on(true);
  const int64_t hq = 4, hkv = 2, d = 64, bs = 16;
  const int64_t short_len = 300, long_len = cpu_info().amx_emulated ? 600 : 5000;
  const int64_t blocks_short = (short_len + bs - 1) / bs, blocks_long = (long_len + bs - 1) / bs;
  const int64_t nb = blocks_short + blocks_long;
  const auto kc = random_bf16(static_cast<size_t>(nb * bs * hkv * d), 41);
  const auto vc = random_bf16(static_cast<size_t>(nb * bs * hkv * d), 42);
  const auto q = random_bf16(static_cast<size_t>(2 * hq * d), 43);
  std::vector<int32_t> table(static_cast<size_t>(2 * blocks_long), 0);
  for (int64_t i = 0; i < blocks_short; ++i) table[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < blocks_long; ++i)
    table[blocks_long + i] = static_cast<int32_t>(blocks_short + i);
  const TensorView kcv(const_cast<uint16_t*>(kc.data()), DType::bf16, {nb, bs, hkv, d});
  const TensorView vcv(const_cast<uint16_t*>(vc.data()), DType::bf16, {nb, bs, hkv, d});
  const int saved = num_threads();
  std::vector<uint16_t> alone(static_cast<size_t>(hq * d)), both(static_cast<size_t>(2 * hq * d));
  std::vector<int32_t> len1 = {static_cast<int32_t>(short_len)};
  set_num_threads(1);
  decode_attention(TensorView(const_cast<uint16_t*>(q.data()), DType::bf16, {1, hq, d}), kcv, vcv,
                   TensorView(alone.data(), DType::bf16, {1, hq, d}),
                   TensorView(table.data(), DType::i32, {1, blocks_long}),
                   TensorView(len1.data(), DType::i32, {1}));
  std::vector<int32_t> len2 = {static_cast<int32_t>(short_len), static_cast<int32_t>(long_len)};
  set_num_threads(2);
  decode_attention(TensorView(const_cast<uint16_t*>(q.data()), DType::bf16, {2, hq, d}), kcv, vcv,
                   TensorView(both.data(), DType::bf16, {2, hq, d}),
                   TensorView(table.data(), DType::i32, {2, blocks_long}),
                   TensorView(len2.data(), DType::i32, {2}));
  set_num_threads(saved);
  EXPECT_EQ(std::vector<uint16_t>(both.begin(), both.begin() + hq * d), alone);
}

// TILEJIT_BATCH_INVARIANT is read once per process: a bad value gets its
// own ctest entry (batch_invariant_test_bad_env), where every call that
// reads it fails with an Error naming it, until set_batch_invariant.
TEST(BatchInvariantEnv, ABadValueIsAnErrorOfEveryCallUntilSet) {
  const char* env = std::getenv("TILEJIT_BATCH_INVARIANT");
  if (env == nullptr || std::string(env) != "yes")
    GTEST_SKIP() << "runs only with TILEJIT_BATCH_INVARIANT=yes (its own ctest entry)";
  const std::string want = "TILEJIT_BATCH_INVARIANT='yes' is not a switch; allowed: 0, 1";
  for (int i = 0; i < 2; ++i) {
    try {
      (void)batch_invariant();
      ADD_FAILURE() << "no Error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  std::vector<uint16_t> x(64, 0x3f80), w(64 * 64, 0x3f80), y(64);
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {64, 64}));
  EXPECT_THROW(gemm(TensorView(x.data(), DType::bf16, {1, 64}), pw,
                    TensorView(y.data(), DType::bf16, {1, 64})),
               Error);
  set_batch_invariant(false);  // the API's value replaces the bad one
  gemm(TensorView(x.data(), DType::bf16, {1, 64}), pw, TensorView(y.data(), DType::bf16, {1, 64}));
  EXPECT_EQ(y[0], 0x4280);  // 64 · 1 · 1
}

TEST(BatchInvariantMode, SwitchAndEnvironment) {
  const bool saved = batch_invariant();
  set_batch_invariant(true);
  EXPECT_TRUE(batch_invariant());
  set_batch_invariant(false);
  EXPECT_FALSE(batch_invariant());
  set_batch_invariant(saved);
}

}  // namespace
}  // namespace tilejit::test
