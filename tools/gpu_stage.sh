#!/usr/bin/env bash
# Copies what tools/gpu_run.sh needs into .device/stage/ (git-ignored; carried by the device tool):
# the GPU test binaries, the lily binary and the non-system shared libraries it links.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STAGE=.device/stage
rm -rf "$STAGE" && mkdir -p "$STAGE"
for b in lily test_gemv test_moe test_sampling test_mixer_kernels test_cuda_backend; do
  cp "$BUILD/$b" "$STAGE/"
done
for lib in $(ldd "$BUILD/lily" | awk '/httplib|brotli/ {print $3}'); do cp -L "$lib" "$STAGE/"; done
pwd > "$STAGE/source_dir"
du -sh "$STAGE"
