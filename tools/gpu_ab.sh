#!/usr/bin/env bash
# A/B of lily binaries on the GPU machine: alternating `lily bench --synthetic full` runs at one context
# (3 rounds), so machine-to-machine differences between device calls cancel out.
#   here:  tools/gpu_stage.sh; cp <other build>/lily .device/stage/lily_base; tar czf .device/stage.tgz -C .device stage
#   there: CTX=4k tools/gpu_ab.sh .device/stage lily_base lily
set -uo pipefail
BIN=$(cd "${1:-.device/stage}" && pwd)
CTX=${CTX:-4k}
shift
source "$(dirname "$0")/gpu_lib.sh"
for round in 1 2 3; do for b in "$@"; do echo "$b: $(LILY=$b us) us/token at $CTX"; done; done
