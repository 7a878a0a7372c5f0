/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer link's side of rdma and cuda_gdr: the link ops backends/rdma calls (send a set-up
 * step on the control connection, name the link) and the translation of that step between its
 * plain form (struct tpb_rdma_setup) and the wire's PeerRdma, both ways, handed to the link's
 * rdma endpoint (tpb_ep_msg()); and the RDMA offer of a PeerReadReq (rdma_port, rdma) to and
 * from the bytes the channel's tpb_prepare() writes and tpb_start() takes, so that the broker
 * (xh.c) carries them without knowing their form. The queue pairs, ports and transfers are
 * backends/rdma's. Runs on the loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include "frame.h"
#include "log.h"
#include "peer.h"
#include "peer_int.h"
#include "rdma/rdma.h"

_Static_assert(TPB_RDMA_QP_RECORD_BYTES == TPW_RDMA_QP_RECORD_BYTES, "queue-pair record size");

static int rdma_send(void *link, const struct tpb_rdma_setup *m)
{
	Tpw__V1__PeerRdma rm = TPW__V1__PEER_RDMA__INIT;
	Tpw__V1__PeerMsg pm = TPW__V1__PEER_MSG__INIT;
	_cleanup_free_ ProtobufCBinaryData *qps = NULL, *rails = NULL;

	if (m->n_qps && !(qps = calloc(m->n_qps, sizeof(*qps))))
		return -ENOMEM;
	if (m->n_rails && !(rails = calloc(m->n_rails, sizeof(*rails))))
		return -ENOMEM;
	for (size_t i = 0; i < m->n_qps; i++)
		qps[i] = (ProtobufCBinaryData){ m->qps[i].len, (uint8_t *)m->qps[i].data };
	for (size_t i = 0; i < m->n_rails; i++)
		rails[i] = (ProtobufCBinaryData){ m->rails[i].len, (uint8_t *)m->rails[i].data };
	rm.n_rails = m->n_rails;
	rm.rails = rails;
	rm.ports = m->ports;
	rm.n_qps = m->n_qps;
	rm.qps = qps;
	rm.error = (char *)(m->error ? m->error : "");
	pm.body_case = TPW__V1__PEER_MSG__BODY_RDMA;
	pm.rdma = &rm;
	return tpd_peer_send(link, &pm, NULL, 0);
}

static const char *rdma_name(const void *link)
{
	return tpd_peer_name(link);
}

const struct tpb_rdma_link_ops tpd_peer_rdma_ops = {
	.send = rdma_send,
	.name = rdma_name,
};

/* The link's rdma endpoint, which takes the set-up steps (cuda_gdr's shares its link), or
 * NULL where the two daemons set up no RDMA. */
static struct tpb_ep *rdma_ep(struct tpd_peer *pr)
{
	return tpd_peer_ep(pr, tpb_index("rdma"));
}

void tpd_peer_rdma_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerRdma *m)
{
	_cleanup_free_ struct tpb_rdma_record *qps = NULL, *rails = NULL;
	struct tpb_rdma_setup st = { .ports = m->ports, .n_qps = m->n_qps, .n_rails = m->n_rails,
				     .error = m->error };

	if (!rdma_ep(pr))
		return;
	if ((m->n_qps && !(qps = calloc(m->n_qps, sizeof(*qps)))) ||
	    (m->n_rails && !(rails = calloc(m->n_rails, sizeof(*rails))))) {
		tpd_peer_log(pr, TPU_LOG_WARNING, "RDMA set-up step dropped: out of memory");
		return;
	}
	for (size_t i = 0; i < m->n_qps; i++)
		qps[i] = (struct tpb_rdma_record){ m->qps[i].data, m->qps[i].len };
	for (size_t i = 0; i < m->n_rails; i++)
		rails[i] = (struct tpb_rdma_record){ m->rails[i].data, m->rails[i].len };
	st.qps = qps;
	st.rails = rails;
	(void)tpb_ep_msg(rdma_ep(pr), &st);
}

int tpd_peer_rdma_offer_in(const Tpw__V1__PeerReadReq *rr, struct tpd_peer_offer *ret)
{
	_cleanup_free_ struct tpb_rdma_region *regions = NULL;
	struct tpd_peer_offer o = { .n = rr->n_rdma };
	struct tpb_rdma_offer of = { .port = rr->rdma_port, .n = rr->n_rdma };

	if (!rr->n_rdma) {
		*ret = (struct tpd_peer_offer){ 0 };
		return 0;
	}
	o.len = tpb_rdma_offer_size(rr->n_rdma);
	regions = calloc(rr->n_rdma, sizeof(*regions));
	o.kinds = calloc(rr->n_rdma, sizeof(*o.kinds));
	o.bytes = malloc(o.len);
	if (!regions || !o.kinds || !o.bytes) {
		tpd_peer_rdma_offer_done(&o);
		return -ENOMEM;
	}
	for (size_t i = 0; i < rr->n_rdma; i++) {
		regions[i] = (struct tpb_rdma_region){ .addr = rr->rdma[i]->addr,
						       .rkey = rr->rdma[i]->rkey,
						       .length = rr->rdma[i]->length,
						       .cuda = rr->rdma[i]->cuda };
		o.kinds[i] = rr->rdma[i]->cuda ? TPB_LOC_CUDA : TPB_LOC_LOCAL;
	}
	of.regions = regions;
	if (tpb_rdma_offer_encode(&of, o.bytes, o.len) < 0) { /* never: sized above */
		tpd_peer_rdma_offer_done(&o);
		return -ENOMEM;
	}
	*ret = o;
	return 0;
}

void tpd_peer_rdma_offer_done(struct tpd_peer_offer *o)
{
	free(o->bytes);
	free(o->kinds);
	*o = (struct tpd_peer_offer){ 0 };
}

int tpd_peer_rdma_offer_out(const void *offer, size_t len, Tpw__V1__PeerReadReq *rr,
			    void **ret_store, char *why, size_t wl)
{
	_cleanup_free_ struct tpb_rdma_region *regions = NULL;
	Tpw__V1__PeerRdmaRegion *wire, **ptrs;
	struct tpb_rdma_offer of;
	size_t n;
	int r = tpb_rdma_offer_decode(offer, len, &regions, &of, why, wl);

	if (r < 0)
		return r;
	/* One block: the regions, then the pointers to them the message carries. */
	n = of.n ? of.n : 1;
	wire = calloc(n, sizeof(*wire) + sizeof(*ptrs));
	if (!wire) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	ptrs = (Tpw__V1__PeerRdmaRegion **)(wire + n);
	for (size_t i = 0; i < of.n; i++) {
		tpw__v1__peer_rdma_region__init(&wire[i]);
		wire[i].addr = of.regions[i].addr;
		wire[i].rkey = of.regions[i].rkey;
		wire[i].length = of.regions[i].length;
		wire[i].cuda = of.regions[i].cuda;
		ptrs[i] = &wire[i];
	}
	rr->rdma_port = of.port;
	rr->n_rdma = of.n;
	rr->rdma = ptrs;
	*ret_store = wire;
	return 0;
}
