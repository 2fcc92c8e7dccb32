#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   ./dev.sh run    install dependencies, build, run the main job (tilejit llama-layer)
#   ./dev.sh test   install dependencies, build, run the test suite (ctest; with the
#                   Python module's pytest suite, ctest's python_tests)
#   ./dev.sh python install dependencies, build, install the library and the Python
#                   package (import tilejit) under /usr/local
#   ./dev.sh asan   the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   ./dev.sh asan-ci  the part of it CI runs (after ./dev.sh test): clang, ASan + UBSan,
#                   in the build the fuzzers link against (build-asan-clang)
#   ./dev.sh tsan   the concurrency tests under ThreadSanitizer (clang; tsan-ci: the same)
#   ./dev.sh fuzz [seconds]  each libFuzzer harness (fuzz/) for that long, default 60
#   ./dev.sh fuzz-ci  what CI runs of it: each harness for 30 s
#   ./dev.sh nollvm-ci  a build without LLVM (-DTILEJIT_WITH_LLVM=OFF, GCC) and the
#                   tests of the paths that fall back to C++ or to scalar there
#   ./dev.sh format-check  clang-format --dry-run -Werror over every tracked *.cpp/*.h
# The builds of test, asan-ci, fuzz-ci and nollvm-ci treat warnings as errors
# (-DTILEJIT_WERROR=ON): CI (.ci/run) fails on a new GCC or clang warning.
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ libxbyak-dev llvm-19-dev libfmt-dev googletest libgtest-dev
          libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev)
# The Python package (python/, docs/python.md) and its tests.
PACKAGES+=(pybind11-dev python3-pybind11 libdlpack-dev python3-dev python3-numpy python3-pytest
           python3-torch)
# A locale with a decimal comma for the locale tests (registry_test's
# KernelKeys.*: kernel keys and IR text must not follow the host's locale).
PACKAGES+=(locales)

# de_DE.UTF-8 made once if missing (a test skips without such a locale).
make_test_locale() {
  locale -a 2>/dev/null | grep -qix 'de_DE.utf8' && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo localedef -i de_DE -f UTF-8 de_DE.UTF-8 2>/dev/null || echo "dev.sh: no de_DE locale (KernelKeys locale tests skip)"
}

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "dev.sh: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# The sanitizer and fuzzing builds use clang (libFuzzer, and a TSan runtime
# that copes with the library's code); installed only for those entries.
CLANG_PACKAGES=(clang-19 libclang-rt-19-dev libfuzzer-19-dev)

install_clang() {
  PACKAGES+=("${CLANG_PACKAGES[@]}")
  install_deps
}

# One clang build serves the ASan + UBSan tests and the fuzzers: the library
# and the tests carry libFuzzer's coverage instrumentation (which costs them
# little), the harnesses link libFuzzer's main.
ASAN_DIR=build-asan-clang
asan_clang_build() {
  build $ASAN_DIR -DCMAKE_CXX_COMPILER=clang++-19 -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTILEJIT_SANITIZE=ON -DTILEJIT_FUZZ=ON -DTILEJIT_BUILD_BENCH=OFF -DTILEJIT_WERROR=ON
}

# A build without LLVM (a break there was once found only by hand): the glue
# kernels of attention (softmax step, decode), RoPE and MoE's GLU are C++ or
# the reference there (the LLVM-emitted ones serve every JIT path otherwise),
# TILEJIT_ISA=llvm is capped (its variants skip), the tool and the IR program
# runner lose their LLVM parts. CI builds all of it and runs the tests of those
# paths on amx and avx512, the llvm variants (~1 min on 2 cores):
NOLLVM_TESTS='_llvm$|^(attention|rope|moe|attention_threads|nan_semantics|hostile_input)_test_(amx|avx512)$'
NOLLVM_TESTS+='|^attention_extend_test_avx512$|^(glu_kernel_test|ir_test)$'
# The quantized GEMMs and experts: Xbyak dequant / act_quant / int8 / fused kernels only.
NOLLVM_TESTS+='|^(quant_gemm|int8_brgemm|moe_quant)_test_(amx|avx512)$'
# The tuner and its database (knobs of LLVM kernels are refused at load
# there), the registry (no llvm rows, no disassembler).
NOLLVM_TESTS+='|^(tuning_test|tune_tool_test|registry_test)$'
NOLLVM_TESTS+='|^(dequant_kernel|quant_kernels|quant_brgemm)_test$'
# A host without AVX-512 (AVX2-only, e.g. AMD Zen 2/3) has neither Xbyak path:
# there the fallbacks are the scalar ones, so their variants run instead.
HOST_AVX512=0
grep -qw avx512bw /proc/cpuinfo 2>/dev/null && HOST_AVX512=1
if [ "$HOST_AVX512" = 0 ]; then
  NOLLVM_TESTS+='|^(attention|rope|moe|nan_semantics|hostile_input|quant_gemm|moe_quant)_test_scalar$'
fi

# The tests where threads meet: compile-once under concurrent misses
# (cache_test), attention's thread pool and per-thread state
# (attention_threads_test), processes and threads sharing a disk cache
# (disk_cache_test).
TSAN_TARGETS=(cache_test attention_threads_test disk_cache_test thread_pool_test)
TSAN_TESTS='^(cache_test_(avx512|llvm|amx)|attention_threads_test_(amx|avx512|llvm|scalar)|disk_cache_test|thread_pool_test)$'
tsan() {
  install_clang
  cmake -S . -B build-tsan -G Ninja -DCMAKE_CXX_COMPILER=clang++-19 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEJIT_SANITIZE=thread -DTILEJIT_BUILD_BENCH=OFF
  cmake --build build-tsan -j "$(nproc)" --target "${TSAN_TARGETS[@]}"
  # halt_on_error: a race fails its test instead of scrolling past in the log.
  # die_after_fork=0: disk_cache_test forks worker processes from a threaded
  # test binary (each child runs threads of its own). The suppressions are
  # reports TSan cannot judge, each explained in the file.
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 die_after_fork=0 suppressions=$PWD/cmake/tsan-suppressions.txt" \
    ctest --test-dir build-tsan --output-on-failure -j "$(nproc)" -R "$TSAN_TESTS"
}

build() {  # build DIR [cmake args...]
  local dir=$1; shift
  cmake -S . -B "$dir" -G Ninja "$@"
  cmake --build "$dir" -j "$(nproc)"
}

cmd=${1:-}
case "$cmd" in
  run)
    install_deps
    build build -DCMAKE_BUILD_TYPE=Release
    ./build/tools/tilejit llama-layer
    ;;
  test)
    install_deps
    make_test_locale
    # TILEJIT_PYTHON: the module too; ctest's python_tests runs tests/python
    # (pytest) against it.
    build build -DCMAKE_BUILD_TYPE=Release -DTILEJIT_WERROR=ON -DTILEJIT_PYTHON=ON
    ctest --test-dir build --output-on-failure -j "$(nproc)"
    ;;
  python)
    # The library and the Python package into /usr/local (Debian's
    # /usr/bin/python3 reads /usr/local/lib/python3.X/dist-packages):
    # docs/python.md "Install".
    install_deps
    build build -DCMAKE_BUILD_TYPE=Release -DTILEJIT_PYTHON=ON
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo cmake --install build
    (cd / && /usr/bin/python3 -c "import tilejit; print('tilejit', tilejit.__version__, tilejit.cpu_info()['isa'])")
    ;;
  asan)
    install_deps
    build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEJIT_SANITIZE=ON -DTILEJIT_BUILD_BENCH=OFF
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
    ;;
  asan-ci)
    # What CI runs under the sanitizers (the whole suite takes ~12 min on 2
    # cores): every test that is not a per-ISA variant, plus the variants of
    # the best path (amx: native, or emulated where the CPU lacks AMX). Not
    # the *_amx_emulated reruns an AMX machine adds: they check the emulator
    # (test support) against the hardware, and under ASan take 2.5-5 min each;
    # nor the reruns of LLVM tests on a narrowed target (_avx2, _avxvnni).
    # On a host without AVX-512 the amx variants would skip (the emulator
    # needs AVX-512 too): the best path there is llvm, whose variants run.
    install_clang
    asan_clang_build
    asan_skip='_(avx512|llvm|scalar)$'
    [ "$HOST_AVX512" = 0 ] && asan_skip='_(amx|avx512|scalar)$'
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir $ASAN_DIR --output-on-failure -j "$(nproc)" \
      -E "$asan_skip"'|_avx2$|_avxvnni$|_amx_emulated$|^tool_test$|^llvm_backend_test'
    ;;
  nollvm-ci)
    install_deps
    build build-nollvm -DCMAKE_BUILD_TYPE=Release -DTILEJIT_WITH_LLVM=OFF -DTILEJIT_WERROR=ON \
      -DTILEJIT_BUILD_BENCH=OFF
    ctest --test-dir build-nollvm --output-on-failure -j "$(nproc)" -R "$NOLLVM_TESTS"
    ./build-nollvm/tools/tilejit cpuinfo
    ;;
  format-check)
    PACKAGES=(clang-format)
    install_deps
    # Debian 12's clang-format is 14, the version the tree is formatted with
    # (.clang-format).
    clang-format --version
    git ls-files -z '*.cpp' '*.h' | xargs -0 clang-format --dry-run -Werror
    echo "format-check: $(git ls-files '*.cpp' '*.h' | wc -l) files formatted"
    ;;
  tsan|tsan-ci)
    tsan
    ;;
  fuzz|fuzz-ci)
    seconds=${2:-60}
    [ "$cmd" = fuzz-ci ] && seconds=30
    install_clang
    asan_clang_build
    fuzz/run.sh $ASAN_DIR "$seconds"
    # The paths the run above does not take (it runs the best one): the LLVM
    # kernels, and the AMX kernels (under the emulator where the CPU lacks
    # AMX), for the quantized-weight harnesses.
    TILEJIT_ISA=llvm fuzz/run.sh $ASAN_DIR "$seconds" quant_pack experts
    TILEJIT_ISA=amx TILEJIT_AMX_EMULATE=auto fuzz/run.sh $ASAN_DIR "$seconds" quant_pack experts
    ;;
  *)
    echo "usage: ./dev.sh run|test|python|asan|asan-ci|tsan|tsan-ci|fuzz [seconds]|fuzz-ci|nollvm-ci|format-check" >&2
    exit 2
    ;;
esac
