// The on-disk kernel cache: round trip, a new process loads instead of
// compiling, corrupted / truncated / foreign entries are recompiled, an
// unusable directory degrades to memory-only, and several processes may fill
// one directory at once.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "jit/disk_cache.h"
#include "jit/kernel_cache.h"
#include "runtime/bf16.h"
#include "runtime/isa.h"
#include "tilejit/tilejit.h"

namespace fs = std::filesystem;
using namespace tilejit;

namespace {

std::string fresh_dir(const std::string& tag) {
  const fs::path p =
      fs::temp_directory_path() / ("tilejit-disk-" + tag + "-" + std::to_string(::getpid()) + "-" +
                                   std::to_string(std::random_device{}()));
  fs::remove_all(p);
  return p.string();
}

std::vector<uint8_t> bytes(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

// A small gemm on a shape no other test uses; returns y[0] bits.
uint16_t run_gemm(int64_t n, int64_t k) {
  std::vector<uint16_t> w(n * k), x(3 * k), y(3 * n);
  for (size_t i = 0; i < w.size(); ++i) w[i] = runtime::f32_to_bf16(float(i % 7) - 3);
  for (size_t i = 0; i < x.size(); ++i) x[i] = runtime::f32_to_bf16(float(i % 5) - 2);
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {n, k}));
  gemm(TensorView(x.data(), DType::bf16, {3, k}), pw, TensorView(y.data(), DType::bf16, {3, n}));
  return y[0];
}

bool jit_path() {
  return runtime::active_isa() != Isa::scalar;
}

}  // namespace

TEST(DiskCache, RoundTrip) {
  jit::DiskCache c(fresh_dir("rt"));
  ASSERT_TRUE(c.enabled());
  EXPECT_FALSE(c.load("k1").has_value());
  c.store("k1", bytes(1000, 3));
  auto got = c.load("k1");
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, bytes(1000, 3));
  EXPECT_FALSE(c.load("k2").has_value());
  EXPECT_EQ(c.stores(), 1u);
  EXPECT_EQ(c.loads(), 1u);
  fs::remove_all(c.dir());
}

TEST(DiskCache, QualifiedKeyCarriesCpuAndBuild) {
  const std::string q = jit::DiskCache::qualified_key("gemm;x");
  EXPECT_NE(q.find("cpu="), std::string::npos);
  EXPECT_NE(q.find("build="), std::string::npos);
}

TEST(DiskCache, CorruptedAndTruncatedEntriesAreRejected) {
  jit::DiskCache c(fresh_dir("bad"));
  c.store("k", bytes(4096, 1));
  const std::string path = c.path_for("k");
  {  // flip one payload byte
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  EXPECT_FALSE(c.load("k").has_value());
  EXPECT_FALSE(fs::exists(path)) << "a corrupted entry is removed";
  c.store("k", bytes(4096, 1));
  fs::resize_file(path, fs::file_size(path) / 2);  // truncated by a crash
  EXPECT_FALSE(c.load("k").has_value());
  std::ofstream(path, std::ios::binary) << "garbage";  // not an entry at all
  EXPECT_FALSE(c.load("k").has_value());
  EXPECT_EQ(c.rejected(), 3u);
  c.store("k", bytes(4096, 1));  // and the entry is written again
  EXPECT_TRUE(c.load("k").has_value());
  fs::remove_all(c.dir());
}

TEST(DiskCache, UnusableDirectoryDegradesToMemory) {
  // A path below a regular file can never be a directory (even for root).
  const std::string file = fresh_dir("file");
  std::ofstream(file) << "x";
  jit::DiskCache c(file + "/sub");
  EXPECT_FALSE(c.enabled());
  c.store("k", bytes(10, 1));  // no throw, no file
  EXPECT_FALSE(c.load("k").has_value());
  fs::remove(file);
}

TEST(DiskCache, ANewProcessLoadsInsteadOfCompiling) {
  if (!jit_path()) GTEST_SKIP() << "ISA path unavailable: the scalar path compiles nothing";
  const std::string dir = fresh_dir("proc");
  jit::KernelCache::global().set_disk_dir(dir);
  // The child fills the directory; the parent's in-memory cache stays cold.
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const uint16_t v = run_gemm(77, 45);
    _exit(jit::KernelCache::global().stats().disk_stores > 0 && v != 0 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  const CacheStats before = cache_stats();
  const uint16_t v = run_gemm(77, 45);
  const CacheStats after = cache_stats();
  EXPECT_NE(v, 0);
  EXPECT_EQ(after.compiles, before.compiles) << "the parent must load, not compile";
  EXPECT_GT(after.disk_loads, before.disk_loads);
  jit::KernelCache::global().set_disk_dir("");
  fs::remove_all(dir);
}

TEST(DiskCache, ManyProcessesFillOneDirectory) {
  if (!jit_path()) GTEST_SKIP() << "ISA path unavailable: the scalar path compiles nothing";
  const std::string dir = fresh_dir("many");
  jit::KernelCache::global().set_disk_dir(dir);
  std::vector<pid_t> kids;
  for (int i = 0; i < 6; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Same shapes in every process: they race on the same entries.
      uint16_t acc = 0;
      for (int64_t n : {33, 64, 100}) acc ^= run_gemm(n, 70);
      _exit(acc == 0xffff ? 2 : 0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  // Every entry left behind is whole; no temporary file remains.
  jit::DiskCache check(dir);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    EXPECT_EQ(e.path().extension(), ".tjk") << e.path();
    ++entries;
  }
  EXPECT_GT(entries, 0);
  const CacheStats before = cache_stats();
  for (int64_t n : {33, 64, 100}) run_gemm(n, 70);
  EXPECT_EQ(cache_stats().compiles, before.compiles);
  jit::KernelCache::global().set_disk_dir("");
  fs::remove_all(dir);
}
