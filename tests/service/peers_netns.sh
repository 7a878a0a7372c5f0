#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Two daemons in two network namespaces joined by a veth pair (10.201.X.1 and .2), each with its
# peer listener on its own namespace address: a pipe between them carries 0 B .. 512 MiB (tp-demo
# verifies every byte), then the link is cut (`ip link set ... down`) during a large transfer and
# both clients must fail within the peer timeout plus slack while both daemons stay up. Skips
# (77) where network namespaces cannot be made. Namespaces and daemons go away even on failure.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN TP_DEMO_BIN
need_tool ip
need_tool timeout
svc_init

nsa=tpt-a-$$
nsb=tpt-b-$$
vea=tpva$$
veb=tpvb$$
net=10.201.$(($$ % 250)).
cleanup_ns() {
	ip netns del "$nsa" 2>/dev/null
	ip netns del "$nsb" 2>/dev/null
}
trap 'cleanup_ns' EXIT
ip netns add "$nsa" 2>/dev/null || skip "cannot create network namespaces here (ip netns add)"
ip netns add "$nsb" || fail "second namespace"
ip link add "$vea" netns "$nsa" type veth peer name "$veb" netns "$nsb" ||
	skip "cannot create a veth pair here"
ip -n "$nsa" addr add "${net}1/24" dev "$vea"
ip -n "$nsb" addr add "${net}2/24" dev "$veb"
ip -n "$nsa" link set "$vea" up
ip -n "$nsb" link set "$veb" up
ip -n "$nsa" link set lo up
ip -n "$nsb" link set lo up

start_ns_daemon() { # NAME NS ADDR
	SVC_LOGS+=("$SVC_TMP/$1.log")
	ip netns exec "$2" "$TPIPD_BIN" --socket "$SVC_TMP/$1.sock" --config /dev/null \
		--peer-listen "$3:7420" --peer-force-cross-host --peer-timeout 3000 \
		--peer-connect-timeout 3000 2>"$SVC_TMP/$1.log" &
	local pid=$!
	svc_track "$pid"
	printf -v "PID_$1" '%s' "$pid"
	local i
	for ((i = 0; i < 200; i++)); do
		ctl --socket "$SVC_TMP/$1.sock" --timeout 1 status >/dev/null 2>&1 && return 0
		kill -0 "$pid" 2>/dev/null || fail "daemon $1 exited during start-up"
		sleep 0.05
	done
	fail "daemon $1 did not start"
}
start_ns_daemon a "$nsa" "${net}1"
start_ns_daemon b "$nsb" "${net}2"

demo() { timeout 90 "$TP_DEMO_BIN" "$@"; }

for mib in 1 64 512; do
	check "a pipe between the namespaces carries ${mib} MiB tensors, verified"
	demo -s "$SVC_TMP/b.sock" -n "ns$mib" -m 2 -z "$mib" listen >"$SVC_TMP/l.out" 2>&1 &
	lpid=$!
	svc_track "$lpid"
	sleep 0.3
	demo -s "$SVC_TMP/a.sock" -n "tpip://${net}2:7420/ns$mib" -m 2 -z "$mib" connect \
		>"$SVC_TMP/c.out" 2>&1 || { cat "$SVC_TMP/c.out" "$SVC_TMP/l.out" >&2; fail "connect side"; }
	wait "$lpid" || { cat "$SVC_TMP/l.out" >&2; fail "listen side"; }
done

check "cutting the link mid-transfer fails both clients within the peer timeout"
demo -s "$SVC_TMP/b.sock" -n cut -m 100 -z 256 listen >"$SVC_TMP/l.out" 2>&1 &
lpid=$!
svc_track "$lpid"
sleep 0.3
demo -s "$SVC_TMP/a.sock" -n "tpip://${net}2:7420/cut" -m 100 -z 256 connect \
	>"$SVC_TMP/c.out" 2>&1 &
cpid=$!
svc_track "$cpid"
sleep 2
ip -n "$nsa" link set "$vea" down
cut=$SECONDS
wait "$cpid" && fail "the connector finished although the link was cut"
wait "$lpid" && fail "the listener finished although the link was cut"
took=$((SECONDS - cut))
[ "$took" -le 8 ] || fail "clients failed $took s after the cut (peer timeout 3 s)"
kill -0 "$PID_a" && kill -0 "$PID_b" || fail "a daemon died when the link was cut"
say "both clients failed ${took} s after the cut: $(tail -1 "$SVC_TMP/c.out")"

svc_stop_daemon "$PID_a"
svc_stop_daemon "$PID_b"
say "ok"
