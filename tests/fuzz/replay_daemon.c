/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Corpus replay for the daemon fuzz targets: `replay_daemon session|peer PATH...` runs every
 * file of the given directories (or files) through fuzz_session_run() or fuzz_peer_run(),
 * against one in-process daemon, so the committed corpora (tests/fuzz/corpus-session,
 * corpus-peer) run in every build, sanitized or not, with any compiler. A failed invariant
 * aborts; a crash is a crash. Exit status: 0 if at least one file ran, 1 otherwise, 2 for a bad
 * command line.
 */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "fuzz_peer.h"
#include "fuzz_session.h"

static unsigned files;
static void (*run)(const uint8_t *data, size_t len);

static void replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	static uint8_t buf[1 << 20];
	size_t n;

	if (!f) {
		fprintf(stderr, "replay_daemon: %s: %s\n", path, strerror(errno));
		exit(1);
	}
	n = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	printf("replay_daemon: %s (%zu bytes)\n", path, n);
	fflush(stdout);
	run(buf, n);
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
		fprintf(stderr, "replay_daemon: %s: %s\n", path, strerror(errno));
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
	if (argc < 2 || (strcmp(argv[1], "session") != 0 && strcmp(argv[1], "peer") != 0)) {
		fprintf(stderr, "usage: replay_daemon session|peer PATH...\n");
		return 2;
	}
	run = strcmp(argv[1], "session") == 0 ? fuzz_session_run : fuzz_peer_run;
	for (int i = 2; i < argc; i++)
		replay(argv[i]);
	printf("replay_daemon: %u %s inputs, every invariant held\n", files, argv[1]);
	return files ? 0 : 1;
}
