/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: a staged write's copy (private memory, CMA off: tpipd --no-cma and
 * TP_CONTEXT_NO_CMA) holds up no other send of its context. One process holds a writer and a
 * reader context joined by two pipes, A and B. The copy into pipe A's staging buffer is held
 * still deterministically: the message lies in private memory one page of which is missing and
 * registered with userfaultfd, so the library's copy blocks in that page fault until the test
 * fills the page; the test sees the fault arrive (the copy has started and cannot end). While
 * it is held: an eager and a staged message on pipe B are written, read byte-exact and
 * completed; writes on pipe A itself are accepted at once and go out after the held one, in
 * order. A pipe closed while its write is being copied completes that write and the one queued
 * behind it with -ECANCELED once the copy ends, in order, and the staging buffer under the copy
 * serves no other message meanwhile (a message on pipe B written then is read intact after the
 * held copy resumed). A write cancelled during its copy ends -ECANCELED after it, and the next
 * write goes; a daemon lost during the copy fails the pipe's writes after it. The first case
 * holds for a daemon without flow control too (protocol 1.4, through a proxy that rewrites the
 * HelloReply). `tpipctl status` and `sessions` show the staging buffers apart from the other
 * shared buffers.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(30000)
#define LISTENER "stagelock"
#define BIG (256u << 20)	    /* the held message */
#define STAGED ((1u << 20) + 1) /* staged: above the 64 KiB eager limit, private memory */
#define EAGER 1000u		    /* travels inline with its descriptor */

static struct tpt_daemon daemon_nocma;
static unsigned cb_seq; /* callbacks seen, in the order they ran (atomic) */

/* ---- callbacks counted -------------------------------------------------------------------- */

struct seen {
	pthread_mutex_t m;
	pthread_cond_t c;
	int count;
	int status;
	unsigned seq; /* cb_seq when it ran */
};

static void seen_init(struct seen *s)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->m, NULL);
	pthread_cond_init(&s->c, NULL);
}

static void on_done(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct seen *s = arg;

	(void)p;
	(void)errmsg;
	pthread_mutex_lock(&s->m);
	s->count++;
	s->status = status;
	s->seq = __atomic_add_fetch(&cb_seq, 1, __ATOMIC_SEQ_CST);
	pthread_cond_broadcast(&s->c);
	pthread_mutex_unlock(&s->m);
}

/* Waits for the callback; returns its status. */
static int seen_wait(struct seen *s)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += T_MS / 1000;
	pthread_mutex_lock(&s->m);
	while (!s->count)
		if (pthread_cond_timedwait(&s->c, &s->m, &ts))
			break;
	pthread_mutex_unlock(&s->m);
	ck_assert_msg(s->count == 1, "callback ran %d times", s->count);
	return s->status;
}

static int seen_count(struct seen *s)
{
	int n;

	pthread_mutex_lock(&s->m);
	n = s->count;
	pthread_mutex_unlock(&s->m);
	return n;
}

/* ---- a writer and a reader context, two pipes --------------------------------------------- */

struct ends {
	struct tp_context *wctx, *rctx;
	struct tp_listener *l;
	struct tp_pipe *w[2], *r[2];
};

/* Both ends; the writer's context on @writer_socket (NULL: the daemon's). */
static void ends_open_at(struct ends *e, const char *writer_socket)
{
	struct tp_context_options o = { .size = sizeof(o), .socket_path = writer_socket,
					.name = "sl-writer",
					.flags = TP_CONTEXT_NO_CMA | TP_CONTEXT_NO_RING };

	if (writer_socket)
		ck_assert_int_eq(tp_context_new(&o, &e->wctx), 0);
	else
		ck_assert_int_eq(tpt_ctx_new(&daemon_nocma, TP_CONTEXT_NO_CMA, "sl-writer",
					     &e->wctx), 0);
	ck_assert_int_eq(tpt_ctx_new(&daemon_nocma, TP_CONTEXT_NO_CMA, "sl-reader", &e->rctx), 0);
	ck_assert(!tp_context_cma_ok(e->wctx) && !tp_context_cma_ok(e->rctx));
	ck_assert_int_eq(tp_listen(e->rctx, LISTENER, NULL, &e->l), 0);
	for (int i = 0; i < 2; i++) {
		ck_assert_int_eq(tp_connect(e->wctx, LISTENER, &e->w[i]), 0);
		ck_assert_int_eq(tp_listener_accept_sync(e->l, T_MS, &e->r[i]), 0);
		ck_assert_int_eq(tp_pipe_wait_connected(e->w[i], T_MS), 0);
	}
}

static void ends_open(struct ends *e)
{
	ends_open_at(e, NULL);
}

static void ends_close(struct ends *e)
{
	for (int i = 0; i < 2; i++) {
		tp_pipe_close(e->w[i]);
		tp_pipe_close(e->r[i]);
	}
	tp_listener_close(e->l);
	tp_context_free(e->wctx);
	tp_context_free(e->rctx);
}

static struct tp_message one_payload(struct tp_payload *pl, void *data, size_t len)
{
	*pl = (struct tp_payload){ .data = data, .length = len };
	return (struct tp_message){ .payloads = pl, .n_payloads = 1 };
}

/* Reads the next message on @p (one payload of @len bytes) and checks it holds @seed's bytes. */
static void read_expect(struct tp_pipe *p, size_t len, uint64_t seed)
{
	struct tp_descriptor *d;
	struct tp_allocation a;
	struct tp_slot s;
	void *buf = malloc(len);
	size_t bad = 0;

	ck_assert(buf);
	ck_assert_int_eq(tp_pipe_read_descriptor_sync(p, T_MS, &d), 0);
	ck_assert_uint_eq(d->n_payloads, 1);
	ck_assert_uint_eq(d->payloads[0].length, len);
	s = (struct tp_slot){ .device = { TP_DEVICE_CPU, 0 }, .data = buf };
	a = (struct tp_allocation){ .payloads = &s, .n_payloads = 1 };
	ck_assert_int_eq(tp_pipe_read_sync_timeout(p, d, &a, T_MS), 0);
	ck_assert_msg(tpt_verify(buf, len, seed, &bad), "%zu bytes of seed %llu: wrong at %zu",
		      len, (unsigned long long)seed, bad);
	free(buf);
}

/* A message of @len private bytes filled from @seed, written on @p. */
struct msg {
	struct tp_payload pl;
	struct tp_message m;
	void *buf;
	struct seen done;
};

static void msg_write(struct msg *m, struct tp_pipe *p, size_t len, uint64_t seed)
{
	m->buf = malloc(len);
	ck_assert(m->buf);
	tpt_fill(m->buf, len, seed);
	m->m = one_payload(&m->pl, m->buf, len);
	seen_init(&m->done);
	ck_assert_msg(tp_pipe_write(p, &m->m, on_done, &m->done) == 0, "write: %s",
		      tp_last_error());
}

/* ---- private memory whose copy is held in a page fault ------------------------------------ */

struct held {
	int uffd;
	uint8_t *mem;
	size_t len;
	uint8_t *hole; /* the missing page */
	uint8_t *page; /* its bytes, put in place by held_release() */
	size_t page_len;
};

/* Maps @len bytes of @seed's pattern, the page at @len / 2 missing and held by userfaultfd. */
static void held_new(struct held *h, size_t len, uint64_t seed)
{
	struct uffdio_api api = { .api = UFFD_API };
	struct uffdio_register reg = { .mode = UFFDIO_REGISTER_MODE_MISSING };

	h->len = len;
	h->page_len = (size_t)sysconf(_SC_PAGESIZE);
	h->mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	ck_assert(h->mem != MAP_FAILED);
	tpt_fill(h->mem, len, seed);
	h->hole = h->mem + len / 2;
	h->page = malloc(h->page_len);
	ck_assert(h->page);
	memcpy(h->page, h->hole, h->page_len);
	ck_assert_int_eq(madvise(h->hole, h->page_len, MADV_DONTNEED), 0);
	h->uffd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);
	ck_assert_msg(h->uffd >= 0, "userfaultfd: %s", strerror(errno));
	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_API, &api), 0);
	reg.range.start = (uintptr_t)h->hole;
	reg.range.len = h->page_len;
	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_REGISTER, &reg), 0);
}

/* Waits until a copy touches the missing page: it is copying then, and stays so. */
static void held_wait_touched(struct held *h)
{
	struct pollfd pfd = { .fd = h->uffd, .events = POLLIN };
	struct uffd_msg msg;

	ck_assert_msg(poll(&pfd, 1, T_MS) == 1, "the staging copy never reached the held page");
	ck_assert_int_eq(read(h->uffd, &msg, sizeof(msg)), (ssize_t)sizeof(msg));
	ck_assert_int_eq(msg.event, UFFD_EVENT_PAGEFAULT);
	ck_assert(msg.arg.pagefault.address >= (uintptr_t)h->hole &&
		  msg.arg.pagefault.address < (uintptr_t)h->hole + h->page_len);
}

/* Puts the page in place: the copy goes on. */
static void held_release(struct held *h)
{
	struct uffdio_copy cp = { .dst = (uintptr_t)h->hole, .src = (uintptr_t)h->page,
				  .len = h->page_len };

	ck_assert_int_eq(ioctl(h->uffd, UFFDIO_COPY, &cp), 0);
}

static void held_free(struct held *h)
{
	close(h->uffd);
	munmap(h->mem, h->len);
	free(h->page);
}

/* A write of the held memory from its own thread (the copy happens in tp_pipe_write()). */
struct held_writer {
	pthread_t t;
	struct tp_pipe *p;
	struct tp_payload pl;
	struct tp_message m;
	struct seen done;
	int r;
	bool returned; /* atomic */
};

static void *held_writer_main(void *arg)
{
	struct held_writer *w = arg;

	w->r = tp_pipe_write(w->p, &w->m, on_done, &w->done);
	__atomic_store_n(&w->returned, true, __ATOMIC_SEQ_CST);
	return NULL;
}

static void held_writer_start(struct held_writer *w, struct tp_pipe *p, struct held *h)
{
	w->p = p;
	w->m = one_payload(&w->pl, h->mem, h->len);
	seen_init(&w->done);
	ck_assert_int_eq(pthread_create(&w->t, NULL, held_writer_main, w), 0);
}

/* Pipe B's messages, written from a thread: with a copy that held send_lock, the write itself
 * would block, and the test would see that as the reads below failing, not as a hang. */
struct b_writer {
	pthread_t t;
	struct tp_pipe *p;
	struct msg eager, staged;
};

static void *b_writer_main(void *arg)
{
	struct b_writer *w = arg;

	msg_write(&w->eager, w->p, EAGER, 21);
	msg_write(&w->staged, w->p, STAGED, 22);
	return NULL;
}

/* ---- a daemon without flow control ------------------------------------------------------- */

/*
 * A proxy between one client (no ring) and the daemon that rewrites the HelloReply to say
 * protocol 1.4 (before flow control) and forwards every other byte, and the fds that come with
 * the client's bytes (BufferRegister), as they are.
 */
struct proxy {
	int lfd;
	char path[108];
	pthread_t th;
};

/* Sends @len bytes of @buf and, with the first of them, the @n_fds fds of @fds. */
static int proxy_send(int fd, const uint8_t *buf, size_t len, const int *fds, size_t n_fds)
{
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(sizeof(int) * 16)];
	} cm;

	while (len) {
		struct iovec iov = { (void *)buf, len };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		ssize_t k;

		if (n_fds) {
			mh.msg_control = cm.b;
			mh.msg_controllen = CMSG_SPACE(sizeof(int) * n_fds);
			cm.h.cmsg_level = SOL_SOCKET;
			cm.h.cmsg_type = SCM_RIGHTS;
			cm.h.cmsg_len = CMSG_LEN(sizeof(int) * n_fds);
			memcpy(CMSG_DATA(&cm.h), fds, sizeof(int) * n_fds);
		}
		k = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (k <= 0)
			return -1;
		n_fds = 0;
		buf += k;
		len -= (size_t)k;
	}
	return 0;
}

/* Rewrites the first daemon frame (HelloReply) in @buf[0..*len) once it is whole. */
static bool proxy_rewrite_hello(uint8_t *buf, size_t *len, size_t cap)
{
	Tpw__V1__DaemonMsg *dm = NULL;
	struct tpw_hdr h;
	size_t n, rest;
	uint8_t out[8192];

	if (*len < TPW_HDR_SIZE || tpw_hdr_parse(buf, 1u << 20, &h) < 0)
		return false;
	if (*len < TPW_HDR_SIZE + h.msg_len + h.data_len ||
	    tpw_daemon_msg_unpack(buf + TPW_HDR_SIZE, h.msg_len, &dm) < 0)
		return false;
	if (dm->body_case == TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY)
		dm->hello_reply->minor = TPW_MINOR_FLOW - 1;
	n = tpw_frame_pack(&dm->base, h.data_len, h.nfds, h.seq, out);
	tpw_daemon_msg_free(dm);
	rest = *len - TPW_HDR_SIZE - h.msg_len;
	ck_assert(n + rest <= cap && n <= sizeof(out));
	memmove(buf + n, buf + TPW_HDR_SIZE + h.msg_len, rest);
	memcpy(buf, out, n);
	*len = n + rest;
	return true;
}

static void *proxy_main(void *arg)
{
	struct proxy *px = arg;
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int c = accept4(px->lfd, NULL, NULL, SOCK_CLOEXEC);
	int d = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	static uint8_t buf[1 << 16], up[1 << 16];
	size_t pending = 0;
	bool hello_done = false;

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", daemon_nocma.socket);
	if (c < 0 || connect(d, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return NULL;
	for (;;) {
		struct pollfd pfd[2] = { { c, POLLIN, 0 }, { d, POLLIN, 0 } };
		ssize_t k;

		if (poll(pfd, 2, -1) < 0)
			break;
		if (pfd[0].revents) {
			union {
				struct cmsghdr h;
				char b[CMSG_SPACE(sizeof(int) * 16)];
			} cm;
			struct iovec iov = { up, sizeof(up) };
			struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
					     .msg_control = cm.b, .msg_controllen = sizeof(cm.b) };
			int fds[16];
			size_t n_fds = 0;

			k = recvmsg(c, &mh, MSG_CMSG_CLOEXEC);
			for (struct cmsghdr *ch = CMSG_FIRSTHDR(&mh); k > 0 && ch;
			     ch = CMSG_NXTHDR(&mh, ch)) {
				size_t n = (ch->cmsg_len - CMSG_LEN(0)) / sizeof(int);

				if (ch->cmsg_level != SOL_SOCKET || ch->cmsg_type != SCM_RIGHTS)
					continue;
				memcpy(fds + n_fds, CMSG_DATA(ch), n * sizeof(int));
				n_fds += n;
			}
			if (k <= 0 || proxy_send(d, up, (size_t)k, fds, n_fds) < 0)
				break;
			for (size_t i = 0; i < n_fds; i++)
				close(fds[i]);
		}
		if (pfd[1].revents) {
			k = recv(d, buf + pending, sizeof(buf) - pending, 0);
			if (k <= 0)
				break;
			pending += (size_t)k;
			if (!hello_done && !(hello_done = proxy_rewrite_hello(buf, &pending,
									      sizeof(buf))))
				continue;
			if (proxy_send(c, buf, pending, NULL, 0) < 0)
				break;
			pending = 0;
		}
	}
	close(c);
	close(d);
	return NULL;
}

static void proxy_start(struct proxy *px)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	snprintf(px->path, sizeof(px->path), "%s/old.sock", daemon_nocma.dir);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", px->path);
	px->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(px->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(px->lfd, 1), 0);
	ck_assert_int_eq(pthread_create(&px->th, NULL, proxy_main, px), 0);
}

/* ---- tpipctl --json ----------------------------------------------------------------------- */

/* `tpipctl --json @what`, parsed (owned: json_object_put()). */
static struct json_object *ctl_json(const char *what)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", daemon_nocma.socket, "--json", what, NULL };
	struct tpt_cmd_result res;
	struct json_object *o;

	ck_assert_msg(bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	o = json_tokener_parse(res.out);
	ck_assert_msg(o, "tpipctl %s: %s", what, res.out);
	tpt_cmd_result_free(&res);
	return o;
}

static int64_t json_int(struct json_object *o, const char *key)
{
	struct json_object *v;

	ck_assert_msg(json_object_object_get_ex(o, key, &v), "no member %s", key);
	return json_object_get_int64(v);
}

/* The session named @name in `tpipctl --json sessions` @o (borrowed from @o). */
static struct json_object *json_session(struct json_object *o, const char *name)
{
	struct json_object *arr, *v;

	ck_assert(json_object_object_get_ex(o, "sessions", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *s = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(s, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0)
			return s;
	}
	ck_abort_msg("no session named %s", name);
	return NULL;
}

/* ---- cases -------------------------------------------------------------------------------- */

START_TEST(test_staged_copy_on_one_pipe_holds_up_no_other_pipe)
{
	struct ends e;
	struct held h;
	struct held_writer a1 = { 0 };
	struct b_writer b = { 0 };
	struct msg a2, a3, a4;

	ends_open(&e);
	held_new(&h, BIG, 11);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h); /* A's staging copy is under way, and cannot end */

	b.p = e.w[1];
	ck_assert_int_eq(pthread_create(&b.t, NULL, b_writer_main, &b), 0);
	read_expect(e.r[1], EAGER, 21);
	read_expect(e.r[1], STAGED, 22);
	ck_assert_int_eq(seen_wait(&b.eager.done), 0);
	ck_assert_int_eq(seen_wait(&b.staged.done), 0);
	ck_assert_int_eq(pthread_join(b.t, NULL), 0);
	/* All of that while A's copy stayed where it was. */
	ck_assert(!__atomic_load_n(&a1.returned, __ATOMIC_SEQ_CST));
	ck_assert_int_eq(seen_count(&a1.done), 0);

	/* Pipe A takes more writes at once; they go out after the held one. */
	msg_write(&a2, e.w[0], STAGED, 12);
	msg_write(&a3, e.w[0], EAGER, 13);
	ck_assert(!__atomic_load_n(&a1.returned, __ATOMIC_SEQ_CST));

	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0);
	read_expect(e.r[0], BIG, 11);
	read_expect(e.r[0], STAGED, 12);
	read_expect(e.r[0], EAGER, 13);
	ck_assert_int_eq(seen_wait(&a1.done), 0);
	ck_assert_int_eq(seen_wait(&a2.done), 0);
	ck_assert_int_eq(seen_wait(&a3.done), 0);
	ck_assert(a1.done.seq < a2.done.seq && a2.done.seq < a3.done.seq);

	/* The pipes carry on. */
	msg_write(&a4, e.w[0], STAGED, 14);
	read_expect(e.r[0], STAGED, 14);
	ck_assert_int_eq(seen_wait(&a4.done), 0);
	ends_close(&e);
	held_free(&h);
	free(a2.buf);
	free(a3.buf);
	free(a4.buf);
	free(b.eager.buf);
	free(b.staged.buf);
}
END_TEST

START_TEST(test_pipe_closed_during_a_staged_copy_fails_its_writes_after_the_copy)
{
	struct ends e;
	struct held h;
	struct held_writer a1 = { 0 };
	struct b_writer b = { 0 };
	struct msg a2, b1;
	void *sync;

	ends_open(&e);
	held_new(&h, 16u << 20, 31);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h);
	/* As above: pipe B goes on (and a library whose copy blocked every send fails here
	 * instead of hanging on the calls below). */
	b.p = e.w[1];
	ck_assert_int_eq(pthread_create(&b.t, NULL, b_writer_main, &b), 0);
	read_expect(e.r[1], EAGER, 21);
	read_expect(e.r[1], STAGED, 22);
	ck_assert_int_eq(pthread_join(b.t, NULL), 0);
	msg_write(&a2, e.w[0], STAGED, 32); /* queued behind the copy */

	tp_pipe_close(e.w[0]);
	e.w[0] = NULL; /* the handle is gone */
	/* The daemon answers this after it acknowledged the close, so the library has failed
	 * pipe A's writes by the time it returns: their callbacks wait for the copy. */
	ck_assert_int_eq(tp_buffer_alloc(e.wctx, 4096, &sync), 0);
	ck_assert_int_eq(tp_buffer_free(e.wctx, sync), 0);
	ck_assert_int_eq(seen_count(&a1.done), 0);
	ck_assert_int_eq(seen_count(&a2.done), 0);

	/* A message of the held one's size: were the held write's staging buffer back in the
	 * pool, this one would take it, and the copy resumed below would overwrite it. */
	msg_write(&b1, e.w[1], 16u << 20, 33);
	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0); /* accepted: it ends by its callback */
	ck_assert_int_eq(seen_wait(&a1.done), -ECANCELED);
	ck_assert_int_eq(seen_wait(&a2.done), -ECANCELED);
	ck_assert(a1.done.seq < a2.done.seq);
	read_expect(e.r[1], 16u << 20, 33);
	ck_assert_int_eq(seen_wait(&b1.done), 0);

	/* The reader's end of pipe A learns the writer closed it; nothing was sent on it. */
	{
		struct tp_descriptor *d = NULL;

		ck_assert_int_lt(tp_pipe_read_descriptor_sync(e.r[0], T_MS, &d), 0);
	}
	ck_assert_int_eq(seen_wait(&b.eager.done), 0);
	ck_assert_int_eq(seen_wait(&b.staged.done), 0);
	ends_close(&e);
	held_free(&h);
	free(a2.buf);
	free(b1.buf);
	free(b.eager.buf);
	free(b.staged.buf);
}
END_TEST

/* As the first case, with a daemon that has no flow control: the library holds the writes
 * of the pipe whose write is being copied all the same, and sends them in order. */
START_TEST(test_staged_copy_holds_up_no_other_pipe_without_flow_control)
{
	struct ends e;
	struct proxy px;
	struct held h;
	struct held_writer a1 = { 0 };
	struct b_writer b = { 0 };
	struct msg a2, a3;

	proxy_start(&px);
	ends_open_at(&e, px.path);
	held_new(&h, 16u << 20, 61);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h);

	b.p = e.w[1];
	ck_assert_int_eq(pthread_create(&b.t, NULL, b_writer_main, &b), 0);
	read_expect(e.r[1], EAGER, 21);
	read_expect(e.r[1], STAGED, 22);
	ck_assert_int_eq(seen_wait(&b.eager.done), 0);
	ck_assert_int_eq(seen_wait(&b.staged.done), 0);
	ck_assert_int_eq(pthread_join(b.t, NULL), 0);
	ck_assert(!__atomic_load_n(&a1.returned, __ATOMIC_SEQ_CST));
	msg_write(&a2, e.w[0], STAGED, 62);
	msg_write(&a3, e.w[0], EAGER, 63);

	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0);
	read_expect(e.r[0], 16u << 20, 61);
	read_expect(e.r[0], STAGED, 62);
	read_expect(e.r[0], EAGER, 63);
	ck_assert_int_eq(seen_wait(&a1.done), 0);
	ck_assert_int_eq(seen_wait(&a2.done), 0);
	ck_assert_int_eq(seen_wait(&a3.done), 0);
	ck_assert(a1.done.seq < a2.done.seq && a2.done.seq < a3.done.seq);
	ends_close(&e);
	pthread_join(px.th, NULL);
	close(px.lfd);
	held_free(&h);
	free(a2.buf);
	free(a3.buf);
	free(b.eager.buf);
	free(b.staged.buf);
}
END_TEST

/* The daemon dies during a staged copy: the writes of the copying pipe fail after the copy
 * ended, in order, and the context frees cleanly. */
START_TEST(test_daemon_lost_during_a_staged_copy_fails_its_writes_after_the_copy)
{
	const char *args[] = { "--no-cma", NULL };
	struct ends e;
	struct held h;
	struct held_writer a1 = { 0 };
	struct msg a2;
	void *sync = NULL;

	ends_open(&e);
	held_new(&h, 16u << 20, 71);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h);
	msg_write(&a2, e.w[0], STAGED, 72);

	ck_assert_int_eq(tpt_daemon_kill(&daemon_nocma), 0);
	/* Fails once the library has seen the connection go (its request fails with it): the
	 * pipe's writes have failed by then, their callbacks waiting for the copy. */
	ck_assert_int_lt(tp_buffer_alloc(e.wctx, 4096, &sync), 0);
	ck_assert_int_eq(seen_count(&a1.done), 0);
	ck_assert_int_eq(seen_count(&a2.done), 0);

	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0);
	ck_assert_int_lt(seen_wait(&a1.done), 0);
	ck_assert_int_lt(seen_wait(&a2.done), 0);
	ck_assert(a1.done.seq < a2.done.seq);
	ends_close(&e);
	held_free(&h);
	free(a2.buf);
	/* For the fixture's teardown. */
	ck_assert_int_eq(tpt_daemon_start(&daemon_nocma, args), 0);
}
END_TEST

/* tp_cancel() of a write whose copy is held: it ends with -ECANCELED once the copy ended (it
 * never reached the daemon), and the write queued behind it goes out then. */
START_TEST(test_staged_write_cancelled_during_its_copy_lets_the_next_go)
{
	struct ends e;
	struct held h;
	struct held_writer a1 = { 0 };
	struct msg a2;
	int found = 0;

	ends_open(&e);
	held_new(&h, 16u << 20, 51);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h);
	msg_write(&a2, e.w[0], STAGED, 52);
	/* Its id is not out yet (tp_pipe_write_ex() returns it after the copy): the held write
	 * and the one behind it are the context's only pending operations, and ids count up. */
	for (uint64_t id = 1; id < 64 && !found; id++)
		found = tp_cancel(e.wctx, id) == 0;
	ck_assert_msg(found, "no pending operation to cancel");
	ck_assert_int_eq(seen_count(&a1.done), 0);

	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0);
	ck_assert_int_eq(seen_wait(&a1.done), -ECANCELED);
	read_expect(e.r[0], STAGED, 52); /* the first message pipe A carries */
	ck_assert_int_eq(seen_wait(&a2.done), 0);
	ck_assert(a1.done.seq < a2.done.seq);
	ends_close(&e);
	held_free(&h);
	free(a2.buf);
}
END_TEST

/* While a staged copy is held, its 16 MiB buffer is the writer's, shown as a staging buffer
 * next to a tp_buffer_alloc() buffer that is not one. */
START_TEST(test_staging_buffers_shown_apart_in_status_and_sessions)
{
	struct ends e;
	struct held h;
	struct held_writer a1 = { 0 };
	struct json_object *o, *w;
	void *shared;

	ends_open(&e);
	ck_assert_int_eq(tp_buffer_alloc(e.wctx, 1u << 20, &shared), 0);
	held_new(&h, 16u << 20, 41);
	held_writer_start(&a1, e.w[0], &h);
	held_wait_touched(&h);

	o = ctl_json("sessions");
	w = json_session(o, "sl-writer");
	ck_assert_int_ge(json_int(w, "staging_buffers"), 1);
	ck_assert_int_ge(json_int(w, "staging_bytes"), 16 << 20);
	/* Every buffer but the tp_buffer_alloc() one is the library's. */
	ck_assert_int_eq(json_int(w, "buffers") - json_int(w, "staging_buffers"), 1);
	ck_assert_int_eq(json_int(w, "buffer_bytes") - json_int(w, "staging_bytes"), 1 << 20);
	json_object_put(o);
	o = ctl_json("status");
	ck_assert_int_ge(json_int(o, "staging_buffers"), 1);
	ck_assert_int_ge(json_int(o, "staging_bytes"), 16 << 20);
	json_object_put(o);

	held_release(&h);
	ck_assert_int_eq(pthread_join(a1.t, NULL), 0);
	ck_assert_int_eq(a1.r, 0);
	read_expect(e.r[0], 16u << 20, 41);
	ck_assert_int_eq(seen_wait(&a1.done), 0);
	ck_assert_int_eq(tp_buffer_free(e.wctx, shared), 0);
	ends_close(&e);
	held_free(&h);
}
END_TEST

static void setup(void)
{
	const char *args[] = { "--no-cma", NULL };

	ck_assert_int_eq(tpt_daemon_start(&daemon_nocma, args), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&daemon_nocma), 0);
}

static Suite *stagelock_suite(void)
{
	Suite *s = suite_create("stagelock");
	TCase *tc = tcase_create("staging");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 200);
	tcase_add_test(tc, test_staged_copy_on_one_pipe_holds_up_no_other_pipe);
	tcase_add_test(tc, test_pipe_closed_during_a_staged_copy_fails_its_writes_after_the_copy);
	tcase_add_test(tc, test_staged_write_cancelled_during_its_copy_lets_the_next_go);
	tcase_add_test(tc, test_daemon_lost_during_a_staged_copy_fails_its_writes_after_the_copy);
	tcase_add_test(tc, test_staged_copy_holds_up_no_other_pipe_without_flow_control);
	tcase_add_test(tc, test_staging_buffers_shown_apart_in_status_and_sessions);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(stagelock_suite());
}
