// The per-thread front of a process-wide compile-once table: repeats are
// answered from a thread_local map (no lock, no shared cache line), misses
// go to `slow`, whose result must live as long as the process (kernels and
// plans are never evicted). One template for the registry's kernels and the
// GEMM plans, so no caller keeps a lookup table of its own.
#pragma once

#include <unordered_map>

#include "codegen/kernel_desc.h"
#include "runtime/per_thread.h"

namespace tilejit::jit {

template <class Key, class Value, class Hash = codegen::DescHash, class Eq = std::equal_to<Key>>
class FrontCache {
 public:
  // The value for `key`: this thread's copy, else slow(key) remembered.
  template <class Slow>
  static Value& get(const Key& key, Slow slow, bool* hit = nullptr) {
    auto& map = runtime::per_thread<std::unordered_map<Key, Value*, Hash, Eq>>([] {});
    if (auto it = map.find(key); it != map.end()) {
      if (hit) *hit = true;
      return *it->second;
    }
    Value& v = slow(key);
    map.emplace(key, &v);
    if (hit) *hit = false;
    return v;
  }
};

}  // namespace tilejit::jit
