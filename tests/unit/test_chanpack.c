/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite: tp_chan_read_many_into() against a daemon that lies (docs/channels.md "Batch
 * reads into one buffer", Trust). A thread of the test plays the daemon on a Unix socket (no
 * control ring, no CMA): it says it takes packed reads, and answers a packed READ with items
 * that do not fit the room the READ named (two of 100 bytes for 150: the second would land at
 * 128), more items than max_items, one inline item larger than the room, or one "copied" item
 * larger than it. Each read fails with -EPROTO and not one byte of the caller's memory changes
 * (the library checks every length before it copies); an answer that fits lands packed. A
 * daemon whose answer to the open does not say it takes packed reads gets none (it would take
 * one as malformed): a read of one item into the buffer, as tp_chan_read_into() sends.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "frame.h"
#include "tpclient.h"

#define ROOM 150u
#define BUF 4096u

enum lie { HONEST, PAST_ROOM, MORE_THAN_MAX, ONE_PAST_ROOM, COPIED_PAST_ROOM, OLD_DAEMON };

struct fake {
	int lfd;
	enum lie lie;
	uint64_t room;	     /* what the READ said */
	uint32_t max_items;
	bool pack;
	char path[108];
};

static int read_full(int fd, void *p, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t k = read(fd, (uint8_t *)p + got, len - got);

		if (k <= 0)
			return -1;
		got += (size_t)k;
	}
	return 0;
}

/* One frame from the client. Return: owned message, or NULL at its end. */
static Tpw__V1__ClientMsg *fake_recv(int fd)
{
	uint8_t hb[TPW_HDR_SIZE], *body;
	Tpw__V1__ClientMsg *m = NULL;
	struct tpw_hdr h;

	if (read_full(fd, hb, sizeof(hb)) < 0 || tpw_hdr_parse(hb, 1u << 26, &h) < 0)
		return NULL;
	body = malloc((size_t)h.msg_len + h.data_len + 1);
	if (body && read_full(fd, body, (size_t)h.msg_len + h.data_len) == 0)
		(void)tpw_client_msg_unpack(body, h.msg_len, &m);
	free(body);
	return m;
}

static void fake_send(int fd, Tpw__V1__DaemonMsg *m, const uint8_t *tail, uint32_t tail_len)
{
	size_t n = tpw_frame_size(&m->base);
	uint8_t *buf = malloc(n + tail_len);

	ck_assert_ptr_nonnull(buf);
	n = tpw_frame_pack(&m->base, tail_len, 0, 1, buf);
	if (tail_len)
		memcpy(buf + n, tail, tail_len);
	ck_assert_int_eq(write(fd, buf, n + tail_len), (ssize_t)(n + tail_len));
	free(buf);
}

/* The answer to READ @o of the lie @f plays. */
static void fake_read(struct fake *f, int fd, const Tpw__V1__ChanOp *o)
{
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	uint64_t lens[3] = { 100, 100, 100 };
	uint8_t tail[300];

	memset(tail, 0x5c, sizeof(tail));
	f->pack = o->pack;
	f->max_items = o->max_items;
	f->room = o->n_segments ? o->segments[0]->length : 0;
	r.req_id = o->req_id;
	r.status = TPW__V1__STATUS__STATUS_OK;
	r.chan_id = 7;
	r.lengths = lens;
	r.n_lengths = f->lie == MORE_THAN_MAX ? 3 : f->lie == OLD_DAEMON ? 1 : 2;
	if (f->lie == ONE_PAST_ROOM || f->lie == COPIED_PAST_ROOM) {
		lens[0] = ROOM + 1;
		r.n_lengths = 1;
	}
	r.copied = f->lie == COPIED_PAST_ROOM;
	dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
	dm.chan_reply = &r;
	fake_send(fd, &dm, tail, r.copied ? 0 : (uint32_t)(lens[0] + (r.n_lengths - 1) * 100));
}

static void *fake_run(void *arg)
{
	struct fake *f = arg;
	Tpw__V1__DaemonMsg dm = TPW__V1__DAEMON_MSG__INIT;
	Tpw__V1__HelloReply hr = TPW__V1__HELLO_REPLY__INIT;
	Tpw__V1__ChanReply r = TPW__V1__CHAN_REPLY__INIT;
	Tpw__V1__Reply rep = TPW__V1__REPLY__INIT;
	Tpw__V1__ClientMsg *m;
	int fd = accept(f->lfd, NULL, NULL);

	ck_assert_int_ge(fd, 0);
	while ((m = fake_recv(fd))) {
		if (m->body_case == TPW__V1__CLIENT_MSG__BODY_HELLO) {
			hr.status = TPW__V1__STATUS__STATUS_OK;
			hr.major = TPW_PROTO_MAJOR;
			hr.minor = TPW_PROTO_MINOR;
			hr.session_id = 1;
			dm.body_case = TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY;
			dm.hello_reply = &hr;
			fake_send(fd, &dm, NULL, 0);
		} else if (m->body_case == TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER) {
			rep = (Tpw__V1__Reply)TPW__V1__REPLY__INIT; /* a staging buffer: taken */
			rep.req_id = m->buffer_register->req_id;
			rep.status = TPW__V1__STATUS__STATUS_OK;
			dm.body_case = TPW__V1__DAEMON_MSG__BODY_REPLY;
			dm.reply = &rep;
			fake_send(fd, &dm, NULL, 0);
		} else if (m->body_case == TPW__V1__CLIENT_MSG__BODY_CHAN_OP &&
			   m->chan_op->op == TPW__V1__CHAN_OP_KIND__CHAN_OP_READ) {
			fake_read(f, fd, m->chan_op);
		} else if (m->body_case == TPW__V1__CLIENT_MSG__BODY_CHAN_OP) {
			r = (Tpw__V1__ChanReply)TPW__V1__CHAN_REPLY__INIT;
			r.req_id = m->chan_op->req_id;
			r.status = TPW__V1__STATUS__STATUS_OK;
			r.chan_id = 7;
			r.pack_reads = f->lie != OLD_DAEMON; /* (the answer to the open says so) */
			dm.body_case = TPW__V1__DAEMON_MSG__BODY_CHAN_REPLY;
			dm.chan_reply = &r;
			fake_send(fd, &dm, NULL, 0);
		}
		tpw_client_msg_free(m);
	}
	close(fd);
	return NULL;
}

/* A read of up to 2 items into ROOM bytes of a buffer of BUF against the lie _i: its result,
 * the buffer unchanged unless honest. */
START_TEST(test_packed_answer_checked_before_any_copy)
{
	struct fake f = { .lie = (enum lie)_i };
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct tp_context_options o = { .size = sizeof(o),
					.flags = TP_CONTEXT_NO_RING | TP_CONTEXT_NO_CMA,
					.reply_timeout_ms = 5000 };
	struct tp_chan_item items[2];
	struct tp_context *ctx = NULL;
	struct tp_chan *ch = NULL;
	uint8_t *buf = NULL, *want = malloc(BUF);
	pthread_t t;
	size_t n = 0;
	int r;

	ck_assert_int_eq(posix_memalign((void **)&buf, 64, BUF), 0);
	ck_assert_ptr_nonnull(want);
	memset(buf, 0xaa, BUF);
	memset(want, 0xaa, BUF);
	snprintf(f.path, sizeof(f.path), "/tmp/tpt-chanpack.%d", (int)getpid());
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", f.path);
	unlink(f.path);
	f.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_ge(f.lfd, 0);
	ck_assert_int_eq(bind(f.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	ck_assert_int_eq(listen(f.lfd, 1), 0);
	ck_assert_int_eq(pthread_create(&t, NULL, fake_run, &f), 0);
	o.socket_path = f.path;
	r = tp_context_new(&o, &ctx);
	ck_assert_msg(r == 0, "context: %d %s", r, tp_last_error());
	ck_assert_msg(tp_chan_open(ctx, "lies", NULL, &ch) == 0, "open: %s", tp_last_error());
	r = tp_chan_read_many_into(ch, buf, _i == HONEST ? 2 * 128 : ROOM, items, 2, &n, 0);
	/* the READ said packed, its room, and max_items; to an older daemon, a read of one item
	 * into the buffer (tp_chan_read_into()'s) */
	ck_assert(f.pack == (_i != OLD_DAEMON));
	ck_assert_uint_eq(f.room, _i == HONEST ? 2 * 128 : ROOM);
	ck_assert_uint_eq(f.max_items, _i == OLD_DAEMON ? 0 : 2);
	if (_i == OLD_DAEMON) {
		ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
		ck_assert_uint_eq(n, 1);
		ck_assert_ptr_eq(items[0].data, buf);
		ck_assert_uint_eq(items[0].len, 100);
		memset(want, 0x5c, 100);
	} else if (_i == HONEST) {
		ck_assert_msg(r == 0, "read: %d %s", r, tp_last_error());
		ck_assert_uint_eq(n, 2);
		ck_assert_ptr_eq(items[0].data, buf);
		ck_assert_ptr_eq(items[1].data, buf + 128);
		memset(want, 0x5c, 100);
		memset(want + 128, 0x5c, 100);
	} else {
		ck_assert_msg(r == -EPROTO, "read: %d %s", r, tp_last_error());
	}
	ck_assert_mem_eq(buf, want, BUF); /* not one byte elsewhere, none at all on a lie */
	tp_chan_release(ch);
	tp_context_free(ctx);
	pthread_join(t, NULL);
	close(f.lfd);
	unlink(f.path);
	free(buf);
	free(want);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("chanpack");
	TCase *tc = tcase_create("chanpack");

	tcase_set_timeout(tc, 30);
	tcase_add_loop_test(tc, test_packed_answer_checked_before_any_copy, HONEST,
			    OLD_DAEMON + 1);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
