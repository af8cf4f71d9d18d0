#!/usr/bin/env bash
# Runs lily's GPU tests and the decode benchmark on the GPU machine (the device tool), from a folder of
# binaries built here (static cudart, static libstdc++) plus the shared libraries they need.
#   here:  tools/gpu_stage.sh            -> .device/stage/ (binaries + libcpp-httplib and its deps)
#   there: tools/gpu_run.sh .device/stage   (logs and bench JSON under $OUT)
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
OUT=${OUT:-/tmp/lily-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
# The tests find their fixtures under the source directory they were built from (LILY_SOURCE_DIR).
SRC_DIR=$(cat "$BIN/source_dir" 2>/dev/null || echo /work/main)
if [ ! -e "$SRC_DIR" ]; then mkdir -p "$(dirname "$SRC_DIR")" && ln -s "$(pwd)" "$SRC_DIR"; fi
BIN_DIR=$(cat "$BIN/binary_dir" 2>/dev/null || echo /tmp/lily-build)
mkdir -p "$BIN_DIR"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
for t in "$BIN"/test_*; do
  name=$(basename "$t")
  echo "== $name"
  timeout "${TEST_TIMEOUT:-240}" "$t" > "$OUT/$name.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED) |tests? ran" "$OUT/$name.log" | tail -4
  [ $rc -eq 0 ] || { status=1; echo "$name FAILED (rc=$rc)"; grep -E -A2 "FAILED|Failure|error|exception" "$OUT/$name.log" | head -40; }
done
echo "== LILY_CUDA_SYNC=1: the debug switch (a sync after every launch, none inside graph captures)"
LILY_CUDA_SYNC=1 timeout 240 "$BIN/test_cuda_backend" > "$OUT/debug_sync.log" 2>&1 || { status=1; echo "debug sync FAILED"; grep -E -A3 "FAILED|error" "$OUT/debug_sync.log" | head -20; }
grep -E "^\[  (PASSED|FAILED) " "$OUT/debug_sync.log" | tail -2
echo "== lily bench --synthetic full"
timeout 200 "$BIN/lily" bench --synthetic full 2>&1 | tee "$OUT/bench.txt" | tail -40
timeout 120 "$BIN/lily" bench --synthetic full --json --no-breakdown > "$OUT/bench.json" 2>"$OUT/bench_json.err"
echo "== lily bench --synthetic full --prompts (the server's loop, time per kernel family)"
timeout 240 "$BIN/lily" bench --synthetic full --prompts "${LILY_PROMPTS:-1k,8k,32k}" --json \
  > "$OUT/prompts.json" 2>"$OUT/prompts.err" || { status=1; tail -5 "$OUT/prompts.err"; }
python3 -c 'import json,sys; [print("%7d tokens %9.1f ms %8.0f tok/s  gemm %.0f TFLOP/s" % (p["tokens"], p["ttft_ms"], p["tok_per_s"], p["gemm_tflops"])) for p in json.load(open(sys.argv[1]))["points"]]' "$OUT/prompts.json" || true
exit $status
