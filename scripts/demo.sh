#!/bin/sh
# `make demo`: newt's main job on this host. The tiny GPT trains on the King James Bible
# (Debian's bible-kjv, tokenized once into build/kjv.tok) with 4 workers, a private etcd and
# two coordinators; at step 100 one worker is killed with kill -9, at step 200 a new one
# joins, at step 250 one is preempted (SIGTERM: it leaves gracefully, handing its state
# over); the run finishes and shows each recovery (where the time went, steps lost). The
# summary lands in build/demo-summary.json; the demo ends by writing the run's report
# (build/demo-logs/report.html: loss, membership, recoveries, throughput; `newt report`)
# and printing its path. `newt demo` shows the rendezvous alone.
set -eu
newt=${1:-build/newt}
dir=$(dirname "$newt")
corpus=$dir/kjv.tok
[ -s "$corpus" ] || scripts/demo-corpus.sh "$newt" "$corpus"
"$newt" run --nproc 4 --preset tiny --data "$corpus" --steps 300 --global-batch 24 --micro-batch 2 \
  --chaos kill:worker:1@step=100,join:1@step=200,term:worker:2@step=250 --summary "$dir/demo-summary.json" --log-dir "$dir/demo-logs"
"$newt" report "$dir/demo-logs" --out "$dir/demo-report.html" \
  --title "make demo: 4 workers, kill -9, a join, a preemption"
echo "the run's report: $dir/demo-report.html (open it in a browser)"
