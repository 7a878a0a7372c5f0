#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The Prometheus endpoint: off by default; with --metrics-listen on a loopback address, GET /metrics
# serves the gauges, counters and per-channel histograms in the text format (and they move after a
# message) by Prometheus conventions (tpipd_build_info with the version, process_start_time_seconds
# as unix time, no tpipd_up or integer uptime, exact increasing bucket bounds ending in +Inf,
# per-peer link series labelled by the peer's address, up with bytes both ways after a cross-host
# transfer to a second daemon, the groups' activity after a group across the two daemons has
# come and gone), other paths are 404; a non-loopback address is refused before anything is
# bound.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN EXAMPLE_CLIENT_BIN TP_DEMO_BIN
need_tool curl "fetches the metrics page"
svc_init

sock=$SVC_TMP/tpipd.sock
log=$SVC_TMP/tpipd.log

check "a non-loopback metrics address is a configuration error (exit 2), nothing is served"
timeout 10 "$TPIPD_BIN" --socket "$SVC_TMP/refused.sock" --peer-listen off --metrics-listen 192.0.2.1:9470 \
	2>"$SVC_TMP/refused.log"
rc=$?
[ "$rc" -eq 2 ] || fail "tpipd with a non-loopback metrics address: exit $rc, expected 2"
grep -q "is not a loopback ADDR:PORT" "$SVC_TMP/refused.log" ||
	fail "no clear message for a non-loopback metrics address"
[ ! -e "$SVC_TMP/refused.sock" ] || fail "the refused daemon left its socket"

# A free loopback port: try a few in the dynamic range until the daemon binds one.
port=
for try in 1 2 3 4 5 6 7 8; do
	candidate=$((20000 + (RANDOM % 20000)))
	rm -f "$log"
	"$TPIPD_BIN" --socket "$sock" --config /dev/null --peer-listen 127.0.0.1:0 \
		--peer-force-cross-host --peer-key-file "$(svc_peer_key)" \
		--metrics-listen "127.0.0.1:$candidate" 2>"$log" &
	pid=$!
	svc_track "$pid"
	SVC_LOGS+=("$log")
	wait_until 10 "tpipd ready or gone" bash -c "grep -q ' ready on ' '$log' || ! kill -0 $pid 2>/dev/null"
	if kill -0 "$pid" 2>/dev/null; then
		port=$candidate
		break
	fi
	say "port $candidate was taken (try $try)"
done
[ -n "$port" ] || fail "no free loopback port found for the metrics endpoint"
url=http://127.0.0.1:$port

check "GET /metrics: text format, build info, start time, gauges and channel series"
page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
version=$("$TPIPD_BIN" --version | awk '{ print $2 }')
grep -qxF "tpipd_build_info{version=\"$version\"} 1" <<<"$page" ||
	fail "tpipd_build_info{version=\"$version\"} 1 missing"
! grep -qE '^tpipd_(up|uptime_seconds)[ {]' <<<"$page" ||
	fail "tpipd_up or tpipd_uptime_seconds still served"
start=$(awk '$1 == "process_start_time_seconds" { print $2 }' <<<"$page")
[[ $start =~ ^[0-9]+\.[0-9]+$ ]] || fail "process_start_time_seconds is '$start', not a float"
now=$(date +%s)
awk -v s="$start" -v n="$now" 'BEGIN { exit !(s > n - 60 && s <= n + 1) }' ||
	fail "process_start_time_seconds $start is not within the last minute (now $now)"
page2=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
[ "$(awk '$1 == "process_start_time_seconds" { print $2 }' <<<"$page2")" = "$start" ] ||
	fail "process_start_time_seconds changes between scrapes"
for m in tpipd_sessions tpipd_pipes tpipd_listeners tpipd_messages_moved_total \
	tpipd_bytes_moved_total 'tpipd_channel_transfers_total{channel="shm"}' \
	'tpipd_channel_copy_seconds_bucket{channel="shm",le="+Inf"}' \
	'tpipd_channel_copy_seconds_sum{channel="shm"}'; do
	grep -qF -- "$m" <<<"$page" || fail "series $m missing"
done
grep -q "^# TYPE tpipd_channel_copy_seconds histogram" <<<"$page" || fail "no histogram TYPE line"
for m in tpipd_peer_bytes_sent_total tpipd_peer_bytes_received_total tpipd_peer_up; do
	grep -q "^# TYPE $m " <<<"$page" || fail "no TYPE line for the per-peer series $m"
done

check "bucket bounds are exact powers of two microseconds, increasing, the last +Inf"
les=$(sed -n 's/^tpipd_channel_copy_seconds_bucket{channel="shm",le="\([^"]*\)"}.*/\1/p' <<<"$page")
expect=$(awk 'BEGIN { us = 2; for (i = 0; i < 25; i++) {
	printf "%d.%06d\n", int(us / 1e6), us % 1e6; us *= 2 } print "+Inf" }')
[ "$les" = "$expect" ] || fail "le bounds are:
$les
expected:
$expect"
ctype=$(curl -fsS --max-time 5 -o /dev/null -w '%{content_type}' "$url/metrics")
[[ $ctype == text/plain* ]] || fail "content type is '$ctype'"

check "the counters move after a message"
"$EXAMPLE_CLIENT_BIN" "$sock" >"$SVC_TMP/client.out" 2>&1 ||
	{ cat "$SVC_TMP/client.out"; fail "example client failed"; }
page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
moved=$(awk '$1 == "tpipd_messages_moved_total" { print $2 }' <<<"$page")
[ "${moved:-0}" -ge 1 ] || fail "tpipd_messages_moved_total is '$moved' after a message"
say "  tpipd_messages_moved_total $moved"

check "a link to a second daemon: tpipd_peer_* series labelled by its address, up, bytes both ways"
svc_start_daemon "$SVC_TMP/b.sock" "$SVC_TMP/b.log" --config /dev/null --peer-listen 127.0.0.1:0 \
	--peer-force-cross-host --peer-key-file "$(svc_peer_key)"
b_pid=$SVC_DAEMON_PID
b_addr=$(ctl --socket "$SVC_TMP/b.sock" --json status |
	sed -n 's/.*"peer_listen": *"\([^"]*\)".*/\1/p')
[[ $b_addr == 127.0.0.1:[0-9]* ]] || fail "daemon b reports peer_listen '$b_addr'"
timeout 60 "$TP_DEMO_BIN" -s "$SVC_TMP/b.sock" -n xmetrics --remote -m 1 -z 1 listen \
	>"$SVC_TMP/listen.out" 2>&1 &
lpid=$!
svc_track "$lpid"
wait_until 10 "listener xmetrics on daemon b" bash -c \
	"'$TPIPCTL_BIN' --socket '$SVC_TMP/b.sock' listeners | grep -q xmetrics"
timeout 60 "$TP_DEMO_BIN" -s "$sock" -n "tpip://$b_addr/xmetrics" -m 1 -z 1 connect \
	>"$SVC_TMP/connect.out" 2>&1 ||
	{ cat "$SVC_TMP/connect.out" "$SVC_TMP/listen.out"; fail "cross-daemon transfer failed"; }
wait "$lpid" || { cat "$SVC_TMP/listen.out"; fail "the listener on daemon b failed"; }
page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
grep -F "{peer=\"$b_addr\"}" <<<"$page" | sed "s/^/$SVC_NAME:   /"
grep -qxF "tpipd_peer_up{peer=\"$b_addr\"} 1" <<<"$page" ||
	fail "tpipd_peer_up{peer=\"$b_addr\"} 1 missing"
for m in tpipd_peer_bytes_sent_total tpipd_peer_bytes_received_total; do
	v=$(awk -v k="$m{peer=\"$b_addr\"}" '$1 == k { print $2 }' <<<"$page")
	[ "${v:-0}" -gt 0 ] || fail "$m{peer=\"$b_addr\"} is '$v' after a transfer"
done
if [ -n "${TP_ALLREDUCE_BIN:-}" ]; then
	check "a group across the two daemons: collectives, their bytes and the leaders' bytes between hosts"
	TPIPD_SOCKET=$sock TP_GROUP_REMOTE=any-peer timeout 60 "$TP_ALLREDUCE_BIN" 0 2 xmetrics \
		--coordinator "tpip://$b_addr" >"$SVC_TMP/ar0.out" 2>&1 &
	apid=$!
	svc_track "$apid"
	TPIPD_SOCKET=$SVC_TMP/b.sock TP_GROUP_REMOTE=any-peer timeout 60 "$TP_ALLREDUCE_BIN" 1 2 \
		xmetrics --coordinator "tpip://$b_addr" >"$SVC_TMP/ar1.out" 2>&1 ||
		{ cat "$SVC_TMP/ar0.out" "$SVC_TMP/ar1.out"; fail "tp-allreduce across the daemons failed"; }
	wait "$apid" || { cat "$SVC_TMP/ar0.out"; fail "tp-allreduce rank 0 failed"; }
	page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
	for m in tpipd_group_collectives_total tpipd_group_bytes_total \
		tpipd_group_xhost_bytes_sent_total tpipd_group_xhost_bytes_received_total; do
		v=$(awk -v k="$m" '$1 == k { print $2 }' <<<"$page")
		say "  $m $v"
		[ "${v:-0}" -gt 0 ] || fail "$m is '$v' after the group's collectives (freed since)"
	done
else
	say "skip: the group metrics need the tp-allreduce example (not built)"
fi
svc_stop_daemon "$b_pid"

check "other paths are 404"
code=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "$url/nope")
[ "$code" = 404 ] || fail "GET /nope answered $code"

svc_stop_daemon "$pid"
say "ok"
