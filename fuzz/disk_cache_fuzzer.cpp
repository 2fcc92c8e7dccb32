// libFuzzer harness: loading entries of the on-disk kernel cache
// (jit/disk_cache.cpp) from whatever is found in an entry's place.
//
// The first byte picks how the fuzzed bytes become the entry:
//   0  the bytes are the entry file, as is;
//   1  a well-formed entry for the key whose payload is the bytes, then one
//      fuzz-chosen field forged (magic, format, key length, key byte,
//      payload length, checksum) or the file truncated: the fuzzer reaches
//      past the checksum test, which random bytes almost never pass;
//   2  store(key, bytes) through the cache itself, then load;
//   3  not a regular file: a symlink (to /dev/zero, to a good entry, to
//      nothing), a FIFO with no writer, a directory.
// The contract under test: load() returns exactly the payload of a
// well-formed entry for its key (decided here by an independent reading of
// the format in jit/disk_cache.h) and nothing otherwise, never blocks, never
// reads without end; an entry it refuses is removed (a directory excepted).
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "jit/disk_cache.h"

namespace {

using tilejit::jit::DiskCache;
using Bytes = std::vector<uint8_t>;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "disk_cache_fuzzer: %s\n%s\n", what, detail.c_str());
  std::abort();
}

constexpr char kKey[] = "fuzz|gemm_avx512_bf16_f32_m8n64k32";

uint64_t fnv1a(const uint8_t* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

template <class T>
void put(Bytes& out, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

Bytes make_entry(const std::string& qualified, const Bytes& payload) {
  Bytes out = {'T', 'J', 'K', 'C'};
  put(out, uint32_t{1});
  put(out, static_cast<uint64_t>(qualified.size()));
  out.insert(out.end(), qualified.begin(), qualified.end());
  put(out, static_cast<uint64_t>(payload.size()));
  out.insert(out.end(), payload.begin(), payload.end());
  put(out, fnv1a(out.data(), out.size()));
  return out;
}

// The format of jit/disk_cache.h, read independently of the cache's code.
std::optional<Bytes> expected_payload(const Bytes& f, const std::string& qualified) {
  const size_t q = qualified.size();
  const size_t head = 4 + 4 + 8;
  if (f.size() < head + q + 8 + 8) return std::nullopt;
  if (std::memcmp(f.data(), "TJKC", 4) != 0) return std::nullopt;
  uint32_t format;
  uint64_t key_len, payload_len, sum;
  std::memcpy(&format, f.data() + 4, 4);
  std::memcpy(&key_len, f.data() + 8, 8);
  if (format != 1 || key_len != q) return std::nullopt;
  if (std::memcmp(f.data() + head, qualified.data(), q) != 0) return std::nullopt;
  std::memcpy(&payload_len, f.data() + head + q, 8);
  const size_t payload_at = head + q + 8;
  if (payload_len != f.size() - payload_at - 8) return std::nullopt;
  std::memcpy(&sum, f.data() + f.size() - 8, 8);
  if (sum != fnv1a(f.data(), f.size() - 8)) return std::nullopt;
  return Bytes(f.begin() + static_cast<std::ptrdiff_t>(payload_at), f.end() - 8);
}

const std::string& cache_dir() {
  static const std::string dir = [] {
    const char* t = std::getenv("TMPDIR");
    return std::string(t != nullptr && *t != '\0' ? t : "/tmp") + "/tilejit_disk_cache_fuzz_" +
           std::to_string(::getpid());
  }();
  return dir;
}

void write_file(const std::string& path, const Bytes& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) fail("cannot write", path);
  if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f) != bytes.size())
    fail("cannot write", path);
  std::fclose(f);
}

bool exists_no_follow(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 4, arg = size > 1 ? data[1] : 0;
  const Bytes body(data + 1, data + size);

  std::error_code ec;
  std::filesystem::remove_all(cache_dir(), ec);
  DiskCache cache(cache_dir());
  if (!cache.enabled()) fail("the cache directory cannot be created", cache_dir());
  const std::string key = kKey;
  const std::string qualified = DiskCache::qualified_key(key);
  const std::string path = cache.path_for(key);

  std::optional<Bytes> want;  // what load() must return
  bool regular = true;        // the entry is a regular file (a refused one is removed)
  switch (mode) {
    case 0:
      write_file(path, body);
      want = expected_payload(body, qualified);
      break;
    case 1: {
      const Bytes payload(body.begin() + (body.empty() ? 0 : 1), body.end());
      Bytes e = make_entry(qualified, payload);
      // Which field to forge and with what: arg's low 3 bits pick the field,
      // the payload's first byte (if any) the value.
      const uint8_t v = payload.empty() ? 0xff : payload[0];
      const size_t key_at = 16, plen_at = 16 + qualified.size();
      switch (arg % 8) {
        case 0:
          break;  // well-formed
        case 1:
          e[v % 4] ^= 1;
          break;
        case 2:
          e[4] = v;
          break;
        case 3:
          e[8 + v % 8] ^= static_cast<uint8_t>(1u << (v / 8 % 8));
          break;
        case 4:
          e[key_at + v % qualified.size()] ^= 0x20;
          break;
        case 5:
          e[plen_at + v % 8] ^= static_cast<uint8_t>(0x80 >> (v % 8));
          break;
        case 6:
          e[e.size() - 8 + v % 8] ^= 1;
          break;
        case 7:
          e.resize(e.size() - 1 - v % std::min<size_t>(e.size(), 64));
          break;
      }
      write_file(path, e);
      want = expected_payload(e, qualified);
      if (arg % 8 == 0 && want != payload) fail("the harness's own entry does not read back");
      break;
    }
    case 2:
      cache.store(key, body);
      want = body;
      break;
    case 3: {
      regular = false;
      const std::string good = cache_dir() + "/good.tjk";
      switch (arg % 6) {
        case 0:
          std::filesystem::create_symlink("/dev/zero", path, ec);
          break;
        case 1:
          write_file(good, make_entry(qualified, body));
          std::filesystem::create_symlink(good, path, ec);
          break;
        case 2:
          std::filesystem::create_symlink(cache_dir() + "/nothing", path, ec);
          break;
        case 3:
          ::mkfifo(path.c_str(), 0600);
          break;
        case 4:
          std::filesystem::create_directory(path, ec);
          break;
        case 5:
          std::filesystem::create_directory(path, ec);
          write_file(path + "/x", body);
          break;
      }
      break;
    }
  }

  const std::optional<Bytes> got = cache.load(key);
  if (got != want)
    fail(got ? "load() returned a payload for an entry that is not well-formed"
             : "load() refused a well-formed entry",
         "mode " + std::to_string(mode) + ", arg " + std::to_string(arg));
  const bool directory = std::filesystem::is_directory(path, ec);
  if (!got && exists_no_follow(path) && !directory && (regular || mode == 3))
    fail("a refused entry was left in place", path);
  // A second load sees the same (a kept entry) or nothing (a removed one).
  if (cache.load(key) != got) fail("a second load() disagrees with the first");
  return 0;
}
