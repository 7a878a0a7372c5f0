/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The tpipd frame: a fixed 24-byte little-endian header, one protobuf-c message, then an
 * optional raw data tail. This module parses and builds headers, packs messages into frames and
 * unpacks them with a bounded allocator. It does no I/O and keeps no state; validation of the
 * unpacked messages lives in validate.h.
 *
 * Header layout (all little endian):
 *   0  u32 magic     TPW_MAGIC ("TPW1")
 *   4  u16 version   TPW_WIRE_VERSION
 *   6  u16 nfds      fds passed with this frame by SCM_RIGHTS
 *   8  u32 msg_len   protobuf bytes that follow the header (>= 1)
 *  12  u32 data_len  raw bytes that follow the message
 *  16  u64 seq       sender's frame counter, from 1
 */
#ifndef TPW_FRAME_H
#define TPW_FRAME_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tpw.pb-c.h"

#define TPW_MAGIC 0x31575054u /* "TPW1" */
#define TPW_WIRE_VERSION 1
#define TPW_HDR_SIZE 24
#define TPW_FDS_MAX 4
/* No configuration may raise the frame limit above this. */
#define TPW_FRAME_MAX_HARD (64u << 20)
#define TPW_NAME_MAX 255
#define TPW_MESSAGE_MAX 1024 /* error message strings */
#define TPW_CUDA_HANDLE_BYTES 64 /* CUipcMemHandle, CUipcEventHandle */
#define TPW_BUS_ID_MAX 31
#define TPW_CUDA_UUID_BYTES 16 /* CUuuid */
#define TPW_RDMA_PORTS_MAX 32	    /* RDMA ports a daemon announces for cuda_gdr (PeerRdma) */
#define TPW_RDMA_QP_RECORD_BYTES 32 /* one queue-pair connection record in PeerRdma.qps */
#define TPW_RDMA_RAIL_BYTES 16	    /* one port's rail in PeerRdma.rails */

/*
 * Protocol version spoken by this build (Hello.major / Hello.minor). Minor versions:
 *   0  first release
 *   1  the daemon answers every PipeClose with PipeClosed once no copy uses that end's memory
 *   2  shared-memory control rings (RingSetup after HelloReply)
 *   3  CUDA memory segments (Segment.cuda) and CudaRelease
 *   4  SessionEnd both ways: a clean tp_context_free(), a session closed by an administrator
 *   5  flow control: the pipe write window (Limits.pipe_queue_bytes) and FlowCredit
 *   5  Cancel: give up on one pending write or read (tp_cancel())
 *   6  CudaDmabuf: a client hands over the dma-buf of its CUDA allocation for RDMA
 *   7  channel items by reference and batch reads (ChanOp.segments, max_items, take_held;
 *      ChanReply.held_len, copied): a client sends them only to a daemon of minor >= 7, and
 *      a daemon holds a large item for (ChanReply.held_len) only a client of minor >= 7
 *   8  channel items as messages (ChanOp.msgs, msg, msg_drop; ChanReply.msg_desc, msg_held,
 *      msg_taken): a client sends them only to a daemon of minor >= 8; a daemon refuses a
 *      message item to a plain read (STATUS_UNSUPPORTED, the item stays first), so a client of
 *      an older minor never misreads one
 *   9  lent channel items read by mapping (ChanOp.map_ok, mapped, map_done, map_fail;
 *      ChanReply.map_key, map_off, map_size, map_fd; BufferRegister.chan_map): a daemon hands
 *      an item that way only to a client of minor >= 9 on control rings that asks for it
 *  10  work queue questions and answers as messages (WqOp.msg_desc, segment, msg, msg_read,
 *      segments, msg_drop; WqReply.msg_desc, msg_len, msg_held, msg_copied): a client sends them
 *      only to a daemon of minor >= 10; a daemon refuses a message item to a plain take or
 *      answer read (STATUS_UNSUPPORTED, the item stays first), so an older client never
 *      misreads one
 *  11  Broadcast of a message with CUDA tensors (the daemon fans it out, docs/fanout.md): a
 *      client sends one only to a daemon of minor >= 11 and writes each pipe itself otherwise
 *  12  mapped channel buffers retired (ChanReply.retired, a notice with req_id 0): a daemon
 *      sends one only to a client of minor >= 12, which then unmaps those writers' buffers
 *  13  lent channel buffers given back at once (ChanReply.released in a notice with req_id 0):
 *      a daemon sends one only to a client of minor >= 13, which then handles those buffers
 *      as it handles the ones a write's answer gives back
 *  14  a group's remote access (GroupJoin.remote, remote_peers): a client asks for a group
 *      that takes members or a coordinator on other hosts only of a daemon of minor >= 14
 *      (an older one would join such a group without checking the peers); a daemon takes a
 *      GroupJoin without them as remote access NONE
 *  15  Connect.expect_remote, expect_peers (the far daemon's identity a tpip:// connect needs):
 *      a client sends them only to a daemon of minor >= 15 (an older one would ignore them
 *      and connect to whatever daemon answers the address) and refuses the connect otherwise
 */
#define TPW_PROTO_MAJOR 1
#define TPW_PROTO_MINOR 15
#define TPW_MINOR_GROUP_REMOTE 14
#define TPW_MINOR_CONNECT_PEER 15
/* Daemon-to-daemon protocol, versioned apart from the client one. 2: frames inside TLS 1.3, no
 * PeerAuth; a daemon speaking 1 (plaintext PeerHello) is refused with a clear log line. Minor
 * versions of peer protocol 2:
 *   0  first release
 *   1  PeerConnect.wait_ms (a connect waits for the listener) and PeerPipeClose.connect_pending
 *      (its cancel); a dialler sends neither to a daemon of minor 0
 *   2  PeerConnect and PeerConnectReply carry the sender's per-pipe queue limits (queue_max,
 *      queue_bytes): each daemon keeps what its end writes within the far daemon's limits too;
 *      older daemons send neither (0: unknown, own limits only)
 *   3  channels and work queues across hosts (PeerMsg 50-53, issue 25 part xhost): a daemon
 *      forwards none to a daemon of an older minor (that would fail the whole link)
 *   5  the daemon's fan-out across hosts (issue 25 part fanout): PeerBcast (PeerMsg 530) and
 *      PeerReadReq.bcast; a daemon sends neither to a daemon of an older minor
 *   6  large channel items across hosts (issue 25 part xhost): ChanOp.streamed, xfer_id and
 *      room, ChanReply.xfer_id, held_len and copied in PeerChanOp / PeerChanReply, and
 *      PeerMsg.chan_xfer_end (590); a forwarding daemon offers its clients items by reference
 *      (ChanReply.remote_refs) only for a channel whose host speaks 6 or later
 *   7  channel items as messages (ChanOp.msgs, msg, msg_drop; ChanReply.msg_desc, msg_held,
 *      msg_taken) in PeerChanOp / PeerChanReply: a forwarding daemon refuses them
 *      (-EOPNOTSUPP) for a channel whose host speaks an older minor
 *   8  work queues created and owned from other hosts (issue 25 part xhost): PeerWqOp OPEN
 *      with create carries the creation (access, gid, at_most_once, remote, remote_peers) and
 *      its answer's owner says the handle is the owner's; a forwarding daemon refuses such an
 *      open (-EOPNOTSUPP) to a daemon of an older minor, which would open the queue as a worker;
 *      PeerHello.frame_max: work queue payloads are kept within the far daemon's frames
 *   9  work queue questions and answers as messages (WqOp.msg_desc, msg, msg_read, msg_drop;
 *      WqReply.msg_desc, msg_len, msg_held) in PeerWqOp / PeerWqReply, inline only: a
 *      forwarding daemon refuses them (-EOPNOTSUPP) for a queue whose host speaks an older
 *      minor, which would take them for byte ops
 *  10  batch reads of channels: PeerChanOp READ with max_items, answered with up to that many
 *      inline items (cut to the hosting daemon's segments-max, within the forwarding daemon's
 *      frames); a forwarding daemon sends max_items only to a daemon of this minor or later
 *  11  work queue messages by reference across hosts: WqOp.stream_len, xfer_id and room,
 *      WqReply.xfer_id and msg_copied (with msg_len) in PeerWqOp / PeerWqReply, the bytes over
 *      the link's data connections as large channel items' (PeerMsg.chan_xfer_end); a
 *      forwarding daemon offers its clients messages by reference (WqReply.remote_refs) only
 *      for a queue whose host speaks 11 or later, and refuses a larger one otherwise
 *  12  a group's remote access in PeerGroupJoin (remote, remote_peers) and the identity of
 *      each member's link in PeerGroupMember.peer: a member's daemon sends no join to a
 *      coordinator of an older minor (which would admit members of any peer); a coordinator
 *      takes a join without them as remote access NONE and refuses it
 */
#define TPW_PEER_PROTO_MAJOR 2
#define TPW_PEER_PROTO_MINOR 12
#define TPW_PEER_MINOR_CONNECT_WAIT 1
#define TPW_PEER_MINOR_QUEUE_LIMITS 2
#define TPW_PEER_MINOR_CHAN 3
#define TPW_PEER_MINOR_BCAST 5 /* PeerBcast, PeerReadReq.bcast (issue 25, fan-out) */
#define TPW_PEER_MINOR_CHAN_STREAM 6 /* large channel items across hosts (issue 25, xhost) */
#define TPW_PEER_MINOR_CHAN_MSG 7 /* channel items as messages (issue 25, msg) */
#define TPW_PEER_MINOR_WQ_CREATE 8 /* work queues created and owned from other hosts */
#define TPW_PEER_MINOR_WQ_MSG 9 /* work queue questions and answers as messages (wqmsg) */
#define TPW_PEER_MINOR_CHAN_BATCH 10 /* batch reads of channels across hosts (max_items) */
#define TPW_PEER_MINOR_WQ_STREAM 11 /* work queue messages by reference across hosts */
#define TPW_PEER_MINOR_GROUP_REMOTE 12 /* a group's remote access in PeerGroupJoin */
/* The longest PeerConnect.wait_ms a daemon accepts (one hour); a dialler clamps to it. */
#define TPW_PEER_WAIT_MS_MAX 3600000u
#define TPW_MINOR_CLOSE_ACK 1
#define TPW_MINOR_RING 2
#define TPW_MINOR_SESSION_END 4
#define TPW_MINOR_CUDA 3
#define TPW_MINOR_FLOW 5
#define TPW_MINOR_CANCEL 5
#define TPW_MINOR_CUDA_DMABUF 6
#define TPW_MINOR_CHAN_FAST 7
#define TPW_MINOR_CHAN_MSG 8 /* channel items as messages (ChanOp.msgs, ChanOp.msg) */
#define TPW_MINOR_CHAN_MAP 9 /* lent channel items read by mapping (ChanOp.map_ok) */
#define TPW_MINOR_WQ_MSG 10 /* work queue questions and answers as messages (WqOp 650-655) */
#define TPW_MINOR_BCAST_CUDA 11 /* Broadcast of CUDA tensors (issue 25, fan-out) */
#define TPW_MINOR_CHAN_RETIRE 12 /* mapped channel buffers retired (ChanReply.retired) */
#define TPW_MINOR_CHAN_RELEASED 13 /* lent buffers given back by notice (ChanReply.released) */
/* Channel items up to TPW_CHAN_INLINE_ITEM ride inline in frames (writes and answers), except
 * that items above TPW_CHAN_SHM_ITEM in (or read into) a shared buffer are copied with memcpy;
 * other items are copied between the clients' memory and the daemon by CMA (protocol minor 7,
 * docs/channels.md: a CMA access costs more than a frame for smaller items, a memcpy less). */
#define TPW_CHAN_INLINE_ITEM (256u << 10)
#define TPW_CHAN_SHM_ITEM (16u << 10)
/* A packed batch read (ChanOp.pack, tp_chan_read_many_into()) puts each item at a multiple of
 * this in the reader's allocation, the first at 0. */
#define TPW_CHAN_PACK_ALIGN 64u

/*
 * tpw_chan_pack_at() - where an item of @len bytes goes in a packed batch read whose items so
 * far end at @end (0: none yet) in an allocation of @room bytes: the next multiple of
 * TPW_CHAN_PACK_ALIGN. The daemon and the library both place items with it.
 * Return: true with *@ret_off, false when the item does not fit (for any input: no overflow).
 */
static inline bool tpw_chan_pack_at(uint64_t end, uint64_t len, uint64_t room,
				    uint64_t *ret_off)
{
	uint64_t off;

	if (end > room || end > UINT64_MAX - (TPW_CHAN_PACK_ALIGN - 1))
		return false;
	off = (end + (TPW_CHAN_PACK_ALIGN - 1)) & ~(uint64_t)(TPW_CHAN_PACK_ALIGN - 1);
	if (off > room || len > room - off)
		return false;
	*ret_off = off;
	return true;
}

/* Buffer ids one ChanReply.released carries at most (issue 25 part private). */
#define TPW_CHAN_RELEASED_MAX 1024u
/* Buffer keys one ChanOp.mapped lists at most (issue 25 part map). */
#define TPW_CHAN_MAPPED_MAX 16u
/* Buffer keys one ChanReply.retired notice carries at most (client minor 12). */
#define TPW_CHAN_RETIRED_MAX 64u

struct tpw_hdr {
	uint32_t magic;
	uint16_t version;
	uint16_t nfds;
	uint32_t msg_len;
	uint32_t data_len;
	uint64_t seq;
};

/*
 * tpw_hdr_parse() - decode and check a frame header.
 * @buf: TPW_HDR_SIZE bytes (borrowed).
 * @frame_max: largest msg_len + data_len accepted.
 * @ret: the decoded header, written only on success.
 *
 * Return: 0; -EBADMSG for a bad magic, a zero msg_len or too many fds; -EPROTONOSUPPORT for
 * another wire version; -EMSGSIZE if msg_len + data_len exceeds @frame_max.
 */
int tpw_hdr_parse(const uint8_t *buf, uint32_t frame_max, struct tpw_hdr *ret);

/* Encodes @h into TPW_HDR_SIZE bytes at @buf. */
void tpw_hdr_pack(const struct tpw_hdr *h, uint8_t *buf);

/* Bytes needed for the header plus @msg packed (not the data tail). */
size_t tpw_frame_size(const ProtobufCMessage *msg);

/*
 * tpw_frame_pack() - write header and packed @msg into @buf.
 * @buf: at least tpw_frame_size(@msg) bytes.
 * Return: bytes written (header + message).
 */
size_t tpw_frame_pack(const ProtobufCMessage *msg, uint32_t data_len, uint16_t nfds, uint64_t seq,
		      uint8_t *buf);

/*
 * tpw_client_msg_unpack() / tpw_daemon_msg_unpack() - unpack a frame's message.
 * @buf, @len: the msg_len bytes after the header (borrowed).
 * @ret: returns owned message, free with tpw_client_msg_free() / tpw_daemon_msg_free().
 *
 * Allocation during unpack is limited to a budget proportional to @len, so a small frame cannot
 * make the receiver allocate without bound.
 * Return: 0, -EBADMSG if the bytes do not decode (or exceed the budget).
 */
int tpw_client_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__ClientMsg **ret);
int tpw_daemon_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__DaemonMsg **ret);
/* The same for daemon <-> daemon messages (peer links). */
int tpw_peer_msg_unpack(const uint8_t *buf, size_t len, Tpw__V1__PeerMsg **ret);
void tpw_peer_msg_free(Tpw__V1__PeerMsg *m);
void tpw_client_msg_free(Tpw__V1__ClientMsg *m);
void tpw_daemon_msg_free(Tpw__V1__DaemonMsg *m);

#endif
