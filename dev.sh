#!/usr/bin/env bash
# One entry point for a fresh Debian 12 machine:
#   ./dev.sh run    install dependencies, build, run the main job (tilejit llama-layer)
#   ./dev.sh test   install dependencies, build, run the test suite (ctest)
#   ./dev.sh asan   the test suite under AddressSanitizer + UndefinedBehaviorSanitizer
#   ./dev.sh asan-ci  the part of it CI runs (after ./dev.sh test)
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(cmake ninja-build g++ libxbyak-dev llvm-19-dev libfmt-dev googletest libgtest-dev
          libbenchmark-dev libdnnl-dev libcli11-dev nlohmann-json3-dev)

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
    build build -DCMAKE_BUILD_TYPE=Release
    ctest --test-dir build --output-on-failure -j "$(nproc)"
    ;;
  asan)
    install_deps
    build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEJIT_SANITIZE=ON -DTILEJIT_BUILD_BENCH=OFF
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$(nproc)"
    ;;
  asan-ci)
    # What CI runs under the sanitizers (the whole suite takes ~12 min on 2
    # cores): every test that is not a per-ISA variant, plus the variants of
    # the best path (amx: native, or emulated where the CPU lacks AMX).
    install_deps
    build build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTILEJIT_SANITIZE=ON -DTILEJIT_BUILD_BENCH=OFF
    ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$(nproc)" \
      -E '_(avx512|llvm|scalar)$|_llvm_avx2$|^tool_test$|^llvm_backend_test'
    ;;
  *)
    echo "usage: ./dev.sh run|test|asan|asan-ci" >&2
    exit 2
    ;;
esac
