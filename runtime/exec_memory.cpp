#include "runtime/exec_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "tilejit/error.h"

namespace tilejit::runtime {

ExecutableMemory::ExecutableMemory(const void* code, size_t size) : size_(size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  mapped_ = (size + page - 1) / page * page;
  if (mapped_ == 0) mapped_ = page;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw Error("executable memory: mmap of " + std::to_string(mapped_) +
                " bytes failed: " + std::strerror(errno));
  std::memcpy(p, code, size);
  if (mprotect(p, mapped_, PROT_READ | PROT_EXEC) != 0) {
    const int err = errno;
    munmap(p, mapped_);
    throw Error(std::string("executable memory: mprotect(PROT_READ|PROT_EXEC) failed: ") +
                std::strerror(err));
  }
  base_ = p;
}

ExecutableMemory::~ExecutableMemory() {
  if (base_ != nullptr) munmap(base_, mapped_);
}

ExecutableMemory::ExecutableMemory(ExecutableMemory&& o) noexcept
    : base_(std::exchange(o.base_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, 0)) {}

ExecutableMemory& ExecutableMemory::operator=(ExecutableMemory&& o) noexcept {
  if (this != &o) {
    if (base_ != nullptr) munmap(base_, mapped_);
    base_ = std::exchange(o.base_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
  }
  return *this;
}

}  // namespace tilejit::runtime
