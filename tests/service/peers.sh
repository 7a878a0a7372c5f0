#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Cross-host pipes between two daemons on this machine (--peer-force-cross-host, peer listeners
# on 127.0.0.1 with ports the kernel picks): tp-demo moves shared and private payloads and
# tensors across and verifies every byte; tpipctl peers shows the link; an unknown listener, a
# port nobody listens on, a wrong key and a key on one side only fail the connect with a clear
# error within the connect timeout; malformed frames from a raw TCP client close only that
# connection; SIGKILL of the remote daemon mid-transfer fails both clients within the peer
# timeout, the survivor stays up with its fds back to where they were, and a restarted peer is
# reached by new pipes.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN TP_DEMO_BIN
need_tool jq
need_tool timeout
svc_init

head -c 32 /dev/urandom | base64 >"$SVC_TMP/k1"
head -c 32 /dev/urandom | base64 >"$SVC_TMP/k2"
chmod 600 "$SVC_TMP/k1" "$SVC_TMP/k2"

# start_peer NAME [ARGS...]: daemon NAME on $SVC_TMP/NAME.sock with a loopback peer listener;
# sets PID_<NAME> and PORT_<NAME>. Without --peer-key-file or --peer-insecure in ARGS it gets
# the script's shared key (svc_peer_key).
start_peer() {
	local n=$1 auth=(--peer-key-file "$(svc_peer_key)")
	shift
	case " $* " in *" --peer-key-file "* | *" --peer-insecure "*) auth=() ;; esac
	svc_start_daemon "$SVC_TMP/$n.sock" "$SVC_TMP/$n.log" --config /dev/null \
		--peer-listen 127.0.0.1:0 --peer-force-cross-host --peer-timeout 3000 \
		--peer-connect-timeout 2000 "${auth[@]}" "$@"
	printf -v "PID_$n" '%s' "$SVC_DAEMON_PID"
	local port
	port=$(ctl --socket "$SVC_TMP/$n.sock" --json status | jq -r .peer_listen | sed 's/.*://')
	[ -n "$port" ] && [ "$port" != null ] || fail "daemon $n reports no peer listener"
	printf -v "PORT_$n" '%s' "$port"
}

demo() { timeout 60 "$TP_DEMO_BIN" "$@"; }

# wait_listener DAEMON NAME: until daemon DAEMON lists listener NAME (5 s).
wait_listener() {
	local i
	for ((i = 0; i < 100; i++)); do
		ctl --socket "$SVC_TMP/$1.sock" --json listeners 2>/dev/null | jq -e --arg n "$2" \
			'.listeners[]? | select(.name == $n)' >/dev/null && return 0
		sleep 0.05
	done
	fail "listener $2 did not appear on $1"
}

# transfer FROM TO NAME [demo args]: a listener on TO, a connector on FROM through tpip://.
transfer() {
	local from=$1 to=$2 name=$3 port_var="PORT_$2"
	shift 3
	demo -s "$SVC_TMP/$to.sock" -n "$name" --remote "$@" listen >"$SVC_TMP/listen.out" 2>&1 &
	local lpid=$!
	svc_track "$lpid"
	wait_listener "$to" "$name"
	demo -s "$SVC_TMP/$from.sock" -n "tpip://127.0.0.1:${!port_var}/$name" "$@" connect \
		>"$SVC_TMP/connect.out" 2>&1
	CONNECT_RC=$?
	# A refused connect never reaches the listener: stop it instead of waiting out its timeout.
	[ "$CONNECT_RC" -eq 0 ] || svc_stop_pid "$lpid"
	wait "$lpid"
	LISTEN_RC=$?
}

start_peer a
start_peer b

check "transfers across daemons, every byte verified (shared and private, 3 x 12 MiB)"
transfer a b xdemo -m 3 -z 8
[ "$CONNECT_RC" -eq 0 ] && [ "$LISTEN_RC" -eq 0 ] || {
	cat "$SVC_TMP/connect.out" "$SVC_TMP/listen.out" >&2
	fail "cross-daemon transfer failed (connect $CONNECT_RC, listen $LISTEN_RC)"
}
grep -q "verified 3 messages" "$SVC_TMP/connect.out" || fail "listener did not verify 3 messages"

check "the other direction over the same link, large tensor (256 MiB private)"
transfer b a back -m 1 -z 256
[ "$CONNECT_RC" -eq 0 ] && [ "$LISTEN_RC" -eq 0 ] || {
	cat "$SVC_TMP/connect.out" "$SVC_TMP/listen.out" >&2
	fail "reverse transfer failed"
}

check "tpipctl peers shows the link up with 4 data connections"
ctl --socket "$SVC_TMP/a.sock" --json peers >"$SVC_TMP/peers.json" || fail "tpipctl peers failed"
jq -e '[.peers[] | select(.state == "up" and .data_conns == 4)] | length >= 1' \
	"$SVC_TMP/peers.json" >/dev/null || { cat "$SVC_TMP/peers.json" >&2; fail "no up link"; }
jq -e '[.peers[].bytes_sent] | add > 30000000' "$SVC_TMP/peers.json" >/dev/null ||
	fail "peer byte counters do not show the transfer"
ctl --socket "$SVC_TMP/a.sock" peers | head -1 | grep -q "STATE" || fail "no table header"

check "an unknown listener fails the connect with 'no listener'"
demo -s "$SVC_TMP/a.sock" -n "tpip://127.0.0.1:$PORT_b/nosuch" connect >"$SVC_TMP/c.out" 2>&1 &&
	fail "connect to an unknown listener succeeded"
grep -q "no listener named 'nosuch'" "$SVC_TMP/c.out" || { cat "$SVC_TMP/c.out" >&2; fail "unclear error"; }

check "a port nobody listens on is refused within the connect timeout"
start=$SECONDS
demo -s "$SVC_TMP/a.sock" -n "tpip://127.0.0.1:1/x" connect >"$SVC_TMP/c.out" 2>&1 &&
	fail "connect to port 1 succeeded"
[ $((SECONDS - start)) -le 5 ] || fail "refusal took $((SECONDS - start)) s"
grep -qi "refused" "$SVC_TMP/c.out" || { cat "$SVC_TMP/c.out" >&2; fail "unclear error"; }

check "malformed frames from a raw TCP client close that connection only"
# junk: arbitrary bytes; header: a frame header announcing 2 GiB.
for kind in junk header; do
	exec 7<>"/dev/tcp/127.0.0.1/$PORT_b" || fail "cannot reach b's peer port"
	if [ "$kind" = junk ]; then
		printf 'garbage garbage garbage garbage' >&7
	else
		printf 'TPW1\001\000\000\000\377\377\377\177\000\000\000\000\001\000\000\000\000\000\000\000' >&7
	fi
	timeout 5 cat <&7 >/dev/null 2>&1
	[ $? -ne 124 ] || fail "b did not close a connection that sent $kind"
	exec 7>&-
done
exec 7<>"/dev/tcp/127.0.0.1/$PORT_b" && printf 'TPW' >&7 && exec 7>&-
kill -0 "$PID_b" || fail "b died on malformed input"
grep -q "peer connection from .*\(closing\|refused\)" "$SVC_TMP/b.log" || fail "b logged no reason"
transfer a b afterjunk -m 1 -z 1
[ "$CONNECT_RC" -eq 0 ] || fail "transfer after junk failed"

check "keys: same key works, a wrong key and an unauthenticated (insecure) peer are refused"
start_peer k1 --peer-key-file "$SVC_TMP/k1"
start_peer k2 --peer-key-file "$SVC_TMP/k2"
transfer k1 k2 keyed -m 1 -z 1
[ "$CONNECT_RC" -ne 0 ] || fail "a wrong key was accepted"
grep -q "wrong pre-shared key" "$SVC_TMP/connect.out" || { cat "$SVC_TMP/connect.out" >&2; fail "no key error"; }
grep -q "TLS handshake failed.*wrong pre-shared key" "$SVC_TMP/k2.log" || fail "k2 logged no key error"
start_peer ins --peer-insecure
transfer ins k2 keyed -m 1 -z 1
[ "$CONNECT_RC" -ne 0 ] || fail "a daemon without authentication was accepted"
grep -q "TLS-authenticated" "$SVC_TMP/connect.out" || { cat "$SVC_TMP/connect.out" >&2; fail "no auth error"; }
start_peer k3 --peer-key-file "$SVC_TMP/k1"
transfer k1 k3 keyed -m 1 -z 1
[ "$CONNECT_RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "the same key was refused"; }
ctl --socket "$SVC_TMP/k1.sock" --json peers |
	jq -e '[.peers[] | select(.authenticated and .state == "up")] | length == 1' >/dev/null ||
	fail "k1 shows no authenticated link"

check "SIGKILL of the remote daemon mid-transfer fails both clients; the survivor recovers"
fds_before=$(ls "/proc/$PID_a/fd" | wc -l)
demo -s "$SVC_TMP/b.sock" -n big --remote -m 40 -z 256 listen >"$SVC_TMP/listen.out" 2>&1 &
lpid=$!
svc_track "$lpid"
wait_listener b big
demo -s "$SVC_TMP/a.sock" -n "tpip://127.0.0.1:$PORT_b/big" -m 40 -z 256 connect \
	>"$SVC_TMP/connect.out" 2>&1 &
cpid=$!
svc_track "$cpid"
# Kill only once tensor bytes flow (the mpt channel counts them), never after the end.
for ((i = 0; i < 200; i++)); do
	ctl --socket "$SVC_TMP/b.sock" --json stats 2>/dev/null |
		jq -e '[.channels[]? | select(.name == "mpt") | .bytes] | add > 0' >/dev/null &&
		break
	kill -0 "$cpid" 2>/dev/null || { cat "$SVC_TMP/connect.out" >&2; fail "connector ended early"; }
	sleep 0.05
done
[ "$i" -lt 200 ] || fail "no tensor bytes crossed within 10 s"
kill -KILL "$PID_b"
killed=$SECONDS
wait "$cpid" && fail "the connector succeeded although the remote daemon was killed"
[ $((SECONDS - killed)) -le 10 ] || fail "connector took $((SECONDS - killed)) s to fail"
wait "$lpid" && fail "the listener succeeded although its daemon was killed"
kill -0 "$PID_a" || fail "the surviving daemon died"
for ((i = 0; i < 100; i++)); do
	[ "$(ls "/proc/$PID_a/fd" | wc -l)" -le "$fds_before" ] && break
	sleep 0.1
done
[ "$(ls "/proc/$PID_a/fd" | wc -l)" -le "$fds_before" ] ||
	fail "daemon a holds $(ls "/proc/$PID_a/fd" | wc -l) fds, had $fds_before"
start_peer b2
transfer a b2 again -m 1 -z 4
[ "$CONNECT_RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "a restarted peer is not reachable"; }

for n in a k1 k2 k3 ins b2; do
	pid_var="PID_$n"
	svc_stop_daemon "${!pid_var}"
done
say "ok"
