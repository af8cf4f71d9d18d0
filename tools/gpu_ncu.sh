#!/usr/bin/env bash
# Per-kernel times of one decode step on the GPU machine (ncu, one metric pass, clocks left alone):
#   tools/gpu_ncu.sh .device/stage 4k   -> $OUT/ncu_<ctx>.csv and a summary (tools/ncu_summary.py)
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
OUT=${OUT:-/tmp/lily-gpu-out}
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
timeout 400 "$NCU" --clock-control none --metrics gpu__time_duration.sum,launch__grid_size --csv --page raw \
  "$BIN/lily" bench --synthetic full --contexts "$CTX" --steps 1 --no-breakdown > "$OUT/ncu_$CTX.csv" 2> "$OUT/ncu_$CTX.err"
python3 "$(dirname "$0")/ncu_summary.py" "$OUT/ncu_$CTX.csv" | tee "$OUT/ncu_$CTX.txt"
