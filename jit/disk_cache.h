// The on-disk kernel cache: position-independent machine code (or an object
// file) stored under a directory, keyed by the specialization key + the CPU
// signature + the tilejit build, so a new process loads a kernel instead of
// compiling it.
//
// Entry file: "<16 hex digits of the key hash>.tjk" holding
//   magic "TJKC" | u32 format | u64 key length | key | u64 payload length |
//   payload | u64 FNV-1a of everything before it.
// Writers fill a unique temporary file in the same directory and rename(2)
// it into place, so readers see a whole entry or none, whatever number of
// processes fill the directory. A truncated or corrupted entry fails its
// length or checksum test, is removed and recompiled. Only regular files of
// at most 64 MiB are read: a symlink, FIFO, device or directory in an entry's
// place is refused without reading (or blocking) and unlinked where it can
// be. A store that fails loses that one entry (logged under TILEJIT_VERBOSE);
// only a directory that cannot be created degrades the cache to memory-only,
// with one warning.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace tilejit::jit {

// TILEJIT_CACHE_MAX_SIZE's default: 1 GiB (~80 000 GEMM weight shapes' kernels).
constexpr uint64_t kDefaultCacheMaxBytes = uint64_t(1) << 30;

class DiskCache {
 public:
  // dir empty: disabled. max_bytes: the directory's size cap (0: none).
  explicit DiskCache(std::string dir, uint64_t max_bytes = cache_max_bytes_from_env());

  bool enabled() const { return !dir_.empty() && !disabled_.load(); }
  const std::string& dir() const { return dir_; }

  // The payload stored for `key`, or nothing (missing, foreign, corrupted).
  std::optional<std::vector<uint8_t>> load(const std::string& key);
  // Best effort, never throws: a failure loses this entry only (store_failures()).
  void store(const std::string& key, const std::vector<uint8_t>& payload);

  // The full key an entry is filed under: key + CPU signature + build (the
  // version, git hash and the GNU build-id of the linked library: any
  // rebuild with other code files its kernels apart).
  static std::string qualified_key(const std::string& key);
  std::string path_for(const std::string& key) const;

  uint64_t loads() const { return loads_.load(); }
  uint64_t stores() const { return stores_.load(); }
  uint64_t rejected() const { return rejected_.load(); }
  uint64_t store_failures() const { return store_failures_.load(); }
  // Entries removed to keep the directory under max_bytes (by this process).
  uint64_t evictions() const { return evictions_.load(); }
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  void disable(const std::string& why);
  void store_failed(const std::string& why, const std::string& path);
  void log(const std::string& what, const std::string& path) const;
  void remove_orphans() const;
  void trim(const std::string& keep);

  static uint64_t cache_max_bytes_from_env();

  std::string dir_;
  std::atomic<bool> disabled_{false};
  std::once_flag warned_;
  std::atomic<uint64_t> loads_{0}, stores_{0}, rejected_{0}, store_failures_{0};
  uint64_t max_bytes_ = 0;
  // The entries' bytes at the last scan of the directory plus what this
  // process stored since: a scan (and trim) runs when it passes max_bytes_.
  // Other processes' stores are seen at the next scan only, so the directory
  // can pass the cap by what they stored in between.
  std::atomic<uint64_t> known_bytes_{0};
  std::atomic<uint64_t> evictions_{0};
  std::mutex trim_mu_;
};

// TILEJIT_CACHE_MAX_SIZE parsed: "<n>[K|M|G|T]" (powers of 1024, either
// case, blanks around taken), 0 = no limit; nothing for a value that is not
// such a size or passes 2^64 bytes.
std::optional<uint64_t> parse_cache_size(const char* text);

// The directory from TILEJIT_CACHE_DIR ("" = off, the library default).
std::string disk_cache_dir_from_env();
// The per-user default the `tilejit` tool uses: $XDG_CACHE_HOME/tilejit or
// ~/.cache/tilejit (absolute paths only; HOME unset: the passwd entry's
// home), "" (memory only) when there is none.
std::string default_user_cache_dir();

}  // namespace tilejit::jit
