#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The channel example across hosts (examples/chan_pipeline.c, docs/channels.md "Across hosts"):
# two daemons in two network namespaces joined by a veth pair. `tp-chan-pipeline --serve` on b
# creates ex.in and ex.out for other hosts and runs the worker; `tp-chan-pipeline --remote
# tpip://b` on a writes 1..5 and an item of 4 MiB from a shared buffer (larger than rides inline:
# it crosses over the link's data connections) into b's ex.in, closes it and reads ex.out: the
# five squares, the 4 MiB item's checksum as a computed it (with "(closed)" if the worker's close
# of the cascade came before it was read), then "drained"; both exit 0 and b's link counters show the large item crossed.
# Skips (77) where network namespaces or veth pairs cannot be made.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN TP_CHAN_PIPELINE_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

nsa=tpp-a-$$
nsb=tpp-b-$$
vea=tppa$$
veb=tppb$$
net=10.205.$(($$ % 250)).
B="tpip://${net}2:7420"

svc_two_hosts "$nsa" "$nsb" "$vea" "$veb" "$net"

start_ns_daemon() { # NAME NS ADDR:PORT
	local name=$1 ns=$2 addr=$3
	SVC_LOGS+=("$SVC_TMP/$name.log")
	ip netns exec "$ns" "$TPIPD_BIN" --socket "$SVC_TMP/$name.sock" --config /dev/null \
		--peer-listen "$addr" --peer-force-cross-host --peer-timeout 3000 \
		--peer-connect-timeout 3000 --peer-key-file "$(svc_peer_key)" 2>"$SVC_TMP/$name.log" &
	local pid=$!
	svc_track "$pid"
	svc_wait_daemon "$SVC_TMP/$name.sock" "$pid"
}
start_ns_daemon a "$nsa" "${net}1:7420"
start_ns_daemon b "$nsb" "${net}2:7420"

check "the example's worker serves on b"
ip netns exec "$nsb" env TPIPD_SOCKET="$SVC_TMP/b.sock" timeout 60 "$TP_CHAN_PIPELINE_BIN" \
	--serve >"$SVC_TMP/serve.out" 2>&1 </dev/null &
serve=$!
svc_track "$serve"
wait_until 10 "the worker to be ready" grep -q "^ready$" "$SVC_TMP/serve.out"

check "the example on a writes through tpip://b and reads the cascade back"
out=$(ip netns exec "$nsa" env TPIPD_SOCKET="$SVC_TMP/a.sock" timeout 60 \
	"$TP_CHAN_PIPELINE_BIN" --remote "$B" 2>&1) || fail "tp-chan-pipeline --remote: $out"
want="1
4
9
16
25"
# an item read after the worker's close says "(closed)": the squares are the same
[ "$(printf '%s\n' "$out" | head -5 | sed 's/ (closed)$//')" = "$want" ] || fail "the squares: $out"
printf '%s\n' "$out" | sed -n 6p | grep -qE "^checksum of 4194304 bytes: [0-9]+ \(as sent\)( \(closed\))?$" ||
	fail "the large item: $out"
[ "$(printf '%s\n' "$out" | tail -1)" = drained ] || fail "not drained: $out"
wait_exit "$serve" 30
[ "$SVC_STATUS" = 0 ] || fail "tp-chan-pipeline --serve: $(cat "$SVC_TMP/serve.out")"

check "the large item crossed the link's data connections"
recv=$(ctl --socket "$SVC_TMP/b.sock" --json peers | jq '[.peers[] | .bytes_received] | add')
[ "${recv:-0}" -ge 4194304 ] || fail "b received $recv bytes over the link"
say "ok"
