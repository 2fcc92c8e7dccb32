// A file read against a size cap (CappedFile): the one reader of the files a
// user names, for the library (the tuning database) and the tool
// (tools/file_limits.h states the tool's caps). A path that names /dev/zero,
// a FIFO that never ends or a directory, or a header that claims more data
// than the file holds, is an Error naming the file, the size and the cap,
// never a read until memory runs out or a wait for a writer. Regular files
// are measured (fstat) before anything is read; other files (a pipe, stdin,
// a device) are read no further than cap + 1 bytes.
#pragma once

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "tilejit/error.h"

namespace tilejit::runtime {

// "16 MiB", "16 GiB": caps as messages state them.
inline std::string byte_size_str(int64_t n) {
  if (n >= (int64_t(1) << 30) && n % (int64_t(1) << 30) == 0) return fmt::format("{} GiB", n >> 30);
  if (n >= (int64_t(1) << 20) && n % (int64_t(1) << 20) == 0) return fmt::format("{} MiB", n >> 20);
  return fmt::format("{} bytes", n);
}

class CappedFile {
 public:
  // With dash_is_stdin, path "-" reads stdin (shown as <stdin>). Throws
  // Error "<name>: cannot open: ..." or "<name>: is a directory, not a file".
  explicit CappedFile(const std::string& path, bool dash_is_stdin = false)
      : name_(dash_is_stdin && path == "-" ? "<stdin>" : path) {
    if (dash_is_stdin && path == "-") {
      fd_ = STDIN_FILENO;
      owned_ = false;
    } else {
      // O_NONBLOCK so that opening a FIFO nobody writes to does not wait for
      // a writer (it then reads as empty); reads block again after open.
      fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
      if (fd_ < 0) throw Error(fmt::format("{}: cannot open: {}", name_, std::strerror(errno)));
      ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) & ~O_NONBLOCK);
    }
    struct stat st;
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      close_fd();
      throw Error(fmt::format("{}: cannot stat: {}", name_, std::strerror(e)));
    }
    if (S_ISDIR(st.st_mode)) {
      close_fd();
      throw Error(fmt::format("{}: is a directory, not a file", name_));
    }
    // stdin may be a regular file read from an offset other than 0: it is
    // capped as it is read, like a pipe.
    if (S_ISREG(st.st_mode) && owned_) size_ = st.st_size;
  }
  ~CappedFile() { close_fd(); }
  CappedFile(const CappedFile&) = delete;
  CappedFile& operator=(const CappedFile&) = delete;

  const std::string& name() const { return name_; }
  // The size of a regular file; -1 for a pipe, a device or stdin from one.
  int64_t size() const { return size_; }

  // Throws unless the file can hold at most `cap` bytes: a regular file is
  // measured, anything else is checked by read_all as it is read.
  // `cap_text` says the cap in a message (default: "16 MiB" for the bytes).
  void require_at_most(int64_t cap, const char* what, const std::string& cap_text = "") const {
    if (size_ > cap) throw too_big(size_, cap_text.empty() ? byte_size_str(cap) : cap_text, what);
  }

  // Appends up to n bytes (fewer only at the end of the file) to out, a
  // std::string or a std::vector<uint8_t>.
  //
  // Read straight into `out`, in chunks: a 64 KiB buffer on the stack here
  // jumped a host's small-stack thread past its guard page (load_tuning_db on
  // a 64 KiB pthread: SIGSEGV, or heap corruption where read(2) landed).
  template <class Buffer>
  void read_up_to(int64_t n, Buffer& out) {
    constexpr int64_t kChunk = int64_t(1) << 16;
    while (n > 0) {
      const size_t at = out.size();
      const auto want = static_cast<size_t>(std::min(n, kChunk));
      out.resize(at + want);
      ssize_t r = 0;
      do r = ::read(fd_, out.data() + at, want);
      while (r < 0 && errno == EINTR);
      const int e = errno;
      out.resize(at + static_cast<size_t>(std::max<ssize_t>(r, 0)));
      if (r < 0) throw Error(fmt::format("{}: read error: {}", name_, std::strerror(e)));
      if (r == 0) return;
      n -= r;
    }
  }

  // The whole rest of the file, which must be at most `cap` bytes.
  std::string read_all(int64_t cap, const char* what) {
    require_at_most(cap, what);
    std::string out;
    read_up_to(cap + 1, out);
    if (static_cast<int64_t>(out.size()) > cap) throw too_big(-1, byte_size_str(cap), what);
    return out;
  }

 private:
  Error too_big(int64_t size, const std::string& cap, const char* what) const {
    return Error(fmt::format(
        "{}: {} than the {} a {} may have", name_,
        size >= 0 ? fmt::format("is {} bytes, more", size) : std::string("holds more"), cap, what));
  }
  void close_fd() {
    if (owned_ && fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

  std::string name_;
  int fd_ = -1;
  bool owned_ = true;
  int64_t size_ = -1;
};

}  // namespace tilejit::runtime
