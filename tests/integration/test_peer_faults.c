/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: cross-host pipes when things go wrong. Two daemons on this machine treat each
 * other as remote hosts (see test_peers.c), with --peer-timeout 3000 and --peer-connect-timeout
 * 2000 (times tpt_time_scale() under valgrind). A malformed tpip:// address (no host, no or an
 * empty name, a port out of range or not a number, a bad bracketed IPv6 host) fails the connect
 * with -EINVAL at once and opens no link. A peer that answers with a hello of another major
 * version, or refuses saying VERSION, fails it with -EPROTONOSUPPORT at once, naming the
 * version. An unknown listener fails the connect with -ENOENT;
 * a port nobody listens on with -ECONNREFUSED, and one that accepts TCP but never answers with
 * -ETIMEDOUT, each within the connect timeout. SIGKILL of the remote daemon mid-transfer, or
 * SIGSTOP (a silent peer), fails both clients within the peer timeout, while the surviving daemon
 * stays up, gets back to its fd count and reaches a restarted peer. Pre-shared keys: different
 * keys, or a key on one side only, are refused with -EACCES and logged; the same key works.
 * Malformed input on the peer port (garbage, an oversized header, a truncated frame, a valid
 * PeerHello followed by garbage or by silence, a bad PeerHello, a data connection for an unknown
 * link) closes that connection only. A slow reader of 1 GiB of rendezvous messages and a reader
 * that falls behind a flood of eager messages keep both daemons' memory bounded.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(60000)
/* How much later than the deadline it documents the daemon may report a failure. */
#define SLACK_MS TPT_SCALED_MS(2000)
/* How long a dead link may take to leave `tpipctl peers`. */
#define GONE_MS TPT_SCALED_MS(5000)

static struct tpt_sync to_b, to_parent;

static void syncs_setup(void)
{
	ck_assert_int_eq(tpt_sync_init(&to_b), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
}

static void syncs_teardown(void)
{
	tpt_sync_done(&to_b);
	tpt_sync_done(&to_parent);
}

static void setup(void)
{
	tpt_peer_fixture_start();
	syncs_setup();
}

static void teardown(void)
{
	syncs_teardown();
	tpt_peer_fixture_stop();
}

/* A pair with --peer-insecure: the plaintext protocol, so that raw frames reach the parser of
 * first frames and the handshake (TLS only wraps the same code). */
static void insecure_setup(void)
{
	const char *const *t = tpt_peer_args();
	const char *a[8] = { "--peer-insecure", t[0], t[1], t[2], t[3], NULL };

	ck_assert_int_eq(tpt_daemon_pair_start(&tpt_peer_a, a, &tpt_peer_b, a), 0);
	syncs_setup();
}

static void sleep_ms(unsigned ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* A pair that proves that a client of @from reaches a listener @name of @to. */
static bool cross_works(const struct tpt_daemon *from, const struct tpt_daemon *to,
			const char *name)
{
	return tpt_peer_cross_works(from, to, name, 50, T_MS);
}

static void check_fds_back(const struct tpt_daemon *d, int baseline, const char *who)
{
	ck_assert_msg(tpt_daemon_wait_fds(d, baseline, TPT_SCALED_MS(10000)) >= 0,
		      "%s: fds did not return to the baseline of %d", who, baseline);
}

/* ---- connect errors ------------------------------------------------------------------------- */

struct connect_case {
	const struct tpt_daemon *d; /* the client's daemon; NULL: A */
	char address[128];
	int want[2];  /* acceptable errors (0: unused) */
	int max_ms;   /* the error must come within this */
	const char *want_text; /* the error message must contain this (NULL: any) */
};

/* A client of A connects to @c->address and expects one of @c->want within @c->max_ms. */
static int connect_fails(void *arg)
{
	const struct connect_case *c = arg;
	struct tp_context *ctx;
	struct tp_pipe *p;
	struct tp_descriptor *d = NULL;
	uint64_t t0;
	int r = tpt_ctx_new(c->d ? c->d : &tpt_peer_a, 0, "connect-fails", &ctx), r2;

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	t0 = tpt_now_ms();
	r = tp_connect(ctx, c->address, &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect(%s) returned %d at once (%s); the error belongs on the "
		    "pipe", c->address, r, tp_last_error());
	r = tp_pipe_wait_connected(p, T_MS);
	tpt_log("connect %s: %d (%s) after %llu ms: %s", c->address, r, tp_strerror(r),
		(unsigned long long)(tpt_now_ms() - t0), tp_last_error());
	TPT_REQUIRE(r != 0 && (r == c->want[0] || r == c->want[1]), 1,
		    "connect %s: %d, want %d or %d", c->address, r, c->want[0], c->want[1]);
	TPT_REQUIRE(tpt_now_ms() - t0 <= (uint64_t)c->max_ms, 1,
		    "the error took %llu ms, want <= %d", (unsigned long long)(tpt_now_ms() - t0),
		    c->max_ms);
	TPT_REQUIRE(tp_last_error()[0], 1, "no error message");
	TPT_REQUIRE(!c->want_text || strstr(tp_last_error(), c->want_text), 1,
		    "error message '%s' lacks '%s'", tp_last_error(), c->want_text);
	r2 = tp_pipe_read_descriptor_sync(p, T_MS, &d);
	TPT_REQUIRE(r2 < 0, 1, "read_descriptor on a failed pipe: %d", r2);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

static void expect_connect_error(struct connect_case *c)
{
	pid_t pid = tpt_fork(connect_fails, c);

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "connector"));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a), "daemon A died");
}

START_TEST(test_peer_faults_unknown_listener_is_enoent)
{
	struct connect_case c = { .want = { -ENOENT, -ENOENT },
				  .max_ms = TPT_PEER_CONNECT_TIMEOUT_MS + SLACK_MS };

	tpt_peer_address(&tpt_peer_b, "nosuch", c.address, sizeof(c.address));
	expect_connect_error(&c);
	/* The link itself is fine: a real listener is reached over it. */
	ck_assert(cross_works(&tpt_peer_a, &tpt_peer_b, "after-enoent"));
}
END_TEST

/* Addresses tp_connect() must refuse itself with -EINVAL (libtpclient(3)), sending nothing. */
static const char *const bad_addresses[] = {
	"tpip://",                         /* no host */
	"tpip:///x",                       /* no host */
	"tpip://127.0.0.1",                /* no listener name */
	"tpip://127.0.0.1:7420/",          /* empty listener name */
	"tpip://127.0.0.1:0/x",            /* port 0 */
	"tpip://127.0.0.1:65536/x",        /* port out of range */
	"tpip://127.0.0.1:99999/x",        /* port out of range */
	"tpip://127.0.0.1:18446744073709551617/x", /* port overflows */
	"tpip://127.0.0.1:-1/x",           /* negative port */
	"tpip://127.0.0.1:+80/x",          /* signed port */
	"tpip://bad host/x",               /* space in the host */
	"tpip://999.1.1.1/x",              /* not an IPv4 address, not a name */
	"tpip://[zz::1]:7420/x",           /* not an IPv6 address */
	"tpip://[fe80::1%]:7420/x",        /* empty zone */
	"tpip://127.0.0.1:12ab/x",         /* port not a number */
	"tpip://127.0.0.1:/x",             /* empty port */
	"tpip://[::1/x",                   /* unclosed bracket */
	"tpip://[]:7420/x",                /* empty bracketed host */
	"tpip://[::1]x/x",                 /* junk after the bracket */
	"tpip://127.0.0.1:7420/no spaces", /* invalid listener name */
};

/* A client of A calls tp_connect(@arg): it must return -EINVAL itself, naming the address. */
static int connect_refused(void *arg)
{
	const char *address = arg;
	struct tp_context *ctx;
	struct tp_pipe *p = NULL;
	int r = tpt_ctx_new(&tpt_peer_a, 0, "connect-refused", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, address, &p);
	tpt_log("connect %s: %d: %s", address, r, tp_last_error());
	TPT_REQUIRE(r == -EINVAL, 1, "tp_connect(%s) returned %d, want -EINVAL at once", address,
		    r);
	TPT_REQUIRE(!p, 1, "a pipe was returned");
	TPT_REQUIRE(strstr(tp_last_error(), "invalid address"), 1, "error message '%s'",
		    tp_last_error());
	tp_context_free(ctx);
	return 0;
}

/* _i: index into bad_addresses. */
START_TEST(test_peer_faults_malformed_address_is_einval_at_once)
{
	pid_t pid = tpt_fork(connect_refused, (void *)bad_addresses[_i]);

	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "connector"));
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a), "daemon A died");
	ck_assert_msg(tpt_peer_links_gone(&tpt_peer_a, 0), "'%s' made A open a peer link",
		      bad_addresses[_i]);
}
END_TEST

/* Binds a loopback TCP socket on a free port; listens if @backlog > 0. Return: fd. */
static int loopback_socket(int backlog, int *ret_port)
{
	struct sockaddr_in sin = { .sin_family = AF_INET,
				   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	if (backlog > 0)
		ck_assert_int_eq(listen(fd, backlog), 0);
	ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
	*ret_port = ntohs(sin.sin_port);
	return fd;
}

/*
 * The fd count of @d to come back to after a fault. A daemon creates its resolver (one socket)
 * on its first dial and keeps it, so a refused dial to a closed port comes first.
 */
static int settled_fds(const struct tpt_daemon *d)
{
	struct connect_case c = { .d = d, .want = { -ECONNREFUSED, -ECONNREFUSED },
				  .max_ms = TPT_PEER_CONNECT_TIMEOUT_MS };
	int port, fd = loopback_socket(0, &port), n;
	pid_t pid;

	close(fd);
	snprintf(c.address, sizeof(c.address), "tpip://127.0.0.1:%d/warm-up", port);
	pid = tpt_fork(connect_fails, &c);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "warm-up dial"));
	n = tpt_daemon_fd_settle(d, TPT_SCALED_MS(200), TPT_SCALED_MS(5000));
	ck_assert_int_gt(n, 0);
	return n;
}

START_TEST(test_peer_faults_closed_port_is_refused_in_time)
{
	/* tp_strerror(-ECONNREFUSED) is generic: the message names the peer that refused. */
	struct connect_case c = { .want = { -ECONNREFUSED, -ETIMEDOUT },
				  .max_ms = TPT_PEER_CONNECT_TIMEOUT_MS + SLACK_MS,
				  .want_text = "tpipd at 127.0.0.1:" };
	int port, fd = loopback_socket(0, &port);

	close(fd); /* bound, never listened, closed: nothing listens there */
	snprintf(c.address, sizeof(c.address), "tpip://127.0.0.1:%d/x", port);
	expect_connect_error(&c);
}
END_TEST

START_TEST(test_peer_faults_silent_port_times_out)
{
	struct connect_case c = { .want = { -ETIMEDOUT, -ETIMEDOUT },
				  .max_ms = TPT_PEER_CONNECT_TIMEOUT_MS + SLACK_MS };
	int fds = settled_fds(&tpt_peer_a);
	int port, fd = loopback_socket(8, &port);

	/* The kernel completes the TCP handshake; nobody ever answers the PeerHello. */
	snprintf(c.address, sizeof(c.address), "tpip://127.0.0.1:%d/x", port);
	expect_connect_error(&c);
	close(fd);
	check_fds_back(&tpt_peer_a, fds, "A after a silent peer");
}
END_TEST

/* ---- the remote daemon dies or goes silent mid-transfer ------------------------------------- */

#define BIG (64u << 20)

static void big_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 60;
	s->index = index;
	s->n_tensors = 1;
	s->lens[0] = BIG;
}

/* What the reader on B / the writer on A must see once the link is gone (0: any error). */
static int reader_want, writer_want;

/* Reads 64 MiB messages until an error; tells the parent once two have arrived intact. */
static int endless_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "endless-reader", .where = "big",
			     .ready = &to_b, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	unsigned n = 0;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	big_spec(0, &s);
	while ((r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS)) == 0)
		if (++n == 2)
			tpt_sync_post(&to_parent, 0);
	tpt_log("reader: %u messages, then %d (%s): %s", n, r, tp_strerror(r), tp_last_error());
	TPT_REQUIRE(n >= 2 && r < 0, 1, "reader stopped with %d after %u messages", r, n);
	TPT_REQUIRE(!reader_want || r == reader_want, 1, "reader error %d, want %d", r,
		    reader_want);
	return 0;
}

/* Writes the same 64 MiB message until a write fails (with writer_want). */
static int endless_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "endless-writer",
			     .where = tpt_peer_address(&tpt_peer_b, "big", addr, sizeof(addr)),
			     .ready = &to_b, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	unsigned n = 0;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	big_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	while (n < 100000 && (r = tp_pipe_write_sync(e.p, &m.m)) == 0)
		n++;
	tpt_log("writer: %u messages, then %d (%s): %s", n, r, tp_strerror(r), tp_last_error());
	TPT_REQUIRE(r < 0 && (!writer_want || r == writer_want), 1, "writer error %d, want %d", r,
		    writer_want);
	r = tp_pipe_write_sync(e.p, &m.m);
	TPT_REQUIRE(r < 0 && (!writer_want || r == writer_want), 1,
		    "a write after the failure: %d, want %d", r, writer_want);
	tpt_msg_free(e.ctx, &m);
	tpt_end_close(&e);
	return 0;
}

/* Waits for @pid until @t0 + @ms; logs how long after @t0 it ended. */
static bool wait_since(pid_t pid, uint64_t t0, int ms, const char *what)
{
	int left = (int)(t0 + (uint64_t)ms > tpt_now_ms() ? t0 + (uint64_t)ms - tpt_now_ms() : 0);
	bool ok = tpt_wait_ok(pid, left, what);

	printf("%s ended %llu ms after the fault (limit %d ms): %s\n", what,
	       (unsigned long long)(tpt_now_ms() - t0), ms, ok ? "ok" : "FAILED");
	return ok;
}

/*
 * _i 0: SIGKILL B, the reader's daemon; 1: SIGKILL A, the writer's (and dialler's) daemon. The
 * client of the survivor must see -ECONNRESET (peering.md: the peer daemon died); the client of
 * the killed daemon any error. The survivor drops the link, gets back to its fds and reaches a
 * new daemon started in the victim's place.
 */
START_TEST(test_peer_faults_daemon_killed_mid_transfer)
{
	struct tpt_daemon *victim = _i ? &tpt_peer_a : &tpt_peer_b;
	struct tpt_daemon *survivor = _i ? &tpt_peer_b : &tpt_peer_a;
	const char *who = _i ? "A (writer side)" : "B (reader side)";
	int fds = settled_fds(survivor);
	pid_t rp, wp;
	uint64_t t0;
	bool ok;

	writer_want = _i ? 0 : -ECONNRESET;
	reader_want = _i ? -ECONNRESET : 0;
	rp = tpt_fork(endless_reader, NULL);
	wp = tpt_fork(endless_writer, NULL);
	ck_assert_int_gt(rp, 0);
	ck_assert_int_gt(wp, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(tpt_daemon_kill(victim), 0);
	ok = wait_since(wp, t0, TPT_PEER_TIMEOUT_MS + SLACK_MS, "writer on A");
	ok = wait_since(rp, t0, TPT_PEER_TIMEOUT_MS + SLACK_MS, "reader on B") && ok;
	ck_assert_msg(ok, "a client did not fail as it should when %s was killed", who);
	ck_assert_msg(tpt_daemon_alive(survivor), "the surviving daemon died");
	ck_assert_msg(tpt_peer_links_gone(survivor, GONE_MS), "the survivor still lists the link");
	check_fds_back(survivor, fds, "the survivor");
	/* A new daemon (new port) in the victim's place; teardown stops it. */
	ck_assert_int_eq(tpt_daemon_start_peer(victim, tpt_peer_args()), 0);
	ck_assert_msg(cross_works(&tpt_peer_a, &tpt_peer_b, "after-kill"),
		      "no pipe between the survivor and a restarted daemon");
}
END_TEST

START_TEST(test_peer_faults_silent_remote_daemon_times_out)
{
	int fds_a = settled_fds(&tpt_peer_a), fds_b = settled_fds(&tpt_peer_b);
	pid_t rp, wp;
	uint64_t t0;
	bool ok;

	writer_want = -ECONNRESET;
	reader_want = -ECONNRESET; /* B wakes up to a link A has declared dead */
	rp = tpt_fork(endless_reader, NULL);
	wp = tpt_fork(endless_writer, NULL);
	ck_assert_int_gt(rp, 0);
	ck_assert_int_gt(wp, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, T_MS), 0);
	t0 = tpt_now_ms();
	ck_assert_int_eq(kill(tpt_peer_b.pid, SIGSTOP), 0);
	ok = wait_since(wp, t0, TPT_PEER_TIMEOUT_MS + SLACK_MS, "writer on A");
	t0 = tpt_now_ms();
	ck_assert_int_eq(kill(tpt_peer_b.pid, SIGCONT), 0);
	ok = wait_since(rp, t0, TPT_PEER_TIMEOUT_MS + SLACK_MS, "reader on B (after SIGCONT)") &&
	     ok;
	ck_assert_msg(ok, "a client did not fail (in time) when the remote daemon went silent");
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_a) && tpt_daemon_alive(&tpt_peer_b),
		      "a daemon died");
	ck_assert_msg(tpt_peer_links_gone(&tpt_peer_a, GONE_MS), "A still lists the dead link");
	ck_assert_msg(tpt_peer_links_gone(&tpt_peer_b, GONE_MS), "B still lists the dead link");
	check_fds_back(&tpt_peer_a, fds_a, "A after a silent peer");
	check_fds_back(&tpt_peer_b, fds_b, "B after waking up");
	ck_assert_msg(cross_works(&tpt_peer_a, &tpt_peer_b, "after-stop"), "no new link");
}
END_TEST

/* ---- pre-shared keys ------------------------------------------------------------------------ */

static struct tpt_daemon ka, kb;
static char key_dir[64], key1[128], key2[128];

static void write_key(const char *path, unsigned seed)
{
	char text[64];
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

	ck_assert_int_ge(fd, 0);
	/* 48 key bytes of hex text (the daemon takes the file's bytes, trailing newline cut). */
	for (unsigned i = 0; i < 24; i++)
		snprintf(text + 2 * i, 3, "%02x", (unsigned)(tpt_seed(seed, i, 7) & 0xff));
	text[48] = '\n';
	ck_assert_int_eq(write(fd, text, 49), 49);
	close(fd);
	ck_assert_int_eq(chmod(path, 0600), 0);
}

static void keys_setup(void)
{
	syncs_setup();
	snprintf(key_dir, sizeof(key_dir), "/tmp/tpt-key.XXXXXX");
	ck_assert(mkdtemp(key_dir));
	snprintf(key1, sizeof(key1), "%s/k1", key_dir);
	snprintf(key2, sizeof(key2), "%s/k2", key_dir);
	write_key(key1, 1);
	write_key(key2, 2);
}

static void keys_teardown(void)
{
	unlink(key1);
	unlink(key2);
	rmdir(key_dir);
	syncs_teardown();
}

/* Starts ka and kb with @key_a / @key_b (NULL: --peer-insecure, no TLS). */
static void start_keyed(const char *key_a, const char *key_b)
{
	const char *const *t = tpt_peer_args(); /* the fixture's (scaled) timeouts */
	const char *a[8] = { t[0], t[1], t[2], t[3], "--peer-insecure" };
	const char *b[8] = { t[0], t[1], t[2], t[3], "--peer-insecure" };

	if (key_a) {
		a[4] = "--peer-key-file";
		a[5] = key_a;
	}
	if (key_b) {
		b[4] = "--peer-key-file";
		b[5] = key_b;
	}
	ck_assert_int_eq(tpt_daemon_pair_start(&ka, a, &kb, b), 0);
}

static void stop_keyed(void)
{
	int ra = tpt_daemon_stop(&ka), rb = tpt_daemon_stop(&kb);

	ck_assert_int_eq(ra, 0);
	ck_assert_int_eq(rb, 0);
}

static int keyed_connect_fails(void *arg)
{
	char addr[128];
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(&ka, 0, "keyed", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, tpt_peer_address(&kb, "keyed", addr, sizeof(addr)), &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	tpt_log("keyed connect: %d (%s): %s", r, tp_strerror(r), tp_last_error());
	TPT_REQUIRE(r == -EACCES, 1, "connect across mismatched keys: %d, want -EACCES", r);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

/* A listener "keyed" on kb exists, so only authentication can refuse the connect. */
static void expect_refused(const char *a_log, const char *b_log)
{
	struct tpt_end e = { .d = &kb, .ctx_name = "keyed-listener", .where = "keyed",
			     .timeout_ms = T_MS };
	pid_t pid;

	ck_assert_int_eq(tpt_end_listen(&e, false), 0);
	pid = tpt_fork(keyed_connect_fails, NULL);
	ck_assert_int_gt(pid, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "connector"));
	tpt_end_close(&e);
	if (a_log)
		ck_assert_msg(tpt_daemon_wait_log(&ka, a_log, TPT_SCALED_MS(5000), NULL, 0) == 0,
			      "A's log does not say '%s'", a_log);
	if (b_log)
		ck_assert_msg(tpt_daemon_wait_log(&kb, b_log, TPT_SCALED_MS(5000), NULL, 0) == 0,
			      "B's log does not say '%s'", b_log);
	ck_assert_msg(tpt_daemon_alive(&ka) && tpt_daemon_alive(&kb), "a daemon died");
}

START_TEST(test_peer_faults_different_keys_are_refused)
{
	start_keyed(key1, key2);
	/* The TLS handshake fails on both ends (the PSK binder does not verify), each saying so. */
	expect_refused("wrong pre-shared key", "wrong pre-shared key");
	stop_keyed();
}
END_TEST

START_TEST(test_peer_faults_key_on_one_side_is_refused)
{
	/* An insecure (plaintext) dialler is told why in its own protocol; a TLS dialler to an
	 * insecure daemon finds its handshake refused. Both ends log it. */
	start_keyed(NULL, key1);
	expect_refused("accepts only TLS-authenticated peers", "plaintext peer protocol");
	stop_keyed();
	start_keyed(key1, NULL);
	expect_refused("TLS handshake failed", "it starts TLS");
	stop_keyed();
}
END_TEST

START_TEST(test_peer_faults_same_key_authenticates)
{
	struct tpt_link l;

	start_keyed(key1, key1);
	ck_assert(cross_works(&ka, &kb, "keyed"));
	ck_assert_int_eq(tpt_peer_links(&ka, &l), 1);
	ck_assert_msg(l.authenticated && strcmp(l.state, "up") == 0,
		      "keyed link: authenticated %d, state %s", l.authenticated, l.state);
	ck_assert(tpt_daemon_log_has(&ka, "authenticated"));
	stop_keyed();
}
END_TEST

/* ---- malformed input on the peer port ------------------------------------------------------- */

enum junk {
	JUNK_GARBAGE,	     /* bytes that are no frame header */
	JUNK_HUGE_HEADER,    /* a valid header announcing a 2 GiB message */
	JUNK_BIG_FIRST,	     /* a first frame over the 4096-byte limit of first frames */
	JUNK_TRUNCATED,	     /* a header and part of its message, then close */
	JUNK_HELLO_GARBAGE,  /* a valid PeerHello, then garbage */
	JUNK_HELLO_SILENCE,  /* a valid PeerHello, then nothing: the handshake deadline */
	JUNK_SILENCE,	     /* nothing at all: the first-frame deadline */
	JUNK_BAD_HELLO,	     /* a PeerHello with another major version */
	JUNK_BAD_CONNS,	     /* a PeerHello promising 1000 data connections */
	JUNK_DATA_UNKNOWN,   /* a PeerDataHello for a link that does not exist */
	JUNK_N
};

static const char *const junk_names[JUNK_N] = {
	"garbage", "huge header", "oversized first frame", "truncated frame", "hello + garbage",
	"hello + silence", "silence", "hello with major 99", "hello with 1000 data conns",
	"data hello for an unknown link",
};

static void junk_hello(Tpw__V1__PeerHello *h, uint8_t *nonce, uint8_t *boot)
{
	for (unsigned i = 0; i < 32; i++)
		nonce[i] = (uint8_t)(tpt_seed(7, i, 1) & 0xff);
	for (unsigned i = 0; i < 16; i++)
		boot[i] = (uint8_t)(tpt_seed(8, i, 1) & 0xff); /* another "host" */
	h->major = TPW_PEER_PROTO_MAJOR;
	h->minor = TPW_PEER_PROTO_MINOR;
	h->host = "junk-host";
	h->boot_id.data = boot;
	h->boot_id.len = 16;
	h->instance = tpt_seed(9, 9, 9);
	h->data_conns = 4;
	h->nonce.data = nonce;
	h->nonce.len = 32;
}

static int send_hello_kind(struct tpt_raw *r, enum junk kind)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerDataHello dh = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
	uint8_t nonce[32], boot[16], mac[32] = { 0 };

	junk_hello(&h, nonce, boot);
	if (kind == JUNK_BAD_HELLO)
		h.major = 99;
	if (kind == JUNK_BAD_CONNS)
		h.data_conns = 1000;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	if (kind == JUNK_DATA_UNKNOWN) {
		dh.link_id = 424242;
		dh.index = 0;
		dh.mac.data = mac;
		dh.mac.len = sizeof(mac);
		m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
		m.data_hello = &dh;
	}
	return tpt_raw_send_peer(r, &m);
}

static void frame_header(uint8_t *hb, uint32_t msg_len)
{
	struct tpw_hdr h = { .magic = TPW_MAGIC, .version = TPW_WIRE_VERSION, .msg_len = msg_len,
			     .seq = 1 };

	tpw_hdr_pack(&h, hb);
}

/* Sends @kind's bytes. Return: whether B must close the connection by itself. */
static bool send_junk(struct tpt_raw *r, enum junk kind)
{
	static const char garbage[] = "garbage garbage garbage garbage garbage garbage garbage!";
	uint8_t buf[TPW_HDR_SIZE + 5000] = { 0 };
	Tpw__V1__PeerMsg *ans = NULL;

	switch (kind) {
	case JUNK_GARBAGE:
		ck_assert_int_eq(tpt_raw_send_bytes(r, garbage, sizeof(garbage), NULL, 0), 0);
		return true;
	case JUNK_HUGE_HEADER:
		frame_header(buf, 0x7fffffffu);
		ck_assert_int_eq(tpt_raw_send_bytes(r, buf, TPW_HDR_SIZE, NULL, 0), 0);
		return true;
	case JUNK_BIG_FIRST:
		frame_header(buf, 5000);
		memset(buf + TPW_HDR_SIZE, 0x0a, 5000);
		/* B may close after the header: a short write then is fine. */
		tpt_raw_send_bytes(r, buf, sizeof(buf), NULL, 0);
		return true;
	case JUNK_TRUNCATED:
		frame_header(buf, 100);
		ck_assert_int_eq(tpt_raw_send_bytes(r, buf, TPW_HDR_SIZE + 10, NULL, 0), 0);
		return false;
	case JUNK_HELLO_GARBAGE:
	case JUNK_HELLO_SILENCE:
		ck_assert_int_eq(send_hello_kind(r, kind), 0);
		ck_assert_int_eq(tpt_raw_recv_peer(r, TPT_SCALED_MS(5000), &ans), 0);
		ck_assert_int_eq(ans->body_case, TPW__V1__PEER_MSG__BODY_HELLO);
		ck_assert_msg(!ans->hello->status ||
				      ans->hello->status == TPW__V1__STATUS__STATUS_OK,
			      "B refused a valid hello: status %d, %s", ans->hello->status,
			      ans->hello->message ? ans->hello->message : "?");
		tpw_peer_msg_free(ans);
		if (kind == JUNK_HELLO_GARBAGE)
			ck_assert_int_eq(tpt_raw_send_bytes(r, garbage, sizeof(garbage), NULL, 0),
					 0);
		return true;
	case JUNK_SILENCE:
		return true;
	default:
		ck_assert_int_eq(send_hello_kind(r, kind), 0);
		return true;
	}
}

/* ---- a peer that speaks another protocol version ----------------------------------------- */

struct fake_peer {
	int fd;	     /* listening */
	bool refuse; /* answer with a refusal saying VERSION, not with a hello of major 99 */
};

/* Child: accepts one dial, reads its PeerHello, answers as @arg says, then expects the dialler
 * to close the connection without another frame. */
static int fake_peer_run(void *arg)
{
	const struct fake_peer *fp = arg;
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	struct tpt_raw r = { .fd = accept(fp->fd, NULL, NULL) };
	uint8_t nonce[32], boot[16];
	int rr;

	TPT_REQUIRE(r.fd >= 0, 1, "accept: %s", strerror(errno));
	rr = tpt_raw_recv_peer(&r, T_MS, &in);
	TPT_REQUIRE(rr == 0 && in->body_case == TPW__V1__PEER_MSG__BODY_HELLO, 1,
		    "no PeerHello from the dialler: %d", rr);
	TPT_REQUIRE(in->hello->major == TPW_PEER_PROTO_MAJOR, 1, "dialler says major %u",
		    in->hello->major);
	tpw_peer_msg_free(in);
	junk_hello(&h, nonce, boot);
	if (fp->refuse) {
		h.status = TPW__V1__STATUS__STATUS_VERSION;
		h.message = "this daemon speaks protocol 99.0";
	} else {
		h.major = 99;
	}
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	TPT_REQUIRE(tpt_raw_send_peer(&r, &m) == 0, 1, "send the hello");
	in = NULL;
	rr = tpt_raw_recv_peer(&r, T_MS, &in);
	TPT_REQUIRE(rr < 0, 1, "the dialler sent frame %d after a hello of another version",
		    in ? (int)in->body_case : -1);
	close(r.fd);
	return 0;
}

/* _i: 0 the peer answers with a hello of major 99; 1 it refuses with status VERSION. */
START_TEST(test_peer_faults_other_protocol_version_is_eprotonosupport)
{
	struct connect_case c = { .want = { -EPROTONOSUPPORT, -EPROTONOSUPPORT },
				  .max_ms = SLACK_MS,
				  .want_text = _i == 0 ? "protocol 99." : "speaks protocol 99.0" };
	struct fake_peer fp = { .refuse = _i == 1 };
	int fds = settled_fds(&tpt_peer_a), port;
	pid_t pid;

	fp.fd = loopback_socket(8, &port);
	pid = tpt_fork(fake_peer_run, &fp);
	ck_assert_int_gt(pid, 0);
	snprintf(c.address, sizeof(c.address), "tpip://127.0.0.1:%d/x", port);
	expect_connect_error(&c);
	ck_assert(tpt_wait_ok(pid, T_MS, "fake peer"));
	close(fp.fd);
	check_fds_back(&tpt_peer_a, fds, "A after a peer of another version");
}
END_TEST

/* _i: enum junk. */
START_TEST(test_peer_faults_junk_on_peer_port_closes_that_connection)
{
	int fds_b = settled_fds(&tpt_peer_b);
	/* Silent connections are closed at the connect deadline; the rest at once. */
	int limit = TPT_PEER_CONNECT_TIMEOUT_MS + SLACK_MS;
	struct tpt_raw r;
	uint64_t t0;

	ck_assert_int_eq(tpt_raw_connect_tcp(&r, "127.0.0.1", tpt_peer_b.peer_port), 0);
	t0 = tpt_now_ms();
	if (send_junk(&r, (enum junk)_i)) {
		int e = tpt_raw_wait_closed(&r, limit);
		printf("%s: closed by B after %llu ms\n", junk_names[_i],
		       (unsigned long long)(tpt_now_ms() - t0));
		ck_assert_msg(e == 0, "%s: B kept the connection open for %d ms", junk_names[_i],
			      limit);
	}
	tpt_raw_close(&r);
	ck_assert_msg(tpt_daemon_alive(&tpt_peer_b), "B died on %s", junk_names[_i]);
	check_fds_back(&tpt_peer_b, fds_b, junk_names[_i]);
	ck_assert_msg(tpt_daemon_wait_log(&tpt_peer_b, "peer", TPT_SCALED_MS(1000), NULL, 0) == 0,
		      "no log");
	ck_assert_msg(cross_works(&tpt_peer_a, &tpt_peer_b, "after-junk"),
		      "no real pipe after %s", junk_names[_i]);
}
END_TEST

/* ---- flow control and memory ---------------------------------------------------------------- */

/*
 * Bound on each daemon's RSS growth while 1 GiB crosses to a slow reader: 256 MiB. Rendezvous
 * bytes go straight from the writer's memory to the reader's (peering.md, "Flow control and
 * memory"), so a daemon that buffers whole messages for a slow reader blows well past it.
 */
#if defined(__SANITIZE_ADDRESS__)
/* AddressSanitizer keeps up to 256 MiB of freed memory in quarantine (its default), which RSS
 * counts: allow for it in sanitizer builds, where the daemon is built the same way. */
#define RSS_BOUND_KB (512L << 10)
#else
#define RSS_BOUND_KB (256L << 10)
#endif
#define SLOW_MSGS 64
#define SLOW_LEN (16u << 20)
#define SLOW_DISTINCT 8 /* distinct message contents (writer memory: 8 x 16 MiB) */

static void slow_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 70;
	s->index = index % SLOW_DISTINCT;
	s->n_tensors = 1;
	s->lens[0] = SLOW_LEN;
}

static int slow_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "slow-reader", .where = "slow",
			     .ready = &to_b, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < SLOW_MSGS; i++) {
		sleep_ms(20); /* pacing: the reader is slow on purpose */
		slow_spec(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, i % 2 ? TPT_MEM_SHM : TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_end_close(&e);
	return 0;
}

/* Issues all 64 writes at once (8 distinct buffers, each written 8 times) and waits. */
static int fast_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "fast-writer",
			     .where = tpt_peer_address(&tpt_peer_b, "slow", addr, sizeof(addr)),
			     .ready = &to_b, .timeout_ms = T_MS };
	static struct tpt_msg msgs[SLOW_DISTINCT];
	static struct tpt_done done;
	struct tpt_done_arg args[SLOW_MSGS];
	struct tpt_msg_spec s;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < SLOW_DISTINCT; i++) {
		slow_spec(i, &s);
		r = tpt_msg_build(e.ctx, &s, i % 2 ? TPT_MEM_PRIVATE : TPT_MEM_SHM, &msgs[i]);
		TPT_REQUIRE(r == 0, 1, "build %u", i);
	}
	tpt_done_init(&done);
	for (unsigned i = 0; i < SLOW_MSGS; i++) {
		args[i] = (struct tpt_done_arg){ &done, i };
		r = tp_pipe_write(e.p, &msgs[i % SLOW_DISTINCT].m, tpt_done_cb, &args[i]);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	r = tpt_done_wait(&done, SLOW_MSGS, T_MS);
	TPT_REQUIRE(r == 0, 1, "only %u of %d writes completed", done.count, SLOW_MSGS);
	for (unsigned i = 0; i < SLOW_MSGS; i++)
		TPT_REQUIRE(done.status[i] == 0, 1, "write %u: %d", i, done.status[i]);
	TPT_REQUIRE(done.order_errors == 0, 1, "writes completed out of order");
	for (unsigned i = 0; i < SLOW_DISTINCT; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	tpt_end_close(&e);
	return 0;
}

/* A child that has exited (not reaped yet). */
static bool exited(pid_t pid)
{
	siginfo_t si = { 0 };

	return waitid(P_PID, pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

struct rss_watch {
	long base_a, base_b, peak_a, peak_b;
};

/* Samples both daemons' RSS until @a and @b have exited, or @timeout_ms. */
static void watch_rss(pid_t a, pid_t b, struct rss_watch *w, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;

	while (tpt_now_ms() < deadline && !(exited(a) && exited(b))) {
		long ra = tpt_daemon_rss_kb(&tpt_peer_a), rb = tpt_daemon_rss_kb(&tpt_peer_b);
		w->peak_a = ra > w->peak_a ? ra : w->peak_a;
		w->peak_b = rb > w->peak_b ? rb : w->peak_b;
		sleep_ms(5); /* sampling interval, not synchronisation */
	}
}

static void check_rss(const struct rss_watch *w, const char *what)
{
	printf("%s: daemon RSS A %ld -> peak %ld KiB (+%ld), B %ld -> peak %ld KiB (+%ld), "
	       "bound +%ld KiB\n", what, w->base_a, w->peak_a, w->peak_a - w->base_a, w->base_b,
	       w->peak_b, w->peak_b - w->base_b, RSS_BOUND_KB);
	ck_assert_msg(w->peak_a - w->base_a < RSS_BOUND_KB, "A grew by %ld KiB",
		      w->peak_a - w->base_a);
	ck_assert_msg(w->peak_b - w->base_b < RSS_BOUND_KB, "B grew by %ld KiB",
		      w->peak_b - w->base_b);
}

START_TEST(test_peer_faults_slow_reader_keeps_daemon_memory_bounded)
{
	struct rss_watch w = { .base_a = tpt_daemon_rss_kb(&tpt_peer_a),
			       .base_b = tpt_daemon_rss_kb(&tpt_peer_b) };
	pid_t rp = tpt_fork(slow_reader, NULL), wp = tpt_fork(fast_writer, NULL);
	uint64_t t0 = tpt_now_ms();

	ck_assert_int_gt(rp, 0);
	ck_assert_int_gt(wp, 0);
	watch_rss(rp, wp, &w, 3 * T_MS);
	ck_assert(tpt_wait_ok(rp, T_MS, "slow reader"));
	ck_assert(tpt_wait_ok(wp, T_MS, "fast writer"));
	printf("1 GiB to a slow reader in %llu ms\n", (unsigned long long)(tpt_now_ms() - t0));
	check_rss(&w, "slow reader");
}
END_TEST

/* Eager messages: 1500 x 60 KiB (88 MiB) written as fast as the daemons take them. */
#define FLOOD_MSGS 1500
#define FLOOD_LEN (60u << 10)

static void flood_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 71;
	s->index = index;
	s->n_payloads = 1;
	s->lens[0] = FLOOD_LEN;
}

/* Starts reading only after 1 s, then reads every message in order. */
static int flood_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "flood-reader", .where = "flood",
			     .ready = &to_b, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0, 1, "setup");
	sleep_ms(1000); /* fall behind on purpose */
	for (unsigned i = 0; i < FLOOD_MSGS; i++) {
		flood_spec(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "message %u: %d", i, r);
	}
	tpt_end_close(&e);
	return 0;
}

/*
 * Writes every message with a blocking write; a write refused with -ENOBUFS (a full queue on the
 * way) is retried after a short pause, as a client that paces itself would.
 */
static int flood_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "flood-writer",
			     .where = tpt_peer_address(&tpt_peer_b, "flood", addr, sizeof(addr)),
			     .ready = &to_b, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	unsigned refused = 0;
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0, 1, "setup");
	for (unsigned i = 0; i < FLOOD_MSGS; i++) {
		flood_spec(i, &s);
		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
		while ((r = tp_pipe_write_sync(e.p, &m.m)) == -ENOBUFS && refused < 100000) {
			refused++;
			sleep_ms(2);
		}
		tpt_msg_free(e.ctx, &m);
		TPT_REQUIRE(r == 0, 1, "write %u: %d %s", i, r, tp_last_error());
	}
	tpt_log("flood writer: %u writes refused with -ENOBUFS and retried", refused);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peer_faults_eager_flood_keeps_daemon_memory_bounded)
{
	struct rss_watch w = { .base_a = tpt_daemon_rss_kb(&tpt_peer_a),
			       .base_b = tpt_daemon_rss_kb(&tpt_peer_b) };
	pid_t rp = tpt_fork(flood_reader, NULL), wp = tpt_fork(flood_writer, NULL);

	ck_assert_int_gt(rp, 0);
	ck_assert_int_gt(wp, 0);
	watch_rss(rp, wp, &w, 3 * T_MS);
	ck_assert(tpt_wait_ok(rp, T_MS, "flood reader"));
	ck_assert(tpt_wait_ok(wp, T_MS, "flood writer"));
	check_rss(&w, "eager flood");
}
END_TEST

/* ---- a source the writer's daemon cannot read ---------------------------------------------- */

#define UNREADABLE_LEN (4u << 20)

/*
 * The writer hands over a tensor of private memory it has already unmapped. Its daemon's first
 * read of it fails, so it sends nothing and says so (PeerXferEnd with the error): the write
 * and the remote read must both fail instead of the read waiting for bytes that never come.
 */
static int unreadable_writer(void *arg)
{
	char addr[128];
	struct tpt_end e = { .d = &tpt_peer_a, .ctx_name = "unreadable-writer",
			     .where = tpt_peer_address(&tpt_peer_b, "unreadable", addr,
						       sizeof(addr)),
			     .ready = &to_b, .timeout_ms = T_MS };
	void *gone = mmap(NULL, UNREADABLE_LEN, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = UNREADABLE_LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	int r = tpt_end_connect(&e);

	TPT_REQUIRE(r == 0 && gone != MAP_FAILED, 1, "setup");
	TPT_REQUIRE(munmap(gone, UNREADABLE_LEN) == 0, 1, "munmap");
	t.data = gone;
	r = tp_pipe_write_sync(e.p, &m);
	tpt_log("writer: %d (%s): %s", r, tp_strerror(r), r ? tp_last_error() : "");
	TPT_REQUIRE(r == -EFAULT, 1, "a write from unmapped memory: %d, want -EFAULT", r);
	/* The pipe stays open until the reader has its answer: a close would end its read too. */
	r = tpt_sync_wait(&to_parent, T_MS);
	TPT_REQUIRE(r == 0, 1, "the reader did not finish");
	tpt_end_close(&e);
	return 0;
}

static int unreadable_reader(void *arg)
{
	struct tpt_end e = { .d = &tpt_peer_b, .ctx_name = "unreadable-reader",
			     .where = "unreadable", .ready = &to_b, .timeout_ms = T_MS };
	struct tp_descriptor *d = NULL;
	uint8_t *buf = malloc(UNREADABLE_LEN);
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r = tpt_end_listen(&e, true);

	TPT_REQUIRE(r == 0 && buf, 1, "setup");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0 && d->n_tensors == 1 && d->tensors[0].length == UNREADABLE_LEN, 1,
		    "descriptor: %d", r);
	slot.data = buf;
	r = tp_pipe_read_sync(e.p, d, &a);
	tpt_log("reader: %d (%s): %s", r, tp_strerror(r), r ? tp_last_error() : "");
	TPT_REQUIRE(r == -EFAULT, 1, "a read of an unreadable source: %d, want -EFAULT", r);
	tpt_sync_post(&to_parent, 0);
	free(buf);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_peer_faults_unreadable_source_fails_both_ends)
{
	ck_assert(tpt_run_pair(unreadable_reader, unreadable_writer, NULL, T_MS));
	ck_assert_msg(cross_works(&tpt_peer_a, &tpt_peer_b, "after-unreadable"),
		      "the link does not carry a pipe after the failed transfer");
}
END_TEST

static Suite *peer_faults_suite(void)
{
	Suite *s = suite_create("peer_faults");
	TCase *conn = tcase_create("connect");
	TCase *dead = tcase_create("dead");
	TCase *keys = tcase_create("keys");
	TCase *junk = tcase_create("junk");
	TCase *flow = tcase_create("flow");

	tcase_add_checked_fixture(conn, setup, teardown);
	tcase_add_test(conn, test_peer_faults_unknown_listener_is_enoent);
	tcase_add_loop_test(conn, test_peer_faults_malformed_address_is_einval_at_once, 0,
			    (int)(sizeof(bad_addresses) / sizeof(bad_addresses[0])));
	tcase_add_test(conn, test_peer_faults_closed_port_is_refused_in_time);
	tcase_add_test(conn, test_peer_faults_silent_port_times_out);
	tcase_set_timeout(conn, 60);
	suite_add_tcase(s, conn);

	tcase_add_checked_fixture(dead, setup, teardown);
	tcase_add_loop_test(dead, test_peer_faults_daemon_killed_mid_transfer, 0, 2);
	tcase_add_test(dead, test_peer_faults_silent_remote_daemon_times_out);
	tcase_add_test(dead, test_peer_faults_unreadable_source_fails_both_ends);
	tcase_set_timeout(dead, 120);
	suite_add_tcase(s, dead);

	tcase_add_checked_fixture(keys, keys_setup, keys_teardown);
	tcase_add_test(keys, test_peer_faults_different_keys_are_refused);
	tcase_add_test(keys, test_peer_faults_key_on_one_side_is_refused);
	tcase_add_test(keys, test_peer_faults_same_key_authenticates);
	tcase_set_timeout(keys, 60);
	suite_add_tcase(s, keys);

	tcase_add_checked_fixture(junk, insecure_setup, teardown);
	tcase_add_loop_test(junk, test_peer_faults_junk_on_peer_port_closes_that_connection, 0,
			    JUNK_N);
	tcase_add_loop_test(junk, test_peer_faults_other_protocol_version_is_eprotonosupport, 0, 2);
	tcase_set_timeout(junk, 60);
	suite_add_tcase(s, junk);

	tcase_add_checked_fixture(flow, setup, teardown);
	tcase_add_test(flow, test_peer_faults_slow_reader_keeps_daemon_memory_bounded);
	tcase_add_test(flow, test_peer_faults_eager_flood_keeps_daemon_memory_bounded);
	tcase_set_timeout(flow, 200);
	suite_add_tcase(s, flow);
	return s;
}

int main(void)
{
	return tpt_run_suite(peer_faults_suite());
}
