#!/bin/bash
# SPDX-License-Identifier: BSD-3-Clause
# Real Slurm: Debian's munged, slurmctld and slurmd on this machine (one node, in the foreground,
# in a network namespace of their own: slurm_lib.sh), then `srun -n 4` of slurm_env, which
# derives each task's place through libtpclient's Slurm bootstrap. The four lines must agree:
# ranks 0..3 and local ranks 0..3, each once; size and local size 4; node 0 of 1; one key,
# "slurm:<job>.<step>" of the job srun made; one coordinator, this node. A second srun (-n 2)
# is another job, so another key. A task whose node list is broken fails and says which variable.
# Then `srun -n 4` of tp-allreduce (the example) against a tpipd in the cluster's namespace: the
# Slurm bootstrap (explicit, then AUTO) joins the step's group on the one node, and every task
# prints the right sum, maximum and broadcast value.
# Skips (77) with the reason where the packages are missing or the daemons cannot start here.
. "$(dirname -- "$0")/lib.sh" || exit 1
. "$(dirname -- "$0")/slurm_lib.sh" || exit 1
need_env SLURM_ENV_BIN TPIPD_BIN
svc_init
slurm_start

# run_env N OUT: srun -n N of slurm_env, each line prefixed with the task's job=JOB.STEP.
run_env() {
	# shellcheck disable=SC2016 # expanded by the task's shell
	slurm_srun "$1" "$2" bash -c 'printf "job=%s.%s " "$SLURM_JOB_ID" "$SLURM_STEP_ID"; exec "$0"' \
		"$SLURM_ENV_BIN" || fail "srun -n $1 slurm_env exited with status $?"
}

# field OUT NAME: the values of NAME=... in OUT, one per line, in line order.
field() { sed -n "s/.* $2=\([^ ]*\).*/\1/p; s/^$2=\([^ ]*\).*/\1/p" "$1"; }

# check_step OUT N: the N lines of OUT agree as described above. Sets KEY.
check_step() {
	local out=$1 n=$2 want v job
	[ "$(wc -l <"$out")" -eq "$n" ] || fail "$n tasks printed $(wc -l <"$out") lines: $(cat "$out")"
	want=$(seq 0 $((n - 1)))
	[ "$(field "$out" rank | sort -n)" = "$want" ] || fail "ranks are not 0..$((n - 1)): $(cat "$out")"
	[ "$(field "$out" local_rank | sort -n)" = "$want" ] ||
		fail "local ranks are not 0..$((n - 1)): $(cat "$out")"
	for v in size local_size; do
		[ "$(field "$out" $v | sort -u)" = "$n" ] || fail "$v is not $n everywhere: $(cat "$out")"
	done
	[ "$(field "$out" node | sort -u)" = 0 ] || fail "node is not 0 everywhere: $(cat "$out")"
	[ "$(field "$out" nodes | sort -u)" = 1 ] || fail "nodes is not 1 everywhere: $(cat "$out")"
	for v in coordinator node_name; do
		[ "$(field "$out" $v | sort -u)" = "$SLURM_NODE" ] ||
			fail "$v is not $SLURM_NODE everywhere: $(cat "$out")"
	done
	KEY=$(field "$out" key | sort -u)
	[ "$(wc -l <<<"$KEY")" -eq 1 ] || fail "the tasks disagree on the key: $(cat "$out")"
	job=$(field "$out" job | sort -u)
	[ "$KEY" = "slurm:$job" ] || fail "key $KEY is not slurm:<job>.<step> of job $job"
	[[ $KEY =~ ^slurm:[0-9]+\.[0-9]+$ ]] || fail "malformed key $KEY"
}

check "srun -n 4: ranks 0..3, one key, one coordinator"
run_env 4 "$SVC_TMP/four.out"
cat "$SVC_TMP/four.out"
check_step "$SVC_TMP/four.out" 4
key4=$KEY

check "srun -n 2: another job, another key"
run_env 2 "$SVC_TMP/two.out"
check_step "$SVC_TMP/two.out" 2
[ "$KEY" != "$key4" ] || fail "two jobs share the key $KEY"

check "a task with a broken node list fails and names the variable"
if slurm_srun 1 "$SVC_TMP/bad.out" env 'SLURM_STEP_NODELIST=gn[01-03' "$SLURM_ENV_BIN"; then
	fail "slurm_env accepted SLURM_STEP_NODELIST=gn[01-03"
fi
grep -q "error: slurm: SLURM_STEP_NODELIST: host list: '\[' at character 3 is never closed" \
	"$SLURM_DIR/srun.err" || fail "no reason naming SLURM_STEP_NODELIST: $(cat "$SLURM_DIR/srun.err")"

# run_allreduce OUT ARGS...: srun -n 4 of tp-allreduce ARGS against the tpipd started below.
run_allreduce() {
	local out=$1
	shift
	slurm_srun 4 "$out" env TPIPD_SOCKET="$SVC_TMP/tpipd.sock" "$TP_ALLREDUCE_BIN" "$@" ||
		fail "srun -n 4 tp-allreduce $* exited with status $?: $(cat "$out")"
	cat "$out"
	[ "$(grep -c "sum of ranks 6 (expected 6)" "$out")" = 4 ] || fail "not 4 right sums"
	[ "$(grep -c "max of element 0 919" "$out")" = 4 ] || fail "not 4 right maxima"
	[ "$(grep -c "broadcast from rank 3: 30" "$out")" = 4 ] || fail "not 4 broadcasts"
}
if [ -n "${TP_ALLREDUCE_BIN:-}" ]; then
	check "srun -n 4 tp-allreduce --slurm: an all-reduce among the step's tasks"
	SVC_LOGS+=("$SVC_TMP/tpipd.log")
	slurm_exec "$TPIPD_BIN" --socket "$SVC_TMP/tpipd.sock" --config /dev/null \
		--peer-listen off 2>"$SVC_TMP/tpipd.log" &
	svc_track "$!"
	svc_wait_daemon "$SVC_TMP/tpipd.sock" "$!"
	run_allreduce "$SVC_TMP/ar.out" --slurm
	check "srun -n 4 tp-allreduce auto 0: AUTO takes Slurm's rank and size"
	run_allreduce "$SVC_TMP/ar_auto.out" auto 0
else
	say "tp-allreduce not built: the all-reduce under srun is skipped"
fi

say "ok"
