#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# libibverbs is loaded at run time, never linked (registered only in builds that found
# rdma-core): tpipd has no NEEDED entry for libibverbs (readelf -d); and with libibverbs.so.1
# made unusable (/dev/null bound over it in a private mount namespace), tpipd still starts and
# serves, the rdma channel is not viable with one info line that names libibverbs, and neither
# rdma nor cuda_gdr is offered. The second part skips (77) where a mount namespace cannot be made
# or the library is not installed; the first never does.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN
need_tool readelf
svc_init

check "tpipd has no NEEDED entry for libibverbs"
readelf -d "$TPIPD_BIN" >"$SVC_TMP/dynamic" || fail "readelf -d $TPIPD_BIN failed"
grep -q '(NEEDED)' "$SVC_TMP/dynamic" || fail "readelf shows no NEEDED entries at all"
if grep -q 'NEEDED.*libibverbs' "$SVC_TMP/dynamic"; then
	grep NEEDED "$SVC_TMP/dynamic"
	fail "tpipd links libibverbs"
fi

need_tool unshare
need_tool jq "reads tpipctl --json backends"
need_tool ldconfig
lib=$(ldconfig -p | awk '$1 == "libibverbs.so.1" { print $NF; exit }')
[ -n "$lib" ] || skip "libibverbs.so.1 is not installed here (nothing to hide)"
real=$(readlink -f "$lib")
unshare -m true 2>/dev/null || skip "cannot make a mount namespace here (unshare -m)"

check "libibverbs.so.1 unusable ($real hidden): tpipd starts, rdma is not viable and says why"
sock=$SVC_TMP/tpipd.sock
log=$SVC_TMP/tpipd.log
SVC_LOGS+=("$log")
unshare -m bash -c 'mount --bind /dev/null "$1" && exec "${@:2}"' _ "$real" \
	"$TPIPD_BIN" --socket "$sock" --config /dev/null --peer-listen off 2>"$log" &
pid=$!
svc_track "$pid"
svc_wait_daemon "$sock" "$pid"
ctl --socket "$sock" status >/dev/null || fail "tpipctl status does not answer"
grep -E "channel rdma \(priority [0-9]+\): not viable: no libibverbs .*libibverbs\.so\.1" "$log" ||
	fail "no line saying that rdma is not viable for want of libibverbs"
[ "$(grep -c "no libibverbs" "$log")" -le 2 ] || fail "libibverbs' absence is logged more than once a channel"
ctl --socket "$sock" --json backends >"$SVC_TMP/backends.json" || fail "tpipctl backends failed"
jq -e '.backends[] | select(.name == "rdma") | .viable == false and (.why | test("libibverbs"))' \
	"$SVC_TMP/backends.json" >/dev/null || fail "tpipctl backends: rdma viable, or not saying why"
jq -e '.backends[] | select(.name == "cuda_gdr") | .viable == false' "$SVC_TMP/backends.json" \
	>/dev/null || fail "tpipctl backends: cuda_gdr viable without libibverbs"
kill "$pid"
wait_exit "$pid" 10
[ "$SVC_STATUS" -eq 0 ] || fail "tpipd exited $SVC_STATUS after SIGTERM"
