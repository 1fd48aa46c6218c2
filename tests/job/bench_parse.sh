#!/bin/sh
# bench_parse (issue 37, item 11): `newt bench parse` small -- a plan of 3,000 ranks, 3,000
# events in key and reverse order, manifests of 1 MiB of each shape -- each read back and
# checked by the command (exit 1 on a wrong count); here every case must have printed its
# line. Correctness only: the times are the benchmark's to report (newt bench parse).
set -eu
newt=${1:?usage: bench_parse.sh NEWT}
out=$("$newt" bench parse --ranks 3000 --events 3000 --manifest-mb 1 --repeat 1)
echo "$out"
for want in '"shape":"tensors"' '"shape":"chunks"' '"shape":"boxes8"' '"what":"plan","ranks":3000' \
            '"events":3000,"order":"key"' '"events":3000,"order":"reverse"'; do
  echo "$out" | grep -qF "$want" || { echo "FAIL: no line with $want"; exit 1; }
done
echo "1 passed, 0 failed"
