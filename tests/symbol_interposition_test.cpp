// A host process may carry its own copy of a function that tilejit
// instantiates from a dependency's header: an engine linking another LLVM
// defines llvm::IRBuilderBase::CreateFSub too. This executable is such a
// host: it defines that function (LLVM 19's mangled name, which the decode
// emitter's softmax calls) as a trap. The library must bind its own copy
// (cmake/tilejit.map); when it exported the symbol, the dynamic linker bound
// the host's, and a real host's LLVM 14 copy crashed the first decode call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "jit/kernel_cache.h"
#include "test_util.h"

extern "C" [[noreturn]] void host_create_fsub() __asm__(
    "_ZN4llvm13IRBuilderBase10CreateFSubEPNS_5ValueES2_RKNS_5TwineEPNS_6MDNodeE");
extern "C" void host_create_fsub() {
  std::fputs("the library called the host's llvm::IRBuilderBase::CreateFSub\n", stderr);
  std::_Exit(3);
}

namespace tilejit::test {
namespace {

TEST(SymbolInterposition, TheHostsCopyOfAnLlvmFunctionIsNotCalled) {
  jit::KernelCache::global().set_disk_dir("");  // compile: the emitter must run
  constexpr int64_t kHq = 8, kHkv = 2, kD = 64, kBlock = 16, kBlocks = 2, kLen = 20;
  const std::vector<uint16_t> q = random_bf16(kHq * kD, 1);
  const std::vector<uint16_t> k = random_bf16(kBlocks * kBlock * kHkv * kD, 2);
  const std::vector<uint16_t> v = random_bf16(kBlocks * kBlock * kHkv * kD, 3);
  std::vector<uint16_t> out(kHq * kD, 0);
  const std::vector<int32_t> table = {1, 0};
  const std::vector<int32_t> lens = {kLen};
  decode_attention(TensorView(q.data(), DType::bf16, {1, kHq, kD}),
                   TensorView(k.data(), DType::bf16, {kBlocks, kBlock, kHkv, kD}),
                   TensorView(v.data(), DType::bf16, {kBlocks, kBlock, kHkv, kD}),
                   TensorView(out.data(), DType::bf16, {1, kHq, kD}),
                   TensorView(table.data(), DType::i32, {1, kBlocks}),
                   TensorView(lens.data(), DType::i32, {1}));
  for (uint16_t o : out) ASSERT_TRUE(std::isfinite(bf16_to_f32(o)));
  EXPECT_GT(jit::KernelCache::global().stats().compiles, 0);
}

}  // namespace
}  // namespace tilejit::test
