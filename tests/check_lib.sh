# The check harness of the shell tests (tool_test.sh, tune_tool_test.sh):
#   source "$(dirname "$0")/check_lib.sh"   after setting WORK (a scratch dir)
# Each check runs a command with its output in $OUT / $ERR; a failure prints
# the description and the head of both, and is counted; check_summary ends
# the script with the count (exit 0 only when nothing failed).
failures=0
checks=0
OUT=$WORK/out
ERR=$WORK/err

fail() {
  echo "FAIL: $*"
  echo "  --- stdout (head) ---"
  head -n 30 "$OUT" | sed 's/^/  /'
  echo "  --- stderr (head) ---"
  head -n 30 "$ERR" | sed 's/^/  /'
  failures=$((failures + 1))
}

check_summary() {  # check_summary <name>
  echo "$1: $checks checks, $failures failed"
  [ $failures -eq 0 ]
}
