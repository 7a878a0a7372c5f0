#!/bin/sh
# SPDX-License-Identifier: BSD-3-Clause
#
# Readers under valgrind's memcheck: the integration suites given as arguments run with every
# client process (the suite and the reader and writer processes it forks) under memcheck, the
# daemon not. The daemon writes a reader's private memory from its own process (CMA), which
# memcheck cannot see; libtpclient says those bytes are defined when a read or take has put
# them there (tpc_mem_written()), so a reader that checks what it received is not told it uses
# uninitialised memory. Any memcheck error in a client (an uninitialised byte, an invalid read
# or write, a leak of a whole block) exits that process with status 99, which fails its case.
#
# Usage: valgrind_reads.sh SUITE... (integration test binaries; TPIPD_BIN set as for them)
if ! command -v valgrind >/dev/null 2>&1; then
	echo "SKIP: valgrind is not installed (Debian's valgrind package)"
	exit 77
fi
# The daemon was built as the suites were: valgrind must be able to read such a binary (one from
# a compiler whose debug information it does not know, e.g. clang's DWARF 5 for valgrind 3.19,
# makes it give up).
if ! valgrind --quiet --error-exitcode=99 "${TPIPD_BIN:?}" --version >/dev/null 2>&1; then
	echo "SKIP: valgrind cannot run $TPIPD_BIN --version (debug information it cannot read?)"
	exit 77
fi
# valgrind's clients are several times slower: the suites' own waits grow with this.
# --fair-sched=yes: valgrind runs one thread at a time, and by default a thread that spins (a
# test waiting for the first bytes of a copy, a library spinning on its rings) can keep taking
# that turn while the thread that would make progress starves: pipes' copy cases then waited out
# their deadlines in 1 to 2 runs of 3.
TPT_TIME_SCALE=${TPT_TIME_SCALE:-5}
CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-5}
export TPT_TIME_SCALE CK_TIMEOUT_MULTIPLIER
status=0
for suite in "$@"; do
	echo "== $suite under memcheck"
	valgrind --fair-sched=yes --quiet --error-exitcode=99 --num-callers=16 --leak-check=full \
		--errors-for-leak-kinds=definite --show-leak-kinds=definite "$suite" || status=1
done
exit $status
