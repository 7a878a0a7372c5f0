#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Admin requests: an unprivileged user (nobody, via setpriv or runuser) reaching the 0666 socket
# gets exit status 3 and a permission message for drain and close-session, and the daemon keeps
# serving; root's close-session ends a real client session (example_client --hold sees it end)
# and the session disappears from `tpipctl sessions`.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN EXAMPLE_CLIENT_BIN
[ "$(id -u)" -eq 0 ] || skip "needs root: runs tpipctl as another user and as root"
need_tool jq
svc_init

if command -v setpriv >/dev/null; then
	as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups "$@"; }
	how="setpriv --reuid=65534 --regid=65534 --clear-groups"
elif command -v runuser >/dev/null && id nobody >/dev/null 2>&1; then
	as_nobody() { runuser -u nobody -- "$@"; }
	how="runuser -u nobody --"
else
	skip "neither setpriv nor runuser is installed"
fi

# nobody must reach the socket and run tpipctl: a 0755 directory holding both.
chmod 0755 "$SVC_TMP"
cp "$TPIPCTL_BIN" "$SVC_TMP/tpipctl"
chmod 0755 "$SVC_TMP/tpipctl"
sock=$SVC_TMP/tpipd.sock
log=$SVC_TMP/tpipd.log
svc_start_daemon "$sock" "$log" --config /dev/null

check "the socket is mode 0666"
[ "$(stat -c %a "$sock")" = 666 ] || fail "socket mode is $(stat -c %a "$sock")"
check "nobody can run reports ($how tpipctl status)"
as_nobody "$SVC_TMP/tpipctl" --socket "$sock" status >/dev/null ||
	fail "tpipctl status as nobody failed"

# refused CMD...: as nobody, expect exit 3 and a permission message; the daemon still serves.
refused() {
	local rc
	as_nobody "$SVC_TMP/tpipctl" --socket "$sock" "$@" >"$SVC_TMP/out" 2>"$SVC_TMP/err"
	rc=$?
	say "  exit $rc: $(cat "$SVC_TMP/err")"
	[ "$rc" -eq 3 ] || fail "tpipctl $* as nobody: exit status $rc, expected 3"
	grep -qi 'permission' "$SVC_TMP/err" || fail "tpipctl $* as nobody: no permission message"
	kill -0 "$SVC_DAEMON_PID" 2>/dev/null || fail "tpipd exited after a refused $*"
	ctl --socket "$sock" status >/dev/null || fail "tpipctl status failed after a refused $*"
}

check "drain as nobody: exit 3, permission, the daemon keeps serving"
refused drain
check "close-session 1 as nobody: exit 3, permission, the daemon keeps serving"
refused close-session 1
check "the daemon logged both refusals for uid 65534"
[ "$(grep -c 'refused for uid 65534' "$log")" -eq 2 ] || fail "expected two refusal lines"

check "a client session held open by example_client --hold"
"$EXAMPLE_CLIENT_BIN" "$sock" --hold >"$SVC_TMP/client.out" 2>"$SVC_TMP/client.err" &
cpid=$!
svc_track "$cpid"
SVC_LOGS+=("$SVC_TMP/client.out" "$SVC_TMP/client.err")
wait_until 15 "example_client to hold its session" grep -qx holding "$SVC_TMP/client.out"
ctl --socket "$sock" --json sessions >"$SVC_TMP/sessions.json" || fail "tpipctl sessions failed"
sid=$(jq -r --argjson p "$cpid" '.sessions[] | select(.pid == $p and .role == "client") | .id' \
	"$SVC_TMP/sessions.json")
[ -n "$sid" ] || { cat "$SVC_TMP/sessions.json"; fail "no client session with pid $cpid"; }
say "  example_client pid $cpid is session $sid"

check "close-session $sid as root: exit 0"
ctl --socket "$sock" close-session "$sid" || fail "tpipctl close-session $sid failed"
check "the client sees its session end and exits 0"
wait_exit "$cpid" 10
[ "$SVC_STATUS" -eq 0 ] || fail "example_client exited $SVC_STATUS after close-session"
say "  $(tail -n 1 "$SVC_TMP/client.out")"
grep -qx "session ended: closed by an administrator" "$SVC_TMP/client.out" ||
	fail "the client does not read its session's end as closed by an administrator"
check "session $sid is gone from tpipctl sessions"
gone() {
	ctl --socket "$sock" --json sessions |
		jq -e --argjson s "$sid" '[.sessions[] | select(.id == $s)] | length == 0'
}
wait_until 5 "session $sid to disappear" gone
check "close-session of an unknown session: exit 3, not found"
ctl --socket "$sock" close-session 999999 2>"$SVC_TMP/err"
rc=$?
[ "$rc" -eq 3 ] || fail "close-session 999999: exit $rc, expected 3"
grep -qi 'no such session' "$SVC_TMP/err" || fail "no 'no such session' message"

check "the daemon survived all of it and stops with status 0"
svc_stop_daemon "$SVC_DAEMON_PID"
say "ok"
