/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_daemon: the assembler of tpipd: it builds every part (the local part's sessions, the
 * broker's pipes, the peer part, ctl and metrics), runs the event loop, the control socket and
 * its accept loop (with EMFILE back-off), signal handling, reload and graceful stop. The state
 * the parts read, and its accessors, is core.h's. Sessions and pipes do the protocol work.
 */
#ifndef TPD_DAEMON_H
#define TPD_DAEMON_H

#include "core.h"

/*
 * tpd_daemon_new() - bind the control socket, probe backends, start copy threads.
 * @cfg: borrowed; copied.
 * @ret: returns owned daemon, free with tpd_daemon_free().
 * Return: 0 or -errno (logged).
 */
int tpd_daemon_new(const struct tpd_config *cfg, struct tpd_daemon **ret);

/* Runs the loop until a stop signal has been handled. Return: 0 or -errno. */
int tpd_daemon_run(struct tpd_daemon *d);

/* Closes every session, frees everything, unlinks the socket. Accepts NULL. */
void tpd_daemon_free(struct tpd_daemon *d);

/*
 * tpd_daemon_reload() - re-read the configuration file and flags; apply what can change live,
 * log what needs a restart. A bad file leaves the running configuration in force.
 * Return: 0 or the error of the reload (logged).
 */
int tpd_daemon_reload(struct tpd_daemon *d);

#endif
