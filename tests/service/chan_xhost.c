/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channels and work queues across hosts for the service suite (chan_xhost.sh): one command per
 * run against the daemon at SOCKET, printing one line per result ("item TEXT", "closed TEXT",
 * "error ERRNO-NAME: MESSAGE", ...) so that the script checks what each host saw. A name is a
 * channel or queue name, an address tpip://HOST[:PORT]/NAME of one on another host.
 *
 * Usage: chan_xhost SOCKET COMMAND ARGS...
 *   create NAME REMOTE             a persistent channel (REMOTE: none, any or peers:ID)
 *   unlink NAME
 *   open ADDR                      open and release
 *   write ADDR ITEM...             one write per item
 *   read ADDR N MS                 up to N reads of MS each (-1: no deadline); stops at an error
 *   close ADDR
 *   readers ADDR K MS              K handles opened one after the other, then one read of MS
 *                                  on each, from a thread each
 *   wq-own NAME REMOTE N           a queue: submit N questions, receive their N answers (each
 *                                  "a:" + its question), then wait until stdin closes, release
 *                                  (NAME an address: created on that host, owned from here)
 *   wq-work ADDR [N [UID]]         a worker: take and answer until closed (or N questions; -1:
 *                                  no limit) of uid UID's queue (default: the caller's)
 *   wq-hold ADDR [UID]             a worker: take one question and hold it until killed
 *   wq-open ADDR                   open a queue as a worker and release
 *   wq-own-msg NAME REMOTE N [T]   as wq-own, questions and answers as messages (metadata
 *                                  "qI", a payload "qI" and a tensor of T pattern bytes, 3000
 *                                  by default; the answer: metadata "a:qI" and the question's
 *                                  parts back)
 *   wq-work-msg ADDR N [T]         as wq-work, taking and answering messages (tensors of T)
 *   write-big ADDR LEN SEED        one item of LEN pattern bytes (seed SEED)
 *   read-packed ADDR N ROOM MS     tp_chan_read_many_into() into ROOM bytes of private memory
 *                                  until N items (or -EPIPE: "drained"): "call K" per call
 *                                  (K items), then each item ("item TEXT", "closed TEXT", an
 *                                  item above 64 bytes as "big LEN SEED" where it is one
 *                                  write-big's pattern, else "bad LEN")
 * Exit: 0 when every call succeeded (a read that ends with -EPIPE, drained, included), 1 on an
 * error, 2 usage.
 */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <tpclient.h>

static struct tp_context *ctx;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

static int fail(const char *what, int r)
{
	pthread_mutex_lock(&out_lock);
	printf("error %s: %s: %s\n", strerrorname_np(-r), what, tp_last_error());
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
	return 1;
}

static void say(const char *what, const char *a, size_t len)
{
	pthread_mutex_lock(&out_lock);
	printf("%s %.*s\n", what, (int)len, a);
	fflush(stdout);
	pthread_mutex_unlock(&out_lock);
}

/* "none", "any", "peers:ID" into @remote and @peer. Return: 0 or -1. */
static int parse_remote(const char *s, enum tp_remote_access *remote, const char **peer)
{
	*peer = NULL;
	if (strcmp(s, "none") == 0)
		*remote = TP_REMOTE_NONE;
	else if (strcmp(s, "any") == 0)
		*remote = TP_REMOTE_ANY_PEER;
	else if (strncmp(s, "peers:", 6) == 0) {
		*remote = TP_REMOTE_PEERS;
		*peer = s + 6;
	} else
		return -1;
	return 0;
}

static int cmd_create(const char *name, const char *remote)
{
	struct tp_chan_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char *peer;
	struct tp_chan *ch;
	int r;

	if (parse_remote(remote, &o.remote, &peer) < 0)
		return 2;
	o.flags = TP_CHAN_CREATE | TP_CHAN_EXCL | TP_CHAN_PERSISTENT;
	o.access = TP_ACCESS_ANYONE;
	o.remote_peers = peer ? &peer : NULL;
	o.n_remote_peers = peer ? 1 : 0;
	r = tp_chan_open(ctx, name, &o, &ch);
	if (r < 0)
		return fail("create", r);
	tp_chan_release(ch);
	printf("created\n");
	return 0;
}

static int open_chan(const char *addr, struct tp_chan **ch)
{
	int r = tp_chan_open(ctx, addr, NULL, ch);

	return r < 0 ? fail("open", r) : 0;
}

static int cmd_write(const char *addr, int n, char **items)
{
	struct tp_chan *ch;
	int r;

	if (open_chan(addr, &ch))
		return 1;
	for (int i = 0; i < n; i++) {
		struct iovec iov = { items[i], strlen(items[i]) };

		r = tp_chan_write(ch, &iov, 1, 5000);
		if (r < 0) {
			fail("write", r);
			tp_chan_release(ch);
			return 1;
		}
	}
	printf("wrote %d\n", n);
	tp_chan_release(ch);
	return 0;
}

/* Reads up to @n items from @ch, @ms each; prints each. Return: 0, or 1 on an error other
 * than -EPIPE. */
static int read_some(struct tp_chan *ch, int n, int ms)
{
	void *item;
	size_t len;
	int r;

	for (int i = 0; i < n; i++) {
		r = tp_chan_read(ch, &item, &len, ms);
		if (r < 0)
			return fail("read", r) && r != -EPIPE;
		say(r == TP_CHAN_CLOSED ? "closed" : "item", item, len);
		free(item);
	}
	return 0;
}

static int cmd_read(const char *addr, int n, int ms)
{
	struct tp_chan *ch;
	int r;

	if (open_chan(addr, &ch))
		return 1;
	r = read_some(ch, n, ms);
	tp_chan_release(ch);
	return r;
}

static int cmd_close(const char *addr)
{
	struct tp_chan *ch;
	int r;

	if (open_chan(addr, &ch))
		return 1;
	r = tp_chan_close(ch);
	tp_chan_release(ch);
	if (r < 0)
		return fail("close", r);
	printf("closed\n");
	return 0;
}

struct reader {
	pthread_t t;
	struct tp_chan *ch;
	int ms, rc;
};

static void *reader_run(void *arg)
{
	struct reader *rd = arg;

	rd->rc = read_some(rd->ch, 1, rd->ms);
	/* After a failed link the handle stays failed: a second call fails the same way. */
	if (rd->rc) {
		void *item;
		size_t len;
		int r = tp_chan_read(rd->ch, &item, &len, 0);

		if (r < 0)
			fail("again", r);
		else
			free(item);
	}
	return NULL;
}

/* Opens @k handles one after the other, then reads one item on each from its own thread. */
static int cmd_readers(const char *addr, int k, int ms)
{
	struct reader *rd = calloc((size_t)k, sizeof(*rd));
	int rc = 0, n;

	for (n = 0; n < k && !rc; n++)
		rc = open_chan(addr, &rd[n].ch);
	if (rc)
		n--;
	for (int i = 0; i < n; i++) {
		rd[i].ms = ms;
		pthread_create(&rd[i].t, NULL, reader_run, &rd[i]);
	}
	for (int i = 0; i < n; i++) {
		pthread_join(rd[i].t, NULL);
		rc |= rd[i].rc;
		tp_chan_release(rd[i].ch);
	}
	free(rd);
	return rc;
}

/* Creates queue @name, open to @remote (as parse_remote()), owned by *@ret. Return: 0, or the
 * exit status of a failure (printed). */
static int wq_create(const char *name, const char *remote, struct tp_wq **ret)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = -1 };
	const char *peer;
	int r;

	if (parse_remote(remote, &o.remote, &peer) < 0)
		return 2;
	o.flags = TP_WQ_CREATE | TP_WQ_EXCL;
	o.access = TP_ACCESS_ANYONE;
	o.remote_peers = peer ? &peer : NULL;
	o.n_remote_peers = peer ? 1 : 0;
	r = tp_wq_open(ctx, name, &o, ret);
	if (r < 0)
		return fail("wq create", r);
	if (!tp_wq_is_owner(*ret)) {
		printf("error EPROTO: the creator's handle is not the owner's\n");
		return 1;
	}
	return 0;
}

static int cmd_wq_own(const char *name, const char *remote, int n)
{
	struct tp_wq *q;
	char buf[64], want[64];
	void *data;
	size_t len;
	uint64_t id;
	int r = wq_create(name, remote, &q);

	if (r)
		return r;
	for (int i = 0; i < n; i++) {
		snprintf(buf, sizeof(buf), "q%d", i);
		r = tp_wq_submit(q, buf, strlen(buf), &id);
		if (r < 0)
			return fail("submit", r);
	}
	printf("submitted %d\n", n);
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		r = tp_wq_answer(q, &id, &data, &len, 30000);
		if (r < 0)
			return fail("answer", r);
		snprintf(want, sizeof(want), "a:q%llu", (unsigned long long)id - 1);
		if (len != strlen(want) || memcmp(data, want, len) != 0) {
			printf("error EBADMSG: answer %llu is '%.*s', not '%s'\n",
			       (unsigned long long)id, (int)len, (char *)data, want);
			return 1;
		}
		free(data);
	}
	r = tp_wq_drain(q, 0);
	printf("answered %d%s\n", n, r == 0 ? " drained" : "");
	fflush(stdout);
	while (fgets(buf, sizeof(buf), stdin))
		;
	tp_wq_release(q);
	return 0;
}

static int cmd_wq_work(const char *addr, int max, long owner_uid, bool hold)
{
	struct tp_wq_options o = { .size = sizeof(o), .owner_uid = owner_uid };
	struct tp_wq *q;
	char buf[96];
	void *data;
	size_t len;
	uint64_t id;
	int r, n = 0;

	r = tp_wq_open(ctx, addr, &o, &q);
	if (r < 0)
		return fail("wq open", r);
	if (tp_wq_is_owner(q)) {
		printf("error EPROTO: a worker's handle from another host is the owner's\n");
		return 1;
	}
	while (max < 0 || n < max) {
		r = tp_wq_take(q, &id, &data, &len, 30000);
		if (r == -EPIPE)
			break;
		if (r < 0)
			return fail("take", r);
		if (hold) {
			printf("took %llu\n", (unsigned long long)id);
			fflush(stdout);
			pause();
		}
		snprintf(buf, sizeof(buf), "a:%.*s", (int)len, (char *)data);
		free(data);
		r = tp_wq_reply(q, id, buf, strlen(buf));
		if (r < 0)
			return fail("reply", r);
		n++;
	}
	printf("worked %d%s\n", n, r == -EPIPE ? " closed" : "");
	tp_wq_release(q);
	return 0;
}

/* ---- questions and answers as messages ------------------------------------------------------ */

static size_t wq_tensor = 3000; /* a message's tensor bytes (wq-own-msg, wq-work-msg T) */

static void pattern(uint8_t *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(seed * 131u + i * 7u);
}

static int cmd_write_big(const char *addr, size_t len, unsigned seed)
{
	uint8_t *p = malloc(len);
	struct iovec iov = { p, len };
	struct tp_chan *ch;
	int r;

	if (!p || open_chan(addr, &ch)) {
		free(p);
		return 1;
	}
	pattern(p, len, seed);
	r = tp_chan_write(ch, &iov, 1, 5000);
	free(p);
	tp_chan_release(ch);
	if (r < 0)
		return fail("write", r);
	printf("wrote 1\n");
	return 0;
}

/* One item of a packed read: text, or the seed of the write-big pattern it holds. */
static void say_packed(const struct tp_chan_item *it, bool closed)
{
	uint8_t *want;
	char line[64];

	if (it->len <= 64)
		return say(closed ? "closed" : "item", it->data, it->len);
	want = malloc(it->len);
	snprintf(line, sizeof(line), "bad %zu", it->len);
	for (unsigned seed = 0; want && seed < 256; seed++) {
		pattern(want, it->len, seed);
		if (memcmp(want, it->data, it->len) == 0) {
			snprintf(line, sizeof(line), "big %zu %u", it->len, seed);
			break;
		}
	}
	free(want);
	say(closed ? "closed" : "item", line, strlen(line));
}

static int cmd_read_packed(const char *addr, int n, size_t room, int ms)
{
	struct tp_chan_item items[64];
	void *buf = malloc(room);
	struct tp_chan *ch;
	char line[32];
	size_t k;
	int r = 0;

	if (!buf || open_chan(addr, &ch)) {
		free(buf);
		return 1;
	}
	for (int got = 0; got < n; got += (int)k) {
		r = tp_chan_read_many_into(ch, buf, room, items, 64, &k, ms);
		if (r == -EPIPE) {
			printf("drained\n");
			r = 0;
			break;
		}
		if (r < 0) {
			fail("read", r);
			break;
		}
		snprintf(line, sizeof(line), "%zu", k);
		say("call", line, strlen(line));
		for (size_t i = 0; i < k; i++)
			say_packed(&items[i], r == TP_CHAN_CLOSED);
	}
	tp_chan_release(ch);
	free(buf);
	return r < 0;
}

/* Message @i: metadata and payload @name, tensor wq_tensor bytes of pattern @i (@t). */
static struct tp_message wq_msg(const char *meta, const char *name, uint8_t *t,
				struct tp_payload *p, struct tp_tensor *tt)
{
	*p = (struct tp_payload){ .data = (void *)name, .length = strlen(name) };
	*tt = (struct tp_tensor){ .device = { TP_DEVICE_CPU, 0 }, .data = t,
				  .length = wq_tensor };
	return (struct tp_message){ .metadata = meta, .metadata_len = strlen(meta),
				    .payloads = p, .n_payloads = 1, .tensors = tt,
				    .n_tensors = 1 };
}

/* Reads message @d of @q: its metadata into @meta, payload into @name, tensor into @t. */
static int wq_msg_read(struct tp_wq *q, struct tp_descriptor *d, char *meta, char *name,
		       uint8_t *t)
{
	struct tp_slot s[2] = { { .device = { TP_DEVICE_CPU, 0 }, .data = name },
				{ .device = { TP_DEVICE_CPU, 0 }, .data = t } };
	struct tp_allocation a = { .payloads = &s[0], .n_payloads = 1, .tensors = &s[1],
				   .n_tensors = 1 };

	if (d->n_payloads != 1 || d->n_tensors != 1 || d->payloads[0].length > 31 ||
	    d->tensors[0].length != wq_tensor || d->metadata_len > 31) {
		tp_wq_descriptor_free(d);
		return -EBADMSG;
	}
	memcpy(meta, d->metadata, d->metadata_len);
	meta[d->metadata_len] = 0;
	name[d->payloads[0].length] = 0;
	return tp_wq_read_msg(q, d, &a);
}

static int cmd_wq_own_msg(const char *name, const char *remote, int n)
{
	uint8_t *t = malloc(wq_tensor), *want = malloc(wq_tensor);
	char buf[32], meta[32], got[32], wmeta[40];
	struct tp_descriptor *d;
	struct tp_payload p;
	struct tp_tensor tt;
	struct tp_message m;
	struct tp_wq *q;
	uint64_t id;
	int r = t && want ? wq_create(name, remote, &q) : 1;

	if (r)
		return r;
	for (int i = 0; i < n; i++) {
		snprintf(buf, sizeof(buf), "q%d", i);
		pattern(t, wq_tensor, (unsigned)i);
		m = wq_msg(buf, buf, t, &p, &tt);
		r = tp_wq_submit_msg(q, &m, &id);
		if (r < 0)
			return fail("submit", r);
	}
	printf("submitted %d\n", n);
	fflush(stdout);
	for (int i = 0; i < n; i++) {
		r = tp_wq_answer_descriptor(q, &id, &d, 30000);
		if (r == 0)
			r = wq_msg_read(q, d, meta, got, t);
		if (r < 0)
			return fail("answer", r);
		snprintf(wmeta, sizeof(wmeta), "a:q%llu", (unsigned long long)id - 1);
		snprintf(buf, sizeof(buf), "q%llu", (unsigned long long)id - 1);
		pattern(want, wq_tensor, (unsigned)id - 1);
		if (strcmp(meta, wmeta) || strcmp(got, buf) || memcmp(t, want, wq_tensor)) {
			printf("error EBADMSG: answer %llu is '%s' '%s', not '%s' '%s' (or its "
			       "tensor differs)\n", (unsigned long long)id, meta, got, wmeta, buf);
			return 1;
		}
	}
	r = tp_wq_drain(q, 0);
	printf("answered %d%s\n", n, r == 0 ? " drained" : "");
	fflush(stdout);
	while (fgets(buf, sizeof(buf), stdin))
		;
	tp_wq_release(q);
	free(t);
	free(want);
	return 0;
}

static int cmd_wq_work_msg(const char *addr, int max)
{
	uint8_t *t = malloc(wq_tensor);
	char meta[32], name[32], ameta[40];
	struct tp_descriptor *d;
	struct tp_payload p;
	struct tp_tensor tt;
	struct tp_message m;
	struct tp_wq *q;
	uint64_t id;
	int r, n = 0;

	if (!t)
		return 1;
	r = tp_wq_open(ctx, addr, NULL, &q);
	if (r < 0)
		return fail("wq open", r);
	while (max < 0 || n < max) {
		r = tp_wq_take_descriptor(q, &id, &d, 30000);
		if (r == -EPIPE)
			break;
		if (r == 0)
			r = wq_msg_read(q, d, meta, name, t);
		if (r < 0)
			return fail("take", r);
		snprintf(ameta, sizeof(ameta), "a:%s", meta);
		m = wq_msg(ameta, name, t, &p, &tt);
		r = tp_wq_reply_msg(q, id, &m);
		if (r < 0)
			return fail("reply", r);
		n++;
	}
	printf("worked %d%s\n", n, r == -EPIPE ? " closed" : "");
	tp_wq_release(q);
	free(t);
	return 0;
}

static int cmd_wq_open(const char *addr)
{
	struct tp_wq *q;
	int r = tp_wq_open(ctx, addr, NULL, &q);

	if (r < 0)
		return fail("wq open", r);
	printf("opened\n");
	tp_wq_release(q);
	return 0;
}

static int run(int argc, char **argv)
{
	const char *c = argv[2];
	struct tp_chan *ch;

	if (strcmp(c, "create") == 0 && argc == 5)
		return cmd_create(argv[3], argv[4]);
	if (strcmp(c, "unlink") == 0 && argc == 4) {
		int r = tp_chan_unlink(ctx, argv[3], -1);

		return r < 0 ? fail("unlink", r) : 0;
	}
	if (strcmp(c, "open") == 0 && argc == 4) {
		if (open_chan(argv[3], &ch))
			return 1;
		printf("opened\n");
		return tp_chan_release(ch) < 0;
	}
	if (strcmp(c, "write") == 0 && argc >= 5)
		return cmd_write(argv[3], argc - 4, argv + 4);
	if (strcmp(c, "read") == 0 && argc == 6)
		return cmd_read(argv[3], atoi(argv[4]), atoi(argv[5]));
	if (strcmp(c, "close") == 0 && argc == 4)
		return cmd_close(argv[3]);
	if (strcmp(c, "readers") == 0 && argc == 6)
		return cmd_readers(argv[3], atoi(argv[4]), atoi(argv[5]));
	if (strcmp(c, "wq-own") == 0 && argc == 6)
		return cmd_wq_own(argv[3], argv[4], atoi(argv[5]));
	if (strcmp(c, "wq-work") == 0 && argc >= 4 && argc <= 6)
		return cmd_wq_work(argv[3], argc >= 5 ? atoi(argv[4]) : -1,
				   argc == 6 ? atol(argv[5]) : -1, false);
	if (strcmp(c, "wq-hold") == 0 && (argc == 4 || argc == 5))
		return cmd_wq_work(argv[3], 1, argc == 5 ? atol(argv[4]) : -1, true);
	if (strcmp(c, "wq-open") == 0 && argc == 4)
		return cmd_wq_open(argv[3]);
	if (strcmp(c, "wq-own-msg") == 0 && (argc == 6 || argc == 7)) {
		wq_tensor = argc == 7 ? strtoull(argv[6], NULL, 0) : wq_tensor;
		return cmd_wq_own_msg(argv[3], argv[4], atoi(argv[5]));
	}
	if (strcmp(c, "write-big") == 0 && argc == 6)
		return cmd_write_big(argv[3], strtoull(argv[4], NULL, 0), (unsigned)atoi(argv[5]));
	if (strcmp(c, "read-packed") == 0 && argc == 7)
		return cmd_read_packed(argv[3], atoi(argv[4]), strtoull(argv[5], NULL, 0),
				       atoi(argv[6]));
	if (strcmp(c, "wq-work-msg") == 0 && (argc == 5 || argc == 6)) {
		wq_tensor = argc == 6 ? strtoull(argv[5], NULL, 0) : wq_tensor;
		return cmd_wq_work_msg(argv[3], atoi(argv[4]));
	}
	return 2;
}

int main(int argc, char **argv)
{
	struct tp_context_options co = { .size = sizeof(co) };
	int r;

	if (argc < 3) {
		fprintf(stderr, "usage: chan_xhost SOCKET COMMAND ARGS...\n");
		return 2;
	}
	co.socket_path = argv[1];
	r = tp_context_new(&co, &ctx);
	if (r < 0) {
		printf("error context: %s\n", tp_last_error());
		return 1;
	}
	r = run(argc, argv);
	if (r == 2)
		fprintf(stderr, "chan_xhost: bad command or arguments\n");
	tp_context_free(ctx);
	return r;
}
