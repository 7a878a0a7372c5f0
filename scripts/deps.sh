# SPDX-License-Identifier: BSD-3-Clause
# shellcheck shell=bash
#
# Shared by ./demo.sh, ./test.sh and .ci/run (source it, do not run it): installs the Debian
# packages tpipd needs to build and test, only those that are missing, non-interactively and
# with sudo when not root; and configures and builds a meson build directory. Debian 12
# (bookworm) is the reference system; elsewhere it prints what to install and fails.

# Build and test dependencies, as Debian package names. munge, slurmd, slurmctld and slurm-client
# (Debian's slurm-wlm without its metapackage) serve the real-Slurm service test only
# (tests/service/slurm.sh), which starts its own daemons and skips where they cannot run.
TP_DEB_PACKAGES=(
	meson ninja-build pkg-config gcc libc6-dev
	libevent-dev libprotobuf-c-dev protobuf-c-compiler libsystemd-dev libibverbs-dev
	check libjson-c-dev libssl-dev libinih-dev
	valgrind iproute2 scdoc jq curl openssl
	munge slurmd slurmctld slurm-client
)

# For the test suite only (./test.sh, .ci/run; not ./demo.sh, so that the first command stays
# light): python3-dev, python3-numpy, python3-pytest and python3-torch build the Python module
# and run its suite (client/python, tests/python) with Debian's /usr/bin/python3.
TP_DEB_TEST_PACKAGES=(python3-dev python3-numpy python3-pytest python3-torch)

# Optional, for the benchmarks' baselines only (bench/run.sh, bench/run_allreduce.sh): a C++
# compiler and Debian's TensorPipe; PyTorch (torch.distributed, gloo) and Open MPI for the
# all-reduce baselines; UCX's ucx_perftest for bench/run.sh; libzmq for bench_chan's ZeroMQ
# PUSH/PULL baseline. The project builds and tests without
# them.
TP_DEB_BENCH_PACKAGES=(g++ libtensorpipe-dev python3-torch openmpi-bin libopenmpi-dev ucx-utils libzmq3-dev)

# Prints the names among "$@" that dpkg does not list as installed.
tp_deps_missing() {
	local p status
	for p in "$@"; do
		status=$(dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null || true)
		case "$status" in
		*"install ok installed"*) ;;
		*) printf '%s\n' "$p" ;;
		esac
	done
}

# tp_deps_install [test]: installs the packages of TP_DEB_PACKAGES (and, with "test", of
# TP_DEB_TEST_PACKAGES) that are missing. Return: 0, or non-zero if that fails.
tp_deps_install() {
	local missing sudo=() want=("${TP_DEB_PACKAGES[@]}")
	[ "${1:-}" = test ] && want+=("${TP_DEB_TEST_PACKAGES[@]}")
	if ! command -v dpkg-query >/dev/null || ! command -v apt-get >/dev/null; then
		echo "deps: not a Debian system; install the equivalents of:" >&2
		echo "  ${want[*]}" >&2
		return 1
	fi
	mapfile -t missing < <(tp_deps_missing "${want[@]}")
	if [ "${#missing[@]}" -eq 0 ]; then
		return 0
	fi
	if [ "$(id -u)" -ne 0 ]; then
		if ! command -v sudo >/dev/null; then
			echo "deps: missing packages: ${missing[*]}" >&2
			echo "deps: run as root or install sudo" >&2
			return 1
		fi
		sudo=(sudo)
	fi
	echo "deps: installing ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
		"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
			--no-install-recommends "${missing[@]}" </dev/null
}

# Installs the optional benchmark packages that are missing; never fails the caller.
tp_deps_install_bench() {
	local missing sudo=()
	command -v apt-get >/dev/null || return 0
	mapfile -t missing < <(tp_deps_missing "${TP_DEB_BENCH_PACKAGES[@]}")
	[ "${#missing[@]}" -eq 0 ] && return 0
	[ "$(id -u)" -eq 0 ] || sudo=(sudo)
	echo "deps: installing optional benchmark packages: ${missing[*]}"
	"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
		--no-install-recommends "${missing[@]}" </dev/null ||
		echo "deps: could not install ${missing[*]}; the baselines that need them are skipped"
	return 0
}

# tp_configure DIR [MESON_OPTIONS...]: configures DIR once, and applies the given -D options to
# a DIR configured before (so ./test.sh turns -Werror on in a build that ./demo.sh made).
tp_configure() {
	local dir=$1
	shift
	if [ ! -f "$dir/build.ninja" ]; then
		meson setup "$dir" "$@" || return
	elif [ "$#" -gt 0 ]; then
		meson configure "$dir" "$@" >/dev/null || return
	fi
}

# tp_build DIR [MESON_OPTIONS...]: tp_configure, then builds everything (tests, benchmarks).
tp_build() {
	tp_configure "$@" || return
	ninja -C "$1"
}

# tp_build_targets DIR TARGET...: tp_configure DIR as it is, then builds only the ninja TARGETs
# (paths under DIR, such as daemon/tpipd) and what they need; a later tp_build builds the rest.
tp_build_targets() {
	local dir=$1
	shift
	tp_configure "$dir" || return
	ninja -C "$dir" "$@"
}
