// Executable memory that is never writable and executable at once (W^X):
// bytes are copied into a fresh RW mapping, which is then flipped to RX.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tilejit::runtime {

class ExecutableMemory {
 public:
  ExecutableMemory() = default;
  // Maps, copies `size` bytes of `code`, then makes the pages read+execute.
  ExecutableMemory(const void* code, size_t size);
  ~ExecutableMemory();
  ExecutableMemory(ExecutableMemory&& o) noexcept;
  ExecutableMemory& operator=(ExecutableMemory&& o) noexcept;
  ExecutableMemory(const ExecutableMemory&) = delete;
  ExecutableMemory& operator=(const ExecutableMemory&) = delete;

  const void* data() const { return base_; }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;    // code bytes
  size_t mapped_ = 0;  // page-rounded mapping
};

}  // namespace tilejit::runtime
