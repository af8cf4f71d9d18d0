#!/usr/bin/env bash
# `lily serve` on the GPU machine with a full-size random-weight checkpoint: `lily synth` writes the MLX 4-bit
# layout (~19.5 GB), the Qwen3 tokenizer and the Qwen3.6 chat template staged by tools/gpu_stage.sh are copied
# next to it, the server starts on the CUDA backend, and tools/gpu_serve_client.py drives the HTTP API.
# Usage (after tools/gpu_stage.sh): bash tools/gpu_serve.sh .device/stage [OUTDIR]
# Environment: LILY_SERVE_CTX (--ctx), LILY_SERVE_ARGS (more serve flags, e.g. "--max-seqs 16"), and the client's
# LILY_PROMPT_LENGTHS (prompt times), LILY_GAP_PROMPT (a stream's worst gap while a prompt of that many tokens is
# processed), LILY_CANCEL_PROMPT (a client dropping its request during a prompt of that many tokens: time until
# the server stops it, /health and /metrics meanwhile), LILY_CLIENTS (e.g. 1,4,8,16,64: concurrent clients' tok/s),
# LILY_CLIENTS_ONLY, LILY_QUICK (stop after
# the json_schema ratio).
set -euo pipefail
BIN=$(cd "$1" && pwd)
OUT=${2:-${OUT:-/tmp}}
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
DIR=${LILY_SYNTH_DIR:-/tmp/lily-synth}/serve
[ -f "$BIN/tokenizer.json" ] || { echo "no tokenizer in $BIN (tools/gpu_stage.sh copies it after scripts/setup.sh)"; exit 1; }
if [ ! -f "$DIR/.synth-done" ]; then
  "$BIN/lily" synth --out "$DIR" --preset full --layout mlx-4bit --seed 11
  touch "$DIR/.synth-done"
fi
cp "$BIN/tokenizer.json" "$BIN/tokenizer_config.json" "$BIN/chat_template.jinja" "$DIR/"
PORT=18080
"$BIN/lily" serve --model "$DIR" --device cuda --port $PORT --ctx ${LILY_SERVE_CTX:-16384} ${LILY_SERVE_ARGS:-} > "$OUT/serve.log" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true' EXIT
python3 "$(dirname "$0")/gpu_serve_client.py" "http://127.0.0.1:$PORT" 2>&1 | tee "$OUT/serve_client.txt"
kill -TERM $PID
wait $PID || echo "lily serve exited with $?"
tr '\r' '\n' < "$OUT/serve.log" | grep -v "^loading weights" | tail -30
