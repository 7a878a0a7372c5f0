/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Raw wire access for tests that must send what libtpclient never would: a plain Unix stream
 * connection to tpipd that sends hand-built frames (valid or broken, with or without fds) and
 * receives daemon frames with deadlines, also through a shared-memory control ring offered by
 * RingSetup (whose positions a test may corrupt); and a plain TCP connection to a daemon's peer
 * port that sends and receives PeerMsg frames the way another daemon would (or garbage). Uses
 * proto/frame.h to pack and unpack.
 */
#ifndef TPT_WIRE_H
#define TPT_WIRE_H

#include <stdbool.h>
#include <stdint.h>
#include "frame.h"
#include "ring.h"
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
/* The same, saying protocol minor @minor (an older library's). */
int tpt_raw_hello_minor(struct tpt_raw *r, Tpw__V1__Role role, uint32_t minor, int timeout_ms);
/* A client Hello that says group_arena_fd (today's library: it may join groups). */
int tpt_raw_hello_group(struct tpt_raw *r, int timeout_ms);

/*
 * tpt_raw_take_fd() - on a connection with a control ring, read the socket's doorbell bytes
 * until one carries an fd (what the daemon sends ahead of RingXfer or GroupJoined).
 * Return: the owned fd, -ETIMEDOUT, or -ECONNRESET.
 */
int tpt_raw_take_fd(struct tpt_raw *r, int timeout_ms);

/*
 * tpt_raw_wait_closed() - read and drop frames until the daemon closes the connection.
 * Return: 0 once closed (EOF or ECONNRESET), -ETIMEDOUT if still open after @timeout_ms.
 */
int tpt_raw_wait_closed(struct tpt_raw *r, int timeout_ms);

/* ---- control rings (RingSetup) ---------------------------------------------------------- */

/*
 * The client's side of a shared-memory control ring: the sealed memfd offered by RingSetup, its
 * mapping, and the two endpoints (produces client->daemon, consumes daemon->client). Once the
 * daemon took it (Reply STATUS_OK), frames go through the rings and the socket carries only
 * doorbell bytes and fds (each fd ahead of its frame, with one byte).
 */
struct tpt_raw_ring {
	int fd;	   /* the memfd; -1 once closed */
	void *map; /* tpu_ring_map_size(size) bytes */
	uint32_t size;
	struct tpu_ring tx, rx;
};

/* Makes a ring of @size bytes per direction with tpu_ring_create(). Return: 0 or -errno. */
int tpt_raw_ring_new(struct tpt_raw_ring *g, uint32_t size);

/* Unmaps and closes (either may already be gone). */
void tpt_raw_ring_free(struct tpt_raw_ring *g);

/* The shared header of @g's mapping (for tests that corrupt positions on purpose). */
struct tpu_ring_shm *tpt_raw_ring_shm(const struct tpt_raw_ring *g);

/*
 * tpt_raw_ring_setup() - after tpt_raw_hello(), send RingSetup{@req_id, @ring_bytes} on the
 * socket carrying @fd (borrowed; < 0: no fd, and the header announces none) and wait for the
 * Reply, which always comes on the socket.
 * @ret: returns the owned reply, free with tpw_daemon_msg_free().
 * Return: 0 once a Reply arrived (whatever its status); -EPROTO if another message came;
 * -errno as tpt_raw_recv().
 */
int tpt_raw_ring_setup(struct tpt_raw *r, uint64_t req_id, uint32_t ring_bytes, int fd,
		       int timeout_ms, Tpw__V1__DaemonMsg **ret);

/* Sends one doorbell byte on the socket. Return: 0 or -errno. */
int tpt_raw_doorbell(struct tpt_raw *r);

/*
 * tpt_raw_ring_put() - publish all of @buf into the client->daemon ring, waiting (futex, up to
 * @timeout_ms) while it is full, and ring the doorbell whenever the daemon sleeps. Return: 0;
 * -ETIMEDOUT; -EPROTO if the daemon's position is impossible; -errno from the doorbell.
 */
int tpt_raw_ring_put(struct tpt_raw *r, struct tpt_raw_ring *g, const void *buf, size_t len,
		     int timeout_ms);

/*
 * tpt_raw_ring_send() - tpt_raw_send() through the ring: @fds (borrowed, @nfds) go first on
 * the socket with one byte, then the frame (announcing @hdr_nfds fds) goes into the ring with
 * tpt_raw_ring_put(). Return: as tpt_raw_ring_put().
 */
int tpt_raw_ring_send(struct tpt_raw *r, struct tpt_raw_ring *g, const Tpw__V1__ClientMsg *msg,
		      const void *tail, uint32_t tail_len, const int *fds, unsigned nfds,
		      uint16_t hdr_nfds, int timeout_ms);

/*
 * tpt_raw_ring_recv() - receive one frame from the daemon->client ring (sleeping on the
 * doorbell when it is empty, as a client does). Frames the daemon wrote before it closed the
 * connection are still returned. Return: as tpt_raw_recv(), and -EPROTO for an impossible
 * daemon position.
 */
int tpt_raw_ring_recv(struct tpt_raw *r, struct tpt_raw_ring *g, int timeout_ms,
		      Tpw__V1__DaemonMsg **ret, uint8_t **ret_tail, uint32_t *ret_tail_len);

/* tpt_raw_expect() through the ring. */
int tpt_raw_ring_expect(struct tpt_raw *r, struct tpt_raw_ring *g, int body_case,
			int timeout_ms, Tpw__V1__DaemonMsg **ret);

/* ---- peer port (TCP) -------------------------------------------------------------------- */

/* Connects to @ip (IPv4 literal) port @port over TCP. Return: 0 or -errno (@r->fd is then -1). */
int tpt_raw_connect_tcp(struct tpt_raw *r, const char *ip, int port);
/* The same from source address @src (an IPv4 literal, e.g. 127.0.0.2: another source to the
 * daemon), or the kernel's choice if NULL. */
int tpt_raw_connect_tcp_from(struct tpt_raw *r, const char *src, const char *ip, int port);

/* Packs @msg into a frame (next sequence number, no data tail) and sends it. Return: 0/-errno. */
int tpt_raw_send_peer(struct tpt_raw *r, const Tpw__V1__PeerMsg *msg);

/* What tpt_raw_peer_dial() states, as another daemon's Hello would. */
struct tpt_raw_peer_hello {
	int port;	    /* the daemon's peer port (on 127.0.0.1) */
	const char *host;   /* host name stated; NULL: "hostile" */
	uint8_t boot_base;  /* boot id: the 16 bytes boot_base, boot_base + 1, ... */
	uint64_t instance;  /* daemon instance stated */
	uint32_t frame_max; /* largest frame it takes; 0: says nothing */
	int timeout_ms;	    /* for each answer awaited */
	const char *src;    /* source address of its connections; NULL: the kernel's choice */
	int rcvbuf;	    /* SO_RCVBUF of its control connection, set before it connects (the
			     * window is small from the first segment: shrunk on a connection
			     * already up, the kernel drops what the window let in); 0: the kernel's */
};

/*
 * tpt_raw_peer_dial() - dial a daemon's peer port as another daemon would over an insecure link
 * (plain frames): control connection @c, Hello stating @h, then one data connection @data bound
 * to the link id the daemon's Ready named, up to the Ready that says the link is up.
 * Return: 0; -ECONNREFUSED if the daemon answered the Hello with none or with an error status
 * (@c stays open); -EPROTO if another step failed (logged with tpt_log()); -errno from a dial.
 */
int tpt_raw_peer_dial(const struct tpt_raw_peer_hello *h, struct tpt_raw *c,
		      struct tpt_raw *data);

/*
 * tpt_raw_send_chunk() - send one chunk of stripe transfer @xfer_id (segment 0) at @off on a
 * peer data connection: the stripe's header (backends/mpt/stripe_io.c: magic, segment, id,
 * offset, length, flags) and @len bytes of @fill.
 * Return: 0 or -errno.
 */
int tpt_raw_send_chunk(struct tpt_raw *data, uint64_t xfer_id, uint64_t off, uint32_t len,
		       uint8_t fill);

/*
 * tpt_raw_recv_peer() - receive one PeerMsg frame (its data tail is dropped).
 * @ret: returns owned message, free with tpw_peer_msg_free().
 * Return: as tpt_raw_recv().
 */
int tpt_raw_recv_peer(struct tpt_raw *r, int timeout_ms, Tpw__V1__PeerMsg **ret);

#endif
