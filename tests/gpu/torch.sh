#!/usr/bin/env bash
# The GPU check's PyTorch run (tests/gpu/run.sh calls it): examples/torch/train.py through
# the Python package on CUDA tensors, its collectives on NCCL on torch's current stream:
# two workers sharing the host's GPUs (--share-gpus), one killed at step 10, against the same
# script on one worker; and again with --ddp (torch's DistributedDataParallel over newt,
# newt.torch: each bucket's reduction on NCCL on torch's stream, from the hook).
#
#   tests/gpu/torch.sh NEWT OUT_DIR      (PYTHONPATH and NEWT_LIBRARY: the package and libnewt)
#
# Checks, from the runs' summaries: both done with every step and every sample, one crash
# recovered with no step lost, and the final losses within a relative TORCH_RTOL (default
# 1e-4: both run fp32 with TF32 off, torch's default, and differ only in the order of the
# gradient sums, which 60 steps amplify to about 1e-7). The last line on stdout is one JSON
# object for the summary; exits non-zero when a check fails.
set -euo pipefail
NEWT=$1
OUT_DIR=$2
STEPS=${TORCH_STEPS:-60}
RTOL=${TORCH_RTOL:-1e-4}
py=""
for p in python3 /opt/torch/.venv/bin/python3; do
  if command -v "$p" >/dev/null 2>&1 && "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
  then py=$(command -v "$p"); break; fi
done
bad=0
fail() { echo "torch: FAILED: $*"; bad=1; }
[ -n "$py" ] || { fail "no Python with torch that sees a GPU (python3, /opt/torch/.venv/bin/python3)"; echo '{"ok":false}'; exit 1; }
"$py" -c 'import newt; print("torch: newt package", newt.__file__, "on", newt.library_path)' ||
  { fail "import newt failed (PYTHONPATH=${PYTHONPATH:-}, NEWT_LIBRARY=${NEWT_LIBRARY:-})"; echo '{"ok":false}'; exit 1; }
run() { # run TAG NPROC SCRIPT_FLAGS [FLAGS...]: a newt run of the example, its summary in OUT_DIR/torch-TAG.json
  local tag=$1 n=$2 args=$3
  shift 3
  rm -f "$OUT_DIR/torch-$tag.json"
  # shellcheck disable=SC2086 # the script's flags, split
  "$NEWT" run --backend nccl --share-gpus --nproc "$n" --steps "$STEPS" --global-batch 16 --micro-batch 2 --quiet \
    --timeout-ms 120000 --log-dir "$OUT_DIR/torch-$tag.logs" --summary "$OUT_DIR/torch-$tag.json" "$@" \
    -- "$py" examples/torch/train.py $args >"$OUT_DIR/torch-$tag.out" 2>&1 ||
    fail "$tag: newt run failed: $(tail -n 3 "$OUT_DIR/torch-$tag.out" | tr '\n' ' ') (logs: $OUT_DIR/torch-$tag.logs)"
}
run ref 1 ""
run kill 2 "" --chaos kill:worker:1@step=10
run kill_ddp 2 "--ddp" --chaos kill:worker:1@step=10
"$py" - "$OUT_DIR/torch-ref.json" "$OUT_DIR/torch-kill.json" "$OUT_DIR/torch-kill_ddp.json" "$STEPS" "$RTOL" <<'PY' || bad=1
import json, sys
ref_p, run_p, ddp_p, steps, rtol = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
out, bad = {"ok": False}, []
try:
    ref, run, ddp = json.load(open(ref_p)), json.load(open(run_p)), json.load(open(ddp_p))
except Exception as e:  # a run that failed left no summary
    print(f"torch: FAILED: no summary: {e}")
    print(json.dumps(out))
    sys.exit(1)
b = ref.get("final_loss")
for name, s in (("ref", ref), ("kill", run), ("kill_ddp", ddp)):
    if not (s.get("done") and s.get("steps") == steps and s.get("samples_consumed") == steps * 16):
        bad.append(f"{name}: done {s.get('done')}, {s.get('steps')} steps, {s.get('samples_consumed')} samples")
    if name == "ref":
        continue
    recs = s.get("recoveries", [])
    if [r.get("cause") for r in recs] != ["crash"] or any(r.get("steps_lost") for r in recs):
        bad.append(f"{name}: recoveries {recs}")
    a = s.get("final_loss")
    rel = abs(a - b) / abs(b) if a is not None and b else None
    if rel is None or rel > rtol:
        bad.append(f"{name}: final loss {a}, one worker's {b} (relative {rel}, at most {rtol})")
for m in bad:
    print("torch: FAILED:", m)

def rel_of(s):
    a = s.get("final_loss")
    return abs(a - b) / abs(b) if a is not None and b else None

def rec_ms(s):
    recs = s.get("recoveries", [])
    return recs[0].get("total_ms") if recs else None
out = {"ok": not bad, "final_loss": run.get("final_loss"), "reference_loss": b, "relative": rel_of(run),
       "recovery_ms": rec_ms(run), "wall_s": run.get("wall_s"), "ddp_final_loss": ddp.get("final_loss"),
       "ddp_relative": rel_of(ddp), "ddp_recovery_ms": rec_ms(ddp), "ddp_wall_s": ddp.get("wall_s")}
print(json.dumps(out))
sys.exit(1 if bad else 0)
PY
exit $bad
