#!/usr/bin/env bash
# Run the whole test suite (everything that needs no GPU and is not a soak): builds first, installs the pinned npm test
# oracles project-locally, then runs ctest excluding the "gpu" and "soak" labels. On a GPU machine run
# `ctest --test-dir build -L gpu` for the GPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ -f tests/oracle/package.json ]; then
  (cd tests/oracle && npm ci --no-audit --no-fund --loglevel=error)
fi
BUILD=${LILY_BUILD_DIR:-build}
ctest --test-dir "$BUILD" -LE "gpu|soak" --output-on-failure -j"$(nproc)" --timeout 900
# Bounded fuzzing of every tests/*/fuzz_*.cpp under ASan + UBSan (LILY_FUZZ_SECONDS per target; 0 skips).
if [ "${LILY_FUZZ_SECONDS:-60}" != 0 ]; then
  scripts/fuzz.sh "${LILY_FUZZ_SECONDS:-60}"
fi
