// The C++ ABI of this version: the public structs' sizes. Before 1.0 the
// SONAME carries the minor version (libtilejit.so.0.MINOR, CMakeLists.txt),
// so a struct may change only with a minor bump; then this table is written
// again for the new version. Without it, 0.1's CacheStats grew by a field
// under the same SONAME and a binary built against 0.1 wrote past its own
// struct when it called the new cache_stats() (an outside tester's find).
#include <gtest/gtest.h>

#include <cstddef>
#include <string>

#include "tilejit/tilejit.h"

#ifndef TILEJIT_PROJECT_VERSION
#error "tests/CMakeLists.txt defines TILEJIT_PROJECT_VERSION"
#endif

namespace tilejit {
namespace {

struct Size {
  const char* name;
  size_t now, in_version;
};

TEST(Abi, PublicStructsMatchThisVersionsTable) {
  const std::string version = TILEJIT_PROJECT_VERSION;
  ASSERT_EQ(version.rfind("0.2.", 0), 0u)
      << "version " << version << ": write this table for it (and keep the SONAME rule)";
  const Size sizes[] = {
      {"TensorView", sizeof(TensorView), 64},
      {"Int8Weight", sizeof(Int8Weight), 128},
      {"Fp8Weight", sizeof(Fp8Weight), 144},
      {"Int4Weight", sizeof(Int4Weight), 320},
      {"AutoRoundConfig", sizeof(AutoRoundConfig), 56},
      {"Mxfp4Weight", sizeof(Mxfp4Weight), 136},
      {"PackedWeight", sizeof(PackedWeight), 16},
      {"GemmOptions", sizeof(GemmOptions), 96},
      {"KvCacheScales", sizeof(KvCacheScales), 152},
      {"AttentionOptions", sizeof(AttentionOptions), 320},
      {"DecodeOptions", sizeof(DecodeOptions), 1},
      {"ExtendOptions", sizeof(ExtendOptions), 224},
      {"RopeOptions", sizeof(RopeOptions), 56},
      {"PackedExperts", sizeof(PackedExperts), 16},
      {"MoeOptions", sizeof(MoeOptions), 280},
      {"GroupedTopkOptions", sizeof(GroupedTopkOptions), 96},
      {"NormOptions", sizeof(NormOptions), 8},             // 0.2.3
      {"GluOptions", sizeof(GluOptions), 20},              // 0.2.3
      {"GatedNormOptions", sizeof(GatedNormOptions), 16},  // 0.2.4
      {"CpuInfo", sizeof(CpuInfo), 64},
      {"CacheStats", sizeof(CacheStats), 104},
      {"Error", sizeof(Error), 40},
  };
  for (const Size& s : sizes)
    EXPECT_EQ(s.now, s.in_version)
        << s.name << " changed size in " << version
        << ": a C++ ABI change needs the next minor version (CMakeLists.txt), and this table "
           "written again for it";
}

}  // namespace
}  // namespace tilejit
