#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# bench/python/run.sh: the tpipd Python module against what a PyTorch user has, in one run on
# this host, against a private tpipd started here:
#   pipe       round trip and 1/16/64 MiB tensor throughput: tpipd (bench_tpipd.py pipe) vs
#              torch.distributed.rpc rpc_sync over TensorPipe (bench_rpc.py), the latter once
#              as is (rpc) and once with GLIBC_TUNABLES=glibc.malloc.mmap_max=0:
#              glibc.malloc.arena_max=1 (rpc-nommap)
#   chan       items/s of 4 and 64 KiB items through one tpipd.Channel (bench_tpipd.py chan)
#   allreduce  float32 sum for 2 and 4 processes: tpipd.all_reduce (bench_tpipd.py allreduce)
#              and the C bench_allreduce in alternating rounds (PYBENCH_ROUNDS, default 3), then
#              torch.distributed gloo once (bench/allreduce_gloo.py)
# then a table with ratios (round trip: ours / the better rpc; throughput: ours / the better
# rpc; all-reduce: the median of ours over the rounds / C's, and gloo / ours), each round's
# figure and the ranks' CPU time per iteration beside it. On a small shared machine one run
# says little: 4 ranks on 2 CPUs take 2-3x as long, with 2-3x the CPU time for the same work,
# whenever other work runs beside them, C or Python alike (docs/python.md, Benchmarks), so
# compare the rounds, not one run of each. Numbers only; the exit status says whether it ran.
#
# Environment: BUILD_DIR (default <repo>/build), PYBENCH_SECS (time per figure, default 1),
# PYBENCH_SIZES (default 1M,16M,64M), PYBENCH_N (default "2 4"), PYBENCH_ROUNDS (default 3),
# PYBENCH_PYTHONPATH (where
# tpipd is imported from; default the build's: another build's package and _tpipd, with its
# libtpclient on LD_LIBRARY_PATH, to compare two versions). Uses /usr/bin/python3.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${BUILD_DIR:-$root/build}
secs=${PYBENCH_SECS:-1}
sizes=${PYBENCH_SIZES:-1M,16M,64M}
ns=${PYBENCH_N:-2 4}
rounds=${PYBENCH_ROUNDS:-3}
py=/usr/bin/python3
here=$root/bench/python
nommap='glibc.malloc.mmap_max=0:glibc.malloc.arena_max=1'

[ -x "$build/daemon/tpipd" ] || { echo "run.sh: build first ($build/daemon/tpipd)" >&2; exit 1; }
ext=$(ls "$build"/client/python/_tpipd*.so 2>/dev/null | head -1)
[ -n "$ext" ] || { echo "run.sh: no _tpipd in $build (python3-dev missing?)" >&2; exit 1; }
export PYTHONPATH=${PYBENCH_PYTHONPATH:-$build/client/python:$root/client/python}
tmp=$(mktemp -d)
"$build/daemon/tpipd" --socket "$tmp/s" --peer-listen off --log-level warning 2>"$tmp/log" &
dpid=$!
trap 'kill $dpid 2>/dev/null; wait $dpid 2>/dev/null; rm -rf "$tmp"' EXIT
for _ in $(seq 200); do [ -S "$tmp/s" ] && break; sleep 0.05; done
export TPIPD_SOCKET=$tmp/s
out=$tmp/lines

echo "# pipe: tpipd"
$py "$here/bench_tpipd.py" pipe -s "$sizes" -t "$secs" | tee -a "$out"
echo "# pipe: rpc_sync (TensorPipe)"
$py "$here/bench_rpc.py" -s "$sizes" -t "$secs" --label rpc 2>/dev/null | tee -a "$out"
echo "# pipe: rpc_sync with GLIBC_TUNABLES=$nommap"
GLIBC_TUNABLES=$nommap $py "$here/bench_rpc.py" -s "$sizes" -t "$secs" --label rpc-nommap \
	2>/dev/null | tee -a "$out"
echo "# channel items through one channel (a writer thread, a reader; not compared)"
$py "$here/bench_tpipd.py" chan -t "$secs" | tee -a "$out"
# measured IMPL N CMD...: runs CMD, then records in $out the share of the CPUs that other
# processes used meanwhile (the CPU time of the whole machine less CMD's, its children's and
# the daemon's, over the run's wall time): "others impl=IMPL n=N pct=P".
hz=$(getconf CLK_TCK)
ncpu=$(nproc)
busy() { awk -v hz="$hz" '/^cpu /{ print ($2 + $3 + $4 + $7 + $8 + $9) / hz }' /proc/stat; }
mine() { # CPU seconds of this shell's waited-for children and of the daemon (call it in this
	# shell, not in $(...): a subshell has no children of its own)
	times >"$tmp/times.$BASHPID"
	awk 'NR == 2 { for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); s += a[1] * 60 + a[2] }
		print s }' "$tmp/times.$BASHPID"
	awk -v hz="$hz" '{ print ($14 + $15) / hz }' "/proc/$dpid/stat"
}
measured() {
	local impl=$1 n=$2 b0 t0 m=$tmp/mine.$BASHPID
	shift 2
	b0=$(busy) t0=$(date +%s.%N)
	mine >"$m.0"
	"$@"
	mine >"$m.1"
	echo "$b0 $(busy) $t0 $(date +%s.%N)" | cat - "$m.0" "$m.1" |
		awk -v i="$impl" -v n="$n" -v c="$ncpu" 'NR == 1 { b = $2 - $1; w = $4 - $3 }
			NR == 2 || NR == 3 { b += $1 } NR > 3 { b -= $1 }
			END { printf "others impl=%s n=%s pct=%.0f\n", i, n,
			      (w > 0 ? 100 * b / (c * w) : 0) }' >>"$out"
}

for n in $ns; do
	for r in $(seq "$rounds"); do
		echo "# allreduce n=$n, round $r of $rounds: tpipd-py, then C"
		measured tpipd-py "$n" $py "$here/bench_tpipd.py" allreduce -n "$n" -s "$sizes" \
			-t "$secs" | tee -a "$out"
		if [ -x "$build/bench/bench_allreduce" ]; then
			measured c "$n" "$build/bench/bench_allreduce" --socket "$tmp/s" \
				--ranks "$n" --sizes "$sizes" 2>/dev/null |
				sed -E 's/^allreduce (impl=[^ ]+ )?/allreduce impl=c /' | tee -a "$out"
		fi
	done
	echo "# allreduce n=$n: gloo"
	$py "$root/bench/allreduce_gloo.py" -n "$n" -s "$sizes" -t "$secs" 2>/dev/null |
		tee -a "$out"
done

$py - "$out" <<'PY'
import re, statistics, sys
rows = [dict(kv.split("=", 1) for kv in l.split()[1:]) | {"kind": l.split()[0]}
        for l in open(sys.argv[1]) if "=" in l]
def get(kind, impl, **k):
    for r in rows:
        if r["kind"] == kind and r.get("impl") == impl and all(r.get(a) == str(b) for a, b in k.items()):
            return float(r["median_us"])
print()
print(f"{'figure':<28}{'tpipd-py':>12}{'rpc':>12}{'rpc-nommap':>12}{'ratio':>10}")
o, a, b = get("rtt", "tpipd-py"), get("rtt", "rpc"), get("rtt", "rpc-nommap")
best = min(x for x in (a, b) if x) if (a or b) else None
print(f"{'round trip (us)':<28}{o or 0:>12.1f}{a or 0:>12.1f}{b or 0:>12.1f}"
      f"{(o / best) if o and best else 0:>9.2f}x  (ours / better rpc, goal <= 0.25)")
for s in sorted({int(r["size"]) for r in rows if r["kind"] == "tput"}):
    g = lambda i: (s / get("tput", i, size=s) / 1e3) if get("tput", i, size=s) else 0
    o, a, b = g("tpipd-py"), g("rpc"), g("rpc-nommap")
    print(f"{'tput ' + str(s >> 20) + ' MiB (GB/s)':<28}{o:>12.2f}{a:>12.2f}{b:>12.2f}"
          f"{(o / max(a, b)) if max(a, b) else 0:>9.2f}x  (ours / better rpc, goal >= 2)")
print()
print(f"{'allreduce (us)':<28}{'tpipd-py':>12}{'C':>12}{'gloo':>12}{'py/C':>8}{'gloo/py':>9}"
      "   (medians over the rounds)")
def rounds(impl, n, s):
    return [r for r in rows if r["kind"] == "allreduce" and r.get("impl") == impl and
            r["n"] == n and r["size"] == s]
def med(rs):
    return statistics.median(float(r["median_us"]) for r in rs) if rs else 0
def each(rs, impl, n):
    load = [r["pct"] for r in rows if r["kind"] == "others" and r["impl"] == impl and
            r["n"] == n]
    return ", ".join(f"{float(r['median_us']):.0f}" +
                     (f" ({float(r['cpu_us']):.0f}" if "cpu_us" in r else " (") +
                     (f", {load[i]}%)" if i < len(load) else ")") for i, r in enumerate(rs))
done = set()
for r in rows:
    key = (r.get("n"), r.get("size"))
    if r["kind"] != "allreduce" or r.get("impl") != "tpipd-py" or key in done:
        continue
    done.add(key)
    n, s = key
    py, c = rounds("tpipd-py", n, s), rounds("c", n, s)
    o, cm, gl = med(py), med(c), get("allreduce", "gloo", n=n, size=s)
    print(f"{'n=' + n + ' ' + str(int(s) >> 20) + ' MiB':<28}{o:>12.1f}{cm:>12.1f}"
          f"{gl or 0:>12.1f}{(o / cm) if cm else 0:>8.2f}{(gl / o) if gl else 0:>9.2f}")
    print(f"{'':<4}rounds, us (CPU us per iteration of the busiest rank, CPU % others used"
          f" meanwhile): tpipd-py {each(py, 'tpipd-py', n)}; C {each(c, 'c', n)}")
PY
