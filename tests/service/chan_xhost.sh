#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Channels and work queues across hosts (docs/channels.md, docs/queues.md): two daemons in two
# network namespaces joined by a veth pair. A producer on a writes into a channel hosted on b and
# a consumer on b reads it; a reader on a blocked on b's channel wakes for an item written on b
# and for a close; close-then-drain across hosts (items read after the close carry "closed",
# then -EPIPE); a work queue on b whose owner is on b and whose worker is on a, and a worker on a
# SIGKILLed with a question taken (queued again exactly once); a work queue created on b from a
# (chan-remote-create-uid on b) and owned there, worked on b, closed on b when its owner on a is
# SIGKILLed (the waiting worker sees it closed); opens refused where the creator
# did not allow other hosts (or named another peer identity), with the text of a missing name;
# chan-peer-ops-max (4 on a) just below and above, on the hosting side (a channel on a, readers
# on b) and on the forwarding side (a channel on b, readers on a), with a local reader not
# refused; over an unauthenticated link any-peer admits and peers does not, as for listeners;
# packed reads of b's channel from a (several items an answer within the reader's buffer, in
# order; a large item alone; closed, then drained); the link cut fails blocked remote reads (a
# packed one too, having taken nothing) with -ECONNRESET naming the host within the
# peer timeout while a's local channel still works, b queues the question a worker on a
# held again and closes the queue owned from a (its waiting worker sees it closed). Skips (77)
# where network namespaces or veth
# pairs cannot be made.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN CHAN_XHOST_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

PEER_TIMEOUT_MS=3000
OPS_MAX=4
nsa=tpc-a-$$
nsb=tpc-b-$$
vea=tpca$$
veb=tpcb$$
net=10.203.$(($$ % 250)).
A="tpip://${net}1:7420"
B="tpip://${net}2:7420"

svc_two_hosts "$nsa" "$nsb" "$vea" "$veb" "$net"

start_ns_daemon() { # NAME NS ADDR:PORT ARGS... (--peer-insecure: no key)
	local name=$1 ns=$2 addr=$3 auth
	shift 3
	auth=(--peer-key-file "$(svc_peer_key)")
	[ "${1:-}" = --peer-insecure ] && auth=()
	SVC_LOGS+=("$SVC_TMP/$name.log")
	ip netns exec "$ns" "$TPIPD_BIN" --socket "$SVC_TMP/$name.sock" --config /dev/null \
		--peer-listen "$addr" --peer-force-cross-host --peer-timeout "$PEER_TIMEOUT_MS" \
		--peer-connect-timeout 3000 "${auth[@]}" "$@" 2>"$SVC_TMP/$name.log" &
	local pid=$!
	svc_track "$pid"
	svc_wait_daemon "$SVC_TMP/$name.sock" "$pid"
}
start_ns_daemon a "$nsa" "${net}1:7420" --chan-peer-ops-max "$OPS_MAX"
start_ns_daemon b "$nsb" "${net}2:7420" --chan-remote-create-uid 4242

x() { local host=$1; shift; timeout 30 "$CHAN_XHOST_BIN" "$SVC_TMP/$host.sock" "$@"; }
# bg ID HOST ARGS...: chan_xhost in the background (its own pid: killed at the end if it is
# still there), output in $SVC_TMP/ID.out, pid in PID_ID.
bg() {
	local id=$1 host=$2
	shift 2
	"$CHAN_XHOST_BIN" "$SVC_TMP/$host.sock" "$@" >"$SVC_TMP/$id.out" 2>&1 </dev/null &
	printf -v "PID_$id" '%s' "$!"
	svc_track "$!"
}
# held ID HOST ARGS...: as bg, with stdin a fifo the script holds open until release ID.
held() {
	local id=$1 fd
	shift
	mkfifo "$SVC_TMP/$id.in" || fail "mkfifo"
	(
		for v in "${!FD_@}"; do eval "exec ${!v}>&-"; done
		exec timeout 60 "$CHAN_XHOST_BIN" "$SVC_TMP/$1.sock" "${@:2}" \
			<"$SVC_TMP/$id.in" >"$SVC_TMP/$id.out" 2>&1
	) &
	exec {fd}>"$SVC_TMP/$id.in"
	printf -v "FD_$id" '%s' "$fd"
	printf -v "PID_$id" '%s' "$!"
	svc_track "$!"
}
release() { local v="FD_$1"; eval "exec ${!v}>&-"; }
out_has() { grep -qE -- "$2" "$SVC_TMP/$1.out"; }
out_count() { grep -cE -- "$2" "$SVC_TMP/$1.out"; }
wait_out() { # ID WHAT ERE: waits 10 s for a line of ID's output
	local deadline=$((SECONDS + 10))
	until out_has "$1" "$3"; do
		[ "$SECONDS" -lt "$deadline" ] ||
			fail "timed out after 10s waiting for $2: $(cat "$SVC_TMP/$1.out")"
		sleep 0.05
	done
}
expect_out() { # TEXT ERE
	grep -qE -- "$2" <<<"$1" || fail "expected /$2/ in: $1"
}
chan_is() { # HOST NAME JQ-CONDITION
	ctl --socket "$SVC_TMP/$1.sock" --json channels |
		jq -e --arg n "$2" "[.channels[] | select(.name == \$n) | select($3)] | length == 1"
}
queue_is() { # HOST NAME JQ-CONDITION
	ctl --socket "$SVC_TMP/$1.sock" --json queues |
		jq -e --arg n "$2" "[.queues[] | select(.name == \$n) | select($3)] | length == 1"
}
queue_gone() { # HOST NAME
	! ctl --socket "$SVC_TMP/$1.sock" --json queues |
		jq -e --arg n "$2" '.queues[] | select(.name == $n)' >/dev/null
}
done_pid() { local v="PID_$1"; wait_exit "${!v}" "$2"; }

check "a producer on a writes into b's channel; a consumer on b reads the items in order"
expect_out "$(x b create work any)" "^created$"
expect_out "$(x a write "$B/work" one two three)" "^wrote 3$"
out=$(x b read work 3 1000) || fail "read on b: $out"
[ "$out" = $'item one\nitem two\nitem three' ] || fail "b read: $out"
chan_is b work '.items_written == 3 and .items_read == 3 and .remote == "any-peer" and
	.remote_handles == 0' >/dev/null || fail "tpipctl channels on b"

check "a reader on a blocked on b's channel wakes for an item written on b"
bg r1 a readers "$B/work" 1 -1
wait_until 10 "the remote reader to wait on b" chan_is b work \
	'.readers_waiting == 1 and .remote_handles == 1'
expect_out "$(x b write work four)" "^wrote 1$"
done_pid r1 10
[ "$(cat "$SVC_TMP/r1.out")" = "item four" ] || fail "r1: $(cat "$SVC_TMP/r1.out")"

check "close then drain across hosts: a writes 3 and closes, b reads 1, a drains 2, then -EPIPE"
bg r2 a readers "$B/work" 1 -1 # woken by the items or the close
wait_until 10 "the remote reader to wait on b" chan_is b work '.readers_waiting == 1'
expect_out "$(x a write "$B/work" i0 i1 i2 i3)" "^wrote 4$"
done_pid r2 10
[ "$(cat "$SVC_TMP/r2.out")" = "item i0" ] || fail "r2: $(cat "$SVC_TMP/r2.out")"
expect_out "$(x a close "$B/work")" "^closed$"
out=$(x b read work 1 1000) || fail "read on b: $out"
[ "$out" = "closed i1" ] || fail "b read after close: $out"
out=$(x a read "$B/work" 5 1000) || fail "drain from a: $out"
expect_out "$out" $'^closed i2\nclosed i3\nerror EPIPE: read: .*closed and drained'
chan_is b work '.state == "drained"' >/dev/null || fail "b's channel is not drained"
out=$(x a write "$B/work" late) && fail "wrote into a closed channel: $out"
expect_out "$out" "^error EPIPE: write: "

check "packed reads across hosts: several items an answer, in order, within the reader's buffer"
expect_out "$(x b create pk any)" "^created$"
want=""
items=()
for i in $(seq 0 11); do
	items+=("$(printf 'p%02d%047d' "$i" 0)") # 50 bytes: 4 fit 256 packed (64-byte steps)
	[ $((i % 4)) = 0 ] && want+="call 4"$'\n'
	want+="item ${items[$i]}"$'\n'
done
expect_out "$(x b write pk "${items[@]}")" "^wrote 12$"
out=$(x a read-packed "$B/pk" 12 256 2000) || fail "packed read from a: $out"
[ "$out" = "${want%$'\n'}" ] || fail "packed read from a: $out"
check "packed reads across hosts: a large item streamed alone between small ones"
expect_out "$(x b write pk s0 s1 s2)" "^wrote 3$"
expect_out "$(x b write-big pk 300000 7)" "^wrote 1$"
expect_out "$(x b write pk s3 s4)" "^wrote 2$"
out=$(x a read-packed "$B/pk" 6 400000 2000) || fail "packed read from a: $out"
[ "$out" = $'call 3\nitem s0\nitem s1\nitem s2\ncall 1\nitem big 300000 7\ncall 2\nitem s3\nitem s4' ] ||
	fail "packed read from a: $out"
check "packed reads across hosts: closed with the last items, then drained"
expect_out "$(x b write pk c0 c1 c2)" "^wrote 3$"
expect_out "$(x b close pk)" "^closed$"
out=$(x a read-packed "$B/pk" 5 4096 2000) || fail "packed read from a: $out"
[ "$out" = $'call 3\nclosed c0\nclosed c1\nclosed c2\ndrained' ] || fail "packed read from a: $out"
chan_is b pk '.items_written == 21 and .items_read == 21 and .state == "drained"' >/dev/null ||
	fail "tpipctl channels on b after the packed reads"
expect_out "$(x b unlink pk)" "^$"

check "a reader on a blocked on b's channel is woken by a close on b"
expect_out "$(x b create cw any)" "^created$"
bg r3 a readers "$B/cw" 1 -1
wait_until 10 "the remote reader to wait on b" chan_is b cw '.readers_waiting == 1'
expect_out "$(x b close cw)" "^closed$"
done_pid r3 10
expect_out "$(cat "$SVC_TMP/r3.out")" "^error EPIPE: read: "

check "opens from another host refused unless the creator allowed them, as a missing name"
expect_out "$(x b create private none)" "^created$"
expect_out "$(x b create certonly peers:cert:elsewhere.example)" "^created$"
expect_out "$(x b create pskonly peers:psk)" "^created$"
for n in private certonly nosuch; do
	out=$(x a open "$B/$n") && fail "opened $n from a: $out"
	expect_out "$out" "^error ENOENT: open: .*no channel '$n' of uid 0 on .* accepts handles from other hosts"
done
say "$out"
expect_out "$(x b open private)" "^opened$"
expect_out "$(x a open "$B/pskonly")" "^opened$"
out=$(x a write "$B/private" x) && fail "wrote into b's private channel: $out"
chan_is b private '.items == 0' >/dev/null || fail "b's private channel changed"

check "a host whose daemon does not listen: the open fails at once with the refused connect"
out=$(x a open "tpip://${net}2:7421/work") && fail "opened on a closed port: $out"
expect_out "$out" "^error ECONNREFUSED: open: .*channel host ${net}2:7421: cannot reach its daemon"
say "$out"

check "a work queue on b: owner on b, a worker on a answers its 6 questions; tpipctl shows it"
held own1 b wq-own jobs any 6
wait_until 10 "the owner's questions" out_has own1 "^submitted 6$"
out=$(x a wq-work "$B/jobs" 6) || fail "worker on a: $out"
expect_out "$out" "^worked 6$"
wait_until 10 "the owner's answers" out_has own1 "^answered 6 drained$"
queue_is b jobs '.answered == 6 and .requeued == 0 and .workers == 0' >/dev/null ||
	fail "tpipctl queues on b"
release own1
done_pid own1 10

check "messages across hosts: owner on b, a worker on a answers its 3 message questions"
held own7 b wq-own-msg mjobs any 3
wait_until 10 "the owner's questions" out_has own7 "^submitted 3$"
out=$(x a wq-work-msg "$B/mjobs" 3) || fail "message worker on a: $out"
expect_out "$out" "^worked 3$"
wait_until 10 "the owner's answers" out_has own7 "^answered 3 drained$"
release own7
done_pid own7 10

check "large messages across hosts: tensors of 16 MiB + 3 by reference both ways (peer minor 11)"
held own8 b wq-own-msg bigjobs any 2 16777219
wait_until 10 "the owner's questions" out_has own8 "^submitted 2$"
out=$(x a wq-work-msg "$B/bigjobs" 2 16777219) || fail "message worker on a: $out"
expect_out "$out" "^worked 2$"
wait_until 30 "the owner's answers" out_has own8 "^answered 2 drained$"
release own8
done_pid own8 10

check "a worker on a SIGKILLed with a question taken: queued again once, answered by another"
held own2 b wq-own jobs2 any 2
wait_until 10 "the owner's questions" out_has own2 "^submitted 2$"
bg w1 a wq-hold "$B/jobs2"
wait_until 10 "the worker to take a question" out_has w1 "^took 1$"
queue_is b jobs2 '.taken == 1 and .workers == 1 and .remote == "any-peer" and
	.remote_workers == 1' >/dev/null || fail "taken on b"
kill -KILL "$PID_w1"
wait_until 10 "the question queued again" queue_is b jobs2 '.requeued == 1 and .taken == 0'
out=$(x a wq-work "$B/jobs2" 2) || fail "second worker on a: $out"
expect_out "$out" "^worked 2$"
wait_until 10 "the owner's answers" out_has own2 "^answered 2 drained$"
queue_is b jobs2 '.requeued == 1 and .answered == 2' >/dev/null || fail "requeued on b"
release own2
done_pid own2 10

check "a work queue on b that does not admit other hosts: a worker on a is refused"
held own3 b wq-own privq none 0
wait_until 10 "the private queue" out_has own3 "^answered 0"
out=$(x a wq-open "$B/privq") && fail "opened b's private queue from a: $out"
expect_out "$out" "^error ENOENT: wq open: .*no work queue 'privq' of uid 0 on .* accepts"
expect_out "$(x b wq-open privq)" "^opened$"
release own3
done_pid own3 10

check "a work queue created on b from a (chan-remote-create-uid 4242 on b): owned on a, worked on b; the owner SIGKILLed closes it on b"
held own5 a wq-own "$B/xq" any 2
wait_until 10 "the remote owner's questions" out_has own5 "^submitted 2$"
queue_is b xq '.uid == 4242 and .queued == 2 and .owner_pid == 0' >/dev/null ||
	fail "b's queue made from a: $(ctl --socket "$SVC_TMP/b.sock" --json queues)"
expect_out "$(x b wq-work xq 1 4242)" "^worked 1$"
bg w5 b wq-work xq -1 4242 # takes the second question, answers, then waits for more
wait_until 10 "the remote owner's answers" out_has own5 "^answered 2 drained$"
wait_until 10 "a worker waiting" queue_is b xq '.queued == 0 and .taken == 0 and .workers == 1'
owner=$(pgrep -P "$PID_own5") || fail "no owner process under $PID_own5"
kill -KILL "$owner"
start=$SECONDS
wait_until 10 "b to close the queue of the dead owner" queue_gone b xq
done_pid w5 10
out_has w5 "^worked 1 closed$" || fail "w5: $(cat "$SVC_TMP/w5.out")"
[ $((SECONDS - start)) -le 5 ] || fail "closed after $((SECONDS - start)) s"
out=$(x b wq-work xq 1 4242) && fail "worked for the dead owner's queue: $out"
expect_out "$out" "^error ENOENT: wq open: "
release own5
done_pid own5 10

check "hosting side: chan-peer-ops-max $OPS_MAX on a: $OPS_MAX reads from b wait, one more is refused"
expect_out "$(x a create lim any)" "^created$"
bg l1 b readers "$A/lim" $((OPS_MAX - 1)) -1
wait_until 10 "$((OPS_MAX - 1)) reads from b to wait on a" chan_is a lim \
	".readers_waiting == $((OPS_MAX - 1))"
out=$(x b read "$A/lim" 1 300) && fail "read an item: $out"
expect_out "$out" "^error ETIMEDOUT: read: " # the ${OPS_MAX}th waited
bg l2 b readers "$A/lim" 1 -1
wait_until 10 "$OPS_MAX reads from b to wait on a" chan_is a lim ".readers_waiting == $OPS_MAX"
out=$(x b read "$A/lim" 1 300) && fail "read an item: $out"
expect_out "$out" "^error ENOBUFS: read: .*$OPS_MAX channel ops of this peer wait on .*chan-peer-ops-max"
say "$out"
out=$(x a read lim 1 300) && fail "read an item: $out"
expect_out "$out" "^error ETIMEDOUT: read: " # a local reader of a is not refused
expect_out "$(x a close lim)" "^closed$"
done_pid l1 10
done_pid l2 10
[ "$(out_count l1 "^error EPIPE")" = $((OPS_MAX - 1)) ] || fail "l1: $(cat "$SVC_TMP/l1.out")"
out_has l2 "^error EPIPE" || fail "l2: $(cat "$SVC_TMP/l2.out")"

check "forwarding side: chan-peer-ops-max $OPS_MAX on a: $OPS_MAX reads from a wait on b, one more is refused on a"
expect_out "$(x b create flim any)" "^created$"
bg f1 a readers "$B/flim" $((OPS_MAX + 1)) -1 # opens answered first, then the reads
wait_out f1 "a read from a refused" "^error ENOBUFS: read: .*channel host ${net}2:7420: $OPS_MAX ops forwarded over this link wait for answers \(chan-peer-ops-max\)"
wait_until 10 "$OPS_MAX reads from a to wait on b" chan_is b flim ".readers_waiting == $OPS_MAX"
say "$(grep ENOBUFS "$SVC_TMP/f1.out")"
out=$(x a open "$B/flim") && fail "opened with $OPS_MAX ops waiting: $out"
expect_out "$out" "^error ENOBUFS: open: .*channel host ${net}2:7420: $OPS_MAX ops forwarded over this link wait for answers \(chan-peer-ops-max\)"
expect_out "$(x b close flim)" "^closed$"
done_pid f1 10
[ "$(out_count f1 "^error EPIPE")" = "$OPS_MAX" ] || fail "f1: $(cat "$SVC_TMP/f1.out")"
[ "$(out_count f1 "^error ENOBUFS: read")" = 1 ] || fail "f1: $(cat "$SVC_TMP/f1.out")"

check "over an unauthenticated (--peer-insecure) link, as for listeners: any-peer admits it, peers:psk does not"
start_ns_daemon ia "$nsa" "${net}1:7421" --peer-insecure
start_ns_daemon ib "$nsb" "${net}2:7421" --peer-insecure
expect_out "$(x ib create anyi any)" "^created$"
expect_out "$(x ib create pski peers:psk)" "^created$"
expect_out "$(x ia write "tpip://${net}2:7421/anyi" hi)" "^wrote 1$"
out=$(x ia open "tpip://${net}2:7421/pski") && fail "opened over an insecure link: $out"
expect_out "$out" "^error ENOENT: open: .*no channel 'pski' of uid 0 on .* accepts handles from other hosts"
expect_out "$(x ib read anyi 1 1000)" "^item hi$"

check "the link cut: blocked reads on b's channel fail with -ECONNRESET naming b within the peer timeout; b queues the question of a's worker again and closes the queue owned from a"
expect_out "$(x b create cut any)" "^created$"
expect_out "$(x a create local any)" "^created$"
bg c1 a readers "$B/cut" 2 -1
bg c3 a read-packed "$B/cut" 4 4096 -1
bg c2 a readers local 1 -1
held own4 b wq-own cutq any 1
wait_until 10 "the owner's question" out_has own4 "^submitted 1$"
bg w2 a wq-hold "$B/cutq"
wait_until 10 "the worker on a to take the question" out_has w2 "^took 1$"
wait_until 10 "3 reads from a to wait on b" chan_is b cut '.readers_waiting == 3'
wait_until 10 "a local read to wait on a" chan_is a local '.readers_waiting == 1'
held own6 a wq-own "$B/cutown" any 1
wait_until 10 "the remote owner's question" out_has own6 "^submitted 1$"
expect_out "$(x b wq-work cutown 1 4242)" "^worked 1$"
wait_until 10 "the remote owner's answer" out_has own6 "^answered 1 drained$"
bg w6 b wq-work cutown -1 4242
wait_until 10 "a worker on b" queue_is b cutown '.workers == 1 and .queued == 0'
start=$SECONDS
ip -n "$nsa" link set "$vea" down || fail "$vea down"
done_pid c1 $((PEER_TIMEOUT_MS / 1000 + 5))
[ $((SECONDS - start)) -le $((PEER_TIMEOUT_MS / 1000 + 3)) ] ||
	fail "the reads failed after $((SECONDS - start)) s"
cat "$SVC_TMP/c1.out"
[ "$(out_count c1 "^error ECONNRESET: read: .*channel host ${net}2:7420: peer link failed")" = 2 ] ||
	fail "c1: $(cat "$SVC_TMP/c1.out")"
[ "$(out_count c1 "^error ECONNRESET: again: .*channel host ${net}2:7420")" = 2 ] ||
	fail "c1 (second call): $(cat "$SVC_TMP/c1.out")"
done_pid c3 5 # a packed read fails the same way, having taken nothing
[ "$(cat "$SVC_TMP/c3.out")" = "$(grep -m1 "^error ECONNRESET: read: .*channel host ${net}2:7420: peer link failed" "$SVC_TMP/c3.out")" ] ||
	fail "c3: $(cat "$SVC_TMP/c3.out")"
chan_is a local '.readers_waiting == 1' >/dev/null || fail "a's local reader is gone"
wait_until 10 "b to queue the cut worker's question again" queue_is b cutq \
	'.requeued == 1 and .queued == 1 and .taken == 0 and .workers == 0'
kill -TERM "$PID_own4" # it waits for an answer that no worker will give
done_pid own4 10
done_pid w6 10 # the queue owned from a closed with the link
out_has w6 "^worked 0 closed$" || fail "w6: $(cat "$SVC_TMP/w6.out")"
queue_gone b cutown || fail "b still lists the queue owned from a"
release own6
done_pid own6 10
expect_out "$(x a write local still)" "^wrote 1$"
done_pid c2 10
[ "$(cat "$SVC_TMP/c2.out")" = "item still" ] || fail "c2: $(cat "$SVC_TMP/c2.out")"
expect_out "$(x b write cut z1 z2)" "^wrote 2$" # nothing of a's reads is left waiting on b
[ "$(x b read cut 2 1000)" = $'item z1\nitem z2' ] || fail "b's channel after the cut"
say "ok"
