/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * rdma and cuda_gdr transfers on a set-up peer link: receives (registration and the offer) and
 * sends (RDMA writes posted on the link's queue pairs, their completions). See rdma.h. Setting
 * the link's queue pairs up, rebuilding them and freeing the link are link.c's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpconfig.h"
#include "log.h"
#include "rdma_int.h"
#include "tpb.h"

#if HAVE_RDMA

#define RDMA_POLL_US 50 /* CUDA event polling period while a transfer waits */

struct tpb_rdma_recv {
	struct rdma_regs regs;
	const struct tpb_rdma_seg *segs;
	struct tpb_rdma *g;
	struct rdma_timer timer; /* polls the mappings to open, then the reader's CUDA events */
	tpb_rdma_ready_fn ready;
	void *arg;
	struct tpb_rdma_region *regions;
	uint64_t link_id; /* its link's tpb_rdma_link.id (the receive may outlive the link) */
	bool registered;  /* @regs made: the mappings were open */
	struct rdma_busy busy; /* the reader's CUDA mappings, busy from open to end */
};

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

/* ---- the CUDA mappings a transfer keeps busy ----------------------------------------------- */

int tpb_rdma_busy_on(struct rdma_busy *b, const struct tpb_rdma_seg *segs, size_t n)
{
	if (b->on)
		return 0;
	free(b->maps);
	b->n = 0;
	b->maps = calloc(2 * n + 1, sizeof(*b->maps));
	if (!b->maps)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (!segs[i].len || segs[i].mem.loc != TPB_LOC_CUDA)
			continue;
		b->maps[b->n++] = tpb_cuda_map_ref(segs[i].mem.cuda);
		if (segs[i].mem.event)
			b->maps[b->n++] = tpb_cuda_map_ref(segs[i].mem.event);
	}
	tpb_cuda_maps_busy(b->maps, b->n);
	b->on = true;
	return 0;
}

/* Hands @b's busy mappings to the worker to go idle, and drops @b's references to them (the
 * request holds its own). Return: the request (owned), or NULL. */
static struct tpb_cuda_idle *busy_release(struct rdma_busy *b)
{
	struct tpb_cuda_idle *q;

	if (!b->on)
		return NULL;
	q = tpb_cuda_maps_idle_bg(b->maps, b->n);
	for (size_t i = 0; i < b->n; i++)
		tpb_cuda_map_unref(b->maps[i]);
	b->n = 0;
	b->on = false;
	return q;
}

bool tpb_rdma_busy_off(struct rdma_busy *b)
{
	if (b->on)
		b->idle = busy_release(b);
	if (!tpb_cuda_idle_done(b->idle))
		return false;
	tpb_cuda_idle_put(b->idle);
	b->idle = NULL;
	return true;
}

void tpb_rdma_busy_free(struct rdma_busy *b)
{
	if (b->on)
		b->idle = busy_release(b);
	tpb_cuda_idle_put(b->idle);
	free(b->maps);
	*b = (struct rdma_busy){ 0 };
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

/* 1 when the mapping of every CUDA segment is open, 0 while some are opening (on the CUDA
 * layer's worker: cuIpcOpenMemHandle may block for long), -errno. */
static int maps_open(const struct tpb_rdma_seg *segs, size_t n, char *why, size_t wl)
{
	int all = 1;

	for (size_t i = 0; i < n; i++) {
		int r = segs[i].len ? tpb_cuda_gdr_poll_open(&segs[i].mem, why, wl) : 1;

		if (r < 0)
			return r;
		all &= r;
	}
	return all;
}

/*
 * maps_open() of @segs, and once they are open, @b marks them busy, so that a transfer ending
 * on the same memory (tpb_rdma_busy_off()) cannot close them before this one ends; then asked
 * again (one closed meanwhile: not open yet, opened again). Never waits for an open.
 */
static int busy_open(struct rdma_busy *b, const struct tpb_rdma_seg *segs, size_t n, char *why,
		     size_t wl)
{
	int r = maps_open(segs, n, why, wl);

	if (r <= 0 || b->on)
		return r;
	r = tpb_rdma_busy_on(b, segs, n);
	return r < 0 ? r : maps_open(segs, n, why, wl);
}

/* The link of @g whose id is @id, or NULL (it went). */
static struct tpb_rdma_link *link_by_id(struct tpb_rdma *g, uint64_t id)
{
	struct tpb_rdma_link *l;

	tpu_list_for_each(l, &g->links, node)
		if (l->id == id)
			return l;
	return NULL;
}

/* Registers @rv's destination (its mappings open; the registration worker makes new regions)
 * and fills its regions for the offer. Return: 1 done, 0 registering (ask again), -errno. */
static int recv_register(struct tpb_rdma_recv *rv, char *why, size_t wl)
{
	struct tpb_rdma_link *l;
	int r = tpb_rdma_reg_make(rv->g, rv->segs, rv->regs.n, &rv->regs, why, wl);

	if (r <= 0)
		return r;
	l = link_by_id(rv->g, rv->link_id);
	if (l)
		tpb_rdma_link_note_regs(l, &rv->regs);
	for (size_t i = 0; i < rv->regs.n; i++) {
		const struct rdma_reg *g = &rv->regs.r[i];

		rv->regions[i] = (struct tpb_rdma_region){
			.addr = g->addr,
			.rkey = g->rkey,
			.length = g->len,
			.cuda = rv->segs[i].mem.loc == TPB_LOC_CUDA,
		};
	}
	rv->registered = true;
	return 1;
}

static void recv_on_timer(struct rdma_timer *t)
{
	struct tpb_rdma_recv *rv = tpu_container_of(t, struct tpb_rdma_recv, timer);
	char why[160] = "";
	int r = rv->registered ? 1 : busy_open(&rv->busy, rv->segs, rv->regs.n, why, sizeof(why));

	if (r > 0 && !rv->registered)
		r = recv_register(rv, why, sizeof(why));
	if (r > 0 || (r == 0 && rv->registered))
		r = events_done(rv->segs, rv->regs.n, why, sizeof(why));
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
	rv->regs.n = n;
	rv->g = l->g;
	rv->link_id = l->id;
	rv->timer.fn = recv_on_timer;
	rv->ready = ready;
	rv->arg = arg;
	rv->regions = calloc(n ? n : 1, sizeof(*rv->regions));
	r = rv->regions ? 0 : -ENOMEM;
	if (r == 0)
		r = link_port(l, tpb_cuda_bus_id(tpb_rdma_reg_first_cuda(segs, n)), -1,
			      &rv->regs.port, why, wl);
	/* Mappings not open yet are opened off the loop, and new regions are registered off it:
	 * the timer goes on once they are (a failure then reaches @ready, and the reader goes
	 * without RDMA). */
	if (r == 0 && (r = busy_open(&rv->busy, segs, n, why, wl)) > 0)
		r = recv_register(rv, why, wl);
	if (r < 0) {
		tpb_rdma_recv_free(rv);
		return r == -ENOMEM ? r : -EOPNOTSUPP;
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

struct tpb_cuda_idle *tpb_rdma_recv_end(struct tpb_rdma_recv *rv)
{
	struct tpb_cuda_idle *q;

	if (!rv)
		return NULL;
	tpb_rdma_timer_stop(&rv->timer);
	tpb_rdma_reg_free(&rv->regs);
	q = busy_release(&rv->busy);
	return q;
}

void tpb_rdma_recv_free(struct tpb_rdma_recv *rv)
{
	if (!rv)
		return;
	tpb_rdma_timer_stop(&rv->timer);
	tpb_rdma_reg_free(&rv->regs);
	tpb_rdma_busy_free(&rv->busy);
	free(rv->regions);
	free(rv);
}

/* ---- send ---------------------------------------------------------------------------------- */

void tpb_rdma_send_finish(struct rdma_send *s)
{
	struct tpb_rdma_xfer *x = s->x;

	tpu_list_remove(&s->node);
	tpb_rdma_reg_free(&s->regs);
	tpb_rdma_busy_free(&s->busy); /* a link going: idle on the worker, unwaited */
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

void tpb_rdma_send_fail(struct rdma_send *s, int err, const char *why)
{
	if (s->status || s->ending) /* ending: every write completed already */
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

	tpb_rdma_send_fail(s, err, why);
	if (s->l->state != LINK_READY || s->l->closing)
		return;
	snprintf(text, sizeof(text), "RDMA write failed: %.160s", why);
	tpb_rdma_link_off_rebuild(s->l, text);
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

/*
 * Registers @s's sources (their mappings open; the registration worker makes new regions) on
 * the port link_port() chose, and finds the queue pair to the reader's port. Return: 1, 0 while
 * registering (ask again), or -errno (reason in @why) with nothing held.
 */
static int send_register(struct rdma_send *s, char *why, size_t wl)
{
	struct tpb_rdma_link *l = s->l;
	int r;

	if (!tpb_rdma_link_ready(l)) /* it went off while the mappings opened */
		return tpu_why(-EOPNOTSUPP, why, wl, "RDMA is not set up on this link");
	r = tpb_rdma_reg_make(l->g, s->x->segs, s->x->n_segs, &s->regs, why, wl);
	if (r <= 0)
		return r;
	s->qp = l->qps[(size_t)(s->regs.port - l->g->ports) * l->n_remote + s->rport];
	if (!s->qp) { /* link_port() chose a port with one: cannot happen */
		tpb_rdma_reg_free(&s->regs);
		return tpu_why(-EOPNOTSUPP, why, wl, "no queue pair to the reader's RDMA port %u",
			       s->rport);
	}
	s->registered = true;
	tpb_rdma_link_note_regs(l, &s->regs);
	return 1;
}

/*
 * A send whose sources' mappings were still opening, or whose registration runs on the
 * worker: registers them once open, polls the registration. Return: 1
 * registered, 0 not yet (the timer polls again), -1 the send failed (-EOPNOTSUPP, nothing
 * written: its caller may use the stripe).
 */
static int send_poll_register(struct rdma_send *s)
{
	char why[160] = "";
	int r = busy_open(&s->busy, s->x->segs, s->x->n_segs, why, sizeof(why));

	if (r > 0)
		r = send_register(s, why, sizeof(why));
	if (r == 0) {
		tpb_rdma_timer_in_us(s->l->g, &s->timer, RDMA_POLL_US);
		return 0;
	}
	if (r < 0) {
		tpb_rdma_send_fail(s, -EOPNOTSUPP, why);
		return -1;
	}
	return 1;
}

/*
 * @s wrote all it will: its registrations go, then its CUDA mappings go idle on the worker
 * (closed there if no session holds them), and only then does it finish, so that its writer is
 * never told its write ended while the daemon still maps the memory (polled by the timer).
 */
static void send_end(struct rdma_send *s)
{
	s->ending = true;
	tpb_rdma_reg_free(&s->regs);
	if (!tpb_rdma_busy_off(&s->busy)) {
		tpb_rdma_timer_in_us(s->l->g, &s->timer, RDMA_POLL_US);
		return;
	}
	tpb_rdma_send_finish(s);
}

static void send_on_timer(struct rdma_timer *t)
{
	struct rdma_send *s = tpu_container_of(t, struct rdma_send, timer);
	char why[160] = "";
	int r;

	if (s->pending)
		return; /* a completion re-arms */
	if (s->ending) {
		send_end(s);
		return;
	}
	if (!s->registered && !s->status && !s->canceled && send_poll_register(s) == 0)
		return;
	if (!s->status && !s->canceled && !s->events_ok) {
		r = events_done(s->x->segs, s->x->n_segs, why, sizeof(why));
		if (r == 0) {
			tpb_rdma_timer_in_us(s->l->g, &s->timer, RDMA_POLL_US);
			return;
		}
		if (r < 0)
			tpb_rdma_send_fail(s, r, why);
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
	send_end(s);
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

/* Frees @s, never started (no registration held, not in its link's sends). */
static void send_free_unstarted(struct rdma_send *s)
{
	tpb_rdma_busy_free(&s->busy);
	free(s->raddr);
	free(s->rkey);
	free(s);
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
	s->rport = rr->port;
	s->channel = tpb_rdma_channel(tpb_rdma_reg_first_cuda(x->segs, x->n_segs), rr, false);
	s->raddr = calloc(x->n_segs ? x->n_segs : 1, sizeof(*s->raddr));
	s->rkey = calloc(x->n_segs ? x->n_segs : 1, sizeof(*s->rkey));
	s->timer.fn = send_on_timer;
	r = s->raddr && s->rkey ? 0 : -ENOMEM;
	if (r == 0)
		r = link_port(l, tpb_cuda_bus_id(tpb_rdma_reg_first_cuda(x->segs, x->n_segs)),
			      rr->port, &s->regs.port, why, wl);
	/* Sources whose mappings are not open yet are opened off the loop (the CUDA layer's
	 * worker), and registered off it (the registration worker); the timer goes on once they
	 * are, and a failure then completes the send with -EOPNOTSUPP, nothing written (the
	 * caller sends over the stripe). */
	if (r == 0 && (r = busy_open(&s->busy, x->segs, x->n_segs, why, wl)) > 0)
		r = send_register(s, why, wl);
	if (r < 0) {
		send_free_unstarted(s);
		return r == -ENOMEM ? r : -EOPNOTSUPP;
	}
	for (size_t i = 0; i < x->n_segs; i++) {
		s->raddr[i] = rr->regions[i].addr;
		s->rkey[i] = rr->regions[i].rkey;
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

#else /* !HAVE_RDMA */
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
