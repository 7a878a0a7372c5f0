#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Cross-host group joins through a coordinator (docs/collectives.md): two daemons in two network
# namespaces joined by a veth pair, a the coordinator. 2 hosts x 2 ranks, ranks interleaved
# (0 and 3 on a, 1 and 2 on b): every member learns its rank, the size, its host (numbered by
# lowest rank) and local rank, and tpipctl groups shows both hosts; a member SIGKILLed fails
# the group on both hosts naming its rank; a join whose coordinator is down fails at once with
# the refused connect, one whose coordinator does not answer fails by its timeout naming it;
# the coordinator's bounds (group-members-max, group-peer-groups-max) hold just below and
# above; a join over an unauthenticated link is refused; a daemon reached at its own address
# through a dial coordinates itself; the Slurm bootstrap joins from Slurm's variables; cutting
# the link between the hosts fails the group on both, naming the link. The group's remote access
# (TP_GROUP_REMOTE, any-peer for the members here unless a check says otherwise): without it a
# coordinator on another host is refused at once, as is one whose identity it does not name;
# members stating another one than the group's are refused; a group allowing "psk" joins, and
# tpipctl shows its members on the other host as remote principals (identity, claimed uid).
# The two daemons state one host name and one identity: tpipctl tells their hosts apart by
# number and address (plan line, member rows, --json host_index and host_addr).
# Skips (77) where network namespaces or veth pairs cannot be made.
. "$(dirname -- "$0")/lib.sh" || exit 1
need_env TPIPD_BIN TPIPCTL_BIN GROUP_JOIN_BIN
need_tool ip
need_tool jq
need_tool timeout
svc_init

PEER_TIMEOUT_MS=3000
nsa=tpg-a-$$
nsb=tpg-b-$$
vea=tpga$$
veb=tpgb$$
net=10.202.$(($$ % 250)).
COORD="tpip://${net}1:7420"
MENV=()
export TP_GROUP_REMOTE=any-peer # the members take part across hosts (a check says otherwise)

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
start_ns_daemon a "$nsa" "${net}1:7420" --group-members-max 4 --group-peer-groups-max 2
start_ns_daemon b "$nsb" "${net}2:7420"

# member ID HOST NAME RANK SIZE [MS]: a held member (stdin: a fifo the script keeps open until
# release ID); its output in $SVC_TMP/ID.out, its pid in PID_ID.
member() {
	local id=$1 host=$2 name=$3 rank=$4 size=$5 ms=${6:-20000} fd
	mkfifo "$SVC_TMP/$id.in" || fail "mkfifo"
	(
		for v in "${!FD_@}"; do eval "exec ${!v}>&-"; done # only the script holds them
		exec env "${MENV[@]}" "$GROUP_JOIN_BIN" "$SVC_TMP/$host.sock" "$name" "$rank" \
			"$size" "${MCOORD:-$COORD}" \
			"$ms" --hold <"$SVC_TMP/$id.in" >"$SVC_TMP/$id.out" 2>&1
	) &
	exec {fd}>"$SVC_TMP/$id.in"
	printf -v "FD_$id" '%s' "$fd"
	printf -v "PID_$id" '%s' "$!"
	svc_track "$!"
}
release() { local v="FD_$1"; eval "exec ${!v}>&-"; }
joined() { grep -q "^joined $2" "$SVC_TMP/$1.out"; }
expect_joined() { # ID "rank=... hosts=..."
	wait_until 20 "member $1 to join" joined "$1" "$2"
}
groups_json() { ctl --socket "$SVC_TMP/$1.sock" --json groups; }
group_failure_has() { # HOST NAME TEXT
	groups_json "$1" | jq -e --arg n "$2" --arg t "$3" \
		'[.groups[]? | select(.name == $n) | .failure | contains($t)] | any'
}

check "2 hosts x 2 ranks (0, 3 on a; 1, 2 on b) join through coordinator a"
member r0 a four 0 4
member r1 b four 1 4
member r2 b four 2 4
member r3 a four 3 4
expect_joined r0 "rank=0 size=4 local_rank=0 local_size=2 host=0 hosts=2"
expect_joined r1 "rank=1 size=4 local_rank=0 local_size=2 host=1 hosts=2"
expect_joined r2 "rank=2 size=4 local_rank=1 local_size=2 host=1 hosts=2"
expect_joined r3 "rank=3 size=4 local_rank=1 local_size=2 host=0 hosts=2"
for h in a b; do
	groups_json "$h" | jq -e '[.groups[]? | select(.name == "four" and .hosts == 2 and
		.size == 2 and (.plan | contains("4 members on 2 hosts")))] | length == 1' \
		>/dev/null || { groups_json "$h" >&2; fail "tpipctl groups on $h"; }
done
groups_json b | jq -e '[.groups[] | select(.name == "four") | .members[] |
	select(.remote | not) | .rank] == [1, 2]' \
	>/dev/null || { groups_json b >&2; fail "b's members are not ranks 1 and 2"; }
groups_json b | jq -e '[.groups[] | select(.name == "four") | .members[] | select(.remote) |
	select(.session == null and .uid == null and (.peer | startswith("psk:")) and
	.claimed_uid == 0) | .rank] == [0, 3]' \
	>/dev/null || { groups_json b >&2; fail "b does not show ranks 0 and 3 as remote principals"; }
groups_json a | jq -e '[.groups[] | select(.name == "four" and .coordinated) | .members[] |
	select(.remote) | .rank] == [1, 2]' \
	>/dev/null || { groups_json a >&2; fail "the coordinator does not show ranks 1, 2 as remote"; }

check "two hosts stating one host name and one identity (psk) are told apart"
# Both daemons run on this machine in namespaces of their own: they state the same host name.
# The plan line names each host with where its daemon is reached ("here" for its own), the
# member rows give the host's number in the group and its address, in the text and in --json.
groups_json b | jq -e --arg a "${net}1:7420" '[.groups[] | select(.name == "four") |
	(.plan | contains("[" + $a + "] (2)") and contains("[here] (2)")),
	([.members[] | select(.remote) | [.host_index, .host_addr]] == [[0, $a], [0, $a]])] ==
	[true, true]' >/dev/null || { groups_json b >&2; fail "b does not tell the two hosts apart"; }
groups_json a | jq -e --arg b "${net}2:7420" '[.groups[] |
	select(.name == "four" and (.coordinated | not)) |
	(.plan | contains("[here] (2)") and contains("[" + $b + "] (2)")),
	([.members[] | select(.remote) | [.host_index, .host_addr]] == [[1, $b], [1, $b]])] ==
	[true, true]' >/dev/null || { groups_json a >&2; fail "a does not tell the two hosts apart"; }
groups_json a | jq -e --arg b "${net}2:7420" '[.groups[] | select(.name == "four" and
	.coordinated) | .members[] | select(.remote) | [.host_index, .host_addr]] ==
	[[1, $b], [1, $b]]' >/dev/null ||
	{ groups_json a >&2; fail "the coordinator does not tell the two hosts apart"; }
out=$(ctl --socket "$SVC_TMP/b.sock" groups)
grep -q "(host 0 at ${net}1:7420), uid 0 claimed" <<<"$out" || { say "$out"; fail "b's table"; }
say "$(grep "plan:" <<<"$out" | head -1)"

check "rank 2 (on b) SIGKILLed: the group fails on both hosts naming rank 2"
kill -KILL "$PID_r2"
wait_until $((PEER_TIMEOUT_MS / 1000 + 3)) "the failure on b" group_failure_has b four "rank 2"
wait_until $((PEER_TIMEOUT_MS / 1000 + 3)) "the failure on a" group_failure_has a four "rank 2"
for id in r0 r1 r3; do release "$id"; done
for id in r0 r1 r3; do v="PID_$id"; wait_exit "${!v}" 10; done
wait_until 10 "the group to go" sh -c "! '$TPIPCTL_BIN' --socket '$SVC_TMP/a.sock' --json groups |
	jq -e '.groups[]? | select(.name == \"four\")'"

check "coordinator down: a refused connect fails the join at once with its cause"
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" down 0 2 "tpip://${net}1:7421" 20000) &&
	fail "joined a coordinator that is not there"
grep -q "ECONNREFUSED" <<<"$out" && grep -q "coordinator ${net}1:7421" <<<"$out" ||
	fail "unexpected: $out"
say "$out"

check "coordinator that does not answer: the join fails by its timeout, naming it"
start=$SECONDS
out=$(ip netns exec "$nsb" true; timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" mute 0 2 \
	"tpip://${net}9:7420" 1500) && fail "joined a coordinator that does not answer"
grep -q "ETIMEDOUT" <<<"$out" && grep -q "coordinator ${net}9:7420 not reachable" <<<"$out" ||
	fail "unexpected: $out"
say "$out"
[ $((SECONDS - start)) -le 8 ] || fail "the join took $((SECONDS - start)) s"

check "the default remote access (none): a coordinator on another host is refused at once"
out=$(TP_GROUP_REMOTE= timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" nor 0 2 "$COORD" 20000) &&
	fail "joined through a coordinator on another host with remote access none"
grep -q "EACCES" <<<"$out" && grep -q "remote access (none) does not allow it" <<<"$out" ||
	fail "unexpected: $out"
say "$out"

check "TP_GROUP_REMOTE=cert:gn99: a coordinator proving the key is not that peer, refused"
out=$(TP_GROUP_REMOTE="cert:gn99" timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" gn 0 2 "$COORD" \
	20000) && fail "joined through a coordinator the group does not name"
grep -q "EACCES" <<<"$out" && grep -q "peers cert:gn99" <<<"$out" || fail "unexpected: $out"

check "TP_GROUP_REMOTE=psk on both hosts joins; a member stating any-peer is refused (EINVAL)"
MENV=(TP_GROUP_REMOTE="psk")
member p0 a pskg 0 2
member p1 b pskg 1 2
MENV=()
expect_joined p0 "rank=0 size=2 local_rank=0 local_size=1 host=0 hosts=2"
expect_joined p1 "rank=1 size=2 local_rank=0 local_size=1 host=1 hosts=2"
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" pskg 1 2 "$COORD" 5000) &&
	fail "joined a group stating another remote access"
grep -q "EINVAL\|EBUSY" <<<"$out" || fail "unexpected: $out"
member q0 a pskq 0 2 4000 # never completes: it times out
wait_until 10 "q0's join at the coordinator, stating the group's remote access first" sh -c \
	"'$TPIPCTL_BIN' --socket '$SVC_TMP/a.sock' --json groups |
	jq -e '.groups[]? | select(.name == \"pskq\")' >/dev/null"
out=$(TP_GROUP_REMOTE="psk" timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" pskq 1 2 "$COORD" \
	5000) && fail "joined a group stating another remote access"
grep -q "EINVAL" <<<"$out" && grep -q "takes remote members from any peer" <<<"$out" ||
	fail "unexpected: $out"
for id in p0 p1 q0; do release "$id"; done
for id in p0 p1 q0; do v="PID_$id"; wait_exit "${!v}" 10; done

check "group-members-max 4 at the coordinator: 5 members refused (4 joined above)"
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" five 0 5 "$COORD" 5000) &&
	fail "a group of 5 joined"
grep -q "ENOBUFS" <<<"$out" && grep -q "group-members-max" <<<"$out" || fail "unexpected: $out"

check "group-peer-groups-max 2: a second group over b's link joins, a third is refused"
member g1 b one1 0 1
member g2 b one2 0 1
expect_joined g1 "rank=0 size=1"
expect_joined g2 "rank=0 size=1"
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" one3 0 1 "$COORD" 5000) &&
	fail "a third group over one link joined"
grep -q "ENOBUFS" <<<"$out" && grep -q "group-peer-groups-max" <<<"$out" ||
	fail "unexpected: $out"
say "$out"
release g1
wait_exit "$PID_g1" 10
wait_until 10 "a third group once one left" timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/b.sock" \
	one3 0 1 "$COORD" 5000
release g2
wait_exit "$PID_g2" 10

check "Slurm bootstrap: 2 hosts x 2 tasks from the variables srun would set (nodes ${net}[1-2])"
slurm_member() { # ID HOST PROCID NODEID LOCALID [BOOTSTRAP: slurm or auto]
	MENV=(SLURM_JOB_ID=77 SLURM_STEP_ID=3 SLURM_PROCID="$3" SLURM_STEP_NUM_TASKS=4
		SLURM_NODEID="$4" SLURM_LOCALID="$5" SLURM_STEP_NODELIST="${net}[1-2]"
		SLURM_STEP_TASKS_PER_NODE="2(x2)")
	MCOORD=${6:-slurm} member "$1" "$2" train -1 0
	MENV=()
}
slurm_member s0 a 0 0 0
slurm_member s1 a 1 0 1 auto # AUTO in a Slurm task is the Slurm bootstrap
slurm_member s2 b 2 1 0
slurm_member s3 b 3 1 1 auto
expect_joined s0 "rank=0 size=4 local_rank=0 local_size=2 host=0 hosts=2"
expect_joined s1 "rank=1 size=4 local_rank=1 local_size=2 host=0 hosts=2"
expect_joined s2 "rank=2 size=4 local_rank=0 local_size=2 host=1 hosts=2"
expect_joined s3 "rank=3 size=4 local_rank=1 local_size=2 host=1 hosts=2"
groups_json b | jq -e '[.groups[] | select(.name == "train@slurm:77.3")] | length == 1' \
	>/dev/null || { groups_json b >&2; fail "no group train@slurm:77.3 on b"; }
for id in s0 s1 s2 s3; do release "$id"; done
for id in s0 s1 s2 s3; do v="PID_$id"; wait_exit "${!v}" 10; done

check "a coordinator takes no join over an unauthenticated (--peer-insecure) link"
start_ns_daemon ia "$nsa" "*:7421" --peer-insecure
start_ns_daemon ib "$nsb" "${net}2:7421" --peer-insecure
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/ib.sock" open 0 2 "tpip://${net}1:7421" 5000) &&
	fail "joined over an unauthenticated link"
grep -q "EACCES" <<<"$out" && grep -q "not authenticated" <<<"$out" ||
	fail "unexpected: $out"
say "$out"

check "a coordinator address that is the daemon's own, not as it listens (*:7421): it coordinates"
out=$(timeout 30 "$GROUP_JOIN_BIN" "$SVC_TMP/ia.sock" self 0 1 "tpip://${net}1:7421" 5000) ||
	fail "join through its own daemon: $out"
grep -q "^joined rank=0 size=1 local_rank=0 local_size=1 host=0 hosts=1" <<<"$out" ||
	fail "unexpected: $out"

check "the link between the hosts cut: the group fails on both hosts naming the link's host"
member c0 a cut 0 4
member c1 b cut 1 4
member c2 b cut 2 4
member c3 a cut 3 4
for id in c0 c1 c2 c3; do expect_joined "$id" "rank="; done
ip -n "$nsa" link set "$vea" down || fail "$vea down"
wait_until $((PEER_TIMEOUT_MS / 1000 + 4)) "the failure on b" \
	group_failure_has b cut "peer link to coordinator ${net}1:7420 failed"
wait_until $((PEER_TIMEOUT_MS / 1000 + 4)) "the failure on a" \
	group_failure_has a cut "(rank 1) failed"
groups_json a | jq -r '.groups[] | select(.name == "cut") | "a: " + .failure'
groups_json b | jq -r '.groups[] | select(.name == "cut") | "b: " + .failure'
for id in c0 c1 c2 c3; do release "$id"; done
for id in c0 c1 c2 c3; do v="PID_$id"; wait_exit "${!v}" 10; done
say "ok"
