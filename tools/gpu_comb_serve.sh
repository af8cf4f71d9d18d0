#!/usr/bin/env bash
# lily serve over HTTP (tools/gpu_serve.sh, full-size random 4-bit checkpoint): the prompt options off (A) and on
# (B: prompt lengths to 128K, cancel during a 32K prompt; C: --max-seqs 64 concurrency). Logs -> $OUT/logs.tgz
set -uo pipefail
B=$(cd "$1" && pwd); shift
OPTS="$*"
L=/tmp/logs; mkdir -p $L/A $L/B $L/C
trap 'tar czf $OUT/logs.tgz -C /tmp logs' EXIT
T0=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total,driver_version --format=csv | tee $L/gpu.txt
echo "== synth"; export LD_LIBRARY_PATH=$B; mkdir -p /tmp/lily-synth/serve
timeout 300 $B/lily synth --out /tmp/lily-synth/serve --preset full --layout mlx-4bit --seed 11 > $L/synth.txt 2>&1 && touch /tmp/lily-synth/serve/.synth-done
echo "synth rc=$? t=$(( $(date +%s) - T0 ))s"
echo "== A: options off"; LILY_SERVE_CTX=40000 LILY_PROMPT_LENGTHS=1024,8192,32768 LILY_CLIENTS=1 LILY_CLIENTS_ONLY=1 \
  timeout 200 bash tools/gpu_serve.sh $B $L/A > $L/A/run.txt 2>&1; grep -E "prompt of|ready|clients" $L/A/run.txt
echo "t=$(( $(date +%s) - T0 ))s"
echo "== B: $OPTS"; env $OPTS LILY_SERVE_CTX=140000 LILY_PROMPT_LENGTHS=1024,8192,32768,131072 LILY_CANCEL_PROMPT=32768 \
  LILY_CLIENTS=1 LILY_CLIENTS_ONLY=1 timeout 200 bash tools/gpu_serve.sh $B $L/B > $L/B/run.txt 2>&1; grep -E "prompt of|ready|cancel|clients" $L/B/run.txt
echo "t=$(( $(date +%s) - T0 ))s"
echo "== C: $OPTS --max-seqs 64"; env $OPTS LILY_SERVE_ARGS="--max-seqs 64" LILY_CLIENTS=1,4,8,16,64 LILY_CLIENTS_ONLY=1 \
  timeout 150 bash tools/gpu_serve.sh $B $L/C > $L/C/run.txt 2>&1; grep -E "ready|clients" $L/C/run.txt
echo "t=$(( $(date +%s) - T0 ))s"
