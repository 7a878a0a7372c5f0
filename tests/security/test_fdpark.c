/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: fds a client makes the daemon hold outside its handlers ("parked" fds). A
 * client may send fds ahead of the frames that announce them: up to 16 on a ring session (fds
 * travel on the socket, frames in the ring) and up to 4 behind a partial frame on a socket
 * session. Each is a slot of the daemon's fd table, and a user with many sessions could
 * otherwise fill it and make accept, pidfd and link opens fail for everyone. They are charged
 * to the uid as kept fds: at most kept-fds-per-uid plus 24 in flight per uid, kept-fds-max
 * plus 24 for all. An attacker (uid 65534) parks fds on five sessions up to the limit (all
 * kept), one more fd on a sixth session fails that session only, with a log line; a victim
 * (uid 4242) still connects and registers a buffer, and every charge goes when the sessions
 * end. Needs root (to run clients as other uids).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <json-c/json.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <unistd.h>
#include "frame.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 20000
#define NOBODY 65534
#define VICTIM 4242
#define IN_FLIGHT 24	   /* TPD_QUOTA_FDS_IN_FLIGHT */
#define KEPT 8		   /* --kept-fds-per-uid, or --kept-fds-max */
#define LIMIT (KEPT + IN_FLIGHT) /* fds one uid (or all) may have parked */
#define SOCKETS 4	   /* socket sessions, 4 fds each behind a partial frame */
#define RING_FDS (LIMIT - 4 * SOCKETS) /* on one ring session, ahead of any frame */

static struct tpt_daemon dm;

static bool skip_unless_root(void)
{
	if (geteuid() == 0)
		return false;
	printf("skipped: needs root to run clients as other uids\n");
	return true;
}

/* `tpipctl --json status` field @key (as root: daemon-wide), or -1. */
static long status_field(const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", dm.socket, "--json", "status", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *v;
	long n = -1;

	if (!bin || tpt_run(argv, T_MS, &res) < 0)
		return -1;
	o = json_tokener_parse(res.out);
	if (o && json_object_object_get_ex(o, key, &v))
		n = (long)json_object_get_int64(v);
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return n;
}

/* Waits until the daemon's status says @want fds kept. Return: true if it did. */
static bool kept_reaches(long want)
{
	uint64_t end = tpt_now_ms() + T_MS;
	long n = -1;

	for (unsigned i = 0; tpt_now_ms() < end; i++) {
		n = status_field("kept_fds");
		if (n == want)
			return true;
		tpt_backoff(i);
	}
	tpt_log("kept_fds is %ld, not %ld", n, want);
	return false;
}

/* @n fresh fds (of /dev/null) in @fds. Return: 0 or 1. */
static int some_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++) {
		fds[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		TPT_REQUIRE(fds[i] >= 0, 1, "open");
	}
	return 0;
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		close(fds[i]);
}

/* A socket session with Hello that sends the header of a frame announcing @nfds fds, with
 * them, and no more of it. Return: 0 or 1. */
static int park_partial(struct tpt_raw *raw, unsigned nfds)
{
	struct tpw_hdr h = { TPW_MAGIC, TPW_WIRE_VERSION, (uint16_t)nfds, 100, 0, 0 };
	uint8_t hb[TPW_HDR_SIZE];
	int fds[TPW_FDS_MAX];

	TPT_REQUIRE(nfds <= TPW_FDS_MAX, 1, "%u fds", nfds);
	TPT_REQUIRE(tpt_raw_connect(raw, dm.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	if (some_fds(fds, nfds))
		return 1;
	h.seq = ++raw->seq;
	tpw_hdr_pack(&h, hb);
	TPT_REQUIRE(tpt_raw_send_bytes(raw, hb, sizeof(hb), fds, nfds) == 0, 1, "send");
	close_fds(fds, nfds);
	return 0;
}

/* A ring session that sends @nfds fds on its socket (4 a doorbell byte), and no frame that
 * announces them. Return: 0 or 1. */
static int park_ring(struct tpt_raw *raw, struct tpt_raw_ring *g, unsigned nfds)
{
	Tpw__V1__DaemonMsg *rep = NULL;
	static const uint8_t bell;
	int fds[4];
	bool ok;

	TPT_REQUIRE(tpt_raw_connect(raw, dm.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	TPT_REQUIRE(tpt_raw_ring_new(g, TPU_RING_MIN) == 0, 1, "ring");
	TPT_REQUIRE(tpt_raw_ring_setup(raw, 1, TPU_RING_MIN, g->fd, T_MS, &rep) == 0, 1, "setup");
	ok = rep->reply->status == TPW__V1__STATUS__STATUS_OK;
	tpw_daemon_msg_free(rep);
	TPT_REQUIRE(ok, 1, "ring refused");
	for (unsigned done = 0; done < nfds; done += 4) {
		unsigned n = nfds - done < 4 ? nfds - done : 4;

		if (some_fds(fds, n))
			return 1;
		TPT_REQUIRE(tpt_raw_send_bytes(raw, &bell, 1, fds, n) == 0, 1, "send fds");
		close_fds(fds, n);
	}
	return 0;
}

struct attack {
	struct tpt_sync parked; /* to the parent: fds parked up to the limit, then: refused */
	struct tpt_sync go;	/* to the attacker: go on */
};

/*
 * As nobody: parks LIMIT fds (RING_FDS on a ring session, 4 on each of SOCKETS socket
 * sessions), waits, then parks one more on another socket session, which must be closed while
 * the others stay; waits again, then closes them all.
 */
static int attacker(void *arg)
{
	struct attack *a = arg;
	struct tpt_raw raw[SOCKETS + 2];
	struct tpt_raw_ring g;

	if (tpt_become_user(NOBODY) || park_ring(&raw[0], &g, RING_FDS))
		return 1;
	for (unsigned i = 1; i <= SOCKETS; i++)
		if (park_partial(&raw[i], 4))
			return 1;
	TPT_REQUIRE(tpt_sync_post(&a->parked, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&a->go, T_MS * 2) == 0, 1, "no word from the parent");
	if (park_partial(&raw[SOCKETS + 1], 1))
		return 1;
	TPT_REQUIRE(tpt_raw_wait_closed(&raw[SOCKETS + 1], T_MS) == 0, 1,
		    "a session parking fds above the limit was kept");
	for (unsigned i = 0; i <= SOCKETS; i++)
		TPT_REQUIRE(tpt_raw_wait_closed(&raw[i], i ? 50 : 300) == -ETIMEDOUT, 1,
			    "session %u within the limit was closed", i);
	TPT_REQUIRE(tpt_sync_post(&a->parked, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_sync_wait(&a->go, T_MS * 2) == 0, 1, "no word from the parent");
	for (unsigned i = 0; i < SOCKETS + 2; i++)
		tpt_raw_close(&raw[i]);
	tpt_raw_ring_free(&g);
	return 0;
}

/* As the victim: a session, and a buffer registered with its fd (as the library does). */
static int victim(void *unused)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw raw;
	int fd, e;
	bool ok;

	(void)unused;
	if (tpt_become_user(VICTIM))
		return 1;
	TPT_REQUIRE(tpt_raw_connect(&raw, dm.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	fd = memfd_create("victim", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	TPT_REQUIRE(fd >= 0 && ftruncate(fd, 1 << 20) == 0 &&
			    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "memfd");
	br.req_id = 7;
	br.buf_id = 1;
	br.gen = 1;
	br.size = 1 << 20;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	TPT_REQUIRE(tpt_raw_send(&raw, &m, NULL, 0, &fd, 1, 1) == 0, 1, "register");
	close(fd);
	e = tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep);
	TPT_REQUIRE(e == 0, 1, "no answer to the registration: %d", e);
	ok = rep->reply->req_id == 7 && rep->reply->status == TPW__V1__STATUS__STATUS_OK;
	if (!ok)
		tpt_log("registration refused: %s", rep->reply->message ? rep->reply->message : "-");
	tpw_daemon_msg_free(rep);
	TPT_REQUIRE(ok, 1, "the victim could not register a buffer");
	tpt_raw_close(&raw);
	return 0;
}

/* The attack against a daemon started with @args: refused saying @needle. */
static void run_attack(const char *const *args, const char *needle)
{
	struct attack a;
	int fds0;
	pid_t pid;

	if (skip_unless_root())
		return;
	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dm), 0);
	fds0 = tpt_daemon_fd_settle(&dm, 200, T_MS);
	ck_assert_int_gt(fds0, 0);
	ck_assert_int_eq(tpt_sync_init(&a.parked), 0);
	ck_assert_int_eq(tpt_sync_init(&a.go), 0);
	pid = tpt_fork(attacker, &a);
	ck_assert_int_eq(tpt_sync_wait(&a.parked, T_MS * 2), 0);
	/* just at the limit: every parked fd is held, and charged */
	ck_assert(kept_reaches(LIMIT));
	ck_assert(!tpt_daemon_log_has(&dm, needle));
	ck_assert_int_eq(tpt_sync_post(&a.go, 0), 0);
	/* just above it: the sixth session is failed, the others kept, one log line */
	ck_assert_int_eq(tpt_sync_wait(&a.parked, T_MS * 2), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, needle, T_MS, NULL, 0), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&dm, needle), 1);
	ck_assert(kept_reaches(LIMIT));
	ck_assert_int_ge(status_field("kept_fds_refused"), 1);
	ck_assert_int_ge(status_field("parked_fds_refused"), 1);
	/* the daemon holds no more than that, and another user still gets in */
	ck_assert_int_le(tpt_daemon_fd_count(&dm), fds0 + LIMIT + 3 * (SOCKETS + 1) + 8);
	ck_assert(tpt_wait_ok(tpt_fork(victim, NULL), T_MS * 2, "victim"));
	ck_assert_int_eq(tpt_sync_post(&a.go, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS * 2, "attacker"));
	/* sessions that died with parked fds gave back every charge and every fd */
	ck_assert(kept_reaches(0));
	ck_assert_int_ge(tpt_daemon_wait_fds(&dm, fds0, T_MS), 0);
	tpt_sync_done(&a.parked);
	tpt_sync_done(&a.go);
	ck_assert(tpt_daemon_alive(&dm));
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
}

START_TEST(test_fdpark_parked_fds_bounded_per_uid)
{
	const char *args[] = { "--kept-fds-per-uid", "8", NULL };

	run_attack(args, "uid 65534 holds 32 fds in the daemon, its limit");
}
END_TEST

START_TEST(test_fdpark_parked_fds_bounded_daemon_wide)
{
	const char *args[] = { "--kept-fds-per-uid", "1000", "--kept-fds-max", "8", NULL };

	run_attack(args, "the daemon holds 32 fds for clients, its limit");
}
END_TEST

static Suite *fdpark_suite(void)
{
	Suite *s = suite_create("sec_fdpark");
	TCase *tc = tcase_create("parked");

	tcase_add_test(tc, test_fdpark_parked_fds_bounded_per_uid);
	tcase_add_test(tc, test_fdpark_parked_fds_bounded_daemon_wide);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(fdpark_suite());
}
