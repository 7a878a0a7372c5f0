# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
# Shared helpers for the service suite, sourced by each script: a private temp dir, cleanup on
# exit (daemons and helpers started here are stopped, the temp dir removed, even on failure),
# bounded waits instead of sleeps, skips (exit 77) and failure reporting with the daemon logs.
# Nothing here starts a daemon by itself; svc_start_daemon does, when a script asks.

set -u

SVC_NAME=$(basename "$0" .sh)
SVC_TMP=
SVC_PIDS=()   # processes to stop at exit, most recent last
SVC_LOGS=()   # files to print when the test fails
SVC_NETNS=()  # network namespaces to delete at exit
SVC_FAILED=0

say() { printf '%s: %s\n' "$SVC_NAME" "$*"; }
check() { printf '%s: check: %s\n' "$SVC_NAME" "$*"; }

# Prints the logs collected so far and exits 1.
fail() {
	printf '%s: FAIL: %s\n' "$SVC_NAME" "$*" >&2
	SVC_FAILED=1
	svc_dump_logs
	exit 1
}

skip() {
	printf '%s: SKIP: %s\n' "$SVC_NAME" "$*"
	exit 77
}

need_tool() {
	command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed${2:+ ($2)}"
}

need_env() {
	local v
	for v in "$@"; do
		[ -n "${!v:-}" ] || fail "$v is not set (run through meson test)"
	done
}

svc_dump_logs() {
	local f
	for f in "${SVC_LOGS[@]}"; do
		[ -s "$f" ] || continue
		printf -- '---- %s ----\n' "$f" >&2
		tail -n 60 "$f" >&2
	done
}

# Stops @pid: SIGTERM, up to 5 s, then SIGKILL. Only processes this script started.
svc_stop_pid() {
	local pid=$1 i
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null
	for ((i = 0; i < 100; i++)); do
		kill -0 "$pid" 2>/dev/null || return 0
		sleep 0.05
	done
	kill -KILL "$pid" 2>/dev/null
}

svc_cleanup() {
	local rc=$? i
	trap - EXIT
	for ((i = ${#SVC_PIDS[@]} - 1; i >= 0; i--)); do
		svc_stop_pid "${SVC_PIDS[i]}"
	done
	wait 2>/dev/null
	if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ "$SVC_FAILED" -eq 0 ]; then
		svc_dump_logs
	fi
	# Deleting a namespace also deletes the devices in it (a veth end, and so its pair).
	for ((i = 0; i < ${#SVC_NETNS[@]}; i++)); do
		ip netns del "${SVC_NETNS[i]}" 2>/dev/null
	done
	[ -n "$SVC_TMP" ] && rm -rf "$SVC_TMP"
	exit "$rc"
}

# Creates $SVC_TMP and arms the cleanup. Call once, first.
svc_init() {
	SVC_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpsvc.XXXXXX") || fail "mktemp"
	trap svc_cleanup EXIT
	trap 'exit 1' INT TERM HUP
}

svc_track() { SVC_PIDS+=("$1"); }

# svc_peer_key: prints the path of a pre-shared peer key file (mode 0600) shared by every daemon
# of the script, creating it on first use: peer listeners open only with authentication.
svc_peer_key() {
	local k=$SVC_TMP/peer.key
	if [ ! -s "$k" ]; then
		(umask 077 && head -c 32 /dev/urandom | base64 >"$k") || fail "cannot write $k"
	fi
	printf '%s\n' "$k"
}

# svc_netns NAME...: creates these network namespaces, deleted by the cleanup (after the
# processes stop); skips the script (77) where namespaces cannot be made.
svc_netns() {
	local ns
	for ns in "$@"; do
		ip netns add "$ns" 2>/dev/null ||
			skip "cannot create network namespaces here (ip netns add)"
		SVC_NETNS+=("$ns")
	done
}

# svc_two_hosts NSA NSB VEA VEB NET: two network namespaces as hosts, joined by a veth pair
# VEA (in NSA, address NET1/24) - VEB (in NSB, NET2/24), loopback and both ends up; NET is a
# prefix such as "10.201.7.". Skips the script (77) where that cannot be made.
svc_two_hosts() {
	local nsa=$1 nsb=$2 vea=$3 veb=$4 net=$5 ns
	svc_netns "$nsa" "$nsb"
	ip link add "$vea" netns "$nsa" type veth peer name "$veb" netns "$nsb" 2>/dev/null ||
		skip "cannot create a veth pair here"
	ip -n "$nsa" addr add "${net}1/24" dev "$vea" || fail "address on $vea"
	ip -n "$nsb" addr add "${net}2/24" dev "$veb" || fail "address on $veb"
	for ns in "$nsa" "$nsb"; do ip -n "$ns" link set lo up || fail "lo up in $ns"; done
	ip -n "$nsa" link set "$vea" up || fail "$vea up"
	ip -n "$nsb" link set "$veb" up || fail "$veb up"
}

# svc_wait_daemon SOCKET PID: waits (10 s) until the daemon PID answers tpipctl status on SOCKET.
svc_wait_daemon() {
	local deadline=$((SECONDS + 10))
	until ctl --socket "$1" --timeout 1 status >/dev/null 2>&1; do
		kill -0 "$2" 2>/dev/null || fail "tpipd exited during start-up ($1)"
		[ "$SECONDS" -lt "$deadline" ] || fail "tpipd did not answer on $1 within 10 s"
		sleep 0.05
	done
}

# wait_until SECONDS DESCRIPTION CMD...: runs CMD every 50 ms until it succeeds or SECONDS pass.
wait_until() {
	local secs=$1 what=$2 deadline
	shift 2
	deadline=$((SECONDS + secs))
	while :; do
		"$@" >/dev/null 2>&1 && return 0
		[ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${secs}s waiting for $what"
		sleep 0.05
	done
}

# wait_exit PID SECONDS: waits for a child to exit; sets SVC_STATUS to its exit status.
wait_exit() {
	local pid=$1 secs=$2 deadline
	deadline=$((SECONDS + secs))
	while kill -0 "$pid" 2>/dev/null; do
		# A zombie still answers kill -0; wait reaps it.
		case $(cut -d' ' -f3 "/proc/$pid/stat" 2>/dev/null) in Z) break ;; esac
		[ "$SECONDS" -lt "$deadline" ] || fail "pid $pid did not exit within ${secs}s"
		sleep 0.05
	done
	wait "$pid"
	SVC_STATUS=$?
}

# tpipctl in the foreground (a function: start background processes with "$TPIPCTL_BIN" itself,
# so that $! is their pid and signals reach them).
ctl() { "$TPIPCTL_BIN" "$@"; }

# svc_start_daemon SOCKET LOG [ARGS...]: starts $TPIPD_BIN --socket SOCKET ARGS with stderr to LOG,
# waits (10 s) until tpipctl status answers; sets SVC_DAEMON_PID.
svc_start_daemon() {
	local sock=$1 log=$2
	shift 2
	SVC_LOGS+=("$log")
	"$TPIPD_BIN" --socket "$sock" --peer-listen off "$@" 2>"$log" &
	SVC_DAEMON_PID=$!
	svc_track "$SVC_DAEMON_PID"
	svc_wait_daemon "$sock" "$SVC_DAEMON_PID"
}

# svc_stop_daemon PID: SIGTERM and expect exit status 0 within 10 s.
svc_stop_daemon() {
	local pid=$1
	kill -TERM "$pid" || fail "cannot signal tpipd $pid"
	wait_exit "$pid" 10
	[ "$SVC_STATUS" -eq 0 ] || fail "tpipd exited with status $SVC_STATUS after SIGTERM"
}
