// A refused AMX permission request gives the next path, one clear log line
// and right answers, never a crash. Linux refuses ARCH_REQ_XCOMP_PERM with
// ENOSPC while any thread of the process has a sigaltstack smaller than the
// AMX signal frame, so a tiny sigaltstack installed before tilejit's first
// call forces the refusal on a machine that has AMX. Own process: the
// request is made once per process.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdint>
#include <string>
#include <vector>

#include "test_util.h"
#include "tilejit/tilejit.h"

namespace tilejit::test {
namespace {

bool cpu_has_amx_tile() {
  uint32_t a, b, c, d;
  __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
  return (d >> 24) & 1u;
}

TEST(AmxPermission, RefusedRequestFallsBackToTheNextPathWithOneLogLine) {
  if (!cpu_has_amx_tile()) GTEST_SKIP() << "the CPU has no AMX: nothing to refuse";
  // 4 KiB: the classic minimum for plain signals, far below the ~11 KiB an
  // AMX signal frame needs (glibc's MINSIGSTKSZ is now sysconf-sized, too big).
  static std::vector<char> stack(4096);
  stack_t ss{};
  ss.ss_sp = stack.data();
  ss.ss_size = stack.size();
  ASSERT_EQ(sigaltstack(&ss, nullptr), 0);

  ::testing::internal::CaptureStderr();
  const CpuInfo ci = cpu_info();
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(ci.amx_tile);
  EXPECT_FALSE(ci.amx_permitted);
  EXPECT_NE(ci.max_isa, Isa::amx);
  EXPECT_NE(ci.isa, Isa::amx);
  EXPECT_NE(log.find("AMX permission refused"), std::string::npos) << log;
  EXPECT_NE(log.find("sigaltstack"), std::string::npos) << log;
  // The next path computes the right answer (M = 40 would be AMX tiles).
  GemmProblem p = random_problem(40, 100, 77, Activation::silu, Bias::f32, DType::bf16);
  EXPECT_TRUE(run_and_compare(p));
  ss.ss_flags = SS_DISABLE;
  sigaltstack(&ss, nullptr);
}

}  // namespace
}  // namespace tilejit::test
