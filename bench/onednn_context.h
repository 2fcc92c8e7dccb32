// The oneDNN version, as a context line of the benches that compare with it.
#pragma once

#include <benchmark/benchmark.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>

namespace tilejit::bench {

inline void add_onednn_context() {
  const dnnl::version_t* v = dnnl::version();
  char buf[64];
  std::snprintf(buf, sizeof buf, "%d.%d.%d (%s)", v->major, v->minor, v->patch, v->hash);
  benchmark::AddCustomContext("onednn", buf);
}

}  // namespace tilejit::bench
