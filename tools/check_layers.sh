#!/usr/bin/env bash
# Checks that every `#include "..."` under src/ follows the layer order (docs/architecture.md):
#   cli → server → runtime → model → kernels → util, with tokenizer, chat and grammar beside runtime.
# An area may include itself and the areas listed for it below, nothing else; there are no exceptions.
# Usage: tools/check_layers.sh [repo-root]. Exit 1 on any violation.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

# The areas each area may include besides itself.
declare -A may=(
  [util]=""
  [kernels]="util"
  [model]="kernels util"
  [runtime]="model kernels util"
  [tokenizer]="util"
  [chat]="tokenizer util"
  [grammar]="chat tokenizer util"
  [server]="runtime model kernels util tokenizer chat grammar"
  [cli]="server runtime model kernels util tokenizer chat grammar"
)

fail=0
while IFS= read -r file; do
  area=${file#src/}; area=${area%%/*}
  if [ -z "${may[$area]+x}" ]; then
    echo "$file: area '$area' is not in the layer order (add it to tools/check_layers.sh)"; fail=1; continue
  fi
  dir=$(dirname "$file")
  # Lines like: 12:#include "runtime/backend.h"
  while IFS= read -r hit; do
    [ -z "$hit" ] && continue
    lineno=${hit%%:*}
    inc=${hit#*\"}; inc=${inc%%\"*}
    # Resolve like the compiler: the including file's directory first, then src/.
    if [ -f "$dir/$inc" ]; then
      target=${dir#src/}/$inc
    elif [ -f "src/$inc" ]; then
      target=$inc
    else
      echo "$file:$lineno: #include \"$inc\" is not a file under src/ (quote includes are for lily's own headers)"
      fail=1; continue
    fi
    case "$target" in *..*|*./*) target=$(realpath -m --relative-to=src "src/$target") ;; esac
    to=${target%%/*}
    [ "$to" = "$area" ] && continue
    case " ${may[$area]} " in *" $to "*) continue ;; esac
    echo "$file:$lineno: $area/ must not include $to/ (\"$inc\"): $area/ may include only" \
         "${may[$area]:-nothing outside util/}${may[$area]:+ (and itself)}"
    fail=1
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' "$file" || true)
done < <(find src -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \) | sort)

[ "$fail" = 0 ] && echo "layers ok"
exit $fail
