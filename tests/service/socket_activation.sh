#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Socket activation: systemd-socket-activate listens on s.sock and, on the first connection,
# execs tpipd in place with the socket as fd 3 (LISTEN_FDS=1). The daemon must serve on the
# passed socket, ignore its own --socket (other.sock is never created), report the passed path,
# and exit 0 on SIGTERM without removing the socket it does not own.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN
need_tool systemd-socket-activate
svc_init

sock=$SVC_TMP/s.sock
other=$SVC_TMP/other.sock
log=$SVC_TMP/tpipd.log
SVC_LOGS+=("$log")

say "systemd-socket-activate -l $sock $TPIPD_BIN --socket $other"
systemd-socket-activate -l "$sock" "$TPIPD_BIN" --socket "$other" --peer-listen off 2>"$log" &
pid=$!
svc_track "$pid"
wait_until 10 "the activator to listen on $sock" test -S "$sock"

check "tpipctl status through the activated socket succeeds (the first connection starts tpipd)"
ctl --socket "$sock" --timeout 10 status >"$SVC_TMP/status.out" 2>&1 ||
	{ cat "$SVC_TMP/status.out"; fail "tpipctl status failed"; }
cat "$SVC_TMP/status.out"

check "the activator's pid $pid is now tpipd (exec in place)"
wait_until 5 "pid $pid to become tpipd" grep -qx tpipd "/proc/$pid/comm"

check "status reports the passed socket $sock"
ctl --socket "$sock" --json status >"$SVC_TMP/status.json" || fail "tpipctl --json status failed"
if command -v jq >/dev/null; then
	got=$(jq -r .socket_path "$SVC_TMP/status.json")
	[ "$got" = "$sock" ] || fail "socket_path is '$got', expected '$sock'"
	dpid=$(jq -r .pid "$SVC_TMP/status.json")
	[ "$dpid" = "$pid" ] || fail "status pid is $dpid, expected $pid"
else
	grep -qF "\"socket_path\": \"$sock\"" "$SVC_TMP/status.json" || fail "socket_path is not $sock"
fi

check "the daemon logged that it uses the activated socket"
grep -q "using control socket $sock from socket activation" "$log" ||
	fail "no 'from socket activation' line in the log"

check "$other was never created"
[ ! -e "$other" ] || fail "$other exists: the daemon bound its own socket"

check "SIGTERM: the daemon exits 0"
svc_stop_daemon "$pid"

check "the activated socket was left to its owner (not unlinked by tpipd)"
[ -S "$sock" ] || fail "$sock was removed by tpipd"
[ ! -e "$other" ] || fail "$other exists after stop"
say "ok"
