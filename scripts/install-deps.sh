#!/bin/sh
# Installs the Debian packages newt needs, for a profile. The lists below are the one
# source of them: the host's build, the tests and the demo, and both images
# (helm/Dockerfile.cpu and helm/Dockerfile run this script in each stage;
# tests/image/image.sh builds the CPU image's root filesystems from the same lists).
#
#   install-deps.sh PROFILE          install what is missing (quiet when nothing is)
#   install-deps.sh --list PROFILE   print the profile's packages, one a line
#
# Profiles: build (this host), test, demo, image-build (an image's build stage),
# image-run (an image's runtime: newt, and etcd for `newt run` and the auth bootstrap).
# Idempotent; needs root (or sudo) only when something is missing. The CUDA toolkit is
# not a Debian package: when it is under /usr/local/cuda the GPU parts are built too,
# otherwise they are skipped (the CUDA image's base brings it). NEWT_NCCL_PIN (the CUDA
# image sets it, e.g. 2.28.9-1+cuda13.0) adds NCCL at that version from NVIDIA's apt
# repository of the CUDA base to image-build (libnccl2, libnccl-dev) and image-run
# (libnccl2): the NCCL backend needs 2.28.7 or newer, which a CUDA base may not carry.
set -eu
list=0
if [ "${1:-}" = "--list" ]; then list=1; shift; fi
profile=${1:-build}

# what compiles newt (CMakeLists.txt: every find_package and pkg_check_modules)
image_build="cmake make gcc libc6-dev pkg-config libcurl4-openssl-dev libcjson-dev libzstd-dev
             libxxhash-dev libopenblas-dev libssl-dev libmicrohttpd-dev"
# what newt links at run time, etcd for `newt run` and etcdctl for the auth bootstrap
image_run="ca-certificates libcurl4 libcjson1 libzstd1 libxxhash0 libopenblas0 libgomp1 libssl3
           libmicrohttpd12 etcd-server etcd-client"
build="$image_build etcd-server"
# chromium and a font: the report of `newt report` is checked in a real headless browser;
# prometheus: promtool checks the metrics and the chart's alert rules; mmdebstrap and
# eatmydata: the CPU image's root filesystems are built from these lists (tests/image);
# python3-torch, python3-numpy: the Python package's tests and examples/torch (with
# libopenblas0-pthread, without which Debian's torch falls back to the reference BLAS)
test="$build clang libclang-rt-14-dev openssl valgrind iproute2 etcd-client yamllint nodejs npm unzip
      chromium fonts-dejavu-core prometheus mmdebstrap eatmydata python3-torch python3-numpy libopenblas0-pthread"
# the demo ends by writing its report (an HTML file: any browser opens it, none is needed)
demo="$build bible-kjv"

case "$profile" in
  build) want=$build ;;
  test) want=$test ;;
  demo) want=$demo ;;
  image-build) want=$image_build ;;
  image-run) want=$image_run ;;
  *) echo "install-deps.sh: unknown profile '$profile' (build, test, demo, image-build, image-run)" >&2; exit 2 ;;
esac

pin=${NEWT_NCCL_PIN:-}
if [ -n "$pin" ]; then
  case "$profile" in
    image-build) want="$want libnccl2=$pin libnccl-dev=$pin" ;;
    image-run) want="$want libnccl2=$pin" ;;
  esac
fi

if [ "$list" -eq 1 ]; then
  for p in $want; do echo "$p"; done
  exit 0
fi

missing=""
for p in $want; do
  case "$p" in
    nodejs|npm) command -v "$p" >/dev/null 2>&1 && continue ;; # a newer Node.js may be installed outside apt
  esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -eq 0 ]; then sudo=""
elif command -v sudo >/dev/null 2>&1; then sudo="sudo"
else
  echo "newt needs these Debian packages:$missing" >&2
  echo "install them as root: apt-get install -y$missing" >&2
  exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
# no daemon starts at install time (prometheus, etcd): the tests start what they need
policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
  policy=/usr/sbin/policy-rc.d
  printf '#!/bin/sh\nexit 101\n' | $sudo tee $policy >/dev/null && $sudo chmod 0755 $policy
fi
$sudo apt-get update -qq >/dev/null
# (a pinned NCCL may replace the base's, which CUDA images hold)
held=""
if [ -n "$pin" ]; then held="--allow-downgrades --allow-change-held-packages"; fi
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $held $missing >/dev/null
if [ -n "$policy" ]; then $sudo rm -f "$policy"; fi
