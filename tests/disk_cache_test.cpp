// The on-disk kernel cache: round trip, a new process loads instead of
// compiling, corrupted / truncated / foreign entries are recompiled, an
// unusable directory degrades to memory-only, and several processes may fill
// one directory at once. Hostile directories: a symlink to /dev/zero, a FIFO,
// a device node, a directory, an oversized or forged entry in an entry's
// place are refused without reading or blocking; a failed store loses only
// that entry; and runs stay correct while a vandal corrupts the directory.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <optional>
#include <random>
#include <thread>
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

// A relative directory names the directory it names when it is set: an
// embedding process that changes its working directory afterwards kept
// storing into `<new cwd>/<dir>`, which did not exist (every store failed).
TEST(DiskCache, ARelativeDirectoryStaysWhereItWasWhenSet) {
  const fs::path base = fresh_dir("rel");
  fs::create_directories(base / "elsewhere");
  const fs::path old_cwd = fs::current_path();
  fs::current_path(base);
  jit::DiskCache c("kc");
  fs::current_path(base / "elsewhere");
  c.store("k1", bytes(100, 5));
  fs::current_path(old_cwd);
  EXPECT_EQ(c.stores(), 1u);
  EXPECT_EQ(fs::path(c.dir()), base / "kc");
  EXPECT_TRUE(fs::is_directory(base / "kc"));
  EXPECT_FALSE(fs::exists(base / "elsewhere" / "kc"));
  ASSERT_TRUE(c.load("k1").has_value());
  EXPECT_EQ(*c.load("k1"), bytes(100, 5));
  fs::remove_all(base);
}

// Under a file size limit (RLIMIT_FSIZE) an entry that would pass it is not
// written: writing it raised SIGXFSZ, which ended the process (exit 153). In
// a child: the limit is its own.
TEST(DiskCache, AnEntryPastTheFileSizeLimitIsSkippedNotFatal) {
  const std::string dir = fresh_dir("fsize");
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(60);
    jit::DiskCache c(dir);
    rlimit lim{};
    ::getrlimit(RLIMIT_FSIZE, &lim);
    lim.rlim_cur = 1024;
    if (::setrlimit(RLIMIT_FSIZE, &lim) != 0) ::_exit(10);
    c.store("big", bytes(4000, 1));  // past the limit: skipped
    c.store("small", bytes(100, 2));
    const bool ok = c.stores() == 1 && c.store_failures() == 1 && !c.load("big").has_value() &&
                    c.load("small") == bytes(100, 2);
    ::_exit(ok ? 0 : 11);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  fs::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status)) << "the child ended by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(DiskCache, QualifiedKeyCarriesCpuAndBuild) {
  const std::string q = jit::DiskCache::qualified_key("gemm;x");
  EXPECT_NE(q.find("cpu="), std::string::npos);
  EXPECT_NE(q.find("build="), std::string::npos);
  // The linked library's GNU build-id (40 hex digits of sha1): a rebuild
  // with other code never loads this build's kernels, even at the same git
  // hash (a build directory configured before a `git pull`).
  EXPECT_THAT(q, ::testing::MatchesRegex(".*\\|build=.*\\+[0-9a-f]{16,}$")) << q;
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
  ::testing::internal::CaptureStderr();
  jit::DiskCache c(file + "/sub");
  // The warning says why (it said "cannot create the directory" for a path
  // that exists as a file too).
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              ::testing::HasSubstr("(cannot create the directory: Not a directory)"));
  EXPECT_FALSE(c.enabled());
  c.store("k", bytes(10, 1));  // no throw, no file
  EXPECT_FALSE(c.load("k").has_value());
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(jit::DiskCache(file).enabled());
  EXPECT_THAT(::testing::internal::GetCapturedStderr(),
              ::testing::HasSubstr("(it exists and is not a directory)"));
  fs::remove(file);
}

// An existing directory the process cannot write: one warning (it was silent
// without TILEJIT_VERBOSE while every store failed), and loads still work.
// In a child that is not root (root writes anywhere): nobody when run as root.
TEST(DiskCache, AReadOnlyDirectoryIsSaidAndServesLoads) {
  const std::string dir = fresh_dir("ro");
  {
    jit::DiskCache w(dir, 0);
    w.store("k", bytes(10, 1));
  }
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  char log_path[] = "/tmp/tilejit-ro-log-XXXXXX";
  const int log_fd = ::mkstemp(log_path);
  ASSERT_GE(log_fd, 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) _exit(20);
    if (::dup2(log_fd, 2) < 0) _exit(21);
    jit::DiskCache c(dir, 0);
    if (!c.enabled()) _exit(22);
    if (!c.load("k").has_value()) _exit(23);
    c.store("k2", bytes(10, 2));
    _exit(c.store_failures() == 1 ? 0 : 24);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ::close(log_fd);
  std::ifstream in(log_path);
  const std::string log((std::istreambuf_iterator<char>(in)), {});
  ::unlink(log_path);
  ::chmod(dir.c_str(), 0755);
  fs::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(log, ::testing::HasSubstr("is not writable"));
  EXPECT_THAT(log, ::testing::HasSubstr("kernels are loaded from it but new ones are not stored"));
}

// A temporary entry whose writer died before its rename is removed when the
// directory is next opened; a running writer's is not (they stayed forever).
TEST(DiskCache, OrphanedTemporaryFilesOfDeadWritersAreRemoved) {
  const std::string dir = fresh_dir("orphans");
  fs::create_directories(dir);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);  // reaped: its pid names no process
  const std::string dead = dir + "/0123456789abcdef.tjk.tmp." + std::to_string(child) + ".7";
  const std::string live = dir + "/0123456789abcdef.tjk.tmp." + std::to_string(::getpid()) + ".8";
  const std::string other = dir + "/notes.txt";
  for (const std::string& f : {dead, live, other}) std::ofstream(f) << "x";
  jit::DiskCache c(dir);
  EXPECT_TRUE(c.enabled());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(other));
  fs::remove_all(dir);
}

// The tool's default directory: absolute XDG_CACHE_HOME, else absolute HOME,
// else the passwd entry's home, else none (it was a fixed name in the shared
// /tmp, which any user can create first).
TEST(DiskCache, DefaultUserDirectoryIsAbsoluteAndNeverInSharedTmp) {
  struct Saved {
    std::string name;
    std::optional<std::string> value;
  };
  std::vector<Saved> saved;
  for (const char* n : {"XDG_CACHE_HOME", "HOME"}) {
    const char* v = std::getenv(n);
    saved.push_back({n, v ? std::optional<std::string>(v) : std::nullopt});
  }
  ::setenv("XDG_CACHE_HOME", "/x/cache", 1);
  EXPECT_EQ(jit::default_user_cache_dir(), "/x/cache/tilejit");
  ::setenv("XDG_CACHE_HOME", "relative/cache", 1);  // ignored, as the XDG spec says
  ::setenv("HOME", "/h", 1);
  EXPECT_EQ(jit::default_user_cache_dir(), "/h/.cache/tilejit");
  ::unsetenv("XDG_CACHE_HOME");
  ::unsetenv("HOME");
  const std::string d = jit::default_user_cache_dir();
  EXPECT_TRUE(d.empty() || (d[0] == '/' && d.find("/.cache/tilejit") != std::string::npos)) << d;
  EXPECT_EQ(d.rfind("/tmp/", 0), std::string::npos) << d;
  for (const Saved& v : saved)
    v.value ? ::setenv(v.name.c_str(), v.value->c_str(), 1) : ::unsetenv(v.name.c_str());
}

TEST(DiskCacheSize, TheSizeKnobParses) {
  EXPECT_EQ(jit::parse_cache_size("0"), 0u);
  EXPECT_EQ(jit::parse_cache_size("4096"), 4096u);
  EXPECT_EQ(jit::parse_cache_size("1K"), 1024u);
  EXPECT_EQ(jit::parse_cache_size("500m"), 500ull << 20);
  EXPECT_EQ(jit::parse_cache_size("1G"), 1ull << 30);
  EXPECT_EQ(jit::parse_cache_size("2t"), 2ull << 40);
  EXPECT_EQ(jit::parse_cache_size("1048576T"), 1ull << 60);
  // Large asks for "effectively no cap" are taken up to 2^64 bytes.
  EXPECT_EQ(jit::parse_cache_size("8388607T"), 8388607ull << 40);
  EXPECT_EQ(jit::parse_cache_size("18446744073709551615"), UINT64_MAX);
  EXPECT_EQ(jit::parse_cache_size(" 5M "), 5ull << 20);
  for (const char* bad : {"", "-1", "1.5G", "1KB", "G", "1 G", "0x10", "1e9",
                          "18446744073709551616", "99999999999999999999", "16777216T"})
    EXPECT_FALSE(jit::parse_cache_size(bad).has_value()) << bad;
  EXPECT_FALSE(jit::parse_cache_size(nullptr).has_value());
}

// Sets an entry's modification time (the cache's "last used") to `sec`.
void set_used(const std::string& path, time_t sec) {
  const struct timespec t[2] = {{sec, 0}, {sec, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0) << path;
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += fs::file_size(e.path());
  return total;
}

// Past TILEJIT_CACHE_MAX_SIZE a store removes the least recently *used*
// entries (a load counts as a use) down to 90 % of the cap; the entry just
// stored stays.
TEST(DiskCacheSize, AFullDirectoryLosesItsLeastRecentlyUsedEntries) {
  const std::string dir = fresh_dir("cap");
  const std::vector<uint8_t> payload = bytes(10000, 1);
  uint64_t entry = 0;
  {
    jit::DiskCache probe(dir, 0);
    probe.store("size-probe", payload);
    entry = fs::file_size(probe.path_for("size-probe"));
    fs::remove(probe.path_for("size-probe"));
  }
  // Room for three entries and a half: the fourth store passes the cap, and
  // removing one entry brings the directory under 90 % of it.
  jit::DiskCache c(dir, entry * 7 / 2);
  for (const char* k : {"k0", "k1", "k2"}) c.store(k, payload);
  EXPECT_EQ(c.evictions(), 0u);
  set_used(c.path_for("k0"), 1000000);
  set_used(c.path_for("k1"), 2000000);
  set_used(c.path_for("k2"), 3000000);
  ASSERT_TRUE(c.load("k0").has_value());  // k0 used now: k1 is the least recently used
  c.store("k3", payload);
  EXPECT_EQ(c.evictions(), 1u);
  EXPECT_FALSE(fs::exists(c.path_for("k1")));
  for (const char* k : {"k0", "k2", "k3"}) EXPECT_TRUE(c.load(k).has_value()) << k;
  EXPECT_LE(dir_bytes(dir), entry * 7 / 2);

  // A cap below one entry keeps the entry just stored, and only it.
  jit::DiskCache tiny(dir, entry / 2);
  EXPECT_EQ(tiny.evictions(), 3u);  // the directory was trimmed when opened
  tiny.store("k4", payload);
  EXPECT_TRUE(tiny.load("k4").has_value());
  EXPECT_EQ(dir_bytes(dir), fs::file_size(tiny.path_for("k4")));
  fs::remove_all(dir);
}

TEST(DiskCacheSize, ZeroMeansNoLimit) {
  const std::string dir = fresh_dir("nocap");
  jit::DiskCache c(dir, 0);
  for (int i = 0; i < 20; ++i) {
    std::string key = "n";  // (GCC 12's -Wrestrict misfires on "n" + std::to_string(i) at -O3)
    key += std::to_string(i);
    c.store(key, bytes(5000, uint8_t(i)));
  }
  EXPECT_EQ(c.evictions(), 0u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 20);
  fs::remove_all(dir);
}

// The knob reaches the process's cache: a child with a 1 KiB cap and a fresh
// directory keeps only the last entry it stored and counts the evictions.
TEST(DiskCacheSize, TheEnvironmentCapReachesCacheStats) {
  if (!jit_path()) GTEST_SKIP() << "the scalar path compiles nothing";
  const std::string dir = fresh_dir("capenv");
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::setenv("TILEJIT_CACHE_MAX_SIZE", "1K", 1);
    jit::KernelCache::global().set_disk_dir(dir);
    (void)run_gemm(24, 40);
    (void)run_gemm(40, 24);
    const CacheStats st = cache_stats();
    size_t files = 0;
    for (const auto& e : fs::directory_iterator(dir)) files += e.is_regular_file() ? 1 : 0;
    _exit(st.disk_stores >= 2 && st.disk_evictions >= 1 && files == 1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  fs::remove_all(dir);
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

// ---- hostile directories ----------------------------------------------------

namespace {

// Forks a child that runs fn and exits with its result.
pid_t start_child(const std::function<int()>& fn) {
  const pid_t pid = fork();
  if (pid == 0) _exit(fn());
  return pid;
}

// The child's exit code, or -1 when it has not finished by `deadline` (it is
// then killed), -3 when it died of a signal: a load that blocks on a FIFO or
// reads /dev/zero without end fails the test instead of hanging it.
int wait_until(pid_t pid, std::chrono::steady_clock::time_point deadline) {
  if (pid < 0) return -2;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -3;
}

std::chrono::steady_clock::time_point after(double seconds) {
  return std::chrono::steady_clock::now() +
         std::chrono::duration_cast<std::chrono::steady_clock::duration>(
             std::chrono::duration<double>(seconds));
}

int in_child_within(double seconds, const std::function<int()>& fn) {
  return wait_until(start_child(fn), after(seconds));
}

// In a child (so that a hang is caught): the load of `key` returns nothing,
// counts one rejected entry, and a store + load then round-trips.
int refuses_then_recovers(const std::string& dir, bool entry_removable) {
  jit::DiskCache c(dir);
  if (c.load("k").has_value()) return 10;
  if (c.rejected() != 1) return 11;
  if (!c.enabled()) return 12;
  if (!entry_removable) return 0;
  c.store("k", bytes(300, 9));
  const auto got = c.load("k");
  return got && *got == bytes(300, 9) ? 0 : 13;
}

// A directory whose entry for "k" has been replaced by `make_entry(path)`.
std::string dir_with_entry(const std::string& tag,
                           const std::function<void(const std::string&)>& make_entry) {
  const std::string dir = fresh_dir(tag);
  jit::DiskCache c(dir);
  c.store("k", bytes(300, 9));
  const std::string path = c.path_for("k");
  fs::remove(path);
  make_entry(path);
  return dir;
}

}  // namespace

TEST(DiskCacheHostile, SymlinkToDevZeroIsNotRead) {
  const std::string dir =
      dir_with_entry("zero", [](const std::string& p) { fs::create_symlink("/dev/zero", p); });
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, true); }), 0);
  EXPECT_TRUE(fs::exists("/dev/zero")) << "only the link is removed";
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, SymlinkToAGoodEntryIsNotFollowed) {
  // Even a link to a valid entry is refused: the cache reads only files it wrote.
  const std::string dir = dir_with_entry("link", [](const std::string& p) {
    jit::DiskCache other(fresh_dir("link-target"));
    other.store("k", bytes(300, 9));
    fs::create_symlink(other.path_for("k"), p);
  });
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, true); }), 0);
  fs::remove_all(dir);
}

// An entry another user could have written is never run: a valid entry made
// group- or world-writable, or (as root) owned by another user, is refused and
// left in place; the store of the key then replaces it. Entries are stored
// 0644 whatever the umask (umask 002 would make them group-writable).
TEST(DiskCacheHostile, EntryOthersCouldWriteIsNotRun) {
  const std::string dir = fresh_dir("foreign");
  const mode_t old_umask = ::umask(002);
  {
    jit::DiskCache c(dir);
    c.store("k", bytes(300, 9));
    ::umask(old_umask);
    const std::string path = c.path_for("k");
    struct stat st;
    ASSERT_EQ(::stat(path.c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0644u) << "stored under umask 002";
    ASSERT_TRUE(c.load("k").has_value());
    for (mode_t mode : {0664, 0646}) {
      ASSERT_EQ(::chmod(path.c_str(), mode), 0);
      jit::DiskCache d(dir);
      EXPECT_FALSE(d.load("k").has_value()) << std::oct << mode;
      EXPECT_EQ(d.rejected(), 1u);
      EXPECT_TRUE(fs::exists(path)) << "not this process's file to remove";
    }
    ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
    if (::geteuid() == 0) {  // another owner: only root can make one here
      ASSERT_EQ(::chown(path.c_str(), 65534, 65534), 0) << std::strerror(errno);
      jit::DiskCache d(dir);
      EXPECT_FALSE(d.load("k").has_value()) << "owned by uid 65534";
      d.store("k", bytes(300, 9));  // replaces it by rename
      EXPECT_TRUE(d.load("k").has_value());
    }
  }
  ::umask(old_umask);
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, FifoDoesNotBlock) {
  const std::string dir = dir_with_entry("fifo", [](const std::string& p) {
    ASSERT_EQ(mkfifo(p.c_str(), 0644), 0) << std::strerror(errno);
  });
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, true); }), 0);
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, DeviceNodeIsNotRead) {
  bool made = true;
  const std::string dir = dir_with_entry("dev", [&](const std::string& p) {
    // /dev/zero's numbers (1, 5); creating a device node needs CAP_MKNOD.
    made = mknod(p.c_str(), S_IFCHR | 0644, makedev(1, 5)) == 0;
  });
  if (!made) {
    fs::remove_all(dir);
    GTEST_SKIP() << "mknod needs CAP_MKNOD: " << std::strerror(errno);
  }
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, true); }), 0);
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, DirectoryInPlaceOfAnEntry) {
  const std::string dir = dir_with_entry("dir", [](const std::string& p) {
    fs::create_directories(p + "/inside");  // not empty: rename(2) cannot replace it
  });
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, false); }), 0);
  jit::DiskCache c(dir);
  EXPECT_FALSE(c.load("k").has_value());
  c.store("k", bytes(300, 9));  // the publish fails: that entry only
  EXPECT_EQ(c.store_failures(), 1u);
  EXPECT_TRUE(c.enabled()) << "one failed store must not turn the cache off";
  EXPECT_TRUE(fs::is_directory(c.path_for("k"))) << "a directory is never removed";
  c.store("other", bytes(50, 2));
  ASSERT_TRUE(c.load("other").has_value());
  EXPECT_EQ(*c.load("other"), bytes(50, 2));
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << "temporary left: " << e.path();
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, OversizedEntryIsNotRead) {
  // A sparse 4 GiB file: refused by its size, without a read.
  const std::string dir = dir_with_entry("big", [](const std::string& p) {
    std::ofstream(p, std::ios::binary) << "TJKC";
    fs::resize_file(p, uintmax_t(4) << 30);
  });
  EXPECT_EQ(in_child_within(10, [&] { return refuses_then_recovers(dir, true); }), 0);
  fs::remove_all(dir);
}

// An entry whose payload is empty passes its checksum: the Xbyak loader
// refuses it and the kernel is compiled (it ran the empty mapping: SIGSEGV).
TEST(DiskCacheHostile, AnEmptyCodeEntryIsCompiledNotRun) {
  const std::string dir = fresh_dir("empty");
  const std::string key = "test_empty_entry_" + std::to_string(::getpid());
  jit::DiskCache(dir).store(key, {});
  jit::KernelCache::global().set_disk_dir(dir);
  const CacheStats before = cache_stats();
  // mov eax, 42; ret
  const jit::Kernel& k = jit::KernelCache::global().get(
      key, "empty_entry_test", [] { return std::vector<uint8_t>{0xB8, 42, 0, 0, 0, 0xC3}; });
  EXPECT_EQ(k.entry<int (*)()>()(), 42);
  EXPECT_EQ(cache_stats().compiles, before.compiles + 1);
  jit::KernelCache::global().set_disk_dir("");
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, ForgedPayloadLengthIsRejected) {
  // A well-formed entry whose payload length is 2^64 - 4 and whose checksum
  // matches: the length check must not wrap.
  jit::DiskCache c(fresh_dir("forged"));
  const std::string q = jit::DiskCache::qualified_key("k");
  std::vector<uint8_t> out = {'T', 'J', 'K', 'C'};
  auto put = [&](auto v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  };
  put(uint32_t{1});
  put(uint64_t{q.size()});
  out.insert(out.end(), q.begin(), q.end());
  put(~uint64_t{0} - 3);
  const size_t payload_pos = out.size();
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the bytes before the (wrapped) payload end
  for (size_t i = 0; i < payload_pos - 4; ++i) h = (h ^ out[i]) * 1099511628211ull;
  out.resize(payload_pos - 4 + 8 + 4);
  std::memcpy(out.data() + payload_pos - 4, &h, 8);
  std::ofstream(c.path_for("k"), std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  EXPECT_FALSE(c.load("k").has_value());
  EXPECT_EQ(c.rejected(), 1u);
  fs::remove_all(c.dir());
}

// The directory deleted underneath (a cleanup while a server runs): the next
// store makes it again (an outside tester's process lost every later store:
// 11 159 failures after 449 stores). Where it cannot be made (a file in its
// place), that store fails alone, and the next one works once it can.
TEST(DiskCacheHostile, AStoreIntoAVanishedDirectoryMakesItAgain) {
  jit::DiskCache c(fresh_dir("gone"));
  fs::remove_all(c.dir());  // deleted underneath, temporary files and all
  c.store("k", bytes(100, 1));
  EXPECT_EQ(c.store_failures(), 0u);
  EXPECT_EQ(c.stores(), 1u);
  ASSERT_TRUE(c.load("k").has_value());
  fs::remove_all(c.dir());
  { std::ofstream(c.dir()) << "a file where the directory was"; }
  c.store("k2", bytes(100, 2));
  EXPECT_EQ(c.store_failures(), 1u);
  EXPECT_TRUE(c.enabled());
  fs::remove(c.dir());
  c.store("k2", bytes(100, 2));
  ASSERT_TRUE(c.load("k2").has_value());
  EXPECT_EQ(c.stores(), 2u);
  fs::remove_all(c.dir());
}

// The directories the cache makes are 0755 whatever the umask: under umask 0
// they were drwxrwxrwx (create_directories), where any user could delete or
// flood the entries. Both places that make them: the constructor, and a store
// into a directory removed underneath. Existing ones keep their mode. In a
// child, whose umask is its own.
TEST(DiskCacheHostile, MadeDirectoriesAreNotWritableByOthersUnderUmaskZero) {
  const std::string base = fresh_dir("umask");
  fs::create_directories(base);
  ASSERT_EQ(::chmod(base.c_str(), 0711), 0);
  const int code = in_child_within(60, [&] {
    ::umask(0);
    auto mode = [](const std::string& p) {
      struct stat sb;
      return ::lstat(p.c_str(), &sb) == 0 && S_ISDIR(sb.st_mode) ? int(sb.st_mode & 07777) : -1;
    };
    const std::string dir = base + "/a/b/kc";
    const std::vector<std::string> made = {base + "/a", base + "/a/b", dir};
    int wrong = 0;  // bit 0: made by the constructor, bit 1: by the store
    jit::DiskCache c(dir);
    if (!c.enabled()) return 10;
    if (mode(base) != 0711) return 11;  // existing: left as it was
    for (const std::string& p : made) wrong |= mode(p) != 0755 ? 1 : 0;
    fs::remove_all(base + "/a");
    c.store("k", bytes(100, 1));
    if (c.stores() != 1) return 12;
    for (const std::string& p : made) wrong |= mode(p) != 0755 ? 2 : 0;
    return wrong == 0 ? 0 : 20 + wrong;
  });
  fs::remove_all(base);
  EXPECT_EQ(code, 0) << "21: the constructor's directories, 22: the store's, 23: both";
}

namespace {

// y = x·wᵀ for a [5, k] x and an [n, k] w, bf16 bits.
std::vector<uint16_t> gemm_output(int64_t n, int64_t k) {
  std::vector<uint16_t> w(n * k), x(5 * k), y(5 * n);
  for (size_t i = 0; i < w.size(); ++i) w[i] = runtime::f32_to_bf16(float(int(i % 11) - 5) / 4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = runtime::f32_to_bf16(float(int(i % 7) - 3) / 2);
  const PackedWeight pw = pack_weight(TensorView(w.data(), DType::bf16, {n, k}));
  gemm(TensorView(x.data(), DType::bf16, {5, k}), pw, TensorView(y.data(), DType::bf16, {5, n}));
  return y;
}

// One act of vandalism on an entry of the directory: delete it, truncate it,
// flip a byte, or put a symlink to /dev/zero, a FIFO or a directory there.
void vandalize(const fs::path& p, std::mt19937& rng) {
  std::error_code ec;
  if (fs::is_directory(fs::symlink_status(p, ec))) {
    // The cache never removes a directory: the vandal takes its own away,
    // so that the entry's key can be stored and loaded again.
    fs::remove_all(p, ec);
    return;
  }
  switch (rng() % 6) {
    case 0:
      fs::remove(p, ec);
      break;
    case 1:
      fs::resize_file(p, fs::file_size(p, ec) / 2, ec);
      break;
    case 2: {
      std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(rng() % std::max<uintmax_t>(1, fs::file_size(p, ec))));
      f.put(static_cast<char>(rng()));
      break;
    }
    case 3:
      fs::remove(p, ec);
      fs::create_symlink("/dev/zero", p, ec);
      break;
    case 4:
      fs::remove(p, ec);
      mkfifo(p.c_str(), 0644);
      break;
    case 5:
      fs::remove(p, ec);
      fs::create_directories(p / "x", ec);
      break;
  }
}

}  // namespace

TEST(DiskCacheHostile, ConcurrentVandalismNeverChangesAResult) {
  if (!jit_path()) GTEST_SKIP() << "ISA path unavailable: the scalar path compiles nothing";
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{48, 40}, {80, 72}, {112, 136}, {20, 8}};
  size_t total = 0;
  for (const auto& [n, k] : shapes) total += size_t(5 * n);
  // The reference: every result computed once with the disk cache off, in a
  // child (so that this process's in-memory cache, which the workers inherit
  // through fork, stays cold for these shapes), into shared memory. A kernel
  // loaded from disk is the same code, so results must be bit-identical.
  auto* want = static_cast<uint16_t*>(
      mmap(nullptr, total * 2, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(want, MAP_FAILED);
  auto all_results = [&](uint16_t* out, bool compare, size_t first) {
    size_t bad = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      const size_t s = (first + i) % shapes.size();
      size_t off = 0;
      for (size_t j = 0; j < s; ++j) off += size_t(5 * shapes[j].first);
      const std::vector<uint16_t> y = gemm_output(shapes[s].first, shapes[s].second);
      if (compare)
        bad += std::memcmp(y.data(), out + off, y.size() * 2) != 0;
      else
        std::memcpy(out + off, y.data(), y.size() * 2);
    }
    return bad;
  };
  ASSERT_EQ(in_child_within(120,
                            [&] {
                              jit::KernelCache::global().set_disk_dir("");
                              all_results(want, false, 0);
                              return 0;
                            }),
            0);

  const std::string dir = fresh_dir("vandal");
  fs::create_directories(dir);
  // The vandal: a process of its own, killed at the end, so that this one
  // forks the workers without other threads running; it counts its acts in
  // shared memory.
  auto* acts =
      static_cast<std::atomic<int>*>(mmap(nullptr, sizeof(std::atomic<int>), PROT_READ | PROT_WRITE,
                                          MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(acts, MAP_FAILED);
  new (acts) std::atomic<int>(0);
  const pid_t vandal = start_child([&] {
    std::mt19937 rng(7);
    while (true) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (rng() % 4 == 0) {
          vandalize(e.path(), rng);
          acts->fetch_add(1);
        }
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    return 0;
  });
  ASSERT_GT(vandal, 0);
  // A worker: a cold in-memory cache, two threads loading, compiling and storing.
  auto worker = [&] {
    jit::KernelCache::global().set_disk_dir(dir);
    std::atomic<size_t> wrong{0};
    std::thread t1([&] { wrong += all_results(want, true, 0); });
    std::thread t2([&] { wrong += all_results(want, true, 2); });
    t1.join();
    t2.join();
    return wrong.load() == 0 ? 0 : 1;
  };
  for (int round = 0; round < 20; ++round) {
    // Three concurrent workers; each must finish (a FIFO or /dev/zero must
    // not stall it) with every result exact.
    std::vector<pid_t> kids;
    for (int c = 0; c < 3; ++c) kids.push_back(start_child(worker));
    const auto deadline = after(120);
    for (pid_t pid : kids)
      EXPECT_EQ(wait_until(pid, deadline), 0)
          << "round " << round << ": a worker gave a wrong result (1), hung (-1) or crashed (-3)";
  }
  kill(vandal, SIGKILL);
  waitpid(vandal, nullptr, 0);
  EXPECT_GT(acts->load(), 0) << "the vandal found no entry to spoil";
  // What the vandal left is refused or loaded, never trusted blindly: one more
  // cold process, with no vandal, still computes every result exactly.
  EXPECT_EQ(in_child_within(120, worker), 0);
  munmap(acts, sizeof(std::atomic<int>));
  munmap(want, total * 2);
  fs::remove_all(dir);
}

TEST(DiskCacheHostile, ConcurrentVandalismNeverYieldsAWrongPayload) {
  // One process (so that a ThreadSanitizer build sees every access): four
  // threads store and load eight entries through one DiskCache while a fifth
  // spoils them. A load returns nothing or exactly the payload stored for its
  // key, never a spoiled one; a FIFO or /dev/zero that blocked would be
  // caught by the test's ctest timeout.
  const std::string dir = fresh_dir("vandal1");
  jit::DiskCache c(dir);
  auto payload = [](int key) { return bytes(500 + 97 * size_t(key), uint8_t(key)); };
  std::atomic<bool> stop{false};
  std::atomic<int> wrong{0}, loads{0};
  std::thread vandal([&] {
    std::mt19937 rng(11);
    while (!stop.load()) {
      std::error_code ec;
      for (const auto& e : fs::directory_iterator(dir, ec))
        if (rng() % 4 == 0) vandalize(e.path(), rng);
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  std::vector<std::thread> users;
  for (int t = 0; t < 4; ++t)
    users.emplace_back([&, t] {
      for (int i = 0; i < 1500; ++i) {
        const int key = (i * 5 + t) % 8;
        const std::string name = "key" + std::to_string(key);
        if (auto got = c.load(name)) {
          ++loads;
          if (*got != payload(key)) ++wrong;
        } else {
          c.store(name, payload(key));
        }
      }
    });
  for (auto& u : users) u.join();
  stop.store(true);
  vandal.join();
  EXPECT_EQ(wrong.load(), 0) << "a spoiled entry was loaded";
  EXPECT_GT(loads.load(), 0) << "no load ever succeeded: the test tested nothing";
  EXPECT_GT(c.rejected(), 0u) << "the vandal spoiled nothing that was loaded";
  EXPECT_TRUE(c.enabled());
  fs::remove_all(dir);
}
