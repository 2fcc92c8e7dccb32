// TILEJIT_VERBOSE=1 (README): every operator call prints one line
// "tilejit: <op> <shapes> path=<isa> <what runs>" (ops/verbose_log.h) on the
// active path, naming the kernel or plan it runs. One call of each attention
// operator, rope and store_kv, its stderr captured.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "jit/registry.h"
#include "runtime/verbose.h"
#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

// Before the library's first verbose_level() (it caches the level): the
// binary logs whether or not ctest sets the variable.
const bool kVerboseSet = [] {
  setenv("TILEJIT_VERBOSE", "1", 1);
  return true;
}();

// The lines of `err` that start "tilejit: <op> ".
std::vector<std::string> call_lines(const std::string& err, const std::string& op) {
  std::vector<std::string> out;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("tilejit: " + op + " ", 0) == 0) out.push_back(line);
  return out;
}

class VerboseLog : public IsaTest {
 protected:
  void SetUp() override {
    IsaTest::SetUp();
    ASSERT_TRUE(kVerboseSet);
    ASSERT_GT(runtime::verbose_level(), 0) << "TILEJIT_VERBOSE read before the test set it";
    isa_ = cpu_info().isa;
  }
  // The one line of op in the stderr of f(); fails unless there is exactly
  // one, naming the active path.
  template <class F>
  std::string one_line(const std::string& op, F f) {
    testing::internal::CaptureStderr();
    f();
    const std::string err = testing::internal::GetCapturedStderr();
    const auto lines = call_lines(err, op);
    EXPECT_EQ(lines.size(), 1u) << "stderr:\n" << err;
    if (lines.empty()) return "";
    std::printf("%s\n", lines[0].c_str());  // to stdout: the line, for the reader of the log
    EXPECT_NE(lines[0].find(std::string(" path=") + isa_name(isa_) + " "), std::string::npos)
        << lines[0];
    return lines[0];
  }
  bool scalar() const { return isa_ == Isa::scalar; }
  // What an attention call on the engine or the reference says it runs.
  std::string engine_or_reference() const {
    return scalar() ? " plan=reference"
                    : std::string(" plan=attention_engine kernels=brgemm_") + isa_name(isa_);
  }
  Isa isa_ = Isa::scalar;
};

// A paged cache of `dtype` holding B sequences of `lens` keys, hkv heads of d.
struct Paged {
  int64_t bs = 16, hkv = 2, d = 64, max_blocks = 0, num_blocks = 0;
  std::vector<uint16_t> k16, v16;
  std::vector<uint8_t> k8, v8;
  std::vector<int32_t> table, lens;
  DType dtype;

  Paged(std::vector<int32_t> l, DType dt) : lens(std::move(l)), dtype(dt) {
    for (int32_t n : lens) max_blocks = std::max<int64_t>(max_blocks, (n + bs - 1) / bs);
    num_blocks = max_blocks * static_cast<int64_t>(lens.size());
    for (int64_t i = 0; i < num_blocks; ++i) table.push_back(static_cast<int32_t>(i));
    const size_t n = static_cast<size_t>(num_blocks * bs * hkv * d);
    if (dtype == DType::bf16) {
      k16 = random_bf16(n, 1), v16 = random_bf16(n, 2);
    } else {
      k8.assign(n, 0x30), v8.assign(n, 0x28);
    }
  }
  TensorView cache(bool v) {
    void* p = dtype == DType::bf16 ? static_cast<void*>(v ? v16.data() : k16.data())
                                   : static_cast<void*>(v ? v8.data() : k8.data());
    return TensorView(p, dtype, {num_blocks, bs, hkv, d});
  }
  int64_t batch() const { return static_cast<int64_t>(lens.size()); }
  TensorView table_view() { return TensorView(table.data(), DType::i32, {batch(), max_blocks}); }
  TensorView lens_view() { return TensorView(lens.data(), DType::i32, {batch()}); }
};

TEST_F(VerboseLog, DecodeBf16AndFp8Cache) {
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(dt));
    Paged c({20, 33}, dt);
    const int64_t hq = 4;
    const auto q = random_bf16(static_cast<size_t>(c.batch() * hq * c.d), 3);
    std::vector<uint16_t> out(q.size());
    AttentionOptions opt;
    if (dt == DType::f8e4m3) opt.kv_scales.k_scale = opt.kv_scales.v_scale = 0.5f;
    const std::string line = one_line("decode_attention", [&] {
      decode_attention(TensorView(q.data(), DType::bf16, {c.batch(), hq, c.d}), c.cache(false),
                       c.cache(true), TensorView(out.data(), DType::bf16, {c.batch(), hq, c.d}),
                       c.table_view(), c.lens_view(), opt);
    });
    EXPECT_NE(line.find(std::string(" cache=") + dtype_name(dt) + " "), std::string::npos) << line;
    const bool llvm = !scalar() && jit::family_built(jit::Family::decode_attention);
    if (llvm) {
      EXPECT_NE(line.find(" kernel=decode_attn_llvm_d64_dv64_g2_bs16"), std::string::npos) << line;
      EXPECT_EQ(line.find("copy=bf16"), std::string::npos) << line;  // reads the codes
    } else {
      EXPECT_NE(line.find(engine_or_reference()), std::string::npos) << line;
      if (dt == DType::f8e4m3) {
        EXPECT_NE(line.find(" copy=bf16"), std::string::npos) << line;
      }
    }
    if (!scalar()) {
      EXPECT_NE(line.find(" splits="), std::string::npos) << line;
    }
  }
}

TEST_F(VerboseLog, Extend) {
  Paged c({40}, DType::bf16);  // 32 prefix keys, then 8 new tokens in the cache
  const int64_t hq = 4, n = 8;
  std::vector<int32_t> qo = {0, static_cast<int32_t>(n)}, prefix = {32};
  const auto q = random_bf16(static_cast<size_t>(n * hq * c.d), 4);
  std::vector<uint16_t> out(q.size());
  const std::string line = one_line("extend_attention", [&] {
    extend_attention(TensorView(q.data(), DType::bf16, {n, hq, c.d}), c.cache(false), c.cache(true),
                     TensorView(out.data(), DType::bf16, {n, hq, c.d}),
                     TensorView(qo.data(), DType::i32, {2}), c.table_view(),
                     TensorView(prefix.data(), DType::i32, {1}), AttentionOptions{});
  });
  EXPECT_NE(line.find(engine_or_reference()), std::string::npos) << line;
  EXPECT_NE(line.find(" T=8 B=1 Hq=4 Hkv=2 D=64 Dv=64 bs=16 "), std::string::npos) << line;
  if (!scalar()) {
    EXPECT_NE(line.find(" key_block="), std::string::npos) << line;
  }
}

TEST_F(VerboseLog, FlashAttnVarlen) {
  const int64_t t = 24, hq = 4, hkv = 2, d = 64;
  const auto q = random_bf16(static_cast<size_t>(t * hq * d), 5);
  const auto kv = random_bf16(static_cast<size_t>(t * hkv * d), 6);
  std::vector<uint16_t> out(q.size());
  std::vector<int32_t> cu = {0, 10, static_cast<int32_t>(t)};
  const std::string line = one_line("flash_attn_varlen", [&] {
    flash_attn_varlen(TensorView(q.data(), DType::bf16, {t, hq, d}),
                      TensorView(kv.data(), DType::bf16, {t, hkv, d}),
                      TensorView(kv.data(), DType::bf16, {t, hkv, d}),
                      TensorView(out.data(), DType::bf16, {t, hq, d}),
                      TensorView(cu.data(), DType::i32, {3}),
                      TensorView(cu.data(), DType::i32, {3}), AttentionOptions{.causal = true});
  });
  EXPECT_NE(line.find(engine_or_reference()), std::string::npos) << line;
  EXPECT_NE(line.find(" causal=1 "), std::string::npos) << line;
}

TEST_F(VerboseLog, Rope) {
  const int64_t t = 5, hq = 4, hk = 2, d = 64, max_pos = 16;
  auto q = random_bf16(static_cast<size_t>(t * hq * d), 7);
  auto k = random_bf16(static_cast<size_t>(t * hk * d), 8);
  auto cache = random_f32(static_cast<size_t>(max_pos * d), 9);
  std::vector<int32_t> pos = {0, 3, 7, 1, 15};
  const TensorView kv(k.data(), DType::bf16, {t, hk, d});
  const std::string line = one_line("rope", [&] {
    rope(TensorView(q.data(), DType::bf16, {t, hq, d}), &kv,
         TensorView(pos.data(), DType::i32, {t}),
         TensorView(cache.data(), DType::f32, {max_pos, d}), RopeOptions{});
  });
  if (!scalar() && jit::family_built(jit::Family::rope))
    EXPECT_NE(line.find(" kernel=rope_llvm"), std::string::npos) << line;
  else
    EXPECT_NE(line.find(" plan=reference"), std::string::npos) << line;
}

TEST_F(VerboseLog, StoreKv) {
  for (DType dt : {DType::bf16, DType::f8e4m3}) {
    SCOPED_TRACE(dtype_name(dt));
    Paged c({16}, dt);
    const int64_t t = 3;
    const auto k = random_bf16(static_cast<size_t>(t * c.hkv * c.d), 10);
    std::vector<int64_t> slots = {0, 5, -1};
    const std::string line = one_line("store_kv", [&] {
      store_kv(TensorView(k.data(), DType::bf16, {t, c.hkv, c.d}),
               TensorView(k.data(), DType::bf16, {t, c.hkv, c.d}), c.cache(false), c.cache(true),
               TensorView(slots.data(), DType::i64, {t}));
    });
    EXPECT_NE(line.find(std::string(" cache=") + dtype_name(dt)), std::string::npos) << line;
    // An fp8 cache: the kv_quant kernel of the path, the C++ rule on scalar.
    const Isa isa = cpu_info().isa;
    const std::string plan = dt == DType::bf16    ? " plan=c++_copy"
                             : isa == Isa::scalar ? " plan=c++_to_e4m3"
                             : isa == Isa::llvm   ? " plan=kv_quant_llvm"
                                                  : " plan=kv_quant_avx512";
    EXPECT_NE(line.find(plan), std::string::npos) << line;
  }
}

// gemm names its plan on the JIT paths and "reference" on scalar (it printed
// nothing there); the routing ops run C++ on every path.
TEST_F(VerboseLog, GemmAndRouting) {
  const int64_t m = 4, n = 16, k = 32;  // >= 3 rows: amx runs its own tiles (fewer: avx512)
  const auto w = random_bf16(static_cast<size_t>(n * k), 11);
  const auto x = random_bf16(static_cast<size_t>(m * k), 12);
  std::vector<uint16_t> y(static_cast<size_t>(m * n));
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {n, k}));
  const std::string g = one_line("gemm", [&] {
    gemm(TensorView(x.data(), DType::bf16, {m, k}), pw, TensorView(y.data(), DType::bf16, {m, n}));
  });
  EXPECT_NE(g.find(scalar() ? " plan=reference" : " plan=gemm_"), std::string::npos) << g;

  const int64_t t = 3, e = 8, topk = 2;
  std::vector<float> logits(static_cast<size_t>(t * e));
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 5) - 2.0f;
  std::vector<float> wts(static_cast<size_t>(t * topk));
  std::vector<int32_t> ids(static_cast<size_t>(t * topk));
  const TensorView lv(logits.data(), DType::f32, {t, e});
  const TensorView wv(wts.data(), DType::f32, {t, topk}), iv(ids.data(), DType::i32, {t, topk});
  for (const char* op : {"topk_softmax", "topk_sigmoid", "grouped_topk"}) {
    SCOPED_TRACE(op);
    const std::string line = one_line(op, [&] {
      if (std::string(op) == "topk_softmax")
        topk_softmax(lv, wv, iv, true);
      else if (std::string(op) == "topk_sigmoid")
        topk_sigmoid(lv, wv, iv, true);
      else
        grouped_topk(lv, wv, iv, GroupedTopkOptions{.num_expert_group = 2, .topk_group = 1});
    });
    EXPECT_NE(line.find("T=3 E=8 k=2"), std::string::npos) << line;
    EXPECT_NE(line.find(" plan=c++"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace tilejit::test
