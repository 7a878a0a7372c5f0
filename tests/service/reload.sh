#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# SIGHUP reload: a changed file is applied (live options) or reported as needing a restart
# (copy-threads); a broken file is refused, the running configuration stays and the daemon keeps
# serving; it still stops cleanly afterwards.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN
svc_init

sock=$SVC_TMP/tpipd.sock
conf=$SVC_TMP/tpipd.conf
log=$SVC_TMP/tpipd.log

# Replaces the config file atomically, as an editor or a package manager would.
write_conf() {
	# shellcheck disable=SC2059 # callers pass printf formats
	printf "$1" >"$conf.new" && mv "$conf.new" "$conf"
}

log_has() { grep -qF -- "$1" "$log"; }

write_conf '[limits]\nsegments-max = 4\n'
say "starting tpipd with [limits] segments-max = 4"
svc_start_daemon "$sock" "$log" --config "$conf"
pid=$SVC_DAEMON_PID

check "tpipctl status answers"
ctl --socket "$sock" status >/dev/null || fail "tpipctl status failed"

check "stderr is a file, not the journal: every line has the time after its <N> priority"
stamp='^<[0-7]>[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}[+-][0-9]{4} '
grep -qE "${stamp}tpipd .* ready on " "$log" || { cat "$log"; fail "no timestamp on the ready line"; }
if grep -vqE "$stamp" "$log"; then
	grep -vE "$stamp" "$log"
	fail "log lines without a timestamp"
fi

check "the running configuration has segments-max = 4 (--check-config of the same file)"
"$TPIPD_BIN" --config "$conf" --check-config | grep -qxF "segments-max = 4" ||
	fail "segments-max = 4 not in effect"

write_conf '[daemon]\nlog-level = debug\ncopy-threads = 3\n[limits]\nsegments-max = 4\n'
check "SIGHUP with log-level = debug and copy-threads = 3: 'reloaded' and 'needs a restart: copy-threads'"
kill -HUP "$pid"
wait_until 10 "'reloaded' in the log" log_has "reloaded $conf"
wait_until 5 "'needs a restart: copy-threads' in the log" log_has "needs a restart: copy-threads"
grep -F "reloaded $conf" "$log" | sed "s/^/$SVC_NAME:   /"
grep -qF "2 options changed" "$log" || fail "the reload line does not count 2 changed options"

check "log-level = debug is live: a new control session is logged at debug level"
lines=$(wc -l <"$log")
ctl --socket "$sock" status >/dev/null || fail "tpipctl status failed after the reload"
wait_until 5 "a debug line (<7>) after the reload" \
	sh -c "tail -n +$((lines + 1)) '$log' | grep -q '^<7>'"

printf '[limits]\nsegments-max = lots\n' >"$conf"
check "SIGHUP with a broken file: 'reload failed', the daemon keeps serving"
kill -HUP "$pid"
wait_until 10 "'reload failed' in the log" log_has "reload failed"
grep -F "reload failed" "$log" | sed "s/^/$SVC_NAME:   /"
log_has "$conf:2: segments-max: 'lots'" || fail "the failure does not name $conf:2 and the key"
kill -0 "$pid" 2>/dev/null || fail "tpipd exited after a failed reload"
ctl --socket "$sock" status >/dev/null || fail "tpipctl status failed after a failed reload"

check "SIGTERM: exit status 0"
svc_stop_daemon "$pid"
say "ok"
