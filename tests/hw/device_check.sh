#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
# scripts/device-check.sh proved here: `pack` gathers this build (argument 1) and the libraries it
# loads (libibverbs.so.1, loaded at run time, where installed) into a temporary folder, `run
# --fake` runs the packed hw suite and bench_cuda on the stand-in CUDA driver and verbs provider
# through the carried loader, and the summary must name every test as ok and end in "0 failed".
# Exit 77 (skip) where bench_cuda was not built.
set -uo pipefail
build=$1
src=$(dirname "$(readlink -f "$0")")/../..
[ -x "$build/bench/bench_cuda" ] || { echo "SKIP: bench_cuda is not built"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export DEVICE_CHECK_DIR=$tmp/devlibs DEVICE_CHECK_NO_BUILD=1 OUT=$tmp/out
"$src/scripts/device-check.sh" pack "$build" || { echo "FAIL: pack"; exit 1; }
# tpipd dlopen()s libibverbs: ldd does not list it, pack must carry it where it is installed
if ldconfig -p 2>/dev/null | awk '$1 == "libibverbs.so.1" { f = 1 } END { exit !f }'; then
	[ -f "$tmp/devlibs/lib/libibverbs.so.1" ] || { echo "FAIL: libibverbs.so.1 not packed"; exit 1; }
fi
"$src/scripts/device-check.sh" run --fake >"$tmp/run.log" 2>&1
rc=$?
cat "$tmp/run.log"
[ "$rc" = 0 ] || { echo "FAIL: run --fake exited $rc"; exit 1; }
for t in test_cuda_xfer test_cuda_peer test_cuda_host test_cuda_stream test_cuda_faults \
	test_cuda_ctl test_fakeverbs test_rdma test_cuda_gdr test_cuda_dmabuf; do
	grep -qE "^$t +ok " "$tmp/run.log" || { echo "FAIL: $t is not ok in the summary"; exit 1; }
	[ -s "$OUT/device-check/$t.log" ] || { echo "FAIL: no log for $t in \$OUT"; exit 1; }
done
grep -q '^== CUDA -> CUDA on one device' "$tmp/run.log" || { echo "FAIL: no bench_cuda table"; exit 1; }
tail -1 "$tmp/run.log" | grep -qx 'device-check: 0 failed' || { echo "FAIL: last line"; exit 1; }
echo "PASS: device-check packed and ran the hw suite and bench_cuda on the stand-ins"
