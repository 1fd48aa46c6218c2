#!/bin/sh
# The GPU check's bundle, proven here without a GPU (the suite's gpu_bundle):
#
#   tests/gpu/bundle_test.sh SRC BUILD WORK
#
# 1. tests/gpu/bundle.sh makes the bundle from the suite's own build (BUILD: CUDA, warnings
#    as errors, sm_90), under its 48 MiB;
# 2. a minimal Debian root (mmdebstrap --variant=essential, bookworm: libc and the tools a
#    system needs, none of newt's library packages) gets the bundle unpacked in /opt/newt-gpu;
#    there, with the bundle's library path, ldd of every program and library in it leaves
#    only the CUDA driver's, cuBLAS's and NCCL's unresolved (and test_comm_nccl, which links
#    NCCL itself, does leave NCCL unresolved: the root has none), `newt --version` runs,
#    `newt --version --libs` names the NCCL and cuBLAS it did not find, and `newt run` trains
#    on the CPU with the bundle's etcd (the private etcd starts);
# 3. tests/gpu/run.sh with the bundle, on this machine without a GPU (the dry run): every
#    step runs, within caps that add up to 300 s or less, and each but the unpacking fails
#    with its own reason; run.sh installs nothing; exit status non-zero. (On a machine with a
#    GPU, run.sh must pass instead.)
#
# Needs root, mmdebstrap and unshare (scripts/install-deps.sh test installs mmdebstrap); the
# root filesystem comes from Debian's registry, as the image tests' do.
set -eu
src=$(cd "${1:?usage: bundle_test.sh SRC BUILD WORK}" && pwd)
build=$(cd "${2:?build dir}" && pwd)
work=${3:?work dir}
fail() { echo "gpu_bundle: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || fail "needs root (mmdebstrap, unshare, chroot)"
command -v mmdebstrap >/dev/null || fail "needs mmdebstrap (scripts/install-deps.sh test)"
unshare --mount true 2>/dev/null || fail "unshare --mount is not allowed here"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)

# --- 1. the bundle ---------------------------------------------------------------------------
"$src/tests/gpu/bundle.sh" "$work/bundle" "$build" || fail "tests/gpu/bundle.sh did not make the bundle"
[ -f "$work/bundle/newt-gpu-bundle.tar.xz" ] && [ -f "$work/bundle/MANIFEST.txt" ] || fail "the bundle lacks its archive or manifest"
for f in bin/newt bin/etcd bin/test_comm_nccl bin/test_kernels lib/libopenblas.so.0 lib/libcurl.so.4 lib/libcudart.so.13; do
  grep -q "^  $f " "$work/bundle/MANIFEST.txt" || fail "the bundle's manifest lacks $f"
done
for f in libnccl.so.2 libcublas.so.13 libcublasLt.so.13 libcuda.so.1 libc.so.6; do
  ! grep -q "^  lib/$f " "$work/bundle/MANIFEST.txt" || fail "the bundle carries $f, which the GPU machine has"
done

# --- 2. a minimal Debian root ---------------------------------------------------------------------
hooks=""
[ -d /usr/share/mmdebstrap/hooks/eatmydata ] && command -v eatmydata >/dev/null && hooks="--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata"
root=$work/root
# shellcheck disable=SC2086 # $hooks is one flag or none
mmdebstrap --quiet --mode=root --variant=essential $hooks bookworm "$root" >"$work/mmdebstrap.log" 2>&1 ||
  { tail -n 20 "$work/mmdebstrap.log"; fail "the minimal root filesystem did not build (mmdebstrap, Debian's registry)"; }
echo "gpu_bundle: a minimal Debian root in $(( $(date +%s) - t0 )) s"
# newt's library packages are not there (libzstd1 is: dpkg itself needs it)
for p in $(sh "$src/scripts/install-deps.sh" --list image-run) libopenblas0-pthread libstdc++6 libgfortran5; do
  case "$p" in libzstd1 | ca-certificates) continue ;; esac
  if chroot "$root" dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    fail "the minimal root has $p installed: it would hide what the bundle lacks"
  fi
done
mkdir -p "$root/opt/newt-gpu"
tar -C "$root/opt/newt-gpu" -xJf "$work/bundle/newt-gpu-bundle.tar.xz"
cat >"$root/check.sh" <<'EOF'
cd /tmp
for f in /opt/newt-gpu/bin/* /opt/newt-gpu/lib/*; do
  ldd "$f" >/tmp/ldd.out 2>&1 || { grep -q "not a dynamic executable" /tmp/ldd.out && continue; }
  sed -n "s|^[[:space:]]*\([^ ]*\) => not found|unresolved \1 $f|p" /tmp/ldd.out
done
echo "== newt --version"
newt --version
echo "== newt --version --libs"
newt --version --libs; echo "libs exit $?"
echo "== newt run"
newt run --nproc 2 --steps 5 --global-batch 8 --micro-batch 2 --log-dir /tmp/run --timeout-ms 240000 || echo "run exit $?"
EOF
out=$work/root.log
unshare --mount --pid --fork sh -ec '
  r=$1
  mount -t proc proc "$r/proc"
  mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
  mkdir -p "$r/dev/shm"
  mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
  chroot "$r" /usr/bin/env -i HOME=/tmp PATH=/opt/newt-gpu/bin:/usr/bin:/bin LD_LIBRARY_PATH=/opt/newt-gpu/lib sh /check.sh
' sh "$root" >"$out" 2>&1 || { tail -n 40 "$out"; fail "the programs of the bundle did not run in the minimal root"; }
bad=$(sed -n 's/^unresolved \([^ ]*\) .*/\1/p' "$out" |
      grep -v -x -e libcuda.so.1 -e libcublas.so.13 -e libcublasLt.so.13 -e libnccl.so.2 | sort -u | tr '\n' ' ')
[ -z "$bad" ] || { grep '^unresolved' "$out"; fail "libraries the bundle should carry are unresolved in the minimal root: $bad"; }
grep -q '^unresolved libnccl.so.2 /opt/newt-gpu/bin/test_comm_nccl$' "$out" ||
  { cat "$out"; fail "test_comm_nccl's NCCL was resolved in a root without NCCL: the ldd check sees nothing"; }
! grep -q '^unresolved [^ ]* /opt/newt-gpu/bin/newt$' "$out" || { grep '^unresolved' "$out"; fail "newt itself has unresolved libraries"; }
grep -q '^newt [0-9.]* (CUDA ' "$out" || { cat "$out"; fail "newt --version did not run in the minimal root"; }
grep -q '^nccl: NCCL (libnccl.so.2) was not found' "$out" && grep -q '^cublas: cuBLAS (libcublas.so.13) was not found' "$out" &&
  grep -q '^libs exit 1$' "$out" || { cat "$out"; fail "newt --version --libs did not say what it could not find"; }
grep -q 'newt run: done: 5 steps' "$out" || { tail -n 30 "$out"; fail "newt run did not train with the bundle's etcd in the minimal root"; }
echo "gpu_bundle: in a minimal Debian root only $(sed -n 's/^unresolved \([^ ]*\) .*/\1/p' "$out" | sort -u | tr '\n' ' ')are unresolved;" \
  "newt --version, --version --libs and newt run (private etcd, CPU) ran there"

# --- 3. the dry run of run.sh -------------------------------------------------------------------------
! grep -n 'install-deps\|apt-get\|pip install\|pip3 install' "$src/tests/gpu/run.sh" || fail "run.sh installs something"
dry=$work/dry
set +e
NEWT_GPU_BUNDLE=$work/bundle OUT=$dry "$src/tests/gpu/run.sh" >"$work/dry.log" 2>&1
rc=$?
set -e
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  [ "$rc" -eq 0 ] || { tail -n 30 "$work/dry.log"; fail "this machine has a GPU, and run.sh failed on it"; }
  echo "gpu_bundle: a GPU is here: run.sh passed"
  echo "1 passed, 0 failed"
  exit 0
fi
[ "$rc" -ne 0 ] || { tail -n 30 "$work/dry.log"; fail "run.sh passed on a machine without a GPU"; }
[ -f "$dry/gpu-summary.json" ] || { tail -n 30 "$work/dry.log"; fail "run.sh wrote no summary"; }
caps=$(sed -n 's/^== .* (at most \([0-9]*\)s)$/\1/p' "$work/dry.log")
nsteps=$(printf '%s\n' "$caps" | grep -c . || true)
sum=$(printf '%s\n' "$caps" | awk '{s += $1} END {print s + 0}')
[ "$nsteps" -eq 10 ] || { grep '^== ' "$work/dry.log"; fail "run.sh ran $nsteps steps, expected 10 (every step reached)"; }
[ "$sum" -le 300 ] || fail "run.sh's caps add up to $sum s, over 5 minutes"
! grep -q 'NOT RUN\|timed out' "$work/dry.log" || { grep '^== ' "$work/dry.log"; fail "a step of the dry run did not run, or timed out"; }
passed=$(grep -c '^== .*: passed (' "$work/dry.log" || true)
[ "$passed" -eq 1 ] && grep -q '^== unpack the bundle: passed (' "$work/dry.log" ||
  { grep '^== ' "$work/dry.log"; fail "without a GPU only the unpacking may pass ($passed steps passed)"; }
# every failed step has a reason of its own: the summary's "why" fields, all different and none empty
whys=$(grep -o '"why":"[^"]*"' "$dry/gpu-summary.json" | sed 's/^"why":"//; s/"$//' | sed '1d')
[ "$(printf '%s\n' "$whys" | grep -c .)" -eq 9 ] || { cat "$dry/gpu-summary.json"; fail "not every failed step says why"; }
[ "$(printf '%s\n' "$whys" | sort -u | grep -c .)" -eq 9 ] || { printf '%s\n' "$whys"; fail "two steps failed with the same words"; }
printf '%s\n' "$whys" | grep -q 'no NVIDIA GPU visible' || fail "the environment step does not say there is no GPU"
tail -n 10 "$work/dry.log"
echo "gpu_bundle: the dry run reached all $nsteps steps (caps $sum s), each GPU step failing with its own reason, in $(( $(date +%s) - t0 )) s in all"
echo "1 passed, 0 failed"
