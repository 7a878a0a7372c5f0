/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Corpus replay for the peer fuzz target: runs every file of the given directories (or files)
 * through fuzz_peer_run(), against one in-process daemon with an insecure peer listener, so the
 * committed corpus (tests/fuzz/corpus-peer) runs in every build, sanitized or not, with any
 * compiler. A failed invariant aborts; a crash is a crash. Exit status: 0 if at least one file
 * ran, 1 otherwise.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_peer.h"

static unsigned files;

static void replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	static uint8_t buf[1 << 20];
	size_t n;

	if (!f) {
		fprintf(stderr, "replay_peer: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	printf("replay_peer: %s (%zu bytes)\n", path, n);
	fflush(stdout);
	fuzz_peer_run(buf, n);
	files++;
}

static void replay(const char *path)
{
	struct stat st;
	struct dirent **names;
	int n;

	if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
		replay_file(path);
		return;
	}
	n = scandir(path, &names, NULL, alphasort);
	if (n < 0) {
		fprintf(stderr, "replay_peer: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	for (int i = 0; i < n; i++) {
		char child[4096];
		if (names[i]->d_name[0] != '.') {
			snprintf(child, sizeof(child), "%s/%s", path, names[i]->d_name);
			replay_file(child);
		}
		free(names[i]);
	}
	free(names);
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++)
		replay(argv[i]);
	printf("replay_peer: %u inputs, every invariant held\n", files);
	return files ? 0 : 1;
}
