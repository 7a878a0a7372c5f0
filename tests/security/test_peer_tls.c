/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: trust between daemons (issue 21, items 3, 4 and 5). Daemons on loopback peer
 * as remote hosts (the peer fixture: --peer-force-cross-host, one shared key file). The attacks:
 * a local user (uid 65534) makes daemon B dial its port, relays B's bytes to daemon A and injects
 * its own frame once A has authenticated the relayed handshake; a raw client speaks the old
 * plaintext PeerHello; two daemons hold different keys; a key holder (this test process, with
 * its own TLS client over the daemon's TLS helpers) attaches a data connection to a link with a
 * forged, replayed or other link's binding token, and opens a link to A that claims daemon B's
 * listener port; a daemon without authentication must open no TCP port, and one with the
 * insecure switch must say so at start, on every link and in tpipctl. Each case asserts the
 * refusal, its log line (once), and that nothing else was disturbed.
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <openssl/ssl.h>
#include "ipeer.h"
#include "itest.h"
#include "peerauth.h"
#include "peertls.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(60000)
#define LOG_MS TPT_SCALED_MS(5000)

static struct tpt_daemon da, db;

static void pair_setup(void)
{
	ck_assert_int_eq(tpt_daemon_pair_start(&da, tpt_peer_args(), &db, tpt_peer_args()), 0);
}

static void pair_teardown(void)
{
	int ra = tpt_daemon_stop(&da), rb = tpt_daemon_stop(&db);

	ck_assert_int_eq(ra, 0);
	ck_assert_int_eq(rb, 0);
}

/* A pair that proves that a client of @from reaches a listener @name of @to. */
static bool cross_works(const struct tpt_daemon *from, const struct tpt_daemon *to,
			const char *name)
{
	return tpt_peer_cross_works(from, to, name, 60, T_MS);
}

static int loopback_listen(int *ret_port)
{
	int fd = tpt_loopback_listen(ret_port);

	ck_assert_int_ge(fd, 0);
	return fd;
}

static int tcp_connect(int port)
{
	struct sockaddr_in in = {.sin_family = AF_INET,
				 .sin_port = htons((uint16_t)port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&in, sizeof(in)) < 0) {
		int e = -errno;
		close(fd);
		return e;
	}
	return fd;
}

static bool has_magic(const uint8_t *b, size_t n)
{
	return memmem(b, n, "TPW1", 4) != NULL;
}

/* ---- a key holder's TLS client (the test process, not a daemon) ---------------------------- */

static struct tpd_peertls *fake_tls;
static struct tpd_peer_key fake_key;

static void fake_tls_init(void)
{
	char why[300];
	struct tpd_peertls_config c = {0};

	if (fake_tls)
		return;
	ck_assert_msg(tpd_peerauth_key_load(tpt_peer_key_file(), &fake_key, why, sizeof(why)) == 0,
		      "key: %s", why);
	c.key = &fake_key;
	ck_assert_msg(tpd_peertls_new(&c, &fake_tls, why, sizeof(why)) == 0, "tls: %s", why);
}

struct fconn {
	int fd;
	SSL *ssl;
};

/* A TLS connection to @port as a key holder would open it. Return: 0 or -EACCES. */
static int fconn_open(struct fconn *c, int port)
{
	fake_tls_init();
	c->fd = tcp_connect(port);
	ck_assert_int_ge(c->fd, 0);
	c->ssl = tpd_peertls_ssl_new(fake_tls, false, "127.0.0.1");
	ck_assert_ptr_nonnull(c->ssl);
	SSL_set_fd(c->ssl, c->fd);
	return SSL_connect(c->ssl) == 1 ? 0 : -EACCES;
}

static void fconn_close(struct fconn *c)
{
	SSL_free(c->ssl);
	close(c->fd);
	c->ssl = NULL;
	c->fd = -1;
}

static void fconn_send(struct fconn *c, Tpw__V1__PeerMsg *m)
{
	uint8_t buf[1024];
	size_t n = tpw_frame_size(&m->base);

	ck_assert_uint_le(n, sizeof(buf));
	tpw_frame_pack(&m->base, 0, 0, 1, buf);
	ck_assert_int_eq(SSL_write(c->ssl, buf, (int)n), (int)n);
}

static int ssl_read_all(SSL *ssl, uint8_t *b, size_t n)
{
	for (size_t done = 0; done < n;) {
		int r = SSL_read(ssl, b + done, (int)(n - done));
		if (r <= 0)
			return -ECONNRESET;
		done += (size_t)r;
	}
	return 0;
}

/* One frame from @c (with a receive timeout). Return: 0 with @ret, or -ECONNRESET (closed). */
static int fconn_recv(struct fconn *c, Tpw__V1__PeerMsg **ret)
{
	uint8_t buf[8192];
	struct tpw_hdr h;
	struct timeval tv = {LOG_MS / 1000, 0};

	setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	if (ssl_read_all(c->ssl, buf, TPW_HDR_SIZE) < 0)
		return -ECONNRESET;
	ck_assert_int_eq(tpw_hdr_parse(buf, sizeof(buf) - TPW_HDR_SIZE, &h), 0);
	ck_assert_uint_eq(h.data_len, 0);
	if (ssl_read_all(c->ssl, buf + TPW_HDR_SIZE, h.msg_len) < 0)
		return -ECONNRESET;
	ck_assert_int_eq(tpw_peer_msg_unpack(buf + TPW_HDR_SIZE, h.msg_len, ret), 0);
	return 0;
}

/* A link of a fake dialler, up to its PeerReady (data connections may now attach). */
struct flink {
	struct fconn ctl;
	uint64_t link_id;
	uint8_t link_key[TPD_PEERTLS_BIND_LEN];
};

static void flink_open(struct flink *l, int port, uint32_t claimed_port, uint32_t data_conns)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	uint8_t boot[16];

	ck_assert_int_eq(fconn_open(&l->ctl, port), 0);
	for (unsigned i = 0; i < 16; i++)
		boot[i] = (uint8_t)(0xa0 + i);
	h.major = TPW_PEER_PROTO_MAJOR;
	h.minor = TPW_PEER_PROTO_MINOR;
	h.host = "fake-dialler";
	h.boot_id.data = boot;
	h.boot_id.len = 16;
	h.instance = 0x5eed5eed5eedull + claimed_port;
	h.data_conns = data_conns;
	h.listen_port = claimed_port;
	h.force_cross_host = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	fconn_send(&l->ctl, &m);
	ck_assert_int_eq(fconn_recv(&l->ctl, &in), 0);
	ck_assert_int_eq(in->body_case, TPW__V1__PEER_MSG__BODY_HELLO);
	ck_assert_msg(!in->hello->status || in->hello->status == TPW__V1__STATUS__STATUS_OK,
		      "hello refused: %s", in->hello->message ? in->hello->message : "?");
	tpw_peer_msg_free(in);
	ck_assert_int_eq(fconn_recv(&l->ctl, &in), 0);
	ck_assert_int_eq(in->body_case, TPW__V1__PEER_MSG__BODY_READY);
	l->link_id = in->ready->link_id;
	tpw_peer_msg_free(in);
	ck_assert_int_eq(tpd_peertls_link_key(l->ctl.ssl, l->link_id, l->link_key), 0);
}

/* A data connection to @port offering @token (NULL: the right one for @key and this session)
 * for @link_id, connection @index. Return: 0 when the daemon answers with a valid proof,
 * -ECONNRESET when it closes. */
static int data_attach(int port, uint64_t link_id, const uint8_t *key, unsigned index,
		       const uint8_t *token, struct fconn *ret)
{
	Tpw__V1__PeerDataHello h = TPW__V1__PEER_DATA_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	uint8_t t[TPD_PEERTLS_BIND_LEN], want[TPD_PEERTLS_BIND_LEN];
	int r;

	ck_assert_int_eq(fconn_open(ret, port), 0);
	if (!token) {
		ck_assert_int_eq(tpd_peertls_binding(key, ret->ssl, index, true, t), 0);
		token = t;
	}
	h.link_id = link_id;
	h.index = index;
	h.mac.data = (uint8_t *)token;
	h.mac.len = TPD_PEERTLS_BIND_LEN;
	m.body_case = TPW__V1__PEER_MSG__BODY_DATA_HELLO;
	m.data_hello = &h;
	fconn_send(ret, &m);
	r = fconn_recv(ret, &in);
	if (r < 0)
		return r;
	ck_assert_int_eq(in->body_case, TPW__V1__PEER_MSG__BODY_DATA_HELLO);
	ck_assert_int_eq(tpd_peertls_binding(key, ret->ssl, index, false, want), 0);
	ck_assert_msg(
	    tpd_peertls_binding_ok(want, in->data_hello->mac.data, in->data_hello->mac.len),
	    "the daemon's answer does not prove the link");
	tpw_peer_msg_free(in);
	return 0;
}

/* ---- 1. relay of a daemon's handshake ---------------------------------------------------- */

struct relay {
	int lfd, a_port;
	struct tpt_sync go;   /* the test: A has authenticated the relayed handshake */
	struct tpt_sync seen; /* the child: what it saw of A's bytes (1: plaintext) */
};

/* Parent side of the relay's victim: B dials through the attacker; a client of B asks for it. */
static int attacker_client(void *arg)
{
	const int *port = arg;
	struct tp_context *ctx;
	struct tp_pipe *p;
	char addr[64];
	int r;

	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		return 2;
	r = tpt_ctx_new(&db, 0, "attacker", &ctx);
	TPT_REQUIRE(r == 0, 1, "context on B: %d", r);
	snprintf(addr, sizeof(addr), "tpip://127.0.0.1:%d/relay", *port);
	r = tp_connect(ctx, addr, &p);
	if (r == 0) {
		tp_pipe_wait_connected(p, TPT_SCALED_MS(10000));
		tp_pipe_close(p);
	}
	tp_context_free(ctx);
	return 0;
}

#define RELAY_PAIRS 8

/*
 * The attacker (uid 65534): accepts every connection B makes to its port (the control connection
 * first, then the data connections) and relays each to A's peer port, byte for byte, watching
 * A's bytes for plaintext frames. Once told that A brought the link up, it stops forwarding B's
 * control bytes and writes its own PeerConnect for A's listener "secret" instead, then reads
 * whatever A sends until A closes or 10 s pass.
 */
static int attacker_relay(void *arg)
{
	struct relay *rl = arg;
	struct pollfd pf[2 + 2 * RELAY_PAIRS];
	int peer_of[2 + 2 * RELAY_PAIRS];
	unsigned n = 2;
	uint8_t buf[65536];
	bool plaintext = false, injected = false;

	if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 ||
	    setresuid(65534, 65534, 65534) < 0)
		return 2;
	pf[0] = (struct pollfd){.fd = rl->lfd, .events = POLLIN};
	pf[1] = (struct pollfd){.fd = rl->go.fd[0], .events = POLLIN};
	for (;;) {
		int k = poll(pf, n, injected ? TPT_SCALED_MS(10000) : -1);
		if (k <= 0)
			break;
		if ((pf[0].revents & POLLIN) && n + 2 <= 2 + 2 * RELAY_PAIRS) {
			int b = accept(rl->lfd, NULL, NULL), a = tcp_connect(rl->a_port);
			TPT_REQUIRE(b >= 0 && a >= 0, 1, "relay: accept %d, connect %d", b, a);
			pf[n] = (struct pollfd){.fd = b, .events = POLLIN};
			peer_of[n++] = a;
			pf[n] = (struct pollfd){.fd = a, .events = POLLIN};
			peer_of[n++] = b;
		}
		if (!injected && (pf[1].revents & POLLIN)) {
			/* A authenticated the relayed link: speak for ourselves now. */
			Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
			Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;
			size_t len;
			pc.pipe_id = 77;
			pc.name = "secret";
			pc.remote_name = "attacker";
			m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
			m.connect = &pc;
			len = tpw_frame_pack(&m.base, 0, 0, 99, buf);
			TPT_REQUIRE(n >= 4, 1, "go before any connection");
			(void)!write(pf[3].fd, buf, len); /* A's side of the control connection */
			injected = true;
			pf[2].fd = -1; /* B's control bytes are no longer forwarded */
			pf[1].fd = -1;
			continue;
		}
		for (unsigned i = 2; i < n; i++) {
			ssize_t r;
			if (pf[i].fd < 0 || !(pf[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			r = read(pf[i].fd, buf, sizeof(buf));
			if (r <= 0) {
				if (i == 3 && injected)
					goto out; /* A closed the control connection on us */
				pf[i].fd = -1;
				continue;
			}
			if (i % 2 == 1) /* from A */
				plaintext |= has_magic(buf, (size_t)r);
			if (!(injected && i == 3))
				(void)!write(peer_of[i], buf, (size_t)r);
		}
	}
out:
	tpt_sync_post(&rl->seen, plaintext ? 1 : 0);
	return 0;
}

START_TEST(test_relay_of_a_daemon_handshake_gives_the_attacker_nothing)
{
	struct relay rl = {0};
	struct tpt_end victim = {
	    .d = &da, .ctx_name = "victim", .where = "secret", .timeout_ms = T_MS};
	int port, plain;
	pid_t client, relay;

	ck_assert_int_eq(tpt_sync_init(&rl.go), 0);
	ck_assert_int_eq(tpt_sync_init(&rl.seen), 0);
	ck_assert_int_eq(tpt_end_listen(&victim, false), 0); /* "secret" on A */
	ck_assert_int_eq(tpt_daemon_open_to_all(&db), 0);
	rl.lfd = loopback_listen(&port);
	rl.a_port = da.peer_port;
	relay = tpt_fork(attacker_relay, &rl);
	client = tpt_fork(attacker_client, &port);
	ck_assert_int_gt(relay, 0);
	ck_assert_int_gt(client, 0);
	/* A brings the relayed link up: the handshake is B's and A authenticates B. */
	ck_assert_msg(tpt_daemon_wait_log(&da, "link up to", LOG_MS, NULL, 0) == 0,
		      "A never brought the relayed link up");
	ck_assert_int_eq(tpt_sync_post(&rl.go, 1), 0);
	ck_assert(tpt_wait_ok(relay, T_MS, "relay"));
	ck_assert(tpt_wait_ok(client, T_MS, "attacker client"));
	plain = tpt_sync_wait(&rl.seen, T_MS);
	/* The relay has ended (A closed on it, or 10 s passed after the injection). */
	ck_assert_msg(!tpt_daemon_log_has(&da, "from 'attacker'") &&
			  !tpt_daemon_log_has(&da, "accepted 'attacker'") &&
			  !tpt_daemon_log_has(&da, ": accepted '"),
		      "A served the attacker a pipe to 'secret'");
	ck_assert_msg(plain == 0, "the attacker read plaintext frames of A's side of the link");
	/* The injected frame fails A's TLS record check: the link dies, nothing is served. */
	ck_assert_msg(tpt_daemon_wait_log(&da, "link failed", LOG_MS, NULL, 0) == 0,
		      "A kept a link with injected bytes");
	tpt_end_close(&victim);
	close(rl.lfd);
	tpt_sync_done(&rl.go);
	tpt_sync_done(&rl.seen);
	ck_assert(cross_works(&db, &da, "after-relay"));
}
END_TEST

/* ---- 2. the old plaintext protocol ------------------------------------------------------- */

START_TEST(test_plaintext_hello_is_refused_and_logged_once)
{
	Tpw__V1__PeerHello h = TPW__V1__PEER_HELLO__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *ans = NULL;
	struct tpt_raw r;
	uint8_t boot[16] = {1, 2, 3}, nonce[32] = {0};

	ck_assert_int_eq(tpt_raw_connect_tcp(&r, "127.0.0.1", da.peer_port), 0);
	h.major = 1; /* an old daemon's hello, as it sends it in plaintext */
	h.minor = 3;
	h.host = "old-daemon";
	h.boot_id.data = boot;
	h.boot_id.len = 16;
	h.instance = 4242;
	h.data_conns = 4;
	h.nonce.data = nonce;
	h.nonce.len = 32;
	h.force_cross_host = true;
	m.body_case = TPW__V1__PEER_MSG__BODY_HELLO;
	m.hello = &h;
	ck_assert_int_eq(tpt_raw_send_peer(&r, &m), 0);
	ck_assert_int_eq(tpt_raw_recv_peer(&r, LOG_MS, &ans), 0);
	ck_assert_int_eq(ans->body_case, TPW__V1__PEER_MSG__BODY_HELLO);
	ck_assert_msg(ans->hello->status == TPW__V1__STATUS__STATUS_PERMISSION,
		      "a plaintext hello got status %d, want a refusal", ans->hello->status);
	ck_assert_ptr_nonnull(strstr(ans->hello->message, "TLS"));
	tpw_peer_msg_free(ans);
	ck_assert_int_eq(tpt_raw_wait_closed(&r, LOG_MS), 0);
	tpt_raw_close(&r);
	ck_assert_int_eq(tpt_daemon_wait_log(&da, "plaintext peer protocol", LOG_MS, NULL, 0), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "plaintext peer protocol"), 1);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "accepted from"), 0);
	ck_assert(cross_works(&db, &da, "after-plaintext"));
}
END_TEST

/* Connects to A's peer port, sends a few plaintext bytes and waits until A closes. */
static void plaintext_knock(void)
{
	struct tpt_raw r;

	ck_assert_int_eq(tpt_raw_connect_tcp(&r, "127.0.0.1", da.peer_port), 0);
	ck_assert_int_eq(tpt_raw_send_bytes(&r, "TPW1junk", 8, NULL, 0), 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&r, LOG_MS), 0);
	tpt_raw_close(&r);
}

/* The same from source address 127.0.0.2: another source to the daemon. */
static void plaintext_knock_from_2(void)
{
	struct tpt_raw r;

	ck_assert_int_eq(tpt_raw_connect_tcp_from(&r, "127.0.0.2", "127.0.0.1", da.peer_port), 0);
	ck_assert_int_eq(tpt_raw_send_bytes(&r, "TPW1junk", 8, NULL, 0), 0);
	ck_assert_int_eq(tpt_raw_wait_closed(&r, LOG_MS), 0);
	tpt_raw_close(&r);
}

/* Refusals anyone can cause are logged at most 20 per 10 s for each source address: 20 are,
 * the 21st is not; another source's refusal still is (one budget for all sources used to go to
 * the first one's flood). */
START_TEST(test_refusal_logs_are_bounded)
{
	for (int i = 0; i < 20; i++)
		plaintext_knock();
	ck_assert_int_eq(tpt_daemon_log_count(&da, "plaintext peer protocol"), 20);
	plaintext_knock();
	ck_assert_int_eq(tpt_daemon_log_count(&da, "plaintext peer protocol"), 20);
	plaintext_knock_from_2();
	ck_assert_int_eq(tpt_daemon_log_count(&da, "plaintext peer protocol"), 21);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "from 127.0.0.2:"), 1);
	ck_assert(tpt_daemon_alive(&da));
}
END_TEST

/* Connects to A's peer port from @src (127.0.0.1 or .2) and closes at once, sending nothing. */
static void silent_knock(const char *src)
{
	struct tpt_raw r;

	ck_assert_int_eq(tpt_raw_connect_tcp_from(&r, src, "127.0.0.1", da.peer_port), 0);
	tpt_raw_close(&r);
}

/*
 * Connections closed before their hello are noted within the same budget per source address as
 * refusals: of 60 from 127.0.0.1 at most 20 lines, and one from 127.0.0.2 after them is still
 * logged. On the old daemon each was a line of its own (60), for anyone who reaches the port.
 */
START_TEST(test_connections_closed_before_their_hello_are_logged_within_the_budget)
{
	const char *what = "closed before its hello";
	int before = tpt_daemon_log_count(&da, what), after;

	for (int i = 0; i < 60; i++)
		silent_knock("127.0.0.1");
	silent_knock("127.0.0.2");
	ck_assert_int_eq(tpt_daemon_wait_log(&da, "from 127.0.0.2:", LOG_MS, NULL, 0), 0);
	usleep(300 * 1000); /* any of the 60 not handled yet */
	after = tpt_daemon_log_count(&da, what);
	ck_assert_msg(after - before >= 1 && after - before <= 21,
		      "%d lines of 61 connections closed before their hello", after - before);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "from 127.0.0.2:"), 1);
	ck_assert(tpt_daemon_alive(&da));
}
END_TEST

/* ---- 3. a wrong key ---------------------------------------------------------------------- */

static char other_key[128];

static int wrong_key_connect(void *arg)
{
	struct tpt_daemon *other = arg;
	struct tp_context *ctx;
	struct tp_pipe *p;
	char addr[128];
	int r = tpt_ctx_new(other, 0, "wrong-key", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, tpt_peer_address(&da, "keyed", addr, sizeof(addr)), &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -EACCES, 1, "connect with a wrong key: %d (%s), want -EACCES", r,
		    tp_last_error());
	TPT_REQUIRE(strstr(tp_last_error(), "wrong pre-shared key"), 1,
		    "the error does not name the key: %s", tp_last_error());
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_wrong_key_fails_the_handshake_on_both_ends)
{
	struct tpt_daemon other;
	const char *const *t = tpt_peer_args();
	const char *args[8] = {t[0], t[1], t[2], t[3], "--peer-key-file", other_key, NULL};
	struct tpt_end e = {.d = &da, .ctx_name = "keyed", .where = "keyed", .timeout_ms = T_MS};
	FILE *f;
	pid_t pid;

	snprintf(other_key, sizeof(other_key), "%s/other.key", da.dir);
	f = fopen(other_key, "w");
	ck_assert_ptr_nonnull(f);
	fputs("another-key-another-key-another-key\n", f);
	fclose(f);
	ck_assert_int_eq(chmod(other_key, 0600), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&other, args), 0);
	ck_assert_int_eq(tpt_end_listen(&e, false), 0);
	pid = tpt_fork(wrong_key_connect, &other);
	ck_assert(tpt_wait_ok(pid, T_MS, "connector"));
	tpt_end_close(&e);
	ck_assert_int_eq(tpt_daemon_wait_log(&da, "wrong pre-shared key", LOG_MS, NULL, 0), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&other, "wrong pre-shared key", LOG_MS, NULL, 0), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "TLS handshake failed"), 1);
	ck_assert_int_eq(tpt_daemon_log_count(&other, "link failed"), 1);
	ck_assert_int_eq(tpt_daemon_stop(&other), 0);
	ck_assert(cross_works(&db, &da, "after-wrong-key"));
}
END_TEST

/* ---- 4. data connection hijack ----------------------------------------------------------- */

START_TEST(test_data_connection_needs_its_links_session)
{
	struct flink l1, l2;
	struct fconn c, ok;
	uint8_t forged[TPD_PEERTLS_BIND_LEN], replay[TPD_PEERTLS_BIND_LEN];
	int port = da.peer_port;

	flink_open(&l1, port, 0, 1);
	flink_open(&l2, port, 0, 1);
	/* a forged token */
	memset(forged, 0x5a, sizeof(forged));
	ck_assert_int_eq(data_attach(port, l1.link_id, l1.link_key, 0, forged, &c), -ECONNRESET);
	fconn_close(&c);
	/* a token replayed from another data connection of the same link (another session) */
	ck_assert_int_eq(fconn_open(&ok, port), 0);
	ck_assert_int_eq(tpd_peertls_binding(l1.link_key, ok.ssl, 0, true, replay), 0);
	fconn_close(&ok);
	ck_assert_int_eq(data_attach(port, l1.link_id, l1.link_key, 0, replay, &c), -ECONNRESET);
	fconn_close(&c);
	/* another link's key: valid for l2, presented for l1 */
	ck_assert_int_eq(data_attach(port, l1.link_id, l2.link_key, 0, NULL, &c), -ECONNRESET);
	fconn_close(&c);
	ck_assert_int_eq(tpt_daemon_log_count(&da, "wrong or replayed binding token"), 3);
	/* the link itself is untouched: its real dialler still attaches */
	ck_assert_int_eq(data_attach(port, l1.link_id, l1.link_key, 0, NULL, &c), 0);
	ck_assert_int_eq(tpt_daemon_wait_log(&da, "link up to fake-dialler", LOG_MS, NULL, 0), 0);
	fconn_close(&c);
	fconn_close(&l1.ctl);
	fconn_close(&l2.ctl);
	ck_assert(cross_works(&db, &da, "after-hijack"));
}
END_TEST

/* ---- 5. a link that claims another daemon's port ----------------------------------------- */

START_TEST(test_claimed_port_does_not_capture_dials)
{
	struct flink l;
	struct fconn d;
	struct tpt_link first;
	Tpw__V1__PeerMsg *in = NULL;

	/* A key holder links to A and claims B's listener port, then brings its link up. */
	flink_open(&l, da.peer_port, (uint32_t)db.peer_port, 1);
	ck_assert_int_eq(data_attach(da.peer_port, l.link_id, l.link_key, 0, NULL, &d), 0);
	ck_assert_int_eq(fconn_recv(&l.ctl, &in), 0); /* PeerReady, data up */
	ck_assert_int_eq(in->body_case, TPW__V1__PEER_MSG__BODY_READY);
	tpw_peer_msg_free(in);
	/* A client of A dials B: the pipe must reach B's listener, not the impostor. */
	ck_assert(cross_works(&da, &db, "claimed"));
	ck_assert_int_eq(tpt_peer_links(&da, &first), 2); /* the impostor's and A's own to B */
	/* Nothing but keepalives reached the impostor. */
	{
		int fl = fcntl(l.ctl.fd, F_GETFL);
		fcntl(l.ctl.fd, F_SETFL, fl | O_NONBLOCK);
		for (;;) {
			uint8_t b[TPW_HDR_SIZE];
			int r = SSL_read(l.ctl.ssl, b, sizeof(b));
			if (r <= 0)
				break;
			ck_assert_int_eq(r, TPW_HDR_SIZE);
			/* pings are 2..40 bytes; a PeerConnect names a listener: read and check */
			{
				struct tpw_hdr h;
				uint8_t body[4096];
				ck_assert_int_eq(tpw_hdr_parse(b, sizeof(body), &h), 0);
				fcntl(l.ctl.fd, F_SETFL, fl);
				ck_assert_int_eq(ssl_read_all(l.ctl.ssl, body, h.msg_len), 0);
				fcntl(l.ctl.fd, F_SETFL, fl | O_NONBLOCK);
				ck_assert_int_eq(tpw_peer_msg_unpack(body, h.msg_len, &in), 0);
				ck_assert_msg(in->body_case == TPW__V1__PEER_MSG__BODY_PING,
					      "the impostor got a %s", in->base.descriptor->name);
				tpw_peer_msg_free(in);
			}
		}
	}
	fconn_close(&d);
	fconn_close(&l.ctl);
}
END_TEST

/* ---- 6. no authentication, no network listener ------------------------------------------- */

/* A client of keyless daemon @arg dials another host: refused at once, saying why. */
static int keyless_dial(void *arg)
{
	struct tp_context *ctx;
	struct tp_pipe *p;
	int r = tpt_ctx_new(arg, 0, "keyless", &ctx);

	TPT_REQUIRE(r == 0, 1, "context: %d", r);
	r = tp_connect(ctx, "tpip://127.0.0.1:9/x", &p);
	TPT_REQUIRE(r == 0, 1, "tp_connect: %d", r);
	r = tp_pipe_wait_connected(p, T_MS);
	TPT_REQUIRE(r == -EACCES, 1, "dial without authentication: %d (%s), want -EACCES", r,
		    tp_last_error());
	TPT_REQUIRE(strstr(tp_last_error(), "no peer authentication configured"), 1,
		    "unclear error: %s", tp_last_error());
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

START_TEST(test_no_key_opens_no_tcp_port)
{
	struct tpt_daemon d;
	int port, lfd = loopback_listen(&port), fd;
	char spec[64];
	const char *args[] = {"--peer-listen", spec, "--log-level", "info", NULL};
	char *out;

	close(lfd); /* a free port, now nobody's */
	snprintf(spec, sizeof(spec), "127.0.0.1:%d", port);
	ck_assert_int_eq(tpt_daemon_start(&d, args), 0);
	ck_assert_int_eq(
	    tpt_daemon_wait_log(&d, "not opened: no peer authentication", LOG_MS, NULL, 0), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&d, "not opened: no peer authentication"), 1);
	fd = tcp_connect(port);
	ck_assert_msg(fd == -ECONNREFUSED, "the daemon without a key accepts TCP on %d (%d)", port,
		      fd);
	out = tpt_ctl(&d, "status", true);
	ck_assert_ptr_nonnull(strstr(out, "\"peer_listen\": \"\""));
	ck_assert_ptr_nonnull(strstr(out, "\"peer_auth\": \"none\""));
	free(out);
	ck_assert(tpt_wait_ok(tpt_fork(keyless_dial, &d), T_MS, "keyless dial"));
	ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}
END_TEST

/* ---- 7. the insecure switch is loud --------------------------------------------------------- */

START_TEST(test_insecure_switch_is_loud_and_shown)
{
	struct tpt_daemon a, b;
	const char *const *t = tpt_peer_args();
	const char *args[8] = {"--peer-insecure", t[0], t[1], t[2], t[3], NULL};
	char *out;

	ck_assert_int_eq(tpt_daemon_pair_start(&a, args, &b, args), 0);
	ck_assert_int_eq(tpt_daemon_log_count(&a, "peer links are INSECURE"), 1);
	ck_assert(cross_works(&a, &b, "insecure"));
	ck_assert_int_eq(tpt_daemon_log_count(&b, "WITHOUT authentication (--peer-insecure)"), 1);
	out = tpt_ctl(&b, "peers", true);
	ck_assert_msg(strstr(out, "\"security\": \"insecure\""), "peers: %s", out);
	free(out);
	out = tpt_ctl(&b, "peers", false);
	ck_assert_msg(strstr(out, "INSECURE"), "peers table: %s", out);
	free(out);
	out = tpt_ctl(&a, "status", true);
	ck_assert_msg(strstr(out, "\"peer_auth\": \"insecure\""), "status: %s", out);
	free(out);
	ck_assert_int_eq(tpt_daemon_stop(&a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&b), 0);
}
END_TEST

static Suite *peer_tls_suite(void)
{
	Suite *s = suite_create("peer_tls");
	TCase *tc = tcase_create("attacks");
	TCase *solo = tcase_create("default");

	tcase_add_checked_fixture(tc, pair_setup, pair_teardown);
	tcase_add_test(tc, test_relay_of_a_daemon_handshake_gives_the_attacker_nothing);
	tcase_add_test(tc, test_plaintext_hello_is_refused_and_logged_once);
	tcase_add_test(tc, test_refusal_logs_are_bounded);
	tcase_add_test(tc, test_connections_closed_before_their_hello_are_logged_within_the_budget);
	tcase_add_test(tc, test_wrong_key_fails_the_handshake_on_both_ends);
	tcase_add_test(tc, test_data_connection_needs_its_links_session);
	tcase_add_test(tc, test_claimed_port_does_not_capture_dials);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	tcase_add_test(solo, test_no_key_opens_no_tcp_port);
	tcase_add_test(solo, test_insecure_switch_is_loud_and_shown);
	tcase_set_timeout(solo, 60);
	suite_add_tcase(s, solo);
	return s;
}

int main(void)
{
	return tpt_run_suite(peer_tls_suite());
}
