/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: exhaustion of the daemon by a local user (issue 21, items 6 and 7). An
 * attacker (uid 65534) tries to take every session slot, park sessions without Hello, park big
 * partial frames, and fill a listener's pipe table by connecting and closing; each is refused at
 * its limit with a clear error (a HelloReply saying why, a closed session) and a rate-limited log
 * line, while a victim user (uid 4242) and root still get in. Each limit is tried just at it
 * (accepted) and just above (refused). Needs root (to run clients as other uids).
 */
#include <check.h>
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <json-c/json.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include "frame.h"
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 20000
#define NOBODY 65534
#define VICTIM 4242

static struct tpt_daemon dm;

static void start(const char *const *args)
{
	ck_assert_int_eq(tpt_daemon_start(&dm, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dm), 0);
}

static void stop(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&dm), 0);
}

static bool skip_unless_root(void)
{
	if (geteuid() == 0)
		return false;
	printf("skipped: needs root to run clients as other uids\n");
	return true;
}

/* Lines of the daemon's log holding @needle. */
static unsigned log_count(const char *needle)
{
	char line[2048];
	unsigned n = 0;
	FILE *f = fopen(dm.log, "re");

	if (!f)
		return 0;
	while (fgets(line, sizeof(line), f))
		n += strstr(line, needle) != NULL;
	fclose(f);
	return n;
}

/*
 * Connects without saying Hello and waits for the daemon's refusal. Return: 0 if a HelloReply
 * with STATUS_LIMIT whose message holds @needle came and the connection closed; 1 otherwise.
 */
static int expect_refused(const char *needle)
{
	Tpw__V1__DaemonMsg *m = NULL;
	struct tpt_raw r;
	int e;

	TPT_REQUIRE(tpt_raw_connect(&r, dm.socket) == 0, 1, "connect");
	e = tpt_raw_recv(&r, T_MS, &m, NULL, NULL);
	TPT_REQUIRE(e == 0, 1, "no refusal: %d", e);
	e = m->body_case == TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY &&
	    m->hello_reply->status == TPW__V1__STATUS__STATUS_LIMIT && m->hello_reply->message &&
	    strstr(m->hello_reply->message, needle);
	if (!e)
		tpt_log("unexpected answer (type %d, %s)", (int)m->body_case,
			m->body_case == TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY &&
					m->hello_reply->message
				? m->hello_reply->message
				: "-");
	tpw_daemon_msg_free(m);
	TPT_REQUIRE(e, 1, "refusal does not say '%s'", needle);
	TPT_REQUIRE(tpt_raw_wait_closed(&r, T_MS) == 0, 1, "refused session kept open");
	tpt_raw_close(&r);
	return 0;
}

/* Opens @n sessions with Hello into @raw. Return: 0 or 1. */
static int open_sessions(struct tpt_raw *raw, unsigned n, Tpw__V1__Role role)
{
	for (unsigned i = 0; i < n; i++) {
		int e;

		TPT_REQUIRE(tpt_raw_connect(&raw[i], dm.socket) == 0, 1, "connect %u", i);
		e = tpt_raw_hello(&raw[i], role, T_MS);
		TPT_REQUIRE(e == 0, 1, "session %u of %u refused: %d", i + 1, n, e);
	}
	return 0;
}

static void close_sessions(struct tpt_raw *raw, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		tpt_raw_close(&raw[i]);
}

/* ---- sessions per uid ------------------------------------------------------------------------ */

#define PER_UID 4

/* As nobody: PER_UID sessions attach, every further one is refused saying why. */
static int per_uid_attacker(void *arg)
{
	struct tpt_raw raw[PER_UID];

	if (tpt_become_user(NOBODY) || open_sessions(raw, PER_UID, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	for (int i = 0; i < 20; i++)
		if (expect_refused("per uid"))
			return 1;
	/* what a libtpclient user sees */
	for (int i = 0; i < 20; i++) {
		struct tp_context *ctx = NULL;
		int e = tpt_ctx_new(&dm, 0, "one-too-many", &ctx);

		TPT_REQUIRE(e == -ENOBUFS, 1, "context over the quota: %d %s", e, tp_last_error());
		TPT_REQUIRE(strstr(tp_last_error(), "session limit of 4 per uid reached for uid 65534"),
			    1, "error: %s", tp_last_error());
		/* the error names the option that sets the limit */
		TPT_REQUIRE(strstr(tp_last_error(), "tpipd --sessions-per-uid"), 1, "error: %s",
			    tp_last_error());
	}
	/* the slot of a session that ends is free again */
	tpt_raw_close(&raw[0]);
	for (unsigned round = 0;; round++) {
		int e;

		TPT_REQUIRE(tpt_raw_connect(&raw[0], dm.socket) == 0, 1, "connect");
		e = tpt_raw_hello(&raw[0], TPW__V1__ROLE__ROLE_CLIENT, T_MS);
		if (e == 0)
			break;
		TPT_REQUIRE(round < 200, 1, "slot not given back: %d", e);
		tpt_raw_close(&raw[0]);
		tpt_backoff(round);
	}
	close_sessions(raw, PER_UID);
	return 0;
}

/* As the victim: still attaches while nobody holds its whole quota. */
static int per_uid_victim(void *arg)
{
	struct tpt_raw raw[PER_UID];

	if (tpt_become_user(VICTIM) || open_sessions(raw, PER_UID, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	close_sessions(raw, PER_UID);
	return 0;
}

START_TEST(test_limits_sessions_per_uid_at_limit_pass_above_refused_and_logged_once)
{
	const char *args[] = { "--sessions-per-uid", "4", NULL };
	struct tpt_raw raw[PER_UID + 1];

	if (skip_unless_root())
		return;
	start(args);
	ck_assert(tpt_wait_ok(tpt_fork(per_uid_attacker, NULL), T_MS * 4, "attacker"));
	ck_assert(tpt_wait_ok(tpt_fork(per_uid_victim, NULL), T_MS, "victim"));
	/* root is exempt from the per-uid quota */
	ck_assert_int_eq(open_sessions(raw, PER_UID + 1, TPW__V1__ROLE__ROLE_CONTROL), 0);
	close_sessions(raw, PER_UID + 1);
	/* 41 refusals in a second or two: a line or two, not 41 */
	ck_assert_uint_ge(log_count("per uid reached for uid 65534"), 1);
	ck_assert_uint_le(log_count("per uid reached for uid 65534"), 3);
	stop();
}
END_TEST

/* As nobody: holds its PER_UID sessions and is refused as fast as it can for 2 s (says when it
 * starts on @arg's sync). */
static int refusal_flooder(void *arg)
{
	struct tpt_raw raw[PER_UID];
	uint64_t end;

	if (tpt_become_user(NOBODY) || open_sessions(raw, PER_UID, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	tpt_sync_post((struct tpt_sync *)arg, 1);
	for (end = tpt_now_ms() + 2000; tpt_now_ms() < end;)
		if (expect_refused("per uid"))
			return 1;
	close_sessions(raw, PER_UID);
	return 0;
}

/* As the victim, once the flood runs: its own PER_UID sessions, then one refused. */
static int refused_victim(void *arg)
{
	struct tpt_raw raw[PER_UID];

	if (tpt_become_user(VICTIM) || open_sessions(raw, PER_UID, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	if (expect_refused("per uid reached for uid 4242"))
		return 1;
	close_sessions(raw, PER_UID);
	return 0;
}

/*
 * Nobody, over its session limit, is refused as fast as it can connect; the victim's one
 * refusal meanwhile is still logged, and nobody's take a line a second. One line a second for
 * all uids together used to go to the flood: the victim's refusal was never logged.
 */
START_TEST(test_limits_one_users_refusals_do_not_hide_anothers_from_the_log)
{
	const char *args[] = { "--sessions-per-uid", "4", NULL };
	struct tpt_sync go;
	pid_t flood;

	if (skip_unless_root())
		return;
	start(args);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	flood = tpt_fork(refusal_flooder, &go);
	ck_assert_int_eq(tpt_sync_wait(&go, T_MS), 1);
	usleep(300 * 1000); /* the flood's first line is out: it would take the shared one */
	ck_assert(tpt_wait_ok(tpt_fork(refused_victim, NULL), T_MS, "victim"));
	ck_assert(tpt_wait_ok(flood, T_MS * 2, "flood"));
	ck_assert_msg(log_count("per uid reached for uid 4242") == 1,
		      "the victim's refusal was logged %u times",
		      log_count("per uid reached for uid 4242"));
	ck_assert_uint_ge(log_count("per uid reached for uid 65534"), 1);
	ck_assert_uint_le(log_count("per uid reached for uid 65534"), 4);
	tpt_sync_done(&go);
	stop();
}
END_TEST

/* ---- slots reserved for root and admins ------------------------------------------------------ */

#define SLOTS 8
#define RESERVED 2

static int reserved_attacker(void *arg)
{
	struct tpt_raw raw[SLOTS - RESERVED];

	if (tpt_become_user(NOBODY) || open_sessions(raw, SLOTS - RESERVED, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	if (expect_refused("kept for root and the admin group"))
		return 1;
	/* hold them until the parent is done */
	TPT_REQUIRE(tpt_sync_wait((struct tpt_sync *)arg, T_MS * 2) == 0, 1, "no word from parent");
	close_sessions(raw, SLOTS - RESERVED);
	return 0;
}

START_TEST(test_limits_reserved_slots_keep_root_in_when_a_user_fills_the_table)
{
	const char *args[] = { "--sessions-max", "8", "--sessions-reserved", "2", NULL };
	struct tpt_raw raw[RESERVED];
	struct tpt_sync done;
	pid_t pid;

	if (skip_unless_root())
		return;
	start(args);
	ck_assert_int_eq(tpt_sync_init(&done), 0);
	pid = tpt_fork(reserved_attacker, &done);
	/* wait until the attacker holds its 6 sessions and was refused a 7th */
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "kept for root", T_MS, NULL, 0), 0);
	/* root's tpipctl-like sessions take the 2 reserved slots; the 9th is over sessions-max */
	ck_assert_int_eq(open_sessions(raw, RESERVED, TPW__V1__ROLE__ROLE_CONTROL), 0);
	ck_assert_int_eq(expect_refused("session limit of 8 reached (tpipd --sessions-max)"), 0);
	close_sessions(raw, RESERVED);
	ck_assert_int_eq(tpt_sync_post(&done, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS * 2, "attacker"));
	tpt_sync_done(&done);
	stop();
}
END_TEST

/* ---- Hello deadline and frame size before Hello --------------------------------------------- */

START_TEST(test_limits_session_without_hello_closed_at_deadline)
{
	const char *args[] = { "--hello-timeout", "500", NULL };
	struct tpt_raw quiet, polite;
	uint64_t t0;

	start(args);
	ck_assert_int_eq(tpt_raw_connect(&polite, dm.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&polite, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tpt_raw_connect(&quiet, dm.socket), 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&quiet, T_MS), 0);
	ck_assert_uint_ge(tpt_now_ms() - t0, 400);
	/* the session that said Hello in time outlives the deadline */
	ck_assert_int_eq(tpt_raw_wait_closed(&polite, 300), -ETIMEDOUT);
	ck_assert_uint_eq(log_count("no Hello within 500 ms"), 1);
	tpt_raw_close(&quiet);
	tpt_raw_close(&polite);
	stop();
}
END_TEST

/* Sends Hello padded (unknown field 16) so that its frame body is exactly @body bytes. */
static int send_sized_hello(struct tpt_raw *raw, size_t body)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	uint8_t buf[8192];
	struct tpw_hdr hd = { TPW_MAGIC, TPW_WIRE_VERSION, 0, (uint32_t)body, 0, ++raw->seq };
	size_t n, fill;

	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "padded";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	n = protobuf_c_message_pack(&m.base, buf + TPW_HDR_SIZE);
	fill = body - n - 4;
	ck_assert(fill >= 128 && fill < (1u << 14) && TPW_HDR_SIZE + body <= sizeof(buf));
	buf[TPW_HDR_SIZE + n] = 0x82; /* field 16, length-delimited: a two-byte tag */
	buf[TPW_HDR_SIZE + n + 1] = 0x01;
	buf[TPW_HDR_SIZE + n + 2] = (uint8_t)((fill & 0x7f) | 0x80);
	buf[TPW_HDR_SIZE + n + 3] = (uint8_t)(fill >> 7);
	memset(buf + TPW_HDR_SIZE + n + 4, 'x', fill);
	tpw_hdr_pack(&hd, buf);
	return tpt_raw_send_bytes(raw, buf, TPW_HDR_SIZE + body, NULL, 0);
}

START_TEST(test_limits_frame_before_hello_at_limit_passes_above_closes)
{
	const char *args[] = { "--hello-frame-max", "4096", NULL };
	struct tpt_raw raw;
	Tpw__V1__DaemonMsg *rep = NULL;
	uint8_t hdr[TPW_HDR_SIZE];
	struct tpw_hdr h = { TPW_MAGIC, TPW_WIRE_VERSION, 0, 4u << 20, 0, 1 };

	start(args);
	ck_assert_int_eq(tpt_raw_connect(&raw, dm.socket), 0);
	ck_assert_int_eq(send_sized_hello(&raw, 4096), 0);
	ck_assert_int_eq(tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->hello_reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);
	tpt_raw_close(&raw);
	/* one byte more before Hello: closed at the header */
	ck_assert_int_eq(tpt_raw_connect(&raw, dm.socket), 0);
	ck_assert_int_eq(send_sized_hello(&raw, 4097), 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&raw, T_MS), 0);
	tpt_raw_close(&raw);
	/* the attack: the header of a 4 MiB frame, never completed, is refused at once */
	ck_assert_int_eq(tpt_raw_connect(&raw, dm.socket), 0);
	tpw_hdr_pack(&h, hdr);
	ck_assert_int_eq(tpt_raw_send_bytes(&raw, hdr, sizeof(hdr), NULL, 0), 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&raw, 2000), 0);
	tpt_raw_close(&raw);
	ck_assert(tpt_daemon_alive(&dm));
	stop();
}
END_TEST

/* ---- bytes held in partial frames ------------------------------------------------------------ */

#define PARTIAL (600u << 10)

/* Says Hello, then sends the header of a @len-byte frame and 1000 bytes of it. */
static int park_partial(struct tpt_raw *raw, uint32_t len)
{
	static uint8_t body[TPW_HDR_SIZE + 1000];
	struct tpw_hdr h = { TPW_MAGIC, TPW_WIRE_VERSION, 0, len, 0, 0 };

	TPT_REQUIRE(tpt_raw_connect(raw, dm.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	h.seq = ++raw->seq;
	tpw_hdr_pack(&h, body);
	memset(body + TPW_HDR_SIZE, 0, 1000);
	TPT_REQUIRE(tpt_raw_send_bytes(raw, body, sizeof(body), NULL, 0) == 0, 1, "send");
	return 0;
}

/* A round trip on a fresh session: the daemon has read what was sent before it. */
static int settle(void)
{
	struct tpt_raw r;
	int e;

	TPT_REQUIRE(tpt_raw_connect(&r, dm.socket) == 0, 1, "connect");
	e = tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CONTROL, T_MS);
	tpt_raw_close(&r);
	TPT_REQUIRE(e == 0, 1, "hello: %d", e);
	return 0;
}

/* Holds one partial frame (below the per-uid budget), is refused a second one (above it). */
static int partial_attacker(void *arg)
{
	struct tpt_raw a, b;

	if (tpt_become_user(NOBODY) || park_partial(&a, PARTIAL) || settle() || park_partial(&b, PARTIAL))
		return 1;
	TPT_REQUIRE(tpt_raw_wait_closed(&b, T_MS) == 0, 1, "second partial frame kept");
	TPT_REQUIRE(tpt_raw_wait_closed(&a, 300) == -ETIMEDOUT, 1, "first partial frame dropped");
	TPT_REQUIRE(tpt_sync_wait((struct tpt_sync *)arg, T_MS * 2) == 0, 1, "no word");
	tpt_raw_close(&a);
	tpt_raw_close(&b);
	return 0;
}

/* The victim's 600K frame fits the daemon-wide budget; a 400K one more, within its own
 * per-uid budget, does not. */
static int partial_victim(void *arg)
{
	struct tpt_raw a, b;

	if (tpt_become_user(VICTIM) || park_partial(&a, PARTIAL) || settle() ||
	    park_partial(&b, 400u << 10))
		return 1;
	TPT_REQUIRE(tpt_raw_wait_closed(&b, T_MS) == 0, 1, "frame over the daemon budget kept");
	TPT_REQUIRE(tpt_raw_wait_closed(&a, 300) == -ETIMEDOUT, 1, "frame in budget dropped");
	tpt_raw_close(&a);
	tpt_raw_close(&b);
	return 0;
}

START_TEST(test_limits_partial_frames_bounded_per_uid_and_daemon_wide)
{
	/* per uid: one 600K frame fits 1M, two do not; daemon-wide: two 600K fit 1.5M, with a
	 * 400K one more they do not */
	const char *args[] = { "--input-bytes-per-uid", "1M", "--input-bytes-max", "1536K", NULL };
	struct tpt_sync held;
	pid_t pid;

	if (skip_unless_root())
		return;
	start(args);
	ck_assert_int_eq(tpt_sync_init(&held), 0);
	pid = tpt_fork(partial_attacker, &held);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "per-uid limit", T_MS, NULL, 0), 0);
	ck_assert(tpt_wait_ok(tpt_fork(partial_victim, NULL), T_MS * 2, "victim"));
	ck_assert(tpt_daemon_log_has(&dm, "daemon-wide limit"));
	ck_assert_int_eq(tpt_sync_post(&held, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS * 2, "attacker"));
	tpt_sync_done(&held);
	stop();
}
END_TEST

/* ---- pipes closed by the far end (item 7) ---------------------------------------------------- */

#define CYCLES 10000

/* `tpipctl --json status` field @key, or -1. */
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

/*
 * One long-running listener; a connector connects and closes CYCLES times. When @polite, the
 * listener notices the close (read_descriptor fails) and closes its end too; otherwise it only
 * accepts and keeps the pipe, as a listener busy elsewhere would.
 */
static int cycles_child(void *arg)
{
	bool polite = arg != NULL;
	struct tp_context *lc = NULL, *cc = NULL;
	struct tp_listener *l = NULL;
	int r;

	TPT_REQUIRE(tpt_ctx_new(&dm, 0, "listener", &lc) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tpt_ctx_new(&dm, 0, "connector", &cc) == 0, 1, "context: %s", tp_last_error());
	TPT_REQUIRE(tp_listen(lc, "long-running", NULL, &l) == 0, 1, "listen: %s", tp_last_error());
	for (unsigned i = 0; i < CYCLES; i++) {
		struct tp_pipe *cp = NULL, *ap = NULL;
		struct tp_descriptor *d = NULL;

		r = tp_connect(cc, "long-running", &cp);
		if (r == 0)
			r = tp_pipe_wait_connected(cp, T_MS);
		TPT_REQUIRE(r == 0, 1, "cycle %u: connect: %d %s", i, r, tp_last_error());
		r = tp_listener_accept_sync(l, T_MS, &ap);
		TPT_REQUIRE(r == 0, 1, "cycle %u: accept: %d %s", i, r, tp_last_error());
		tp_pipe_close(cp);
		if (!polite)
			continue; /* @ap stays open until the context ends */
		r = tp_pipe_read_descriptor_sync(ap, T_MS, &d);
		TPT_REQUIRE(r == -EPIPE, 1, "cycle %u: read after the far close: %d", i, r);
		tp_pipe_close(ap);
	}
	tp_listener_close(l);
	tp_context_free(cc);
	tp_context_free(lc);
	return 0;
}

static void run_cycles(bool polite)
{
	long pipes = -1;

	start(NULL);
	ck_assert(tpt_wait_ok(tpt_fork(cycles_child, polite ? (void *)1 : NULL), 240000,
			      "connect/close cycles"));
	/* every pipe is freed, not only detached */
	for (unsigned round = 0; round < 300 && pipes != 0; round++) {
		pipes = status_field("pipes");
		if (pipes != 0)
			tpt_backoff(round);
	}
	ck_assert_int_eq(pipes, 0);
	stop();
}

START_TEST(test_limits_listener_survives_10000_pipes_closed_by_the_far_end)
{
	run_cycles(true);
}
END_TEST

START_TEST(test_limits_listener_that_never_reads_survives_10000_far_closes)
{
	run_cycles(false);
}
END_TEST

/* ---- fd exhaustion: accepts pause instead of spinning ---------------------------------------- */

#define FLOOD_UNIX 120
#define FLOOD_TCP 40

/* CPU time the daemon used, in clock ticks. */
static long daemon_cpu_ticks(void)
{
	return tpt_cpu_ticks(dm.pid);
}

/* A loopback TCP port free a moment ago. */
static int free_port(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd >= 0 && bind(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0 &&
	    getsockname(fd, (struct sockaddr *)&sin, &sl) == 0)
		port = ntohs(sin.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

START_TEST(test_limits_fd_exhaustion_pauses_accepts_with_few_log_lines_and_recovers)
{
	char metrics[32];
	const char *args[] = { "--hello-timeout", "60000", "--metrics-listen", metrics, NULL };
	struct rlimit low;
	struct tpt_raw unix_flood[FLOOD_UNIX], tcp_flood[FLOOD_TCP], http_flood[FLOOD_TCP], r;
	long t0, t1, hz = sysconf(_SC_CLK_TCK);
	int e = -EADDRINUSE, mport = -1;
	uint64_t w0;

	/* a port free a moment ago may be the one the daemon's peer listener then gets (it binds
	 * port 0), or another test's: up to 5 tries */
	for (int i = 0; i < 5 && e < 0; i++) {
		mport = free_port();
		ck_assert_int_gt(mport, 0);
		snprintf(metrics, sizeof(metrics), "127.0.0.1:%d", mport);
		e = tpt_daemon_start_peer(&dm, args);
	}
	ck_assert_int_eq(e, 0);
	/* The daemon raises its soft limit to the hard one at start: lower both once it runs
	 * (new fds only; it holds fewer than 64) */
	low.rlim_cur = low.rlim_max = 64;
	ck_assert_int_eq(prlimit(dm.pid, RLIMIT_NOFILE, &low, NULL), 0);
	/* fill the daemon's fd table with sessions that never say Hello, then queue more */
	for (int i = 0; i < FLOOD_UNIX; i++)
		ck_assert_int_eq(tpt_raw_connect(&unix_flood[i], dm.socket), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "accept failed", T_MS, NULL, 0), 0);
	/* and the peer port: its backlog stays readable while no fd is left */
	for (int i = 0; i < FLOOD_TCP; i++)
		ck_assert_int_eq(tpt_raw_connect_tcp(&tcp_flood[i], "127.0.0.1", dm.peer_port), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "peer accept failed", T_MS, NULL, 0), 0);
	/* and the metrics endpoint (libevent's listener warned and spun before) */
	for (int i = 0; i < FLOOD_TCP; i++)
		ck_assert_int_eq(tpt_raw_connect_tcp(&http_flood[i], "127.0.0.1", mport), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "metrics accept failed", T_MS, NULL, 0), 0);
	/* a 2 s window: the loop sleeps between 1 s pauses (a spinning accept burns the core) */
	t0 = daemon_cpu_ticks();
	w0 = tpt_now_ms();
	while (tpt_now_ms() - w0 < 2000)
		tpt_backoff(10);
	t1 = daemon_cpu_ticks();
	ck_assert_int_ge(t0, 0);
	ck_assert_msg(t1 - t0 < hz / 2, "daemon used %ld ticks of CPU in 2 s (%ld per s)", t1 - t0,
		      hz);
	ck_assert_uint_le(log_count("accept failed"), 6); /* unix, peer, metrics: 1 per 10 s each */
	ck_assert_uint_le(log_count("Error from accept"), 1); /* libevent's own warning */
	ck_assert_uint_ge(log_count("peer accept failed"), 1);
	/* fds come back: new clients get in again */
	for (int i = 0; i < FLOOD_UNIX; i++)
		tpt_raw_close(&unix_flood[i]);
	for (int i = 0; i < FLOOD_TCP; i++) {
		tpt_raw_close(&tcp_flood[i]);
		tpt_raw_close(&http_flood[i]);
	}
	for (unsigned round = 0;; round++) {
		ck_assert_int_eq(tpt_raw_connect(&r, dm.socket), 0);
		e = tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CONTROL, 2000);
		tpt_raw_close(&r);
		if (e == 0)
			break;
		ck_assert_msg(round < 100, "no session after the flood: %d", e);
		tpt_backoff(round);
	}
	stop();
}
END_TEST

/* ---- a peer daemon's messages obey the reader's queue limits ------------------------------ */

#define RQ_MAX 8	/* the reader's daemon: --pipe-queue-max */
#define RQ_WRITES 20	/* the writer's daemon holds all but RQ_MAX back (its limit is 4096) */

static struct tpt_daemon wa; /* the writer's daemon; dm is the reader's */
static struct tpt_sync rq_ready, rq_go;

static void rq_spec(unsigned index, struct tpt_msg_spec *ret)
{
	memset(ret, 0, sizeof(*ret));
	ret->pipe = 70;
	ret->index = index;
	ret->n_payloads = 1;
	ret->lens[0] = (128u << 10) + index; /* rendezvous: the write completes once read */
}

/* On the reader's host: reads what was queued once told to (all, then the writer's last one). */
static int rq_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "rq-reader", .where = "flooded",
			     .ready = &rq_ready, .timeout_ms = T_MS };
	struct tpt_msg_spec spec;
	unsigned n = arg ? RQ_WRITES : 0;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "listen");
	TPT_REQUIRE(tpt_sync_wait(&rq_go, T_MS * 3) == 0, 1, "no word from the parent");
	for (unsigned i = 0; i < n; i++) {
		rq_spec(i, &spec);
		TPT_REQUIRE(tpt_msg_read_check(e.ctx, e.p, &spec, TPT_MEM_PRIVATE, T_MS) == 0, 1,
			    "message %u", i);
	}
	if (n) {
		rq_spec(RQ_WRITES, &spec);
		TPT_REQUIRE(tpt_msg_read_check(e.ctx, e.p, &spec, TPT_MEM_PRIVATE, T_MS) == 0, 1,
			    "the message after the refused ones");
	}
	tpt_end_close(&e);
	return 0;
}

/* On the writer's host: RQ_WRITES writes at once; its daemon sends the reader's daemon RQ_MAX
 * (that daemon's limit, learnt at set-up) and holds the rest back until they are read: all
 * complete. With @arg NULL: only RQ_MAX writes, left pending. */
static int rq_writer(void *arg)
{
	char addr[160];
	struct tpt_end e = { .d = &wa, .ctx_name = "rq-writer", .ready = &rq_ready,
			     .timeout_ms = T_MS };
	static struct tpt_msg msgs[RQ_WRITES + 1];
	static struct tpt_done_arg da[RQ_WRITES];
	static struct tpt_done done;
	unsigned n = arg ? RQ_WRITES : RQ_MAX;
	struct tpt_msg_spec spec;

	e.where = tpt_peer_address(&dm, "flooded", addr, sizeof(addr));
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	tpt_done_init(&done);
	for (unsigned i = 0; i <= n; i++) {
		rq_spec(i, &spec);
		TPT_REQUIRE(tpt_msg_build(e.ctx, &spec, TPT_MEM_PRIVATE, &msgs[i]) == 0, 1, "build");
	}
	for (unsigned i = 0; i < n; i++) {
		da[i] = (struct tpt_done_arg){ &done, i };
		TPT_REQUIRE(tp_pipe_write(e.p, &msgs[i].m, tpt_done_cb, &da[i]) == 0, 1, "write %u",
			    i);
	}
	if (!arg) {
		TPT_REQUIRE(tpt_sync_wait(&rq_go, T_MS * 3) == 0, 1, "no word from the parent");
		return 0; /* its daemon is killed under it */
	}
	TPT_REQUIRE(tpt_done_wait(&done, n, T_MS * 2) == 0, 1, "%u of %u writes completed",
		    done.count, n);
	for (unsigned i = 0; i < n; i++)
		TPT_REQUIRE(done.status[i] == 0, 1, "write %u completed with %d", i,
			    done.status[i]);
	TPT_REQUIRE(done.order_errors == 0 && done.bad_errmsg == 0, 1, "completions");
	TPT_REQUIRE(tp_pipe_write_sync(e.p, &msgs[n].m) == 0, 1, "write after the refusals: %s",
		    tp_last_error());
	for (unsigned i = 0; i <= n; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	tpt_end_close(&e);
	return 0;
}

/* Polls `tpipctl --json status` of @d until @key is @want. */
static bool status_reaches(struct tpt_daemon *d, const char *key, uint64_t want)
{
	const char *keys[] = { key };
	uint64_t v = ~0ull;

	for (unsigned round = 0; round < 400; round++) {
		tpt_status_u64s(d, keys, 1, &v);
		if (v == want)
			return true;
		tpt_backoff(round);
	}
	fprintf(stderr, "%s stayed %llu, want %llu\n", key, (unsigned long long)v,
		(unsigned long long)want);
	return false;
}

static void rq_start(void)
{
	const char *b_args[] = { "--pipe-queue-max", "8", NULL };

	ck_assert_int_eq(tpt_daemon_pair_start(&wa, NULL, &dm, b_args), 0);
	ck_assert_int_eq(tpt_sync_init(&rq_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&rq_go), 0);
}

/* ---- inline bytes held in all pipes together ---------------------------------------------- */

#define QB_MSG 60000u /* eager: the bytes stay in the daemon's pipe queue until read */

static struct tpt_sync qb_ready, qb_done, qb_refused;

/* Accepts two pipes and reads nothing until told. */
static int qb_reader(void *arg)
{
	struct tpt_end e = { .d = &dm, .ctx_name = "qb-reader", .where = "hoard",
			     .ready = &qb_ready, .timeout_ms = T_MS };
	struct tp_pipe *second = NULL;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	TPT_REQUIRE(tp_listener_accept_sync(e.l, T_MS, &second) == 0, 1, "accept");
	TPT_REQUIRE(tpt_sync_wait(&qb_done, T_MS * 3) == 0, 1, "no word");
	tp_pipe_close(second);
	tpt_end_close(&e);
	return 0;
}

/* Writes @n messages of QB_MSG bytes on @p; the last must end with @last_want. */
static int qb_write(struct tp_context *ctx, struct tp_pipe *p, unsigned pipe, unsigned n,
		    int last_want)
{
	for (unsigned i = 0; i < n; i++) {
		struct tpt_msg_spec spec = { .pipe = pipe, .index = i, .n_payloads = 1,
					     .lens = { QB_MSG } };
		struct tpt_msg m;
		int r;

		TPT_REQUIRE(tpt_msg_build(ctx, &spec, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
		r = tp_pipe_write_sync(p, &m.m);
		tpt_msg_free(ctx, &m);
		TPT_REQUIRE(r == (i + 1 < n ? 0 : last_want), 1, "pipe %u write %u: %d %s", pipe, i,
			    r, r ? tp_last_error() : "");
	}
	return 0;
}

#define QB_MORE 12u

static int qb_writer(void *unused)
{
	static struct tpt_msg m[QB_MORE];
	static struct tpt_done_arg arg[QB_MORE];
	struct tpt_done done;
	struct tpt_end a = { .d = &dm, .ctx_name = "qb-writer", .where = "hoard",
			     .ready = &qb_ready, .timeout_ms = T_MS };
	struct tp_pipe *b = NULL;
	unsigned n;
	int r;

	TPT_REQUIRE(tpt_end_connect(&a) == 0, 1, "connect");
	r = tp_connect(a.ctx, "hoard", &b);
	if (r == 0)
		r = tp_pipe_wait_connected(b, T_MS);
	TPT_REQUIRE(r == 0, 1, "second pipe: %d", r);
	/* 17 x 60000 = 1020000 in the first pipe (its own limit is 1M); the second takes about
	 * 9 more (26 x 60000 = 1560000, with the bookkeeping of each message, still under
	 * 1536K = 1572864) and the writes beyond wait for room (the parent sees the wait), then
	 * fail with the pipe when the reader closes it, never with -ENOBUFS */
	if (qb_write(a.ctx, a.p, 1, 17, 0))
		return 1;
	tpt_done_init(&done);
	for (n = 0; n < QB_MORE; n++) {
		struct tpt_msg_spec spec = { .pipe = 2, .index = n, .n_payloads = 1,
					     .lens = { QB_MSG } };

		arg[n] = (struct tpt_done_arg){ &done, n };
		TPT_REQUIRE(tpt_msg_build(a.ctx, &spec, TPT_MEM_PRIVATE, &m[n]) == 0, 1, "build");
		r = tp_pipe_write(b, &m[n].m, tpt_done_cb, &arg[n]);
		TPT_REQUIRE(r == 0, 1, "write %u on the second pipe: %d", n, r);
	}
	TPT_REQUIRE(tpt_sync_post(&qb_refused, 0) == 0, 1, "post");
	TPT_REQUIRE(tpt_done_wait(&done, QB_MORE, T_MS * 3) == 0, 1, "%u of %u completed",
		    done.count, QB_MORE);
	for (n = 0; n < QB_MORE && done.status[n] == 0; n++)
		;
	TPT_REQUIRE(n >= 8 && n < QB_MORE && done.order_errors == 0, 1, "%u writes succeeded",
		    n);
	for (unsigned i = n; i < QB_MORE; i++)
		TPT_REQUIRE(done.status[i] != 0 && done.status[i] != -ENOBUFS, 1,
			    "write %u waiting for the budget ended with %d", i, done.status[i]);
	for (n = 0; n < QB_MORE; n++)
		tpt_msg_free(a.ctx, &m[n]);
	TPT_REQUIRE(tpt_sync_wait(&qb_done, T_MS * 3) == 0, 1, "no word");
	tp_pipe_close(b);
	tpt_end_close(&a);
	return 0;
}

START_TEST(test_limits_inline_bytes_of_all_pipes_bounded)
{
	const char *args[] = { "--pipe-queue-bytes", "1M", "--pipe-queue-bytes-max", "1536K", NULL };
	const char *keys[] = { "pipe_held_bytes" };
	pid_t reader, writer;
	uint64_t held;

	start(args);
	ck_assert_int_eq(tpt_sync_init(&qb_ready), 0);
	ck_assert_int_eq(tpt_sync_init(&qb_done), 0);
	ck_assert_int_eq(tpt_sync_init(&qb_refused), 0);
	reader = tpt_fork(qb_reader, NULL);
	writer = tpt_fork(qb_writer, NULL);
	/* the writer has written everything; once a write waits for the budget, the daemon
	 * holds just under the limit, less than one more message (60000 bytes and its
	 * bookkeeping) away from it; the reader then closes the pipes */
	ck_assert_int_eq(tpt_sync_wait(&qb_refused, T_MS * 2), 0);
	ck_assert(status_reaches(&dm, "budget_waits", 1));
	tpt_status_u64s(&dm, keys, 1, &held);
	ck_assert_uint_le(held, 1572864);
	ck_assert_uint_gt(held + 60000 + 4096, 1572864);
	ck_assert_int_eq(tpt_sync_post(&qb_done, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&qb_done, 0), 0);
	ck_assert(tpt_wait_ok(writer, T_MS * 2, "writer"));
	ck_assert(tpt_wait_ok(reader, T_MS * 2, "reader"));
	ck_assert(status_reaches(&dm, "pipe_queued_bytes", 0));
	ck_assert(status_reaches(&dm, "pipe_held_bytes", 0));
	stop();
}
END_TEST

START_TEST(test_limits_remote_messages_obey_the_readers_queue_limit)
{
	pid_t reader, writer;

	rq_start();
	reader = tpt_fork(rq_reader, (void *)1);
	writer = tpt_fork(rq_writer, (void *)1);
	/* the reader's daemon queues RQ_MAX while the reader reads nothing; the writer's daemon
	 * keeps the other 12 back (it refused them before: each write failed) */
	ck_assert(status_reaches(&dm, "pipe_queued_messages", RQ_MAX));
	ck_assert(status_reaches(&wa, "pipe_queued_messages", RQ_MAX));
	ck_assert(status_reaches(&dm, "remote_refused", 0));
	ck_assert_int_eq(log_count("remote message"), 0);
	ck_assert_int_eq(tpt_sync_post(&rq_go, 0), 0);
	ck_assert(tpt_wait_ok(writer, T_MS * 3, "writer"));
	ck_assert(tpt_wait_ok(reader, T_MS * 3, "reader"));
	ck_assert_int_eq(tpt_daemon_stop(&wa), 0);
	stop();
}
END_TEST

START_TEST(test_limits_remote_messages_freed_when_the_link_dies)
{
	pid_t reader, writer;

	rq_start();
	reader = tpt_fork(rq_reader, NULL);
	writer = tpt_fork(rq_writer, NULL);
	ck_assert(status_reaches(&dm, "pipe_queued_messages", RQ_MAX));
	ck_assert(status_reaches(&dm, "pipes", 1));
	/* the writer's daemon dies; the reader lives on and never closes its pipe */
	ck_assert_int_eq(tpt_daemon_kill(&wa), 0);
	ck_assert(status_reaches(&dm, "pipe_queued_messages", 0));
	ck_assert(status_reaches(&dm, "pipe_held_bytes", 0));
	ck_assert(status_reaches(&dm, "pipes", 0));
	ck_assert_int_eq(tpt_sync_post(&rq_go, 0), 0);
	ck_assert_int_eq(tpt_sync_post(&rq_go, 0), 0);
	ck_assert(tpt_wait_ok(reader, T_MS * 3, "reader"));
	tpt_wait(writer, T_MS, NULL);
	stop();
}
END_TEST

/* ---- shared buffer bytes per uid ---------------------------------------------------------- */

#define BUF (768u << 10)

/* As nobody: two clients each register BUF (together exactly the per-uid limit); one page more
 * from either is refused, while each is far below its per-client limit. */
static int buffers_attacker(void *arg)
{
	struct tp_context *c1 = NULL, *c2 = NULL;
	void *a = NULL, *b = NULL, *x = NULL;
	int r;

	if (tpt_become_user(NOBODY))
		return 1;
	TPT_REQUIRE(tpt_ctx_new(&dm, 0, "buf1", &c1) == 0, 1, "context");
	TPT_REQUIRE(tpt_ctx_new(&dm, 0, "buf2", &c2) == 0, 1, "context");
	r = tp_buffer_alloc(c1, BUF, &a);
	TPT_REQUIRE(r == 0, 1, "first: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(c2, BUF, &b);
	TPT_REQUIRE(r == 0, 1, "second, at the per-uid limit: %d %s", r, tp_last_error());
	r = tp_buffer_alloc(c2, 4096, &x);
	TPT_REQUIRE(r == -ENOBUFS, 1, "a page over the per-uid limit: %d (want -ENOBUFS)", r);
	TPT_REQUIRE(strstr(tp_last_error(), "per uid"), 1, "error: %s", tp_last_error());
	TPT_REQUIRE(tpt_sync_wait((struct tpt_sync *)arg, T_MS * 2) == 0, 1, "no word");
	/* freeing gives the budget back; the page is asked for on the connection that freed, so
	 * that the daemon has seen the free (a one-way message) before the request */
	TPT_REQUIRE(tp_buffer_free(c1, a) == 0, 1, "free");
	r = tp_buffer_alloc(c1, 4096, &x);
	TPT_REQUIRE(r == 0, 1, "after a free: %d %s", r, tp_last_error());
	tp_context_free(c1);
	tp_context_free(c2);
	return 0;
}

/* The victim's own budget is untouched by nobody's buffers. */
static int buffers_victim(void *arg)
{
	struct tp_context *c = NULL;
	void *a = NULL;
	int r;

	if (tpt_become_user(VICTIM))
		return 1;
	TPT_REQUIRE(tpt_ctx_new(&dm, 0, "victim", &c) == 0, 1, "context");
	r = tp_buffer_alloc(c, BUF, &a);
	TPT_REQUIRE(r == 0, 1, "victim's buffer: %d %s", r, tp_last_error());
	tp_context_free(c);
	return 0;
}

START_TEST(test_limits_buffer_bytes_per_uid_at_limit_pass_above_refused)
{
	const char *args[] = { "--buffer-bytes-max", "1M", "--buffer-bytes-per-uid", "1536K",
			       NULL };
	struct tpt_sync go;
	pid_t pid;

	if (skip_unless_root())
		return;
	start(args);
	ck_assert_int_eq(tpt_sync_init(&go), 0);
	pid = tpt_fork(buffers_attacker, &go);
	ck_assert_int_eq(tpt_daemon_wait_log(&dm, "per uid reached for uid 65534", T_MS, NULL, 0),
			 0);
	ck_assert(tpt_wait_ok(tpt_fork(buffers_victim, NULL), T_MS, "victim"));
	ck_assert_int_eq(tpt_sync_post(&go, 0), 0);
	ck_assert(tpt_wait_ok(pid, T_MS * 2, "attacker"));
	tpt_sync_done(&go);
	stop();
}
END_TEST

/* ---- the peer port: pending connections, links, data connections ---------------------------- */

/* Threads of the daemon (/proc/PID/status). */
static long daemon_threads(const struct tpt_daemon *d)
{
	char path[64], line[256];
	long n = -1;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/status", (int)d->pid);
	f = fopen(path, "re");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "Threads: %ld", &n) == 1)
			break;
	fclose(f);
	return n;
}

static bool link_works(struct tpt_daemon *from);

START_TEST(test_limits_idle_peer_connections_capped_per_source)
{
	const char *args[] = { "--peer-pending-per-source", "8", "--peer-pending-max", "16", NULL };
	struct tpt_raw idle[8], idle2[8], extra;
	long threads;
	int fds, e;

	ck_assert_int_eq(tpt_daemon_start_peer(&dm, args), 0);
	fds = tpt_daemon_fd_settle(&dm, 200, T_MS);
	threads = daemon_threads(&dm);
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(tpt_raw_connect_tcp(&idle[i], "127.0.0.1", dm.peer_port), 0);
	/* the 8 wait for their first frame (until the connect timeout, 5 s) */
	for (unsigned round = 0; tpt_daemon_fd_count(&dm) != fds + 8; round++) {
		ck_assert_msg(round < 400, "daemon holds %d fds, want %d", tpt_daemon_fd_count(&dm),
			      fds + 8);
		tpt_backoff(round);
	}
	/* the 9th from the same address, and 200 more, are closed at once */
	for (int i = 0; i < 200; i++) {
		ck_assert_int_eq(tpt_raw_connect_tcp(&extra, "127.0.0.1", dm.peer_port), 0);
		e = tpt_raw_wait_closed(&extra, T_MS);
		tpt_raw_close(&extra);
		ck_assert_msg(e == 0, "connection %d over the limit kept open", 9 + i);
	}
	/* another source's refusal right after the flood is logged (the flood used to take the
	 * line of the second for every source): 8 wait, the 9th meets peer-pending-max */
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(tpt_raw_connect_tcp_from(&idle2[i], "127.0.0.2", "127.0.0.1",
							  dm.peer_port), 0);
	ck_assert_int_eq(tpt_raw_connect_tcp_from(&extra, "127.0.0.2", "127.0.0.1", dm.peer_port),
			 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&extra, T_MS), 0);
	tpt_raw_close(&extra);
	ck_assert_uint_eq(log_count("peer connection from 127.0.0.2:"), 1);
	ck_assert_int_eq(tpt_daemon_fd_count(&dm), fds + 16);
	ck_assert_int_eq(daemon_threads(&dm), threads);
	for (int i = 0; i < 8; i++)
		ck_assert_int_eq(tpt_raw_wait_closed(&idle[i], 0), -ETIMEDOUT);
	ck_assert_uint_le(log_count("peer connection from 127.0.0.1:"), 2);
	/* once the flood is gone, a daemon from the same address links */
	for (int i = 0; i < 8; i++) {
		tpt_raw_close(&idle[i]);
		tpt_raw_close(&idle2[i]);
	}
	ck_assert_int_eq(tpt_daemon_wait_fds(&dm, fds, T_MS), fds);
	ck_assert_int_eq(tpt_daemon_start_peer(&wa, NULL), 0);
	ck_assert(link_works(&wa));
	ck_assert_int_eq(tpt_daemon_stop(&wa), 0);
	stop();
}
END_TEST

static struct tpt_daemon dialer;

/* From @arg's daemon, connects to a name daemon dm does not serve. Return: the error. */
static int probe_child(void *arg)
{
	char addr[160];
	struct tpt_end e = { .d = arg, .ctx_name = "probe", .timeout_ms = T_MS };
	int r;

	e.where = tpt_peer_address(&dm, "nobody-listens", addr, sizeof(addr));
	r = tpt_ctx_new(e.d, 0, "probe", &e.ctx);
	TPT_REQUIRE(r == 0, 100, "context");
	r = tp_connect(e.ctx, e.where, &e.p);
	if (r == 0)
		r = tp_pipe_wait_connected(e.p, T_MS);
	tpt_log("connect %s: %d %s", e.where, r, r ? tp_last_error() : "");
	tpt_end_close(&e);
	return r == -ENOENT ? 0 : 1; /* 0: the link came up and the name was looked up */
}

/* True if a client of @from reached dm over a (new or reused) link. */
static bool link_works(struct tpt_daemon *from)
{
	int status = -1;

	return tpt_wait(tpt_fork(probe_child, from), T_MS * 2, &status) == 0 &&
	       WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

/* Two dialling daemons; dm admits @args. The first link is at the limit, the second over. */
static void two_links(const char *const *args, const char *why)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&dialer, NULL, &dm, args), 0);
	ck_assert(link_works(&dialer));
	ck_assert_int_eq(tpt_daemon_start_peer(&wa, NULL), 0);
	ck_assert(!link_works(&wa));
	ck_assert(tpt_daemon_log_has(&dm, why));
	ck_assert(link_works(&dialer)); /* the link within the limit carries on */
	ck_assert_int_eq(tpt_daemon_stop(&wa), 0);
	ck_assert_int_eq(tpt_daemon_stop(&dialer), 0);
	stop();
}

START_TEST(test_limits_peer_links_per_source_at_limit_pass_above_refused)
{
	const char *args[] = { "--peer-links-per-source", "1", NULL };

	two_links(args, "links from that address (limit 1)");
}
END_TEST

START_TEST(test_limits_peer_data_connections_capped_daemon_wide)
{
	/* each dialler opens 4 data connections (8 threads here): 4 fit, 8 do not */
	const char *args[] = { "--peer-data-conns-max", "4", NULL };

	two_links(args, "data connections (limit 4)");
}
END_TEST

/* A client of @from connecting to @to's "nobody-listens": the error it gets (in @ret). */
struct dial {
	struct tpt_daemon *from, *to;
	int want;
	const char *why; /* in the error message, or NULL */
};

static int dial_child(void *arg)
{
	const struct dial *x = arg;
	char addr[160];
	struct tpt_end e = { .d = x->from, .ctx_name = "dial", .timeout_ms = T_MS };
	int r;

	e.where = tpt_peer_address(x->to, "nobody-listens", addr, sizeof(addr));
	TPT_REQUIRE(tpt_ctx_new(e.d, 0, "dial", &e.ctx) == 0, 1, "context");
	r = tp_connect(e.ctx, e.where, &e.p);
	if (r == 0)
		r = tp_pipe_wait_connected(e.p, T_MS);
	TPT_REQUIRE(r == x->want, 1, "connect %s: %d %s (want %d)", e.where, r, tp_last_error(),
		    x->want);
	TPT_REQUIRE(!x->why || strstr(tp_last_error(), x->why), 1, "error: %s", tp_last_error());
	tpt_end_close(&e);
	return 0;
}

/* dm dials (a client of it connects to) wa, then dialer: the second link is over @args. */
static void two_dials(const char *const *args, const char *why)
{
	struct dial first = { &dm, &wa, -ENOENT, NULL }, second = { &dm, &dialer, -ENOBUFS, why };

	ck_assert_int_eq(tpt_daemon_pair_start(&dm, args, &wa, NULL), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&dialer, NULL), 0);
	ck_assert(tpt_wait_ok(tpt_fork(dial_child, &first), T_MS * 2, "first link"));
	ck_assert(tpt_wait_ok(tpt_fork(dial_child, &second), T_MS * 2, "second link"));
	ck_assert(tpt_wait_ok(tpt_fork(dial_child, &first), T_MS * 2, "first link again"));
	ck_assert_int_eq(tpt_daemon_stop(&dialer), 0);
	ck_assert_int_eq(tpt_daemon_stop(&wa), 0);
	stop();
}

START_TEST(test_limits_links_a_daemon_dials_at_limit_pass_above_refused)
{
	const char *args[] = { "--peer-links-max", "1", NULL };

	two_dials(args, "links to other daemons (limit 1)");
}
END_TEST

START_TEST(test_limits_data_connections_of_dialled_links_capped)
{
	const char *args[] = { "--peer-data-conns-max", "4", "--peer-data-conns", "4", NULL };

	two_dials(args, "4 more would exceed 4");
}
END_TEST

/* ---- one user's listeners and everyone else's listener calls ------------------------------- */

#define LHOG_SESSIONS 100 /* of uid 65534, within sessions-per-uid (128) */
#define LHOG_NAMES 256	  /* each: listeners-max */
#define LPROBE_OPS 20000  /* closes of a listener id nobody holds */
#define LPIPELINE 256

static struct tpt_sync lhog_ready, lhog_done;

/* Sends Listen of "PREFIX-K" for K in [@first, @first + @n) before reading the answers, which
 * must all be @status. Return: 0 or 1. */
static int listen_burst(struct tpt_raw *r, const char *prefix, unsigned first, unsigned n,
			int status)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	char name[64];

	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	l.name = name;
	for (unsigned i = 0; i < n; i++) {
		snprintf(name, sizeof(name), "%s-%u", prefix, first + i);
		l.req_id = i + 1;
		TPT_REQUIRE(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0) == 0, 1, "send %u", i);
	}
	for (unsigned i = 0; i < n; i++) {
		Tpw__V1__DaemonMsg *d;
		int st;

		TPT_REQUIRE(tpt_raw_expect(r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &d) == 0, 1,
			    "answer %u of %u", i, n);
		st = d->reply->status;
		tpw__v1__daemon_msg__free_unpacked(d, NULL);
		TPT_REQUIRE(st == status, 1, "listen %u: status %d, not %d", i, st, status);
	}
	return 0;
}

/* uid 65534: LHOG_SESSIONS sessions of LHOG_NAMES listeners each, kept until the parent is done. */
static int listener_hog(void *arg)
{
	static struct tpt_raw r[LHOG_SESSIONS];
	char prefix[32];

	(void)arg;
	if (tpt_become_user(NOBODY) || open_sessions(r, LHOG_SESSIONS, TPW__V1__ROLE__ROLE_CLIENT))
		return 1;
	for (unsigned i = 0; i < LHOG_SESSIONS; i++) {
		snprintf(prefix, sizeof(prefix), "hog%u", i);
		if (listen_burst(&r[i], prefix, 0, LHOG_NAMES, TPW__V1__STATUS__STATUS_OK))
			return 1;
	}
	tpt_sync_post(&lhog_ready, 0);
	TPT_REQUIRE(tpt_sync_wait(&lhog_done, 10 * T_MS) == 0, 1, "no word from the parent");
	close_sessions(r, LHOG_SESSIONS);
	return 0;
}

/* The daemon's CPU ticks for LPROBE_OPS closes on @r of listener ids nobody holds (no answer:
 * a Listen of the taken name "mine-0" after them, answered, says they were all handled). */
static long listener_probe_ticks(void *arg)
{
	struct tpt_raw *r = arg;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__ListenerClose c = TPW__V1__LISTENER_CLOSE__INIT;
	long t0 = tpt_cpu_ticks(dm.pid), t1;

	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTENER_CLOSE;
	m.listener_close = &c;
	for (unsigned i = 0; i < LPROBE_OPS; i++) {
		c.listener_id = (1ull << 40) + i; /* never handed out */
		ck_assert_int_eq(tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0), 0);
		if (i % LPIPELINE == LPIPELINE - 1) /* keep the daemon's input drained */
			ck_assert_int_eq(listen_burst(r, "mine", 0, 1,
						      TPW__V1__STATUS__STATUS_EXISTS), 0);
	}
	ck_assert_int_eq(listen_burst(r, "mine", 0, 1, TPW__V1__STATUS__STATUS_EXISTS), 0);
	t1 = tpt_cpu_ticks(dm.pid);
	ck_assert(t0 >= 0 && t1 >= t0);
	return t1 - t0;
}

/*
 * A user's listeners cost other users' listener calls nothing: beside uid 65534's 25600
 * listeners (100 sessions of 256), root's closes of listener ids it does not hold take the
 * daemon about the CPU they took before. Every connect, listen and listener close walked the
 * list of all listeners (by name or id). Ticks of the daemon's CPU time, not the wall clock.
 */
START_TEST(test_limits_another_users_listeners_do_not_slow_listener_calls)
{
	long before, after;
	struct tpt_raw r;

	if (skip_unless_root())
		return;
	start(NULL);
	ck_assert_int_eq(open_sessions(&r, 1, TPW__V1__ROLE__ROLE_CLIENT), 0);
	ck_assert_int_eq(listen_burst(&r, "mine", 0, 1, TPW__V1__STATUS__STATUS_OK), 0);
	ck_assert_int_eq(tpt_cpu_beside(dm.pid, listener_probe_ticks, &r, listener_hog, &lhog_ready,
					&lhog_done, 10 * T_MS,
					"listener closes beside "
					"25600 listeners of another uid",
					&before, &after),
			 0);
	ck_assert_msg(tpt_cpu_beside_ok(before, after), "closes took %ld ticks of the daemon's "
		      "CPU beside another uid's listeners, %ld alone", after, before);
	tpt_raw_close(&r);
	stop();
}
END_TEST

/* ---- one user's failed connects and another user's lines ------------------------------------- */

#define CONNECT_FLOOD 5000     /* connects of nobody to a name nobody listens on */
#define SESSION_LOG_BURST 2000 /* TPD_SESSION_LOG_BURST (daemon/core/quota.h), in 10 s: a
					* window starts at a name's first line, so a run of T ms
					* spans 1 + T / 10000 of them */

/* Nobody connects CONNECT_FLOOD times to a name nobody listens on, as fast as it can. */
static int connect_flood(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(NOBODY) == 0 && tpt_ctx_new(&dm, 0, "flood", &ctx) == 0, 1,
		    "context");
	for (unsigned i = 0; i < CONNECT_FLOOD; i++) {
		TPT_REQUIRE(tp_connect(ctx, "nothing-here", &p) == 0, 1, "connect %u", i);
		TPT_REQUIRE(tp_pipe_wait_connected(p, T_MS) == -ENOENT, 1, "connect %u", i);
		tp_pipe_close(p);
	}
	tp_context_free(ctx);
	return 0;
}

/* The victim's one connect to a name nobody listens on. */
static int connect_once(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(VICTIM) == 0 && tpt_ctx_new(&dm, 0, "once", &ctx) == 0, 1,
		    "context");
	TPT_REQUIRE(tp_connect(ctx, "victims-own-name", &p) == 0, 1, "connect");
	TPT_REQUIRE(tp_pipe_wait_connected(p, T_MS) == -ENOENT, 1, "connect succeeded");
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/*
 * Runs @flood (nobody's calls, each a line the daemon writes; started on a daemon with @args)
 * and then the victim's failed connect, and checks the log: the lines with @needle (@what, in
 * the messages) are at most one SESSION_LOG_BURST for each window the flood spans, and the
 * victim's line is there.
 */
static void flood_then_victim(const char *const *args, tpt_child_fn flood, const char *needle,
			      const char *what)
{
	uint64_t t0 = 0, took;
	int lines;
	pid_t pid;

	start(args);
	t0 = tpt_now_ms();
	pid = tpt_fork(flood, NULL);
	ck_assert(tpt_wait_ok(pid, 6 * T_MS, "flood"));
	took = tpt_now_ms() - t0;
	pid = tpt_fork(connect_once, NULL);
	ck_assert(tpt_wait_ok(pid, T_MS, "victim"));
	lines = tpt_daemon_log_count(&dm, needle);
	printf("%s of one user in %llu ms: %d lines in the log\n", what,
	       (unsigned long long)took, lines);
	ck_assert_int_gt(lines, 0);
	ck_assert_msg(lines <= SESSION_LOG_BURST * (int)(1 + took / 10000), "%d lines of one "
		      "user's %s in %llu ms", lines, what, (unsigned long long)took);
	ck_assert_msg(tpt_daemon_log_has(&dm, "connect to 'victims-own-name' failed"),
		      "the other user's failed connect is not in the log");
	stop();
}

/*
 * Every line about a session has a budget per uid (2000 in 10 s; 8000 for all uids), above
 * which its lines are dropped and counted in its next one: nobody's 5000 connects to a name
 * nobody listens on, each a line "connect to 'nothing-here' failed", leave at most 2000 in
 * the log, and the victim's failed connect after them is still logged. Each was logged, a line
 * for every call a client cared to make: one user could fill the log at the rate of its calls
 * and hide every other user's lines.
 */
START_TEST(test_limits_one_users_session_lines_are_bounded)
{
	if (skip_unless_root())
		return;
	flood_then_victim(NULL, connect_flood, "connect to 'nothing-here' failed",
			  "5000 failed connects");
}
END_TEST

/* ---- one user's failing messages and another user's lines ------------------------------------ */

#define BAD_MSGS 3000 /* messages of nobody's whose copy fails */
#define BAD_LEN (256u << 10)

/* Nobody pipes to itself and writes BAD_MSGS messages from memory it unmapped: the daemon's
 * copy of each fails (no pipe ring: --pipe-ring no), a line about the pipe alone each. */
static int bad_copies(void *arg)
{
	struct tp_listen_options lo = { .size = sizeof(lo) };
	struct tp_context *ctx;
	struct tp_listener *l;
	struct tp_pipe *w, *r;
	uint8_t *gone, *buf = malloc(BAD_LEN);
	struct tpt_done done;
	struct tpt_done_arg da = { &done, 0 };

	(void)arg;
	TPT_REQUIRE(buf && tpt_become_user(NOBODY) == 0 &&
			    tpt_ctx_new(&dm, 0, "bad", &ctx) == 0, 1, "context");
	gone = mmap(NULL, BAD_LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	TPT_REQUIRE(gone != MAP_FAILED && munmap(gone, BAD_LEN) == 0, 1, "unmapped memory");
	TPT_REQUIRE(tp_listen(ctx, "self", &lo, &l) == 0 && tp_connect(ctx, "self", &w) == 0 &&
			    tp_listener_accept_sync(l, T_MS, &r) == 0, 1, "pipe to itself");
	for (unsigned i = 0; i < BAD_MSGS; i++) {
		struct tp_payload pl = { .data = gone, .length = BAD_LEN };
		struct tp_message m = { .payloads = &pl, .n_payloads = 1 };
		struct tp_slot sl = { .data = buf };
		struct tp_allocation al = { .payloads = &sl, .n_payloads = 1 };
		struct tp_descriptor *d;

		tpt_done_init(&done);
		TPT_REQUIRE(tp_pipe_write(w, &m, tpt_done_cb, &da) == 0, 1, "write %u", i);
		TPT_REQUIRE(tp_pipe_read_descriptor_sync(r, T_MS, &d) == 0, 1, "descriptor %u", i);
		TPT_REQUIRE(tp_pipe_read_sync_timeout(r, d, &al, T_MS) < 0, 1, "read %u", i);
		TPT_REQUIRE(tpt_done_wait(&done, 1, T_MS) == 0 && done.last_status < 0, 1,
			    "write %u: %d", i, done.last_status);
	}
	tp_context_free(ctx);
	free(buf);
	return 0;
}

/*
 * Lines about a pipe alone (no session's: a message whose copy failed) are within the budget
 * of its ends' uids, as a session's lines are within its uid's: nobody's 3000 messages from
 * memory it unmapped, on a pipe to itself, leave at most 2000 such lines, and the victim's
 * failed connect after them is logged. Each was logged, a line for every message.
 */
START_TEST(test_limits_one_users_pipe_lines_are_bounded)
{
	static const char *const args[] = { "--pipe-ring", "no", NULL };

	if (skip_unless_root())
		return;
	flood_then_victim(args, bad_copies, "Bad address", "3000 failed copies");
}
END_TEST

static Suite *limits_suite(void)
{
	Suite *s = suite_create("sec_limits");
	TCase *tc = tcase_create("sessions");

	tcase_add_test(tc, test_limits_sessions_per_uid_at_limit_pass_above_refused_and_logged_once);
	tcase_add_test(tc, test_limits_one_users_refusals_do_not_hide_anothers_from_the_log);
	tcase_add_test(tc, test_limits_one_users_session_lines_are_bounded);
	tcase_add_test(tc, test_limits_one_users_pipe_lines_are_bounded);
	tcase_add_test(tc, test_limits_reserved_slots_keep_root_in_when_a_user_fills_the_table);
	tcase_add_test(tc, test_limits_session_without_hello_closed_at_deadline);
	tcase_add_test(tc, test_limits_frame_before_hello_at_limit_passes_above_closes);
	tcase_add_test(tc, test_limits_partial_frames_bounded_per_uid_and_daemon_wide);
	tcase_add_test(tc, test_limits_buffer_bytes_per_uid_at_limit_pass_above_refused);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	tc = tcase_create("pipes");
	tcase_add_test(tc, test_limits_listener_survives_10000_pipes_closed_by_the_far_end);
	tcase_add_test(tc, test_limits_listener_that_never_reads_survives_10000_far_closes);
	tcase_set_timeout(tc, 250);
	suite_add_tcase(s, tc);
	tc = tcase_create("remote");
	tcase_add_test(tc, test_limits_remote_messages_obey_the_readers_queue_limit);
	tcase_add_test(tc, test_limits_remote_messages_freed_when_the_link_dies);
	tcase_add_test(tc, test_limits_inline_bytes_of_all_pipes_bounded);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	tc = tcase_create("peers");
	tcase_add_test(tc, test_limits_idle_peer_connections_capped_per_source);
	tcase_add_test(tc, test_limits_peer_links_per_source_at_limit_pass_above_refused);
	tcase_add_test(tc, test_limits_peer_data_connections_capped_daemon_wide);
	tcase_add_test(tc, test_limits_links_a_daemon_dials_at_limit_pass_above_refused);
	tcase_add_test(tc, test_limits_data_connections_of_dialled_links_capped);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	tc = tcase_create("fds");
	tcase_add_test(tc, test_limits_fd_exhaustion_pauses_accepts_with_few_log_lines_and_recovers);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	tc = tcase_create("cpu");
	tcase_add_test(tc, test_limits_another_users_listeners_do_not_slow_listener_calls);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(limits_suite());
}
