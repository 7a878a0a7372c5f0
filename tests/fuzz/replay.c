/* SPDX-License-Identifier: BSD-3-Clause */
/* The corpus replay driver of replay_frame and replay_slurm (replay.h). */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "replay.h"

struct tally {
	unsigned files;
	unsigned failures;
};

bool replay_starts_with(const char *s, const char *prefix)
{
	return strncmp(s, prefix, strlen(prefix)) == 0;
}

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

static void replay_one(const char *path, const char *name, replay_check_fn check,
		       struct tally *t)
{
	uint8_t *buf = NULL;
	size_t len = 0;
	int r = read_file(path, &buf, &len);

	if (r < 0) {
		fprintf(stderr, "%s: %s\n", path, strerror(-r));
		t->failures++;
		return;
	}
	t->files++;
	if (!check(path, name, buf, len))
		t->failures++;
	free(buf);
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

static void replay_dir(const char *dir, replay_check_fn check, struct tally *t)
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
			replay_one(path, ents[i]->d_name, check, t);
		}
		free(ents[i]);
	}
	free(ents);
}

int replay_main(int argc, char **argv, replay_check_fn check)
{
	struct tally t = { 0, 0 };
	struct stat st;

	for (int i = 1; i < argc; i++) {
		const char *base = strrchr(argv[i], '/');

		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode))
			replay_dir(argv[i], check, &t);
		else
			replay_one(argv[i], base ? base + 1 : argv[i], check, &t);
	}
	printf("replayed %u files, %u failures\n", t.files, t.failures);
	return t.files > 0 && t.failures == 0 ? 0 : 1;
}
