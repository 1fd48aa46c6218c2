#!/usr/bin/env bash
# The GPU check's layouts (tests/gpu/run.sh calls it): the parallel trainer's layouts that fit
# on this host's GPUs, each a `newt run --backend nccl --share-gpus` of one process per rank
# (no faults), against the single process on one GPU, `newt train --device cuda` of the same
# values (docs/model.md, "Devices": both are the one trainer, a layout of one rank there).
#
#   tests/gpu/layouts.sh NEWT OUT_DIR
#
# Layouts (LAYOUTS, names from: dp2z1 tp2 pp2 tp2pp2 tp2dp2z2 tp2dp2z3 tp2pp2dp2z3; all
# but tp2dp2z3 by default): dp 2 with ZeRO 1, tp 2, pp 2, tp 2 x pp 2, tp 2 x dp 2 with ZeRO
# 2 (or 3), and tp 2 x pp 2 x dp 2 with ZeRO 3 (eight processes). --share-gpus lets the ranks
# share a GPU, each its own host to NCCL (docs/elastic.md, "GPU workers on one host").
#
# Checkpoints crossing devices and layouts: the last layout named saves every STEPS/2 steps;
# with its last checkpoint removed, `newt train` on the CPU resumes from its middle one;
# and a `newt train` on the CPU saves the same way, which a GPU layout (tp 2 x dp 2, ZeRO 2)
# resumes. Each resumed run must say it resumed at STEPS/2 and end within LOSS_RTOL of the
# uninterrupted CPU run's last loss.
#
# Checks, from each run's summary and step log: the job is done with every step and
# steps x global batch samples; its loss at step 1 within a relative FIRST_RTOL (default
# 5e-3) of the single process's, and at the last step within LOSS_RTOL (default 2e-2). Why
# these: the GPU's GEMMs round their inputs to bf16 (docs/model.md, "Devices"), and a layout
# changes the GEMMs' shapes (tensor parallelism) and the order partial sums are added in
# (the all-reduces), so the runs agree only to rounding: at step 1 (the initial weights, no
# update yet) to about 1e-3, and they drift apart over the steps while the loss falls from
# about 5.6 to about 2.5; a wrong layout (a missing shard, a doubled batch, an unreduced
# gradient) is off by far more. The last line on stdout is one JSON object for the summary;
# exits non-zero when a check fails.
#
# Runs against the test double too (a newt built with NEWT_GPU_DOUBLE, and
# NEWT_NCCL_DOUBLE_DEVICES=1): there the losses agree to fp32 rounding.
set -euo pipefail
NEWT=$1
OUT_DIR=$2
STEPS=${LAYOUT_STEPS:-100}
LAYOUTS=${LAYOUTS:-dp2z1 tp2 pp2 tp2pp2 tp2dp2z2 tp2pp2dp2z3}
FIRST_RTOL=${FIRST_RTOL:-5e-3}
RTOL=${LOSS_RTOL:-2e-2}
GB=24
FLAGS=(--model "layers=2,channels=64" --seq-len 32 --steps "$STEPS" --micro-batch 2)
work=$OUT_DIR/layouts
rm -rf "$work"
mkdir -p "$work"

# loss_at STEP FILE: the loss of step STEP in a step log (job/runlog.h: one JSON line a step)
loss_at() {
  { grep "\"step\":$1[,}]" "$2" 2>/dev/null || true; } | tail -n 1 | sed -n 's/.*"loss":\([-0-9.eE+]*\).*/\1/p'
}
# within A B RTOL: |A - B| <= RTOL * |B|
within() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; if (b < 0) b = -b; exit !(d <= t * b) }'; }
# near NAME WHAT VALUE REF_NAME REF RTOL: VALUE within RTOL of REF, else a line saying why (status 1)
near() {
  if [ -z "$3" ] || [ -z "$5" ]; then
    echo "layouts: $1: no $2 (got '$3', $4 '$5')"
    return 1
  fi
  within "$3" "$5" "$6" || { echo "layouts: $1: $2 $3, $4 $5: beyond relative $6"; return 1; }
}

bad=0
fail() { echo "layouts: FAILED: $*"; bad=1; }

HALF=$((STEPS / 2))
ref_log=$work/single.jsonl
"$NEWT" train --device cuda "${FLAGS[@]}" --batch "$GB" --log "$ref_log" >"$work/single.out" 2>&1 ||
  fail "newt train --device cuda failed: $(tail -n 3 "$work/single.out" | tr '\n' ' ')"
cpu_log=$work/cpu.jsonl
"$NEWT" train --device cpu --threads 0 "${FLAGS[@]}" --batch "$GB" --log "$cpu_log" --ckpt-dir "$work/ck-cpu" \
  --ckpt-every "$HALF" >"$work/cpu.out" 2>&1 || fail "newt train --device cpu failed: $(tail -n 3 "$work/cpu.out" | tr '\n' ' ')"
cpu_last=$(loss_at "$STEPS" "$cpu_log")
ref_first=$(loss_at 1 "$ref_log")
ref_last=$(loss_at "$STEPS" "$ref_log")
echo "layouts: single process on $(sed -n 's/.*x T [0-9]*, \(.*\), data .*/\1/p' "$work/single.out" | head -n 1):" \
  "loss ${ref_first:-?} at step 1, ${ref_last:-?} at step $STEPS"
if [ -z "$ref_first" ] || [ -z "$ref_last" ]; then fail "no reference losses in $ref_log"; fi

layouts_json=""
run_layout() { # NAME NPROC FLAGS...
  local name=$1 nproc=$2
  shift 2
  local dir=$work/$name ok=true done_=false steps="" samples="" first="" last="" t0 t
  t0=$(date +%s)
  "$NEWT" run --backend nccl --share-gpus --nproc "$nproc" "$@" "${FLAGS[@]}" --global-batch "$GB" --quiet \
    --timeout-ms 150000 --log-dir "$dir" --summary "$dir.json" >"$dir.out" 2>&1 ||
    { echo "layouts: $name: newt run failed: $(tail -n 3 "$dir.out" | tr '\n' ' ')"; ok=false; }
  t=$(($(date +%s) - t0))
  if [ -f "$dir.json" ]; then
    grep -q '"done":[[:space:]]*true' "$dir.json" && done_=true
    steps=$(sed -n 's/^[[:space:]]*"steps":[[:space:]]*\([0-9]*\),*$/\1/p' "$dir.json" | head -n 1)
    samples=$(sed -n 's/^[[:space:]]*"samples_consumed":[[:space:]]*\([0-9]*\),*$/\1/p' "$dir.json" | head -n 1)
  fi
  first=$(loss_at 1 "$dir/steps.jsonl")
  last=$(loss_at "$STEPS" "$dir/steps.jsonl")
  [ "$done_" = true ] || { echo "layouts: $name: the job is not done"; ok=false; }
  [ "$steps" = "$STEPS" ] || { echo "layouts: $name: steps ${steps:-?}, expected $STEPS"; ok=false; }
  [ "$samples" = "$((STEPS * GB))" ] || { echo "layouts: $name: samples ${samples:-?}, expected $((STEPS * GB))"; ok=false; }
  near "$name" "loss at step 1" "$first" "the single process's" "$ref_first" "$FIRST_RTOL" || ok=false
  near "$name" "loss at step $STEPS" "$last" "the single process's" "$ref_last" "$RTOL" || ok=false
  [ "$ok" = true ] || bad=1
  echo "layouts: $name ($nproc processes, ${t}s): $([ "$ok" = true ] && echo passed || echo FAILED)," \
    "loss ${first:-?} at step 1, ${last:-?} at step $STEPS"
  layouts_json="$layouts_json${layouts_json:+,}{\"layout\":\"$name\",\"processes\":$nproc,\"seconds\":$t,\"first_loss\":${first:-null},\"final_loss\":${last:-null},\"ok\":$ok}"
}

# layout NAME: its processes and flags
layout_args() {
  case "$1" in
    dp2z1) echo 2 --zero 1 ;;
    tp2) echo 2 --tp 2 ;;
    pp2) echo 2 --pp 2 ;;
    tp2pp2) echo 4 --tp 2 --pp 2 ;;
    tp2dp2z2) echo 4 --tp 2 --zero 2 ;;
    tp2dp2z3) echo 4 --tp 2 --zero 3 ;;
    tp2pp2dp2z3) echo 8 --tp 2 --pp 2 --zero 3 ;;
    *) return 1 ;;
  esac
}
# the last layout named also saves every STEPS/2 steps: its checkpoint crosses to the CPU
names=($LAYOUTS)
[ "${#names[@]}" -gt 0 ] || { echo "layouts: LAYOUTS names no layout"; exit 2; }
ck_name=${names[$((${#names[@]} - 1))]}
for name in "${names[@]}"; do
  args=$(layout_args "$name") || { fail "unknown layout $name (dp2z1 tp2 pp2 tp2pp2 tp2dp2z2 tp2dp2z3 tp2pp2dp2z3)"; continue; }
  # shellcheck disable=SC2086 # the flags are words
  if [ "$name" = "$ck_name" ]; then run_layout "$name" $args --ckpt-dir "$work/ck-gpu" --ckpt-every "$HALF"
  else run_layout "$name" $args; fi
done

# --- checkpoints across devices and layouts ---------------------------------------------------
crossings_json=""
# crossed NAME RESUMED LAST: the resumed run said RESUMED and ended at loss LAST
crossed() {
  local ok=true
  [ "$2" = "$HALF" ] || { echo "layouts: $1: resumed at step ${2:-none}, expected $HALF"; ok=false; }
  near "$1" "loss at step $STEPS" "$3" "the uninterrupted CPU run's" "$cpu_last" "$RTOL" || ok=false
  [ "$ok" = true ] || bad=1
  echo "layouts: $1: $([ "$ok" = true ] && echo passed || echo FAILED), resumed at ${2:-none}, loss ${3:-?} at step $STEPS" \
    "(CPU uninterrupted ${cpu_last:-?})"
  crossings_json="$crossings_json${crossings_json:+,}{\"crossing\":\"$1\",\"resumed_at\":${2:-null},\"final_loss\":${3:-null},\"ok\":$ok}"
}
last_step_dir() { printf '%s/step-%010d' "$1" "$STEPS"; }
# a GPU layout's checkpoint, resumed by one process on the CPU
rm -rf "$(last_step_dir "$work/ck-gpu")"
"$NEWT" train --device cpu --threads 0 "${FLAGS[@]}" --batch "$GB" --log "$work/gpu-to-cpu.jsonl" --ckpt-dir "$work/ck-gpu" \
  >"$work/gpu-to-cpu.out" 2>&1 || echo "layouts: newt train resuming the GPU checkpoint failed: $(tail -n 3 "$work/gpu-to-cpu.out" | tr '\n' ' ')"
crossed "gpu-$ck_name-to-cpu" "$(sed -n 's/^newt train: resumed at step \([0-9]*\) .*/\1/p' "$work/gpu-to-cpu.out")" \
  "$(loss_at "$STEPS" "$work/gpu-to-cpu.jsonl")"
# the CPU's checkpoint, resumed by a GPU layout
rm -rf "$(last_step_dir "$work/ck-cpu")"
dir=$work/cpu-to-gpu
"$NEWT" run --backend nccl --share-gpus --nproc 4 --tp 2 --zero 2 "${FLAGS[@]}" --global-batch "$GB" --quiet \
  --timeout-ms 150000 --log-dir "$dir" --summary "$dir.json" --ckpt-dir "$work/ck-cpu" >"$dir.out" 2>&1 ||
  echo "layouts: newt run resuming the CPU checkpoint failed: $(tail -n 3 "$dir.out" | tr '\n' ' ')"
from=$({ grep -o '"type":"started"[^}]*' "$dir/events.jsonl" 2>/dev/null || true; } | head -n 1 |
  sed -n 's/.*"restore":"ckpt".*"restore_step":\([0-9]*\).*/\1/p')
crossed cpu-to-gpu-tp2dp2z2 "$from" "$(loss_at "$STEPS" "$dir/steps.jsonl")"

[ "$bad" -eq 0 ] && echo "layouts: passed: every layout within relative $FIRST_RTOL at step 1 and $RTOL at step $STEPS," \
  "every crossing within $RTOL"
printf '{"single":{"first_loss":%s,"final_loss":%s},"cpu_final_loss":%s,"first_rtol":%s,"rtol":%s,"layouts":[%s],"crossings":[%s],"ok":%s}\n' \
  "${ref_first:-null}" "${ref_last:-null}" "${cpu_last:-null}" "$FIRST_RTOL" "$RTOL" "$layouts_json" "$crossings_json" \
  "$([ "$bad" -eq 0 ] && echo true || echo false)"
exit "$bad"
