#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# ./test.sh's list of skipped tests: scripts/test-skips.py reads a meson testlog.json and prints
# each skipped test with the SKIP line it printed (a plain "SKIP: ...", a TAP "1..0 # SKIP ..."
# plan, or nothing), and nothing at all for a run without skips; test.sh runs it after
# `meson test` and keeps meson's exit status.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_SOURCE_ROOT
need_tool python3
svc_init

tool=$TPIPD_SOURCE_ROOT/scripts/test-skips.py
log=$SVC_TMP/testlog.json
cat >"$log" <<'JSON'
{"name": "tpipd:unit / common", "result": "OK", "stdout": "100%: Checks: 3\n"}
{"name": "tpipd:hw / cuda_ipc", "result": "SKIP", "stdout": "probing\nSKIP: no CUDA device\n"}
{"name": "tpipd:hw / tap", "result": "SKIP", "stdout": "1..0 # SKIP no RDMA device\n"}
{"name": "tpipd:service / quiet", "result": "SKIP", "stdout": ""}
JSON

check "the skipped tests are listed with their reasons"
out=$(python3 "$tool" "$log") || fail "test-skips.py failed on $log"
printf '%s\n' "$out"
grep -qxF 'Skipped tests (3):' <<<"$out" || fail "no count of skipped tests"
grep -qxF '  tpipd:hw / cuda_ipc: SKIP: no CUDA device' <<<"$out" ||
	fail "the SKIP line of cuda_ipc is missing"
grep -qxF '  tpipd:hw / tap: 1..0 # SKIP no RDMA device' <<<"$out" ||
	fail "the TAP skip reason is missing"
grep -qxF '  tpipd:service / quiet: (no reason printed)' <<<"$out" ||
	fail "a skip without output is not listed"
grep -q 'unit / common' <<<"$out" && fail "a passed test is listed as skipped"

check "a run without skips prints nothing"
head -1 "$log" >"$SVC_TMP/clean.json"
out=$(python3 "$tool" "$SVC_TMP/clean.json") || fail "test-skips.py failed"
[ -z "$out" ] || fail "output for a run without skips: $out"

check "test.sh lists the skips after meson test and keeps its exit status"
grep -q 'meson test .*|| status=\$?' "$TPIPD_SOURCE_ROOT/test.sh" ||
	fail "test.sh loses meson's status"
grep -q 'scripts/test-skips.py' "$TPIPD_SOURCE_ROOT/test.sh" || fail "test.sh does not list skips"
grep -q 'exit "\$status"' "$TPIPD_SOURCE_ROOT/test.sh" || fail "test.sh does not exit with it"
say "ok"
