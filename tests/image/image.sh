#!/bin/sh
# The images, proven without Docker (CI has no container runtime; it reaches Debian's
# registry):
#
#   image.sh packages SRC   fast: both Dockerfiles install exactly scripts/install-deps.sh's
#                           profiles image-build and image-run (no other apt-get), and every
#                           dependency CMakeLists.txt asks for (pkg_check_modules, find_package,
#                           the tools) comes from a package of image-build (pkg-config's .pc
#                           file, looked up with dpkg -S, is in the list or a dependency of it)
#   image.sh cpu SRC WORK   the CPU image for real: its build stage's and its runtime's root
#                           filesystems built from Debian's packages with mmdebstrap (the same
#                           registry), newt built in the first from this tree with the
#                           Dockerfile's own cmake commands, copied into the second, and
#                           `newt run --nproc 2` run there as user 65532 with a read-only root
#                           filesystem, a tmpfs /tmp and /dev/shm (as the chart's pods have)
#
# The CUDA image (helm/Dockerfile) installs the same profiles on its CUDA base, so the CPU
# run checks its package lists too, short of the base. Needs root, mmdebstrap and unshare.
set -eu
mode=${1:?usage: image.sh packages SRC | image.sh cpu SRC WORK}
src=$(cd "${2:?source dir}" && pwd)
deps="$src/scripts/install-deps.sh"
fail() { echo "image: $*" >&2; exit 1; }

list() { sh "$deps" --list "$1" | tr '\n' ' '; }

check_packages() {
  for f in Dockerfile Dockerfile.cpu; do
    df="$src/helm/$f"
    stages=$(grep -o 'install-deps.sh [a-z-]*$\|install-deps.sh [a-z-]* ' "$df" | awk '{print $2}' | tr '\n' ' ')
    [ "$stages" = "image-build image-run " ] ||
      fail "$f: its stages install '$stages', want the profiles 'image-build image-run' of scripts/install-deps.sh"
    if grep -n 'apt-get install\|apt install' "$df"; then
      fail "$f installs packages outside scripts/install-deps.sh (one list drives every image)"
    fi
  done
  want=$(list image-build)
  # every tool and library the build asks for
  for tool in cmake make gcc pkg-config; do
    case " $want " in *" $tool "*) ;; *) fail "image-build lacks $tool (the build runs it)" ;; esac
  done
  mods=$(grep -ho 'pkg_check_modules([A-Z_]* REQUIRED IMPORTED_TARGET [a-z0-9_.-]*' "$src/CMakeLists.txt" "$src"/*/CMakeLists.txt |
         awk '{print $NF}')
  # find_package(X) of CMakeLists.txt by its pkg-config module
  for p in $(grep -ho 'find_package([A-Za-z]*' "$src/CMakeLists.txt" | sed 's/find_package(//'); do
    case "$p" in
      CURL) mods="$mods libcurl" ;;
      OpenSSL) mods="$mods openssl" ;;
      PkgConfig|Threads|OpenMP|CUDAToolkit) ;; # pkg-config, libc, gcc's libgomp; CUDA: the base
      *) fail "CMakeLists.txt: find_package($p): tests/image/image.sh does not know its Debian package" ;;
    esac
  done
  for m in $mods; do
    pc=$(pkg-config --variable=pcfiledir "$m" 2>/dev/null)/$m.pc
    [ -e "$pc" ] || fail "pkg-config module $m is not installed here (make deps-build)"
    pkg=$(dpkg -S "$(readlink -f "$pc")" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || pkg=$(dpkg -S "$pc" 2>/dev/null | head -1 | cut -d: -f1)
    [ -n "$pkg" ] || fail "no Debian package owns $pc"
    ok=0
    for w in $want; do
      [ "$w" = "$pkg" ] && ok=1
      # a package of the list that depends on it (libopenblas-dev: libopenblas-pthread-dev | ...)
      dpkg-query -W -f='${Depends}' "$w" 2>/dev/null | tr ',|' '\n\n' | awk '{print $1}' | grep -qx "$pkg" && ok=1
    done
    [ "$ok" -eq 1 ] || fail "CMakeLists.txt needs $m (package $pkg), which install-deps.sh's image-build lacks"
    echo "image: $m from $pkg"
  done
  echo "image: both Dockerfiles install image-build and image-run only; image-build covers the build's dependencies"
  check_nccl_pin
}

# The CUDA image's NCCL: the pin is at least the version comm/nccl_lib.h requires, built for the
# base's CUDA major, and reaches both stages' install-deps.sh
check_nccl_pin() {
  df="$src/helm/Dockerfile"
  pin=$(sed -n 's/^ARG NCCL_PIN=//p' "$df")
  cuda=$(sed -n 's/^ARG CUDA_VERSION=//p' "$df")
  [ -n "$pin" ] && [ -n "$cuda" ] || fail "helm/Dockerfile: no ARG NCCL_PIN or CUDA_VERSION"
  need=$(sed -n 's/^#define NEWT_NCCL_MIN_TEXT "\([0-9.]*\)".*/\1/p' "$src/comm/nccl_lib.h")
  [ -n "$need" ] || fail "comm/nccl_lib.h: no minimum NCCL version (#define NEWT_NCCL_MIN_TEXT \"X.Y.Z\")"
  have=${pin%%-*}
  [ "$(printf '%s\n%s\n' "$need" "$have" | sort -V | head -1)" = "$need" ] ||
    fail "helm/Dockerfile: NCCL_PIN $pin is older than the $need comm/nccl_lib.h names"
  case "$pin" in *"+cuda${cuda%%.*}."*) ;; *) fail "helm/Dockerfile: NCCL_PIN $pin is not built for the base's CUDA $cuda" ;; esac
  n=$(grep -c 'NEWT_NCCL_PIN="${NCCL_PIN}" sh /tmp/install-deps.sh' "$df")
  [ "$n" -eq 2 ] || fail "helm/Dockerfile: $n of its 2 stages install NCCL_PIN"
  NEWT_NCCL_PIN=$pin sh "$deps" --list image-run | grep -qx "libnccl2=$pin" ||
    fail "install-deps.sh: NEWT_NCCL_PIN does not reach image-run"
  echo "image: the CUDA image pins NCCL $pin (comm/nccl_lib.h needs $need) on CUDA $cuda"
}

if [ "$mode" = packages ]; then
  check_packages
  echo "1 passed, 0 failed"
  exit 0
fi
[ "$mode" = cpu ] || fail "unknown mode $mode"
work=${3:?work dir}
[ "$(id -u)" -eq 0 ] || fail "needs root (mmdebstrap, unshare, chroot)"
command -v mmdebstrap >/dev/null || fail "needs mmdebstrap (scripts/install-deps.sh test)"
unshare --mount true 2>/dev/null || fail "unshare --mount is not allowed here"
check_packages
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
t0=$(date +%s)
comma() { list "$1" | tr ' ' ',' | sed 's/,$//'; }
hooks=""
[ -d /usr/share/mmdebstrap/hooks/eatmydata ] && command -v eatmydata >/dev/null && hooks="--hook-dir=/usr/share/mmdebstrap/hooks/eatmydata"
# the two stages of helm/Dockerfile.cpu (debian:12-slim is Debian 12, bookworm)
mmdebstrap --quiet --mode=root --variant=essential $hooks --include="$(comma image-build)" bookworm "$work/build" \
  >"$work/build.log" 2>&1 &
b=$!
mmdebstrap --quiet --mode=root --variant=essential $hooks --include="$(comma image-run)" bookworm "$work/run" \
  >"$work/run.log" 2>&1 || { cat "$work/run.log"; fail "the runtime root filesystem (image-run) did not build"; }
wait $b || { cat "$work/build.log"; fail "the build root filesystem (image-build) did not build"; }
echo "image: root filesystems from Debian's packages in $(( $(date +%s) - t0 )) s"

# the build stage's commands, as the Dockerfile writes them (RUN cmake ... up to the line
# without a continuation), run in the build root with the tree at /src
cmds=$(awk '/^FROM /{n++} n==1 && /^RUN cmake/{on=1} on{print; if (!/\\$/) exit}' "$src/helm/Dockerfile.cpu" |
       sed 's/^RUN //')
[ -n "$cmds" ] || fail "helm/Dockerfile.cpu: no RUN cmake in its build stage"
mkdir -p "$work/build/src"
unshare --mount --fork sh -ec '
  mount --bind -o ro "$1" "$2/src"
  mount -t proc proc "$2/proc"
  chroot "$2" sh -ec "cd /src && $3"
' sh "$src" "$work/build" "$cmds" >"$work/compile.log" 2>&1 ||
  { tail -40 "$work/compile.log"; fail "newt did not build in the image's build stage"; }
echo "image: newt built in the build stage in $(( $(date +%s) - t0 )) s"
cp "$work/build/build/newt" "$work/run/usr/local/bin/newt"
rm -rf "$work/build"

# the runtime, as the chart runs it: user 65532, read-only root, tmpfs /tmp and /dev/shm
out="$work/newt-run.log"
unshare --mount --pid --fork sh -ec '
  r=$1
  mount --bind "$r" "$r"
  mount -o remount,bind,ro "$r"
  mount -t proc proc "$r/proc"
  mount -t tmpfs -o mode=1777 tmpfs "$r/tmp"
  mount -t tmpfs -o mode=1777 tmpfs "$r/dev/shm"
  chroot --userspec=65532:65532 "$r" /usr/bin/env -i HOME=/tmp PATH=/usr/local/bin:/usr/bin:/bin sh -ec "
    cd /tmp
    touch /usr/local/bin/newt 2>/dev/null && { echo the root filesystem is writable; exit 1; }
    id -u
    newt --version
    newt run --nproc 2 --steps 20 --global-batch 8 --micro-batch 2 --log-dir /tmp/run --timeout-ms 240000
    cat /tmp/run/w0.end
  "
' sh "$work/run" >"$out" 2>&1 || { tail -40 "$out"; fail "newt run --nproc 2 failed in the runtime image"; }
grep -q '^65532$' "$out" || fail "newt did not run as user 65532"
grep -q 'newt run: done: 20 steps' "$out" || { cat "$out"; fail "newt run did not finish"; }
grep -q '^done: ' "$out" || { cat "$out"; fail "no termination message"; }
echo "image: newt run --nproc 2 trained 20 steps as user 65532 on a read-only root ($(( $(date +%s) - t0 )) s in all)"
echo "1 passed, 0 failed"
