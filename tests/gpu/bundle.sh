#!/usr/bin/env bash
# The GPU check's bundle: everything tests/gpu/run.sh needs that a GPU machine's image lacks,
# built on this machine (Debian 12 with the CUDA toolkit) and carried there (docs/model.md,
# "The GPU check on a machine without network").
#
#   tests/gpu/bundle.sh DIR [BUILD]     (DIR: e.g. gpu-bundle, git-ignored)
#
# 1. builds newt for sm_90 with -DNEWT_CUDA=ON -DNEWT_WERROR=ON in BUILD (default
#    build-gpu-bundle), the targets the check runs: newt, test_comm_nccl, test_kernels, and
#    libnewt.so with the Python package (the PyTorch step). An
#    existing BUILD is used as it is when its cache holds those settings (CUDA found, warnings
#    as errors, sm_90 among its architectures, no sanitizer, not the test double); a BUILD
#    named on the command line with other settings is refused, the default one reconfigured;
# 2. gathers into a staging tree: bin/ (the binaries, debug sections stripped, and the etcd
#    `newt run` starts), python/newt (the package), lib/ (libnewt.so.0 and every shared
#    library they load, found with ldd, but libc's, the
#    CUDA driver's, cuBLAS's and NCCL's: the GPU machine's own, run.sh finds them there);
# 3. writes DIR/newt-gpu-bundle.tar.xz (the staging tree; xz, which GNU tar and Python's
#    tarfile both read) and DIR/MANIFEST.txt (what the bundle was built from, the newest
#    glibc symbol version it needs, and every file with its size and sha256);
# 4. prints the bundle's size and fails when it is 48 MiB or more (the carried working tree
#    and the bundle together must stay under the device tool's 64 MiB).
#
# The data of the check is newt's generated corpus (no file). tests/gpu/bundle_test.sh (the
# suite's gpu_bundle) proves the bundle self-contained: unpacked into a minimal Debian root
# without newt's library packages, only the CUDA driver, cuBLAS and NCCL are left unresolved.
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=${1:?usage: tests/gpu/bundle.sh DIR [BUILD]}
BUILD=${2:-build-gpu-bundle}
named_build=$([ -n "${2:-}" ] && echo 1 || echo 0)
MAX_BYTES=$((48 * 1024 * 1024))
TARGETS=(newt test_comm_nccl test_kernels newt_shared newt_python)
say() { echo "bundle: $*"; }
fail() { echo "bundle: $*" >&2; exit 1; }

# --- 1. the build ---------------------------------------------------------------------------
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -n 1; }
cache_ok() { # why the build in $BUILD is not the bundle's, or nothing
  [ -f "$BUILD/CMakeCache.txt" ] || { echo "no CMakeCache.txt"; return; }
  local cuda arch
  cuda=$(cache_value NEWT_CUDA)
  [ "$cuda" != OFF ] || { echo "NEWT_CUDA=OFF"; return; }
  [ "$(cache_value NEWT_CUDA_BUILT)" = ON ] || { echo "its CUDA parts are not built"; return; }
  [ "$(cache_value NEWT_WERROR)" = ON ] || { echo "NEWT_WERROR is not ON"; return; }
  arch=$(cache_value NEWT_CUDA_ARCH)
  case ";$arch;" in *";90;"* | *";90-real;"* | *";90a;"*) ;; *) echo "NEWT_CUDA_ARCH=$arch has no sm_90"; return ;; esac
  [ -z "$(cache_value NEWT_SANITIZE)" ] || { echo "built with sanitizers"; return; }
  [ "$(cache_value NEWT_GPU_DOUBLE)" != ON ] || { echo "the test double's build"; return; }
}
why=$(cache_ok)
if [ -n "$why" ]; then
  [ "$named_build" = 0 ] || [ ! -f "$BUILD/CMakeCache.txt" ] ||
    fail "$BUILD is not a build for the bundle ($why): name another directory, or none"
  say "configuring $BUILD (-DNEWT_CUDA=ON -DNEWT_WERROR=ON -DNEWT_CUDA_ARCH=90)"
  mkdir -p "$BUILD"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEWT_CUDA=ON -DNEWT_WERROR=ON -DNEWT_CUDA_ARCH=90 \
    -DNEWT_SANITIZE= -DNEWT_GPU_DOUBLE=OFF >"$BUILD/bundle-configure.log" 2>&1 ||
    { tail -n 20 "$BUILD/bundle-configure.log"; fail "cmake could not configure $BUILD (the CUDA toolkit with NCCL's header is needed)"; }
else
  say "using the build in $BUILD (CUDA, warnings as errors, sm_90)"
fi
cmake --build "$BUILD" -j "$(nproc)" --target "${TARGETS[@]}" -- --no-print-directory >"$BUILD/bundle-build.log" 2>&1 ||
  { tail -n 30 "$BUILD/bundle-build.log"; fail "the build of ${TARGETS[*]} in $BUILD failed"; }
newt_bin=$BUILD/newt
bins=("$newt_bin" "$BUILD/tests/comm/test_comm_nccl" "$BUILD/tests/gpu/test_kernels")
for b in "${bins[@]}"; do [ -x "$b" ] || fail "$b was not built"; done
libnewt=$BUILD/lib/libnewt.so.0 # and the Python package over it (tests/gpu/torch.sh)
[ -e "$libnewt" ] && [ -f "$BUILD/python/newt/__init__.py" ] || fail "libnewt.so.0 or the Python package was not built"
etcd_bin=${NEWT_ETCD_BIN:-$(command -v etcd || true)}
[ -n "$etcd_bin" ] && [ -x "$etcd_bin" ] || fail "no etcd to bundle (install etcd-server: scripts/install-deps.sh build)"

# --- 2. the staging tree ------------------------------------------------------------------------
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for b in "${bins[@]}"; do
  cp "$b" "$stage/bin/"
  strip --strip-debug "$stage/bin/$(basename "$b")"
done
cp -L "$etcd_bin" "$stage/bin/etcd"
cp -L "$libnewt" "$stage/lib/libnewt.so.0"
strip --strip-debug "$stage/lib/libnewt.so.0"
mkdir -p "$stage/python/newt"
cp "$BUILD"/python/newt/*.py "$stage/python/newt/"

# the GPU machine's own: libc (glibc's libraries and the loader), the CUDA driver, cuBLAS, NCCL
host_own() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
      libresolv.so.* | libutil.so.* | libanl.so.* | libnsl.so.*) return 0 ;;
    libcuda.so.* | libnvidia-*.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.*) return 0 ;;
  esac
  return 1
}
for b in "${bins[@]}" "$libnewt"; do
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    host_own "$name" && continue
    [ "$path" != "not" ] || fail "$(basename "$b") needs $name, which this machine cannot find (ldd)"
    [ -e "$stage/lib/$name" ] || cp -L "$path" "$stage/lib/$name"
  done < <(ldd "$b")
done

# --- 3. the manifest and the archive ---------------------------------------------------------
mkdir -p "$DIR"
rm -f "$DIR/newt-gpu-bundle.tar.xz" "$DIR/MANIFEST.txt"
glibc=$(for f in "$stage"/bin/* "$stage"/lib/*; do objdump -T "$f" 2>/dev/null; done |
        grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n 1)
commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain 2>/dev/null | grep -qv '^??' && echo ", with uncommitted changes" || true)
{
  echo "newt GPU bundle: tests/gpu/bundle.sh; tests/gpu/run.sh runs it (NEWT_GPU_BUNDLE=DIR)"
  echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), commit $commit$dirty"
  echo "version: $("$newt_bin" --version)"
  echo "glibc: $glibc"
  echo "host libraries: libc, the CUDA driver (libcuda.so.1), cuBLAS (libcublas.so.13), NCCL (libnccl.so.2)"
  echo "files:"
  (cd "$stage" && find . -type f | sort | while read -r f; do
    printf '  %s %s %s\n' "${f#./}" "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -d' ' -f1)"
  done)
} >"$DIR/MANIFEST.txt"
cp "$DIR/MANIFEST.txt" "$stage/MANIFEST.txt"
tar -C "$stage" -cf - . | xz -6 -T0 >"$DIR/newt-gpu-bundle.tar.xz"

# --- 4. the size -------------------------------------------------------------------------------
bytes=$(du -cb "$DIR/newt-gpu-bundle.tar.xz" "$DIR/MANIFEST.txt" | tail -n 1 | cut -f1)
unpacked=$(du -sb "$stage" | cut -f1)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
say "$DIR: $(mib "$bytes") ($(find "$stage" -type f | wc -l) files, $(mib "$unpacked") unpacked; needs glibc $glibc)"
[ "$bytes" -lt "$MAX_BYTES" ] || fail "$DIR is $(mib "$bytes"): over the 48 MiB a bundle may take"
