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
#include <stdio.h>
#include "fuzz_frame.h"
#include "replay.h"

static bool check(const char *path, const char *name, const uint8_t *buf, size_t len)
{
	unsigned res = fuzz_frame_check(buf, len);

	if ((replay_starts_with(name, "client-ok-") && !(res & FUZZ_CLIENT_OK)) ||
	    (replay_starts_with(name, "client-bad-") && (res & FUZZ_CLIENT_OK)) ||
	    (replay_starts_with(name, "daemon-ok-") && !(res & FUZZ_DAEMON_OK)) ||
	    (replay_starts_with(name, "daemon-bad-") && (res & FUZZ_DAEMON_OK)) ||
	    (replay_starts_with(name, "peer-ok-") && !(res & FUZZ_PEER_OK)) ||
	    (replay_starts_with(name, "peer-bad-") && (res & FUZZ_PEER_OK))) {
		fprintf(stderr, "%s: unexpected verdict (client %s, daemon %s, peer %s)\n", path,
			res & FUZZ_CLIENT_OK ? "valid" : "invalid",
			res & FUZZ_DAEMON_OK ? "valid" : "invalid",
			res & FUZZ_PEER_OK ? "valid" : "invalid");
		return false;
	}
	return true;
}

int main(int argc, char **argv)
{
	return replay_main(argc, argv, check);
}
