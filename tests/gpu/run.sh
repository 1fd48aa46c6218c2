#!/usr/bin/env bash
# Every GPU check in one go, on a machine with an NVIDIA GPU (`make test` leaves them out:
# CI has no GPU; the NCCL backend's suite runs there against the test double instead).
#
#   tests/gpu/run.sh              OUT=/some/dir tests/gpu/run.sh
#
# 1. prints the driver, CUDA and NCCL versions (nvidia-smi, nvcc, ncclGetVersion);
# 2. builds newt with the CUDA parts required and warnings as errors (-DNEWT_CUDA=ON
#    -DNEWT_WERROR=ON), the targets the checks need;
# 3. runs the NCCL backend's multi-rank suite (tests/comm/test_comm_nccl.c, the source the
#    double runs in `make test`) against the real NCCL: one GPU per rank where there are
#    enough (3); otherwise the ranks share GPUs, each its own NCCL host (the suite sets
#    NCCL_HOSTID per rank) over NCCL's socket transport (P2P and SHM off, set here), or
#    NCCL refuses and the log says so; then the CUDA device's kernels against the CPU
#    device's (tests/gpu/test_kernels.c: one JSON line per op and tensor, and a matmul
#    timing, kept in the summary under "kernels"); then the other tests labelled gpu;
# 4. runs `newt bench allreduce --backend nccl` (nccl-tests figures), then
#    `newt bench train --backend cuda --preset gpt2-124m` (tokens/s and MFU on GPU 0: the
#    summary's "train"), the trainer's layouts (dp, tp, pp, ZeRO 1-3, up to 8 processes
#    sharing the GPUs) against `newt train --device cuda`, and checkpoints crossing devices
#    and layouts both ways (tests/gpu/layouts.sh: the summary's "layouts"), an elastic `newt run --backend nccl --share-gpus` of three workers
#    with a kill and a join, checked against `newt train` on the CPU (tests/gpu/elastic.sh:
#    the summary's "elastic"), and `newt bench recovery --backend nccl --share-gpus` (one
#    run: the summary's "recovery"); --share-gpus lets the workers share a GPU, each its own
#    host to the coordinator and NCCL (docs/elastic.md, "GPU workers on one host");
# 5. writes a JSON summary to $OUT/gpu-summary.json (or /tmp) and the log beside it.
#
# Exits non-zero when any step fails or does not run; ends within 8 minutes on one H200
# with 16 cores (each step under `timeout`, against one deadline).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
OUT_DIR=${OUT:-/tmp}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu.log
SUMMARY=$OUT_DIR/gpu-summary.json
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

T0=$(date +%s)
DEADLINE=$((T0 + 460)) # 8 minutes, less what the summary needs
JOBS=$(nproc)
failed=0
steps_json=""
cases_json=""
bench_json=""
kernels_json=""
train_json=""
layouts_json=""
elastic_json=""
recovery_json=""

json_str() { # a JSON string of $1 (quotes, backslashes and control characters escaped)
  printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t\r' '   ')"
}

# step NAME CAP_SECONDS COMMAND...: runs COMMAND under timeout (CAP or what is left),
# records its result; a failed or skipped step fails the script at the end.
step() {
  local name=$1 cap=$2
  shift 2
  local left=$((DEADLINE - $(date +%s))) t rc status
  [ "$cap" -lt "$left" ] || cap=$left
  if [ "$cap" -lt 5 ]; then
    echo "== $name: NOT RUN: out of time (the 8-minute budget is spent)"
    status="not run (out of time)"
    rc=124
    t=0
  else
    echo "== $name (at most ${cap}s)"
    t=$(date +%s)
    set +e
    timeout --kill-after=10 "$cap" "$@"
    rc=$?
    set -e
    t=$(($(date +%s) - t))
    if [ "$rc" -eq 0 ]; then status=passed
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="timed out after ${cap}s"
    else status="failed (exit $rc)"; fi
    echo "== $name: $status (${t}s)"
  fi
  [ "$rc" -eq 0 ] || failed=1
  steps_json="$steps_json${steps_json:+,}{\"step\":$(json_str "$name"),\"result\":$(json_str "$status"),\"seconds\":$t}"
  return 0
}

# --- 1. versions ---------------------------------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PATH="$CUDA_HOME/bin:$PATH"
export LD_LIBRARY_PATH="$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
gpus=0 driver="" gpu_name="" cuda="" nccl_lib="" nccl_header=""
if nvidia-smi -L; then
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  nvidia-smi
else
  echo "tests/gpu/run.sh: no NVIDIA GPU visible (nvidia-smi failed): these checks need one"
  failed=1
fi
cuda=$(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*, V[0-9.]*' || echo "nvcc not found")
nccl_header=$(sed -n 's/^#define NCCL_VERSION_CODE \([0-9]*\).*/\1/p' "$CUDA_HOME/include/nccl.h" 2>/dev/null || true)
probe_dir=$(mktemp -d)
cat >"$probe_dir/v.c" <<'EOF'
#include <nccl.h>
#include <stdio.h>
int main(void) {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return 1;
  printf("%d.%d.%d\n", v / 10000, v / 100 % 100, v % 100);
  return 0;
}
EOF
if cc -I"$CUDA_HOME/include" "$probe_dir/v.c" -L"$CUDA_HOME/lib64" -lnccl -o "$probe_dir/v" &&
   nccl_lib=$("$probe_dir/v"); then :; else nccl_lib="unknown (ncclGetVersion probe failed)"; failed=1; fi
rm -rf "$probe_dir"
echo "GPUs: $gpus ($gpu_name); driver $driver; CUDA $cuda; NCCL $nccl_lib (header $nccl_header)"

# --- 2. build --------------------------------------------------------------------------------
step "install build dependencies" 60 scripts/install-deps.sh build
step "configure (NEWT_CUDA=ON, NEWT_WERROR=ON)" 60 \
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEWT_CUDA=ON -DNEWT_WERROR=ON
step "build" 240 cmake --build "$BUILD" -j "$JOBS" --target newt test_comm_nccl test_kernels

# --- 3. the NCCL backend's suite on the GPUs, then the other gpu tests ---------------------------
if [ "$gpus" -lt 3 ]; then
  echo "== $gpus GPU(s) for up to 3 ranks: the ranks share GPUs, each its own NCCL host (NCCL_HOSTID, set by the"
  echo "   suite per rank), over NCCL's socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket);"
  echo "   where NCCL refuses this, the suite's failures below carry NCCL's own words"
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
suite_out=$OUT_DIR/test_comm_nccl.log
# shellcheck disable=SC2016 # expanded by the inner bash
step "NCCL backend suite (test_comm_nccl)" 200 bash -c \
  'set -o pipefail; "$1/tests/comm/test_comm_nccl" 2>&1 | tee "$2"' _ "$BUILD" "$suite_out"
if [ -f "$suite_out" ]; then
  while read -r verdict name secs; do
    cases_json="$cases_json${cases_json:+,}{\"case\":$(json_str "$name"),\"result\":$(json_str "$verdict"),\"seconds\":${secs:-0}}"
  done < <(sed -n 's/^\(ok\|FAILED\) *\(test_[a-z0-9_]*\) (\([0-9.]*\) s)$/\1 \2 \3/p' "$suite_out")
fi
kernels_out=$OUT_DIR/test_kernels.jsonl
# shellcheck disable=SC2016 # expanded by the inner bash
step "CUDA device kernels vs the CPU device (test_kernels)" 90 bash -c \
  'set -o pipefail; "$1/tests/gpu/test_kernels" | tee "$2"' _ "$BUILD" "$kernels_out"
if [ -f "$kernels_out" ]; then
  while read -r line; do
    kernels_json="$kernels_json${kernels_json:+,}$line"
  done < <(grep '^{.*}$' "$kernels_out" || true) # whole lines only (a crash may cut the last)
fi
step "other gpu tests (ctest -L gpu)" 90 \
  ctest --test-dir "$BUILD" -L gpu -E '^(test_comm_nccl|test_kernels)$' --output-on-failure --timeout 80

# --- 4. the benchmark ---------------------------------------------------------------------------
bench_out=$OUT_DIR/bench-nccl.jsonl
# shellcheck disable=SC2016 # expanded by the inner bash
step "newt bench allreduce --backend nccl" 60 bash -c \
  'set -o pipefail; "$1/newt" bench allreduce --backend nccl --min 1M --max 1G --warmup 5 | tee "$2"' _ "$BUILD" "$bench_out"
if [ -f "$bench_out" ]; then
  while read -r line; do
    bench_json="$bench_json${bench_json:+,}$line"
  done < <(grep '^{' "$bench_out" || true)
fi

# one JSON line of a step's output (the last whole one), or "" when it has none
last_json() { { grep '^{.*}$' "$1" 2>/dev/null || true; } | tail -n 1; }

train_out=$OUT_DIR/bench-train.jsonl
# shellcheck disable=SC2016 # expanded by the inner bash
step "newt bench train --backend cuda --preset gpt2-124m" 120 bash -c \
  'set -o pipefail; "$1/newt" bench train --backend cuda --preset gpt2-124m --batch 16 --warmup 3 --steps 10 | tee "$2"' \
  _ "$BUILD" "$train_out"
train_json=$(last_json "$train_out")

layouts_out=$OUT_DIR/layouts.log
# shellcheck disable=SC2016 # expanded by the inner bash
step "the trainer's layouts on this host's GPUs vs newt train --device cuda; checkpoints across devices" 200 bash -c \
  'set -o pipefail; tests/gpu/layouts.sh "$1/newt" "$2" | tee "$3"' _ "$BUILD" "$OUT_DIR" "$layouts_out"
layouts_json=$(last_json "$layouts_out")

elastic_out=$OUT_DIR/elastic.log
# shellcheck disable=SC2016 # expanded by the inner bash
step "elastic newt run --backend nccl --share-gpus (kill, join) vs newt train" 150 bash -c \
  'set -o pipefail; tests/gpu/elastic.sh "$1/newt" "$2" | tee "$3"' _ "$BUILD" "$OUT_DIR" "$elastic_out"
elastic_json=$(last_json "$elastic_out")

recovery_out=$OUT_DIR/bench-recovery.jsonl
# shellcheck disable=SC2016 # expanded by the inner bash
step "newt bench recovery --backend nccl --share-gpus" 90 bash -c \
  'set -o pipefail; "$1/newt" bench recovery --backend nccl --share-gpus --nproc 4 --runs 1 --steps 200 --kill-at 10 \
     --model layers=2,channels=64 | tee "$2"' _ "$BUILD" "$recovery_out"
recovery_json=$(last_json "$recovery_out")

# --- 5. the summary ---------------------------------------------------------------------------
total=$(($(date +%s) - T0))
ok=$([ "$failed" -eq 0 ] && echo true || echo false)
cat >"$SUMMARY" <<EOF
{"ok":$ok,"seconds":$total,"gpus":$gpus,"gpu":$(json_str "$gpu_name"),"driver":$(json_str "$driver"),
 "cuda":$(json_str "$cuda"),"nccl":$(json_str "$nccl_lib"),"nccl_header":$(json_str "$nccl_header"),
 "shared_gpus_socket_transport":$([ "$gpus" -lt 3 ] && echo true || echo false),
 "steps":[$steps_json],
 "test_comm_nccl":[$cases_json],
 "kernels":[$kernels_json],
 "bench":[$bench_json],
 "train":${train_json:-null},
 "layouts":${layouts_json:-null},
 "elastic":${elastic_json:-null},
 "recovery":${recovery_json:-null}}
EOF
echo "== summary: $SUMMARY"
cat "$SUMMARY"
if [ "$failed" -ne 0 ]; then
  echo "tests/gpu/run.sh: FAILED (see the steps above and $LOG)"
  exit 1
fi
echo "tests/gpu/run.sh: every GPU check passed in ${total}s"
