/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Control requests (tpipctl): snapshots of the daemon's status, sessions, pipes and listeners,
 * answered as CtlReply. Read-only; admin actions arrive with the service integration.
 */
#ifndef TPD_CTL_H
#define TPD_CTL_H

#include "tpw.pb-c.h"

struct tpd_session;

/* Answers @req on @s with a CtlReply. Borrows both. */
void tpd_ctl_handle(struct tpd_session *s, const Tpw__V1__CtlRequest *req);

/* Registers tpd_ctl_handle() with the session part (tpd_sessmsg_set_ctl()), which calls it for
 * every CtlRequest. Call at daemon start, before the first session attaches. */
void tpd_ctl_start(void);

#endif
