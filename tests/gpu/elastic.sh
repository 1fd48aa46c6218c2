#!/usr/bin/env bash
# The GPU check's elastic run (tests/gpu/run.sh calls it): `newt run --backend nccl` with
# three workers, one killed at step 10 and one joining at step 20, on this host's GPUs
# (--share-gpus: on a machine of one GPU the three share it, each its own host to the
# coordinator and to NCCL, over NCCL's socket transport; docs/elastic.md, "GPU workers on one host").
#
#   tests/gpu/elastic.sh NEWT OUT_DIR
#
# Checks, from the run's summary: the job is done with every step, consumed steps x
# global batch samples, and recorded a crash and a join, each with no step lost; and its
# final loss against `newt train` of the same flags on the CPU (fp32, no faults), within
# a relative LOSS_RTOL (default 2e-2). Why 2e-2: the GPU's GEMMs round their inputs to
# bf16 (8 significant bits, about 4e-3 of a typical output: docs/model.md, "Devices"), so
# the two runs drift apart by rounding over the steps, while the loss falls from about 5.6
# to about 2 (a lost or doubled batch, or a state from the wrong step after a recovery,
# shows in the samples and steps_lost checks, and a broken step in the loss). The last line
# on stdout is one JSON object for the summary; exits non-zero when a check fails.
set -euo pipefail
NEWT=$1
OUT_DIR=$2
STEPS=${ELASTIC_STEPS:-1000} # enough for a joiner's start (CUDA, NCCL) to land before the end
RTOL=${LOSS_RTOL:-2e-2}
FLAGS=(--model "layers=2,channels=64" --seq-len 32 --steps "$STEPS")
summary=$OUT_DIR/elastic-summary.json
rm -f "$summary"

run_out=$OUT_DIR/elastic-run.out
"$NEWT" run --backend nccl --share-gpus --nproc 3 "${FLAGS[@]}" --global-batch 24 --micro-batch 2 \
  --chaos kill:worker:1@step=10,join:1@step=20 --quiet --timeout-ms 120000 --summary "$summary" >"$run_out" 2>&1 ||
  echo "elastic: FAILED: newt run failed: $(tail -n 2 "$run_out" | tr '\n' ' ')(its summary, if any, is checked below)"
ref=
if [ -f "$summary" ]; then # the reference only for a run to compare with
  ref=$("$NEWT" train "${FLAGS[@]}" --batch 24 --micro-batch 2 --threads 1 | grep '^{' | tail -n 1) || ref=
  echo "elastic: CPU reference: $ref"
fi

num() { # num KEY FILE: the first "KEY": number in the pretty-printed JSON FILE
  sed -n "s/^[[:space:]]*\"$1\":[[:space:]]*\\([-0-9.eE+]*\\),*\$/\\1/p" "$2" | head -n 1
}
bad=0
fail() { echo "elastic: FAILED: $*"; bad=1; }
done_=false steps="" loss="" samples="" causes="" lost=""
if [ -f "$summary" ]; then
  grep -q '"done":[[:space:]]*true' "$summary" && done_=true
  steps=$(num steps "$summary")
  loss=$(num final_loss "$summary")
  samples=$(num samples_consumed "$summary")
  causes=$(grep -o '"cause":[[:space:]]*"[a-z]*"' "$summary" | sed 's/.*"\([a-z]*\)"$/\1/' | tr '\n' ' ' || true)
  lost=$(grep -o '"steps_lost":[[:space:]]*-*[0-9]*' "$summary" | sed 's/.*[[:space:]:]//' | tr '\n' ' ' || true)
  causes=${causes% } lost=${lost% }
else
  fail "no summary at $summary"
fi
ref_loss=$(printf '%s' "$ref" | sed -n 's/.*"final_loss":\([-0-9.eE+]*\).*/\1/p')
[ "$done_" = true ] || fail "the job is not done"
[ "$steps" = "$STEPS" ] || fail "steps $steps, expected $STEPS"
[ "$samples" = "$((STEPS * 24))" ] || fail "samples_consumed $samples, expected $((STEPS * 24))"
case " $causes " in *" crash "*) ;; *) fail "no crash recovery (recoveries: $causes)" ;; esac
case " $causes " in *" join "*) ;; *) fail "no join recovery (recoveries: $causes; a larger ELASTIC_STEPS gives the joiner time)" ;; esac
for l in $lost; do [ "$l" = 0 ] || fail "a recovery lost $l steps (steps_lost: $lost)"; done
if [ -n "$loss" ] && [ -n "$ref_loss" ]; then
  awk -v a="$loss" -v b="$ref_loss" -v t="$RTOL" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= t * b) }' ||
    fail "final loss $loss, the CPU's $ref_loss: beyond relative $RTOL"
else
  fail "no final loss (run: '$loss', reference: '$ref_loss')"
fi
[ "$bad" -eq 0 ] && echo "elastic: passed: $steps steps, recoveries: $causes, final loss $loss (CPU $ref_loss)"
printf '{"done":%s,"steps":%s,"final_loss":%s,"cpu_final_loss":%s,"rtol":%s,"recoveries":"%s","steps_lost":"%s","ok":%s}\n' \
  "$done_" "${steps:-null}" "${loss:-null}" "${ref_loss:-null}" "$RTOL" "$causes" "$lost" \
  "$([ "$bad" -eq 0 ] && echo true || echo false)"
exit "$bad"
