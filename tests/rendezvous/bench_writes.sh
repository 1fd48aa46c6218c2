#!/bin/sh
# The etcd writes a rendezvous costs, counted by the client that sent them: `newt bench
# rendezvous` with 64 simulated workers doing what real ones do. In hosts of 8 under node
# agents each worker writes its registration and the update that acknowledges the generation,
# and each host one lease grant: 64 * 2 + 8 + the plan = 137 (2.125 per worker); workers
# started alone add a grant each: 64 * 3 + 1 = 193. Usage: bench_writes.sh path/to/newt
newt="$1"
pass=0
fail=0
check() { # per_host, the line's expected etcd_writes and writes_per_worker
  out=$("$newt" bench rendezvous --workers 64 --per-host "$1" 2>&1)
  if echo "$out" | grep -q "\"per_host\":$1,\"etcd_writes\":$2,\"writes_per_worker\":$3,"; then
    echo "ok     --per-host $1: $2 writes, $3 per worker"
    pass=$((pass + 1))
  else
    echo "FAIL   --per-host $1: expected $2 writes ($3 per worker), got:"
    echo "$out"
    fail=$((fail + 1))
  fi
}
check 8 137 2.125
check 1 193 3.000
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
