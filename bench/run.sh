#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/run.sh: build the benchmarks (release build in build-bench/ unless BUILD_DIR says
# otherwise), start a private tpipd on a socket in a temporary directory, run bench_latency and
# bench_throughput against it, and print one table: case, size, result, baseline, ratio. Every
# baseline is measured in the same run as the figure it is compared with. Numbers only: the
# script never passes or fails a figure; its exit status says whether everything ran.
#
# Environment:
#   BENCH_QUICK=1        fewer iterations, sizes up to 64 MiB, shorter phases
#   BUILD_DIR=DIR        meson build directory (default: <repo>/build-bench)
#   TPIPD_BIN=PATH       run this tpipd instead of the one just built (e.g. an installed one)
#   TPIPD_ARGS="..."     extra tpipd flags (e.g. "--copy-threads 2")
#   BENCH_LAT_ARGS="..." extra bench_latency flags (e.g. "-n 50000")
#   BENCH_TPUT_ARGS="..." extra bench_throughput flags (e.g. "-s 1M,16M -K shm")
#   BENCH_TIMEOUT=SECS   wall-clock limit per benchmark program (default 900)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
quick=${BENCH_QUICK:-0}
limit=${BENCH_TIMEOUT:-900}

if [[ ! -f $build/build.ninja ]]; then
	meson setup "$build" "$root" -Dbuildtype=release
fi
ninja -C "$build" daemon/tpipd bench/bench_latency bench/bench_throughput
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
else
	lat_args=()
	tput_args=()
fi

rows=$tmp/rows.tsv
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

# shellcheck disable=SC2086 # the extra-args variables are lists of flags
run_one bench_latency "${lat_args[@]}" ${BENCH_LAT_ARGS:-}
# shellcheck disable=SC2086
run_one bench_throughput "${tput_args[@]}" ${BENCH_TPUT_ARGS:-}

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
echo
{
	printf 'case\tsize\tresult\tbaseline\tratio\n'
	cat "$rows"
} | column -t -s $'\t'

if [[ $daemon_alive == 1 && -s $tmp/tpipd.log ]]; then
	echo
	echo "tpipd warnings during the run:"
	cat "$tmp/tpipd.log"
fi
exit "$status"
