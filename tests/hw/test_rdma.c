/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: the rdma channel, tensors in shared buffers on both sides moved between two daemons
 * that treat each other as remote hosts (the peer fixture: --peer-force-cross-host on
 * loopback) by RDMA writes instead of the data connections. The daemons run without a CUDA
 * driver: host memory needs only an RDMA port. Messages of one to many tensors, 64 KiB + 1 to
 * 64 MiB, in their own buffers and carved at odd offsets from one, arrive intact; both daemons
 * count every byte under rdma in `tpipctl stats` and on the link in `tpipctl peers`, and list
 * rdma as viable, with its capabilities, in `tpipctl backends`. Private memory on either side
 * cannot be registered: those tensors still arrive, over mpt. A daemon without an RDMA port, or
 * with one and --no-rdma, sets up no RDMA with one that has it and the bytes go over mpt. A write the RDMA device fails
 * reaches both clients as an error naming rdma; both daemons stay up, turn RDMA off on that link
 * and move the next message over the data connections.
 * Runs on an active RDMA port, else against the stand-in provider ($TPIPD_VERBS_LIBRARY, or
 * $TPT_FAKEVERBS, which meson sets); skips (77) with the reason if neither loads, and fails
 * instead of falling back with TPT_HW_REQUIRE=1.
 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"
#include "tpv.h"

#define KIB (1u << 10)
#define MIB (1u << 20)
#define EXIT_SKIP 77

/* The row of channel @name in `tpipctl --json backends` output @o (borrowed from @o). */
static struct json_object *backend_row(struct json_object *o, const char *name, const char *out)
{
	struct json_object *arr, *v;

	ck_assert_msg(o && json_object_object_get_ex(o, "backends", &arr),
		      "tpipctl --json backends: %s", out);
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *e = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(e, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0)
			return e;
	}
	ck_abort_msg("no %s backend: %s", name, out);
	return NULL;
}

/* `tpipctl --json backends` of @d lists rdma as viable, for shared buffers between hosts. */
static void expect_rdma_backend(const struct tpt_daemon *d)
{
	static const char *const want[] = { "host-mem", "cross-host", "src-local", "dst-local" };
	char *out = tpt_ctl(d, "backends", true);
	struct json_object *o = json_tokener_parse(out), *c = backend_row(o, "rdma", out), *v, *caps;
	char text[200] = "";

	ck_assert_msg(json_object_object_get_ex(c, "viable", &v) && json_object_get_boolean(v),
		      "rdma not viable: %s", out);
	ck_assert(json_object_object_get_ex(c, "caps", &caps));
	for (size_t i = 0; i < json_object_array_length(caps); i++)
		snprintf(text + strlen(text), sizeof(text) - strlen(text), "%s,",
			 json_object_get_string(json_object_array_get_idx(caps, i)));
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		ck_assert_msg(strstr(text, want[i]), "rdma caps '%s' lack %s", text, want[i]);
	ck_assert_msg(!strstr(text, "cuda") && !strstr(text, "process"), "rdma caps '%s'", text);
	json_object_put(o);
	free(out);
}

/* `tpipctl --json backends` of @d lists @name as not viable, turned off by configuration. */
static void expect_backend_disabled(const struct tpt_daemon *d, const char *name)
{
	char *out = tpt_ctl(d, "backends", true);
	struct json_object *o = json_tokener_parse(out), *c = backend_row(o, name, out), *v;

	ck_assert_msg(json_object_object_get_ex(c, "viable", &v) && !json_object_get_boolean(v),
		      "%s viable: %s", name, out);
	ck_assert_msg(json_object_object_get_ex(c, "why", &v) &&
			      strcmp(json_object_get_string(v), "disabled by configuration") == 0,
		      "%s: %s", name, out);
	json_object_put(o);
	free(out);
}

/* Channel byte counts of both daemons, to compare before and after a transfer. */
struct counts {
	uint64_t rdma[2], mpt[2];
};

static struct counts counts_now(void)
{
	struct counts c;

	for (int k = 0; k < 2; k++) {
		const struct tpt_daemon *d = k ? &tpt_peer_b : &tpt_peer_a;

		c.rdma[k] = tpt_channel_bytes(d, "rdma");
		c.mpt[k] = tpt_channel_bytes(d, "mpt");
	}
	return c;
}

static bool counts_are(const struct counts *c0, const struct counts *c, uint64_t rdma,
		       uint64_t mpt)
{
	for (int k = 0; k < 2; k++)
		if (c->rdma[k] - c0->rdma[k] != rdma || c->mpt[k] - c0->mpt[k] != mpt)
			return false;
	return true;
}

/* Since @c0, both daemons counted @rdma bytes under rdma and @mpt under mpt. A writer's
 * daemon counts a send when its own completion runs, which may come a loop turn after the
 * reader's daemon told the writer the message was read: poll for a while. */
static void expect_counts(const struct counts *c0, uint64_t rdma, uint64_t mpt)
{
	struct counts c = counts_now();

	for (int i = 0; i < 500 && !counts_are(c0, &c, rdma, mpt); i++) {
		usleep(10000);
		c = counts_now();
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_msg(c.rdma[k] - c0->rdma[k] == rdma && c.mpt[k] - c0->mpt[k] == mpt,
			      "daemon %c: rdma %llu mpt %llu bytes, want %llu and %llu", k ? 'B' : 'A',
			      (unsigned long long)(c.rdma[k] - c0->rdma[k]),
			      (unsigned long long)(c.mpt[k] - c0->mpt[k]),
			      (unsigned long long)rdma, (unsigned long long)mpt);
	}
}

static const size_t *spec_lens;
static size_t spec_n;

/* Message @index holds one tensor of spec_lens[@index] bytes; the last, every size at once. */
static void spec_sizes(unsigned index, struct tpt_msg_spec *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->index = index;
	ret->meta_len = 24;
	if (index < spec_n) {
		ret->n_tensors = 1;
		ret->lens[0] = spec_lens[index];
		return;
	}
	ret->n_tensors = spec_n;
	ret->seg_meta_len = 8;
	for (size_t i = 0; i < spec_n; i++)
		ret->lens[i] = spec_lens[i];
}

/* Sends spec_sizes() messages (one per size, then all in one) from a client of A to one of B. */
static bool cross(const char *name, enum tpt_mem wmem, enum tpt_mem rmem)
{
	char addr[128];
	struct tpt_xfer x = { .d = &tpt_peer_b, .writer_d = &tpt_peer_a, .name = name,
			      .address = tpt_peer_address(&tpt_peer_b, name, addr, sizeof(addr)),
			      .n_msgs = (unsigned)spec_n + 1, .spec = spec_sizes,
			      .writer_mem = wmem, .reader_mem = rmem };

	return tpt_xfer_run(&x);
}

static const size_t sizes[] = { 64 * KIB + 1, MIB + 7, 3 * MIB, 64 * MIB };

static uint64_t sizes_total(void)
{
	uint64_t t = 0;

	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		t += sizes[i];
	return 2 * t; /* one message per size, then all in one */
}

/* The one link of @d: RDMA in @state (a prefix; "": no RDMA on the link), its text naming @why
 * (NULL: anything); RDMA bytes sent and received at least as given. */
static void expect_link(const struct tpt_daemon *d, const char *state, const char *why,
			uint64_t sent, uint64_t received)
{
	struct tpt_link l;

	ck_assert_int_eq(tpt_peer_links(d, &l), 1);
	ck_assert_msg((*state ? strncmp(l.rdma, state, strlen(state)) == 0 : !l.rdma[0]) &&
			      (!why || strstr(l.rdma, why)),
		      "%s: link rdma '%s', want '%s' naming '%s'", d->socket, l.rdma, state,
		      why ? why : "");
	ck_assert_uint_ge(l.rdma_bytes_sent, sent);
	ck_assert_uint_ge(l.rdma_bytes_received, received);
}

START_TEST(test_rdma_shared_buffers_across_daemons)
{
	struct counts c0 = counts_now();

	spec_lens = sizes;
	spec_n = sizeof(sizes) / sizeof(sizes[0]);
	ck_assert(cross("rdma-shm", TPT_MEM_SHM, TPT_MEM_SHM));
	expect_counts(&c0, sizes_total(), 0);
	c0 = counts_now();
	ck_assert(cross("rdma-slab", TPT_MEM_SLAB, TPT_MEM_SLAB));
	expect_counts(&c0, sizes_total(), 0);
	expect_link(&tpt_peer_a, "ready", NULL, 2 * sizes_total(), 0);
	expect_link(&tpt_peer_b, "ready", NULL, 0, 2 * sizes_total());
	expect_rdma_backend(&tpt_peer_a);
	expect_rdma_backend(&tpt_peer_b);
	ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));
}
END_TEST

/* Private memory on either side: not registrable, so the whole message goes over mpt. */
START_TEST(test_rdma_private_memory_goes_over_mpt)
{
	static const size_t two[] = { MIB + 3, 5 * MIB };
	struct counts c0 = counts_now();

	spec_lens = two;
	spec_n = 2;
	ck_assert(cross("rdma-pw", TPT_MEM_PRIVATE, TPT_MEM_SHM));
	ck_assert(cross("rdma-pr", TPT_MEM_SHM, TPT_MEM_PRIVATE));
	ck_assert(cross("rdma-mix", TPT_MEM_MIXED, TPT_MEM_SHM));
	expect_counts(&c0, 0, 3 * 2 * (MIB + 3 + 5 * MIB));
}
END_TEST

/* One 2 MiB tensor crosses, as listener @name, over mpt; neither daemon has RDMA on the link. */
static void expect_no_rdma(const char *name)
{
	static const size_t one[] = { 2 * MIB };
	struct counts c0 = counts_now();

	spec_lens = one;
	spec_n = 1;
	ck_assert(cross(name, TPT_MEM_SHM, TPT_MEM_SHM));
	expect_counts(&c0, 0, 2 * 2 * MIB);
	expect_link(&tpt_peer_a, "", NULL, 0, 0);
	expect_link(&tpt_peer_b, "", NULL, 0, 0);
}

/* Daemon B has no RDMA port: no RDMA on the link, the bytes go over mpt. */
START_TEST(test_rdma_peer_without_a_port)
{
	const char *lib = getenv("TPIPD_VERBS_LIBRARY");
	char *saved = lib ? strdup(lib) : NULL;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	setenv("TPIPD_VERBS_LIBRARY", "/nonexistent/libibverbs.so.1", 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, tpt_peer_args()), 0);
	if (saved)
		setenv("TPIPD_VERBS_LIBRARY", saved, 1);
	else
		unsetenv("TPIPD_VERBS_LIBRARY");
	free(saved);
	expect_no_rdma("rdma-none");
}
END_TEST

/* Daemon B has a port but runs with --no-rdma: no RDMA on the link, the bytes go over mpt, and
 * B lists rdma and cuda_gdr as turned off. */
START_TEST(test_rdma_turned_off_by_configuration)
{
	const char *const *t = tpt_peer_args();
	const char *args[8] = { t[0], t[1], t[2], t[3], "--no-rdma" };

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, args), 0);
	expect_no_rdma("rdma-off");
	expect_backend_disabled(&tpt_peer_b, "rdma");
	expect_backend_disabled(&tpt_peer_b, "cuda_gdr");
	expect_rdma_backend(&tpt_peer_a);
}
END_TEST

/* Restarts both daemons with the stand-in's knobs @env ("NAME=VALUE", NULL-terminated) and
 * the extra flags @extra (up to 3, NULL-terminated). */
static void restart_both(const char *const *env, const char *const *extra)
{
	const char *const *t = tpt_peer_args();
	const char *args[8] = { t[0], t[1], t[2], t[3] };

	for (int i = 0; extra && extra[i] && i < 3; i++)
		args[4 + i] = extra[i];
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
	for (int i = 0; env[i]; i++)
		ck_assert_int_eq(putenv((char *)env[i]), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_b, args), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, args), 0);
	for (int i = 0; env[i]; i++) {
		char name[64];

		snprintf(name, sizeof(name), "%.*s", (int)strcspn(env[i], "="), env[i]);
		unsetenv(name);
	}
}

/* Issue 28 item 2, between daemons: 8 ports on 8 rails each; the link connects the 8 pairs on a
 * rail (their rails carried in PeerRdma) and moves every tensor by RDMA. */
START_TEST(test_rdma_eight_rails_between_daemons)
{
	static const char *const env[] = { "FAKEVERBS_PORTS=8", "FAKEVERBS_RAILS=8", NULL };
	struct counts c0;

	restart_both(env, NULL);
	c0 = counts_now();
	spec_lens = sizes;
	spec_n = sizeof(sizes) / sizeof(sizes[0]);
	ck_assert(cross("rdma-rails", TPT_MEM_SHM, TPT_MEM_SHM));
	expect_counts(&c0, sizes_total(), 0);
	expect_link(&tpt_peer_a, "ready: 8 queue pairs between ports on the same rail", NULL,
		    sizes_total(), 0);
	expect_link(&tpt_peer_b, "ready: 8 queue pairs between ports on the same rail", NULL, 0,
		    sizes_total());
}
END_TEST

/*
 * A port whose context does not open (FAKEVERBS_FAIL_PD=1: the first ibv_alloc_pd of each daemon
 * fails, so port 0 on both) is skipped: the link connects the other rail and every tensor still
 * goes by RDMA (on the old code the link went off and every byte went over mpt).
 */
START_TEST(test_rdma_port_that_does_not_open_is_skipped)
{
	static const char *const env[] = { "FAKEVERBS_PORTS=2", "FAKEVERBS_RAILS=2",
					   "FAKEVERBS_FAIL_PD=1", NULL };
	struct counts c0;

	restart_both(env, NULL);
	c0 = counts_now();
	spec_lens = sizes;
	spec_n = sizeof(sizes) / sizeof(sizes[0]);
	ck_assert(cross("rdma-skip", TPT_MEM_SHM, TPT_MEM_SHM));
	expect_counts(&c0, sizes_total(), 0);
	expect_link(&tpt_peer_a, "ready: 1 queue pairs between ports on the same rail", NULL,
		    sizes_total(), 0);
	expect_link(&tpt_peer_b, "ready: 1 queue pairs between ports on the same rail", NULL, 0,
		    sizes_total());
}
END_TEST

/* Issue 28 item 6: a fabric that carries only traffic class 106 and answers after the default
 * ACK timeout: --rdma-traffic-class 106 --rdma-timeout 18 make every tensor go by RDMA. */
START_TEST(test_rdma_roce_settings_from_the_configuration)
{
	static const char *const env[] = { "FAKEVERBS_TC=106", "FAKEVERBS_FABRIC_TIMEOUT=18",
					   NULL };
	static const char *const extra[] = { "--rdma-traffic-class=106", "--rdma-timeout=18",
					     NULL };
	struct counts c0;

	restart_both(env, extra);
	c0 = counts_now();
	spec_lens = sizes;
	spec_n = sizeof(sizes) / sizeof(sizes[0]);
	ck_assert(cross("rdma-tc", TPT_MEM_SHM, TPT_MEM_SHM));
	expect_counts(&c0, sizes_total(), 0);
	expect_link(&tpt_peer_a, "ready", NULL, sizes_total(), 0);
}
END_TEST

/*
 * One 1 MiB tensor in a shared buffer from a client of A to one of B. @fail: the device fails
 * the writes and both ends must see an error naming rdma; else it must arrive.
 */
static struct tpt_sync f_ready, f_done;

static int fault_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "rdma-fault-w",
			     .where = tpt_peer_address(&tpt_peer_b, "rdma-fault", addr, sizeof(addr)),
			     .ready = &f_ready, .timeout_ms = TPT_SCALED_MS(60000) };
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = MIB };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	int r;

	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(tp_buffer_alloc(e.ctx, MIB, &t.data) == 0, 1, "buffer");
	memset(t.data, 0x5a, MIB);
	r = tp_pipe_write_sync(e.p, &m);
	if (arg) {
		TPT_REQUIRE(r < 0, 1, "the write succeeded though the device failed it");
		printf("writer: %d %s\n", r, tp_last_error());
	} else {
		TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	}
	tpt_sync_wait(&f_done, TPT_SCALED_MS(60000));
	tp_buffer_free(e.ctx, t.data);
	tpt_end_close(&e);
	return 0;
}

static int fault_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "rdma-fault-r", .where = "rdma-fault",
			     .ready = &f_ready, .timeout_ms = TPT_SCALED_MS(60000) };
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tp_buffer_alloc(e.ctx, MIB, &slot.data) == 0, 1, "buffer");
	r = tp_pipe_read_descriptor_sync(e.p, TPT_SCALED_MS(60000), &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	r = tp_pipe_read_sync(e.p, d, &a);
	if (arg) {
		TPT_REQUIRE(r < 0, 1, "the read succeeded though the device failed the write");
		TPT_REQUIRE(strstr(tp_last_error(), "rdma") != NULL, 1, "reader's error: %s",
			    tp_last_error());
		printf("reader: %d %s\n", r, tp_last_error());
	} else {
		TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
		for (size_t i = 0; i < MIB; i++)
			TPT_REQUIRE(((uint8_t *)slot.data)[i] == 0x5a, 1, "byte %zu", i);
	}
	tpt_sync_post(&f_done, 0);
	tp_buffer_free(e.ctx, slot.data);
	tpt_end_close(&e);
	return 0;
}

static bool one_tensor(bool fail)
{
	bool ok;

	ck_assert_int_eq(tpt_sync_init(&f_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&f_done), 0);
	ok = tpt_run_pair(fault_reader, fault_writer, fail ? &f_done : NULL,
			  TPT_SCALED_MS(120000));
	tpt_sync_done(&f_ready);
	tpt_sync_done(&f_done);
	return ok;
}

/*
 * The RDMA device fails the sender's writes (the stand-in's FAKEVERBS_FAIL_WRITES): both clients
 * see the error, the daemons stay up, RDMA is off on that link (both daemons say why) and the
 * next tensor crosses over the data connections.
 */
START_TEST(test_rdma_device_error_reaches_both_clients)
{
	struct counts c0;

	ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
	setenv("FAKEVERBS_FAIL_WRITES", "1", 1);
	ck_assert_int_eq(tpt_daemon_start_peer(&tpt_peer_a, tpt_peer_args()), 0);
	unsetenv("FAKEVERBS_FAIL_WRITES");
	ck_assert(one_tensor(true));
	ck_assert(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b));
	expect_link(&tpt_peer_a, "off: ", "RDMA write failed", 0, 0);
	expect_link(&tpt_peer_b, "off: ", "RDMA write failed", 0, 0);
	c0 = counts_now();
	ck_assert(one_tensor(false));
	expect_counts(&c0, 0, MIB);
}
END_TEST

/* ---- the registration cache ---------------------------------------------------------------- */

/* The registration cache of @d, from `tpipctl --json status`. */
struct cache {
	uint64_t regions, bytes, hits, misses, evictions;
};

static struct cache cache_now(const struct tpt_daemon *d)
{
	static const char *const keys[] = { "rdma_cache_regions", "rdma_cache_bytes",
					    "rdma_cache_hits", "rdma_cache_misses",
					    "rdma_cache_evictions" };
	uint64_t v[5];

	tpt_status_u64s(d, keys, 5, v);
	return (struct cache){ v[0], v[1], v[2], v[3], v[4] };
}

static void expect_cache(const struct tpt_daemon *d, const struct cache *want)
{
	struct cache c = cache_now(d);

	ck_assert_msg(c.regions == want->regions && c.bytes == want->bytes &&
			      c.hits == want->hits && c.misses == want->misses &&
			      c.evictions == want->evictions,
		      "%s: cache regions %llu bytes %llu hits %llu misses %llu evictions %llu, want "
		      "%llu %llu %llu %llu %llu",
		      d->socket, (unsigned long long)c.regions, (unsigned long long)c.bytes,
		      (unsigned long long)c.hits, (unsigned long long)c.misses,
		      (unsigned long long)c.evictions, (unsigned long long)want->regions,
		      (unsigned long long)want->bytes, (unsigned long long)want->hits,
		      (unsigned long long)want->misses, (unsigned long long)want->evictions);
}

/*
 * C_MSGS messages of one C_LEN-byte tensor, each from one 8 MiB shared buffer of the writer into
 * one of the reader, at offsets that move: the writer's are 0 or 1 MiB + 64, the reader's 4 KiB
 * or 2 MiB + 8. Regions are registered in whole 2 MiB steps of the buffer, so each side
 * registers [0, 4 MiB) for the first message, widens it to [0, 6 MiB) for the second, and finds
 * every later one in it.
 */
#define C_MSGS 8u
#define C_LEN (3 * MIB + 5)
#define C_BUF (8 * MIB)
static struct tpt_sync c_ready, c_sent, c_freed, c_go[2]; /* c_go: the writer's, the reader's */

static size_t c_woff(unsigned k)
{
	return k % 2 ? MIB + 64 : 0;
}

static size_t c_roff(unsigned k)
{
	return k % 3 == 1 ? 2 * MIB + 8 : 4 * KIB;
}

/* After the messages, the writer and the reader post c_sent and hold their buffers until their
 * c_go; then the writer frees its buffer, both post c_freed and keep their contexts open until a
 * second c_go, and leave (the reader still holding its buffer). */
static int cache_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "rdma-cache-w",
			     .where = tpt_peer_address(&tpt_peer_b, "rdma-cache", addr, sizeof(addr)),
			     .ready = &c_ready, .timeout_ms = TPT_SCALED_MS(60000) };
	void *buf;
	int r;

	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	TPT_REQUIRE(tp_buffer_alloc(e.ctx, C_BUF, &buf) == 0, 1, "buffer");
	for (unsigned k = 0; k < C_MSGS; k++) {
		struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 },
				       .data = (uint8_t *)buf + c_woff(k), .length = C_LEN };
		struct tp_message m = { .tensors = &t, .n_tensors = 1 };

		memset(t.data, 0x30 + (int)k, C_LEN);
		r = tp_pipe_write_sync(e.p, &m);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", k, r, tp_last_error());
	}
	tpt_sync_post(&c_sent, 0);
	TPT_REQUIRE(tpt_sync_wait(&c_go[0], TPT_SCALED_MS(60000)) == 0, 1, "no go");
	tp_buffer_free(e.ctx, buf);
	tpt_sync_post(&c_freed, 0);
	TPT_REQUIRE(tpt_sync_wait(&c_go[0], TPT_SCALED_MS(60000)) == 0, 1, "no second go");
	tpt_end_close(&e);
	return 0;
}

static int cache_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "rdma-cache-r", .where = "rdma-cache",
			     .ready = &c_ready, .timeout_ms = TPT_SCALED_MS(60000) };
	struct tp_descriptor *d;
	uint8_t *buf;
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tp_buffer_alloc(e.ctx, C_BUF, (void **)&buf) == 0, 1, "buffer");
	for (unsigned k = 0; k < C_MSGS; k++) {
		struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = buf + c_roff(k) };
		struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };

		r = tp_pipe_read_descriptor_sync(e.p, TPT_SCALED_MS(60000), &d);
		TPT_REQUIRE(r == 0, 1, "descriptor %u: %d %s", k, r, tp_last_error());
		r = tp_pipe_read_sync(e.p, d, &a);
		TPT_REQUIRE(r == 0, 1, "read %u: %d %s", k, r, tp_last_error());
		for (size_t i = 0; i < C_LEN; i++)
			TPT_REQUIRE(buf[c_roff(k) + i] == 0x30 + k, 1, "message %u byte %zu", k, i);
	}
	tpt_sync_post(&c_sent, 0);
	TPT_REQUIRE(tpt_sync_wait(&c_go[1], TPT_SCALED_MS(60000)) == 0, 1, "no go");
	tpt_sync_post(&c_freed, 0);
	TPT_REQUIRE(tpt_sync_wait(&c_go[1], TPT_SCALED_MS(60000)) == 0, 1, "no second go");
	tpt_end_close(&e);
	return 0;
}

/* Polls until the cache of @d is @want (a released buffer's region goes as the daemon handles
 * the release, which the client sends without waiting), or fails after 10 s. */
static void expect_cache_soon(const struct tpt_daemon *d, const struct cache *want)
{
	for (int i = 0; i < TPT_SCALED_MS(10000) / 20; i++) {
		struct cache c = cache_now(d);

		if (memcmp(&c, want, sizeof(c)) == 0)
			return;
		usleep(20000);
	}
	expect_cache(d, want);
}

/*
 * Each daemon registers twice for the eight messages and finds the other six in its cache; one
 * 6 MiB region per daemon stays while the clients hold their buffers. It goes (no eviction) as
 * the writer frees its buffer, while still attached, and as the reader leaves holding its own.
 */
START_TEST(test_rdma_registrations_are_cached)
{
	struct cache live = { .regions = 1, .bytes = 6 * MIB, .hits = C_MSGS - 2, .misses = 2 };
	struct cache gone = { .hits = C_MSGS - 2, .misses = 2 };
	struct counts c0 = counts_now();
	pid_t w, r;

	ck_assert_int_eq(tpt_sync_init(&c_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&c_sent), 0);
	ck_assert_int_eq(tpt_sync_init(&c_freed), 0);
	ck_assert_int_eq(tpt_sync_init(&c_go[0]), 0);
	ck_assert_int_eq(tpt_sync_init(&c_go[1]), 0);
	r = tpt_fork(cache_reader, NULL);
	w = tpt_fork(cache_writer, NULL);
	ck_assert(r > 0 && w > 0);
	ck_assert_int_eq(tpt_sync_wait(&c_sent, TPT_SCALED_MS(120000)), 0);
	ck_assert_int_eq(tpt_sync_wait(&c_sent, TPT_SCALED_MS(120000)), 0);
	expect_counts(&c0, (uint64_t)C_MSGS * C_LEN, 0);
	expect_cache(&tpt_peer_a, &live);
	expect_cache(&tpt_peer_b, &live);
	tpt_sync_post(&c_go[0], 0);
	tpt_sync_post(&c_go[1], 0);
	ck_assert_int_eq(tpt_sync_wait(&c_freed, TPT_SCALED_MS(60000)), 0);
	ck_assert_int_eq(tpt_sync_wait(&c_freed, TPT_SCALED_MS(60000)), 0);
	expect_cache_soon(&tpt_peer_a, &gone);
	expect_cache(&tpt_peer_b, &live);
	tpt_sync_post(&c_go[0], 0);
	tpt_sync_post(&c_go[1], 0);
	ck_assert(tpt_wait_ok(w, TPT_SCALED_MS(60000), "writer"));
	ck_assert(tpt_wait_ok(r, TPT_SCALED_MS(60000), "reader"));
	tpt_sync_done(&c_ready);
	tpt_sync_done(&c_sent);
	tpt_sync_done(&c_freed);
	tpt_sync_done(&c_go[0]);
	tpt_sync_done(&c_go[1]);
	expect_cache(&tpt_peer_a, &gone);
	expect_cache(&tpt_peer_b, &gone);
}
END_TEST

/*
 * With --rdma-cache 0 every segment registers and nothing stays; with a budget smaller than one
 * region, each region is evicted when its transfer ends. The bytes arrive either way.
 */
START_TEST(test_rdma_cache_budget)
{
	static const size_t two[] = { MIB + 7, 3 * MIB };
	static const char *const budgets[] = { "0", "1M" };
	const char *const *t = tpt_peer_args();

	spec_lens = two;
	spec_n = 2;
	for (size_t i = 0; i < 2; i++) {
		const char *args[8] = { t[0], t[1], t[2], t[3], "--rdma-cache", budgets[i] };
		struct counts c0;
		struct cache c;

		ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
		ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
		ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, args, &tpt_peer_b, args), 0);
		c0 = counts_now();
		ck_assert(cross(i ? "rdma-small" : "rdma-nocache", TPT_MEM_SHM, TPT_MEM_SHM));
		expect_counts(&c0, 2 * (MIB + 7 + 3 * MIB), 0);
		for (int k = 0; k < 2; k++) {
			c = cache_now(k ? &tpt_peer_b : &tpt_peer_a);
			/* one message per size, then both in one: 4 segments, none found cached */
			ck_assert_msg(c.regions == 0 && c.bytes == 0 && c.hits == 0 && c.misses == 4,
				      "budget %s, daemon %c: regions %llu bytes %llu hits %llu "
				      "misses %llu", budgets[i], k ? 'B' : 'A',
				      (unsigned long long)c.regions, (unsigned long long)c.bytes,
				      (unsigned long long)c.hits, (unsigned long long)c.misses);
			ck_assert_uint_eq(c.evictions, i ? 4 : 0);
		}
	}
}
END_TEST

/*
 * [backends] priority decides the channel between hosts, on each daemon: the reader's daemon
 * (B) with mpt first makes no RDMA offer, the writer's daemon (A) with mpt first declines the
 * offer; either way one 2 MiB tensor crosses over mpt although RDMA is ready on the link. With
 * rdma first on both (as in the built-in order between hosts), the same tensor goes by rdma.
 */
START_TEST(test_rdma_priority_decides_the_channel)
{
	static const size_t one[] = { 2 * MIB };
	static const struct {
		const char *a, *b, *name;
		bool rdma;
	} cases[] = {
		{ "rdma,mpt", "mpt", "prio-reader-mpt", false },
		{ "mpt", "rdma,mpt", "prio-writer-mpt", false },
		{ "rdma,mpt", "rdma,mpt", "prio-rdma", true },
		{ "mpt,rdma", "mpt,rdma", "prio-mpt", false },
	};
	const char *const *t = tpt_peer_args();

	spec_lens = one;
	spec_n = 1;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *a[8] = { t[0], t[1], t[2], t[3], "--backend-priority", cases[i].a };
		const char *b[8] = { t[0], t[1], t[2], t[3], "--backend-priority", cases[i].b };
		uint64_t bytes = 2 * 2 * MIB;
		struct counts c0;

		ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_a), 0);
		ck_assert_int_eq(tpt_daemon_stop(&tpt_peer_b), 0);
		ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, a, &tpt_peer_b, b), 0);
		c0 = counts_now();
		ck_assert_msg(cross(cases[i].name, TPT_MEM_SHM, TPT_MEM_SHM), "%s", cases[i].name);
		expect_counts(&c0, cases[i].rdma ? bytes : 0, cases[i].rdma ? 0 : bytes);
		expect_link(&tpt_peer_a, "ready", NULL, cases[i].rdma ? bytes : 0, 0);
		expect_link(&tpt_peer_b, "ready", NULL, 0, cases[i].rdma ? bytes : 0);
	}
}
END_TEST

static Suite *rdma_suite(bool stand_in)
{
	Suite *s = suite_create("rdma");
	TCase *tc = tcase_create("rdma");

	tcase_add_checked_fixture(tc, tpt_peer_fixture_start, tpt_peer_fixture_stop);
	tcase_add_test(tc, test_rdma_shared_buffers_across_daemons);
	tcase_add_test(tc, test_rdma_private_memory_goes_over_mpt);
	tcase_add_test(tc, test_rdma_turned_off_by_configuration);
	tcase_add_test(tc, test_rdma_registrations_are_cached);
	tcase_add_test(tc, test_rdma_cache_budget);
	tcase_add_test(tc, test_rdma_priority_decides_the_channel);
	if (stand_in) { /* the daemons' ports and failures come from the stand-in provider */
		tcase_add_test(tc, test_rdma_peer_without_a_port);
		tcase_add_test(tc, test_rdma_device_error_reaches_both_clients);
		tcase_add_test(tc, test_rdma_eight_rails_between_daemons);
		tcase_add_test(tc, test_rdma_port_that_does_not_open_is_skipped);
		tcase_add_test(tc, test_rdma_roce_settings_from_the_configuration);
	}
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

/* True if the verbs library (TPIPD_VERBS_LIBRARY, else the system's) has an active port. */
static bool port_there(char *why, size_t wl)
{
	const struct tpv_ops *ops = tpv_ops_load(why, wl);

	return ops && tpv_probe(ops, why, wl);
}

int main(void)
{
	const char *stand_in = getenv("TPT_FAKEVERBS");
	const char *lib;
	char why[256] = "";

	/* No device here: run the daemons against the stand-in provider that meson names, so the
	 * path is exercised on every machine (a real port, where there is one, takes precedence). */
	if (!getenv("TPIPD_VERBS_LIBRARY") && !port_there(why, sizeof(why)) && stand_in &&
	    !getenv("TPT_HW_REQUIRE")) {
		printf("no RDMA port (%s): using the stand-in %s\n", why, stand_in);
		setenv("TPIPD_VERBS_LIBRARY", stand_in, 1);
	}
	lib = getenv("TPIPD_VERBS_LIBRARY");
	if (!port_there(why, sizeof(why))) {
		printf("SKIP: rdma needs an active RDMA port: %s\n", why);
		return getenv("TPT_HW_REQUIRE") ? 1 : EXIT_SKIP;
	}
	/* Host memory only: the daemons must not need the (stand-in) CUDA driver. */
	unsetenv("TPIPD_CUDA_LIBRARY");
	return tpt_run_suite(rdma_suite(lib && strstr(lib, "fakeverbs")));
}
