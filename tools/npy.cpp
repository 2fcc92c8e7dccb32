#include "tools/npy.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>

#include "runtime/file_size_limit.h"
#include "runtime/fresh_file.h"
#include "tilejit/error.h"
#include "tools/file_limits.h"

namespace tilejit::tools {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

// Header text as a message quotes it: control bytes escaped (a header ends in
// '\n', and may hold anything), at most 120 bytes of it.
std::string excerpt(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out;
  for (size_t i = 0; i < std::min(s.size(), kMax); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    out += c < 0x20 || c >= 0x7f ? fmt::format("\\x{:02x}", c) : std::string(1, s[i]);
  }
  if (s.size() > kMax) out += fmt::format("... ({} bytes)", s.size());
  return out;
}

// The header is a Python dict literal; the writers we read (numpy, this file)
// only produce strings, booleans and int tuples in it.
struct HeaderValue {
  std::string str;
  std::optional<bool> boolean;
  std::optional<std::vector<int64_t>> tuple;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view s, const std::string& name) : s_(s), name_(name) {}

  std::map<std::string, HeaderValue> dict() {
    std::map<std::string, HeaderValue> out;
    expect('{');
    while (true) {
      ws();
      if (peek() == '}') break;
      std::string key = string();
      expect(':');
      out[key] = value();
      // Items are separated by commas, as Python's literal (numpy reads the
      // header with ast.literal_eval): "{'a': 1 'b': 2}" is no header.
      if (peek() == '}') break;
      expect(',');
    }
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw Error(
        fmt::format("{}: bad .npy header ({} at offset {}): {}", name_, what, i_, excerpt(s_)));
  }
  void ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  char peek() {
    ws();
    return i_ < s_.size() ? s_[i_] : '\0';
  }
  void expect(char c) {
    if (peek() != c) fail(fmt::format("expected '{}'", c));
    ++i_;
  }
  std::string string() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    const size_t end = s_.find(q, ++i_);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string v(s_.substr(i_, end - i_));
    i_ = end + 1;
    return v;
  }
  HeaderValue value() {
    HeaderValue v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.str = string();
    } else if (s_.substr(i_, 4) == "True") {
      v.boolean = true;
      i_ += 4;
    } else if (s_.substr(i_, 5) == "False") {
      v.boolean = false;
      i_ += 5;
    } else if (c == '(') {
      ++i_;
      std::vector<int64_t> dims;
      while (peek() != ')') {
        if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a dimension");
        int64_t d = 0;
        while (i_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[i_]))) {
          if (d > (int64_t(1) << 50)) fail("dimension too large");
          d = d * 10 + (s_[i_++] - '0');
        }
        if (i_ < s_.size() && s_[i_] == 'L') ++i_;  // Python 2 longs
        dims.push_back(d);
        if (peek() == ')' && dims.size() > 1) break;
        expect(',');  // "(3)" is an int in Python, not a shape: "(3,)"
      }
      ++i_;
      v.tuple = std::move(dims);
    } else if (c == '[') {
      fail("structured dtypes are not supported");
    } else {
      fail("unexpected value");
    }
    return v;
  }

  std::string_view s_;
  const std::string& name_;
  size_t i_ = 0;
};

std::optional<NpyDtype> dtype_from_descr(const std::string& d) {
  // One-byte types have no byte order: numpy writes '|', others may write '<'.
  if (d == "<f4" || d == "=f4") return NpyDtype::f4;
  if (d == "<i4" || d == "=i4") return NpyDtype::i4;
  if (d == "|u1" || d == "<u1" || d == "=u1") return NpyDtype::u1;
  if (d == "|i1" || d == "<i1" || d == "=i1") return NpyDtype::i1;
  if (d == "<u2" || d == "=u2") return NpyDtype::u2;
  return std::nullopt;
}

std::string shape_tuple(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return fmt::format("({},)", shape[0]);
  return fmt::format("({})", fmt::join(shape, ", "));
}

}  // namespace

const char* npy_descr(NpyDtype t) {
  switch (t) {
    case NpyDtype::f4:
      return "<f4";
    case NpyDtype::i4:
      return "<i4";
    case NpyDtype::u1:
      return "|u1";
    case NpyDtype::i1:
      return "|i1";
    case NpyDtype::u2:
      return "<u2";
  }
  return "?";
}

int npy_item_bytes(NpyDtype t) {
  switch (t) {
    case NpyDtype::f4:
    case NpyDtype::i4:
      return 4;
    case NpyDtype::u1:
    case NpyDtype::i1:
      return 1;
    case NpyDtype::u2:
      return 2;
  }
  return 1;
}

int64_t NpyArray::numel() const {
  // An accepted header's product fits (its byte size was checked) unless a
  // dim is 0, which makes the partial products before it meaningless: a
  // (2^32, 2^32, 0) header is 0 elements, not an int64 overflow.
  for (int64_t d : shape)
    if (d == 0) return 0;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// What the fixed-size preamble (magic, version, header length) says.
struct Preamble {
  size_t header_start = 0;  // 10 (version 1) or 12
  size_t header_len = 0;
};

// `bytes` holds at least the first 10 bytes of the file (12 for version 2+).
Preamble parse_preamble(std::string_view bytes, const std::string& name) {
  if (bytes.empty() || bytes.substr(0, std::min(bytes.size(), kMagicLen)) !=
                           std::string_view(kMagic, std::min(bytes.size(), kMagicLen)))
    throw Error(fmt::format("{}: not a .npy file (no \\x93NUMPY magic)", name));
  if (bytes.size() < kMagicLen + 4)  // the magic (or its start) and nothing after
    throw Error(fmt::format("{}: truncated .npy header ({} bytes; the preamble alone is {})", name,
                            bytes.size(), kMagicLen + 4));
  const auto u8 = [&](size_t i) { return static_cast<uint32_t>(static_cast<uint8_t>(bytes[i])); };
  const uint32_t major = u8(6);
  Preamble p;
  if (major == 1) {
    p.header_len = u8(8) | u8(9) << 8;
    p.header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Error(fmt::format("{}: truncated .npy header", name));
    p.header_len = u8(8) | u8(9) << 8 | u8(10) << 16 | u8(11) << 24;
    p.header_start = 12;
  } else {
    throw Error(
        fmt::format("{}: .npy format version {}.{} is not supported; allowed: 1.0, 2.0, 3.0", name,
                    major, u8(7)));
  }
  if (static_cast<int64_t>(p.header_len) > kMaxNpyHeaderBytes)
    throw Error(fmt::format("{}: .npy header length {} is more than the {} a header may have", name,
                            p.header_len, byte_size_str(kMaxNpyHeaderBytes)));
  return p;
}

// The array a header describes, with no data yet; *data_bytes is what the
// shape needs, computed with overflow checks and capped (dense_bytes).
NpyArray parse_header(std::string_view header, const std::string& name, int64_t* data_bytes) {
  auto dict = HeaderParser(header, name).dict();
  NpyArray a;
  const std::string descr = dict["descr"].str;
  const auto dt = dtype_from_descr(descr);
  if (!dt) {
    const bool big = !descr.empty() && descr[0] == '>';
    throw Error(
        fmt::format("{}: dtype '{}' is not supported{}; allowed: <f4, <i4, |u1, |i1, <u2 "
                    "(bf16 bits)",
                    name, excerpt(descr), big ? " (big-endian)" : ""));
  }
  a.dtype = *dt;
  if (!dict["shape"].tuple) throw Error(fmt::format("{}: .npy header has no shape", name));
  a.shape = *dict["shape"].tuple;
  // Fortran order is the same memory as C order for fewer than two dims of size > 1.
  int big_dims = 0;
  for (int64_t d : a.shape) big_dims += d > 1;
  if (dict["fortran_order"].boolean.value_or(false) && big_dims > 1)
    throw Error(
        fmt::format("{}: the array is in Fortran order; write it in C order "
                    "(numpy.ascontiguousarray)",
                    name));
  *data_bytes = dense_bytes(a.shape, npy_item_bytes(a.dtype),
                            fmt::format("{}: the .npy array ({})", name, descr));
  return a;
}

Error size_mismatch(const std::string& name, const std::string& holds, const NpyArray& a,
                    int64_t want) {
  return Error(fmt::format("{}: holds {} data bytes, but shape {} of {} needs {}", name, holds,
                           shape_tuple(a.shape), npy_descr(a.dtype), want));
}

}  // namespace

NpyArray parse_npy(std::string_view bytes, const std::string& name) {
  const Preamble p = parse_preamble(bytes, name);
  if (bytes.size() - p.header_start < p.header_len)
    throw Error(fmt::format("{}: truncated .npy header", name));
  int64_t want = 0;
  NpyArray a = parse_header(bytes.substr(p.header_start, p.header_len), name, &want);
  const std::string_view data = bytes.substr(p.header_start + p.header_len);
  if (static_cast<int64_t>(data.size()) != want)
    throw size_mismatch(name, std::to_string(data.size()), a, want);
  a.data.assign(data.begin(), data.end());
  return a;
}

// Reads the file piece by piece, so that no more is read than the header
// says the array needs (and never more than the caps of tools/file_limits.h):
// /dev/zero fails at the magic, a header claiming 2^52 elements at its shape.
NpyArray read_npy(const std::string& path) {
  CappedFile f(path);
  f.require_at_most(kMaxNpyHeaderBytes + 12 + kMaxNpyDataBytes, ".npy file",
                    fmt::format("{} header and {} of data", byte_size_str(kMaxNpyHeaderBytes),
                                byte_size_str(kMaxNpyDataBytes)));
  std::string head;
  f.read_up_to(10, head);
  if (head.size() >= 7 && head[6] != 1) f.read_up_to(2, head);
  const Preamble p = parse_preamble(head, f.name());
  f.read_up_to(static_cast<int64_t>(p.header_start + p.header_len - head.size()), head);
  if (head.size() < p.header_start + p.header_len)
    throw Error(fmt::format("{}: truncated .npy header", f.name()));
  int64_t want = 0;
  NpyArray a =
      parse_header(std::string_view(head).substr(p.header_start, p.header_len), f.name(), &want);
  const int64_t data_start = static_cast<int64_t>(head.size());
  if (f.size() >= 0 && f.size() - data_start != want)
    throw size_mismatch(f.name(), std::to_string(f.size() - data_start), a, want);
  if (f.size() >= 0) a.data.reserve(static_cast<size_t>(want));
  f.read_up_to(want + 1, a.data);  // one byte more: a stream longer than the shape is an error too
  const auto got = static_cast<int64_t>(a.data.size());
  if (got != want)
    throw size_mismatch(
        f.name(), got > want ? fmt::format("more than {}", want) : std::to_string(got), a, want);
  return a;
}

std::string serialize_npy(const NpyArray& a) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}",
                                   npy_descr(a.dtype), shape_tuple(a.shape));
  // numpy pads the header with spaces and a newline so the data starts on a
  // 64-byte boundary.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const size_t prefix = v2 ? 12 : 10;
  header.append(63 - (prefix + header.size()) % 64, ' ');
  header += '\n';
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v2 ? 2 : 1);
  out += '\0';
  const size_t len = header.size();
  out += static_cast<char>(len & 0xff);
  out += static_cast<char>((len >> 8) & 0xff);
  if (v2) {
    out += static_cast<char>((len >> 16) & 0xff);
    out += static_cast<char>((len >> 24) & 0xff);
  }
  out += header;
  out.append(reinterpret_cast<const char*>(a.data.data()), a.data.size());
  return out;
}

void write_npy(const std::string& path, const NpyArray& a) {
  write_output_file(path, serialize_npy(a));
}

void write_output_file(const std::string& path, const std::string& bytes) {
  // A regular file (or a new name) is written beside under a fresh name and
  // renamed over it once complete, so a failed write (a full disk, an error)
  // leaves the old file or none, never a truncated one. Anything else (a
  // FIFO, /dev/stdout, a device) is written in place.
  struct stat st {};
  const bool in_place = ::stat(path.c_str(), &st) == 0 && !S_ISREG(st.st_mode);
  // A write past the soft RLIMIT_FSIZE raises SIGXFSZ, which ends the process
  // (exit 153): asked first, as the library's writers do.
  if (!in_place && !runtime::file_size_allowed(bytes.size()))
    throw Error(fmt::format("{}: its {} would pass the file size limit (RLIMIT_FSIZE)", path,
                            byte_size_str(static_cast<int64_t>(bytes.size()))));
  std::string target = path;
  int fd = -1;
  if (in_place) {
    // O_NONBLOCK: a FIFO nobody reads is an error (ENXIO) instead of a wait in
    // open(2); writes block again after the open.
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NONBLOCK, 0644);
  } else {
    // A fresh temporary of our own (runtime::create_fresh_beside: a name
    // that can be predicted was a symlink another user planted, and the tool
    // overwrote its target); mode 0644 under the umask, as outputs had before.
    runtime::FreshFile fresh = runtime::create_fresh_beside(path, 0644, /*exact_mode=*/false);
    fd = fresh.fd;
    target = std::move(fresh.path);
  }
  if (fd < 0)
    throw Error(fmt::format("{}: cannot create: {}", path,
                            errno == ENXIO ? "a FIFO with no reader" : std::strerror(errno)));
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  auto fail = [&](int err) {
    if (!in_place) ::unlink(target.c_str());
    throw Error(fmt::format("{}: write error: {}", path, std::strerror(err)));
  };
  if (!runtime::write_all(fd, bytes.data(), bytes.size())) {
    const int err = errno;
    ::close(fd);
    fail(err);
  }
  if (::close(fd) != 0) fail(errno);
  if (!in_place && ::rename(target.c_str(), path.c_str()) != 0) fail(errno);
}

}  // namespace tilejit::tools
