#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/run_allreduce.sh: all-reduce (float32, sum) on one host for N = 2, 4, 8 ranks and, with
# ALLREDUCE_XHOST=1, on 2 hosts x 2 ranks (two network namespaces joined by a veth pair), for
# the peers a user would pick, measured in the same run:
#   gloo     torch.distributed with gloo (bench/allreduce_gloo.py, Debian's python3-torch,
#            run with /usr/bin/python3; tcp:// rendezvous on loopback or on the veth)
#   mpi-shm  Open MPI's MPI_Allreduce (bench/allreduce_mpi.c) with --mca btl self,vader
#   mpi-tcp  the same with --mca btl self,tcp
# each once as is and once with GLIBC_TUNABLES=glibc.malloc.mmap_max=0 (glibc otherwise gives
# every large temporary buffer a fresh mmap, which dominates MPI's time at 64 MiB); and ours,
# bench_allreduce, where the build has it (the hook below). Each program prints one line per
# size; this script adds hosts= and mmap= and prints them as they come:
#   allreduce impl=gloo|mpi-shm|mpi-tcp|tpipd n=N size=S median_us=T busbw_GBps=B iters=I
#             hosts=H mmap=default|off
# median over the iterations of the slowest rank's time; busbw = 2(N-1)/N x size / time. Then,
# per hosts, n and size, the best peer ("allreduce best ...", and ours against it where ours
# ran). Numbers only: the exit status says whether everything ran, never whether a figure is
# good. On a shared 2-CPU machine 4 and 8 ranks oversubscribe the CPUs: say so with the figures.
#
# Environment:
#   BUILD_DIR=DIR          meson build directory (default: <repo>/build-bench, release)
#   ALLREDUCE_N="2 4 8"    rank counts on one host
#   ALLREDUCE_SIZES=LIST   sizes (default 4K,64K,1M,16M,64M)
#   ALLREDUCE_SECS=S       time budget per size and run (default 1; 5 to 200 iterations)
#   ALLREDUCE_IMPLS="..."  which of tpipd gloo mpi-shm mpi-tcp (default all)
#   ALLREDUCE_MMAP="..."   default and/or off (default both)
#   ALLREDUCE_XHOST=1      also 2 namespaced hosts x 2 ranks (root and iproute2)
#   ALLREDUCE_XHOST_ONLY=1 only those
#   ALLREDUCE_DTYPE=T      f32 (default), f16 or bf16: the elements ours and gloo sum (the lines
#                          end in dtype=T; MPI, which has no 16-bit float type, is left out,
#                          and gloo says so where its torch cannot sum T)
#   ALLREDUCE_OP=OP        ours times OP instead of all-reduce: broadcast, allgather or
#                          reduce-scatter (bench_allreduce --op; its lines start with OP's
#                          name, and the peers, which time all-reduces only, are left out)
#   ALLREDUCE_TPIPD_ARGS=".." extra flags for ours' two daemons across hosts (e.g.
#                          "--peer-data-encryption no": tensor bytes unencrypted, as gloo's and
#                          MPI's are; the default encrypts them with TLS)
#   BENCH_TIMEOUT=SECS     wall-clock limit per program run (default 300)
#   BENCH_NO_INSTALL=1     do not install the optional baseline packages
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
ns_list=${ALLREDUCE_N:-2 4 8}
sizes=${ALLREDUCE_SIZES:-4K,64K,1M,16M,64M}
secs=${ALLREDUCE_SECS:-1}
impls=${ALLREDUCE_IMPLS:-tpipd gloo mpi-shm mpi-tcp}
op=${ALLREDUCE_OP:-allreduce}
op_args=()
[[ $op == allreduce ]] || { impls=tpipd; op_args=(--op "$op"); }
dtype=${ALLREDUCE_DTYPE:-f32}
case $dtype in
f32 | f16 | bf16) ;;
*) echo "run_allreduce.sh: ALLREDUCE_DTYPE=$dtype: not f32, f16 or bf16" >&2; exit 2 ;;
esac
[[ $dtype == f32 ]] || op_args+=(--dtype "$dtype") # (an older bench_allreduce as ALLREDUCE_OURS has no --dtype)
mmaps=${ALLREDUCE_MMAP:-default off}
limit=${BENCH_TIMEOUT:-300}
python=/usr/bin/python3

# shellcheck source=scripts/deps.sh
. "$root/scripts/deps.sh"
[[ ${BENCH_NO_INSTALL:-0} == 1 ]] || tp_deps_install_bench
if [[ ! -f $build/build.ninja ]]; then
	meson setup "$build" "$root" -Dbuildtype=release || exit 1
fi
build=$(cd "$build" && pwd) || exit 1
ninja -C "$build" build.ninja >/dev/null || exit 1
targets=()
for t in bench/allreduce_mpi bench/bench_allreduce; do
	ninja -C "$build" -t query "$t" >/dev/null 2>&1 && targets+=("$t")
done
[[ " ${targets[*]} " == *" bench/bench_allreduce "* ]] && targets+=(daemon/tpipd)
[[ ${#targets[@]} -eq 0 ]] || ninja -C "$build" "${targets[@]}" || exit 1

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpipd-allreduce.XXXXXX")
pids=()
netns=()
# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local p n
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	for n in "${netns[@]}"; do ip netns del "$n" 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

have() { [[ " $impls " == *" $1 "* ]]; }
results=$tmp/results

# emit HOSTS MMAP: tags each "allreduce ..." line of stdin and prints it (and keeps it).
emit() {
	local line
	while IFS= read -r line; do
		[[ $line == allreduce\ impl=* || $line == "${op//-/_}"\ impl=* ]] || continue
		printf '%s hosts=%s mmap=%s\n' "$line" "$1" "$2" | tee -a "$results"
	done
}

# mmap_env MMAP: sets ENV_MMAP to the env(1) prefix of a run with glibc's mmap threshold off
# (MMAP=off) or to nothing (default), and MPI_X to mpirun's option passing it on.
mmap_env() {
	ENV_MMAP=()
	MPI_X=()
	if [[ $1 == off ]]; then
		ENV_MMAP=(env GLIBC_TUNABLES=glibc.malloc.mmap_max=0)
		MPI_X=(-x GLIBC_TUNABLES)
	fi
}

# run_or_note WHAT MMAP CMD...: runs CMD under the time limit and MMAP; notes a failure (in a
# file: this runs on the left of a pipe, in a subshell).
run_or_note() {
	local what=$1 rc
	mmap_env "$2"
	shift 2
	"${ENV_MMAP[@]}" timeout -k 5 "$limit" "$@"
	rc=$?
	if [[ $rc -ne 0 ]]; then
		echo "run_allreduce.sh: $what failed (status $rc)" >&2
		echo "$what" >>"$tmp/failed"
	fi
	return 0
}

mpi_run() { # N BTL LABEL MMAP [mpirun options...]
	local n=$1 btl=$2 label=$3 m=$4
	shift 4
	mmap_env "$m"
	run_or_note "$label n=$n" "$m" mpirun --allow-run-as-root --oversubscribe --bind-to none \
		-n "$n" "${MPI_X[@]}" --mca pml ob1 --mca btl "$btl" "$@" \
		"$build/bench/allreduce_mpi" -l "$label" -s "$sizes" -t "$secs"
}

# ---- the hook for ours ---------------------------------------------------------------------
# bench_allreduce (built into $build/bench/ by the groups work) runs when the build has it,
# against a private tpipd started here (TPIPD_SOCKET). Its expected interface:
#   bench_allreduce -n N -s SIZES -t SECONDS
# starting its N ranks itself and printing, per size, the line format above with impl=tpipd
# (the hosts= and mmap= tags are added here). ALLREDUCE_OURS="CMD ARGS" replaces the command
# (N, SIZES and SECONDS are appended as above).
ours_bin=$build/bench/bench_allreduce
ours_sock=
start_ours_daemon() {
	local i
	[[ -n $ours_sock ]] && return 0
	ours_sock=$tmp/tpipd.sock
	"$build/daemon/tpipd" --socket "$ours_sock" --peer-listen off --log-level warning \
		2>"$tmp/tpipd.log" &
	pids+=($!)
	for ((i = 0; i < 200; i++)); do
		[[ -S $ours_sock ]] && return 0
		sleep 0.05
	done
	echo "run_allreduce.sh: tpipd did not start: $(tail -n 3 "$tmp/tpipd.log")" >&2
	return 1
}
run_ours() { # N MMAP
	local cmd
	if [[ -n ${ALLREDUCE_OURS:-} ]]; then
		read -ra cmd <<<"$ALLREDUCE_OURS"
	elif [[ -x $ours_bin ]]; then
		cmd=("$ours_bin")
	else
		return 0
	fi
	start_ours_daemon || { echo "tpipd" >>"$tmp/failed"; return 0; }
	TPIPD_SOCKET=$ours_sock run_or_note "bench_allreduce n=$1" "$2" "${cmd[@]}" -n "$1" \
		-s "$sizes" -t "$secs" "${op_args[@]}" | emit 1 "$2"
}

have_gloo=0
if have gloo; then
	if [[ -x $python ]] && "$python" -c 'import torch.distributed' 2>/dev/null; then
		have_gloo=1
	else
		echo "run_allreduce.sh: gloo skipped: no torch.distributed for $python (python3-torch)" >&2
	fi
fi
have_mpi=0
if have mpi-shm || have mpi-tcp; then
	if [[ $dtype != f32 ]]; then
		echo "run_allreduce.sh: MPI skipped: MPI has no $dtype type (ALLREDUCE_DTYPE)" >&2
	elif [[ -x $build/bench/allreduce_mpi ]] && command -v mpirun >/dev/null; then
		have_mpi=1
	else
		echo "run_allreduce.sh: MPI skipped: allreduce_mpi not built or no mpirun (libopenmpi-dev, openmpi-bin)" >&2
	fi
fi

# ---- one host ------------------------------------------------------------------------------
one_host() {
	local n m
	for n in $ns_list; do
		for m in $mmaps; do
			have tpipd && run_ours "$n" "$m"
			[[ $have_gloo == 1 ]] && run_or_note "gloo n=$n" "$m" "$python" \
				"$root/bench/allreduce_gloo.py" -n "$n" -s "$sizes" -t "$secs" --dtype "$dtype" | emit 1 "$m"
			if [[ $have_mpi == 1 ]]; then
				have mpi-shm && mpi_run "$n" self,vader mpi-shm "$m" | emit 1 "$m"
				have mpi-tcp && mpi_run "$n" self,tcp mpi-tcp "$m" \
					--mca btl_tcp_if_include lo | emit 1 "$m"
			fi
		done
	done
}

# ---- 2 hosts x 2 ranks ---------------------------------------------------------------------
# Namespaces A and B joined by a veth pair (10.78.0.1, 10.78.0.2); ranks 0, 1 in A, 2, 3 in B.
ns_a=
ns_b=
xhost_setup() {
	[[ $(id -u) -eq 0 ]] && command -v ip >/dev/null || {
		echo "run_allreduce.sh: 2 hosts skipped: needs root and iproute2" >&2
		return 1
	}
	ns_a=tpar-a-$$
	ns_b=tpar-b-$$
	ip netns add "$ns_a" && netns+=("$ns_a") && ip netns add "$ns_b" && netns+=("$ns_b") &&
		ip link add "ar$$a" netns "$ns_a" type veth peer name "ar$$b" netns "$ns_b" &&
		ip -n "$ns_a" addr add 10.78.0.1/24 dev "ar$$a" &&
		ip -n "$ns_b" addr add 10.78.0.2/24 dev "ar$$b" &&
		ip -n "$ns_a" link set "ar$$a" up && ip -n "$ns_b" link set "ar$$b" up &&
		ip -n "$ns_a" link set lo up && ip -n "$ns_b" link set lo up || {
		echo "run_allreduce.sh: 2 hosts skipped: cannot make namespaces and a veth pair" >&2
		return 1
	}
}

xhost_gloo() { # MMAP
	local m=$1 r ns dev url=tcp://10.78.0.1:29500 rpids=()
	mmap_env "$m"
	for r in 3 2 1; do
		if ((r < 2)); then ns=$ns_a dev=ar$$a; else ns=$ns_b dev=ar$$b; fi
		GLOO_SOCKET_IFNAME=$dev "${ENV_MMAP[@]}" timeout -k 5 "$limit" ip netns exec "$ns" \
			"$python" "$root/bench/allreduce_gloo.py" -n 4 --rank "$r" --init-url "$url" \
			-s "$sizes" -t "$secs" --dtype "$dtype" >/dev/null &
		rpids+=($!)
	done
	GLOO_SOCKET_IFNAME=ar$$a run_or_note "gloo 2x2" "$m" ip netns exec "$ns_a" \
		"$python" "$root/bench/allreduce_gloo.py" -n 4 --rank 0 --init-url "$url" \
		-s "$sizes" -t "$secs" --dtype "$dtype" | emit 2 "$m"
	for r in "${rpids[@]}"; do wait "$r" || echo "gloo 2x2 rank" >>"$tmp/failed"; done
}

# mpirun in A launches its daemons on "hosts" ns-a and ns-b through an rsh agent that enters
# the namespace of that name instead of logging in anywhere.
xhost_mpi() { # BTL LABEL MMAP [options]
	local btl=$1 label=$2 m=$3 agent=$tmp/netns-rsh
	shift 3
	# Each "host" also gets a /dev/shm of its own (ip netns exec gives the agent a mount
	# namespace): Open MPI names its shared-memory segments by host name and local rank, and
	# both namespaces have this machine's host name.
	# shellcheck disable=SC2016 # expanded by the agent
	printf '#!/bin/sh\nh=$1; shift\nexec ip netns exec "$h" sh -c "mount -t tmpfs tpshm /dev/shm && exec $*"\n' \
		>"$agent"
	chmod +x "$agent"
	printf '%s slots=2\n%s slots=2\n' "$ns_a" "$ns_b" >"$tmp/hostfile"
	mmap_env "$m"
	run_or_note "$label 2x2" "$m" ip netns exec "$ns_a" mpirun --allow-run-as-root \
		--oversubscribe --bind-to none -n 4 --hostfile "$tmp/hostfile" \
		--mca plm_rsh_agent "$agent" --mca routed direct --mca oob_tcp_if_include 10.78.0.0/24 \
		--mca btl_tcp_if_include 10.78.0.0/24 "${MPI_X[@]}" --mca pml ob1 --mca btl "$btl" \
		"$@" "$build/bench/allreduce_mpi" -l "$label" -s "$sizes" -t "$secs"
}

# Ours: a tpipd in each namespace, peered over the veth (a pre-shared key; --peer-force-cross-host
# since both namespaces share this machine's boot id); bench_allreduce forks the 4 ranks here
# and gives ranks 0, 1 the daemon of A and 2, 3 that of B (a socket path reaches across network
# namespaces), joined through A's daemon.
xhost_ours_daemons() {
	local h i
	[[ -S $tmp/xb.sock ]] && return 0
	(umask 077 && head -c 32 /dev/urandom | base64 >"$tmp/peer.key")
	for h in a:1 b:2; do
		ns=ns_${h%%:*}
		ip netns exec "${!ns}" "$build/daemon/tpipd" --socket "$tmp/x${h%%:*}.sock" \
			--config /dev/null --peer-listen "10.78.0.${h#*:}:7420" \
			--peer-key-file "$tmp/peer.key" --peer-force-cross-host --log-level warning \
			${ALLREDUCE_TPIPD_ARGS:-} \
			2>"$tmp/x${h%%:*}.log" &
		pids+=($!)
	done
	for ((i = 0; i < 200; i++)); do
		[[ -S $tmp/xa.sock && -S $tmp/xb.sock ]] && return 0
		sleep 0.05
	done
	echo "run_allreduce.sh: the two tpipd did not start: $(tail -n 3 "$tmp"/x?.log)" >&2
	return 1
}
xhost_ours() { # MMAP
	[[ -x $ours_bin ]] || return 0
	xhost_ours_daemons || { echo "tpipd 2x2" >>"$tmp/failed"; return 0; }
	run_or_note "tpipd 2x2" "$1" "$ours_bin" -n 4 -s "$sizes" -t "$secs" "${op_args[@]}" \
		--xhost "$tmp/xa.sock,$tmp/xb.sock,tpip://10.78.0.1:7420" | emit 2 "$1"
}

two_hosts() {
	local m
	xhost_setup || return 0
	for m in $mmaps; do
		have tpipd && xhost_ours "$m"
		[[ $have_gloo == 1 ]] && xhost_gloo "$m"
		if [[ $have_mpi == 1 ]]; then
			# Between hosts MPI has TCP only; inside a host shared memory where enabled.
			have mpi-shm && xhost_mpi self,vader,tcp mpi-shm "$m" | emit 2 "$m"
			have mpi-tcp && xhost_mpi self,tcp mpi-tcp "$m" | emit 2 "$m"
		fi
	done
}

touch "$results"
[[ ${ALLREDUCE_XHOST_ONLY:-0} == 1 ]] || one_host
[[ ${ALLREDUCE_XHOST:-0} == 1 || ${ALLREDUCE_XHOST_ONLY:-0} == 1 ]] && two_hosts

# The best peer per hosts, n and size; ours against it where ours ran (ratio < 1: ours faster).
echo
awk '
function val(k,   i, a) { for (i = 2; i <= NF; i++) { split($i, a, "="); if (a[1] == k) return a[2] } }
{
	key = val("hosts") " " val("n") " " val("size"); t = val("median_us") + 0
	if (val("impl") == "tpipd") { if (!(key in ours) || t < ours[key]) ours[key] = t; next }
	if (!(key in best) || t < best[key]) { best[key] = t; who[key] = val("impl") " mmap=" val("mmap") }
}
END {
	for (k in best) {
		split(k, f, " ")
		line = sprintf("allreduce best hosts=%s n=%s size=%s impl=%s median_us=%.1f", f[1], f[2], f[3], who[k], best[k])
		if (k in ours) line = line sprintf(" tpipd_us=%.1f ratio=%.2f", ours[k], ours[k] / best[k])
		print line
	}
}' "$results" | sort -t= -k2,2n -k3,3n -k4,4n
if [[ -s $tmp/failed ]]; then
	echo "run_allreduce.sh: did not complete: $(paste -sd, "$tmp/failed")" >&2
	exit 1
fi
