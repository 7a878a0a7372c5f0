/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Corpus replay for the frame fuzz target: feeds every file of the given directories (or
 * files) to fuzz_frame_check(), so the committed corpus runs in every build, sanitized or not,
 * with any compiler. Seed files carry their expected verdict in their name:
 *   client-ok-*  must validate as a client frame    client-bad-*  must not
 *   daemon-ok-*  must validate as a daemon frame    daemon-bad-*  must not
 *   peer-ok-*    must validate as a peer frame      peer-bad-*    must not
 * Other names (files the fuzzer added) only have to run without crashing.
 * Exit status: 0 if every expectation held and at least one file was read, 1 otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_frame.h"

struct tally {
	unsigned files;
	unsigned failures;
};

static int read_file(const char *path, uint8_t **ret, size_t *ret_len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t len = 0, cap = 0, n;

	if (!f)
		return -errno;
	do {
		if (len == cap) {
			uint8_t *nb = realloc(buf, cap ? cap * 2 : 4096);
			if (!nb) {
				free(buf);
				fclose(f);
				return -ENOMEM;
			}
			buf = nb;
			cap = cap ? cap * 2 : 4096;
		}
		n = fread(buf + len, 1, cap - len, f);
		len += n;
	} while (n > 0);
	fclose(f);
	*ret = buf;
	*ret_len = len;
	return 0;
}

static bool starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void replay_one(const char *path, const char *name, struct tally *t)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	unsigned res;
	int r = read_file(path, &buf, &len);

	if (r < 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(-r));
		t->failures++;
		return;
	}
	res = fuzz_frame_check(buf, len);
	free(buf);
	t->files++;
	if ((starts_with(name, "client-ok-") && !(res & FUZZ_CLIENT_OK)) ||
	    (starts_with(name, "client-bad-") && (res & FUZZ_CLIENT_OK)) ||
	    (starts_with(name, "daemon-ok-") && !(res & FUZZ_DAEMON_OK)) ||
	    (starts_with(name, "daemon-bad-") && (res & FUZZ_DAEMON_OK)) ||
	    (starts_with(name, "peer-ok-") && !(res & FUZZ_PEER_OK)) ||
	    (starts_with(name, "peer-bad-") && (res & FUZZ_PEER_OK))) {
		fprintf(stderr, "%s: unexpected verdict (client %s, daemon %s, peer %s)\n", path,
			res & FUZZ_CLIENT_OK ? "valid" : "invalid",
			res & FUZZ_DAEMON_OK ? "valid" : "invalid",
			res & FUZZ_PEER_OK ? "valid" : "invalid");
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
