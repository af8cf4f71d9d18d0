#!/usr/bin/env bash
# The decode step at one context under each environment switch of the kernels (GPU machine):
#   tools/gpu_variants.sh .device/stage 4k "LILY_PDL=0" "LILY_GEMV_BPS=1" ...
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${2:-4k}
shift 2
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
us() { "$BIN/lily" bench --synthetic full --contexts "$CTX" --steps 64 --no-breakdown --json 2>/dev/null |
       python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["points"][0]["us_per_token"])'; }
echo "default: $(us) us at context $CTX"
for v in "$@"; do echo "$v: $(env $v "$BIN/lily" bench --synthetic full --contexts "$CTX" --steps 64 --no-breakdown --json 2>/dev/null |
       python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["points"][0]["us_per_token"])') us"; done
