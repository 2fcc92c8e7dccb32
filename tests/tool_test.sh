#!/usr/bin/env bash
# End-to-end test of the `tilejit` command line (docs/tool.md).
#
#   tests/tool_test.sh <path to tilejit> <examples dir>
#
# Every examples/*.tir is dumped at every stage; gemm programs (whatever
# elementwise ops follow the gemm) and purely elementwise ones are run with
# --check on generated inputs (saved as .npy and read back), on the active
# path and on the scalar one; error paths must exit non-zero with a one-line
# message, and the hostile inputs of docs/reliability.md with exactly the
# documented code (1 input, 2 usage) under a timeout. Needs no numpy: inputs
# come from `run --random-inputs` and the hidden `tilejit gen-npy` helper.
set -u

TJ=${1:?usage: tool_test.sh <tilejit binary> <examples dir>}
EXAMPLES=${2:?usage: tool_test.sh <tilejit binary> <examples dir>}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/tilejit_tool_test.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# Compile counts and timings stay out of the user's cache.
export TILEJIT_CACHE_DIR=

# shellcheck source=tests/check_lib.sh
source "$(dirname "$0")/check_lib.sh"

# ok <description> <command...>: exit 0 expected.
ok() {
  local what=$1
  shift
  checks=$((checks + 1))
  "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  [ $rc -eq 0 ] || fail "$what: exit $rc, expected 0 ($*)"
  return $rc
}

# bad <description> <stderr regex> <command...>: exit != 0 and one stderr
# line matching the regex.
bad() {
  local what=$1 pattern=$2
  shift 2
  checks=$((checks + 1))
  "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if [ $rc -eq 0 ]; then
    fail "$what: exit 0, expected an error ($*)"
  elif ! grep -Eq -- "$pattern" "$ERR"; then
    fail "$what: stderr does not match /$pattern/ ($*)"
  elif [ "$(wc -l <"$ERR")" -ne 1 ]; then
    fail "$what: expected a one-line error, got $(wc -l <"$ERR") lines ($*)"
  fi
}

# exits <code> <description> <stderr regex> <command...>: exactly that exit
# code (docs/tool.md: 1 an error in the input, 2 a usage error) and one
# stderr line matching the regex. Run under a timeout: hostile input must
# never hang the tool.
exits() {
  local want=$1 what=$2 pattern=$3
  shift 3
  checks=$((checks + 1))
  timeout 60 "$@" >"$OUT" 2>"$ERR"
  local rc=$?
  if [ $rc -ne "$want" ]; then
    fail "$what: exit $rc, expected $want ($*)"
  elif ! grep -Eq -- "$pattern" "$ERR"; then
    fail "$what: stderr does not match /$pattern/ ($*)"
  elif [ "$(wc -l <"$ERR")" -ne 1 ]; then
    fail "$what: expected a one-line error, got $(wc -l <"$ERR") lines ($*)"
  fi
}
usage() { exits 2 "$@"; }
input_error() { exits 1 "$@"; }

# has <description> <file> <regex>
has() {
  checks=$((checks + 1))
  grep -Eq -- "$3" "$2" || fail "$1: output does not match /$3/"
}

# ---- help, cpuinfo -----------------------------------------------------------
for sub in dump run bench cpuinfo llama-layer; do
  ok "$sub --help" "$TJ" "$sub" --help && has "$sub --help" "$OUT" "Usage|Options"
done
TILEJIT_CACHE_DIR=$WORK/cache ok "cpuinfo" "$TJ" cpuinfo
has "cpuinfo: active path" "$OUT" "^active path +(amx|avx512|llvm|scalar)"
has "cpuinfo: threads" "$OUT" "^threads +[0-9]+"
has "cpuinfo: usable features" "$OUT" "^usable features "
has "cpuinfo: the registry's brgemm rows" "$OUT" "^  brgemm +avx512 +xbyak +(yes|no) +avx512f avx512bw avx512vl avx512_bf16( avx512_vnni)?$"
has "cpuinfo: an LLVM row" "$OUT" "^  rope +llvm +llvm +(yes|no) +avx2 fma$"
has "cpuinfo: cache dir" "$OUT" "^kernel cache +$WORK/cache"
ok "cpuinfo, cache off" "$TJ" cpuinfo && has "cpuinfo: cache off" "$OUT" "^kernel cache +off"

# ---- every example: dump at every stage, run --check ---------------------------
shopt -s nullglob
examples=("$EXAMPLES"/*.tir)
[ ${#examples[@]} -gt 0 ] || fail "no examples in $EXAMPLES"
for tir in "${examples[@]}"; do
  name=$(basename "$tir" .tir)
  ok "$name: dump --stage ir" "$TJ" dump "$tir" --stage ir
  has "$name: ir" "$OUT" "^func @"
  # The printed IR reads back to itself (through stdin).
  cp "$OUT" "$WORK/$name.ir"
  ok "$name: dump - --stage ir" "$TJ" dump - --stage ir <"$WORK/$name.ir"
  checks=$((checks + 1))
  cmp -s "$OUT" "$WORK/$name.ir" || fail "$name: printed IR does not read back to itself"
  ok "$name: dump --stage verified" "$TJ" dump "$tir" --stage verified
  has "$name: verified" "$OUT" "verified: .* no diagnostics"

  # Bind every symbolic dim to 10: M tails on every path (AVX-512 7 + 3, AMX 10 of 32).
  dims=()
  for s in $(grep -Eo '^// \?[A-Za-z_0-9]+ is bound' "$OUT" | sed -E 's|^// \?([A-Za-z_0-9]+) .*|\1|'); do
    dims+=(--dim "$s=10")
  done

  if ! grep -Eq '= *(gemm|attention|decode_attention|rope|moe) ' "$tir"; then
    # Elementwise only: one loop compiled by LLVM, shown through the registry.
    ok "$name: dump --stage plan (no gemm)" "$TJ" dump "$tir" --stage plan
    has "$name: elementwise plan" "$OUT" "^plan +elementwise: @[A-Za-z0-9_]+ as one fused loop compiled by LLVM"
    ok "$name: dump --stage key (no gemm)" "$TJ" dump "$tir" --stage key
    has "$name: elementwise key" "$OUT" "^key +elementwise;func @"
    ok "$name: dump --stage asm (no gemm)" "$TJ" dump "$tir" --stage asm
    has "$name: elementwise asm header" "$OUT" "^; kernel elementwise_[A-Za-z0-9_]+  \\([0-9]+ bytes\\)"
    has "$name: elementwise asm is LLVM code" "$OUT" "^; the elementwise program \\(llvm code\\)"
    has "$name: elementwise asm has ret" "$OUT" "\\bret\\b"
    ok "$name: dump --stage all (no gemm)" "$TJ" dump "$tir"
    ok "$name: run --random-inputs --check" \
      "$TJ" run "$tir" --random-inputs 11 "${dims[@]}" --save-inputs "$WORK/$name.in" --check
    has "$name: PASS" "$OUT" "^PASS \\("
    has "$name: tolerance" "$OUT" "tolerance +0 for the inputs, carried through the chain"
    inputs=()
    for f in "$WORK/$name.in"/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
    ok "$name: run --input ... --check" "$TJ" run "$tir" "${inputs[@]}" --check
    has "$name: PASS from files" "$OUT" "^PASS \\("
    TILEJIT_ISA=scalar ok "$name: run --check, TILEJIT_ISA=scalar" "$TJ" run "$tir" "${inputs[@]}" --check
    has "$name: scalar PASS" "$OUT" "^PASS \\("
    bad "$name: bench (no gemm)" "has no gemm: .tilejit bench. reports gemm GFLOP/s" \
      "$TJ" bench "$tir" "${dims[@]}" --seconds 0.01
    continue
  fi
  if grep -Eq '= *(attention|decode_attention|rope|moe) ' "$tir"; then
    # Operator programs: one public API call per op (tools/program/operator_runner.h).
    ok "$name: dump (all stages)" "$TJ" dump "$tir" "${dims[@]}"
    for stage in ir verified plan key asm; do has "$name: all has $stage" "$OUT" "^// ---- $stage ----"; done
    has "$name: plan names the call" "$OUT" "^call 1 of [0-9]+: %[A-Za-z0-9_]+ = (rope|attention|decode_attention|moe) "
    has "$name: plan has the API call" "$OUT" "^  api +(tilejit::rope|tilejit::flash_attn_varlen|tilejit::decode_attention|w13p = tilejit::pack_experts)\\("
    # asm lists the kernels the shapes fix (RoPE's) and names the rest.
    has "$name: asm lists or explains" "$OUT" "(kernels are chosen and compiled inside the operator at run time|^; kernel (rope|decode_attn)_llvm_)"
    ok "$name: dump --stage key --isa scalar" "$TJ" dump "$tir" --stage key --isa scalar
    has "$name: scalar: no JIT code" "$OUT" "^  kernels none \\(no JIT code on the scalar path\\)"
    ok "$name: run --random-inputs --check" \
      "$TJ" run "$tir" --random-inputs 11 "${dims[@]}" --save-inputs "$WORK/$name.in" --check
    has "$name: PASS" "$OUT" "^PASS \\("
    has "$name: reference" "$OUT" "^check  against the scalar reference \\(runtime/reference_(rope|attention|moe)\\.h"
    inputs=()
    for f in "$WORK/$name.in"/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
    result=$(sed -nE 's/^ *return %([A-Za-z0-9_]+).*/\1/p' "$WORK/$name.ir")
    ok "$name: run --input ... --check" \
      "$TJ" run "$tir" "${inputs[@]}" --output "$result=$WORK/$name.out1.npy" --check
    has "$name: PASS from files" "$OUT" "^PASS \\("
    ok "$name: run --input ... again" "$TJ" run "$tir" "${inputs[@]}" --output "$result=$WORK/$name.out2.npy"
    checks=$((checks + 1))
    cmp -s "$WORK/$name.out1.npy" "$WORK/$name.out2.npy" || fail "$name: two runs wrote different outputs"
    TILEJIT_ISA=scalar ok "$name: run --check, TILEJIT_ISA=scalar" "$TJ" run "$tir" "${inputs[@]}" --check
    has "$name: scalar path" "$OUT" "on the scalar path"
    has "$name: scalar PASS" "$OUT" "^PASS \\("
    ok "$name: bench" "$TJ" bench "$tir" "${dims[@]}" --seconds 0.02 --threads 1
    has "$name: bench rate" "$OUT" "^  (GFLOP/s|GB/s) +[0-9.]+ "
    has "$name: bench calls" "$OUT" "^  calls +tilejit::"
    continue
  fi

  if grep -Eq '= *gemm .*scale = %' "$tir"; then
    # A quantized weight (docs/ir.md "Quantized weights"): the bf16 plan over
    # k_packed plus the dequant kernel (fp8, int4), or the i8 plan plus the
    # act_quant kernel (W8A8).
    if grep -Eq 'xi8>' "$tir"; then kind=int8 acc=u8xi8_i32acc helper=act_quant; else
      kind=dequant acc=bf16_f32acc helper=dequant; fi
    ok "$name: dump (all stages)" "$TJ" dump "$tir" "${dims[@]}"
    for stage in ir verified plan key asm; do has "$name: all has $stage" "$OUT" "^// ---- $stage ----"; done
    for isa in avx512 amx; do
      ok "$name: dump --stage plan --isa $isa" "$TJ" dump "$tir" --stage plan --isa $isa "${dims[@]}"
      has "$name: plan ($isa)" "$OUT" "^plan gemm_${isa}_${acc}_m[0-9]+n64k[0-9]+"
      has "$name: plan weight ($isa)" "$OUT" "^  weight +%[a-z_]+ (i8|f8e4m3|u4|f4e2m1) \\[[0-9]+, [0-9]+\\]: tilejit::pack_weight\\((Int8|Fp8|Int4|Mxfp4)Weight\\)"
      has "$name: plan helper kernel ($isa)" "$OUT" "^  kernel +${helper}_avx512_"
      ok "$name: dump --stage key --isa $isa" "$TJ" dump "$tir" --stage key --isa $isa "${dims[@]}"
      has "$name: plan key ($isa)" "$OUT" "^key +gemm;isa=$isa;n=[0-9]+;k=[0-9]+;"
      has "$name: helper key ($isa)" "$OUT" "^ +${helper};isa=avx512;"
      [ $kind = int8 ] && has "$name: i8 micro-kernel key ($isa)" "$OUT" "brgemm;isa=$isa;a=u8;b=i8;"
      ok "$name: dump --stage asm --isa $isa" "$TJ" dump "$tir" --stage asm --isa $isa "${dims[@]}"
      has "$name: asm brgemm ($isa)" "$OUT" "^; kernel brgemm_${isa}_${acc}_m[0-9]+n[0-9]+k[0-9]+[a-z0-9_]*  \\([0-9]+ bytes\\)"
      has "$name: asm helper ($isa)" "$OUT" "^; kernel ${helper}_avx512_[a-z0-9_]+  \\([0-9]+ bytes\\)"
      has "$name: asm has ret ($isa)" "$OUT" "\\bret\\b"
    done
    # The llvm path's rows: its brgemm and its dequant / act_quant kernel.
    ok "$name: dump --stage asm --isa llvm" "$TJ" dump "$tir" --stage asm --isa llvm "${dims[@]}"
    has "$name: llvm brgemm asm" "$OUT" "^; kernel brgemm_llvm_${acc}_m[0-9]+n[0-9]+k[0-9]+[a-z0-9_]*  \\([0-9]+ bytes\\)"
    has "$name: llvm helper asm" "$OUT" "^; kernel ${helper}_llvm_[a-z0-9_]+  \\([0-9]+ bytes\\)"
    if [ $kind = dequant ]; then
      # M <= 4: the fused decode kernel instead of the dequant route.
      ok "$name: dump --stage plan --isa llvm (M=2)" "$TJ" dump "$tir" --stage plan --isa llvm --dim M=2
      has "$name: fused kernel named (llvm, M=2)" "$OUT" "^  fused +brgemm_llvm_bf16x(u4|f8e4m3|f4e2m1)[a-z0-9_]*_m2n64k[0-9]+"
      ok "$name: dump --stage asm --isa llvm (M=2)" "$TJ" dump "$tir" --stage asm --isa llvm --dim M=2
      has "$name: fused kernel asm (llvm, M=2)" "$OUT" "^; kernel brgemm_llvm_bf16x(u4|f8e4m3|f4e2m1)[a-z0-9_]*_m2n64k[0-9]+"
      # The key stage lists exactly the fused kernels a run at that M compiles
      # (row groups and N tails: ops::quant_fused_descs, one home for both).
      ok "$name: dump --stage key --isa llvm (M=3)" "$TJ" dump "$tir" --stage key --isa llvm --dim M=3
      grep -E '^  [0-9]+ rows(, N tail)? +brgemm_' "$OUT" | awk '{print $NF}' | sort >"$WORK/$name.keyed"
      TILEJIT_ISA=llvm TILEJIT_VERBOSE=1 ok "$name: run on llvm (M=3)" \
        "$TJ" run "$tir" --random-inputs 1 --dim M=3
      grep -Eo 'compiled brgemm_[a-z0-9_]+' "$ERR" | awk '{print $2}' | sort >"$WORK/$name.ran"
      checks=$((checks + 1))
      if [ ! -s "$WORK/$name.keyed" ] || ! cmp -s "$WORK/$name.keyed" "$WORK/$name.ran"; then
        fail "$name: dump --stage key (M=3) lists [$(tr '\n' ' ' <"$WORK/$name.keyed")], the run compiled [$(tr '\n' ' ' <"$WORK/$name.ran")]"
      fi
    fi
    ok "$name: dump --stage plan --isa scalar" "$TJ" dump "$tir" --stage plan --isa scalar
    has "$name: scalar plan" "$OUT" "^  kernel +none \\(the scalar path computes from the logical weights in double\\)"
    ok "$name: dump --stage asm --isa scalar" "$TJ" dump "$tir" --stage asm --isa scalar
    has "$name: scalar asm" "$OUT" "scalar reference"
    ok "$name: run --random-inputs --check" \
      "$TJ" run "$tir" --random-inputs 11 "${dims[@]}" --save-inputs "$WORK/$name.in" --check
    has "$name: PASS" "$OUT" "^PASS \\("
    if [ $kind = int8 ]; then
      has "$name: tolerance" "$OUT" "tolerance +int8_output_bound: .*K=[0-9]+"
      has "$name: reference" "$OUT" "reference_act_quant_row"
    else
      # int4 at this M on the llvm path: the automatic route is W4A8.
      has "$name: tolerance" "$OUT" "tolerance +gemm_output_bound .* \\+ (dequant_weight_bound|W4A8 .*w4a8_activation_bound) .*K=[0-9]+"
    fi
    inputs=()
    for f in "$WORK/$name.in"/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
    result=$(sed -nE 's/^ *return %([A-Za-z0-9_]+).*/\1/p' "$WORK/$name.ir")
    ok "$name: run --input ... --check" \
      "$TJ" run "$tir" "${inputs[@]}" --output "$result=$WORK/$name.out1.npy" --check
    has "$name: PASS from files" "$OUT" "^PASS \\("
    ok "$name: run --input ... again" "$TJ" run "$tir" "${inputs[@]}" --output "$result=$WORK/$name.out2.npy"
    checks=$((checks + 1))
    cmp -s "$WORK/$name.out1.npy" "$WORK/$name.out2.npy" || fail "$name: two runs wrote different outputs"
    for isa in avx512 llvm scalar; do
      ok "$name: run --isa $isa --check" "$TJ" run "$tir" "${inputs[@]}" --isa $isa --check
      has "$name: PASS ($isa)" "$OUT" "^PASS \\("
    done
    # M = 1 (the decode row: the AVX-512 plan with shallow K chunks).
    ok "$name: run M=1 --check" "$TJ" run "$tir" --random-inputs 5 --dim M=1 --check
    has "$name: PASS (M=1)" "$OUT" "^PASS \\("
    continue
  fi

  ok "$name: dump (all stages)" "$TJ" dump "$tir" "${dims[@]}"
  for stage in ir verified plan key asm; do has "$name: all has $stage" "$OUT" "^// ---- $stage ----"; done
  for isa in avx512 amx; do
    ok "$name: dump --stage plan --isa $isa" "$TJ" dump "$tir" --stage plan --isa $isa
    has "$name: plan ($isa)" "$OUT" "^plan gemm_${isa}_bf16_f32acc_m[0-9]+n64k[0-9]+"
    plan=$(sed -nE 's/^plan (gemm_[a-z0-9_]+).*/\1/p' "$OUT")
    ok "$name: dump --stage key --isa $isa" "$TJ" dump "$tir" --stage key --isa $isa "${dims[@]}"
    has "$name: key names the plan ($isa)" "$OUT" "^plan +$plan\$"
    has "$name: plan key ($isa)" "$OUT" "^key +gemm;isa=$isa;n=[0-9]+;k=[0-9]+;"
    has "$name: micro-kernel key ($isa)" "$OUT" "brgemm;isa=$isa;a=bf16;b=bf16;(zeros=0;)?acc=f32;mr=[0-9]+;nr=[0-9]+;kb=[0-9]+;"
    has "$name: M-tail kernel for M=10 ($isa)" "$OUT" "^  M tail \\(([0-9]+) rows\\)"
    ok "$name: dump --stage asm --isa $isa" "$TJ" dump "$tir" --stage asm --isa $isa "${dims[@]}"
    has "$name: asm header ($isa)" "$OUT" "^; kernel brgemm_${isa}_bf16_f32acc_m[0-9]+n[0-9]+k[0-9]+[a-z0-9_]*  \\([0-9]+ bytes\\)"
    if [ $isa = avx512 ]; then
      has "$name: asm has vdpbf16ps" "$OUT" "vdpbf16ps zmm[0-9]+, zmm[0-9]+, dword ptr"
    else
      has "$name: asm has tdpbf16ps" "$OUT" "tdpbf16ps tmm[0-9], tmm[0-9], tmm[0-9]"
      has "$name: asm has ldtilecfg" "$OUT" "ldtilecfg"
    fi
  done
  # The llvm path's micro-kernels are disassembled too (registry, LLVM code).
  ok "$name: dump --stage asm --isa llvm" "$TJ" dump "$tir" --stage asm --isa llvm "${dims[@]}"
  has "$name: llvm asm header" "$OUT" "^; kernel brgemm_llvm_bf16_f32acc_m[0-9]+n[0-9]+k[0-9]+[a-z0-9_]*  \\([0-9]+ bytes\\)"
  has "$name: llvm asm is LLVM code" "$OUT" "^; main block[^:]*: brgemm;isa=llvm;.*llvm_cpu=.* \\(llvm code\\)"
  ok "$name: dump --stage asm --syntax att" "$TJ" dump "$tir" --stage asm --isa avx512 --syntax att
  has "$name: AT&T syntax" "$OUT" "vdpbf16ps \\(%"
  ok "$name: dump --stage asm --isa scalar" "$TJ" dump "$tir" --stage asm --isa scalar
  has "$name: scalar asm" "$OUT" "scalar reference"
  TILEJIT_ISA=scalar ok "$name: dump --stage asm, TILEJIT_ISA=scalar" "$TJ" dump "$tir" --stage asm
  has "$name: scalar asm by env" "$OUT" "scalar reference.*no JIT code"

  # run --check on generated inputs, saved as .npy ...
  ok "$name: run --random-inputs --check" \
    "$TJ" run "$tir" --random-inputs 11 "${dims[@]}" --save-inputs "$WORK/$name.in" --check
  has "$name: PASS" "$OUT" "^PASS \\("
  has "$name: tolerance" "$OUT" "tolerance +.*K=[0-9]+"
  # ... then read back from the .npy files: same result.
  inputs=()
  for f in "$WORK/$name.in"/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
  result=$(sed -nE 's/^ *return %([A-Za-z0-9_]+).*/\1/p' "$WORK/$name.ir")
  ok "$name: run --input ... --check" \
    "$TJ" run "$tir" "${inputs[@]}" --output "$result=$WORK/$name.out1.npy" --check
  has "$name: PASS from files" "$OUT" "^PASS \\("
  ok "$name: run --input ... again" \
    "$TJ" run "$tir" "${inputs[@]}" --output "%$result=$WORK/$name.out2.npy"
  checks=$((checks + 1))
  cmp -s "$WORK/$name.out1.npy" "$WORK/$name.out2.npy" || fail "$name: two runs wrote different outputs"
  checks=$((checks + 1))
  head -c 6 "$WORK/$name.out1.npy" | od -c | grep -q 'N   U   M   P   Y' || fail "$name: output is not .npy"
  # The scalar path, by environment and by --isa.
  TILEJIT_ISA=scalar ok "$name: run --check, TILEJIT_ISA=scalar" \
    "$TJ" run "$tir" "${inputs[@]}" --check
  has "$name: scalar path" "$OUT" "on the scalar path"
  has "$name: scalar PASS" "$OUT" "^PASS \\("
  ok "$name: run --isa scalar --check" "$TJ" run "$tir" "${inputs[@]}" --isa scalar --check
  has "$name: --isa scalar" "$OUT" "on the scalar path"
done

# ---- one example in detail: names, keys, .npy conventions, errors -----------------
LB=$EXAMPLES/linear_bias.tir
LS=$EXAMPLES/linear_silu.tir
if [ -f "$LB" ] && [ -f "$LS" ]; then
  ok "linear_silu: dump --stage key" "$TJ" dump "$LS" --stage key --isa avx512 --dim M=512
  has "linear_silu: plan name" "$OUT" "^plan +gemm_avx512_bf16_f32acc_m7n64k4096_silu_bf16out$"
  has "linear_silu: plan key" "$OUT" "^key +gemm;isa=avx512;n=11008;k=4096;bias=none;act=silu;out=bf16;glu=none;alpha=0x0p\\+0;limit=0x0p\\+0(;b=bf16;kcmax=2048)?(;inv=0)?$"
  has "linear_silu: M tail of 512 = 73*7 + 1" "$OUT" "M tail \\(1 row\\), last K chunk +brgemm_avx512_bf16_f32acc_m1n64k2048_accin_silu_bf16out"
  ok "linear_bias: dump --stage key" "$TJ" dump "$LB" --stage key --isa avx512
  has "linear_bias: N tail" "$OUT" "N tail \\(40 cols\\) +brgemm_avx512_bf16_f32acc_m7n40k1024_biasbf16_f32out"
  has "linear_bias: N tail key" "$OUT" "brgemm;isa=avx512;a=bf16;b=bf16;(zeros=0;)?acc=f32;mr=7;nr=40;kb=1024;brow=256;apack=0;acc_in=0;(chain1=0;)?bias=bf16;act=none;glu=none;alpha=0x0p\\+0;limit=0x0p\\+0;out=f32"
  ok "linear_bias: dump --stage plan" "$TJ" dump "$LB" --stage plan
  has "linear_bias: row-major w is packed by run" "$OUT" "%w is row-major in the IR"

  ok "linear_bias: inputs" "$TJ" run "$LB" --random-inputs 3 --dim M=5 --save-inputs "$WORK/lb"
  # A float32 array for a bf16 input is rounded to bf16.
  "$TJ" gen-npy "$WORK/x_f32.npy" --dtype '<f4' --shape 5,1024 --seed 4
  ok "bf16 input from <f4" "$TJ" run "$LB" --input "x=$WORK/x_f32.npy" --input "w=$WORK/lb/w.npy" \
    --input "bias=$WORK/lb/bias.npy" --check
  has "bf16 input from <f4: PASS" "$OUT" "^PASS \\("

  "$TJ" gen-npy "$WORK/x_wrong.npy" --dtype '<u2' --shape 5,1000
  bad "wrong-shape .npy" "input 'x' \\(.*x_wrong.npy\\) has shape \\[5, 1000\\]; expected \\[\\?M, 1024\\]" \
    "$TJ" run "$LB" --input "x=$WORK/x_wrong.npy" --input "w=$WORK/lb/w.npy" --input "bias=$WORK/lb/bias.npy"
  "$TJ" gen-npy "$WORK/x_rank.npy" --dtype '<u2' --shape 5120
  bad "wrong-rank .npy" "input 'x' .* has shape \\[5120\\]; expected \\[\\?M, 1024\\]" \
    "$TJ" run "$LB" --input "x=$WORK/x_rank.npy" --random-inputs 1
  # A gemm program that also returns its input: the error of the elementwise
  # part names the program's own function and value, not the runner's split.
  sed 's/    -> (tensor<?Mx11008xbf16>)/    -> (tensor<?Mx11008xbf16>, tensor<?Mx4096xbf16>)/; s/^  return %y$/  return %y, %x/' \
    "$LS" >"$WORK/ret_param.tir"
  bad "gemm program returning a param" "function @linear_silu: %x has shape \\[\\?M, 4096\\]: every value must have the shape \\[\\?M, 11008\\]" \
    "$TJ" run "$WORK/ret_param.tir" --random-inputs 1 --dim M=3
  # Diagnostic knobs with a value that is no level: ignored with one warning
  # (they were silently off), the run itself fine.
  TILEJIT_PERF_MAP=yes TILEJIT_VERBOSE=abc ok "bad diagnostic knobs: run" "$TJ" run "$LB" --random-inputs 1 --dim M=2
  has "TILEJIT_PERF_MAP=yes warned" "$ERR" "warning: TILEJIT_PERF_MAP='yes' ignored: allowed: an integer from 0 to 1"
  has "TILEJIT_VERBOSE=abc warned" "$ERR" "warning: TILEJIT_VERBOSE='abc' ignored"
  # A value with a newline is shown escaped on one line, a long one cut at 64
  # bytes (raw, the newline split the warning and 5000 bytes were printed).
  TILEJIT_VERBOSE="$(printf '1\nx')" ok "knob with a newline: run" "$TJ" run "$LB" --random-inputs 1 --dim M=2
  has "knob value escaped" "$ERR" "warning: TILEJIT_VERBOSE='1.nx' ignored"
  TILEJIT_ISA="$(head -c 5000 /dev/zero | tr '\0' a)" bad "long knob value cut" \
    "TILEJIT_ISA='a{64}[.]{3} [(]5000 bytes[)]' is not an ISA path" "$TJ" run "$LB" --random-inputs 1 --dim M=2
  # Blanks around a level are taken, as TILEJIT_NUM_THREADS takes them.
  TILEJIT_VERBOSE='0 ' ok "knob with a trailing blank: run" "$TJ" run "$LB" --random-inputs 1 --dim M=2
  checks=$((checks + 1))
  ! grep -q TILEJIT_VERBOSE "$ERR" || fail "a trailing blank warned: $(cat "$ERR")"
  "$TJ" gen-npy "$WORK/x_i4.npy" --dtype '<i4' --shape 5,1024
  bad "wrong-dtype .npy" "input 'x' \\(.*x_i4.npy\\) is a '<i4' array; .* needs '<u2'" \
    "$TJ" run "$LB" --input "x=$WORK/x_i4.npy" --random-inputs 1
  "$TJ" gen-npy "$WORK/x_m6.npy" --dtype '<u2' --shape 6,1024
  bad "inconsistent symbolic dim" "\\?M = 6, but \\?M = 5" \
    "$TJ" run "$LB" --input "x=$WORK/x_m6.npy" --random-inputs 1 --dim M=5
  printf 'not numpy' >"$WORK/garbage.npy"
  bad "not a .npy file" "garbage.npy: not a .npy file" \
    "$TJ" run "$LB" --input "x=$WORK/garbage.npy" --random-inputs 1
  printf '\x93NUMPY' >"$WORK/magic_only.npy"  # the magic and nothing more: truncated, not "no magic"
  bad "truncated .npy preamble" "magic_only.npy: truncated .npy header \\(6 bytes" \
    "$TJ" run "$LB" --input "x=$WORK/magic_only.npy" --random-inputs 1
  bad "missing .npy file" "nothere.npy: cannot open" \
    "$TJ" run "$LB" --input "x=$WORK/nothere.npy" --random-inputs 1
  bad "missing input" "missing input 'bias' \\(tensor<1000xbf16>\\)" \
    "$TJ" run "$LB" --input "x=$WORK/lb/x.npy" --input "w=$WORK/lb/w.npy"
  bad "unknown input" "has no input 'q'; its inputs are x, w, bias" \
    "$TJ" run "$LB" --input "q=$WORK/lb/x.npy" --random-inputs 1
  bad "unknown output" "has no result 'y'" \
    "$TJ" run "$LB" --random-inputs 1 --dim M=2 --output "y=$WORK/y.npy"
  bad "malformed --input" "--input 'x': expected NAME=FILE.npy" "$TJ" run "$LB" --input x
  bad "unbound dim" "\\?M has no size; give --dim M=SIZE" "$TJ" run "$LB" --random-inputs 1
  bad "unknown dim" "has no dim \\?Q; its symbolic dims are \\?M" "$TJ" dump "$LB" --dim Q=3
  bad "bad dim value" "--dim 'M=-1': the size must be an integer in \\[0, 2147483647\\]" "$TJ" dump "$LB" --dim M=-1
  bad "unknown --stage" "--stage: bogus not in" "$TJ" dump "$LB" --stage bogus
  bad "unknown --isa" "--isa: knights not in" "$TJ" run "$LB" --isa knights
  bad "unknown option" "tilejit run: error: .*--frobnicate" "$TJ" run "$LB" --frobnicate
  bad "missing file argument" "file is required" "$TJ" dump
  bad "missing .tir file" "nothere.tir: cannot open" "$TJ" dump "$WORK/nothere.tir"
  bad "bench without its dims" "give --dim M=SIZE" "$TJ" bench "$LB"
  ok "bench" "$TJ" bench "$LB" --dim M=16 --seconds 0.05 --threads 1
  has "bench: GFLOP/s" "$OUT" "^  GFLOP/s +[0-9.]+"
  has "bench: time per call" "$OUT" "^  time/call +[0-9.e+-]+ ms"
  has "bench: peak" "$OUT" "^  % of peak +([0-9.]+% of|n/a)"

  # The on-disk kernel cache fills when it is on.
  TILEJIT_CACHE_DIR=$WORK/kcache ok "run with a cache dir" "$TJ" run "$LB" --random-inputs 1 --dim M=3
  checks=$((checks + 1))
  if [ "$(sed -nE 's/^active path +([a-z0-9]+).*/\1/p' <(TILEJIT_CACHE_DIR= "$TJ" cpuinfo))" != scalar ]; then
    ls "$WORK/kcache"/*.tjk >/dev/null 2>&1 || fail "no kernel cache entries in $WORK/kcache"
  fi
fi

# ---- a static row stride: the runner lays x out at that stride ----------------------
printf 'func @s(%%x: tensor<?Mx100xbf16, strided<[160, 1]>>, %%w: tensor<70x100xbf16>) -> (tensor<?Mx70xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx70xf32>\n  %%1 = relu %%0 : tensor<?Mx70xf32>\n  return %%1\n}\n' >"$WORK/strided.tir"
ok "strided x: run --check" "$TJ" run "$WORK/strided.tir" --random-inputs 2 --dim M=9 --check
has "strided x: PASS" "$OUT" "^PASS \\("

# ---- IR errors ----------------------------------------------------------------
printf 'func @bad(%%x: tensor<?Mx8xbf16>) -> (tensor<?Mx8xf32>) {\n  %%0 = gemm %%x %%x : tensor<?Mx8xf32>\n  return %%0\n}\n' >"$WORK/syntax.tir"
for stage in ir all; do
  bad "malformed .tir (--stage $stage)" "^$WORK/syntax.tir:2:16: error: " "$TJ" dump "$WORK/syntax.tir" --stage $stage
done
bad "malformed .tir on stdin" "^<stdin>:2:16: error: " "$TJ" dump - <"$WORK/syntax.tir"
bad "malformed .tir (run)" "^$WORK/syntax.tir:[0-9]+:[0-9]+: error: " "$TJ" run "$WORK/syntax.tir" --random-inputs 1
printf 'func @k(%%x: tensor<?Mx64xbf16>, %%w: tensor<32x100xbf16>) -> (tensor<?Mx32xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx32xf32>\n  return %%0\n}\n' >"$WORK/verify.tir"
ok "verify error: --stage ir still prints" "$TJ" dump "$WORK/verify.tir" --stage ir
bad "verify error (dump)" "verify.tir: error: %0 = gemm: .*K=100" "$TJ" dump "$WORK/verify.tir" --stage verified
bad "verify error (run)" "verify.tir: error: %0 = gemm: .*K=100" "$TJ" run "$WORK/verify.tir" --random-inputs 1
printf 'func @r(%%x: tensor<?Mx64xf32>) -> (tensor<?Mx64xf32>) {\n  %%0 = relu %%x : tensor<?Mx64xf32>\n  return %%0\n}\n' >"$WORK/relu.tir"
ok "elementwise only: verified" "$TJ" dump "$WORK/relu.tir" --stage verified
ok "elementwise only: key" "$TJ" dump "$WORK/relu.tir" --stage key
has "elementwise only: key names the IR" "$OUT" "^key +elementwise;func @r\\(%x: tensor<\\?Mx64xf32>\\)"
ok "elementwise only: run --check" "$TJ" run "$WORK/relu.tir" --random-inputs 1 --dim M=5 --check
has "elementwise only: PASS" "$OUT" "^PASS \\(320 elements"

# ---- a gemm followed by more than the fused chain (the LLVM elementwise rest) --------
# The longest prefix the gemm fuses (bias → silu) runs as the gemm; mul, gelu_tanh
# and cast run as one LLVM loop.
printf 'func @e(%%x: tensor<?Mx128xbf16>, %%w: tensor<80x128xbf16>, %%bias: tensor<80xbf16>, %%s: tensor<80xf32>) -> (tensor<?Mx80xbf16>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx80xf32>\n  %%1 = add %%0, %%bias : tensor<?Mx80xf32>\n  %%2 = silu %%1 : tensor<?Mx80xf32>\n  %%3 = mul %%2, %%s : tensor<?Mx80xf32>\n  %%4 = gelu_tanh %%3 : tensor<?Mx80xf32>\n  %%5 = cast %%4 {to = bf16} : tensor<?Mx80xbf16>\n  return %%5\n}\n' >"$WORK/epi.tir"
ok "gemm + rest: dump plan of the fused prefix" "$TJ" dump "$WORK/epi.tir" --stage plan --isa avx512
has "gemm + rest: prefix plan" "$OUT" "^plan gemm_avx512_bf16_f32acc_m7n64k128_nt16_biasbf16_silu_f32out"
ok "gemm + rest: run --check (rows over threads)" "$TJ" run "$WORK/epi.tir" --random-inputs 4 --dim M=300 --check
has "gemm + rest: PASS" "$OUT" "^PASS \\(24000 elements"
# An inner value read after the prefix shortens it (here to gemm → add); two results.
printf 'func @t(%%x: tensor<?Mx128xbf16>, %%w: tensor<80x128xbf16>, %%bias: tensor<80xf32>) -> (tensor<?Mx80xf32>, tensor<?Mx80xbf16>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx80xf32>\n  %%1 = add %%0, %%bias : tensor<?Mx80xf32>\n  %%2 = relu %%1 : tensor<?Mx80xf32>\n  %%3 = mul %%2, %%1 : tensor<?Mx80xf32>\n  %%4 = cast %%3 {to = bf16} : tensor<?Mx80xbf16>\n  return %%1, %%4\n}\n' >"$WORK/two.tir"
ok "gemm + rest, two results: dump plan" "$TJ" dump "$WORK/two.tir" --stage plan --isa avx512
has "gemm + rest, two results: prefix plan" "$OUT" "^plan gemm_avx512_bf16_f32acc_m7n64k128_nt16_biasf32_f32out"
ok "gemm + rest, two results: run --check" "$TJ" run "$WORK/two.tir" --random-inputs 4 --dim M=10 --check
has "gemm + rest, two results: PASS" "$OUT" "^PASS \\(1600 elements"
TILEJIT_ISA=scalar ok "gemm + rest, two results: scalar run --check" "$TJ" run "$WORK/two.tir" --random-inputs 4 --dim M=10 --check
has "gemm + rest, two results: scalar PASS" "$OUT" "^PASS \\(1600 elements"

# ---- rope, attention, moe: inputs from gen-npy, --check on the avx512 and scalar paths ----
# gen-npy gives a file named after an operand role values of that role: pos in
# [0, 16), a real cos/sin cache, distinct expert ids in [0, 16), weights summing to 1.
G=$WORK/gen
mkdir -p "$G"
gen() { "$TJ" gen-npy "$G/$1.npy" --dtype "$2" --shape "$3" --seed "${4:-1}" || fail "gen-npy $1"; }
gen q '<u2' 7,32,128
gen pos '<i4' 7
gen cos_sin '<f4' 64,128
gen k '<u2' 19,8,128 2
gen v '<u2' 19,8,128 3
gen hidden '<u2' 5,256
gen w13 '<u2' 16,192,256 4
gen w2 '<u2' 16,256,96 5
gen topk_weights '<f4' 5,2
gen topk_ids '<i4' 5,2
R=(-i "q=$G/q.npy" -i "pos=$G/pos.npy" -i "cos_sin=$G/cos_sin.npy")
A=(-i "q=$G/q.npy" -i "k=$G/k.npy" -i "v=$G/v.npy")
M=(-i "hidden=$G/hidden.npy" -i "w13=$G/w13.npy" -i "w2=$G/w2.npy"
  -i "topk_weights=$G/topk_weights.npy" -i "topk_ids=$G/topk_ids.npy")
RA=("${R[@]}" -i "k=$G/k.npy" -i "v=$G/v.npy")
active=$(sed -nE 's/^active path +([a-z0-9]+).*/\1/p' <("$TJ" cpuinfo))
# The paths this host runs (TILEJIT_ISA caps: a path the CPU lacks falls back,
# e.g. avx512 on an AVX2-only host runs llvm).
runnable=""
for p in amx avx512 llvm scalar; do
  [ "$(sed -nE 's/^active path +([a-z0-9]+).*/\1/p' <(TILEJIT_ISA=$p "$TJ" cpuinfo))" = "$p" ] &&
    runnable+=" $p"
done
runs_here() { [[ " $runnable " == *" $1 "* ]]; }
for ex in rope:R attention_causal:A moe_silu:M rope_attention:RA; do
  name=${ex%%:*}
  declare -n args=${ex#*:}
  [ -f "$EXAMPLES/$name.tir" ] || { fail "missing examples/$name.tir"; continue; }
  for isa in avx512 scalar; do
    ok "$name (gen-npy): run --isa $isa --check" "$TJ" run "$EXAMPLES/$name.tir" "${args[@]}" --isa $isa --check
    has "$name (gen-npy, $isa): PASS" "$OUT" "^PASS \\("
    has "$name (gen-npy, $isa): tolerance stated" "$OUT" "^  tolerance +[^ ]"
  done
  unset -n args
done
has "rope_attention: checked call by call" "$OUT" "each call on the operands it read"
has "rope_attention: rope bound" "$OUT" "%qr \\(rope\\): bf16: 2⁻⁷·\\|ref\\|"

# ---- quantized experts (docs/ir.md "Quantized experts"): every path, decode and prefill rows ----
# T = 1 and 3: most experts take <= 4 rows (the fused decode kernel in one
# call); T = 64: runs around 16 rows (the fused kernel's row groups up to 16
# on avx512 / llvm, the dequant route past them and on amx) and bigger int8 groups.
for name in moe_int8 moe_fp8_block moe_int4_gptq moe_mxfp4; do
  tir=$EXAMPLES/$name.tir
  [ -f "$tir" ] || { fail "missing examples/$name.tir"; continue; }
  if grep -Eq 'xi8>' "$tir"; then helper=act_quant; else helper=dequant; fi
  for isa in avx512 amx llvm; do
    ok "$name: dump --stage plan --isa $isa" "$TJ" dump "$tir" --stage plan --isa $isa --dim T=4
    has "$name: plan api ($isa)" "$OUT" "^  api +w13p = tilejit::pack_experts\\(E (Int8|Fp8|Int4|Mxfp4)Weight of %[a-z0-9_]+ (i8|f8e4m3|u4|f4e2m1) \\[8, 192, 256\\] with scales %"
    has "$name: plan names the helper kernel ($isa)" "$OUT" "^  kernels +.*\\b${helper}_(avx512|llvm)_[a-z0-9]+"
  done
  for isa in avx512 llvm; do
    ok "$name: dump --stage key --isa $isa" "$TJ" dump "$tir" --stage key --isa $isa
    has "$name: helper kernel named ($isa)" "$OUT" "^  kernel  ${helper}_${isa}_[a-z0-9_]+ \\(w13: "
    has "$name: helper key ($isa)" "$OUT" "^  key     ${helper};isa=${isa};"
    ok "$name: dump --stage asm --isa $isa" "$TJ" dump "$tir" --stage asm --isa $isa
    has "$name: helper asm ($isa)" "$OUT" "^; kernel ${helper}_${isa}_[a-z0-9_]+  \\([0-9]+ bytes\\)"
    has "$name: the rest is chosen at run time ($isa)" "$OUT" "kernels are chosen and compiled inside the operator at run time"
  done
  ok "$name: dump --stage key --isa scalar" "$TJ" dump "$tir" --stage key --isa scalar
  has "$name: scalar: no JIT code" "$OUT" "^  kernels none \\(no JIT code on the scalar path\\)"
  for isa in $active avx512 llvm scalar; do
    runs_here $isa || continue
    for t in 1 3 64; do
      TILEJIT_ISA=$isa ok "$name: run T=$t --check, TILEJIT_ISA=$isa" "$TJ" run "$tir" --random-inputs 7 --dim T=$t --check
      has "$name: $isa path (T=$t)" "$OUT" "on the $isa path"
      has "$name: PASS ($isa, T=$t)" "$OUT" "^PASS \\("
    done
  done
  has "$name: reference" "$OUT" "^check  against the scalar reference \\(runtime/reference_moe.h's oracle on the exact dequantized experts"
  has "$name: tolerance" "$OUT" "^  tolerance +the bf16 experts' bound .* on the exact (int8|fp8_e4m3|int4_gptq|mxfp4) weights"
done
# Non-gated experts (gated = false, relu2: Nemotron-H): bf16 with a non-gated
# shared expert and block fp8, against the oracles on every path (decode,
# the fused kernel's rows, prefill); dump packs w13 as ExpertProj::up.
for name in moe_relu2 moe_relu2_fp8; do
  tir=$EXAMPLES/$name.tir
  [ -f "$tir" ] || { fail "missing examples/$name.tir"; continue; }
  for isa in $active avx512 llvm scalar; do
    runs_here $isa || continue
    for t in 1 5 64; do
      TILEJIT_ISA=$isa ok "$name: run T=$t --check ($isa)" "$TJ" run "$tir" --random-inputs 5 --dim T=$t --check
      has "$name: PASS ($isa, T=$t)" "$OUT" "^PASS \\("
    done
  done
  ok "$name: dump --stage plan" "$TJ" dump "$tir" --stage plan --dim T=4
  has "$name: w13 packed as up" "$OUT" "w13p = tilejit::pack_experts\\(.*%w1 .*, up\\)"
  has "$name: plain epilogue" "$OUT" "plain relu2 epilogue \\(non-gated\\)"
done
# MoeOptions' tensors as named operands: GPT-OSS's biases (moe_mxfp4.tir, run
# above on every path) and a gated bf16 shared expert (moe_shared_expert.tir)
# checked against the oracle on every path; dump names them in the call; the
# shared expert's weights without the expert is a verifier error.
tir=$EXAMPLES/moe_shared_expert.tir
for isa in $active avx512 llvm scalar; do
  runs_here $isa || continue
  for t in 1 9; do
    TILEJIT_ISA=$isa ok "moe shared expert: run T=$t --check ($isa)" "$TJ" run "$tir" --random-inputs 3 --dim T=$t --check
    has "moe shared expert: PASS ($isa, T=$t)" "$OUT" "^PASS \\("
  done
done
ok "moe shared expert: dump --stage plan" "$TJ" dump "$tir" --stage plan --dim T=4
has "moe shared expert: dump packs it" "$OUT" "sp13 = tilejit::pack_experts\\(%shared_w13 bf16 \\[320, 256\\] as \\[1, 2·Is, H\\], gate_up\\)"
has "moe shared expert: dump passes it" "$OUT" "\\.shared_w13 = &sp13, \\.shared_w2 = &sp2, \\.shared_weights = %shared_gate f32 \\[4\\]"
ok "moe biases: dump --stage plan" "$TJ" dump "$EXAMPLES/moe_mxfp4.tir" --stage plan --dim T=4
has "moe biases: dump passes them" "$OUT" "\\.b13 = %w13_bias f32 \\[8, 192\\], \\.b2 = %w2_bias f32 \\[8, 256\\]"
sed -e 's/shared_w13 = %shared_w13,//; s/shared_w2 = %shared_w2, //' "$tir" >"$WORK/sw_only.tir"
input_error "moe shared_weights without a shared expert" "sw_only.tir: error: %o = moe: operand 'shared_weights' \\(%shared_gate\\) without a shared expert" \
  "$TJ" dump "$WORK/sw_only.tir" --stage verified
# AttentionOptions' per-head tensors as named operands: GPT-OSS's sinks with a
# sliding window (attention_sinks.tir) and sinks + ALiBi slopes on the paged
# decode, checked on every path at shapes where a dropped sink moves the
# output past the bound (few keys) and at longer ones; dump names them.
tir=$EXAMPLES/attention_sinks.tir
sed -e 's/%seq_lens: tensor<4xi32>)/%seq_lens: tensor<4xi32>, %sinks: tensor<32xf32>, %slopes: tensor<32xf32>)/' \
    -e 's/%block_table, %seq_lens {/%block_table, %seq_lens, sinks = %sinks, alibi_slopes = %slopes {/' \
    "$EXAMPLES/decode_attention.tir" >"$WORK/decode_sinks.tir"
for isa in $active avx512 llvm scalar; do
  runs_here $isa || continue
  for ts in "3 5" "37 300"; do
    set -- $ts
    TILEJIT_ISA=$isa ok "attention sinks: run T=$1 S=$2 --check ($isa)" "$TJ" run "$tir" --random-inputs 5 --dim T=$1 --dim S=$2 --check
    has "attention sinks: PASS ($isa, T=$1 S=$2)" "$OUT" "^PASS \\("
  done
  TILEJIT_ISA=$isa ok "decode sinks + alibi: run --check ($isa)" "$TJ" run "$WORK/decode_sinks.tir" --random-inputs 5 --check
  has "decode sinks + alibi: PASS ($isa)" "$OUT" "^PASS \\("
done
ok "attention sinks: dump --stage plan" "$TJ" dump "$tir" --stage plan --dim T=4 --dim S=9
has "attention sinks: dump passes them" "$OUT" "\\.softcap = 0, \\.sinks = %sinks f32 \\[64\\]\\}\\): one sequence"
ok "decode sinks + alibi: dump --stage plan" "$TJ" dump "$WORK/decode_sinks.tir" --stage plan
has "decode sinks + alibi: dump passes them" "$OUT" "\\.sinks = %sinks f32 \\[32\\], \\.alibi_slopes = %slopes f32 \\[32\\]\\}"
sed -e 's/%sinks: tensor<64xf32>/%sinks: tensor<63xf32>/' "$tir" >"$WORK/sinks_bad.tir"
input_error "attention sinks of the wrong length" "sinks_bad.tir: error: %o = attention: operand 'sinks' \\(%sinks\\) has Hq=63 but 'q' \\(%q\\) has Hq=64" \
  "$TJ" dump "$WORK/sinks_bad.tir" --stage verified
# int4 experts' int4_route: forced W4A8 (and W4A16) checked on every path
# (the oracle follows the route per expert); dump names the route; a value
# outside the three is a verifier error.
for route in w4a8 w4a16; do
  sed -e "s/{format = \"gptq\", group_size = 128, top_k = 2}/{format = \"gptq\", group_size = 128, int4_route = \"$route\", top_k = 2}/" \
    "$EXAMPLES/moe_int4_gptq.tir" >"$WORK/moe_$route.tir"
  for isa in $active llvm scalar; do
    runs_here $isa || continue
    TILEJIT_ISA=$isa ok "moe int4_route=$route: run T=9 --check ($isa)" "$TJ" run "$WORK/moe_$route.tir" --random-inputs 4 --dim T=9 --check
    has "moe int4_route=$route: PASS ($isa)" "$OUT" "^PASS \\("
  done
done
ok "moe int4_route=w4a8: dump --stage plan" "$TJ" dump "$WORK/moe_w4a8.tir" --stage plan --isa llvm --dim T=4
has "moe int4_route=w4a8: dump names the route" "$OUT" "int4_route w4a8: every expert .* take W4A8"
sed -e 's/{format = "gptq", group_size = 128, top_k = 2}/{format = "gptq", group_size = 128, int4_route = "w4a4", top_k = 2}/' \
  "$EXAMPLES/moe_int4_gptq.tir" >"$WORK/moe_w4a4.tir"
input_error "moe int4_route outside the enum" "error: %o = moe: attribute 'int4_route' = \"w4a4\" must be one of \"automatic\", \"w4a16\", \"w4a8\"" \
  "$TJ" dump "$WORK/moe_w4a4.tir" --stage verified
# A computed scale is refused: the experts are packed once, when the inputs are bound.
printf 'func @q(%%h: tensor<?Tx256xbf16>, %%w13: tensor<2x64x256xi8>, %%w2: tensor<2x256x32xi8>, %%tw: tensor<?Tx1xf32>, %%ti: tensor<?Tx1xi32>, %%s13: tensor<2x64xf32>, %%s2: tensor<2x256xf32>) -> (tensor<?Tx256xbf16>) {\n  %%a = moe %%h, %%w13, %%w2, %%tw, %%ti, scale13 = %%s13, scale2 = %%s2 {top_k = 1} : tensor<?Tx256xbf16>\n  %%o = moe %%a, %%w13, %%w2, %%tw, %%ti, scale13 = %%s13, scale2 = %%s2 {top_k = 1} : tensor<?Tx256xbf16>\n  return %%o\n}\n' >"$WORK/moe_q2.tir"
ok "quantized experts, two calls: run --check" "$TJ" run "$WORK/moe_q2.tir" --random-inputs 3 --dim T=5 --check
has "quantized experts, two calls: PASS" "$OUT" "^PASS \\("
printf 'func @q(%%h: tensor<?Tx256xbf16>, %%w13: tensor<2x64x256xi8>, %%w2: tensor<2x256x32xi8>, %%tw: tensor<?Tx1xf32>, %%ti: tensor<?Tx1xi32>, %%s13: tensor<2x64xf32>) -> (tensor<?Tx256xbf16>) {\n  %%o = moe %%h, %%w13, %%w2, %%tw, %%ti, scale13 = %%s13 {top_k = 1} : tensor<?Tx256xbf16>\n  return %%o\n}\n' >"$WORK/moe_q_bad.tir"
bad "quantized experts without scale2" "error: %o = moe: operand 'w2' \\(%w2\\) is i8: a quantized weight needs a 'scale2' operand" "$TJ" run "$WORK/moe_q_bad.tir" --random-inputs 1 --dim T=2
# ---- decode_attention over a paged cache (bf16, and f8e4m3 / f8e5m2 with k_scale / v_scale) ----
# Every runnable path against the reference over the block table's rows; dump
# names the operator's one LLVM kernel, its key and its code.
for name in decode_attention decode_attention_fp8 decode_attention_fp8_e5m2; do
  tir=$EXAMPLES/$name.tir
  [ -f "$tir" ] || { fail "missing examples/$name.tir"; continue; }
  for isa in $active avx512 llvm scalar; do
    runs_here $isa || continue
    TILEJIT_ISA=$isa ok "$name: run --check, TILEJIT_ISA=$isa" "$TJ" run "$tir" --random-inputs 5 --check
    has "$name: $isa path" "$OUT" "on the $isa path: decode_attention B=[0-9]+ Hq=[0-9]+ Hkv=[0-9]+ "
    has "$name: PASS ($isa)" "$OUT" "^PASS \\("
  done
  has "$name: reference" "$OUT" "^check  against the scalar reference \\(runtime/reference_attention.h over the cache rows of the block table"
  ok "$name: dump --stage plan" "$TJ" dump "$tir" --stage plan --isa llvm
  has "$name: plan api" "$OUT" "^  api +tilejit::decode_attention\\(q = %q bf16 \\[[0-9]+, [0-9]+, [0-9]+\\], k_cache = %k_cache (bf16|f8e4m3|f8e5m2) "
  has "$name: plan kernel" "$OUT" "^  kernels +decode_attn_llvm_d[0-9]+_dv[0-9]+_g[0-9]+_bs[0-9]+_"
  ok "$name: dump --stage key" "$TJ" dump "$tir" --stage key --isa llvm
  key=$(sed -nE 's/^  key +(decode_attn_llvm;[^ ]+)$/\1/p' "$OUT")
  checks=$((checks + 1))
  [ -n "$key" ] || fail "$name: dump --stage key prints no decode_attn_llvm key"
  ok "$name: dump --stage asm" "$TJ" dump "$tir" --stage asm --isa llvm
  has "$name: asm header" "$OUT" "^; kernel decode_attn_llvm_[a-z0-9_]+  \\([0-9]+ bytes\\)"
  # The kernel dump names is the one the call compiles.
  TILEJIT_ISA=llvm TILEJIT_VERBOSE=1 ok "$name: run, TILEJIT_VERBOSE=1" "$TJ" run "$tir" --random-inputs 5
  has "$name: the compiled kernel has dump's key" "$ERR" "^tilejit: compiled decode_attn_llvm_[a-z0-9_]+ .* key=$key\$"
  ok "$name: dump --stage key --isa scalar" "$TJ" dump "$tir" --stage key --isa scalar
  has "$name: scalar: no JIT code" "$OUT" "^  kernels none \\(no JIT code on the scalar path\\)"
done
# Past the LLVM kernel's 1024 query heads per kv head the engine's decode runs.
printf 'func @d(%%q: tensor<1x1088x16xbf16>, %%k_cache: tensor<3x16x1x16xbf16>, %%v_cache: tensor<3x16x1x16xbf16>, %%bt: tensor<1x3xi32>, %%sl: tensor<1xi32>) -> (tensor<1x1088x16xbf16>) {\n  %%0 = decode_attention %%q, %%k_cache, %%v_cache, %%bt, %%sl : tensor<1x1088x16xbf16>\n  return %%0\n}\n' >"$WORK/decode_wide.tir"
ok "decode_attention, 1088 heads per kv head: run --check" "$TJ" run "$WORK/decode_wide.tir" --random-inputs 3 --check
has "decode_attention, 1088 heads per kv head: PASS" "$OUT" "^PASS \\("
ok "decode_attention, 1088 heads per kv head: dump --stage plan" "$TJ" dump "$WORK/decode_wide.tir" --stage plan --isa llvm
has "decode_attention, 1088 heads per kv head: the engine" "$OUT" "more query heads per kv head than the LLVM kernel unrolls"
ok "decode_attention_fp8: dump --stage key" "$TJ" dump "$EXAMPLES/decode_attention_fp8.tir" --stage key --isa avx512
has "decode_attention_fp8: the fp8 cache's kernel" "$OUT" "^  key     decode_attn_llvm;d=96;dv=64;g=8;bs=1;.*;kv=f8e4m3;"
# An e5m2 cache (vLLM's fp8_e5m2): its own kernel, its scales in the call,
# its codes through .npy files ('|u1') both ways, the reference reading them
# as e5m2 (the same bytes read as e4m3 would fail the check).
E5=$EXAMPLES/decode_attention_fp8_e5m2.tir
ok "decode_attention_fp8_e5m2: dump --stage key" "$TJ" dump "$E5" --stage key --isa avx512
has "decode_attention_fp8_e5m2: the e5m2 cache's kernel" "$OUT" "^  key     decode_attn_llvm;d=128;dv=128;g=8;bs=16;.*;kv=f8e5m2;"
ok "decode_attention_fp8_e5m2: dump --stage plan" "$TJ" dump "$E5" --stage plan --isa scalar
has "decode_attention_fp8_e5m2: the call's cache scales" "$OUT" "k_cache = %k_cache f8e5m2 \\[64, 16, 2, 128\\], .*\\.kv_scales = \\{\\.k_scale = 0\\.02, \\.v_scale = 0\\.05\\}"
ok "decode_attention_fp8_e5m2: inputs" "$TJ" run "$E5" --random-inputs 7 --save-inputs "$WORK/e5in" --output 0="$WORK/e5out.npy" --check
has "decode_attention_fp8_e5m2: PASS on saved inputs" "$OUT" "^PASS \\("
checks=$((checks + 1))
[ "$(head -c 64 "$WORK/e5in/k_cache.npy" | tr -d '\0' | grep -ao "'descr': '|u1'")" = "'descr': '|u1'" ] ||
  fail "decode_attention_fp8_e5m2: the saved cache is not '|u1' codes"
e5inputs=()
for f in "$WORK/e5in"/*.npy; do e5inputs+=(--input "$(basename "$f" .npy)=$f"); done
ok "decode_attention_fp8_e5m2: run --input ... --check" "$TJ" run "$E5" "${e5inputs[@]}" --output 0="$WORK/e5out2.npy" --check
has "decode_attention_fp8_e5m2: PASS from files" "$OUT" "^PASS \\("
checks=$((checks + 1))
cmp -s "$WORK/e5out.npy" "$WORK/e5out2.npy" || fail "decode_attention_fp8_e5m2: outputs from saved inputs differ"
"$TJ" gen-npy "$WORK/e5f4.npy" --dtype '<f4' --shape 64,16,2,128 --seed 3 || fail "gen-npy e5f4"
input_error "decode_attention_fp8_e5m2: a float cache file" "error: input 'k_cache' \\(.*\\) is a '<f4' array; tensor<64x16x2x128xf8e5m2> needs '\\|u1' \\(e5m2 codes\\)" \
  "$TJ" run "$E5" --input k_cache="$WORK/e5f4.npy" --random-inputs 7
# Bad input reaches the call's own Error: block ids past the cache (gen-npy's
# plain i32 values lie in [0, 16), the cache has 4 blocks).
printf 'func @d(%%q: tensor<2x4x64xbf16>, %%k_cache: tensor<4x16x2x64xbf16>, %%v_cache: tensor<4x16x2x64xbf16>, %%bt: tensor<2x2xi32>, %%sl: tensor<2xi32>) -> (tensor<2x4x64xbf16>) {\n  %%0 = decode_attention %%q, %%k_cache, %%v_cache, %%bt, %%sl : tensor<2x4x64xbf16>\n  return %%0\n}\n' >"$WORK/decode_small.tir"
ok "decode_attention: small cache, generated table" "$TJ" run "$WORK/decode_small.tir" --random-inputs 2 --check
has "decode_attention: small cache PASS" "$OUT" "^PASS \\("
"$TJ" gen-npy "$WORK/bt.npy" --dtype '<i4' --shape 2,2 --seed 3 || fail "gen-npy bt"
bad "decode_attention: block id past the cache" "error: decode_attention: block_table\\[0, 0\\]=8; allowed: \\[0, num_blocks\\) = \\[0, 4\\)" \
  "$TJ" run "$WORK/decode_small.tir" --random-inputs 2 --input bt="$WORK/bt.npy"
sed -e 's/{k_scale = 0.02, v_scale = 0.05, window_left = 100}/{v_scale = 0.05}/' \
  -e 's/xf8e4m3>/xbf16>/g' "$EXAMPLES/decode_attention_fp8.tir" >"$WORK/decode_scale_bf16.tir"
input_error "decode_attention: a cache scale on a bf16 cache" "error: %0 = decode_attention: attribute 'v_scale' needs an fp8 \\(f8e4m3 or f8e5m2\\) cache; 'k_cache' \\(%k_cache\\) is bf16" \
  "$TJ" dump "$WORK/decode_scale_bf16.tir" --stage verified

# The RoPE kernel and key that dump names are the ones the call compiles.
if [ "$active" != scalar ]; then
  # Its code too, through the registry (LLVM code); attention's kernels are
  # chosen at run time and are only named.
  ok "rope: dump --stage asm" "$TJ" dump "$EXAMPLES/rope.tir" --stage asm
  has "rope: asm header" "$OUT" "^; kernel rope_llvm_[a-z0-9_]+  \\([0-9]+ bytes\\)"
  has "rope: asm is LLVM code with its key" "$OUT" "^; tilejit::rope: rope_llvm;.*llvm_cpu=.* \\(llvm code\\)"
  ok "rope_attention: dump --stage asm" "$TJ" dump "$EXAMPLES/rope_attention.tir" --stage asm
  has "rope_attention: the rope kernel's code" "$OUT" "^; kernel rope_llvm_"
  has "rope_attention: attention named, not listed" "$OUT" "runs tilejit::flash_attn_varlen: the kernels are chosen"
  ok "rope: dump --stage key" "$TJ" dump "$EXAMPLES/rope.tir" --stage key
  key=$(sed -nE 's/^  key +(rope_llvm;[^ ]+)$/\1/p' "$OUT")
  checks=$((checks + 1))
  [ -n "$key" ] || fail "rope: dump --stage key prints no rope_llvm key"
  TILEJIT_VERBOSE=1 ok "rope: run, TILEJIT_VERBOSE=1" "$TJ" run "$EXAMPLES/rope.tir" "${R[@]}"
  has "rope: the compiled kernel has dump's key" "$ERR" "^tilejit: compiled rope_llvm_[a-z0-9_]+ .* key=$key\$"
fi

# A NaN in q (rope) and in hidden (moe) makes those outputs NaN, as the
# references' (docs/tool.md: a NaN reference is matched exactly, whatever its
# bound, itself NaN there): a PASS (they FAILed on the NaN bound). That a
# mismatch FAILs is tests/check_report_test.cpp's.
poison() {  # <src.npy> <dst.npy> <elements> <item bytes> <bits as printf escapes>: element 0
  cp "$1" "$2"
  printf "$5" | dd of="$2" bs=1 seek=$(($(stat -c %s "$1") - $3 * $4)) conv=notrunc 2>/dev/null
}
poison "$G/q.npy" "$G/q_nan.npy" $((7 * 32 * 128)) 2 '\xc0\x7f'
poison "$G/hidden.npy" "$G/hidden_nan.npy" $((5 * 256)) 2 '\xc0\x7f'
for case in "rope:q=$G/q_nan.npy:${R[*]:2}" "moe_silu:hidden=$G/hidden_nan.npy:${M[*]:2}"; do
  IFS=: read -r name poisoned rest <<<"$case"
  read -ra rest <<<"$rest"
  checks=$((checks + 1))
  "$TJ" run "$EXAMPLES/$name.tir" -i "$poisoned" "${rest[@]}" --check >"$OUT" 2>"$ERR"
  rc=$?
  [ $rc -eq 0 ] || fail "$name: a NaN input: exit $rc, expected 0 (the NaN outputs match the reference's)"
  has "$name: a NaN input PASSes" "$OUT" "^PASS \\("
  has "$name: the NaN reaches the output" "$OUT" "mean nan"
done
# Right answers --check failed (an outside tester): an elementwise chain
# whose values reach ±Inf (relu(-Inf) = 0 carried a NaN bound; relu2(2e19)
# and x*x overflow f32 where the reference stayed in double), and int4 with
# an Inf in x on each route (automatic keeps W4A16; a requested w4a8 makes
# the row NaN, W8A8's rule).
printf 'func @e(%%x: tensor<4x20xf32>) -> (tensor<4x20xf32>, tensor<4x20xf32>, tensor<4x20xf32>) {\n  %%0 = relu %%x : tensor<4x20xf32>\n  %%1 = relu2 %%x : tensor<4x20xf32>\n  %%2 = mul %%x, %%x : tensor<4x20xf32>\n  return %%0, %%1, %%2\n}\n' >"$WORK/ew_inf.tir"
"$TJ" gen-npy "$WORK/ew_x.npy" --dtype '<f4' --shape 4,20 --seed 9
poison "$WORK/ew_x.npy" "$WORK/ew_minf.npy" 80 4 '\x00\x00\x80\xff'  # -Inf
poison "$WORK/ew_x.npy" "$WORK/ew_big.npy" 80 4 '\x23\xc7\x8a\x5f'   # 2e19
sed 's/group_size = 128}/group_size = 128, int4_route = "w4a8"}/' "$EXAMPLES/gemm_int4_gptq.tir" >"$WORK/g4_w4a8.tir"
ok "int4 inputs for the Inf cases" "$TJ" run "$EXAMPLES/gemm_int4_gptq.tir" --random-inputs 4 --dim M=5 --save-inputs "$WORK/g4in"
poison "$WORK/g4in/x.npy" "$WORK/g4in/x_inf.npy" $((5 * 256)) 2 '\x80\x7f'  # +Inf
g4=()
for f in "$WORK/g4in"/*.npy; do
  b=$(basename "$f" .npy)
  [ "$b" = x ] || [ "$b" = x_inf ] || g4+=(-i "$b=$f")
done
for isa in $active avx512 llvm scalar; do
  runs_here $isa || continue
  for x in minf big; do
    TILEJIT_ISA=$isa ok "elementwise chain, x[0] = $x: --check ($isa)" "$TJ" run "$WORK/ew_inf.tir" -i x="$WORK/ew_$x.npy" --check
    has "elementwise chain, x[0] = $x: PASS ($isa)" "$OUT" "^PASS \\("
  done
  for tir in "$EXAMPLES/gemm_int4_gptq.tir" "$WORK/g4_w4a8.tir"; do
    TILEJIT_ISA=$isa ok "$(basename "$tir"), an Inf in x: --check ($isa)" "$TJ" run "$tir" -i x="$WORK/g4in/x_inf.npy" "${g4[@]}" --check
    has "$(basename "$tir"), an Inf in x: PASS ($isa)" "$OUT" "^PASS \\("
  done
done

# Options the IR has and the API takes: gptj, partial rotary, f32, int64
# positions (saved and read back as '<i4'); windows, softcap, sm_scale, GQA, a
# strided k; gelu, E < 16, tails, a w13 the IR calls packed (the tool packs).
printf 'func @r(%%q: tensor<?Tx4x96xf32>, %%pos: tensor<?Txi64>, %%cs: tensor<?Px64xf32>) -> (tensor<?Tx4x96xf32>) {\n  %%o = rope %%q, %%pos, %%cs {rotary_dim = 64, style = "gptj"} : tensor<?Tx4x96xf32>\n  return %%o\n}\n' >"$WORK/rope_i64.tir"
printf 'func @a(%%q: tensor<?Tx8x64xbf16>, %%k: tensor<?Sx2x64xbf16, strided<[256, 64, 1]>>, %%v: tensor<?Sx2x64xbf16>) -> (tensor<?Tx8x64xbf16>) {\n  %%o = attention %%q, %%k, %%v {causal = true, sm_scale = 0.2, softcap = 4.0, window_left = 5} : tensor<?Tx8x64xbf16>\n  return %%o\n}\n' >"$WORK/attn_opts.tir"
printf 'func @m(%%h: tensor<?Tx100xbf16>, %%w13: tensor<5x80x100xbf16, packed<vnni2, n_block=64, k_pair=2>>, %%w2: tensor<5x100x40xbf16>, %%tw: tensor<?Tx3xf32>, %%ti: tensor<?Tx3xi32>) -> (tensor<?Tx100xbf16>) {\n  %%o = moe %%h, %%w13, %%w2, %%tw, %%ti {activation = "gelu_tanh", top_k = 3} : tensor<?Tx100xbf16>\n  return %%o\n}\n' >"$WORK/moe_gelu.tir"
# GPT-OSS's clamped SwiGLU (a small limit so both clamps bite) with a routed scale.
printf 'func @m(%%h: tensor<?Tx96xbf16>, %%w13: tensor<4x96x96xbf16>, %%w2: tensor<4x96x48xbf16>, %%tw: tensor<?Tx2xf32>, %%ti: tensor<?Tx2xi32>) -> (tensor<?Tx96xbf16>) {\n  %%o = moe %%h, %%w13, %%w2, %%tw, %%ti {activation = "clamped_swiglu", swiglu_alpha = 1.702, swiglu_limit = 0.5, routed_scaling_factor = 2.5, top_k = 2} : tensor<?Tx96xbf16>\n  return %%o\n}\n' >"$WORK/moe_swiglu.tir"
for spec in "rope_i64:--dim T=33 --dim P=100" "attn_opts:--dim T=20 --dim S=30" "moe_gelu:--dim T=37" "moe_swiglu:--dim T=29"; do
  name=${spec%%:*}
  read -ra d <<<"${spec#*:}"
  ok "$name: run --check" "$TJ" run "$WORK/$name.tir" --random-inputs 5 "${d[@]}" --save-inputs "$WORK/$name.in" --check
  has "$name: PASS" "$OUT" "^PASS \\("
  [ "$name" != rope_i64 ] || has "rope_i64: f32 bound" "$OUT" "tolerance +f32: 2⁻²²"
  inputs=()
  for f in "$WORK/$name.in"/*.npy; do inputs+=(--input "$(basename "$f" .npy)=$f"); done
  TILEJIT_ISA=scalar ok "$name: scalar run --check from files" "$TJ" run "$WORK/$name.tir" "${inputs[@]}" --check
  has "$name: scalar PASS" "$OUT" "^PASS \\("
done
checks=$((checks + 1))
head -c 128 "$WORK/rope_i64.in/pos.npy" | grep -q "'descr': '<i4'" || fail "rope_i64: i64 positions not saved as '<i4'"
ok "rope_i64: dump --stage key" "$TJ" dump "$WORK/rope_i64.tir" --stage key --isa avx512
has "rope_i64: kernel for int64 positions" "$OUT" "^  kernel +rope_llvm_gptj_f32_cachef32_d96_rd64_hq4_hk0_posi64$"
ok "moe_gelu: dump --stage plan" "$TJ" dump "$WORK/moe_gelu.tir" --stage plan --dim T=4
has "moe_gelu: packs the weights" "$OUT" "w13p = tilejit::pack_experts\\(%w13 bf16 \\[5, 80, 100\\], gate_up\\)"
has "moe_gelu: the activation" "$OUT" "\\{\\.act = gelu_tanh\\}"
ok "moe_swiglu: dump --stage plan" "$TJ" dump "$WORK/moe_swiglu.tir" --stage plan --dim T=4
has "moe_swiglu: the activation" "$OUT" "clamped_swiglu\\(alpha=1.702, limit=0.5\\)"

# What the public API cannot take is refused, in the file: error: style.
printf 'func @f(%%q: tensor<?Tx8x64xf32>, %%k: tensor<?Sx2x64xf32>, %%v: tensor<?Sx2x64xf32>) -> (tensor<?Tx8x64xf32>) {\n  %%o = attention %%q, %%k, %%v : tensor<?Tx8x64xf32>\n  return %%o\n}\n' >"$WORK/attn_f32.tir"
bad "attention f32: run" "attn_f32.tir: error: %o = attention .*operand 'q' \\(%q\\) is f32: tilejit::flash_attn_varlen takes bf16" \
  "$TJ" run "$WORK/attn_f32.tir" --random-inputs 1 --dim T=2 --dim S=2
bad "attention f32: dump" "attn_f32.tir: error: cannot produce --stage plan: .*takes bf16" "$TJ" dump "$WORK/attn_f32.tir"
printf 'func @g(%%x: tensor<?Tx64xbf16>, %%w: tensor<64x64xbf16>, %%q: tensor<?Tx2x64xbf16>, %%pos: tensor<?Txi32>, %%cs: tensor<?Px64xf32>) -> (tensor<?Tx64xf32>, tensor<?Tx2x64xbf16>) {\n  %%0 = gemm %%x, %%w : tensor<?Tx64xf32>\n  %%1 = rope %%q, %%pos, %%cs : tensor<?Tx2x64xbf16>\n  return %%0, %%1\n}\n' >"$WORK/mixed.tir"
bad "gemm and rope in one program" "mixed.tir: error: no lowering for op 'gemm' .* in a program with rope, attention, decode_attention or moe ops" \
  "$TJ" run "$WORK/mixed.tir" --random-inputs 1 --dim T=2 --dim P=2
bad "positions without a cache size" "random input 'pos' .*must lie in \\[0, \\?P\\) \\(%cos_sin dim 0\\).*give --dim P=SIZE" \
  "$TJ" run "$EXAMPLES/rope.tir" --random-inputs 1 --dim T=3
mkdir -p "$G/small"
gen small/cos_sin '<f4' 4,128
bad "positions past the cache" "rope: positions\\[.*allowed: \\[0, max_position = 4\\)" \
  "$TJ" run "$EXAMPLES/rope.tir" -i "q=$G/q.npy" -i "pos=$G/pos.npy" -i "cos_sin=$G/small/cos_sin.npy"
bad "gen-npy: a role with the wrong dtype" "expert ids are i32 \\[T, top_k\\]" \
  "$TJ" gen-npy "$G/topk_ids.npy" --dtype '<f4' --shape 3,2

# ---- hostile input: exit codes, size caps, one clear message per refused value ----
H=$WORK/hostile
mkdir -p "$H"
RT=$EXAMPLES/rope.tir
# Usage errors exit 2 and name the option and what it allows.
for d in T=-1 T=abc T=99999999999999999999 T=4611686018427387904 T=; do
  usage "--dim $d" "^tilejit run: error: --dim 'T=[^']*': the size must be an integer in \[0, 2147483647\] \(see tilejit run --help\)$|expected NAME=SIZE" \
    "$TJ" run "$RT" --random-inputs 1 --dim "$d"
done
usage "unknown dim (run)" "--dim 'Q=3': @rope has no dim \?Q; its symbolic dims are \?T, \?P" \
  "$TJ" run "$RT" --random-inputs 1 --dim Q=3
usage "unknown dim (dump)" "has no dim \?Q" "$TJ" dump "$LB" --dim Q=3
usage "dump --dim M=2^62" "the size must be an integer in \[0, 2147483647\]" \
  "$TJ" dump "$LS" --stage key --dim M=4611686018427387904
for s in -1 nan inf 1e308 0; do
  usage "bench --seconds $s" "^tilejit bench: error: --seconds [^:]*: allowed: a number of seconds > 0 and at most 3600" \
    "$TJ" bench "$LB" --dim M=2 --seconds "$s"
done
usage "bench --threads 100000" "^tilejit bench: error: --threads 100000: .*allowed: 1 to 4096" \
  "$TJ" bench "$LB" --dim M=2 --threads 100000 --seconds 0.01
usage "llama-layer --threads 100000" "^tilejit llama-layer: error: --threads 100000: .*allowed: 1 to 4096" \
  "$TJ" llama-layer --threads 100000
usage "llama-layer --weights int2" "^tilejit llama-layer: error: --weights: int2 not in \\{bf16,int8,fp8,int4\\}" \
  "$TJ" llama-layer --weights int2
usage "llama-layer --seconds nan" "^tilejit llama-layer: error: --seconds nan: allowed" "$TJ" llama-layer --seconds nan
usage "llama-layer --moe-weights int8,int2" "^tilejit llama-layer: error: --moe-weights: int2 not in \\{bf16,int8,fp8,fp8_block,int4,awq,mxfp4,all\\}" \
  "$TJ" llama-layer --moe-weights int8,int2
usage "llama-layer --only attn" "^tilejit llama-layer: error: --only: attn not in \\{dense,moe\\}" "$TJ" llama-layer --only attn
# The main job's MoE block alone (--only moe) with quantized experts: the job
# exits 0 only if every row's check passed; each M's int4 moe_experts row ran
# and says ok; the M = 1 row names its route (the fused decode kernel on
# amx / avx512 with VBMI); no dense-layer or bf16 experts row ran.
ok "llama-layer --only moe --moe-weights int4" "$TJ" llama-layer --only moe --moe-weights int4 --seconds 0.01
for m in 1 16 512; do
  has "llama-layer: int4 moe_experts M=$m checked" "$OUT" \
    "^moe_experts +$m E=128 k=8 H=2048 I=768 int4 .* ok \\(max err [^)]*\\)  err/bound [0-9.]+"
done
has "llama-layer: M=1 int4 experts name their route" "$OUT" "^moe_experts +1 .* int4 .*fused_experts \\(8 experts: (fused decode kernel|dequant \\+ bf16 kernels|scalar fallback)\\)"
checks=$((checks + 1))
! grep -Eq "^(input_norm|qkv_proj|attn_decode|silu_and_mul|moe_experts .* I=768  )" "$OUT" || fail "llama-layer --only moe: rows other than the MoE block's int4 ones ran"
for seed in 18446744073709551616 -1 abc; do
  usage "--random-inputs $seed" "--random-inputs: '$seed' is not a seed; allowed: an integer in \[0, 18446744073709551615\]" \
    "$TJ" run "$LB" --random-inputs "$seed" --dim M=2
done
usage "bench --seed -1" "--seed: '-1' is not a seed" "$TJ" bench "$LB" --dim M=2 --seed -1
touch "$H/a_file"
usage "--save-inputs at a regular file" "^tilejit run: error: --save-inputs '.*a_file': exists and is not a directory; allowed: a directory" \
  "$TJ" run "$LB" --random-inputs 1 --dim M=2 --save-inputs "$H/a_file"
usage "missing input is usage" "missing input 'bias'" "$TJ" run "$LB" --input "x=$WORK/lb/x.npy" --input "w=$WORK/lb/w.npy"
usage "unknown input is usage" "has no input 'q'" "$TJ" run "$LB" --input "q=$WORK/lb/x.npy" --random-inputs 1
usage "unknown output is usage" "has no result 'y'" "$TJ" run "$LB" --random-inputs 1 --dim M=2 --output "y=$WORK/y.npy"
usage "malformed --input is usage" "--input 'x': expected NAME=FILE.npy" "$TJ" run "$LB" --input x
usage "input given twice" "input 'x' is given twice" \
  "$TJ" run "$LB" --input "x=$WORK/lb/x.npy" --input "x=$WORK/lb/x.npy" --random-inputs 1
# --output onto an --input's file (by name, or through a symlink to it):
# the run would replace the data it read; the input stays as it was.
"$TJ" gen-npy "$H/xin.npy" --dtype '<u2' --shape 2,1024 --seed 5
ln -sf "$H/xin.npy" "$H/x_link.npy"
cp "$H/xin.npy" "$H/x_before.npy"
usage "output onto an input" "--output '1=.*xin.npy': the file of --input 'x=.*xin.npy'; allowed: a file that is not one of the run's inputs" \
  "$TJ" run "$LB" --input "x=$H/xin.npy" --random-inputs 1 --output "1=$H/xin.npy"
usage "output onto an input via a symlink" "--output '1=.*x_link.npy': the file of --input 'x=" \
  "$TJ" run "$LB" --input "x=$H/xin.npy" --random-inputs 1 --output "1=$H/x_link.npy"
ok "the input kept" cmp "$H/xin.npy" "$H/x_before.npy"
# Two --output onto one file: the second write would replace the first.
printf 'func @two(%%x: tensor<?Mx16xf32>) -> (tensor<?Mx16xf32>, tensor<?Mx16xf32>) {\n  %%a = silu %%x : tensor<?Mx16xf32>\n  %%b = relu %%x : tensor<?Mx16xf32>\n  return %%a, %%b\n}\n' >"$H/two.tir"
ok "two results: run" "$TJ" run "$H/two.tir" --random-inputs 1 --dim M=2 --output "a=$H/a.npy" --output "b=$H/b.npy"
usage "two outputs onto one file" "--output 'b=.*same.npy': the file of --output 'a=.*same.npy'; allowed: one file per result" \
  "$TJ" run "$H/two.tir" --random-inputs 1 --dim M=2 --output "a=$H/same.npy" --output "b=$H/./same.npy"
usage "unbound dim is usage" "\?M has no size; give --dim M=SIZE" "$TJ" run "$LB" --random-inputs 1
usage "unknown option" "^tilejit run: error: .*--frobnicate" "$TJ" run "$LB" --frobnicate
usage "unknown --stage" "--stage: bogus not in" "$TJ" dump "$LB" --stage bogus
usage "gen-npy --shape past int32" "--shape: dim 4294967296; allowed: 0 to 2147483647" \
  "$TJ" gen-npy "$H/g.npy" --shape 4294967296

# Zero and int64-max dims: the verifier refuses what run refuses (no SIGFPE in dump).
printf 'func @g(%%x: tensor<?Mx64xbf16>, %%w: tensor<0x64xbf16>) -> (tensor<?Mx0xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx0xf32>\n  return %%0\n}\n' >"$H/n0.tir"
printf 'func @g(%%x: tensor<?Mx0xbf16>, %%w: tensor<64x0xbf16>) -> (tensor<?Mx64xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx64xf32>\n  return %%0\n}\n' >"$H/k0.tir"
for isa in avx512 amx; do
  for stage in verified plan key asm all; do
    input_error "gemm N=0: dump --stage $stage --isa $isa" "n0.tir: error: %0 = gemm: operand 'w' \(%w\) has N=0; allowed: N >= 1" \
      "$TJ" dump "$H/n0.tir" --stage $stage --isa $isa --dim M=10
    input_error "gemm K=0: dump --stage $stage --isa $isa" "k0.tir: error: %0 = gemm: operand 'w' \(%w\) has K=0; allowed: K >= 1" \
      "$TJ" dump "$H/k0.tir" --stage $stage --isa $isa --dim M=10
  done
done
input_error "gemm K=0: run" "has K=0; allowed: K >= 1" "$TJ" run "$H/k0.tir" --random-inputs 1 --dim M=2
printf 'func @m(%%h: tensor<?Tx96xbf16>, %%w13: tensor<4x0x96xbf16>, %%w2: tensor<4x96x0xbf16>, %%tw: tensor<?Tx2xf32>, %%ti: tensor<?Tx2xi32>) -> (tensor<?Tx96xbf16>) {\n  %%o = moe %%h, %%w13, %%w2, %%tw, %%ti {top_k = 2} : tensor<?Tx96xbf16>\n  return %%o\n}\n' >"$H/moe0.tir"
input_error "moe I=0" "moe0.tir: error: %o = moe: operand 'w13' \(%w13\) has 2\*I=0; allowed: 2\*I >= 1" \
  "$TJ" dump "$H/moe0.tir" --dim T=3
printf 'func @a(%%q: tensor<?Tx0x64xbf16>, %%k: tensor<?Sx2x64xbf16>, %%v: tensor<?Sx2x64xbf16>) -> (tensor<?Tx0x64xbf16>) {\n  %%o = attention %%q, %%k, %%v {causal = true} : tensor<?Tx0x64xbf16>\n  return %%o\n}\n' >"$H/attn0.tir"
input_error "attention Hq=0" "attn0.tir: error: %o = attention: operand 'q' \(%q\) has Hq=0; allowed: Hq >= 1" \
  "$TJ" dump "$H/attn0.tir" --stage verified
printf 'func @r(%%q: tensor<?Tx0x64xf32>, %%pos: tensor<?Txi32>, %%cs: tensor<?Px64xf32>) -> (tensor<?Tx0x64xf32>) {\n  %%o = rope %%q, %%pos, %%cs : tensor<?Tx0x64xf32>\n  return %%o\n}\n' >"$H/rope0.tir"
input_error "rope H=0" "rope0.tir: error: %o = rope: operand 'q' \(%q\) has H=0; allowed: H >= 1" \
  "$TJ" dump "$H/rope0.tir" --stage plan
MAX=9223372036854775807
# Dims past tilejit::Limits::max_dim are refused where the type is written.
printf 'func @g(%%x: tensor<?Mx%sxbf16>, %%w: tensor<64x%sxbf16>) -> (tensor<?Mx64xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx64xf32>\n  return %%0\n}\n' $MAX $MAX >"$H/kmax.tir"
input_error "gemm K=INT64_MAX" "kmax.tir:1:13: error: tensor<\?Mx${MAX}xbf16>: dim $MAX is larger than 2147483647, the largest dim an operator takes" \
  "$TJ" dump "$H/kmax.tir" --stage ir
# The largest dims allowed plan without overflow (KC was -2016 for K = INT64_MAX).
BIG=2147483647
printf 'func @g(%%x: tensor<?Mx%sxbf16>, %%w: tensor<64x%sxbf16>) -> (tensor<?Mx64xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx64xf32>\n  return %%0\n}\n' $BIG $BIG >"$H/kbig.tir"
printf 'func @g(%%x: tensor<?Mx64xbf16>, %%w: tensor<%sx64xbf16>) -> (tensor<?Mx%sxf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx%sxf32>\n  return %%0\n}\n' $BIG $BIG $BIG >"$H/nbig.tir"
for isa in avx512 amx; do
  ok "gemm K=2^31-1: dump --stage plan --isa $isa" timeout 20 "$TJ" dump "$H/kbig.tir" --stage plan --isa $isa
  has "gemm K=2^31-1: K chunks of 2048 ($isa)" "$OUT" "KC=2048 x 1048576 chunks"
  ok "gemm N=2^31-1: dump --stage key --isa $isa" timeout 20 "$TJ" dump "$H/nbig.tir" --stage key --isa $isa --dim M=10
  has "gemm N=2^31-1: the N tail ($isa)" "$OUT" "N tail \(63 cols\)"
done
input_error "gemm N=2^31-1: run" "random input 'w' has shape \[$BIG, 64\] of 2-byte elements: 274877906816 bytes; allowed: at most 16 GiB" \
  "$TJ" run "$H/nbig.tir" --random-inputs 1 --dim M=2
printf 'func @s(%%x: tensor<?Mx100xbf16, strided<[%s, 1]>>, %%w: tensor<70x100xbf16>) -> (tensor<?Mx70xf32>) {\n  %%0 = gemm %%x, %%w : tensor<?Mx70xf32>\n  return %%0\n}\n' $MAX >"$H/xstride.tir"
input_error "x row stride INT64_MAX" "input 'x' at its row stride $MAX has shape .*more than 2\^63 bytes" \
  "$TJ" run "$H/xstride.tir" --random-inputs 1 --dim M=3
printf 'func @a(%%q: tensor<?Tx8x64xbf16>, %%k: tensor<?Sx2x64xbf16, strided<[4611686018427387904, 64, 1]>>, %%v: tensor<?Sx2x64xbf16>) -> (tensor<?Tx8x64xbf16>) {\n  %%o = attention %%q, %%k, %%v {causal = true} : tensor<?Tx8x64xbf16>\n  return %%o\n}\n' >"$H/kstride.tir"
input_error "k stride 2^62" "input 'k' at its strides \[4611686018427387904, 64, 1\] spans more than 2\^63 elements" \
  "$TJ" run "$H/kstride.tir" --random-inputs 1 --dim T=3 --dim S=4
# The largest --dim: the key stage lists the kernels without a loop over M.
ok "dump --stage key --dim M=2^31-1" timeout 20 "$TJ" dump "$LS" --stage key --dim M=2147483647
has "dump --dim M=2^31-1: M tail" "$OUT" "micro-kernels for M=2147483647"

# .npy files: read header first, the shape overflow-checked and capped.
npy_header() {  # <file> <shape tuple>: a version-1.0 header for '<u2' and no data
  npy_dict "$1" "{'descr': '<u2', 'fortran_order': False, 'shape': $2, }"
}
npy_dict() {  # <file> <header dict text>: a version-1.0 header and no data
  local h="$2"
  while [ $(((${#h} + 11) % 64)) -ne 0 ]; do h="$h "; done
  h="$h"$'\n'
  { printf '\x93NUMPY\x01\x00'; printf "\\x$(printf %02x $((${#h} % 256)))\\x$(printf %02x $((${#h} / 256)))"; printf '%s' "$h"; } >"$1"
}
# The header is a Python literal (numpy reads it with ast.literal_eval): its
# items and dims are separated by commas, and (5120) is an int, not a shape.
npy_dict "$H/nocomma.npy" "{'descr': '<u2' 'fortran_order': False 'shape': (5, 1024) }"
input_error ".npy header without commas" "nocomma.npy: bad .npy header \\(expected ',' at offset 16\\)" \
  "$TJ" run "$LB" -i "x=$H/nocomma.npy" --random-inputs 1
npy_header "$H/dimnocomma.npy" "(5 1024)"
input_error ".npy shape without commas" "dimnocomma.npy: bad .npy header \\(expected ','" \
  "$TJ" run "$LB" -i "x=$H/dimnocomma.npy" --random-inputs 1
npy_header "$H/notuple.npy" "(5120)"
input_error ".npy shape (5120) is no tuple" "notuple.npy: bad .npy header \\(expected ','" \
  "$TJ" run "$LB" -i "x=$H/notuple.npy" --random-inputs 1
npy_header "$H/wrap.npy" "(4503599627370496, 4096)"
input_error ".npy shape product overflows" "wrap.npy: the .npy array \(<u2\) has shape \[4503599627370496, 4096\] .*more than 2\^63 bytes" \
  "$TJ" run "$LB" -i "x=$H/wrap.npy" --random-inputs 1
npy_header "$H/huge.npy" "(1024, 1024, 1024, 1024)"
input_error ".npy past the 16 GiB cap" "huge.npy: .*2199023255552 bytes; allowed: at most 16 GiB" \
  "$TJ" run "$LB" -i "x=$H/huge.npy" --random-inputs 1
npy_header "$H/short.npy" "(5, 1024)"
input_error ".npy with no data" "short.npy: holds 0 data bytes, but shape \(5, 1024\) of <u2 needs 10240" \
  "$TJ" run "$LB" -i "x=$H/short.npy" --random-inputs 1
input_error ".npy longer than its shape (a pipe)" "holds more than 10240 data bytes" \
  "$TJ" run "$LB" -i "x="<(cat "$WORK/lb/x.npy" "$WORK/lb/x.npy") --random-inputs 1
ok ".npy from a pipe" "$TJ" run "$LB" -i "x="<(cat "$WORK/lb/x.npy") --random-inputs 1
truncate -s 17G "$H/sparse.npy"  # sparse: measured, never read
input_error ".npy file past the cap" "sparse.npy: is 18253611008 bytes, more than the 1 MiB header and 16 GiB of data a .npy file may have" \
  "$TJ" run "$LB" -i "x=$H/sparse.npy" --random-inputs 1
rm -f "$H/sparse.npy"
input_error ".npy from /dev/zero" "/dev/zero: not a .npy file" "$TJ" run "$LB" -i x=/dev/zero --random-inputs 1
input_error ".npy a directory" "$H: is a directory, not a file" "$TJ" run "$LB" -i "x=$H" --random-inputs 1
mkfifo "$H/fifo"
input_error ".npy a FIFO with no writer" "fifo: not a .npy file" "$TJ" run "$LB" -i "x=$H/fifo" --random-inputs 1
input_error "gen-npy past the cap" "gen-npy .*allowed: at most 16 GiB" \
  "$TJ" gen-npy "$H/g.npy" --dtype '<f4' --shape 65536,65536,65536
printf "\x93NUMPY\x01\x00\x20\x00{'descr': '<u\x002', 'shape': (\n    \n" >"$H/ctl.npy"
input_error ".npy header with NUL and newlines: one line" "ctl.npy: bad .npy header \(expected a dimension at offset 32\): \{'descr': '<u\\\\x002', 'shape': \(\\\\x0a" \
  "$TJ" run "$LB" -i "x=$H/ctl.npy" --random-inputs 1
input_error "a file name with a newline: one line" "a\\\\x0ab.npy: cannot open" "$TJ" run "$LB" -i "x=a
b.npy" --random-inputs 1
# Outputs: a FIFO nobody reads is an error, not a wait in open(2); a full disk a write error.
input_error "output to a FIFO with no reader" "fifo: cannot create: a FIFO with no reader" \
  "$TJ" run "$LB" --random-inputs 1 --dim M=2 -o "1=$H/fifo"
input_error "output to /dev/full" "/dev/full: write error" "$TJ" run "$LB" --random-inputs 1 --dim M=2 -o 1=/dev/full
# Under `ulimit -f` an output that would not fit is an error (it was SIGXFSZ,
# exit 153, and a truncated file), and nothing is left at its name.
input_error "output past RLIMIT_FSIZE" "y.npy: its 12128 bytes would pass the file size limit" \
  sh -c "ulimit -S -f 1; exec '$TJ' run '$LB' --random-inputs 1 --dim M=3 -o '1=$H/y.npy'"
ok "no partial output past RLIMIT_FSIZE" test ! -e "$H/y.npy"
input_error "inputs saved past RLIMIT_FSIZE" "bias.npy: its 2128 bytes would pass the file size limit" \
  sh -c "ulimit -S -f 1; exec '$TJ' run '$LB' --random-inputs 1 --dim M=3 --save-inputs '$H/si'"
ok "a written output leaves no temporary file" "$TJ" run "$LB" --random-inputs 1 --dim M=2 -o "1=$H/y2.npy"
ok "... only the output itself" test "$(ls "$H" | grep -c '^y2\.npy')" -eq 1
# The temporary of an output was "<out>.tmp.<pid>": a symlink planted at that
# name made the tool overwrite the link's target (and leave the link as the
# output). The shell that execs the tool knows its pid ($$), as an attacker
# watching the process list could. Now the temporary has a fresh random name
# and is created O_EXCL | O_NOFOLLOW.
echo precious >"$H/victim"
cp "$H/victim" "$H/victim_was"
mkdir -p "$H/si_link"
# shellcheck disable=SC2016 # expanded by the inner shell
plant_then_run='ln -s "$1" "$2.tmp.$$" || exit 99; shift 2; exec "$@"'
ok "-o with a symlink at the old temporary name" sh -c "$plant_then_run" sh "$H/victim" "$H/o.npy" \
  "$TJ" run "$LB" --random-inputs 1 --dim M=2 -o "1=$H/o.npy"
ok "... the symlink's target untouched" cmp "$H/victim_was" "$H/victim"
ok "... the output a regular file" test -f "$H/o.npy" -a ! -L "$H/o.npy"
ok "--save-inputs with a symlink at the old temporary name" sh -c "$plant_then_run" sh "$H/victim" \
  "$H/si_link/x.npy" "$TJ" run "$LB" --random-inputs 1 --dim M=2 --save-inputs "$H/si_link"
ok "... the symlink's target untouched" cmp "$H/victim_was" "$H/victim"
ok "... the input a regular file" test -f "$H/si_link/x.npy" -a ! -L "$H/si_link/x.npy"
# The directories --save-inputs makes are 0755 whatever the umask (under
# umask 0 they were world-writable); an existing one keeps its mode.
mkdir -p "$H/um" && chmod 711 "$H/um"
# shellcheck disable=SC2016
ok "--save-inputs under umask 0" sh -c 'umask 0; exec "$@"' sh \
  "$TJ" run "$LB" --random-inputs 1 --dim M=2 --save-inputs "$H/um/a/b"
ok "... the directories it made 0755" test "$(stat -c %a "$H/um/a" "$H/um/a/b" | sort -u)" = 755
ok "... the existing one as it was" test "$(stat -c %a "$H/um")" = 711
# bench's plan line names the kernel a quantized weight runs at that M: the
# one the library's verbose line names (it named the bf16 plan for an fp8
# weight running the fused kernel).
for m in 3 40; do
  ok "bench fp8 at M=$m" env TILEJIT_VERBOSE=1 "$TJ" bench "$EXAMPLES/gemm_fp8_channel.tir" --dim M=$m --seconds 0.05
  ran=$(grep -m1 '^tilejit: gemm w8a16' "$ERR" | grep -Eo '(kernel|plan)=[a-z0-9_]+' | cut -d= -f2)
  checks=$((checks + 1))
  [ -n "$ran" ] && grep -Eq "^  plan .*$ran" "$OUT" || fail "bench fp8 at M=$m: plan line does not name '$ran'"
done
usage "--save-inputs ''" "--save-inputs: '' is not a directory" "$TJ" run "$LB" --random-inputs 1 --dim M=2 --save-inputs ''
usage "--dim given twice" "--dim 'M=2': \?M is already given \(1\)" "$TJ" run "$LB" --random-inputs 1 --dim M=1 --dim M=2
# Standard output that cannot be written is an error of every subcommand
# (dump called it an internal error, exit 3; the others exited 0).
for sub in "dump $LB" "cpuinfo" "run $LB --random-inputs 1 --dim M=1 --check"; do
  input_error "$sub to a full stdout" "cannot write to standard output: No space left on device" \
    sh -c "exec '$TJ' $sub >/dev/full"
  input_error "$sub to a closed stdout" "cannot write to standard output: Bad file descriptor" \
    sh -c "exec '$TJ' $sub >&-"
done
ok "bench of an empty problem (M=0) ends" timeout 30 "$TJ" bench "$LB" --dim M=0 --seconds 0.05
# .tir files: at most 16 MiB.
input_error ".tir from /dev/zero" "/dev/zero: holds more than the 16 MiB a .tir program may have" "$TJ" dump /dev/zero
input_error ".tir on stdin from /dev/zero" "<stdin>: holds more than the 16 MiB" sh -c "exec '$TJ' dump - </dev/zero"
truncate -s 17M "$H/big.tir"
input_error ".tir past 16 MiB" "big.tir: is 17825792 bytes, more than the 16 MiB a .tir program may have" "$TJ" dump "$H/big.tir"
input_error ".tir a directory" "is a directory, not a file" "$TJ" dump "$H"
input_error ".tir a FIFO with no writer" "fifo:1:1: error: expected 'func', got end of input" "$TJ" dump "$H/fifo"
# NUL (or any control byte) in a string literal: refused where it stands, the message whole.
printf 'func @r(%%q: tensor<?Tx4x64xf32>, %%pos: tensor<?Txi32>, %%cs: tensor<?Px64xf32>) -> (tensor<?Tx4x64xf32>) {\n  %%o = rope %%q, %%pos, %%cs {style = "ne\x00ox"} : tensor<?Tx4x64xf32>\n  return %%o\n}\n' >"$H/nul.tir"
input_error "NUL in a string literal" "nul.tir:2:39: error: byte 0x00 in a string literal; allowed: printable characters$" \
  "$TJ" dump "$H/nul.tir" --stage ir
printf 'func @r(%%q: tensor<?Tx4x64xf32>, %%pos: tensor<?Txi32>, %%cs: tensor<?Px64xf32>) -> (tensor<?Tx4x64xf32>) {\n  %%o = rope %%q, %%pos, %%cs {style = "ne\x01ox"} : tensor<?Tx4x64xf32>\n  return %%o\n}\n' >"$H/ctl.tir"
input_error "control byte in a string literal" "ctl.tir:2:39: error: byte 0x01 in a string literal" "$TJ" dump "$H/ctl.tir"

# The disk cache under the tool: entries replaced by directories, /dev/zero
# links and FIFOs; every run completes and passes, a failed store is one
# TILEJIT_VERBOSE line and later stores still happen.
if [ "$active" != scalar ]; then
  KC=$H/kcache
  TILEJIT_CACHE_DIR=$KC ok "disk cache: fill" "$TJ" run "$LB" --random-inputs 1 --dim M=3
  n=0
  entries=("$KC"/*.tjk)
  for e in "${entries[@]}"; do
    case $((n % 3)) in
      0) rm -f "$e" && mkdir -p "$e/x" ;;
      1) rm -f "$e" && ln -s /dev/zero "$e" ;;
      2) rm -f "$e" && mkfifo "$e" ;;
    esac
    n=$((n + 1))
  done
  checks=$((checks + 1))
  [ $n -gt 0 ] || fail "disk cache: no entries to replace"
  TILEJIT_CACHE_DIR=$KC TILEJIT_VERBOSE=1 ok "disk cache: hostile entries" timeout 60 "$TJ" run "$LB" --random-inputs 1 --dim M=3 --check
  has "disk cache: hostile entries: PASS" "$OUT" "^PASS \\("
  has "disk cache: refused, not read" "$ERR" "^tilejit: disk cache: refused entry"
  has "disk cache: a directory makes one store fail" "$ERR" "^tilejit: disk cache: cannot publish: "
  if [ $n -gt 1 ]; then
    checks=$((checks + 1))
    [ -f "${entries[1]}" ] && [ ! -L "${entries[1]}" ] ||
      fail "disk cache: the store after a failed one did not happen (${entries[1]})"
  fi
  TILEJIT_CACHE_DIR=$KC ok "disk cache: run again" timeout 60 "$TJ" run "$LB" --random-inputs 1 --dim M=3 --check
  has "disk cache: run again: PASS" "$OUT" "^PASS \\("
fi

TILEJIT_CACHE_DIR=/dev/null ok "an unusable cache dir" "$TJ" run "$LB" --random-inputs 1 --dim M=2 --check
has "an unusable cache dir: PASS" "$OUT" "^PASS \\("
checks=$((checks + 1))
[ "$(grep -c "kernel cache directory '/dev/null' is not usable" "$ERR")" -eq 1 ] ||
  fail "an unusable cache dir: expected one warning, got: $(cat "$ERR")"

# Every bench program parses its arguments: --help exits 0, a bad argument 1 or 2, never a crash.
BENCH_DIR=$(dirname "$TJ")/../bench
for b in rope_bench gemm_bench attention_bench moe_bench jit_bench; do
  [ -x "$BENCH_DIR/$b" ] || continue
  ok "$b --help" timeout 30 "$BENCH_DIR/$b" --help
  for arg in --bogus abc 0 100000; do
    checks=$((checks + 1))
    timeout 30 "$BENCH_DIR/$b" "$arg" --benchmark_filter=NONE >"$OUT" 2>"$ERR"
    rc=$?
    { [ $rc -eq 1 ] || [ $rc -eq 2 ]; } || fail "$b $arg: exit $rc, expected 1 or 2 (a usage error)"
    grep -Eq "error" "$ERR" || fail "$b $arg: no error message"
  done
done

# ---- quantized weights: input and verifier errors -------------------------------
Q="$WORK/quant"
mkdir -p "$Q"
if [ -f "$EXAMPLES/gemm_int4_gptq.tir" ]; then
  "$TJ" run "$EXAMPLES/gemm_int4_gptq.tir" --random-inputs 3 --dim M=2 --save-inputs "$Q/in" >/dev/null 2>&1 ||
    fail "gemm_int4_gptq: --save-inputs"
  # The qweight of a gptq u4 [256, 512] weight is i32 [64, 256]: an [N, K]-shaped file is refused.
  "$TJ" gen-npy "$Q/qw_bad.npy" --dtype '<i4' --shape 256,512 || fail "gen-npy qw_bad"
  input_error "int4: qweight of the logical shape" \
    "input 'qweight' \\(.*qw_bad.npy\\) has shape \\[256, 512\\]; expected \\[64, 256\\] \\(the int32-packed checkpoint tensor of tensor<256x512xu4>\\)" \
    "$TJ" run "$EXAMPLES/gemm_int4_gptq.tir" -i x="$Q/in/x.npy" -i qweight="$Q/qw_bad.npy" \
    -i scales="$Q/in/scales.npy" -i qzeros="$Q/in/qzeros.npy" -i g_idx="$Q/in/g_idx.npy"
  "$TJ" gen-npy "$Q/qw_u1.npy" --dtype '|u1' --shape 64,256 || fail "gen-npy qw_u1"
  input_error "int4: qweight not int32" "input 'qweight' .* is a '\\|u1' array; .* needs '<i4'" \
    "$TJ" run "$EXAMPLES/gemm_int4_gptq.tir" -i x="$Q/in/x.npy" -i qweight="$Q/qw_u1.npy" \
    -i scales="$Q/in/scales.npy" -i qzeros="$Q/in/qzeros.npy" -i g_idx="$Q/in/g_idx.npy"
fi
# MXFP4: the weight is held as its code bytes [N, ceil(K/2)] ('|u1'), the
# scales as e8m0 bytes [N, ceil(K/32)].
if [ -f "$EXAMPLES/gemm_mxfp4.tir" ]; then
  "$TJ" run "$EXAMPLES/gemm_mxfp4.tir" --random-inputs 3 --dim M=2 --save-inputs "$Q/mx" >/dev/null 2>&1 ||
    fail "gemm_mxfp4: --save-inputs"
  "$TJ" gen-npy "$Q/mx_bad.npy" --dtype '|u1' --shape 200,330 || fail "gen-npy mx_bad"
  input_error "mxfp4: weight of the logical shape" \
    "input 'w' \\(.*mx_bad.npy\\) has shape \\[200, 330\\]; expected \\[200, 165\\] \\(the MXFP4 code bytes \\(two codes a byte\\) of tensor<200x330xf4e2m1>\\)" \
    "$TJ" run "$EXAMPLES/gemm_mxfp4.tir" -i x="$Q/mx/x.npy" -i w="$Q/mx_bad.npy" \
    -i w_scales="$Q/mx/w_scales.npy" -i bias="$Q/mx/bias.npy"
  "$TJ" gen-npy "$Q/mx_i4.npy" --dtype '<i4' --shape 200,165 || fail "gen-npy mx_i4"
  input_error "mxfp4: weight not bytes" "input 'w' .* is a '<i4' array; .* needs '\\|u1' \\(the MXFP4 code bytes\\)" \
    "$TJ" run "$EXAMPLES/gemm_mxfp4.tir" -i x="$Q/mx/x.npy" -i w="$Q/mx_i4.npy" \
    -i w_scales="$Q/mx/w_scales.npy" -i bias="$Q/mx/bias.npy"
fi
sed -e 's/%w_scales: tensor<200x11xu8>/%w_scales: tensor<200x10xu8>/' "$EXAMPLES/gemm_mxfp4.tir" >"$Q/mxs.tir"
input_error "mxfp4: scale shape" "mxs.tir: error: %0 = gemm: operand 'scale' \\(%w_scales\\) has shape \\[200, 10\\]; an f4e2m1 weight of N=200, K=330 takes scale as its e8m0 exponents, u8 \\[N, ceil\\(K/32\\)\\] = \\[200, 11\\]" \
  "$TJ" dump "$Q/mxs.tir" --stage verified
sed -e 's/scale = %w_scales/scale = %w_scales {group_size = 32}/' "$EXAMPLES/gemm_mxfp4.tir" >"$Q/mxg.tir"
input_error "mxfp4: an int4 attribute" "mxg.tir: error: %0 = gemm: attribute 'group_size' applies to u4 weights only; 'w' \\(%w\\) is f4e2m1" \
  "$TJ" dump "$Q/mxg.tir" --stage verified
# glu_rows: GPT-OSS's interleaved gate / up rows (moe_mxfp4.tir has them) on
# bf16 experts too, checked against the oracle on the rows put back in halves
# order; dump names the pack_experts argument; another value is refused.
sed -e 's/{activation = "silu", top_k = 2}/{activation = "silu", glu_rows = "interleaved", top_k = 2}/' \
  "$EXAMPLES/moe_silu.tir" >"$Q/il.tir"
for t in 1 9; do
  ok "moe glu_rows interleaved (bf16): run T=$t --check" "$TJ" run "$Q/il.tir" --random-inputs 4 --dim T=$t --check
  has "moe glu_rows interleaved (bf16): PASS (T=$t)" "$OUT" "^PASS \\("
done
ok "moe glu_rows interleaved: dump" "$TJ" dump "$Q/il.tir" --stage plan --dim T=2
has "moe glu_rows interleaved: dump names it" "$OUT" "gate_up, GluRows::interleaved\\)"
sed -e 's/glu_rows = "interleaved"/glu_rows = "alternate"/' "$Q/il.tir" >"$Q/il_bad.tir"
input_error "moe glu_rows outside the enum" "il_bad.tir: error: %o = moe: attribute 'glu_rows' = \"alternate\" must be one of \"halves\", \"interleaved\"" \
  "$TJ" dump "$Q/il_bad.tir" --stage verified
sed -e 's/group_size = 128/group_size = 0/' "$EXAMPLES/gemm_int4_gptq.tir" >"$Q/g0.tir"
input_error "int4: group_size 0" "g0.tir: error: %0 = gemm: attribute 'group_size' = 0; allowed: a group size >= 1 \\(32, 64, 128, ...\\) or -1" \
  "$TJ" dump "$Q/g0.tir" --stage plan
# int4_route: W4A8 on request (every path: LLVM kernels, or the scalar oracle),
# checked against its own bound and named by dump; a value outside the three is
# a verifier error.
sed -e 's/group_size = 128}/group_size = 128, int4_route = "w4a8"}/' "$EXAMPLES/gemm_int4_gptq.tir" >"$Q/w4a8.tir"
ok "int4: W4A8 run --check" "$TJ" run "$Q/w4a8.tir" --random-inputs 5 --dim M=19 --check
has "int4: W4A8 check passes" "$OUT" "^PASS"
has "int4: W4A8 check names its bound" "$OUT" "w4a8_activation_bound"
ok "int4: W4A8 dump" "$TJ" dump "$Q/w4a8.tir" --dim M=3 --stage plan
has "int4: dump names the W4A8 route" "$OUT" "^  w4a8 +M = 3: int4_route w4a8 takes W4A8"
sed -e 's/group_size = 128}/group_size = 128, int4_route = "w4a4"}/' "$EXAMPLES/gemm_int4_gptq.tir" >"$Q/w4a4.tir"
input_error "int4: int4_route outside the enum" "w4a4.tir: error: %0 = gemm: attribute 'int4_route' = \"w4a4\" must be one of \"automatic\", \"w4a16\", \"w4a8\"" \
  "$TJ" dump "$Q/w4a4.tir" --stage verified
sed -e 's/{block_k = 128, block_n = 128}/{block_k = 64, block_n = 128}/' "$EXAMPLES/gemm_fp8_block.tir" >"$Q/bk.tir"
input_error "fp8: block scale shape" "bk.tir: error: %0 = gemm: operand 'scale' \\(%w_scale\\) has shape \\[3, 3\\]; block scales of 128x64" \
  "$TJ" run "$Q/bk.tir" --random-inputs 1 --dim M=2 --check
sed -e 's/%w_scale: tensor<192xf32>/%w_scale: tensor<192xf32>, %z: tensor<1x192xu4>/' \
  -e 's/scale = %w_scale/scale = %w_scale, zero = %z/' "$EXAMPLES/gemm_fp8_channel.tir" >"$Q/z.tir"
input_error "fp8: a zero operand" "z.tir: error: %0 = gemm: operand 'zero' \\(%z\\): an f8e4m3 weight has no zero point" \
  "$TJ" dump "$Q/z.tir" --stage verified

# ---- TILEJIT_JIT_DUMP: each kernel's machine code, of either backend ----------
JD="$WORK/jit_dump"
mkdir -p "$JD"
TILEJIT_JIT_DUMP="$JD" TILEJIT_ISA=llvm ok "jit dump: an LLVM kernel" \
  "$TJ" run "$EXAMPLES/linear_silu.tir" --random-inputs 3 --dim M=5
checks=$((checks + 1))
llvm_bins=$(find "$JD" -name '*llvm*.bin' -size +0 | wc -l)
[ "$llvm_bins" -ge 1 ] || fail "jit dump: no non-empty LLVM kernel .bin in $JD ($(ls "$JD" | head -3))"
if grep -qw avx512bw /proc/cpuinfo; then
  TILEJIT_JIT_DUMP="$JD" TILEJIT_ISA=avx512 ok "jit dump: an Xbyak kernel" \
    "$TJ" run "$EXAMPLES/linear_silu.tir" --random-inputs 3 --dim M=5
  checks=$((checks + 1))
  [ "$(find "$JD" -name '*avx512*.bin' -size +0 | wc -l)" -ge 1 ] ||
    fail "jit dump: no non-empty Xbyak kernel .bin in $JD"
fi
# A symlink or FIFO at a dump's predictable name (an outside review): the
# dump was written through the link (a root server overwrote its target) or
# waited for ever in open(2) for a FIFO reader, inside the operator call. Now
# it is written under a fresh name and renamed over the planted one.
JH="$WORK/jit_dump_hostile"
mkdir -p "$JH"
echo precious >"$WORK/dump_victim"
cp "$WORK/dump_victim" "$WORK/victim_was"
for bin in $(find "$JD" -name '*llvm*.bin' | head -1); do
  name=$(basename "$bin")
  for planted in symlink fifo; do
    rm -f "${JH:?}/$name"
    if [ $planted = symlink ]; then ln -s "$WORK/dump_victim" "$JH/$name"; else mkfifo "$JH/$name"; fi
    TILEJIT_JIT_DUMP="$JH" TILEJIT_ISA=llvm ok "jit dump: a $planted at the name: no hang, --check passes" \
      timeout 30 "$TJ" run "$EXAMPLES/linear_silu.tir" --random-inputs 3 --dim M=5 --check
    ok "jit dump: a $planted at the name: the link's target untouched" \
      cmp "$WORK/victim_was" "$WORK/dump_victim"
    # shellcheck disable=SC2016 # (cmp would wait on a FIFO left in place)
    ok "jit dump: a $planted at the name: replaced by a regular file of the kernel's bytes" \
      sh -c 'test -f "$2" && test ! -L "$2" && cmp "$1" "$2"' sh "$bin" "$JH/$name"
    ok "jit dump: a $planted at the name: no temporary file left" test "$(ls "$JH" | wc -l)" -eq 1
  done
done

# ---- TILEJIT_PERF_MAP: perf's fixed name, /tmp/perf-<pid>.map ----------------
# The name cannot move, and /tmp is everyone's: a FIFO planted there made the
# first kernel wait for ever; a symlink was appended through. Now the map is
# opened O_NOFOLLOW | O_NONBLOCK and written only if it is a regular file of
# this user, else one warning and no map. The shell that execs the tool
# plants at its own pid ($$); the run must pass its --check either way.
cp "$WORK/victim_was" "$WORK/perf_victim"
# shellcheck disable=SC2016 # expanded by the inner shell
perf_plant_then_run='map=/tmp/perf-$$.map; echo "$map" >"$2"
  case $1 in fifo) mkfifo "$map" || exit 99 ;; symlink) ln -s "$3" "$map" || exit 99 ;;
    hardlink) ln "$3" "$map" || exit 99 ;; esac
  shift 3; TILEJIT_PERF_MAP=1 exec "$@"'
for planted in none fifo symlink hardlink; do
  ok "perf map, $planted at its name: no hang, --check passes" timeout 30 sh -c "$perf_plant_then_run" sh \
    $planted "$WORK/perf_path" "$WORK/perf_victim" \
    "$TJ" run "$EXAMPLES/linear_silu.tir" --random-inputs 3 --dim M=5 --check
  map=$(cat "$WORK/perf_path")
  warnings=$(grep -c TILEJIT_PERF_MAP "$ERR")
  case $planted in
    none) has "perf map: kernels named" "$map" '^[0-9a-f]+ [0-9a-f]+ [a-z0-9_]+$' ;;
    fifo) has "perf map: a FIFO refused" "$ERR" "^tilejit: warning: TILEJIT_PERF_MAP: not writing $map \(it is a FIFO with no reader\)$" ;;
    symlink)
      has "perf map: a symlink refused" "$ERR" "^tilejit: warning: TILEJIT_PERF_MAP: not writing $map \(it is a symlink\)$"
      ok "perf map: the symlink's target untouched" cmp "$WORK/victim_was" "$WORK/perf_victim"
      ;;
    hardlink)  # a hard link to a file of this user: the lines went into it
      has "perf map: a hard link refused" "$ERR" "^tilejit: warning: TILEJIT_PERF_MAP: not writing $map \(it has other hard links\)$"
      ok "perf map: the linked file untouched" cmp "$WORK/victim_was" "$WORK/perf_victim"
      ;;
  esac
  ok "perf map, $planted at its name: $([ $planted = none ] && echo no || echo one) warning" \
    test "$warnings" -eq "$([ $planted = none ] && echo 0 || echo 1)"
  rm -f "$map"
done

# ---- found from outside (2026-12-06): f16 and scalar results, M = 0 dumps ----
# An f16 result's summary read it as f32 (a heap over-read; garbage min/max);
# f16 inputs are generated and --check compares f16 values.
cat >"$WORK/f16.tir" <<'EOF'
func @f16(%x: tensor<?Mx64xbf16>, %w: tensor<48x64xbf16>, %h: tensor<?Mx48xf16>) -> (tensor<?Mx48xf16>) {
  %a = gemm %x, %w : tensor<?Mx48xf32>
  %g = cast %h {to = f32} : tensor<?Mx48xf32>
  %s = add %a, %g : tensor<?Mx48xf32>
  %c = cast %s {to = f16} : tensor<?Mx48xf16>
  return %c
}
EOF
ok "f16 result and input: run --check" "$TJ" run "$WORK/f16.tir" --random-inputs 4 --dim M=3 --check
has "f16: PASS" "$OUT" "^PASS \\("
checks=$((checks + 1))
read -r lo hi < <(sed -nE 's/^  %c \[3, 48\] f16: min (\S+) max (\S+) .*/\1 \2/p' "$OUT")
awk -v lo="$lo" -v hi="$hi" 'BEGIN { exit !(lo != "" && lo > -100 && hi < 100) }' ||
  fail "f16: the summary's min/max ($lo, $hi) are not the result's (|v| < 100)"
# A program of rank-0 values (scalars): it ran, then printing its M was exit 3.
cat >"$WORK/scalar.tir" <<'EOF'
func @s(%x: tensor<f32>, %y: tensor<f32>) -> (tensor<f32>) {
  %z = add %x, %y : tensor<f32>
  %r = relu %z : tensor<f32>
  return %r
}
EOF
ok "rank-0 program: run --check" "$TJ" run "$WORK/scalar.tir" --random-inputs 5 --check
has "rank-0 program: PASS" "$OUT" "^PASS \\(1 elements"
# M = 0: no kernel runs, so dump shows none (it asked the registry for mr = 0).
for ex in gemm_fp8_channel gemm_int4_gptq gemm_mxfp4; do
  ok "$ex: dump --stage asm --dim M=0" "$TJ" dump "$EXAMPLES/$ex.tir" --stage asm --dim M=0
done

check_summary tool_test
