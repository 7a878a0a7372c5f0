#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Metrics beyond loopback: two network namespaces joined by a veth pair (10.202.X.1 and .2).
# Without --metrics-allow-remote, --metrics-listen on the first namespace's address is a
# configuration error (exit 2, for --check-config and for a start, naming the option) and
# nothing is bound; with it (as a flag, or as metrics-allow-remote = yes in the file), the daemon
# in the first namespace binds that address, logs that other hosts can read the page, and a
# scrape from the second namespace (another "host") gets the page. Skips (77) where network
# namespaces or veth pairs cannot be made. Namespaces and daemons go away even on failure.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN
need_tool ip
need_tool curl "fetches the metrics page"
need_tool timeout
svc_init

nsa=tpt-ma-$$
nsb=tpt-mb-$$
vea=tpma$$
veb=tpmb$$
net=10.202.$(($$ % 250)).
addr=${net}1
port=9470 # a fresh namespace: nothing else listens there

svc_two_hosts "$nsa" "$nsb" "$vea" "$veb" "$net"

# bound_in_a: is anything listening on $addr:$port in the first namespace?
bound_in_a() { ip netns exec "$nsa" ss -Hltn "src $addr:$port" | grep -q .; }

check "without --metrics-allow-remote, $addr:$port is refused: --check-config exits 2 naming the option"
ip netns exec "$nsa" timeout 10 "$TPIPD_BIN" --config /dev/null --metrics-listen "$addr:$port" \
	--check-config >/dev/null 2>"$SVC_TMP/check.err"
rc=$?
[ "$rc" -eq 2 ] || { cat "$SVC_TMP/check.err"; fail "--check-config: exit $rc, expected 2"; }
grep -q "is not a loopback ADDR:PORT.*--metrics-allow-remote" "$SVC_TMP/check.err" ||
	{ cat "$SVC_TMP/check.err"; fail "the refusal does not name --metrics-allow-remote"; }

check "... and a start exits 2 the same way, binding nothing"
ip netns exec "$nsa" timeout 10 "$TPIPD_BIN" --config /dev/null --socket "$SVC_TMP/refused.sock" \
	--peer-listen off --metrics-listen "$addr:$port" 2>"$SVC_TMP/refused.log"
rc=$?
[ "$rc" -eq 2 ] || { cat "$SVC_TMP/refused.log"; fail "start: exit $rc, expected 2"; }
grep -q -- "--metrics-allow-remote" "$SVC_TMP/refused.log" || fail "the start's refusal does not name the option"
[ ! -e "$SVC_TMP/refused.sock" ] || fail "the refused daemon left its socket"
! bound_in_a || fail "something listens on $addr:$port after the refusal"

check "with the option, --check-config passes and prints it"
ip netns exec "$nsa" "$TPIPD_BIN" --config /dev/null --metrics-listen "$addr:$port" \
	--metrics-allow-remote --check-config >"$SVC_TMP/dump" 2>"$SVC_TMP/check.err" ||
	{ cat "$SVC_TMP/check.err"; fail "--check-config with --metrics-allow-remote failed"; }
grep -qxF "metrics-allow-remote = yes" "$SVC_TMP/dump" || fail "metrics-allow-remote = yes not printed"

# start_a ARGS...: tpipd in the first namespace; waits until it is ready.
start_a() {
	local log=$SVC_TMP/a$1.log
	SVC_LOGS+=("$log")
	shift
	ip netns exec "$nsa" "$TPIPD_BIN" --socket "$SVC_TMP/a.sock" --peer-listen off "$@" 2>"$log" &
	PID_A=$!
	svc_track "$PID_A"
	svc_wait_daemon "$SVC_TMP/a.sock" "$PID_A"
	LOG_A=$log
}

# scrape_from_b: GET /metrics from the second namespace into $SVC_TMP/page.
scrape_from_b() {
	ip netns exec "$nsb" curl -fsS --max-time 5 "http://$addr:$port/metrics" >"$SVC_TMP/page" ||
		fail "GET http://$addr:$port/metrics from $nsb failed"
	grep -q '^tpipd_build_info{version=' "$SVC_TMP/page" || fail "the page has no tpipd_build_info"
	grep -q '^tpipd_sessions ' "$SVC_TMP/page" || fail "the page has no tpipd_sessions"
}

check "--metrics-allow-remote: the page is served to the other namespace, and the start says so"
start_a 1 --config /dev/null --metrics-listen "$addr:$port" --metrics-allow-remote
grep -q "metrics on http://$addr:$port/metrics, open to other hosts" "$LOG_A" ||
	fail "no notice that the metrics page is open to other hosts"
scrape_from_b
say "  scraped $(wc -l <"$SVC_TMP/page") lines from $nsb"
kill "$PID_A"
wait_exit "$PID_A" 10

check "metrics-allow-remote = yes in the file (after metrics-listen) serves it the same way"
printf '[daemon]\nmetrics-listen = %s:%s\nmetrics-allow-remote = yes\n' "$addr" "$port" \
	>"$SVC_TMP/remote.conf"
start_a 2 --config "$SVC_TMP/remote.conf"
scrape_from_b
kill "$PID_A"
wait_exit "$PID_A" 10
