#!/usr/bin/env bash
# Marginal cost of each kernel family in the captured decode step (GPU machine): the decode benchmark at one
# context with the family left out of the graph (LILY_SKIP), against the full step. The skipped step computes
# garbage; only its time matters.
#   tools/gpu_marginal.sh .device/stage 4k
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
source "$(dirname "$0")/gpu_lib.sh"
full=$(us)
echo "full step at context $CTX: $full us"
# the families of the default step (gdn_in_proj / gdn_core / gdn_out_proj exist only with LILY_GDN_FUSED=0)
for f in gdn attn_in_proj attn_core attn_out_proj moe lm_head; do
  t=$(us LILY_SKIP=$f)
  python3 -c "print('%-14s %8s us without  -> marginal %7.1f us' % ('$f', '$t', $full - $t))"
done
