#!/usr/bin/env bash
# The GPU check's PyTorch run (tests/gpu/run.sh calls it): examples/torch/train.py through
# the Python package on CUDA tensors, its collectives on NCCL on torch's current stream:
# two workers sharing the host's GPUs (--share-gpus), one killed at step 10, against the same
# script on one worker; and again with --ddp (torch's DistributedDataParallel over newt,
# newt.torch: each bucket's reduction on NCCL on torch's stream, from the hook); and
# examples/torch/ddp.py, the stock DDP script, in fp16 with a GradScaler, one sample's gradient
# made to overflow after the kill: every rank's scaler skips that step alike, and the run ends
# as the script does on one worker (the same loss, the same steps skipped -- the overflow's at
# least -- and the same scale).
#
#   tests/gpu/torch.sh NEWT OUT_DIR      (PYTHONPATH and NEWT_LIBRARY: the package and libnewt)
#
# Checks, from the runs' summaries: both done with every step and every sample, one crash
# recovered with no step lost, and the final losses within a relative TORCH_RTOL (default
# 1e-4: both run fp32 with TF32 off, torch's default, and differ only in the order of the
# gradient sums, which 60 steps amplify to about 1e-7; the fp16 pair TORCH_FP16_RTOL, 5e-3). The last line on stdout is one JSON
# object for the summary; exits non-zero when a check fails.
set -euo pipefail
NEWT=$1
OUT_DIR=$2
STEPS=${TORCH_STEPS:-60}
RTOL=${TORCH_RTOL:-1e-4}
RTOL16=${TORCH_FP16_RTOL:-5e-3} # fp16's forward: the sums' order counts more (bf16 on the CPU: 5e-3 too)
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
run() { # run TAG NPROC SCRIPT_AND_FLAGS [FLAGS...]: a newt run of the script, its summary in OUT_DIR/torch-TAG.json
  local tag=$1 n=$2 args=$3
  shift 3
  rm -f "$OUT_DIR/torch-$tag.json"
  # shellcheck disable=SC2086 # the script's flags, split
  "$NEWT" run --backend nccl --share-gpus --nproc "$n" --steps "$STEPS" --global-batch 16 --micro-batch 2 --quiet \
    --timeout-ms 120000 --log-dir "$OUT_DIR/torch-$tag.logs" --summary "$OUT_DIR/torch-$tag.json" "$@" \
    -- "$py" $args >"$OUT_DIR/torch-$tag.out" 2>&1 ||
    fail "$tag: newt run failed: $(tail -n 3 "$OUT_DIR/torch-$tag.out" | tr '\n' ' ') (logs: $OUT_DIR/torch-$tag.logs)"
}
run ref 1 "examples/torch/train.py"
run kill 2 "examples/torch/train.py" --chaos kill:worker:1@step=10
run kill_ddp 2 "examples/torch/train.py --ddp" --chaos kill:worker:1@step=10
FP16="examples/torch/ddp.py --autocast fp16 --overflow-sample $((12 * 16 + 3))" # a sample of step 12
run fp16_ref 1 "$FP16"
run fp16_kill 2 "$FP16" --chaos kill:worker:1@step=10
"$py" - "$OUT_DIR" "$STEPS" "$RTOL" "$RTOL16" <<'PY' || bad=1
import glob, json, re, sys
out_dir, steps, rtol, rtol16 = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
out, bad, s = {"ok": False}, [], {}
for tag in ("ref", "kill", "kill_ddp", "fp16_ref", "fp16_kill"):
    try:
        s[tag] = json.load(open(f"{out_dir}/torch-{tag}.json"))
    except Exception as e:  # a run that failed left no summary
        print(f"torch: FAILED: {tag}: no summary: {e}")
        print(json.dumps(out))
        sys.exit(1)

def rel(a, b):
    return abs(a - b) / abs(b) if a is not None and b else None

def scaler_of(tag):  # rank 0's last words: the steps its scaler skipped, its scale
    for p in sorted(glob.glob(f"{out_dir}/torch-{tag}.logs/*.log")):
        for line in open(p, errors="replace"):
            m = re.search(r"ddp.py: rank 0 done.*scaler skipped (\d+) steps, scale (\S+)", line)
            if m:
                return int(m.group(1)), float(m.group(2))
    return None

for tag, ref in (("ref", None), ("kill", "ref"), ("kill_ddp", "ref"), ("fp16_ref", None), ("fp16_kill", "fp16_ref")):
    r = s[tag]
    if not (r.get("done") and r.get("steps") == steps and r.get("samples_consumed") == steps * 16):
        bad.append(f"{tag}: done {r.get('done')}, {r.get('steps')} steps, {r.get('samples_consumed')} samples")
    if ref is None:
        continue
    recs = r.get("recoveries", [])
    if [x.get("cause") for x in recs] != ["crash"] or any(x.get("steps_lost") for x in recs):
        bad.append(f"{tag}: recoveries {recs}")
    tol = rtol16 if tag.startswith("fp16") else rtol
    d = rel(r.get("final_loss"), s[ref].get("final_loss"))
    if d is None or d > tol:
        bad.append(f"{tag}: final loss {r.get('final_loss')}, one worker's {s[ref].get('final_loss')} (relative {d}, "
                   f"at most {tol})")
sc = {tag: scaler_of(tag) for tag in ("fp16_ref", "fp16_kill")}
for tag, v in sc.items():
    if v is None or v[0] < 1:
        bad.append(f"{tag}: rank 0's scaler skipped {v and v[0]} steps, expected the overflow's at least (logs: "
                   f"{out_dir}/torch-{tag}.logs)")
if sc["fp16_ref"] and sc["fp16_kill"] and sc["fp16_ref"] != sc["fp16_kill"]:
    bad.append(f"fp16: after the kill the scaler skipped {sc['fp16_kill'][0]} steps and its scale is "
               f"{sc['fp16_kill'][1]}; on one worker {sc['fp16_ref'][0]} and {sc['fp16_ref'][1]}")
for m in bad:
    print("torch: FAILED:", m)
ref, run, ddp, fp16 = s["ref"], s["kill"], s["kill_ddp"], s["fp16_kill"]
b = ref.get("final_loss")

def rel_of(r):
    return rel(r.get("final_loss"), b)

def rec_ms(s):
    recs = s.get("recoveries", [])
    return recs[0].get("total_ms") if recs else None
out = {"ok": not bad, "final_loss": run.get("final_loss"), "reference_loss": b, "relative": rel_of(run),
       "recovery_ms": rec_ms(run), "wall_s": run.get("wall_s"), "ddp_final_loss": ddp.get("final_loss"),
       "ddp_relative": rel_of(ddp), "ddp_recovery_ms": rec_ms(ddp), "ddp_wall_s": ddp.get("wall_s"),
       "fp16_final_loss": fp16.get("final_loss"), "fp16_relative": rel(fp16.get("final_loss"),
       s["fp16_ref"].get("final_loss")), "fp16_scaler": sc["fp16_kill"]}
print(json.dumps(out))
sys.exit(1 if bad else 0)
PY
exit $bad
