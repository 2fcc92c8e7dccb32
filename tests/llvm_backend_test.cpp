// The LLVM ORC backend (codegen/llvm/): the batch-reduce GEMM micro-kernel
// bit-for-bit against the Xbyak AVX-512 kernel where this CPU runs it, its
// API (names, object files, concurrent compiles, unlinking); elementwise IR
// chains against a scalar double evaluation; bad inputs raising
// tilejit::Error. The micro-kernel against the scalar reference over the
// tails of the contract and every epilogue, in the host's default variant and
// with the fma dot product forced, is tests/brgemm_battery_test (its llvm and
// llvm_fma instances, on the harness of tests/brgemm_test_util.h).
//
// Tolerances (per output; the bounds of runtime/reference_error_bounds.h):
//  - GEMM: products of bf16 values are exact in fp32 and each addition rounds
//    once (u = 2⁻²⁴), in any order, so the dot product of K terms plus the
//    acc_in partial sum and the bias is within (K+2)·u·Σ|x·w| + u·|bias| of
//    exact (K counts the acc_in term); the activation stretches that by its
//    Lipschitz constant and adds its own approximation error, 4e-6·max(1,|v|)
//    (exp polynomial ~2e-7, erf A&S 1.5e-7); a bf16 output adds one bf16 ulp,
//    2⁻⁷·|ref|.
//  - Elementwise: the reference carries an error bound along the chain:
//    f32 ops add u·|result|, products add |a|·e_b + |b|·e_a, activations
//    L·e_in + 4e-6·max(1, |in|), a bf16 value 2⁻⁸·|v| (half an ulp), an f16
//    value 2⁻¹¹·|v| + 2⁻²⁵ (half an ulp, subnormals included). Exact paths
//    (casts from bf16/i8/u8/fp8, copies) carry no error, so they must match
//    exactly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "brgemm_test_util.h"
#include "codegen/brgemm_desc.h"
#include "codegen/llvm/llvm_brgemm.h"
#include "codegen/llvm/llvm_elementwise.h"
#include "codegen/llvm/llvm_jit.h"
#include "codegen/xbyak/emitters.h"
#include "ir/parser.h"
#include "jit/kernel_cache.h"
#include "runtime/bf16.h"
#include "runtime/exec_memory.h"
#include "runtime/quant_formats.h"
#include "runtime/reference_gemm.h"
#include "test_util.h"
#include "tests/support/activations.h"

namespace tilejit::test {
namespace {

namespace lb = codegen::llvm_backend;

// ===========================================================================
// Brgemm: the cases of the Xbyak differential and of the API tests, on the
// shared harness (tests/brgemm_test_util.h: inputs ending at guard pages with
// NaN padding, the run between sentinel zones, the check against the
// reference). The kernel against the reference over the tails and every
// epilogue, default and fma variants, is brgemm_battery_test (llvm,
// llvm_fma).

// A case of the llvm row with strided A (rows of kb + 3 elements, the padding
// NaN) and C (rows of nr + 7, the padding sentinel).
BrgemmCase llvm_case(int mr, int nr, int64_t kb, int batch = 1) {
  BrgemmCase c;
  c.path = Isa::llvm;
  c.group = "sweep";
  c.mr = mr, c.nr = nr, c.kb = kb, c.batch = batch;
  c.lda_pad = 3, c.ldc_pad = 7;
  return c;
}

// ---------------------------------------------------------------------------
// The sweep: every (mr, nr, kb) of the contract's tails, with batch, the
// activation, bias, output dtype and acc_in mode rotating through their
// values so that each appears with many shapes (each with every other is the
// Epilogue sweep below).

const int kMr[] = {1, 2, 3, 4, 5, 6, 7, 8, 13, 16, 32};
const int kNr[] = {1, 15, 16, 17, 33, 64};
const int64_t kKb[] = {1, 2, 30, 32, 33, 100, 4096};
const std::vector<Activation> kActs = testing_support::all_activations();
const BiasKind kBiases[] = {BiasKind::none, BiasKind::f32, BiasKind::bf16};

std::vector<BrgemmCase> shape_sweep() {
  std::vector<BrgemmCase> v;
  int i = 0;
  for (int mr : kMr)
    for (int nr : kNr)
      for (int64_t kb : kKb) {
        BrgemmCase c = llvm_case(mr, nr, kb, i % 2 ? 3 : 1);
        c.act = kActs[size_t(i) % kActs.size()];
        c.bias = kBiases[i % 3];
        c.out = (i / 2) % 2 ? DType::bf16 : DType::f32;
        const int acc = (i / 3) % 3;
        c.acc = acc == 0 ? Acc::off : acc == 1 ? Acc::separate : Acc::alias;
        if (c.acc == Acc::alias && c.out != DType::f32) c.acc = Acc::separate;
        v.push_back(c);
        ++i;
      }
  return v;
}

// Every epilogue (activation × bias × output × acc_in × batch) on two shapes:
// an odd-K, N-tail decode block and a full-width block that is split into
// row blocks.
std::vector<BrgemmCase> epilogue_sweep() {
  std::vector<BrgemmCase> v;
  for (auto [mr, nr, kb] : {std::tuple{3, 17, int64_t{33}}, std::tuple{13, 64, int64_t{30}}})
    for (Activation act : kActs)
      for (BiasKind bias : kBiases)
        for (DType out : {DType::f32, DType::bf16})
          for (Acc acc : {Acc::off, Acc::separate, Acc::alias})
            for (int batch : {1, 3}) {
              if (acc == Acc::alias && out != DType::f32) continue;
              BrgemmCase c = llvm_case(mr, nr, kb, batch);
              c.act = act, c.bias = bias, c.out = out, c.acc = acc;
              v.push_back(c);
            }
  return v;
}

std::string case_name(const ::testing::TestParamInfo<BrgemmCase>& info) {
  return info.param.str();
}

bool host_has_dpbf16() {
  return lb::host_target().avx512bf16;
}

// ---------------------------------------------------------------------------
// Against the Xbyak AVX-512 kernel, on the shapes it takes (mr up to its
// register limit): the dpbf16 variant uses the same instruction, the same
// accumulator sets and the same epilogue formulas, so every output must be
// bit-identical (bf16 outputs of subnormal values excepted: vcvtneps2bf16
// flushes them to zero, the LLVM kernel rounds them).

bool xbyak_takes(const BrgemmCase& c) {
  return c.mr <= codegen::xbyak::avx512_brgemm_max_mr((c.nr + 15) / 16);
}

class LlvmVsXbyak : public ::testing::TestWithParam<BrgemmCase> {};

TEST_P(LlvmVsXbyak, BitIdenticalToAvx512Kernel) {
  const CpuInfo info = cpu_info();
  if (!info.avx512_bf16 || info.max_isa < Isa::avx512 || !host_has_dpbf16())
    GTEST_SKIP() << "no AVX512-BF16 on this CPU/OS or in the LLVM target (TILEJIT_LLVM_CPU): the "
                    "Xbyak AVX-512 kernel and the LLVM dpbf16 variant both need it, so the "
                    "differential test cannot run here";
  const BrgemmCase& c = GetParam();
  BrgemmDesc xd = c.desc();
  xd.isa = Isa::avx512;
  const std::vector<uint8_t> code = codegen::xbyak::emit_avx512_brgemm(xd);
  const runtime::ExecutableMemory mem(code.data(), code.size());
  const auto xfn = reinterpret_cast<BrgemmFn>(const_cast<void*>(mem.data()));
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc());
  const BrgemmData d = make_brgemm_data(c);
  const std::vector<uint8_t> want = run_brgemm(d, xfn);
  const std::vector<uint8_t> got = run_brgemm(d, k.fn<BrgemmFn>());
  ASSERT_EQ(got.size(), want.size());
  const int64_t elems = int64_t(got.size()) / (c.out == DType::f32 ? 4 : 2);
  int64_t differ = 0;
  std::string msg;
  for (int64_t e = 0; e < elems; ++e) {
    if (same_output_bits(got.data(), want.data(), c.out, e)) continue;
    if (differ++ < 5)
      msg += fmt::format("\n  element {}: llvm {}, xbyak {}", e - kBrgemmGuard,
                         read_out(got.data(), c.out, e), read_out(want.data(), c.out, e));
  }
  EXPECT_EQ(differ, 0) << c.str() << ": outputs differ from the Xbyak kernel's" << msg;
}

// The cases of both sweeps the Xbyak kernel takes, each once.
std::vector<BrgemmCase> xbyak_sweep() {
  std::vector<BrgemmCase> v;
  std::set<std::string> seen;
  for (const auto& s : {shape_sweep(), epilogue_sweep()})
    for (const BrgemmCase& c : s)
      if (xbyak_takes(c) && seen.insert(c.str()).second) v.push_back(c);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Cases, LlvmVsXbyak, ::testing::ValuesIn(xbyak_sweep()), case_name);

// ---------------------------------------------------------------------------
// The kernel API around the cases.

TEST(LlvmBrgemmApi, NameSpellsTheSpecializationWithIsaLlvm) {
  BrgemmDesc d;
  d.isa = Isa::amx;  // ignored
  d.mr = 7, d.nr = 64, d.kb = 4096;
  d.bias = BiasKind::f32, d.act = Activation::silu, d.out = DType::bf16;
  EXPECT_EQ(lb::llvm_brgemm_name(d), "brgemm_llvm_bf16_f32acc_m7n64k4096_biasf32_silu_bf16out");
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(d);
  EXPECT_EQ(k.name, lb::llvm_brgemm_name(d));
  EXPECT_NE(k.entry, nullptr);
  EXPECT_GT(k.compile_us, 0);
  // A relocatable x86-64 ELF object: what a disk cache would store.
  ASSERT_GT(k.object_file.size(), 64u);
  EXPECT_EQ(std::memcmp(k.object_file.data(),
                        "\x7f"
                        "ELF",
                        4),
            0);
  const lb::LlvmKernel f = lb::compile_llvm_brgemm(d, {.dot = lb::BrgemmDot::fma});
  EXPECT_EQ(f.name, lb::llvm_brgemm_name(d) + "_fma");
}

TEST(LlvmBrgemmApi, KernelFromItsObjectFileComputesTheSame) {
  BrgemmCase c = llvm_case(5, 33, 77, 2);
  c.act = Activation::gelu_erf, c.bias = BiasKind::bf16, c.out = DType::bf16;
  const BrgemmData d = make_brgemm_data(c);
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc());
  // Linked twice in one process: each object lives in its own JITDylib.
  const lb::LlvmKernel again = lb::load_object_file(k.name, k.object_file);
  const lb::LlvmKernel third = lb::load_object_file(k.name, k.object_file);
  EXPECT_NE(again.entry, k.entry);
  const std::vector<uint8_t> want = run_brgemm(d, k.fn<BrgemmFn>());
  EXPECT_TRUE(check_brgemm(d, want));
  EXPECT_EQ(run_brgemm(d, again.fn<BrgemmFn>()), want);
  EXPECT_EQ(run_brgemm(d, third.fn<BrgemmFn>()), want);
  // The function's own extent (what the perf map names), known after either
  // path: inside the object, which also holds its constants and metadata.
  EXPECT_GT(k.code_size, 64u);
  EXPECT_LT(k.code_size, k.object_file.size());
  EXPECT_EQ(again.code_size, k.code_size);
}

TEST(LlvmBrgemmApi, ZeroBatchGivesTheEpilogueOfZero) {
  BrgemmCase c = llvm_case(2, 20, 8, 0);
  c.bias = BiasKind::f32, c.act = Activation::relu;
  const BrgemmData d = make_brgemm_data(c);
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(c.desc());
  const std::vector<uint8_t> got = run_brgemm(d, k.fn<BrgemmFn>());
  for (int i = 0; i < c.mr; ++i)
    for (int j = 0; j < c.nr; ++j)
      EXPECT_EQ(read_out(got.data(), c.out, kBrgemmGuard + i * d.ldc + j),
                std::max(0.0f, d.bias[size_t(j)]));
}

TEST(LlvmBrgemmApi, KernelsCompiledOnManyThreadsAtOnceAreCorrect) {
  // Different kernels on 4 threads at once (compiles share the JIT, not their
  // LLVMContext or TargetMachine), each checked on its own thread.
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::mutex mu;
  std::vector<std::string> messages;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) {
        BrgemmCase c = llvm_case(1 + t * 3 + i, 9 + 13 * i, 21 + 10 * t);
        c.act = kActs[size_t(t + i) % kActs.size()];
        c.out = i % 2 ? DType::bf16 : DType::f32;
        try {
          const lb::LlvmKernel k = lb::compile_llvm_brgemm(
              c.desc(), {.dot = i % 2 ? lb::BrgemmDot::fma : lb::BrgemmDot::best});
          const BrgemmData d = make_brgemm_data(c);
          const auto r = check_brgemm(d, run_brgemm(d, k.fn<BrgemmFn>()));
          if (!r) {
            ++failures;
            std::lock_guard<std::mutex> lock(mu);
            messages.push_back(r.message());
          }
        } catch (const std::exception& e) {
          ++failures;
          std::lock_guard<std::mutex> lock(mu);
          messages.push_back(e.what());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << ::testing::PrintToString(messages);
}

TEST(LlvmBrgemmApi, DroppedKernelsAreUnlinked) {
  // Each kernel owns its JITDylib; dropping the last copy removes it. Many
  // compile/drop rounds must neither fail nor disturb a kernel still held.
  const BrgemmCase keep = llvm_case(3, 16, 10);
  const BrgemmData d = make_brgemm_data(keep);
  const lb::LlvmKernel held = lb::compile_llvm_brgemm(keep.desc());
  const std::vector<uint8_t> want = run_brgemm(d, held.fn<BrgemmFn>());
  for (int i = 0; i < 20; ++i) {
    BrgemmDesc desc = keep.desc();
    desc.kb = 1 + i;
    lb::LlvmKernel k = lb::compile_llvm_brgemm(desc);
    lb::LlvmKernel copy = k;  // copies share the code
    EXPECT_EQ(copy.entry, k.entry);
  }
  EXPECT_EQ(run_brgemm(d, held.fn<BrgemmFn>()), want);
}

// Linux caps a process at vm.max_map_count (~65 530) mappings, host and JIT
// together. Linked kernels used to take two each (code RX, constants R, not
// mergeable with the neighbours'): an outside tester's process stopped
// compiling at ~32 700 LLVM kernels and its std::thread creation failed.
// Kernels now share large mappings (codegen/llvm/jit_memory.cpp): 120 held
// kernels add a handful, and each still computes what it should.
TEST(LlvmJit, HeldKernelsShareMappings) {
  auto mappings = [] {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    int64_t n = 0;
    while (std::getline(maps, line)) ++n;
    return n;
  };
  // SiLU and a bf16 output: kernels with constant pools (read-only data),
  // what split each kernel's memory in two.
  BrgemmCase base = llvm_case(3, 16, 10);
  base.act = Activation::silu, base.out = DType::bf16;
  std::vector<lb::LlvmKernel> held;
  held.push_back(lb::compile_llvm_brgemm(base.desc()));  // the JIT and its first reservation
  const int64_t before = mappings();
  constexpr int kKernels = 120;
  for (int i = 0; i < kKernels; ++i) {
    BrgemmDesc desc = base.desc();
    desc.kb = 2 + i;
    held.push_back(lb::compile_llvm_brgemm(desc));
  }
  const int64_t grown = mappings() - before;
  EXPECT_LT(grown, kKernels / 4) << grown << " mappings for " << kKernels << " kernels";
  const BrgemmData d = make_brgemm_data(base);
  EXPECT_TRUE(check_brgemm(d, run_brgemm(d, held.front().fn<BrgemmFn>())));
  BrgemmCase last = base;
  last.kb = 2 + kKernels - 1;
  const BrgemmData dl = make_brgemm_data(last);
  EXPECT_TRUE(check_brgemm(dl, run_brgemm(dl, held.back().fn<BrgemmFn>())));
}

// ---------------------------------------------------------------------------
// Bad descriptors and modules: tilejit::Error naming the problem.

TEST(LlvmBrgemmErrors, OutOfContractDescriptorsRaiseError) {
  auto expect_error = [](BrgemmDesc d, const char* needle) {
    try {
      lb::compile_llvm_brgemm(d);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(needle));
    }
  };
  BrgemmDesc d;
  d.mr = 0;
  expect_error(d, "mr = 0");
  d.mr = 33;
  expect_error(d, "mr = 33");
  d = {};
  d.nr = 0;
  expect_error(d, "nr = 0");
  d.nr = 65;
  expect_error(d, "nr = 65");
  d = {};
  d.kb = -2;
  expect_error(d, "kb = -2");
  d = {};
  d.b_row_bytes = 128;
  expect_error(d, "b_row_bytes = 128");
  d = {};
  d.b_row_bytes = 258;
  expect_error(d, "b_row_bytes = 258");
  d = {};
  d.out = DType::f16;
  expect_error(d, "out = f16");
  d = {};
  d.act = static_cast<Activation>(42);
  expect_error(d, "Activation(42)");
}

TEST(LlvmBrgemmErrors, Dpbf16OnAHostWithoutItRaisesError) {
  if (host_has_dpbf16())
    GTEST_SKIP() << "this host has AVX512-BF16: the dpbf16 variant compiles here";
  EXPECT_THROW(lb::compile_llvm_brgemm(BrgemmDesc{}, {.dot = lb::BrgemmDot::dpbf16}), Error);
}

TEST(LlvmJitErrors, ModuleProblemsRaiseErrorNotAbort) {
  // No function of the name asked for.
  EXPECT_THROW(lb::compile_module("missing", [](lb::ModuleContext&) {}), Error);
  // Garbage instead of an object file.
  std::vector<uint8_t> junk(256, 0x5a);
  try {
    lb::load_object_file("f", junk);
    ADD_FAILURE() << "linked a junk object";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("LLVM JIT"));
  }
  // An object without the symbol.
  BrgemmDesc d;
  const lb::LlvmKernel k = lb::compile_llvm_brgemm(d);
  EXPECT_THROW(lb::load_object_file("not_in_there", k.object_file), Error);
  // Exceptions of the IR callback reach the caller.
  EXPECT_THROW(
      lb::compile_module("cb", [](lb::ModuleContext&) { throw Error("from the callback"); }),
      Error);
}

TEST(LlvmJit, HostTargetDescribesThisMachine) {
  const lb::HostTarget& h = lb::host_target();
  EXPECT_THAT(h.triple, ::testing::StartsWith("x86_64"));
  EXPECT_EQ(h.vector_bits, h.avx512f ? 512 : 256);
  EXPECT_TRUE(h.avx2 && h.fma);
  const CpuInfo info = cpu_info();
  if (const char* cpu = std::getenv("TILEJIT_LLVM_CPU"); cpu != nullptr && *cpu != '\0') {
    // Narrowed to a named CPU: never more than the host has.
    EXPECT_EQ(h.cpu, cpu);
    EXPECT_TRUE(!h.avx512f || info.avx512f);
    EXPECT_TRUE(!h.avx512bf16 || info.avx512_bf16);
  } else {
    EXPECT_EQ(h.avx512f, info.avx512f);
    EXPECT_EQ(h.avx512bf16, info.avx512_bf16);
  }
}

// ===========================================================================
// Elementwise chains.

// Host-side dtype codecs for the reference (independent of the kernel's).
double decode(DType t, const uint8_t* p) {
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::f16: {
      _Float16 h;
      std::memcpy(&h, p, 2);
      return static_cast<double>(h);
    }
    case DType::i8:
      return static_cast<int8_t>(*p);
    case DType::u8:
      return *p;
    case DType::i32: {
      int32_t i;
      std::memcpy(&i, p, 4);
      return i;
    }
    case DType::f8e4m3:  // checked over all 256 codes in quant_formats_test
      return runtime::e4m3_to_f32(*p);
    case DType::u4:
    case DType::f4e2m1:
    case DType::f8e5m2:  // a KV cache type only: no elementwise kernel reads it
    case DType::i64:
      break;
  }
  return 0;
}

size_t dsize(DType t) {
  return static_cast<size_t>(dtype_bits(t) / 8);
}

// A value of the reference: the exact result of the op on exact inputs, and a
// bound on how far the kernel's may be from it (header comment).
struct RefVal {
  double v = 0, err = 0;
};

RefVal round_to(DType t, RefVal r) {
  const double mag = std::fabs(r.v) + r.err;
  if (t == DType::bf16) r.err += std::ldexp(mag, -8);
  if (t == DType::f16) r.err += std::ldexp(mag, -11) + std::ldexp(1.0, -25);
  return r;
}

// One tensor of an elementwise call: host bytes and how the kernel finds them.
struct Tensor {
  DType dtype = DType::f32;
  int64_t row_stride = 0, col_stride = 1;  // elements, as the kernel will use them
  std::vector<uint8_t> bytes;
  const uint8_t* at(int64_t r, int64_t c) const {
    return bytes.data() + size_t(r * row_stride + c * col_stride) * dsize(dtype);
  }
};

struct EwCall {
  std::vector<Tensor> params, results;
  std::vector<int64_t> param_strides;       // [params][2], the dynamic-stride array
  std::vector<int64_t> result_row_strides;  // empty: null (contiguous)
  int64_t rows = 1, n = 1;
  int64_t args_rows = -1;  // what args.rows says (default: rows)
};

// Evaluates f at (row, col) in double with error bounds.
std::vector<RefVal> reference_eval(const ir::Function& f, const EwCall& call, int64_t r,
                                   int64_t c) {
  std::map<int, RefVal> vals;
  for (size_t i = 0; i < f.params.size(); ++i) {
    const Tensor& t = call.params[i];
    vals[f.params[i]] = {decode(t.dtype, t.at(r, c)), 0};
  }
  const double u = std::ldexp(1.0, -24);
  for (const ir::Op& op : f.ops) {
    const RefVal a = vals.at(op.operands[0]);
    RefVal out;
    switch (op.kind) {
      case ir::OpKind::add: {
        const RefVal b = vals.at(op.operands[1]);
        out.v = a.v + b.v;
        out.err = a.err + b.err;
        out.err += u * (std::fabs(out.v) + out.err);
        break;
      }
      case ir::OpKind::mul: {
        const RefVal b = vals.at(op.operands[1]);
        out.v = a.v * b.v;
        out.err = std::fabs(a.v) * b.err + std::fabs(b.v) * a.err + a.err * b.err;
        out.err += u * (std::fabs(out.v) + out.err);
        break;
      }
      case ir::OpKind::cast: {
        out = a;
        // An i32 rounds to f32 on its way (documented).
        const ir::TensorType& in = f.value(op.operands[0]).type;
        if (in.dtype == DType::i32) out.err += u * std::fabs(a.v);
        break;
      }
      default: {
        const Activation act = ir::activation_of(op.kind);
        out.v = runtime::reference_activation(act, a.v);
        out.err = runtime::activation_error(act, a.v, a.err);
        out.err += runtime::activation_math_error(act, std::fabs(a.v) + a.err);
        out.err += u * (std::fabs(out.v) + out.err);
        break;
      }
    }
    vals[op.result] = round_to(f.value(op.result).type.dtype, out);
  }
  std::vector<RefVal> res;
  for (int id : f.results) res.push_back(vals.at(id));
  return res;
}

// Runs the kernel of f on `call` and checks every result element (and that
// result row padding stays untouched).
::testing::AssertionResult run_elementwise(const ir::Function& f, EwCall call) {
  lb::LlvmKernel k;
  try {
    k = lb::compile_llvm_elementwise(f);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "compile failed: " << e.what();
  }
  std::vector<const void*> params;
  std::vector<void*> results;
  for (auto& t : call.params) params.push_back(t.bytes.data());
  for (auto& t : call.results) {
    std::fill(t.bytes.begin(), t.bytes.end(), uint8_t(0xa5));
    results.push_back(t.bytes.data());
  }
  const std::vector<uint8_t> untouched = [&] {
    std::vector<uint8_t> all;
    for (auto& t : call.results) all.insert(all.end(), t.bytes.begin(), t.bytes.end());
    return all;
  }();
  lb::ElementwiseArgs args{};
  args.params = params.data();
  args.results = results.data();
  args.rows = call.args_rows >= 0 ? call.args_rows : call.rows;
  args.param_strides = call.param_strides.empty() ? nullptr : call.param_strides.data();
  args.result_row_strides =
      call.result_row_strides.empty() ? nullptr : call.result_row_strides.data();
  k.fn<lb::ElementwiseFn>()(&args);

  int64_t bad = 0;
  std::string msg;
  for (int64_t r = 0; r < call.rows; ++r)
    for (int64_t c = 0; c < call.n; ++c) {
      const std::vector<RefVal> ref = reference_eval(f, call, r, c);
      for (size_t i = 0; i < ref.size(); ++i) {
        const double got = decode(call.results[i].dtype, call.results[i].at(r, c));
        const bool ok = std::isnan(ref[i].v)
                            ? std::isnan(got)
                            : got == ref[i].v || std::fabs(got - ref[i].v) <= ref[i].err;
        if (!ok && bad++ < 6)
          msg += "\n  result " + std::to_string(i) + " [" + std::to_string(r) + ", " +
                 std::to_string(c) + "] = " + std::to_string(got) + ", reference " +
                 std::to_string(ref[i].v) + " ± " + std::to_string(ref[i].err);
      }
    }
  // Bytes of the result buffers that are not results must still be 0xa5.
  int64_t touched = 0;
  size_t base = 0;
  for (auto& t : call.results) {
    std::vector<bool> is_result(t.bytes.size(), false);
    const int64_t rs = t.row_stride;
    for (int64_t r = 0; r < (rs == 0 ? 1 : call.rows); ++r)
      for (int64_t c = 0; c < call.n; ++c)
        for (size_t b = 0; b < dsize(t.dtype); ++b)
          is_result[size_t(r * rs + c) * dsize(t.dtype) + b] = true;
    for (size_t b = 0; b < t.bytes.size(); ++b)
      if (!is_result[b] && t.bytes[b] != untouched[base + b]) ++touched;
    base += t.bytes.size();
  }
  if (bad == 0 && touched == 0) return ::testing::AssertionSuccess();
  auto res = ::testing::AssertionFailure() << f.name << ": ";
  if (bad) res << bad << " results outside the bound" << msg;
  if (touched) res << "\n" << touched << " bytes outside the results were written";
  return res;
}

// A tensor of `rows` × n elements of dtype t with the given strides, filled
// with values from [lo, hi] (rounded to t); padding bytes get 0xee.
Tensor make_tensor(DType t, int64_t rows, int64_t n, int64_t row_stride, int64_t col_stride,
                   uint32_t seed, double lo = -6, double hi = 6) {
  Tensor x;
  x.dtype = t;
  x.row_stride = row_stride;
  x.col_stride = col_stride;
  const int64_t span = (rows - 1) * row_stride + (n - 1) * col_stride + 1;
  x.bytes.assign(size_t(std::max<int64_t>(span, 1)) * dsize(t), 0xee);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < n; ++c) {
      uint8_t* p = x.bytes.data() + size_t(r * row_stride + c * col_stride) * dsize(t);
      const double v = d(rng);
      switch (t) {
        case DType::f32: {
          const float f = static_cast<float>(v);
          std::memcpy(p, &f, 4);
          break;
        }
        case DType::bf16: {
          const uint16_t h = f32_to_bf16(static_cast<float>(v));
          std::memcpy(p, &h, 2);
          break;
        }
        case DType::f16: {
          const _Float16 h = static_cast<_Float16>(v);
          std::memcpy(p, &h, 2);
          break;
        }
        case DType::i8:
          *p = static_cast<uint8_t>(static_cast<int8_t>(std::lround(v * 20)));
          break;
        case DType::u8:
        case DType::f8e4m3:
          *p = static_cast<uint8_t>(rng());
          break;
        case DType::i32: {
          const int32_t i = static_cast<int32_t>(rng());  // full range: rounds to f32
          std::memcpy(p, &i, 4);
          break;
        }
        case DType::u4:
        case DType::f4e2m1:
        case DType::f8e5m2:
        case DType::i64:
          break;
      }
    }
  return x;
}

Tensor contiguous(DType t, int64_t rows, int64_t n, uint32_t seed, double lo = -6, double hi = 6) {
  return make_tensor(t, rows, n, n, 1, seed, lo, hi);
}

// A result buffer of rows × n (row stride ≥ n).
Tensor result(DType t, int64_t rows, int64_t n, int64_t row_stride = 0) {
  Tensor x;
  x.dtype = t;
  x.row_stride = row_stride ? row_stride : n;
  x.bytes.assign(size_t(std::max<int64_t>((rows - 1) * x.row_stride + n, 1)) * dsize(t), 0);
  return x;
}

// Replaces every "$N" in text with n.
std::string with_n(std::string text, int64_t n) {
  for (size_t p; (p = text.find("$N")) != std::string::npos;) text.replace(p, 2, std::to_string(n));
  return text;
}

class LlvmElementwiseN : public ::testing::TestWithParam<int64_t> {};

TEST_P(LlvmElementwiseN, BiasSiluToBf16) {
  const int64_t n = GetParam();
  const ir::Function f = ir::parse(with_n(R"(
func @bias_silu(%x: tensor<?Mx$Nxbf16>, %b: tensor<$Nxf32>) -> (tensor<?Mx$Nxbf16>) {
  %0 = add %x, %b : tensor<?Mx$Nxf32>
  %1 = silu %0 : tensor<?Mx$Nxf32>
  %2 = cast %1 {to = bf16} : tensor<?Mx$Nxbf16>
  return %2
})",
                                          n));
  for (int64_t rows : {1, 3}) {
    EwCall call;
    call.rows = rows, call.n = n;
    call.params = {contiguous(DType::bf16, rows, n, 1), make_tensor(DType::f32, 1, n, 0, 1, 2)};
    call.results = {result(DType::bf16, rows, n)};
    EXPECT_TRUE(run_elementwise(f, call)) << "rows " << rows;
  }
}

TEST_P(LlvmElementwiseN, EveryActivationAsItsOwnResult) {
  const int64_t n = GetParam();
  const ir::Function f = ir::parse(with_n(R"(
func @acts(%x: tensor<?Mx$Nxf32>) -> (tensor<?Mx$Nxf32>, tensor<?Mx$Nxf32>, tensor<?Mx$Nxf32>, tensor<?Mx$Nxf32>) {
  %0 = relu %x : tensor<?Mx$Nxf32>
  %1 = silu %x : tensor<?Mx$Nxf32>
  %2 = gelu_tanh %x : tensor<?Mx$Nxf32>
  %3 = gelu_erf %x : tensor<?Mx$Nxf32>
  return %0, %1, %2, %3
})",
                                          n));
  EwCall call;
  call.rows = 4, call.n = n;
  call.params = {contiguous(DType::f32, 4, n, 3, -20, 20)};
  for (int i = 0; i < 4; ++i) call.results.push_back(result(DType::f32, 4, n));
  EXPECT_TRUE(run_elementwise(f, call));
}

TEST_P(LlvmElementwiseN, Bf16ArithmeticWithRoundingBetweenOps) {
  // bf16 values are rounded where they are defined: %0 and %1 are bf16.
  const int64_t n = GetParam();
  const ir::Function f = ir::parse(with_n(R"(
func @mix(%x: tensor<?Mx$Nxbf16, strided<[?, 1]>>, %s: tensor<$Nxbf16>) -> (tensor<?Mx$Nxf16>, tensor<?Mx$Nxbf16>) {
  %0 = mul %x, %s : tensor<?Mx$Nxbf16>
  %1 = add %0, %x : tensor<?Mx$Nxbf16>
  %2 = cast %1 {to = f32} : tensor<?Mx$Nxf32>
  %3 = gelu_erf %2 : tensor<?Mx$Nxf32>
  %4 = cast %3 {to = f16} : tensor<?Mx$Nxf16>
  return %4, %1
})",
                                          n));
  EwCall call;
  call.rows = 3, call.n = n;
  const int64_t ldx = n + 5;
  call.params = {make_tensor(DType::bf16, 3, n, ldx, 1, 4, -3, 3),
                 make_tensor(DType::bf16, 1, n, 0, 1, 5, -2, 2)};
  call.param_strides = {ldx, 1, 0, 0};
  // The second result into rows of n + 3 elements.
  call.results = {result(DType::f16, 3, n), result(DType::bf16, 3, n, n + 3)};
  call.result_row_strides = {n, n + 3};
  EXPECT_TRUE(run_elementwise(f, call));
}

std::string n_name(const ::testing::TestParamInfo<int64_t>& p) {
  return "n" + std::to_string(p.param);
}

INSTANTIATE_TEST_SUITE_P(N, LlvmElementwiseN, ::testing::Values(1, 15, 16, 17, 100), n_name);

TEST(LlvmElementwise, StridedColumnsStaticAndDynamic) {
  const ir::Function f = ir::parse(R"(
func @strided(%x: tensor<?Mx20xf32, strided<[?, 3]>>, %y: tensor<?Mx20xf32, strided<[?, ?]>>) -> (tensor<?Mx20xf32>) {
  %0 = mul %x, %y : tensor<?Mx20xf32>
  %1 = relu %0 : tensor<?Mx20xf32>
  return %1
})");
  EwCall call;
  call.rows = 3, call.n = 20;
  call.params = {make_tensor(DType::f32, 3, 20, 70, 3, 6),
                 make_tensor(DType::f32, 3, 20, 45, 2, 7)};
  call.param_strides = {70, 0, 45, 2};  // x's column stride is static: its entry is unused
  call.results = {result(DType::f32, 3, 20)};
  EXPECT_TRUE(run_elementwise(f, call));
}

TEST(LlvmElementwise, Rank3CollapsesLeadingDimsIntoRows) {
  const ir::Function f = ir::parse(R"(
func @r3(%x: tensor<2x?Tx24xf32>, %b: tensor<24xbf16>) -> (tensor<2x?Tx24xbf16>) {
  %0 = add %x, %b : tensor<2x?Tx24xf32>
  %1 = gelu_tanh %0 : tensor<2x?Tx24xf32>
  %2 = cast %1 {to = bf16} : tensor<2x?Tx24xbf16>
  return %2
})");
  EwCall call;
  call.rows = 2 * 5, call.n = 24;
  call.params = {contiguous(DType::f32, 10, 24, 8), make_tensor(DType::bf16, 1, 24, 0, 1, 9)};
  call.results = {result(DType::bf16, 10, 24)};
  EXPECT_TRUE(run_elementwise(f, call));
}

TEST(LlvmElementwise, StaticRowsIgnoreArgsRows) {
  const ir::Function f = ir::parse(R"(
func @fixed(%x: tensor<5x20xf32>) -> (tensor<5x20xf32>) {
  %0 = add %x, %x : tensor<5x20xf32>
  return %0
})");
  EwCall call;
  call.rows = 5, call.n = 20, call.args_rows = 0;
  call.params = {contiguous(DType::f32, 5, 20, 10)};
  call.results = {result(DType::f32, 5, 20)};
  EXPECT_TRUE(run_elementwise(f, call));
}

TEST(LlvmElementwise, ScalarAndVectorOnlyChains) {
  const ir::Function s = ir::parse(R"(
func @scalar(%x: tensor<f32>) -> (tensor<f32>) {
  %0 = silu %x : tensor<f32>
  return %0
})");
  EwCall call;
  call.rows = 1, call.n = 1;
  call.params = {contiguous(DType::f32, 1, 1, 11)};
  call.results = {result(DType::f32, 1, 1)};
  EXPECT_TRUE(run_elementwise(s, call));

  const ir::Function v = ir::parse(R"(
func @vec(%x: tensor<33xbf16>) -> (tensor<33xf32>) {
  %0 = cast %x {to = f32} : tensor<33xf32>
  %1 = gelu_tanh %0 : tensor<33xf32>
  return %1
})");
  EwCall vc;
  vc.rows = 1, vc.n = 33, vc.args_rows = 7;  // rank 1: one row whatever args.rows says
  vc.params = {contiguous(DType::bf16, 1, 33, 12)};
  vc.results = {result(DType::f32, 1, 33)};
  EXPECT_TRUE(run_elementwise(v, vc));
}

TEST(LlvmElementwise, CastsFromEveryReadableDtypeAndParamCopies) {
  const ir::Function f = ir::parse(R"(
func @casts(%a: tensor<?Mx40xi8>, %b: tensor<?Mx40xu8>, %c: tensor<?Mx40xi32>, %d: tensor<?Mx40xf8e4m3>, %e: tensor<?Mx40xf16>) -> (tensor<?Mx40xf32>, tensor<?Mx40xbf16>, tensor<?Mx40xf32>, tensor<?Mx40xf32>, tensor<?Mx40xbf16>, tensor<?Mx40xi8>, tensor<?Mx40xf16>) {
  %0 = cast %a {to = f32} : tensor<?Mx40xf32>
  %1 = cast %b {to = bf16} : tensor<?Mx40xbf16>
  %2 = cast %c {to = f32} : tensor<?Mx40xf32>
  %3 = cast %d {to = f32} : tensor<?Mx40xf32>
  %4 = cast %e {to = bf16} : tensor<?Mx40xbf16>
  return %0, %1, %2, %3, %4, %a, %e
})");
  EwCall call;
  call.rows = 2, call.n = 40;
  call.params = {contiguous(DType::i8, 2, 40, 13), contiguous(DType::u8, 2, 40, 14),
                 contiguous(DType::i32, 2, 40, 15), contiguous(DType::f8e4m3, 2, 40, 16),
                 contiguous(DType::f16, 2, 40, 17, -70000, 70000)};
  call.results = {result(DType::f32, 2, 40), result(DType::bf16, 2, 40), result(DType::f32, 2, 40),
                  result(DType::f32, 2, 40), result(DType::bf16, 2, 40), result(DType::i8, 2, 40),
                  result(DType::f16, 2, 40)};
  EXPECT_TRUE(run_elementwise(f, call));
}

TEST(LlvmElementwise, InPlaceResultOverItsInput) {
  const ir::Function f = ir::parse(R"(
func @inplace(%x: tensor<?Mx50xf32>, %b: tensor<50xf32>) -> (tensor<?Mx50xf32>) {
  %0 = add %x, %b : tensor<?Mx50xf32>
  %1 = gelu_erf %0 : tensor<?Mx50xf32>
  return %1
})");
  const lb::LlvmKernel k = lb::compile_llvm_elementwise(f);
  Tensor x = contiguous(DType::f32, 3, 50, 18);
  const Tensor b = make_tensor(DType::f32, 1, 50, 0, 1, 19);
  const Tensor x0 = x;
  const void* params[] = {x.bytes.data(), b.bytes.data()};
  void* results[] = {x.bytes.data()};
  lb::ElementwiseArgs args{params, results, 3, nullptr, nullptr};
  k.fn<lb::ElementwiseFn>()(&args);
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t c = 0; c < 50; ++c) {
      const double pre = decode(DType::f32, x0.at(r, c)) + decode(DType::f32, b.at(0, c));
      const double want = runtime::reference_activation(Activation::gelu_erf, pre);
      EXPECT_NEAR(decode(DType::f32, x.at(r, c)), want, 5e-6 * std::max(1.0, std::fabs(pre)));
    }
}

// The conversions, exhaustively or at their edges, bit for bit against the
// host compiler's (_Float16) and runtime/bf16.h.
TEST(LlvmElementwiseConversions, F16ToF32AllBitPatterns) {
  const ir::Function f = ir::parse(R"(
func @h2f(%x: tensor<?Mx256xf16>) -> (tensor<?Mx256xf32>) {
  %0 = cast %x {to = f32} : tensor<?Mx256xf32>
  return %0
})");
  const lb::LlvmKernel k = lb::compile_llvm_elementwise(f);
  std::vector<uint16_t> in(65536);
  for (uint32_t i = 0; i < 65536; ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> out(65536);
  const void* params[] = {in.data()};
  void* results[] = {out.data()};
  lb::ElementwiseArgs args{params, results, 256, nullptr, nullptr};
  k.fn<lb::ElementwiseFn>()(&args);
  int bad = 0;
  for (uint32_t i = 0; i < 65536; ++i) {
    _Float16 h;
    std::memcpy(&h, &in[i], 2);
    const float want = static_cast<float>(h);
    const bool ok = std::isnan(want) ? std::isnan(out[i]) : std::memcmp(&want, &out[i], 4) == 0;
    if (!ok && bad++ < 5)
      ADD_FAILURE() << "f16 0x" << std::hex << i << " -> " << out[i] << ", want " << want;
  }
  EXPECT_EQ(bad, 0);
}

TEST(LlvmElementwiseConversions, F32ToF16AndBf16RoundToNearestEven) {
  const ir::Function f = ir::parse(R"(
func @f2h(%x: tensor<?Mx64xf32>) -> (tensor<?Mx64xf16>, tensor<?Mx64xbf16>) {
  %0 = cast %x {to = f16} : tensor<?Mx64xf16>
  %1 = cast %x {to = bf16} : tensor<?Mx64xbf16>
  return %0, %1
})");
  const lb::LlvmKernel k = lb::compile_llvm_elementwise(f);
  std::vector<float> in;
  // Edges: zeros, f16 subnormals and their ties, the normal boundary, ties
  // between f16 / bf16 neighbours, the largest f16 and just above (rounding
  // to inf or not), inf, NaN; then random values over f16's range.
  for (float v : {0.0f,           -0.0f,          0x1p-24f, 0x1p-25f,        0x1.8p-25f,
                  0x1p-26f,       0x1.ffcp-15f,   0x1p-14f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
                  1.0f + 0x1p-8f, 1.0f + 0x3p-8f, 65504.0f, 65519.0f,        65520.0f,
                  1e6f,           3.4e38f,        INFINITY, -INFINITY,       NAN,
                  -0x1p-24f,      2049.0f,        2051.0f})
    in.push_back(v);
  std::mt19937 rng(20);
  while (in.size() % 64 != 0 || in.size() < 64 * 64) {
    const uint32_t bits = (rng() & 0x8fffffffu) | ((100u + rng() % 60u) << 23);  // ~2^-27 .. 2^32
    float v;
    std::memcpy(&v, &bits, 4);
    in.push_back(v);
  }
  const int64_t rows = int64_t(in.size()) / 64;
  std::vector<uint16_t> h(in.size()), b(in.size());
  const void* params[] = {in.data()};
  void* results[] = {h.data(), b.data()};
  lb::ElementwiseArgs args{params, results, rows, nullptr, nullptr};
  k.fn<lb::ElementwiseFn>()(&args);
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const _Float16 want_h = static_cast<_Float16>(in[i]);
    uint16_t wh;
    std::memcpy(&wh, &want_h, 2);
    const uint16_t wb = f32_to_bf16(in[i]);
    const bool nan = std::isnan(in[i]);
    const bool ok_h = nan ? (h[i] & 0x7c00) == 0x7c00 && (h[i] & 0x3ff) != 0 : h[i] == wh;
    const bool ok_b = nan ? (b[i] & 0x7f80) == 0x7f80 && (b[i] & 0x7f) != 0 : b[i] == wb;
    if ((!ok_h || !ok_b) && bad++ < 5)
      ADD_FAILURE() << in[i] << ": f16 0x" << std::hex << h[i] << " want 0x" << wh << ", bf16 0x"
                    << b[i] << " want 0x" << wb;
  }
  EXPECT_EQ(bad, 0);
}

TEST(LlvmElementwiseConversions, Fp8E4m3AllBitPatterns) {
  const ir::Function f = ir::parse(R"(
func @f8(%x: tensor<?Mx16xf8e4m3>) -> (tensor<?Mx16xf32>) {
  %0 = cast %x {to = f32} : tensor<?Mx16xf32>
  return %0
})");
  const lb::LlvmKernel k = lb::compile_llvm_elementwise(f);
  std::vector<uint8_t> in(256);
  for (int i = 0; i < 256; ++i) in[size_t(i)] = static_cast<uint8_t>(i);
  std::vector<float> out(256);
  const void* params[] = {in.data()};
  void* results[] = {out.data()};
  lb::ElementwiseArgs args{params, results, 16, nullptr, nullptr};
  k.fn<lb::ElementwiseFn>()(&args);
  for (int i = 0; i < 256; ++i) {
    const double want = decode(DType::f8e4m3, &in[size_t(i)]);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(out[size_t(i)])) << i;
    else
      EXPECT_EQ(out[size_t(i)], want) << "fp8 0x" << std::hex << i;
  }
}

// ---------------------------------------------------------------------------
// What the elementwise compiler refuses, and how it says so.

void expect_ew_error(const std::string& text, const std::string& needle) {
  const ir::Function f = ir::parse(text);
  try {
    lb::compile_llvm_elementwise(f);
    ADD_FAILURE() << "no error; expected one mentioning: " << needle;
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(needle));
  }
}

TEST(LlvmElementwiseErrors, UnsupportedProgramsRaiseErrorNamingTheProblem) {
  expect_ew_error(R"(
func @g(%x: tensor<?Mx64xbf16>, %w: tensor<32x64xbf16, packed<vnni2, n_block=64, k_pair=2>>) -> (tensor<?Mx32xf32>) {
  %0 = gemm %x, %w : tensor<?Mx32xf32>
  %1 = relu %0 : tensor<?Mx32xf32>
  return %1
})",
                  "%0 = gemm is not elementwise");
  expect_ew_error(R"(
func @symn(%x: tensor<?Mx?Nxf32>) -> (tensor<?Mx?Nxf32>) {
  %0 = relu %x : tensor<?Mx?Nxf32>
  return %0
})",
                  "N must be static");
  expect_ew_error(R"(
func @two(%a: tensor<4x8xf32>, %b: tensor<3x8x8xf32>) -> (tensor<4x8xf32>, tensor<3x8x8xf32>) {
  %0 = relu %a : tensor<4x8xf32>
  %1 = relu %b : tensor<3x8x8xf32>
  return %0, %1
})",
                  "%a has shape [4, 8]");
  expect_ew_error(R"(
func @u4(%q: tensor<?Mx16xu4>, %y: tensor<?Mx16xf32>) -> (tensor<?Mx16xf32>, tensor<?Mx16xu4>) {
  %0 = relu %y : tensor<?Mx16xf32>
  return %0, %q
})",
                  "%q has dtype u4");
  expect_ew_error(R"(
func @nc(%x: tensor<2x?Tx8xf32, strided<[100, 8, 1]>>) -> (tensor<2x?Tx8xf32>) {
  %0 = relu %x : tensor<2x?Tx8xf32>
  return %0
})",
                  "do not collapse into rows");
}

TEST(LlvmElementwiseErrors, UnverifiableFunctionRaisesTheVerifierError) {
  ir::Function f = ir::parse(R"(
func @bad(%x: tensor<?Mx8xbf16>) -> (tensor<?Mx8xf32>) {
  %0 = relu %x : tensor<?Mx8xf32>
  return %0
})");  // relu of bf16: parses, fails verify (activations take f32)
  try {
    lb::compile_llvm_elementwise(f);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("relu"));
  }
}

// ===========================================================================
// Measurements for docs/llvm-backend.md (not run by default: they time the
// machine). ./llvm_backend_test --gtest_also_run_disabled_tests --gtest_filter=*Measure*

double thread_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) * 1e3 + double(t.tv_nsec) / 1e6;
}

double best_gflops(BrgemmFn fn, const BrgemmData& d) {
  const BrgemmCase& c = d.c;
  const double flop = 2.0 * c.mr * c.nr * c.kb * c.batch;
  std::vector<float> out(size_t(c.mr * d.ldc));
  BrgemmArgs args{};
  args.a = d.a_list.data();
  args.b = d.b_list.data();
  args.batch = c.batch;
  args.lda = d.lda * 2;
  args.c = out.data();
  args.ldc = d.ldc * 4;
  const int iters = static_cast<int>(2e7 / flop) + 1;
  double best = 0;
  for (int t = 0; t < 20; ++t) {  // best of 20: the machine is shared
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) fn(&args);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flop * iters / s / 1e9);
  }
  return best;
}

TEST(LlvmBackendMeasure, DISABLED_CompileTimeAndThroughput) {
  lb::host_target();
  lb::compile_llvm_brgemm(BrgemmDesc{});  // first-use costs (target init, JIT) out of the way
  struct Row {
    int mr, nr;
    int64_t kb;
    Activation act;
  };
  for (const Row& r : {Row{7, 64, 4096, Activation::none}, Row{4, 64, 4096, Activation::none},
                       Row{1, 64, 4096, Activation::none}, Row{7, 64, 256, Activation::gelu_tanh},
                       Row{2, 17, 4096, Activation::silu}, Row{32, 64, 1024, Activation::none}}) {
    BrgemmCase c = llvm_case(r.mr, r.nr, r.kb);
    c.act = r.act;
    const BrgemmData d = make_brgemm_data(c);
    std::string line = c.str() + ":";
    for (auto [dot, opt, label] :
         {std::tuple{lb::BrgemmDot::best, lb::OptLevel::kernel, "best/kernel"},
          std::tuple{lb::BrgemmDot::fma, lb::OptLevel::kernel, "fma/kernel"},
          std::tuple{lb::BrgemmDot::best, lb::OptLevel::O2, "best/O2"},
          std::tuple{lb::BrgemmDot::best, lb::OptLevel::O3, "best/O3"}}) {
      double wall = 1e9, cpu = 1e9;
      lb::LlvmKernel k;
      for (int i = 0; i < 5; ++i) {
        const double c0 = thread_cpu_ms();
        k = lb::compile_llvm_brgemm(c.desc(), {.dot = dot, .opt = opt});
        cpu = std::min(cpu, thread_cpu_ms() - c0);
        wall = std::min(wall, k.compile_us / 1e3);
      }
      char buf[160];
      std::snprintf(buf, sizeof buf,
                    "\n  llvm %-11s compile %5.1f ms (cpu %5.1f ms)  %6.1f GFLOP/s", label, wall,
                    cpu, best_gflops(k.fn<BrgemmFn>(), d));
      line += buf;
    }
    if (xbyak_takes(c) && cpu_info().avx512_bf16) {
      BrgemmDesc xd = c.desc();
      xd.isa = Isa::avx512;
      const std::vector<uint8_t> code = codegen::xbyak::emit_avx512_brgemm(xd);
      const runtime::ExecutableMemory mem(code.data(), code.size());
      char buf[96];
      std::snprintf(buf, sizeof buf, "\n  xbyak avx512             %6.1f GFLOP/s",
                    best_gflops(reinterpret_cast<BrgemmFn>(const_cast<void*>(mem.data())), d));
      line += buf;
    }
    std::printf("%s\n", line.c_str());
  }
  // An elementwise chain: compile time and GB/s over a [256 × 4096] bf16 tensor.
  const ir::Function f = ir::parse(R"(
func @bias_silu(%x: tensor<?Mx4096xbf16>, %b: tensor<4096xf32>) -> (tensor<?Mx4096xbf16>) {
  %0 = add %x, %b : tensor<?Mx4096xf32>
  %1 = silu %0 : tensor<?Mx4096xf32>
  %2 = cast %1 {to = bf16} : tensor<?Mx4096xbf16>
  return %2
})");
  double wall = 1e9, cpu = 1e9;
  lb::LlvmKernel k;
  for (int i = 0; i < 5; ++i) {
    const double c0 = thread_cpu_ms();
    k = lb::compile_llvm_elementwise(f);
    cpu = std::min(cpu, thread_cpu_ms() - c0);
    wall = std::min(wall, k.compile_us / 1e3);
  }
  const Tensor x = contiguous(DType::bf16, 256, 4096, 1);
  const Tensor b = make_tensor(DType::f32, 1, 4096, 0, 1, 2);
  Tensor y = result(DType::bf16, 256, 4096);
  const void* params[] = {x.bytes.data(), b.bytes.data()};
  void* results[] = {y.bytes.data()};
  lb::ElementwiseArgs args{params, results, 256, nullptr, nullptr};
  double best = 0;
  for (int t = 0; t < 20; ++t) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 10; ++i) k.fn<lb::ElementwiseFn>()(&args);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, 10 * 256 * 4096 * 4.0 / s / 1e9);  // bf16 in + bf16 out
  }
  std::printf(
      "elementwise bias_silu 256x4096 bf16: compile %.1f ms (cpu %.1f ms), %.1f GB/s, %.2f "
      "Gelem/s\n",
      wall, cpu, best, best / 4);
}

// ===========================================================================
// Memory exhaustion: LLVM cannot fail an allocation and go on (it aborts, or
// unwinds through frames without cleanups), so a compile must not start
// without room for it. In children with the address space limited to what
// they use plus 0..96 MiB, the first MLA decode call (the largest LLVM
// compile) either runs or is an Error "out of memory"; never a signal. The
// same child then runs the call with the limit lifted, so the refused
// attempt left nothing behind. Before the headroom check the sweep ended by
// SIGSEGV at +12 MiB (the tool's own sweep: "LLVM ERROR: out of memory").
int run_mla_decode_once() {
  std::vector<uint16_t> out;
  try {
    out = mla_decode(/*hq=*/16, /*block=*/13, /*blocks=*/4, /*len=*/40, /*seed=*/1);
  } catch (const Error& e) {
    return std::string(e.what()).find("out of memory") != std::string::npos ? 2 : 3;
  } catch (...) {
    return 4;
  }
  for (uint16_t v : out)
    if (!std::isfinite(bf16_to_f32(v))) return 5;
  return 0;
}

TEST(LlvmOutOfMemory, ACompileWithoutRoomIsAnErrorNotAnAbort) {
  if (kUnderAsan || kUnderTsan)
    GTEST_SKIP() << "an address-space limit starves the sanitizer's own shadow and fake stacks";
  std::set<int> outcomes;
  for (int mib = 0; mib <= 96; mib += 8) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(120);
      jit::KernelCache::global().set_disk_dir("");  // compile, never load
      long pages = 0;
      if (FILE* f = std::fopen("/proc/self/statm", "r")) {
        if (std::fscanf(f, "%ld", &pages) != 1) pages = 0;
        std::fclose(f);
      }
      rlimit lim{};
      ::getrlimit(RLIMIT_AS, &lim);
      const rlim_t hard = lim.rlim_max;
      lim.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                     (static_cast<rlim_t>(mib) << 20);
      if (pages == 0 || ::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(10);
      const int limited = run_mla_decode_once();
      lim.rlim_cur = hard;
      if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(11);
      const int lifted = run_mla_decode_once();
      ::_exit(limited == 2 && lifted == 0 ? 2 : limited != 0 ? 20 + limited : lifted);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status))
        << "+" << mib << " MiB: the child ended by signal " << WTERMSIG(status);
    const int code = WEXITSTATUS(status);
    EXPECT_TRUE(code == 0 || code == 2) << "+" << mib << " MiB: exit " << code;
    outcomes.insert(code);
  }
  // Else the sweep proves nothing: some limit must refuse, a larger one run.
  EXPECT_TRUE(outcomes.count(0) && outcomes.count(2));
}

}  // namespace
}  // namespace tilejit::test
