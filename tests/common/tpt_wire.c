/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Raw frames over a Unix socket (directly or through a shared-memory control ring) or a TCP
 * connection to a peer port, for tests. See tpt_wire.h.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include "tpt.h"
#include "tpt_wire.h"
#include "tpu.h"

int tpt_raw_connect(struct tpt_raw *r, const char *path)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	int e;

	r->seq = 0;
	r->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->fd < 0)
		return -errno;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
	if (connect(r->fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		e = -errno;
		close(r->fd);
		r->fd = -1;
		return e;
	}
	return 0;
}

void tpt_raw_close(struct tpt_raw *r)
{
	if (r->fd >= 0)
		close(r->fd);
	r->fd = -1;
}

int tpt_raw_send_bytes(struct tpt_raw *r, const void *buf, size_t len, const int *fds,
		       unsigned nfds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 8)];
	} cm;
	const uint8_t *p = buf;
	size_t off = 0;

	if (nfds > 8)
		return -EINVAL;
	while (off < len) {
		struct iovec iov = { (void *)(p + off), len - off };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t n;

		if (off == 0 && nfds) {
			memset(&cm, 0, sizeof(cm));
			mh.msg_control = cm.b;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
			cm.h.cmsg_level = SOL_SOCKET;
			cm.h.cmsg_type = SCM_RIGHTS;
			cm.h.cmsg_len = CMSG_LEN(sizeof(int) * nfds);
			memcpy(CMSG_DATA(&cm.h), fds, sizeof(int) * nfds);
		}
		n = sendmsg(r->fd, &mh, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		off += (size_t)n;
	}
	return 0;
}

int tpt_raw_send(struct tpt_raw *r, const Tpw__V1__ClientMsg *msg, const void *tail,
		 uint32_t tail_len, const int *fds, unsigned nfds, uint16_t hdr_nfds)
{
	size_t n = tpw_frame_size(&msg->base);
	uint8_t *buf = malloc(n + tail_len);
	int e;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&msg->base, tail_len, hdr_nfds, ++r->seq, buf);
	if (tail_len)
		memcpy(buf + n, tail, tail_len);
	e = tpt_raw_send_bytes(r, buf, n + tail_len, fds, nfds);
	free(buf);
	return e;
}

/* Reads exactly @len bytes before @deadline. Return: 0, -ECONNRESET on EOF, -ETIMEDOUT, -errno. */
static int read_full(int fd, void *buf, size_t len, uint64_t deadline)
{
	uint8_t *p = buf;
	size_t off = 0;

	while (off < len) {
		struct pollfd pf = { .fd = fd, .events = POLLIN };
		int left = (int)(deadline > tpt_now_ms() ? deadline - tpt_now_ms() : 0);
		ssize_t n;
		int r = poll(&pf, 1, left);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return -ETIMEDOUT;
		n = recv(fd, p + off, len - off, MSG_CMSG_CLOEXEC);
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n < 0)
			return errno == ECONNRESET ? -ECONNRESET : -errno;
		if (n == 0)
			return -ECONNRESET;
		off += (size_t)n;
	}
	return 0;
}

/* Reads one frame's header and body (message + data tail) into owned @ret_body. */
static int recv_frame_bytes(struct tpt_raw *r, uint64_t deadline, struct tpw_hdr *h,
			    uint8_t **ret_body)
{
	uint8_t hb[TPW_HDR_SIZE], *body;
	int e = read_full(r->fd, hb, sizeof(hb), deadline);

	if (e < 0)
		return e;
	e = tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, h);
	if (e < 0)
		return e;
	body = malloc((size_t)h->msg_len + h->data_len + 1);
	if (!body)
		return -ENOMEM;
	e = read_full(r->fd, body, (size_t)h->msg_len + h->data_len, deadline);
	if (e < 0) {
		free(body);
		return e;
	}
	*ret_body = body;
	return 0;
}

static int recv_frame(struct tpt_raw *r, uint64_t deadline, Tpw__V1__DaemonMsg **ret,
		      uint8_t **ret_tail, uint32_t *ret_tail_len)
{
	uint8_t *body = NULL;
	struct tpw_hdr h;
	int e = recv_frame_bytes(r, deadline, &h, &body);

	if (e == 0)
		e = tpw_daemon_msg_unpack(body, h.msg_len, ret);
	if (e == 0 && ret_tail) {
		memmove(body, body + h.msg_len, h.data_len);
		*ret_tail = body;
		*ret_tail_len = h.data_len;
		return 0;
	}
	free(body);
	return e;
}

int tpt_raw_recv(struct tpt_raw *r, int timeout_ms, Tpw__V1__DaemonMsg **ret, uint8_t **ret_tail,
		 uint32_t *ret_tail_len)
{
	return recv_frame(r, tpt_now_ms() + (uint64_t)timeout_ms, ret, ret_tail, ret_tail_len);
}

int tpt_raw_expect(struct tpt_raw *r, int body_case, int timeout_ms, Tpw__V1__DaemonMsg **ret)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		Tpw__V1__DaemonMsg *m = NULL;
		int e = recv_frame(r, deadline, &m, NULL, NULL);

		if (e < 0)
			return e;
		if ((int)m->body_case == body_case) {
			*ret = m;
			return 0;
		}
		tpw_daemon_msg_free(m);
	}
}

int tpt_raw_hello(struct tpt_raw *r, Tpw__V1__Role role, int timeout_ms)
{
	return tpt_raw_hello_minor(r, role, TPW_PROTO_MINOR, timeout_ms);
}

/* Sends Hello{@role, @minor, @group_arena_fd} and waits for HelloReply. */
static int raw_hello(struct tpt_raw *r, Tpw__V1__Role role, uint32_t minor, bool group_arena_fd,
		     int timeout_ms)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	int e;

	h.major = TPW_PROTO_MAJOR;
	h.minor = minor;
	h.role = role;
	h.name = "tpt-raw";
	h.group_arena_fd = group_arena_fd;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	e = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	if (e < 0)
		return e;
	e = tpt_raw_recv(r, timeout_ms, &rep, NULL, NULL);
	if (e < 0)
		return e;
	if (rep->body_case != TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY)
		e = -EPROTO;
	else if (rep->hello_reply->status != TPW__V1__STATUS__STATUS_OK)
		e = tpw_status_to_errno(rep->hello_reply->status);
	tpw_daemon_msg_free(rep);
	return e;
}

int tpt_raw_hello_minor(struct tpt_raw *r, Tpw__V1__Role role, uint32_t minor, int timeout_ms)
{
	return raw_hello(r, role, minor, false, timeout_ms);
}

int tpt_raw_hello_group(struct tpt_raw *r, int timeout_ms)
{
	return raw_hello(r, TPW__V1__ROLE__ROLE_CLIENT, TPW_PROTO_MINOR, true, timeout_ms);
}

int tpt_raw_take_fd(struct tpt_raw *r, int timeout_ms)
{
	uint64_t end = tpt_now_ms() + (uint64_t)timeout_ms;

	while (tpt_now_ms() < end) {
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(sizeof(int))];
		} cm;
		uint8_t byte;
		struct iovec iov = { &byte, 1 };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b,
				     .msg_controllen = sizeof(cm.b) };
		struct pollfd pf = { .fd = r->fd, .events = POLLIN };
		struct cmsghdr *c;

		if (poll(&pf, 1, 100) <= 0)
			continue;
		if (recvmsg(r->fd, &mh, MSG_CMSG_CLOEXEC) <= 0)
			return -ECONNRESET;
		c = CMSG_FIRSTHDR(&mh);
		if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int fd;

			memcpy(&fd, CMSG_DATA(c), sizeof(fd));
			return fd;
		}
	}
	return -ETIMEDOUT;
}

int tpt_raw_wait_closed(struct tpt_raw *r, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	uint8_t buf[4096];

	for (;;) {
		struct pollfd pf = { .fd = r->fd, .events = POLLIN };
		int left = (int)(deadline > tpt_now_ms() ? deadline - tpt_now_ms() : 0);
		int e = poll(&pf, 1, left);
		ssize_t n;

		if (e < 0 && errno == EINTR)
			continue;
		if (e == 0)
			return -ETIMEDOUT;
		n = recv(r->fd, buf, sizeof(buf), MSG_CMSG_CLOEXEC);
		if (n == 0 || (n < 0 && errno == ECONNRESET))
			return 0;
		if (n < 0 && errno != EINTR && errno != EAGAIN)
			return -errno;
	}
}

/* ---- control rings ---------------------------------------------------------------------- */

int tpt_raw_ring_new(struct tpt_raw_ring *g, uint32_t size)
{
	int e;

	memset(g, 0, sizeof(*g));
	g->fd = -1;
	e = tpu_ring_create(size, &g->fd, &g->map);
	if (e < 0)
		return e;
	g->size = size;
	tpu_ring_init(g->map, size, true, &g->tx, &g->rx);
	return 0;
}

void tpt_raw_ring_free(struct tpt_raw_ring *g)
{
	if (g->map)
		munmap(g->map, tpu_ring_map_size(g->size));
	if (g->fd >= 0)
		close(g->fd);
	g->map = NULL;
	g->fd = -1;
}

struct tpu_ring_shm *tpt_raw_ring_shm(const struct tpt_raw_ring *g)
{
	return g->map;
}

int tpt_raw_ring_setup(struct tpt_raw *r, uint64_t req_id, uint32_t ring_bytes, int fd,
		       int timeout_ms, Tpw__V1__DaemonMsg **ret)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__RingSetup rs = TPW__V1__RING_SETUP__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	int e;

	rs.req_id = req_id;
	rs.ring_bytes = ring_bytes;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_RING_SETUP;
	m.ring_setup = &rs;
	e = tpt_raw_send(r, &m, NULL, 0, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, fd >= 0 ? 1 : 0);
	if (e < 0)
		return e;
	e = tpt_raw_recv(r, timeout_ms, &rep, NULL, NULL);
	if (e < 0)
		return e;
	if (rep->body_case != TPW__V1__DAEMON_MSG__BODY_REPLY || rep->reply->req_id != req_id) {
		tpw_daemon_msg_free(rep);
		return -EPROTO;
	}
	*ret = rep;
	return 0;
}

int tpt_raw_doorbell(struct tpt_raw *r)
{
	static const uint8_t bell;

	return tpt_raw_send_bytes(r, &bell, 1, NULL, 0);
}

static int left_ms(uint64_t deadline)
{
	uint64_t now = tpt_now_ms();

	return now < deadline ? (int)(deadline - now) : 0;
}

int tpt_raw_ring_put(struct tpt_raw *r, struct tpt_raw_ring *g, const void *buf, size_t len,
		     int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	struct iovec iov = { (void *)buf, len };
	size_t done = 0;

	while (done < len) {
		ssize_t k = tpu_ring_put(&g->tx, &iov, 1, done);
		uint32_t seq;
		int e;

		if (k < 0)
			return (int)k;
		done += (size_t)k;
		if (k > 0 && tpu_ring_consumer_asleep(&g->tx)) {
			e = tpt_raw_doorbell(r);
			if (e < 0)
				return e;
		}
		if (k > 0 || done == len || tpu_ring_wait_space_prepare(&g->tx, &seq))
			continue;
		if (!left_ms(deadline))
			return -ETIMEDOUT;
		tpu_ring_futex_wait(&g->tx, seq, 10);
	}
	return 0;
}

int tpt_raw_ring_send(struct tpt_raw *r, struct tpt_raw_ring *g, const Tpw__V1__ClientMsg *msg,
		      const void *tail, uint32_t tail_len, const int *fds, unsigned nfds,
		      uint16_t hdr_nfds, int timeout_ms)
{
	size_t n = tpw_frame_size(&msg->base);
	uint8_t *buf = malloc(n + tail_len);
	int e = 0;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&msg->base, tail_len, hdr_nfds, ++r->seq, buf);
	if (tail_len)
		memcpy(buf + n, tail, tail_len);
	if (nfds)
		e = tpt_raw_send_bytes(r, "", 1, fds, nfds);
	if (e == 0)
		e = tpt_raw_ring_put(r, g, buf, n + tail_len, timeout_ms);
	free(buf);
	return e;
}

/*
 * Sleeps on the doorbell (at most @ms) with the ring's sleeping flag set, as a client does.
 * Return: 0, or -ECONNRESET once the daemon closed the socket.
 */
static int ring_doze(struct tpt_raw *r, struct tpt_raw_ring *g, int ms)
{
	struct pollfd pf = { .fd = r->fd, .events = POLLIN };
	uint8_t bells[64];
	int e = 0;

	if (tpu_ring_sleep_prepare(&g->rx))
		return 0;
	if (poll(&pf, 1, ms) > 0) {
		ssize_t n = recv(r->fd, bells, sizeof(bells), MSG_DONTWAIT);

		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			e = -ECONNRESET;
	}
	tpu_ring_sleep_cancel(&g->rx);
	return e;
}

/* Reads exactly @len bytes from the daemon->client ring before @deadline. */
static int ring_read_full(struct tpt_raw *r, struct tpt_raw_ring *g, void *buf, size_t len,
			  uint64_t deadline)
{
	uint8_t *p = buf;
	size_t off = 0;
	bool closed = false;

	while (off < len) {
		ssize_t k = tpu_ring_get(&g->rx, p + off, len - off);
		int e;

		if (k < 0)
			return (int)k;
		off += (size_t)k;
		if (k > 0 && tpu_ring_producer_waiting(&g->rx))
			(void)tpt_raw_doorbell(r); /* the daemon holds output until there is room */
		if (k > 0)
			continue;
		if (closed)
			return -ECONNRESET; /* empty after the end: nothing more will come */
		if (!left_ms(deadline))
			return -ETIMEDOUT;
		e = ring_doze(r, g, TPU_MIN(left_ms(deadline), 20));
		closed = e == -ECONNRESET;
	}
	return 0;
}

int tpt_raw_ring_recv(struct tpt_raw *r, struct tpt_raw_ring *g, int timeout_ms,
		      Tpw__V1__DaemonMsg **ret, uint8_t **ret_tail, uint32_t *ret_tail_len)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	uint8_t hb[TPW_HDR_SIZE], *body;
	struct tpw_hdr h;
	int e = ring_read_full(r, g, hb, sizeof(hb), deadline);

	if (e == 0)
		e = tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, &h);
	if (e < 0)
		return e;
	body = malloc((size_t)h.msg_len + h.data_len + 1);
	if (!body)
		return -ENOMEM;
	e = ring_read_full(r, g, body, (size_t)h.msg_len + h.data_len, deadline);
	if (e == 0)
		e = tpw_daemon_msg_unpack(body, h.msg_len, ret);
	if (e == 0 && ret_tail) {
		memmove(body, body + h.msg_len, h.data_len);
		*ret_tail = body;
		*ret_tail_len = h.data_len;
		return 0;
	}
	free(body);
	return e;
}

int tpt_raw_ring_expect(struct tpt_raw *r, struct tpt_raw_ring *g, int body_case,
			int timeout_ms, Tpw__V1__DaemonMsg **ret)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;

	for (;;) {
		Tpw__V1__DaemonMsg *m = NULL;
		int e = tpt_raw_ring_recv(r, g, left_ms(deadline), &m, NULL, NULL);

		if (e < 0)
			return e;
		if ((int)m->body_case == body_case) {
			*ret = m;
			return 0;
		}
		tpw_daemon_msg_free(m);
	}
}

/* ---- peer port (TCP) -------------------------------------------------------------------- */

int tpt_raw_connect_tcp(struct tpt_raw *r, const char *ip, int port)
{
	return tpt_raw_connect_tcp_from(r, NULL, ip, port);
}

/* tpt_raw_connect_tcp_from() with SO_RCVBUF @rcvbuf (0: the kernel's) set before connect(). */
static int connect_tcp(struct tpt_raw *r, const char *src, const char *ip, int port, int rcvbuf)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons((uint16_t)port) };
	struct sockaddr_in from = { .sin_family = AF_INET };
	int e;

	r->seq = 0;
	if (inet_pton(AF_INET, ip, &sin.sin_addr) != 1 ||
	    (src && inet_pton(AF_INET, src, &from.sin_addr) != 1)) {
		r->fd = -1;
		return -EINVAL;
	}
	r->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (r->fd < 0)
		return -errno;
	if ((rcvbuf && setsockopt(r->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf)) < 0) ||
	    (src && bind(r->fd, (struct sockaddr *)&from, sizeof(from)) < 0) ||
	    connect(r->fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		e = -errno;
		close(r->fd);
		r->fd = -1;
		return e;
	}
	return 0;
}

int tpt_raw_connect_tcp_from(struct tpt_raw *r, const char *src, const char *ip, int port)
{
	return connect_tcp(r, src, ip, port, 0);
}

/* Receives the next peer message on @r and checks it has body @body_case. Return: it or NULL. */
static Tpw__V1__PeerMsg *peer_dial_expect(struct tpt_raw *r, int timeout_ms, int body_case)
{
	Tpw__V1__PeerMsg *in = NULL;

	if (tpt_raw_recv_peer(r, timeout_ms, &in) < 0)
		return NULL;
	if ((int)in->body_case != body_case) {
		tpw_peer_msg_free(in);
		return NULL;
	}
	return in;
}

/* The data connection's half of tpt_raw_peer_dial(), for link @link_id. */
static int peer_dial_data(const struct tpt_raw_peer_hello *h, struct tpt_raw *c,
			  struct tpt_raw *data, uint64_t link_id)
{
	Tpw__V1__PeerDataHello dh = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in;
	bool up;
	int r;

	r = tpt_raw_connect_tcp_from(data, h->src, "127.0.0.1", h->port);
	if (r < 0)
		return r;
	dh.link_id = link_id;
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &dh;
	TPT_REQUIRE(tpt_raw_send_peer(data, &m) == 0, -EPROTO, "data hello");
	in = peer_dial_expect(data, h->timeout_ms, TPW__V1__PEER_MSG__BODY_DATA_HELLO);
	TPT_REQUIRE(in, -EPROTO, "no data hello back");
	tpw_peer_msg_free(in);
	in = peer_dial_expect(c, h->timeout_ms, TPW__V1__PEER_MSG__BODY_READY);
	up = in && in->ready->data_up;
	tpw_peer_msg_free(in);
	TPT_REQUIRE(up, -EPROTO, "the link did not come up");
	return 0;
}

int tpt_raw_peer_dial(const struct tpt_raw_peer_hello *h, struct tpt_raw *c,
		      struct tpt_raw *data)
{
	Tpw__V1__PeerHello ph = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in;
	uint8_t boot[16];
	uint64_t link_id;
	bool ok;
	int r;

	for (unsigned i = 0; i < sizeof(boot); i++)
		boot[i] = (uint8_t)(h->boot_base + i);
	r = connect_tcp(c, h->src, "127.0.0.1", h->port, h->rcvbuf);
	if (r < 0)
		return r;
	ph.major = TPW_PEER_PROTO_MAJOR;
	ph.minor = TPW_PEER_PROTO_MINOR;
	ph.host = (char *)(h->host ? h->host : "hostile");
	ph.boot_id.data = boot;
	ph.boot_id.len = sizeof(boot);
	ph.instance = h->instance;
	ph.data_conns = 1;
	ph.frame_max = h->frame_max;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &ph;
	TPT_REQUIRE(tpt_raw_send_peer(c, &m) == 0, -EPROTO, "hello");
	in = peer_dial_expect(c, h->timeout_ms, TPW__V1__PEER_MSG__BODY_HELLO);
	ok = in && (!in->hello->status || in->hello->status == TPW__V1__STATUS__STATUS_OK);
	tpw_peer_msg_free(in);
	if (!ok)
		return -ECONNREFUSED;
	in = peer_dial_expect(c, h->timeout_ms, TPW__V1__PEER_MSG__BODY_READY);
	TPT_REQUIRE(in, -EPROTO, "no ready");
	link_id = in->ready->link_id;
	tpw_peer_msg_free(in);
	return peer_dial_data(h, c, data, link_id);
}

int tpt_raw_send_peer(struct tpt_raw *r, const Tpw__V1__PeerMsg *msg)
{
	size_t n = tpw_frame_size(&msg->base);
	uint8_t *buf = malloc(n);
	int e;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&msg->base, 0, 0, ++r->seq, buf);
	e = tpt_raw_send_bytes(r, buf, n, NULL, 0);
	free(buf);
	return e;
}

int tpt_raw_recv_peer(struct tpt_raw *r, int timeout_ms, Tpw__V1__PeerMsg **ret)
{
	uint8_t *body = NULL;
	struct tpw_hdr h;
	int e = recv_frame_bytes(r, tpt_now_ms() + (uint64_t)timeout_ms, &h, &body);

	if (e == 0)
		e = tpw_peer_msg_unpack(body, h.msg_len, ret);
	free(body);
	return e;
}

static void put_le(uint8_t *p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

int tpt_raw_send_chunk(struct tpt_raw *data, uint64_t xfer_id, uint64_t off, uint32_t len,
		       uint8_t fill)
{
	uint8_t *b = malloc(32 + (size_t)len);
	int e;

	if (!b)
		return -ENOMEM;
	put_le(b, 0x31435054u, 4);
	put_le(b + 4, 0, 4);
	put_le(b + 8, xfer_id, 8);
	put_le(b + 16, off, 8);
	put_le(b + 24, len, 4);
	put_le(b + 28, 0, 4);
	memset(b + 32, fill, len);
	e = tpt_raw_send_bytes(data, b, 32 + (size_t)len, NULL, 0);
	free(b);
	return e;
}
