/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer link's side of cross-host groups (issue 24): the group part registers a small ops
 * table here (struct tpd_peer_group_ops), and a link hands it its group messages, tells it
 * when it is up and when it is torn down, and answers what groups need to know of a link (the
 * far daemon's instance, whether it authenticated). Groups never reach into a link otherwise.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "core.h"
#include "peer.h"
#include "peer_int.h"

static const struct tpd_peer_group_ops *group_ops;

void tpd_peer_group_set_ops(const struct tpd_peer_group_ops *ops)
{
	group_ops = ops;
}

uint64_t tpd_peer_group_far_instance(const struct tpd_peer *pr)
{
	return pr->far_instance;
}

uint64_t tpd_peer_group_instance(const struct tpd_daemon *d)
{
	const struct tpd_peers *ps = tpd_daemon_peers(d);

	return ps ? ps->instance : 0;
}

const char *tpd_peer_group_host(const struct tpd_peer *pr)
{
	return pr->host[0] ? pr->host : pr->key;
}

bool tpd_peer_group_authenticated(const struct tpd_peer *pr)
{
	return pr->authenticated;
}

bool tpd_peer_group_remote_ok(const struct tpd_peer *pr)
{
	return pr->peer_minor >= TPW_PEER_MINOR_GROUP_REMOTE;
}

char *tpd_peer_group_far_addr(const struct tpd_peer *pr, char *buf, size_t len)
{
	const char *colon = strrchr(pr->key, ':');

	if (pr->outgoing)
		snprintf(buf, len, "%s", pr->key);
	else if (colon && pr->claimed_port)
		snprintf(buf, len, "%.*s:%u", (int)(colon - pr->key), pr->key,
			 (unsigned)pr->claimed_port);
	else if (len)
		*buf = '\0';
	return buf;
}

int tpd_peer_group_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m)
{
	if (!group_ops)
		return -EPROTO;
	group_ops->msg(pr->peers->d, pr, m);
	return 0;
}

void tpd_peer_group_link_up(struct tpd_peer *pr)
{
	if (group_ops)
		group_ops->link_up(pr->peers->d, pr);
}

void tpd_peer_group_link_failed(struct tpd_peer *pr)
{
	if (group_ops)
		group_ops->link_failed(pr->peers->d, pr, pr->fail_err ? pr->fail_err : -ECONNRESET,
				       pr->last_error);
}
