/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon's fan-out (Broadcast, issue 25): one message from a writer to several of its pipes,
 * with the writer's memory read once. Each target becomes an ordinary message of its pipe
 * (tpd_pipe_write_one(): its own descriptor, its place in the pipe's order, its own WriteDone),
 * so readers read it as any message. Shared-buffer sources are read in place by every reader's
 * copy; private memory (cma_addr) is read once, by a copy job on the copier, into daemon staging
 * that the local readers' copies then read, each waiting for that one read (and failing with
 * it). A CUDA source with two or more local readers is staged the same way, but only at the
 * first read that wants it in CPU memory (tpd_bcast_cuda_src()), into staging of its own (a
 * message with both is read once for each, and a delivery waits for the reads it copies from):
 * one copy job reads the device into it for every reader into CPU memory, while the WriteDones
 * and the pipes' PipeClosed wait for that read (tpd_bcast_holds(), pipe->stage_reads: the
 * writer frees its memory once its broadcast is done); a reader into CUDA memory gets its
 * device-to-device copy from the source, as a Write's. Staging is charged to the writer's uid
 * (bcast-stage-bytes-per-uid); above the limit each delivery reads the writer's memory as a
 * Write would. Readers on another host get the message once per link (PeerBcast), CUDA sources
 * included: the far daemon reads it once into its host staging, charged to the peer that sent
 * it (tpd_peer_principal(): all its links together), and delivers its readers from there; that
 * staging goes as soon as no reader wants it. It does not decide what a message is or how it
 * is copied (msg.c, pipe.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "peer.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

#define STAGE_ALIGN 64u

/* One principal's staging bytes held now: a local uid, or a peer (tpd_peer_principal(), never
 * a link: every link of one peer shares its limit) for the fan-out of its broadcasts. */
struct bcast_uid {
	struct tpu_list node;
	uint64_t key;	/* the uid; 0 for a peer */
	uint64_t bytes;
	char peer[TPD_PEER_PRINCIPAL_LEN]; /* the peer, "" for a uid */
};

/* The staging reads of one broadcast, each a bit of tpd_msg.bcast_reads: its private segments
 * (at the broadcast; a far daemon's: every segment, received once) and its CUDA segments (at
 * the first local read into CPU memory). */
enum { STAGE_PRIV, STAGE_CUDA, STAGE_N };

#define STAGE_BIT(k) ((uint8_t)(1u << (k)))

/* One read of some of a broadcast's segments into daemon staging, and what it became. */
struct bcast_stage {
	struct tpd_bcast *bc;
	uint8_t *buf;	  /* the staging copy, charged to bc->key or bc->peer_key */
	uint64_t len;
	uint64_t *off;	  /* per segment: its offset in @buf, UINT64_MAX when not staged here */
	bool reading;	  /* the staging read runs */
	struct tpb_copy_job *job; /* ... this one, on this host (NULL once it ended) */
	bool dev;	  /* it reads the writer's CUDA memory: the WriteDones wait for it */
	bool abandoned;	  /* every delivery was done before it: tpb_copier_abandon() */
	int err;	  /* < 0: it failed */
	char why[160];
	struct tpd_pipe **pipes; /* while @dev is read: the pipes of bc->msgs (pipe->stage_reads) */
	size_t n_pipes;
};

struct tpd_bcast {
	unsigned refs;
	struct tpd_broker *broker;
	uint64_t key;	  /* whose staging (struct bcast_uid): the writer's uid */
	size_t n_seg;
	struct bcast_stage st[STAGE_N];
	bool cuda;	  /* its local deliveries' CUDA sources may be staged at their first read
			   * into CPU memory (tpd_bcast_cuda_src()) */
	bool cuda_tried;  /* ... that first read came: staged, or over the limit */
	struct tpd_msg **msgs; /* deliveries that may read the staging (NULL once freed), @n_msgs */
	size_t n_msgs;
	struct tpd_msg **xmsgs; /* writer's side: targets to announce in a PeerBcast */
	size_t n_xmsgs;
	bool no_xbcast;	  /* a pipe named twice: every target gets its own PeerDescriptor */
	/* A far daemon's broadcast (tpd_bcast_peer()): the message whose receive fills the
	 * staging, while it runs (NULL once it ended), and whether it was told to stop. */
	bool peer;
	char *peer_key;	  /* ... charged to its peer (tpd_peer_principal()), not to a uid */
	struct tpd_msg *carrier;
	bool stopping;
};

const struct tpd_bcast_stats *tpd_bcast_stats(const struct tpd_broker *b)
{
	return &b->bcast;
}

/* The account of uid @key, or of peer @peer when not NULL; NULL if it holds nothing. */
static struct bcast_uid *uid_find(struct tpd_broker *b, uint64_t key, const char *peer)
{
	struct bcast_uid *u;

	tpu_list_for_each(u, &b->bcast_uids, node) {
		if (peer ? strcmp(u->peer, peer) == 0 : !u->peer[0] && u->key == key)
			return u;
	}
	return NULL;
}

/* Charges @len staging bytes to @bc's principal within @limit. Return: 0, -EDQUOT or -ENOMEM. */
static int uid_charge(const struct tpd_bcast *bc, uint64_t len, uint64_t limit)
{
	struct tpd_broker *b = bc->broker;
	struct bcast_uid *u = uid_find(b, bc->key, bc->peer_key);
	uint64_t held = u ? u->bytes : 0;

	if (len > limit || held > limit - len)
		return -EDQUOT;
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return -ENOMEM;
		u->key = bc->key;
		if (bc->peer_key)
			snprintf(u->peer, sizeof(u->peer), "%s", bc->peer_key);
		tpu_list_insert_tail(&b->bcast_uids, &u->node);
	}
	u->bytes += len;
	b->bcast.stage_held += len;
	return 0;
}

static void uid_release(const struct tpd_bcast *bc, uint64_t len)
{
	struct tpd_broker *b = bc->broker;
	struct bcast_uid *u = uid_find(b, bc->key, bc->peer_key);

	if (!u)
		return;
	u->bytes -= TPU_MIN(len, u->bytes);
	b->bcast.stage_held -= TPU_MIN(len, b->bcast.stage_held);
	if (u->bytes == 0) {
		tpu_list_remove(&u->node);
		free(u);
	}
}

static void peer_unwanted(struct tpd_bcast *bc);

static struct tpd_bcast *bcast_ref(struct tpd_bcast *bc)
{
	bc->refs++;
	return bc;
}

static void bcast_unref(struct tpd_bcast *bc)
{
	if (!bc || --bc->refs > 0)
		return;
	for (size_t k = 0; k < STAGE_N; k++) {
		struct bcast_stage *st = &bc->st[k];

		if (st->buf)
			uid_release(bc, st->len);
		free(st->buf);
		free(st->off);
		free(st->pipes);
	}
	free(bc->msgs);
	free(bc->xmsgs);
	free(bc->peer_key);
	free(bc);
}

/* ---- the staging of a far daemon's broadcast: held while a delivery needs it -------------- */

/* Whether delivery @m of a far daemon's broadcast still needs the staging: a copy out of it
 * runs, or its reader is there and has not finished with it. */
static bool peer_needs(const struct tpd_msg *m)
{
	if (!m)
		return false;
	if (m->copying && !m->xh) /* the carrier's own receive is not a reader */
		return true;
	return !m->write_ready && !tpd_pipe_end_dying(tpd_pipe_end_peer(m->from));
}

/* Frees the staging of far daemon's broadcast @bc once its receive ended and no delivery needs
 * it (at once when the receive failed: no delivery reads it then); a delivery that would still
 * copy out of it fails. */
static void peer_stage_drop(struct tpd_bcast *bc)
{
	struct bcast_stage *st = &bc->st[STAGE_PRIV];

	if (!st->buf || st->reading)
		return;
	for (size_t i = 0; st->err == 0 && i < bc->n_msgs; i++)
		if (peer_needs(bc->msgs[i]))
			return;
	if (st->err == 0) {
		st->err = -ECANCELED;
		snprintf(st->why, sizeof(st->why), "the broadcast's staging was freed: no reader "
			 "wanted it any more");
	}
	uid_release(bc, st->len);
	free(st->buf);
	st->buf = NULL;
}

/* No delivery of far daemon's broadcast @bc may need its staging any more: stops its receive
 * (it ends in tpd_bcast_staged()), or frees it once that ended. */
static void peer_unwanted(struct tpd_bcast *bc)
{
	struct bcast_stage *st = &bc->st[STAGE_PRIV];

	for (size_t i = 0; i < bc->n_msgs; i++)
		if (peer_needs(bc->msgs[i]))
			return;
	if (st->reading && bc->carrier && bc->carrier->xh && !bc->stopping) {
		bc->stopping = true;
		tpd_xh_stage_stop(bc->carrier->xh, -ECANCELED,
				  "every reader of the broadcast left");
		return;
	}
	peer_stage_drop(bc);
}

void tpd_bcast_unwanted(struct tpd_msg *m)
{
	if (m->bcast && m->bcast->peer)
		peer_unwanted(m->bcast);
}

void tpd_bcast_attach(struct tpd_bcast *bc, struct tpd_msg *m, const struct tpd_pipe_end *r)
{
	const struct bcast_stage *st = bc ? &bc->st[STAGE_PRIV] : NULL;

	if (!bc || (!st->buf && !bc->cuda) || r->remote || bc->n_seg != m->n_src)
		return;
	for (size_t i = 0; st->buf && i < m->n_src; i++) {
		struct tpd_msg_src *src = &m->src[i];

		if (st->off[i] == UINT64_MAX || src->mem.loc != TPB_LOC_PROCESS)
			continue;
		tpb_proc_unref(src->mem.proc);
		src->mem = (struct tpb_mem){ .loc = TPB_LOC_LOCAL };
		src->mem.addr = (uint64_t)(uintptr_t)(st->buf + st->off[i]);
	}
	m->bcast_reads = st->buf ? STAGE_BIT(STAGE_PRIV) : 0;
	m->bcast = bcast_ref(bc);
	m->bcast_slot = bc->n_msgs;
	bc->msgs[bc->n_msgs++] = m;
}

void tpd_bcast_detach(struct tpd_msg *m)
{
	struct tpd_bcast *bc = m->bcast;

	if (!bc)
		return;
	bc->msgs[m->bcast_slot] = NULL;
	m->bcast = NULL;
	if (bc->peer && bc->refs > 1)
		peer_unwanted(bc);
	bcast_unref(bc);
}

int tpd_bcast_error(const struct tpd_msg *m, const char **why)
{
	for (size_t k = 0; m->bcast && k < STAGE_N; k++) {
		const struct bcast_stage *st = &m->bcast->st[k];

		if (!(m->bcast_reads & STAGE_BIT(k)) || st->err == 0)
			continue;
		if (why)
			*why = st->why;
		return st->err;
	}
	return 0;
}

bool tpd_bcast_waiting(const struct tpd_msg *m)
{
	bool reading = false;

	for (size_t k = 0; m->bcast && k < STAGE_N; k++)
		reading |= (m->bcast_reads & STAGE_BIT(k)) && m->bcast->st[k].reading;
	/* a read that failed fails the delivery now, whatever its other reads do */
	return reading && tpd_bcast_error(m, NULL) == 0;
}

/* The pipes of the deliveries of @st's read of the device: their PipeClosed and freeing may go. */
static void stage_pipes_release(struct bcast_stage *st)
{
	for (size_t i = 0; i < st->n_pipes; i++) {
		struct tpd_pipe *p = st->pipes[i];

		if (--p->stage_reads > 0)
			continue;
		tpd_pipe_end_owed_maybe(&p->end[0]);
		tpd_pipe_end_owed_maybe(&p->end[1]);
		tpd_pipe_maybe_free(p);
	}
	st->n_pipes = 0;
}

/* A staging read is done: let the deliveries that wait for it go (or fail). */
static void stage_on_done(struct tpb_copy_job *job)
{
	struct bcast_stage *st = job->arg;
	struct tpd_bcast *bc = st->bc;

	st->reading = false;
	st->job = NULL;
	if (job->status < 0) {
		st->err = job->status == -ESRCH ? -ECONNRESET : job->status;
		snprintf(st->why, sizeof(st->why), "reading the broadcast's source failed: %.100s",
			 job->status == -ESRCH ? "its writer died"
			 : job->why[0]	       ? job->why
						 : strerror(-job->status));
	} else {
		bc->broker->bcast.staged_bytes += job->bytes;
	}
	tpb_copier_job_free(job);
	for (size_t i = 0; i < bc->n_msgs; i++)
		if (bc->msgs[i])
			tpd_pipe_start_next_copy(bc->msgs[i]->from);
	/* the WriteDones held while the device was read (tpd_bcast_holds()), then the pipes'
	 * PipeClosed and freeing */
	for (size_t i = 0; st->dev && i < bc->n_msgs; i++)
		if (bc->msgs[i])
			tpd_pipe_write_flush(bc->msgs[i]->from);
	stage_pipes_release(st);
	bcast_unref(bc); /* the job's */
}

/* @bc's staging read of the device that runs now, or NULL (the private one never reads it). */
static struct bcast_stage *stage_dev_reading(struct tpd_bcast *bc)
{
	for (size_t k = 0; bc && k < STAGE_N; k++)
		if (bc->st[k].reading && bc->st[k].dev && bc->st[k].job)
			return &bc->st[k];
	return NULL;
}

bool tpd_bcast_holds(struct tpd_msg *m)
{
	struct bcast_stage *st = stage_dev_reading(m->bcast);
	bool all_done = true;

	if (!st)
		return false;
	for (size_t i = 0; i < st->bc->n_msgs; i++)
		all_done &= !st->bc->msgs[i] || st->bc->msgs[i]->write_ready;
	if (all_done && !st->abandoned) {
		/* nobody reads the staging any more: stop reading the device (its chunks not
		 * started fail at once); the WriteDones still wait for the end of the read */
		st->abandoned = true;
		tpb_copier_abandon(tpd_daemon_copier(m->from->pipe->d), st->job);
	}
	return true;
}

static const Tpw__V1__Segment *bcast_segment(const Tpw__V1__Write *w, size_t i)
{
	return i < w->n_payloads ? w->payloads[i]->data : w->tensors[i - w->n_payloads]->data;
}

/* Whether @w has bytes in CUDA memory. */
static bool has_cuda(const Tpw__V1__Write *w)
{
	for (size_t i = 0; i < w->n_payloads + w->n_tensors; i++) {
		const Tpw__V1__Segment *seg = bcast_segment(w, i);

		if (seg->loc_case == TPW__V1__SEGMENT__LOC_CUDA && seg->length)
			return true;
	}
	return false;
}

/* The bytes @w's private segments need in staging (each aligned), 0 without any. */
static uint64_t stage_need(const Tpw__V1__Write *w, uint64_t *off)
{
	uint64_t total = 0;

	for (size_t i = 0; i < w->n_payloads + w->n_tensors; i++) {
		const Tpw__V1__Segment *seg = bcast_segment(w, i);

		off[i] = UINT64_MAX;
		if (seg->loc_case != TPW__V1__SEGMENT__LOC_CMA_ADDR || seg->length == 0)
			continue;
		off[i] = total;
		/* no overflow: message-bytes-max bounds the lengths, validated before */
		total += (seg->length + STAGE_ALIGN - 1) & ~(uint64_t)(STAGE_ALIGN - 1);
	}
	return total;
}

/*
 * Submits the one read of @st's segments (those with an offset in @st->off) from @src (the
 * writer's private memory, or its CUDA memory: the job holds that mapping and event until it
 * ends) into @st->buf, on @d's copier.
 */
static int stage_start(struct bcast_stage *st, struct tpd_daemon *d, const struct tpd_msg_src *src)
{
	struct tpd_bcast *bc = st->bc;
	size_t n = 0;
	struct tpb_copy_job *job;
	char reason[256];

	for (size_t i = 0; i < bc->n_seg; i++)
		n += st->off[i] != UINT64_MAX;
	job = tpb_copier_job_new(n, n); /* room for a mapping and an event per transfer */
	if (!job)
		return -ENOMEM;
	for (size_t i = 0; i < bc->n_seg; i++) {
		struct tpb_xfer *x = &job->xfers[job->n];
		int channel;

		if (st->off[i] == UINT64_MAX)
			continue;
		channel = tpb_select_why(src[i].mem.loc, TPB_LOC_LOCAL, reason, sizeof(reason));
		if (channel < 0 || tpb_copier_job_hold_proc(job, src[i].mem.proc) < 0) {
			tpb_copier_job_free(job);
			return -EOPNOTSUPP;
		}
		x->src = src[i].mem;
		x->dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					   .addr = (uint64_t)(uintptr_t)(st->buf + st->off[i]) };
		x->len = src[i].len;
		if (x->src.loc == TPB_LOC_CUDA) {
			job->maps[job->n_maps++] = tpb_cuda_map_ref(x->src.cuda);
			if (x->src.event)
				job->maps[job->n_maps++] = tpb_cuda_map_ref(x->src.event);
			st->dev = true;
		}
		job->channels[job->n++] = channel;
		job->bytes += x->len;
	}
	job->done = stage_on_done;
	job->arg = st;
	bcast_ref(bc); /* the job's */
	st->reading = true;
	st->job = job;
	for (size_t k = 0; st->dev && k < bc->n_msgs; k++) {
		if (!bc->msgs[k])
			continue;
		st->pipes[st->n_pipes] = bc->msgs[k]->from->pipe;
		st->pipes[st->n_pipes++]->stage_reads++;
	}
	tpb_copier_submit(tpd_daemon_copier(d), job);
	return 0;
}

/*
 * Charges @need staging bytes to @st's uid (beside what its broadcast's other staging holds) and
 * starts the read of @src into them (stage_start()); else leaves @st without staging.
 * Return: 0, -EDQUOT over bcast-stage-bytes-per-uid, -errno.
 */
static int stage_make(struct bcast_stage *st, struct tpd_daemon *d, uint64_t need,
		      const struct tpd_msg_src *src)
{
	struct tpd_bcast *bc = st->bc;
	int r = uid_charge(bc, need, tpd_daemon_cfg(d)->bcast_stage_bytes_per_uid);

	if (r == -EDQUOT)
		bc->broker->bcast.unstaged++;
	if (r < 0)
		return r;
	st->buf = aligned_alloc(STAGE_ALIGN, need);
	st->len = need;
	r = st->buf ? stage_start(st, d, src) : -ENOMEM;
	if (r == 0)
		return 0;
	uid_release(bc, need);
	free(st->buf);
	st->buf = NULL;
	return r;
}

/*
 * Makes @bc's staging for @w from @s when a local reader needs it and the writer's uid has room;
 * else leaves @bc without (each delivery then reads the writer's memory, as a Write's would).
 */
static void stage_maybe(struct tpd_session *s, struct tpd_bcast *bc, const Tpw__V1__Write *w,
			bool local_reader)
{
	_cleanup_free_ struct tpd_msg_src *src = NULL;
	uint64_t need = stage_need(w, bc->st[STAGE_PRIV].off);

	if (need == 0 || !local_reader || !tpd_session_cma(s))
		return;
	src = calloc(bc->n_seg, sizeof(*src));
	if (!src)
		return;
	for (size_t i = 0; i < bc->n_seg; i++) {
		const Tpw__V1__Segment *seg = bcast_segment(w, i);

		src[i].mem = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = tpd_session_proc(s),
					       .addr = seg->cma_addr };
		src[i].len = seg->length;
	}
	if (stage_make(&bc->st[STAGE_PRIV], tpd_session_daemon(s), need, src) == -EDQUOT)
		tpd_session_log(s, TPU_LOG_DEBUG,
				"broadcast of %llu private bytes over the staging limit of uid %u "
				"(tpipd --bcast-stage-bytes-per-uid): each reader reads the writer",
				(unsigned long long)need, (unsigned)bc->key);
}

/* Whether a local delivery of @bc other than @m has not been read yet (it may still want the
 * bytes in CPU memory). */
static bool other_unread(const struct tpd_bcast *bc, const struct tpd_msg *m)
{
	for (size_t i = 0; i < bc->n_msgs; i++) {
		const struct tpd_msg *o = bc->msgs[i];

		if (o && o != m && !o->read_requested && !o->write_ready && !o->canceled)
			return true;
	}
	return false;
}

/* The first read of @bc's CUDA source into CPU memory, by delivery @m: stages the CUDA
 * segments of @m's sources (the same for every delivery) when another delivery may still want
 * them, within the writer's uid's staging (its private segments' staging, if any, included). */
static void cuda_stage_maybe(struct tpd_bcast *bc, struct tpd_msg *m)
{
	struct bcast_stage *st = &bc->st[STAGE_CUDA];
	uint64_t need = 0;

	if (!other_unread(bc, m))
		return; /* the last to read: staging would save no read of the device */
	if (bc->st[STAGE_PRIV].err < 0)
		return; /* its private bytes' read failed: every delivery fails with it */
	bc->cuda_tried = true;
	for (size_t i = 0; i < bc->n_seg; i++) {
		const struct tpd_msg_src *src = &m->src[i];

		st->off[i] = UINT64_MAX;
		if (src->mem.loc != TPB_LOC_CUDA || src->len == 0)
			continue;
		st->off[i] = need;
		/* no overflow: message-bytes-max bounds the lengths, validated before */
		need += (src->len + STAGE_ALIGN - 1) & ~(uint64_t)(STAGE_ALIGN - 1);
	}
	if (need && stage_make(st, m->from->pipe->d, need, m->src) == -EDQUOT)
		tpd_pipe_log(m->from->pipe, NULL, TPU_LOG_DEBUG,
			     "broadcast of %llu bytes of CUDA memory over the staging limit of uid "
			     "%u (tpipd --bcast-stage-bytes-per-uid): each reader reads the device",
			     (unsigned long long)need, (unsigned)bc->key);
}

void tpd_bcast_cuda_src(struct tpd_msg *m, size_t i, struct tpb_mem *src)
{
	struct tpd_bcast *bc = m->bcast;
	const struct bcast_stage *st;

	if (!bc || !bc->cuda || i >= bc->n_seg)
		return;
	if (!bc->cuda_tried)
		cuda_stage_maybe(bc, m);
	/* a staging read that already failed failed those that waited; a later reader reads
	 * the device itself */
	st = &bc->st[STAGE_CUDA];
	if (!st->buf || st->off[i] == UINT64_MAX || (st->err < 0 && !st->reading))
		return;
	*src = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
				 .addr = (uint64_t)(uintptr_t)(st->buf + st->off[i]) };
	m->bcast_reads |= STAGE_BIT(STAGE_CUDA);
}

/* Answers target @t of @s's broadcast that names no pipe of @s (or over the limit, @err). */
static void target_refuse(struct tpd_session *s, const Tpw__V1__BroadcastTarget *t, int err,
			  const char *why, uint32_t tail_len)
{
	Tpw__V1__WriteDone wd = TPW__V1__WRITE_DONE__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_pipe_end *e = tpd_session_pipe_find(s, t->pipe_id);

	if (e) {
		tpd_pipe_write_reject(e, t->write_id, err, why); /* behind its pending writes */
		tpd_pipe_credit(e, tail_len); /* its room in the client's write window */
		return;
	}
	wd.pipe_id = t->pipe_id;
	wd.write_id = t->write_id;
	wd.status = tpw_status_from_errno(err);
	wd.message = (char *)why;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_WRITE_DONE;
	dm.write_done = &wd;
	tpd_session_send(s, &dm, NULL, 0);
}

/* A new fan-out of @n_seg segments to at most @n pipes, charged to @key; NULL without memory. */
static struct tpd_bcast *bcast_new(struct tpd_broker *br, size_t n_seg, size_t n, uint64_t key)
{
	struct tpd_bcast *bc = calloc(1, sizeof(*bc));
	bool ok;

	if (!bc)
		return NULL;
	bc->refs = 1;
	bc->broker = br;
	bc->key = key;
	bc->n_seg = n_seg;
	bc->msgs = calloc(n + 1, sizeof(*bc->msgs));
	bc->xmsgs = calloc(n + 1, sizeof(*bc->xmsgs));
	ok = bc->msgs && bc->xmsgs;
	for (size_t k = 0; k < STAGE_N; k++) {
		struct bcast_stage *st = &bc->st[k];

		st->bc = bc;
		st->off = calloc(n_seg + 1, sizeof(*st->off));
		st->pipes = calloc(n + 1, sizeof(*st->pipes));
		ok = ok && st->off && st->pipes;
	}
	if (!ok) {
		bcast_unref(bc);
		return NULL;
	}
	return bc;
}

/* ---- across hosts: the writer's daemon ------------------------------------------------------ */

bool tpd_bcast_defer(struct tpd_bcast *bc, struct tpd_msg *m, const struct tpd_pipe_end *r)
{
	struct tpd_pipe *p = r->pipe;

	/* inline parts (m->tail_len) are copied after this: such a message goes on its own */
	if (!bc || bc->no_xbcast || !r->remote || m->eager || m->tail_len || !p->link ||
	    !p->remote_id || p->connecting ||
	    tpd_peer_chan_far_minor(p->link) < TPW_PEER_MINOR_BCAST)
		return false;
	/* CUDA sources too: the far daemon stages the bytes in host memory (one that cannot, an
	 * older one, reads each target on its own: a plain PeerReadReq, served as any) */
	m->xbcast = true;
	bc->xmsgs[bc->n_xmsgs++] = m;
	return true;
}

/* Announces the deferred targets of @bc, one PeerBcast per link (a link with a single target
 * gets its PeerDescriptor). A target whose announcement cannot go fails. */
static void bcast_announce(struct tpd_bcast *bc, const Tpw__V1__Write *w)
{
	_cleanup_free_ struct tpd_msg **grp = calloc(bc->n_xmsgs + 1, sizeof(*grp));

	for (size_t i = 0; i < bc->n_xmsgs; i++) {
		struct tpd_peer *link;
		size_t n = 0;
		int r;

		if (!bc->xmsgs[i])
			continue;
		link = bc->xmsgs[i]->from->pipe->link;
		for (size_t k = i; k < bc->n_xmsgs; k++) {
			if (!bc->xmsgs[k] || bc->xmsgs[k]->from->pipe->link != link)
				continue;
			if (grp)
				grp[n++] = bc->xmsgs[k];
			else
				tpd_msg_send_descriptor(tpd_pipe_end_peer(bc->xmsgs[k]->from),
							bc->xmsgs[k], w);
			bc->xmsgs[k] = NULL;
		}
		if (n == 1) {
			grp[0]->xbcast = false;
			r = tpd_msg_send_descriptor(tpd_pipe_end_peer(grp[0]->from), grp[0], w);
		} else {
			r = n ? tpd_msg_send_peer_bcast(link, grp, n, w) : 0;
		}
		for (size_t k = 0; r < 0 && k < n; k++)
			tpd_pipe_msg_consumed(grp[k], TPW__V1__STATUS__STATUS_PEER_DIED,
					      "the peer link failed");
	}
	bc->n_xmsgs = 0;
}

/* Whether a target pipe is named twice (then each gets its own descriptor: a PeerBcast names
 * each pipe once). */
static int u64_cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

static bool targets_repeat(const Tpw__V1__Broadcast *b)
{
	_cleanup_free_ uint64_t *ids = calloc(b->n_targets + 1, sizeof(*ids));

	if (!ids)
		return true;
	for (size_t i = 0; i < b->n_targets; i++)
		ids[i] = b->targets[i]->pipe_id;
	qsort(ids, b->n_targets, sizeof(*ids), u64_cmp);
	for (size_t i = 1; i < b->n_targets; i++)
		if (ids[i] == ids[i - 1])
			return true;
	return false;
}

void tpd_bcast_peer_read(struct tpd_pipe *p, const Tpw__V1__PeerReadReq *rr)
{
	struct tpd_pipe_end *w = tpd_xpipe_local_end(p);
	struct tpd_msg *m;
	unsigned suppressed;

	tpu_list_for_each(m, &w->rq, rnode) {
		if (m->msg_id != rr->msg_id)
			continue;
		if (!m->xbcast || m->read_requested || m->copying || m->xh || m->eager)
			break;
		if (m->canceled) {
			tpd_cancel_peer_read_canceled(w, m, rr->xfer_id);
			return;
		}
		if (tpd_xh_build_send(m, rr) < 0) {
			tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_IO, "out of memory",
					0, false);
			return;
		}
		m->read_requested = true;
		m->xcarrier = true;
		(void)tpd_xh_start(m); /* a failure completed it */
		return;
	}
	if (tpd_peer_log_ok(p->link, &suppressed)) /* the peer asks at will */
		tpd_pipe_log(p, NULL, TPU_LOG_WARNING, "peer asked for broadcast message %llu, not "
			     "one announced and waiting (%u lines about this peer not logged "
			     "before this one)", (unsigned long long)rr->msg_id, suppressed);
	tpd_xh_tell_end(p, rr->xfer_id, TPW__V1__STATUS__STATUS_INVALID, "no such message", 0,
			false);
}

/* ---- across hosts: the readers' daemon ------------------------------------------------------ */

/* Refuses @pr's PeerBcast @b: PeerConsumed{INVALID} for each target on a pipe of this link. */
static void peer_refuse(struct tpd_peer *pr, const Tpw__V1__PeerBcast *b, struct tpd_pipe **pipes,
			const char *why)
{
	unsigned suppressed;

	if (tpd_peer_log_ok(pr, &suppressed))
		tpu_log(TPU_LOG_WARNING, "peer %s: broadcast to %zu pipes refused: %s (%u lines "
			"about this peer not logged before this one)", tpd_peer_name(pr),
			b->n_targets, why, suppressed);
	for (size_t i = 0; i < b->n_targets; i++) {
		Tpw__V1__PeerConsumed c = TPW__V1__PEER_CONSUMED__INIT;
		Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;

		if (!pipes[i] || !pipes[i]->remote_id)
			continue;
		c.pipe_id = pipes[i]->remote_id;
		c.msg_id = b->targets[i]->msg_id;
		c.status = TPW__V1__STATUS__STATUS_INVALID;
		c.message = (char *)why;
		pm.body_case = TPW__V1__PEER_MSG__BODY_CONSUMED;
		pm.consumed = &c;
		tpd_peer_send(pr, &pm, NULL, 0);
	}
}

/* Checks that every target names a distinct open pipe of @pr whose writer is on the far host.
 * Return: NULL, or why not. */
static const char *peer_check(const Tpw__V1__PeerBcast *b, struct tpd_pipe **pipes)
{
	_cleanup_free_ uint64_t *ids = calloc(b->n_targets + 1, sizeof(*ids));

	if (!ids)
		return "out of memory";
	for (size_t i = 0; i < b->n_targets; i++) {
		if (!pipes[i])
			return "a pipe id that is not a pipe of this link";
		if (pipes[i]->connecting || !tpd_xpipe_remote_end(pipes[i])->remote)
			return "a pipe that is not open";
		ids[i] = pipes[i]->id;
	}
	qsort(ids, b->n_targets, sizeof(*ids), u64_cmp);
	for (size_t i = 1; i < b->n_targets; i++)
		if (ids[i] == ids[i - 1])
			return "a pipe named twice";
	return NULL;
}

/* The message tpd_xpipe_peer_descriptor() just queued on @p (the last of its remote writer's
 * queue, which was @before), or NULL: refused by the queue limits, or the reader left. A message
 * queued before, even of the same id, is never taken for it. */
static struct tpd_msg *peer_queued(struct tpd_pipe *p, const struct tpu_list *before,
				   uint64_t msg_id, size_t n_seg)
{
	struct tpd_pipe_end *w = tpd_xpipe_remote_end(p);
	struct tpd_msg *m;

	if (w->rq.prev == before || tpu_list_empty(&w->rq))
		return NULL;
	m = tpu_container_of(w->rq.prev, struct tpd_msg, rnode);
	if (m->msg_id != msg_id || m->n_src != n_seg || m->read_requested || m->eager)
		return NULL;
	return m;
}

/* Stages the far daemon's broadcast @bc (its messages in bc->msgs) with one receive carried by
 * the first. Return: 0, or -errno (no staging: each message is read on its own). */
static int peer_stage(struct tpd_bcast *bc, const Tpw__V1__Descriptor *dd)
{
	struct tpd_daemon *d = bc->msgs[0]->from->pipe->d;
	struct bcast_stage *st = &bc->st[STAGE_PRIV];
	uint64_t need = 0;
	int r;

	for (size_t i = 0; i < bc->n_seg; i++) {
		/* a CUDA source lands here as host bytes (the writer's daemon reads the device
		 * memory into its stripe), as for a target read on its own */
		uint64_t len = i < dd->n_payloads ? dd->payloads[i]->length
						  : dd->tensors[i - dd->n_payloads]->length;

		st->off[i] = need;
		if (len > UINT64_MAX / 2 - need)
			return -EOVERFLOW;
		need += (len + STAGE_ALIGN - 1) & ~(uint64_t)(STAGE_ALIGN - 1);
	}
	if (need == 0)
		return -ENODATA;
	r = uid_charge(bc, need, tpd_daemon_cfg(d)->bcast_stage_bytes_per_uid);
	if (r == -EDQUOT)
		bc->broker->bcast.unstaged++;
	if (r < 0)
		return r;
	st->buf = aligned_alloc(STAGE_ALIGN, need);
	st->len = need;
	if (!st->buf) {
		uid_release(bc, need);
		return -ENOMEM;
	}
	for (size_t k = 0; k < bc->n_msgs; k++) {
		struct tpd_msg *m = bc->msgs[k];

		for (size_t i = 0; i < m->n_src; i++)
			m->src[i].mem = (struct tpb_mem){
				.loc = TPB_LOC_LOCAL,
				.addr = (uint64_t)(uintptr_t)(st->buf + st->off[i]) };
		m->bcast = bcast_ref(bc);
		m->bcast_slot = k;
		m->bcast_reads = STAGE_BIT(STAGE_PRIV);
	}
	r = tpd_xh_build_recv_stage(bc->msgs[0], st->buf, st->off);
	if (r < 0)
		return r; /* the messages fail with st->err; the staging goes */
	st->reading = true;
	bc->carrier = bc->msgs[0];
	(void)tpd_xh_start(bc->msgs[0]); /* a failure ends in tpd_bcast_staged() */
	return 0;
}

void tpd_bcast_peer(struct tpd_peer *pr, const Tpw__V1__PeerBcast *b, struct tpd_pipe **pipes)
{
	const char *bad = peer_check(b, pipes);
	struct tpd_bcast *bc;
	size_t n_seg = b->descriptor->n_payloads + b->descriptor->n_tensors;
	int r;

	if (bad) {
		peer_refuse(pr, b, pipes, bad);
		return;
	}
	bc = bcast_new(tpd_daemon_broker(pipes[0]->d), n_seg, b->n_targets, 0);
	if (bc) {
		bc->peer = true;
		bc->peer_key = strdup(tpd_peer_principal(pr));
		if (!bc->peer_key) {
			bcast_unref(bc);
			bc = NULL;
		}
	}
	for (size_t i = 0; i < b->n_targets; i++) {
		Tpw__V1__Descriptor dd = *b->descriptor;
		const struct tpu_list *before = tpd_xpipe_remote_end(pipes[i])->rq.prev;
		struct tpd_msg *m;

		dd.msg_id = b->targets[i]->msg_id;
		tpd_xpipe_peer_descriptor(pipes[i], &dd, NULL, 0);
		m = peer_queued(pipes[i], before, dd.msg_id, n_seg);
		if (m && bc)
			bc->msgs[bc->n_msgs++] = m;
	}
	if (!bc)
		return; /* each message is read on its own */
	r = bc->n_msgs ? peer_stage(bc, b->descriptor) : -ENODATA;
	if (r < 0 && !bc->st[STAGE_PRIV].buf) {
		bc->n_msgs = 0; /* not staged: nothing refers to @bc */
	} else if (r < 0) {
		bc->st[STAGE_PRIV].err = r;
		snprintf(bc->st[STAGE_PRIV].why, sizeof(bc->st[STAGE_PRIV].why),
			 "no receive for the broadcast: %s", strerror(-r));
		peer_stage_drop(bc);
	}
	bcast_unref(bc);
}

/* The receive carried by @m ended: @m goes as any message whose reader is done with it or gone
 * (its own copy out of the staging, if its reader wants one, comes in its turn). May free @m. */
static void carrier_settle(struct tpd_msg *m)
{
	struct tpd_pipe_end *w = m->from, *r = tpd_pipe_end_peer(w);
	Tpw__V1__Status gone;

	if (!tpu_list_linked(&m->rnode)) { /* consumed while its receive ran */
		tpd_pipe_msg_maybe_free(m);
		return;
	}
	if (m->copying || !tpd_pipe_end_dying(r))
		return;
	gone = tpd_pipe_end_gone_status(r);
	tpd_pipe_msg_consumed(m, gone, tpd_pipe_why(w->pipe, gone));
}

void tpd_bcast_staged(struct tpd_msg *m, int status, const char *why)
{
	struct tpd_bcast *bc = m->bcast;
	struct bcast_stage *st = bc ? &bc->st[STAGE_PRIV] : NULL;

	if (!bc) {
		carrier_settle(m);
		return;
	}
	bcast_ref(bc);
	st->reading = false;
	bc->carrier = NULL;
	if (status < 0) {
		st->err = status;
		snprintf(st->why, sizeof(st->why), "receiving the broadcast failed: %.120s",
			 why && *why ? why : strerror(-status));
	} else {
		bc->broker->bcast.staged_bytes += st->len;
	}
	carrier_settle(m); /* may free @m */
	for (size_t i = 0; i < bc->n_msgs; i++)
		if (bc->msgs[i])
			tpd_pipe_start_next_copy(bc->msgs[i]->from);
	peer_stage_drop(bc);
	bcast_unref(bc);
}

void tpd_bcast_handle(struct tpd_session *s, const Tpw__V1__Broadcast *b, const uint8_t *tail,
		      uint32_t tail_len)
{
	struct tpd_daemon *d = tpd_session_daemon(s);
	struct tpd_broker *br = tpd_daemon_broker(d);
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	const Tpw__V1__Write *w = b->write;
	struct tpd_bcast *bc;
	size_t local_readers = 0;
	char why[160];

	br->bcast.requests++;
	br->bcast.targets += b->n_targets;
	if (b->n_targets > cfg->bcast_pipes_max) {
		snprintf(why, sizeof(why), "broadcast to %zu pipes exceeds the limit of %u (tpipd "
			 "--bcast-pipes-max)", b->n_targets, cfg->bcast_pipes_max);
		tpd_session_log(s, TPU_LOG_INFO, "%s", why);
		for (size_t i = 0; i < b->n_targets; i++)
			target_refuse(s, b->targets[i], -ENOBUFS, why, tail_len);
		return;
	}
	/* NULL without memory: each delivery then reads the writer's memory, as a Write's */
	bc = bcast_new(br, w->n_payloads + w->n_tensors, b->n_targets, tpd_session_uid(s));
	if (bc)
		bc->no_xbcast = targets_repeat(b);
	for (size_t i = 0; i < b->n_targets; i++) {
		struct tpd_pipe_end *e = tpd_session_pipe_find(s, b->targets[i]->pipe_id);

		if (e && !tpd_pipe_end_peer(e)->remote)
			local_readers++;
	}
	if (bc)
		stage_maybe(s, bc, w, local_readers > 0);
	/* CUDA sources (beside private bytes staged or not): at the first read into CPU memory,
	 * into staging of their own, if two or more local readers may want them so */
	if (bc && local_readers > 1 && has_cuda(w))
		bc->cuda = true;
	for (size_t i = 0; i < b->n_targets; i++) {
		const Tpw__V1__BroadcastTarget *t = b->targets[i];
		struct tpd_pipe_end *e = tpd_session_pipe_find(s, t->pipe_id);

		if (!e)
			target_refuse(s, t, -ENOENT, "no such pipe", tail_len);
		else
			tpd_pipe_write_one(e, w, t->write_id, tail, tail_len, bc);
	}
	if (bc)
		bcast_announce(bc, w);
	bcast_unref(bc);
}
