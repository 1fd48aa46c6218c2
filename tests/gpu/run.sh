#!/bin/sh
# Every GPU check in one go, on a machine with an NVIDIA GPU: builds with the CUDA parts
# required (NEWT_CUDA=ON) and runs the tests labelled "gpu" (which `make test` leaves out,
# since CI has no GPU). Output goes to the terminal and, when OUT is set, to $OUT/gpu.log.
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build-gpu}
log=${OUT:-/tmp}/gpu.log
nvidia-smi -L || { echo "tests/gpu/run.sh: no NVIDIA GPU visible" >&2; exit 1; }
scripts/install-deps.sh build
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNEWT_CUDA=ON >/dev/null
cmake --build "$BUILD" -j "$(nproc)" -- --no-print-directory 2>&1 | tail -n 20
cd "$BUILD"
ctest -L gpu --output-on-failure --timeout 600 2>&1 | tee "$log"
