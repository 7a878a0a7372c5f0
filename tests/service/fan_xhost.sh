#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# The daemon's fan-out across hosts (docs/fanout.md): two daemons in two network namespaces joined
# by a veth pair. A server on a broadcasts to 4 readers, 2 on a and 2 on b (tpip://a/fan), each
# broadcast one request to a's daemon: private memory (read once into a's staging for the local
# readers), a shared buffer and a small private message; every reader gets each message's bytes,
# in order, and a's counters show one staging read; the link carries each large broadcast once
# (PeerBcast: b stages it once for its 2 readers). Then a reader on b SIGKILLed on its first
# descriptor fails only its own pipe: the other 3 get every message. Skips (77) where network
# namespaces or veth pairs cannot be made.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN FAN_XHOST_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

SIZE=$((4 << 20))
nsa=tpf-a-$$
nsb=tpf-b-$$
vea=tpfa$$
veb=tpfb$$
net=10.204.$(($$ % 250)).
A="tpip://${net}1:7420"

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

# bg ID HOST ARGS...: fan_xhost in the background, output in $SVC_TMP/ID.out, pid in PID_ID.
bg() {
	local id=$1 host=$2
	shift 2
	timeout 90 "$FAN_XHOST_BIN" "$SVC_TMP/$host.sock" "$@" >"$SVC_TMP/$id.out" 2>&1 </dev/null &
	printf -v "PID_$id" '%s' "$!"
	svc_track "$!"
}
out_has() { grep -qE -- "$2" "$SVC_TMP/$1.out"; }
done_pid() { local v="PID_$1"; wait_exit "${!v}" "$2"; }
status_a() { ctl --socket "$SVC_TMP/a.sock" --json status | jq -r ".$1"; }

# run NAME DIE: a server on a and readers a1 a2 (on a), b1 b2 (on b; b2 dies if DIE is "die")
run() {
	local name=$1 die=$2
	bg "srv$name" a server "fan$name" 4 "$SIZE"
	wait_until 10 "the server to listen" out_has "srv$name" "^listening$"
	bg "a1$name" a reader "fan$name"
	bg "a2$name" a reader "fan$name"
	bg "b1$name" b reader "$A/fan$name"
	bg "b2$name" b reader "$A/fan$name" $die
	done_pid "srv$name" 60
	[ "$SVC_STATUS" = 0 ] || fail "server: $(cat "$SVC_TMP/srv$name.out")"
	for r in a1 a2 b1 b2; do
		[ "$r" = b2 ] && [ -n "$die" ] && continue
		done_pid "$r$name" 30
		[ "$SVC_STATUS" = 0 ] || fail "reader $r: $(cat "$SVC_TMP/$r$name.out")"
		[ "$(grep -cE '^read [0-2] ok$' "$SVC_TMP/$r$name.out")" = 3 ] &&
			out_has "$r$name" "^end$" || fail "reader $r: $(cat "$SVC_TMP/$r$name.out")"
	done
}

check "one broadcast request to 2 readers on a and 2 on b: every reader gets every message"
run 1 ""
for round in 0 1 2; do
	out_has srv1 "^round $round: delivered 4 fanout daemon$" ||
		fail "server: $(cat "$SVC_TMP/srv1.out")"
done
[ "$(status_a bcast_requests)" = 3 ] || fail "bcast_requests $(status_a bcast_requests)"
[ "$(status_a bcast_targets)" = 12 ] || fail "bcast_targets $(status_a bcast_targets)"
# the private 4 MiB once for a's 2 readers (the small one travels inline, the shared buffer in place)
[ "$(status_a bcast_staged_bytes)" = "$SIZE" ] ||
	fail "bcast_staged_bytes $(status_a bcast_staged_bytes), want $SIZE"
[ "$(status_a bcast_stage_held)" = 0 ] || fail "staging still held"
# b read the private and the shared 4 MiB once each for its 2 readers
staged_b=$(ctl --socket "$SVC_TMP/b.sock" --json status | jq -r .bcast_staged_bytes)
[ "$staged_b" = $((2 * SIZE)) ] || fail "b's bcast_staged_bytes $staged_b, want $((2 * SIZE))"

check "a reader on b killed on its first descriptor fails only its own pipe"
run 2 die
done_pid b22 30
[ "$SVC_STATUS" = 137 ] || fail "the reader on b did not die: $SVC_STATUS"
out_has srv2 "^round 0: delivered 3 fanout daemon$" || fail "server: $(cat "$SVC_TMP/srv2.out")"
out_has srv2 "^round 2: delivered 3 fanout daemon$" || fail "server: $(cat "$SVC_TMP/srv2.out")"
[ "$(status_a bcast_stage_held)" = 0 ] || fail "staging still held"
say "ok"
