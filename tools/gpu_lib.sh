# Shared by the GPU-machine benchmark scripts (gpu_ab.sh, gpu_marginal.sh, gpu_variants.sh); source it after
# setting BIN (the staged binaries, tools/gpu_stage.sh) and CTX (a context for `lily bench --contexts`).
export LD_LIBRARY_PATH="$BIN:${LD_LIBRARY_PATH:-}"
# us [VAR=value ...]: µs per token of `$BIN/${LILY:-lily} bench --synthetic full` at $CTX (64 steps), with the
# given environment (killed after 120 s: a hung variant must not eat the device call).
us() {
  timeout 120 env "$@" "$BIN/${LILY:-lily}" bench --synthetic full --contexts "$CTX" --steps 64 --no-breakdown --no-loops \
    --json 2>/dev/null |
    python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["points"][0]["us_per_token"])'
}
