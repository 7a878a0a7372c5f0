#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Peer links authenticated by certificates from a cluster CA (mutual TLS), and the data
# encryption switch. Two daemons with certificates for 127.0.0.1 move verified bytes both ways;
# tpipctl peers shows the certificate identity; a link accepted from a peer whose certificate
# names the dialled host serves later dials to it (item 4), so the pair keeps one link; a daemon
# whose certificate comes from another CA, or names another host, is refused on both ends with a
# clear error; peer-data-encryption = no on both ends works and shows in tpipctl peers, and a
# mismatch of that setting fails the link saying so. Fails on a daemon without TLS (no --peer-cert).
. "$(dirname -- "$0")/../service/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN XFER_TOOL_BIN
need_tool jq
need_tool openssl
need_tool timeout
svc_init

cd "$SVC_TMP" || fail "cd"
# ca, ca2: two cluster CAs; a, b: 127.0.0.1 from ca; x: 127.0.0.1 from ca2; w: another host.
mkcert() { # NAME CA SAN
	openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$1.key" \
		-out "$1.csr" -subj "/CN=$1" >/dev/null 2>&1 &&
		printf 'subjectAltName=%s\n' "$3" >"$1.ext" &&
		openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial \
			-out "$1.crt" -days 2 -extfile "$1.ext" >/dev/null 2>&1 || fail "cert $1"
	chmod 600 "$1.key"
}
for ca in ca ca2; do
	openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$ca.key" \
		-out "$ca.crt" -subj "/CN=$ca" -days 2 >/dev/null 2>&1 || fail "CA $ca"
done
mkcert a ca IP:127.0.0.1
mkcert b ca IP:127.0.0.1
mkcert x ca2 IP:127.0.0.1
mkcert w ca DNS:elsewhere.test

# start NAME CERT CA [ARGS...]: daemon NAME with a loopback peer listener; sets PORT_<NAME>.
start() {
	local n=$1 cert=$2 ca=$3
	shift 3
	svc_start_daemon "$SVC_TMP/$n.sock" "$SVC_TMP/$n.log" --config /dev/null \
		--peer-listen 127.0.0.1:0 --peer-force-cross-host --peer-connect-timeout 2000 \
		--peer-cert "$cert.crt" --peer-cert-key "$cert.key" --peer-ca "$ca.crt" "$@"
	printf -v "PID_$n" '%s' "$SVC_DAEMON_PID"
	local port
	port=$(ctl --socket "$SVC_TMP/$n.sock" --json status | jq -r .peer_listen | sed 's/.*://')
	[ -n "$port" ] && [ "$port" != null ] || fail "daemon $n reports no peer listener"
	printf -v "PORT_$n" '%s' "$port"
}

has_listener() { # DAEMON NAME
	ctl --socket "$SVC_TMP/$1.sock" --json listeners |
		jq -e --arg n "$2" '.listeners[]? | select(.name == $n)'
}

# xfer FROM TO NAME [LISTEN_OPTION...]: one 4 MiB message from a client of FROM to listener NAME
# on TO (which takes pipes from any peer, or as the options say); sets RC.
xfer() {
	local port_var="PORT_$2"
	timeout 30 "$XFER_TOOL_BIN" -s "$SVC_TMP/$2.sock" -t 10000 "${@:4}" listen "$3" 4194304 \
		>"$SVC_TMP/listen.out" 2>&1 &
	local lpid=$!
	svc_track "$lpid"
	wait_until 5 "listener $3 on $2" has_listener "$2" "$3"
	timeout 30 "$XFER_TOOL_BIN" -s "$SVC_TMP/$1.sock" -t 10000 connect \
		"tpip://127.0.0.1:${!port_var}/$3" 4194304 >"$SVC_TMP/connect.out" 2>&1
	RC=$?
	[ "$RC" -eq 0 ] || svc_stop_pid "$lpid"
	wait "$lpid"
}

check "certificates from one CA: bytes cross both ways over one link"
start a a ca
start b b ca
xfer a b one
[ "$RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "a -> b failed"; }
xfer b a two
[ "$RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "b -> a failed"; }
ctl --socket "$SVC_TMP/b.sock" --json peers >"$SVC_TMP/peers.json" || fail "tpipctl peers"
jq -e '.peers | length == 1' "$SVC_TMP/peers.json" >/dev/null ||
	{ cat "$SVC_TMP/peers.json" >&2; fail "b dialled a again although a's certificate names it"; }
jq -e '.peers[0].identity == "cert:CN=a,IP:127.0.0.1" and .peers[0].authenticated' \
	"$SVC_TMP/peers.json" >/dev/null || { cat "$SVC_TMP/peers.json" >&2; fail "no identity"; }
ctl --socket "$SVC_TMP/b.sock" --json status | jq -e '.peer_auth | startswith("tls")' \
	>/dev/null || fail "status does not say tls"

check "a listener that names its peers: cert:HOST and the exact identity admit a, others not"
xfer a b seven --remote-peer cert:127.0.0.1
[ "$RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "cert:127.0.0.1 did not admit a"; }
xfer a b eight --remote-peer "cert:CN=a,IP:127.0.0.1"
[ "$RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "a's exact identity did not admit a"; }
for entry in cert:gpu99.invalid psk "cert:CN=b,IP:127.0.0.1" cert:CN=a; do
	xfer a b nine --remote-peer "$entry"
	[ "$RC" -ne 0 ] || fail "a listener admitting only '$entry' took a's pipe"
	grep -q "accepts pipes from other hosts" "$SVC_TMP/connect.out" ||
		{ cat "$SVC_TMP/connect.out" >&2; fail "unclear refusal for '$entry'"; }
done

check "a certificate from another CA is refused on both ends"
start x x ca2
xfer x b three
[ "$RC" -ne 0 ] || fail "a certificate of another CA was accepted"
grep -q "TLS handshake failed" "$SVC_TMP/connect.out" || { cat "$SVC_TMP/connect.out" >&2; fail "unclear error"; }
wait_until 5 "b's log of the refusal" grep -q "TLS handshake failed" "$SVC_TMP/b.log"

check "a certificate that does not name the dialled host is refused"
start w w ca
xfer a w four
[ "$RC" -ne 0 ] || fail "a certificate for another host was accepted"
grep -q "certificate refused" "$SVC_TMP/connect.out" ||
	{ cat "$SVC_TMP/connect.out" >&2; fail "unclear error"; }

check "peer-data-encryption = no on both ends: authenticated, tensor bytes plaintext"
start p1 a ca --peer-data-encryption no
start p2 b ca --peer-data-encryption no
xfer p1 p2 five
[ "$RC" -eq 0 ] || { cat "$SVC_TMP/connect.out" >&2; fail "plaintext data failed"; }
ctl --socket "$SVC_TMP/p1.sock" --json peers |
	jq -e '.peers[0].security == "tls, data plaintext" and .peers[0].authenticated' >/dev/null ||
	fail "tpipctl peers does not show plaintext data"

check "a data encryption mismatch fails the link saying so"
xfer p1 b six
[ "$RC" -ne 0 ] || fail "a data encryption mismatch was accepted"
grep -q "peer-data-encryption differs" "$SVC_TMP/connect.out" ||
	{ cat "$SVC_TMP/connect.out" >&2; fail "unclear error"; }

for n in a b x w p1 p2; do
	pid_var="PID_$n"
	svc_stop_daemon "${!pid_var}"
done
say "ok"
