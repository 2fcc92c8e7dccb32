// The argument parser of the benches that are plain programs (rope_bench):
// Google Benchmark ones parse their flags in benchmark::Initialize. Kept out
// of bench_util.h, whose <benchmark/benchmark.h> needs the library linked.
#pragma once

#include <charconv>
#include <cstdio>
#include <string>
#include <system_error>

#include "tilejit/tilejit.h"

namespace tilejit::bench {

// `--help`, and the thread count as `--threads N`, `--threads=N` or a bare
// `N`. Returns the exit code to leave with (0 after --help, 2 after a bad
// argument, with a one-line message naming it), or -1 to run with *threads
// set (0: the library default). Never throws: a bench must not abort on its
// arguments.
inline int parse_bench_args(int argc, char** argv, const char* usage, int* threads) {
  *threads = 0;
  auto bad = [&](const std::string& what) {
    std::fprintf(stderr, "%s: error: %s (usage: %s)\n", argv[0], what.c_str(), usage);
    return 2;
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("usage: %s\n", usage);
      return 0;
    }
    std::string value = a;
    if (a == "--threads") {
      if (i + 1 == argc) return bad("--threads needs a value");
      value = argv[++i];
    } else if (a.rfind("--threads=", 0) == 0) {
      value = a.substr(10);
    } else if (!a.empty() && a[0] == '-') {
      return bad("unknown option '" + a + "'");
    }
    int n = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
    if (ec != std::errc() || end != value.data() + value.size() || n < 1)
      return bad("'" + value + "' is not a thread count; allowed: an integer >= 1");
    try {
      set_num_threads(n);  // the library states the allowed range
    } catch (const Error& e) {
      return bad(e.what());
    }
    *threads = n;
  }
  return -1;
}

}  // namespace tilejit::bench
