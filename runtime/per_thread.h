// Per-thread objects without C++ thread_local destructors. glibc registers a
// thread_local's destructor at the thread's first use with a calloc it
// cannot fail: near an address-space limit a pool worker's first touch of a
// scratch vector ended the process ("Fatal glibc error: failed to register
// TLS destructor"; 1-2 of 60 decode runs on 16 threads). per_thread keeps
// only a plain pointer in TLS and registers the object with one pthread key
// of its own, so running out of memory there is a std::bad_alloc, which the
// operator reports as its Error.
#pragma once

#include <memory>

namespace tilejit::runtime {

namespace detail {
// Deletes `obj` with `del` when this thread ends; throws std::bad_alloc (or
// an Error if no thread key can be made) without taking ownership.
void at_thread_exit(void* obj, void (*del)(void*));
}  // namespace detail

// This thread's T of this call site, default-constructed at first use. The
// site is a lambda (`per_thread<T>([] {})`): each lambda is its own type, so
// each site has its own T.
template <class T, class Site>
T& per_thread(Site) {
  thread_local T* p = nullptr;  // trivially destructible: nothing registered with glibc
  if (p == nullptr) [[unlikely]] {
    auto owned = std::make_unique<T>();
    detail::at_thread_exit(owned.get(), [](void* q) { delete static_cast<T*>(q); });
    p = owned.release();
  }
  return *p;
}

}  // namespace tilejit::runtime
