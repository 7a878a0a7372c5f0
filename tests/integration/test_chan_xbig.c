/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: large channel items across hosts (issue 25 part xhost; docs/channels.md
 * "Across hosts"). Two daemons on loopback (each treats the other as another host): a client of
 * daemon a opens tpip://b/NAME and writes items from 1000 bytes to 24 MiB, from shared buffers
 * and from private memory, and they arrive byte-exact on b; items written on b are read on a
 * with tp_chan_read() and tp_chan_read_into() (private and shared memory), byte-exact, and an
 * allocation one byte short gets -EMSGSIZE with the item's length, the item staying first. Items
 * above the inline limit move over the link's data connections in chunks (the link's byte
 * counters show each once), not inline. The channel's byte capacity holds on b, the host that
 * keeps the bytes: an item of exactly the capacity is written from a, one byte more is refused
 * with -EMSGSIZE, and the link and the channel are untouched; chan-peer-bytes-max on b (what
 * one remote daemon may have arriving) likewise just at and above, -ENOBUFS. A forwarding daemon killed while
 * its client's items stream to b leaves only whole items on b; the hosting daemon killed fails
 * a's blocked read with -ECONNRESET naming the host, in bounded time. Message items (metadata,
 * payloads, tensors) cross both ways whole, into every kind of slot, and one held by a's
 * handle goes back on b at its release.
 */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ipeer.h"
#include "itest.h"

#define T_MS 60000
#define MIB (1u << 20)
#define NAME "xbig"

static struct tpt_daemon da, db;
static char addr[256];

static void item_fill(uint8_t *p, unsigned i, size_t len)
{
	uint32_t x = 2654435761u * (i + 1);

	for (size_t k = 0; k < len; k++) {
		x = x * 1103515245u + 12345u;
		p[k] = (uint8_t)(x >> 16);
	}
	memcpy(p, &i, sizeof(i));
}

/* Is @p (@len bytes) item @i of @want_len bytes? */
static bool item_ok(const uint8_t *p, size_t len, unsigned i, size_t want_len)
{
	uint8_t *w;
	bool ok;

	if (len != want_len || !(w = malloc(len)))
		return false;
	item_fill(w, i, len);
	ok = memcmp(p, w, len) == 0;
	free(w);
	return ok;
}

static struct tp_context *ctx_of(const struct tpt_daemon *d)
{
	struct tp_context *ctx = NULL;

	ck_assert_int_eq(tpt_ctx_new(d, 0, "xbig", &ctx), 0);
	return ctx;
}

/* Creates NAME on b (any peer may open it) with @cap_bytes (0: default); opens it from a. */
static void open_pair(struct tp_context *ca, struct tp_context *cb, uint64_t cap_bytes,
		      struct tp_chan **ret_a, struct tp_chan **ret_b)
{
	struct tp_chan_options ob = { .size = sizeof(ob), .flags = TP_CHAN_CREATE,
				      .owner_uid = -1, .capacity_bytes = cap_bytes,
				      .remote = TP_REMOTE_ANY_PEER };
	struct tp_chan_options oa = { .size = sizeof(oa), .owner_uid = 0 };

	ck_assert_int_eq(tp_chan_open(cb, NAME, &ob, ret_b), 0);
	tpt_peer_address(&db, NAME, addr, sizeof(addr));
	ck_assert_msg(tp_chan_open(ca, addr, &oa, ret_a) == 0, "open %s: %s", addr,
		      tp_last_error());
}

static void start_pair(void)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, NULL), 0);
}

static void stop_pair(void)
{
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}

static const size_t lens[] = { 1000, (16u << 10) + 1, (256u << 10) + 1, 16 * MIB, 16 * MIB - 3,
			       24 * MIB };

/* a writes each item of lens[] (shared buffer for the even ones), b reads them byte-exact; then b
 * writes them and a reads them back (tp_chan_read(), into a private allocation, into a shared
 * buffer, in turn). */
START_TEST(test_large_items_cross_byte_exact)
{
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb;
	struct tpt_link la, lb;
	uint8_t *shm, *priv, *into;
	size_t n = sizeof(lens) / sizeof(lens[0]), len;
	void *item;

	start_pair();
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, 0, &xa, &xb);
	ck_assert_int_eq(tp_buffer_alloc(ca, 24 * MIB, (void **)&shm), 0);
	priv = malloc(24 * MIB);
	into = malloc(24 * MIB);
	ck_assert(priv && into);
	for (unsigned i = 0; i < n; i++) {
		uint8_t *p = i % 2 ? priv : shm;
		struct iovec it = { p, lens[i] };

		item_fill(p, i, lens[i]);
		ck_assert_msg(tp_chan_write(xa, &it, 1, T_MS) == 0, "write %u (%zu bytes): %s", i,
			      lens[i], tp_last_error());
		ck_assert_msg(tp_chan_read(xb, &item, &len, T_MS) == 0, "read %u: %s", i,
			      tp_last_error());
		ck_assert_msg(item_ok(item, len, i, lens[i]), "item %u: %zu bytes, not as written",
			      i, len);
		free(item);
	}
	tpt_peer_links(&db, &lb);
	ck_assert_msg(lb.bytes_received >= 56 * MIB, "b received %llu bytes over the link",
		      (unsigned long long)lb.bytes_received);
	for (unsigned i = 0; i < n; i++) {
		struct iovec it = { priv, lens[i] };
		int r;

		item_fill(priv, i, lens[i]);
		ck_assert_int_eq(tp_chan_write(xb, &it, 1, T_MS), 0);
		switch (i % 3) {
		case 0:
			r = tp_chan_read(xa, &item, &len, T_MS);
			ck_assert_msg(r == 0, "read %u on a: %s", i, tp_last_error());
			ck_assert_msg(item_ok(item, len, i, lens[i]), "item %u read on a", i);
			free(item);
			break;
		case 1:
			r = tp_chan_read_into(xa, into, 24 * MIB, &len, T_MS);
			ck_assert_msg(r == 0, "read_into %u on a: %s", i, tp_last_error());
			ck_assert_msg(item_ok(into, len, i, lens[i]), "item %u read into on a", i);
			break;
		default:
			r = tp_chan_read_into(xa, shm, 24 * MIB, &len, T_MS);
			ck_assert_msg(r == 0, "read_into shm %u on a: %s", i, tp_last_error());
			ck_assert_msg(item_ok(shm, len, i, lens[i]), "item %u read into shm", i);
		}
	}
	tpt_peer_links(&da, &la);
	ck_assert_msg(la.bytes_received >= 56 * MIB, "a received %llu bytes over the link",
		      (unsigned long long)la.bytes_received);
	ck_assert_int_eq(tp_chan_read(xa, &item, &len, 0), -EAGAIN);
	/* An allocation one byte short: -EMSGSIZE with the item's length, the item stays first. */
	{
		struct iovec it = { priv, 2 * MIB };

		item_fill(priv, 9, 2 * MIB);
		ck_assert_int_eq(tp_chan_write(xb, &it, 1, T_MS), 0);
		len = 0;
		ck_assert_int_eq(tp_chan_read_into(xa, into, 2 * MIB - 1, &len, T_MS), -EMSGSIZE);
		ck_assert_uint_eq(len, 2 * MIB);
		ck_assert_int_eq(tp_chan_read_into(xa, into, 2 * MIB, &len, T_MS), 0);
		ck_assert(item_ok(into, len, 9, 2 * MIB));
	}
	ck_assert_int_eq(tp_chan_release(xa), 0);
	ck_assert_int_eq(tp_chan_release(xb), 0);
	tp_buffer_free(ca, shm);
	free(priv);
	free(into);
	tp_context_free(ca);
	tp_context_free(cb);
	stop_pair();
}
END_TEST

/* The channel's byte capacity, on the hosting daemon: an item of exactly that many bytes goes
 * from a, one of a byte more is refused with -EMSGSIZE; the channel stays empty and usable. */
/* Message items cross as byte items do (docs/channels.md, "Items as messages"): a writes
 * messages (metadata, several parts inline, by reference and above the inline limit, from
 * private and shared memory; one empty) into tpip://b/NAME and b reads them whole; b writes them
 * and a reads them through its handle (inline, or staged in one destination), into private and
 * shared slots; a's byte read of a message item is refused and leaves it first; a's handle
 * released with an item held gives it back on b. */
static struct tpt_msg_spec xspec(unsigned i)
{
	static const size_t big[] = { 100, 40000, 0, 300000, 2 * MIB }, one[] = { 3 * MIB };
	struct tpt_msg_spec s = { .pipe = 7, .index = i, .meta_len = 9, .seg_meta_len = 3 };

	if (i % 3 == 0) {
		s.n_payloads = 3;
		s.n_tensors = 2;
		s.tensor_target = true;
		memcpy(s.lens, big, sizeof(big));
	} else if (i % 3 == 1) {
		s.n_tensors = 1;
		memcpy(s.lens, one, sizeof(one));
	}
	return s; /* i % 3 == 2: no part at all */
}

START_TEST(test_message_items_cross)
{
	static const enum tpt_mem mem[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM, TPT_MEM_MIXED };
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb, *xa2;
	struct tp_descriptor *d;
	struct tp_chan_options oa = { .size = sizeof(oa), .owner_uid = 0 };
	size_t len;
	void *item;

	start_pair();
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, 0, &xa, &xb);
	for (unsigned i = 0; i < 6; i++) {
		struct tpt_msg_spec s = xspec(i);
		struct tpt_msg m;

		ck_assert_int_eq(tpt_msg_build(ca, &s, mem[i % 3], &m), 0);
		ck_assert_msg(tp_chan_write_msgs(xa, &m.m, 1, T_MS) == 0, "write %u: %s", i,
			      tp_last_error());
		tpt_msg_free(ca, &m);
	}
	for (unsigned i = 0; i < 6; i++) {
		struct tpt_msg_spec s = xspec(i);

		ck_assert_msg(tpt_chan_msg_read_check(cb, xb, &s, mem[(i + 1) % 3], T_MS, NULL) == 0,
			      "message %u read on b", i);
	}
	for (unsigned i = 0; i < 6; i++) {
		struct tpt_msg_spec s = xspec(i);
		struct tpt_msg m;

		ck_assert_int_eq(tpt_msg_build(cb, &s, mem[i % 3], &m), 0);
		ck_assert_int_eq(tp_chan_write_msgs(xb, &m.m, 1, T_MS), 0);
		tpt_msg_free(cb, &m);
	}
	ck_assert_int_eq(tp_chan_read(xa, &item, &len, 0), -EOPNOTSUPP);
	for (unsigned i = 0; i < 6; i++) {
		struct tpt_msg_spec s = xspec(i);

		ck_assert_msg(tpt_chan_msg_read_check(ca, xa, &s, mem[(i + 2) % 3], T_MS, NULL) == 0,
			      "message %u read on a: %s", i, tp_last_error());
	}
	/* An item held by a's handle goes back on b when the handle goes. */
	ck_assert_int_eq(tp_chan_write_msgs(xb, &(struct tp_message){ .metadata = "held",
								      .metadata_len = 4 }, 1, 0), 0);
	tpt_peer_address(&db, NAME, addr, sizeof(addr));
	ck_assert_int_eq(tp_chan_open(ca, addr, &oa, &xa2), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(xa2, &d, T_MS), 0);
	ck_assert_uint_eq(d->metadata_len, 4);
	ck_assert_int_eq(tp_chan_read_descriptor(xb, &d, 0), -EAGAIN);
	ck_assert_int_eq(tp_chan_release(xa2), 0);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	ck_assert_int_eq(tp_chan_read_descriptor(xb, &d, T_MS), 0);
	ck_assert(d->metadata_len == 4 && memcmp(d->metadata, "held", 4) == 0);
	ck_assert_int_eq(tp_chan_descriptor_free(d), 0);
	tp_chan_release(xa);
	tp_chan_release(xb);
	tp_context_free(ca);
	tp_context_free(cb);
	stop_pair();
}
END_TEST

START_TEST(test_capacity_holds_on_the_hosting_daemon)
{
	const size_t cap = 16 * MIB + 5;
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb;
	uint8_t *p = malloc(cap + 1);
	struct iovec it = { p, cap };
	void *item;
	size_t len;

	ck_assert(p);
	start_pair();
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, cap, &xa, &xb);
	item_fill(p, 7, cap + 1);
	ck_assert_msg(tp_chan_write(xa, &it, 1, T_MS) == 0, "write at capacity: %s",
		      tp_last_error());
	ck_assert_int_eq(tp_chan_read(xb, &item, &len, T_MS), 0);
	ck_assert(item_ok(item, len, 7, cap));
	free(item);
	it.iov_len = cap + 1;
	ck_assert_int_eq(tp_chan_write(xa, &it, 1, T_MS), -EMSGSIZE);
	ck_assert_int_eq(tp_chan_read(xb, &item, &len, 0), -EAGAIN);
	it.iov_len = cap;
	ck_assert_int_eq(tp_chan_write(xa, &it, 1, T_MS), 0);
	ck_assert_int_eq(tp_chan_read(xa, &item, &len, T_MS), 0);
	ck_assert(item_ok(item, len, 7, cap));
	free(item);
	tp_chan_release(xa);
	tp_chan_release(xb);
	tp_context_free(ca);
	tp_context_free(cb);
	free(p);
	stop_pair();
}
END_TEST

/* chan-peer-bytes-max on the hosting daemon (16M): a write of a remote daemon's items of exactly
 * that many bytes goes (one item, or a batch of two), one byte more is refused with -ENOBUFS
 * naming the limit, whatever the channel's capacity; the channel stays empty and usable. */
START_TEST(test_peer_bytes_max_on_the_hosting_daemon)
{
	static const char *const bargs[] = { "--chan-peer-bytes-max", "16M", NULL };
	const size_t max = 16 * MIB;
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb;
	uint8_t *p = malloc(max + 1);
	struct iovec it = { p, max }, two[2] = { { p, max / 2 }, { p + max / 2, max / 2 } };
	void *item;
	size_t len;

	ck_assert(p);
	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, bargs), 0);
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, 0, &xa, &xb);
	item_fill(p, 5, max + 1);
	ck_assert_msg(tp_chan_write(xa, &it, 1, T_MS) == 0, "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_read(xb, &item, &len, T_MS), 0);
	ck_assert(item_ok(item, len, 5, max));
	free(item);
	ck_assert_msg(tp_chan_write(xa, two, 2, T_MS) == 0, "%s", tp_last_error());
	for (int k = 0; k < 2; k++) {
		ck_assert_int_eq(tp_chan_read(xb, &item, &len, T_MS), 0);
		ck_assert_uint_eq(len, max / 2);
		free(item);
	}
	it.iov_len = max + 1;
	ck_assert_int_eq(tp_chan_write(xa, &it, 1, T_MS), -ENOBUFS);
	ck_assert_msg(strstr(tp_last_error(), "chan-peer-bytes-max"), "%s", tp_last_error());
	ck_assert_int_eq(tp_chan_read(xb, &item, &len, 0), -EAGAIN);
	it.iov_len = max;
	ck_assert_int_eq(tp_chan_write(xa, &it, 1, T_MS), 0);
	ck_assert_int_eq(tp_chan_read(xb, &item, &len, T_MS), 0);
	ck_assert(item_ok(item, len, 5, max));
	free(item);
	tp_chan_release(xa);
	tp_chan_release(xb);
	tp_context_free(ca);
	tp_context_free(cb);
	free(p);
	stop_pair();
}
END_TEST

#define DIE_ITEM (16 * MIB)

/* A client of a writing 16 MiB items to NAME on b (private memory) until a call fails. */
static int die_writer(void *arg)
{
	struct tp_chan_options oa = { .size = sizeof(oa), .owner_uid = 0 };
	struct tp_context *ca = NULL;
	struct tp_chan *xa = NULL;
	uint8_t *p = malloc(DIE_ITEM);

	(void)arg;
	TPT_REQUIRE(p && tpt_ctx_new(&da, 0, "xbig-w", &ca) == 0, 1, "context");
	TPT_REQUIRE(tp_chan_open(ca, addr, &oa, &xa) == 0, 1, "open: %s", tp_last_error());
	for (unsigned i = 0;; i++) {
		struct iovec it = { p, DIE_ITEM };

		item_fill(p, i, DIE_ITEM);
		if (tp_chan_write(xa, &it, 1, T_MS) < 0)
			break;
	}
	tp_chan_release(xa);
	tp_context_free(ca);
	free(p);
	return 0;
}

/* Polls @d's first link until it received more than @bytes. */
static bool link_received(const struct tpt_daemon *d, uint64_t bytes)
{
	struct tpt_link l;

	for (unsigned tries = 0; tries < 5000; tries++)
		if (tpt_peer_links(d, &l) && l.bytes_received > bytes)
			return true;
	return false;
}

/* The forwarding daemon a is killed while its client's items stream to b: b fails what was
 * arriving, and what b's channel holds afterwards is whole items only, each byte-exact, with no
 * room left reserved. */
START_TEST(test_forwarding_daemon_killed_mid_item_leaves_whole_items)
{
	static const char *const bargs[] = { "--chan-bytes-max", "1G", "--chan-bytes-per-uid",
					     "2G", NULL };
	struct tp_chan_options ob = { .size = sizeof(ob), .flags = TP_CHAN_CREATE,
				      .owner_uid = -1, .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *cb;
	struct tp_chan *xb;
	unsigned n = 0;
	void *item;
	size_t len;
	pid_t w;
	int r;

	ck_assert_int_eq(tpt_daemon_pair_start(&da, NULL, &db, bargs), 0);
	cb = ctx_of(&db);
	ck_assert_int_eq(tp_chan_open(cb, NAME, &ob, &xb), 0);
	tpt_peer_address(&db, NAME, addr, sizeof(addr));
	w = tpt_fork(die_writer, NULL);
	ck_assert_msg(link_received(&db, 5 * DIE_ITEM / 2), "the items never streamed");
	kill(da.pid, SIGKILL);
	ck_assert(tpt_peer_links_gone(&db, T_MS));
	while ((r = tp_chan_read(xb, &item, &len, 0)) == 0) {
		ck_assert_msg(item_ok(item, len, n, DIE_ITEM), "item %u is not whole", n);
		free(item);
		n++;
	}
	ck_assert_int_eq(r, -EAGAIN);
	ck_assert_msg(n >= 2, "%u items", n);
	ck_assert_uint_eq(tpt_channel_bytes(&db, NAME), 0);
	tpt_wait_ok(w, T_MS, "writer");
	tp_chan_release(xb);
	tp_context_free(cb);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* The hosting daemon b is killed while a's client reads its items: the read fails with
 * -ECONNRESET naming the host, in bounded time; every item it got before is byte-exact. */
START_TEST(test_hosting_daemon_killed_fails_the_read)
{
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb;
	uint8_t *p = malloc(DIE_ITEM), *into = malloc(DIE_ITEM);
	struct timespec t0, t1;
	unsigned n = 0;
	size_t len;
	int r;

	ck_assert(p && into);
	start_pair();
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, 0, &xa, &xb);
	for (unsigned i = 0; i < 3; i++) {
		struct iovec it = { p, DIE_ITEM };

		item_fill(p, i, DIE_ITEM);
		ck_assert_int_eq(tp_chan_write(xb, &it, 1, T_MS), 0);
	}
	ck_assert_int_eq(tp_chan_read_into(xa, into, DIE_ITEM, &len, T_MS), 0);
	ck_assert(item_ok(into, len, n++, DIE_ITEM));
	kill(db.pid, SIGKILL);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while ((r = tp_chan_read_into(xa, into, DIE_ITEM, &len, T_MS)) == 0)
		ck_assert(item_ok(into, len, n++, DIE_ITEM));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_msg(r == -ECONNRESET, "read after the host died: %d %s", r, tp_last_error());
	ck_assert_msg(strstr(tp_last_error(), "127.0.0.1"), "%s", tp_last_error());
	ck_assert_msg(t1.tv_sec - t0.tv_sec < 20, "failed after %ld s",
		      (long)(t1.tv_sec - t0.tv_sec));
	tp_chan_release(xa);
	tp_chan_release(xb); /* its daemon is gone: the handle is only freed */
	tp_context_free(ca);
	tp_context_free(cb);
	free(p);
	free(into);
	tpt_daemon_stop(&da);
	tpt_daemon_stop(&db);
}
END_TEST

/* Does @out hold @needle? */
static bool has(const char *out, const char *needle)
{
	return out && strstr(out, needle);
}

/* tpipctl channels and queues of the forwarding daemon list its clients' handles of a channel
 * and a queue of another host (tpip://HOST:PORT/NAME, state "remote"; JSON remote_handle), then
 * "remote, link failed" once that host's daemon is gone, and nothing once released. */
START_TEST(test_tpipctl_lists_remote_handles)
{
	struct tp_wq_options qb = { .size = sizeof(qb), .flags = TP_WQ_CREATE, .owner_uid = -1,
				    .remote = TP_REMOTE_ANY_PEER };
	struct tp_wq_options qa = { .size = sizeof(qa), .owner_uid = 0 };
	struct tp_context *ca, *cb;
	struct tp_chan *xa, *xb;
	struct tp_wq *wa, *wb;
	char qaddr[256], want[300];
	char *out;

	start_pair();
	ca = ctx_of(&da);
	cb = ctx_of(&db);
	open_pair(ca, cb, 0, &xa, &xb);
	ck_assert_int_eq(tp_wq_open(cb, "xq", &qb, &wb), 0);
	tpt_peer_address(&db, "xq", qaddr, sizeof(qaddr));
	ck_assert_msg(tp_wq_open(ca, qaddr, &qa, &wa) == 0, "%s", tp_last_error());
	out = tpt_ctl(&da, "channels", true);
	snprintf(want, sizeof(want), "\"name\": \"%s\"", addr);
	ck_assert_msg(has(out, want) && has(out, "\"remote_handle\": true") &&
		      has(out, "\"state\": \"remote\""), "%s", out);
	free(out);
	out = tpt_ctl(&da, "channels", false);
	ck_assert_msg(has(out, addr) && has(out, "remote"), "%s", out);
	free(out);
	out = tpt_ctl(&da, "queues", true);
	snprintf(want, sizeof(want), "\"name\": \"%s\"", qaddr);
	ck_assert_msg(has(out, want) && has(out, "\"remote_handle\": true"), "%s", out);
	free(out);
	out = tpt_ctl(&db, "channels", true); /* the hosting daemon: its channel, no such row */
	ck_assert_msg(!has(out, "tpip://") && has(out, "\"remote_handles\": 1"), "%s", out);
	free(out);
	tp_chan_release(xb);
	tp_wq_release(wb);
	tp_context_free(cb);
	tpt_daemon_stop(&db);
	ck_assert(tpt_peer_links_gone(&da, T_MS));
	out = tpt_ctl(&da, "channels", true);
	ck_assert_msg(has(out, "\"state\": \"remote, link failed\""), "%s", out);
	free(out);
	tp_chan_release(xa);
	tp_wq_release(wa);
	out = tpt_ctl(&da, "channels", true);
	ck_assert_msg(!has(out, "tpip://"), "%s", out);
	free(out);
	out = tpt_ctl(&da, "queues", true);
	ck_assert_msg(!has(out, "tpip://"), "%s", out);
	free(out);
	tp_context_free(ca);
	tpt_daemon_stop(&da);
}
END_TEST

static Suite *xbig_suite(void)
{
	Suite *s = suite_create("chan_xbig");
	TCase *tc = tcase_create("xbig");

	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, test_large_items_cross_byte_exact);
	tcase_add_test(tc, test_message_items_cross);
	tcase_add_test(tc, test_capacity_holds_on_the_hosting_daemon);
	tcase_add_test(tc, test_peer_bytes_max_on_the_hosting_daemon);
	tcase_add_test(tc, test_forwarding_daemon_killed_mid_item_leaves_whole_items);
	tcase_add_test(tc, test_hosting_daemon_killed_fails_the_read);
	tcase_add_test(tc, test_tpipctl_lists_remote_handles);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(xbig_suite());
}
