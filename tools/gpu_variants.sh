#!/usr/bin/env bash
# The decode step at one context under each environment switch of the kernels (GPU machine):
#   tools/gpu_variants.sh .device/stage 4k "LILY_PDL=0" "LILY_GEMV_BPS=1" ...
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
shift 2
source "$(dirname "$0")/gpu_lib.sh"
echo "default: $(us) us at context $CTX"
for v in "$@"; do echo "$v: $(us $v) us"; done
