/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Corpus replay for the Slurm bootstrap fuzz target: feeds every file of the given directories
 * (or files) to fuzz_slurm_check(), so the committed corpus (tests/fuzz/corpus-slurm) runs in
 * every build, sanitized or not, with any compiler. Seed files carry their expected verdict in
 * their name: ok-* must be accepted, bad-* refused; other names (files the fuzzer added) only
 * have to run without crashing.
 * Exit status: 0 if every expectation held and at least one file was read, 1 otherwise.
 */
#include <stdio.h>
#include "fuzz_slurm.h"
#include "replay.h"

static bool check(const char *path, const char *name, const uint8_t *buf, size_t len)
{
	int ok = fuzz_slurm_check(buf, len);

	if ((replay_starts_with(name, "ok-") && !ok) || (replay_starts_with(name, "bad-") && ok)) {
		fprintf(stderr, "%s: unexpectedly %s\n", path, ok ? "accepted" : "refused");
		return false;
	}
	return true;
}

int main(int argc, char **argv)
{
	return replay_main(argc, argv, check);
}
