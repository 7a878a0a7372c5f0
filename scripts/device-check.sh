#!/usr/bin/env bash
# SPDX-License-Identifier: BSD-3-Clause
#
# The one-command GPU proof. Two steps, because a GPU machine may have the CUDA driver but none
# of the Debian libraries tpipd links:
#
#   scripts/device-check.sh pack [BUILD]   on a build machine: builds BUILD (default ./build,
#                                          which must have found cuda.h) and gathers into
#                                          ./.devlibs/ the daemon, tpipctl, the hw suite's
#                                          programs, bench_cuda, the stand-in drivers and every
#                                          library they load (glibc and its loader included;
#                                          libibverbs.so.1, which tpipd dlopen()s, where it is
#                                          installed),
#                                          with wrappers that run each program on those
#                                          libraries. .devlibs/ is ignored by git.
#   scripts/device-check.sh run [--fake]   on the GPU machine, from the repository root: runs
#                                          every hw test with TPT_HW_REQUIRE=1 (a missing GPU is a
#                                          failure, not a skip), then bench_cuda_calls and
#                                          bench_cuda, each under
#                                          a deadline so the whole run ends within
#                                          $DEVICE_CHECK_BUDGET seconds (default 480), and prints
#                                          one summary table. --fake runs the same on the
#                                          stand-in CUDA driver and verbs provider, to prove the
#                                          script here, without a GPU.
#
# rdma and cuda_gdr need an RDMA port as well: on a GPU machine without one they run without
# TPT_HW_REQUIRE and report their skip (the table says so); with --fake they use the stand-in.
# Each test's whole output goes to $OUT/device-check/ when $OUT is set (the device tool's
# folder that comes back), else to .devlibs/logs/. Exit status: 0 when no test failed.
# DEVICE_CHECK_DIR replaces .devlibs/, DEVICE_CHECK_NO_BUILD=1 makes pack take BUILD as it is
# (the hw suite's device_check test does both).
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.." || exit 2
ROOT=$PWD
D=${DEVICE_CHECK_DIR:-$ROOT/.devlibs} # where pack gathers and run finds the programs

HW_TESTS=(test_cuda_xfer test_cuda_peer test_cuda_basic test_cuda_host test_cuda_stream test_cuda_faults test_cuda_life
	test_cuda_ctl test_cuda_rules test_cuda_coll test_fakeverbs test_rdma test_cuda_gdr test_cuda_dmabuf)
NEEDS_RDMA=" test_rdma test_cuda_gdr test_fakeverbs test_cuda_dmabuf "
PROGRAMS=(daemon/tpipd client/tpipctl/tpipctl bench/bench_cuda bench/bench_cuda_calls)

die() {
	echo "device-check: $*" >&2
	exit 2
}

# The shared libraries @1 loads (resolved paths) and its ELF interpreter, one a line.
deps_of() {
	ldd "$1" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/.*ld-linux/ { print $1 }'
}

# Writes bin/NAME, which runs real/NAME through the carried loader on the carried libraries.
wrapper() {
	local name=$1
	cat >"$D/bin/$name" <<'EOF'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")/..
exec "$d/lib/ld-linux-x86-64.so.2" --library-path "$d/lib" "$d/real/$(basename "$0")" "$@"
EOF
	chmod 755 "$D/bin/$name"
}

pack() {
	local build=${1:-build} f name lib
	[ -f "$build/build.ninja" ] || die "no meson build in $build (run ./test.sh, or meson setup $build)"
	if [ -z "${DEVICE_CHECK_NO_BUILD:-}" ]; then
		ninja -C "$build" >/dev/null || die "the build in $build failed"
	fi
	[ -x "$build/tests/hw/test_cuda_xfer" ] ||
		die "$build was configured without CUDA (cuda.h not found): the hw suite is not built"
	rm -rf "$D"
	mkdir -p "$D/bin" "$D/real" "$D/lib" "$D/logs"
	for f in "${PROGRAMS[@]}" "${HW_TESTS[@]/#/tests/hw/}"; do
		[ -x "$build/$f" ] || die "$build/$f is missing"
		name=$(basename "$f")
		cp "$build/$f" "$D/real/$name"
		strip --strip-debug "$D/real/$name" 2>/dev/null || true
		wrapper "$name"
		deps_of "$build/$f" >>"$D/deps.txt"
	done
	for f in "$build"/tests/hw/libfakecuda.so "$build"/tests/hw/libfakeverbs.so; do
		[ -f "$f" ] || continue
		cp "$f" "$D/lib/"
		deps_of "$f" >>"$D/deps.txt"
	done
	# tpipd dlopen()s libibverbs.so.1 (ldd does not list it): carry it and what it links, where
	# this machine has it, as when it was linked; its providers are the GPU machine's own.
	lib=$(ldconfig -p 2>/dev/null | awk '$1 == "libibverbs.so.1" { print $NF; exit }')
	if [ -n "$lib" ]; then
		echo "$lib" >>"$D/deps.txt"
		deps_of "$lib" >>"$D/deps.txt"
	fi
	sort -u "$D/deps.txt" | while read -r lib; do
		cp -L "$lib" "$D/lib/$(basename "$lib")"
	done
	[ -f "$D/lib/ld-linux-x86-64.so.2" ] || die "no ELF loader among the dependencies"
	chmod 755 "$D/lib/ld-linux-x86-64.so.2"
	rm -f "$D/deps.txt"
	echo "device-check: packed $(find "$D" -type f | wc -l) files," \
		"$(du -sh "$D" | cut -f1) in .devlibs (carry it to the GPU machine)"
}

now() { date +%s; }

# run_one NAME BUDGET_LEFT: runs one hw test under its deadline; appends a row to $rows.
run_one() {
	local name=$1 left=$2 cap=$3 log rc start secs result note env_req=1
	log=$LOGS/$name.log
	case "$NEEDS_RDMA" in *" $name "*) [ "$FAKE" = 1 ] || env_req= ;; esac
	start=$(now)
	# TPT_HW_REQUIRE must be absent, not empty, for a skip to stay a skip.
	env ${env_req:+TPT_HW_REQUIRE=1} timeout -k 5 "$((left < cap ? left : cap))" \
		"$D/bin/$name" >"$log" 2>&1
	rc=$?
	secs=$(($(now) - start))
	case $rc in
	0) result=ok ;;
	77) result=skipped ;;
	124 | 137) result=TIMEOUT ;;
	*) result=FAIL ;;
	esac
	# The note: Check's tally for a pass, else the last line that says why (or the last line).
	if [ "$result" = ok ]; then
		note=$(grep -E '^[0-9]+%: Checks' "$log" | tail -1)
	else
		note=$(grep -E 'SKIP|skip|FAIL|fail|rror' "$log" | tail -1)
	fi
	[ -n "$note" ] || note=$(grep -v '^[[:space:]]*$' "$log" | tail -1)
	note=$(printf '%s' "$note" | cut -c1-90)
	rows+=("$(printf '%-18s %-8s %5ss  %s' "$name" "$result" "$secs" "$note")")
	[ "$result" = ok ] || [ "$result" = skipped ] || failed=$((failed + 1))
}

run() {
	local budget=${DEVICE_CHECK_BUDGET:-480} t0 left name bench_log
	FAKE=0
	[ "${1:-}" = --fake ] && FAKE=1
	[ -x "$D/bin/tpipd" ] || die "no .devlibs/ here: run 'scripts/device-check.sh pack' first"
	LOGS=${OUT:+$OUT/device-check}
	LOGS=${LOGS:-$D/logs}
	mkdir -p "$LOGS"
	export TPIPD_BIN=$D/bin/tpipd TPIPCTL_BIN=$D/bin/tpipctl
	if [ "$FAKE" = 1 ]; then
		export TPIPD_CUDA_LIBRARY=$D/lib/libfakecuda.so
		export TPIPD_VERBS_LIBRARY=$D/lib/libfakeverbs.so TPT_FAKEVERBS=$D/lib/libfakeverbs.so
	fi
	rows=()
	failed=0
	t0=$(now)
	echo "device-check: $(uname -srm), $(nproc) cores"
	if [ "$FAKE" = 1 ]; then
		echo "device-check: stand-in CUDA driver and verbs provider (--fake)"
	elif command -v nvidia-smi >/dev/null; then
		nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader |
			sed 's/^/device-check: GPU /'
	else
		echo "device-check: no nvidia-smi on this machine"
	fi
	for name in "${HW_TESTS[@]}"; do
		left=$((budget - ($(now) - t0) - 60)) # keep a minute for bench_cuda
		if [ "$left" -lt 10 ]; then
			rows+=("$(printf '%-18s %-8s %5ss  %s' "$name" "not run" 0 "budget spent")")
			failed=$((failed + 1))
			continue
		fi
		run_one "$name" "$left" 240
	done
	bench_log=$LOGS/bench_cuda.log
	timeout -k 5 60 "$D/bin/bench_cuda_calls" -n 200 >"$LOGS/bench_cuda_calls.log" 2>&1
	left=$((budget - ($(now) - t0)))
	if [ "$left" -ge 20 ]; then
		BENCH_CUDA_MAX_SIZE=${BENCH_CUDA_MAX_SIZE:-256M} timeout -k 5 "$left" \
			"$D/bin/bench_cuda" -D "$TPIPD_BIN" -T 0.3 >"$bench_log" 2>&1
		rows+=("$(printf '%-18s %-8s %5ss  %s' bench_cuda "rc $?" "-" "figures below")")
	else
		rows+=("$(printf '%-18s %-8s %5ss  %s' bench_cuda "not run" 0 "budget spent")")
	fi
	echo
	echo "== device-check summary ($(($(now) - t0)) s; logs in $LOGS)"
	printf '%-18s %-8s %6s  %s\n' TEST RESULT TIME NOTE
	printf '%s\n' "${rows[@]}"
	echo
	echo "== bench_cuda_calls (what each driver call on a message's path costs)"
	cat "$LOGS/bench_cuda_calls.log" 2>/dev/null
	echo
	echo "== bench_cuda"
	cat "$bench_log" 2>/dev/null
	echo
	echo "device-check: $failed failed"
	[ "$failed" = 0 ]
}

case "${1:-}" in
pack) shift; pack "$@" ;;
run) shift; run "$@" ;;
*) die "usage: scripts/device-check.sh pack [BUILD] | run [--fake]" ;;
esac
