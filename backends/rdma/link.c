/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma and cuda_gdr on peer links: queue-pair set-up per link, receives (registration and
 * the offer) and sends (RDMA writes). See rdma.h. The context, its ports and event fd are
 * ctx.c's, registration and its cache reg.c's, the link's op-table endpoint ep.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "tpconfig.h"
#include "log.h"
#include "rdma_int.h"
#include "tpb.h"

const char *tpb_rdma_channel(bool local_cuda, const struct tpb_rdma_offer *offer,
			     bool remote_cuda)
{
	bool cuda = local_cuda || remote_cuda;

	for (size_t i = 0; offer && i < offer->n && !cuda; i++)
		cuda = offer->regions[i].cuda;
	return cuda ? "cuda_gdr" : "rdma";
}

#if HAVE_RDMA
_Static_assert(TPV_QP_INFO_BYTES == TPB_RDMA_QP_RECORD_BYTES, "queue-pair record size");
_Static_assert(TPV_RAIL_BYTES == TPB_RDMA_RAIL_BYTES, "rail size");

#define RDMA_POLL_US 50 /* CUDA event polling period while a transfer waits */

struct tpb_rdma_recv {
	struct rdma_regs regs;
	const struct tpb_rdma_seg *segs;
	struct tpb_rdma *g;
	struct rdma_timer timer; /* polls the reader's CUDA events */
	tpb_rdma_ready_fn ready;
	void *arg;
	struct tpb_rdma_region *regions;
};

struct rdma_send {
	struct tpu_list node; /* in the link's sends */
	struct tpb_rdma_link *l;
	struct tpb_rdma_xfer *x;
	struct rdma_regs regs;
	struct tpv_qp *qp;
	uint64_t *raddr;
	uint32_t *rkey;
	struct rdma_timer timer; /* event polling, and completions decided outside a call */
	size_t next;		 /* next segment to post */
	unsigned pending;	 /* writes posted, not completed */
	bool canceled, posting;
	bool events_ok; /* the writer's CUDA events fired */
	const char *channel; /* "rdma" or "cuda_gdr", for errors */
	int status;
	char why[160];
};

static const char *link_text(const struct tpb_rdma_link *l)
{
	return l->g->cfg.link_ops->name(l->link);
}

/* ---- link set-up --------------------------------------------------------------------------- */

static void link_send(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m)
{
	l->g->cfg.link_ops->send(l->link, m);
}

#define REBUILD_MS_DEFAULT 1000
#define REBUILD_MS_MAX 60000

static void link_announce(struct tpb_rdma_link *l);
static void send_fail(struct rdma_send *s, int err, const char *why);

/*
 * Frees @l's queue pairs (their pending writes flushed) and forgets the peer's ports: sends
 * still running fail with -ECONNRESET. The link is then in LINK_PORTS, to be set up again.
 */
static void link_reset(struct tpb_rdma_link *l)
{
	size_t n = l->qps ? l->g->n * l->n_remote : 0;
	struct rdma_send *s;

	l->state = LINK_PORTS; /* the flushes below must not turn the link off again */
	tpu_list_for_each(s, &l->sends, node)
		send_fail(s, -ECONNRESET, "RDMA queue pairs rebuilt");
	for (size_t k = 0; k < n; k++) {
		if (!l->qps[k])
			continue;
		tpv_qp_close(l->qps[k], tpb_rdma_write_done, l->g);
		tpb_rdma_port_put(&l->g->ports[k / l->n_remote]);
	}
	tpu_list_for_each(s, &l->sends, node) {
		if (!s->pending) /* finishes from its timer */
			tpb_rdma_timer_in_us(l->g, &s->timer, 0);
	}
	free(l->qps);
	free(l->pairs);
	l->qps = NULL;
	l->pairs = NULL;
	l->n_pairs = 0;
	l->n_remote = 0;
	snprintf(l->text, sizeof(l->text), "connecting (rebuilding)");
}

/* The rebuild timer: set the link up again from the ports step. */
static void link_on_rebuild(struct rdma_timer *t)
{
	struct tpb_rdma_link *l = tpu_container_of(t, struct tpb_rdma_link, rebuild);

	if (l->state != LINK_OFF)
		return;
	l->rebuilds++;
	tpu_log(TPU_LOG_INFO, "peer %s: rebuilding RDMA queue pairs (attempt %u of %u)",
		l->g->cfg.link_ops->name(l->link), l->rebuilds, l->g->cfg.rebuild_max);
	link_reset(l);
	link_announce(l);
}

/* This side gives up RDMA on @l (tells the peer unless @quiet); the link carries on without. */
static void link_off(struct tpb_rdma_link *l, bool quiet, const char *why)
{
	struct tpb_rdma_setup rm = { 0 };

	l->state = LINK_OFF;
	snprintf(l->text, sizeof(l->text), "off: %.190s", why);
	tpu_log(TPU_LOG_NOTICE, "peer %s: RDMA off: %s", link_text(l), why);
	if (quiet)
		return;
	rm.error = why;
	link_send(l, &rm);
}

/* A write failed on @l: RDMA off, and rebuilt later unless that was tried too often. */
static void link_off_rebuild(struct tpb_rdma_link *l, const char *why)
{
	uint64_t ms = l->g->cfg.rebuild_ms ? l->g->cfg.rebuild_ms : REBUILD_MS_DEFAULT;

	link_off(l, false, why);
	if (l->rebuilds >= l->g->cfg.rebuild_max) {
		size_t used = strlen(l->text);

		if (l->g->cfg.rebuild_max)
			snprintf(l->text + used, sizeof(l->text) - used,
				 " (given up after %u rebuilds)", l->rebuilds);
		return;
	}
	ms = TPU_MIN(ms << TPU_MIN(l->rebuilds, 16u), (uint64_t)REBUILD_MS_MAX);
	tpb_rdma_timer_in_us(l->g, &l->rebuild, (long)ms * 1000);
}

/* The first set-up step: this side's ports and their rails (none if memory is short). */
static void link_announce(struct tpb_rdma_link *l)
{
	struct tpb_rdma_record *rails = calloc(l->g->n ? l->g->n : 1, sizeof(*rails));
	struct tpb_rdma_setup rm = { .ports = (uint32_t)l->g->n };

	for (size_t i = 0; rails && i < l->g->n; i++)
		rails[i] = (struct tpb_rdma_record){ l->g->nics[i].rail, TPV_RAIL_BYTES };
	rm.n_rails = rails ? l->g->n : 0;
	rm.rails = rails;
	link_send(l, &rm);
	free(rails);
}

/*
 * Which (local port, remote port) pairs get a queue pair: those on the same rail, if the peer
 * sent its rails and some pair shares one; else every pair (a peer that does not say, or
 * networks routed to each other: as before rails). The peer decides alike from the same keys.
 * Return: 0 or -ENOMEM.
 */
static int link_pairs(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m)
{
	size_t n = l->g->n * l->n_remote;

	l->pairs = calloc(n ? n : 1, sizeof(*l->pairs));
	if (!l->pairs)
		return -ENOMEM;
	l->n_pairs = 0;
	for (size_t i = 0; m->n_rails == l->n_remote && i < l->g->n; i++) {
		for (size_t j = 0; j < l->n_remote; j++) {
			const struct tpb_rdma_record *rj = &m->rails[j];
			bool same = rj->len == TPV_RAIL_BYTES &&
				    !memcmp(rj->data, l->g->nics[i].rail, TPV_RAIL_BYTES);

			l->pairs[i * l->n_remote + j] = same;
			l->n_pairs += same;
		}
	}
	if (l->n_pairs)
		return 0;
	for (size_t k = 0; k < n; k++)
		l->pairs[k] = true;
	l->n_pairs = n;
	return 0;
}

struct tpb_rdma_link *tpb_rdma_link_new(struct tpb_rdma *g, void *link, unsigned peer_offers)
{
	unsigned common = tpb_rdma_offers(g) & peer_offers;
	struct tpb_rdma_link *l;

	if (!common || !(l = calloc(1, sizeof(*l))))
		return NULL;
	l->g = g;
	l->link = link;
	l->ep = (struct tpb_ep){ .ctx = &g->base, .peer = &l->peer };
	l->peer = (struct tpb_peer){ .name = g->cfg.link_ops->name(link), .link = link };
	tpu_list_init(&l->op_sends);
	tpu_list_init(&l->op_recvs);
	l->gdr_ep = (struct tpb_ep){ .ctx = &g->gdr_base, .peer = &l->peer };
	tpu_list_insert_tail(&g->links, &l->node);
	l->common = common;
	l->state = LINK_PORTS;
	tpu_list_init(&l->sends);
	l->rebuild.fn = link_on_rebuild;
	snprintf(l->text, sizeof(l->text), "connecting");
	link_announce(l);
	return l;
}

/* Creates a queue pair per (local port, remote port) pair of l->pairs and sends their records,
 * in (local, remote) order. */
static int link_make_qps(struct tpb_rdma_link *l, char *why, size_t wl)
{
	const struct tpb_rdma_config *c = &l->g->cfg;
	struct tpv_qp_params params = { /* zeros take the layer's defaults */
		.traffic_class = c->traffic_class,
		.sl = c->sl,
		.timeout = c->timeout,
		.retry_cnt = c->retry,
	};
	struct tpb_rdma_setup rm = { 0 };
	size_t n = l->g->n * l->n_remote, m = 0;
	uint8_t(*rec)[TPV_QP_INFO_BYTES] = calloc(l->n_pairs ? l->n_pairs : 1, sizeof(*rec));
	struct tpb_rdma_record *qps = calloc(l->n_pairs ? l->n_pairs : 1, sizeof(*qps));
	int r = rec && qps ? 0 : -ENOMEM;

	l->qps = calloc(n ? n : 1, sizeof(*l->qps));
	if (!l->qps)
		r = -ENOMEM;
	for (size_t k = 0; k < n && r == 0; k++) {
		struct rdma_port *pt = &l->g->ports[k / l->n_remote];

		if (!l->pairs[k])
			continue;
		r = tpb_rdma_port_open(pt, why, wl);
		if (r == 0 && (r = tpv_qp_new(pt->ctx, &params, &l->qps[k], why, wl)) < 0)
			tpb_rdma_port_put(pt);
		if (r == 0) {
			tpv_qp_info_encode(tpv_qp_local(l->qps[k]), rec[m]);
			qps[m] = (struct tpb_rdma_record){ rec[m], TPV_QP_INFO_BYTES };
			m++;
		}
	}
	if (r == 0) {
		rm.n_qps = m;
		rm.qps = qps;
		link_send(l, &rm);
	}
	free(rec);
	free(qps);
	return r;
}

/* Connects every queue pair with the peer's records: its (j, i) pairs in its order, (its port
 * j, our port i), j first. */
static int link_connect(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m, char *why,
			size_t wl)
{
	size_t n_local = l->g->n, k = 0;

	if (m->n_qps != l->n_pairs) {
		snprintf(why, wl, "peer sent %zu queue-pair records, expected %zu", m->n_qps,
			 l->n_pairs);
		return -EPROTO;
	}
	for (size_t j = 0; j < l->n_remote; j++) {
		for (size_t i = 0; i < n_local; i++) {
			const struct tpb_rdma_record *b = &m->qps[k];
			struct tpv_qp_info info;
			int r;

			if (!l->pairs[i * l->n_remote + j])
				continue;
			k++;
			r = tpv_qp_info_decode(b->data, b->len, &info);
			if (r < 0) {
				snprintf(why, wl, "malformed queue-pair record from the peer");
				return r;
			}
			r = tpv_qp_connect(l->qps[i * l->n_remote + j], &info, why, wl);
			if (r < 0)
				return r;
		}
	}
	return 0;
}

void tpb_rdma_link_on_msg(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m)
{
	char why[200] = "";
	int r;

	if (!l)
		return;
	if (m->ports && !m->n_qps && l->state != LINK_PORTS) {
		/* the peer sets the link up again (it rebuilds after a failure): so does this */
		tpb_rdma_timer_stop(&l->rebuild);
		link_reset(l);
		link_announce(l);
	}
	if (l->state == LINK_OFF)
		return;
	if (m->error && *m->error) {
		snprintf(why, sizeof(why), "the peer gave up: %.150s", m->error);
		link_off(l, true, why);
		return;
	}
	if (l->state == LINK_PORTS && m->n_qps == 0) {
		if (m->ports == 0 || m->ports > l->g->cfg.ports_max) {
			snprintf(why, sizeof(why), "peer announced %u RDMA ports", m->ports);
			link_off(l, false, why);
			return;
		}
		l->n_remote = m->ports;
		l->state = LINK_CONNECTING;
		r = link_pairs(l, m);
		if (r == 0)
			r = link_make_qps(l, why, sizeof(why));
		if (r < 0)
			link_off(l, false, why[0] ? why : strerror(-r));
		return;
	}
	if (l->state != LINK_CONNECTING || m->n_qps == 0) {
		link_off(l, false, "RDMA set-up message out of order");
		return;
	}
	r = link_connect(l, m, why, sizeof(why));
	if (r < 0) {
		link_off(l, false, why[0] ? why : strerror(-r));
		return;
	}
	l->state = LINK_READY;
	if (l->n_pairs == l->g->n * l->n_remote)
		snprintf(l->text, sizeof(l->text), "ready: %zux%u queue pairs", l->g->n,
			 l->n_remote);
	else
		snprintf(l->text, sizeof(l->text), "ready: %zu queue pairs between ports on the "
			 "same rail (%zux%u ports)", l->n_pairs, l->g->n, l->n_remote);
	tpu_log(TPU_LOG_INFO, "peer %s: RDMA %s", link_text(l), l->text);
}

bool tpb_rdma_link_ready(const struct tpb_rdma_link *l)
{
	return l && l->state == LINK_READY;
}

const char *tpb_rdma_link_state(const struct tpb_rdma_link *l)
{
	return l ? l->text : "";
}

void tpb_rdma_link_bytes(const struct tpb_rdma_link *l, uint64_t *sent, uint64_t *received)
{
	*sent = l ? l->sent : 0;
	*received = l ? l->received : 0;
}

void tpb_rdma_link_received(struct tpb_rdma_link *l, uint64_t bytes)
{
	if (l)
		l->received += bytes;
}

/* ---- transfers ---------------------------------------------------------------------------- */

/*
 * The local port a transfer of memory on GPU @bus_id (NULL: host) uses on @l: one with a queue
 * pair to remote port @remote (< 0: to any), nearest the GPU among those (host memory:
 * round-robin). Return: NULL when every port qualifies (tpb_rdma_reg_make() then chooses
 * among all, as without rails), else the port; -ENETUNREACH when none does (@why).
 */
static int link_port(struct tpb_rdma_link *l, const char *bus_id, long remote,
		     struct rdma_port **ret, char *why, size_t wl)
{
	_cleanup_free_ struct tpv_nic *nics = calloc(l->g->n ? l->g->n : 1, sizeof(*nics));
	_cleanup_free_ size_t *map = calloc(l->g->n ? l->g->n : 1, sizeof(*map));
	size_t c = 0;
	int k;

	if (!nics || !map)
		return -ENOMEM;
	for (size_t i = 0; i < l->g->n; i++) {
		bool ok = false;

		for (size_t j = 0; j < l->n_remote && !ok; j++)
			ok = l->qps[i * l->n_remote + j] && (remote < 0 || (size_t)remote == j);
		if (ok) {
			nics[c] = l->g->nics[i];
			map[c++] = i;
		}
	}
	*ret = NULL;
	if (c == l->g->n)
		return 0;
	if (!c) {
		snprintf(why, wl, "no RDMA port here shares a rail with the peer's port %ld", remote);
		return -ENETUNREACH;
	}
	k = tpv_nic_choose(nics, c, TPV_SYSFS_ROOT, bus_id, &l->g->rr);
	*ret = &l->g->ports[map[k < 0 ? 0 : k]];
	return 0;
}

/* 1 when the CUDA events of every segment fired, 0 not yet, -errno. */
static int events_done(const struct tpb_rdma_seg *segs, size_t n, char *why, size_t wl)
{
	for (size_t i = 0; i < n; i++) {
		int r = segs[i].len ? tpb_cuda_event_done(&segs[i].mem, why, wl) : 1;
		if (r <= 0)
			return r;
	}
	return 1;
}

/* ---- receive ------------------------------------------------------------------------------- */

/* -EOPNOTSUPP unless both daemons of @l offer the channel a receive of @segs needs. */
static int recv_offered(const struct tpb_rdma_link *l, const struct tpb_rdma_seg *segs,
			size_t n, bool src_cuda, char *why, size_t wl)
{
	bool cuda = src_cuda || tpb_rdma_reg_first_cuda(segs, n);

	if (cuda && !(l->common & TPB_RDMA_CUDA)) {
		snprintf(why, wl, "CUDA memory, and cuda_gdr is not offered by both daemons");
		return -EOPNOTSUPP;
	}
	if (!cuda && !(l->common & TPB_RDMA_HOST)) {
		snprintf(why, wl, "host memory, and rdma is not offered by both daemons");
		return -EOPNOTSUPP;
	}
	return 0;
}

static void recv_on_timer(struct rdma_timer *t)
{
	struct tpb_rdma_recv *rv = tpu_container_of(t, struct tpb_rdma_recv, timer);
	char why[160] = "";
	int r = events_done(rv->segs, rv->regs.n, why, sizeof(why));

	if (r == 0) {
		tpb_rdma_timer_in_us(rv->g, &rv->timer, RDMA_POLL_US);
		return;
	}
	rv->ready(rv->arg, r < 0 ? r : 0, why);
}

int tpb_rdma_recv_new(struct tpb_rdma_link *l, const struct tpb_rdma_seg *segs, size_t n,
		      bool src_cuda, tpb_rdma_ready_fn ready, void *arg, struct tpb_rdma_recv **ret,
		      char *why, size_t wl)
{
	struct tpb_rdma_recv *rv;
	int r;

	if (!tpb_rdma_link_ready(l)) {
		snprintf(why, wl, "RDMA is not set up on this link");
		return -EOPNOTSUPP;
	}
	r = recv_offered(l, segs, n, src_cuda, why, wl);
	if (r == 0)
		r = tpb_rdma_reg_applicable(segs, n, why, wl);
	if (r < 0)
		return r;
	rv = calloc(1, sizeof(*rv));
	if (!rv)
		return -ENOMEM;
	rv->segs = segs;
	rv->g = l->g;
	rv->timer.fn = recv_on_timer;
	rv->ready = ready;
	rv->arg = arg;
	rv->regions = calloc(n ? n : 1, sizeof(*rv->regions));
	r = rv->regions ? 0 : -ENOMEM;
	if (r == 0)
		r = link_port(l, tpb_cuda_bus_id(tpb_rdma_reg_first_cuda(segs, n)), -1,
			      &rv->regs.port, why, wl);
	if (r == 0)
		r = tpb_rdma_reg_make(l->g, segs, n, &rv->regs, why, wl);
	if (r < 0) {
		tpb_rdma_recv_free(rv);
		return r == -ENOMEM ? r : -EOPNOTSUPP;
	}
	for (size_t i = 0; i < n; i++) {
		const struct rdma_reg *g = &rv->regs.r[i];

		rv->regions[i] = (struct tpb_rdma_region){
			.addr = g->addr,
			.rkey = g->rkey,
			.length = g->len,
			.cuda = segs[i].mem.loc == TPB_LOC_CUDA,
		};
	}
	tpb_rdma_timer_in_us(rv->g, &rv->timer, 0);
	*ret = rv;
	return 0;
}

void tpb_rdma_recv_offer(const struct tpb_rdma_recv *rv, struct tpb_rdma_offer *ret)
{
	*ret = (struct tpb_rdma_offer){
		.port = (uint32_t)(rv->regs.port - rv->regs.port->g->ports),
		.n = rv->regs.n,
		.regions = rv->regions,
	};
}

int tpb_rdma_recv_flush(struct tpb_rdma_recv *rv, char *why, size_t wl)
{
	for (size_t i = 0; rv && i < rv->regs.n; i++) {
		int r = tpb_cuda_rdma_flush(&rv->segs[i].mem, rv->segs[i].len, why, wl);

		if (r < 0)
			return r;
	}
	return 0;
}

void tpb_rdma_recv_free(struct tpb_rdma_recv *rv)
{
	if (!rv)
		return;
	tpb_rdma_timer_stop(&rv->timer);
	tpb_rdma_reg_free(&rv->regs);
	free(rv->regions);
	free(rv);
}

/* ---- send ---------------------------------------------------------------------------------- */

static void send_finish(struct rdma_send *s)
{
	struct tpb_rdma_xfer *x = s->x;

	tpu_list_remove(&s->node);
	tpb_rdma_reg_free(&s->regs);
	tpb_rdma_timer_stop(&s->timer);
	x->status = s->status ? s->status : s->canceled ? -ECANCELED : 0;
	snprintf(x->why, sizeof(x->why), "%s",
		 s->status ? s->why : s->canceled ? "transfer canceled" : "");
	x->bytes = x->status == 0 ? x->total : 0;
	x->ns = tpu_now_ns() - x->start_ns;
	s->l->sent += x->bytes;
	free(s->raddr);
	free(s->rkey);
	free(s);
	x->done(x);
}

static void send_fail(struct rdma_send *s, int err, const char *why)
{
	if (s->status)
		return;
	s->status = err;
	snprintf(s->why, sizeof(s->why), "%s: %s", s->channel, why);
}

/*
 * The device failed a write of @s: @s fails, and RDMA is off for the rest of the link's life
 * (a queue pair in error flushes everything after), so later transfers use the data
 * connections; the peer is told so its offers stop.
 */
static void send_broken(struct rdma_send *s, int err, const char *why)
{
	char text[200];

	send_fail(s, err, why);
	if (s->l->state != LINK_READY || s->l->closing)
		return;
	snprintf(text, sizeof(text), "RDMA write failed: %.160s", why);
	link_off_rebuild(s->l, text);
}

/* True while @s has writes to post and no reason to stop. */
static bool send_more(const struct rdma_send *s)
{
	return !s->status && !s->canceled && s->next < s->regs.n;
}

/* Posts the writes not posted yet, as far as the send queue takes them. */
static void send_post(struct rdma_send *s)
{
	char why[160] = "";

	s->posting = true;
	while (send_more(s)) {
		const struct rdma_reg *g = &s->regs.r[s->next];
		struct tpv_write w = { .local_addr = g->addr, .lkey = g->lkey,
				       .remote_addr = s->raddr[s->next], .rkey = s->rkey[s->next],
				       .len = g->len, .cookie = (uint64_t)(uintptr_t)s };
		int r = g->len ? tpv_qp_write(s->qp, &w, why, sizeof(why)) : 0;

		if (r == -ENOBUFS)
			break; /* again on the next completion */
		if (r < 0) {
			send_broken(s, r, why);
			break;
		}
		s->pending += g->len ? 1 : 0;
		s->next++;
	}
	s->posting = false;
}

void tpb_rdma_write_done(void *arg, uint64_t cookie, int status, const char *why)
{
	struct rdma_send *s = (struct rdma_send *)(uintptr_t)cookie;

	s->pending--;
	if (status < 0)
		send_broken(s, status, why);
	else
		s->l->rebuilds = 0; /* the link works */
	if (!s->posting)
		send_post(s);
	if (s->pending)
		return;
	/* Finish outside the drain; or the queue is full of other transfers' writes: retry. */
	tpb_rdma_timer_in_us(s->l->g, &s->timer, send_more(s) ? RDMA_POLL_US : 0);
}

static void send_on_timer(struct rdma_timer *t)
{
	struct rdma_send *s = tpu_container_of(t, struct rdma_send, timer);
	char why[160] = "";
	int r;

	if (s->pending)
		return; /* a completion re-arms */
	if (!s->status && !s->canceled && !s->events_ok) {
		r = events_done(s->x->segs, s->x->n_segs, why, sizeof(why));
		if (r == 0) {
			tpb_rdma_timer_in_us(s->l->g, &s->timer, RDMA_POLL_US);
			return;
		}
		if (r < 0)
			send_fail(s, r, why);
		s->events_ok = r > 0;
	}
	if (send_more(s)) {
		send_post(s);
		if (s->pending)
			return;
		if (send_more(s)) { /* the send queue is full of other transfers' writes */
			tpb_rdma_timer_in_us(s->l->g, &s->timer, RDMA_POLL_US);
			return;
		}
	}
	send_finish(s);
}

/* Checks @rr's offer against @x. Return: 0, -EOPNOTSUPP (no offer), -EPROTO. */
static int offer_check(const struct tpb_rdma_link *l, const struct tpb_rdma_xfer *x,
		       const struct tpb_rdma_offer *rr, char *why, size_t wl)
{
	if (!rr || rr->n == 0) {
		snprintf(why, wl, "the reader's daemon offered no RDMA region");
		return -EOPNOTSUPP;
	}
	if (rr->n != x->n_segs || rr->port >= l->n_remote) {
		snprintf(why, wl, "RDMA offer of %zu regions on port %u for %zu segments",
			 rr->n, rr->port, x->n_segs);
		return -EPROTO;
	}
	for (size_t i = 0; i < x->n_segs; i++) {
		if (rr->regions[i].length != x->segs[i].len) {
			snprintf(why, wl, "RDMA region %zu of %llu bytes for %llu", i,
				 (unsigned long long)rr->regions[i].length,
				 (unsigned long long)x->segs[i].len);
			return -EPROTO;
		}
	}
	return 0;
}

int tpb_rdma_send(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x,
		  const struct tpb_rdma_offer *rr, char *why, size_t wl)
{
	struct rdma_send *s;
	int r;

	if (!tpb_rdma_link_ready(l)) {
		snprintf(why, wl, "RDMA is not set up on this link");
		return -EOPNOTSUPP;
	}
	r = offer_check(l, x, rr, why, wl);
	if (r == 0) /* the reader offered RDMA for the kind of memory on its side and this one */
		r = tpb_rdma_reg_applicable(x->segs, x->n_segs, why, wl);
	if (r < 0)
		return r;
	s = calloc(1, sizeof(*s));
	if (!s)
		return -ENOMEM;
	s->l = l;
	s->x = x;
	s->channel = tpb_rdma_channel(tpb_rdma_reg_first_cuda(x->segs, x->n_segs), rr, false);
	s->raddr = calloc(x->n_segs ? x->n_segs : 1, sizeof(*s->raddr));
	s->rkey = calloc(x->n_segs ? x->n_segs : 1, sizeof(*s->rkey));
	s->timer.fn = send_on_timer;
	r = s->raddr && s->rkey ? 0 : -ENOMEM;
	if (r == 0)
		r = link_port(l, tpb_cuda_bus_id(tpb_rdma_reg_first_cuda(x->segs, x->n_segs)),
			      rr->port, &s->regs.port, why, wl);
	if (r == 0)
		r = tpb_rdma_reg_make(l->g, x->segs, x->n_segs, &s->regs, why, wl);
	if (r < 0) {
		free(s->raddr);
		free(s->rkey);
		free(s);
		return r == -ENOMEM ? r : -EOPNOTSUPP;
	}
	for (size_t i = 0; i < x->n_segs; i++) {
		s->raddr[i] = rr->regions[i].addr;
		s->rkey[i] = rr->regions[i].rkey;
	}
	s->qp = l->qps[(size_t)(s->regs.port - l->g->ports) * l->n_remote + rr->port];
	if (!s->qp) { /* link_port() chose a port with one: cannot happen */
		tpb_rdma_reg_free(&s->regs);
		free(s->raddr);
		free(s->rkey);
		free(s);
		snprintf(why, wl, "no queue pair to the reader's RDMA port %u", rr->port);
		return -EOPNOTSUPP;
	}
	x->total = 0;
	for (size_t i = 0; i < x->n_segs; i++)
		x->total += x->segs[i].len;
	x->start_ns = tpu_now_ns();
	tpu_list_insert_tail(&l->sends, &s->node);
	tpb_rdma_timer_in_us(l->g, &s->timer, 0);
	return 0;
}

void tpb_rdma_send_cancel(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x)
{
	struct rdma_send *s;

	tpu_list_for_each(s, &l->sends, node) {
		if (s->x != x)
			continue;
		s->canceled = true;
		if (!s->pending)
			tpb_rdma_timer_in_us(l->g, &s->timer, 0);
		return;
	}
}

void tpb_rdma_link_free(struct tpb_rdma_link *l)
{
	struct rdma_send *s, *tmp;
	size_t n;

	if (!l)
		return;
	l->closing = true;
	tpb_rdma_timer_stop(&l->rebuild);
	tpu_list_for_each(s, &l->sends, node)
		send_fail(s, -ECONNRESET, "peer link closed");
	/* Closing flushes the writes still pending through tpb_rdma_write_done(). */
	n = l->qps ? l->g->n * l->n_remote : 0;
	for (size_t k = 0; k < n; k++) {
		if (!l->qps[k])
			continue;
		tpv_qp_close(l->qps[k], tpb_rdma_write_done, l->g);
		tpb_rdma_port_put(&l->g->ports[k / l->n_remote]);
	}
	tpu_list_for_each_safe(s, tmp, &l->sends, node) {
		s->pending = 0;
		send_finish(s);
	}
	/* Receives started through the op table end too (ep.c). */
	tpb_rdma_ep_flush(l);

	tpu_list_remove(&l->node);
	free(l->qps);
	free(l->pairs);
	free(l);
}

#else /* !HAVE_RDMA */
struct tpb_rdma_link *tpb_rdma_link_new(struct tpb_rdma *g, void *link, unsigned peer_offers)
{
	return NULL;
}

void tpb_rdma_link_free(struct tpb_rdma_link *l)
{
}

void tpb_rdma_link_on_msg(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m)
{
}

bool tpb_rdma_link_ready(const struct tpb_rdma_link *l)
{
	return false;
}

const char *tpb_rdma_link_state(const struct tpb_rdma_link *l)
{
	return "";
}

void tpb_rdma_link_bytes(const struct tpb_rdma_link *l, uint64_t *sent, uint64_t *received)
{
	*sent = 0;
	*received = 0;
}

void tpb_rdma_link_received(struct tpb_rdma_link *l, uint64_t bytes)
{
}

int tpb_rdma_recv_new(struct tpb_rdma_link *l, const struct tpb_rdma_seg *segs, size_t n,
		      bool src_cuda, tpb_rdma_ready_fn ready, void *arg, struct tpb_rdma_recv **ret,
		      char *why, size_t wl)
{
	snprintf(why, wl, "tpipd was built without RDMA or CUDA support");
	return -EOPNOTSUPP;
}

void tpb_rdma_recv_offer(const struct tpb_rdma_recv *rv, struct tpb_rdma_offer *ret)
{
	*ret = (struct tpb_rdma_offer){ 0 };
}

void tpb_rdma_recv_free(struct tpb_rdma_recv *rv)
{
}

int tpb_rdma_recv_flush(struct tpb_rdma_recv *rv, char *why, size_t wl)
{
	return 0;
}

int tpb_rdma_send(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x,
		  const struct tpb_rdma_offer *rr, char *why, size_t wl)
{
	snprintf(why, wl, "tpipd was built without RDMA or CUDA support");
	return -EOPNOTSUPP;
}

void tpb_rdma_send_cancel(struct tpb_rdma_link *l, struct tpb_rdma_xfer *x)
{
}

#endif
