/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What the daemon fuzz targets (fuzz_session.c, fuzz_peer.c) share: the one in-process daemon
 * of a fuzzing process (a temporary socket directory, quiet unless asked, freed at exit), the
 * sealed memfds that stand for shared buffers, and sending and receiving on a connection to
 * that daemon without blocking. What an input means is each target's business.
 */
#ifndef FUZZ_DAEMON_H
#define FUZZ_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "daemon.h"

/*
 * fuzz_daemon_start() - start this process's daemon on a socket in a fresh /tmp directory, with
 * one copy thread, no spinning, no metrics and no peer listener, after @adjust (may be NULL)
 * edited that configuration; both go at exit. Aborts when the daemon cannot start. With
 * @log_env set in the environment, the daemon logs at debug on stderr; else it logs nothing.
 * Return: borrowed daemon, valid until exit.
 */
struct tpd_daemon *fuzz_daemon_start(const char *log_env, void (*adjust)(struct tpd_config *));

/* True when the daemon logs (the variable given to fuzz_daemon_start() was set). */
bool fuzz_daemon_logging(void);

/* A sealed (shrink, grow, seal) 64 KiB memfd, as a shared buffer; -1 if it cannot be made. */
int fuzz_daemon_memfd(void);

/*
 * fuzz_daemon_send() - send @len bytes of @buf on @fd (with a memfd from fuzz_daemon_memfd() if
 * @with_fd; a lone fd rides on one zero byte) without blocking; while the socket is full, call
 * @stall(@arg) (a pass of the loop) and retry, at most 64 times. Stops quietly once the daemon
 * closed the connection. Borrows everything.
 */
void fuzz_daemon_send(int fd, const uint8_t *buf, size_t len, bool with_fd,
		      void (*stall)(void *arg), void *arg);

/*
 * fuzz_daemon_recv() - read what the daemon has sent on @fd, without blocking, into @buf (@cap
 * bytes at most), closing any fds that came with it. Return: bytes read, or <= 0 when nothing
 * more is there (or the connection is closed).
 */
ssize_t fuzz_daemon_recv(int fd, void *buf, size_t cap);

/* When logging: "@who: daemon moved N messages, N bytes so far" on stderr. */
void fuzz_daemon_report(const char *who);

#endif
