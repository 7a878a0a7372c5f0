#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/run_xhost.sh: benchmark a pipe across two daemons (the cross-host path) on one machine.
# It builds the benchmarks (release build in build-bench/ unless BUILD_DIR says otherwise),
# starts two private tpipd with sockets in a temporary directory, each with a peer listener on a
# free port and --peer-force-cross-host, so that a pipe from a client of daemon A to a listener
# on daemon B (tpip://HOST:PORT/NAME) crosses a peer link: one control and N data TCP
# connections. Then, in one invocation, so that every figure meets the same background load:
# iperf3 with N streams over the same path (the throughput baseline), bench_latency (8 B round
# trips across the daemons, next to a raw TCP ping-pong over the same path), bench_throughput
# (one tensor per message, shared buffers and private memory, 1 MiB to 512 MiB, each row next to
# N raw TCP streams moving the same messages between as many distinct buffers) and
# tp_baseline's TensorPipe uv transport + mpt channel with N lanes (if it was built). It prints
# one table: case, size, result, baseline, ratio, vs raw tcp, vs TensorPipe. Numbers only: the
# exit status says whether everything ran, never whether a figure is good.
#
# With XBENCH_NETNS=1 (root and iproute2 needed) each daemon runs in a network namespace of its
# own, joined by a veth pair (10.77.0.1 and 10.77.0.2, MTU 1500), instead of both on loopback;
# the processes of "host A" (the writer, the pinger, iperf3's client, TensorPipe's driver) run in
# namespace A, those of "host B" (the TCP servers) in namespace B. Everything is removed on exit.
#
# Environment:
#   BENCH_QUICK=1        fewer iterations, sizes up to 64 MiB, shorter phases
#   BUILD_DIR=DIR        meson build directory (default: <repo>/build-bench)
#   TPIPD_BIN=PATH       run this tpipd instead of the one just built
#   TPIPD_ARGS="..."     extra flags for both daemons (e.g. "--peer-chunk 4M"; without
#                        --peer-key-file, --peer-cert or --peer-insecure both get a shared key
#                        made for the run; "--peer-data-encryption no" measures TLS without
#                        encrypted tensor bytes)
#   XBENCH_CONNS=N       data connections per peer link, iperf3 streams and mpt lanes (default 4)
#   XBENCH_NETNS=1       one network namespace per daemon, joined by a veth pair
#   XBENCH_RATE=RATE     with XBENCH_NETNS=1: shape each veth end to RATE (NNmbit or NNgbit,
#                        e.g. 10gbit, 25gbit) with a token bucket, so that the link, not the
#                        CPUs, bounds every run on it, as a NIC of that speed would
#   XBENCH_SIZES=LIST    throughput sizes (default 1M,4M,16M,64M,256M,512M; quick: up to 64M)
#   XBENCH_IPERF_SECS=S  iperf3 duration (default 5; quick: 3)
#   XBENCH_IPERF_LEN=L   iperf3 write size of one baseline run (default 1M: tpipd's default
#                        --peer-chunk; set it to the chunk given in TPIPD_ARGS)
#   XBENCH_SEND_SIZE=L   write size of another iperf3 baseline run and of the raw TCP streams
#                        (default 60K: tpipd's default --peer-send-size; set it to the one given
#                        in TPIPD_ARGS)
#   BENCH_LAT_ARGS="..." extra bench_latency flags (e.g. "-n 50000")
#   BENCH_TPUT_ARGS="..." extra bench_throughput flags (e.g. "-k 8")
#   BENCH_TPB_ARGS="..."  extra tp_baseline flags
#   BENCH_TIMEOUT=SECS   wall-clock limit per benchmark program (default 300)
#   BENCH_NO_INSTALL=1   do not install the optional baseline packages (iperf3, jq, g++,
#                        libtensorpipe-dev)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build-bench}
quick=${BENCH_QUICK:-0}
limit=${BENCH_TIMEOUT:-300}
conns=${XBENCH_CONNS:-4}
iperf_len=${XBENCH_IPERF_LEN:-1M}
send_len=${XBENCH_SEND_SIZE:-60K}
netns=${XBENCH_NETNS:-0}
rate=${XBENCH_RATE:-}

if ! [[ $conns =~ ^[0-9]+$ ]] || ((conns < 1 || conns > 16)); then
	echo "run_xhost.sh: XBENCH_CONNS must be 1..16 (tpipd's --peer-data-conns range)" >&2
	exit 2
fi
if [[ $netns == 1 ]] && { [[ $(id -u) != 0 ]] || ! command -v ip >/dev/null; }; then
	echo "run_xhost.sh: XBENCH_NETNS=1 needs root and iproute2 (ip)" >&2
	exit 2
fi
rate_bytes=0
if [[ -n $rate ]]; then
	if [[ $netns != 1 ]] || ! command -v tc >/dev/null; then
		echo "run_xhost.sh: XBENCH_RATE needs XBENCH_NETNS=1 and iproute2's tc" >&2
		exit 2
	fi
	if [[ $rate =~ ^([1-9][0-9]{0,5})(mbit|gbit)$ ]]; then
		rate_bytes=${BASH_REMATCH[1]}
		[[ ${BASH_REMATCH[2]} == gbit ]] && rate_bytes=$((rate_bytes * 1000))
		rate_bytes=$((rate_bytes * 125000))
	fi
	if ((rate_bytes < 12500000)); then
		echo "run_xhost.sh: XBENCH_RATE must be NNmbit or NNgbit, at least 100mbit" \
			"(e.g. 10gbit)" >&2
		exit 2
	fi
fi

# The baselines need iperf3 and jq (throughput) and g++ + libtensorpipe-dev (TensorPipe):
# installed when missing, best effort.
# shellcheck source=scripts/deps.sh
. "$root/scripts/deps.sh"
install_xbench_deps() {
	local missing sudo=()
	command -v apt-get >/dev/null || return 0
	mapfile -t missing < <(tp_deps_missing iperf3 jq)
	[[ ${#missing[@]} -eq 0 ]] && return 0
	[[ $(id -u) -eq 0 ]] || sudo=(sudo)
	echo "deps: installing optional benchmark packages: ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}" </dev/null ||
		echo "deps: could not install ${missing[*]}; the baselines that need them are skipped"
	return 0
}
if [[ ${BENCH_NO_INSTALL:-0} != 1 ]]; then
	tp_deps_install_bench
	install_xbench_deps
fi
if [[ ! -f $build/build.ninja ]]; then
	meson setup "$build" "$root" -Dbuildtype=release
fi
targets=(daemon/tpipd client/tpipctl/tpipctl bench/bench_latency bench/bench_throughput)
ninja -C "$build" build.ninja >/dev/null
have_tpb=0
if ninja -C "$build" -t query bench/tp_baseline >/dev/null 2>&1; then
	have_tpb=1
	targets+=(bench/tp_baseline)
fi
ninja -C "$build" "${targets[@]}"
tpipd=${TPIPD_BIN:-$build/daemon/tpipd}
tpipctl=$build/client/tpipctl/tpipctl
have_iperf=0
command -v iperf3 >/dev/null && command -v jq >/dev/null && have_iperf=1

tmp=$(mktemp -d "${TMPDIR:-/tmp}/tpipd-xbench.XXXXXX")
pid_a=
pid_b=
iperf_pid=
iperf_port=
ns_a=
ns_b=

stop_pid() {
	if [[ -n $1 ]] && kill -0 "$1" 2>/dev/null; then
		kill -TERM "$1" 2>/dev/null || true
		wait "$1" 2>/dev/null || true
	fi
}

# shellcheck disable=SC2317 # invoked by the EXIT trap
cleanup() {
	local st=$?

	stop_pid "$iperf_pid"
	stop_pid "$pid_a"
	stop_pid "$pid_b"
	# Deleting a namespace also deletes the veth end in it, and with it the pair.
	[[ -z $ns_a ]] || ip netns del "$ns_a" 2>/dev/null || true
	[[ -z $ns_b ]] || ip netns del "$ns_b" 2>/dev/null || true
	rm -rf "$tmp"
	exit "$st"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- the two "hosts" -------------------------------------------------------------------------

in_a=()
in_b=()
host_a=127.0.0.1
host_b=127.0.0.1
if [[ $netns == 1 ]]; then
	ns_a=tpxb-$$-a
	ns_b=tpxb-$$-b
	ip netns add "$ns_a"
	ip netns add "$ns_b"
	ip link add "xb$$a" netns "$ns_a" type veth peer name "xb$$b" netns "$ns_b"
	host_a=10.77.0.1
	host_b=10.77.0.2
	ip -n "$ns_a" addr add "$host_a/24" dev "xb$$a"
	ip -n "$ns_b" addr add "$host_b/24" dev "xb$$b"
	for ns in "$ns_a" "$ns_b"; do
		ip -n "$ns" link set lo up
	done
	ip -n "$ns_a" link set "xb$$a" up
	ip -n "$ns_b" link set "xb$$b" up
	if [[ -n $rate ]]; then
		# A token bucket on each end's egress. Its depth is 1 ms at the rate (at least
		# 256 KiB), enough for a 64 KiB GSO packet and for the kernel's timer slack; its
		# queue holds 5 ms, so TCP sees a link of that speed, not drops.
		burst=$((rate_bytes / 1000))
		((burst >= 262144)) || burst=262144
		ip netns exec "$ns_a" tc qdisc add dev "xb$$a" root tbf rate "$rate" \
			burst "$burst" latency 5ms
		ip netns exec "$ns_b" tc qdisc add dev "xb$$b" root tbf rate "$rate" \
			burst "$burst" latency 5ms
	fi
	in_a=(ip netns exec "$ns_a")
	in_b=(ip netns exec "$ns_b")
fi

# start_daemon NAME HOST CMD...: starts tpipd NAME with its socket in $tmp and a peer listener on
# HOST; its pid goes to the variable pid_NAME. `ip netns exec` execs, so $! is tpipd itself.
start_daemon() {
	local name=$1 host=$2 auth=()
	shift 2
	# Peer listeners open only with authentication: both daemons share a key made here,
	# unless TPIPD_ARGS says how they authenticate (--peer-insecure, a key, certificates).
	case " ${TPIPD_ARGS:-} " in
	*" --peer-insecure "* | *" --peer-key-file "* | *" --peer-cert "*) ;;
	*)
		[[ -s $tmp/peer.key ]] || (umask 077 && head -c 32 /dev/urandom | base64 >"$tmp/peer.key")
		auth=(--peer-key-file "$tmp/peer.key")
		;;
	esac
	# shellcheck disable=SC2086 # TPIPD_ARGS is a list of flags
	"$@" "$tpipd" --socket "$tmp/$name.sock" --log-level warning \
		--peer-listen "$host:0" --peer-force-cross-host --peer-data-conns "$conns" \
		"${auth[@]}" ${TPIPD_ARGS:-} 2>"$tmp/$name.log" &
	printf -v "pid_$name" '%s' "$!"
}

# wait_daemon NAME: waits for its socket; prints the port of its peer listener.
wait_daemon() {
	local name=$1 pid sock=$tmp/$1.sock listen=

	pid=pid_$name
	pid=${!pid}
	for _ in $(seq 100); do
		[[ -S $sock ]] && break
		if ! kill -0 "$pid" 2>/dev/null; then
			echo "run_xhost.sh: tpipd $name exited during start-up:" >&2
			cat "$tmp/$name.log" >&2
			return 1
		fi
		sleep 0.1
	done
	listen=$("$tpipctl" --socket "$sock" status --json 2>/dev/null | jq -r '.peer_listen // empty' \
		2>/dev/null || true)
	if [[ -z $listen ]]; then
		listen=$(sed -n 's/.*peer listener on \([^ ]*\).*/\1/p' "$tmp/$name.log" | head -n 1)
	fi
	if [[ ! -S $sock || -z $listen ]]; then
		echo "run_xhost.sh: tpipd $name did not come up with a peer listener within 10 s:" >&2
		cat "$tmp/$name.log" >&2
		return 1
	fi
	echo "${listen##*:}"
}

start_daemon a "$host_a" "${in_a[@]}"
start_daemon b "$host_b" "${in_b[@]}"
wait_daemon a >/dev/null
port_b=$(wait_daemon b)
url_host=$host_b
[[ $host_b == *:* ]] && url_host="[$host_b]"
prefix="tpip://$url_host:$port_b/"

if [[ $quick == 1 ]]; then
	lat_args=(-n 2000 -w 200)
	tput_args=(-s "${XBENCH_SIZES:-1M,4M,16M,64M}" -T 0.2 -m 4)
	iperf_secs=${XBENCH_IPERF_SECS:-3}
else
	lat_args=(-n 5000)
	tput_args=(-s "${XBENCH_SIZES:-1M,4M,16M,64M,256M,512M}")
	iperf_secs=${XBENCH_IPERF_SECS:-5}
fi
ns_b_args=()
[[ $netns == 1 ]] && ns_b_args=(-N "$ns_b")

rows=$tmp/rows.tsv
: >"$rows"
status=0

# run_one NAME ARGS...: runs bench/NAME in "host A" with -t; its rows go to $rows.
run_one() {
	local name=$1
	shift
	echo "run_xhost.sh: running $name $*" >&2
	if ! timeout "$limit" "${in_a[@]}" "$build/bench/$name" -t "$@" >>"$rows"; then
		echo "run_xhost.sh: $name did not complete (see messages above)" >&2
		status=1
	fi
}

# ---- iperf3: N TCP streams over the same path -------------------------------------------------

# iperf3_server: starts a one-shot iperf3 server in "host B" on a free port (in iperf_port; its
# pid in iperf_pid). Not in a subshell: the server must be this shell's child.
iperf3_server() {
	local port
	for _ in 1 2 3 4 5; do
		port=$((20000 + RANDOM % 40000))
		"${in_b[@]}" iperf3 -s -B "$host_b" -p "$port" -1 >"$tmp/iperf3-server.log" 2>&1 &
		iperf_pid=$!
		for _ in $(seq 50); do
			if "${in_b[@]}" ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
				iperf_port=$port
				return 0
			fi
			kill -0 "$iperf_pid" 2>/dev/null || break
			sleep 0.1
		done
		stop_pid "$iperf_pid"
	done
	return 1
}

# iperf3_runs WHEN: the three baseline runs, rows named "... (WHEN)".
iperf3_runs() {
	run_iperf3 "iperf3 tcp -P $conns ($1)" "128K"
	run_iperf3 "iperf3 tcp -P $conns -l $send_len ($1)" "$send_len" -l "$send_len"
	run_iperf3 "iperf3 tcp -P $conns -l $iperf_len ($1)" "$iperf_len" -l "$iperf_len"
}

# run_iperf3 NAME SIZE [IPERF3_CLIENT_ARGS...]: one iperf3 run; a row named NAME, size SIZE.
run_iperf3() {
	local gbps retr name=$1 size=$2
	shift 2

	echo "run_xhost.sh: running iperf3 -P $conns -t $iperf_secs $*" >&2
	if ! iperf3_server; then
		echo "run_xhost.sh: iperf3 server did not start:" >&2
		cat "$tmp/iperf3-server.log" >&2
		printf '%s\t-\terror (see stderr)\t-\t-\n' "$name" >>"$rows"
		status=1
		return
	fi
	if ! timeout "$limit" "${in_a[@]}" iperf3 -c "$host_b" -p "$iperf_port" -P "$conns" \
		-t "$iperf_secs" -J "$@" >"$tmp/iperf3.json" 2>"$tmp/iperf3.err"; then
		echo "run_xhost.sh: iperf3 client failed:" >&2
		cat "$tmp/iperf3.err" >&2
		jq -r '.error // empty' "$tmp/iperf3.json" >&2 2>/dev/null || true
		printf '%s\t-\terror (see stderr)\t-\t-\n' "$name" >>"$rows"
		status=1
	else
		gbps=$(jq -r '.end.sum_received.bits_per_second / 8e9' "$tmp/iperf3.json")
		retr=$(jq -r '.end.sum_sent.retransmits // 0' "$tmp/iperf3.json")
		printf '%s\t%s\t%.2f GB/s (%s s, %s retransmits)\t-\t-\n' "$name" "$size" "$gbps" \
			"$iperf_secs" "$retr" >>"$rows"
	fi
	wait "$iperf_pid" 2>/dev/null || true
	iperf_pid=
}

if [[ $have_iperf == 1 ]]; then
	# Three write sizes: iperf3's own default (128 KiB), tpipd's socket write size and tpipd's
	# chunk size, once here and once after tpipd's throughput runs. The best of all six is the
	# baseline of the ratio column (background load only ever lowers a baseline, and no write
	# size is best on every path).
	iperf3_runs before
else
	echo "run_xhost.sh: iperf3 or jq missing (apt-get install iperf3 jq): no throughput" \
		"baseline" >&2
fi
# shellcheck disable=SC2086 # the extra-args variables are lists of flags
run_one bench_latency -S "$tmp/a.sock" -r "$tmp/b.sock" -a "$prefix" -x "$host_b" \
	"${ns_b_args[@]}" -P "xhost " -c ac "${lat_args[@]}" ${BENCH_LAT_ARGS:-}
# shellcheck disable=SC2086
run_one bench_throughput -S "$tmp/a.sock" -r "$tmp/b.sock" -a "$prefix" -P "xhost " -B -R \
	-x "$host_b" "${ns_b_args[@]}" -C "$conns" -W "$send_len" -K shm,cma "${tput_args[@]}" ${BENCH_TPUT_ARGS:-}
peers_a=$("$tpipctl" --socket "$tmp/a.sock" peers 2>&1 || true)
if [[ $have_iperf == 1 ]]; then
	iperf3_runs after
fi
if [[ $have_tpb == 1 ]]; then
	# shellcheck disable=SC2086
	run_one tp_baseline -c um -L "$conns" -H "$host_b" -A "$host_a" "${ns_b_args[@]}" -R \
		"${lat_args[@]}" "${tput_args[@]}" ${BENCH_TPB_ARGS:-}
else
	echo "run_xhost.sh: tp_baseline was not built (no TensorPipe at configure time:" \
		"apt-get install libtensorpipe-dev, then meson setup --wipe $build);" \
		"TensorPipe rows skipped" >&2
fi

alive=1
for name in a b; do
	pid=pid_$name
	if ! kill -0 "${!pid}" 2>/dev/null; then
		echo "run_xhost.sh: tpipd $name is no longer running; its log:" >&2
		cat "$tmp/$name.log" >&2
		alive=0
		status=1
	fi
done

# ---- the table --------------------------------------------------------------------------------

# xhost_columns ROWS: fills in the xhost rows' baseline and ratio (throughput: iperf3 from the
# same run) and adds the sixth column, tpipd against TensorPipe uv+mpt (> 1: tpipd better).
xhost_columns() {
	awk -F '\t' -v OFS='\t' '
	function med(s, n, a, i) {
		n = split(s, a, " ")
		for (i = 1; i < n; i++)
			if (a[i] == "med")
				return a[i + 1] + 0
		return 0
	}
	function gbps(s, a) {
		if (index(s, "GB/s") == 0)
			return 0
		split(s, a, " ")
		return a[1] + 0
	}
	function k_of(name, n, a) {
		n = split(name, a, " ")
		return a[n]
	}
	NR == FNR {
		if ($1 ~ /^iperf3 / && gbps($3) > iperf) {
			iperf = gbps($3)
			iperf_name = $1
			sub(/ \(.*\)$/, "", iperf_name)
			sub(/ tcp/, "", iperf_name)
		} else if ($1 ~ /^tensorpipe uv\+mpt latency rtt /) {
			key = $1
			sub(/^tensorpipe uv\+mpt /, "", key)
			lat[key] = med($3)
		} else if ($1 ~ /^tensorpipe uv\+mpt tput /) {
			tput[k_of($1) "|" $2] = gbps($3)
		}
		next
	}
	{
		vs = "-"
		raw = "-"
		if ($1 ~ /^xhost tput / && gbps($3) > 0) {
			key = k_of($1) "|" $2
			if ($4 ~ /^raw tcp .*GB\/s$/) {
				n = split($4, a, " ")
				raw = sprintf("%s (%s GB/s)", $5, a[n - 1])
			}
			$4 = "-"
			$5 = "-"
			if (iperf > 0) {
				$4 = sprintf("%s %.2f GB/s", iperf_name, iperf)
				$5 = sprintf("%.3f", gbps($3) / iperf)
			}
			if (tput[key] > 0)
				vs = sprintf("%.2f", gbps($3) / tput[key])
		} else if ($1 ~ /^xhost latency rtt /) {
			key = $1
			sub(/^xhost /, "", key)
			if (lat[key] > 0 && med($3) > 0)
				vs = sprintf("%.2f", lat[key] / med($3))
		}
		print $0, raw, vs
	}' "$1" "$1"
}

echo
mode=full
[[ $quick == 1 ]] && mode=BENCH_QUICK
path="loopback ($host_a)"
[[ $netns == 1 ]] && path="veth pair between two network namespaces ($host_a -> $host_b)"
[[ -n $rate ]] && path="$path, shaped to $rate each way (tbf)"
echo "tpipd across two daemons ($mode): $("$tpipd" --version 2>/dev/null | head -n 1 || true)," \
	"$(uname -n), $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo |
		head -n 1)), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "path: $path; $conns data connections per peer link (--peer-data-conns)," \
	"--peer-force-cross-host; writer/pinger on daemon A, reader/ponger on daemon B"
echo "latency ratio = tpipd median / raw TCP ping-pong median over the same path (p99 in brackets);"
echo "throughput ratio = tpipd GB/s / iperf3 GB/s over the same path ($conns streams: the best of"
echo "the six iperf3 runs, writes of 128K, $send_len and $iperf_len before and after tpipd's);"
echo "vs raw tcp = tpipd GB/s / $conns raw TCP streams carrying the same messages between as many"
echo "distinct memory slots as tpipd's benchmark uses, in writes of $send_len (bench_throughput -x),"
echo "measured right before each row (in brackets);"
echo "vs TensorPipe (> 1: tpipd better) = TensorPipe uv+mpt median / tpipd median for latency,"
echo "tpipd GB/s / TensorPipe uv+mpt GB/s ($conns lanes, same size and k) for throughput"
[[ $have_tpb == 1 ]] ||
	echo "(TensorPipe baseline not built: no TensorPipe rows; the vs TensorPipe column says -)"
echo
{
	printf 'case\tsize\tresult\tbaseline\tratio\tvs raw tcp\tvs TensorPipe\n'
	xhost_columns "$rows"
} | column -t -s $'\t'

echo
echo "daemon A's peer links after the tpipd throughput runs (tpipctl peers):"
echo "$peers_a"

if [[ $alive == 1 ]]; then
	for name in a b; do
		# The peer listener's "no key" notice is expected here; anything else is news.
		if grep -v 'peer listener on .*no key' "$tmp/$name.log" >"$tmp/$name.warn" &&
			[[ -s $tmp/$name.warn ]]; then
			echo
			echo "tpipd $name warnings during the run:"
			cat "$tmp/$name.warn"
		fi
	done
fi
exit "$status"
