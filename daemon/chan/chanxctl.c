/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl channels and queues on the forwarding host (chanx.h; issue 25 part xhost): a row per
 * handle this daemon's clients hold on a channel or queue of another host. Not responsible for
 * the daemon's own channels and queues (chan.c, wq.c). Runs on the loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chanx_int.h"
#include "session.h"

/* The handles of kind @k to list, and room for them in *@v (@n used). Return: how many, or
 * -ENOMEM. */
static int ctl_grow(struct tpd_chanx *x, enum xkind k, bool own_only, uid_t viewer, void ***v,
		    size_t n)
{
	const struct xh *xh;
	size_t more = 0;
	void **nv;

	tpu_list_for_each(xh, &x->xhs, node)
		more += xh->kind == k && xh->far_id &&
			(!own_only || tpd_session_uid(xh->s) == viewer);
	if (!more)
		return 0;
	nv = realloc(*v, (n + more) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	*v = nv;
	return (int)TPU_MIN(more, (size_t)INT32_MAX);
}

/* The next handle of kind @k to list after @xh (NULL: the first), or NULL. */
static const struct xh *ctl_next(struct tpd_chanx *x, enum xkind k, bool own_only, uid_t viewer,
				 const struct xh *xh)
{
	const struct tpu_list *at = xh ? &xh->node : &x->xhs;

	for (at = at->next; at != &x->xhs; at = at->next) {
		xh = tpu_container_of(at, struct xh, node);
		if (xh->kind == k && xh->far_id && (!own_only || tpd_session_uid(xh->s) == viewer))
			return xh;
	}
	return NULL;
}

static char *ctl_name(const struct xh *xh)
{
	char *name = NULL;

	return asprintf(&name, "tpip://%s/%s", xh->host, xh->name) < 0 ? NULL : name;
}

int tpd_chanx_ctl_channels(struct tpd_chanx *x, bool own_only, uid_t viewer,
			   Tpw__V1__CtlChannel ***v, size_t *n)
{
	int more = ctl_grow(x, X_CHAN, own_only, viewer, (void ***)v, *n);
	const struct xh *xh = NULL;

	for (int i = 0; i < more && (xh = ctl_next(x, X_CHAN, own_only, viewer, xh)); i++) {
		Tpw__V1__CtlChannel *c = calloc(1, sizeof(*c));

		if (!c)
			return -ENOMEM;
		tpw__v1__ctl_channel__init(c);
		if (!(c->name = ctl_name(xh))) {
			free(c);
			return -ENOMEM;
		}
		c->uid = (uint32_t)tpd_session_uid(xh->s);
		c->state = (char *)(xh->pr ? "remote" : "remote, link failed");
		c->handles = 1;
		c->remote_handle = true;
		(*v)[(*n)++] = c;
	}
	return more < 0 ? more : 0;
}

int tpd_chanx_ctl_queues(struct tpd_chanx *x, bool own_only, uid_t viewer, Tpw__V1__CtlQueue ***v,
			 size_t *n)
{
	int more = ctl_grow(x, X_WQ, own_only, viewer, (void ***)v, *n);
	const struct xh *xh = NULL;

	for (int i = 0; i < more && (xh = ctl_next(x, X_WQ, own_only, viewer, xh)); i++) {
		Tpw__V1__CtlQueue *q = calloc(1, sizeof(*q));

		if (!q)
			return -ENOMEM;
		tpw__v1__ctl_queue__init(q);
		if (!(q->name = ctl_name(xh))) {
			free(q);
			return -ENOMEM;
		}
		q->uid = (uint32_t)tpd_session_uid(xh->s);
		q->state = (char *)(xh->pr ? "remote" : "remote, link failed");
		q->remote_handle = true;
		(*v)[(*n)++] = q;
	}
	return more < 0 ? more : 0;
}
