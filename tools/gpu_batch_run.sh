#!/usr/bin/env bash
# The batched decode step's checks and numbers in one device call (tools/gpu_stage.sh first): the GPU tests that
# cover it, bench_prefill's dense GEMMs at few rows (tiles and int8), and `lily bench --concurrency` under the
# kernel options given as arguments (one run each, e.g. "LILY_BATCH_GRAPH_ROWS=0 LILY_GEMM_I8=0").
#   there: bash tools/gpu_batch_run.sh .device/stage "" "LILY_BATCH_GRAPH_ROWS=0"    (logs under $OUT)
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
shift
OUT=${OUT:-/tmp/lily-gpu-out}
L=$OUT/logs
mkdir -p "$L"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
SRC_DIR=$(cat "$BIN/source_dir")
[ -e "$SRC_DIR" ] || { mkdir -p "$(dirname "$SRC_DIR")" && ln -s "$(pwd)" "$SRC_DIR"; }
mkdir -p "$(cat "$BIN/binary_dir")"
for t in ${LILY_TESTS:-test_batched test_cuda_batch test_sampling test_moe}; do
  timeout 240 "$BIN/$t" > "$L/$t.log" 2>&1
  echo "$t rc=$? $(grep -cE '^\[       OK' "$L/$t.log") ok"
  grep -E "^\[  FAILED" "$L/$t.log" | head -5
done
for n in ${LILY_PREFILL_ROWS:-16}; do
  timeout 90 "$BIN/bench_prefill" "$n" > "$L/prefill_${n}.txt" 2>&1
  grep "gemm" "$L/prefill_${n}.txt" | cut -c1-56
done
i=0
for opts in "$@"; do
  i=$((i + 1))
  echo "== concurrency [$opts]"
  env $opts timeout 240 "$BIN/lily" bench --synthetic full --concurrency "${LILY_CLIENTS:-1,4,8,16,64}" \
    --gen-tokens "${LILY_GEN:-128}" > "$L/conc_$i.txt" 2>&1
  tail -7 "$L/conc_$i.txt"
done
tar czf "$OUT/logs.tgz" -C "$OUT" logs
