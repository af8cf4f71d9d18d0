#!/usr/bin/env bash
# Fuzzing: builds every tests/<area>/fuzz_<name>.cpp (a libFuzzer LLVMFuzzerTestOneInput) with clang,
# AddressSanitizer and UBSan into build-fuzz/, then runs each target for a bounded time. A crash, leak, UB report,
# timeout or out-of-memory fails the script and leaves the input in build-fuzz/artifacts/.
# Optional per target: tests/<area>/corpus/<name>/ (seed inputs, read-only) and tests/<area>/fuzz_<name>.dict.
# Usage: scripts/fuzz.sh [seconds-per-target] [fuzz_target ...]   (default 60 s, all targets)
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=${1:-${LILY_FUZZ_SECONDS:-60}}
shift || true
BUILD=${LILY_FUZZ_BUILD_DIR:-build-fuzz}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DLILY_FUZZ=ON -DLILY_CUDA=OFF >/dev/null
cmake --build "$BUILD" --target fuzz_all -j"$(nproc)"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/*/fuzz_*.cpp; do [ -e "$f" ] && targets+=("$(basename "$f" .cpp)"); done
fi
mkdir -p "$BUILD/artifacts"
for t in "${targets[@]}"; do
  src=$(ls tests/*/"$t".cpp)
  area=$(basename "$(dirname "$src")")
  work="$BUILD/corpus/$t"
  mkdir -p "$work"
  dirs=("$work")
  [ -d "tests/$area/corpus/${t#fuzz_}" ] && dirs+=("tests/$area/corpus/${t#fuzz_}")
  args=(-max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -max_len=4096 -print_final_stats=1
        -artifact_prefix="$BUILD/artifacts/$t-")
  [ -f "tests/$area/$t.dict" ] && args+=(-dict="tests/$area/$t.dict")
  echo "fuzz: $t for ${SECS}s"
  log="$BUILD/$t.log"
  if ! "$BUILD/$t" "${args[@]}" "${dirs[@]}" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz: $t FAILED (log $log, crashing input in $BUILD/artifacts/)"
    exit 1
  fi
  grep -E '^(#[0-9]+ +DONE|stat::number_of_executed_units)' "$log" || true
done
echo "fuzz: ${#targets[@]} target(s) ran clean"
