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
 * replays through fuzz_session_run() in every build (replay_session.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "daemon.h"
#include "fuzz_session.h"
#include "log.h"
#include "session.h"

#define CLIENTS 3
#define MEMFD_SIZE (64u << 10)
#define PASSES_PER_RECORD 8
#define DRAIN_DEADLINE_NS (5ull * 1000 * 1000 * 1000)

static struct tpd_daemon *daemon_;
static char dir_[64];

static void log_drop(enum tpu_log_level level, const char *const *fields, const char *msg)
{
	(void)level;
	(void)fields;
	(void)msg;
}

static void make_daemon(void)
{
	struct tpd_config cfg;
	int r;

	/* FUZZ_SESSION_LOG=1 shows the daemon's log (debug) on stderr. */
	if (getenv("FUZZ_SESSION_LOG"))
		tpu_log_set_level(TPU_LOG_DEBUG);
	else
		tpu_log_set_sink(log_drop);
	snprintf(dir_, sizeof(dir_), "/tmp/tpipd-fuzz-XXXXXX");
	if (!mkdtemp(dir_))
		abort();
	tpd_config_defaults(&cfg);
	snprintf(cfg.socket_path, sizeof(cfg.socket_path), "%s/s", dir_);
	snprintf(cfg.peer_listen, sizeof(cfg.peer_listen), "off");
	cfg.metrics_listen[0] = '\0';
	cfg.copy_threads = 1;
	cfg.spin_us = 0;
	r = tpd_daemon_new(&cfg, &daemon_);
	if (r < 0) {
		fprintf(stderr, "fuzz_session: cannot start the daemon: %s\n", strerror(-r));
		abort();
	}
}

static void cleanup_dir(void)
{
	if (daemon_)
		tpd_daemon_free(daemon_);
	daemon_ = NULL;
	rmdir(dir_);
}

static int make_memfd(void)
{
	int fd = memfd_create("fuzz-buffer", MFD_CLOEXEC | MFD_ALLOW_SEALING);

	if (fd < 0)
		return -1;
	if (ftruncate(fd, MEMFD_SIZE) < 0 ||
	    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Reads and drops whatever the daemon sent to client @fd, closing any fds that came with it. */
static void drain_client(int fd)
{
	char buf[65536];
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 16)];
	} cm;

	for (;;) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				     .msg_controllen = sizeof(cm.b) };
		ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		struct cmsghdr *c;

		if (n <= 0)
			return;
		for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
				int f;
				memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
				close(f);
			}
		}
	}
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

/* Sends @len bytes on client @fd (with a memfd if @with_fd), running the loop while it is full. */
static void send_record(int *clients, int fd, const uint8_t *buf, size_t len, bool with_fd)
{
	int mfd = with_fd ? make_memfd() : -1;
	bool fd_sent = mfd < 0;
	unsigned stalls = 0;

	while ((len || !fd_sent) && stalls < 64) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cm;
		uint8_t zero = 0;
		struct iovec iov = { len ? (void *)buf : &zero, len ? len : 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (!fd_sent) {
			mh.msg_control = cm.b;
			mh.msg_controllen = sizeof(cm.b);
			CMSG_FIRSTHDR(&mh)->cmsg_level = SOL_SOCKET;
			CMSG_FIRSTHDR(&mh)->cmsg_type = SCM_RIGHTS;
			CMSG_FIRSTHDR(&mh)->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(CMSG_FIRSTHDR(&mh)), &mfd, sizeof(int));
		}
		n = sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (n < 0) {
			if (errno != EAGAIN)
				break; /* the daemon closed this session */
			stalls++;
			loop_passes(clients, 1);
			continue;
		}
		fd_sent = true;
		if (len) {
			buf += n;
			len -= (size_t)n;
		}
	}
	if (mfd >= 0)
		close(mfd);
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

/* After the clients hung up: every session, pipe and listener must go within the deadline. */
static void check_all_gone(void)
{
	int none[CLIENTS] = { -1, -1, -1 };
	uint64_t deadline = tpu_now_ns() + DRAIN_DEADLINE_NS;

	while (daemon_->n_sessions || daemon_->n_pipes || daemon_->registry.count) {
		if (tpu_now_ns() > deadline) {
			fprintf(stderr,
				"fuzz_session: %u sessions, %u pipes, %u listeners left after every "
				"client hung up\n",
				daemon_->n_sessions, daemon_->n_pipes, daemon_->registry.count);
			abort();
		}
		loop_passes(none, 1);
		sched_yield();
	}
	if (getenv("FUZZ_SESSION_LOG"))
		fprintf(stderr, "fuzz_session: daemon moved %llu messages, %llu bytes so far\n",
			(unsigned long long)daemon_->messages_moved,
			(unsigned long long)daemon_->bytes_moved);
}

void fuzz_session_run(const uint8_t *data, size_t len)
{
	int clients[CLIENTS] = { -1, -1, -1 };
	size_t off = 0;

	if (!daemon_) {
		make_daemon();
		atexit(cleanup_dir);
	}
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
			send_record(clients, clients[c], data + off, n, op & 0x04);
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
