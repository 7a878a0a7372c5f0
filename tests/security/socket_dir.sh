#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Socket path race (issue 21, item 9). tpipd refuses, with exit status 1 and one clear line, to
# put its socket in a directory other users can write (0777, a sticky 1777 like /tmp, group
# writable) or one another uid owns: there anyone could swap the socket's name for a link. In a
# safe directory the socket is created 0666 by bind() itself (umask), and the daemon never
# chmod()s a path (checked with strace where it is installed), so a link swapped in after bind
# cannot turn another file's mode.
. "$(dirname -- "$0")/../service/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN
[ "$(id -u)" -eq 0 ] || skip "needs root: makes a directory owned by another uid"
svc_init

# refused DIR WHAT: tpipd with its socket in DIR exits 1 saying why, and leaves no socket.
refused() {
	local dir=$1 what=$2 log=$SVC_TMP/refused.log
	"$TPIPD_BIN" --socket "$dir/tpipd.sock" --peer-listen off --config /dev/null 2>"$log" &
	local pid=$!
	svc_track "$pid"
	wait_exit "$pid" 10
	[ "$SVC_STATUS" -eq 1 ] || { cat "$log"; fail "$what: exit status $SVC_STATUS, want 1"; }
	grep -q "refusing socket directory $dir" "$log" || { cat "$log"; fail "$what: no reason"; }
	[ "$(grep -c 'refusing socket directory' "$log")" -eq 1 ] || fail "$what: logged twice"
	[ ! -e "$dir/tpipd.sock" ] || fail "$what: a socket was created"
	check "refused: $what"
}

for mode in 0777 1777 0775 0757; do
	d=$SVC_TMP/m$mode
	mkdir "$d" && chmod "$mode" "$d"
	refused "$d" "directory mode $mode"
done
d=$SVC_TMP/other
mkdir -m 0755 "$d" && chown 65534:65534 "$d"
refused "$d" "directory owned by uid 65534"

# Just inside the rule: 0755, owned by root. The socket is 0666 from its creation.
d=$SVC_TMP/ok
mkdir -m 0755 "$d"
svc_start_daemon "$d/tpipd.sock" "$SVC_TMP/ok.log" --config /dev/null
mode=$(stat -c '%a %F' "$d/tpipd.sock")
[ "$mode" = "666 socket" ] || fail "socket is '$mode', want '666 socket'"
check "socket created 0666 in a 0755 root directory"
svc_stop_daemon "$SVC_DAEMON_PID"

# No chmod() of any path, at all, while starting (the old code chmod()ed the socket's path).
if command -v strace >/dev/null && strace -f -o /dev/null true 2>/dev/null; then
	trace=$SVC_TMP/strace.log
	strace -f -qq -e trace=chmod,fchmodat -o "$trace" \
		"$TPIPD_BIN" --socket "$d/tpipd.sock" --peer-listen off --config /dev/null \
		2>"$SVC_TMP/strace-daemon.log" &
	pid=$!
	svc_track "$pid"
	svc_wait_daemon "$d/tpipd.sock" "$pid"
	dpid=$(sed -n 's/.* ready on .* (pid \([0-9]*\),.*/\1/p' "$SVC_TMP/strace-daemon.log")
	[ -n "$dpid" ] || fail "no pid in the daemon's ready line"
	kill -TERM "$dpid"
	wait_exit "$pid" 10
	if grep -E 'chmod' "$trace" | grep -v 'ENOSYS\|exited' >/dev/null; then
		cat "$trace"
		fail "tpipd chmod()s a path"
	fi
	check "no chmod() of a path"
else
	say "strace not usable here: not checking for chmod() calls"
fi
