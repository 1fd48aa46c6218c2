# What the shell tests share (sourced, POSIX sh): each check said on a line of its own and
# counted, into $passed and $failed, for the script's "N passed, M failed" at its end.
#   ok NAME             a check that held
#   fail NAME WHY       one that did not, and why
#   check NAME WHY CMD  CMD must succeed
passed=0
failed=0
ok() { echo "ok     $1"; passed=$((passed + 1)); }
fail() { echo "FAILED $1: $2"; failed=$((failed + 1)); }
check() {
  name=$1 why=$2
  shift 2
  if "$@"; then ok "$name"; else fail "$name" "$why"; fi
}
