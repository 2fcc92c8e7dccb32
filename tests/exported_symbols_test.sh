#!/usr/bin/env bash
# libtilejit exports tilejit's own symbols only (cmake/tilejit.map): a
# function the library instantiates from LLVM, Xbyak, fmt or nlohmann-json
# headers, left exported, is bound to a host process's own copy when the host
# has one (an engine linking another LLVM crashed in our decode emitter).
# Usage: exported_symbols_test.sh <libtilejit.so> [tilejit_c.h]
set -euo pipefail
lib=$1
all=$(nm -D --defined-only -C "$lib" | awk '{ $1 = ""; $2 = ""; sub(/^  /, ""); print }')
[ -n "$all" ] || { echo "FAIL: no dynamic symbols read from $lib"; exit 1; }
others=$(grep -v -e 'tilejit::' -e '^tilejit_' <<<"$all" || true)
if [ -n "$others" ]; then
  echo "FAIL: $(wc -l <<<"$others") exported symbols are not tilejit's, e.g.:"
  head -20 <<<"$others"
  exit 1
fi
# The public API is still there.
for s in 'tilejit::gemm(' 'tilejit::decode_attention(' 'typeinfo for tilejit::Error'; do
  grep -qF "$s" <<<"$all" || { echo "FAIL: $s is not exported"; exit 1; }
done
# Every function the C header declares (include/tilejit/tilejit_c.h).
if [ -n "${2:-}" ]; then
  declared=$(grep -oE '^[a-z_* ]*\b(tilejit_[a-z0-9_]+)\(' "$2" | sed -E 's/.*\b(tilejit_[a-z0-9_]+)\($/\1/' | sort -u)
  [ "$(wc -l <<<"$declared")" -ge 40 ] || { echo "FAIL: too few C functions read from $2"; exit 1; }
  for f in $declared; do
    grep -qx "$f" <<<"$all" || { echo "FAIL: $f (declared in $2) is not exported"; exit 1; }
  done
fi
echo "OK: $(wc -l <<<"$all") exported symbols, all tilejit's"
