#!/usr/bin/env bash
# End-to-end test of `tilejit tune` (docs/tuning.md) on a tiny workload:
#
#   tests/tune_tool_test.sh <path to tilejit>
#
# non-TTY progress lines, a valid database, a second process that compiles
# no kernel (the warm-up filled the disk cache), --budget stopping cleanly,
# --resume skipping finished entries, ^C leaving a valid database, a tuned
# entry named by `dump --stage plan` and run by `run --check`, a stale
# entry ignored with one verbose line, bad workload fields named.
set -u

TJ=${1:?usage: tune_tool_test.sh <tilejit binary>}
PY=/usr/bin/python3
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tilejit_tune_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export TILEJIT_CACHE_DIR=$WORK/cache
unset TILEJIT_TUNING_DB TILEJIT_VERBOSE

# shellcheck source=tests/check_lib.sh
source "$(dirname "$0")/check_lib.sh"
check() {  # check <description> <condition command...>
  local what=$1
  shift
  checks=$((checks + 1))
  "$@" || fail "$what"
}
entries() {  # entries <db>: the number of entries of a valid database (error otherwise)
  $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["tilejit_tuning_db"] == 1; print(len(d["entries"]))' "$1"
}

cat >"$WORK/tiny.json" <<'EOF'
{"name": "tiny", "ops": [
 {"op": "gemm", "name": "proj", "n": 256, "k": 512, "m": [1, 16, 40]},
 {"op": "decode_attention", "name": "dec", "d": 64, "hq": 4, "hkv": 2, "batch": [1], "seq_len": [512]},
 {"op": "prefill_attention", "name": "pre", "d": 64, "hq": 4, "hkv": 2, "seq_len": [32]},
 {"op": "moe", "name": "exp", "e": 4, "topk": 2, "h": 128, "i": 64, "t": [1, 4]},
 {"op": "extend_attention", "name": "ext", "d": 64, "hq": 4, "hkv": 2, "prefix_len": 40, "seq_len": [24]},
 {"op": "rope", "name": "rope", "d": 64, "hq": 4, "hkv": 2, "style": "gptj", "t": [3, 16]}
]}
EOF
NENTRIES=8  # 3 gemm M buckets, 1 decode, 1 prefill, 2 moe, 1 extend (rope is warm-up only)
NCALLS=10   # 3 gemm + 1 decode + 1 prefill + 2 moe + 1 extend + 2 rope

# 1. A full run, stdout a file (not a TTY): plain lines, no \r bar.
"$TJ" tune "$WORK/tiny.json" --out "$WORK/db.json" --budget 2m >"$OUT" 2>"$ERR"
rc=$?
check "tune exits 0 (got $rc)" test $rc -eq 0
check "one progress line per entry" test "$(grep -c '^tune \[[0-9]/8\] ' "$OUT")" -eq $NENTRIES
check "no carriage return off a TTY" bash -c "! grep -q $'\r' '$OUT' '$ERR'"
check "a result line per entry" test "$(grep -c -- '-> ' "$OUT")" -eq $NENTRIES
check "the warm-up line" grep -q "^warm-up: $NCALLS operator calls: " "$OUT"
check "says its operands are cold" grep -q "^cold operands: .* past 4 x the [0-9]* MiB last-level cache" "$OUT"
check "database valid with every entry" test "$(entries "$WORK/db.json")" = $NENTRIES

# 1b. On a terminal (a pty from script(1), where installed): the one-line
# bar with an ETA, redrawn with \r, instead of the plain lines.
if command -v script >/dev/null; then
  script -qfec "'$TJ' tune '$WORK/tiny.json' --out '$WORK/dbtty.json' --budget 2m" /dev/null \
    >"$OUT" 2>"$ERR"
  check "TTY: a bar with an ETA redrawn with \\r" grep -aq $'\r\[[#-]*\] [0-9]/8 ETA ' "$OUT"
  check "TTY: no plain progress lines" bash -c "! grep -aq '^tune \[' '$OUT'"
fi

# 2. A second process: every kernel of the workload from the disk cache.
"$TJ" tune "$WORK/tiny.json" --out "$WORK/db.json" --no-search >"$OUT" 2>"$ERR"
check "second process compiles 0 kernels, loads from disk" \
  grep -Eq "^warm-up: $NCALLS operator calls: 0 kernels compiled, [1-9][0-9]* loaded" "$OUT"

# 3. --budget: a budget smaller than one entry stops cleanly with a valid
# (empty) database; --resume then tunes everything.
"$TJ" tune "$WORK/tiny.json" --out "$WORK/db2.json" --budget 0.01s >"$OUT" 2>"$ERR"
rc=$?
check "tiny budget exits 0 (got $rc)" test $rc -eq 0
check "budget message" grep -q 'budget of .* reached' "$OUT"
check "database valid after the budget" test "$(entries "$WORK/db2.json")" -lt $NENTRIES
"$TJ" tune "$WORK/tiny.json" --out "$WORK/db2.json" --resume --budget 2m >"$OUT" 2>"$ERR"
check "--resume completes the database" test "$(entries "$WORK/db2.json")" = $NENTRIES

# 4. --resume skips what is there: drop two entries, two are tuned again.
$PY -c 'import json,sys; d=json.load(open(sys.argv[1])); d["entries"]=d["entries"][:-2]; json.dump(d, open(sys.argv[2],"w"))' \
  "$WORK/db.json" "$WORK/db3.json"
"$TJ" tune "$WORK/tiny.json" --out "$WORK/db3.json" --resume --budget 2m >"$OUT" 2>"$ERR"
check "--resume names the entries it skips" grep -q '2 entries to tune, 6 already in the database (--resume)' "$OUT"
check "--resume tunes only the missing ones" test "$(grep -c '^tune \[' "$OUT")" -eq 2
check "database complete again" test "$(entries "$WORK/db3.json")" = $NENTRIES

# 5. ^C: the measurement in progress is abandoned, the database is valid.
cat >"$WORK/long.json" <<'EOF'
{"name": "long", "ops": [{"op": "gemm", "n": 2048, "k": 2048, "m": {"from": 1, "to": 4096}}]}
EOF
"$TJ" tune "$WORK/long.json" --out "$WORK/db4.json" --budget 5m >"$OUT" 2>"$ERR" &
pid=$!
# Wait for the first finished entry (up to 60 s: under a loaded ctest -j the
# first entry once took longer than the 10 s this waited before, and the
# interrupt came before any entry was kept), then interrupt.
for _ in $(seq 600); do
  grep -q -- '-> ' "$OUT" 2>/dev/null && break
  sleep 0.1
done
kill -INT $pid
wait $pid
rc=$?
check "^C exits 130 (got $rc)" test $rc -eq 130
check "^C says how to continue" grep -q 'interrupted: .*--resume' "$OUT"
n4=$(entries "$WORK/db4.json")
check "database valid after ^C" test -n "$n4"
check "^C kept the finished entries" test "${n4:-0}" -ge 1

# 6. A tuned entry: dump names it, run --check passes with it, verbose logs it.
cat >"$WORK/proj.tir" <<'EOF'
func @proj(%x: tensor<?Mx512xbf16>, %w: tensor<256x512xbf16, packed<vnni2, n_block=64, k_pair=2>>)
    -> (tensor<?Mx256xbf16>) {
  %acc = gemm %x, %w : tensor<?Mx256xf32>
  %y = cast %acc {to = bf16} : tensor<?Mx256xbf16>
  return %y
}
EOF
# The M = 40 entry (bucket 17-64) of this machine, with knobs that are valid
# on its path (AMX: whole 32-row blocks; AVX-512 / LLVM: mr 4).
$PY - "$WORK/db.json" "$WORK/tuned.json" "$WORK/stale.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
e = [x for x in d["entries"] if x["family"] == "gemm" and x["shape"]["m"] == "17-64"][0]
e["knobs"] = {"task_rows": 32} if e["shape"]["path"] == "amx" else {"mr": 4, "task_rows": 8}
json.dump({"tilejit_tuning_db": 1, "entries": [e]}, open(sys.argv[2], "w"), indent=1)
e = dict(e, cpu="AuthenticAMD-25-17-1-elsewhere")
json.dump({"tilejit_tuning_db": 1, "entries": [e]}, open(sys.argv[3], "w"), indent=1)
EOF
TILEJIT_TUNING_DB=$WORK/tuned.json "$TJ" dump "$WORK/proj.tir" --stage plan --dim M=40 >"$OUT" 2>"$ERR"
check "dump --stage plan names the tuned entry" grep -q 'tuned        entry gemm:.*m=17-64.*n=256' "$OUT"
TILEJIT_TUNING_DB=$WORK/tuned.json "$TJ" dump "$WORK/proj.tir" --stage plan --dim M=1 >"$OUT" 2>"$ERR"
check "no entry at another M bucket" bash -c "! grep -q 'tuned ' '$OUT'"
TILEJIT_TUNING_DB=$WORK/tuned.json TILEJIT_VERBOSE=1 "$TJ" run "$WORK/proj.tir" --random-inputs 3 \
  --dim M=40 --check >"$OUT" 2>"$ERR"
rc=$?
check "run --check with the tuned plan passes (rc $rc)" test $rc -eq 0
check "run --check PASS" grep -q 'PASS' "$OUT"
check "verbose logs the tuned plan" grep -q 'tilejit: tuned plan gemm:.*m=17-64' "$ERR"
TILEJIT_TUNING_DB=$WORK/stale.json TILEJIT_VERBOSE=1 "$TJ" run "$WORK/proj.tir" --random-inputs 3 \
  --dim M=40 --check >"$OUT" 2>"$ERR"
check "a stale entry: one verbose line" test "$(grep -c '1 stale' "$ERR")" -eq 1
check "a stale entry is not applied" bash -c "! grep -q 'tuned plan' '$ERR'"

# 6b. The main job marks the attention rows that ran a tuned entry, whatever
# knobs the entry holds (a decode entry with only prefetch_chunks once threw
# there): Llama-3-8B decode at B = 16 and prefill at T = 512, this machine's
# path and build (taken from the decode entry tune wrote). The decode knob:
# prefetch_chunks where the LLVM decode kernel exists, splits otherwise
# (a build without LLVM refuses prefetch_chunks at load).
DEC_KNOB=splits=3
"$TJ" cpuinfo | grep -Eq '^  decode_attention +llvm' && DEC_KNOB=prefetch_chunks=4
$PY - "$WORK/db.json" "$WORK/job.json" "$DEC_KNOB" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
knob, value = sys.argv[3].split("=")
dec = [x for x in d["entries"] if x["family"] == "decode_attention"][0]
common = {"path": dec["shape"]["path"], "threads": dec["shape"]["threads"], "d": "128", "dv": "128",
          "hq": "32", "hkv": "8"}
e1 = dict(dec, shape=dict(common, block="16", kv="bf16", batch="5-16", seq="1025-4096"),
          knobs={knob: int(value)})
e2 = dict(dec, family="prefill_attention", shape=dict(common, causal="1", batch="1", seq="257-1024"),
          knobs={"key_block": 64, "rows": 32})
e3 = dict(dec, shape=dict(common, block="16", kv="f8e4m3", batch="5-16", seq="1025-4096"),
          knobs={"splits": 2})
json.dump({"tilejit_tuning_db": 1, "entries": [e1, e2, e3]}, open(sys.argv[2], "w"), indent=1)
EOF
"$TJ" llama-layer --only dense --no-check --seconds 0.01 --tuning-db "$WORK/job.json" >"$OUT" 2>"$ERR"
rc=$?
check "llama-layer with attention entries exits 0 (got $rc)" test $rc -eq 0
check "the B=16 decode row is marked tuned" grep -Eq "^attn_decode +16 .*\(tuned $DEC_KNOB\)" "$OUT"
check "the T=512 prefill row is marked tuned" grep -Eq '^attn_prefill +512 .*\(tuned key_block=64 rows=32\)' "$OUT"
check "the fp8-cache decode row is marked with its own entry" grep -Eq '^attn_decode_f8 +16 .*\(tuned splits=2\)' "$OUT"
check "no other attention row is" test "$(grep -E '^attn_' "$OUT" | grep -c tuned)" -eq 3

# 7. Bad input: one-line errors naming the field (exit 1), bad options (exit 2).
echo '{"ops": [{"op": "gemm", "n": 8, "k": 0, "m": [1]}]}' >"$WORK/bad.json"
"$TJ" tune "$WORK/bad.json" --out "$WORK/x.json" >"$OUT" 2>"$ERR"
rc=$?
check "bad workload exits 1 (got $rc)" test $rc -eq 1
check "bad workload names the field" grep -q 'bad.json: ops\[0\].k: 0; allowed: an integer in \[1, ' "$ERR"
"$TJ" tune "$WORK/tiny.json" --budget 10x >"$OUT" 2>"$ERR"
check "bad --budget exits 2" test $? -eq 2
printf '{"tilejit_tuning_db": 1,\n "entries": [\n  {"family": "gemm", "shape": }\n]}\n' >"$WORK/corrupt.json"
"$TJ" tune "$WORK/tiny.json" --out "$WORK/corrupt.json" >"$OUT" 2>"$ERR"
check "corrupt database: exit 1" test $? -eq 1
check "corrupt database: file and line" grep -q "corrupt.json:3: error: the tuning database is not valid JSON" "$ERR"

# 8. Quantized entries (synthetic checkpoints of each route: int4 fused
# decode kernel at M=1, the dequant route at M=40, W8A8, fp8 experts): tuned,
# and a second process compiles none of their kernels either.
cat >"$WORK/quant.json" <<'EOF'
{"name": "quant", "ops": [
 {"op": "gemm", "name": "q4", "n": 256, "k": 512, "format": "int4_gptq", "group_size": 128, "m": [1, 40]},
 {"op": "gemm", "name": "q8", "n": 256, "k": 512, "format": "int8", "m": [16]},
 {"op": "moe", "name": "qexp", "e": 4, "topk": 2, "h": 128, "i": 64, "format": "fp8_e4m3", "t": [4]},
 {"op": "decode_attention", "name": "dec8", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e4m3", "batch": [1], "seq_len": [512]},
 {"op": "extend_attention", "name": "ext8", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e4m3", "prefix_len": 40, "seq_len": [24]},
 {"op": "decode_attention", "name": "dec5", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e5m2", "batch": [1], "seq_len": [512]},
 {"op": "extend_attention", "name": "ext5", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e5m2", "prefix_len": 40, "seq_len": [24]}
]}
EOF
"$TJ" tune "$WORK/quant.json" --out "$WORK/dbq.json" --budget 1m >"$OUT" 2>"$ERR"
rc=$?
check "quantized tune exits 0 (got $rc)" test $rc -eq 0
check "quantized database has every entry" test "$(entries "$WORK/dbq.json")" = 8
check "the fused route has no plan knob" grep -q 'M=1 int4_gptq: .*the fused decode kernel: no plan knob' "$OUT"
# The int4 route is a candidate wherever the LLVM W4A8 kernels run (a build
# with LLVM on a JIT path): M=1 and M=40 each try the route they do not take.
if "$TJ" cpuinfo | grep -Eq '^  brgemm +llvm +llvm +yes'; then
  check "int4: the other route tried at M=1" grep -Eq 'tried: .*w4a8=[01]' "$OUT"
  check "int4: both M buckets try a route" test "$(grep -Ec 'tried: .*w4a8=[01]' "$OUT")" -ge 2
fi
check "quantized entries carry their format" grep -q '"fmt": *"int4_gptq"' "$WORK/dbq.json"
check "fp8 KV cache: decode and extend entries keyed by the cache dtype" \
  test "$($PY -c 'import json,sys; print(sum(e["shape"].get("kv") == "f8e4m3" for e in json.load(open(sys.argv[1]))["entries"]))' "$WORK/dbq.json")" = 2
check "fp8 KV cache: the labels say so" test "$(grep -c '^tune \[.*kv=f8e4m3$' "$OUT")" -eq 2
check "e5m2 KV cache: decode and extend entries keyed by the cache dtype" \
  test "$($PY -c 'import json,sys; print(sum(e["shape"].get("kv") == "f8e5m2" for e in json.load(open(sys.argv[1]))["entries"]))' "$WORK/dbq.json")" = 2
check "e5m2 KV cache: the labels say so" test "$(grep -c '^tune \[.*kv=f8e5m2$' "$OUT")" -eq 2
# dump names a quantized program's entry and follows its route: the M=40
# int4 bucket's entry, made to say W4A16 (w4a8 = 0), applied to
# examples/gemm_int4_gptq.tir (the same N, K, format) at M=40.
EX=$(dirname "$0")/../examples/gemm_int4_gptq.tir
$PY - "$WORK/dbq.json" "$WORK/dbw.json" <<'PYEOF'
import json, sys
db = json.load(open(sys.argv[1]))
keep = []
for e in db["entries"]:
    s = e["shape"]
    lo, _, hi = s.get("m", "").partition("-")
    if s.get("fmt") == "int4_gptq" and lo.isdigit() and int(lo) <= 40 <= int(hi or lo):
        s["out"] = "bf16"
        e["knobs"] = {"w4a8": 0}
        keep.append(e)
db["entries"] = keep
json.dump(db, open(sys.argv[2], "w"))
PYEOF
"$TJ" dump "$EX" --stage plan --dim M=40 >"$OUT" 2>"$ERR"
if grep -q 'int4_route automatic takes W4A8' "$OUT"; then
  TILEJIT_TUNING_DB="$WORK/dbw.json" "$TJ" dump "$EX" --stage plan --dim M=40 >"$OUT" 2>"$ERR"
  check "dump names the tuned int4 entry" grep -Eq '^  tuned +gemm:.*fmt=int4_gptq' "$OUT"
  check "dump follows the entry's route (W4A16)" bash -c "! grep -q 'takes W4A8' '$OUT'"
  TILEJIT_TUNING_DB="$WORK/dbw.json" TILEJIT_VERBOSE=1 "$TJ" run "$EX" --random-inputs 1 --dim M=40 >"$OUT" 2>"$ERR"
  check "the run takes the same route" grep -q 'gemm w4a16 M=40' "$ERR"
fi
"$TJ" tune "$WORK/quant.json" --out "$WORK/dbq.json" --no-search >"$OUT" 2>"$ERR"
check "quantized and fp8 cache: second process compiles 0 kernels" \
  grep -Eq '^warm-up: 8 operator calls: 0 kernels compiled, [1-9][0-9]* loaded' "$OUT"
echo '{"ops": [{"op": "gemm", "n": 8, "k": 64, "format": "int3", "m": [1]}]}' >"$WORK/badq.json"
"$TJ" tune "$WORK/badq.json" --out "$WORK/x.json" >"$OUT" 2>"$ERR"
check "bad format named with the allowed ones" grep -q 'ops\[0\].format: "int3"; allowed: bf16, int8, fp8_e4m3' "$ERR"
# The e5m2 ops time an e5m2 cache (store_kv's codes, read with the cache's
# scales): the decode kernel the warm-up compiles is the e5m2 one.
echo '{"ops": [{"op": "decode_attention", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e5m2", "batch": [1], "seq_len": [64]}]}' >"$WORK/kv5.json"
TILEJIT_CACHE_DIR= TILEJIT_VERBOSE=1 "$TJ" tune "$WORK/kv5.json" --out "$WORK/db5.json" --no-search >"$OUT" 2>"$ERR"
check "e5m2 decode warm-up exits 0" test $? -eq 0
check "e5m2 decode: no e4m3 cache kernel" bash -c "! grep -q 'compiled decode_attn.*kvf8e4m3' '$ERR'"
if grep -q 'compiled decode_attn_llvm' "$ERR"; then
  check "e5m2 decode: the e5m2 cache kernel" grep -Eq 'compiled decode_attn_llvm_[a-z0-9_]*_kvf8e5m2' "$ERR"
fi
echo '{"ops": [{"op": "extend_attention", "d": 64, "hq": 4, "hkv": 2, "kv": "f8e3m4", "seq_len": [4]}]}' >"$WORK/badkv.json"
"$TJ" tune "$WORK/badkv.json" --out "$WORK/x.json" >"$OUT" 2>"$ERR"
check "bad kv named with the allowed ones" grep -q 'ops\[0\].kv: "f8e3m4"; allowed: bf16, f8e4m3, f8e5m2' "$ERR"

# 9. --model-config with --kv-cache-dtype: the decode and extend ops over an
# fp8 cache (prefill has no cache); a bad dtype or the flag without a config
# is an error.
CFG=$(dirname "$0")/../examples/tune/llama3-8b-config.json
"$TJ" tune --model-config "$CFG" --kv-cache-dtype f8e4m3 --save-workload "$WORK/kv8.json" >"$OUT" 2>"$ERR"
rc=$?
check "--kv-cache-dtype: workload written (rc $rc)" test $rc -eq 0 -a -s "$WORK/kv8.json"
check "--kv-cache-dtype: decode and extend over f8e4m3, prefill without" \
  test "$($PY -c 'import json,sys; print(sorted((o["op"], o.get("kv")) for o in json.load(open(sys.argv[1]))["ops"] if "attention" in o["op"]))' "$WORK/kv8.json")" = \
  "[('decode_attention', 'f8e4m3'), ('extend_attention', 'f8e4m3'), ('prefill_attention', None)]"
"$TJ" tune --model-config "$CFG" --kv-cache-dtype fp8 --save-workload "$WORK/x.json" >"$OUT" 2>"$ERR"
rc=$?
check "bad --kv-cache-dtype: exit 1 (got $rc)" test $rc -eq 1
check "bad --kv-cache-dtype named with the allowed ones" grep -q -- '--kv-cache-dtype: "fp8"; allowed: bf16, f8e4m3, f8e5m2' "$ERR"
"$TJ" tune "$WORK/tiny.json" --kv-cache-dtype f8e4m3 >"$OUT" 2>"$ERR"
check "--kv-cache-dtype without --model-config: exit 2" test $? -eq 2

# 10. Hostile inputs: a wrong-typed config field or DB field is exit 1 naming
# it (never 3); a FIFO, /dev/zero or a directory as a file is an error, not a
# hang; a budget past a week and --threads 0 are usage errors (exit 2).
printf '{"hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,"num_key_value_heads":8,"model_type":null,"hidden_act":5}' >"$WORK/c.json"
"$TJ" tune --model-config "$WORK/c.json" --save-workload "$WORK/w.json" >"$OUT" 2>"$ERR"
rc=$?
check "wrong-typed config field: exit 1 (got $rc)" test $rc -eq 1
check "wrong-typed config field named" grep -q 'c.json: hidden_act: 5; allowed: a string' "$ERR"
for cfg in mixtral gpt-oss; do
  if [ $cfg = mixtral ]; then
    printf '{"hidden_size":4096,"num_attention_heads":32,"num_key_value_heads":8,"intermediate_size":14336,"num_local_experts":8,"num_experts_per_tok":2}' >"$WORK/$cfg.json"
  else
    printf '{"hidden_size":2880,"num_attention_heads":64,"num_key_value_heads":8,"head_dim":64,"intermediate_size":2880,"num_local_experts":32,"experts_per_token":4,"quantization_config":{"quant_method":"mxfp4"}}' >"$WORK/$cfg.json"
  fi
  "$TJ" tune --model-config "$WORK/$cfg.json" --save-workload "$WORK/$cfg-w.json" >"$OUT" 2>"$ERR"
  rc=$?
  check "$cfg config builds a workload (rc $rc)" test $rc -eq 0
  check "$cfg workload has its experts" grep -q '"op": *"moe"' "$WORK/$cfg-w.json"
done
SHAPE=$($PY -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["entries"][0]["shape"]))' "$WORK/db.json")
CPU=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["entries"][0]["cpu"])' "$WORK/db.json")
VER=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["entries"][0]["tilejit"])' "$WORK/db.json")
printf '{"tilejit_tuning_db":1,"entries":[{"family":"gemm","shape":%s,"knobs":{},"cpu":"%s","tilejit":"%s","measured":{"default_us":"fast"}}]}' \
  "$SHAPE" "$CPU" "$VER" >"$WORK/badm.json"
"$TJ" tune "$WORK/tiny.json" --no-search --out "$WORK/badm.json" >"$OUT" 2>"$ERR"
rc=$?
check "wrong-typed measured: exit 1 (got $rc)" test $rc -eq 1
check "wrong-typed measured named with its line" grep -q 'badm.json:1: error: tuning database entry 0: measured.default_us = "fast"' "$ERR"
printf '{"tilejit_tuning_db":1,"entries":[{"family":"mla_attention","shape":{"x":"1"},"knobs":{"nr":32},"cpu":"other","tilejit":"0.0"}]}' >"$WORK/foreign.json"
"$TJ" tune "$WORK/tiny.json" --no-search --out "$WORK/foreign.json" >"$OUT" 2>"$ERR"
rc=$?
check "a foreign entry of an unknown family loads (rc $rc)" test $rc -eq 0
mkfifo "$WORK/ff"
for args in "tune $WORK/ff" "tune $WORK/tiny.json --no-search --out $WORK/ff" "tune $WORK/tiny.json --out /dev/zero" "tune /dev/zero"; do
  # shellcheck disable=SC2086
  timeout 20 "$TJ" $args >"$OUT" 2>"$ERR"
  rc=$?
  check "'$args': exit 1, no hang (got $rc)" test $rc -eq 1
done
check "/dev/zero: the cap named" grep -q '/dev/zero: holds more than the 16 MiB a tune workload may have' "$ERR"
"$TJ" tune "$WORK/tiny.json" --out "$WORK" >"$OUT" 2>"$ERR"
check "--out a directory: named" grep -q "$WORK: is a directory" "$ERR"
for b in 1e10s 99999999999999999999m 1e300h; do
  "$TJ" tune "$WORK/tiny.json" --out "$WORK/b.json" --budget $b >"$OUT" 2>"$ERR"
  rc=$?
  check "--budget $b: exit 2 (got $rc)" test $rc -eq 2
done
for cmd in "tune $WORK/tiny.json" "llama-layer"; do
  # shellcheck disable=SC2086
  "$TJ" $cmd --threads 0 >"$OUT" 2>"$ERR"
  rc=$?
  check "$cmd --threads 0: exit 2 (got $rc)" test $rc -eq 2
  check "$cmd --threads 0: allowed named" grep -q "allowed: an integer >= 1" "$ERR"
done
printf '{"ops":[{"op":"gemm","name":"a\\nb\\u001b[31m","n":64,"k":64,"m":[1]}]}' >"$WORK/esc.json"
"$TJ" tune "$WORK/esc.json" --out "$WORK/esc-db.json" --budget 1s >"$OUT" 2>"$ERR"
check "control bytes of an op name escaped" grep -qF 'gemm a\x0ab\x1b[31m N=64' "$OUT"
check "no raw ESC printed" test "$(tr -dc '\033' <"$OUT" | wc -c)" -eq 0
ln -s "$WORK/real-db.json" "$WORK/link-db.json"
"$TJ" tune "$WORK/esc.json" --out "$WORK/link-db.json" --budget 1s >"$OUT" 2>"$ERR"
check "--out a symlink: written through it" test -L "$WORK/link-db.json" -a -s "$WORK/real-db.json"

# 12. Output paths: --save-workload to a FIFO nobody reads is an error, not
# a hang (the writer of `run --output`); an --out tune cannot write is
# found before the first measurement (a name too long was exit 3, a missing
# directory an error after the first entry); empty paths and options
# without the one they go with are usage errors.
mkfifo "$WORK/wfifo"
timeout 20 "$TJ" tune --model-config "$CFG" --save-workload "$WORK/wfifo" >"$OUT" 2>"$ERR"
rc=$?
check "--save-workload a FIFO with no reader: exit 1, no hang (got $rc)" test $rc -eq 1
check "--save-workload a FIFO: said so" grep -q "wfifo: cannot create: a FIFO with no reader" "$ERR"
LONG=$WORK/$(printf 'a%.0s' $(seq 300)).json
for out in "$WORK/no-such-dir/db.json" "$LONG"; do
  "$TJ" tune "$WORK/tiny.json" --out "$out" --budget 1m >"$OUT" 2>"$ERR"
  rc=$?
  check "--out ${out:0:60}...: exit 1 (got $rc)" test $rc -eq 1
  check "--out ${out:0:60}...: named before any measurement" \
    bash -c "grep -q -- '--out .*: cannot write the tuning database: ' '$ERR' && ! grep -q '^tune \[' '$OUT'"
done
timeout 20 "$TJ" tune "$WORK/tiny.json" --out "" --budget 1m >"$OUT" 2>"$ERR"
rc=$?
check "--out '': usage error, exit 2 (got $rc)" test $rc -eq 2
check "--out '': named" grep -q -- "--out: '' is not a file; allowed: a path" "$ERR"
timeout 20 "$TJ" tune --model-config "$CFG" --save-workload "" --budget 1s --out "$WORK/sw-db.json" \
  >"$OUT" 2>"$ERR"
rc=$?
check "--save-workload '': usage error, exit 2 (got $rc)" test $rc -eq 2
for args in "--save-workload $WORK/sw.json" "--rounds 5"; do
  # shellcheck disable=SC2086
  timeout 20 "$TJ" tune "$WORK/tiny.json" $args --budget 1s --out "$WORK/sw-db.json" >"$OUT" 2>"$ERR"
  rc=$?
  check "tune $args: usage error, exit 2 (got $rc)" test $rc -eq 2
done
check "--rounds without --verify named" grep -q -- '--rounds requires --verify' "$ERR"

# 13. Smaller things an outside tester found: a TILEJIT_CACHE_DIR that is a
# regular file is named as unusable (was "off (TILEJIT_CACHE_DIR=)"); --verify
# of a database that does not exist is an error (was "0 tuned entries
# verified", exit 0); a budget without its unit or in hex is a usage error
# (were seconds); two identical ops are one entry (were tuned twice).
: >"$WORK/afile"
TILEJIT_CACHE_DIR=$WORK/afile "$TJ" tune "$WORK/tiny.json" --out "$WORK/db.json" --no-search >"$OUT" 2>"$ERR"
check "a cache dir that is a file: named as unusable" \
  grep -q "^kernel cache off (TILEJIT_CACHE_DIR=$WORK/afile is not a usable directory" "$OUT"
"$TJ" tune "$WORK/tiny.json" --out "$WORK/none.json" --verify >"$OUT" 2>"$ERR"
rc=$?
check "--verify of no database: exit 1 (got $rc)" test $rc -eq 1
check "--verify of no database: said so" grep -q -- "--verify: the tuning database .*none.json does not exist" "$ERR"
for b in 5 0x10s; do
  "$TJ" tune "$WORK/tiny.json" --out "$WORK/b.json" --budget $b >"$OUT" 2>"$ERR"
  rc=$?
  check "--budget $b: exit 2 (got $rc)" test $rc -eq 2
done
echo '{"ops": [{"op": "gemm", "name": "a", "n": 64, "k": 64, "m": [1]}, {"op": "gemm", "name": "b", "n": 64, "k": 64, "m": [1]}]}' >"$WORK/dup.json"
"$TJ" tune "$WORK/dup.json" --out "$WORK/dup-db.json" --budget 5s >"$OUT" 2>"$ERR"
check "two identical ops: one entry tuned" grep -q "(2 ops, 1 entries to tune)" "$OUT"

# 11. A database whose parse does not fit in memory (2M empty objects
# within the structure bounds, ~300 MB parsed, under ulimit -v 200000): an
# Error naming the variable and the file (was a std::bad_alloc the CLI
# reported as "the tensors of this program ... do not fit"). Only where the
# tool itself runs under that limit.
$PY -c 'import sys; open(sys.argv[1], "w").write("{\"tilejit_tuning_db\":1,\"entries\":[" + ",".join(["{}"] * 2000000) + "]}")' "$WORK/huge.json"
if (ulimit -v 200000 && "$TJ" dump "$WORK/proj.tir" --stage plan --dim M=40 >/dev/null 2>&1); then
  (ulimit -v 200000 && TILEJIT_TUNING_DB="$WORK/huge.json" "$TJ" dump "$WORK/proj.tir" --stage plan --dim M=40) >"$OUT" 2>"$ERR"
  rc=$?
  check "database out of memory: exit 1 (got $rc)" test $rc -eq 1
  check "database out of memory: the variable and file named" \
    grep -q "^TILEJIT_TUNING_DB: $WORK/huge.json: error: out of memory reading the tuning database" "$ERR"
fi

# 12. Kernels the search compiled but the cache could not store: a cache
# directory holding a directory at every entry's name (a store's rename onto
# it fails, for root too), the names from a first run into an empty one. A
# warning counts them (the warm-up compiled none, so nothing was said).
printf '{"name": "fill", "ops": [{"op": "gemm", "n": 128, "k": 128, "m": [1]}]}' >"$WORK/fill.json"
TILEJIT_CACHE_DIR="$WORK/filla" "$TJ" tune "$WORK/fill.json" --out "$WORK/filldb_a.json" --budget 20s >"$OUT" 2>"$ERR"
mkdir -p "$WORK/fillc"
for e in "$WORK"/filla/*.tjk; do mkdir "$WORK/fillc/$(basename "$e")"; done
check "the first run stored entries" test "$(ls "$WORK/fillc" | wc -l)" -gt 0
TILEJIT_CACHE_DIR="$WORK/fillc" "$TJ" tune "$WORK/fill.json" --out "$WORK/filldb.json" --budget 20s >"$OUT" 2>"$ERR"
rc=$?
check "a cache that cannot take the kernels: exit 0 (got $rc)" test $rc -eq 0
check "... and a warning counting the kernels not stored" \
  grep -Eq "^warning: the kernel cache .*fillc could not be filled: [1-9][0-9]* of the [0-9]+ kernels compiled were not stored" "$OUT"

check_summary tune_tool_test
