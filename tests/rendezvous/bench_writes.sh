#!/bin/sh
# The etcd writes a rendezvous costs, counted by the client that sent them: `newt bench
# rendezvous` with 64 simulated workers doing what real ones do.
#  - In hosts of 8 under node agents whose gateways gather their workers' writes (--batch 1,
#    the default): each host's 8 registrations go as one transaction, its 8 acknowledgements
#    as another, plus its lease grant: 8 * 3 = 24 writes, 0.375 per worker, and the plan: 25.
#    The linger is far longer than the run, so each host's first write waits for all 8 (every
#    worker has a thread of its own: --threads 64): the count cannot depend on timing.
#  - Each writing alone (--batch 0, the previous release): its registration and the update
#    that acknowledges the generation, and each host one lease grant: 64 * 2 + 8 + the plan =
#    137 (2.125 per worker).
#  - Workers started alone add a grant each: 64 * 3 + 1 = 193.
# Usage: bench_writes.sh path/to/newt
newt="$1"
pass=0
fail=0
check() { # per_host, batch, the line's expected etcd_writes and writes_per_worker
  out=$("$newt" bench rendezvous --workers 64 --threads 64 --linger-ms 60000 --per-host "$1" --batch "$2" 2>&1)
  batched=$2
  [ "$1" -eq 1 ] && batched=0
  if echo "$out" | grep -q "\"per_host\":$1,\"batch\":$batched,\"etcd_writes\":$3,\"writes_per_worker\":$4,"; then
    echo "ok     --per-host $1 --batch $2: $3 writes, $4 per worker"
    pass=$((pass + 1))
  else
    echo "FAIL   --per-host $1 --batch $2: expected $3 writes ($4 per worker), got:"
    echo "$out"
    fail=$((fail + 1))
  fi
}
check 8 1 25 0.375
check 8 0 137 2.125
check 1 1 193 3.000
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
