/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Fuzz target for the daemon's session layer: frames go through the real session code (framing,
 * fd queue, bounded unpack, validation, state checks, the handlers, the listener registry, pipes
 * and copies) of an in-process daemon, in sequences over up to three client connections at once,
 * so that listen, connect, write, read and close can meet in any order. It is responsible for
 * driving the daemon and for the invariants checked after each input (no crash, every session,
 * pipe and listener gone once the clients hang up, no fd left behind); not for the wire format
 * alone (fuzz_frame.c covers that).
 *
 * An input is a sequence of records: op (1 byte), len (2 bytes, little endian), then len bytes.
 *   op & 0x03  which client (0..2); 3 is taken as 2
 *   op & 0x04  a sealed 64 KiB memfd rides with the bytes (SCM_RIGHTS), as a shared buffer would
 *   op & 0x08  that client hangs up after sending
 *   op & 0x10  no event loop pass after this record (batch it with the next one)
 * Built as a libFuzzer target by clang (fuzz_session_main via LLVMFuzzerTestOneInput); the corpus
 * replays through fuzz_session_run() in every build (replay_daemon.c).
 */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>
#include "fuzz_daemon.h"
#include "fuzz_session.h"
#include "pipe.h"
#include "session.h"

#define CLIENTS 3
#define PASSES_PER_RECORD 8
#define DRAIN_DEADLINE_NS (5ull * 1000 * 1000 * 1000)

static struct tpd_daemon *daemon_;

/* Reads and drops whatever the daemon sent to client @fd, closing any fds that came with it. */
static void drain_client(int fd)
{
	char buf[65536];

	while (fuzz_daemon_recv(fd, buf, sizeof(buf)) > 0)
		;
}

static void loop_passes(const int *clients, unsigned passes)
{
	for (unsigned p = 0; p < passes; p++) {
		event_base_loop(daemon_->base, EVLOOP_NONBLOCK);
		for (int i = 0; i < CLIENTS; i++)
			if (clients[i] >= 0)
				drain_client(clients[i]);
	}
}

static void stall(void *clients)
{
	loop_passes(clients, 1);
}

static int attach_client(void)
{
	struct tpd_session *s;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	if (tpd_session_new(daemon_, sv[0], &s) < 0) {
		close(sv[1]);
		return -1;
	}
	return sv[1];
}

/* Sessions still attached (the local part's count). */
static unsigned sessions_left(void)
{
	return tpd_local_session_count(tpd_daemon_local(daemon_));
}

/* After the clients hung up: every session, pipe and listener must go within the deadline. */
static void check_all_gone(void)
{
	int none[CLIENTS] = { -1, -1, -1 };
	uint64_t deadline = tpu_now_ns() + DRAIN_DEADLINE_NS;

	while (sessions_left() || tpd_broker_pipe_count(tpd_daemon_broker(daemon_)) ||
	       daemon_->registry.count) {
		if (tpu_now_ns() > deadline) {
			fprintf(stderr,
				"fuzz_session: %u sessions, %u pipes, %u listeners left after every "
				"client hung up\n",
				sessions_left(), tpd_broker_pipe_count(tpd_daemon_broker(daemon_)),
				daemon_->registry.count);
			abort();
		}
		loop_passes(none, 1);
		sched_yield();
	}
	fuzz_daemon_report("fuzz_session");
}

void fuzz_session_run(const uint8_t *data, size_t len)
{
	int clients[CLIENTS] = { -1, -1, -1 };
	size_t off = 0;

	if (!daemon_)
		daemon_ = fuzz_daemon_start("FUZZ_SESSION_LOG", NULL);
	while (len - off >= 3) {
		uint8_t op = data[off];
		size_t n = (size_t)data[off + 1] | (size_t)data[off + 2] << 8;
		int c = (op & 3) == 3 ? 2 : op & 3;

		off += 3;
		if (n > len - off)
			n = len - off;
		if (clients[c] < 0)
			clients[c] = attach_client();
		if (clients[c] >= 0)
			fuzz_daemon_send(clients[c], data + off, n, op & 0x04, stall, clients);
		off += n;
		if ((op & 0x08) && clients[c] >= 0) {
			close(clients[c]);
			clients[c] = -1;
		}
		if (!(op & 0x10))
			loop_passes(clients, PASSES_PER_RECORD);
	}
	for (int i = 0; i < CLIENTS; i++)
		if (clients[i] >= 0)
			close(clients[i]);
	check_all_gone();
}

#ifdef FUZZ_SESSION_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	fuzz_session_run(data, size);
	return 0;
}
#endif
