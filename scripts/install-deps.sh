#!/bin/sh
# Installs the Debian packages newt needs, for a profile: build, test or demo.
# Idempotent and quiet when everything is present; needs root (or sudo) only when
# something is missing. The CUDA toolkit is not a Debian package: when it is under
# /usr/local/cuda the GPU parts are built too, otherwise they are skipped.
set -eu
profile=${1:-build}

build="cmake make gcc pkg-config libcurl4-openssl-dev libcjson-dev libzstd-dev libxxhash-dev
       libopenblas-dev libssl-dev libmicrohttpd-dev etcd-server"
# chromium and a font: the report of `newt report` is checked in a real headless browser
test="$build clang libclang-rt-14-dev openssl valgrind iproute2 etcd-client yamllint nodejs npm unzip
      chromium fonts-dejavu-core"
# the demo ends by writing its report (an HTML file: any browser opens it, none is needed)
demo="$build bible-kjv"

case "$profile" in
  build) want=$build ;;
  test) want=$test ;;
  demo) want=$demo ;;
  *) echo "install-deps.sh: unknown profile '$profile' (build, test or demo)" >&2; exit 2 ;;
esac

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
$sudo apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$sudo apt-get install -y -qq --no-install-recommends $missing >/dev/null
