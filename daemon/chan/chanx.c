/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channels and work queues of other hosts (chanx.h; issue 25 part xhost). The forwarding side:
 * a client's handle of "tpip://HOST[:PORT]/NAME" (struct xh) and the ops forwarded for it and
 * not answered yet (struct xop), per link; the answers relayed to the client under the ids it
 * knows. The hosting side is chan.c's and wq.c's (tpd_chan_peer_op(), tpd_wq_peer_op()): this
 * file only takes their messages off the link and sends their answers. Everything the far daemon
 * says is checked by validation before it comes here; an answer to an op this side did not
 * forward on that very link is dropped, so a link can only answer its own ops. Not responsible
 * for the link itself (daemon/peer/) nor for the objects' state.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chan.h"
#include "chanstream.h"
#include "chanx.h"
#include "chanx_int.h"
#include "config.h"
#include "core.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"
#include "wq.h"

static const char *noun(enum xkind k)
{
	return k == X_CHAN ? "channel" : "work queue";
}

void tpd_chanx_admit_link(const struct tpd_peer *pr, const char *id,
			  Tpw__V1__RemoteAccess *remote, char ***peers, size_t *n, char **room)
{
	bool in = false;

	for (size_t i = 0; i < *n; i++)
		in |= tpd_peer_identity_matches((*peers)[i], pr);
	if (*remote == TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER || in)
		return;
	for (size_t i = 0; i < *n; i++)
		room[i] = (*peers)[i];
	room[(*n)++] = (char *)id;
	*peers = room;
	*remote = TPW__V1__REMOTE_ACCESS__REMOTE_PEERS;
}

bool tpd_chanx_is_address(const char *name)
{
	return name && strncmp(name, "tpip://", 7) == 0;
}

/* ---- answers to the client ----------------------------------------------------------------- */

/* Sends @r (req_id and the handle id already the client's) with @tail to @s. */
void tpd_chanx_to_client(struct tpd_session *s, Tpw__V1__ChanReply *r, const struct iovec *tail)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

	m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	m.chan_reply = r;
	tpd_session_send(s, &m, tail, tail ? 1 : 0);
}

static void to_client_wq(struct tpd_session *s, Tpw__V1__WqReply *r, const struct iovec *tail)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

	m.body_case = TPW__V1__DAEMON_MSG__BODY_WQ_REPLY;
	m.wq_reply = r;
	tpd_session_send(s, &m, tail, tail ? 1 : 0);
}

static void refuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		   const char *fmt, ...) _printf_(6, 7);

/*
 * Whether the client's library takes @m with @tail as a frame (the checks it runs on every
 * frame, with its own bounds): an answer built from a far daemon's is checked here once more,
 * so that no combination of fields a hostile or newer far daemon sends can make the library
 * refuse the frame and end the client's whole context. Return: true, or false with @why.
 */
static bool client_takes(const Tpw__V1__DaemonMsg *m, const struct iovec *tail, char *why,
			 size_t wl)
{
	const struct tpw_limits lim = { .frame_max = TPW_FRAME_MAX_HARD,
					.inline_max = TPW_FRAME_MAX_HARD,
					.segments_max = UINT32_MAX,
					.message_bytes_max = UINT64_MAX,
					.metadata_max = UINT32_MAX };
	struct tpw_hdr h = { .data_len = tail ? (uint32_t)tail->iov_len : 0 };

	return tpw_daemon_msg_validate(m, &h, &lim, why, wl) == 0;
}

/* Sends a far daemon's answer @a (a ChanReply or WqReply in @m, built from @pr's) to @s, or,
 * when @s's library would refuse it, a refusal of that op alone, logged once. */
static void far_answer(struct tpd_peer *pr, struct tpd_session *s, Tpw__V1__DaemonMsg *m,
		       const struct iovec *tail)
{
	bool chan = m->body_case == TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	char why[200];

	if (!client_takes(m, tail, why, sizeof(why))) {
		tpd_session_log(s, TPU_LOG_WARNING, "%s answer of host %s refused, its op fails: "
				"%s", chan ? "channel" : "work queue", tpd_peer_name(pr), why);
		if (chan)
			return refuse(X_CHAN, s, m->chan_reply->req_id, m->chan_reply->chan_id,
				      -EPROTO, "the channel's host %s sent an answer that is not "
				      "valid here: %s", tpd_peer_name(pr), why);
		return refuse(X_WQ, s, m->wq_reply->req_id, m->wq_reply->wq_id, -EPROTO,
			      "the work queue's host %s sent an answer that is not valid here: %s",
			      tpd_peer_name(pr), why);
	}
	tpd_session_send(s, m, tail, tail ? 1 : 0);
}

void tpd_chanx_to_client_wq(struct tpd_session *s, Tpw__V1__WqReply *r)
{
	to_client_wq(s, r, NULL);
}

/* Answers @s's request @req_id on handle @id (0: none) with @err and the reason @fmt, @ap. */
static void vrefuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		    const char *fmt, va_list ap) _printf_(6, 0);
static void vrefuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		    const char *fmt, va_list ap)
{
	Tpw__V1__ChanReply cr = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__WqReply wr = TPW__V1__WQ_REPLY__INIT;
	char why[TPW_MESSAGE_MAX < 400 ? TPW_MESSAGE_MAX : 400];

	vsnprintf(why, sizeof(why), fmt, ap);
	if (k == X_CHAN) {
		cr.req_id = req_id;
		cr.status = tpw_status_from_errno(err);
		cr.message = why;
		cr.chan_id = id;
		return tpd_chanx_to_client(s, &cr, NULL);
	}
	wr.req_id = req_id;
	wr.status = tpw_status_from_errno(err);
	wr.message = why;
	wr.wq_id = id;
	to_client_wq(s, &wr, NULL);
}

static void refuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		   const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vrefuse(k, s, req_id, id, err, fmt, ap);
	va_end(ap);
}

void tpd_chanx_refuse(enum xkind k, struct tpd_session *s, uint64_t req_id, uint64_t id, int err,
		      const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vrefuse(k, s, req_id, id, err, fmt, ap);
	va_end(ap);
}

/* ---- forwarding ---------------------------------------------------------------------------- */

void tpd_chanx_xop_free(struct xop *xo)
{
	tpu_strv_free(xo->remote_peers, xo->n_remote_peers);
	for (size_t i = 0; i < xo->n_out; i++)
		tpd_chan_copy_put(&xo->out_mem[i]);
	free(xo->out_mem);
	free(xo->out_len);
	/* A receive of a read that ends here is cancelled: nothing can take its bytes any more,
	 * and it holds the client's buffer until it ends (a far daemon may never send them). A
	 * send ends on its own. Either frees @xo->xs once its end is delivered. */
	if (xo->xs && !xo->xs->send)
		tpd_chan_stream_cancel(xo->xs->cs);
	if (xo->xs)
		xo->xs->xo = NULL;
	tpu_list_remove(&xo->node);
	free(xo);
}

static void xh_free(struct xh *xh)
{
	tpu_list_remove(&xh->node);
	free(xh);
}

/* Ops forwarded over @pr and not answered yet. */
static uint32_t link_ops(const struct tpd_chanx *x, const struct tpd_peer *pr)
{
	const struct xop *xo;
	uint32_t n = 0;

	tpu_list_for_each(xo, &x->xops, node)
		n += xo->pr == pr;
	return n;
}

/* The ops of @pr that uid @uid of this host may have unanswered: chan-peer-ops-per-uid (0: a
 * quarter of chan-peer-ops-max, at least 1), never above chan-peer-ops-max; root has no share. */
static uint32_t uid_share(const struct tpd_config *cfg, uid_t uid)
{
	uint32_t share = cfg->chan_peer_ops_per_uid;

	if (uid == 0)
		return cfg->chan_peer_ops_max;
	if (!share)
		share = cfg->chan_peer_ops_max / 4 ? cfg->chan_peer_ops_max / 4 : 1;
	return share < cfg->chan_peer_ops_max ? share : cfg->chan_peer_ops_max;
}

/* Whether uid @uid holds its share of the ops forwarded over @pr and not answered (counted from
 * the xops themselves, so every way an op ends gives its place back). */
static bool uid_ops_full(const struct tpd_chanx *x, const struct tpd_peer *pr, uid_t uid)
{
	uint32_t share = uid_share(tpd_daemon_cfg(x->d), uid), n = 0;
	const struct xop *xo;

	tpu_list_for_each(xo, &x->xops, node)
		n += xo->pr == pr && xo->by_uid == uid;
	return n >= share;
}

/* The PeerMsg @m (its wrappers @pc and @pw) that carries @chan or @wq as op @op_id from @uid's
 * @pid. */
struct xop_msg {
	Tpw__V1__PeerChanOp pc;
	Tpw__V1__PeerWqOp pw;
	Tpw__V1__PeerMsg m;
};

static void xop_msg_build(struct xop_msg *xm, Tpw__V1__ChanOp *chan, Tpw__V1__WqOp *wq,
			  uint64_t op_id, uint32_t uid, uint32_t pid)
{
	*xm = (struct xop_msg){ TPW__V1__PEER_CHAN_OP__INIT, TPW__V1__PEER_WQ_OP__INIT,
				TPW__V1__PEER_MSG__INIT };
	if (chan) {
		chan->req_id = op_id;
		xm->pc.op = chan;
		xm->pc.uid = uid;
		xm->pc.pid = pid;
		xm->m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_OP;
		xm->m.chan_op = &xm->pc;
	} else {
		wq->req_id = op_id;
		xm->pw.op = wq;
		xm->pw.uid = uid;
		xm->pw.pid = pid;
		xm->m.body_case = TPW__V1__PEER_MSG__BODY_WQ_OP;
		xm->m.wq_op = &xm->pw;
	}
}

/* The size of that PeerMsg without the header (@chan's or @wq's req_id left as it was). */
static size_t xop_msg_len(Tpw__V1__ChanOp *chan, Tpw__V1__WqOp *wq, uint64_t op_id, uint32_t uid,
			  uint32_t pid)
{
	uint64_t saved = chan ? chan->req_id : wq->req_id;
	struct xop_msg xm;
	size_t n;

	xop_msg_build(&xm, chan, wq, op_id, uid, pid);
	n = tpw_frame_size(&xm.m.base);
	if (chan)
		chan->req_id = saved;
	else
		wq->req_id = saved;
	return n - TPW_HDR_SIZE;
}

/* Sends @xo's op @chan or @wq (its req_id and handle id set here) with @tail over its link. */
static void xop_send(struct tpd_chanx *x, struct xop *xo, Tpw__V1__ChanOp *chan,
		     Tpw__V1__WqOp *wq, const struct iovec *tail)
{
	uint32_t uid = xo->s ? (uint32_t)tpd_session_uid(xo->s) : xo->uid;
	uint32_t pid = xo->s ? (uint32_t)tpd_session_pid(xo->s) : xo->pid;
	struct xop_msg xm;

	(void)x;
	xo->sent = true;
	xop_msg_build(&xm, chan, wq, xo->op_id, uid, pid);
	tpd_peer_send(xo->pr, &xm.m, tail, tail ? 1 : 0);
}

/* Sends the OPEN @xo holds. */
static void xop_send_open(struct tpd_chanx *x, struct xop *xo)
{
	Tpw__V1__ChanOp c = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__WqOp q = TPW__V1__WQ_OP__INIT;

	if (xo->kind == X_CHAN) {
		c.op = xo->op;
		c.name = xo->name;
		c.create = xo->create;
		c.exclusive = xo->exclusive;
		c.owner_set = xo->owner_set;
		c.owner_uid = xo->owner_uid;
		if (xo->create && tpd_peer_chan_far_minor(xo->pr) >= TPW_PEER_MINOR_CHAN_STREAM) {
			c.persistent = xo->persistent;
			c.access = xo->access;
			c.gid = xo->gid;
			c.capacity_items = xo->capacity_items;
			c.capacity_bytes = xo->capacity_bytes;
			c.remote = xo->remote;
			c.remote_peers = xo->remote_peers;
			c.n_remote_peers = xo->n_remote_peers;
		}
		return xop_send(x, xo, &c, NULL, NULL);
	}
	q.op = TPW__V1__WQ_OP_KIND__WQ_OP_OPEN;
	q.name = xo->name;
	q.create = xo->create;
	q.exclusive = xo->exclusive;
	q.owner_set = xo->owner_set;
	q.owner_uid = xo->owner_uid;
	if (xo->create) { /* the hosting daemon speaks 8 or later (xop_open_or_refuse()) */
		q.access = xo->access;
		q.gid = xo->gid;
		q.at_most_once = xo->at_most_once;
		q.remote = xo->remote;
		q.remote_peers = xo->remote_peers;
		q.n_remote_peers = xo->n_remote_peers;
	}
	xop_send(x, xo, NULL, &q, NULL);
}

/* Tells the hosting daemon that handle @far_id of @pr is released; nobody waits for it. */
static void release_far(struct tpd_chanx *x, enum xkind k, struct tpd_peer *pr, uint64_t far_id)
{
	struct xop xo = { .kind = k, .pr = pr, .op_id = 0 };
	Tpw__V1__ChanOp c = TPW__V1__CHAN_OP__INIT;
	Tpw__V1__WqOp q = TPW__V1__WQ_OP__INIT;

	if (k == X_CHAN) {
		c.op = TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE;
		c.chan_id = far_id;
		return xop_send(x, &xo, &c, NULL, NULL);
	}
	q.op = TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE;
	q.wq_id = far_id;
	xop_send(x, &xo, NULL, &q, NULL);
}

static unsigned session_xhs(const struct tpd_chanx *x, const struct tpd_session *s)
{
	const struct xh *xh;
	unsigned n = 0;

	tpu_list_for_each(xh, &x->xhs, node)
		n += xh->s == s;
	return n;
}

/* The fields of an OPEN both kinds share (@chan: a channel's OPEN or UNLINK, @wq: a queue's
 * OPEN; the other NULL). */
struct xopen {
	uint64_t req_id;
	const char *name;
	bool create, exclusive, owner_set;
	uint32_t owner_uid;
	const Tpw__V1__ChanOp *chan;
	const Tpw__V1__WqOp *wq;
};

/* Keeps the creation fields of @o (an OPEN with create, @o->chan or @o->wq) in @xo.
 * Return: 0 or -ENOMEM. */
static int xop_keep_create(struct xop *xo, const struct xopen *o)
{
	char **peers = o->chan ? o->chan->remote_peers : o->wq->remote_peers;
	size_t n = o->chan ? o->chan->n_remote_peers : o->wq->n_remote_peers;

	if (o->chan) {
		xo->persistent = o->chan->persistent;
		xo->access = o->chan->access;
		xo->gid = o->chan->gid;
		xo->capacity_items = o->chan->capacity_items;
		xo->capacity_bytes = o->chan->capacity_bytes;
		xo->remote = o->chan->remote;
	} else {
		xo->at_most_once = o->wq->at_most_once;
		xo->access = o->wq->access;
		xo->gid = o->wq->gid;
		xo->remote = o->wq->remote;
	}
	if (tpu_strv_dup(peers, n, TPW_REMOTE_PEERS_MAX, TPW_NAME_MAX, &xo->remote_peers) < 0)
		return -ENOMEM;
	xo->n_remote_peers = n;
	return 0;
}

static bool xop_open_or_refuse(struct tpd_chanx *x, struct xop *xo);

static void xopen(struct tpd_chanx *x, enum xkind k, struct tpd_session *s,
		  const struct xopen *o)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(x->d);
	char host[TPW_TPIP_HOST_MAX + 1], why[200], xh_host[XH_HOST_MAX];
	const char *name;
	struct xh *xh;
	struct xop *xo;
	uint16_t port;
	int r;

	r = tpw_tpip_parse(o->name, (uint16_t)cfg->peer_port, host, &port, &name, why,
			   sizeof(why));
	if (r < 0)
		return refuse(k, s, o->req_id, 0, -EINVAL, "%s address '%.64s': %s", noun(k),
			      o->name, why);
	if (session_xhs(x, s) >= XH_HANDLES_PER_SESSION)
		return refuse(k, s, o->req_id, 0, -ENOBUFS, "this session has %u handles of "
			      "channels and queues on other hosts", XH_HANDLES_PER_SESSION);
	xh = calloc(1, sizeof(*xh));
	xo = calloc(1, sizeof(*xo));
	if (xo)
		tpu_list_init(&xo->node);
	if (xo && o->create && (o->chan || o->wq) && xop_keep_create(xo, o) < 0) {
		tpd_chanx_xop_free(xo);
		xo = NULL;
	}
	if (!xh || !xo) {
		free(xh);
		free(xo);
		return refuse(k, s, o->req_id, 0, -ENOMEM, "out of memory");
	}
	tpu_list_init(&xh->node);
	tpu_list_init(&xo->node);
	snprintf(xh->host, sizeof(xh->host), strchr(host, ':') ? "[%s]:%u" : "%s:%u", host,
		 (unsigned)port);
	snprintf(xh_host, sizeof(xh_host), "%s", xh->host);
	r = tpd_peer_get(x->d, host, port, &xh->pr, why, sizeof(why));
	if (r == 0 && link_ops(x, xh->pr) >= cfg->chan_peer_ops_max)
		r = tpu_why(-ENOBUFS, why, sizeof(why), "%u ops forwarded over this link wait "
			    "for answers (chan-peer-ops-max)", cfg->chan_peer_ops_max);
	else if (r == 0 && uid_ops_full(x, xh->pr, tpd_session_uid(s)))
		r = tpu_why(-ENOBUFS, why, sizeof(why), "uid %u has %u ops forwarded over this "
			    "link waiting for answers (chan-peer-ops-per-uid)",
			    (unsigned)tpd_session_uid(s),
			    uid_share(cfg, tpd_session_uid(s)));
	if (r < 0) {
		free(xh);
		free(xo);
		return refuse(k, s, o->req_id, 0, r, "%s host %s: %s", noun(k), xh_host, why);
	}
	xh->kind = xo->kind = k;
	xh->s = xo->s = s;
	xo->by_uid = tpd_session_uid(s);
	xh->id = k == X_CHAN ? tpd_chan_new_id(x->cs) : tpd_wq_new_id(tpd_daemon_wqs(x->d));
	xo->pr = xh->pr;
	xo->op_id = ++x->next_op;
	xo->req_id = o->req_id;
	xo->local_id = xh->id;
	xo->op = o->chan ? (int)o->chan->op : TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN;
	xo->xh = xh; /* WQ_OP_OPEN is 1 too */
	snprintf(xo->name, sizeof(xo->name), "%s", name);
	snprintf(xh->name, sizeof(xh->name), "%s", name);
	xo->create = o->create;
	xo->exclusive = o->exclusive;
	xo->owner_set = o->owner_set;
	xo->owner_uid = o->owner_uid;
	xo->uid = (uint32_t)tpd_session_uid(s);
	xo->pid = (uint32_t)tpd_session_pid(s);
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK) { /* no handle */
		free(xh);
		xo->xh = NULL;
		xo->local_id = 0;
	} else {
		tpu_list_insert_tail(&x->xhs, &xh->node);
	}
	tpu_list_insert_tail(&x->xops, &xo->node);
	if (tpd_peer_is_up(xo->pr))
		xop_open_or_refuse(x, xo);
}

/*
 * Sends the OPEN @xo holds over its link, now up, or refuses it when the far daemon is too old
 * to know channel messages (sending one would fail the whole link, and its pipes with it).
 * Return: false when @xo was refused and freed.
 */
static bool xop_open_or_refuse(struct tpd_chanx *x, struct xop *xo)
{
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK && xo->kind == X_CHAN &&
	    tpd_peer_chan_far_minor(xo->pr) < TPW_PEER_MINOR_CHAN_STREAM) {
		refuse(xo->kind, xo->s, xo->req_id, 0, -EOPNOTSUPP, "channel host %s: its daemon "
		       "speaks peer protocol 2.%u, which unlinks no channel for other hosts (2.%u "
		       "and later)", tpd_peer_name(xo->pr), tpd_peer_chan_far_minor(xo->pr),
		       TPW_PEER_MINOR_CHAN_STREAM);
		tpd_chanx_xop_free(xo);
		return false;
	}
	if (xo->kind == X_WQ && xo->create && tpd_peer_chan_supported(xo->pr) &&
	    tpd_peer_chan_far_minor(xo->pr) < TPW_PEER_MINOR_WQ_CREATE) {
		refuse(X_WQ, xo->s, xo->req_id, 0, -EOPNOTSUPP, "work queue host %s: its daemon "
		       "speaks peer protocol 2.%u, which creates no work queue for other hosts (2.%u "
		       "and later): open it without TP_WQ_CREATE to work for it",
		       tpd_peer_name(xo->pr), tpd_peer_chan_far_minor(xo->pr),
		       TPW_PEER_MINOR_WQ_CREATE);
		if (xo->xh)
			xh_free(xo->xh);
		tpd_chanx_xop_free(xo);
		return false;
	}
	if (tpd_peer_chan_supported(xo->pr)) {
		xop_send_open(x, xo);
		return true;
	}
	refuse(xo->kind, xo->s, xo->req_id, 0, -EOPNOTSUPP, "%s host %s: its daemon speaks peer "
	       "protocol 2.%u, which has no channels or queues across hosts (2.%u and later)",
	       noun(xo->kind), tpd_peer_name(xo->pr), tpd_peer_chan_far_minor(xo->pr),
	       TPW_PEER_MINOR_CHAN);
	if (xo->xh)
		xh_free(xo->xh);
	tpd_chanx_xop_free(xo);
	return false;
}

void tpd_chanx_open(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o)
{
	const struct xopen xo = { o->req_id, o->name, o->create, o->exclusive, o->owner_set,
				  o->owner_uid, o, NULL };

	xopen(x, X_CHAN, s, &xo);
}

void tpd_chanx_unlink(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o)
{
	const struct xopen xo = { o->req_id, o->name, false, false, o->owner_set, o->owner_uid,
				  o, NULL };

	xopen(x, X_CHAN, s, &xo);
}

void tpd_chanx_wq_open(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__WqOp *o)
{
	const struct xopen xo = { o->req_id, o->name, o->create, o->exclusive, o->owner_set,
				  o->owner_uid, NULL, o };

	xopen(x, X_WQ, s, &xo);
}

static struct xh *xh_find(struct tpd_chanx *x, enum xkind k, const struct tpd_session *s,
			  uint64_t id)
{
	struct xh *xh;

	tpu_list_for_each(xh, &x->xhs, node)
		if (xh->kind == k && xh->s == s && xh->id == id && xh->far_id)
			return xh;
	return NULL;
}

/*
 * Forwards op @op (kind @k, @chan or @wq, the client's @req_id) of handle @xh with @tail and
 * the large items @lg (taken; NULL: none), or answers it: a failed link's handle answers
 * -ECONNRESET naming the host (its RELEASE: 0 and the handle goes); a link with
 * chan-peer-ops-max ops unanswered, or the caller's uid with its chan-peer-ops-per-uid share of
 * them, refuses it.
 */
static void xforward(struct tpd_chanx *x, struct xh *xh, int op, uint64_t req_id,
		     Tpw__V1__ChanOp *chan, Tpw__V1__WqOp *wq, const struct iovec *tail,
		     struct xlarge *lg)
{
	uint32_t max = tpd_daemon_cfg(x->d)->chan_peer_ops_max;
	bool release = op == (xh->kind == X_CHAN ? TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE
						 : TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE);
	struct tpd_session *s = xh->s;
	bool uid_full = xh->pr && uid_ops_full(x, xh->pr, tpd_session_uid(s));
	uint64_t id = xh->id;
	struct xop *xo;
	size_t flen;
	int r;

	if (lg && lg->n && (!xh->pr || link_ops(x, xh->pr) >= max || uid_full))
		tpd_chanx_big_put(lg);
	if (!xh->pr && release) {
		enum xkind k = xh->kind;

		xh_free(xh);
		return refuse(k, s, req_id, id, 0, "%s", "");
	}
	if (!xh->pr)
		return refuse(xh->kind, s, req_id, id, -ECONNRESET, "%s host %s: %s", noun(xh->kind),
			      xh->host, xh->why);
	if (link_ops(x, xh->pr) >= max)
		return refuse(xh->kind, s, req_id, id, -ENOBUFS, "%s host %s: %u ops forwarded over "
			      "this link wait for answers (chan-peer-ops-max)", noun(xh->kind),
			      xh->host, max);
	if (uid_full)
		return refuse(xh->kind, s, req_id, id, -ENOBUFS, "%s host %s: uid %u has %u ops "
			      "forwarded over this link waiting for answers (chan-peer-ops-per-uid)",
			      noun(xh->kind), xh->host, (unsigned)tpd_session_uid(s),
			      uid_share(tpd_daemon_cfg(x->d), tpd_session_uid(s)));
	/* What the client sent fitted this daemon's frames, not necessarily the far daemon's once
	 * wrapped (a descriptor's metadata beside a payload near the limit): a frame above the far
	 * daemon's frame-max would fail the whole link there, every user's handles with it. The
	 * op's id, handle id and the caller at their largest bound the frame xop_send() builds. */
	if (chan)
		chan->chan_id = UINT64_MAX;
	else
		wq->wq_id = UINT64_MAX;
	flen = xop_msg_len(chan, wq, UINT64_MAX, UINT32_MAX, UINT32_MAX) +
	       (tail ? tail->iov_len : 0);
	if (flen > tpd_peer_chan_frame_max(xh->pr)) {
		tpd_chanx_big_put(lg);
		return refuse(xh->kind, s, req_id, id, -EMSGSIZE, "%s host %s: this op makes a "
			      "frame of %zu bytes, above the %u its daemon accepts (its frame-max)",
			      noun(xh->kind), xh->host, flen, tpd_peer_chan_frame_max(xh->pr));
	}
	xo = calloc(1, sizeof(*xo));
	if (!xo) {
		tpd_chanx_big_put(lg);
		return refuse(xh->kind, s, req_id, id, -ENOMEM, "out of memory");
	}
	xo->kind = xh->kind;
	xo->pr = xh->pr;
	xo->op_id = ++x->next_op;
	xo->s = s;
	xo->by_uid = tpd_session_uid(s);
	xo->req_id = req_id;
	xo->local_id = id;
	xo->op = op;
	xo->max_items = chan ? chan->max_items : 0;
	xo->pack = chan && chan->pack_peer;
	xo->msg = wq && wq->msg;
	tpu_list_insert_tail(&x->xops, &xo->node);
	if (lg && lg->n && !lg->read) { /* sent once the hosting daemon has room for them */
		xo->out_mem = lg->mem;
		xo->out_len = lg->len;
		xo->n_out = lg->n;
		*lg = (struct xlarge){ 0 };
	}
	r = lg && lg->n ? tpd_chanx_big_read_start(x, xo, lg) : 0;
	if (r == -ENOTCONN || r == -EPIPE)
		r = -ECONNRESET; /* the link's data connections are gone: the link goes with them */
	if (r < 0) {
		tpd_chanx_xop_free(xo);
		return refuse(xh->kind, s, req_id, id, r, "%s host %s: cannot receive the item "
			      "over the link's data connections: %s", noun(xh->kind), xh->host,
			      strerror(-r));
	}
	if (chan)
		chan->chan_id = xh->far_id;
	else
		wq->wq_id = xh->far_id;
	if (xo->xs && chan) { /* a read's receive: where the hosting daemon sends the item */
		chan->xfer_id = xo->xs->xfer_id;
		chan->room = xo->room;
	} else if (chan && chan->pack_peer) { /* (never: a packed read names its allocation) */
		chan->pack_peer = false;
		chan->max_items = 0;
		xo->pack = false;
		xo->max_items = 0;
	} else if (xo->xs) {
		wq->xfer_id = xo->xs->xfer_id;
		wq->room = xo->room;
	}
	xop_send(x, xo, chan, wq, tail);
	if (release)
		xh_free(xh); /* its answer (and those of its waits) still come, to @xo */
}

bool tpd_chanx_op(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__ChanOp *o,
		  const uint8_t *tail, size_t tail_len)
{
	struct xh *xh = xh_find(x, X_CHAN, s, o->chan_id);
	struct iovec iov = { (void *)tail, tail_len };
	struct xlarge lg = { 0 };
	_cleanup_free_ protobuf_c_boolean *streamed = NULL;
	char why[200];
	Tpw__V1__ChanOp c;
	int r;

	if (!xh)
		return false;
	if ((o->n_msgs || o->msg) && xh->pr &&
	    tpd_peer_chan_far_minor(xh->pr) < TPW_PEER_MINOR_CHAN_MSG) {
		refuse(X_CHAN, s, o->req_id, o->chan_id, -EOPNOTSUPP, "channel host %s: its "
		       "daemon speaks peer protocol 2.%u: items are byte strings (2.%u takes "
		       "messages)", xh->host, tpd_peer_chan_far_minor(xh->pr),
		       TPW_PEER_MINOR_CHAN_MSG);
		return true;
	}
	if (o->n_segments > 1 && o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ) {
		refuse(X_CHAN, s, o->req_id, o->chan_id, -EOPNOTSUPP, "channel host %s: a read "
		       "into several slots does not cross hosts (one destination)", xh->host);
		return true;
	}
	if (xh->pr && tail_len > tpd_peer_chan_tail_max(xh->pr)) { /* the link would fail */
		refuse(X_CHAN, s, o->req_id, o->chan_id, -EMSGSIZE, "channel host %s: %zu bytes of "
		       "items inline are above the %u that cross to it (its frame-max less 64 KiB)",
		       xh->host, tail_len, tpd_peer_chan_tail_max(xh->pr));
		return true;
	}
	if ((o->n_segments || (o->take_held && !o->msg)) && xh->pr &&
	    tpd_peer_chan_far_minor(xh->pr) < TPW_PEER_MINOR_CHAN_STREAM) {
		refuse(X_CHAN, s, o->req_id, o->chan_id, -EOPNOTSUPP, "channel host %s: its "
		       "daemon speaks peer protocol 2.%u: items ride inline (2.%u streams them)",
		       xh->host, tpd_peer_chan_far_minor(xh->pr), TPW_PEER_MINOR_CHAN_STREAM);
		return true;
	}
	r = o->n_segments && xh->pr ? tpd_chanx_big_get(s, o, &lg, &streamed, why, sizeof(why)) : 0;
	if (r < 0) {
		refuse(X_CHAN, s, o->req_id, o->chan_id, r, "%s", why);
		return true;
	}
	c = *o;
	c.base.n_unknown_fields = 0;
	c.base.unknown_fields = NULL;
	c.n_remote_peers = 0; /* creation only, never forwarded */
	c.remote_peers = NULL;
	/* A plain read takes a batch across hosts from a daemon that bounds it by this link's
	 * frames (peer minor >= 10); an older one answers one item at a time. A packed read
	 * (one allocation) too, from a daemon that said it takes a peer's packed reads: its
	 * items packed within the allocation, into which this daemon receives (ChanOp.pack_peer).
	 * The client's pack fields are for a daemon of its own host: a far daemon takes them
	 * from a peer as malformed, which would fail the whole link. */
	c.pack_peer = o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ && o->pack &&
		      o->n_segments == 1 && !o->msg && !o->take_held && xh->pr && xh->far_pack;
	c.pack = c.pack_copied = c.pack_mapped = false;
	if (o->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_READ || o->msg || o->take_held ||
	    (o->n_segments && !c.pack_peer) || !xh->pr ||
	    tpd_peer_chan_far_minor(xh->pr) < TPW_PEER_MINOR_CHAN_BATCH)
		c.max_items = 0;
	if (c.max_items <= 1)
		c.pack_peer = false;
	c.lend = false;	 /* a lent staging buffer stays with this host: the far daemon copies */
	/* a mapped read is for a channel of this host (its buffers are this host's): a far daemon
	 * takes those fields from a peer as malformed, which would fail the whole link */
	c.map_ok = c.map_done = c.map_fail = false;
	c.n_mapped = 0;
	c.mapped = NULL;
	/* The hosting daemon holds a large item for this handle only for a client that takes it
	 * (client minor >= 7 and CMA, as here). */
	c.inline_only = o->inline_only || tpd_session_client_minor(s) < TPW_MINOR_CHAN_FAST;
	c.n_segments = 0;
	c.segments = NULL;
	if (lg.n && !lg.read) {
		c.n_streamed = o->n_lengths;
		c.streamed = streamed;
	}
	xforward(x, xh, o->op, o->req_id, &c, NULL, tail_len ? &iov : NULL, &lg);
	tpd_chanx_big_put(&lg); /* what xforward() did not take: no item by reference */
	return true;
}

/* May @s's op @o of handle @xh go by reference to its host (peer minor >= 11)? If not, it is
 * refused (the link stays up) and false returned. */
static bool wq_refs_ok(struct xh *xh, struct tpd_session *s, const Tpw__V1__WqOp *o)
{
	if (!o->segment && !o->n_segments)
		return true;
	if (xh->pr && tpd_peer_chan_far_minor(xh->pr) < TPW_PEER_MINOR_WQ_STREAM) {
		refuse(X_WQ, s, o->req_id, o->wq_id, -EMSGSIZE, "work queue host %s: its daemon "
		       "speaks peer protocol 2.%u: messages cross hosts inline, at most the inline "
		       "limit (2.%u takes larger ones by reference)", xh->host,
		       tpd_peer_chan_far_minor(xh->pr), TPW_PEER_MINOR_WQ_STREAM);
		return false;
	}
	if (o->n_segments > 1) {
		refuse(X_WQ, s, o->req_id, o->wq_id, -EOPNOTSUPP, "work queue host %s: a read into "
		       "several slots does not cross hosts (one destination)", xh->host);
		return false;
	}
	return true;
}

bool tpd_chanx_wq_op(struct tpd_chanx *x, struct tpd_session *s, const Tpw__V1__WqOp *o,
		     const uint8_t *tail, size_t tail_len)
{
	struct xh *xh = xh_find(x, X_WQ, s, o->wq_id);
	struct iovec iov = { (void *)tail, tail_len };
	struct xlarge lg = { 0 };
	bool read = o->n_segments != 0;
	char why[200];
	Tpw__V1__WqOp q;
	int r;

	if (!xh)
		return false;
	if ((o->msg_desc || o->msg || o->msg_read || o->msg_drop) && xh->pr &&
	    tpd_peer_chan_far_minor(xh->pr) < TPW_PEER_MINOR_WQ_MSG) {
		refuse(X_WQ, s, o->req_id, o->wq_id, -EOPNOTSUPP, "work queue host %s: its daemon "
		       "speaks peer protocol 2.%u: questions and answers are byte strings (2.%u "
		       "takes messages)", xh->host, tpd_peer_chan_far_minor(xh->pr),
		       TPW_PEER_MINOR_WQ_MSG);
		return true;
	}
	if (!wq_refs_ok(xh, s, o))
		return true;
	if (xh->pr && tail_len > tpd_peer_chan_tail_max(xh->pr)) { /* the link would fail */
		refuse(X_WQ, s, o->req_id, o->wq_id, -EMSGSIZE, "work queue host %s: a payload of "
		       "%zu bytes is above the %u that cross to it (its frame-max less 64 KiB: "
		       "queue payloads cross hosts inline)", xh->host, tail_len,
		       tpd_peer_chan_tail_max(xh->pr));
		return true;
	}
	/* A message by reference (validated: a segment with a descriptor, or one read
	 * destination): the client's memory resolved here, its bytes over the data connections. */
	r = (o->segment || read) && xh->pr ?
	    tpd_chanx_big_segs(s, read ? o->segments : &o->segment, 1, read, &lg, NULL, why,
			       sizeof(why)) : 0;
	if (r < 0) {
		refuse(X_WQ, s, o->req_id, o->wq_id, r, "%s", why);
		return true;
	}
	q = *o;
	q.base.n_unknown_fields = 0;
	q.base.unknown_fields = NULL;
	q.n_remote_peers = 0;
	q.remote_peers = NULL;
	q.segment = NULL;
	q.n_segments = 0;
	q.segments = NULL;
	q.stream_len = lg.n && !lg.read ? lg.len[0] : 0;
	xforward(x, xh, o->op, o->req_id, NULL, &q, tail_len ? &iov : NULL, &lg);
	tpd_chanx_big_put(&lg); /* what xforward() did not take */
	return true;
}

void tpd_chanx_session_end(struct tpd_chanx *x, struct tpd_session *s)
{
	struct xop *xo, *otmp;
	struct xh *xh, *htmp;

	tpu_list_for_each_safe(xo, otmp, &x->xops, node) {
		if (xo->s != s)
			continue;
		if (xo->xh) { /* an OPEN: its handle goes with the session, released once open */
			xh_free(xo->xh);
			xo->xh = NULL;
			xo->s = NULL;
			if (!xo->sent)
				tpd_chanx_xop_free(xo);
			continue;
		}
		tpd_chanx_xop_free(xo);
	}
	tpu_list_for_each_safe(xh, htmp, &x->xhs, node) {
		if (xh->s != s)
			continue;
		if (xh->pr)
			release_far(x, xh->kind, xh->pr, xh->far_id);
		xh_free(xh);
	}
}

/* ---- answers from the hosting daemon ------------------------------------------------------- */

static struct xop *xop_find(struct tpd_chanx *x, enum xkind k, const struct tpd_peer *pr,
			    uint64_t op_id)
{
	struct xop *xo;

	if (!op_id)
		return NULL;
	tpu_list_for_each(xo, &x->xops, node)
		if (xo->kind == k && xo->pr == pr && xo->op_id == op_id && xo->sent)
			return xo;
	return NULL;
}

/* The answer to OPEN @xo came with status @ok: the handle is open (its far id @far_id), or goes.
 * Return: false when nobody is left to tell (the session ended: the far handle is released). */
static bool xop_opened(struct tpd_chanx *x, struct xop *xo, bool ok, uint64_t far_id)
{
	if (!xo->s) {
		if (ok)
			release_far(x, xo->kind, xo->pr, far_id);
		return false;
	}
	if (ok)
		xo->xh->far_id = far_id;
	else
		xh_free(xo->xh);
	xo->xh = NULL;
	return true;
}

/* Is @r (not one item) the answer of @xo's batch read: more than one item, at most those asked
 * for, and for a packed read packed within its allocation? (That they are inline byte items adding up to the data tail the frame's check made
 * sure: proto/validate.c, check_chan_batch().) */
static bool batch_ok(const struct xop *xo, const Tpw__V1__ChanReply *r)
{
	uint64_t end = 0, off;

	if (r->n_lengths <= 1 || r->n_lengths > xo->max_items)
		return false;
	/* a packed read's: each item where tpw_chan_pack_at() puts it within the allocation */
	for (size_t i = 0; xo->pack && i < r->n_lengths; i++) {
		if (!tpw_chan_pack_at(end, r->lengths[i], xo->room, &off))
			return false;
		end = off + r->lengths[i];
	}
	return true;
}

static void on_chan_reply(struct tpd_chanx *x, struct tpd_peer *pr, const Tpw__V1__ChanReply *r,
			  const uint8_t *tail, uint32_t tail_len)
{
	struct xop *xo = xop_find(x, X_CHAN, pr, r->req_id);
	Tpw__V1__ChanReply a;
	struct iovec iov = { (void *)tail, tail_len };
	bool item = false, tell = true;
	struct xbig_ans ba = { .xfer_id = r->xfer_id, .ok = r->status == TPW__V1__STATUS__STATUS_OK,
			       .copied = r->copied && xo &&
					 xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ,
			       .len = r->n_lengths ? r->lengths[0] : 0, .closed = r->closed,
			       .msg = r->msg_taken };

	if (tpd_chanx_big_reply(x, xo, pr, &ba))
		return; /* a large item's answer: taken, or kept until its bytes are in */
	if (!xo)
		return; /* the session ended, or not an op of this link: dropped */
	/* Only what a far daemon's answer may say goes to the client: a field for this host's
	 * clients alone (lent staging, released buffers, mappings, copies) from a hostile or
	 * newer far daemon would make the client's library refuse the frame and end its whole
	 * context, or hold buffers for nothing. */
	a = (Tpw__V1__ChanReply)TPW__V1__CHAN_REPLY__INIT;
	a.status = r->status;
	a.message = r->message;
	a.closed = r->closed;
	a.n_lengths = r->n_lengths;
	a.lengths = r->lengths;
	a.held_len = r->held_len;
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ) {
		a.msg_desc = r->msg_desc;
		a.msg_held = r->msg_held;
		a.msg_taken = r->msg_taken;
	}
	a.req_id = xo->req_id;
	a.chan_id = xo->local_id;
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN && !r->chan_id &&
	    r->status == TPW__V1__STATUS__STATUS_OK) {
		a.status = TPW__V1__STATUS__STATUS_INVALID;
		a.message = (char *)"the channel's host answered an open without a handle";
	}
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN && xo->s && xo->xh)
		xo->xh->far_pack = r->pack_peer &&
				   tpd_peer_chan_far_minor(pr) >= TPW_PEER_MINOR_CHAN_STREAM;
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN &&
	    a.status == TPW__V1__STATUS__STATUS_OK)
		a.pack_reads = xo->s && xo->xh && xo->xh->far_pack; /* ChanOp.pack forwarded */
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN)
		tell = xop_opened(x, xo, a.status == TPW__V1__STATUS__STATUS_OK, r->chan_id);
	else if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ)
		item = r->status == TPW__V1__STATUS__STATUS_OK &&
		       (r->n_lengths == 1 ? tail_len || r->msg_taken /* a message's may be empty */
					  : batch_ok(xo, r));
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN &&
	    a.status == TPW__V1__STATUS__STATUS_OK)
		a.remote_refs = tpd_peer_chan_far_minor(pr) >= TPW_PEER_MINOR_CHAN_STREAM;
	if (xo->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ &&
	    r->status == TPW__V1__STATUS__STATUS_OK && !item && !r->held_len && !r->msg_held &&
	    !r->msg_taken) {
		a.status = TPW__V1__STATUS__STATUS_INVALID; /* never an empty item */
		a.message = (char *)"the channel's host answered a read without an item";
	}
	if (!item) {
		a.n_lengths = 0;
		a.lengths = NULL;
	}
	/* A held item's length goes only with nothing taken (the far daemon's validation lets
	 * msg_taken and held_len through together: the client's refuses them). */
	if (xo->op != TPW__V1__CHAN_OP_KIND__CHAN_OP_READ || item || r->msg_taken)
		a.held_len = 0;
	if (tell) {
		Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

		m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
		m.chan_reply = &a;
		far_answer(pr, xo->s, &m, item ? &iov : NULL);
	}
	tpd_chanx_xop_free(xo);
}

static void on_wq_reply(struct tpd_chanx *x, struct tpd_peer *pr, const Tpw__V1__WqReply *r,
			const uint8_t *tail, uint32_t tail_len)
{
	struct xop *xo = xop_find(x, X_WQ, pr, r->req_id);
	Tpw__V1__WqReply a;
	struct iovec iov = { (void *)tail, tail_len };
	bool data, take, tell = true;
	struct xbig_ans ba = { .xfer_id = r->xfer_id, .ok = r->status == TPW__V1__STATUS__STATUS_OK,
			       .copied = r->msg_copied && xo,
			       .len = r->msg_len, .qid = r->question_id, .closed = r->closed };

	if (tpd_chanx_big_reply(x, xo, pr, &ba))
		return; /* a message by reference: taken, or kept until its bytes are in */
	if (!xo)
		return;
	/* Only what a far daemon's answer to this op may say goes to the client, as for channels
	 * (on_chan_reply()): a field of another op's answer, or for this host's clients alone,
	 * from a hostile or newer far daemon would make the client's library take a descriptor
	 * nobody frees, or report a worker's death for a take. */
	take = xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_TAKE ||
	       xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER;
	a = (Tpw__V1__WqReply)TPW__V1__WQ_REPLY__INIT;
	a.status = r->status;
	a.message = r->message;
	a.closed = r->closed;
	a.req_id = xo->req_id;
	a.wq_id = xo->local_id;
	/* A handle of a queue on another host is the owner's only if its OPEN created it there
	 * (a hosting daemon of minor >= 8; xop_open_or_refuse()); other answers tell nothing. */
	a.owner = xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN && xo->create && r->owner;
	if (take || xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT)
		a.question_id = r->question_id;
	a.answer_status = TPW__V1__STATUS__STATUS_OK; /* (as this daemon's answers say it) */
	if (xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER) { /* a worker's death, none waiting */
		a.answer_status = r->answer_status;
		a.idle = r->idle;
	}
	if (take && xo->msg && r->msg_held) { /* a descriptor (validated: no length, no tail) */
		a.msg_held = true;
		a.msg_desc = r->msg_desc;
		a.msg_len = r->msg_len;
	}
	data = tail_len && r->status == TPW__V1__STATUS__STATUS_OK && take;
	if (xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN && !r->wq_id &&
	    r->status == TPW__V1__STATUS__STATUS_OK) {
		a.status = TPW__V1__STATUS__STATUS_INVALID;
		a.message = (char *)"the work queue's host answered an open without a handle";
	}
	if (xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN)
		tell = xop_opened(x, xo, a.status == TPW__V1__STATUS__STATUS_OK, r->wq_id);
	a.remote_refs = xo->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN &&
			a.status == TPW__V1__STATUS__STATUS_OK &&
			tpd_peer_chan_far_minor(pr) >= TPW_PEER_MINOR_WQ_STREAM;
	if (data)
		a.length = r->length; /* (validated: the tail's) */
	if (tell) {
		Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

		m.body_case = TPW__V1__DAEMON_MSG__BODY_WQ_REPLY;
		m.wq_reply = &a;
		far_answer(pr, xo->s, &m, data ? &iov : NULL);
	}
	tpd_chanx_xop_free(xo);
}

/* ---- the hosting side's answers ------------------------------------------------------------ */

void tpd_chanx_reply(struct tpd_peer *pr, Tpw__V1__ChanReply *r, const struct iovec *tail,
		     size_t n_tail)
{
	Tpw__V1__PeerChanReply pc = TPW__V1__PEER_CHAN_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (!r->req_id)
		return; /* nobody waits for it (a release the far daemon sent on its own) */
	pc.reply = r;
	m.body_case = TPW__V1__PEER_MSG__BODY_CHAN_REPLY;
	m.chan_reply = &pc;
	tpd_peer_send(pr, &m, tail, tail ? (int)n_tail : 0);
}

void tpd_chanx_wq_reply(struct tpd_peer *pr, Tpw__V1__WqReply *r, const struct iovec *tail)
{
	Tpw__V1__PeerWqReply pw = TPW__V1__PEER_WQ_REPLY__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	if (!r->req_id)
		return;
	pw.reply = r;
	m.body_case = TPW__V1__PEER_MSG__BODY_WQ_REPLY;
	m.wq_reply = &pw;
	tpd_peer_send(pr, &m, tail, tail ? 1 : 0);
}

/* ---- the link's events ---------------------------------------------------------------------- */

static void chanx_on_msg(struct tpd_daemon *d, struct tpd_peer *pr, const Tpw__V1__PeerMsg *m,
			 const uint8_t *tail, uint32_t tail_len)
{
	struct tpd_chans *cs = tpd_daemon_chans(d);
	struct tpd_chanx *x = tpd_chan_x(cs);

	switch (m->body_case) {
	case TPW__V1__PEER_MSG__BODY_CHAN_OP:
		return tpd_chan_peer_op(cs, pr, m->chan_op, tail, tail_len);
	case TPW__V1__PEER_MSG__BODY_WQ_OP:
		return tpd_wq_peer_op(tpd_daemon_wqs(d), pr, m->wq_op, tail, tail_len);
	case TPW__V1__PEER_MSG__BODY_CHAN_REPLY:
		return on_chan_reply(x, pr, m->chan_reply->reply, tail, tail_len);
	case TPW__V1__PEER_MSG__BODY_WQ_REPLY:
		return on_wq_reply(x, pr, m->wq_reply->reply, tail, tail_len);
	case TPW__V1__PEER_MSG__BODY_CHAN_XFER_END:
		return tpd_chan_stream_end(pr, m->chan_xfer_end->xfer_id, m->chan_xfer_end->bytes,
					   tpw_status_to_errno(m->chan_xfer_end->status) ?: -EIO,
					   m->chan_xfer_end->message);
	default:
		return;
	}
}

static void chanx_on_link_up(struct tpd_daemon *d, struct tpd_peer *pr)
{
	struct tpd_chanx *x = tpd_chan_x(tpd_daemon_chans(d));
	struct xop *xo, *tmp;

	tpu_list_for_each_safe(xo, tmp, &x->xops, node)
		if (xo->pr == pr && !xo->sent && xo->s)
			xop_open_or_refuse(x, xo);
}

static void chanx_on_link_failed(struct tpd_daemon *d, struct tpd_peer *pr, int err,
				 const char *why)
{
	struct tpd_chanx *x = tpd_chan_x(tpd_daemon_chans(d));
	struct xop *xo, *otmp;
	struct xh *xh, *htmp;
	unsigned n_ops = 0, n_xh = 0;

	/* Hosting side: the handles the far daemon opened here go, with their waits. */
	tpd_chan_peer_gone(tpd_daemon_chans(d), pr);
	tpd_wq_peer_gone(tpd_daemon_wqs(d), pr);
	/* Forwarding side: every op waiting for an answer over @pr fails, naming the host. */
	tpu_list_for_each_safe(xo, otmp, &x->xops, node) {
		if (xo->pr != pr)
			continue;
		if (xo->s && !xo->sent) /* an OPEN: the link never came up */
			refuse(xo->kind, xo->s, xo->req_id, 0, err < 0 ? err : -ECONNRESET,
			       "%s host %s: cannot reach its daemon: %s", noun(xo->kind),
			       tpd_peer_name(pr), why && *why ? why : "connection reset");
		else if (xo->s)
			refuse(xo->kind, xo->s, xo->req_id, xo->xh ? 0 : xo->local_id, -ECONNRESET,
			       "%s host %s: peer link failed: %s", noun(xo->kind),
			       tpd_peer_name(pr), why && *why ? why : "connection reset");
		if (xo->xh)
			xh_free(xo->xh);
		tpd_chanx_xop_free(xo);
		n_ops++;
	}
	tpu_list_for_each_safe(xh, htmp, &x->xhs, node) {
		if (xh->pr != pr)
			continue;
		xh->pr = NULL;
		snprintf(xh->why, sizeof(xh->why), "peer link failed: %s",
			 why && *why ? why : "connection reset");
		n_xh++;
	}
	if (n_ops || n_xh)
		tpu_log_info("peer %s: link failed: %u handles of channels and queues there fail, "
			     "%u ops waiting for answers failed", tpd_peer_name(pr), n_xh, n_ops);
}

static const struct tpd_peer_chan_ops chanx_peer_ops = {
	.msg = chanx_on_msg,
	.link_up = chanx_on_link_up,
	.link_failed = chanx_on_link_failed,
};

int tpd_chanx_new(struct tpd_daemon *d, struct tpd_chans *cs, struct tpd_chanx **ret)
{
	struct tpd_chanx *x = calloc(1, sizeof(*x));

	if (!x)
		return -ENOMEM;
	x->d = d;
	x->cs = cs;
	tpu_list_init(&x->xhs);
	tpu_list_init(&x->xops);
	tpd_peer_chan_set_ops(&chanx_peer_ops);
	*ret = x;
	return 0;
}

void tpd_chanx_free(struct tpd_chanx *x)
{
	struct xop *xo, *otmp;
	struct xh *xh, *htmp;

	if (!x)
		return;
	tpu_list_for_each_safe(xo, otmp, &x->xops, node)
		tpd_chanx_xop_free(xo);
	tpu_list_for_each_safe(xh, htmp, &x->xhs, node)
		xh_free(xh);
	free(x);
}
