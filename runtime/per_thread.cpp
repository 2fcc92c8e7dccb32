#include "runtime/per_thread.h"

#include <pthread.h>

#include <cstring>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "runtime/lazy_statics.h"
#include "tilejit/error.h"

namespace tilejit::runtime::detail {
namespace {

using Exits = std::vector<std::pair<void*, void (*)(void*)>>;
thread_local Exits* t_exits = nullptr;  // a plain pointer, as per_thread's

// Runs when a thread that used per_thread ends (not for the main thread at
// exit(): its objects stay reachable until the process is gone).
void run_exits(void* p) {
  auto* exits = static_cast<Exits*>(p);
  t_exits = nullptr;
  for (auto it = exits->rbegin(); it != exits->rend(); ++it) it->second(it->first);
  delete exits;
}

pthread_key_t exit_key() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    if (const int rc = pthread_key_create(&k, run_exits); rc != 0)
      throw Error(std::string("per-thread scratch: no thread key can be made: ") +
                  std::strerror(rc));
    return k;
  }();
  return key;
}
const bool g_fork_hook = on_fork_complete([] { (void)exit_key(); });

}  // namespace

void at_thread_exit(void* obj, void (*del)(void*)) {
  if (t_exits == nullptr) {
    auto exits = std::make_unique<Exits>();
    exits->reserve(16);
    // Within the thread's first block of keys no memory is needed; past
    // it (a host with > 32 keys) glibc's ENOMEM is reported here.
    if (pthread_setspecific(exit_key(), exits.get()) != 0) throw std::bad_alloc();
    t_exits = exits.release();
  }
  t_exits->emplace_back(obj, del);
}

}  // namespace tilejit::runtime::detail
