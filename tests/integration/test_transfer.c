/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: data of every size class (0 B, 1 B, 4 KiB, 1 MiB, 64 MiB, 256 MiB) moves
 * between two client processes through a real tpipd with its contents intact, for each pairing
 * of writer and reader memory (shared buffer from tp_buffer_alloc or private malloc memory),
 * and through the staging path when cross-memory attach is off (TP_CONTEXT_NO_CMA on either or
 * both ends). Every case starts its own daemon (checked fixture) and forks a reader and a
 * writer; the writer sends one message with a single tensor of the size, then one with a single
 * payload of the size, and the reader checks lengths, metadata and every byte.
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include "itest.h"

static const size_t sizes[] = { 0, 1, 4096, 1u << 20, 64u << 20, 256u << 20 };
static const enum tpt_mem mems[] = { TPT_MEM_SHM, TPT_MEM_PRIVATE };

#define N_SIZES (sizeof(sizes) / sizeof(sizes[0]))

/* The size under test; set before the children fork, read by their spec function. */
static size_t cur_size;

static void size_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 1;
	s->index = index;
	if (index == 0) {
		s->n_tensors = 1;
	} else {
		s->n_payloads = 1;
		s->meta_len = 8;
		s->seg_meta_len = 16;
	}
	s->lens[0] = cur_size;
}

static bool run_sizes(size_t size, enum tpt_mem wmem, enum tpt_mem rmem, uint32_t wflags,
		      uint32_t rflags)
{
	struct tpt_xfer x = {
		.d = &tpt_fixture_daemon,
		.name = "xfer",
		.n_msgs = 2,
		.spec = size_spec,
		.writer_mem = wmem,
		.reader_mem = rmem,
		.writer_flags = wflags,
		.reader_flags = rflags,
		.timeout_ms = 100000,
	};
	uint64_t t0 = tpt_now_ms();
	bool ok;

	cur_size = size;
	ok = tpt_xfer_run(&x);
	printf("%zu bytes, writer %s%s, reader %s%s: %s in %llu ms\n", size, tpt_mem_name(wmem),
	       wflags & TP_CONTEXT_NO_CMA ? " (no cma)" : "", tpt_mem_name(rmem),
	       rflags & TP_CONTEXT_NO_CMA ? " (no cma)" : "", ok ? "ok" : "FAILED",
	       (unsigned long long)(tpt_now_ms() - t0));
	return ok;
}

/* _i: size index * 4 + writer memory * 2 + reader memory. */
START_TEST(test_transfer_sizes_arrive_intact)
{
	size_t size = sizes[_i / 4];
	enum tpt_mem wmem = mems[(_i / 2) % 2], rmem = mems[_i % 2];

	ck_assert_msg(run_sizes(size, wmem, rmem, 0, 0), "%zu bytes, %s -> %s", size,
		      tpt_mem_name(wmem), tpt_mem_name(rmem));
	ck_assert_msg(tpt_daemon_alive(&tpt_fixture_daemon), "tpipd died");
}
END_TEST

/* Staging through shared buffers when CMA is off: _i picks size and which ends refuse CMA. */
START_TEST(test_transfer_without_cma_stages_private_memory)
{
	static const size_t stage_sizes[] = { 1u << 20, 64u << 20 };
	static const uint32_t flags[][2] = {
		{ TP_CONTEXT_NO_CMA, TP_CONTEXT_NO_CMA },
		{ TP_CONTEXT_NO_CMA, 0 },
		{ 0, TP_CONTEXT_NO_CMA },
	};
	size_t size = stage_sizes[_i / 3];
	const uint32_t *f = flags[_i % 3];

	ck_assert_msg(run_sizes(size, TPT_MEM_PRIVATE, TPT_MEM_PRIVATE, f[0], f[1]),
		      "%zu bytes, no-cma writer %d reader %d", size, !!f[0], !!f[1]);
}
END_TEST

START_TEST(test_transfer_without_cma_reaches_shared_buffers)
{
	/* NO_CMA on both ends, shared memory on one: no staging needed on that side. */
	ck_assert(run_sizes(64u << 20, TPT_MEM_SHM, TPT_MEM_PRIVATE, TP_CONTEXT_NO_CMA,
			    TP_CONTEXT_NO_CMA));
	ck_assert(run_sizes(64u << 20, TPT_MEM_PRIVATE, TPT_MEM_SHM, TP_CONTEXT_NO_CMA,
			    TP_CONTEXT_NO_CMA));
}
END_TEST

START_TEST(test_transfer_daemon_without_cma_still_moves_private_memory)
{
	const char *args[] = { "--no-cma", NULL };

	/* This case runs its own daemon with CMA disabled on the daemon side. */
	ck_assert_int_eq(tpt_daemon_stop(&tpt_fixture_daemon), 0);
	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert(run_sizes(1u << 20, TPT_MEM_PRIVATE, TPT_MEM_PRIVATE, 0, 0));
	ck_assert(run_sizes(64u << 20, TPT_MEM_PRIVATE, TPT_MEM_SHM, 0, 0));
}
END_TEST

static Suite *transfer_suite(void)
{
	Suite *s = suite_create("transfer");
	TCase *sz = tcase_create("sizes");
	TCase *nc = tcase_create("no-cma");

	tcase_add_checked_fixture(sz, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_loop_test(sz, test_transfer_sizes_arrive_intact, 0, (int)N_SIZES * 4);
	tcase_set_timeout(sz, 200);
	suite_add_tcase(s, sz);

	tcase_add_checked_fixture(nc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_loop_test(nc, test_transfer_without_cma_stages_private_memory, 0, 6);
	tcase_add_test(nc, test_transfer_without_cma_reaches_shared_buffers);
	tcase_add_test(nc, test_transfer_daemon_without_cma_still_moves_private_memory);
	tcase_set_timeout(nc, 200);
	suite_add_tcase(s, nc);
	return s;
}

int main(void)
{
	return tpt_run_suite(transfer_suite());
}
