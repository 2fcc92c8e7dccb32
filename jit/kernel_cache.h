// The process-wide kernel cache: canonical key -> compiled kernel. Thread-safe;
// concurrent requests for one key compile once (the others wait on the same
// shared_future, as oneDNN's primitive cache does). Kernels are never evicted,
// so a pointer handed out stays valid for the life of the process.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "jit/kernel.h"
#include "tilejit/tilejit.h"

namespace tilejit::jit {

class KernelCache {
 public:
  static KernelCache& global();

  // Returns the kernel for `key`; on a miss `emit` produces its machine code
  // (position independent bytes), which is placed in executable memory.
  // If `emit` throws, nothing is cached and the error reaches every waiter.
  const Kernel& get(const std::string& key, const std::string& name,
                    const std::function<std::vector<uint8_t>()>& emit);
  // The general form: any backend. On a miss the on-disk cache is tried first
  // (recipe.load), then recipe.compile, whose payload is stored on disk.
  const Kernel& get(const std::string& key, const std::string& name, const KernelRecipe& recipe);

  CacheStats stats() const;
  // Points the on-disk cache at `dir` ("" turns it off). The library default
  // is TILEJIT_CACHE_DIR; the tool and tests set it explicitly.
  void set_disk_dir(const std::string& dir);
  // Counts a lookup served by a caller-side table (e.g. a plan's kernel slots).
  void count_hit();

 private:
  KernelCache() = default;

 public:
  struct Impl;

 private:
  Impl& impl() const;
};

}  // namespace tilejit::jit
