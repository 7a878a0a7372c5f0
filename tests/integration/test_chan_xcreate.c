/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: creating and unlinking channels from another host (issue 25 part xhost;
 * docs/channels.md "Across hosts"). Two daemons on loopback: a client of a names
 * tpip://b/NAME. Without chan-remote-create-uid on b (the default), a create of a missing
 * channel and an unlink of b's channel are answered as for a missing channel, and b's channel
 * stays. With chan-remote-create-uid 4242, a create makes the channel on b owned by uid 4242
 * with the flags and capacity the client asked for (persistent, capacity in items: a third
 * item of a capacity of 2 is refused), a second exclusive create gets -EADDRINUSE, the
 * channel outlives the client's handle and goes with its unlink from a; a create under another
 * owner uid and an unlink of root's channel are refused, root's channel untouched; b's
 * chans-per-uid holds for uid 4242 just at and just above, a channel unlinked from a while a
 * handle keeps it included (it used to leave every count of b).
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ipeer.h"
#include "itest.h"

#define T_MS 30000

static struct tpt_daemon da, db, dc;

static struct tp_context *ctx_of(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	ck_assert_int_eq(tpt_ctx_new(d, 0, "xcreate", &ctx), 0);
	return ctx;
}

static const char *at(const char *name)
{
	return tpt_peer_at(&db, name);
}

/* Does b's `tpipctl --json channels` list @name (with @field in its row's text, if given)? */
static bool b_lists(const char *name, const char *field)
{
	return tpt_ctl_lists(&db, "channels", name, field);
}

/* @d's one peer link must be up. */
static void link_up(const struct tpt_daemon *d)
{
	struct tpt_link link;

	ck_assert_msg(tpt_peer_links(d, &link) == 1 && strcmp(link.state, "up") == 0,
		      "the link is %s: %s", link.state, link.last_error);
}

/* b's own channel "roots" (root's; any peer may open it). */
static struct tp_chan *roots_chan(struct tp_context *cb)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE |
				     TP_CHAN_PERSISTENT, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER };
	struct tp_chan *ch = NULL;

	ck_assert_int_eq(tp_chan_open(cb, "roots", &o, &ch), 0);
	return ch;
}

START_TEST(test_create_and_unlink_refused_by_default)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1 };
	struct tp_context *ca, *cb;
	struct tp_chan *ch = NULL, *rc;

	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, NULL), 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	rc = roots_chan(cb);
	ck_assert_int_eq(tp_chan_open(ca, at("made"), &o, &ch), -ENOENT);
	ck_assert_msg(strstr(tp_last_error(), "creates none for other hosts"), "%s",
		      tp_last_error());
	ck_assert(!b_lists("made", NULL));
	ck_assert_int_eq(tp_chan_unlink(ca, at("roots"), 0), -ENOENT);
	ck_assert_msg(strstr(tp_last_error(), "chan-remote-create-uid"), "%s", tp_last_error());
	ck_assert(b_lists("roots", NULL));
	o.flags = 0;
	o.owner_uid = 0;
	ck_assert_int_eq(tp_chan_open(ca, at("roots"), &o, &ch), 0); /* opening still works */
	tp_chan_release(ch);
	tp_chan_release(rc);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

START_TEST(test_create_and_unlink_as_the_configured_uid)
{
	static const char *const bargs[] = { "--chan-remote-create-uid", "4242", "--chans-per-uid",
					     "2", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE |
				     TP_CHAN_PERSISTENT, .owner_uid = -1, .capacity_items = 2 };
	struct tp_context *ca, *cb;
	struct tp_chan *ch = NULL, *ch2 = NULL, *third = NULL, *rc;
	char item[8] = "item";
	struct iovec it = { item, sizeof(item) };

	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, bargs), 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	rc = roots_chan(cb);
	ck_assert_msg(tp_chan_open(ca, at("made"), &o, &ch) == 0, "%s", tp_last_error());
	ck_assert(b_lists("made", "\"uid\": 4242"));
	ck_assert(b_lists("made", "\"persistent\": true"));
	ck_assert(b_lists("made", "\"capacity_items\": 2"));
	ck_assert_int_eq(tp_chan_write(ch, &it, 1, 0), 0);
	ck_assert_int_eq(tp_chan_write(ch, &it, 1, 0), 0);
	ck_assert_int_eq(tp_chan_write(ch, &it, 1, 0), -ENOBUFS); /* its capacity, on b */
	o.flags |= TP_CHAN_EXCL;
	ck_assert_int_eq(tp_chan_open(ca, at("made"), &o, &ch2), -EADDRINUSE);
	o.flags = TP_CHAN_CREATE;
	o.owner_uid = 0; /* in another uid's names: no */
	ck_assert_int_eq(tp_chan_open(ca, at("other"), &o, &ch2), -ENOENT);
	ck_assert(!b_lists("other", NULL));
	o.owner_uid = -1; /* chans-per-uid 2: a second channel of uid 4242 just fits, a third not */
	o.flags = TP_CHAN_CREATE | TP_CHAN_PERSISTENT;
	ck_assert_msg(tp_chan_open(ca, at("second"), &o, &ch2) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_release(ch2), 0);
	ck_assert_int_eq(tp_chan_open(ca, at("third"), &o, &ch2), -ENOBUFS);
	ck_assert_int_eq(tp_chan_unlink(ca, at("roots"), 0), -ENOENT); /* root's: not ours */
	ck_assert(b_lists("roots", NULL));
	ck_assert_int_eq(tp_chan_release(ch), 0);
	ck_assert(b_lists("made", NULL)); /* persistent: outlives the handle */
	ck_assert_msg(tp_chan_unlink(ca, at("made"), -1) == 0, "%s", tp_last_error());
	ck_assert(!b_lists("made", NULL));
	ck_assert_int_eq(tp_chan_unlink(ca, at("made"), -1), -ENOENT);
	ck_assert_int_eq(tp_chan_unlink(ca, at("second"), 4242), 0);
	/* unlinked from a while a's handle keeps it: still one of uid 4242's two */
	ck_assert_msg(tp_chan_open(ca, at("kept"), &o, &ch) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_unlink(ca, at("kept"), -1), 0);
	ck_assert_msg(tp_chan_open(ca, at("n1"), &o, &ch2) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_open(ca, at("n2"), &o, &third), -ENOBUFS);
	ck_assert_int_eq(tp_chan_release(ch), 0); /* freed: its slot comes back */
	ck_assert_msg(tp_chan_open(ca, at("n2"), &o, &third) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_unlink(ca, at("n1"), -1), 0);
	ck_assert_int_eq(tp_chan_unlink(ca, at("n2"), -1), 0);
	tp_chan_release(ch2);
	tp_chan_release(third);
	tp_chan_release(rc);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* Items inline across hosts within the far daemon's frames (PeerHello.frame_max), the link
 * staying up. _i 0: a takes 8 MiB inline, b's frames 4 MiB: a batch of 5 MiB of small items
 * written from a is refused with -EMSGSIZE naming the limit, one of 1 MiB passes. 1: a's frames
 * are 128 KiB: an item of 200 KiB read from a (inline up to 256 KiB otherwise) comes over the
 * data connections, intact. Such frames used to fail the whole link. */
START_TEST(test_items_inline_within_the_far_frames)
{
	static const char *const big[] = { "--frame-max", "16777216", "--inline-max", "8388608",
					   NULL };
	static const char *const small[] = { "--frame-max", "131072", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER };
	struct tp_chan_options ro = { .size = sizeof(ro), .owner_uid = 0 };
	enum { SMALL_ITEM = 16384, N_ITEMS = 320, ITEM = 200 << 10 };
	static struct iovec iov[N_ITEMS];
	struct tp_context *ca, *cb;
	struct tp_chan *hb, *ha;
	uint8_t *buf = malloc(N_ITEMS * SMALL_ITEM);
	void *got;
	size_t len;

	ck_assert_ptr_nonnull(buf);
	tpt_fill(buf, N_ITEMS * SMALL_ITEM, 7);
	ck_assert_int_eq(tpt_daemon_pair_start(&da, _i ? small : big, &db, NULL), 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_chan_open(cb, "wide", &o, &hb), 0);
	ck_assert_msg(tp_chan_open(ca, at("wide"), &ro, &ha) == 0, "%s", tp_last_error());
	for (size_t i = 0; i < N_ITEMS; i++)
		iov[i] = (struct iovec){ buf + i * SMALL_ITEM, SMALL_ITEM };
	if (_i == 0) {
		ck_assert_int_eq(tp_chan_write(ha, iov, N_ITEMS, 0), -EMSGSIZE);
		ck_assert_msg(strstr(tp_last_error(), "above the 4128768 that cross to it"), "%s",
			      tp_last_error());
		ck_assert_int_eq(tp_chan_write(ha, iov, 64, 0), 0); /* 1 MiB */
		for (size_t i = 0; i < 64; i++) {
			ck_assert_int_eq(tp_chan_read(hb, &got, &len, T_MS), 0);
			ck_assert(len == SMALL_ITEM && memcmp(got, iov[i].iov_base, len) == 0);
			free(got);
		}
	} else {
		struct iovec one = { buf, ITEM };

		ck_assert_int_eq(tp_chan_write(hb, &one, 1, 0), 0);
		ck_assert_msg(tp_chan_read(ha, &got, &len, T_MS) == 0, "%s", tp_last_error());
		ck_assert(len == ITEM && tpt_verify(got, len, 7, NULL));
		free(got);
	}
	link_up(&da);
	tp_chan_release(ha);
	tp_chan_release(hb);
	free(buf);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* tpip:// address of @name on b over IPv6 loopback (b listening on "*:0"): another address
 * than 127.0.0.1 on this host, so another far daemon to b. */
static const char *at6(const char *name)
{
	static char buf[4][256];
	static unsigned k;
	char *b = buf[k++ % 4];

	snprintf(b, sizeof(buf[0]), "tpip://[::1]:%d/%s", db.peer_port, name);
	return b;
}

/* Whether this host has an IPv6 loopback to listen on. */
static bool ipv6_loopback(void)
{
	struct sockaddr_in6 in6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
	int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0 && bind(fd, (struct sockaddr *)&in6, sizeof(in6)) == 0;

	if (fd >= 0)
		close(fd);
	return ok;
}

/* @ctx's tp_chan_open() of channel @addr (of b) with create, persistent. Return: its result. */
static int xcreate_at(struct tp_context *ctx, const char *addr, struct tp_chan **ret)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE |
				     TP_CHAN_PERSISTENT, .owner_uid = -1 };

	return tp_chan_open(ctx, addr, &o, ret);
}

/* xcreate_at() of channel @name of b. */
static int xcreate(struct tp_context *ctx, const char *name, struct tp_chan **ret)
{
	return xcreate_at(ctx, at(name), ret);
}

/* As xcreate_at() for a work queue (not persistent: it lives while its owner's handle does). */
static int xcreate_wq_at(struct tp_context *ctx, const char *addr, struct tp_wq **ret)
{
	struct tp_wq_options o = { .size = sizeof(o), .flags = TP_WQ_CREATE, .owner_uid = -1 };

	return tp_wq_open(ctx, addr, &o, ret);
}

static int xcreate_wq(struct tp_context *ctx, const char *name, struct tp_wq **ret)
{
	return xcreate_wq_at(ctx, at(name), ret);
}

/*
 * One far daemon's share of what chan-remote-create-uid's uid may hold on b
 * (--chan-remote-create-per-peer 2, --chan-remote-bytes-per-peer 64K; the uid's chans-per-uid far
 * above). A far daemon holding the pre-shared key is known by the address its link comes from:
 * a (over 127.0.0.1) and c (over ::1, b listening on both; skipped without IPv6 loopback).
 * a creates two channels and two queues, and its third of each
 * is refused (-ENOBUFS, naming the limit) while c still creates its own; a's writes fit
 * up to 64 KiB together, one byte more is refused naming the limit while c's channel takes the
 * same write; the writes of all far daemons together stop at one chan-bytes-per-uid (96K here)
 * of their own, charged to no local uid: c's second 32 KiB is refused naming it; b's `tpipctl
 * channels` and `queues` say whom each is charged to. A channel a unlinks and releases gives
 * its slot back; a's restart keeps its account. Before, one far daemon could take every
 * channel, queue and byte of that uid.
 */
START_TEST(test_each_far_daemon_gets_its_share)
{
	static const char *const bargs[] = { "--chan-remote-create-uid", "4242",
					     "--chan-remote-create-per-peer", "2",
					     "--chan-remote-bytes-per-peer", "64K",
					     "--chan-bytes-per-uid", "96K", "--peer-listen", "*:0",
					     NULL };
	static const char *const aargs[] = { "--peer-host-name", "ha", NULL };
	static const char *const cargs[] = { "--peer-host-name", "hc", NULL };
	static uint8_t item[32768];
	struct iovec half = { item, sizeof(item) }, one = { item, 1 };
	struct tp_context *ca, *cc;
	struct tp_chan *a1, *a2, *a3 = NULL, *c1;
	struct tp_wq *q1, *q2, *q3 = NULL, *qc;
	char *out;

	if (!ipv6_loopback()) {
		fprintf(stderr, "skipped: no IPv6 loopback (the far daemons need two addresses)\n");
		return;
	}
	ck_assert_int_eq(tpt_daemon_pair_start(&da, aargs, &db, bargs), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&dc, cargs), 0);
	ca = ctx_of(&da);
	cc = ctx_of(&dc);
	ck_assert_msg(xcreate(ca, "a1", &a1) == 0, "%s", tp_last_error());
	ck_assert_msg(xcreate(ca, "a2", &a2) == 0, "%s", tp_last_error());
	ck_assert_int_eq(xcreate(ca, "a3", &a3), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "chan-remote-create-per-peer"), "%s",
		      tp_last_error());
	ck_assert(!b_lists("a3", NULL));
	ck_assert_msg(xcreate_wq(ca, "qa1", &q1) == 0, "%s", tp_last_error());
	ck_assert_msg(xcreate_wq(ca, "qa2", &q2) == 0, "%s", tp_last_error());
	ck_assert_int_eq(xcreate_wq(ca, "qa3", &q3), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "chan-remote-create-per-peer"), "%s",
		      tp_last_error());
	ck_assert_msg(xcreate_at(cc, at6("c1"), &c1) == 0, "%s", tp_last_error()); /* c's own */
	ck_assert_msg(xcreate_wq_at(cc, at6("qc"), &qc) == 0, "%s", tp_last_error());
	ck_assert(b_lists("a1", "\"created_by\": \"psk:tpipd@127.0.0.1\""));
	ck_assert(b_lists("c1", "\"created_by\": \"psk:tpipd@::1\""));
	out = tpt_ctl(&db, "queues", true);
	ck_assert_msg(strstr(out, "\"created_by\": \"psk:tpipd@127.0.0.1\"") &&
		      strstr(out, "\"created_by\": \"psk:tpipd@::1\""), "%s", out);
	free(out);
	/* bytes: 64 KiB in a's two channels, then one more byte is a's limit, not c's */
	ck_assert_int_eq(tp_chan_write(a1, &half, 1, 0), 0);
	ck_assert_int_eq(tp_chan_write(a2, &half, 1, 0), 0);
	ck_assert_int_eq(tp_chan_write(a1, &one, 1, 0), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "chan-remote-bytes-per-peer"), "%s",
		      tp_last_error());
	ck_assert_int_eq(tp_chan_write(c1, &half, 1, 0), 0); /* 96 KiB of far writes: just at */
	ck_assert_int_eq(tp_chan_write(c1, &half, 1, 0), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "far hosts' writes share"), "%s", tp_last_error());
	/* a slot comes back once a's channel is gone (unlinked, its handle released) */
	ck_assert_int_eq(tp_chan_unlink(ca, at("a2"), -1), 0);
	ck_assert_int_eq(tp_chan_release(a2), 0);
	ck_assert_msg(xcreate(ca, "a3", &a3) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_write(a3, &half, 1, 0), 0); /* a2's bytes went with it */
	ck_assert_int_eq(tp_chan_write(a3, &one, 1, 0), -ENOBUFS); /* at both limits again */
	/* a's daemon restarts: its persistent channels still count against it */
	tp_chan_release(a1);
	tp_chan_release(a3);
	tp_wq_release(q1);
	tp_wq_release(q2);
	tp_context_free(ca);
	tpt_daemon_stop(&da);
	ck_assert_int_eq(tpt_daemon_start_peer(&da, aargs), 0);
	ca = ctx_of(&da);
	ck_assert_int_eq(xcreate(ca, "a4", &a3), -ENOBUFS);
	ck_assert_msg(xcreate_wq(ca, "qa4", &q1) == 0, "%s", tp_last_error()); /* queues went */
	tp_wq_release(q1);
	tp_chan_release(c1);
	tp_wq_release(qc);
	tp_context_free(ca);
	tp_context_free(cc);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
	tpt_daemon_stop(&dc);
}
END_TEST

/* tp_chan_read_many() of @ch, at most @max items; each item's first 4 bytes must be @next, then
 * @next + 1 ..., and the rest of it tpt_fill()'s bytes for that number. Return: items read. */
static size_t read_many_check(struct tp_chan *ch, size_t max, uint32_t *next)
{
	static struct tp_chan_item it[300];
	size_t n = 0;

	ck_assert_msg(tp_chan_read_many(ch, it, max, &n, T_MS) == 0, "%s", tp_last_error());
	for (size_t k = 0; k < n; k++) {
		uint32_t v;

		ck_assert_uint_ge(it[k].len, 4);
		memcpy(&v, it[k].data, 4);
		ck_assert_uint_eq(v, *next);
		ck_assert(tpt_verify((uint8_t *)it[k].data + 4, it[k].len - 4, v, NULL));
		(*next)++;
		free(it[k].data);
	}
	return n;
}

/* tp_chan_read_many_into() of @ch into a buffer of @size bytes, checked as read_many_check()
 * checks; with -EMSGSIZE, the length reported is @next's 4 KiB. Return: items read, or the
 * error. */
static int read_many_into_check(struct tp_chan *ch, size_t size, uint32_t *next)
{
	struct tp_chan_item it[8];
	uint8_t *buf = malloc(size);
	size_t n = 0;
	int r;

	ck_assert_ptr_nonnull(buf);
	r = tp_chan_read_many_into(ch, buf, size, it, 8, &n, T_MS);
	if (r == -EMSGSIZE)
		ck_assert_uint_eq(it[0].len, 4096);
	for (size_t k = 0; r >= 0 && k < n; k++) {
		uint32_t v;

		ck_assert_uint_ge(it[k].len, 4);
		memcpy(&v, it[k].data, 4);
		ck_assert_uint_eq(v, *next);
		ck_assert(tpt_verify((uint8_t *)it[k].data + 4, it[k].len - 4, v, NULL));
		(*next)++;
	}
	free(buf);
	return r < 0 ? r : (int)n;
}

/*
 * Batch reads across hosts (peer minor 10): a's tp_chan_read_many() of b's channel takes as many
 * items as one answer of b may carry, in order and byte-exact, where it took one a call before.
 * _i 0: a's frames are the default: 256 items of 4 KiB (b's inline limit, 1 MiB), then the 44
 * left; small, small, large, small: the two small ones, the large one alone (over the data
 * connections), the last. 1: a's frames are 128 KiB, so that b keeps each answer within them
 * (64 KiB of data: 15 items of 4 KiB and their headers... 16 of exactly 4 KiB), the link up.
 * tp_chan_read_many_into() of b's channel takes small, small, large, small as a packed read
 * does here (both daemons take packed reads across hosts): the two small ones in one call, the
 * large one alone, the last; in order, and it leaves an item that does not fit its buffer
 * first in the channel.
 */
START_TEST(test_read_many_across_hosts)
{
	static const char *const small[] = { "--frame-max", "131072", NULL };
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE, .owner_uid = -1,
				     .remote = TP_REMOTE_ANY_PEER };
	struct tp_chan_options ro = { .size = sizeof(ro), .owner_uid = 0 };
	enum { N = 300, ITEM = 4096, BIG = (1 << 20) + 3 };
	static uint8_t items[N][ITEM];
	static struct iovec iov[N];
	uint8_t *big = malloc(BIG);
	struct tp_context *ca, *cb;
	struct tp_chan *hb, *ha;
	uint32_t next = 0;
	size_t got = 0, calls = 0, per = _i ? 16 : 256;

	ck_assert_ptr_nonnull(big);
	ck_assert_int_eq(tpt_daemon_pair_start(&da, _i ? small : NULL, &db, NULL), 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_chan_open(cb, "many", &o, &hb), 0);
	ck_assert_msg(tp_chan_open(ca, at("many"), &ro, &ha) == 0, "%s", tp_last_error());
	for (uint32_t i = 0; i < N; i++) {
		memcpy(items[i], &i, 4);
		tpt_fill(items[i] + 4, ITEM - 4, i);
		iov[i] = (struct iovec){ items[i], ITEM };
	}
	ck_assert_int_eq(tp_chan_write(hb, iov, 200, 0), 0); /* a write's bytes inline: 1 MiB */
	ck_assert_int_eq(tp_chan_write(hb, iov + 200, N - 200, 0), 0);
	while (got < N) {
		size_t n = read_many_check(ha, N, &next);

		ck_assert_uint_eq(n, per < N - got ? per : N - got);
		got += n;
		calls++;
	}
	ck_assert_uint_eq(calls, (N + per - 1) / per);
	/* small, small, large, small: a batch stops before the large one, which comes alone */
	memcpy(big, &(uint32_t){ N + 2 }, 4);
	tpt_fill(big + 4, BIG - 4, N + 2);
	for (uint32_t i = 0; i < 4; i++) {
		memcpy(items[i], &(uint32_t){ N + i }, 4);
		tpt_fill(items[i] + 4, ITEM - 4, N + i);
	}
	iov[2] = (struct iovec){ big, BIG };
	ck_assert_int_eq(tp_chan_write(hb, iov, 4, 0), 0);
	ck_assert_uint_eq(read_many_check(ha, N, &next), 2);
	ck_assert_uint_eq(read_many_check(ha, N, &next), 1);
	ck_assert_uint_eq(read_many_check(ha, N, &next), 1);
	ck_assert_uint_eq(next, N + 4);
	/* packed reads of another host's channel: the small items that ride inline together, the
	 * large one alone; a buffer below the first item: -EMSGSIZE, and it stays first */
	for (uint32_t i = 0; i < 4; i++) {
		memcpy(i == 2 ? big : items[i], &(uint32_t){ N + 4 + i }, 4);
		tpt_fill((i == 2 ? big : items[i]) + 4, (i == 2 ? BIG : ITEM) - 4, N + 4 + i);
	}
	ck_assert_int_eq(tp_chan_write(hb, iov, 4, 0), 0);
	ck_assert_int_eq(read_many_into_check(ha, ITEM - 1, &next), -EMSGSIZE);
	ck_assert_int_eq(read_many_into_check(ha, 2 * BIG, &next), 2);
	ck_assert_int_eq(read_many_into_check(ha, 2 * BIG, &next), 1);
	ck_assert_int_eq(read_many_into_check(ha, 2 * BIG, &next), 1);
	ck_assert_uint_eq(next, N + 8);
	link_up(&da);
	tp_chan_release(ha);
	tp_chan_release(hb);
	free(big);
	tp_context_free(ca);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/*
 * What a far daemon creates and unlinks at will is logged within its budget (tpd_peer_log_ok():
 * 20 lines in each 10 s of one peer): a creates and unlinks a persistent channel 150 times and
 * creates a work queue (gone with its handle) 60 times; every call succeeds, and b's log holds
 * at most 20 lines of them for each 10 s the loop took. b used to log a line for each, 360 here:
 * a peer allowed to create could fill b's log at the rate of its link and hide every other
 * line.
 */
START_TEST(test_creates_and_unlinks_of_a_peer_are_logged_within_its_budget)
{
	static const char *const bargs[] = { "--chan-remote-create-uid", "4242", NULL };
	enum { N_CHANS = 150, N_WQS = 60, BURST = 20, WINDOW_MS = 10000 };
	struct tp_context *ca;
	struct tp_chan *ch;
	struct tp_wq *q;
	uint64_t t0, took;
	int lines;

	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, bargs), 0);
	ca = ctx_of(&da);
	t0 = tpt_now_ms();
	for (unsigned i = 0; i < N_CHANS; i++) {
		ck_assert_msg(xcreate(ca, "flood", &ch) == 0, "create %u: %s", i, tp_last_error());
		tp_chan_release(ch);
		ck_assert_msg(tp_chan_unlink(ca, at("flood"), -1) == 0, "unlink %u: %s", i,
			      tp_last_error());
	}
	for (unsigned i = 0; i < N_WQS; i++) {
		ck_assert_msg(xcreate_wq(ca, "qflood", &q) == 0, "queue %u: %s", i,
			      tp_last_error());
		tp_wq_release(q);
	}
	took = tpt_now_ms() - t0;
	lines = tpt_daemon_log_count(&db, "created channel 'flood'") +
		tpt_daemon_log_count(&db, "unlinked channel 'flood'") +
		tpt_daemon_log_count(&db, "created work queue 'qflood'");
	printf("%u creates and unlinks of a peer in %llu ms: %d lines in b's log\n",
	       2 * N_CHANS + N_WQS, (unsigned long long)took, lines);
	ck_assert_int_gt(lines, 0);
	ck_assert_msg(lines <= BURST * (int)(1 + took / WINDOW_MS + 1), "%d lines of one peer's "
		      "creates and unlinks in %llu ms", lines, (unsigned long long)took);
	ck_assert(tpt_daemon_log_has(&db, "lines about this peer not logged before this one"));
	tp_context_free(ca);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

static Suite *xcreate_suite(void)
{
	Suite *s = suite_create("chan_xcreate");
	TCase *tc = tcase_create("xcreate");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_create_and_unlink_refused_by_default);
	tcase_add_test(tc, test_create_and_unlink_as_the_configured_uid);
	tcase_add_test(tc, test_each_far_daemon_gets_its_share);
	tcase_add_test(tc, test_creates_and_unlinks_of_a_peer_are_logged_within_its_budget);
	tcase_add_loop_test(tc, test_items_inline_within_the_far_frames, 0, 2);
	tcase_add_loop_test(tc, test_read_many_across_hosts, 0, 2);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(xcreate_suite());
}
