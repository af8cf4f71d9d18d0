#!/usr/bin/env bash
# Load time of a full-size checkpoint on the GPU machine (no real checkpoint is reachable there): writes a
# random full-size MLX 4-bit checkpoint with `lily synth` (~19.5 GB; it stays in the page cache), then runs
# `lily bench --model` on it twice (the load line: open + upload + repack, then decode at the given contexts),
# and a 4-layer bf16 (HF layout) checkpoint through the bf16 path. Usage (after tools/gpu_stage.sh):
#   bash tools/gpu_load.sh .device/stage [OUTDIR]
set -euo pipefail
BIN=$(cd "$1" && pwd)
OUT=${2:-${OUT:-/tmp}}
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
DIR=${LILY_SYNTH_DIR:-/tmp/lily-synth}
mkdir -p "$DIR"
df -h "$DIR" | tail -1
free -g | head -2

echo "== synth full mlx-4bit"
"$BIN/lily" synth --out "$DIR/q4" --preset full --layout mlx-4bit --seed 7
du -sh "$DIR/q4"
for i in 1 2; do
  echo "== bench --model (run $i)"
  "$BIN/lily" bench --model "$DIR/q4" --contexts 0,4096 --steps 128 --no-breakdown $([ $i = 2 ] && echo --no-loops) \
    2>&1 | tr '\r' '\n' | grep -v "^loading weights" | tee "$OUT/load_q4_$i.txt"
done
rm -rf "$DIR/q4"

echo "== synth full hf-bf16, 4 layers"
"$BIN/lily" synth --out "$DIR/bf16" --preset full --layout hf-bf16 --layers 4 --seed 7
du -sh "$DIR/bf16"
"$BIN/lily" bench --model "$DIR/bf16" --contexts 0 --steps 64 --no-breakdown --no-loops 2>&1 | tr '\r' '\n' |
  grep -v "^loading weights" | tee "$OUT/load_bf16.txt"
rm -rf "$DIR/bf16"
