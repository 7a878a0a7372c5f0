/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Named channels hosted by the daemon (chan.h). Responsible for the channel registry, the
 * limits per uid and per channel, handles per session and per peer link, OPEN and UNLINK from
 * local clients and other hosts, the ops' entry (the session's and the peer link's, CLOSE and
 * RELEASE) and the rows of tpipctl channels. Leaves the items, the daemon's spare buffers and
 * the buffers writers lend to chanitem.c, and WRITE and READ (waiting readers and writers,
 * deadlines, which item goes inline, into a reader's allocation or held for a reader) to
 * chanio.c; items that do not ride inline are copied by chancopy.c. Not responsible for
 * sessions or frames (local/). Everything runs on the daemon's loop thread.
 */
#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <event2/event.h>

#include "chan_int.h"
#include "chanx.h"
#include "config.h"
#include "core.h"
#include "local.h"
#include "peer.h"
#include "session.h"
#include "tpu.h"
#include "validate.h"

static struct tpd_chans *chans_of(struct tpd_session *s)
{
	return tpd_daemon_chans(tpd_session_daemon(s));
}

/* Sends @r (its @n_lengths items in @tail, @n_tail pieces: one at most to a peer link). */
void tpd_chan_reply_send(const struct chan_who *who, Tpw__V1__ChanReply *r,
			 const struct iovec *tail, size_t n_tail)
{
	Tpw__V1__DaemonMsg m = TPW__V1__DAEMON_MSG__INIT;

	if (who->pr)
		return tpd_chanx_reply(who->pr, r, tail, n_tail);
	m.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	m.chan_reply = r;
	tpd_session_send(who->s, &m, n_tail ? tail : NULL, (int)n_tail);
}

void tpd_chan_answer(const struct chan_who *who, uint64_t req_id, int err, const char *why,
		     uint64_t id, bool closed, const struct chan_item *it)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	struct iovec tail;
	uint64_t len;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(err);
	r.message = (char *)(why ? why : "");
	r.chan_id = id;
	r.closed = closed;
	if (it) {
		len = it->len;
		r.n_lengths = 1;
		r.lengths = &len;
		tail.iov_base = (void *)tpd_chan_item_bytes(it);
		tail.iov_len = it->len;
	}
	tpd_chan_reply_send(who, &r, &tail, it ? 1 : 0);
}

/* Answers a read with the length of an item it did not get: held for it (@err 0), or too large
 * for its allocation (@err -EMSGSIZE). */
void tpd_chan_answer_len(const struct chan_handle *h, uint64_t req_id, int err,
			 const char *why, uint64_t len)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(err);
	r.message = (char *)(why ? why : "");
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.held_len = len;
	tpd_chan_reply_send(&h->who, &r, NULL, 0);
}

/* The bytes of buffers @uid's writers lend to channels (any uid's): its entry in @cs (@add: made
 * if missing), or NULL. */
uint64_t *tpd_chan_lent_of(struct tpd_chans *cs, uid_t uid, bool add)
{
	struct chan_lent_uid *v;

	for (size_t i = 0; i < cs->n_lent; i++)
		if (cs->lent[i].uid == uid)
			return &cs->lent[i].bytes;
	if (!add)
		return NULL;
	if (cs->n_lent == cs->cap_lent) {
		v = realloc(cs->lent, (cs->cap_lent * 2 + 4) * sizeof(*v));
		if (!v)
			return NULL;
		cs->lent = v;
		cs->cap_lent = cs->cap_lent * 2 + 4;
	}
	cs->lent[cs->n_lent] = (struct chan_lent_uid){ .uid = uid };
	return &cs->lent[cs->n_lent++].bytes;
}

/* The key of a payer in tpd_chans.payers: a local @uid + 1 (never 0, bit 63 clear), or for a
 * far daemon's @account FNV-1a of it with bit 63 set. */
static uint64_t payer_hkey(bool remote, uid_t uid, const char *account)
{
	uint64_t h = 0xcbf29ce484222325ull;

	if (!remote)
		return (uint64_t)uid + 1;
	for (const unsigned char *c = (const unsigned char *)account; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	return h | (1ull << 63);
}

/* The payer of local @uid (!@remote) or of far @account. Return: borrowed, or NULL. */
static struct chan_payer *payer_lookup(const struct tpd_chans *cs, bool remote, uid_t uid,
				       const char *account)
{
	struct chan_payer *p = tpu_hmap_get(&cs->payers, payer_hkey(remote, uid, account));

	for (; p; p = p->next)
		if (p->remote == remote &&
		    (remote ? strcmp(p->account, account) == 0 : p->uid == uid))
			return p;
	return NULL;
}

/* Bytes @uid pays for (the items its writes put in any channel, named or unlinked and still
 * alive, the writes it has waiting for room, and the buffers its writers lend, whole); the
 * number of channels @uid owns in *@ret_count. */
uint64_t tpd_chan_uid_bytes(const struct tpd_chans *cs, uid_t uid, uint32_t *ret_count)
{
	const uint64_t *lent = tpd_chan_lent_of((struct tpd_chans *)cs, uid, false);
	const struct tpu_list *lists[] = { &cs->chans, &cs->unlinked };
	const struct chan_payer *p;
	const struct chan *c;
	uint64_t b = lent ? *lent : 0;
	uint32_t n = 0;

	p = payer_lookup(cs, false, uid, NULL);
	b += p ? p->bytes : 0;
	for (size_t i = 0; ret_count && i < TPU_ARRAY_SIZE(lists); i++)
		tpu_list_for_each(c, lists[i], node)
			n += c->uid == uid;
	if (ret_count)
		*ret_count = n;
	return b;
}

/* The channels the far daemon of account @creator created here, named or unlinked and kept. */
uint32_t tpd_chan_creator_count(const struct tpd_chans *cs, const char *creator)
{
	const struct tpu_list *lists[] = { &cs->chans, &cs->unlinked };
	const struct chan *c;
	uint32_t n = 0;

	for (size_t i = 0; i < TPU_ARRAY_SIZE(lists); i++)
		tpu_list_for_each(c, lists[i], node)
			n += c->creator && strcmp(c->creator, creator) == 0;
	return n;
}

/* The key of @who's payer: a local session's uid, or a peer link's account (in @acct,
 * TPD_PEER_ACCOUNT_LEN bytes; "" for a link without authentication). Return: whether remote. */
static bool payer_key(const struct chan_who *who, uid_t *uid, const char **account, char *acct)
{
	if (who->s) {
		*uid = tpd_session_uid(who->s);
		*account = NULL;
		return false;
	}
	*uid = 0;
	*account = tpd_peer_account(who->pr, acct);
	if (!*account)
		*account = "";
	return true;
}

static struct chan_payer *payer_find(const struct tpd_chans *cs, const struct chan_who *who)
{
	char acct[TPD_PEER_ACCOUNT_LEN];
	const char *account;
	uid_t uid;
	bool remote = payer_key(who, &uid, &account, acct);

	return payer_lookup(cs, remote, uid, account);
}

struct chan_payer *tpd_chan_payer_get(struct tpd_chans *cs, const struct chan_who *who)
{
	char acct[TPD_PEER_ACCOUNT_LEN];
	struct chan_payer *p = payer_find(cs, who), *head;
	const char *account;

	if (p) {
		p->refs++;
		return p;
	}
	p = calloc(1, sizeof(*p));
	if (!p)
		return NULL;
	p->remote = payer_key(who, &p->uid, &account, acct);
	if (p->remote && !(p->account = strdup(account))) {
		free(p);
		return NULL;
	}
	p->refs = 1;
	p->cs = cs;
	p->key = payer_hkey(p->remote, p->uid, p->account);
	head = tpu_hmap_get(&cs->payers, p->key);
	if (head) { /* another account of the same hash: chained behind it */
		p->next = head->next;
		head->next = p;
	} else if (tpu_hmap_put(&cs->payers, p->key, p) < 0) {
		free(p->account);
		free(p);
		return NULL;
	}
	return p;
}

void tpd_chan_payer_ref(struct chan_payer *p)
{
	p->refs++;
}

/* Drops a reference to @p (may be NULL); the last one frees it (it pays for nothing then). */
void tpd_chan_payer_unref(struct chan_payer *p)
{
	struct chan_payer *head;
	int r;

	if (!p || --p->refs)
		return;
	assert(p->bytes == 0);
	head = tpu_hmap_get(&p->cs->payers, p->key);
	if (head == p) {
		tpu_hmap_del(&p->cs->payers, p->key);
		/* (no growth: the map held one more key a moment ago) */
		r = p->next ? tpu_hmap_put(&p->cs->payers, p->key, p->next) : 0;
		assert(r == 0);
		(void)r;
	} else {
		while (head && head->next != p)
			head = head->next;
		assert(head);
		head->next = p->next;
	}
	free(p->account);
	free(p);
}

void tpd_chan_payer_charge(struct chan_payer *p, int64_t delta)
{
	assert(delta >= 0 || p->bytes >= (uint64_t)-delta);
	p->bytes += (uint64_t)delta;
	if (p->remote)
		p->cs->remote_bytes += (uint64_t)delta;
}

const char *tpd_chan_over_bytes(const struct chan *c, const struct chan_who *who,
				uint64_t bytes)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(c->cs->d);
	const struct chan_payer *p;

	if (who->s)
		return tpd_chan_uid_bytes(c->cs, tpd_session_uid(who->s), NULL) + bytes >
		       cfg->chan_bytes_per_uid ? "the writer's chan-bytes-per-uid is spent" : NULL;
	p = payer_find(c->cs, who);
	if ((p ? p->bytes : 0) + bytes > cfg->chan_remote_bytes_per_peer)
		return "this host's chan-remote-bytes-per-peer is spent";
	if (c->cs->remote_bytes + bytes > cfg->chan_bytes_per_uid)
		return "the chan-bytes-per-uid that far hosts' writes share is spent";
	return NULL;
}

static void chan_free(struct chan *c)
{
	struct chan_item *it, *tmp;

	if (!c)
		return;
	tpu_list_remove(&c->node);
	tpu_list_for_each_safe(it, tmp, &c->items, node) {
		/* Unlinked first: an item kept as a spare buffer is moved by unlinking it, which
		 * would write into the one freed before it. */
		tpu_list_remove(&it->node);
		assert(it->payer); /* admitted: its writer's charge goes now */
		tpd_chan_item_free(c->cs, it);
	}
	tpu_strv_free(c->remote_peers, c->n_remote_peers);
	free(c->creator);
	free(c->name);
	free(c);
}

/* Frees @c once nothing keeps it: no handle, no copy, and neither persistent nor named. */
void tpd_chan_maybe_free(struct chan *c)
{
	if (c->n_handles == 0 && tpu_list_empty(&c->copies) && (!c->persistent || !c->named))
		chan_free(c);
}

/* May the far daemon of @pr open @c for its client? Decided on the channel's remote access and
 * the link's authenticated identity only, as for a listener (tpd_listener_permits_remote()). */
static bool chan_permits_remote(const struct chan *c, const struct tpd_peer *pr)
{
	switch (c->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER:
		return true;
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS:
		for (size_t i = 0; tpd_peer_identity(pr) && i < c->n_remote_peers; i++)
			if (tpd_peer_identity_matches(c->remote_peers[i], pr))
				return true;
		return false;
	default:
		return false;
	}
}

static bool chan_permits(const struct chan *c, const struct tpd_session *s)
{
	uid_t uid = tpd_session_uid(s);

	if (uid == 0 || uid == c->uid || c->access == TPW__V1__ACCESS__ACCESS_ANYONE)
		return true;
	return c->access == TPW__V1__ACCESS__ACCESS_GROUP &&
	       (tpd_session_gid(s) == c->gid || tpd_session_in_group(s, c->gid));
}

static struct chan *chan_find(struct tpd_chans *cs, uid_t uid, const char *name)
{
	struct chan *c;

	tpu_list_for_each(c, &cs->chans, node)
		if (c->uid == uid && strcmp(c->name, name) == 0)
			return c;
	return NULL;
}

static bool who_same(const struct chan_who *a, const struct chan_who *b)
{
	return a->s == b->s && a->pr == b->pr;
}

/* The session or peer link a handle of @who belongs to (tpd_handix). */
static const void *who_key(const struct chan_who *who)
{
	return who->s ? (const void *)who->s : (const void *)who->pr;
}

static struct chan_handle *handle_find(struct tpd_chans *cs, const struct chan_who *who,
				       uint64_t id)
{
	struct chan_handle *h = tpd_handix_get(&cs->ix, id);

	return h && who_same(&h->who, who) ? h : NULL;
}

static void handle_free(struct chan_handle *h, bool answer)
{
	struct chan_wait *w, *tmp;
	struct chan *c = h->c;
	struct chan_lend *l, *ltmp;
	struct chan_copy *cp;

	/* Its lent buffers stay with their items, and nobody is told when they leave. */
	tpu_list_for_each_safe(l, ltmp, &h->lends, node) {
		tpu_list_remove(&l->node);
		l->h = NULL;
	}
	free(h->released);
	if (h->noticing) /* nobody left to tell */
		tpu_list_remove(&h->notice_node);
	tpu_list_for_each_safe(w, tmp, &c->waiters, node) {
		if (w->h != h)
			continue;
		if (answer)
			tpd_chan_answer(&h->who, w->req_id, -ECANCELED, "the handle was released",
					h->id, c->closed, NULL);
		tpd_chan_io_wait_free(w);
	}
	tpu_list_for_each_safe(w, tmp, &c->writers, node) {
		if (w->h != h)
			continue;
		if (answer)
			tpd_chan_answer(&h->who, w->req_id, -ECANCELED, "the handle was released",
					h->id, c->closed, NULL);
		tpd_chan_io_wait_free(w);
	}
	tpu_list_for_each(cp, &c->copies, node)
		if (cp->h == h)
			cp->h = NULL; /* the copy ends, answering nobody */
	tpd_chan_hand_forget(c, h);
	tpd_handix_del(&c->cs->ix, h->id, who_key(&h->who));
	tpu_list_remove(&h->node);
	c->n_handles--;
	c->maps_held -= h->n_sent;
	c->n_remote -= h->who.pr != NULL;
	/* the reader went before it said it copied the items out */
	bool back = tpd_chan_io_mapped_back(h);

	if (h->held) /* never read: back to the head, for the oldest waiting reader */
		tpd_chan_item_give_back(c, h->held);
	if (h->held || back)
		tpd_chan_io_serve(c);
	free(h);
	tpd_chan_maybe_free(c);
}

/* @o's remote access into @c (validated: peers only with REMOTE_PEERS). Return: 0 or -ENOMEM
 * (@c unchanged then). */
static int chan_set_remote(struct chan *c, const Tpw__V1__ChanOp *o)
{
	int r = tpu_strv_dup(o->remote_peers, o->n_remote_peers, TPW_REMOTE_PEERS_MAX,
			     TPW_NAME_MAX, &c->remote_peers);

	if (r < 0)
		return r;
	c->n_remote_peers = o->n_remote_peers;
	c->remote = o->remote ? o->remote : TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	return 0;
}

/* Creates channel @o->name of @uid. Return: 0 or -errno with a reason in *why. */
static int chan_create(struct tpd_chans *cs, uid_t uid, const Tpw__V1__ChanOp *o,
		       struct chan **ret, const char **why)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(cs->d);
	uint32_t n;
	struct chan *c;

	tpd_chan_uid_bytes(cs, uid, &n);
	if (n >= cfg->chans_per_uid) {
		*why = "this uid has chans-per-uid channels already";
		return -ENOBUFS;
	}
	if (o->capacity_items > cfg->chan_items_max || o->capacity_bytes > cfg->chan_bytes_max) {
		*why = "capacity above the daemon's chan-items-max or chan-bytes-max";
		return -ENOBUFS;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->name = strdup(o->name))) {
		free(c);
		*why = "out of memory";
		return -ENOMEM;
	}
	tpu_list_init(&c->node);
	tpu_list_init(&c->items);
	tpu_list_init(&c->copies);
	c->cs = cs;
	if (chan_set_remote(c, o) < 0) {
		chan_free(c);
		*why = "out of memory";
		return -ENOMEM;
	}
	c->uid = uid;
	c->access = o->access ? o->access : TPW__V1__ACCESS__ACCESS_OWNER;
	c->gid = o->gid;
	c->persistent = o->persistent;
	c->named = true;
	c->cap_items = o->capacity_items ? o->capacity_items : cfg->chan_items_max;
	c->cap_bytes = o->capacity_bytes ? o->capacity_bytes : cfg->chan_bytes_max;
	tpu_list_init(&c->items);
	tpu_list_init(&c->waiters);
	tpu_list_init(&c->writers);
	tpu_list_insert_tail(&cs->chans, &c->node);
	*ret = c;
	return 0;
}

static unsigned who_handles(const struct tpd_chans *cs, const struct chan_who *who)
{
	return tpd_handix_count(&cs->ix, who_key(who));
}

/* A new handle of @who on @c. Return: owned by @cs (handle_free()), or NULL without memory. */
static struct chan_handle *handle_new(struct tpd_chans *cs, const struct chan_who *who,
				      struct chan *c)
{
	struct chan_handle *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	h->who = *who;
	h->id = ++cs->next_id;
	if (tpd_handix_add(&cs->ix, h->id, who_key(who), h) < 0) {
		free(h);
		return NULL;
	}
	h->c = c;
	tpu_list_init(&h->lends);
	tpu_list_init(&h->notice_node);
	c->n_handles++;
	c->n_remote += who->pr != NULL;
	tpu_list_insert_tail(&cs->handles, &h->node);
	return h;
}

/* The local uid that channels created from other hosts belong to (chan-remote-create-uid)
 * if link @pr may create and unlink channels here (an authenticated one), else 0. */
static uid_t remote_creator(const struct tpd_chans *cs, const struct tpd_peer *pr)
{
	return tpd_peer_identity(pr) ? tpd_daemon_cfg(cs->d)->chan_remote_create_uid : 0;
}

/* Creates channel @o->name of uid @owner for the far daemon of @who's link, with @o's flags and
 * limits as a local creator of that uid gets them; its remote access admits that link always.
 * Return: 0 or -errno with the reason in *@why. */
static int chan_create_remote(struct tpd_chans *cs, const struct chan_who *who,
			      const Tpw__V1__ChanOp *o, uid_t owner, struct chan **ret,
			      const char **why)
{
	const char *id = tpd_peer_identity(who->pr);
	Tpw__V1__ChanOp co = *o;
	char *peers[TPW_REMOTE_PEERS_MAX + 1], acct[TPD_PEER_ACCOUNT_LEN];
	const char *creator = tpd_peer_account(who->pr, acct);
	uint32_t n = 0;
	int r;

	if (!creator) { /* remote_creator() admits authenticated links only */
		*why = "the link is not authenticated";
		return -EACCES;
	}
	n = tpd_chan_creator_count(cs, creator);
	if (n >= tpd_daemon_cfg(cs->d)->chan_remote_create_per_peer) {
		*why = "this host has created chan-remote-create-per-peer channels here already";
		return -ENOBUFS;
	}
	tpd_chanx_admit_link(who->pr, id, &co.remote, &co.remote_peers, &co.n_remote_peers, peers);
	r = chan_create(cs, owner, &co, ret, why);
	if (r == 0 && !((*ret)->creator = strdup(creator))) {
		chan_free(*ret);
		*why = "out of memory";
		return -ENOMEM;
	}
	return r;
}

/*
 * OPEN from another host's daemon: an existing channel whose remote access admits the link, or,
 * with create on a daemon whose chan-remote-create-uid names a uid and over an authenticated
 * link, a new channel of that uid (looked up under it unless the op names its owner). A channel
 * that does not admit the link is, to the far daemon, no channel at all (the same status and
 * text), so that names cannot be probed from other hosts.
 */
/* Answers a peer's OPEN (@req_id) with handle @h: this daemon takes its packed reads. */
static void open_answer_remote(const struct chan_who *who, uint64_t req_id,
			       const struct chan_handle *h)
{
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;

	r.req_id = req_id;
	r.status = tpw_status_from_errno(0);
	r.message = (char *)"";
	r.chan_id = h->id;
	r.closed = h->c->closed;
	r.pack_peer = true; /* ChanOp.pack_peer (chanio.c, read_params()) */
	tpd_chan_reply_send(who, &r, NULL, 0);
}

static void op_open_remote(struct tpd_chans *cs, const struct chan_who *who,
			   const Tpw__V1__ChanOp *o)
{
	uid_t creator = o->create ? remote_creator(cs, who->pr) : 0;
	uid_t owner = o->owner_set ? o->owner_uid : creator ? creator : who->uid;
	struct chan *c = chan_find(cs, owner, o->name);
	const char *cwhy = NULL;
	struct chan_handle *h;
	unsigned held;
	char why[320];
	int r;

	if (!c && creator && owner == creator) {
		if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
			return tpd_chan_answer(who, o->req_id, -ENOBUFS, "this peer link has 1024 "
					       "channel handles here", 0, false, NULL);
		r = chan_create_remote(cs, who, o, owner, &c, &cwhy);
		if (r < 0)
			return tpd_chan_answer(who, o->req_id, r, cwhy, 0, false, NULL);
		h = handle_new(cs, who, c);
		if (!h) {
			tpd_chan_maybe_free(c);
			return tpd_chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false,
					       NULL);
		}
		if (tpd_peer_log_ok(who->pr, &held)) /* the peer creates and unlinks at will */
			tpu_log_info("peer %s: created channel '%s' of uid %u (%u lines about this "
				     "peer not logged before this one)", tpd_peer_name(who->pr),
				     c->name, (unsigned)c->uid, held);
		return open_answer_remote(who, o->req_id, h);
	}
	if (!c || !chan_permits_remote(c, who->pr)) {
		snprintf(why, sizeof(why), "no channel '%.64s' of uid %u on %.60s accepts handles "
			 "from other hosts%s", o->name, (unsigned)owner, tpd_peers_hostname(cs->d),
			 !o->create || creator ? "" : ", and it creates none for other hosts "
			 "(chan-remote-create-uid)");
		return tpd_chan_answer(who, o->req_id, -ENOENT, why, 0, false, NULL);
	}
	if (o->create && o->exclusive)
		return tpd_chan_answer(who, o->req_id, -EADDRINUSE, "the channel exists", 0, false,
				       NULL);
	if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
		return tpd_chan_answer(who, o->req_id, -ENOBUFS, "this peer link has 1024 channel "
				       "handles here", 0, false, NULL);
	h = handle_new(cs, who, c);
	if (!h)
		return tpd_chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false, NULL);
	open_answer_remote(who, o->req_id, h);
}

static void op_open(struct tpd_chans *cs, const struct chan_who *who, const Tpw__V1__ChanOp *o)
{
	Tpw__V1__ChanReply r_ok = TPW__V1__CHAN_REPLY__INIT;
	struct tpd_session *s = who->s;
	uid_t owner = o->owner_set ? o->owner_uid : tpd_session_uid(s);
	struct chan *c = chan_find(cs, owner, o->name);
	const char *why = NULL;
	struct chan_handle *h;
	int r;

	/* A channel whose access mode refuses the caller is, to it, no channel at all (the same
	 * status and text, TP_CHAN_EXCL included), so that another uid's private names cannot be
	 * probed; it cannot create one of that uid anyway. */
	if (c && !chan_permits(c, s))
		c = NULL;
	if (c && o->create && o->exclusive)
		return tpd_chan_answer(who, o->req_id, -EADDRINUSE, "the channel exists", 0, false,
				       NULL);
	if (!c && (!o->create || owner != tpd_session_uid(s)))
		return tpd_chan_answer(who, o->req_id, -ENOENT, "no such channel", 0, false, NULL);
	if (who_handles(cs, who) >= CHAN_HANDLES_PER_SESSION)
		return tpd_chan_answer(who, o->req_id, -ENOBUFS, "this session has 1024 channel "
				       "handles", 0, false, NULL);
	if (!c) {
		r = chan_create(cs, tpd_session_uid(s), o, &c, &why);
		if (r < 0)
			return tpd_chan_answer(who, o->req_id, r, why, 0, false, NULL);
	}
	h = handle_new(cs, who, c);
	if (!h) {
		tpd_chan_maybe_free(c);
		return tpd_chan_answer(who, o->req_id, -ENOMEM, "out of memory", 0, false, NULL);
	}
	r_ok.req_id = o->req_id;
	r_ok.status = tpw_status_from_errno(0);
	r_ok.message = (char *)"";
	r_ok.chan_id = h->id;
	r_ok.closed = c->closed;
	r_ok.pack_reads = true; /* ChanOp.pack (chanio.c) */
	tpd_chan_reply_send(who, &r_ok, NULL, 0);
}

static void op_unlink(struct tpd_chans *cs, const struct chan_who *who,
		      const Tpw__V1__ChanOp *o)
{
	struct tpd_session *s = who->s;
	uid_t owner = o->owner_set ? o->owner_uid : tpd_session_uid(s);
	struct chan *c = chan_find(cs, owner, o->name);

	if (!c || !chan_permits(c, s)) /* (as op_open(): not probed by unlinking) */
		return tpd_chan_answer(who, o->req_id, -ENOENT, "no such channel", 0, false, NULL);
	if (tpd_session_uid(s) != 0 && tpd_session_uid(s) != c->uid)
		return tpd_chan_answer(who, o->req_id, -EACCES,
				       "only the channel's owner unlinks it", 0, false, NULL);
	c->named = false;
	/* A later open of the name makes a new channel; this one stays charged until freed. */
	tpu_list_remove(&c->node);
	tpu_list_insert_tail(&cs->unlinked, &c->node);
	tpd_chan_answer(who, o->req_id, 0, NULL, 0, c->closed, NULL);
	tpd_chan_maybe_free(c);
}

/* UNLINK from another host's daemon: as the uid of chan-remote-create-uid, over an
 * authenticated link, of a channel of that uid whose remote access admits the link; any other
 * channel is, to the far daemon, no channel at all. */
static void op_unlink_remote(struct tpd_chans *cs, const struct chan_who *who,
			     const Tpw__V1__ChanOp *o)
{
	uid_t creator = remote_creator(cs, who->pr);
	uid_t owner = o->owner_set ? o->owner_uid : creator;
	struct chan *c = creator ? chan_find(cs, owner, o->name) : NULL;
	unsigned held;
	char why[320];

	if (!c || c->uid != creator || !chan_permits_remote(c, who->pr)) {
		snprintf(why, sizeof(why), "no channel '%.64s' on %.60s may be unlinked from other "
			 "hosts%s", o->name, tpd_peers_hostname(cs->d), creator ? "" :
			 " (chan-remote-create-uid is not set)");
		return tpd_chan_answer(who, o->req_id, -ENOENT, why, 0, false, NULL);
	}
	c->named = false;
	tpu_list_remove(&c->node); /* charged to its uid, as a local unlink leaves it */
	tpu_list_insert_tail(&cs->unlinked, &c->node);
	if (tpd_peer_log_ok(who->pr, &held))
		tpu_log_info("peer %s: unlinked channel '%s' of uid %u (%u lines about this peer "
			     "not logged before this one)", tpd_peer_name(who->pr), c->name,
			     (unsigned)c->uid, held);
	tpd_chan_answer(who, o->req_id, 0, NULL, 0, c->closed, NULL);
	tpd_chan_maybe_free(c);
}

static void handle_op(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		      const uint8_t *tail, size_t tail_len);

static void chan_on_op(struct tpd_session *s, const Tpw__V1__ChanOp *o, const uint8_t *tail,
		       size_t tail_len)
{
	struct tpd_chans *cs = chans_of(s);
	const struct chan_who who = { .s = s };
	struct chan_handle *h;

	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN && tpd_chanx_is_address(o->name))
		return tpd_chanx_open(cs->x, s, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN)
		return op_open(cs, &who, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK && tpd_chanx_is_address(o->name))
		return tpd_chanx_unlink(cs->x, s, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		return op_unlink(cs, &who, o);
	h = handle_find(cs, &who, o->chan_id);
	if (!h && tpd_chanx_op(cs->x, s, o, tail, tail_len))
		return; /* a handle of a channel on another host: forwarded */
	if (!h)
		return tpd_chan_answer(&who, o->req_id, -ENOENT, "no such channel handle",
				       o->chan_id, false, NULL);
	handle_op(cs, h, o, tail, tail_len);
}

/* Waits (reads and writes waiting for an item or room) the handles of @pr's peer hold here,
 * over any of its links (tpd_peer_same()): counted per link as they start and end, so that a
 * peer's call costs nothing of the handles every user holds (each walked them all). */
static uint32_t peer_waits(const struct tpd_chans *cs, const struct tpd_peer *pr)
{
	return tpd_handix_peer_waits(&cs->ix, pr, tpd_peer_same);
}

void tpd_chan_peer_op(struct tpd_chans *cs, struct tpd_peer *pr, const Tpw__V1__PeerChanOp *po,
		      const uint8_t *tail, size_t tail_len)
{
	const struct chan_who who = { .pr = pr, .uid = po->uid };
	const Tpw__V1__ChanOp *o = po->op;
	uint32_t max = tpd_daemon_cfg(cs->d)->chan_peer_ops_max;
	struct chan_handle *h;
	char why[160];

	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_OPEN)
		return op_open_remote(cs, &who, o);
	if (o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_UNLINK)
		return op_unlink_remote(cs, &who, o);
	h = handle_find(cs, &who, o->chan_id);
	if (!h)
		return tpd_chan_answer(&who, o->req_id, -ENOENT, "no such channel handle",
				       o->chan_id, false, NULL);
	if ((o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ ||
	     o->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE) && o->timeout_ms &&
	    peer_waits(cs, pr) >= max) {
		snprintf(why, sizeof(why), "%u channel ops of this peer wait on %.60s "
			 "(chan-peer-ops-max)", max, tpd_peers_hostname(cs->d));
		return tpd_chan_answer(&who, o->req_id, -ENOBUFS, why, h->id, h->c->closed, NULL);
	}
	if (tpd_chanx_big_admit(cs->d, pr, o, why, sizeof(why)) < 0) /* a remote daemon's bytes */
		return tpd_chan_answer(&who, o->req_id, -ENOBUFS, why, h->id, h->c->closed, NULL);
	handle_op(cs, h, o, tail, tail_len);
}

void tpd_chan_peer_gone(struct tpd_chans *cs, struct tpd_peer *pr)
{
	struct chan_handle *h, *tmp;

	tpu_list_for_each_safe(h, tmp, &cs->handles, node)
		if (h->who.pr == pr)
			handle_free(h, false);
}

uint64_t tpd_chan_new_id(struct tpd_chans *cs)
{
	return ++cs->next_id;
}

struct tpd_chanx *tpd_chan_x(struct tpd_chans *cs)
{
	return cs->x;
}

static void handle_op(struct tpd_chans *cs, struct chan_handle *h, const Tpw__V1__ChanOp *o,
		      const uint8_t *tail, size_t tail_len)
{
	switch (o->op) {
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_WRITE:
		return tpd_chan_io_write(cs, h, o, tail, tail_len);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_READ:
		return tpd_chan_io_read(cs, h, o);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_CLOSE:
		h->c->closed = true; /* idempotent */
		tpd_chan_answer(&h->who, o->req_id, 0, NULL, h->id, true, NULL);
		return tpd_chan_io_serve(h->c);
	case TPW__V1__CHAN_OP_KIND__CHAN_OP_RELEASE:
		tpd_chan_answer(&h->who, o->req_id, 0, NULL, h->id, h->c->closed, NULL);
		return handle_free(h, true);
	default:
		return; /* validation refuses other ops */
	}
}

static void chan_on_session_end(struct tpd_session *s)
{
	struct tpd_chans *cs = chans_of(s);
	struct chan_handle *h, *tmp;

	tpd_chanx_session_end(cs->x, s);
	tpu_list_for_each_safe(h, tmp, &cs->handles, node)
		if (h->who.s == s)
			handle_free(h, false);
}

/* @s let go of @b, a buffer readers may have mapped: once no item lies in it, it is gone for
 * good and the readers sent its fd are told (chanitem.c). */
static void chan_on_buffer_gone(struct tpd_session *s, struct tpb_buffer *b)
{
	b->map_dropped = true;
	if (!b->map_lends)
		tpd_chan_item_retire(chans_of(s), b);
}

static const struct tpd_local_chan_ops chan_local_ops = {
	.op = chan_on_op,
	.session_end = chan_on_session_end,
	.buffer_gone = chan_on_buffer_gone,
};

void tpd_chan_serve_local(struct tpd_local *l)
{
	tpd_local_set_chan_ops(l, &chan_local_ops);
}

int tpd_chan_new(struct tpd_daemon *d, struct tpd_chans **ret)
{
	struct tpd_chans *cs = calloc(1, sizeof(*cs));

	if (!cs)
		return -ENOMEM;
	cs->d = d;
	tpu_list_init(&cs->chans);
	tpu_list_init(&cs->unlinked);
	tpu_list_init(&cs->handles);
	tpd_handix_init(&cs->ix);
	tpu_list_init(&cs->spare);
	tpu_list_init(&cs->noticing);
	tpu_hmap_init(&cs->payers);
	if (tpd_chanx_new(d, cs, &cs->x) < 0) {
		free(cs);
		return -ENOMEM;
	}
	*ret = cs;
	return 0;
}

void tpd_chan_free(struct tpd_chans *cs)
{
	struct chan_handle *h, *htmp;
	struct chan_item *it, *itmp;
	struct chan *c, *ctmp;

	if (!cs)
		return;
	tpd_chanx_free(cs->x);
	tpu_list_for_each_safe(h, htmp, &cs->handles, node)
		handle_free(h, false); /* frees unnamed channels */
	tpu_list_for_each_safe(c, ctmp, &cs->chans, node)
		chan_free(c);
	tpu_list_for_each_safe(c, ctmp, &cs->unlinked, node)
		chan_free(c); /* kept by a copy the daemon's end cut short */
	tpu_list_for_each_safe(it, itmp, &cs->spare, node)
		free(it);
	free(cs->lent);
	tpd_handix_done(&cs->ix);
	tpu_hmap_done(&cs->payers); /* (empty: every payer went with its last item) */
	if (cs->notice_ev)
		event_free(cs->notice_ev);
	free(cs);
}

static const char *chan_state(const struct chan *c)
{
	if (!c->closed)
		return "open";
	return c->n_items ? "closed" : "drained";
}

int tpd_chan_ctl(struct tpd_chans *cs, bool own_only, uid_t viewer, Tpw__V1__CtlChannel ***ret,
		 size_t *n)
{
	Tpw__V1__CtlChannel **v = NULL;
	const struct chan *c;
	size_t k = 0, cap = 0;

	tpu_list_for_each(c, &cs->chans, node)
		cap++;
	if (cap && !(v = calloc(cap, sizeof(*v))))
		return -ENOMEM;
	tpu_list_for_each(c, &cs->chans, node) {
		Tpw__V1__CtlChannel *x;

		if (own_only && c->uid != viewer)
			continue;
		x = calloc(1, sizeof(*x));
		if (!x) {
			tpd_chan_ctl_free(v, k);
			return -ENOMEM;
		}
		tpw__v1__ctl_channel__init(x);
		x->name = strdup(c->name);
		if (!x->name) {
			free(x);
			tpd_chan_ctl_free(v, k);
			return -ENOMEM;
		}
		x->uid = c->uid;
		x->access = c->access;
		x->gid = c->gid;
		x->state = (char *)chan_state(c);
		x->items = c->n_items;
		x->bytes = c->bytes;
		x->handles = c->n_handles;
		x->readers_waiting = c->n_waiters;
		x->writers_waiting = c->n_writers;
		x->persistent = c->persistent;
		x->capacity_items = c->cap_items;
		x->capacity_bytes = c->cap_bytes;
		x->items_written = c->written;
		x->items_read = c->read;
		x->items_mapped = c->mapped;
		x->maps_retired = c->maps_retired;
		x->maps_held = c->maps_held;
		x->items_handed_off = c->handed;
		x->items_handed_back = c->handed_back;
		x->remote = c->remote;
		x->remote_handles = c->n_remote;
		x->created_by = c->creator ? c->creator : (char *)"";
		v[k++] = x;
	}
	*ret = v;
	*n = k;
	return 0;
}

void tpd_chan_ctl_free(Tpw__V1__CtlChannel **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		free(v[i]->name);
		free(v[i]);
	}
	free(v);
}

void tpd_chan_counts(const struct tpd_chans *cs, uint32_t *ret_chans, uint32_t *ret_unlinked,
		     uint64_t *ret_items, uint64_t *ret_bytes)
{
	const struct chan *c;
	uint32_t n = 0, u = 0;
	uint64_t items = 0, bytes = 0;

	tpu_list_for_each(c, &cs->chans, node) {
		n++;
		items += c->n_items;
		bytes += c->bytes;
	}
	tpu_list_for_each(c, &cs->unlinked, node) {
		u++;
		items += c->n_items;
		bytes += c->bytes;
	}
	*ret_chans = n;
	*ret_unlinked = u;
	*ret_items = items;
	*ret_bytes = bytes;
}

uint64_t tpd_chan_handed(const struct tpd_chans *cs)
{
	return cs->handed;
}
