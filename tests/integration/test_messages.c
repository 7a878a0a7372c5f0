/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: message shapes. Messages with no payloads and no tensors, zero-length
 * payloads and tensors, many payloads and tensors per message (64 + 64, mixed sizes across the
 * eager/rendezvous boundary, mixed memory kinds including interior pointers into one shared
 * buffer), metadata on the message and on every payload and tensor, tensor target devices,
 * and streams of inline messages of rising and falling sizes all arrive as written. Each case has its own daemon and two client processes.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include "itest.h"

static bool run(unsigned n_msgs, tpt_spec_fn spec, enum tpt_mem wmem, enum tpt_mem rmem)
{
	struct tpt_xfer x = {
		.d = &tpt_fixture_daemon,
		.name = "shapes",
		.n_msgs = n_msgs,
		.spec = spec,
		.writer_mem = wmem,
		.reader_mem = rmem,
		.timeout_ms = 60000,
	};

	return tpt_xfer_run(&x);
}

/* Message 0: nothing at all. 1: only message metadata. 2: empty then again nothing. */
static void empty_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 2;
	s->index = index;
	s->meta_len = index == 1 ? 100 : 0;
}

START_TEST(test_messages_without_payloads_or_tensors_arrive)
{
	ck_assert(run(3, empty_spec, TPT_MEM_PRIVATE, TPT_MEM_PRIVATE));
}
END_TEST

/* Zero-length segments, alone and among non-empty ones. */
static void zero_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 3;
	s->index = index;
	switch (index) {
	case 0: /* one empty payload */
		s->n_payloads = 1;
		break;
	case 1: /* one empty tensor */
		s->n_tensors = 1;
		break;
	case 2: /* three empty payloads, two empty tensors, with metadata */
		s->n_payloads = 3;
		s->n_tensors = 2;
		s->seg_meta_len = 5;
		break;
	default: /* empty segments between large ones */
		s->n_payloads = 3;
		s->n_tensors = 3;
		s->lens[1] = 100;
		s->lens[3] = 1u << 20;
		s->lens[5] = 7;
		break;
	}
}

START_TEST(test_messages_zero_length_segments_arrive)
{
	static const enum tpt_mem m[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM, TPT_MEM_MIXED };

	ck_assert_msg(run(4, zero_spec, m[_i % 3], m[(_i + 1) % 3]), "writer %s, reader %s",
		      tpt_mem_name(m[_i % 3]), tpt_mem_name(m[(_i + 1) % 3]));
}
END_TEST

/* 64 payloads + 64 tensors of sizes from 0 to 256 KiB, some around the 64 KiB eager limit. */
static void many_spec(unsigned index, struct tpt_msg_spec *s)
{
	static const size_t pick[] = { 0, 1, 3, 100, 4095, 4096, 4097, 65535, 65536, 65537,
				       100000, 262144 };

	s->pipe = 4;
	s->index = index;
	s->n_payloads = 64;
	s->n_tensors = 64;
	s->meta_len = 1000;
	s->seg_meta_len = 24;
	for (size_t k = 0; k < 128; k++)
		s->lens[k] = pick[(k * 7 + index) % (sizeof(pick) / sizeof(pick[0]))];
}

START_TEST(test_messages_many_payloads_and_tensors_arrive)
{
	static const enum tpt_mem w[] = { TPT_MEM_MIXED, TPT_MEM_SLAB, TPT_MEM_PRIVATE };
	static const enum tpt_mem r[] = { TPT_MEM_MIXED, TPT_MEM_PRIVATE, TPT_MEM_SLAB };

	ck_assert_msg(run(3, many_spec, w[_i], r[_i]), "writer %s, reader %s",
		      tpt_mem_name(w[_i]), tpt_mem_name(r[_i]));
}
END_TEST

/* Only small data: every message may travel eagerly; metadata of many sizes. */
static void small_spec(unsigned index, struct tpt_msg_spec *s)
{
	static const size_t meta[] = { 0, 1, 255, 256, 4096, 65536 };

	s->pipe = 5;
	s->index = index;
	s->n_payloads = 2;
	s->n_tensors = 2;
	s->meta_len = meta[index % 6];
	s->seg_meta_len = meta[(index + 3) % 6];
	s->lens[0] = 10;
	s->lens[1] = 0;
	s->lens[2] = 4000;
	s->lens[3] = index;
}

START_TEST(test_messages_metadata_round_trips)
{
	ck_assert(run(12, small_spec, TPT_MEM_PRIVATE, TPT_MEM_SHM));
}
END_TEST

/* Tensors that ask for a CUDA device on the reader: the wish reaches the descriptor. */
static void target_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 6;
	s->index = index;
	s->n_tensors = 2;
	s->lens[0] = 1000;
	s->lens[1] = 300000;
	s->tensor_target = true;
}

START_TEST(test_messages_tensor_target_reaches_reader)
{
	ck_assert(run(2, target_spec, TPT_MEM_SHM, TPT_MEM_PRIVATE));
}
END_TEST

/* Sizes just around the eager and inline thresholds of the library and daemon. */
static void edge_spec(unsigned index, struct tpt_msg_spec *s)
{
	static const size_t e[] = { 4095, 4096, 4097, 65535, 65536, 65537, (1u << 20) - 1,
				    1u << 20, (1u << 20) + 1 };

	s->pipe = 7;
	s->index = index;
	s->n_payloads = 1;
	s->lens[0] = e[index % 9];
}

START_TEST(test_messages_sizes_at_eager_and_inline_edges_arrive)
{
	static const enum tpt_mem m[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM };

	ck_assert(run(9, edge_spec, m[_i / 2], m[_i % 2]));
}
END_TEST

/* Inline messages whose sizes rise and fall between 16 KiB and the eager limit: the reader's
 * library reuses the blocks of read messages for later ones (larger blocks for smaller
 * messages, too small ones given up), and every byte of every message must be its own. */
static void reuse_spec(unsigned index, struct tpt_msg_spec *s)
{
	static const size_t e[] = { 65536, 16384, 40000, 65535, 20000, 16385, 65536, 49152, 17000,
				    30000, 64000, 16384, 65536 };

	s->pipe = 8;
	s->index = index;
	s->n_payloads = index % 3 == 2 ? 2 : 1;
	s->lens[0] = e[index % 13] / s->n_payloads;
	s->lens[1] = e[index % 13] - s->lens[0];
	s->meta_len = index % 5;
}

START_TEST(test_messages_inline_blocks_reused_keep_each_messages_bytes)
{
	static const enum tpt_mem m[] = { TPT_MEM_PRIVATE, TPT_MEM_SHM };

	ck_assert(run(300, reuse_spec, m[_i], TPT_MEM_PRIVATE));
}
END_TEST

static Suite *messages_suite(void)
{
	Suite *s = suite_create("messages");
	TCase *tc = tcase_create("shapes");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_test(tc, test_messages_without_payloads_or_tensors_arrive);
	tcase_add_loop_test(tc, test_messages_zero_length_segments_arrive, 0, 3);
	tcase_add_loop_test(tc, test_messages_many_payloads_and_tensors_arrive, 0, 3);
	tcase_add_test(tc, test_messages_metadata_round_trips);
	tcase_add_test(tc, test_messages_tensor_target_reaches_reader);
	tcase_add_loop_test(tc, test_messages_sizes_at_eager_and_inline_edges_arrive, 0, 4);
	tcase_add_loop_test(tc, test_messages_inline_blocks_reused_keep_each_messages_bytes, 0, 2);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(messages_suite());
}
