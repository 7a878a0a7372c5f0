#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/ucx_baseline.sh: the UCX baseline for bench/run.sh. Runs Debian's ucx_perftest (package
# ucx-utils) between two processes of this host over UCX's shared-memory transport, with the
# buffers on the heap as a PyTorch or numpy tensor's are (UCX_TLS=posix,self,
# UCX_ALLOC_PRIO=heap): tag_lat for an 8-byte one-way latency and tag_bw for the bandwidth at
# each size. The server and the client meet on a loopback TCP port for the exchange of addresses.
# Prints rows in bench/run.sh's tab-separated form (case, size, result, baseline, ratio):
#   ucx posix tag_lat        8 B      one-way med X us
#   ucx posix tag_bw         1 MiB    X GB/s (N msgs)
# Exit status 0 when every run completed; 77 (and a reason on stderr) when ucx_perftest is
# missing. Never judges a figure.
#
# Usage: ucx_baseline.sh SIZE... (bytes, e.g. 4096 1048576)
# Environment: BENCH_QUICK=1 (fewer iterations), BENCH_TIMEOUT=SECS (per run, default 120).
set -uo pipefail

perftest=$(command -v ucx_perftest || true)
if [[ -z $perftest ]]; then
	echo "ucx_baseline.sh: ucx_perftest not found (apt-get install ucx-utils); UCX rows skipped" >&2
	exit 77
fi
limit=${BENCH_TIMEOUT:-120}
quick=${BENCH_QUICK:-0}
export UCX_TLS=posix,self UCX_ALLOC_PRIO=heap UCX_WARN_UNUSED_ENV_VARS=n

human() {
	local n=$1
	if ((n >= 1 << 20 && n % (1 << 20) == 0)); then
		echo "$((n >> 20)) MiB"
	elif ((n >= 1 << 10 && n % (1 << 10) == 0)); then
		echo "$((n >> 10)) KiB"
	else
		echo "$n B"
	fi
}

# A port nobody listens on now (the server binds it; a race with another program only makes
# this run fail, reported below).
free_port() {
	local p
	for _ in $(seq 50); do
		p=$((20000 + RANDOM % 40000))
		if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
			echo "$p"
			return 0
		fi
	done
	return 1
}

# run_pair TEST SIZE ITERS: prints the client's "Final:" line, or fails.
run_pair() {
	local test=$1 size=$2 iters=$3 port out spid line
	port=$(free_port) || return 1
	out=$(mktemp)
	timeout "$limit" "$perftest" -p "$port" >"$out.srv" 2>&1 &
	spid=$!
	# The server listens once its UCX context is up: retry the client until it connects.
	for _ in $(seq 100); do
		if timeout "$limit" "$perftest" 127.0.0.1 -p "$port" -t "$test" -s "$size" \
			-n "$iters" -w $((iters / 10 + 1)) >"$out" 2>&1; then
			break
		fi
		grep -q "Connection refused\|connect() failed" "$out" || break
		sleep 0.05
	done
	wait "$spid" 2>/dev/null
	line=$(grep '^Final:' "$out" | tail -n 1)
	if [[ -z $line ]]; then
		echo "ucx_baseline.sh: ucx_perftest -t $test -s $size failed:" >&2
		tail -n 5 "$out" "$out.srv" >&2
		rm -f "$out" "$out.srv"
		return 1
	fi
	rm -f "$out" "$out.srv"
	echo "$line"
}

status=0
if [[ $quick == 1 ]]; then lat_iters=2000; else lat_iters=20000; fi
if line=$(run_pair tag_lat 8 "$lat_iters"); then
	# Final: iters, 50%ile, average, overall latency (us), then bandwidth and rate columns.
	awk -v OFS='\t' '{ printf "ucx posix tag_lat\t8 B\tone-way med %.2f us (avg %.2f)\t-\t-\n",
		$3, $4 }' <<<"$line"
else
	status=1
fi
for size in "$@"; do
	# About 2 GB per size (512 MB with BENCH_QUICK), 50 messages at least.
	budget=$((quick == 1 ? 512000000 : 2000000000))
	iters=$((budget / size))
	((iters < 50)) && iters=50
	((iters > 200000)) && iters=200000
	if line=$(run_pair tag_bw "$size" "$iters"); then
		# The bandwidth columns are MB/s with MB = 2^20 bytes.
		awk -v OFS='\t' -v sz="$(human "$size")" -v n="$iters" '{
			printf "ucx posix tag_bw\t%s\t%.2f GB/s (%d msgs)\t-\t-\n", sz,
				$6 * 1048576 / 1e9, n }' <<<"$line"
	else
		status=1
	fi
done
exit "$status"
