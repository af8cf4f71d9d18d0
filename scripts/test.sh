#!/usr/bin/env bash
# Run the whole test suite (everything that does not need a GPU): builds first, installs the pinned npm test
# oracles project-locally, then runs ctest excluding the "gpu" label. On a GPU machine run
# `ctest --test-dir build -L gpu` for the GPU tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ -f tests/oracle/package.json ]; then
  (cd tests/oracle && npm ci --no-audit --no-fund --loglevel=error)
fi
BUILD=${LILY_BUILD_DIR:-build}
ctest --test-dir "$BUILD" -LE gpu --output-on-failure -j"$(nproc)" --timeout 900
