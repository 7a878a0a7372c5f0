/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Connecting two sessions of this host by a pipe, on the loop thread: finding the listener,
 * the access checks (its mode, the expected owner, pipes-max on both sides), creating the pipe,
 * and the answers (Reply to the connector, Accepted to the listener's session, or Reply and
 * PipeClosed for a refusal). Connects to a tpip:// address, or waiting for a listener that is
 * not registered yet, go to xconnect.c. The pipe's messages are pipe.c's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

void tpd_pipe_connect_fail(struct tpd_session *s, const Tpw__V1__Connect *c, int err,
			   const char *why)
{
	Tpw__V1__PipeClosed pc = TPW__V1__PIPE_CLOSED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	tpd_session_log(s, TPU_LOG_INFO, "connect to '%s' failed: %s", c->address, why);
	tpd_session_reply(s, c->req_id, err, why, c->pipe_id, NULL);
	pc.pipe_id = c->pipe_id;
	pc.status = tpw_status_from_errno(err);
	pc.message = (char *)why;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_PIPE_CLOSED;
	dm.pipe_closed = &pc;
	tpd_session_send(s, &dm, NULL, 0);
}

void tpd_pipe_connect_accepted(struct tpd_session *ls, struct tpd_listener *l,
			       struct tpd_pipe_end *e, struct tpd_session *cs)
{
	Tpw__V1__Accepted a = TPW__V1__ACCEPTED__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	a.listener_id = l->id;
	a.pipe_id = e->local_id;
	a.remote_name = (char *)tpd_session_name(cs);
	a.remote_pid = (uint32_t)tpd_session_pid(cs);
	a.remote_uid = (uint32_t)tpd_session_uid(cs);
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_ACCEPTED;
	dm.accepted = &a;
	tpd_session_send(ls, &dm, NULL, 0);
}

void tpd_pipe_connect_reply(struct tpd_session *s, uint64_t req_id, uint64_t pipe_id,
			    const char *name, uint32_t owner_uid, bool owner_remote)
{
	Tpw__V1__Reply rep = TPW__V1__REPLY__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;

	rep.req_id = req_id;
	rep.status = TPW__V1__STATUS__STATUS_OK;
	rep.id = pipe_id;
	rep.remote_name = (char *)name;
	rep.owner_known = true;
	rep.owner_uid = owner_uid;
	rep.owner_remote = owner_remote;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_REPLY;
	dm.reply = &rep;
	tpd_session_send(s, &dm, NULL, 0);
}

/* Checks that a connect can go ahead; on refusal returns -errno and fills @why. */
int tpd_pipe_connect_check(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c,
			   struct tpd_listener **ret, char *why, size_t wl)
{
	uint32_t pipes_max = tpd_daemon_cfg(d)->pipes_max;
	struct tpd_listener *l;
	struct tpd_session *ls;

	if (!tpw_name_valid(c->address)) {
		snprintf(why, wl, "invalid address '%.64s'", c->address);
		return -EINVAL;
	}
	if (tpd_session_pipe_find(s, c->pipe_id)) {
		snprintf(why, wl, "pipe id %llu already in use", (unsigned long long)c->pipe_id);
		return -EADDRINUSE;
	}
	l = tpd_listener_registry_find(tpd_daemon_registry(d), c->address);
	if (!l) {
		snprintf(why, wl, "no listener named '%s'", c->address);
		return -ENOENT;
	}
	ls = l->owner;
	/* A local user may tell a listener it may not use from a missing one (tp_listen() of the
	 * name would tell it anyway); the owner's uid is only for those it admits. */
	if (!tpd_session_permitted(s, l)) {
		snprintf(why, wl, "listener '%s' refuses uid %u", l->name,
			 (unsigned)tpd_session_uid(s));
		return -EACCES;
	}
	if (c->expect_uid_set && (uint32_t)l->uid != c->expect_uid) {
		snprintf(why, wl, "listener '%s' is owned by uid %u, not the expected uid %u",
			 l->name, (unsigned)l->uid, (unsigned)c->expect_uid);
		return -EACCES;
	}
	if (tpd_session_pipe_count(s) >= pipes_max || tpd_session_pipe_count(ls) >= pipes_max) {
		snprintf(why, wl, "pipe limit of %u per client reached (tpipd --pipes-max)",
			 pipes_max);
		return -ENOBUFS;
	}
	*ret = l;
	return 0;
}

void tpd_pipe_connect(struct tpd_daemon *d, struct tpd_session *s, const Tpw__V1__Connect *c)
{
	struct tpd_listener *l = NULL;
	struct tpd_session *ls;
	struct tpd_pipe *p;
	char why[TPW_NAME_MAX + 128];
	int r;

	if (strncmp(c->address, "tpip://", 7) == 0) {
		tpd_xconnect_remote(d, s, c);
		return;
	}
	if (c->expect_remote != TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED) {
		tpd_pipe_connect_fail(s, c, -EINVAL, "an expected peer identity needs a tpip:// "
				      "address");
		return;
	}
	r = tpd_pipe_connect_check(d, s, c, &l, why, sizeof(why));
	if (r == -ENOENT && c->wait_ms) {
		tpd_xconnect_wait_local(d, s, c);
		return;
	}
	if (r < 0) {
		tpd_pipe_connect_fail(s, c, r, why);
		return;
	}
	ls = l->owner;
	p = tpd_pipe_new(d, l->name);
	if (!p) {
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	tpd_pipe_end_init(&p->end[0], p, s, c->pipe_id);
	tpd_pipe_end_init(&p->end[1], p, ls, TPD_PIPE_ACCEPT_ID_BASE + ls->next_accept_id++);
	if (tpd_session_pipe_add(s, p->end[0].local_id, &p->end[0]) < 0 ||
	    tpd_session_pipe_add(ls, p->end[1].local_id, &p->end[1]) < 0) {
		tpd_session_pipe_remove(s, p->end[0].local_id);
		free(p->listener);
		free(p);
		tpd_pipe_connect_fail(s, c, -ENOMEM, "out of memory");
		return;
	}
	tpd_broker_pipe_add(tpd_daemon_broker(d), p);
	l->accepted++;
	tpd_pipe_log(p, s, TPU_LOG_INFO, "connected to '%s' (session %llu)", l->name,
		     (unsigned long long)tpd_session_id(ls));
	tpd_pipe_connect_reply(s, c->req_id, c->pipe_id, l->name, (uint32_t)l->uid, false);
	tpd_pipe_connect_accepted(ls, l, &p->end[1], s);
}
