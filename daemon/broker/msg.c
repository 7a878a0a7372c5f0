/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The memory side of a message on the loop thread: resolving the segments of a Write into
 * sources (inline bytes, ranges of shared buffers, addresses in the writer's process, CUDA
 * memory), the Descriptor that tells the reader about them, resolving the segments of a Read
 * into destinations, and the copy job between the two on one host. It checks ranges and takes
 * references; when copies start and how they complete is pipe.c's business.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "buffer.h"
#include "copier.h"
#include "devmem.h"
#include "peer.h"
#include "pipe_int.h"
#include "session.h"

void tpd_msg_release_src(struct tpd_msg *m)
{
	for (size_t i = 0; i < m->n_src; i++) {
		tpb_buffer_unref(m->src[i].buf);
		tpd_devmem_put(&m->src[i].mem);
		tpb_proc_unref(m->src[i].mem.proc);
	}
	free(m->src);
	m->src = NULL;
	m->n_src = 0;
}

void tpd_msg_free(struct tpd_msg *m)
{
	tpd_bcast_detach(m);
	tpd_xh_free(m->xh);
	tpd_msg_release_src(m);
	tpb_copier_job_free(m->job);
	free(m->tail);
	free(m);
}

static int resolve_src(struct tpd_session *s, const Tpw__V1__Segment *seg, const uint8_t *tail,
		       struct tpd_msg_src *out, char *why, size_t wl)
{
	void *ptr;
	int r;

	out->len = seg->length;
	out->mem.loc = TPB_LOC_LOCAL;
	switch (seg->loc_case) {
	case TPW__V1__SEGMENT__LOC_INLINE_OFF:
		out->mem.addr = (uint64_t)(uintptr_t)(tail + seg->inline_off);
		return 0;
	case TPW__V1__SEGMENT__LOC_SHM:
		out->buf = tpd_session_buffer(s, seg->shm->buf_id, seg->shm->gen);
		if (!out->buf) {
			snprintf(why, wl, "no shared buffer %llu/%llu",
				 (unsigned long long)seg->shm->buf_id,
				 (unsigned long long)seg->shm->gen);
			return -ENOENT;
		}
		r = tpb_buffer_resolve(out->buf, seg->shm->offset, seg->length, &ptr);
		if (r < 0) {
			snprintf(
			    why, wl, "range %llu+%llu outside shared buffer %llu of %llu bytes",
			    (unsigned long long)seg->shm->offset, (unsigned long long)seg->length,
			    (unsigned long long)seg->shm->buf_id,
			    (unsigned long long)out->buf->size);
			out->buf = NULL;
			return r;
		}
		tpb_buffer_ref(out->buf);
		out->mem.addr = (uint64_t)(uintptr_t)ptr;
		out->mem.buf = out->buf; /* a channel may keep state with it (cuda_ipc pins it) */
		return 0;
	case TPW__V1__SEGMENT__LOC_CMA_ADDR:
		if (!tpd_session_cma(s)) {
			snprintf(why, wl, "cross-memory attach is not available for this client%s",
				 tpd_session_cma_revoked(s) ? " any more (an access was refused)"
							    : "");
			return -EINVAL;
		}
		out->mem.loc = TPB_LOC_PROCESS;
		out->mem.proc = tpb_proc_ref(tpd_session_proc(s)); /* the message's reference */
		out->mem.addr = seg->cma_addr;
		return 0;
	case TPW__V1__SEGMENT__LOC_RING_ADDR:
		/* Only the writer's library reaches it, through the pipe ring; whether this pipe
		 * direction may send one is the broker's check (tpd_pipe_write_one()). */
		out->mem.loc = TPB_LOC_PROCESS;
		out->mem.proc = tpb_proc_ref(tpd_session_proc(s)); /* the message's reference */
		out->mem.addr = seg->ring_addr;
		out->ring_only = true;
		return 0;
	case TPW__V1__SEGMENT__LOC_CUDA:
		r = tpd_devmem_resolve(s, seg->cuda, &out->mem, why, wl);
		if (r == 0)
			tpb_proc_ref(out->mem.proc); /* the message's reference */
		return r;
	default:
		out->mem.addr = 0; /* zero length, validated */
		return 0;
	}
}

static const Tpw__V1__Segment *write_segment(const Tpw__V1__Write *w, size_t i)
{
	return i < w->n_payloads ? w->payloads[i]->data : w->tensors[i - w->n_payloads]->data;
}

/* Resolves every source of @w into @m; fills @why on failure. */
int tpd_msg_resolve(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Write *w,
		    const uint8_t *tail, char *why, size_t wl)
{
	m->n_src = w->n_payloads + w->n_tensors;
	m->src = calloc(m->n_src ? m->n_src : 1, sizeof(*m->src));
	if (!m->src)
		return -ENOMEM;
	m->eager = true;
	for (size_t i = 0; i < m->n_src; i++) {
		const Tpw__V1__Segment *seg = write_segment(w, i);
		int r = resolve_src(s, seg, tail, &m->src[i], why, wl);
		if (r < 0)
			return r;
		m->bytes += seg->length;
		if (seg->length && seg->loc_case != TPW__V1__SEGMENT__LOC_INLINE_OFF)
			m->eager = false;
		m->ring_only |= m->src[i].ring_only;
	}
	return 0;
}

static void fill_desc(Tpw__V1__Descriptor *dd, const Tpw__V1__Write *w, Tpw__V1__PayloadDesc *pd,
		      Tpw__V1__PayloadDesc **pdp, Tpw__V1__TensorDesc *td,
		      Tpw__V1__TensorDesc **tdp)
{
	static Tpw__V1__Device cpu = TPW__V1__DEVICE__INIT;

	cpu.type = TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	dd->metadata = w->metadata;
	for (size_t i = 0; i < w->n_payloads; i++) {
		tpw__v1__payload_desc__init(&pd[i]);
		pd[i].length = w->payloads[i]->data->length;
		pd[i].metadata = w->payloads[i]->metadata;
		pdp[i] = &pd[i];
	}
	for (size_t i = 0; i < w->n_tensors; i++) {
		tpw__v1__tensor_desc__init(&td[i]);
		td[i].length = w->tensors[i]->data->length;
		td[i].metadata = w->tensors[i]->metadata;
		td[i].device = w->tensors[i]->device ? w->tensors[i]->device : &cpu;
		td[i].target = w->tensors[i]->target;
		tdp[i] = &td[i];
	}
	dd->n_payloads = w->n_payloads;
	dd->payloads = pdp;
	dd->n_tensors = w->n_tensors;
	dd->tensors = tdp;
}

/* A message of up to DESC_INLINE payloads and as many tensors (every ordinary one) has its
 * descriptor's parts built on the stack: no allocation per descriptor on the message path. */
#define DESC_INLINE 8

/* The parts of one Descriptor: on the stack (@in_*), or allocated for a larger message. */
struct desc_parts {
	Tpw__V1__PayloadDesc *pd;
	Tpw__V1__PayloadDesc **pdp;
	Tpw__V1__TensorDesc *td;
	Tpw__V1__TensorDesc **tdp;
	struct iovec *iov;
	bool heap;
	Tpw__V1__PayloadDesc in_pd[DESC_INLINE];
	Tpw__V1__PayloadDesc *in_pdp[DESC_INLINE];
	Tpw__V1__TensorDesc in_td[DESC_INLINE];
	Tpw__V1__TensorDesc *in_tdp[DESC_INLINE];
	struct iovec in_iov[2 * DESC_INLINE];
};

static void desc_parts_done(struct desc_parts *p)
{
	if (!p->heap)
		return;
	free(p->pd);
	free(p->pdp);
	free(p->td);
	free(p->tdp);
	free(p->iov);
}

/* Points @p's parts at room for @w's payloads and tensors. Return: 0 or -ENOMEM. */
static int desc_parts_init(struct desc_parts *p, const Tpw__V1__Write *w)
{
	size_t n = w->n_payloads + w->n_tensors;

	p->heap = w->n_payloads > DESC_INLINE || w->n_tensors > DESC_INLINE;
	if (!p->heap) {
		p->pd = p->in_pd;
		p->pdp = p->in_pdp;
		p->td = p->in_td;
		p->tdp = p->in_tdp;
		p->iov = p->in_iov;
		return 0;
	}
	p->pd = calloc(w->n_payloads + 1, sizeof(*p->pd));
	p->pdp = calloc(w->n_payloads + 1, sizeof(*p->pdp));
	p->td = calloc(w->n_tensors + 1, sizeof(*p->td));
	p->tdp = calloc(w->n_tensors + 1, sizeof(*p->tdp));
	p->iov = calloc(n + 1, sizeof(*p->iov));
	if (!p->pd || !p->pdp || !p->td || !p->tdp || !p->iov) {
		desc_parts_done(p);
		return -ENOMEM;
	}
	return 0;
}

/* Sends the descriptor of @m (written as @w) to the reader @r, with the bytes if eager: to its
 * session, or through the peer link when @r is on another host. */
int tpd_msg_send_descriptor(struct tpd_pipe_end *r, struct tpd_msg *m, const Tpw__V1__Write *w)
{
	Tpw__V1__Descriptor dd = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__PeerDescriptor pd_ = TPW__V1__PEER_DESCRIPTOR__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	size_t n = w->n_payloads + w->n_tensors;
	struct desc_parts p;
	int r_;

	r_ = desc_parts_init(&p, w);
	if (r_ < 0)
		return r_;
	fill_desc(&dd, w, p.pd, p.pdp, p.td, p.tdp);
	dd.pipe_id = r->local_id;
	dd.msg_id = m->msg_id;
	dd.eager = m->eager;
	dd.ring_only = m->ring_only;
	for (size_t i = 0; m->eager && i < n; i++) {
		p.iov[i].iov_base = (void *)(uintptr_t)m->src[i].mem.addr;
		p.iov[i].iov_len = m->src[i].len;
	}
	if (r->remote) {
		dd.pipe_id = 0; /* the peer daemon names the pipe in PeerDescriptor */
		pd_.pipe_id = r->pipe->remote_id;
		pd_.descriptor = &dd;
		pm.body_case = TPW__V1__PEER_MSG__BODY_DESCRIPTOR;
		pm.descriptor = &pd_;
		r_ = r->pipe->link ? tpd_peer_send(r->pipe->link, &pm, p.iov, m->eager ? (int)n : 0)
				   : -ECONNRESET;
	} else {
		dm.body_case = TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR;
		dm.descriptor = &dd;
		r_ = tpd_session_send(r->session, &dm, p.iov, m->eager ? (int)n : 0);
	}
	desc_parts_done(&p);
	return r_;
}

int tpd_msg_send_peer_bcast(struct tpd_peer *link, struct tpd_msg *const *ms, size_t n,
			    const Tpw__V1__Write *w)
{
	Tpw__V1__Descriptor dd = TPW__V1__DESCRIPTOR__INIT;
	Tpw__V1__PeerBcast pb = TPW__V1__PEER_BCAST__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	_cleanup_free_ Tpw__V1__PayloadDesc *pd = calloc(w->n_payloads + 1, sizeof(*pd));
	_cleanup_free_ Tpw__V1__PayloadDesc **pdp = calloc(w->n_payloads + 1, sizeof(*pdp));
	_cleanup_free_ Tpw__V1__TensorDesc *td = calloc(w->n_tensors + 1, sizeof(*td));
	_cleanup_free_ Tpw__V1__TensorDesc **tdp = calloc(w->n_tensors + 1, sizeof(*tdp));
	_cleanup_free_ Tpw__V1__PeerBcastTarget *t = calloc(n, sizeof(*t));
	_cleanup_free_ Tpw__V1__PeerBcastTarget **tp = calloc(n, sizeof(*tp));

	if (!pd || !pdp || !td || !tdp || !t || !tp)
		return -ENOMEM;
	fill_desc(&dd, w, pd, pdp, td, tdp);
	for (size_t i = 0; i < n; i++) {
		tpw__v1__peer_bcast_target__init(&t[i]);
		t[i].pipe_id = ms[i]->from->pipe->remote_id;
		t[i].msg_id = ms[i]->msg_id;
		tp[i] = &t[i];
	}
	pb.descriptor = &dd;
	pb.n_targets = n;
	pb.targets = tp;
	pm.body_case = TPW__V1__PEER_MSG__BODY_BCAST;
	pm.bcast = &pb;
	return tpd_peer_send(link, &pm, NULL, 0);
}

const Tpw__V1__Segment *tpd_msg_read_segment(const Tpw__V1__Read *rd, size_t i)
{
	return i < rd->n_payloads ? rd->payloads[i] : rd->tensors[i - rd->n_payloads];
}

/* Resolves the reader's destination for source @src into @d, taking buffer refs into @job. */
int tpd_msg_resolve_dst(struct tpd_session *s, const Tpw__V1__Segment *seg,
			const struct tpd_msg_src *src, struct tpb_copy_job *job,
			struct tpd_msg_dst *d, char *why, size_t wl)
{
	struct tpb_xfer *x = &d->x;
	struct tpb_buffer *b;
	void *ptr;
	int r;

	if (seg->length != src->len) {
		snprintf(why, wl, "allocation of %llu bytes for a segment of %llu",
			 (unsigned long long)seg->length, (unsigned long long)src->len);
		return -EINVAL;
	}
	x->src = src->mem;
	x->len = src->len;
	d->buf = NULL;
	if (seg->loc_case == TPW__V1__SEGMENT__LOC_RING_ADDR) {
		/* The reader's library copies out of the ring itself: only where the writer's
		 * memory is reachable no other way (the Descriptor said ring_only). */
		if (!src->ring_only) {
			snprintf(why, wl, "ring address for a segment that is not the writer's "
				 "ring-only memory");
			return -EINVAL;
		}
		x->dst = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = tpd_session_proc(s),
					   .addr = seg->ring_addr };
		return tpb_copier_job_hold_proc(job, tpd_session_proc(s));
	}
	if (src->ring_only) {
		snprintf(why, wl, "the writer's memory is reachable only through the pipe ring (it "
			 "has no CMA): the allocation must be CPU memory named by its address");
		return -EINVAL;
	}
	if (seg->loc_case == TPW__V1__SEGMENT__LOC_CMA_ADDR) {
		if (!tpd_session_cma(s)) {
			snprintf(why, wl, "cross-memory attach is not available for this client%s",
				 tpd_session_cma_revoked(s) ? " any more (an access was refused)"
							    : "");
			return -EINVAL;
		}
		x->dst = (struct tpb_mem){ .loc = TPB_LOC_PROCESS, .proc = tpd_session_proc(s),
					   .addr = seg->cma_addr };
		return tpb_copier_job_hold_proc(job, tpd_session_proc(s));
	}
	if (seg->loc_case == TPW__V1__SEGMENT__LOC_CUDA) {
		r = tpd_devmem_resolve(s, seg->cuda, &x->dst, why, wl);
		if (r < 0)
			return r;
		job->maps[job->n_maps++] = x->dst.cuda; /* the job owns these references */
		if (x->dst.event)
			job->maps[job->n_maps++] = x->dst.event;
		return tpb_copier_job_hold_proc(job, x->dst.proc);
	}
	if (seg->loc_case != TPW__V1__SEGMENT__LOC_SHM) {
		snprintf(why, wl, "segment of %llu bytes without destination",
			 (unsigned long long)seg->length);
		return -EINVAL;
	}
	r = tpd_session_buffer_range(s, seg->shm, seg->length, &b, &ptr, why, wl);
	if (r < 0)
		return r;
	job->refs[job->n_refs++] = tpb_buffer_ref(b);
	d->buf = b;
	x->dst = (struct tpb_mem){ .loc = TPB_LOC_LOCAL, .addr = (uint64_t)(uintptr_t)ptr, .buf = b };
	return 0;
}

/* Appends @x to @job as one transfer; the copier's engine cuts it into chunks (work.h). */
static void job_add(struct tpb_copy_job *job, const struct tpb_xfer *x, int channel)
{
	job->xfers[job->n] = *x;
	job->channels[job->n++] = channel;
	job->bytes += x->len;
}

/* The job keeps the source's CUDA mappings alive even if the message goes first. */
static void job_hold_cuda(struct tpb_copy_job *job, const struct tpb_mem *m)
{
	if (m->loc != TPB_LOC_CUDA)
		return;
	job->maps[job->n_maps++] = tpb_cuda_map_ref(m->cuda);
	if (m->event)
		job->maps[job->n_maps++] = tpb_cuda_map_ref(m->event);
}

/* Builds the copy job for @m into the reader's allocation @rd. */
int tpd_msg_build_job(struct tpd_msg *m, struct tpd_session *s, const Tpw__V1__Read *rd,
		      tpb_copy_done_fn done, struct tpb_copy_job **ret, char *why, size_t wl)
{
	struct tpb_copy_job *job;
	size_t n = rd->n_payloads + rd->n_tensors;

	if (n != m->n_src) {
		snprintf(why, wl, "allocation has %zu segments, message has %zu", n, m->n_src);
		return -EINVAL;
	}
	job = tpb_copier_job_new(n, 2 * n);
	if (!job)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		const struct tpd_msg_src *src = &m->src[i];
		struct tpd_msg_dst d;
		struct tpb_xfer *x = &d.x;
		char reason[640], what[32];
		int r, channel;

		if (src->len == 0)
			continue;
		r = tpd_msg_resolve_dst(s, tpd_msg_read_segment(rd, i), src, job, &d, why, wl);
		if (r < 0) {
			tpb_copier_job_free(job);
			return r;
		}
		if (m->bcast && x->src.loc == TPB_LOC_CUDA && x->dst.loc != TPB_LOC_CUDA)
			tpd_bcast_cuda_src(m, i, &x->src); /* the broadcast's staging, if any */
		if (src->buf)
			job->refs[job->n_refs++] = tpb_buffer_ref(src->buf);
		job_hold_cuda(job, &x->src);
		r = tpb_copier_job_hold_proc(job, x->src.proc);
		if (r < 0) {
			snprintf(why, wl, "a copy job spans more than two client processes");
			tpb_copier_job_free(job);
			return r;
		}
		if (src->ring_only) {
			/* never submitted to a channel: the pipe ring or nothing (pipe.c) */
			job_add(job, x, tpb_index("cma"));
			continue;
		}
		channel = tpb_select_why(x->src.loc, x->dst.loc, reason, sizeof(reason));
		if (channel < 0) {
			snprintf(why, wl, "%s", reason);
			tpb_copier_job_free(job);
			return -EOPNOTSUPP;
		}
		job_add(job, x, channel);
		tpd_pipe_pair_record(m->from->pipe, x->src.loc, x->dst.loc, channel);
		snprintf(what, sizeof(what), "%s>%s", tpb_loc_name(x->src.loc),
			 tpb_loc_name(x->dst.loc));
		tpd_pipe_channel_note(m->from->pipe, what, channel, reason);
	}
	job->done = done;
	job->arg = m;
	*ret = job;
	return 0;
}
