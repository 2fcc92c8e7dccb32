// The C API's process-wide functions (include/tilejit/tilejit_c.h): CPU
// information, cache statistics, the tuning database, the thread count.
#include <algorithm>

#include "ops/c_api_support.h"

using namespace tilejit;
using namespace tilejit::c_api;

namespace {
// The counters both C stats structs hold (tilejit_cache_stats and the
// growable tilejit_cache_stats_ex), from one CacheStats.
template <class C>
void fill_counters(const CacheStats& s, C& o) {
  o.hits = s.hits;
  o.misses = s.misses;
  o.compiles = s.compiles;
  o.compile_seconds = s.compile_seconds;
  o.kernels = s.kernels;
  o.disk_loads = s.disk_loads;
  o.disk_stores = s.disk_stores;
  o.tuned_plans = s.tuned_plans;
}
}  // namespace

extern "C" {

tilejit_status tilejit_get_cpu_info(tilejit_cpu_info* out) {
  return call(__func__, [&] {
    tilejit_cpu_info& o = deref(out, "out");
    const CpuInfo c = cpu_info();
    o = tilejit_cpu_info{};
    const size_t n = std::min(c.vendor.size(), sizeof o.vendor - 1);
    std::memcpy(o.vendor, c.vendor.data(), n);
    o.vendor[n] = '\0';
    o.avx512f = c.avx512f;
    o.avx512bw = c.avx512bw;
    o.avx512vl = c.avx512vl;
    o.avx512_bf16 = c.avx512_bf16;
    o.avx512_fp16 = c.avx512_fp16;
    o.amx_tile = c.amx_tile;
    o.amx_bf16 = c.amx_bf16;
    o.amx_int8 = c.amx_int8;
    o.amx_permitted = c.amx_permitted;
    o.amx_emulated = c.amx_emulated;
    o.avx2 = c.avx2;
    o.fma = c.fma;
    o.llvm_backend = c.llvm_backend;
    o.max_isa = static_cast<tilejit_isa>(c.max_isa);
    o.isa = static_cast<tilejit_isa>(c.isa);
    o.num_threads = c.num_threads;
  });
}

tilejit_status tilejit_get_cache_stats(tilejit_cache_stats* out) {
  return call(__func__, [&] { fill_counters(cache_stats(), deref(out, "out")); });
}

tilejit_status tilejit_get_cache_stats_ex(tilejit_cache_stats_ex* out) {
  return call(__func__, [&] {
    tilejit_cache_stats_ex& o = deref(out, "out");
    // An output struct: its size says how much of it the caller has. Only
    // this header's layout exists so far; a later one appends fields and
    // lists this size as an earlier layout (filled up to it).
    if (o.struct_size != sizeof(tilejit_cache_stats_ex))
      throw CArgError("out.struct_size = " + std::to_string(o.struct_size) +
                      "; allowed: " + std::to_string(sizeof(tilejit_cache_stats_ex)) +
                      " (sizeof(tilejit_cache_stats_ex))");
    const CacheStats s = cache_stats();
    fill_counters(s, o);
    o.disk_evictions = s.disk_evictions;
  });
}

tilejit_status tilejit_load_tuning_db(const char* path) {
  return call(__func__, [&] {
    deref(path, "path");
    load_tuning_db(path);
  });
}

tilejit_status tilejit_set_num_threads(int32_t n) {
  return call(__func__, [&] { set_num_threads(n); });
}

tilejit_status tilejit_get_num_threads(int32_t* out) {
  return call(__func__, [&] { deref(out, "out") = num_threads(); });
}

tilejit_status tilejit_set_batch_invariant(bool on) {
  return call(__func__, [&] { set_batch_invariant(on); });
}

tilejit_status tilejit_get_batch_invariant(bool* out) {
  return call(__func__, [&] { deref(out, "out") = batch_invariant(); });
}

}  // extern "C"
