/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The peer link's side of channels and work queues across hosts (issue 25 part xhost): the
 * channel part registers a small ops table here (struct tpd_peer_chan_ops), and a link hands
 * it its channel and queue messages (PeerChanOp, PeerChanReply, PeerWqOp, PeerWqReply) with
 * their data tails, and tells it when it is up and when it is torn down. Nothing else of a
 * link is reached from there but through peer.h.
 */
#include <errno.h>
#include "core.h"
#include "peer.h"
#include "peer_int.h"

static const struct tpd_peer_chan_ops *chan_ops;

void tpd_peer_chan_set_ops(const struct tpd_peer_chan_ops *ops)
{
	chan_ops = ops;
}

int tpd_peer_chan_on_msg(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			 uint32_t tail_len)
{
	if (!chan_ops)
		return -EPROTO;
	chan_ops->msg(pr->peers->d, pr, m, tail, tail_len);
	return 0;
}

bool tpd_peer_chan_supported(const struct tpd_peer *pr)
{
	return pr->peer_minor >= TPW_PEER_MINOR_CHAN;
}

unsigned tpd_peer_chan_far_minor(const struct tpd_peer *pr)
{
	return pr->peer_minor;
}

uint32_t tpd_peer_chan_tail_max(const struct tpd_peer *pr)
{
	uint32_t max = tpd_peer_chan_frame_max(pr);

	return max > TPD_PEER_FRAME_SLACK ? max - TPD_PEER_FRAME_SLACK : 0;
}

uint32_t tpd_peer_chan_frame_max(const struct tpd_peer *pr)
{
	return pr->far_frame_max ? pr->far_frame_max : TPW_DEFAULT_FRAME_MAX;
}

void tpd_peer_chan_link_up(struct tpd_peer *pr)
{
	if (chan_ops)
		chan_ops->link_up(pr->peers->d, pr);
}

void tpd_peer_chan_link_failed(struct tpd_peer *pr)
{
	if (chan_ops)
		chan_ops->link_failed(pr->peers->d, pr, pr->fail_err ? pr->fail_err : -ECONNRESET,
				      pr->last_error);
}
