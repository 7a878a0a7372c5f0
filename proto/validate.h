/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Validation of unpacked messages, in one place, before any handler sees them: a known oneof,
 * enums in range, bounded counts and strings, overflow-checked size arithmetic, inline ranges
 * inside the frame's data tail, fd counts per message type. Checks that need session state
 * (ids owned by the session, ranges inside registered buffers) belong to the daemon.
 * Also maps the wire Status enum to and from errno.
 */
#ifndef TPW_VALIDATE_H
#define TPW_VALIDATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "frame.h"
#include "tpu.h"

/* Limits that validation enforces; the daemon fills them from its configuration. */
struct tpw_limits {
	uint32_t frame_max;	     /* msg_len + data_len per frame */
	uint32_t inline_max;	     /* data tail bytes per frame */
	uint32_t segments_max;	     /* payloads + tensors per message */
	uint64_t message_bytes_max;  /* sum of segment lengths per message */
	uint32_t metadata_max;	     /* sum of metadata bytes per message */
};

/* Defaults used by the daemon and, for daemon -> client frames, by the client. */
#define TPW_DEFAULT_FRAME_MAX (4u << 20)
/* The smallest frame-max a daemon runs with, and a peer's Hello may state. */
#define TPW_FRAME_MAX_MIN 4096u
#define TPW_DEFAULT_INLINE_MAX (1u << 20)
#define TPW_DEFAULT_SEGMENTS_MAX 1024u
#define TPW_DEFAULT_MESSAGE_BYTES_MAX (16ull << 30)
#define TPW_DEFAULT_METADATA_MAX (1u << 20)

/* Most targets of one Broadcast on the wire (the daemon's own limit, bcast-pipes-max, is at
 * most this); more close the session. */
#define TPW_BCAST_TARGETS_MAX 4096u

/* Peer identities a listener may name in Listen.remote_peers. */
#define TPW_REMOTE_PEERS_MAX 32u
#define TPW_GROUP_NAME_MAX 128u  /* GroupJoin.name */
#define TPW_GROUP_SIZE_MAX 4096u /* GroupJoin.size, before the daemon's group-members-max */
#define TPW_GROUP_TOKEN_BYTES 16u /* GroupJoined.token: what the hosts' leaders prove */
#define TPW_GROUP_ADDR_MAX (TPW_TPIP_HOST_MAX + 8u) /* a host's peer address, "[HOST]:PORT" */

void tpw_limits_default(struct tpw_limits *lim);

/*
 * tpw_client_msg_validate() - check a client -> daemon message against @lim.
 * @m: the unpacked message (borrowed).
 * @hdr: its frame header (nfds, data_len).
 * @why, @why_len: receives a one-line reason on failure.
 * Return: 0, or -EBADMSG (malformed), -EMSGSIZE (a size limit), -E2BIG (a count limit).
 */
int tpw_client_msg_validate(const Tpw__V1__ClientMsg *m, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t why_len);

/* Same for daemon -> client messages (the client library checks what it receives). */
int tpw_daemon_msg_validate(const Tpw__V1__DaemonMsg *m, const struct tpw_hdr *hdr,
			    const struct tpw_limits *lim, char *why, size_t why_len);

/* Same for daemon <-> daemon messages on a peer control connection. */
int tpw_peer_msg_validate(const Tpw__V1__PeerMsg *m, const struct tpw_hdr *hdr,
			  const struct tpw_limits *lim, char *why, size_t why_len);

/*
 * tpw_chan_msg_check() - check the descriptor @d of a channel item of @item_len bytes written as
 * a message (ChanOp.msgs): at most @lim->segments_max payloads and tensors, at most
 * @lim->metadata_max metadata bytes in all, known devices, no pipe fields (pipe_id, msg_id,
 * eager, ring_only), and payload and tensor lengths adding up to @item_len exactly. The daemon
 * fails only the write that carries a bad one. Borrows @d.
 * Return: 0, or -EINVAL (inconsistent), -E2BIG (too many parts), -EMSGSIZE (metadata), with a
 * one-line reason in @why.
 */
int tpw_chan_msg_check(const Tpw__V1__Descriptor *d, uint64_t item_len,
		       const struct tpw_limits *lim, char *why, size_t why_len);

/* True if @name is a valid listener name: 1..255 bytes of [A-Za-z0-9._@:+-]. */
bool tpw_name_valid(const char *name);

/* Longest HOST of a tpip:// address (a DNS name is at most 253 bytes). */
#define TPW_TPIP_HOST_MAX 255u
/* Longest tpip://HOST[:PORT]/NAME: "tpip://[" HOST "]:65535/" NAME. */
#define TPW_TPIP_ADDR_MAX (7u + TPW_TPIP_HOST_MAX + 9u + TPW_NAME_MAX)

/*
 * tpw_tpip_parse() - split tpip://HOST[:PORT]/NAME. HOST is a DNS name ([A-Za-z0-9._-], not
 * all digits and dots unless a valid IPv4 address) or a bracketed IPv6 address with an
 * optional zone ("[fe80::1%eth0]"); PORT is 1..65535 (@def_port when absent); NAME passes
 * tpw_name_valid(). Shared by the client (which refuses a bad address before sending it) and
 * the daemon.
 * @host: receives HOST without brackets, at least TPW_TPIP_HOST_MAX + 1 bytes.
 * @ret_name: returns borrowed pointer into @a.
 * Return: 0; -EINVAL with a reason in @why (if not NULL) for any other form.
 */
int tpw_tpip_parse(const char *a, uint16_t def_port, char *host, uint16_t *ret_port,
		   const char **ret_name, char *why, size_t why_len);

/* Wire status -> negative errno (STATUS_OK -> 0; unknown -> -EIO). */
int tpw_status_to_errno(Tpw__V1__Status s);
/* Negative or positive errno -> wire status (0 -> STATUS_OK; unmapped -> STATUS_IO). */
Tpw__V1__Status tpw_status_from_errno(int err);
/* Short name of a status, e.g. "closed". */
const char *tpw_status_name(Tpw__V1__Status s);

#endif
