/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Corpus replay for the Slurm bootstrap fuzz target: feeds every file of the given directories
 * (or files) to fuzz_slurm_check(), so the committed corpus (tests/fuzz/corpus-slurm) runs in
 * every build, sanitized or not, with any compiler. Seed files carry their expected verdict in
 * their name: ok-* must be accepted, bad-* refused; other names (files the fuzzer added) only
 * have to run without crashing.
 * Exit status: 0 if every expectation held and at least one file was read, 1 otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_slurm.h"

#define INPUT_MAX (1u << 20)

struct tally {
	unsigned files;
	unsigned failures;
};

static void replay_one(const char *path, const char *name, struct tally *t)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = malloc(INPUT_MAX);
	size_t len;
	int ok;

	if (!f || !buf) {
		fprintf(stderr, "%s: %s\n", path, strerror(errno));
		if (f)
			fclose(f);
		free(buf);
		t->failures++;
		return;
	}
	len = fread(buf, 1, INPUT_MAX, f);
	fclose(f);
	ok = fuzz_slurm_check(buf, len);
	free(buf);
	t->files++;
	if ((strncmp(name, "ok-", 3) == 0 && !ok) || (strncmp(name, "bad-", 4) == 0 && ok)) {
		fprintf(stderr, "%s: unexpectedly %s\n", path, ok ? "accepted" : "refused");
		t->failures++;
	}
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static void replay_dir(const char *dir, struct tally *t)
{
	struct dirent **ents;
	int n = scandir(dir, &ents, NULL, by_name);
	char path[4096];

	if (n < 0) {
		fprintf(stderr, "%s: %s\n", dir, strerror(errno));
		t->failures++;
		return;
	}
	for (int i = 0; i < n; i++) {
		if (ents[i]->d_name[0] != '.') {
			snprintf(path, sizeof(path), "%s/%s", dir, ents[i]->d_name);
			replay_one(path, ents[i]->d_name, t);
		}
		free(ents[i]);
	}
	free(ents);
}

int main(int argc, char **argv)
{
	struct tally t = { 0, 0 };
	struct stat st;

	for (int i = 1; i < argc; i++) {
		const char *base = strrchr(argv[i], '/');

		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
			replay_dir(argv[i], &t);
		else
			replay_one(argv[i], base ? base + 1 : argv[i], &t);
	}
	printf("replayed %u files, %u failures\n", t.files, t.failures);
	return t.files > 0 && t.failures == 0 ? 0 : 1;
}
