/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Raw wire access for tests that must send what libtpclient never would: a plain Unix stream
 * connection to tpipd that sends hand-built frames (valid or broken, with or without fds) and
 * receives daemon frames with deadlines; and a plain TCP connection to a daemon's peer port that
 * sends and receives PeerMsg frames the way another daemon would (or garbage). Uses
 * proto/frame.h to pack and unpack.
 */
#ifndef TPT_WIRE_H
#define TPT_WIRE_H

#include <stdbool.h>
#include <stdint.h>
#include "frame.h"
#include "validate.h"

struct tpt_raw {
	int fd;
	uint64_t seq; /* last frame sequence number sent */
};

/* Connects to @path. Return: 0 or -errno; @r->fd is -1 on failure. */
int tpt_raw_connect(struct tpt_raw *r, const char *path);
void tpt_raw_close(struct tpt_raw *r);

/*
 * tpt_raw_send_bytes() - send @len bytes as they are; @fds (borrowed, @nfds of them) ride with
 * the first byte. Return: 0 or -errno (-EPIPE / -ECONNRESET once the daemon closed).
 */
int tpt_raw_send_bytes(struct tpt_raw *r, const void *buf, size_t len, const int *fds,
		       unsigned nfds);

/*
 * tpt_raw_send() - pack @msg into a frame with the next sequence number, the data tail @tail
 * (@tail_len bytes) and a header that announces @hdr_nfds fds; send it with @nfds fds from @fds.
 * A test passes hdr_nfds != nfds to provoke a mismatch. Return: 0 or -errno.
 */
int tpt_raw_send(struct tpt_raw *r, const Tpw__V1__ClientMsg *msg, const void *tail,
		 uint32_t tail_len, const int *fds, unsigned nfds, uint16_t hdr_nfds);

/*
 * tpt_raw_recv() - receive one frame.
 * @ret: returns owned message, free with tpw_daemon_msg_free().
 * @ret_tail, @ret_tail_len: returns the owned data tail (free()), or NULL to drop it.
 * Return: 0; -ECONNRESET when the daemon closed the connection (EOF or reset); -ETIMEDOUT;
 * -EBADMSG for a frame that does not decode.
 */
int tpt_raw_recv(struct tpt_raw *r, int timeout_ms, Tpw__V1__DaemonMsg **ret, uint8_t **ret_tail,
		 uint32_t *ret_tail_len);

/* Receives frames, dropping others, until one with body @body_case. Return: as tpt_raw_recv(). */
int tpt_raw_expect(struct tpt_raw *r, int body_case, int timeout_ms, Tpw__V1__DaemonMsg **ret);

/* Sends Hello{major 1, @role} and waits for HelloReply. Return: 0, its error, or -errno. */
int tpt_raw_hello(struct tpt_raw *r, Tpw__V1__Role role, int timeout_ms);

/*
 * tpt_raw_wait_closed() - read and drop frames until the daemon closes the connection.
 * Return: 0 once closed (EOF or ECONNRESET), -ETIMEDOUT if still open after @timeout_ms.
 */
int tpt_raw_wait_closed(struct tpt_raw *r, int timeout_ms);

/* ---- peer port (TCP) -------------------------------------------------------------------- */

/* Connects to @ip (IPv4 literal) port @port over TCP. Return: 0 or -errno (@r->fd is then -1). */
int tpt_raw_connect_tcp(struct tpt_raw *r, const char *ip, int port);

/* Packs @msg into a frame (next sequence number, no data tail) and sends it. Return: 0/-errno. */
int tpt_raw_send_peer(struct tpt_raw *r, const Tpw__V1__PeerMsg *msg);

/*
 * tpt_raw_recv_peer() - receive one PeerMsg frame (its data tail is dropped).
 * @ret: returns owned message, free with tpw_peer_msg_free().
 * Return: as tpt_raw_recv().
 */
int tpt_raw_recv_peer(struct tpt_raw *r, int timeout_ms, Tpw__V1__PeerMsg **ret);

#endif
