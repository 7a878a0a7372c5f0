/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Pipe rings (issue 27): a private->private message between two clients of this host moves
 * through a staging ring both clients map, the writer's library copying chunks in while the
 * reader's copies them out; the daemon stays the broker. This file decides which messages use a
 * ring (tpd_pring_choose()), creates one ring per pipe direction (a sealed memfd, bounded in
 * bytes daemon-wide and per uid), offers it to a writer without CMA (which then names its
 * memory by ring_addr), hands each message to both ends with RingXfer (up to PRING_DEPTH
 * messages of a pipe direction at once, one after the other in the ring), completes each
 * when both ends said RingDone, and kills the ring (its dead word, a futex wake) with every
 * message on it when an end leaves, fails or breaks it. It never reads or writes the ring's chunks; the layout and the
 * rules of the header words are proto/pring.h's, the copy loops client/lib/pring.c's.
 */
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <event2/event.h>
#include "config.h"
#include "core.h"
#include "local.h"
#include "pipe_int.h"
#include "pring.h"
#include "session.h"

/* 8 chunks of 128 KiB: with 64 KiB chunks (a ring of 516 KiB) private 1 and 16 MiB messages
 * moved 15-30 % slower and cost more CPU a message (more hand-offs between the two clients'
 * threads, a ring emptied or filled by any hiccup of the other side); with 16 chunks of 128 KiB
 * 128 KiB messages slowed (2 MiB cycling through the caches). docs/benchmarks.md. */
#define PRING_CHUNK TPW_PRING_CHUNK
#define PRING_NCHUNKS TPW_PRING_NCHUNKS
/* Messages of one pipe direction on its ring at once: the next one's RingXfer goes once the
 * writer has put the one before all in (its RingDone), while the reader still takes it out, so
 * the writer's thread goes on without waiting for the reader and the daemon's round trip. A
 * message waiting behind one the writer has not put in yet stays waiting (cancellable). */
#define PRING_DEPTH 4u

struct tpd_pring {
	int fd;
	struct tpw_pring_hdr *hdr; /* the header page, mapped by the daemon */
	uint64_t id;
	uint32_t next_start;	   /* chunk counter where the next message begins */
	uint64_t bytes;		   /* the memfd's size, charged while the ring lives */
	uid_t uid;		   /* the writer's, charged */
	bool sent[2];		   /* fd sent to the writer's, the reader's session */
	bool dead;
	struct tpd_broker *b;	   /* counts it */
	/* The messages moving through it, oldest first, and for each the RingDones received
	 * (bit 0: the writer's, bit 1: the reader's). Each client answers its messages in order,
	 * so they complete in order: a RingDone completes the oldest or none. */
	struct tpd_msg *q[PRING_DEPTH];
	uint8_t qdone[PRING_DEPTH];
	unsigned qn;
	bool ending; /* it failed: the completion of every message in @q is scheduled */
	int status;
	char why[160];
};


static uint32_t ring_chunks_of(uint64_t bytes)
{
	return (uint32_t)((bytes + PRING_CHUNK - 1) / PRING_CHUNK);
}

void tpd_pring_free(struct tpd_pring *r)
{
	if (!r)
		return;
	if (r->hdr) {
		tpw_pring_kill(r->hdr);
		munmap(r->hdr, TPW_PRING_HDR_BYTES);
	}
	if (r->fd >= 0)
		close(r->fd);
	if (r->b) {
		r->b->rings--;
		r->b->ring_bytes -= r->bytes;
	}
	free(r);
}

/* Ring bytes charged to @uid now (live rings of every pipe). */
static uint64_t uid_bytes(struct tpd_daemon *d, uid_t uid)
{
	struct tpd_broker *b = tpd_daemon_broker(d);
	struct tpd_pipe *p;
	uint64_t n = 0;

	tpu_list_for_each(p, &b->pipes, node)
		for (int i = 0; i < 2; i++)
			if (p->end[i].ring && p->end[i].ring->uid == uid)
				n += p->end[i].ring->bytes;
	return n;
}

/* A new ring for writer end @w, within the limits. Return: 0 or -errno with @why. */
static int ring_new(struct tpd_pipe_end *w, struct tpd_pring **ret, char *why, size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(w->pipe->d);
	uint64_t bytes = tpw_pring_file_bytes(PRING_CHUNK, PRING_NCHUNKS);
	uid_t uid = tpd_session_uid(w->session);
	struct tpd_broker *b = tpd_daemon_broker(w->pipe->d);
	struct tpd_pring *r;

	if (b->ring_bytes + bytes > cfg->pipe_ring_bytes_max) {
		snprintf(why, wl, "pipe rings hold %llu bytes of pipe-ring-bytes-max %llu",
			 (unsigned long long)b->ring_bytes,
			 (unsigned long long)cfg->pipe_ring_bytes_max);
		return -ENOSPC;
	}
	if (uid != 0 && uid_bytes(w->pipe->d, uid) + bytes > cfg->pipe_ring_bytes_per_uid) {
		snprintf(why, wl, "uid %u's pipe rings are at pipe-ring-bytes-per-uid %llu",
			 (unsigned)uid, (unsigned long long)cfg->pipe_ring_bytes_per_uid);
		return -ENOSPC;
	}
	r = calloc(1, sizeof(*r));
	if (!r)
		return -ENOMEM;
	r->fd = memfd_create("tpipd-pipe-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	r->b = b;
	b->rings++;
	if (r->fd < 0 || ftruncate(r->fd, (off_t)bytes) < 0 ||
	    fcntl(r->fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		snprintf(why, wl, "pipe ring memfd: %s", strerror(errno));
		tpd_pring_free(r);
		return -ENOMEM;
	}
	r->hdr = mmap(NULL, TPW_PRING_HDR_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd, 0);
	if (r->hdr == MAP_FAILED) {
		r->hdr = NULL;
		snprintf(why, wl, "pipe ring map: %s", strerror(errno));
		tpd_pring_free(r);
		return -ENOMEM;
	}
	r->bytes = bytes;
	b->ring_bytes += bytes;
	r->uid = uid;
	r->id = ++b->ring_next_id;
	r->hdr->magic = TPW_PRING_MAGIC;
	r->hdr->version = TPW_PRING_VERSION;
	r->hdr->chunk_bytes = PRING_CHUNK;
	r->hdr->nchunks = PRING_NCHUNKS;
	*ret = r;
	return 0;
}

bool tpd_pring_choose(const struct tpd_msg *m, const struct tpd_session *rs,
		      const struct tpb_copy_job *job, char *why, size_t wl)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(m->from->pipe->d);
	const struct tpd_session *ws = m->from->session;

	/* A ring-only message was offered its ring: it takes it whatever the settings now. */
	if ((!cfg->pipe_ring && !m->ring_only) || !ws || job->n == 0)
		return false;
	for (size_t i = 0; i < job->n; i++)
		if (job->xfers[i].src.loc != TPB_LOC_PROCESS ||
		    job->xfers[i].dst.loc != TPB_LOC_PROCESS)
			return false;
	if (job->bytes < cfg->pipe_ring_min && !m->ring_only)
		return false; /* the usual case below the threshold: not worth a note */
	if (m->from->ring_declined && !m->ring_only) {
		snprintf(why, wl, "a library of this pipe declined the pipe ring (it holds its "
			 "limit of rings): cma");
		return false;
	}
	if (!tpd_session_pipe_ring(ws) || !tpd_session_pipe_ring(rs)) {
		snprintf(why, wl, "the %s's library takes no pipe ring (older, or on the socket "
			 "without control rings): cma",
			 !tpd_session_pipe_ring(ws) ? "writer" : "reader");
		return false;
	}
	if (m->ring_only)
		snprintf(why, wl, "the writer has no CMA and was offered the ring: the clients "
			 "copy through a %u x %u KiB ring", PRING_NCHUNKS, PRING_CHUNK >> 10);
	else
		snprintf(why, wl, "both ends private memory, %llu bytes >= pipe-ring-min: the "
			 "clients copy through a %u x %u KiB ring",
			 (unsigned long long)job->bytes, PRING_NCHUNKS, PRING_CHUNK >> 10);
	return true;
}

void tpd_pring_offer(struct tpd_pipe_end *w, const struct tpd_msg *m)
{
	const struct tpd_config *cfg = tpd_daemon_cfg(w->pipe->d);
	struct tpd_pipe_end *r = tpd_pipe_end_peer(w);
	Tpw__V1__RingXfer x = TPW__V1__RING_XFER__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	struct tpd_pring *ring;
	char why[160];
	int err;

	if (w->ring_offered || w->ring || !cfg->pipe_ring || m->eager || m->bcast || m->ring_only ||
	    m->bytes < cfg->pipe_ring_min || w->remote || r->remote || !w->session || !r->session ||
	    tpd_session_cma(w->session) || !tpd_session_pipe_ring_addr(w->session) ||
	    !tpd_session_pipe_ring_addr(r->session))
		return;
	for (size_t i = 0; i < m->n_src; i++)
		if (m->src[i].mem.loc == TPB_LOC_CUDA)
			return;
	err = ring_new(w, &ring, why, sizeof(why));
	if (err < 0) {
		tpd_pipe_channel_note_name(w->pipe, "cpu>cpu", "staging (no ring)", why);
		return;
	}
	w->ring = ring;
	x.pipe_id = w->local_id;
	x.offer = true;
	x.ring_id = ring->id;
	x.chunk_bytes = PRING_CHUNK;
	x.nchunks = PRING_NCHUNKS;
	x.fd_follows = true;
	x.min_bytes = cfg->pipe_ring_min;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_RING_XFER;
	dm.ring_xfer = &x;
	err = tpd_session_send_fd(w->session, ring->fd);
	if (err == 0)
		err = tpd_session_send(w->session, &dm, NULL, 0);
	if (err < 0) {
		tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "pipe ring not offered: %s",
			     strerror(-err));
		tpd_pring_free(TAKE_PTR(w->ring));
		return;
	}
	ring->sent[0] = true;
	w->ring_offered = true;
	tpd_pipe_log(w->pipe, NULL, TPU_LOG_DEBUG, "writer without CMA offered pipe ring %llu: "
		     "its messages of at least %llu bytes go through it, unstaged",
		     (unsigned long long)ring->id, (unsigned long long)cfg->pipe_ring_min);
}

/* Sends end @e's RingXfer for @m (its fd first if its session has none). */
static int ring_send(struct tpd_pring *r, struct tpd_msg *m, struct tpd_pipe_end *e, bool reader)
{
	Tpw__V1__RingXfer x = TPW__V1__RING_XFER__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	const struct tpb_copy_job *job = m->job;
	uint64_t *v = calloc(2 * job->n + 1, sizeof(*v));
	int err;

	if (!v)
		return -ENOMEM;
	x.pipe_id = e->local_id;
	x.id = reader ? m->msg_id : m->write_id;
	x.reader = reader;
	x.ring_id = r->id;
	x.chunk_bytes = PRING_CHUNK;
	x.nchunks = PRING_NCHUNKS;
	x.start = r->next_start;
	x.n_addrs = x.n_lens = job->n;
	x.addrs = v;
	x.lens = v + job->n;
	for (size_t i = 0; i < job->n; i++) {
		v[i] = reader ? job->xfers[i].dst.addr : job->xfers[i].src.addr;
		v[job->n + i] = job->xfers[i].len;
	}
	if (!r->sent[reader]) {
		err = tpd_session_send_fd(e->session, r->fd);
		if (err < 0) {
			free(v);
			return err;
		}
		r->sent[reader] = true;
		x.fd_follows = true;
	}
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_RING_XFER;
	dm.ring_xfer = &x;
	err = tpd_session_send(e->session, &dm, NULL, 0);
	free(v);
	return err < 0 ? err : 0;
}

static const struct timeval ring_now;
static void ring_fail(struct tpd_pring *ring, int status, const char *why);

/* Retires @w's ring: dead for both clients, freed here (their mappings are their own). An end
 * offered its ring for good gets a new one at once, in the bytes the old one gave back (so that
 * its ring-only messages never meet the limits); the next RingXfer hands it out. */
static void ring_retire(struct tpd_pipe_end *w)
{
	char why[160];

	tpd_pring_free(w->ring);
	w->ring = NULL;
	if (w->ring_offered && ring_new(w, &w->ring, why, sizeof(why)) < 0)
		tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "pipe ring not replaced: %s", why);
}

static void ring_on_fail(evutil_socket_t fd, short what, void *arg)
{
	struct tpb_copy_job *job = arg; /* its message lives: it counts as copying */

	(void)fd;
	(void)what;
	job->done(job);
}

/* Fails ring-only message @m (its job counted as copying) with @err, from the loop (never
 * inside tpd_pipe_start_next_copy()): nothing else can reach the writer's memory. */
static void ring_only_fail(struct tpd_msg *m, int err, const char *why)
{
	struct tpb_copy_job *job = m->job;

	job->status = err;
	snprintf(job->why, sizeof(job->why), "pipe ring for a writer without CMA: %.120s", why);
	job->n = 0;
	if (event_base_once(tpd_daemon_base(m->from->pipe->d), -1, EV_TIMEOUT, ring_on_fail, job,
			    &ring_now) < 0)
		job->done(job); /* without memory: at once */
}

int tpd_pring_start(struct tpd_msg *m)
{
	struct tpd_pipe_end *w = m->from, *r = tpd_pipe_end_peer(w);
	struct tpd_pring *ring = w->ring;
	char why[160];
	int err;

	if (!w->session || !r->session) {
		if (!m->ring_only)
			return -EPIPE;
		ring_only_fail(m, -EPIPE, "an end left");
		return 0;
	}
	if (!ring) {
		err = ring_new(w, &ring, why, sizeof(why));
		if (err < 0 && m->ring_only) {
			ring_only_fail(m, err, why);
			return 0;
		}
		if (err < 0) {
			tpd_pipe_channel_note_name(w->pipe, "cpu>cpu", "cma (no ring)", why);
			return err;
		}
		w->ring = ring;
	}
	assert(!ring->ending && ring->qn < PRING_DEPTH);
	if (ring->qn == 0) {
		ring->status = 0;
		ring->why[0] = '\0';
	}
	ring->q[ring->qn] = m;
	ring->qdone[ring->qn++] = 0;
	err = ring_send(ring, m, w, false);
	if (err == 0)
		err = ring_send(ring, m, r, true);
	if (err < 0 && ring->qn > 1) {
		/* messages before it are on the ring: they fail with it, from the loop */
		ring_fail(ring, err, "pipe ring transfer not handed out");
		return 0;
	}
	if (err < 0) {
		/* One end may have it already: the dead ring fails its side, which is ignored. */
		tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "message %llu: pipe ring not handed out "
			     "(%s)%s", (unsigned long long)m->msg_id, strerror(-err),
			     m->ring_only ? "" : ", cma");
		ring->qn = 0;
		ring_retire(w);
		if (!m->ring_only)
			return err;
		ring_only_fail(m, err, "not handed out");
		return 0;
	}
	ring->next_start += ring_chunks_of(m->job->bytes);
	return 0;
}

/* Completes @job of a message that went through a ring with @status: as a copy job would
 * (copy_on_done()). May free the pipe once it was the last job: touch nothing after. */
static void ring_job_done(struct tpb_copy_job *job, int status, const char *why)
{
	job->status = status;
	job->abandoned = status == -ECANCELED;
	if (status < 0)
		snprintf(job->why, sizeof(job->why), "%s", why);
	job->n = 0; /* nothing went through a copy channel */
	job->done(job);
}

/* Completes the oldest message of @w's ring, which both clients moved. */
static void ring_complete_one(struct tpd_pipe_end *w, struct tpd_pring *ring)
{
	struct tpb_copy_job *job = ring->q[0]->job;

	ring->qn--;
	memmove(ring->q, ring->q + 1, ring->qn * sizeof(ring->q[0]));
	memmove(ring->qdone, ring->qdone + 1, ring->qn);
	ring->b->ring_msgs++;
	w->pipe->ring_used = true;
	ring_job_done(job, 0, NULL);
}

/* Fails every message on @w's failed ring (ring->status, ring->why), oldest first, and
 * retires the ring: the next message gets a new one. */
static void ring_fail_all(struct tpd_pipe_end *w, struct tpd_pring *ring)
{
	struct tpb_copy_job *jobs[PRING_DEPTH];
	unsigned n = ring->qn;
	int status = ring->status;
	char why[sizeof(ring->why)];

	for (unsigned i = 0; i < n; i++)
		jobs[i] = ring->q[i]->job;
	memcpy(why, ring->why, sizeof(why));
	ring->qn = 0;
	ring_retire(w); /* frees it */
	/* each job holds its pipe (p->jobs) until its own completion */
	for (unsigned i = 0; i < n; i++)
		ring_job_done(jobs[i], status, why);
}

static void ring_on_abort(evutil_socket_t fd, short what, void *arg)
{
	struct tpd_pipe_end *w = arg; /* lives: its pipe counts the ring's transfers */
	struct tpd_pring *ring = w->ring;

	(void)fd;
	(void)what;
	if (ring && ring->ending)
		ring_fail_all(w, ring);
}

/* Kills @ring (its writer end's) with @status unless it failed already, and schedules the
 * completion of every message on it from the loop. */
static void ring_fail(struct tpd_pring *ring, int status, const char *why)
{
	struct tpd_pipe_end *w = ring->q[0]->from;

	if (ring->ending)
		return;
	tpw_pring_kill(ring->hdr);
	ring->status = status;
	snprintf(ring->why, sizeof(ring->why), "%s", why);
	ring->ending = true;
	if (event_base_once(tpd_daemon_base(w->pipe->d), -1, EV_TIMEOUT, ring_on_abort, w,
			    &ring_now) < 0)
		ring_fail_all(w, ring); /* without memory: at once */
}

/* Is @m on @ring now? */
static bool ring_holds(const struct tpd_pring *ring, const struct tpd_msg *m)
{
	for (unsigned i = 0; ring && i < ring->qn; i++)
		if (ring->q[i] == m)
			return true;
	return false;
}

void tpd_pring_abort(struct tpd_msg *m)
{
	struct tpd_pring *ring = m->from->ring;

	if (ring_holds(ring, m))
		ring_fail(ring, -ECANCELED, "pipe ring transfer abandoned");
}

bool tpd_pring_can_add(const struct tpd_pipe_end *w)
{
	const struct tpd_pring *ring = w->ring;

	/* every transfer of @w running is on its ring, which has room and works, and the writer
	 * has put the last of them all in */
	return ring && !ring->ending && ring->qn > 0 && ring->qn < PRING_DEPTH &&
	       ring->qn == w->copying && ring->qdone[ring->qn - 1] & 1u;
}

/* The id a RingDone of the reader (@reader) or the writer names @m by. */
static uint64_t ring_id_of(const struct tpd_msg *m, bool reader)
{
	return reader ? m->msg_id : m->write_id;
}

/*
 * A library of @w's pipe declined @w's ring (RingDone @rd, STATUS_LIMIT: it holds as many as it
 * takes). Its messages are not ring-only: they go back to the pipe's queue, not copying (no
 * client touches the ring once it is dead), and are copied by cma, as is every later message
 * of @w. The ring is retired.
 */
static void ring_declined(struct tpd_pipe_end *w, struct tpd_pring *ring,
			  const Tpw__V1__RingDone *rd)
{
	char why[200];

	snprintf(why, sizeof(why), "the %s's library declined the pipe ring (%.120s): cma",
		 rd->reader ? "reader" : "writer", rd->message ? rd->message : "");
	w->ring_declined = true;
	for (unsigned i = 0; i < ring->qn; i++) {
		struct tpd_msg *m = ring->q[i];

		m->ring = false;
		m->copying = false;
		w->copying--;
		w->pipe->jobs--;
	}
	ring->qn = 0;
	ring_retire(w);
	tpd_pipe_channel_note_name(w->pipe, "cpu>cpu", "cma (no ring)", why);
	tpd_pipe_log(w->pipe, NULL, TPU_LOG_INFO, "%s", why);
	tpd_pipe_start_next_copy(w);
}

void tpd_pring_on_done(struct tpd_pipe_end *e, const Tpw__V1__RingDone *rd)
{
	struct tpd_pipe_end *w = rd->reader ? tpd_pipe_end_peer(e) : e;
	struct tpd_pring *ring = w->ring;
	unsigned bit = rd->reader ? 2u : 1u, i = 0;
	char why[160];

	if (!ring || ring->ending || w->remote)
		return;
	/* Its client answers in order: this must be its first message without an answer. */
	while (i < ring->qn && ring->qdone[i] & bit)
		i++;
	/* Late answers of a ring that failed and was retired, and lies about other messages,
	 * are not this ring's: ignored. An answer out of order fails the ring. */
	if (i == ring->qn || rd->id != ring_id_of(ring->q[i], rd->reader)) {
		unsigned k = i + 1;

		while (k < ring->qn && rd->id != ring_id_of(ring->q[k], rd->reader))
			k++;
		if (k >= ring->qn)
			return;
		if (rd->status == TPW__V1__STATUS__STATUS_OK) {
			ring_fail(ring, -EPROTO, "pipe ring: answers out of order");
			return;
		}
		i = k; /* a refusal (the library's io thread) comes early: it fails the ring */
	}
	if (rd->status == TPW__V1__STATUS__STATUS_LIMIT && !ring->q[0]->ring_only) {
		ring_declined(w, ring, rd);
		return;
	}
	ring->qdone[i] |= bit;
	if (rd->status != TPW__V1__STATUS__STATUS_OK) {
		int err = tpw_status_to_errno(rd->status);

		snprintf(why, sizeof(why), "pipe ring: the %s failed: %.100s",
			 rd->reader ? "reader" : "writer", rd->message ? rd->message : "");
		ring_fail(ring, err < 0 ? err : -EIO, why);
		return;
	}
	if (i == 0 && ring->qdone[0] == 3u)
		ring_complete_one(w, ring); /* and starts the next copies */
	else if (bit == 1u && i == ring->qn - 1)
		tpd_pipe_start_next_copy(w); /* the writer is free for the next message */
}

void tpd_pring_totals(struct tpd_daemon *d, uint64_t *ret_rings, uint64_t *ret_bytes,
		      uint64_t *ret_msgs)
{
	const struct tpd_broker *b = tpd_daemon_broker(d);

	*ret_rings = b->rings;
	*ret_bytes = b->ring_bytes;
	*ret_msgs = b->ring_msgs;
}
