#include "jit/kernel_cache.h"
#include "jit/tuning_db.h"

#include "jit/disk_cache.h"
#ifdef TILEJIT_HAVE_LLVM
#include "codegen/llvm/llvm_jit.h"
#endif
#include "runtime/file_size_limit.h"
#include "runtime/fresh_file.h"
#include "runtime/lazy_statics.h"
#include "runtime/per_thread.h"
#include "runtime/stack_room.h"
#include "runtime/verbose.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace tilejit::jit {

// The LLVM JIT's fork rule (codegen/llvm/llvm_jit.h), where the build has it.
void llvm_before_fork() {
#ifdef TILEJIT_HAVE_LLVM
  codegen::llvm_backend::before_fork();
#endif
}
void llvm_after_fork(bool child) {
#ifdef TILEJIT_HAVE_LLVM
  codegen::llvm_backend::after_fork(child);
#else
  (void)child;
#endif
}

struct KernelCache::Impl {
  std::mutex mu;
  struct Entry {
    std::shared_future<const Kernel*> future;
    bool ready = false;  // the kernel is made: a forked child may use it (guarded by mu)
  };
  std::unordered_map<std::string, Entry> map;
  std::vector<std::unique_ptr<Kernel>> owned;  // guarded by mu
  std::atomic<uint64_t> hits{0}, misses{0}, compiles{0};
  std::atomic<uint64_t> compile_ns{0};
  std::mutex disk_mu;
  std::shared_ptr<DiskCache> disk = std::make_shared<DiskCache>(disk_cache_dir_from_env());
  std::shared_ptr<DiskCache> disk_cache() {
    std::lock_guard<std::mutex> lk(disk_mu);
    return disk;
  }
  // TILEJIT_PERF_MAP=1: name JIT code for `perf report` (/tmp/perf-<pid>.map).
  const bool perf_map = runtime::diagnostic_env_level("TILEJIT_PERF_MAP", 1) == 1;
  // TILEJIT_JIT_DUMP=DIR: write each kernel's bytes to DIR/<name>.bin.
  const std::string dump_dir = [] {
    const char* v = std::getenv("TILEJIT_JIT_DUMP");
    return v != nullptr ? std::string(v) : std::string();
  }();
  std::mutex observe_mu;
  pid_t perf_map_refused_pid = 0;  // the process whose perf map was refused (observe_mu)
  const bool verbose = runtime::verbose_level() > 0;
};

namespace {
// The cache, once made (fork handlers may run before it is).
std::atomic<KernelCache::Impl*> g_impl{nullptr};
}  // namespace

KernelCache::Impl& KernelCache::impl() const {
  // Immortal (never destroyed): a host thread may still be inside an operator
  // while static destructors run at exit (it crashed in DiskCache::path_for),
  // and its kernels' code must stay mapped.
  runtime::mark_library_used();  // a kernel asked for outside a public call (the tool's)
  static Impl& impl = *new Impl;
  if (g_impl.load(std::memory_order_relaxed) == nullptr) g_impl.store(&impl);
  return impl;
}

namespace {
// The library's one fork handler. fork() while another thread holds a lock
// would leave the child's copy locked forever: hold the cache's locks across
// fork (after the LLVM JIT's gate: a compile in flight takes them when it
// ends), then the leaf locks the other files registered, and release them on
// each side. Registered when the library loads, so that a fork during the
// very first kernel (the LLVM JIT being made) is covered too.
void fork_prepare() {
  // First the lazy statics of a process that has used the library: one being
  // made by another thread would stay half made in the child. Each file
  // registers its own (runtime/lazy_statics.h). Before the LLVM gate: a make
  // may compile.
  if (runtime::library_used()) {
    runtime::fork_complete_statics();
    (void)KernelCache::global().stats();  // makes impl() and the hit counters
  }
  llvm_before_fork();
  if (KernelCache::Impl* p = g_impl.load()) {
    p->mu.lock();
    p->disk_mu.lock();
  }
  runtime::fork_lock_leaves();
}
void fork_parent() {
  runtime::fork_unlock_leaves();
  if (KernelCache::Impl* p = g_impl.load()) {
    p->disk_mu.unlock();
    p->mu.unlock();
  }
  llvm_after_fork(false);
}
void fork_child() {
  runtime::fork_unlock_leaves();
  if (KernelCache::Impl* p = g_impl.load()) {
    // A kernel another thread was making at the fork never comes in the
    // child (that thread is not there): drop its entry, so the child makes
    // it itself instead of waiting on it forever.
    for (auto it = p->map.begin(); it != p->map.end();)
      it = it->second.ready ? std::next(it) : p->map.erase(it);
    p->disk_mu.unlock();
    p->mu.unlock();
  }
  llvm_after_fork(true);
}
const bool g_fork_handlers = (pthread_atfork(fork_prepare, fork_parent, fork_child), true);
}  // namespace

namespace {

// Appends `text` to perf's map of this process. perf fixes the name, in /tmp
// where any user may plant a symlink (a root process appended to its target)
// or a FIFO (the open waited for a reader for ever, inside an operator call):
// the name is opened without following a link or waiting, and written only if
// what was opened is a regular file of this user. Anything else stops the map
// for the process with one warning. Called under observe_mu.
void append_perf_map(pid_t& refused_pid, const std::string& text) {
  const pid_t pid = ::getpid();
  if (refused_pid == pid) return;  // a forked child has its own map
  const std::string path = "/tmp/perf-" + std::to_string(pid) + ".map";
  const char* why = nullptr;
  const int fd = ::open(path.c_str(),
                        O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  struct stat st {};
  if (fd < 0) {
    why = errno == ELOOP   ? "it is a symlink"
          : errno == ENXIO ? "it is a FIFO with no reader"
                           : std::strerror(errno);
  } else if (::fstat(fd, &st) != 0) {
    why = std::strerror(errno);
  } else if (!S_ISREG(st.st_mode)) {
    why = "it is not a regular file";
  } else if (st.st_uid != ::geteuid()) {
    why = "it is owned by another user";
  } else if (st.st_nlink != 1) {
    // A hard link planted at perf's name (to a file of this user) would take
    // the appended lines (an outside tester's find; fs.protected_hardlinks
    // stops other users' links on most hosts, not this user's own).
    why = "it has other hard links";
  }
  if (why != nullptr) {
    if (fd >= 0) ::close(fd);
    refused_pid = pid;
    std::fprintf(stderr, "tilejit: warning: TILEJIT_PERF_MAP: not writing %s (%s)\n", path.c_str(),
                 why);
    return;
  }
  if (runtime::file_size_allowed(static_cast<uint64_t>(st.st_size) + text.size()))
    (void)runtime::write_all(fd, text.data(), text.size());
  ::close(fd);
}

// Writes `bytes` to `path` through a fresh file beside it, renamed over the
// name: a symlink or FIFO planted at the predictable name is replaced, never
// followed (a root process overwrote the link's target) or opened (the open
// of a FIFO waited for ever). Returns why it failed, empty on success.
std::string write_by_rename(const std::string& path, const std::vector<uint8_t>& bytes) {
  // 0644 whatever the umask: a dump others could rewrite is not the kernel's code.
  const runtime::FreshFile fresh = runtime::create_fresh_beside(path, 0644, /*exact_mode=*/true);
  const int fd = fresh.fd;
  const std::string& tmp = fresh.path;
  if (fd < 0) return std::string("cannot create ") + tmp + ": " + std::strerror(errno);
  const bool ok = runtime::write_all(fd, bytes.data(), bytes.size());
  int err = errno;
  const bool closed = ::close(fd) == 0;
  if (ok) err = errno;
  if (!ok || !closed) {
    ::unlink(tmp.c_str());
    return std::string("cannot write ") + tmp + ": " + std::strerror(err);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return std::string("cannot rename it over ") + path + ": " + std::strerror(e);
  }
  return {};
}

}  // namespace

// perf map and JIT dump: best effort, never an error for the caller.
static void observe(KernelCache::Impl& s, const Kernel& k) {
  if (!s.perf_map && s.dump_dir.empty()) return;
  std::lock_guard<std::mutex> lk(s.observe_mu);
  if (s.perf_map) {
    char line[64];
    const int n = std::snprintf(line, sizeof line, "%lx %zx ",
                                reinterpret_cast<unsigned long>(k.entry_ptr), k.size);
    append_perf_map(s.perf_map_refused_pid,
                    std::string(line, static_cast<size_t>(std::max(n, 0))) + k.name + "\n");
  }
  // The entry function's machine code, of either backend (an LLVM kernel's
  // size is its entry symbol's, from the object's symbol table): for
  // `objdump -D -b binary -m i386:x86-64` next to a perf profile.
  if (!s.dump_dir.empty() && k.size > 0) {
    const std::vector<uint8_t> bytes(static_cast<const uint8_t*>(k.entry_ptr),
                                     static_cast<const uint8_t*>(k.entry_ptr) + k.size);
    const std::string path = s.dump_dir + "/" + k.name + ".bin";
    if (!runtime::file_size_allowed(bytes.size())) {
      std::fprintf(stderr, "tilejit: warning: TILEJIT_JIT_DUMP: %s is past the file size limit\n",
                   path.c_str());
    } else if (const std::string why = write_by_rename(path, bytes); !why.empty()) {
      std::fprintf(stderr, "tilejit: warning: TILEJIT_JIT_DUMP: %s\n", why.c_str());
    }
  }
}

KernelCache& KernelCache::global() {
  static KernelCache& cache = *new KernelCache;  // immortal, as impl()
  return cache;
}

namespace {

// Front-cache hits are counted per thread (a shared atomic counter would bounce
// its cache line between the cores on every kernel lookup of a hot loop);
// stats() sums the live threads' counters and what exited threads left.
struct HitCounters {
  std::mutex mu;
  std::vector<const std::atomic<uint64_t>*> live;
  std::atomic<uint64_t> retired{0};
  static HitCounters& global() {
    static HitCounters* c = new HitCounters;  // outlives every thread's counter
    return *c;
  }
  uint64_t total() {
    std::lock_guard<std::mutex> lk(mu);
    uint64_t n = retired.load(std::memory_order_relaxed);
    for (const auto* c : live) n += c->load(std::memory_order_relaxed);
    return n;
  }
};

const bool g_hits_fork_hook = runtime::on_fork_lock([] { HitCounters::global().mu.lock(); },
                                                    [] { HitCounters::global().mu.unlock(); });

struct ThreadHits {
  std::atomic<uint64_t> n{0};  // written by its thread only, read by stats()
  ThreadHits() {
    HitCounters& g = HitCounters::global();
    std::lock_guard<std::mutex> lk(g.mu);
    g.live.push_back(&n);
  }
  ~ThreadHits() {
    HitCounters& g = HitCounters::global();
    std::lock_guard<std::mutex> lk(g.mu);
    g.retired.fetch_add(n.load(std::memory_order_relaxed), std::memory_order_relaxed);
    g.live.erase(std::find(g.live.begin(), g.live.end(), &n));
  }
};

}  // namespace

void KernelCache::count_hit() {
  ThreadHits& hits = runtime::per_thread<ThreadHits>([] {});
  hits.n.store(hits.n.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

std::unique_ptr<Kernel> make_xbyak_kernel(const std::vector<uint8_t>& bytes) {
  auto k = std::make_unique<Kernel>();
  k->backend = "xbyak";
  k->code = runtime::ExecutableMemory(bytes.data(), bytes.size());
  k->entry_ptr = k->code.data();
  k->size = bytes.size();
  return k;
}

KernelRecipe xbyak_recipe(std::function<std::vector<uint8_t>()> emit) {
  KernelRecipe r;
  r.compile = [emit = std::move(emit)] {
    BuiltKernel b;
    b.payload = emit();
    b.kernel = make_xbyak_kernel(b.payload);
    return b;
  };
  // Xbyak code is position independent (RIP-relative constants), so bytes
  // from another process run as they are.
  // An empty entry (its checksum can match) holds no code: running it jumps
  // into whatever follows the mapping. Refused, so the kernel is compiled.
  r.load = [](std::vector<uint8_t> bytes) {
    if (bytes.empty()) throw Error("an empty Xbyak code entry");
    return make_xbyak_kernel(bytes);
  };
  return r;
}

const Kernel& KernelCache::get(const std::string& key, const std::string& name,
                               const std::function<std::vector<uint8_t>()>& emit) {
  return get(key, name, xbyak_recipe(emit));
}

const Kernel& KernelCache::get(const std::string& key, const std::string& name,
                               const KernelRecipe& recipe) {
  Impl& s = impl();
  std::promise<const Kernel*> promise;
  {
    std::unique_lock<std::mutex> lk(s.mu);
    auto it = s.map.find(key);
    if (it != s.map.end()) {
      std::shared_future<const Kernel*> f = it->second.future;
      lk.unlock();
      const bool ready = f.wait_for(std::chrono::seconds(0)) == std::future_status::ready;
      (ready ? s.hits : s.misses).fetch_add(1, std::memory_order_relaxed);
      return *f.get();
    }
    s.map.emplace(key, Impl::Entry{promise.get_future().share()});
    s.misses.fetch_add(1, std::memory_order_relaxed);
  }
  // This thread is the one creator for `key`; others wait on the future.
  try {
    const auto t0 = std::chrono::steady_clock::now();
    const std::shared_ptr<DiskCache> disk = s.disk_cache();
    std::unique_ptr<Kernel> k;
    bool from_disk = false;
    // An LLVM compile took 76-80 KiB of the calling thread's stack (an Xbyak
    // one 28-32): on a host's small-stack thread it runs on one of its own.
    constexpr size_t kMakeStackBytes = size_t{256} << 10;
    runtime::run_with_stack(
        kMakeStackBytes,
        [&] {
          std::optional<std::vector<uint8_t>> stored = disk->load(key);
          if (stored) {
            try {
              k = recipe.load(std::move(*stored));
              from_disk = true;
            } catch (const Error& e) {
              // A stored entry that passes its checksum but will not load (e.g. an
              // object the linker rejects): compile instead.
              if (s.verbose)
                std::fprintf(stderr,
                             "tilejit: fallback: disk cache entry of %s will not load (%s): "
                             "compiling\n",
                             name.c_str(), e.what());
            }
          }
          if (!k) {
            BuiltKernel built = recipe.compile();
            disk->store(key, built.payload);
            k = std::move(built.kernel);
          }
        },
        "making kernel " + name);
    k->name = name;
    k->key = key;
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    k->compile_us = ns / 1e3;
    if (!from_disk) {
      s.compiles.fetch_add(1, std::memory_order_relaxed);
      s.compile_ns.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
    }
    if (s.verbose)
      // fmt, not printf's %f: a host's LC_NUMERIC printed "7458,1 us".
      std::fputs(fmt::format("tilejit: {} {} ({} bytes, {:.1f} us) backend={} key={}\n",
                             from_disk ? "loaded" : "compiled", name, k->size, k->compile_us,
                             k->backend, key)
                     .c_str(),
                 stderr);
    observe(s, *k);
    const Kernel* result = k.get();
    {
      std::lock_guard<std::mutex> lk(s.mu);
      s.owned.push_back(std::move(k));
    }
    promise.set_value(result);
    {
      std::lock_guard<std::mutex> lk(s.mu);
      if (auto it = s.map.find(key); it != s.map.end()) it->second.ready = true;
    }
    return *result;
  } catch (...) {
    {
      std::lock_guard<std::mutex> lk(s.mu);
      s.map.erase(key);  // a later call may try again
    }
    promise.set_exception(std::current_exception());
    throw;
  }
}

CacheStats KernelCache::stats() const {
  Impl& s = impl();
  CacheStats st;
  st.hits = s.hits.load() + HitCounters::global().total();
  st.misses = s.misses.load();
  st.compiles = s.compiles.load();
  st.compile_seconds = s.compile_ns.load() / 1e9;
  const std::shared_ptr<DiskCache> disk = s.disk_cache();
  st.disk_loads = disk->loads();
  st.disk_stores = disk->stores();
  st.disk_evictions = disk->evictions();
  st.disk_dir = disk->enabled() ? disk->dir() : std::string();
  st.tuned_plans = tuned_plans_used();
  std::lock_guard<std::mutex> lk(s.mu);
  st.kernels = s.owned.size();
  return st;
}

void KernelCache::set_disk_dir(const std::string& dir) {
  Impl& s = impl();
  auto fresh = std::make_shared<DiskCache>(dir);
  std::lock_guard<std::mutex> lk(s.disk_mu);
  s.disk = std::move(fresh);
}

}  // namespace tilejit::jit
