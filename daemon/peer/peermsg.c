/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * What a peer link's control frames mean, once peer.c has cut, unpacked and validated one: a
 * const table indexed by PeerMsg body case (peer_msg_cmds) whose entries say in which link
 * states each message is expected. Keepalives are answered here, handshake messages go to
 * peerhs.c, pipe messages up to the broker through its struct tpd_peer_pipe_ops and PeerRdma to
 * the link's RDMA state (backends/rdma/link.c). A message the link's state does not expect
 * fails the link.
 * It neither reads nor writes the connection; everything here runs on the loop thread.
 */
#include <errno.h>
#include <stdlib.h>
#include "rdma/rdma.h"
#include "hmap.h"
#include "peer.h"
#include "peer_int.h"

static void on_ping(struct tpd_peer *pr, const Tpw__V1__PeerPing *p)
{
	Tpw__V1__PeerPing pong = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint64_t now = tpu_now_ns();

	if (p->reply) {
		if (p->t_ns && p->t_ns <= now)
			pr->rtt_us = (now - p->t_ns) / 1000;
		return;
	}
	pong.t_ns = p->t_ns;
	pong.reply = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &pong;
	tpd_peer_send(pr, &m, NULL, 0);
}

static struct tpd_pipe *find_pipe(struct tpd_peer *pr, uint64_t id)
{
	return tpu_hmap_get(&pr->pipes, id);
}

/* The name of @m's body ("hello", "connect"...), for messages: the oneof's field. */
static const char *body_name(const Tpw__V1__PeerMsg *m)
{
	const ProtobufCFieldDescriptor *f =
		protobuf_c_message_descriptor_get_field(m->base.descriptor, m->body_case);

	return f ? f->name : "empty";
}

/*
 * A PeerMsg's handler. @tail: borrowed data tail of the frame. Return: 0, or -EPROTO when the
 * message is not expected now (the link fails as for a message its state does not allow).
 */
typedef int peer_msg_fn(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len);

/* Handshake, dialling side: the answerer's Hello, once. */
static int on_msg_hello(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	if (pr->hello_seen)
		return -EPROTO;
	pr->hello_seen = true;
	tpd_peerhs_dial_on_hello(pr, m->hello);
	return 0;
}

static int on_msg_ready(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	tpd_peerhs_dial_on_ready(pr, m->ready);
	return 0;
}

/* Pipe messages on an up link. Unknown pipe ids are stale (the pipe ended here first) and
 * dropped. */
static int on_msg_connect(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			  uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	tpd_peer_pipe_ops()->connect(pr->peers->d, pr, m->connect);
	return 0;
}

static int on_msg_connect_reply(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m,
				const uint8_t *tail, uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	tpd_peer_pipe_ops()->connect_reply(pr, find_pipe(pr, m->connect_reply->pipe_id), m->connect_reply);
	return 0;
}

static int on_msg_descriptor(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			     uint32_t tail_len)
{
	struct tpd_pipe *p = find_pipe(pr, m->descriptor->pipe_id);

	if (p)
		tpd_peer_pipe_ops()->descriptor(p, m->descriptor->descriptor, tail, tail_len);
	return 0;
}

static int on_msg_read_req(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			   uint32_t tail_len)
{
	struct tpd_pipe *p = find_pipe(pr, m->read_req->pipe_id);

	(void)tail;
	(void)tail_len;
	if (p)
		tpd_peer_pipe_ops()->read_req(p, m->read_req);
	return 0;
}

static int on_msg_xfer_end(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			   uint32_t tail_len)
{
	void *arg = tpu_hmap_get(&pr->xfers, m->xfer_end->xfer_id);

	(void)tail;
	(void)tail_len;
	if (arg)
		tpd_peer_pipe_ops()->xfer_end(pr, arg, m->xfer_end);
	return 0;
}

static int on_msg_consumed(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			   uint32_t tail_len)
{
	struct tpd_pipe *p = find_pipe(pr, m->consumed->pipe_id);

	(void)tail;
	(void)tail_len;
	if (p)
		tpd_peer_pipe_ops()->consumed(p, m->consumed);
	return 0;
}

/* The pipes a PeerBcast names, looked up in this link's table only (validation bounded the
 * count); the broker refuses the request if one is not there. */
static int on_msg_bcast(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len)
{
	_cleanup_free_ struct tpd_pipe **pipes = calloc(m->bcast->n_targets, sizeof(*pipes));

	(void)tail;
	(void)tail_len;
	if (!pipes)
		return -ENOMEM;
	for (size_t i = 0; i < m->bcast->n_targets; i++)
		pipes[i] = find_pipe(pr, m->bcast->targets[i]->pipe_id);
	tpd_peer_pipe_ops()->bcast(pr, m->bcast, pipes);
	return 0;
}

static int on_msg_pipe_close(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			     uint32_t tail_len)
{
	const Tpw__V1__PeerPipeClose *pc = m->pipe_close;
	struct tpd_pipe *p;

	(void)tail;
	(void)tail_len;
	if (pc->connect_pending)
		tpd_peer_pipe_ops()->wait_cancel(pr->peers->d, pr, pc->pipe_id);
	else if ((p = find_pipe(pr, pc->pipe_id)))
		tpd_peer_pipe_ops()->close(p, pc->status, pc->message);
	return 0;
}

static int on_msg_ping(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
		       uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	on_ping(pr, m->ping);
	return 0;
}

static int on_msg_rdma(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
		       uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	tpd_peer_rdma_on_msg(pr, m->rdma);
	return 0;
}

static int on_msg_group(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			uint32_t tail_len)
{
	(void)tail;
	(void)tail_len;
	return tpd_peer_group_on_msg(pr, m);
}

static int on_msg_chan(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
		       uint32_t tail_len)
{
	return tpd_peer_chan_on_msg(pr, m, tail, tail_len);
}

/* When a message is expected; anything else fails the link. */
#define PEER_MSG_ANY 0x1u	/* in every state */
#define PEER_MSG_UP 0x2u	/* on an up link */
#define PEER_MSG_DIAL_HS 0x4u	/* on the dialling side, during the control handshake */
#define PEER_MSG_DIAL_DATA 0x8u	/* on the dialling side, while data connections attach */

struct peer_msg_cmd {
	peer_msg_fn *fn;
	unsigned when; /* PEER_MSG_* */
};

/* Every PeerMsg the control connection handles, indexed by body case. Auth and DataHello
 * belong to the accepted connection and the data connections (peerlisten.c, peerhs.c). */
static const struct peer_msg_cmd peer_msg_cmds[] = {
	[TPW__V1__PEER_MSG__BODY_HELLO] = { on_msg_hello, PEER_MSG_DIAL_HS },
	[TPW__V1__PEER_MSG__BODY_READY] = { on_msg_ready, PEER_MSG_DIAL_HS | PEER_MSG_DIAL_DATA },
	[TPW__V1__PEER_MSG__BODY_CONNECT] = { on_msg_connect, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_CONNECT_REPLY] = { on_msg_connect_reply, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_DESCRIPTOR] = { on_msg_descriptor, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_READ_REQ] = { on_msg_read_req, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_XFER_END] = { on_msg_xfer_end, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_CONSUMED] = { on_msg_consumed, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_BCAST] = { on_msg_bcast, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_PIPE_CLOSE] = { on_msg_pipe_close, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_PING] = { on_msg_ping, PEER_MSG_ANY },
	[TPW__V1__PEER_MSG__BODY_RDMA] = { on_msg_rdma, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_GROUP_JOIN] = { on_msg_group, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_GROUP_JOINED] = { on_msg_group, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_GROUP_GONE] = { on_msg_group, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_CHAN_OP] = { on_msg_chan, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_CHAN_REPLY] = { on_msg_chan, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_WQ_OP] = { on_msg_chan, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_WQ_REPLY] = { on_msg_chan, PEER_MSG_UP },
	[TPW__V1__PEER_MSG__BODY_CHAN_XFER_END] = { on_msg_chan, PEER_MSG_UP },
};

/* The table entry of @m's body case, or NULL for a case it does not know. */
static const struct peer_msg_cmd *peer_msg_cmd(const Tpw__V1__PeerMsg *m)
{
	size_t c = (size_t)m->body_case;

	if (c >= TPU_ARRAY_SIZE(peer_msg_cmds) || !peer_msg_cmds[c].fn)
		return NULL;
	return &peer_msg_cmds[c];
}

void tpd_peermsg_dispatch(struct tpd_peer *pr, const Tpw__V1__PeerMsg *m, const uint8_t *tail,
			  uint32_t tail_len)
{
	const struct peer_msg_cmd *cmd = peer_msg_cmd(m);
	unsigned need;

	switch (pr->state) {
	case PEER_HANDSHAKE:
		need = pr->outgoing ? PEER_MSG_DIAL_HS : 0;
		break;
	case PEER_DATA:
		need = pr->outgoing ? PEER_MSG_DIAL_DATA : 0;
		break;
	case PEER_UP:
		need = PEER_MSG_UP;
		break;
	default:
		need = 0;
	}
	if (cmd && (cmd->when & (need | PEER_MSG_ANY)) && cmd->fn(pr, m, tail, tail_len) == 0)
		return;
	if (pr->state == PEER_UP)
		tpd_peer_fail(pr, -EPROTO, "unexpected %s message on an up link", body_name(m));
	else if (pr->state == PEER_HANDSHAKE || pr->state == PEER_DATA)
		tpd_peer_fail(pr, -EPROTO, "unexpected %s message during the handshake",
			      body_name(m));
}
