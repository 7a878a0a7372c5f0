/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Shared harness of the control-ring suites. See ring_common.h.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "ring_common.h"

struct tpt_daemon ring_dmn;
struct tpt_sync ring_ready, ring_done, ring_st_a, ring_st_b, ring_release, ring_gate;
static int fd_baseline;

void ring_up(const char *const *args)
{
	ck_assert_int_eq(tpt_daemon_start(&ring_dmn, args), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_done), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_st_a), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_st_b), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_release), 0);
	ck_assert_int_eq(tpt_sync_init(&ring_gate), 0);
	fd_baseline = tpt_daemon_fd_settle(&ring_dmn, 200, 5000);
	ck_assert_int_gt(fd_baseline, 0);
}

void ring_down(void)
{
	tpt_sync_done(&ring_ready);
	tpt_sync_done(&ring_done);
	tpt_sync_done(&ring_st_a);
	tpt_sync_done(&ring_st_b);
	tpt_sync_done(&ring_release);
	tpt_sync_done(&ring_gate);
	ck_assert_int_eq(tpt_daemon_stop(&ring_dmn), 0);
}

void ring_up_default(void)
{
	ring_up(NULL);
}

/* Mappings of client ring memfds in the daemon ("memfd:tpipd-ring"). */
static int ring_maps(void)
{
	char path[64], line[512];
	int n = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/maps", (int)ring_dmn.pid);
	f = fopen(path, "re");
	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, "tpipd-ring") != NULL;
	fclose(f);
	return n;
}

/* The daemon is up, holds no ring mapping and gets back to its fd baseline. */
void ring_check_nothing_left(void)
{
	uint64_t deadline = tpt_now_ms() + 10000;
	int n;

	ck_assert_msg(tpt_daemon_alive(&ring_dmn), "tpipd died");
	for (unsigned i = 0; (n = ring_maps()) != 0; i++) {
		ck_assert_msg(tpt_now_ms() < deadline, "tpipd still maps %d client rings", n);
		tpt_backoff(i);
	}
	n = tpt_daemon_wait_fds(&ring_dmn, fd_baseline, 10000);
	ck_assert_msg(n >= 0, "tpipd fds did not return to the baseline of %d", fd_baseline);
}

static void probe_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = 50;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->lens[0] = 60000 + index;
	s->lens[1] = (1u << 20) + index;
}

/* A new pair of (ring) clients transfers on this daemon. */
void ring_check_daemon_serves(const char *name)
{
	struct tpt_xfer x = {
		.d = &ring_dmn,
		.name = name,
		.n_msgs = 4,
		.spec = probe_spec,
		.writer_mem = TPT_MEM_PRIVATE,
		.reader_mem = TPT_MEM_SHM,
		.timeout_ms = T_MS,
	};

	ck_assert_msg(tpt_daemon_alive(&ring_dmn), "tpipd died");
	ck_assert_msg(tpt_xfer_run(&x), "a new pair of clients cannot transfer");
}

void ring_wait_log(const char *needle)
{
	char line[512];
	int r = tpt_daemon_wait_log(&ring_dmn, needle, 10000, line, sizeof(line));

	if (r < 0)
		tpt_daemon_dump_log(&ring_dmn);
	ck_assert_msg(r == 0, "the daemon never logged '%s' (%d)", needle, r);
}

int ring_ctx_open(const struct ring_cl *c, const char *name, struct tp_context **ret)
{
	struct tp_context_options o = {
		.size = sizeof(o),
		.socket_path = ring_dmn.socket,
		.name = name,
		.flags = c->flags,
		.ring_bytes = c->ring_bytes,
		.spin_us = c->spin_us,
		.eager_max = c->eager_max,
	};
	int r = tp_context_new(&o, ret);

	TPT_REQUIRE(r == 0, r, "%s: context: %d %s", name, r, tp_last_error());
	return 0;
}

int ring_raw_open(struct tpt_raw *raw, struct tpt_raw_ring *g, uint32_t size)
{
	Tpw__V1__DaemonMsg *rep = NULL;
	int r = tpt_raw_connect(raw, ring_dmn.socket);

	TPT_REQUIRE(r == 0, r, "connect: %d", r);
	r = tpt_raw_hello(raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS);
	TPT_REQUIRE(r == 0, r, "hello: %d", r);
	r = tpt_raw_ring_new(g, size);
	TPT_REQUIRE(r == 0, r, "ring: %d", r);
	r = tpt_raw_ring_setup(raw, 1, size, g->fd, T_MS, &rep);
	TPT_REQUIRE(r == 0, r, "ring setup: %d", r);
	r = rep->reply->status == TPW__V1__STATUS__STATUS_OK ? 0 : -EPROTO;
	if (r)
		tpt_log("ring setup: status %d (%s)", rep->reply->status, rep->reply->message);
	tpw_daemon_msg_free(rep);
	return r;
}

void ring_raw_close(struct tpt_raw *raw, struct tpt_raw_ring *g)
{
	tpt_raw_close(raw);
	tpt_raw_ring_free(g);
}

