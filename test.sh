#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# Installs what is missing (Debian packages, see scripts/deps.sh), builds tpipd in ./build and
# runs the whole meson test suite there. Extra arguments go to `meson test` (e.g. --suite unit).
# At the end it lists each skipped test with the reason it printed (scripts/test-skips.py).
# Exit status: that of `meson test` (0 when every test passed or was skipped).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

tp_deps_install test
BUILD=${TP_BUILD_DIR:-build} # build directory (default ./build)
tp_build "$BUILD" -Dwerror=true # warnings are errors in tests and CI
status=0
meson test -C "$BUILD" --print-errorlogs "$@" || status=$?
python3 scripts/test-skips.py "$BUILD/meson-logs/testlog.json" || true
exit "$status"
