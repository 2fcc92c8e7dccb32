#include "jit/disk_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "runtime/cpu_features.h"

#ifndef TILEJIT_BUILD_ID
#define TILEJIT_BUILD_ID "unknown"
#endif

namespace tilejit::jit {
namespace {

constexpr char kMagic[4] = {'T', 'J', 'K', 'C'};
constexpr uint32_t kFormat = 1;

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

bool read_file(const std::string& path, std::vector<uint8_t>* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::vector<uint8_t> buf;
  uint8_t chunk[1 << 16];
  size_t n;
  while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) buf.insert(buf.end(), chunk, chunk + n);
  const bool ok = !std::ferror(f);
  std::fclose(f);
  if (ok) *out = std::move(buf);
  return ok;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

DiskCache::DiskCache(std::string dir) : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec || !std::filesystem::is_directory(dir_, ec)) disable("cannot create the directory");
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
  return key + "|cpu=" + runtime::cpu_signature() + "|build=" + TILEJIT_BUILD_ID;
}

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
  if (!read_file(path, &file)) return std::nullopt;
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
    ok = get(file, pos, &payload_len) && file.size() - pos >= payload_len + 8;
  }
  if (ok) {
    const size_t payload_pos = pos;
    pos += payload_len;
    ok = get(file, pos, &sum) && pos == file.size() &&
         sum == fnv1a(file.data(), payload_pos + payload_len);
    if (ok) {
      loads_.fetch_add(1);
      return std::vector<uint8_t>(file.begin() + payload_pos,
                                  file.begin() + payload_pos + payload_len);
    }
  }
  // Truncated or corrupted (or, in theory, another key under the same 64-bit
  // hash): drop it, best effort, so the recompiled kernel replaces it.
  rejected_.fetch_add(1);
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

  const std::string path = path_for(key);
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(rng());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return disable(std::string("cannot create an entry: ") + std::strerror(errno));
  const bool written = write_all(fd, out.data(), out.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed) {
    ::unlink(tmp.c_str());
    return disable(std::string("cannot write an entry: ") + std::strerror(errno));
  }
  // rename(2) is atomic within a directory: readers see the old entry, the
  // new one, or none, never a partial file.
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    ::unlink(tmp.c_str());
    return disable(std::string("cannot publish an entry: ") + std::strerror(errno));
  }
  stores_.fetch_add(1);
}

std::string disk_cache_dir_from_env() {
  const char* d = std::getenv("TILEJIT_CACHE_DIR");
  return d != nullptr ? std::string(d) : std::string();
}

std::string default_user_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0')
    return std::string(x) + "/tilejit";
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0')
    return std::string(h) + "/.cache/tilejit";
  return "/tmp/tilejit-cache-" + std::to_string(::getuid());
}

}  // namespace tilejit::jit
