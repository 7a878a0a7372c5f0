/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Work queues hosted by the daemon (wq.h; docs/queues.md). Responsible for the queue registry,
 * each queue's questions (queued, taken by a worker handle), its answers waiting for the owner,
 * the waits of takes, answer reads and drains with their deadlines, what a worker's or the
 * owner's end does to a queue, and the limits. Not responsible for sessions or frames (local/).
 * Neither a submit nor a reply ever waits for room: a full queue refuses at once, so the owner
 * can always receive answers while its submits are refused (no deadlock of two bounded
 * directions). Everything runs on the daemon's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "chan.h"
#include "chanx.h"
#include "config.h"
#include "core.h"
#include "local.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"
#include "wq.h"
#include "wq_int.h"

void tpd_wq_send(struct wq_handle *h, const struct wq_who *who, uint64_t req_id,
		    const struct wq_ans *a)
{
	Tpw__V1__WqReply r = TPW__V1__WQ_REPLY__INIT;
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;
	struct iovec tail;
	size_t len = a->it && a->it->b ? tpd_wq_msg_body_len(a->it->b) : 0;
	bool data = len && !a->held;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(a->err);
	r.message = (char *)(a->why ? a->why : "");
	r.idle = a->idle;
	if (h) {
		r.wq_id = h->id;
		r.closed = h->q->closed;
		r.owner = h->q->owner == h;
	}
	r.question_id = a->it ? a->it->id : a->qid;
	r.answer_status = a->it ? a->it->status : TPW__V1__STATUS__STATUS_OK;
	if (data) {
		r.length = len;
		tail.iov_base = (void *)tpd_wq_msg_body_bytes(a->it->b);
		tail.iov_len = len;
	}
	r.msg_held = a->held;
	r.msg_desc = a->desc;
	r.msg_len = a->held ? len : a->copied ? a->copied_len : 0;
	r.msg_copied = a->copied;
	r.xfer_id = a->xfer_id;
	if (who->pr)
		return tpd_chanx_wq_reply(who->pr, &r, data ? &tail : NULL);
	m.body_case = TPW__V1__DAEMON_MSG__BODY_WQ_REPLY;
	m.wq_reply = &r;
	tpd_session_send(who->s, &m, data ? &tail : NULL, data ? 1 : 0);
}

/* Answers @h's request @req_id with @err (0 or -errno) and the reason @why. */
void tpd_wq_err(struct wq_handle *h, uint64_t req_id, int err, const char *why)
{
	struct wq_ans a = { .err = err, .why = why };

	tpd_wq_send(h, &h->who, req_id, &a);
}

/* A new item @id with body @b (taken; NULL: none). Return: owned (tpd_wq_item_free()), or NULL
 * (@b dropped). */
struct wq_item *tpd_wq_item_new(uint64_t id, struct wq_body *b)
{
	struct wq_item *it = calloc(1, sizeof(*it));

	if (!it) {
		tpd_wq_msg_body_unref(b);
		return NULL;
	}
	it->id = id;
	it->b = b;
	it->status = TPW__V1__STATUS__STATUS_OK;
	return it;
}

void tpd_wq_item_free(struct wq_item *it)
{
	tpd_wq_msg_body_unref(it->b);
	free(it);
}

static void items_free(struct tpu_list *l)
{
	struct wq_item *it, *tmp;

	tpu_list_for_each_safe(it, tmp, l, node) {
		tpu_list_remove(&it->node);
		tpd_wq_item_free(it);
	}
}

/* Frees @w of @ws as wait_add() left it, queued or not: its timer, its uid's charge and its
 * count for its peer link. */
static void wait_discard(struct tpd_wqs *ws, struct wq_wait *w)
{
	if (w->ev)
		event_free(w->ev);
	if (w->acct)
		tpd_quota_release_wait(w->acct);
	if (w->link)
		tpd_handix_wait_del(&ws->ix, w->link);
	free(w);
}

static void wait_free(struct wq_wait *w)
{
	tpu_list_remove(&w->node);
	w->h->waits--;
	wait_discard(w->h->q->ws, w);
}

static void wq_free(struct wq *q)
{
	tpu_list_remove(&q->node);
	items_free(&q->queued);
	items_free(&q->taken);
	items_free(&q->answers);
	items_free(&q->held);
	tpu_strv_free(q->remote_peers, q->n_remote_peers);
	free(q->creator);
	free(q->name);
	free(q);
}

/* Tells the owner's request @req_id that no question is outstanding. */
static void wq_idle(struct wq_handle *h, uint64_t req_id)
{
	struct wq_ans a = { .err = -ENOENT, .why = "no question is outstanding", .idle = true };

	tpd_wq_send(h, &h->who, req_id, &a);
}

/* Does a payload of @len bytes fit a message to @h (a handle of a peer link: the far daemon's
 * frame-max, tpd_peer_chan_tail_max())? A message (@msg) read by reference over the link's data
 * connections (a far daemon of peer minor >= 11) always does. If not, @why says so. */
bool tpd_wq_fits_link(const struct wq_handle *h, size_t len, bool msg, const char *what,
		      char *why, size_t wl)
{
	uint32_t max;

	if (!h->who.pr)
		return true;
	if (msg && tpd_peer_chan_far_minor(h->who.pr) >= TPW_PEER_MINOR_WQ_STREAM)
		return true;
	max = tpd_peer_chan_tail_max(h->who.pr);
	if (len <= max)
		return true;
	snprintf(why, wl, "%s of %zu bytes is above the %u that cross to %.60s (its frame-max "
		 "less 64 KiB: queue payloads cross hosts inline)", what, len, max,
		 tpd_peer_name(h->who.pr));
	return false;
}

/* Is @it (first in line) a message that request @req_id of @h, a plain take or answer read,
 * cannot be given? Then the request is refused and @it stays where it is. */
static bool refuse_msg(struct wq_handle *h, uint64_t req_id, const struct wq_item *it, bool msg,
		       const char *what)
{
	char why[200];

	if (msg || !it->b || !tpd_wq_msg_body_msg(it->b))
		return false;
	snprintf(why, sizeof(why), "the oldest %s is a message: take it by its descriptor "
		 "(client protocol minor %u)", what, TPW_MINOR_WQ_MSG);
	tpd_wq_err(h, req_id, -EOPNOTSUPP, why);
	return true;
}

/* Hands the oldest queued question to @h's request @req_id (@msg: its descriptor only), or, for
 * a handle of another host whose daemon cannot take it in one frame, refuses that request with
 * -EMSGSIZE (the question stays queued, first in line, for a worker that can); a message to a
 * plain take, -EOPNOTSUPP, likewise. */
static void deliver_question(struct wq_handle *h, uint64_t req_id, bool msg)
{
	struct wq *q = h->q;
	struct wq_item *it = tpu_list_first(&q->queued, struct wq_item, node);
	struct wq_ans a = { .it = it };
	char why[240];

	if (!tpd_wq_fits_link(h, it->b ? tpd_wq_msg_body_len(it->b) : 0, msg, "the oldest question",
			      why, sizeof(why)))
		return tpd_wq_err(h, req_id, -EMSGSIZE, why);
	if (refuse_msg(h, req_id, it, msg, "question"))
		return;
	if (msg && tpd_wq_msg_body_desc(it->b, &a.desc) < 0)
		return tpd_wq_err(h, req_id, -ENOMEM, "out of memory");
	tpu_list_remove(&it->node);
	q->n_queued--;
	it->taker = h;
	tpu_list_insert_tail(&q->taken, &it->node);
	q->n_taken++;
	a.held = msg;
	tpd_wq_send(h, &h->who, req_id, &a);
	tpd_wq_msg_desc_free(a.desc);
}

/* Hands the oldest answer to the owner's request @req_id and forgets it, or with @msg holds it
 * for the owner and answers its descriptor (an error answer, without bytes, is forgotten). */
static void deliver_answer(struct wq_handle *h, uint64_t req_id, bool msg)
{
	struct wq *q = h->q;
	struct wq_item *it = tpu_list_first(&q->answers, struct wq_item, node);
	struct wq_ans a = { .it = it };

	if (refuse_msg(h, req_id, it, msg, "answer"))
		return;
	if (msg && it->b && tpd_wq_msg_body_desc(it->b, &a.desc) < 0)
		return tpd_wq_err(h, req_id, -ENOMEM, "out of memory");
	tpu_list_remove(&it->node);
	q->n_answers--;
	if (msg && it->b) {
		tpu_list_insert_tail(&q->held, &it->node);
		q->n_held++;
		a.held = true;
		tpd_wq_send(h, &h->who, req_id, &a);
		return tpd_wq_msg_desc_free(a.desc);
	}
	q->answer_bytes -= it->b ? tpd_wq_msg_body_charge(it->b) : 0;
	tpd_wq_send(h, &h->who, req_id, &a);
	tpd_wq_item_free(it);
}

/* Serves the waits of @q oldest first: takes while questions are queued (CLOSED once closed
 * and none is), answer reads while answers wait, drains once nothing is queued or taken. */
void tpd_wq_serve(struct wq *q)
{
	struct wq_wait *w, *tmp;

	tpu_list_for_each_safe(w, tmp, &q->waits, node) {
		if (w->kind == WAIT_TAKE && q->n_queued)
			deliver_question(w->h, w->req_id, w->msg);
		else if (w->kind == WAIT_TAKE && (q->closed || q->gone))
			tpd_wq_err(w->h, w->req_id, -EPIPE, "the work queue is closed");
		else if (w->kind == WAIT_ANSWER && q->n_answers)
			deliver_answer(w->h, w->req_id, w->msg);
		else if (w->kind == WAIT_ANSWER && !q->n_queued && !q->n_taken)
			wq_idle(w->h, w->req_id);
		else if (w->kind == WAIT_DRAIN && !q->n_queued && !q->n_taken)
			tpd_wq_err(w->h, w->req_id, 0, NULL);
		else
			continue;
		wait_free(w);
	}
}

static void wait_on_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct wq_wait *w = arg;
	static const char *const why[] = {
		[WAIT_TAKE] = "no question within the timeout",
		[WAIT_ANSWER] = "no answer within the timeout",
		[WAIT_DRAIN] = "questions still unanswered at the timeout",
	};

	(void)fd;
	(void)what;
	tpd_wq_err(w->h, w->req_id, -ETIMEDOUT, why[w->kind]);
	wait_free(w);
}

/* Queues a wait of @h for @req_id (kind @kind, deadline @timeout_ms unless WQ_NO_DEADLINE),
 * charged to the uid of @h's session (waits-per-uid) or counted for its peer link
 * (chan-peer-ops-max, tpd_handix_peer_waits()), or answers the request with the reason it
 * cannot wait. */
static void wait_add(struct tpd_wqs *ws, struct wq_handle *h, uint64_t req_id,
		     enum wq_wait_kind kind, bool msg, uint32_t timeout_ms)
{
	struct tpd_uid_acct *acct = h->who.s ? h->who.s->acct : NULL;
	struct wq_wait *w;
	struct timeval tv;
	char why[160];

	if (timeout_ms == 0)
		return tpd_wq_err(h, req_id, -ETIMEDOUT, "nothing ready (tried once)");
	if (h->waits >= WQ_WAITS_PER_HANDLE)
		return tpd_wq_err(h, req_id, -ENOBUFS, "too many requests waiting on this handle");
	if (acct && tpd_quota_charge_wait(tpd_daemon_cfg(ws->d), acct, why, sizeof(why)) < 0)
		return tpd_wq_err(h, req_id, -ENOBUFS, why);
	w = calloc(1, sizeof(*w));
	if (!w) {
		if (acct)
			tpd_quota_release_wait(acct);
		return tpd_wq_err(h, req_id, -ENOMEM, "out of memory");
	}
	w->acct = acct;
	if (h->who.pr && tpd_handix_wait_add(&ws->ix, h->who.pr) < 0) {
		wait_discard(ws, w);
		return tpd_wq_err(h, req_id, -ENOMEM, "out of memory");
	}
	w->link = h->who.pr;
	if (timeout_ms != WQ_NO_DEADLINE) {
		w->ev = evtimer_new(tpd_daemon_base(ws->d), wait_on_timeout, w);
		tv.tv_sec = timeout_ms / 1000;
		tv.tv_usec = (suseconds_t)(timeout_ms % 1000) * 1000;
		event_base_update_cache_time(tpd_daemon_base(ws->d));
		if (!w->ev || tpd_timer_add(w->ev, &tv) < 0) {
			wait_discard(ws, w);
			return tpd_wq_err(h, req_id, -ENOMEM, "out of memory");
		}
	}
	w->h = h;
	w->req_id = req_id;
	w->kind = kind;
	w->msg = msg;
	h->waits++;
	tpu_list_insert_tail(&h->q->waits, &w->node);
}

static bool wq_permits(const struct wq *q, const struct tpd_session *s)
{
	uid_t uid = tpd_session_uid(s);

	if (uid == 0 || uid == q->uid || q->access == TPW__V1__ACCESS__ACCESS_ANYONE)
		return true;
	return q->access == TPW__V1__ACCESS__ACCESS_GROUP &&
	       (tpd_session_gid(s) == q->gid || tpd_session_in_group(s, q->gid));
}

/* The named queue @name of @uid, or NULL; *@ret_n: the queues of @uid with their owner (a
 * queue whose owner is gone holds nothing and counts for nobody: owner_gone()). */
static struct wq *wq_find(struct tpd_wqs *ws, uid_t uid, const char *name, uint32_t *ret_n)
{
	struct wq *q, *found = NULL;
	uint32_t n = 0;

	tpu_list_for_each(q, &ws->wqs, node) {
		if (q->uid != uid)
			continue;
		n++;
		if (strcmp(q->name, name) == 0)
			found = q;
	}
	*ret_n = n;
	return found;
}

/* Queues alive that far daemon account @creator (tpd_peer_account()) made here, named or not. */
static uint32_t creator_count(const struct tpd_wqs *ws, const char *creator)
{
	const struct tpu_list *lists[] = { &ws->wqs, &ws->gone };
	const struct wq *q;
	uint32_t n = 0;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(lists); i++)
		tpu_list_for_each(q, lists[i], node)
			n += q->creator && strcmp(q->creator, creator) == 0;
	return n;
}

/* May the far daemon of @pr open @q as a worker? On the queue's remote access and the link's
 * authenticated identity only, as for a listener (tpd_listener_permits_remote()). */
static bool wq_permits_remote(const struct wq *q, const struct tpd_peer *pr)
{
	switch (q->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER:
		return true;
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS:
		for (size_t i = 0; tpd_peer_identity(pr) && i < q->n_remote_peers; i++)
			if (tpd_peer_identity_matches(q->remote_peers[i], pr))
				return true;
		return false;
	default:
		return false;
	}
}

static bool who_same(const struct wq_who *a, const struct wq_who *b)
{
	return a->s == b->s && a->pr == b->pr;
}

/* The session or peer link a handle of @who belongs to (tpd_handix). */
static const void *who_key(const struct wq_who *who)
{
	return who->s ? (const void *)who->s : (const void *)who->pr;
}

static unsigned who_handles(const struct tpd_wqs *ws, const struct wq_who *who)
{
	return tpd_handix_count(&ws->ix, who_key(who));
}

/* @o's remote access into @q (validated). Return: 0 or -ENOMEM (@q unchanged then). */
static int wq_set_remote(struct wq *q, const Tpw__V1__WqOp *o)
{
	int r = tpu_strv_dup(o->remote_peers, o->n_remote_peers, TPW_REMOTE_PEERS_MAX,
			     TPW_NAME_MAX, &q->remote_peers);

	if (r < 0)
		return r;
	q->n_remote_peers = o->n_remote_peers;
	q->remote = o->remote ? o->remote : TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	return 0;
}

/* A new queue @o->name of @uid with @o's flags (validated). Return: owned by @ws, or NULL
 * without memory. */
static struct wq *wq_create(struct tpd_wqs *ws, uid_t uid, const Tpw__V1__WqOp *o)
{
	struct wq *q = calloc(1, sizeof(*q));

	if (!q || !(q->name = strdup(o->name))) {
		free(q);
		return NULL;
	}
	tpu_list_init(&q->node);
	tpu_list_init(&q->queued);
	tpu_list_init(&q->taken);
	tpu_list_init(&q->answers);
	tpu_list_init(&q->held);
	if (wq_set_remote(q, o) < 0) {
		wq_free(q);
		return NULL;
	}
	q->uid = uid;
	q->access = o->access ? o->access : TPW__V1__ACCESS__ACCESS_OWNER;
	q->gid = o->gid;
	q->at_most_once = o->at_most_once;
	q->ws = ws;
	tpu_list_init(&q->waits);
	tpu_list_insert_tail(&ws->wqs, &q->node);
	return q;
}

/* A new handle of @who on @q. Return: owned by @ws (handle_free()), or NULL without memory. */
static struct wq_handle *handle_new(struct tpd_wqs *ws, const struct wq_who *who, struct wq *q)
{
	struct wq_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->who = *who;
	h->id = ++ws->next_id;
	if (tpd_handix_add(&ws->ix, h->id, who_key(who), h) < 0) {
		free(h);
		return NULL;
	}
	h->q = q;
	if (!q->owner && !q->n_handles)
		q->owner = h; /* the creator's handle */
	q->n_handles++;
	tpu_list_insert_tail(&ws->handles, &h->node);
	return h;
}

/* The local uid that queues created from other hosts belong to (chan-remote-create-uid, as
 * for channels) if link @pr may create them here (an authenticated one), else 0. A far daemon
 * of peer minor 6 or older sends create with a worker's open and tells its client it is no
 * owner: it gets what it asked for then, a worker's handle of an existing queue only. */
static uid_t remote_creator(const struct tpd_wqs *ws, const struct tpd_peer *pr)
{
	if (tpd_peer_chan_far_minor(pr) < TPW_PEER_MINOR_WQ_CREATE)
		return 0;
	return tpd_peer_identity(pr) ? tpd_daemon_cfg(ws->d)->chan_remote_create_uid : 0;
}

/*
 * Creates queue @o->name of uid @creator for the far daemon of @who's link, whose handle is its
 * owner, with @o's flags as a local creator of that uid gets them and within that uid's
 * wqs-per-uid (@n: its queues now); its remote access admits that link always. Answers @o.
 */
static void op_create_remote(struct tpd_wqs *ws, const struct wq_who *who, const Tpw__V1__WqOp *o,
			     uid_t creator, uint32_t n)
{
	const char *id = tpd_peer_identity(who->pr);
	char *peers[TPW_REMOTE_PEERS_MAX + 1], acct[TPD_PEER_ACCOUNT_LEN];
	const char *account = tpd_peer_account(who->pr, acct);
	Tpw__V1__WqOp co = *o;
	struct wq_ans a = { 0 };
	struct wq_handle *h;
	unsigned held;
	struct wq *q;

	if (who_handles(ws, who) >= WQ_HANDLES_PER_SESSION)
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "this peer link has 1024 work queue "
				     "handles here" };
	else if (n >= tpd_daemon_cfg(ws->d)->wqs_per_uid)
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "the uid of chan-remote-create-uid has "
				     "wqs-per-uid work queues already" };
	else if (!account) /* remote_creator() admits authenticated links only */
		a = (struct wq_ans){ .err = -EACCES, .why = "the link is not authenticated" };
	else if (creator_count(ws, account) >= tpd_daemon_cfg(ws->d)->chan_remote_create_per_peer)
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "this host has created "
				     "chan-remote-create-per-peer work queues here already" };
	if (a.err < 0)
		return tpd_wq_send(NULL, who, o->req_id, &a);
	tpd_chanx_admit_link(who->pr, id, &co.remote, &co.remote_peers, &co.n_remote_peers, peers);
	q = wq_create(ws, creator, &co);
	if (q && !(q->creator = strdup(account))) {
		wq_free(q);
		q = NULL;
	}
	h = q ? handle_new(ws, who, q) : NULL;
	if (!h) {
		if (q)
			wq_free(q);
		a = (struct wq_ans){ .err = -ENOMEM, .why = "out of memory" };
		return tpd_wq_send(NULL, who, o->req_id, &a);
	}
	if (tpd_peer_log_ok(who->pr, &held)) /* the peer creates and releases at will */
		tpu_log_info("peer %s: created work queue '%s' of uid %u, owned from there (%u "
			     "lines about this peer not logged before this one)",
			     tpd_peer_name(who->pr), q->name, (unsigned)q->uid, held);
	tpd_wq_send(h, who, o->req_id, &a);
}

/*
 * OPEN from another host's daemon: a worker's handle of an existing queue whose remote access
 * admits the link, or, with create on a daemon whose chan-remote-create-uid names a uid and over
 * an authenticated link, a new queue of that uid (looked up under it unless the op names its
 * owner) owned by the link's handle (peer minor >= 8). A queue that does not admit the link is,
 * to the far daemon, no queue at all (the same status and text), so that names cannot be probed
 * from other hosts.
 */
static void op_open_remote(struct tpd_wqs *ws, const struct wq_who *who, const Tpw__V1__WqOp *o)
{
	uid_t creator = o->create ? remote_creator(ws, who->pr) : 0;
	uid_t owner = o->owner_set ? o->owner_uid : creator ? creator : who->uid;
	struct wq_ans a = { 0 };
	struct wq_handle *h;
	char why[260];
	uint32_t n;
	struct wq *q = wq_find(ws, owner, o->name, &n);

	if (!q && creator && owner == creator)
		return op_create_remote(ws, who, o, creator, n);
	if (!q || q->gone || !wq_permits_remote(q, who->pr)) {
		snprintf(why, sizeof(why), "no work queue '%.64s' of uid %u on %.60s accepts "
			 "handles from other hosts%s", o->name, (unsigned)owner,
			 tpd_peers_hostname(ws->d), !o->create || creator ? "" : ", and it creates "
			 "none for other hosts (chan-remote-create-uid)");
		a = (struct wq_ans){ .err = -ENOENT, .why = why };
	} else if (o->create && o->exclusive) {
		a = (struct wq_ans){ .err = -EADDRINUSE, .why = "the work queue exists" };
	} else if (who_handles(ws, who) >= WQ_HANDLES_PER_SESSION) {
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "this peer link has 1024 work queue "
				     "handles here" };
	}
	if (a.err < 0)
		return tpd_wq_send(NULL, who, o->req_id, &a);
	h = handle_new(ws, who, q);
	if (!h) {
		a = (struct wq_ans){ .err = -ENOMEM, .why = "out of memory" };
		return tpd_wq_send(NULL, who, o->req_id, &a);
	}
	tpd_wq_send(h, who, o->req_id, &a);
}

static void op_open(struct tpd_wqs *ws, const struct wq_who *who, const Tpw__V1__WqOp *o)
{
	struct tpd_session *s = who->s;
	uid_t owner = o->owner_set ? o->owner_uid : tpd_session_uid(s);
	struct wq_ans a = { 0 };
	struct wq_handle *h;
	uint32_t n;
	struct wq *q = wq_find(ws, owner, o->name, &n);

	a.err = -ENOENT;
	a.why = "no such work queue";
	/* A queue whose access mode refuses the caller is, to it, no queue at all (the same
	 * status and text, TP_WQ_EXCL included): another uid's private names cannot be probed. */
	if (q && !wq_permits(q, s))
		q = NULL;
	if (q && o->create && o->exclusive)
		a = (struct wq_ans){ .err = -EADDRINUSE, .why = "the work queue exists" };
	else if (!q && (!o->create || owner != tpd_session_uid(s)))
		;
	else if (who_handles(ws, who) >= WQ_HANDLES_PER_SESSION)
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "this session has 1024 work queue "
				     "handles" };
	else if (!q && n >= tpd_daemon_cfg(ws->d)->wqs_per_uid)
		a = (struct wq_ans){ .err = -ENOBUFS, .why = "this uid has wqs-per-uid work queues "
				     "already" };
	else
		a.err = 0;
	if (a.err < 0)
		return tpd_wq_send(NULL, who, o->req_id, &a);
	if (!q && !(q = wq_create(ws, tpd_session_uid(s), o))) {
		a = (struct wq_ans){ .err = -ENOMEM, .why = "out of memory" };
		return tpd_wq_send(NULL, who, o->req_id, &a);
	}
	h = handle_new(ws, who, q);
	if (!h) {
		if (!q->n_handles)
			wq_free(q);
		a = (struct wq_ans){ .err = -ENOMEM, .why = "out of memory" };
		return tpd_wq_send(NULL, who, o->req_id, &a);
	}
	a = (struct wq_ans){ 0 };
	tpd_wq_send(h, who, o->req_id, &a);
}

static void op_submit(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
		      const uint8_t *tail, size_t len)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(ws->d);
	struct wq *q = h->q;
	struct wq_ans a = { 0 };
	struct wq_body *b;
	struct wq_item *it;
	char why[240];
	int r;

	if (q->owner != h)
		return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner submits");
	if (q->closed)
		return tpd_wq_err(h, o->req_id, -EPIPE, "the work queue is closed");
	if ((uint64_t)q->n_queued + q->n_taken + q->n_answers + q->n_held + q->n_arriving >=
	    cfg->wq_questions_max)
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "the work queue holds wq-questions-max "
				  "questions: receive answers first");
	r = tpd_wq_msg_body_new(ws, o, tail, len, &b, why, sizeof(why));
	if (r < 0)
		return tpd_wq_err(h, o->req_id, r, why);
	if (q->bytes + tpd_wq_msg_body_charge(b) > cfg->wq_bytes_max) {
		tpd_wq_msg_body_unref(b);
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "the work queue holds wq-bytes-max "
				  "question bytes");
	}
	if (o->segment || o->stream_len) /* by reference: queued once copied in */
		return tpd_wq_msg_copy_in(ws, h, o, b, NULL);
	it = tpd_wq_item_new(++q->next_qid, b);
	if (!it)
		return tpd_wq_err(h, o->req_id, -ENOMEM, "out of memory");
	tpu_list_insert_tail(&q->queued, &it->node);
	q->n_queued++;
	q->bytes += tpd_wq_msg_body_charge(b);
	a.qid = it->id;
	tpd_wq_send(h, &h->who, o->req_id, &a);
	tpd_wq_serve(q);
}

/* Moves question @it (taken) to the answers as @ans (an answer item of the same id). */
void tpd_wq_question_answered(struct wq *q, struct wq_item *it, struct wq_item *ans)
{
	tpu_list_remove(&it->node);
	q->n_taken--;
	q->bytes -= it->b ? tpd_wq_msg_body_charge(it->b) : 0;
	tpd_wq_item_free(it);
	tpu_list_insert_tail(&q->answers, &ans->node);
	q->n_answers++;
	q->answer_bytes += ans->b ? tpd_wq_msg_body_charge(ans->b) : 0;
	q->answered++;
}

static void op_reply(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
		     const uint8_t *tail, size_t len)
{
	struct wq *q = h->q;
	struct wq_item *it, *found = NULL, *ans;
	struct wq_body *b;
	char why[240];
	int r;

	if (q->gone)
		return tpd_wq_err(h, o->req_id, -EPIPE, "the work queue's owner is gone");
	tpu_list_for_each(it, &q->taken, node)
		if (it->id == o->question_id && it->taker == h)
			found = it;
	if (!found) {
		snprintf(why, sizeof(why), "this handle did not take question %llu",
			 (unsigned long long)o->question_id);
		return tpd_wq_err(h, o->req_id, -ENOENT, why);
	}
	if (found->replying)
		return tpd_wq_err(h, o->req_id, -EBUSY, "a reply to this question is being copied "
				  "in");
	r = tpd_wq_msg_body_new(ws, o, tail, len, &b, why, sizeof(why));
	if (r < 0)
		return tpd_wq_err(h, o->req_id, r, why);
	if (q->owner && !tpd_wq_fits_link(q->owner, tpd_wq_msg_body_len(b),
					  tpd_wq_msg_body_msg(b), "an answer", why, sizeof(why))) {
		tpd_wq_msg_body_unref(b);
		return tpd_wq_err(h, o->req_id, -EMSGSIZE, why); /* the question stays taken */
	}
	if (q->answer_bytes + tpd_wq_msg_body_charge(b) >
	    tpd_daemon_cfg(ws->d)->wq_answer_bytes_max) {
		tpd_wq_msg_body_unref(b);
		return tpd_wq_err(h, o->req_id, -ENOBUFS, "the work queue holds "
				  "wq-answer-bytes-max answer bytes: the question stays taken");
	}
	if (o->segment || o->stream_len)
		return tpd_wq_msg_copy_in(ws, h, o, b, found);
	ans = tpd_wq_item_new(found->id, b);
	if (!ans)
		return tpd_wq_err(h, o->req_id, -ENOMEM, "out of memory");
	tpd_wq_question_answered(q, found, ans);
	tpd_wq_err(h, o->req_id, 0, NULL);
	tpd_wq_serve(q);
}

static void op_take(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o)
{
	struct wq *q = h->q;
	const struct wq_wait *w;
	bool earlier = false;

	if (o->msg_read)
		return tpd_wq_msg_read(ws, h, o);
	tpu_list_for_each(w, &q->waits, node)
		earlier |= w->kind == WAIT_TAKE;
	if (q->n_queued && !earlier)
		return deliver_question(h, o->req_id, o->msg);
	if (!q->n_queued && (q->closed || q->gone))
		return tpd_wq_err(h, o->req_id, -EPIPE, "the work queue is closed");
	wait_add(ws, h, o->req_id, WAIT_TAKE, o->msg, o->timeout_ms);
}

static void op_answer(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o)
{
	struct wq *q = h->q;
	const struct wq_wait *w;
	bool earlier = false;

	if (q->owner != h)
		return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner receives "
				  "answers");
	if (o->msg_read)
		return tpd_wq_msg_read(ws, h, o);
	if (o->msg_drop)
		return tpd_wq_msg_drop(h, o);
	tpu_list_for_each(w, &q->waits, node)
		earlier |= w->kind == WAIT_ANSWER;
	if (q->n_answers && !earlier)
		return deliver_answer(h, o->req_id, o->msg);
	if (!q->n_answers && !q->n_queued && !q->n_taken)
		return wq_idle(h, o->req_id);
	wait_add(ws, h, o->req_id, WAIT_ANSWER, o->msg, o->timeout_ms);
}

static void op_drain(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o)
{
	struct wq *q = h->q;

	if (q->owner != h)
		return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner drains it");
	if (!q->n_queued && !q->n_taken)
		return tpd_wq_err(h, o->req_id, 0, NULL);
	wait_add(ws, h, o->req_id, WAIT_DRAIN, false, o->timeout_ms);
}

/*
 * The owner of @q goes (its session ended, it released its handle, or the link of a remote
 * owner failed): @q is closed and loses its name; its queued and taken questions and the
 * answers nobody will receive are dropped (the answers counted), so that the workers' handles
 * that keep it hold no payload and no slot of any uid's wqs-per-uid: a queue without its owner
 * is freed with its last handle, whoever holds it.
 */
static void owner_gone(struct wq *q)
{
	if (q->n_answers)
		tpu_log_info("work queue '%s' of uid %u: its owner is gone, %u answers for it "
			     "dropped", q->name, (unsigned)q->uid, q->n_answers);
	q->ws->answers_dropped += q->n_answers + q->n_held;
	q->owner = NULL;
	q->gone = q->closed = true;
	tpu_list_remove(&q->node); /* the name is free again, and the uid's slot */
	tpu_list_insert_tail(&q->ws->gone, &q->node);
	items_free(&q->queued);
	items_free(&q->taken); /* their replies are refused from now on (-EPIPE) */
	items_free(&q->answers);
	items_free(&q->held);
	/* Copies in still running find the queue gone and drop what they carry. */
	q->n_queued = q->n_taken = q->n_answers = q->n_held = q->n_arriving = 0;
	q->bytes = q->answer_bytes = 0;
}

/* @h's session ends or it releases @h: its taken questions are queued again at the head (or,
 * at-most-once, answered with STATUS_PEER_DIED), its waits go (answered -ECANCELED when
 * @answer), and an owner's end closes the queue, fails the workers' waits and frees what it
 * holds. */
static void handle_free(struct wq_handle *h, bool answer)
{
	struct wq *q = h->q;
	struct wq_item *it, *tmp;
	struct wq_wait *w, *wtmp;
	struct tpu_list back = TPU_LIST_INIT(back);

	tpu_list_for_each_safe(w, wtmp, &q->waits, node) {
		if (w->h != h)
			continue;
		if (answer)
			tpd_wq_err(h, w->req_id, -ECANCELED, "the handle was released");
		wait_free(w);
	}
	tpu_list_for_each_safe(it, tmp, &q->taken, node) {
		if (it->taker != h)
			continue;
		tpu_list_remove(&it->node);
		q->n_taken--;
		it->taker = NULL;
		it->replying = false; /* a reply being copied in finds it no longer this handle's */
		if (q->at_most_once) {
			q->bytes -= it->b ? tpd_wq_msg_body_charge(it->b) : 0;
			tpd_wq_msg_body_unref(it->b); /* a copy out still running keeps its own */
			it->b = NULL;
			it->status = TPW__V1__STATUS__STATUS_PEER_DIED;
			tpu_list_insert_tail(&q->answers, &it->node);
			q->n_answers++;
			q->answered++;
		} else {
			tpu_list_insert_tail(&back, &it->node);
			q->n_queued++;
			q->requeued++;
		}
	}
	tpu_list_splice_head(&q->queued, &back); /* first in line again, in their order */
	if (q->owner == h)
		owner_gone(q);
	tpd_handix_del(&q->ws->ix, h->id, who_key(&h->who));
	tpu_list_remove(&h->node);
	q->n_handles--;
	free(h);
	tpd_wq_serve(q);
	tpd_wq_maybe_free(q);
}

void tpd_wq_maybe_free(struct wq *q)
{
	if (q->n_handles == 0 && q->n_copies == 0)
		wq_free(q);
}

struct wq_handle *tpd_wq_handle_by_id(struct tpd_wqs *ws, uint64_t id)
{
	return tpd_handix_get(&ws->ix, id);
}

static void handle_op(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
		      const uint8_t *tail, size_t tail_len);

static struct wq_handle *handle_find(struct tpd_wqs *ws, const struct wq_who *who, uint64_t id)
{
	struct wq_handle *x = tpd_handix_get(&ws->ix, id);

	return x && who_same(&x->who, who) ? x : NULL;
}

static void wq_on_op(struct tpd_session *s, const Tpw__V1__WqOp *o, const uint8_t *tail,
		     size_t tail_len)
{
	struct tpd_daemon *d = tpd_session_daemon(s);
	struct tpd_wqs *ws = tpd_daemon_wqs(d);
	const struct wq_who who = { .s = s };
	struct wq_ans a = { .err = -ENOENT, .why = "no such work queue handle" };
	struct wq_handle *h;

	if (o->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN && tpd_chanx_is_address(o->name))
		return tpd_chanx_wq_open(tpd_chan_x(tpd_daemon_chans(d)), s, o);
	if (o->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN)
		return op_open(ws, &who, o);
	h = handle_find(ws, &who, o->wq_id);
	if (!h && tpd_chanx_wq_op(tpd_chan_x(tpd_daemon_chans(d)), s, o, tail, tail_len))
		return; /* a handle of a queue on another host: forwarded */
	if (!h)
		return tpd_wq_send(NULL, &who, o->req_id, &a);
	handle_op(ws, h, o, tail, tail_len);
}

/* Waits (takes, answer reads, drains) the handles of @pr's peer hold here, over any of its
 * links (tpd_peer_same()): counted per link as they start and end (each call walked every
 * handle of every user). */
static uint32_t peer_waits(const struct tpd_wqs *ws, const struct tpd_peer *pr)
{
	return tpd_handix_peer_waits(&ws->ix, pr, tpd_peer_same);
}

void tpd_wq_peer_op(struct tpd_wqs *ws, struct tpd_peer *pr, const Tpw__V1__PeerWqOp *po,
		    const uint8_t *tail, size_t tail_len)
{
	const struct wq_who who = { .pr = pr, .uid = po->uid };
	const Tpw__V1__WqOp *o = po->op;
	uint32_t max = tpd_daemon_cfg(ws->d)->chan_peer_ops_max;
	struct wq_ans a = { .err = -ENOENT, .why = "no such work queue handle" };
	struct wq_handle *h;
	char why[160];

	if (o->op == TPW__V1__WQ_OP_KIND__WQ_OP_OPEN)
		return op_open_remote(ws, &who, o);
	h = handle_find(ws, &who, o->wq_id);
	if (!h)
		return tpd_wq_send(NULL, &who, o->req_id, &a);
	if ((o->op == TPW__V1__WQ_OP_KIND__WQ_OP_TAKE ||
	     o->op == TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER ||
	     o->op == TPW__V1__WQ_OP_KIND__WQ_OP_DRAIN) && o->timeout_ms &&
	    peer_waits(ws, pr) >= max) {
		snprintf(why, sizeof(why), "%u work queue ops of this peer wait on %.60s "
			 "(chan-peer-ops-max)", max, tpd_peers_hostname(ws->d));
		return tpd_wq_err(h, o->req_id, -ENOBUFS, why);
	}
	handle_op(ws, h, o, tail, tail_len);
}

void tpd_wq_peer_gone(struct tpd_wqs *ws, struct tpd_peer *pr)
{
	struct wq_handle *h, *tmp;

	tpu_list_for_each_safe(h, tmp, &ws->handles, node)
		if (h->who.pr == pr)
			handle_free(h, false);
}

void tpd_wq_counts(const struct tpd_wqs *ws, struct tpd_wq_counts *ret)
{
	const struct tpu_list *lists[] = { &ws->wqs, &ws->gone };
	struct tpd_wq_counts c = { .answers_dropped = ws->answers_dropped };
	const struct wq *q;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(lists); i++)
		tpu_list_for_each(q, lists[i], node) {
			c.queues++;
			c.ownerless += !q->owner;
			c.questions += (uint64_t)q->n_queued + q->n_taken;
			c.answers += (uint64_t)q->n_answers + q->n_held;
			c.bytes += q->bytes + q->answer_bytes;
		}
	*ret = c;
}

uint64_t tpd_wq_new_id(struct tpd_wqs *ws)
{
	return ++ws->next_id;
}

static void handle_op(struct tpd_wqs *ws, struct wq_handle *h, const Tpw__V1__WqOp *o,
		      const uint8_t *tail, size_t tail_len)
{
	switch (o->op) {
	case TPW__V1__WQ_OP_KIND__WQ_OP_SUBMIT:
		return op_submit(ws, h, o, tail, tail_len);
	case TPW__V1__WQ_OP_KIND__WQ_OP_ANSWER:
		return op_answer(ws, h, o);
	case TPW__V1__WQ_OP_KIND__WQ_OP_TAKE:
		return op_take(ws, h, o);
	case TPW__V1__WQ_OP_KIND__WQ_OP_REPLY:
		return op_reply(ws, h, o, tail, tail_len);
	case TPW__V1__WQ_OP_KIND__WQ_OP_DRAIN:
		return op_drain(ws, h, o);
	case TPW__V1__WQ_OP_KIND__WQ_OP_CLOSE:
		if (h->q->owner != h)
			return tpd_wq_err(h, o->req_id, -EACCES, "only the work queue's owner "
					  "closes it");
		h->q->closed = true; /* idempotent */
		tpd_wq_err(h, o->req_id, 0, NULL);
		return tpd_wq_serve(h->q);
	case TPW__V1__WQ_OP_KIND__WQ_OP_RELEASE:
		tpd_wq_err(h, o->req_id, 0, NULL);
		return handle_free(h, true);
	default:
		return; /* validation refuses other ops */
	}
}

static void wq_on_session_end(struct tpd_session *s)
{
	struct tpd_wqs *ws = tpd_daemon_wqs(tpd_session_daemon(s));
	struct wq_handle *h, *tmp;

	tpu_list_for_each_safe(h, tmp, &ws->handles, node)
		if (h->who.s == s)
			handle_free(h, false);
}

static const struct tpd_local_wq_ops wq_local_ops = {
	.op = wq_on_op,
	.session_end = wq_on_session_end,
};

void tpd_wq_serve_local(struct tpd_local *l)
{
	tpd_local_set_wq_ops(l, &wq_local_ops);
}

int tpd_wq_new(struct tpd_daemon *d, struct tpd_wqs **ret)
{
	struct tpd_wqs *ws = calloc(1, sizeof(*ws));

	if (!ws)
		return -ENOMEM;
	ws->d = d;
	tpu_list_init(&ws->wqs);
	tpu_list_init(&ws->gone);
	tpu_list_init(&ws->handles);
	tpd_handix_init(&ws->ix);
	*ret = ws;
	return 0;
}

void tpd_wq_free(struct tpd_wqs *ws)
{
	struct wq_handle *h, *tmp;

	if (!ws)
		return;
	tpu_list_for_each_safe(h, tmp, &ws->handles, node)
		handle_free(h, false); /* the last handle of a queue frees it */
	tpd_handix_done(&ws->ix);
	free(ws);
}

int tpd_wq_ctl(struct tpd_wqs *ws, bool own_only, uid_t viewer, Tpw__V1__CtlQueue ***ret,
	       size_t *n)
{
	Tpw__V1__CtlQueue **v = NULL;
	const struct wq *q;
	const struct wq_handle *h;
	size_t k = 0, cap = 0;

	tpu_list_for_each(q, &ws->wqs, node)
		cap++;
	if (cap && !(v = calloc(cap, sizeof(*v))))
		return -ENOMEM;
	tpu_list_for_each(q, &ws->wqs, node) {
		Tpw__V1__CtlQueue *x;

		if (own_only && q->uid != viewer)
			continue;
		x = calloc(1, sizeof(*x));
		if (x)
			tpw__v1__ctl_queue__init(x);
		if (!x || !(x->name = strdup(q->name))) {
			free(x);
			tpd_wq_ctl_free(v, k);
			return -ENOMEM;
		}
		x->uid = q->uid;
		x->access = q->access;
		x->gid = q->gid;
		x->state = (char *)(q->closed ? "closed" : "open");
		x->queued = q->n_queued;
		x->taken = q->n_taken;
		x->answers = q->n_answers + q->n_held;
		x->answered = q->answered;
		x->workers = q->n_handles - (q->owner ? 1 : 0);
		x->bytes = q->bytes;
		x->answer_bytes = q->answer_bytes;
		x->at_most_once = q->at_most_once;
		x->requeued = q->requeued;
		x->remote = q->remote;
		x->created_by = q->creator ? q->creator : (char *)"";
		tpu_list_for_each(h, &ws->handles, node)
			x->remote_workers += h->q == q && h->who.pr && h != q->owner;
		if (q->owner && q->owner->who.s)
			x->owner_pid = (uint32_t)tpd_session_pid(q->owner->who.s);
		else if (q->owner) /* the peer's name lives as long as its link, past this call */
			x->owner_host = (char *)tpd_peer_name(q->owner->who.pr);
		v[k++] = x;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_wq_ctl_free(Tpw__V1__CtlQueue **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i]->name);
		free(v[i]);
	}
	free(v);
}
