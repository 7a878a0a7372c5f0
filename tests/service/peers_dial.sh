#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Dialling a peer by a host name with several addresses. Both daemons run in a network namespace
# of the test's own making: lo, plus a veth pair (10.202.X.1/24) into a second namespace where
# nothing answers, with neighbour entries that send 10.202.X.2 and .3 to a MAC address nobody
# has, so those two drop every packet. Daemon b listens on 127.0.0.1 only; daemon a sees a hosts
# file of the test's own
# (a mount namespace binds it over /etc/hosts for that daemon alone) where
#   tp-dual   is ::1 then 127.0.0.1      (nothing listens on the first),
#   tp-silent is 10.202.X.2 then 127.0.0.1 (the first drops every packet),
#   tp-dead   is 10.202.X.2 then 10.202.X.3.
# A pipe to tp-dual and to tp-silent must cross, a's log naming the address it gave up on; a
# closed port on tp-dual must fail with ECONNREFUSED naming both addresses; tp-dead must fail
# with ETIMEDOUT within the connect timeout plus slack, naming both. A third daemon listening on
# [::] is then dialled at the link-local address of the veth end with its zone (%DEV). Skips (77) where namespaces,
# veth pairs, neighbour entries or mount namespaces cannot be made. Namespaces and daemons go
# away even on failure.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN XFER_TOOL_BIN
need_tool ip
need_tool jq
need_tool timeout
need_tool unshare
need_tool mount
svc_init

CONNECT_TIMEOUT_MS=2000
SLACK_MS=1500
ns=tpt-dial-$$
void=tpt-void-$$
net=10.202.$(($$ % 250)).

svc_netns "$ns" "$void"
ip -n "$ns" link set lo up || fail "lo up"
ip link add tpdial$$ netns "$ns" type veth peer name tpvoid$$ netns "$void" 2>/dev/null ||
	skip "cannot create a veth pair here"
ip -n "$ns" addr add "${net}1/24" dev tpdial$$ || fail "address on the veth end"
ip -n "$ns" link set tpdial$$ up || fail "veth end up"
ip -n "$void" link set tpvoid$$ up || fail "the void's veth end up"
for h in 2 3; do
	ip -n "$ns" neigh add "${net}$h" lladdr 02:00:5e:00:53:0$h dev tpdial$$ 2>/dev/null ||
		skip "cannot add neighbour entries here (ip neigh add)"
done

hosts=$SVC_TMP/hosts
cat >"$hosts" <<EOF
::1 tp-dual
127.0.0.1 tp-dual
${net}2 tp-silent
127.0.0.1 tp-silent
${net}2 tp-dead
${net}3 tp-dead
EOF
ip netns exec "$ns" unshare -m mount --bind "$hosts" /etc/hosts 2>/dev/null ||
	skip "cannot bind a hosts file over /etc/hosts in a mount namespace here (unshare -m)"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

SVC_LOGS+=("$SVC_TMP/b.log" "$SVC_TMP/a.log")
ip netns exec "$ns" "$TPIPD_BIN" --socket "$SVC_TMP/b.sock" --config /dev/null \
	--peer-listen 127.0.0.1:0 --peer-force-cross-host --peer-key-file "$(svc_peer_key)" \
	2>"$SVC_TMP/b.log" &
PID_b=$!
svc_track "$PID_b"
svc_wait_daemon "$SVC_TMP/b.sock" "$PID_b"
port=$(ctl --socket "$SVC_TMP/b.sock" --json status | jq -r '.peer_listen' | sed 's/.*://')
[ -n "$port" ] && [ "$port" -gt 0 ] || fail "no peer port for b"
# `exec` keeps the daemon's pid the one tracked here, with the hosts file bound in its own
# mount namespace only.
ip netns exec "$ns" unshare -m sh -c 'mount --bind "$1" /etc/hosts && shift && exec "$@"' sh \
	"$hosts" "$TPIPD_BIN" --socket "$SVC_TMP/a.sock" --config /dev/null --peer-listen off \
	--peer-force-cross-host --peer-connect-timeout "$CONNECT_TIMEOUT_MS" --log-level info \
	--peer-key-file "$(svc_peer_key)" \
	2>"$SVC_TMP/a.log" &
PID_a=$!
svc_track "$PID_a"
svc_wait_daemon "$SVC_TMP/a.sock" "$PID_a"

# cross NAME HOST [DAEMON PORT]: one 1 MiB message from a client of a to a listener NAME on
# DAEMON (default b, on $port), dialled as tpip://HOST:PORT/NAME.
cross() {
	local sock=$SVC_TMP/${3:-b}.sock to_port=${4:-$port}
	timeout 60 "$XFER_TOOL_BIN" -s "$sock" -t 20000 listen "$1" 1M >"$SVC_TMP/l.out" 2>&1 &
	local lpid=$! i
	svc_track "$lpid"
	for ((i = 0; i < 200; i++)); do
		ctl --socket "$sock" --json listeners 2>/dev/null | jq -e --arg n "$1" \
			'.listeners[]? | select(.name == $n)' >/dev/null && break
		sleep 0.05
	done
	timeout 60 "$XFER_TOOL_BIN" -s "$SVC_TMP/a.sock" connect "tpip://$2:$to_port/$1" 1M \
		>"$SVC_TMP/c.out" 2>&1 || { cat "$SVC_TMP/c.out" "$SVC_TMP/l.out" >&2;
		fail "no pipe to $2"; }
	wait "$lpid" || { cat "$SVC_TMP/l.out" >&2; fail "listener of $1"; }
}

# dial_fails HOST PORT WANT_ERRNO_NAME MAX_MS: a connect that must fail so, in time.
dial_fails() {
	local t0 ms
	t0=$(now_ms)
	timeout 60 "$XFER_TOOL_BIN" -s "$SVC_TMP/a.sock" connect "tpip://$1:$2/x" 1 \
		>"$SVC_TMP/c.out" 2>&1 && fail "a connect to $1:$2 succeeded"
	ms=$(($(now_ms) - t0))
	say "$1:$2 after $ms ms: $(tail -1 "$SVC_TMP/c.out")"
	grep -q "($3," "$SVC_TMP/c.out" || fail "$1:$2: want $3"
	[ "$ms" -le "$4" ] || fail "$1:$2: the error took $ms ms, want <= $4"
}

check "a name whose first address (::1) has no listener reaches b on its second"
cross dual tp-dual
grep -q "\[::1\]:$port: .*trying the next address" "$SVC_TMP/a.log" ||
	fail "a did not log giving up on [::1]:$port"

check "a name whose first address drops packets reaches b within the connect timeout"
t0=$(now_ms)
cross silent tp-silent
ms=$(($(now_ms) - t0))
say "tp-silent crossed after $ms ms"
grep -q "${net}2:$port: no answer; trying the next address" "$SVC_TMP/a.log" ||
	fail "a did not log giving up on ${net}2:$port"
[ "$ms" -le $((CONNECT_TIMEOUT_MS + SLACK_MS)) ] || fail "tp-silent took $ms ms"

check "a closed port fails with ECONNREFUSED, naming both addresses"
closed=$((port == 65535 ? port - 1 : port + 1))
dial_fails tp-dual "$closed" ECONNREFUSED $((CONNECT_TIMEOUT_MS + SLACK_MS))
grep -q "\[::1\]:$closed: .*; 127.0.0.1:$closed: Connection refused" "$SVC_TMP/c.out" ||
	fail "the error does not name both addresses"

check "two silent addresses fail with ETIMEDOUT within the connect timeout, naming both"
dial_fails tp-dead "$port" ETIMEDOUT $((CONNECT_TIMEOUT_MS + SLACK_MS))
grep -q "${net}2:$port: no answer; ${net}3:$port: no answer" "$SVC_TMP/c.out" ||
	fail "the error does not name both addresses"

check "a link-local IPv6 address with its zone (tpip://[fe80::...%DEV]:PORT/NAME) is dialled"
lladdr=$(ip -n "$ns" -6 -o addr show dev tpdial$$ scope link 2>/dev/null |
	awk '!/tentative/ { sub(/\/.*/, "", $4); print $4; exit }')
if [ -z "$lladdr" ]; then
	say "skipped: no usable link-local address on tpdial$$ (IPv6 off in this namespace)"
else
	SVC_LOGS+=("$SVC_TMP/c.log")
	ip netns exec "$ns" "$TPIPD_BIN" --socket "$SVC_TMP/c.sock" --config /dev/null \
		--peer-listen "[::]:0" --peer-force-cross-host --peer-key-file "$(svc_peer_key)" \
		2>"$SVC_TMP/c.log" &
	PID_c=$!
	svc_track "$PID_c"
	svc_wait_daemon "$SVC_TMP/c.sock" "$PID_c"
	cport=$(ctl --socket "$SVC_TMP/c.sock" --json status | jq -r '.peer_listen' | sed 's/.*://')
	cross linklocal "[$lladdr%tpdial$$]" c "$cport"
	# c names the link by the address it came from, zone included.
	grep -q "peer [0-9]* (\[fe80::[0-9a-f:]*%tpdial$$\]:[0-9]*): link up" "$SVC_TMP/c.log" ||
		fail "c does not name the link-local peer with its zone"
	svc_stop_daemon "$PID_c"
fi

kill -0 "$PID_a" && kill -0 "$PID_b" || fail "a daemon died"
svc_stop_daemon "$PID_a"
svc_stop_daemon "$PID_b"
say "ok"
