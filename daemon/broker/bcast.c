/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon's fan-out (Broadcast, issue 25): one message from a writer to several of its pipes,
 * with the writer's memory read once. Each target becomes an ordinary message of its pipe
 * (tpd_pipe_write_one(): its own descriptor, its place in the pipe's order, its own WriteDone),
 * so readers read it as any message. Shared-buffer sources are read in place by every reader's
 * copy; private memory (cma_addr) is read once, by a copy job on the copier, into daemon staging
 * that the local readers' copies then read, each waiting for that one read (and failing with
 * it). Staging is charged to the writer's uid (bcast-stage-bytes-per-uid); above the limit, and
 * for readers on another host, each delivery reads the writer's memory as a Write would. It
 * does not decide what a message is or how it is copied (msg.c, pipe.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "copier.h"
#include "core.h"
#include "log.h"
#include "pipe_int.h"
#include "session.h"
#include "validate.h"

#define STAGE_ALIGN 64u

/* One uid's staging bytes held now. */
struct bcast_uid {
	struct tpu_list node;
	uid_t uid;
	uint64_t bytes;
};

struct tpd_bcast {
	unsigned refs;
	struct tpd_broker *broker;
	uid_t uid;
	uint8_t *stage;	  /* the staging copy of the writer's private segments */
	uint64_t stage_len;
	uint64_t *off;	  /* per segment: its offset in @stage, UINT64_MAX when not staged */
	size_t n_seg;
	bool reading;	  /* the staging read runs */
	int err;	  /* < 0: it failed */
	char why[160];
	struct tpd_msg **msgs; /* deliveries reading @stage (NULL once freed), @n_msgs slots */
	size_t n_msgs;
};

const struct tpd_bcast_stats *tpd_bcast_stats(const struct tpd_broker *b)
{
	return &b->bcast;
}

static struct bcast_uid *uid_find(struct tpd_broker *b, uid_t uid)
{
	struct bcast_uid *u;

	tpu_list_for_each(u, &b->bcast_uids, node) if (u->uid == uid) return u;
	return NULL;
}

/* Charges @len staging bytes to @uid within @limit. Return: 0, -EDQUOT or -ENOMEM. */
static int uid_charge(struct tpd_broker *b, uid_t uid, uint64_t len, uint64_t limit)
{
	struct bcast_uid *u = uid_find(b, uid);
	uint64_t held = u ? u->bytes : 0;

	if (len > limit || held > limit - len)
		return -EDQUOT;
	if (!u) {
		u = calloc(1, sizeof(*u));
		if (!u)
			return -ENOMEM;
		u->uid = uid;
		tpu_list_insert_tail(&b->bcast_uids, &u->node);
	}
	u->bytes += len;
	b->bcast.stage_held += len;
	return 0;
}

static void uid_release(struct tpd_broker *b, uid_t uid, uint64_t len)
{
	struct bcast_uid *u = uid_find(b, uid);

	if (!u)
		return;
	u->bytes -= TPU_MIN(len, u->bytes);
	b->bcast.stage_held -= TPU_MIN(len, b->bcast.stage_held);
	if (u->bytes == 0) {
		tpu_list_remove(&u->node);
		free(u);
	}
}

static struct tpd_bcast *bcast_ref(struct tpd_bcast *bc)
{
	bc->refs++;
	return bc;
}

static void bcast_unref(struct tpd_bcast *bc)
{
	if (!bc || --bc->refs > 0)
		return;
	if (bc->stage)
		uid_release(bc->broker, bc->uid, bc->stage_len);
	free(bc->stage);
	free(bc->off);
	free(bc->msgs);
	free(bc);
}

void tpd_bcast_attach(struct tpd_bcast *bc, struct tpd_msg *m, const struct tpd_pipe_end *r)
{
	if (!bc || !bc->stage || r->remote || bc->n_seg != m->n_src)
		return;
	for (size_t i = 0; i < m->n_src; i++) {
		struct tpd_msg_src *src = &m->src[i];

		if (bc->off[i] == UINT64_MAX || src->mem.loc != TPB_LOC_PROCESS)
			continue;
		tpb_proc_unref(src->mem.proc);
		src->mem = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					     .addr = (uint64_t)(uintptr_t)(bc->stage + bc->off[i]) };
	}
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
	bcast_unref(bc);
}

bool tpd_bcast_waiting(const struct tpd_msg *m)
{
	return m->bcast && m->bcast->reading;
}

int tpd_bcast_error(const struct tpd_msg *m, const char **why)
{
	if (!m->bcast || m->bcast->err == 0)
		return 0;
	if (why)
		*why = m->bcast->why;
	return m->bcast->err;
}

/* The staging read is done: let the deliveries that wait for it go (or fail). */
static void stage_on_done(struct tpb_copy_job *job)
{
	struct tpd_bcast *bc = job->arg;

	bc->reading = false;
	if (job->status == -ESRCH || job->status == -EFAULT || job->status == -EPERM) {
		bc->err = job->status == -ESRCH ? -ECONNRESET : job->status;
		snprintf(bc->why, sizeof(bc->why), "reading the broadcast's source failed: %.100s",
			 job->status == -ESRCH ? "its writer died" : job->why);
	} else if (job->status < 0) {
		bc->err = job->status;
		snprintf(bc->why, sizeof(bc->why), "reading the broadcast's source failed: %.100s",
			 job->why[0] ? job->why : strerror(-job->status));
	} else {
		bc->broker->bcast.staged_bytes += job->bytes;
	}
	tpb_copier_job_free(job);
	for (size_t i = 0; i < bc->n_msgs; i++)
		if (bc->msgs[i])
			tpd_pipe_start_next_copy(bc->msgs[i]->from);
	bcast_unref(bc); /* the job's */
}

static const Tpw__V1__Segment *bcast_segment(const Tpw__V1__Write *w, size_t i)
{
	return i < w->n_payloads ? w->payloads[i]->data : w->tensors[i - w->n_payloads]->data;
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

/* Submits the staging read of @bc's private segments of @w from @s's process. */
static int stage_start(struct tpd_session *s, struct tpd_bcast *bc, const Tpw__V1__Write *w)
{
	size_t n = 0;
	struct tpb_copy_job *job;
	char reason[256];
	int channel = tpb_select_why(TPB_LOC_PROCESS, TPB_LOC_LOCAL, reason, sizeof(reason));

	if (channel < 0 || !tpd_session_cma(s))
		return -EOPNOTSUPP;
	for (size_t i = 0; i < bc->n_seg; i++)
		n += bc->off[i] != UINT64_MAX;
	job = tpb_copier_job_new(n, 2 * n);
	if (!job)
		return -ENOMEM;
	if (tpb_copier_job_hold_proc(job, tpd_session_proc(s)) < 0) {
		tpb_copier_job_free(job);
		return -ENOMEM;
	}
	for (size_t i = 0; i < bc->n_seg; i++) {
		const Tpw__V1__Segment *seg = bcast_segment(w, i);
		struct tpb_xfer *x = &job->xfers[job->n];

		if (bc->off[i] == UINT64_MAX)
			continue;
		x->src = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = tpd_session_proc(s),
					   .addr = seg->cma_addr };
		x->dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL,
					   .addr = (uint64_t)(uintptr_t)(bc->stage + bc->off[i]) };
		x->len = seg->length;
		job->channels[job->n++] = channel;
		job->bytes += seg->length;
	}
	job->done = stage_on_done;
	job->arg = bcast_ref(bc);
	bc->reading = true;
	tpb_copier_submit(tpd_daemon_copier(tpd_session_daemon(s)), job);
	return 0;
}

/*
 * Makes @bc's staging for @w from @s when a local reader needs it and the writer's uid has room;
 * else leaves @bc without (each delivery then reads the writer's memory, as a Write's would).
 */
static void stage_maybe(struct tpd_session *s, struct tpd_bcast *bc, const Tpw__V1__Write *w,
			bool local_reader)
{
	struct tpd_daemon *d = tpd_session_daemon(s);
	uint64_t need = stage_need(w, bc->off);
	int r;

	if (need == 0 || !local_reader || !tpd_session_cma(s))
		return;
	r = uid_charge(bc->broker, bc->uid, need, tpd_daemon_cfg(d)->bcast_stage_bytes_per_uid);
	if (r == -EDQUOT) {
		bc->broker->bcast.unstaged++;
		tpd_session_log(s, TPU_LOG_DEBUG,
				"broadcast of %llu private bytes over the staging limit of uid %u "
				"(tpipd --bcast-stage-bytes-per-uid): each reader reads the writer",
				(unsigned long long)need, (unsigned)bc->uid);
		return;
	}
	if (r < 0)
		return;
	bc->stage = aligned_alloc(STAGE_ALIGN, need);
	bc->stage_len = need;
	if (bc->stage && stage_start(s, bc, w) == 0)
		return;
	uid_release(bc->broker, bc->uid, need);
	free(bc->stage);
	bc->stage = NULL;
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

void tpd_bcast_handle(struct tpd_session *s, const Tpw__V1__Broadcast *b, const uint8_t *tail,
		      uint32_t tail_len)
{
	struct tpd_daemon *d = tpd_session_daemon(s);
	struct tpd_broker *br = tpd_daemon_broker(d);
	const struct tpd_config *cfg = tpd_daemon_cfg(d);
	const Tpw__V1__Write *w = b->write;
	struct tpd_bcast *bc;
	bool local_reader = false;
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
	bc = calloc(1, sizeof(*bc));
	if (bc) {
		bc->n_seg = w->n_payloads + w->n_tensors;
		bc->off = calloc(bc->n_seg + 1, sizeof(*bc->off));
		bc->msgs = calloc(b->n_targets, sizeof(*bc->msgs));
	}
	if (!bc || !bc->off || !bc->msgs) {
		free(bc ? bc->off : NULL);
		free(bc);
		bc = NULL; /* no staging: each delivery reads the writer's memory */
	} else {
		bc->refs = 1;
		bc->broker = br;
		bc->uid = tpd_session_uid(s);
	}
	for (size_t i = 0; i < b->n_targets; i++) {
		struct tpd_pipe_end *e = tpd_session_pipe_find(s, b->targets[i]->pipe_id);

		if (e && !tpd_pipe_end_peer(e)->remote)
			local_reader = true;
	}
	if (bc)
		stage_maybe(s, bc, w, local_reader);
	for (size_t i = 0; i < b->n_targets; i++) {
		const Tpw__V1__BroadcastTarget *t = b->targets[i];
		struct tpd_pipe_end *e = tpd_session_pipe_find(s, t->pipe_id);

		if (!e)
			target_refuse(s, t, -ENOENT, "no such pipe", tail_len);
		else
			tpd_pipe_write_one(e, w, t->write_id, tail, tail_len, bc);
	}
	bcast_unref(bc);
}
