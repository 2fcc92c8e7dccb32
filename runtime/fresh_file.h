// The one way tilejit and its tool create a file that is renamed into place:
// the disk cache's entries, TILEJIT_JIT_DUMP's dumps and the tool's outputs.
// A predictable temporary name ("<path>.tmp.<pid>") opened without O_EXCL
// followed a symlink planted there (a root process overwrote its target) or
// waited on a FIFO (an outside review): each writer had its own copy of the
// fix before this header.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>

namespace tilejit::runtime {

struct FreshFile {
  int fd = -1;       // -1: not created (errno says why)
  std::string path;  // "<beside>.tmp.<pid>.<16 hex digits>"
};

// A new file next to `beside`, created O_EXCL | O_NOFOLLOW (a file of our
// own or nothing, never a planted name) with `mode`, under the umask unless
// `exact_mode` (then fchmod: a cache entry others could write is one the
// disk cache refuses, so umask 002 must not make it group-writable). The pid
// in the name lets the disk cache remove a dead writer's leftovers.
inline FreshFile create_fresh_beside(const std::string& beside, mode_t mode, bool exact_mode) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  FreshFile f;
  for (int attempt = 0; attempt < 16; ++attempt) {
    uint64_t r = rng();
    std::string suffix(16, '0');
    for (char& c : suffix) c = kHex[r & 15], r >>= 4;
    f.path = beside + ".tmp." + std::to_string(::getpid()) + "." + suffix;
    f.fd = ::open(f.path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (f.fd >= 0 || errno != EEXIST) break;
  }
  if (f.fd >= 0 && exact_mode && ::fchmod(f.fd, mode) != 0) {
    const int e = errno;
    ::close(f.fd);
    ::unlink(f.path.c_str());
    f.fd = -1;
    errno = e;
  }
  return f;
}

// write(2) until done; false (errno set; ENOSPC for a write of 0) otherwise.
inline bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      if (w == 0) errno = ENOSPC;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace tilejit::runtime
