#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Collectives across hosts (docs/collectives.md): daemons in two network namespaces joined by a
# veth pair (three daemons, so three hosts, in the second part: two of them in one namespace
# are two hosts, as two machines would be). Every member runs the battery of group_coll.c
# (every collective, dtype and op against references computed there, uneven steps, async
# calls, a mismatched call that fails on every rank) with ranks interleaved across hosts and
# in host order (pipelined and not), and every rank must hold the same bits of a float sum; then a member SIGKILLed in the middle of
# 4 MiB all-reduces, and a host's leader in the middle of 16 MiB ones (pipelined: every member
# asks for it, TP_GROUP_PIPELINE=1, except where a check says otherwise), fails every
# survivor on every host, naming its rank, within the peer timeout; a member that leaves or aborts fails the others' next call on every host, naming it;
# cutting the link between the hosts fails every rank within the peer timeout. Pipelined
# broadcasts, all-gathers and reduce-scatters (group_coll.c's seg battery) forced on and off
# must give the same bits, as must members whose libraries offer different algorithm features
# (TP_GROUP_FEATURES_OFF, as libraries of other versions); a leader killed in the middle of pipelined broadcasts and of
# all-gathers, and the link cut in the middle of all-gathers, fail every survivor. Skips (77) where
# network namespaces or veth pairs cannot be made.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN GROUP_COLL_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

PEER_TIMEOUT_MS=3000
nsa=tpc-a-$$
nsb=tpc-b-$$
vea=tpca$$
veb=tpcb$$
net=10.203.$(($$ % 250)).
COORD="tpip://${net}1:7420"
export TP_GROUP_REMOTE=any-peer # the members take part across hosts (docs/collectives.md)

svc_two_hosts "$nsa" "$nsb" "$vea" "$veb" "$net"

start_ns_daemon() { # NAME NS ADDR:PORT
	local name=$1 ns=$2 addr=$3
	SVC_LOGS+=("$SVC_TMP/$name.log")
	ip netns exec "$ns" "$TPIPD_BIN" --socket "$SVC_TMP/$name.sock" --config /dev/null \
		--peer-listen "$addr" --peer-force-cross-host --peer-timeout "$PEER_TIMEOUT_MS" \
		--peer-connect-timeout 3000 --peer-key-file "$(svc_peer_key)" \
		2>"$SVC_TMP/$name.log" &
	local pid=$!
	svc_track "$pid"
	svc_wait_daemon "$SVC_TMP/$name.sock" "$pid"
}
start_ns_daemon a "$nsa" "${net}1:7420"
start_ns_daemon b "$nsb" "${net}2:7420"

battery() { # NAME RANK:HOST...
	local name=$1 n=$(($# - 1)) id ok=0 h
	shift
	for spec in "$@"; do
		member "$name-${spec%%:*}" "${spec#*:}" "$name" "${spec%%:*}" "$n" battery
	done
	for spec in "$@"; do
		id="$name-${spec%%:*}"
		v="PID_${id//-/_}"
		wait_exit "${!v}" 200
		if ! grep -q "^ok battery" "$SVC_TMP/$id.out"; then
			cat "$SVC_TMP/$id.out" >&2
			ok=1
		fi
	done
	[ "$ok" = 0 ] || fail "the battery failed (above)"
	h=$(cat "$SVC_TMP/$name"-*.out | grep "^hash float-sum" | sort -u | wc -l)
	[ "$h" = 2 ] || { grep -h "^hash" "$SVC_TMP/$name"-*.out >&2; fail "ranks disagree on bits"; }
	grep -h "^mismatch" "$SVC_TMP/$name-0.out"
	grep -h "^mismatch" "$SVC_TMP/$name-1.out"
}
# member ID HOST NAME RANK SIZE MODE: runs in the background, output in $SVC_TMP/ID.out. Large
# all-reduces are pipelined (TP_GROUP_PIPELINE=1: this machine may have too few CPUs for the
# default to pipeline), except in the ranks listed in PIPE_OFF (TP_GROUP_PIPELINE=0). FEAT_OFF
# lists RANK:FEATURES: that rank's library offers none of FEATURES (TP_GROUP_FEATURES_OFF), as a
# library of another version.
member() {
	local id=$1 host=$2 v f pe=(TP_GROUP_PIPELINE=1) fe=()
	shift 2
	case " ${PIPE_OFF:-} " in *" $2 "*) pe=(TP_GROUP_PIPELINE=0) ;; esac
	for f in ${FEAT_OFF:-}; do
		[ "${f%%:*}" = "$2" ] && fe=(TP_GROUP_FEATURES_OFF="${f#*:}")
	done
	env "${pe[@]}" "${fe[@]}" "${MENV[@]}" "$GROUP_COLL_BIN" "$SVC_TMP/$host.sock" "$1" "$2" "$3" \
		"$COORD" 20000 "$4" >"$SVC_TMP/$id.out" 2>&1 &
	v="PID_${id//-/_}"
	printf -v "$v" '%s' "$!"
	svc_track "$!"
}
MENV=()

check "2 hosts x 2 ranks (0, 3 on a; 1, 2 on b): every collective, bit-identical on every rank"
battery two 0:a 1:b 2:b 3:a

check "2 hosts x 2 ranks in host order (0, 1 on a; 2, 3 on b): every collective (an all-gather's leaders work in its output, no staging), bit-identical on every rank, pipelined and not"
battery order 0:a 1:a 2:b 3:b
PIPE_OFF="0 1 2 3"
battery orderoff 0:a 1:a 2:b 3:b
PIPE_OFF=

check "2 hosts x 2 ranks in host order, members offering different features: rank 1 (a's other member) not the leader's fold, rank 2 (b's leader) nothing, rank 3 not the step; every collective, bit-identical on every rank"
FEAT_OFF="1:lfold 2:all 3:step"
battery featmix 0:a 1:a 2:b 3:b
FEAT_OFF=

check "2 hosts x 3 ranks (0, 2, 4 on a; 1, 3, 5 on b): every collective; rank 2 does not pipeline (a's members then take large all-reduces whole), nor does rank 1 (b's leader: every leader then exchanges them whole)"
PIPE_OFF="1 2"
battery six 0:a 1:b 2:a 3:b 4:a 5:b
PIPE_OFF=

# segrun NAME RANK:HOST...: the members run group_coll.c's seg battery (broadcasts from every
# root, all-gathers and reduce-scatters big enough to be pipelined, odd counts); each must pass
# and every rank print the same float hash, left in SEG_HASH.
segrun() {
	local name=$1 n=$(($# - 1)) id ok=0 h
	shift
	for spec in "$@"; do
		member "$name-${spec%%:*}" "${spec#*:}" "$name" "${spec%%:*}" "$n" seg
	done
	for spec in "$@"; do
		id="$name-${spec%%:*}"
		v="PID_${id//-/_}"
		wait_exit "${!v}" 200
		if ! grep -q "^ok seg" "$SVC_TMP/$id.out"; then
			cat "$SVC_TMP/$id.out" >&2
			ok=1
		fi
	done
	[ "$ok" = 0 ] || fail "the pipelined collectives failed (above)"
	h=$(cat "$SVC_TMP/$name"-*.out | grep "^hash seg-float" | sort -u)
	[ "$(printf '%s\n' "$h" | wc -l)" = 1 ] || { printf '%s\n' "$h" >&2; fail "ranks disagree on bits"; }
	SEG_HASH=$h
	say "$name: $h"
}

check "pipelined broadcast (every root), all-gather and reduce-scatter, 2 hosts x 2 ranks: against references; the same bits forced on and forced off"
segrun segon 0:a 1:b 2:b 3:a
on=$SEG_HASH
PIPE_OFF="0 1 2 3"
segrun segoff 0:a 1:b 2:b 3:a
PIPE_OFF=
[ "$on" = "$SEG_HASH" ] || fail "pipelined and unpipelined results differ: $on, $SEG_HASH"
FEAT_OFF="3:seg,xseg 1:direct"
segrun segfeat 0:a 1:b 2:b 3:a
FEAT_OFF=
[ "$on" = "$SEG_HASH" ] || fail "ranks 3 and 1 offering less: results differ: $on, $SEG_HASH"

check "the same, 2 hosts x 3 ranks: all pipelined; rank 2 not (a's members take them whole); rank 1 not (b's leader: the leaders exchange them whole)"
segrun segsix 0:a 1:b 2:a 3:b 4:a 5:b
on=$SEG_HASH
for off in 2 1; do
	PIPE_OFF=$off
	segrun "segsix$off" 0:a 1:b 2:a 3:b 4:a 5:b
	PIPE_OFF=
	[ "$on" = "$SEG_HASH" ] || fail "rank $off unpipelined: results differ: $on, $SEG_HASH"
done

check "3 hosts (a: 0, 4; a2: 1; b: 2, 3): every collective (recursive doubling folds a host in)"
start_ns_daemon a2 "$nsa" "${net}1:7421"
battery three 0:a 1:a2 2:b 3:b 4:a

check "3 hosts, pipelined broadcast, all-gather and reduce-scatter: rings of 3 blocks of 2, 1 and 2 ranks"
segrun segthree 0:a 1:a2 2:b 3:b 4:a

check "3 hosts, the ring for every size (TP_GROUP_ALGO=ring)"
MENV=(TP_GROUP_ALGO=ring)
battery ring 0:a 1:a2 2:b 3:b 4:a
MENV=()

# run4 NAME MODE3: ranks 0, 3 on a and 1, 2 on b all-reduce 4 MiB in a loop (rank 3 runs MODE3:
# loop, leave or abort); returns once ranks 0 and 2 (one on each host) have joined.
run4() {
	for r in 0 1 2 3; do
		case $r in 0 | 3) h=a ;; *) h=b ;; esac
		m=loop
		[ "$r" = 3 ] && m=$2
		member "$1-$r" "$h" "$1" "$r" 4 "$m"
	done
	wait_until 20 "the members to join" sh -c "grep -q '^joined' '$SVC_TMP/$1-0.out' &&
		grep -q '^joined' '$SVC_TMP/$1-2.out'"
}
# expect_failed NAME "RANKS" PATTERN: each of RANKS exits, within the peer timeout and a margin
# from now, having printed "failed: PATTERN" (grep -E).
expect_failed() {
	local v r start=$SECONDS
	for r in $2; do
		v="PID_${1}_$r"
		wait_exit "${!v}" $((PEER_TIMEOUT_MS / 1000 + 10))
		grep -Eq "^failed: $3" "$SVC_TMP/$1-$r.out" ||
			{ cat "$SVC_TMP/$1-$r.out" >&2; fail "rank $r did not fail with $3"; }
		grep "^failed" "$SVC_TMP/$1-$r.out"
	done
	[ $((SECONDS - start)) -le $((PEER_TIMEOUT_MS / 1000 + 5)) ] ||
		fail "the ranks took $((SECONDS - start)) s"
}

check "reduce-scatter of 4 x 1 MiB parts, ranks interleaved: each leader sends only the other host's block (2 MiB, not the 4 MiB of an all-reduce)"
MENV=(GROUP_COLL_HOLD="$SVC_TMP/rs.go")
for r in 0 1 2 3; do
	case $r in 0 | 3) h=a ;; *) h=b ;; esac
	member "rs-$r" "$h" rs "$r" 4 rs
done
MENV=()
wait_until 30 "the reduce-scatter" sh -c "for r in 0 1 2 3; do grep -q '^rs ok' \
	\"$SVC_TMP/rs-\$r.out\" || exit 1; done"
rs_bytes() { # HOST: its leader's bytes out, within [2 MiB, 3 MiB)
	"$TPIPCTL_BIN" --socket "$SVC_TMP/$1.sock" --json groups | jq -e '[.groups[] |
		select(.name == "rs") | .members[] | select(.xbytes_out > 0)] |
		length == 1 and .[0].xbytes_out >= 2097152 and .[0].xbytes_out < 3145728'
}
for h in a b; do
	rs_bytes "$h" || { "$TPIPCTL_BIN" --socket "$SVC_TMP/$h.sock" groups >&2
		fail "host $h's leader sent other than one block"; }
done
touch "$SVC_TMP/rs.go"
for r in 0 1 2 3; do
	v="PID_rs_$r"
	wait_exit "${!v}" 20
done
grep -h "^FAIL" "$SVC_TMP"/rs-*.out && fail "reduce-scatter"

check "rank 2 (on b) SIGKILLed mid all-reduce: every survivor fails naming rank 2"
run4 kill loop
leader_moved() { # HOST [GROUP]: its leader's bytes to the other host show in tpipctl groups
	"$TPIPCTL_BIN" --socket "$SVC_TMP/$1.sock" --json groups | jq -e --arg g "${2:-kill}" \
		'[.groups[] | select(.name == $g) | .members[] | select(.xbytes_out > 0 and .xbytes_in > 0 and
		.xbusy_us > 0)] | length == 1'
}
wait_until 20 "a's leader counters" leader_moved a
wait_until 20 "b's leader counters" leader_moved b
"$TPIPCTL_BIN" --socket "$SVC_TMP/a.sock" groups
kill -KILL "$PID_kill_2"
expect_failed kill "0 1 3" "ECONNRESET: .*rank 2"

check "rank 1 (b's leader) SIGKILLed mid 16 MiB all-reduce (pipelined in segments, its exchange on a thread of its own): every survivor fails naming rank 1"
MENV=(GROUP_COLL_LOOP_N=4194304)
run4 killbig loop
MENV=()
wait_until 20 "a's leader counters" leader_moved a killbig
kill -KILL "$PID_killbig_1"
expect_failed killbig "0 2 3" "ECONNRESET: .*rank 1"

check "rank 1 (b's leader) SIGKILLed mid 16 MiB broadcast from rank 0 (pipelined): every survivor fails naming rank 1"
MENV=(GROUP_COLL_LOOP_N=4194304 GROUP_COLL_LOOP_OP=broadcast)
run4 killbc loop
MENV=()
wait_until 20 "a's leader counters" leader_moved a killbc
kill -KILL "$PID_killbc_1"
expect_failed killbc "0 2 3" "ECONNRESET: .*rank 1"

check "rank 0 (a's leader) SIGKILLed mid all-gather of 4 x 4 MiB (pipelined): every survivor fails naming rank 0"
MENV=(GROUP_COLL_LOOP_N=1048576 GROUP_COLL_LOOP_OP=allgather)
run4 killag loop
MENV=()
wait_until 20 "b's leader counters" leader_moved b killag
kill -KILL "$PID_killag_0"
expect_failed killag "1 2 3" "ECONNRESET: .*rank 0"

check "rank 3 (on a) leaves after 3 calls: the others' next call fails on both hosts, naming it"
run4 leave leave
expect_failed leave "0 1 2" "EPIPE: .*rank 3 .*left"

check "rank 3 (on a) aborts after 3 calls: every other rank on both hosts fails, naming it"
run4 abort abort
expect_failed abort "0 1 2" "EPIPE: .*rank 3 .*abort"

check "the link between the hosts cut mid all-reduce, and mid pipelined all-gather of another group: every rank of both fails within the peer timeout"
run4 cut loop
MENV=(GROUP_COLL_LOOP_N=1048576 GROUP_COLL_LOOP_OP=allgather)
run4 cutag loop
MENV=()
wait_until 20 "the all-gathers' leader counters" leader_moved a cutag
ip -n "$nsa" link set "$vea" down || fail "$vea down"
expect_failed cut "0 1 2 3" "ECONNRESET: "
expect_failed cutag "0 1 2 3" "ECONNRESET: "
say "ok"
