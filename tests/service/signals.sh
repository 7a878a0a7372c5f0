#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Signals at the earliest moment: SIGTERM, SIGINT or SIGHUP raised the instant the control socket
# listens (an LD_PRELOAD shim around listen(), signal_at_listen.c) are the daemon's own: SIGTERM
# and SIGINT stop it with status 0 (its handlers were installed before the socket listened; it was
# killed with 143 or 130 before), SIGHUP reloads and the daemon serves on.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN SIGNAL_SHIM
svc_init

# The shim is not built with the sanitizers: let an ASan runtime start without coming first.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0"

for sig in TERM INT; do
	sock=$SVC_TMP/$sig.sock
	log=$SVC_TMP/$sig.log
	SVC_LOGS+=("$log")
	check "SIG$sig raised as the socket starts listening: exit status 0"
	TPT_SIGNAL_AT_LISTEN=$(kill -l "$sig") LD_PRELOAD=$SIGNAL_SHIM \
		"$TPIPD_BIN" --socket "$sock" --peer-listen off 2>"$log" &
	pid=$!
	svc_track "$pid"
	wait_exit "$pid" 10
	[ "$SVC_STATUS" -eq 0 ] || { cat "$log"; fail "tpipd exited with status $SVC_STATUS"; }
	grep -q "SIG$sig" "$log" || { cat "$log"; fail "the log does not name SIG$sig"; }
done

sock=$SVC_TMP/HUP.sock
log=$SVC_TMP/HUP.log
check "SIGHUP raised as the socket starts listening: the daemon serves on, then stops with 0"
SVC_LOGS+=("$log")
TPT_SIGNAL_AT_LISTEN=$(kill -l HUP) LD_PRELOAD=$SIGNAL_SHIM \
	"$TPIPD_BIN" --socket "$sock" --peer-listen off 2>"$log" &
pid=$!
svc_track "$pid"
svc_wait_daemon "$sock" "$pid"
svc_stop_daemon "$pid"
say "ok"
