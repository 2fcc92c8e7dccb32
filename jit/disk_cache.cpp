#include "jit/disk_cache.h"
#include "runtime/lazy_statics.h"

#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "runtime/cpu_features.h"
#include "runtime/env_text.h"
#include "runtime/file_size_limit.h"
#include "runtime/fresh_file.h"
#include "runtime/make_directories.h"
#include "runtime/verbose.h"

#ifndef TILEJIT_BUILD_ID
#define TILEJIT_BUILD_ID "unknown"
#endif

namespace tilejit::jit {
namespace {

constexpr char kMagic[4] = {'T', 'J', 'K', 'C'};
constexpr uint32_t kFormat = 1;
// Kernels are a few KiB of code (an LLVM object file at most a few hundred):
// a larger file in the directory is not an entry this build wrote.
constexpr int64_t kMaxEntryBytes = int64_t(64) << 20;

// The GNU build-id note of the object this code is linked into
// (libtilejit.so, or an executable that links tilejit statically), as hex;
// empty if it has none. The linker hashes the whole output, so any change to
// the code that emits kernels changes it, also where the git hash of
// TILEJIT_BUILD_ID does not: a rebuild after `git pull` in a build directory
// configured before it, or uncommitted edits. A cache keyed on the git hash
// alone served such a rebuild the kernels of the previous code.
std::string own_build_id() {
  struct Search {
    uintptr_t addr;
    std::string hex;
  } s{reinterpret_cast<uintptr_t>(&own_build_id), {}};
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        auto& found = *static_cast<Search*>(data);
        bool mine = false;
        for (int i = 0; i < info->dlpi_phnum && !mine; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          const uintptr_t lo = info->dlpi_addr + ph.p_vaddr;
          mine = ph.p_type == PT_LOAD && found.addr >= lo && found.addr < lo + ph.p_memsz;
        }
        if (!mine) return 0;
        for (int i = 0; i < info->dlpi_phnum; ++i) {
          const ElfW(Phdr)& ph = info->dlpi_phdr[i];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(info->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (end - p >= static_cast<ptrdiff_t>(sizeof(ElfW(Nhdr)))) {
            ElfW(Nhdr) n;
            std::memcpy(&n, p, sizeof n);
            const char* name = p + sizeof n;
            const char* desc = name + ((n.n_namesz + 3) & ~3u);
            const char* next = desc + ((n.n_descsz + 3) & ~3u);
            if (next > end || next < desc) break;
            if (n.n_type == NT_GNU_BUILD_ID && n.n_namesz == 4 &&
                std::memcmp(name, "GNU", 4) == 0) {
              static constexpr char kHex[] = "0123456789abcdef";
              for (uint32_t j = 0; j < n.n_descsz; ++j) {
                const auto b = static_cast<uint8_t>(desc[j]);
                found.hex += kHex[b >> 4];
                found.hex += kHex[b & 15];
              }
              return 1;
            }
            p = next;
          }
        }
        return 1;
      },
      &s);
  return s.hex;
}

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

template <class T>
void put(std::vector<uint8_t>& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

template <class T>
bool get(const std::vector<uint8_t>& in, size_t& pos, T* v) {
  if (in.size() - pos < sizeof(T)) return false;
  std::memcpy(v, in.data() + pos, sizeof(T));
  pos += sizeof(T);
  return true;
}

// Why an entry could not be read; `missing` is the ordinary cold-cache case.
// `foreign`: a regular file that another user could have written (owned by
// neither this user nor root, or writable by group or others). An entry is
// machine code the process will run: one planted by someone else in a shared
// or world-writable directory must not be (an outside tester's finding).
// unreadable: lstat or open failed for another reason than a missing name
// (EACCES in a directory this user cannot search): read_errno says which.
enum class ReadResult { ok, missing, refused, foreign, unreadable };
thread_local int read_errno = 0;

bool trusted_writer(const struct stat& st) {
  return (st.st_uid == ::geteuid() || st.st_uid == 0) && (st.st_mode & (S_IWGRP | S_IWOTH)) == 0;
}

// Reads the entry at `path` only if it is a regular file of at most
// kMaxEntryBytes: a symlink (to /dev/zero, say), a FIFO, a device or a
// directory in its place is refused without reading from it, and opening
// never blocks (O_NONBLOCK: a FIFO with no writer would wait in open(2)).
ReadResult read_file(const std::string& path, std::vector<uint8_t>* out) {
  struct stat before;
  if (::lstat(path.c_str(), &before) != 0) {
    read_errno = errno;
    return errno == ENOENT ? ReadResult::missing : ReadResult::unreadable;
  }
  if (!S_ISREG(before.st_mode) || before.st_size > kMaxEntryBytes) return ReadResult::refused;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) {
    read_errno = errno;
    // ELOOP: the name became a symlink after lstat (O_NOFOLLOW).
    return errno == ENOENT  ? ReadResult::missing
           : errno == ELOOP ? ReadResult::refused
                            : ReadResult::unreadable;
  }
  // The name may have been replaced between lstat and open: check what was opened.
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > kMaxEntryBytes) {
    ::close(fd);
    return ReadResult::refused;
  }
  if (!trusted_writer(st)) {
    ::close(fd);
    return ReadResult::foreign;
  }
  // One byte more than the size says, so that a file growing under us fails
  // the length check instead of being read without end.
  std::vector<uint8_t> buf(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  while (got < buf.size()) {
    const ssize_t r = ::read(fd, buf.data() + got, buf.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  buf.resize(got);
  *out = std::move(buf);
  return ReadResult::ok;
}

}  // namespace

DiskCache::DiskCache(std::string dir, uint64_t max_bytes)
    : dir_(std::move(dir)), max_bytes_(max_bytes) {
  if (dir_.empty()) return;
  std::error_code ec;
  // A relative directory is the one it names now: an embedding process that
  // later changes its working directory kept storing into a path that no
  // longer existed (every store failed, silently without TILEJIT_VERBOSE).
  if (std::filesystem::path abs = std::filesystem::absolute(dir_, ec); !ec)
    dir_ = abs.lexically_normal().string();
  ec = runtime::make_directories(dir_);
  std::error_code st;
  if (!std::filesystem::is_directory(dir_, st)) {
    disable(std::filesystem::exists(dir_, st)
                ? std::string("it exists and is not a directory")
                : "cannot create the directory: " + (ec ? ec.message() : std::string("unknown")));
    return;
  }
  // An existing directory this process cannot write (a read-only image
  // layer, another user's 0755 directory): loads work, every store fails.
  // That was silent without TILEJIT_VERBOSE (an outside tester's find: each
  // restart recompiled while the operator believed the cache on). Said once;
  // the loads stay, a pre-filled read-only cache is a sound deployment.
  if (::access(dir_.c_str(), W_OK | X_OK) != 0) {
    const int e = errno;
    std::fprintf(stderr,
                 "tilejit: warning: kernel cache directory '%s' is not writable (%s); kernels "
                 "are loaded from it but new ones are not stored\n",
                 dir_.c_str(), std::strerror(e));
  }
  remove_orphans();
  trim("");
}

std::optional<uint64_t> parse_cache_size(const char* text) {
  if (text == nullptr) return std::nullopt;
  while (*text == ' ' || *text == '\t') ++text;  // blanks around, as the other knobs
  if (*text < '0' || *text > '9') return std::nullopt;
  uint64_t v = 0;
  const char* p = text;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const auto digit = static_cast<uint64_t>(*p - '0');
    if (v > (UINT64_MAX - digit) / 10) return std::nullopt;
    v = v * 10 + digit;
  }
  int shift = 0;
  switch (*p) {
    case '\0':
      break;
    case 'K':
    case 'k':
      shift = 10;
      break;
    case 'M':
    case 'm':
      shift = 20;
      break;
    case 'G':
    case 'g':
      shift = 30;
      break;
    case 'T':
    case 't':
      shift = 40;
      break;
    case ' ':
    case '\t':
      break;
    default:
      return std::nullopt;
  }
  if (shift != 0) ++p;
  while (*p == ' ' || *p == '\t') ++p;
  if (*p != '\0') return std::nullopt;
  if (shift != 0 && v > (UINT64_MAX >> shift)) return std::nullopt;  // past 2^64 bytes
  return v << shift;
}

uint64_t DiskCache::cache_max_bytes_from_env() {
  const char* e = std::getenv("TILEJIT_CACHE_MAX_SIZE");
  if (e == nullptr || *e == '\0') return kDefaultCacheMaxBytes;
  if (const std::optional<uint64_t> v = parse_cache_size(e)) return *v;
  static std::once_flag warned;
  std::call_once(warned, [&] {
    std::fprintf(stderr,
                 "tilejit: warning: TILEJIT_CACHE_MAX_SIZE='%s' is not a size (<n>[K|M|G|T], "
                 "0 = no limit); using 1G\n",
                 runtime::shown_env_value(e).c_str());
  });
  return kDefaultCacheMaxBytes;
}

// Sums the entries' sizes and, past max_bytes_, removes the least recently
// used (a load sets an entry's mtime, a store writes it) down to 90 % of the
// cap, so a full cache is not trimmed again at every store. Entries of other
// CPUs and builds are never loaded here, so they go first. `keep` (the entry
// just stored) is never removed. A file another process removed or loads at
// the same moment is harmless: a reader holds its open descriptor, and a
// missing entry is a recompile. Entries of other users in a shared directory
// are counted; removing them fails where the directory is sticky.
void DiskCache::trim(const std::string& keep) {
  if (max_bytes_ == 0 || !enabled()) return;
  std::unique_lock<std::mutex> lk(trim_mu_, std::try_to_lock);
  if (!lk.owns_lock()) return;  // another thread is at it
  struct Entry {
    struct timespec mtime;
    uint64_t bytes;
    std::string path;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 20 || name.compare(16, 4, ".tjk") != 0) continue;
    struct stat sb;
    std::string path = it->path().string();
    // Only what could be an entry: a larger file in an entry's name is
    // refused (and unlinked) by the load of its key, not counted here.
    if (::lstat(path.c_str(), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > kMaxEntryBytes)
      continue;
    total += static_cast<uint64_t>(sb.st_size);
    entries.push_back({sb.st_mtim, static_cast<uint64_t>(sb.st_size), std::move(path)});
  }
  if (total > max_bytes_) {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec
                                              : a.mtime.tv_nsec < b.mtime.tv_nsec;
    });
    const uint64_t target = max_bytes_ - max_bytes_ / 10;
    for (const Entry& e : entries) {
      if (total <= target) break;
      if (e.path == keep || ::unlink(e.path.c_str()) != 0) continue;
      total -= e.bytes;
      evictions_.fetch_add(1);
      log("evicted (the directory passed TILEJIT_CACHE_MAX_SIZE)", e.path);
    }
  }
  known_bytes_.store(total);
}

// A process killed between writing "<entry>.tmp.<pid>.<n>" and renaming it
// left the temporary file for good (no later store has its name). Those of
// this user whose writer no longer runs are removed, once per directory
// opened; a live writer's (pid answers kill(0)) are left alone.
void DiskCache::remove_orphans() const {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(".tjk.tmp.");
    if (at == std::string::npos) continue;
    const char* pid_text = name.c_str() + at + 9;
    char* stop = nullptr;
    const long pid = std::strtol(pid_text, &stop, 10);
    if (stop == pid_text || *stop != '.' || pid <= 0) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat sb;
    const std::string path = it->path().string();
    if (::lstat(path.c_str(), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_uid == ::geteuid() &&
        ::unlink(path.c_str()) == 0)
      log("removed an orphaned temporary file", path);
  }
}

void DiskCache::disable(const std::string& why) {
  disabled_.store(true);
  std::call_once(warned_, [&] {
    std::fprintf(stderr,
                 "tilejit: warning: kernel cache directory '%s' is not usable (%s); "
                 "caching in memory only\n",
                 dir_.c_str(), why.c_str());
  });
}

std::string DiskCache::qualified_key(const std::string& key) {
  // Immortal: looked up by threads that may outlive static destruction.
  static const std::string& build =
      *new std::string(std::string(TILEJIT_BUILD_ID) + "+" + own_build_id());
  return key + "|cpu=" + runtime::cpu_signature() + "|build=" + build;
}
namespace {
const bool g_fork_hook = runtime::on_fork_complete([] { (void)DiskCache::qualified_key(""); });
}  // namespace

std::string DiskCache::path_for(const std::string& key) const {
  const std::string q = qualified_key(key);
  char name[32];
  std::snprintf(
      name, sizeof name, "%016llx.tjk",
      static_cast<unsigned long long>(fnv1a(reinterpret_cast<const uint8_t*>(q.data()), q.size())));
  return dir_ + "/" + name;
}

std::optional<std::vector<uint8_t>> DiskCache::load(const std::string& key) {
  if (!enabled()) return std::nullopt;
  const std::string path = path_for(key);
  std::vector<uint8_t> file;
  const ReadResult read = read_file(path, &file);
  if (read == ReadResult::missing) return std::nullopt;
  if (read == ReadResult::foreign) {
    // Left in place: it is not this process's file to remove (a store of
    // the key renames the recompiled entry over it where the directory allows).
    rejected_.fetch_add(1);
    log("refused entry (owned by another user or writable by group / others: its code is not "
        "run)",
        path);
    return std::nullopt;
  }
  if (read == ReadResult::unreadable) {
    // Not this process's to remove or replace: reported, then compiled.
    log(std::string("unreadable entry (") + std::strerror(read_errno) + ")", path);
    return std::nullopt;
  }
  if (read == ReadResult::refused) {
    // Not a regular file of a sane size: never read, and unlinked (a
    // symlink, FIFO or device node loses its name only; a directory stays
    // and makes that key's stores fail) so the recompiled kernel replaces it.
    rejected_.fetch_add(1);
    log("refused entry (not a regular file of at most 64 MiB)", path);
    ::unlink(path.c_str());
    return std::nullopt;
  }
  const std::string q = qualified_key(key);
  size_t pos = 0;
  uint32_t format = 0;
  uint64_t key_len = 0, payload_len = 0, sum = 0;
  bool ok = file.size() >= 4 && std::memcmp(file.data(), kMagic, 4) == 0;
  pos = 4;
  ok = ok && get(file, pos, &format) && format == kFormat && get(file, pos, &key_len) &&
       key_len == q.size() && file.size() - pos >= key_len &&
       std::memcmp(file.data() + pos, q.data(), key_len) == 0;
  if (ok) {
    pos += key_len;
    // Written as two comparisons: payload_len + 8 wraps for a forged length near 2^64.
    ok = get(file, pos, &payload_len) && payload_len <= file.size() - pos &&
         file.size() - pos - payload_len >= 8;
  }
  if (ok) {
    const size_t payload_pos = pos;
    pos += payload_len;
    ok = get(file, pos, &sum) && pos == file.size() &&
         sum == fnv1a(file.data(), payload_pos + payload_len);
    if (ok) {
      loads_.fetch_add(1);
      // Used now: the size cap's trim removes the least recently used entries.
      ::utimensat(AT_FDCWD, path.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
      return std::vector<uint8_t>(file.begin() + payload_pos,
                                  file.begin() + payload_pos + payload_len);
    }
  }
  // Truncated or corrupted (or, in theory, another key under the same 64-bit
  // hash): drop it, best effort, so the recompiled kernel replaces it.
  rejected_.fetch_add(1);
  log("rejected entry (truncated, corrupted or foreign)", path);
  ::unlink(path.c_str());
  return std::nullopt;
}

void DiskCache::store(const std::string& key, const std::vector<uint8_t>& payload) {
  if (!enabled()) return;
  const std::string q = qualified_key(key);
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  put(out, kFormat);
  put(out, static_cast<uint64_t>(q.size()));
  out.insert(out.end(), q.begin(), q.end());
  put(out, static_cast<uint64_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  put(out, fnv1a(out.data(), out.size()));

  if (static_cast<int64_t>(out.size()) > kMaxEntryBytes) {
    store_failed("entry larger than 64 MiB, not stored", path_for(key));
    return;
  }
  const std::string path = path_for(key);
  if (!runtime::file_size_allowed(out.size())) {
    store_failed("entry larger than the file size limit (RLIMIT_FSIZE), not stored", path);
    return;
  }
  // 0644 whatever the umask: a group-writable entry (umask 002) is one the
  // loads refuse (trusted_writer).
  runtime::FreshFile fresh = runtime::create_fresh_beside(path, 0644, /*exact_mode=*/true);
  if (fresh.fd < 0 && errno == ENOENT) {
    // The directory was removed while the process ran (a cleanup of the
    // cache): made again, or every later store of the process would fail.
    if (!runtime::make_directories(dir_)) {
      log("made the directory again", dir_);
      fresh = runtime::create_fresh_beside(path, 0644, /*exact_mode=*/true);
    }
  }
  const int fd = fresh.fd;
  const std::string& tmp = fresh.path;
  if (fd < 0) return store_failed(std::string("cannot create: ") + std::strerror(errno), tmp);
  const bool written = runtime::write_all(fd, out.data(), out.size());
  const int write_errno = errno;
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(tmp.c_str());
    return store_failed(std::string("cannot write: ") + std::strerror(write_errno), tmp);
  }
  // rename(2) is atomic within a directory: readers see the old entry, the
  // new one, or none, never a partial file.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return store_failed(std::string("cannot publish: ") + std::strerror(e), path);
  }
  stores_.fetch_add(1);
  if (max_bytes_ != 0 && known_bytes_.fetch_add(out.size()) + out.size() > max_bytes_) trim(path);
}

// A store that fails (the temporary file deleted underneath, a directory in
// the entry's place, a full disk) loses that one entry, nothing more: the
// next store tries again, and loads go on, so one bad moment does not turn
// the disk cache off for the rest of the process.
void DiskCache::store_failed(const std::string& why, const std::string& path) {
  store_failures_.fetch_add(1);
  log(why, path);
}

void DiskCache::log(const std::string& what, const std::string& path) const {
  if (runtime::verbose_level() > 0)
    std::fprintf(stderr, "tilejit: disk cache: %s: %s\n", what.c_str(), path.c_str());
}

std::string disk_cache_dir_from_env() {
  const char* d = std::getenv("TILEJIT_CACHE_DIR");
  return d != nullptr ? std::string(d) : std::string();
}

std::string default_user_cache_dir() {
  // Absolute paths only: the XDG spec ignores a relative XDG_CACHE_HOME (it
  // would follow the working directory). With no home at all, no directory:
  // a fixed name in the shared /tmp (the previous fallback) is one any other
  // user can create first.
  auto absolute = [](const char* p) { return p != nullptr && p[0] == '/'; };
  if (const char* x = std::getenv("XDG_CACHE_HOME"); absolute(x))
    return std::string(x) + "/tilejit";
  if (const char* h = std::getenv("HOME"); absolute(h)) return std::string(h) + "/.cache/tilejit";
  if (const passwd* pw = ::getpwuid(::getuid()); pw != nullptr && absolute(pw->pw_dir))
    return std::string(pw->pw_dir) + "/.cache/tilejit";
  return "";
}

}  // namespace tilejit::jit
