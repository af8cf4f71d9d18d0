#!/usr/bin/env bash
# wip/comb (main + wip/prompt-f16 + wip/batch-pass + the chunked GDN + the CUDA prompt stop + the few-token GEMM)
# on the GPU machine: the new kernels' tests first, bench_prefill old vs new at 2048, 16 and 4 tokens, `lily
# bench --prompts` with the options off / on, concurrency (default, few-token GEMMs in passes only, passes only),
# the combination's precision bound, then the older tests; each step within what is left of BUDGET seconds. Logs -> $OUT/logs.tgz. There: tar xzf .device/stage-comb.tgz -C .device &&
# BUDGET=520 bash tools/gpu_comb_run.sh .device/stage-comb
set -uo pipefail
T0=$(date +%s); BUDGET=${BUDGET:-540}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
B=$(cd "$1" && pwd); L=/tmp/logs; mkdir -p $L
export LD_LIBRARY_PATH=$B
SRC=$(cat $B/source_dir); [ -e "$SRC" ] || { mkdir -p "$(dirname "$SRC")" && ln -s "$(pwd)" "$SRC"; }
mkdir -p "$(cat $B/binary_dir)"
finish() { tar czf $OUT/logs.tgz -C /tmp logs; }
trap finish EXIT
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,memory.total,driver_version --format=csv > $L/gpu.txt; cat $L/gpu.txt
step() { # name timeout cmd...
  local n=$1 to=$2; shift 2
  local l=$(left); [ $l -lt 15 ] && { echo "SKIP $n (budget)"; return; }
  [ $to -gt $l ] && to=$l
  local s=$(date +%s); timeout $to "$@" > $L/$n.log 2>&1; local rc=$?
  echo "== $n rc=$rc $(( $(date +%s) - s ))s $(grep -cE '^\[       OK' $L/$n.log) ok $(grep -E '^\[  (PASSED|FAILED) ' $L/$n.log | tail -1)"
  grep -E "^\[  FAILED|Failure|vs decode|median|top-1" $L/$n.log | head -8
}
for t in test_gdn_wy test_gemm_rows; do step $t 120 $B/$t; done
step prefill_plain 60 $B/bench_prefill 2048
step prefill_new 60 $B/bench_prefill 2048 f16 attn1 wy
for f in plain new; do grep " us " $L/prefill_$f.log | cut -c1-75 | sed "s/^/$f: /"; done
pr() { python3 -c 'import json,sys; t=open(sys.argv[1]).read(); d=json.JSONDecoder().raw_decode(t[t.index("{"):])[0]; [print("%7d tokens %9.1f ms %8.0f tok/s  gemm %.0f TFLOP/s" % (p["tokens"], p["ttft_ms"], p["tok_per_s"], p["gemm_tflops"])) for p in d["points"]]' $1; }
step prompts_plain 90 $B/lily bench --synthetic full --prompts 1k,8k,32k --json; pr $L/prompts_plain.log
step prompts_all 90 env LILY_GDN_WY=1 LILY_PROMPT_F16=1 LILY_PROMPT_ATTN_1TERM=1 $B/lily bench --synthetic full --prompts 1k,8k,32k --json; pr $L/prompts_all.log
for r in 16 4; do
  step prefill${r}_split 40 $B/bench_prefill $r split
  step prefill${r}_rows 40 $B/bench_prefill $r rows
  for f in split rows; do grep " us " $L/prefill${r}_$f.log | grep -v "attention\|gdn" | cut -c1-62 | sed "s/^/$r $f: /"; done
done
step prompts_small 60 $B/lily bench --synthetic full --prompts 16,64; grep -A22 "^16 tokens" $L/prompts_small.log | head -24
cc() { step $1 120 env $2 $B/lily bench --synthetic full --concurrency 1,4,8,16,64 --gen-tokens 128; tail -7 $L/$1.log; }
cc conc_default ""
cc conc_rows "LILY_GEMM_ROWS=1 LILY_BATCH_GRAPH_ROWS=0"
cc conc_passonly "LILY_BATCH_GRAPH_ROWS=0"
for v in pass rows; do
  e="LILY_BATCH_GRAPH_ROWS=0"; [ $v = rows ] && e="$e LILY_GEMM_ROWS=1"
  step prof_$v 90 env $e $B/lily bench --synthetic full --concurrency 4,16,64 --gen-tokens 32 --profile-steps 4
  grep -E "clients, |^  (gemm|gdn|attn|norm|rout|comb|lm_h|host|embed|\(all)" $L/prof_$v.log | cut -c1-70 | sed "s/^/$v: /"
done
step test_gemm_f16 90 $B/test_gemm_f16
step all_full_step 150 env LILY_GDN_WY=1 LILY_PROMPT_F16=1 LILY_PROMPT_ATTN_1TERM=1 $B/test_full_step
for t in test_mixer_kernels test_batched test_cuda_batch test_full_step; do step $t 150 $B/$t; done
step prompts_f16 90 env LILY_PROMPT_F16=1 $B/lily bench --synthetic full --prompts 1k,8k,32k --json; pr $L/prompts_f16.log
step prompts_wy 90 env LILY_GDN_WY=1 $B/lily bench --synthetic full --prompts 1k,8k,32k --json; pr $L/prompts_wy.log
cc conc_nopass "LILY_BATCH_PASS_GRAPHS=0"
for t in test_cuda_backend test_moe test_gdn_fused test_gemv test_sampling; do step $t 100 $B/$t; done
step prompts_all_128k 120 env LILY_GDN_WY=1 LILY_PROMPT_F16=1 LILY_PROMPT_ATTN_1TERM=1 $B/lily bench --synthetic full --prompts 128k --json; pr $L/prompts_all_128k.log
echo "total $(( $(date +%s) - T0 ))s"
