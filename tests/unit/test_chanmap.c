/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite: a reader handle's mappings of writers' buffers and the daemon's notices that some
 * are gone (client/lib/chanmap.c, compiled in; docs/channels.md "Mapped buffers retired"). A
 * notice unmaps exactly the mappings of the handle it names whose keys it lists: keys the
 * handle does not keep (0, UINT64_MAX, a key of another handle), a handle that is not the
 * context's, and a key listed twice unmap nothing else; a mapping a copy still uses stays
 * mapped (no longer listed as mapped, nor found for a new read) until that copy ends; the
 * handle's release unmaps the rest. A notice of lent buffers given back takes only buffers
 * the named handle lent, each once, and the io thread keeps a handle's own for it and puts a
 * pool buffer back into the pool. The library's other parts are stand-ins below: chanmap.c
 * sends nothing in these cases.
 */
#include <check.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "chan_int.h"
#include "internal.h"

#define MAP_BYTES (64u << 10)

/* ---- stand-ins for the rest of libtpclient (never reached in these cases) ---------------- */

int tpc_wire_send(struct tp_context *ctx, Tpw__V1__ClientMsg *m, const struct iovec *data,
		  size_t n_data, int fd)
{
	(void)ctx, (void)m, (void)data, (void)n_data, (void)fd;
	return 0;
}

int tpc_pring_take_fd(struct tp_context *ctx)
{
	(void)ctx;
	return -EBADF;
}

/* The buffers put back (tpc_chan_back_run(), tpc_chan_map_drop()), in order, and how. */
static struct tpc_buf *put[16];
static bool put_reuse[16];
static unsigned n_put;

void tpc_buffer_stage_put(struct tp_context *ctx, struct tpc_buf *b, bool reuse)
{
	(void)ctx;
	if (b && n_put < 16) {
		put[n_put] = b;
		put_reuse[n_put++] = reuse;
	}
}

int tpc_buffer_chan_new(struct tp_context *ctx, size_t size, struct tpc_buf **ret)
{
	(void)ctx, (void)size, (void)ret;
	return -ENOSYS;
}

void tpc_context_wake(struct tp_context *ctx)
{
	(void)ctx;
}

/* ---- the cases ----------------------------------------------------------------------------- */

/* Is [@p, @p + MAP_BYTES) mapped in this process? */
static bool mapped(const void *p)
{
	return msync((void *)p, MAP_BYTES, MS_ASYNC) == 0;
}

/* A read-only shared mapping of a fresh memfd, as the library makes of a writer's buffer. */
static const uint8_t *map_one(void)
{
	int fd = memfd_create("test-chanmap", MFD_CLOEXEC);
	void *p;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(ftruncate(fd, MAP_BYTES), 0);
	p = mmap(NULL, MAP_BYTES, PROT_READ, MAP_SHARED, fd, 0);
	ck_assert(p != MAP_FAILED);
	close(fd);
	return p;
}

static void notice(struct tp_context *ctx, uint64_t chan_id, uint64_t *keys, size_t n)
{
	Tpw__V1__ChanReply m = TPW__V1__CHAN_REPLY__INIT;

	m.chan_id = chan_id;
	m.retired = keys;
	m.n_retired = n;
	pthread_mutex_lock(&ctx->lock);
	tpc_chan_map_on_retired(ctx, &m);
	pthread_mutex_unlock(&ctx->lock);
}

START_TEST(test_a_notice_unmaps_only_the_named_handles_listed_keys)
{
	struct tp_context *ctx = calloc(1, sizeof(*ctx));
	struct tp_chan *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	Tpw__V1__ChanOp op = TPW__V1__CHAN_OP__INIT;
	struct chan_req cr = { 0 };
	uint64_t keys[CHAN_MAP_MAX];
	const uint8_t *m10, *m11, *m12, *other, *b10;

	ck_assert(ctx && a && b);
	pthread_mutex_init(&ctx->lock, NULL);
	tpu_list_init(&ctx->chans);
	*a = (struct tp_chan){ .ctx = ctx, .id = 5, .map = true, .map_read = true };
	*b = (struct tp_chan){ .ctx = ctx, .id = 6, .map = true, .map_read = true };
	tpc_chan_map_open(a);
	tpc_chan_map_open(b);
	m10 = map_one();
	m11 = map_one();
	m12 = map_one();
	other = map_one(); /* memory of the process's own, in no handle */
	b10 = map_one();
	a->maps[0] = (struct chan_map){ .key = 10, .addr = m10, .size = MAP_BYTES, .used = 1 };
	a->maps[1] = (struct chan_map){ .key = 11, .addr = m11, .size = MAP_BYTES, .used = 2 };
	a->maps[2] = (struct chan_map){ .key = 12, .addr = m12, .size = MAP_BYTES, .used = 3,
					.refs = 1 }; /* a copy out of it runs */
	a->n_maps = 3;
	b->maps[0] = (struct chan_map){ .key = 10, .addr = b10, .size = MAP_BYTES, .used = 1 };
	b->n_maps = 1;

	/* hostile values: keys nobody keeps, a handle that is not ours */
	notice(ctx, 5, (uint64_t[]){ 0, UINT64_MAX, 99, 13, (uint64_t)(uintptr_t)other }, 5);
	notice(ctx, 7, (uint64_t[]){ 10, 11, 12 }, 3);
	notice(ctx, 0, (uint64_t[]){ 10 }, 1);
	ck_assert_uint_eq(a->n_maps, 3);
	ck_assert_uint_eq(b->n_maps, 1);
	ck_assert(mapped(m10) && mapped(m11) && mapped(m12) && mapped(other) && mapped(b10));

	/* key 10 twice and key 12 (in use) for handle 5: its 10 goes, not handle 6's */
	notice(ctx, 5, (uint64_t[]){ 10, 10, 12 }, 3);
	ck_assert(!mapped(m10));
	ck_assert(mapped(m11) && mapped(m12) && mapped(other) && mapped(b10));
	ck_assert_uint_eq(a->n_maps, 2);
	ck_assert_uint_eq(b->n_maps, 1);
	/* the one in use stays until its copy ends, but is no longer listed as mapped */
	tpc_chan_map_op(a, &op, keys, &cr);
	ck_assert(op.map_ok);
	ck_assert_uint_eq(op.n_mapped, 1);
	ck_assert_uint_eq(op.mapped[0], 11);
	/* handle 6 released: a notice for it reaches nothing */
	tpc_chan_map_drop(b);
	ck_assert(!mapped(b10));
	notice(ctx, 6, (uint64_t[]){ 10 }, 1);
	ck_assert(mapped(m11) && mapped(m12) && mapped(other));
	/* its release unmaps the rest, the one retired under a copy included */
	a->maps[1].refs = 0; /* (wherever it is now: the copy ended) */
	a->maps[0].refs = 0;
	tpc_chan_map_drop(a);
	ck_assert(!mapped(m11) && !mapped(m12));
	ck_assert(mapped(other));
	ck_assert(tpu_list_empty(&ctx->chans));
	munmap((void *)other, MAP_BYTES);
	pthread_mutex_destroy(&ctx->lock);
	free(a);
	free(b);
	free(ctx);
}
END_TEST

static void released(struct tp_context *ctx, uint64_t chan_id, uint64_t *ids, size_t n)
{
	Tpw__V1__ChanReply m = TPW__V1__CHAN_REPLY__INIT;

	m.chan_id = chan_id;
	m.released = ids;
	m.n_released = n;
	pthread_mutex_lock(&ctx->lock);
	tpc_chan_on_released(ctx, &m);
	pthread_mutex_unlock(&ctx->lock);
}

/* A notice of lent buffers given back (client minor 13) takes out of the handle it names only
 * the buffers that handle lent, each once; the io thread then keeps the handle's own for its
 * next batches and puts a staging pool buffer back into the pool (reused); the handle's
 * release releases what it kept and what is still lent stays for tpc_chan_lent_drop(). */
START_TEST(test_a_released_notice_gives_back_only_the_named_handles_lent_buffers)
{
	struct tp_context *ctx = calloc(1, sizeof(*ctx));
	struct tp_chan *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	struct tpc_buf own1 = { .id = 1, .size = 4096, .chan = true };
	struct tpc_buf own2 = { .id = 2, .size = 4096, .chan = true };
	struct tpc_buf pool3 = { .id = 3, .size = 4096 };
	struct tpc_buf other4 = { .id = 4, .size = 4096, .chan = true };

	ck_assert(ctx && a && b);
	pthread_mutex_init(&ctx->lock, NULL);
	tpu_list_init(&ctx->chans);
	*a = (struct tp_chan){ .ctx = ctx, .id = 5, .map = true };
	*b = (struct tp_chan){ .ctx = ctx, .id = 6 }; /* no mapping: listed all the same */
	tpc_chan_map_open(a);
	tpc_chan_map_open(b);
	a->lent[0] = &own1;
	a->lent[1] = &own2;
	a->n_lent = 2;
	a->lent_bytes = 8192;
	b->lent[0] = &pool3;
	b->lent[1] = &other4;
	b->n_lent = 2;
	b->lent_bytes = 8192;
	n_put = 0;

	/* hostile values: ids the handle did not lend (another handle's), no handle of ours */
	released(ctx, 5, (uint64_t[]){ 0, 3, 4, UINT64_MAX }, 4);
	released(ctx, 7, (uint64_t[]){ 1, 2, 3, 4 }, 4);
	released(ctx, 0, (uint64_t[]){ 1 }, 1);
	ck_assert_uint_eq(a->n_lent, 2);
	ck_assert_uint_eq(b->n_lent, 2);
	ck_assert_uint_eq(ctx->chan_back, 0);
	/* buffer 1 twice for handle 5, buffer 3 for handle 6 */
	released(ctx, 5, (uint64_t[]){ 1, 1 }, 2);
	released(ctx, 6, (uint64_t[]){ 3 }, 1);
	ck_assert_uint_eq(a->n_lent, 1);
	ck_assert_ptr_eq(a->lent[0], &own2);
	ck_assert_uint_eq(a->lent_bytes, 4096);
	ck_assert_uint_eq(a->n_back, 1);
	ck_assert_uint_eq(b->n_lent, 1);
	ck_assert_ptr_eq(b->lent[0], &other4);
	ck_assert_uint_eq(ctx->chan_back, 2);
	tpc_chan_back_run(ctx);
	ck_assert_uint_eq(ctx->chan_back, 0);
	ck_assert_uint_eq(a->n_back + b->n_back, 0);
	ck_assert_uint_eq(a->n_own, 1); /* kept for the handle's next batches */
	ck_assert_ptr_eq(a->own[0], &own1);
	ck_assert_uint_eq(ctx->chan_own, 1);
	ck_assert_uint_eq(n_put, 1); /* the pool buffer, back into the pool to be reused */
	ck_assert(put[0] == &pool3 && put_reuse[0]);
	/* released: the buffer it kept goes, not reused; the one still lent is not touched */
	tpc_chan_map_drop(a);
	ck_assert_uint_eq(n_put, 2);
	ck_assert(put[1] == &own1 && !put_reuse[1]);
	ck_assert_uint_eq(ctx->chan_own, 0);
	released(ctx, 5, (uint64_t[]){ 2 }, 1);
	ck_assert_uint_eq(ctx->chan_back, 0);
	tpc_chan_map_drop(b);
	ck_assert(tpu_list_empty(&ctx->chans));
	pthread_mutex_destroy(&ctx->lock);
	free(a);
	free(b);
	free(ctx);
}
END_TEST

/*
 * A handle's lent buffers and those a notice gave back share CHAN_LENT_MAX slots until the io
 * thread takes the given-back ones: with 8 given back and not yet taken, no 9th buffer is filed
 * as lent (the library then releases it instead of lending it again). Before, the answers of
 * writes sent earlier filed 8 more and a second notice wrote past the 8 slots of @back.
 */
START_TEST(test_lent_and_given_back_buffers_share_their_slots)
{
	struct tp_context *ctx = calloc(1, sizeof(*ctx));
	struct tp_chan *a = calloc(1, sizeof(*a));
	struct tpc_buf bufs[2 * CHAN_LENT_MAX];
	uint64_t ids[2 * CHAN_LENT_MAX];

	ck_assert(ctx && a);
	pthread_mutex_init(&ctx->lock, NULL);
	tpu_list_init(&ctx->chans);
	*a = (struct tp_chan){ .ctx = ctx, .id = 5, .map = true };
	tpc_chan_map_open(a);
	for (unsigned i = 0; i < 2 * CHAN_LENT_MAX; i++) {
		bufs[i] = (struct tpc_buf){ .id = i + 1, .size = 4096, .chan = true };
		ids[i] = i + 1;
	}
	pthread_mutex_lock(&ctx->lock);
	for (unsigned i = 0; i < CHAN_LENT_MAX; i++)
		ck_assert(tpc_chan_lend_file(a, &bufs[i]));
	ck_assert(!tpc_chan_lend_file(a, &bufs[CHAN_LENT_MAX]));
	pthread_mutex_unlock(&ctx->lock);
	released(ctx, 5, ids, CHAN_LENT_MAX);
	ck_assert_uint_eq(a->n_lent, 0);
	ck_assert_uint_eq(a->n_back, CHAN_LENT_MAX);
	/* the io thread has not run: the answers of earlier writes file nothing */
	pthread_mutex_lock(&ctx->lock);
	ck_assert(!tpc_chan_lend_room(a));
	for (unsigned i = CHAN_LENT_MAX; i < 2 * CHAN_LENT_MAX; i++)
		ck_assert(!tpc_chan_lend_file(a, &bufs[i]));
	pthread_mutex_unlock(&ctx->lock);
	released(ctx, 5, ids + CHAN_LENT_MAX, CHAN_LENT_MAX);
	ck_assert_uint_eq(a->n_back, CHAN_LENT_MAX);
	/* lent past the rule (as filed before it): a notice still stops at the last slot */
	pthread_mutex_lock(&ctx->lock);
	for (unsigned i = 0; i < CHAN_LENT_MAX; i++)
		a->lent[i] = &bufs[CHAN_LENT_MAX + i];
	a->n_lent = CHAN_LENT_MAX;
	a->lent_bytes = CHAN_LENT_MAX * 4096;
	pthread_mutex_unlock(&ctx->lock);
	released(ctx, 5, ids + CHAN_LENT_MAX, CHAN_LENT_MAX);
	ck_assert_uint_eq(a->n_back, CHAN_LENT_MAX);
	ck_assert_uint_eq(a->n_lent, CHAN_LENT_MAX);
	/* the io thread takes them back: room again */
	tpc_chan_back_run(ctx);
	ck_assert_uint_eq(a->n_back, 0);
	pthread_mutex_lock(&ctx->lock);
	a->n_lent = 0; /* (the hand-made ones are not the handle's: nobody frees them) */
	a->lent_bytes = 0;
	ck_assert(tpc_chan_lend_room(a));
	pthread_mutex_unlock(&ctx->lock);
	tpc_chan_map_drop(a);
	pthread_mutex_destroy(&ctx->lock);
	free(a);
	free(ctx);
}
END_TEST

static Suite *chanmap_suite(void)
{
	Suite *s = suite_create("chanmap");
	TCase *tc = tcase_create("retired");

	tcase_add_test(tc, test_a_notice_unmaps_only_the_named_handles_listed_keys);
	tcase_add_test(tc, test_a_released_notice_gives_back_only_the_named_handles_lent_buffers);
	tcase_add_test(tc, test_lent_and_given_back_buffers_share_their_slots);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(chanmap_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
