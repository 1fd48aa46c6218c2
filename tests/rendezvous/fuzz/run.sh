#!/bin/sh
# Builds the rendezvous libFuzzer targets with clang (the main build may use gcc) and runs
# each for a few seconds from its committed seed corpus. clang with libFuzzer
# (Debian: clang, libclang-rt-14-dev) is a test dependency: without it this fails loudly.
#   run.sh SOURCE_DIR WORK_DIR SECONDS
set -eu
src=$1 work=$2 secs=${3:-15}
cc=""
for c in clang clang-14 clang-15 clang-16; do
  if command -v "$c" >/dev/null 2>&1; then cc=$c; break; fi
done
if [ -z "$cc" ]; then
  echo "FAIL: clang is not installed; the fuzz tests need it: apt-get install clang libclang-rt-14-dev (scripts/install-deps.sh test)" >&2
  exit 1
fi
mkdir -p "$work"
cflags="-std=c11 -D_GNU_SOURCE -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$src -I$src/include"
common="$src/common/strutil.c $src/common/json.c $src/common/err.c $src/common/log.c $src/common/clock.c $src/common/param.c"
cjson=$(pkg-config --cflags --libs libcjson 2>/dev/null || echo -lcjson)
status=0
for t in fuzz_watch_stream fuzz_responses; do
  seeds=$src/tests/rendezvous/fuzz/corpus/${t#fuzz_}
  # shellcheck disable=SC2086
  if ! $cc $cflags -o "$work/$t" "$src/tests/rendezvous/fuzz/$t.c" "$src/rendezvous/etcd_parse.c" $common $cjson -lpthread -lm 2>"$work/$t.build.log"; then
    echo "FAIL: building $t with $cc (is libclang-rt-14-dev installed?):" >&2
    cat "$work/$t.build.log" >&2
    exit 1
  fi
  rm -rf "$work/$t.corpus" && mkdir -p "$work/$t.corpus"
  echo "running $t for $secs s from $(ls "$seeds" | wc -l) seeds"
  if ! "$work/$t" -max_total_time="$secs" -rss_limit_mb=2048 -max_len=8192 -print_final_stats=1 \
      -artifact_prefix="$work/$t-" "$work/$t.corpus" "$seeds" >"$work/$t.log" 2>&1; then
    echo "FAIL: $t found a crash (artifact in $work; log $work/$t.log):" >&2
    tail -40 "$work/$t.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_runs|Done" "$work/$t.log" | tail -2
  fi
done
[ $status -eq 0 ] && echo "2 passed, 0 failed" || echo "fuzz: failures above"
exit $status
