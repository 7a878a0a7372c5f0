#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# One-command demo: installs what is missing (Debian packages, see scripts/deps.sh), builds tpipd,
# tpipctl, libtpclient and tp-demo (only these) in ./build, starts tpipd in the foreground on a
# socket in a temporary directory, runs examples/tp-demo (a listener and a connector process moving
# a few messages with shared and private tensors, every byte checked) and shows `tpipctl status`,
# `sessions` and `pipes` while the demo's pipe is still open. Stops the daemon with SIGTERM and
# removes the temporary directory on exit. Exit status: 0 when the demo verified every byte and
# tpipd stopped cleanly.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")"
# shellcheck source=scripts/deps.sh
. scripts/deps.sh

BUILD=${TP_BUILD_DIR:-build} # build directory (default ./build)
TPIPD=$BUILD/daemon/tpipd
TPIPCTL=$BUILD/client/tpipctl/tpipctl
TPDEMO=$BUILD/examples/tp-demo
WAIT_S=30 # longest wait for the daemon to start and for the demo to reach its hold point

tmp=
daemon_pid=
demo_pid=

cleanup() {
	local rc=$?
	if [ -n "$demo_pid" ] && kill -0 "$demo_pid" 2>/dev/null; then
		kill -TERM "$demo_pid" 2>/dev/null || true
		wait "$demo_pid" 2>/dev/null || true
	fi
	if [ -n "$daemon_pid" ] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill -TERM "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	if [ "$rc" -ne 0 ] && [ -n "$tmp" ] && [ -s "$tmp/tpipd.log" ]; then
		echo "--- tpipd log ---" >&2
		cat "$tmp/tpipd.log" >&2
	fi
	if [ -n "$tmp" ]; then
		rm -rf "$tmp"
	fi
	exit "$rc"
}

die() {
	echo "demo: $*" >&2
	exit 1
}

# wait_for SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds; fails on timeout.
wait_for() {
	local tries=$(($1 * 10))
	shift
	while ! "$@"; do
		tries=$((tries - 1))
		if [ "$tries" -le 0 ]; then
			return 1
		fi
		sleep 0.1
	done
}

daemon_ready() {
	kill -0 "$daemon_pid" 2>/dev/null || die "tpipd exited during start-up"
	[ -S "$sock" ] && grep -q 'ready' "$tmp/tpipd.log"
}

demo_holding() {
	kill -0 "$demo_pid" 2>/dev/null || return 0 # finished (or failed) early: stop waiting
	[ -e "$tmp/hold" ]
}

show() {
	echo
	echo "\$ tpipctl $*"
	"$TPIPCTL" --socket "$sock" "$@"
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

tp_deps_install
# Only what the demo runs (tp-demo brings libtpclient): not the tests and benchmarks, which
# ./test.sh builds later in the same directory.
tp_build_targets "$BUILD" "${TPIPD#"$BUILD"/}" "${TPIPCTL#"$BUILD"/}" "${TPDEMO#"$BUILD"/}"
for f in "$TPIPD" "$TPIPCTL" "$TPDEMO"; do
	[ -x "$f" ] || die "$f was not built"
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpipd-demo.XXXXXX")
sock=$tmp/tpipd.sock

echo "== starting tpipd on $sock"
# The demo stays on this host: no peer listener, so this private daemon opens no TCP port (and
# does not compete for 7420 with a tpipd service already running here).
"$TPIPD" --socket "$sock" --log-level info --peer-listen off 2>"$tmp/tpipd.log" &
daemon_pid=$!
wait_for "$WAIT_S" daemon_ready || die "tpipd did not become ready within ${WAIT_S}s"

echo "== running tp-demo"
"$TPDEMO" --socket "$sock" --hold "$tmp/hold" &
demo_pid=$!
wait_for "$WAIT_S" demo_holding || die "tp-demo did not finish its transfer within ${WAIT_S}s"

if [ -e "$tmp/hold" ]; then
	echo
	echo "== the demo's processes are still attached; what tpipctl shows:"
else
	echo
	echo "== tp-demo already exited; what tpipctl shows afterwards:"
fi
ctl_rc=0
show status || ctl_rc=$?
show sessions || ctl_rc=$?
show pipes || ctl_rc=$?
echo

rm -f "$tmp/hold"
demo_rc=0
wait "$demo_pid" || demo_rc=$?
demo_pid=

echo "== stopping tpipd (SIGTERM)"
kill -TERM "$daemon_pid"
daemon_rc=0
wait "$daemon_pid" || daemon_rc=$?
daemon_pid=

[ "$demo_rc" -eq 0 ] || die "tp-demo failed (exit status $demo_rc)"
[ "$ctl_rc" -eq 0 ] || die "tpipctl failed (exit status $ctl_rc)"
[ "$daemon_rc" -eq 0 ] || die "tpipd exited with status $daemon_rc"
echo "== demo finished: every byte verified, tpipd stopped cleanly"
