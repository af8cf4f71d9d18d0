#!/usr/bin/env bash
# Marginal cost of each kernel family in the captured decode step (GPU machine): the decode benchmark at one
# context with the family left out of the graph (LILY_SKIP), against the full step. The skipped step computes
# garbage; only its time matters.
#   tools/gpu_marginal.sh .device/stage 4k
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
us() { "$BIN/lily" bench --synthetic full --contexts "$CTX" --steps 64 --no-breakdown --json 2>/dev/null |
       python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["points"][0]["us_per_token"])'; }
full=$(us)
echo "full step at context $CTX: $full us"
for f in gdn gdn_in_proj gdn_core gdn_out_proj attn_in_proj attn_qk_rope attn_core attn_out_proj moe lm_head; do
  t=$(LILY_SKIP=$f us)
  python3 -c "print('%-14s %8s us without  -> marginal %7.1f us' % ('$f', '$t', $full - $t))"
done
