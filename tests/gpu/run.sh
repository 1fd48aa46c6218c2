#!/usr/bin/env bash
# Every GPU check in one go, within 5 minutes, on a machine with an NVIDIA GPU that may reach
# no network at all (`make test` leaves these out: CI has no GPU; the NCCL backend's suite
# runs there against the test double instead). It installs nothing and builds nothing
# unless asked: newt comes built, in a bundle made on a build machine (tests/gpu/bundle.sh).
#
#   NEWT_GPU_BUNDLE=gpu-bundle OUT=/some/dir tests/gpu/run.sh
#   NEWT_GPU_BUILD=1 tests/gpu/run.sh     (fallback: build here, where newt's -dev packages are)
#
# Found on the machine, not carried: the CUDA driver, cuBLAS (the CUDA toolkit's lib64 under
# CUDA_HOME, default /usr/local/cuda, or a pip wheel's), NCCL (NCCL_HOME, else the Python
# image's nvidia-nccl wheel, else the loader's cache or the toolkit). `newt --version --libs`
# says which NCCL was loaded and refuses one older than the NCCL backend needs (2.28.7).
#
# The steps, most valuable first, each under `timeout` with a cap (the caps add up to 300 s;
# a step that would pass the 300 s deadline gets what is left, and none when under 5 s):
#    15 s  unpack the bundle and check every file against its MANIFEST.txt
#    10 s  environment: driver, GPUs, CUDA, NCCL, cuBLAS (newt --version --libs)
#    25 s  the CUDA kernels against the CPU device's (test_kernels: stated tolerances, one
#          JSON line per op; the matmul timed on random data)
#    60 s  the NCCL backend's multi-rank suite against the real NCCL (test_comm_nccl): one GPU
#          per rank where there are enough (3), otherwise ranks sharing GPUs, each its own
#          NCCL host (NCCL_HOSTID), over NCCL's socket transport; 15 of its 100 rebuilds
#    20 s  newt bench allreduce --backend nccl: 2 ranks at least (on one GPU, two sharing it)
#    20 s  newt bench train --backend cuda --preset gpt2-124m: tokens/s and MFU
#    40 s  the trainer's layouts (dp2 ZeRO 1, tp2 x pp2, tp2 x dp2 ZeRO 3) against
#          `newt train --device cuda`, and checkpoints crossing devices both ways
#          (tests/gpu/layouts.sh, 30 steps)
#    35 s  an elastic `newt run --backend nccl --share-gpus` of three workers with a kill and a
#          join, against `newt train` on the CPU (tests/gpu/elastic.sh)
#    25 s  newt bench recovery --backend nccl --share-gpus: one recovery's phases
#    50 s  the PyTorch example (examples/torch, the Python package) on CUDA tensors, NCCL on
#          torch's stream: two workers and a kill against one worker, with job.reduce_gradients
#          and with torch's DDP over newt (newt.torch, --ddp); the stock DDP script (ddp.py) in
#          fp16 with a GradScaler and an overflow after the kill (tests/gpu/torch.sh)
# A failed step, one that timed out and one that did not run fail the script; each failed
# step's last words are its "why" in the summary. Writes $OUT/gpu-summary.json (OUT
# defaults to /tmp/newt-gpu), the whole log beside it ($OUT/gpu.log) and each step's own
# log ($OUT/step-NN.log); the last lines printed are the summary as a table.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT:-/tmp/newt-gpu}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
LOG=$OUT_DIR/gpu.log
SUMMARY=$OUT_DIR/gpu-summary.json
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1

T0=$(date +%s)
BUDGET=300
DEADLINE=$((T0 + BUDGET))
failed=0
nstep=0
steps_json=""
table=""
json_str() { # a JSON string of $1 (quotes, backslashes and control characters escaped)
  printf '"%s"' "$(printf '%s' "$1" | sed 's/\\/\\\\/g; s/"/\\"/g' | tr '\n\t\r' '   ' | tr -d '\000-\037')"
}
# one JSON line of a file (the last whole one), or "" when it has none
last_json() { { grep '^{.*}$' "$1" 2>/dev/null || true; } | tail -n 1; }
# every whole JSON line of a file, comma-separated
all_json() { { grep '^{.*}$' "$1" 2>/dev/null || true; } | paste -sd, -; }

# step NAME CAP COMMAND...: runs COMMAND under timeout (CAP, or what is left of the budget),
# its output shown and kept in $OUT/step-NN.log; records its result and, when it failed,
# why (its last lines). A failed, timed-out or skipped step fails the script at the end.
STEP_LOG=""
step() {
  local name=$1 cap=$2
  shift 2
  nstep=$((nstep + 1))
  STEP_LOG=$(printf '%s/step-%02d.log' "$OUT_DIR" "$nstep")
  local left=$((DEADLINE - $(date +%s))) t=0 rc status why=""
  [ "$cap" -lt "$left" ] || cap=$left
  : >"$STEP_LOG"
  if [ "$cap" -lt 5 ]; then
    echo "== $name: NOT RUN: out of time (the ${BUDGET}-second budget is spent)"
    status="not run (out of time)"
    why="the ${BUDGET}-second budget was spent before it"
    rc=124
  else
    echo "== $name (at most ${cap}s)"
    t=$(date +%s)
    set +e
    local run=("$@")
    # a function of this script runs in a bash of its own (timeout runs programs only)
    if declare -F "$1" >/dev/null; then run=(bash -c '"$@"' _ "$@"); fi
    { timeout --kill-after=5 "$cap" "${run[@]}" 2>&1; echo $? >"$STEP_LOG.rc"; } | tee "$STEP_LOG"
    set -e
    rc=$(cat "$STEP_LOG.rc" 2>/dev/null || echo 1)
    rm -f "$STEP_LOG.rc"
    t=$(($(date +%s) - t))
    if [ "$rc" -eq 0 ]; then status=passed
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then status="timed out after ${cap}s"
    else status="failed (exit $rc)"; fi
    echo "== $name: $status (${t}s)"
    if [ "$rc" -ne 0 ]; then
      # why: the first line that says FAIL (the root cause, before what follows from it),
      # else the last two lines
      why=$(grep -m 1 'FAIL' "$STEP_LOG" | cut -c1-300 || true)
      [ -n "$why" ] || why=$(grep -v '^[[:space:]]*$' "$STEP_LOG" | grep -v '^{' | tail -n 2 | cut -c1-300 | paste -sd' ' -)
      [ -n "$why" ] || why="it printed nothing"
    fi
  fi
  [ "$rc" -eq 0 ] || failed=1
  steps_json="$steps_json${steps_json:+,}{\"step\":$(json_str "$name"),\"result\":$(json_str "$status"),\"seconds\":$t,\"cap\":$cap,\"why\":$(json_str "$why")}"
  table="$table$(printf '%-36s %-22s %4ss  %s' "$name" "$status" "$t" "$why" | cut -c1-240)"$'\n'
  return 0
}

# --- 0. newt: the bundle, or a build here ----------------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME
B="" bundle_line=""
unpack() { # the bundle into $B, every file checked against the manifest
  local dir=$1
  [ -f "$dir/newt-gpu-bundle.tar.xz" ] || { echo "no $dir/newt-gpu-bundle.tar.xz: make one with tests/gpu/bundle.sh $dir"; return 1; }
  if command -v xz >/dev/null 2>&1; then tar -C "$B" -xJf "$dir/newt-gpu-bundle.tar.xz"
  else python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$dir/newt-gpu-bundle.tar.xz" "$B"; fi
  local bad=0 f size sum
  while read -r f size sum; do
    [ -f "$B/$f" ] && [ "$(stat -c %s "$B/$f")" = "$size" ] && [ "$(sha256sum "$B/$f" | cut -d' ' -f1)" = "$sum" ] ||
      { echo "bundle: $f differs from its manifest (a damaged copy?)"; bad=1; }
  done < <(sed -n 's/^  \([^ ]*\) \([0-9]*\) \([0-9a-f]*\)$/\1 \2 \3/p' "$B/MANIFEST.txt")
  [ "$bad" -eq 0 ] || return 1
  sed -n '1,4p' "$B/MANIFEST.txt"
  local need have
  need=$(sed -n 's/^glibc: //p' "$B/MANIFEST.txt")
  have=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  if [ -n "$need" ] && [ -n "$have" ] && [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -n 1)" != "$need" ]; then
    echo "bundle: built against glibc $need, this machine has $have: rebuild it on an older system, or NEWT_GPU_BUILD=1"
    return 1
  fi
  echo "bundle: unpacked into $B, every file as its manifest says (glibc: needs $need, has ${have:-?})"
}
build_here() { # the fallback: build in $BUILD
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEWT_CUDA=ON -DNEWT_WERROR=ON &&
    cmake --build "$BUILD" -j "$(nproc)" --target newt test_comm_nccl test_kernels newt_shared newt_python
}
export -f unpack build_here
if [ -n "${NEWT_GPU_BUNDLE:-}" ]; then
  B=$(mktemp -d /tmp/newt-gpu-bundle.XXXXXX)
  export B
  step "unpack the bundle" 15 unpack "$NEWT_GPU_BUNDLE"
  bundle_line=$(sed -n 's/^built: //p' "$B/MANIFEST.txt" 2>/dev/null || true)
  NEWT=$B/bin/newt TEST_BIN=$B/bin
  export PYTHONPATH="$B/python${PYTHONPATH:+:$PYTHONPATH}" NEWT_LIBRARY="$B/lib/libnewt.so.0"
  export PATH="$B/bin:$PATH" NEWT_ETCD_BIN="$B/bin/etcd"
  LIBS=$B/lib
elif [ "${NEWT_GPU_BUILD:-0}" = 1 ]; then
  BUILD=${BUILD:-build-gpu}
  export BUILD
  step "build here (NEWT_GPU_BUILD=1)" 240 build_here
  NEWT=$BUILD/newt TEST_BIN=""
  export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}" NEWT_LIBRARY="$BUILD/lib/libnewt.so.0"
  LIBS=""
else
  step "newt for this machine" 5 sh -c 'echo "no newt to run: set NEWT_GPU_BUNDLE to a bundle made by tests/gpu/bundle.sh (docs/model.md, \"The GPU check\"), or NEWT_GPU_BUILD=1 to build here"; exit 1'
  NEWT=/nonexistent/newt TEST_BIN="" LIBS=""
fi
test_bin() { # the path of a test binary: the bundle's, or the build's
  if [ -n "$TEST_BIN" ]; then echo "$TEST_BIN/$1"
  elif [ -x "$BUILD/tests/comm/$1" ]; then echo "$BUILD/tests/comm/$1"
  else echo "$BUILD/tests/gpu/$1"; fi
}

# --- 1. the environment ---------------------------------------------------------------------------
py_lib_dir() { # the directory of the first nvidia/**/NAME in the Python image's site-packages
  local py
  for py in python3 /opt/torch/.venv/bin/python3; do
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    "$py" - "$1" 2>/dev/null <<'EOF' && return 0
import glob, os, site, sys
roots = list(site.getsitepackages()) + [site.getusersitepackages()] + sys.path
for r in roots:
    for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", sys.argv[1]), recursive=True)):
        print(os.path.dirname(os.path.realpath(p)))
        sys.exit(0)
sys.exit(1)
EOF
  done
  return 1
}
cache_lib_dir() { ldconfig -p 2>/dev/null | awk -v n="$1" '$1 == n {print $NF; exit}' | xargs -r dirname; }
find_nccl() {
  local d
  if [ -n "${NCCL_HOME:-}" ]; then
    for d in "$NCCL_HOME/lib" "$NCCL_HOME/lib64"; do [ -e "$d/libnccl.so.2" ] && { echo "$d"; return; }; done
  fi
  py_lib_dir libnccl.so.2 && return
  d=$(cache_lib_dir libnccl.so.2)
  [ -n "$d" ] && { echo "$d"; return; }
  [ -e "$CUDA_HOME/lib64/libnccl.so.2" ] && echo "$CUDA_HOME/lib64"
}
find_cublas() {
  local d
  [ -e "$CUDA_HOME/lib64/libcublas.so.13" ] && { echo "$CUDA_HOME/lib64"; return; }
  py_lib_dir libcublas.so.13 && return
  d=$(cache_lib_dir libcublas.so.13)
  [ -n "$d" ] && echo "$d"
}
gpus=0 driver="" gpu_name=""
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L | grep -c '^GPU ' || true)
  driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -n 1)
  gpu_name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  nvidia-smi || true
fi
nvcc_v=$("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo "no nvcc")
nccl_dir=$(find_nccl || true)
cublas_dir=$(find_cublas || true)
export LD_LIBRARY_PATH="${LIBS:+$LIBS:}${nccl_dir:+$nccl_dir:}${cublas_dir:+$cublas_dir:}$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
[ -z "$nccl_dir" ] || export NEWT_NCCL_LIBRARY="$nccl_dir/libnccl.so.2"
[ -z "$cublas_dir" ] || export NEWT_CUBLAS_LIBRARY="$cublas_dir/libcublas.so.13"
environment() {
  echo "GPUs: $gpus${gpu_name:+ ($gpu_name)}; driver ${driver:-none}; toolkit $nvcc_v at $CUDA_HOME"
  local nowhere="nowhere (looked in NCCL_HOME, the nvidia-nccl wheel of the Python image, ldconfig, $CUDA_HOME/lib64)"
  echo "NCCL from: ${nccl_dir:-$nowhere}"
  nowhere="nowhere (looked in $CUDA_HOME/lib64, a pip wheel, ldconfig)"
  echo "cuBLAS from: ${cublas_dir:-$nowhere}"
  local bad="" out
  out=$("$NEWT" --version --libs 2>&1) || true
  printf '%s\n' "$out"
  printf '%s\n' "$out" | grep -q '^newt ' || bad="newt does not start: $(printf '%s' "$out" | tail -n 1)"
  for lib in cuda nccl cublas; do
    case "$(printf '%s\n' "$out" | sed -n "s/^$lib: //p")" in
      "CUDA runtime "*", driver "*", "[1-9]*" GPU"* | "NCCL "[0-9]*" ("* | "cuBLAS "[0-9]*" ("*) ;;
      *) bad="${bad:+$bad; }$lib: $(printf '%s\n' "$out" | sed -n "s/^$lib: //p" | cut -c1-160)" ;;
    esac
  done
  [ "$gpus" -gt 0 ] || bad="${bad:+$bad; }no NVIDIA GPU visible (nvidia-smi -L)"
  [ -z "$bad" ] || { echo "environment: FAILED: $bad"; return 1; }
  echo "environment: a GPU, the CUDA driver, NCCL and cuBLAS found"
}
export -f environment
export NEWT gpus gpu_name driver nvcc_v nccl_dir cublas_dir
step "environment" 10 environment
env_out=$STEP_LOG
nccl_line=$(sed -n 's/^nccl: //p' "$env_out" | head -n 1)
cuda_line=$(sed -n 's/^cuda: //p' "$env_out" | head -n 1)
cublas_line=$(sed -n 's/^cublas: //p' "$env_out" | head -n 1)
if [ "$gpus" -lt 3 ]; then
  echo "== $gpus GPU(s) for up to 3 ranks: ranks share GPUs, each its own NCCL host (NCCL_HOSTID), over NCCL's"
  echo "   socket transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NET=Socket); NCCL's refusals carry its words"
  export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket NCCL_SOCKET_IFNAME=lo
fi
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# --- 2. kernels, the NCCL suite ------------------------------------------------------------------------
step "kernels (test_kernels)" 25 "$(test_bin test_kernels)"
kernels_json=$(all_json "$STEP_LOG")
NEWT_TEST_REBUILDS=15 step "NCCL suite (test_comm_nccl)" 60 "$(test_bin test_comm_nccl)"
cases_json=""
while read -r verdict name secs; do
  cases_json="$cases_json${cases_json:+,}{\"case\":$(json_str "$name"),\"result\":$(json_str "$verdict"),\"seconds\":${secs:-0}}"
done < <(sed -n 's/^\(ok\|FAILED\) *\(test_[a-z0-9_]*\) (\([0-9.]*\) s)$/\1 \2 \3/p' "$STEP_LOG")

# --- 3. benchmarks ------------------------------------------------------------------------------------
step "bench allreduce --backend nccl" 20 \
  "$NEWT" bench allreduce --backend nccl --ranks "$([ "$gpus" -gt 2 ] && echo "$gpus" || echo 2)" --min 1M --max 256M --warmup 3
bench_json=$(all_json "$STEP_LOG")
step "bench train gpt2-124m --backend cuda" 20 \
  "$NEWT" bench train --backend cuda --preset gpt2-124m --batch 16 --warmup 3 --steps 10
train_json=$(last_json "$STEP_LOG")

# --- 4. layouts, elastic, recovery ---------------------------------------------------------------------
LAYOUT_STEPS=30 LAYOUTS="dp2z1 tp2pp2 tp2dp2z3" step "layouts, checkpoints across devices" 40 \
  tests/gpu/layouts.sh "$NEWT" "$OUT_DIR"
layouts_json=$(last_json "$STEP_LOG")
ELASTIC_STEPS=600 step "elastic: a kill and a join" 35 \
  tests/gpu/elastic.sh "$NEWT" "$OUT_DIR"
elastic_json=$(last_json "$STEP_LOG")
step "bench recovery --backend nccl" 25 \
  "$NEWT" bench recovery --backend nccl --share-gpus --nproc 4 --runs 1 --steps 200 --kill-at 10 --model layers=2,channels=64
recovery_json=$(last_json "$STEP_LOG")
step "PyTorch example and DDP on CUDA (torch.sh)" 50 tests/gpu/torch.sh "$NEWT" "$OUT_DIR"
torch_json=$(last_json "$STEP_LOG")

# --- 5. the summary ------------------------------------------------------------------------------------
total=$(($(date +%s) - T0))
ok=$([ "$failed" -eq 0 ] && echo true || echo false)
cat >"$SUMMARY" <<EOF
{"ok":$ok,"seconds":$total,"budget_seconds":$BUDGET,"gpus":$gpus,"gpu":$(json_str "$gpu_name"),
 "driver":$(json_str "$driver"),"toolkit":$(json_str "$nvcc_v"),"cuda":$(json_str "$cuda_line"),
 "nccl":$(json_str "$nccl_line"),"cublas":$(json_str "$cublas_line"),"bundle":$(json_str "$bundle_line"),
 "shared_gpus_socket_transport":$([ "$gpus" -lt 3 ] && echo true || echo false),
 "steps":[$steps_json],
 "test_comm_nccl":[$cases_json],
 "kernels":[$kernels_json],
 "bench":[$bench_json],
 "train":${train_json:-null},
 "layouts":${layouts_json:-null},
 "elastic":${elastic_json:-null},
 "recovery":${recovery_json:-null},
 "torch":${torch_json:-null}}
EOF
[ -z "$B" ] || rm -rf "$B"
echo "== summary: $SUMMARY"
cat "$SUMMARY"
echo
printf '%-36s %-22s %5s  %s\n' step result time why
printf '%s' "$table"
if [ "$failed" -ne 0 ]; then
  echo "tests/gpu/run.sh: FAILED in ${total}s (see the steps above, $LOG and $OUT_DIR/step-*.log)"
  exit 1
fi
echo "tests/gpu/run.sh: every GPU check passed in ${total}s"
