#!/usr/bin/env bash
# Copies what tools/gpu_run.sh needs into .device/stage/ (git-ignored; carried by the device tool):
# the GPU test binaries, the lily binary and the non-system shared libraries it links.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STAGE=.device/stage
rm -rf "$STAGE" && mkdir -p "$STAGE"
for b in lily test_gemv test_moe test_sampling test_mixer_kernels test_cuda_backend test_gdn_fused bench_kernels; do
  cp "$BUILD/$b" "$STAGE/"
done
strip "$STAGE"/* 2>/dev/null || true
for lib in $(ldd "$BUILD/lily" | awk '/httplib|brotli/ {print $3}'); do cp -L "$lib" "$STAGE/"; done
# the tests look for fixtures in the source tree and write into the build tree they were configured with
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" > "$STAGE/source_dir"
(cd "$BUILD" && pwd) > "$STAGE/binary_dir"
du -sh "$STAGE"
