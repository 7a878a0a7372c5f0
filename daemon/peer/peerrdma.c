/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer link's side of rdma and cuda_gdr: the link ops backends/rdma calls (send a set-up
 * step on the control connection, name the link) and the translation of that step between its
 * plain form (struct tpb_rdma_setup) and the wire's PeerRdma, both ways. The queue pairs, ports
 * and transfers are backends/rdma's; the offers in PeerReadReq are the broker's (xh.c). Runs on
 * the loop thread.
 */
#include <errno.h>
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

void tpd_peer_rdma_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerRdma *m)
{
	_cleanup_free_ struct tpb_rdma_record *qps = NULL, *rails = NULL;
	struct tpb_rdma_setup st = { .ports = m->ports, .n_qps = m->n_qps, .n_rails = m->n_rails,
				     .error = m->error };

	if (!pr->gdr)
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
	tpb_rdma_link_on_msg(pr->gdr, &st);
}
