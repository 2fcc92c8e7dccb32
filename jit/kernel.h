// A compiled kernel: its name (which spells its specialization), its canonical
// key, and its machine code in W^X memory.
#pragma once

#include <string>
#include <vector>

#include "runtime/exec_memory.h"

namespace tilejit::jit {

struct Kernel {
  std::string name;
  std::string key;
  runtime::ExecutableMemory code;
  double compile_us = 0;  // wall time to emit and publish

  template <class Fn>
  Fn entry() const {
    return reinterpret_cast<Fn>(const_cast<void*>(code.data()));
  }
};

}  // namespace tilejit::jit
