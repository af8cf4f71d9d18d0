#!/usr/bin/env bash
# A/B of lily binaries on the GPU machine: alternating `lily bench --synthetic full` runs at one context
# (3 rounds), so machine-to-machine differences between device calls cancel out.
#   here:  tools/gpu_stage.sh; cp <other build>/lily .device/stage/lily_base; tar czf .device/stage.tgz -C .device stage
#   there: CTX=4k tools/gpu_ab.sh .device/stage lily_base lily
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
shift
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
us() { "$BIN/$1" bench --synthetic full --contexts "${CTX:-4k}" --steps 64 --no-breakdown --json 2>/dev/null |
       python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["points"][0]["us_per_token"])'; }
for round in 1 2 3; do for b in "$@"; do echo "$b: $(us "$b") us/token at ${CTX:-4k}"; done; done
