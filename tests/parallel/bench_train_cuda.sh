#!/bin/sh
# `newt bench train --backend cuda` on the CUDA/NCCL test double (a newt built with
# NEWT_GPU_DOUBLE; CMakeLists.txt): one rank in the process, and a layout of four ranks
# (one process and one "GPU" each, NCCL between them), each with the losses of the same
# layout on the CPU and the line's backend, device and mfu (null: the double's peak is
# unknown); a layout with more ranks than GPUs fails at once, naming the GPU.
#
#   bench_train_cuda.sh NEWT_GPU_DOUBLE_BIN
set -u
NEWT=$1
export NEWT_NCCL_DOUBLE_DEVICES=8 NCCL_CHECK_POINTERS=1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0
check() { # check NAME CONDITION-COMMAND...
  name=$1
  shift
  if "$@"; then passed=$((passed + 1)); echo "ok $name"; else failed=$((failed + 1)); echo "FAILED $name"; fi
}
losses() { grep '^step ' "$1" | sed 's/ [0-9.]* ms$//'; }

for layout in "--tp 1" "--tp 2 --dp 2 --zero 1"; do
  # shellcheck disable=SC2086 # the layout's flags are words
  timeout 120 "$NEWT" bench train --preset tiny --batch 16 --micro-batch 4 --steps 2 --warmup 1 $layout \
    >"$dir/cpu.out" 2>"$dir/cpu.err"
  # shellcheck disable=SC2086
  timeout 120 "$NEWT" bench train --backend cuda --preset tiny --batch 16 --micro-batch 4 --steps 2 --warmup 1 $layout \
    >"$dir/gpu.out" 2>"$dir/gpu.err"
  check "cuda $layout: exit 0" [ $? -eq 0 ]
  check "cuda $layout: the losses of the CPU" [ "$(losses "$dir/gpu.err")" = "$(losses "$dir/cpu.err")" ]
  check "cuda $layout: a step logged" grep -q '^step 3 loss' "$dir/gpu.err"
  check "cuda $layout: backend, device, mfu" \
    grep -q '"backend":"cuda","device":"cuda:0 newt test double of a GPU[^"]*","mfu":null}$' "$dir/gpu.out"
done
cat "$dir/gpu.out"

NEWT_NCCL_DOUBLE_DEVICES=3 timeout 60 "$NEWT" bench train --backend cuda --preset tiny --tp 2 --dp 2 --steps 1 \
  >/dev/null 2>"$dir/err"
check "4 ranks on 3 GPUs: fails" [ $? -eq 1 ]
check "4 ranks on 3 GPUs: names the GPU" grep -q 'rank 3: --device 0 + rank: cuda:3: no such GPU' "$dir/err"
timeout 10 "$NEWT" bench train --backend gpu >/dev/null 2>"$dir/err"
check "--backend gpu: exit 2" [ $? -eq 2 ]
check "--backend gpu: named" grep -q -- '--backend: cpu or cuda, not "gpu"' "$dir/err"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
