#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Two daemons in two network namespaces joined by a veth pair (10.201.X.1 and .2), each with its
# peer listener on its own namespace address (clients reach them over their Unix sockets, which
# no network namespace confines): one pipe between them carries 0 B, 1 B, 64 KiB +- 1, 1, 16, 64
# and 512 MiB, every byte verified (xfer_tool); then the link is cut (`ip link set ... down`)
# during a stream of 256 MiB messages and both clients must fail with ECONNRESET within the peer
# timeout plus slack, both daemons stay up, drop the link and reach each other again once the
# link is back. Skips (77) where network namespaces or veth pairs cannot be made. Namespaces
# and daemons go away even on failure.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN XFER_TOOL_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

PEER_TIMEOUT_MS=3000
SLACK_MS=2500
nsa=tpt-a-$$
nsb=tpt-b-$$
vea=tpva$$
veb=tpvb$$
net=10.201.$(($$ % 250)).

svc_two_hosts "$nsa" "$nsb" "$vea" "$veb" "$net"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

start_ns_daemon() { # NAME NS ADDR
	SVC_LOGS+=("$SVC_TMP/$1.log")
	ip netns exec "$2" "$TPIPD_BIN" --socket "$SVC_TMP/$1.sock" --config /dev/null \
		--peer-listen "$3:7420" --peer-force-cross-host --peer-timeout "$PEER_TIMEOUT_MS" \
		--peer-connect-timeout 3000 --peer-key-file "$(svc_peer_key)" 2>"$SVC_TMP/$1.log" &
	local pid=$!
	svc_track "$pid"
	printf -v "PID_$1" '%s' "$pid"
	svc_wait_daemon "$SVC_TMP/$1.sock" "$pid"
}
start_ns_daemon a "$nsa" "${net}1"
start_ns_daemon b "$nsb" "${net}2"

# start_listener NAME SIZE...: xfer_tool listening on b; returns once the listener exists.
start_listener() {
	local name=$1 i
	shift
	timeout 120 "$XFER_TOOL_BIN" -s "$SVC_TMP/b.sock" listen "$name" "$@" \
		>"$SVC_TMP/l.out" 2>&1 &
	LPID=$!
	svc_track "$LPID"
	for ((i = 0; i < 200; i++)); do
		ctl --socket "$SVC_TMP/b.sock" --json listeners 2>/dev/null | jq -e --arg n "$name" \
			'.listeners[]? | select(.name == $n)' >/dev/null && return 0
		kill -0 "$LPID" 2>/dev/null || { cat "$SVC_TMP/l.out" >&2; fail "listener exited"; }
		sleep 0.05
	done
	fail "listener $name did not appear on b"
}

connect_a() { # NAME XFER_TOOL_ARGS...: xfer_tool on a, writing to b's listener NAME
	local name=$1
	shift
	timeout 120 "$XFER_TOOL_BIN" -s "$SVC_TMP/a.sock" connect "tpip://${net}2:7420/$name" "$@"
}

sizes=(0 1 65535 65537 1M 16M 64M 512M)
check "one pipe between the namespaces carries ${sizes[*]} bytes, every byte verified"
start_listener sizes "${sizes[@]}"
connect_a sizes "${sizes[@]}" >"$SVC_TMP/c.out" 2>&1 ||
	{ cat "$SVC_TMP/c.out" "$SVC_TMP/l.out" >&2; fail "connect side"; }
wait "$LPID" || { cat "$SVC_TMP/l.out" >&2; fail "listen side"; }
grep -q "ok: ${#sizes[@]} messages" "$SVC_TMP/l.out" || fail "the listener verified too little"
ctl --socket "$SVC_TMP/a.sock" --json peers |
	jq -e --arg a "${net}2" '[.peers[] | select(.state == "up" and (.address | contains($a)))]
		| length == 1' >/dev/null || fail "a shows no link up to ${net}2"

check "cutting the link mid-transfer fails both clients with ECONNRESET within the peer timeout"
start_listener cut 256M --repeat 1000
connect_a cut 256M --repeat 1000 >"$SVC_TMP/c.out" 2>&1 &
cpid=$!
svc_track "$cpid"
for ((i = 0; i < 400; i++)); do
	grep -q "message 1: " "$SVC_TMP/l.out" && break
	kill -0 "$cpid" 2>/dev/null || { cat "$SVC_TMP/c.out" >&2; fail "connector ended early"; }
	sleep 0.05
done
grep -q "message 1: " "$SVC_TMP/l.out" || fail "no traffic before the cut"
ip -n "$nsa" link set "$vea" down || fail "cannot set $vea down"
cut=$(now_ms)
limit=$((PEER_TIMEOUT_MS + SLACK_MS))
wait_exit "$cpid" $(((limit + 999) / 1000 + 1))
c_rc=$SVC_STATUS c_ms=$(($(now_ms) - cut))
wait_exit "$LPID" $(((limit + 999) / 1000 + 1))
l_rc=$SVC_STATUS l_ms=$(($(now_ms) - cut))
say "connector ended after $c_ms ms: $(tail -1 "$SVC_TMP/c.out")"
say "listener ended after $l_ms ms: $(tail -1 "$SVC_TMP/l.out")"
[ "$c_rc" -ne 0 ] && [ "$l_rc" -ne 0 ] || fail "a client finished although the link was cut"
[ "$c_ms" -le "$limit" ] && [ "$l_ms" -le "$limit" ] ||
	fail "clients failed $c_ms / $l_ms ms after the cut (peer timeout $PEER_TIMEOUT_MS ms)"
grep -q "error after .*ECONNRESET" "$SVC_TMP/c.out" || fail "connector: not ECONNRESET"
grep -q "error after .*ECONNRESET" "$SVC_TMP/l.out" || fail "listener: not ECONNRESET"
kill -0 "$PID_a" && kill -0 "$PID_b" || fail "a daemon died when the link was cut"
for d in a b; do
	wait_until 10 "daemon $d to drop the dead link" \
		sh -c "'$TPIPCTL_BIN' --socket '$SVC_TMP/$d.sock' --json peers |
			jq -e '.peers | length == 0'"
done

check "with the link back, a new pipe crosses again"
ip -n "$nsa" link set "$vea" up || fail "cannot set $vea up"
start_listener again 1M
connect_a again 1M >"$SVC_TMP/c.out" 2>&1 ||
	{ cat "$SVC_TMP/c.out" "$SVC_TMP/l.out" >&2; fail "no pipe after the link came back"; }
wait "$LPID" || { cat "$SVC_TMP/l.out" >&2; fail "listen side after the link came back"; }

svc_stop_daemon "$PID_a"
svc_stop_daemon "$PID_b"
say "ok"
