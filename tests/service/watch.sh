#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# tpipctl watch: without a terminal it prints --count snapshots (header, status, pipes) separated
# by blank lines, at the --interval pace, without escape codes; --json gives one object per
# refresh; an open pipe shows up; SIGTERM ends it with 0; the daemon going away ends it with 2
# and a message; watch-only flags are refused elsewhere. On a terminal (through script(1), when
# installed) each refresh starts with the ANSI home + clear sequence.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN EXAMPLE_CLIENT_BIN
need_tool jq
svc_init

sock=$SVC_TMP/tpipd.sock
log=$SVC_TMP/tpipd.log
out=$SVC_TMP/watch.out
err=$SVC_TMP/watch.err
svc_start_daemon "$sock" "$log" --config /dev/null
now_ms() { echo $(($(date +%s%N) / 1000000)); }

check "watch --count 3 --interval 0.2 into a file: exit 0 after about two intervals"
t0=$(now_ms)
ctl --socket "$sock" watch --count 3 --interval 0.2 >"$out" 2>"$err" ||
	{ cat "$err"; fail "watch exited $?"; }
elapsed=$(($(now_ms) - t0))
say "  took ${elapsed} ms"
[ "$elapsed" -ge 350 ] || fail "3 refreshes 0.2 s apart took only ${elapsed} ms"
check "three snapshots, each a header, the status and the pipes table"
[ "$(grep -c "^tpipd at $sock, every 0.2 s, " "$out")" -eq 3 ] || { cat "$out"; fail "not 3 headers"; }
[ "$(grep -c "^socket: *$sock\$" "$out")" -eq 3 ] || { cat "$out"; fail "not 3 status tables"; }
[ "$(grep -c '^ID  LISTENER  STATE' "$out")" -eq 3 ] || { cat "$out"; fail "not 3 pipes tables"; }
check "snapshots are separated by a blank line"
awk -v s="tpipd at $sock," 'index($0, s) == 1 && NR > 1 && prev != "" { bad = 1 } { prev = $0 }
	END { exit bad }' "$out" || { cat "$out"; fail "a snapshot does not follow a blank line"; }
check "no escape codes when stdout is not a terminal"
! grep -q $'\033' "$out" || fail "escape codes in non-terminal output"

check "watch --json --count 2: two objects with status and pipes"
ctl --socket "$sock" --json watch --count 2 --interval 0.1 >"$out" || fail "watch --json failed"
jq -se --arg s "$sock" 'length == 2 and
	all(.[]; .status.socket_path == $s and (.pipes | type == "array"))' "$out" >/dev/null ||
	{ cat "$out"; fail "watch --json output is not two {status, pipes} objects"; }

check "an open pipe (example_client --hold) shows up in watch"
"$EXAMPLE_CLIENT_BIN" "$sock" --hold >"$SVC_TMP/client.out" 2>&1 &
cpid=$!
svc_track "$cpid"
wait_until 15 "example_client to hold its pipe" grep -qx holding "$SVC_TMP/client.out"
ctl --socket "$sock" watch --count 1 >"$out" || fail "watch --count 1 failed"
grep -qE "^ *[0-9]+  example-$cpid  open " "$out" || { cat "$out"; fail "no open pipe to example-$cpid"; }
grep -qE "^pipes: *1\$" "$out" || { cat "$out"; fail "status does not count the pipe"; }
svc_stop_pid "$cpid"

check "SIGTERM ends a running watch with exit status 0"
# Empty the files first: the shell truncates them in the child, possibly after wait_until has
# already found the previous check's snapshot in them.
: >"$out"
: >"$err"
"$TPIPCTL_BIN" --socket "$sock" watch --interval 0.2 >"$out" 2>"$err" &
wpid=$!
svc_track "$wpid"
wait_until 10 "the first snapshot" grep -q "^tpipd at " "$out"
kill -TERM "$wpid"
wait_exit "$wpid" 5
[ "$SVC_STATUS" -eq 0 ] || { cat "$err"; fail "watch exited $SVC_STATUS after SIGTERM"; }

check "the daemon going away ends watch with exit status 2 and a message"
: >"$out"
: >"$err"
"$TPIPCTL_BIN" --socket "$sock" watch --interval 0.2 >"$out" 2>"$err" &
wpid=$!
svc_track "$wpid"
wait_until 10 "the first snapshot" grep -q "^tpipd at " "$out"
svc_stop_daemon "$SVC_DAEMON_PID"
wait_exit "$wpid" 5
say "  exit $SVC_STATUS: $(cat "$err")"
[ "$SVC_STATUS" -eq 2 ] || fail "watch exited $SVC_STATUS when the daemon stopped, expected 2"
grep -q "lost the daemon" "$err" || fail "no 'lost the daemon' message"

check "watch on a socket nobody serves: exit 2"
ctl --socket "$sock" watch --count 1 >/dev/null 2>"$err"
[ $? -eq 2 ] || fail "watch without a daemon did not exit 2"

check "watch-only flags and bad values are usage errors (exit 1)"
for args in "status --count 2" "pipes --interval 1" "watch --interval 0" "watch --interval 0.01" \
	"watch --interval x" "watch --count 0" "watch --count -3" "watch extra"; do
	# shellcheck disable=SC2086
	ctl --socket "$sock" $args >/dev/null 2>"$err"
	rc=$?
	[ "$rc" -eq 1 ] || fail "tpipctl $args: exit $rc, expected 1"
	say "  $args: $(head -n 1 "$err")"
done

check "--help documents watch, --interval and --count"
ctl --help | grep -q '^  watch ' || fail "--help does not list watch"
ctl --help | grep -q -- '--interval SECS' || fail "--help does not list --interval"
ctl --help | grep -q -- '--count N' || fail "--help does not list --count"

if command -v script >/dev/null; then
	check "on a terminal (script -qec): every refresh starts with ESC[H ESC[2J"
	svc_start_daemon "$sock" "$log" --config /dev/null
	script -qec "$TPIPCTL_BIN --socket $sock watch --count 2 --interval 0.1" /dev/null \
		</dev/null >"$out" 2>&1 || { cat "$out"; fail "watch under script(1) failed"; }
	n=$(grep -o $'\033\\[H\033\\[2J' "$out" | wc -l)
	[ "$n" -eq 2 ] || { od -c "$out" | head; fail "$n clear sequences, expected 2"; }
	svc_stop_daemon "$SVC_DAEMON_PID"
else
	say "script(1) is not installed: terminal mode not checked"
fi
say "ok"
