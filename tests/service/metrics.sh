#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The Prometheus endpoint: off by default; with --metrics-listen on a loopback address, GET
# /metrics serves the gauges, counters and per-channel histograms in the text format (and they
# move after a message), other paths are 404; a non-loopback address is refused before anything
# is bound.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN EXAMPLE_CLIENT_BIN
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
	"$TPIPD_BIN" --socket "$sock" --peer-listen off --metrics-listen "127.0.0.1:$candidate" 2>"$log" &
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

check "GET /metrics: text format, tpipd_up 1, gauges and channel series"
page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
grep -qx "tpipd_up 1" <<<"$page" || fail "tpipd_up 1 missing"
for m in tpipd_sessions tpipd_pipes tpipd_listeners tpipd_messages_moved_total \
	tpipd_bytes_moved_total 'tpipd_channel_transfers_total{channel="shm"}' \
	'tpipd_channel_copy_seconds_bucket{channel="shm",le="+Inf"}' \
	'tpipd_channel_copy_seconds_sum{channel="shm"}'; do
	grep -qF -- "$m" <<<"$page" || fail "series $m missing"
done
grep -q "^# TYPE tpipd_channel_copy_seconds histogram" <<<"$page" || fail "no histogram TYPE line"
ctype=$(curl -fsS --max-time 5 -o /dev/null -w '%{content_type}' "$url/metrics")
[[ $ctype == text/plain* ]] || fail "content type is '$ctype'"

check "the counters move after a message"
"$EXAMPLE_CLIENT_BIN" "$sock" >"$SVC_TMP/client.out" 2>&1 ||
	{ cat "$SVC_TMP/client.out"; fail "example client failed"; }
page=$(curl -fsS --max-time 5 "$url/metrics") || fail "GET /metrics failed"
moved=$(awk '$1 == "tpipd_messages_moved_total" { print $2 }' <<<"$page")
[ "${moved:-0}" -ge 1 ] || fail "tpipd_messages_moved_total is '$moved' after a message"
say "  tpipd_messages_moved_total $moved"

check "other paths are 404"
code=$(curl -s --max-time 5 -o /dev/null -w '%{http_code}' "$url/nope")
[ "$code" = 404 ] || fail "GET /nope answered $code"

svc_stop_daemon "$pid"
say "ok"
