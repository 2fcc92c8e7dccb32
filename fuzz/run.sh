#!/usr/bin/env bash
# Runs the libFuzzer harnesses of a TILEJIT_FUZZ=ON build one after another,
# each for SECONDS, one process at a time (docs/reliability.md):
#   fuzz/run.sh BUILD_DIR SECONDS [harness...]     (default: every harness)
# Harnesses run side by side, one per core (FUZZ_JOBS, default nproc), each
# on one library thread (TILEJIT_NUM_THREADS=1): every harness still gets
# SECONDS of one core, and CI waits a third as long on two cores as it
# would one at a time.
# Each harness grows its corpus under BUILD_DIR/fuzz-work/<name> from the
# committed seeds in fuzz/corpus/<name>; a crash, leak, timeout or failed
# check leaves its input in BUILD_DIR/fuzz-crashes/ and fails the run. Every
# run appends "date harness path=TILEJIT_ISA seconds runs result" to
# BUILD_DIR/fuzz-work/log.
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: fuzz/run.sh BUILD_DIR SECONDS [harness...]}
seconds=${2:?usage: fuzz/run.sh BUILD_DIR SECONDS [harness...]}
shift 2
harnesses=("$@")
[ ${#harnesses[@]} -eq 0 ] && harnesses=(ir_pipeline npy disk_cache api quant_pack experts)

mkdir -p "$build/fuzz-work" "$build/fuzz-crashes"
for h in "${harnesses[@]}"; do
  if [ ! -x "$build/fuzz/${h}_fuzzer" ]; then
    echo "fuzz/run.sh: $build/fuzz/${h}_fuzzer is not built (configure with -DTILEJIT_FUZZ=ON)" >&2
    exit 2
  fi
done

# One harness: its reproducers, then SECONDS of fuzzing; exit status 1 on a failure.
run_one() {
  local h=$1 bin="$build/fuzz/${1}_fuzzer" failed=0
  work="$build/fuzz-work/$h"
  mkdir -p "$work"
  # One log per harness and path: runs of one harness on two paths side by
  # side would otherwise write one file (and mix their stats).
  log="$build/fuzz-work/$h.${TILEJIT_ISA:-best}.last.log"
  # The committed reproducers of past findings (fuzz/crashes/<harness>-*)
  # first: each is a regression test that must now pass.
  repro=(fuzz/crashes/"$h"-*)
  if [ -e "${repro[0]}" ]; then
    if ! TILEJIT_CACHE_DIR= "$bin" "${repro[@]}" >"$log" 2>&1; then
      echo "$(date -u +%FT%TZ) $h reproducers FAILED" | tee -a "$build/fuzz-work/log"
      grep -E 'ERROR|SUMMARY|fuzzer: |Running:' "$log" | head -20 >&2
      return 1
    fi
  fi
  start=$(date +%s)
  # -timeout: one input taking longer is a hang; -rss_limit_mb: one that
  # allocates past it is unbounded allocation. The disk cache off, so inputs
  # do not share kernels through a directory.
  TILEJIT_CACHE_DIR= "$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$build/fuzz-crashes/$h-" \
    "$work" "fuzz/corpus/$h" >"$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - start ))
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  if [ $rc -eq 0 ]; then
    result=clean
  else
    result="FAILED(exit $rc)"
    failed=1
  fi
  echo "$(date -u +%FT%TZ) $h path=${TILEJIT_ISA:-best} ${took}s ${runs:-0} $result" | tee -a "$build/fuzz-work/log"
  if [ $rc -ne 0 ]; then
    grep -E 'ERROR|SUMMARY|fuzzer: |Test unit written' "$log" | head -20 >&2
  fi
  return $failed
}

export TILEJIT_NUM_THREADS=1
jobs=${FUZZ_JOBS:-$(nproc)}
failed=0
running=0
for h in "${harnesses[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  run_one "$h" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed
