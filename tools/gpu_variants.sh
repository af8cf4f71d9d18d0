#!/usr/bin/env bash
# The decode step at one context under each environment switch of the CUDA path (GPU machine; the switches are
# in docs/kernel-options.md):
#   tools/gpu_variants.sh .device/stage 4k "LILY_GDN_FUSED=0" "LILY_MOE_FUSED=0" "LILY_ATTN_SPLITS=33" ...
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
shift 2
source "$(dirname "$0")/gpu_lib.sh"
echo "default: $(us) us at context $CTX"
for v in "$@"; do echo "$v: $(us $v) us"; done
