#!/usr/bin/env bash
# Old and new lily binaries side by side on the GPU machine, in one call: the new binaries' GPU tests, decode
# µs/token at 0 / 4K / 32K / 128K alternating old and new (two rounds), the generation loop's prompt and decode
# times of each, and greedy ids on the golden fixtures. Logs under $OUT.
#   here:  tools/gpu_stage.sh; cp <old build>/lily .device/stage/lily_old; tar czf .device/stage.tgz -C .device stage
#   there: tar xzf .device/stage.tgz -C .device && bash tools/gpu_compare.sh .device/stage lily_old lily
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
OLD=${2:-lily_old}
NEW=${3:-lily}
OUT=${OUT:-/tmp/lily-gpu-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
SRC_DIR=$(cat "$BIN/source_dir" 2>/dev/null || echo /work/main)
if [ ! -e "$SRC_DIR" ]; then mkdir -p "$(dirname "$SRC_DIR")" && ln -s "$(pwd)" "$SRC_DIR"; fi
mkdir -p "$(cat "$BIN/binary_dir" 2>/dev/null || echo /tmp/lily-build)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
status=0
decode() {  # µs/token per context, one line
  timeout 150 "$BIN/$1" bench --synthetic full --contexts 0,4k,32k,128k --steps 128 --no-breakdown --no-loops --json \
    2>/dev/null | python3 -c 'import json,sys; print(" ".join("%.1f" % p["us_per_token"] for p in json.load(sys.stdin)["points"]))'
}
echo "== decode us/token at 0 / 4K / 32K / 128K"
for round in 1 2; do for b in "$OLD" "$NEW"; do echo "$b: $(decode "$b")" | tee -a "$OUT/decode_ab.txt"; done; done
echo "== generation loops (prompts and decode through the Backend)"
for b in "$OLD" "$NEW"; do
  timeout 240 "$BIN/$b" bench --synthetic full --contexts 0 --steps 64 --no-breakdown > "$OUT/loops_$b.txt" 2>&1
  echo "-- $b"; grep -E "prompt of|greedy|chat defaults|top-p|set up" "$OUT/loops_$b.txt"
done
echo "== greedy ids on the golden fixtures"
python3 "$(dirname "$0")/gpu_greedy_ab.py" "$SRC_DIR" "$BIN/$OLD" "$BIN/$NEW" 2>&1 | tee "$OUT/greedy_ab.txt" | tail -12 || status=1
if [ -z "${SKIP_TESTS:-}" ]; then
  for t in "$BIN"/test_*; do
    name=$(basename "$t")
    timeout "${TEST_TIMEOUT:-240}" "$t" > "$OUT/$name.log" 2>&1
    rc=$?
    echo "== $name: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$OUT/$name.log" | tr '\n' ' ')"
    [ $rc -eq 0 ] || { status=1; echo "$name FAILED (rc=$rc)"; grep -E -A2 "FAILED|Failure|exception" "$OUT/$name.log" | head -20; }
  done
fi
echo "== new: the scheduler over the CUDA batch backend (lily bench --concurrency)"
timeout 300 "$BIN/$NEW" bench --synthetic full --concurrency 1,4,8,16,64 > "$OUT/concurrency_new.txt" 2>&1
tail -7 "$OUT/concurrency_new.txt"
echo "== new: full bench (per-family breakdown, plan)"
timeout 200 "$BIN/$NEW" bench --synthetic full --no-loops > "$OUT/bench_new.txt" 2>&1
head -60 "$OUT/bench_new.txt" | grep -vE "^\s*$" | head -45
exit $status
