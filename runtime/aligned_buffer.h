// An owning, 64-byte aligned byte buffer (cache line and AMX tile row alignment).
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "tilejit/error.h"

namespace tilejit::runtime {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

inline std::unique_ptr<std::byte[], FreeDeleter> aligned_alloc_bytes(size_t bytes,
                                                                     size_t align = 64) {
  // Large buffers (packed weights) are streamed once per decode step: 2 MiB
  // pages cut the TLB misses of that stream (measured 8-25% faster M=1 GEMMs).
  constexpr size_t kHuge = size_t(2) << 20;
  const bool huge = bytes >= kHuge;
  if (huge) align = kHuge;
  if (bytes > (size_t(1) << 56))
    throw Error("out of memory: a buffer of " + std::to_string(bytes) +
                " bytes was asked for; allowed: what the machine can allocate");
  const size_t rounded = (bytes + align - 1) / align * align;
  void* p = std::aligned_alloc(align, rounded == 0 ? align : rounded);
  // An Error like any other refused input: the caller asked for shapes whose
  // buffers do not fit (std::bad_alloc would escape the documented contract).
  if (p == nullptr)
    throw Error("out of memory: allocating " + std::to_string(rounded) +
                " bytes failed; allowed: shapes whose buffers fit in memory");
  // Advice only (transparent huge pages may be off); given before the first touch.
  if (huge) madvise(p, rounded, MADV_HUGEPAGE);
  std::memset(p, 0, rounded == 0 ? align : rounded);
  return std::unique_ptr<std::byte[], FreeDeleter>(static_cast<std::byte*>(p));
}

}  // namespace tilejit::runtime
