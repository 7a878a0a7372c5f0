#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# Installs what is missing (Debian packages, see scripts/deps.sh), builds tpipd in ./build and
# runs the whole meson test suite there. Extra arguments go to `meson test` (e.g. --suite unit).
# Exit status: that of `meson test` (0 when every test passed or was skipped).
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

tp_deps_install
BUILD=${TP_BUILD_DIR:-build} # build directory (default ./build)
tp_build "$BUILD" -Dwerror=true # warnings are errors in tests and CI
meson test -C "$BUILD" --print-errorlogs "$@"
