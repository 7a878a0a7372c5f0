/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon fuzz targets' shared harness; see fuzz_daemon.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>
#include "fuzz_daemon.h"
#include "log.h"
#include "pipe.h"

#define MEMFD_SIZE (64u << 10)
#define STALLS_MAX 64

static struct tpd_daemon *daemon_;
static char dir_[64];
static bool logging_;

static void log_drop(enum tpu_log_level level, const char *const *fields, const char *msg)
{
	(void)level;
	(void)fields;
	(void)msg;
}

static void daemon_free_at_exit(void)
{
	if (daemon_)
		tpd_daemon_free(daemon_);
	daemon_ = NULL;
	rmdir(dir_);
}

struct tpd_daemon *fuzz_daemon_start(const char *log_env, void (*adjust)(struct tpd_config *))
{
	struct tpd_config cfg;
	int r;

	logging_ = getenv(log_env) != NULL;
	if (logging_)
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
	if (adjust)
		adjust(&cfg);
	r = tpd_daemon_new(&cfg, &daemon_);
	if (r < 0) {
		fprintf(stderr, "fuzz: cannot start the daemon: %s\n", strerror(-r));
		abort();
	}
	atexit(daemon_free_at_exit);
	return daemon_;
}

bool fuzz_daemon_logging(void)
{
	return logging_;
}

int fuzz_daemon_memfd(void)
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

void fuzz_daemon_send(int fd, const uint8_t *buf, size_t len, bool with_fd,
		      void (*stall)(void *arg), void *arg)
{
	int mfd = with_fd ? fuzz_daemon_memfd() : -1;
	bool fd_sent = mfd < 0;
	unsigned stalls = 0;

	while ((len || !fd_sent) && stalls < STALLS_MAX) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cm;
		uint8_t zero = 0;
		struct iovec iov = { len ? (void *)buf : &zero, len ? len : 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (!fd_sent) {
			memset(&cm, 0, sizeof(cm)); /* the padding too (valgrind) */
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
				break; /* the daemon closed this connection */
			stalls++;
			stall(arg);
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

ssize_t fuzz_daemon_recv(int fd, void *buf, size_t cap)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 16)];
	} cm;
	struct iovec iov = { buf, cap };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
			     .msg_controllen = sizeof(cm.b) };
	ssize_t n = recvmsg(fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	for (struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		for (size_t i = 0; i < (c->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++) {
			int f;

			memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			close(f);
		}
	}
	return n;
}

void fuzz_daemon_report(const char *who)
{
	if (logging_)
		fprintf(stderr, "%s: daemon moved %llu messages, %llu bytes so far\n", who,
			(unsigned long long)tpd_broker_messages_moved(tpd_daemon_broker(daemon_)),
			(unsigned long long)tpd_broker_bytes_moved(tpd_daemon_broker(daemon_)));
}
