#!/usr/bin/env bash
# Per-kernel times and DRAM bytes of one decode step, or of one batched decode pass, on the GPU machine (ncu, one
# metric pass, clocks left alone):
#   tools/gpu_ncu.sh .device/stage 4k       one decode step at that context  -> $OUT/ncu_4k.csv, ncu_4k.txt
#   tools/gpu_ncu.sh .device/stage rows:8   a pass of 8 one-token rows (lily bench --concurrency 8), after the
#                                           prompts and warm-up                -> $OUT/ncu_rows8.csv, ncu_rows8.txt
# The summary (tools/ncu_summary.py) takes one whole step or pass: the launches from an embedding to the next.
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
WHAT=${2:-4k}
OUT=${OUT:-/tmp/lily-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
METRICS=gpu__time_duration.sum,launch__grid_size,dram__bytes_read.sum,dram__bytes_write.sum
if [[ $WHAT == rows:* ]]; then
  N=${WHAT#rows:}
  TAG=rows$N
  # ~500 launches a pass: skip the prompts' passes and the first decode passes, then take about two passes
  CMD=(--launch-skip 4000 --launch-count 1100 "$BIN/lily" bench --synthetic full --concurrency "$N" --gen-tokens 48)
else
  TAG=$WHAT
  CMD=("$BIN/lily" bench --synthetic full --contexts "$WHAT" --steps 1 --no-breakdown)
fi
timeout 400 "$NCU" --clock-control none --metrics "$METRICS" --csv --page raw "${CMD[@]}" > "$OUT/ncu_$TAG.csv" \
  2> "$OUT/ncu_$TAG.err"
python3 "$(dirname "$0")/ncu_summary.py" "$OUT/ncu_$TAG.csv" | tee "$OUT/ncu_$TAG.txt"
