/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma and cuda_gdr on peer links: queue-pair set-up per link, its rebuild after a failed write,
 * and freeing the link. See rdma.h. Receives and sends on a set-up link are xfer.c's; the
 * context, its ports and event fd ctx.c's, registration and its cache reg.c's, the link's
 * op-table endpoint ep.c's.
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
		tpb_rdma_send_fail(s, -ECONNRESET, "RDMA queue pairs rebuilt");
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

void tpb_rdma_link_off_rebuild(struct tpb_rdma_link *l, const char *why)
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

/*
 * The rail a port that cannot be opened announces: kind 0, which no port's rail has (see
 * port_rail() in verbs/nic.c), so that no pair is made with it on either side.
 */
static const uint8_t rail_unusable[TPV_RAIL_BYTES];

/* True if local port @i opens (or is open); a port that failed once stays skipped. */
static bool link_port_usable(struct tpb_rdma_link *l, size_t i)
{
	struct rdma_port *pt = &l->g->ports[i];
	char why[8];

	if (pt->ctx)
		return true;
	if (tpb_rdma_port_open(pt, why, sizeof(why)) < 0)
		return false; /* logged once by tpb_rdma_port_open() */
	tpb_rdma_port_put(pt);
	return true;
}

/* Is the peer's rail @r one it can use (its port opened)? */
static bool rail_usable(const struct tpb_rdma_record *r)
{
	return r->len == TPV_RAIL_BYTES && memcmp(r->data, rail_unusable, TPV_RAIL_BYTES);
}

/* The first set-up step: this side's ports and their rails (none if memory is short); a port
 * that does not open announces rail_unusable. */
static void link_announce(struct tpb_rdma_link *l)
{
	struct tpb_rdma_record *rails = calloc(l->g->n ? l->g->n : 1, sizeof(*rails));
	struct tpb_rdma_setup rm = { .ports = (uint32_t)l->g->n };

	for (size_t i = 0; rails && i < l->g->n; i++)
		rails[i] = (struct tpb_rdma_record){
			link_port_usable(l, i) ? l->g->nics[i].rail : rail_unusable,
			TPV_RAIL_BYTES };
	rm.n_rails = rails ? l->g->n : 0;
	rm.rails = rails;
	link_send(l, &rm);
	free(rails);
}

/* Can (local port @i, remote port @j) get a queue pair: neither side failed to open its port. */
static bool pair_usable(const struct tpb_rdma_link *l, const struct tpb_rdma_setup *m, size_t i,
			size_t j)
{
	if (l->g->ports[i].why[0])
		return false;
	return m->n_rails != l->n_remote || rail_usable(&m->rails[j]);
}

/*
 * Which (local port, remote port) pairs get a queue pair: those on the same rail, if the peer
 * sent its rails and some pair shares one; else every pair (a peer that does not say, or
 * networks routed to each other: as before rails). Never a port either side could not open.
 * The peer decides alike from the same keys. Return: 0 or -ENOMEM; -ENODEV (@why) when no
 * pair is left.
 */
static int link_pairs(struct tpb_rdma_link *l, const struct tpb_rdma_setup *m, char *why,
		      size_t wl)
{
	size_t n = l->g->n * l->n_remote;

	l->pairs = calloc(n ? n : 1, sizeof(*l->pairs));
	if (!l->pairs)
		return -ENOMEM;
	l->n_pairs = 0;
	for (size_t i = 0; m->n_rails == l->n_remote && i < l->g->n; i++) {
		for (size_t j = 0; j < l->n_remote; j++) {
			bool same = pair_usable(l, m, i, j) &&
				    !memcmp(m->rails[j].data, l->g->nics[i].rail, TPV_RAIL_BYTES);

			l->pairs[i * l->n_remote + j] = same;
			l->n_pairs += same;
		}
	}
	if (l->n_pairs)
		return 0;
	for (size_t k = 0; k < n; k++) {
		l->pairs[k] = pair_usable(l, m, k / l->n_remote, k % l->n_remote);
		l->n_pairs += l->pairs[k];
	}
	if (l->n_pairs)
		return 0;
	snprintf(why, wl, "no RDMA port opens on one side or the other");
	return -ENODEV;
}

struct tpb_rdma_link *tpb_rdma_link_new(struct tpb_rdma *g, void *link, unsigned peer_offers)
{
	unsigned common = tpb_rdma_offers(g) & peer_offers;
	struct tpb_rdma_link *l;

	if (!common || !(l = calloc(1, sizeof(*l))))
		return NULL;
	l->g = g;
	l->link = link;
	l->id = ++g->link_ids;
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
		r = link_pairs(l, m, why, sizeof(why));
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

void tpb_rdma_link_free(struct tpb_rdma_link *l)
{
	struct rdma_send *s, *tmp;
	size_t n;

	if (!l)
		return;
	l->closing = true;
	tpb_rdma_timer_stop(&l->rebuild);
	tpu_list_for_each(s, &l->sends, node)
		tpb_rdma_send_fail(s, -ECONNRESET, "peer link closed");
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
		tpb_rdma_send_finish(s);
	}
	/* Receives started through the op table end too (ep.c). */
	tpb_rdma_ep_flush(l);

	tpu_list_remove(&l->node);
	free(l->qps);
	free(l->pairs);
	free(l);
}

void tpb_rdma_link_note_regs(struct tpb_rdma_link *l, const struct rdma_regs *rg)
{
	static const char *const says[RDMA_REG_METHODS] = {
		[RDMA_REG_CLIENT_DMABUF] = "from the dma-buf its client exported",
		[RDMA_REG_DMABUF] = "from a dma-buf the daemon exported of its IPC mapping",
		[RDMA_REG_ADDR] = "by its device address (peer memory)",
	};

	for (size_t i = 0; i < rg->n; i++) {
		int m = tpb_rdma_reg_method(rg, i);

		if (m < 0)
			continue;
		if (!l->reg_by[m]++)
			tpu_log(TPU_LOG_INFO, "peer %s: RDMA registers CUDA memory %s",
				link_text(l), says[m]);
	}
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

#endif
