/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpipctl's control connection: a non-blocking Unix socket driven by poll() against one
 * deadline, carrying exactly the frames a ROLE_CONTROL session may exchange (Hello, HelloReply,
 * CtlRequest, CtlReply). Every received frame is header-checked, unpacked with the bounded
 * allocator and validated before it is looked at. Rendering is not done here.
 */
#include <poll.h>
#include <stdarg.h>
#include <string.h>
#include <stdio.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include "ctl.h"
#include "validate.h"

#define CTL_CLIENT_NAME "tpipctl"

_printf_(3, 4) static int conn_fail(struct ctl_conn *c, enum ctl_fail kind, const char *fmt, ...)
{
	va_list ap;

	c->fail = kind;
	va_start(ap, fmt);
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	va_end(ap);
	return kind == CTL_FAIL_REACH ? -EIO : -EBADMSG;
}

static const char *errstr(int err, char *buf, size_t len)
{
	return tpu_strerror(err, buf, len);
}

/* Waits until @fd is ready for @events or the deadline passes. Return: 0, -ETIMEDOUT, -errno. */
static int conn_wait(struct ctl_conn *c, short events)
{
	struct pollfd p = { .fd = c->fd, .events = events };
	uint64_t now = tpu_now_ns();
	int r;

	if (now >= c->deadline_ns)
		return -ETIMEDOUT;
	r = poll(&p, 1, (int)((c->deadline_ns - now + 999999) / 1000000));
	if (r < 0)
		return errno == EINTR ? 0 : -errno;
	return r == 0 ? -ETIMEDOUT : 0;
}

static int conn_write_all(struct ctl_conn *c, const uint8_t *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = send(c->fd, buf, len, MSG_NOSIGNAL);
		if (n < 0) {
			bool again = errno == EAGAIN || errno == EINTR;
			int r = again ? conn_wait(c, POLLOUT) : -errno;
			if (r < 0)
				return r;
			continue;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads exactly @len bytes. Return: 0, -ECONNRESET on EOF, -ETIMEDOUT, -errno. */
static int conn_read_all(struct ctl_conn *c, uint8_t *buf, size_t len)
{
	while (len > 0) {
		ssize_t n = recv(c->fd, buf, len, 0);
		if (n == 0)
			return -ECONNRESET;
		if (n < 0) {
			bool again = errno == EAGAIN || errno == EINTR;
			int r = again ? conn_wait(c, POLLIN) : -errno;
			if (r < 0)
				return r;
			continue;
		}
		buf += n;
		len -= (size_t)n;
	}
	return 0;
}

static int conn_send(struct ctl_conn *c, const Tpw__V1__ClientMsg *m)
{
	_cleanup_free_ uint8_t *buf = malloc(tpw_frame_size(&m->base));
	char eb[128];
	size_t n;
	int r;

	if (!buf)
		return -ENOMEM;
	n = tpw_frame_pack(&m->base, 0, 0, ++c->seq, buf);
	r = conn_write_all(c, buf, n);
	if (r < 0)
		return conn_fail(c, CTL_FAIL_REACH, "sending to tpipd at %s: %s", c->path,
				 errstr(r, eb, sizeof(eb)));
	return 0;
}

static int conn_read_frame(struct ctl_conn *c, struct tpw_hdr *h, uint8_t **ret)
{
	uint8_t hb[TPW_HDR_SIZE];
	_cleanup_free_ uint8_t *body = NULL;
	char eb[128];
	int r;

	r = conn_read_all(c, hb, sizeof(hb));
	if (r == 0) {
		r = tpw_hdr_parse(hb, TPW_FRAME_MAX_HARD, h);
		if (r < 0)
			return conn_fail(c, CTL_FAIL_DAEMON,
					 "tpipd at %s sent a bad frame header: %s", c->path,
					 errstr(r, eb, sizeof(eb)));
		body = malloc((size_t)h->msg_len + h->data_len);
		if (!body)
			return -ENOMEM;
		r = conn_read_all(c, body, (size_t)h->msg_len + h->data_len);
	}
	c->eof = r == -ECONNRESET;
	if (r < 0)
		return conn_fail(c, CTL_FAIL_REACH, "reading from tpipd at %s: %s", c->path,
				 r == -ECONNRESET ? "connection closed by the daemon"
						  : errstr(r, eb, sizeof(eb)));
	*ret = TAKE_PTR(body);
	return 0;
}

/* Receives one frame and returns its validated message, which must have body @want. */
static int conn_recv(struct ctl_conn *c, Tpw__V1__DaemonMsg__BodyCase want,
		     Tpw__V1__DaemonMsg **ret)
{
	_cleanup_free_ uint8_t *body = NULL;
	Tpw__V1__DaemonMsg *m = NULL;
	struct tpw_limits lim;
	struct tpw_hdr h;
	char why[256];
	int r;

	r = conn_read_frame(c, &h, &body);
	if (r < 0)
		return r;
	tpw_limits_default(&lim);
	lim.frame_max = TPW_FRAME_MAX_HARD;
	if (tpw_daemon_msg_unpack(body, h.msg_len, &m) < 0)
		return conn_fail(c, CTL_FAIL_DAEMON,
				 "tpipd at %s sent a message that does not decode", c->path);
	r = tpw_daemon_msg_validate(m, &h, &lim, why, sizeof(why));
	if (r == 0 && m->body_case != want) {
		snprintf(why, sizeof(why), "unexpected message type %d", (int)m->body_case);
		r = -EBADMSG;
	}
	if (r < 0) {
		tpw_daemon_msg_free(m);
		return conn_fail(c, CTL_FAIL_DAEMON, "tpipd at %s: %s", c->path, why);
	}
	*ret = m;
	return 0;
}

/*
 * Connects without blocking: a Unix socket whose backlog is full answers EAGAIN (it cannot be
 * polled for), so retry every few milliseconds until the deadline.
 */
static int conn_connect(struct ctl_conn *c)
{
	const struct timespec pause = { 0, 5 * 1000000 };
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	char eb[128];
	int err;

	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (c->fd < 0)
		return conn_fail(c, CTL_FAIL_REACH, "cannot connect to tpipd at %s: socket: %s",
				 c->path, errstr(errno, eb, sizeof(eb)));
	memcpy(sun.sun_path, c->path, strlen(c->path) + 1);
	for (;;) {
		if (connect(c->fd, (struct sockaddr *)&sun, sizeof(sun)) == 0)
			return 0;
		err = errno;
		if (err == EAGAIN && tpu_now_ns() < c->deadline_ns)
			nanosleep(&pause, NULL);
		else if (err != EINTR)
			break;
	}
	if (err == EAGAIN)
		err = ETIMEDOUT;
	return conn_fail(c, CTL_FAIL_REACH, "cannot connect to tpipd at %s: %s", c->path,
			 errstr(err, eb, sizeof(eb)));
}

static int conn_hello(struct ctl_conn *c)
{
	Tpw__V1__Hello hello = TPW__V1__HELLO__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *reply = NULL;
	const Tpw__V1__HelloReply *hr;
	int r;

	hello.major = TPW_PROTO_MAJOR;
	hello.minor = TPW_PROTO_MINOR;
	hello.role = TPW__V1__ROLE__ROLE_CONTROL;
	hello.name = (char *)CTL_CLIENT_NAME;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &hello;
	r = conn_send(c, &m);
	if (r == 0)
		r = conn_recv(c, TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY, &reply);
	if (r < 0)
		return r;
	hr = reply->hello_reply;
	if (hr->status != TPW__V1__STATUS__STATUS_OK)
		r = conn_fail(c, CTL_FAIL_DAEMON, "tpipd at %s refused the session (%s): %s",
			      c->path, tpw_status_name(hr->status), hr->message ? hr->message : "");
	tpw_daemon_msg_free(reply);
	return r;
}

/*
 * Picks the socket as libtpclient does (tpu_socket_candidates()): the one asked for, else the
 * per-user socket and, when that file is missing, the system's. Return: 0 or -EIO (c->why).
 */
static int conn_pick_path(struct ctl_conn *c, const char *socket_path)
{
	struct tpu_socket_list l;
	struct stat st;
	char eb[128], tried[2 * 140] = "";
	size_t len = 0;
	int r = tpu_socket_candidates(socket_path, &l);

	if (r < 0)
		return conn_fail(c, CTL_FAIL_REACH,
				 "cannot connect to tpipd: cannot resolve the socket path (%s); "
				 "use --socket PATH or set TPIPD_SOCKET",
				 errstr(r, eb, sizeof(eb)));
	for (unsigned i = 0; i < l.n; i++) {
		snprintf(c->path, sizeof(c->path), "%s", l.path[i]);
		if (l.fixed || stat(c->path, &st) == 0 || errno != ENOENT)
			return 0; /* connecting says what is wrong with it */
		len += (size_t)snprintf(tried + len, sizeof(tried) - len, "%s%s (no such file)",
					i ? ", " : "", l.path[i]);
	}
	return conn_fail(c, CTL_FAIL_REACH,
			 "no daemon socket: tried %s%s; start tpipd, or use --socket PATH or "
			 "TPIPD_SOCKET", l.n == 1 ? "($XDG_RUNTIME_DIR is not set) " : "", tried);
}

int ctl_conn_open(struct ctl_conn *c, const char *socket_path, int timeout_ms)
{
	int r;

	*c = (struct ctl_conn){ .fd = -EBADF };
	ctl_conn_set_timeout(c, timeout_ms);
	r = conn_pick_path(c, socket_path);
	if (r < 0)
		return r;
	r = conn_connect(c);
	if (r < 0)
		return r;
	return conn_hello(c);
}

int ctl_conn_request(struct ctl_conn *c, Tpw__V1__CtlWhat what, uint64_t target_id,
		     Tpw__V1__DaemonMsg **ret)
{
	Tpw__V1__CtlRequest req = TPW__V1__CTL_REQUEST__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *reply = NULL;
	const Tpw__V1__CtlReply *cr;
	int r;

	req.req_id = c->seq + 1;
	req.what = what;
	req.target_id = target_id;
	req.verbose = c->verbose;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CTL;
	m.ctl = &req;
	r = conn_send(c, &m);
	if (r == 0)
		r = conn_recv(c, TPW__V1__DAEMON_MSG__BODY_CTL_REPLY, &reply);
	if (r < 0)
		return r;
	cr = reply->ctl_reply;
	if (cr->req_id != req.req_id)
		r = conn_fail(c, CTL_FAIL_DAEMON,
			      "tpipd at %s answered request %llu, expected %llu", c->path,
			      (unsigned long long)cr->req_id, (unsigned long long)req.req_id);
	else if (cr->status != TPW__V1__STATUS__STATUS_OK)
		r = conn_fail(c, CTL_FAIL_DAEMON, "tpipd at %s: %s: %s", c->path,
			      tpw_status_name(cr->status), cr->message ? cr->message : "");
	if (r < 0) {
		tpw_daemon_msg_free(reply);
		return r;
	}
	*ret = reply;
	return 0;
}

void ctl_conn_set_timeout(struct ctl_conn *c, int timeout_ms)
{
	c->deadline_ns = tpu_now_ns() + (uint64_t)timeout_ms * 1000000ull;
}

void ctl_conn_close(struct ctl_conn *c)
{
	c->fd = tpu_close(c->fd);
}
