#!/bin/sh
# The docs' commands, run as written: a new user's way from install to a running program.
#
# Each block of README.md, docs/api.md and docs/python.md that follows the marker line
# "<!-- tests/api/docs.sh runs the next block as written ... -->" is copied out of the page
# and run by sh -e, in a directory of its own, with two changes only: the docs' prefix
# /opt/newt is this test's (a directory under its work directory), and `make` is the source
# tree's Makefile with this build (BUILD). The program `mytrain.c` is docs/api.md's example,
# copied from the page. No LD_LIBRARY_PATH and no PYTHONPATH come from outside.
#
#   README.md     make install, a program built with pkg-config, `newt run` with a kill: the
#                 job ends done, the kill recovered
#   docs/api.md   the same through an exported PKG_CONFIG_PATH, the static link too
#   docs/python.md  make install, the PYTHONPATH line, `import newt`: it loads the prefix's
#                 libnewt
#
# usage: docs.sh BUILD_DIR (ctest passes it; NEWT_SOURCE_DIR is the source tree). Prints a line
# per check and "N passed, N failed"; exits 1 on any failure, keeping its files (also kept with
# NEWT_KEEP_LOGS=1).
set -u
build=$(cd "${1:?usage: docs.sh BUILD_DIR}" && pwd)
src=${NEWT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
t0=$(date +%s)
work=$(mktemp -d /tmp/newt-docs-XXXXXX)
prefix=$work/opt/newt
. "$src/tests/check.sh" # ok, fail, check
finish() {
  echo "docs.sh: $(($(date +%s) - t0)) s"
  if [ "$failed" -eq 0 ] && [ -z "${NEWT_KEEP_LOGS:-}" ]; then rm -rf "$work"; else echo "files in $work"; fi
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
  exit $?
}

# block PAGE N: the Nth marked block of PAGE (its indented lines, unindented), on stdout
block() {
  awk -v want="$2" '
    /^<!-- tests\/api\/docs.sh runs the next block/ { n++; if (n == want) on = 1; next }
    on == 1 && /^$/ { if (got) exit; next }
    on == 1 && /^    / { got = 1; print substr($0, 5); next }
    on == 1 { exit }' "$src/$1"
}

# the example of docs/api.md, as the page holds it
awk '/^<!-- examples\/linreg\/linreg.c -->$/ { on = 1; next }
     on == 1 && /^```c$/ { on = 2; next }
     on == 2 && /^```$/ { exit }
     on == 2 { print }' "$src/docs/api.md" >"$work/mytrain.c"
if [ -s "$work/mytrain.c" ]; then ok example_copied; else fail example_copied "docs/api.md holds no example"; finish; fi

# run NAME PAGE N: the block in $work/NAME, its output in $work/NAME.out
run() {
  name=$1
  text=$(block "$2" "$3")
  if [ -z "$text" ]; then
    fail "$name" "$2 has no block after its marker number $3"
    return 1
  fi
  mkdir -p "$work/$name" && cp "$work/mytrain.c" "$work/$name/"
  {
    echo "set -ex"
    echo "make() { command make -C '$src' BUILD='$build' \"\$@\"; }"
    echo "cd '$work/$name'"
    printf '%s\n' "$text" | sed "s|/opt/newt|$prefix|g"
  } >"$work/$name.sh"
  (env -u LD_LIBRARY_PATH -u PYTHONPATH -u PKG_CONFIG_PATH -u NEWT_LIBRARY -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
    PATH="/usr/bin:/bin:$PATH" sh "$work/$name.sh") >"$work/$name.out" 2>&1
}

# --- README.md --------------------------------------------------------------------------------
if run readme README.md 1; then ok readme_runs; else fail readme_runs "$(tail -20 "$work/readme.out")"; fi
if grep -q '^newt run: done: 1000 steps' "$work/readme.out" && grep -q 'recovered' "$work/readme.out"; then
  ok readme_done
else
  fail readme_done "newt run did not end done after a recovery: $(tail -20 "$work/readme.out")"
fi

# --- docs/api.md ------------------------------------------------------------------------------
if run api docs/api.md 1; then ok api_runs; else fail api_runs "$(tail -20 "$work/api.out")"; fi
if grep -q '^newt run: done: 1000 steps' "$work/api.out"; then ok api_done; else
  fail api_done "newt run did not end done: $(tail -20 "$work/api.out")"
fi
if [ -x "$work/api/mytrain" ] && ! readelf -d "$work/api/mytrain" | grep NEEDED | grep -q libnewt; then
  ok api_static_linked
else
  fail api_static_linked "the last mytrain of docs/api.md is not linked with libnewt.a"
fi

# --- docs/python.md ---------------------------------------------------------------------------
if run python docs/python.md 1; then ok python_runs; else fail python_runs "$(tail -20 "$work/python.out")"; fi
# shellcheck disable=SC3013 # dash's test knows -ef
if [ "$(tail -1 "$work/python.out")" -ef "$prefix/lib/libnewt.so.0" ]; then ok python_loads_prefix_lib; else
  fail python_loads_prefix_lib "import newt printed $(tail -1 "$work/python.out"), not $prefix/lib/libnewt.so.0"
fi
finish
