// The C API (include/tilejit/tilejit_c.h) against the C++ API it wraps: every
// operator family and weight format gives the bytes the C++ call gives on
// the same inputs (the C layer converts, it never computes), and every
// mistake only a C caller can make (NULL, an options struct not set up by
// its _init, a bad ndim or enum value) is a status and a message naming it.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"
#include "tilejit/tilejit.h"
#include "tilejit/tilejit_c.h"

using namespace tilejit;
using namespace tilejit::test;

namespace {

// C tensors whose shape and stride arrays live as long as the maker.
class CTensors {
 public:
  tilejit_tensor operator()(const void* data, tilejit_dtype dt, std::vector<int64_t> shape,
                            std::vector<int64_t> strides = {}) {
    shapes_.push_back(std::move(shape));
    const int64_t* st = nullptr;
    if (!strides.empty()) {
      shapes_.push_back(std::move(strides));
      st = shapes_.back().data();
    }
    const auto& sh = shapes_[shapes_.size() - (st ? 2 : 1)];
    return {const_cast<void*>(data), dt, static_cast<int32_t>(sh.size()), sh.data(), st};
  }

 private:
  std::deque<std::vector<int64_t>> shapes_;
};

#define EXPECT_C_OK(call) EXPECT_EQ((call), TILEJIT_OK) << tilejit_last_error()
#define ASSERT_C_OK(call) ASSERT_EQ((call), TILEJIT_OK) << tilejit_last_error()

// Stores a raw int in a C enum field, as a C caller may (a C++ cast to the
// enum would be undefined for a value outside it; UBSan reports the load).
template <class E>
void set_raw(E& field, int value) {
  static_assert(sizeof(E) == sizeof(int));
  std::memcpy(&field, &value, sizeof value);
}

// The call must fail with TILEJIT_ERROR and a message naming needle.
void expect_c_error(tilejit_status s, const std::string& needle) {
  EXPECT_EQ(s, TILEJIT_ERROR) << tilejit_status_name(s);
  EXPECT_NE(std::string(tilejit_last_error()).find(needle), std::string::npos)
      << "message \"" << tilejit_last_error() << "\" does not name \"" << needle << "\"";
}

template <class T>
bool same_bytes(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

// fp8 e4m3 codes without the NaN codes (0x7F, 0xFF), which packing refuses.
std::vector<uint8_t> random_e4m3(size_t n, uint32_t seed) {
  auto v = random_bytes(n, seed, 0, 255);
  for (auto& e : v)
    if ((e & 0x7F) == 0x7F) e = 0x3C;
  return v;
}

struct CWeight {
  tilejit_packed_weight* p = nullptr;
  ~CWeight() { tilejit_packed_weight_destroy(p); }
};
struct CExperts {
  tilejit_packed_experts* p = nullptr;
  ~CExperts() { tilejit_packed_experts_destroy(p); }
};

TEST(CApi, VersionAndStatusNames) {
  EXPECT_EQ(tilejit_c_api_version(), TILEJIT_C_API_VERSION);
  EXPECT_STREQ(tilejit_status_name(TILEJIT_OK), "ok");
  EXPECT_STREQ(tilejit_status_name(TILEJIT_ERROR), "error");
  EXPECT_STREQ(tilejit_status_name(TILEJIT_INTERNAL_ERROR), "internal error");
  // Another value ("unknown status"): tests/consumer/c_main.c, in C, where
  // an enum may hold it.
}

// tilejit_gemm_batched: the C++ call's bytes; a NULL array or entry is an Error naming it.
TEST(CApi, GemmBatchedMatchesTheCppCall) {
  constexpr int64_t B = 3, M = 2, N = 40, K = 64;
  const auto x = random_bf16(B * M * K, 11);
  CTensors c;
  std::vector<std::vector<uint16_t>> raw;
  std::vector<CWeight> cws(B);
  std::vector<const tilejit_packed_weight*> handles;
  std::vector<PackedWeight> pws;
  for (int64_t b = 0; b < B; ++b) {
    raw.push_back(random_bf16(N * K, 20 + static_cast<uint32_t>(b)));
    const tilejit_tensor wt = c(raw.back().data(), TILEJIT_BF16, {N, K});
    ASSERT_C_OK(tilejit_pack_weight_bf16(&wt, &cws[b].p));
    handles.push_back(cws[b].p);
    pws.push_back(pack_weight({raw.back().data(), DType::bf16, {N, K}}));
  }
  const tilejit_tensor xt = c(x.data(), TILEJIT_BF16, {B, M, K});
  std::vector<float> yc(B * M * N), ycpp(B * M * N);
  const tilejit_tensor yt = c(yc.data(), TILEJIT_F32, {B, M, N});
  tilejit_gemm_options o;
  tilejit_gemm_options_init(&o);
  o.act = TILEJIT_ACT_SILU;
  ASSERT_C_OK(tilejit_gemm_batched(&xt, handles.data(), handles.size(), &yt, &o));
  GemmOptions co;
  co.act = Activation::silu;
  gemm_batched({const_cast<uint16_t*>(x.data()), DType::bf16, {B, M, K}}, pws,
               {ycpp.data(), DType::f32, {B, M, N}}, co);
  EXPECT_TRUE(same_bytes(yc, ycpp));
  expect_c_error(tilejit_gemm_batched(&xt, nullptr, 3, &yt, nullptr),
                 "tilejit_gemm_batched: w is NULL with w_count 3");
  handles[1] = nullptr;
  expect_c_error(tilejit_gemm_batched(&xt, handles.data(), handles.size(), &yt, nullptr),
                 "w[1] is NULL");
  expect_c_error(tilejit_gemm_batched(&xt, handles.data(), 2, &yt, nullptr), "w[1] is NULL");
  handles[1] = cws[1].p;
  expect_c_error(tilejit_gemm_batched(&xt, handles.data(), 2, &yt, nullptr),
                 "gemm_batched: w holds 2 weights");
}

TEST(CApi, Bf16GemmMatchesTheCppCallWithEveryOption) {
  constexpr int64_t M = 5, N = 37, K = 70, ldx = 80;
  const auto x = random_bf16(M * ldx, 1), w = random_bf16(N * K, 2);
  const auto bias = random_f32(N, 3);
  CTensors c;
  const tilejit_tensor wt = c(w.data(), TILEJIT_BF16, {N, K});
  const tilejit_tensor xt = c(x.data(), TILEJIT_BF16, {M, K}, {ldx, 1});
  const tilejit_tensor bt = c(bias.data(), TILEJIT_F32, {N});
  CWeight cw;
  ASSERT_C_OK(tilejit_pack_weight_bf16(&wt, &cw.p));
  const PackedWeight pw = pack_weight({w.data(), DType::bf16, {N, K}});
  tilejit_packed_weight_info info{};
  ASSERT_C_OK(tilejit_packed_weight_get_info(cw.p, &info));
  EXPECT_EQ(info.n, N);
  EXPECT_EQ(info.k, K);
  EXPECT_EQ(info.format, TILEJIT_WEIGHT_BF16);
  EXPECT_EQ(info.dtype, TILEJIT_BF16);
  EXPECT_EQ(info.packed_bytes, pw.packed_bytes());
  EXPECT_EQ(std::string(info.layout), pw.layout());

  for (auto act : {TILEJIT_ACT_NONE, TILEJIT_ACT_RELU, TILEJIT_ACT_SILU, TILEJIT_ACT_GELU_TANH,
                   TILEJIT_ACT_GELU_ERF}) {
    std::vector<uint16_t> yc(M * N, 0xFFFF), ycpp(M * N, 0);
    const tilejit_tensor yt = c(yc.data(), TILEJIT_BF16, {M, N});
    tilejit_gemm_options o;
    tilejit_gemm_options_init(&o);
    o.bias = &bt;
    o.act = act;
    EXPECT_C_OK(tilejit_gemm(&xt, cw.p, &yt, &o));
    GemmOptions co;
    co.bias = TensorView(bias.data(), DType::f32, {N});
    co.act = static_cast<Activation>(act);
    gemm({const_cast<uint16_t*>(x.data()), DType::bf16, {M, K}, {ldx, 1}}, pw,
         {ycpp.data(), DType::bf16, {M, N}}, co);
    EXPECT_TRUE(same_bytes(yc, ycpp)) << "activation " << act;
  }
  // NULL options are the defaults; f32 output.
  std::vector<float> yc(M * N), ycpp(M * N);
  const tilejit_tensor yt = c(yc.data(), TILEJIT_F32, {M, N});
  EXPECT_C_OK(tilejit_gemm(&xt, cw.p, &yt, nullptr));
  gemm({const_cast<uint16_t*>(x.data()), DType::bf16, {M, K}, {ldx, 1}}, pw,
       {ycpp.data(), DType::f32, {M, N}});
  EXPECT_TRUE(same_bytes(yc, ycpp));
  // unpack gives the weight back.
  std::vector<uint16_t> back(N * K);
  const tilejit_tensor backt = c(back.data(), TILEJIT_BF16, {N, K});
  EXPECT_C_OK(tilejit_packed_weight_unpack_bf16(cw.p, &backt));
  EXPECT_TRUE(same_bytes(back, w));
}

TEST(CApi, QuantizedWeightsPackRunAndUnpackAsInCpp) {
  constexpr int64_t M = 3, N = 45, K = 256;
  const auto x = random_bf16(M * K, 10);
  CTensors c;
  const tilejit_tensor xt = c(x.data(), TILEJIT_BF16, {M, K});
  auto run_both = [&](const tilejit_packed_weight* cw, const PackedWeight& pw,
                      const tilejit_gemm_options* o, const GemmOptions& co, const char* what) {
    std::vector<float> yc(M * N, -1), ycpp(M * N, -2);
    const tilejit_tensor yt = c(yc.data(), TILEJIT_F32, {M, N});
    EXPECT_C_OK(tilejit_gemm(&xt, cw, &yt, o));
    gemm({x.data(), DType::bf16, {M, K}}, pw, {ycpp.data(), DType::f32, {M, N}}, co);
    EXPECT_TRUE(same_bytes(yc, ycpp)) << what;
    std::vector<float> dc(N * K), dcpp(N * K);
    const tilejit_tensor dt = c(dc.data(), TILEJIT_F32, {N, K});
    EXPECT_C_OK(tilejit_packed_weight_dequantize(cw, &dt));
    pw.dequantize({dcpp.data(), DType::f32, {N, K}});
    EXPECT_TRUE(same_bytes(dc, dcpp)) << what;
  };

  {  // int8 W8A8, asymmetric activations
    const auto w = random_bytes(N * K, 11, 0, 255);
    const auto s = random_f32(N, 12, 0.001f, 0.01f);
    const tilejit_int8_weight cw8 = {c(w.data(), TILEJIT_I8, {N, K}),
                                     c(s.data(), TILEJIT_F32, {N})};
    CWeight cw;
    ASSERT_C_OK(tilejit_pack_weight_int8(&cw8, &cw.p));
    const PackedWeight pw =
        pack_weight(Int8Weight{{w.data(), DType::i8, {N, K}}, {s.data(), DType::f32, {N}}});
    tilejit_gemm_options o;
    tilejit_gemm_options_init(&o);
    o.act_quant = TILEJIT_ACT_QUANT_DYNAMIC_ASYM;
    GemmOptions co;
    co.act_quant = ActQuant::dynamic_asym;
    run_both(cw.p, pw, &o, co, "int8");
    std::vector<uint8_t> wb(N * K);
    std::vector<float> sb(N);
    const tilejit_int8_weight out = {c(wb.data(), TILEJIT_I8, {N, K}),
                                     c(sb.data(), TILEJIT_F32, {N})};
    EXPECT_C_OK(tilejit_packed_weight_unpack_int8(cw.p, &out));
    EXPECT_TRUE(same_bytes(wb, w) && same_bytes(sb, s));
  }
  {  // fp8 with block scales, stored [K, N] (strides {1, N})
    const auto w = random_e4m3(N * K, 13);
    const int64_t bn = 16, bk = 128, gn = (N + bn - 1) / bn, gk = K / bk;
    const auto s = random_f32(gn * gk, 14, 0.01f, 0.1f);
    tilejit_fp8_weight cf = {c(w.data(), TILEJIT_F8E4M3, {N, K}, {1, N}),
                             c(s.data(), TILEJIT_F32, {gn, gk}), bn, bk};
    CWeight cw;
    ASSERT_C_OK(tilejit_pack_weight_fp8(&cf, &cw.p));
    Fp8Weight f;
    f.weight = TensorView(const_cast<uint8_t*>(w.data()), DType::f8e4m3, {N, K}, {1, N});
    f.scales = TensorView(s.data(), DType::f32, {gn, gk});
    f.block_n = bn;
    f.block_k = bk;
    const PackedWeight pw = pack_weight(f);
    run_both(cw.p, pw, nullptr, {}, "fp8");
    std::vector<uint8_t> wb(N * K);
    std::vector<float> sb(gn * gk);
    const tilejit_fp8_weight out = {c(wb.data(), TILEJIT_F8E4M3, {N, K}, {1, N}),
                                    c(sb.data(), TILEJIT_F32, {gn, gk}), bn, bk};
    EXPECT_C_OK(tilejit_packed_weight_unpack_fp8(cw.p, &out));
    EXPECT_TRUE(same_bytes(wb, w) && same_bytes(sb, s));
  }
  {  // int4 GPTQ v1 with zero points and act-order g_idx, on the W4A8 route
    constexpr int64_t G = 64, ng = K / G;
    std::vector<int32_t> qw(K / 8 * N), qz(ng * ((N + 7) / 8 * 8 / 8));
    std::mt19937 rng(15);
    for (auto& v : qw) v = static_cast<int32_t>(rng());
    for (auto& v : qz) v = static_cast<int32_t>(rng());
    std::vector<uint16_t> sc(ng * N);
    for (auto& v : sc) v = static_cast<uint16_t>(0x2000 + rng() % 0x400);  // f16 ~ 2^-7
    std::vector<int32_t> gi(K);
    for (int64_t k = 0; k < K; ++k) gi[k] = static_cast<int32_t>((k * 7) % ng);
    const int64_t nz = static_cast<int64_t>(qz.size()) / ng;
    const tilejit_tensor qzt = c(qz.data(), TILEJIT_I32, {ng, nz});
    const tilejit_tensor git = c(gi.data(), TILEJIT_I32, {K});
    tilejit_int4_weight ci;
    tilejit_int4_weight_init(&ci);
    EXPECT_EQ(ci.format, TILEJIT_INT4_GPTQ);
    EXPECT_EQ(ci.group_size, 128);
    EXPECT_EQ(ci.bits, 4);
    ci.qweight = c(qw.data(), TILEJIT_I32, {K / 8, N});
    ci.scales = c(sc.data(), TILEJIT_F16, {ng, N});
    ci.qzeros = &qzt;
    ci.g_idx = &git;
    ci.group_size = G;
    CWeight cw;
    ASSERT_C_OK(tilejit_pack_weight_int4(&ci, &cw.p));
    Int4Weight q;
    q.qweight = TensorView(qw.data(), DType::i32, {K / 8, N});
    q.scales = TensorView(sc.data(), DType::f16, {ng, N});
    q.qzeros = TensorView(qz.data(), DType::i32, {ng, nz});
    q.g_idx = TensorView(gi.data(), DType::i32, {K});
    q.group_size = G;
    const PackedWeight pw = pack_weight(q);
    tilejit_packed_weight_info info{};
    ASSERT_C_OK(tilejit_packed_weight_get_info(cw.p, &info));
    EXPECT_EQ(std::string(info.layout), pw.layout());
    EXPECT_EQ(info.format, TILEJIT_WEIGHT_INT4_GPTQ);
    tilejit_gemm_options o;
    tilejit_gemm_options_init(&o);
    o.int4_route = TILEJIT_INT4_ROUTE_W4A8;
    GemmOptions co;
    co.int4_route = Int4Route::w4a8;
    run_both(cw.p, pw, &o, co, "int4 w4a8");
    run_both(cw.p, pw, nullptr, {}, "int4 automatic");
    std::vector<int32_t> qwb(qw.size()), qzb(qz.size()), gib(K);
    std::vector<uint16_t> scb(sc.size());
    const tilejit_tensor qzbt = c(qzb.data(), TILEJIT_I32, {ng, nz});
    const tilejit_tensor gibt = c(gib.data(), TILEJIT_I32, {K});
    tilejit_int4_weight out = ci;
    out.qweight = c(qwb.data(), TILEJIT_I32, {K / 8, N});
    out.scales = c(scb.data(), TILEJIT_F16, {ng, N});
    out.qzeros = &qzbt;
    out.g_idx = &gibt;
    EXPECT_C_OK(tilejit_packed_weight_unpack_int4(cw.p, &out));
    EXPECT_TRUE(same_bytes(qwb, qw) && same_bytes(qzb, qz) && same_bytes(scb, sc) &&
                same_bytes(gib, gi));

    // The same checkpoint through its AutoRound config.
    tilejit_autoround_config cfg = {4, G, false, true, "auto_round:gptq"};
    tilejit_int4_weight fc;
    ASSERT_C_OK(tilejit_int4_weight_from_autoround(&cfg, &ci.qweight, &ci.scales, &qzt, &git, &fc));
    EXPECT_EQ(fc.format, TILEJIT_INT4_GPTQ);
    EXPECT_EQ(fc.group_size, G);
    EXPECT_FALSE(fc.gptq_v2);
    EXPECT_EQ(fc.qzeros, &qzt);
    EXPECT_EQ(fc.g_idx, &git);
    CWeight cw2;
    ASSERT_C_OK(tilejit_pack_weight_int4(&fc, &cw2.p));
    run_both(cw2.p, pw, nullptr, {}, "int4 from the AutoRound config");
    cfg.bits = 3;
    expect_c_error(
        tilejit_int4_weight_from_autoround(&cfg, &ci.qweight, &ci.scales, &qzt, &git, &fc), "bits");
  }
  {  // MXFP4, K not a multiple of 32 (padded)
    constexpr int64_t Km = 100, nb = (Km + 31) / 32;
    const auto blocks = random_bytes(N * nb * 16, 16, 0, 255);
    const auto scales = random_bytes(N * nb, 17, 118, 130);
    const tilejit_mxfp4_weight cm = {c(blocks.data(), TILEJIT_U8, {N, nb, 16}),
                                     c(scales.data(), TILEJIT_U8, {N, nb}), Km};
    CWeight cw;
    ASSERT_C_OK(tilejit_pack_weight_mxfp4(&cm, &cw.p));
    const PackedWeight pw = pack_weight(Mxfp4Weight{
        {blocks.data(), DType::u8, {N, nb, 16}}, {scales.data(), DType::u8, {N, nb}}, Km});
    std::vector<float> dc(N * Km), dcpp(N * Km);
    const tilejit_tensor dt = c(dc.data(), TILEJIT_F32, {N, Km});
    EXPECT_C_OK(tilejit_packed_weight_dequantize(cw.p, &dt));
    pw.dequantize({dcpp.data(), DType::f32, {N, Km}});
    EXPECT_TRUE(same_bytes(dc, dcpp));
    std::vector<uint8_t> bb(blocks.size()), sb(scales.size());
    const tilejit_mxfp4_weight out = {c(bb.data(), TILEJIT_U8, {N, nb, 16}),
                                      c(sb.data(), TILEJIT_U8, {N, nb}), Km};
    EXPECT_C_OK(tilejit_packed_weight_unpack_mxfp4(cw.p, &out));
    EXPECT_TRUE(same_bytes(sb, scales));
    // A format's unpack on another format is the C++ Error.
    tilejit_int8_weight wrong = {c(bb.data(), TILEJIT_I8, {N, Km}), c(sb.data(), TILEJIT_F32, {N})};
    expect_c_error(tilejit_packed_weight_unpack_int8(cw.p, &wrong), "mxfp4");
  }
}

TEST(CApi, AttentionAndStoreKvMatchTheCppCalls) {
  constexpr int64_t B = 2, Hq = 4, Hkv = 2, D = 72, block = 8, nblocks = 8, mb = 4;
  const auto q = random_bf16(B * Hq * D, 20);
  const auto kc = random_e4m3(nblocks * block * Hkv * D, 21);
  const auto vc = random_e4m3(nblocks * block * Hkv * D, 22);
  const std::vector<int32_t> table = {3, 0, 5, 1, 2, 7, 4, 6}, lens = {29, 11};
  const std::vector<float> sinks = {0.5f, -1.f, 0.f, 2.f};
  CTensors c;
  const tilejit_tensor qt = c(q.data(), TILEJIT_BF16, {B, Hq, D});
  const tilejit_tensor kt = c(kc.data(), TILEJIT_F8E4M3, {nblocks, block, Hkv, D});
  const tilejit_tensor vt = c(vc.data(), TILEJIT_F8E4M3, {nblocks, block, Hkv, D});
  const tilejit_tensor bt = c(table.data(), TILEJIT_I32, {B, mb});
  const tilejit_tensor lt = c(lens.data(), TILEJIT_I32, {B});
  const tilejit_tensor st = c(sinks.data(), TILEJIT_F32, {Hq});
  tilejit_attention_options o;
  tilejit_attention_options_init(&o);
  EXPECT_EQ(o.window_left, -1);
  EXPECT_EQ(o.kv_scales.k_scale, 1.f);
  o.has_sm_scale = true;
  o.sm_scale = 0.2f;
  o.window_left = 13;
  o.softcap = 30.f;
  o.sinks = &st;
  o.kv_scales.k_scale = 0.05f;
  o.kv_scales.v_scale = 0.5f;
  AttentionOptions co;
  co.sm_scale = 0.2f;
  co.window_left = 13;
  co.softcap = 30.f;
  co.sinks = TensorView(sinks.data(), DType::f32, {Hq});
  co.kv_scales.k_scale = 0.05f;
  co.kv_scales.v_scale = 0.5f;
  {
    std::vector<uint16_t> oc(B * Hq * D, 0xFFFF), ocpp(B * Hq * D);
    const tilejit_tensor ot = c(oc.data(), TILEJIT_BF16, {B, Hq, D});
    ASSERT_C_OK(tilejit_decode_attention(&qt, &kt, &vt, &ot, &bt, &lt, &o));
    decode_attention({q.data(), DType::bf16, {B, Hq, D}},
                     {kc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {vc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {ocpp.data(), DType::bf16, {B, Hq, D}}, {table.data(), DType::i32, {B, mb}},
                     {lens.data(), DType::i32, {B}}, co);
    EXPECT_TRUE(same_bytes(oc, ocpp)) << "decode";
    // With decode options: deterministic, and NULL (the defaults).
    tilejit_decode_options dco;
    tilejit_decode_options_init(&dco);
    EXPECT_FALSE(dco.deterministic);
    dco.deterministic = true;
    DecodeOptions dcpp;
    dcpp.deterministic = true;
    ASSERT_C_OK(tilejit_decode_attention_ex(&qt, &kt, &vt, &ot, &bt, &lt, &o, &dco));
    decode_attention({q.data(), DType::bf16, {B, Hq, D}},
                     {kc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {vc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {ocpp.data(), DType::bf16, {B, Hq, D}}, {table.data(), DType::i32, {B, mb}},
                     {lens.data(), DType::i32, {B}}, co, dcpp);
    EXPECT_TRUE(same_bytes(oc, ocpp)) << "decode, deterministic";
    ASSERT_C_OK(tilejit_decode_attention_ex(&qt, &kt, &vt, &ot, &bt, &lt, &o, nullptr));
    tilejit_decode_options zero{};
    expect_c_error(tilejit_decode_attention_ex(&qt, &kt, &vt, &ot, &bt, &lt, &o, &zero),
                   "tilejit_decode_options_init");
  }
  {  // extend: 3 and 2 new tokens with their own K/V after prefixes of 9 and 4 keys
    const std::vector<int32_t> qo = {0, 3, 5}, prefix = {9, 4};
    const auto qn = random_bf16(5 * Hq * D, 23), kn = random_bf16(5 * Hkv * D, 24),
               vn = random_bf16(5 * Hkv * D, 25);
    const tilejit_tensor qnt = c(qn.data(), TILEJIT_BF16, {5, Hq, D});
    const tilejit_tensor knt = c(kn.data(), TILEJIT_BF16, {5, Hkv, D});
    const tilejit_tensor vnt = c(vn.data(), TILEJIT_BF16, {5, Hkv, D});
    const tilejit_tensor qot = c(qo.data(), TILEJIT_I32, {B + 1});
    const tilejit_tensor pt = c(prefix.data(), TILEJIT_I32, {B});
    tilejit_extend_options e;
    tilejit_extend_options_init(&e);
    e.k_new = &knt;
    e.v_new = &vnt;
    e.deterministic = true;
    std::vector<uint16_t> oc(5 * Hq * D, 0xFFFF), ocpp(5 * Hq * D);
    const tilejit_tensor ot = c(oc.data(), TILEJIT_BF16, {5, Hq, D});
    ASSERT_C_OK(tilejit_extend_attention(&qnt, &kt, &vt, &ot, &qot, &bt, &pt, &o, &e));
    ExtendOptions ce;
    ce.k_new = TensorView(kn.data(), DType::bf16, {5, Hkv, D});
    ce.v_new = TensorView(vn.data(), DType::bf16, {5, Hkv, D});
    ce.deterministic = true;
    extend_attention({qn.data(), DType::bf16, {5, Hq, D}},
                     {kc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {vc.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
                     {ocpp.data(), DType::bf16, {5, Hq, D}}, {qo.data(), DType::i32, {B + 1}},
                     {table.data(), DType::i32, {B, mb}}, {prefix.data(), DType::i32, {B}}, co, ce);
    EXPECT_TRUE(same_bytes(oc, ocpp)) << "extend";
    // Options not set up by their init function.
    tilejit_extend_options zero{};
    expect_c_error(tilejit_extend_attention(&qnt, &kt, &vt, &ot, &qot, &bt, &pt, &o, &zero),
                   "tilejit_extend_options_init");
  }
  {  // prefill, causal with ALiBi
    constexpr int64_t T = 19;
    const auto pq = random_bf16(T * Hq * D, 26), pk = random_bf16(T * Hkv * D, 27),
               pv = random_bf16(T * Hkv * D, 28);
    const std::vector<int32_t> cu = {0, 12, 19};
    const std::vector<float> slopes = {0.5f, 0.25f, 0.125f, 0.0625f};
    const tilejit_tensor at = c(slopes.data(), TILEJIT_F32, {Hq});
    tilejit_attention_options po;
    tilejit_attention_options_init(&po);
    po.causal = true;
    po.alibi_slopes = &at;
    AttentionOptions cpo;
    cpo.causal = true;
    cpo.alibi_slopes = TensorView(slopes.data(), DType::f32, {Hq});
    std::vector<uint16_t> oc(T * Hq * D, 0xFFFF), ocpp(T * Hq * D);
    const tilejit_tensor pqt = c(pq.data(), TILEJIT_BF16, {T, Hq, D});
    const tilejit_tensor pkt = c(pk.data(), TILEJIT_BF16, {T, Hkv, D});
    const tilejit_tensor pvt = c(pv.data(), TILEJIT_BF16, {T, Hkv, D});
    const tilejit_tensor ot = c(oc.data(), TILEJIT_BF16, {T, Hq, D});
    const tilejit_tensor cut = c(cu.data(), TILEJIT_I32, {B + 1});
    ASSERT_C_OK(tilejit_flash_attn_varlen(&pqt, &pkt, &pvt, &ot, &cut, &cut, &po));
    flash_attn_varlen({pq.data(), DType::bf16, {T, Hq, D}}, {pk.data(), DType::bf16, {T, Hkv, D}},
                      {pv.data(), DType::bf16, {T, Hkv, D}}, {ocpp.data(), DType::bf16, {T, Hq, D}},
                      {cu.data(), DType::i32, {B + 1}}, {cu.data(), DType::i32, {B + 1}}, cpo);
    EXPECT_TRUE(same_bytes(oc, ocpp)) << "prefill";
  }
  {  // store_kv into an fp8 cache with per-head scales; a negative slot skips
    constexpr int64_t T = 4;
    const auto k = random_bf16(T * Hkv * D, 29, -4, 4), v = random_bf16(T * Hkv * D, 30, -4, 4);
    const std::vector<int64_t> slots = {5, -1, 40, 63};
    const std::vector<float> hs = {0.02f, 0.03f};
    std::vector<uint8_t> kcc(kc), vcc(vc), kcpp(kc), vcpp(vc);
    const tilejit_tensor hst = c(hs.data(), TILEJIT_F32, {Hkv});
    tilejit_kv_cache_scales s = {0.01f, 0.02f, &hst, nullptr};
    const tilejit_tensor ktt = c(k.data(), TILEJIT_BF16, {T, Hkv, D});
    const tilejit_tensor vtt = c(v.data(), TILEJIT_BF16, {T, Hkv, D});
    const tilejit_tensor kct = c(kcc.data(), TILEJIT_F8E4M3, {nblocks, block, Hkv, D});
    const tilejit_tensor vct = c(vcc.data(), TILEJIT_F8E4M3, {nblocks, block, Hkv, D});
    const tilejit_tensor slt = c(slots.data(), TILEJIT_I64, {T});
    ASSERT_C_OK(tilejit_store_kv(&ktt, &vtt, &kct, &vct, &slt, &s));
    KvCacheScales cs;
    cs.k_scale = 0.01f;
    cs.v_scale = 0.02f;
    cs.k_head_scales = TensorView(hs.data(), DType::f32, {Hkv});
    store_kv({k.data(), DType::bf16, {T, Hkv, D}}, {v.data(), DType::bf16, {T, Hkv, D}},
             {kcpp.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
             {vcpp.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
             {slots.data(), DType::i64, {T}}, cs);
    EXPECT_TRUE(same_bytes(kcc, kcpp) && same_bytes(vcc, vcpp));
    EXPECT_FALSE(same_bytes(kcc, kc));
    s.k_scale = 0;
    expect_c_error(tilejit_store_kv(&ktt, &vtt, &kct, &vct, &slt, &s), "k_scale");
  }
}

// An e5m2 cache (TILEJIT_F8E5M2): store_kv writes it and decode reads it as
// the C++ calls do, bit for bit.
TEST(CApi, E5m2CacheStoreAndDecodeMatchTheCppCalls) {
  constexpr int64_t T = 12, Hq = 4, Hkv = 2, D = 64, block = 4, nblocks = 4;
  const auto k = random_bf16(T * Hkv * D, 40, -4, 4), v = random_bf16(T * Hkv * D, 41, -4, 4);
  std::vector<int32_t> slots(T);
  for (int64_t t = 0; t < T; ++t) slots[t] = static_cast<int32_t>((t + 4) % 16);
  CTensors c;
  std::vector<uint8_t> kc(nblocks * block * Hkv * D, 0), vc(kc), kcpp(kc), vcpp(kc);
  tilejit_kv_cache_scales s = {0.001f, 0.002f, nullptr, nullptr};
  const tilejit_tensor ktt = c(k.data(), TILEJIT_BF16, {T, Hkv, D});
  const tilejit_tensor vtt = c(v.data(), TILEJIT_BF16, {T, Hkv, D});
  const tilejit_tensor kct = c(kc.data(), TILEJIT_F8E5M2, {nblocks, block, Hkv, D});
  const tilejit_tensor vct = c(vc.data(), TILEJIT_F8E5M2, {nblocks, block, Hkv, D});
  const tilejit_tensor slt = c(slots.data(), TILEJIT_I32, {T});
  ASSERT_C_OK(tilejit_store_kv(&ktt, &vtt, &kct, &vct, &slt, &s));
  KvCacheScales cs;
  cs.k_scale = 0.001f;
  cs.v_scale = 0.002f;
  store_kv({k.data(), DType::bf16, {T, Hkv, D}}, {v.data(), DType::bf16, {T, Hkv, D}},
           {kcpp.data(), DType::f8e5m2, {nblocks, block, Hkv, D}},
           {vcpp.data(), DType::f8e5m2, {nblocks, block, Hkv, D}}, {slots.data(), DType::i32, {T}},
           cs);
  EXPECT_TRUE(same_bytes(kc, kcpp) && same_bytes(vc, vcpp));
  // e5m2, not e4m3: the codes differ from what an e4m3 cache would hold.
  std::vector<uint8_t> k43(kc.size(), 0), v43(kc.size(), 0);
  store_kv({k.data(), DType::bf16, {T, Hkv, D}}, {v.data(), DType::bf16, {T, Hkv, D}},
           {k43.data(), DType::f8e4m3, {nblocks, block, Hkv, D}},
           {v43.data(), DType::f8e4m3, {nblocks, block, Hkv, D}}, {slots.data(), DType::i32, {T}},
           cs);
  EXPECT_FALSE(same_bytes(kc, k43));
  const auto q = random_bf16(2 * Hq * D, 42);
  const std::vector<int32_t> table = {1, 2, 3, 0, 1, 2, 3, 0}, lens = {12, 7};
  const tilejit_tensor qt = c(q.data(), TILEJIT_BF16, {2, Hq, D});
  const tilejit_tensor bt = c(table.data(), TILEJIT_I32, {2, 4});
  const tilejit_tensor lt = c(lens.data(), TILEJIT_I32, {2});
  tilejit_attention_options o;
  tilejit_attention_options_init(&o);
  o.kv_scales = s;
  AttentionOptions co;
  co.kv_scales = cs;
  std::vector<uint16_t> oc(2 * Hq * D, 0xFFFF), ocpp(oc.size());
  const tilejit_tensor ot = c(oc.data(), TILEJIT_BF16, {2, Hq, D});
  ASSERT_C_OK(tilejit_decode_attention(&qt, &kct, &vct, &ot, &bt, &lt, &o));
  decode_attention(
      {q.data(), DType::bf16, {2, Hq, D}}, {kc.data(), DType::f8e5m2, {nblocks, block, Hkv, D}},
      {vc.data(), DType::f8e5m2, {nblocks, block, Hkv, D}}, {ocpp.data(), DType::bf16, {2, Hq, D}},
      {table.data(), DType::i32, {2, 4}}, {lens.data(), DType::i32, {2}}, co);
  EXPECT_TRUE(same_bytes(oc, ocpp));
  // e4m3 keys with e5m2 values: the C++ Error.
  const tilejit_tensor k4 = c(k43.data(), TILEJIT_F8E4M3, {nblocks, block, Hkv, D});
  expect_c_error(tilejit_decode_attention(&qt, &k4, &vct, &ot, &bt, &lt, &o),
                 "k_cache is f8e4m3, v_cache is f8e5m2");
}

TEST(CApi, RopeMatchesTheCppCall) {
  constexpr int64_t T = 7, Hq = 3, Hk = 1, D = 64, rot = 48, P = 32;
  const auto q = random_f32(T * Hq * D, 40), k = random_f32(T * Hk * D, 41);
  const auto cache = random_f32(P * rot, 42);
  std::vector<int32_t> pos(3 * T);
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = static_cast<int32_t>((i * 5) % P);
  const std::vector<int64_t> sections = {8, 8, 8};
  auto qc = q, kc = k, qcpp = q, kcpp = k;
  CTensors c;
  const tilejit_tensor qt = c(qc.data(), TILEJIT_F32, {T, Hq, D});
  const tilejit_tensor kt = c(kc.data(), TILEJIT_F32, {T, Hk, D});
  const tilejit_tensor pt = c(pos.data(), TILEJIT_I32, {3, T});
  const tilejit_tensor ct = c(cache.data(), TILEJIT_F32, {P, rot});
  tilejit_rope_options o;
  tilejit_rope_options_init(&o);
  EXPECT_EQ(o.ndim, 1);
  o.style = TILEJIT_ROPE_GPTJ;
  o.rotary_dim = rot;
  o.mrope_section = sections.data();
  o.mrope_section_count = 3;
  o.mrope_interleaved = true;
  ASSERT_C_OK(tilejit_rope(&qt, &kt, &pt, &ct, &o));
  RopeOptions co;
  co.style = RopeStyle::gptj;
  co.rotary_dim = rot;
  co.mrope_section = sections;
  co.mrope_interleaved = true;
  const TensorView kv(kcpp.data(), DType::f32, {T, Hk, D});
  rope({qcpp.data(), DType::f32, {T, Hq, D}}, &kv, {pos.data(), DType::i32, {3, T}},
       {cache.data(), DType::f32, {P, rot}}, co);
  EXPECT_TRUE(same_bytes(qc, qcpp) && same_bytes(kc, kcpp));
  EXPECT_FALSE(same_bytes(qc, q));
  // q only.
  ASSERT_C_OK(tilejit_rope(&qt, nullptr, &pt, &ct, &o));
  o.mrope_section_count = -1;
  expect_c_error(tilejit_rope(&qt, nullptr, &pt, &ct, &o), "mrope_section_count = -1");
  o.mrope_section_count = 3;
  o.mrope_section = nullptr;
  expect_c_error(tilejit_rope(&qt, nullptr, &pt, &ct, &o),
                 "tilejit_rope: opt.mrope_section is NULL");
}

TEST(CApi, RowwiseOpsMatchTheCppCalls) {
  constexpr int64_t T = 5, H = 72;
  const auto x = random_bf16(T * H, 50), r = random_bf16(T * H, 51);
  const auto w = random_f32(H, 52);
  CTensors c;
  // rms_norm into out, Gemma's (1 + w), eps set.
  std::vector<uint16_t> out(T * H), out_cpp(T * H);
  auto xc = x;
  const tilejit_tensor xt = c(xc.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor wt = c(w.data(), TILEJIT_F32, {H});
  const tilejit_tensor ot = c(out.data(), TILEJIT_BF16, {T, H});
  tilejit_norm_options no;
  tilejit_norm_options_init(&no);
  EXPECT_EQ(no.eps, NormOptions{}.eps);
  no.eps = 1e-5f;
  no.weight_plus_one = true;
  ASSERT_C_OK(tilejit_rms_norm(&xt, &wt, &ot, &no));
  NormOptions co;
  co.eps = 1e-5f;
  co.weight_plus_one = true;
  const TensorView wv(const_cast<float*>(w.data()), DType::f32, {H});
  rms_norm({xc.data(), DType::bf16, {T, H}}, &wv, {out_cpp.data(), DType::bf16, {T, H}}, co);
  EXPECT_TRUE(same_bytes(out, out_cpp));
  // fused add in place on x, no weight.
  auto xa = x, ra = r, xb = x, rb = r;
  const tilejit_tensor xat = c(xa.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor rat = c(ra.data(), TILEJIT_BF16, {T, H});
  ASSERT_C_OK(tilejit_fused_add_rms_norm(&xat, &rat, nullptr, &xat, nullptr));
  const TensorView xbv(xb.data(), DType::bf16, {T, H});
  fused_add_rms_norm(xbv, {rb.data(), DType::bf16, {T, H}}, nullptr, xbv);
  EXPECT_TRUE(same_bytes(xa, xb) && same_bytes(ra, rb));
  EXPECT_FALSE(same_bytes(ra, r));
  // act_and_mul, GPT-OSS's interleaved clamped SwiGLU.
  std::vector<float> g(T * H / 2), g_cpp(T * H / 2);
  const tilejit_tensor gt = c(g.data(), TILEJIT_F32, {T, H / 2});
  tilejit_glu_options go;
  tilejit_glu_options_init(&go);
  EXPECT_EQ(go.act, TILEJIT_ACT_SILU);
  go.clamped_swiglu = true;
  go.rows = TILEJIT_GLU_INTERLEAVED;
  ASSERT_C_OK(tilejit_act_and_mul(&xt, &gt, &go));
  GluOptions gc;
  gc.clamped_swiglu = true;
  gc.rows = GluRows::interleaved;
  act_and_mul({xc.data(), DType::bf16, {T, H}}, {g_cpp.data(), DType::f32, {T, H / 2}}, gc);
  EXPECT_TRUE(same_bytes(g, g_cpp));
  // Mistakes: the operator's own messages, the C layer's for its structs.
  no.eps = 0;
  expect_c_error(tilejit_rms_norm(&xt, &wt, &ot, &no), "rms_norm: eps=0");
  set_raw(go.rows, 9);
  expect_c_error(tilejit_act_and_mul(&xt, &gt, &go), "act_and_mul: rows=GluRows(9)");
  no.struct_size = 3;
  expect_c_error(tilejit_rms_norm(&xt, &wt, &ot, &no), "tilejit_norm_options_init");
  expect_c_error(tilejit_act_and_mul(nullptr, &gt, nullptr), "tilejit_act_and_mul: x is NULL");
}

TEST(CApi, LayerAndGatedNormsMatchTheCppCalls) {
  constexpr int64_t T = 4, H = 40;
  const auto x = random_bf16(T * H, 60), r = random_bf16(T * H, 61), z = random_bf16(T * H, 62);
  const auto w = random_f32(H, 63), b = random_f32(H, 64);
  CTensors c;
  auto xc = x, zc = z;
  const tilejit_tensor xt = c(xc.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor zt = c(zc.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor wt = c(w.data(), TILEJIT_F32, {H});
  const tilejit_tensor bt = c(b.data(), TILEJIT_F32, {H});
  const TensorView wv(const_cast<float*>(w.data()), DType::f32, {H}),
      bv(const_cast<float*>(b.data()), DType::f32, {H});
  // layer_norm with weight and bias, then without either.
  std::vector<uint16_t> out(T * H), out_cpp(T * H);
  const tilejit_tensor ot = c(out.data(), TILEJIT_BF16, {T, H});
  ASSERT_C_OK(tilejit_layer_norm(&xt, &wt, &bt, &ot, nullptr));
  layer_norm({xc.data(), DType::bf16, {T, H}}, &wv, &bv, {out_cpp.data(), DType::bf16, {T, H}});
  EXPECT_TRUE(same_bytes(out, out_cpp));
  ASSERT_C_OK(tilejit_layer_norm(&xt, nullptr, nullptr, &ot, nullptr));
  layer_norm({xc.data(), DType::bf16, {T, H}}, nullptr, nullptr,
             {out_cpp.data(), DType::bf16, {T, H}});
  EXPECT_TRUE(same_bytes(out, out_cpp));
  // fused add in place on x.
  auto xa = x, ra = r, xb = x, rb = r;
  const tilejit_tensor xat = c(xa.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor rat = c(ra.data(), TILEJIT_BF16, {T, H});
  ASSERT_C_OK(tilejit_fused_add_layer_norm(&xat, &rat, &wt, nullptr, &xat, nullptr));
  const TensorView xbv(xb.data(), DType::bf16, {T, H});
  fused_add_layer_norm(xbv, {rb.data(), DType::bf16, {T, H}}, &wv, nullptr, xbv);
  EXPECT_TRUE(same_bytes(xa, xb) && same_bytes(ra, rb));
  EXPECT_FALSE(same_bytes(ra, r));
  // The gated norm, gate first with gelu_tanh, eps set.
  tilejit_gated_norm_options go;
  tilejit_gated_norm_options_init(&go);
  EXPECT_EQ(go.act, TILEJIT_ACT_SILU);
  EXPECT_TRUE(go.norm_before_gate);
  EXPECT_EQ(go.norm.eps, NormOptions{}.eps);
  go.act = TILEJIT_ACT_GELU_TANH;
  go.norm_before_gate = false;
  go.norm.eps = 1e-5f;
  ASSERT_C_OK(tilejit_rms_norm_gated(&xt, &zt, &wt, &ot, &go));
  GatedNormOptions gc;
  gc.act = Activation::gelu_tanh;
  gc.norm_before_gate = false;
  gc.norm.eps = 1e-5f;
  rms_norm_gated({xc.data(), DType::bf16, {T, H}}, {zc.data(), DType::bf16, {T, H}}, &wv,
                 {out_cpp.data(), DType::bf16, {T, H}}, gc);
  EXPECT_TRUE(same_bytes(out, out_cpp));
  // Mistakes: the operator's own messages, the C layer's for its structs.
  const tilejit_tensor b3 = c(const_cast<float*>(b.data()), TILEJIT_F32, {3});
  expect_c_error(tilejit_layer_norm(&xt, &wt, &b3, &ot, nullptr), "layer_norm: bias has shape [3]");
  go.norm.struct_size = 5;
  expect_c_error(tilejit_rms_norm_gated(&xt, &zt, &wt, &ot, &go), "opt.norm.struct_size = 5");
  tilejit_gated_norm_options_init(&go);
  set_raw(go.act, 42);
  expect_c_error(tilejit_rms_norm_gated(&xt, &zt, &wt, &ot, &go), "rms_norm_gated");
  expect_c_error(tilejit_rms_norm_gated(&xt, nullptr, &wt, &ot, nullptr),
                 "tilejit_rms_norm_gated: gate is NULL");
}

TEST(CApi, ExpertsAndRoutingMatchTheCppCalls) {
  constexpr int64_t E = 4, H = 64, I = 40, T = 5, topk = 2;
  const auto w13 = random_bf16(E * 2 * I * H, 50, -0.2f, 0.2f);
  const auto w2 = random_bf16(E * H * I, 51, -0.2f, 0.2f);
  const auto x = random_bf16(T * H, 52);
  const auto logits = random_f32(T * E, 53, -3, 3);
  const auto b13 = random_f32(E * 2 * I, 54);
  CTensors c;
  const tilejit_tensor w13t = c(w13.data(), TILEJIT_BF16, {E, 2 * I, H});
  const tilejit_tensor w2t = c(w2.data(), TILEJIT_BF16, {E, H, I});
  CExperts c13, c2, s13, s2;
  ASSERT_C_OK(
      tilejit_pack_experts_bf16(&w13t, TILEJIT_EXPERTS_GATE_UP, TILEJIT_GLU_HALVES, &c13.p));
  ASSERT_C_OK(tilejit_pack_experts_bf16(&w2t, TILEJIT_EXPERTS_DOWN, TILEJIT_GLU_HALVES, &c2.p));
  const PackedExperts p13 =
      pack_experts({w13.data(), DType::bf16, {E, 2 * I, H}}, ExpertProj::gate_up);
  const PackedExperts p2 = pack_experts({w2.data(), DType::bf16, {E, H, I}}, ExpertProj::down);
  tilejit_packed_experts_info info{};
  ASSERT_C_OK(tilejit_packed_experts_get_info(c13.p, &info));
  EXPECT_EQ(info.num_experts, E);
  EXPECT_EQ(info.n, I);
  EXPECT_EQ(info.k, H);
  EXPECT_EQ(info.proj, TILEJIT_EXPERTS_GATE_UP);
  EXPECT_EQ(std::string(info.layout), p13.layout());
  // The shared expert: expert 0 as a one-expert pack.
  const tilejit_tensor sh13 = c(w13.data(), TILEJIT_BF16, {1, 2 * I, H});
  const tilejit_tensor sh2 = c(w2.data(), TILEJIT_BF16, {1, H, I});
  ASSERT_C_OK(
      tilejit_pack_experts_bf16(&sh13, TILEJIT_EXPERTS_GATE_UP, TILEJIT_GLU_HALVES, &s13.p));
  ASSERT_C_OK(tilejit_pack_experts_bf16(&sh2, TILEJIT_EXPERTS_DOWN, TILEJIT_GLU_HALVES, &s2.p));
  const PackedExperts ps13 =
      pack_experts({w13.data(), DType::bf16, {1, 2 * I, H}}, ExpertProj::gate_up);
  const PackedExperts ps2 = pack_experts({w2.data(), DType::bf16, {1, H, I}}, ExpertProj::down);

  // Routing: grouped top-k (2 groups, DeepSeek-style bias) then the experts.
  std::vector<float> twc(T * topk), twcpp(T * topk);
  std::vector<int32_t> tic(T * topk), ticpp(T * topk);
  const std::vector<float> bias = {0.1f, -0.2f, 0.3f, 0.f};
  const tilejit_tensor lt = c(logits.data(), TILEJIT_F32, {T, E});
  const tilejit_tensor twt = c(twc.data(), TILEJIT_F32, {T, topk});
  const tilejit_tensor tit = c(tic.data(), TILEJIT_I32, {T, topk});
  const tilejit_tensor cbt = c(bias.data(), TILEJIT_F32, {E});
  tilejit_grouped_topk_options g;
  tilejit_grouped_topk_options_init(&g);
  EXPECT_EQ(g.score, TILEJIT_ROUTER_SIGMOID);
  g.num_expert_group = 2;
  g.topk_group = 1;
  g.routed_scaling_factor = 2.5f;
  g.correction_bias = &cbt;
  ASSERT_C_OK(tilejit_grouped_topk(&lt, &twt, &tit, &g));
  GroupedTopkOptions cg;
  cg.num_expert_group = 2;
  cg.topk_group = 1;
  cg.routed_scaling_factor = 2.5f;
  cg.correction_bias = TensorView(bias.data(), DType::f32, {E});
  grouped_topk({logits.data(), DType::f32, {T, E}}, {twcpp.data(), DType::f32, {T, topk}},
               {ticpp.data(), DType::i32, {T, topk}}, cg);
  EXPECT_TRUE(same_bytes(twc, twcpp) && same_bytes(tic, ticpp));
  ASSERT_C_OK(tilejit_topk_softmax(&lt, &twt, &tit, false));
  topk_softmax({logits.data(), DType::f32, {T, E}}, {twcpp.data(), DType::f32, {T, topk}},
               {ticpp.data(), DType::i32, {T, topk}}, false);
  EXPECT_TRUE(same_bytes(twc, twcpp) && same_bytes(tic, ticpp));
  ASSERT_C_OK(tilejit_topk_sigmoid(&lt, &twt, &tit, true));
  topk_sigmoid({logits.data(), DType::f32, {T, E}}, {twcpp.data(), DType::f32, {T, topk}},
               {ticpp.data(), DType::i32, {T, topk}}, true);
  EXPECT_TRUE(same_bytes(twc, twcpp) && same_bytes(tic, ticpp));

  const tilejit_tensor xt = c(x.data(), TILEJIT_BF16, {T, H});
  const tilejit_tensor b13t = c(b13.data(), TILEJIT_F32, {E, 2 * I});
  std::vector<float> oc(T * H, -1), ocpp(T * H, -2);
  const tilejit_tensor ot = c(oc.data(), TILEJIT_F32, {T, H});
  tilejit_moe_options o;
  tilejit_moe_options_init(&o);
  EXPECT_EQ(o.act, TILEJIT_ACT_SILU);
  EXPECT_EQ(o.routed_scaling_factor, 1.f);
  o.act = TILEJIT_ACT_GELU_TANH;
  o.b13 = &b13t;
  o.routed_scaling_factor = 0.7f;
  o.shared_w13 = s13.p;
  o.shared_w2 = s2.p;
  ASSERT_C_OK(tilejit_fused_experts(&xt, c13.p, c2.p, &twt, &tit, &ot, &o));
  MoeOptions co;
  co.act = Activation::gelu_tanh;
  co.b13 = TensorView(b13.data(), DType::f32, {E, 2 * I});
  co.routed_scaling_factor = 0.7f;
  co.shared_w13 = &ps13;
  co.shared_w2 = &ps2;
  fused_experts({x.data(), DType::bf16, {T, H}}, p13, p2, {twcpp.data(), DType::f32, {T, topk}},
                {ticpp.data(), DType::i32, {T, topk}}, {ocpp.data(), DType::f32, {T, H}}, co);
  EXPECT_TRUE(same_bytes(oc, ocpp));
  // The gated shared expert (Qwen2-MoE): a weight per token.
  std::vector<float> sw(T);
  for (int64_t t = 0; t < T; ++t) sw[t] = 0.25f + 0.5f * static_cast<float>(t % 3);
  const tilejit_tensor swt = c(sw.data(), TILEJIT_F32, {T});
  o.shared_weights = &swt;
  ASSERT_C_OK(tilejit_fused_experts(&xt, c13.p, c2.p, &twt, &tit, &ot, &o));
  co.shared_weights = TensorView(sw.data(), DType::f32, {T});
  fused_experts({x.data(), DType::bf16, {T, H}}, p13, p2, {twcpp.data(), DType::f32, {T, topk}},
                {ticpp.data(), DType::i32, {T, topk}}, {ocpp.data(), DType::f32, {T, H}}, co);
  EXPECT_TRUE(same_bytes(oc, ocpp));
  // A caller compiled against the header before shared_weights: its struct
  // ends before the field (struct_size is the earlier layout's), and the
  // bytes past it are the caller's, never read: the shared expert weighs 1.
  tilejit_moe_options old = o;
  old.struct_size = static_cast<uint32_t>(offsetof(tilejit_moe_options, shared_weights));
  old.shared_weights = reinterpret_cast<const tilejit_tensor*>(uintptr_t{8});  // not a tensor
  ASSERT_C_OK(tilejit_fused_experts(&xt, c13.p, c2.p, &twt, &tit, &ot, &old));
  co.shared_weights.reset();
  fused_experts({x.data(), DType::bf16, {T, H}}, p13, p2, {twcpp.data(), DType::f32, {T, topk}},
                {ticpp.data(), DType::i32, {T, topk}}, {ocpp.data(), DType::f32, {T, H}}, co);
  EXPECT_TRUE(same_bytes(oc, ocpp));
  old.struct_size -= 4;  // no published layout
  expect_c_error(tilejit_fused_experts(&xt, c13.p, c2.p, &twt, &tit, &ot, &old),
                 "(an earlier header's)");
  o.shared_weights = nullptr;

  // int8 experts: one description per expert, packed, run, unpacked.
  std::vector<std::vector<uint8_t>> q13(E), q2(E);
  std::vector<std::vector<float>> s13v(E), s2v(E);
  std::vector<tilejit_int8_weight> cq13, cq2;
  std::vector<Int8Weight> pq13, pq2;
  for (int64_t e = 0; e < E; ++e) {
    q13[e] = random_bytes(2 * I * H, 60 + e, 0, 255);
    q2[e] = random_bytes(H * I, 70 + e, 0, 255);
    s13v[e] = random_f32(2 * I, 80 + e, 0.001f, 0.004f);
    s2v[e] = random_f32(H, 90 + e, 0.001f, 0.004f);
    cq13.push_back(
        {c(q13[e].data(), TILEJIT_I8, {2 * I, H}), c(s13v[e].data(), TILEJIT_F32, {2 * I})});
    cq2.push_back({c(q2[e].data(), TILEJIT_I8, {H, I}), c(s2v[e].data(), TILEJIT_F32, {H})});
    pq13.push_back({{q13[e].data(), DType::i8, {2 * I, H}}, {s13v[e].data(), DType::f32, {2 * I}}});
    pq2.push_back({{q2[e].data(), DType::i8, {H, I}}, {s2v[e].data(), DType::f32, {H}}});
  }
  CExperts i13, i2;
  ASSERT_C_OK(tilejit_pack_experts_int8(cq13.data(), E, TILEJIT_EXPERTS_GATE_UP, TILEJIT_GLU_HALVES,
                                        &i13.p));
  ASSERT_C_OK(
      tilejit_pack_experts_int8(cq2.data(), E, TILEJIT_EXPERTS_DOWN, TILEJIT_GLU_HALVES, &i2.p));
  const PackedExperts pi13 = pack_experts(pq13, ExpertProj::gate_up);
  const PackedExperts pi2 = pack_experts(pq2, ExpertProj::down);
  ASSERT_C_OK(tilejit_fused_experts(&xt, i13.p, i2.p, &twt, &tit, &ot, nullptr));
  fused_experts({x.data(), DType::bf16, {T, H}}, pi13, pi2, {twcpp.data(), DType::f32, {T, topk}},
                {ticpp.data(), DType::i32, {T, topk}}, {ocpp.data(), DType::f32, {T, H}});
  EXPECT_TRUE(same_bytes(oc, ocpp));
  std::vector<std::vector<uint8_t>> b13q(E, std::vector<uint8_t>(2 * I * H));
  std::vector<std::vector<float>> b13s(E, std::vector<float>(2 * I));
  std::vector<tilejit_int8_weight> back;
  for (int64_t e = 0; e < E; ++e)
    back.push_back(
        {c(b13q[e].data(), TILEJIT_I8, {2 * I, H}), c(b13s[e].data(), TILEJIT_F32, {2 * I})});
  ASSERT_C_OK(tilejit_packed_experts_unpack_int8(i13.p, back.data(), E));
  for (int64_t e = 0; e < E; ++e)
    EXPECT_TRUE(same_bytes(b13q[e], q13[e]) && same_bytes(b13s[e], s13v[e]));
  std::vector<float> deq(E * 2 * I * H), deqcpp(E * 2 * I * H);
  const tilejit_tensor dt = c(deq.data(), TILEJIT_F32, {E, 2 * I, H});
  ASSERT_C_OK(tilejit_packed_experts_dequantize(i13.p, &dt));
  pi13.dequantize({deqcpp.data(), DType::f32, {E, 2 * I, H}});
  EXPECT_TRUE(same_bytes(deq, deqcpp));

  // Errors: a wrong expert count, a bf16 unpack of int8 experts, moe options unset.
  expect_c_error(tilejit_packed_experts_unpack_int8(i13.p, back.data(), 0),
                 "tilejit_packed_experts_unpack_int8: num_experts = 0");
  // A failed pack sets its *out to NULL (here a non-owning dummy address).
  tilejit_packed_experts* failed = reinterpret_cast<tilejit_packed_experts*>(&info);
  expect_c_error(tilejit_pack_experts_int8(cq13.data(), -3, TILEJIT_EXPERTS_GATE_UP,
                                           TILEJIT_GLU_HALVES, &failed),
                 "num_experts = -3");
  EXPECT_EQ(failed, nullptr);
  tilejit_moe_options zero{};
  expect_c_error(tilejit_fused_experts(&xt, c13.p, c2.p, &twt, &tit, &ot, &zero),
                 "tilejit_moe_options_init");
  expect_c_error(tilejit_fused_experts(&xt, nullptr, c2.p, &twt, &tit, &ot, nullptr),
                 "w13 is NULL");
  // (An enum argument outside its values is checked as for the fields above;
  // a C++ caller cannot pass one without undefined behaviour, so the C
  // consumer and the testers' C programs cover it.)
}

TEST(CApi, CallerMistakesAreErrorsNamingTheArgument) {
  constexpr int64_t M = 2, N = 16, K = 32;
  const auto x = random_bf16(M * K, 1), w = random_bf16(N * K, 2);
  std::vector<float> y(M * N);
  CTensors c;
  const tilejit_tensor wt = c(w.data(), TILEJIT_BF16, {N, K});
  tilejit_tensor xt = c(x.data(), TILEJIT_BF16, {M, K});
  const tilejit_tensor yt = c(y.data(), TILEJIT_F32, {M, N});
  CWeight cw;
  ASSERT_C_OK(tilejit_pack_weight_bf16(&wt, &cw.p));
  ASSERT_C_OK(tilejit_gemm(&xt, cw.p, &yt, nullptr));

  expect_c_error(tilejit_gemm(nullptr, cw.p, &yt, nullptr), "tilejit_gemm: x is NULL");
  expect_c_error(tilejit_gemm(&xt, nullptr, &yt, nullptr), "w is NULL");
  expect_c_error(tilejit_gemm(&xt, cw.p, nullptr, nullptr), "y is NULL");
  tilejit_packed_weight* out = reinterpret_cast<tilejit_packed_weight*>(&xt);
  expect_c_error(tilejit_pack_weight_bf16(nullptr, &out), "w is NULL");
  EXPECT_EQ(out, nullptr);
  expect_c_error(tilejit_pack_weight_bf16(&wt, nullptr), "tilejit_pack_weight_bf16: out is NULL");
  tilejit_gemm_options o{};
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, &o), "tilejit_gemm: opt.struct_size = 0");
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, &o), "tilejit_gemm_options_init");
  tilejit_gemm_options_init(&o);
  set_raw(o.act, 99);
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, &o), "99");
  o.act = TILEJIT_ACT_NONE;
  set_raw(o.act_quant, -5);
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, &o), "-5");

  xt.ndim = TILEJIT_MAX_NDIM + 1;
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, nullptr), "tilejit_gemm: x.ndim = 9");
  xt.ndim = -1;
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, nullptr), "x.ndim = -1");
  xt.ndim = 2;
  xt.shape = nullptr;
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, nullptr), "tilejit_gemm: x.shape is NULL");
  xt = c(x.data(), TILEJIT_BF16, {M, K});
  set_raw(xt.dtype, 42);
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, nullptr), "42");
  xt = c(x.data(), TILEJIT_BF16, {M, K + 1});
  expect_c_error(tilejit_gemm(&xt, cw.p, &yt, nullptr), "x");

  tilejit_packed_weight_info info;
  expect_c_error(tilejit_packed_weight_get_info(cw.p, nullptr), "out is NULL");
  expect_c_error(tilejit_packed_weight_get_info(nullptr, &info), "w is NULL");
  expect_c_error(tilejit_set_num_threads(0), "n=0");
  int32_t n = 0;
  EXPECT_C_OK(tilejit_get_num_threads(&n));
  EXPECT_GE(n, 1);
  expect_c_error(tilejit_get_num_threads(nullptr), "tilejit_get_num_threads: out is NULL");
  expect_c_error(tilejit_load_tuning_db(nullptr), "path is NULL");
  tilejit_cpu_info cpu;
  ASSERT_C_OK(tilejit_get_cpu_info(&cpu));
  const CpuInfo cc = cpu_info();
  EXPECT_EQ(std::string(cpu.vendor), cc.vendor.substr(0, sizeof cpu.vendor - 1));
  EXPECT_EQ(static_cast<int>(cpu.isa), static_cast<int>(cc.isa));
  EXPECT_EQ(cpu.avx512_bf16, cc.avx512_bf16);
  EXPECT_EQ(cpu.amx_emulated, cc.amx_emulated);
  tilejit_cache_stats st;
  ASSERT_C_OK(tilejit_get_cache_stats(&st));
  EXPECT_GE(st.kernels, 1u);
  EXPECT_EQ(st.hits + st.misses >= st.compiles, true);
  // The growable form: the same counters plus disk_evictions; a struct_size
  // it does not know is an error naming it (a zeroed struct included).
  tilejit_cache_stats_ex ex{};
  expect_c_error(tilejit_get_cache_stats_ex(&ex), "out.struct_size = 0; allowed: ");
  expect_c_error(tilejit_get_cache_stats_ex(nullptr), "out is NULL");
  ex.struct_size = sizeof ex;
  ex.disk_evictions = 12345;  // overwritten with the library's count
  ASSERT_C_OK(tilejit_get_cache_stats_ex(&ex));
  const CacheStats cs = cache_stats();
  EXPECT_EQ(ex.kernels, cs.kernels);
  EXPECT_EQ(ex.disk_stores, cs.disk_stores);
  EXPECT_EQ(ex.disk_evictions, cs.disk_evictions);
  EXPECT_GE(ex.compiles, st.compiles);
  // The *_init functions take NULL without harm.
  tilejit_gemm_options_init(nullptr);
  tilejit_int4_weight_init(nullptr);
}

TEST(CApi, LastErrorIsPerThreadAndBounded) {
  expect_c_error(tilejit_set_num_threads(-7), "n=-7");
  const std::string mine = tilejit_last_error();
  std::string other_before, other_after;
  std::thread t([&] {
    other_before = tilejit_last_error();
    expect_c_error(tilejit_set_num_threads(0), "n=0");
    other_after = tilejit_last_error();
  });
  t.join();
  EXPECT_EQ(other_before, "");  // a new thread has no error yet
  EXPECT_NE(other_after.find("n=0"), std::string::npos);
  EXPECT_EQ(std::string(tilejit_last_error()), mine);  // untouched by the other thread
  // A success leaves it as it was.
  EXPECT_C_OK(tilejit_set_num_threads(1));
  EXPECT_EQ(std::string(tilejit_last_error()), mine);
  // A message longer than the buffer ends in "...", within 4095 bytes.
  const std::string path = "/nonexistent/" + std::string(6000, 'p');
  expect_c_error(tilejit_load_tuning_db(path.c_str()), "/nonexistent/ppp");
  const std::string msg = tilejit_last_error();
  EXPECT_EQ(msg.size(), 4095u);
  EXPECT_EQ(msg.substr(msg.size() - 3), "...");
}

}  // namespace
