#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/run.sh: build the benchmarks (release build in build-bench/ unless BUILD_DIR says
# otherwise), start a private tpipd on a socket in a temporary directory, run bench_latency,
# bench_throughput, bench_idle (the daemon's CPU while its clients are idle) and bench_scale
# (many open pipes) against it, then tp_baseline (the same cases with TensorPipe, if it was built),
# UCX's ucx_perftest between two heap buffers over its shared-memory transport (ucx_baseline.sh,
# if ucx-utils is installed), bench_cuda (CUDA tensors against cuMemcpy in the same run, if built
# with CUDA; it says why it skips without a GPU) and wakeup (the machine's blocking wake-up cost),
# and print one table: case, size, result, baseline, ratio, vs TensorPipe, vs UCX (private->private
# GB/s against UCX tag_bw of the same size). Every baseline is measured in the same run
# as the figure it is compared with. Numbers only: the script never passes or fails a figure; its
# exit status says whether everything ran.
#
# Environment:
#   BENCH_QUICK=1        fewer iterations, sizes up to 64 MiB, shorter phases
#   BUILD_DIR=DIR        meson build directory (default: <repo>/build-bench)
#   TPIPD_BIN=PATH       run this tpipd instead of the one just built (e.g. an installed one)
#   TPIPD_ARGS="..."     extra tpipd flags (e.g. "--copy-threads 2")
#   BENCH_LAT_ARGS="..." extra bench_latency flags (e.g. "-n 50000")
#   BENCH_TPUT_ARGS="..." extra bench_throughput flags (e.g. "-s 1M,16M -K shm")
#   BENCH_TPB_ARGS="..."  extra tp_baseline flags (e.g. "-s 1M,16M -c lc")
#   BENCH_IDLE_ARGS="..." extra bench_idle flags (e.g. "-T 30")
#   BENCH_SCALE_ARGS="..." extra bench_scale flags (e.g. "-N 1,10,100,1000,4000")
#   BENCH_CUDA_ARGS="..." extra bench_cuda flags (e.g. "-K ipc -d 1")
#   BENCH_WAKEUP_ARGS="..." extra wakeup flags (e.g. "-n 500000")
#   BENCH_TIMEOUT=SECS   wall-clock limit per benchmark program (default 900)
#   BENCH_NO_INSTALL=1   do not install the optional baseline packages (g++, libtensorpipe-dev,
#                        ucx-utils)
#   BENCH_UCX_SIZES="..." sizes in bytes for the UCX baseline (default: those of the tput rows)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
quick=${BENCH_QUICK:-0}
limit=${BENCH_TIMEOUT:-900}

# The TensorPipe baseline needs g++ and libtensorpipe-dev: installed when missing, best effort.
# shellcheck source=scripts/deps.sh
. "$root/scripts/deps.sh"
[[ ${BENCH_NO_INSTALL:-0} == 1 ]] || tp_deps_install_bench
if [[ ! -f $build/build.ninja ]]; then
	meson setup "$build" "$root" -Dbuildtype=release
fi
targets=(daemon/tpipd bench/bench_latency bench/bench_throughput bench/bench_idle bench/bench_scale
	bench/wakeup)
# tp_baseline exists only when meson found TensorPipe (libtensorpipe-dev) at configure time;
# regenerate build.ninja first if meson.build files changed, so that the query sees the target.
ninja -C "$build" build.ninja >/dev/null
have_tpb=0
if ninja -C "$build" -t query bench/tp_baseline >/dev/null 2>&1; then
	have_tpb=1
	targets+=(bench/tp_baseline)
fi
# bench_cuda exists only when meson found cuda.h.
have_cuda=0
if ninja -C "$build" -t query bench/bench_cuda >/dev/null 2>&1; then
	have_cuda=1
	targets+=(bench/bench_cuda)
fi
ninja -C "$build" "${targets[@]}"
tpipd=${TPIPD_BIN:-$build/daemon/tpipd}

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpipd-bench.XXXXXX")
daemon_pid=

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local st=$?

	if [[ -n $daemon_pid ]] && kill -0 "$daemon_pid" 2>/dev/null; then
		kill -TERM "$daemon_pid" 2>/dev/null || true
		wait "$daemon_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
	exit "$st"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

sock=$tmp/tpipd.sock
# shellcheck disable=SC2086 # TPIPD_ARGS is a list of flags
"$tpipd" --socket "$sock" --log-level warning ${TPIPD_ARGS:-} 2>"$tmp/tpipd.log" &
daemon_pid=$!

for _ in $(seq 100); do
	[[ -S $sock ]] && break
	if ! kill -0 "$daemon_pid" 2>/dev/null; then
		echo "run.sh: tpipd exited during start-up:" >&2
		cat "$tmp/tpipd.log" >&2
		exit 1
	fi
	sleep 0.1
done
if [[ ! -S $sock ]]; then
	echo "run.sh: tpipd did not create $sock within 10 s" >&2
	cat "$tmp/tpipd.log" >&2
	exit 1
fi
export TPIPD_SOCKET=$sock

if [[ $quick == 1 ]]; then
	lat_args=(-n 2000 -w 200)
	tput_args=(-s '4K,64K,1M,16M,64M' -T 0.2 -m 4)
	idle_args=(-T 3)
	scale_args=(-n 500)
	wakeup_args=(-n 20000)
	cuda_args=(-s '1M,16M,64M' -T 0.2)
	ucx_sizes=(4096 65536 1048576 16777216 67108864)
else
	lat_args=()
	tput_args=()
	idle_args=()
	scale_args=()
	wakeup_args=()
	cuda_args=()
	ucx_sizes=(4096 65536 1048576 16777216 67108864 268435456)
fi
# shellcheck disable=SC2206 # a list of sizes
[[ -n ${BENCH_UCX_SIZES:-} ]] && ucx_sizes=(${BENCH_UCX_SIZES})
tpb_args=("${lat_args[@]}" "${tput_args[@]}")

rows=$tmp/rows.tsv

# vs_tensorpipe ROWS: prints ROWS with a sixth column, tpipd's figure against TensorPipe's
# comparable one from the same run (> 1: tpipd better), or "-" where there is none.
vs_tensorpipe() {
	awk -F '\t' -v OFS='\t' '
	function med(s, n, a, i) {
		n = split(s, a, " ")
		for (i = 1; i < n; i++)
			if (a[i] == "med")
				return a[i + 1] + 0
		return 0
	}
	function lead(s, unit, a) {
		if (index(s, unit) == 0)
			return 0
		split(s, a, " ")
		return a[1] + 0
	}
	function k_of(name, n, a) {
		n = split(name, a, " ")
		return a[n]
	}
	NR == FNR {
		if ($1 ~ /^tensorpipe shm\+basic latency rtt /) {
			key = $1
			sub(/^tensorpipe shm\+basic /, "", key)
			lat[key] = med($3)
		} else if ($1 ~ /^tensorpipe shm\+(cma|basic) tput k=/) {
			# the best TensorPipe channel of this run for the size and k
			v = lead($3, "GB/s")
			if (v > tput[k_of($1) "|" $2])
				tput[k_of($1) "|" $2] = v
		} else if ($1 ~ /^tensorpipe shm\+basic rate k=/) {
			rate[k_of($1) "|" $2] = lead($3, "msg/s")
		}
		next
	}
	{
		vs = "-"
		key = k_of($1) "|" $2
		if ($1 ~ /^latency rtt / && lat[$1] > 0 && med($3) > 0)
			vs = sprintf("%.2f", lat[$1] / med($3))
		else if ($1 ~ /^tput / && tput[key] > 0 && lead($3, "GB/s") > 0)
			vs = sprintf("%.2f", lead($3, "GB/s") / tput[key])
		else if ($1 ~ /^rate / && rate[key] > 0 && lead($3, "msg/s") > 0)
			vs = sprintf("%.2f", lead($3, "msg/s") / rate[key])
		print $0, vs
	}' "$1" "$1"
}
# vs_ucx ROWS: prints ROWS with one more column, a private->private throughput row's GB/s
# against UCX tag_bw's for the same size from the same run (> 1: tpipd better), else "-".
vs_ucx() {
	awk -F '\t' -v OFS='\t' '
	function lead(s, a) {
		if (index(s, "GB/s") == 0)
			return 0
		split(s, a, " ")
		return a[1] + 0
	}
	NR == FNR {
		if ($1 == "ucx posix tag_bw")
			bw[$2] = lead($3)
		next
	}
	{
		vs = "-"
		if ($1 ~ /^tput private->private k=/ && bw[$2] > 0 && lead($3) > 0)
			vs = sprintf("%.2f", lead($3) / bw[$2])
		print $0, vs
	}' "$1" -
}
status=0
run_one() {
	local name=$1
	shift
	echo "run.sh: running $name $*" >&2
	if ! timeout "$limit" "$build/bench/$name" -t "$@" >>"$rows"; then
		echo "run.sh: $name did not complete (see messages above)" >&2
		status=1
	fi
}

# run_socket NAME ARGS...: NAME with the clients kept off the control ring and never spinning
# (the plain Unix socket path, as before rings existed); its rows are marked "(socket)".
run_socket() {
	local name=$1 out=$tmp/socket.tsv
	shift
	echo "run.sh: running $name $* with TPIPD_RING_BYTES=0 TPIPD_SPIN_US=0" >&2
	if TPIPD_RING_BYTES=0 TPIPD_SPIN_US=0 timeout "$limit" "$build/bench/$name" -t "$@" >"$out"
	then
		awk -F '\t' -v OFS='\t' '{ $1 = $1 " (socket)"; print }' "$out" >>"$rows"
	else
		echo "run.sh: $name (socket) did not complete (see messages above)" >&2
		status=1
	fi
}

# shellcheck disable=SC2086 # the extra-args variables are lists of flags
run_one bench_latency "${lat_args[@]}" ${BENCH_LAT_ARGS:-}
# shellcheck disable=SC2086
run_socket bench_latency "${lat_args[@]}" ${BENCH_LAT_ARGS:-}
# shellcheck disable=SC2086
run_one bench_throughput "${tput_args[@]}" ${BENCH_TPUT_ARGS:-}
if [[ -z ${BENCH_TPUT_ARGS:-} ]]; then
	# The small-message rate and one large size, for the same comparison.
	run_socket bench_throughput "${tput_args[@]}" -s 4K,64M -K shm
fi
# Both read the daemon's /proc/PID files, hence its pid.
# shellcheck disable=SC2086
run_one bench_idle -p "$daemon_pid" "${idle_args[@]}" ${BENCH_IDLE_ARGS:-}
# shellcheck disable=SC2086
run_one bench_scale -p "$daemon_pid" "${scale_args[@]}" ${BENCH_SCALE_ARGS:-}
if [[ $have_tpb == 1 ]]; then
	# shellcheck disable=SC2086
	run_one tp_baseline "${tpb_args[@]}" ${BENCH_TPB_ARGS:-}
else
	echo "run.sh: tp_baseline was not built (no TensorPipe at configure time:" \
		"apt-get install libtensorpipe-dev, then meson setup --wipe $build);" \
		"TensorPipe rows skipped" >&2
fi
echo "run.sh: running ucx_baseline.sh ${ucx_sizes[*]}" >&2
ucx_rc=0
BENCH_QUICK=$quick BENCH_TIMEOUT=$limit bash "$root/bench/ucx_baseline.sh" "${ucx_sizes[@]}" \
	>>"$rows" || ucx_rc=$?
case $ucx_rc in
0) have_ucx=1 ;;
77) have_ucx=0 ;;
*) have_ucx=1 status=1 ;;
esac
if [[ $have_cuda == 1 ]]; then
	# shellcheck disable=SC2086
	run_one bench_cuda "${cuda_args[@]}" ${BENCH_CUDA_ARGS:-}
fi
# shellcheck disable=SC2086
run_one wakeup "${wakeup_args[@]}" ${BENCH_WAKEUP_ARGS:-}

daemon_alive=1
if ! kill -0 "$daemon_pid" 2>/dev/null; then
	echo "run.sh: tpipd is no longer running; its log:" >&2
	cat "$tmp/tpipd.log" >&2
	daemon_alive=0
	status=1
fi

echo
mode=full
[[ $quick == 1 ]] && mode=BENCH_QUICK
echo "tpipd benchmarks ($mode): $("$tpipd" --version 2>/dev/null | head -n 1 || true)," \
	"$(uname -n), $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo |
		head -n 1)), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "latency ratio = tpipd median / raw socketpair median (p99 ratio in brackets);"
echo "throughput ratio = tpipd GB/s / single-thread memcpy GB/s; rate ratio = tpipd / raw socketpair"
echo "vs TensorPipe (> 1: tpipd better) = TensorPipe shm+basic median / tpipd median for latency,"
echo "tpipd GB/s / the faster of TensorPipe shm+cma and shm+basic GB/s (same size and k) for"
echo "throughput,"
echo "tpipd msg/s / TensorPipe shm+basic msg/s for the rate; wakeup ratio = cross-CPU / same CPU;"
echo "idle: the daemon's CPU while two attached clients wait (baseline: those clients);"
echo "scale: latency on one pipe while N are open (ratio = against the first N) and the daemon's"
echo "VmRSS growth since before the first pipe, divided by N;"
echo "(socket): the same case with clients on the Unix socket, never spinning (TPIPD_RING_BYTES=0"
echo "TPIPD_SPIN_US=0), i.e. the control path without the shared-memory ring"
echo "vs UCX (> 1: tpipd better) = tpipd private->private GB/s / UCX tag_bw GB/s of the same size"
echo "(ucx_perftest, UCX_TLS=posix,self, heap buffers, its default window); ucx rows: UCX's own"
[[ $have_tpb == 1 ]] ||
	echo "(TensorPipe baseline not built: no TensorPipe rows; the vs TensorPipe column says -)"
[[ $have_ucx == 1 ]] ||
	echo "(UCX baseline skipped: ucx_perftest missing; the vs UCX column says -)"
echo
{
	printf 'case\tsize\tresult\tbaseline\tratio\tvs TensorPipe\tvs UCX\n'
	vs_tensorpipe "$rows" | vs_ucx "$rows"
} | column -t -s $'\t'

if [[ $daemon_alive == 1 && -s $tmp/tpipd.log ]]; then
	echo
	echo "tpipd warnings during the run:"
	cat "$tmp/tpipd.log"
fi
exit "$status"
