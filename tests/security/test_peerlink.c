/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: a peer link's control connection against a hostile peer daemon (a raw
 * dialler over an insecure link, as --peer-insecure allows; a key holder speaks the same frames
 * inside TLS). It sends requests whose answers it never reads: pings, each answered by a pong.
 * The answers waiting for its control connection are bounded by --peer-queue-bytes: a peer that
 * leaves fewer waiting keeps its link and gets them all once it reads, one that leaves more
 * fails its link (the daemon used to queue every answer, as much memory as the peer cared to
 * ask for), and the daemon serves its local clients on.
 * A peer whose Hello states frames below 4096 bytes is refused before its link exists (it was
 * sent no frame at all, and each of its pings made the daemon log an error). The refusals of its
 * group joins are logged in bursts (each was logged), and so are its reads of messages never
 * announced on its pipe (each was logged).
 * One peer's connects waiting for a listener keep only its share of the daemon's places, so
 * another peer's still wait (one peer used to be able to take them all).
 * A peer daemon proven by a certificate is charged for the channels it creates under that
 * certificate, and one that holds the pre-shared key under the address its link comes from,
 * whatever host name its hello states (each name got it another share).
 */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include "ipeer.h"
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(20000)
#define QUEUE_MAX (1u << 20) /* --peer-queue-bytes of the test's daemon */

static struct tpt_daemon host;

static void setup(void)
{
	char to[16];
	const char *args[] = { "--peer-insecure", "--peer-timeout", to, "--peer-queue-bytes",
			       "1M", NULL };

	/* long enough that no keepalive ends a link the test keeps from reading */
	snprintf(to, sizeof(to), "%d", TPT_SCALED_MS(60000));
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
}

static void teardown(void)
{
	ck_assert_int_eq(tpt_daemon_stop(&host), 0);
}

/* Dials @host's peer port as a daemon would (one data connection) whose Hello states
 * @frame_max, up to the link being up. Return: as tpt_raw_peer_dial(). */
static int peer_dial_frames(struct tpt_raw *c, struct tpt_raw *data, uint32_t frame_max)
{
	/* A small window from the first segment: what the daemon sends piles up on its side, not
	 * in this socket. (Shrunk once the connection was up, the buffer made the kernel drop
	 * segments the window had let in and retransmit them; once, under CI's load, the daemon
	 * then received no ping for its 60 s keepalive and failed the link on silence.) */
	const struct tpt_raw_peer_hello h = { .port = host.peer_port, .boot_base = 0xb0,
					      .instance = 0x5eed, .frame_max = frame_max,
					      .timeout_ms = T_MS, .rcvbuf = 4096 };
	int r = tpt_raw_peer_dial(&h, c, data);

	if (r < 0)
		return r;
	setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &(struct timeval){ T_MS / 1000, 0 },
		   sizeof(struct timeval));
	return 0;
}

static void peer_dial(struct tpt_raw *c, struct tpt_raw *data)
{
	ck_assert_int_eq(peer_dial_frames(c, data, 0), 0);
}

/* One ping frame (not a reply: the daemon answers it) into @buf. Return: its size. */
static size_t ping_frame(uint8_t *buf, size_t len, uint64_t seq)
{
	Tpw__V1__PeerPing p = TPW__V1__PEER_PING__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	p.t_ns = 1;
	m.body_case = TPW__V1__PEER_MSG__BODY_PING;
	m.ping = &p;
	ck_assert_uint_le(tpw_frame_size(&m.base), len);
	return tpw_frame_pack(&m.base, 0, 0, seq, buf);
}

/*
 * Sends pings whose pongs add up to @bytes, reading nothing, in writes of 64 KiB.
 * Return: the pings sent, or -errno of the first write the daemon refused.
 */
static long send_pings(struct tpt_raw *c, uint64_t bytes)
{
	static uint8_t buf[64u << 10];
	uint8_t one[64];
	size_t n = ping_frame(one, sizeof(one), 1), per = sizeof(buf) / n;
	long sent = 0;

	for (size_t i = 0; i < per; i++)
		memcpy(buf + i * n, one, n);
	while ((uint64_t)sent * n < bytes) {
		size_t off = 0;

		while (off < per * n) {
			ssize_t k = send(c->fd, buf + off, per * n - off, MSG_NOSIGNAL);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				return k < 0 ? -errno : -ECONNRESET;
			off += (size_t)k;
		}
		sent += (long)per;
	}
	return sent;
}

/* Reads frames from @c until @want pongs came or nothing comes for a while.
 * Return: the pongs read. */
static long read_pongs(struct tpt_raw *c, long want)
{
	Tpw__V1__PeerMsg *in = NULL;
	long got = 0;

	setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &(int){ 1 << 20 }, sizeof(int));
	while (got < want && tpt_raw_recv_peer(c, T_MS, &in) == 0) {
		got += in->body_case == TPW__V1__PEER_MSG__BODY_PING && in->ping->reply;
		tpw_peer_msg_free(in);
	}
	return got;
}

START_TEST(test_peer_that_reads_no_answers_below_the_queue_limit_keeps_its_link)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	struct tpt_link l;
	long sent;

	peer_dial(&c, &data);
	/* half the limit, all of it waiting in the daemon in the worst case */
	sent = send_pings(&c, QUEUE_MAX / 2);
	ck_assert_int_gt(sent, 0);
	ck_assert_int_eq(tpt_peer_links(&host, &l), 1);
	ck_assert_str_eq(l.state, "up");
	ck_assert_int_eq(read_pongs(&c, sent), sent);
	ck_assert_int_eq(tpt_peer_links(&host, &l), 1);
	ck_assert_str_eq(l.state, "up");
	ck_assert(!tpt_daemon_log_has(&host, "does not read its control connection"));
	tpt_raw_close(&data);
	tpt_raw_close(&c);
}
END_TEST

START_TEST(test_peer_that_reads_no_answers_above_the_queue_limit_fails_its_link)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	struct tp_context *ctx;
	long sent;

	peer_dial(&c, &data);
	/* 64 times the limit: far more than the limit and both sockets' buffers hold */
	sent = send_pings(&c, 64ull * QUEUE_MAX);
	ck_assert_msg(sent < 0, "the daemon took %ld pings and queued every answer", sent);
	ck_assert(tpt_peer_links_gone(&host, T_MS));
	ck_assert(tpt_daemon_log_has(&host, "does not read its control connection"));
	ck_assert(tpt_daemon_log_has(&host, "--peer-queue-bytes"));
	ck_assert(tpt_daemon_alive(&host));
	ck_assert_int_eq(tpt_ctx_new(&host, 0, "after", &ctx), 0);
	tp_context_free(ctx);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
}
END_TEST

/*
 * A peer whose Hello states frames below 4096 bytes (TPW_FRAME_MAX_MIN, the smallest frame-max
 * a daemon runs with) is refused before its link exists; one of 4096 gets its link and its
 * pongs. The daemon used to take any size: one of 1 byte was sent no frame at all, and each
 * ping it sent made the daemon log an error ("not sending a frame ... above the 1 the far
 * daemon accepts"), as many lines as it cared to send pings.
 */
START_TEST(test_peer_stating_tiny_frames_is_refused)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	long sent;

	ck_assert_int_eq(peer_dial_frames(&c, &data, TPW_FRAME_MAX_MIN - 1), -ECONNREFUSED);
	ck_assert(tpt_daemon_log_has(&host, "frame max of 4095 bytes (at least 4096)"));
	ck_assert_int_eq(tpt_peer_links(&host, &(struct tpt_link){ 0 }), 0);
	tpt_raw_close(&c);
	tpt_raw_close(&data);
	c.fd = data.fd = -1;
	ck_assert_int_eq(peer_dial_frames(&c, &data, TPW_FRAME_MAX_MIN), 0);
	sent = send_pings(&c, 1); /* one write of them */
	ck_assert_int_gt(sent, 0);
	ck_assert_int_eq(read_pongs(&c, sent), sent);
	ck_assert(!tpt_daemon_log_has(&host, "not sending a frame"));
	tpt_raw_close(&data);
	tpt_raw_close(&c);
}
END_TEST

/*
 * A peer daemon's group joins that the coordinator refuses (here: its link is not
 * authenticated) are each answered, and logged within the link's budget: at most 20 lines for
 * 200 joins. Each
 * used to be logged, a line for every join the peer cared to send.
 */
#define JOINS 200

START_TEST(test_peer_group_join_refusals_are_logged_in_bursts)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	Tpw__V1__PeerGroupJoin j = TPW__V1__PEER_GROUP_JOIN__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	unsigned answered = 0;
	int lines;

	peer_dial(&c, &data);
	j.name = "flood";
	j.rank = -1;
	j.size = 2;
	j.uid = 4242;
	j.pid = 1;
	m.body_case = TPW__V1__PEER_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	for (unsigned i = 0; i < JOINS; i++) {
		j.join_id = i + 1;
		ck_assert_int_eq(tpt_raw_send_peer(&c, &m), 0);
	}
	setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &(int){ 1 << 20 }, sizeof(int));
	while (answered < JOINS && tpt_raw_recv_peer(&c, T_MS, &in) == 0) {
		if (in->body_case == TPW__V1__PEER_MSG__BODY_GROUP_JOINED) {
			ck_assert_int_eq(in->group_joined->status,
					 TPW__V1__STATUS__STATUS_PERMISSION);
			answered++;
		}
		tpw_peer_msg_free(in);
	}
	ck_assert_uint_eq(answered, JOINS);
	lines = tpt_daemon_log_count(&host, "group join from");
	ck_assert_msg(lines >= 1 && lines <= 20, "%d log lines for %u refused joins", lines, JOINS);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
}
END_TEST

/*
 * A peer daemon with a pipe to a listener here asks for messages that were never announced, in
 * the pipe's order and as broadcast reads: each is answered (PeerXferEnd INVALID) and the
 * warnings stay within the link's budget (PEER_LOG_BURST lines in a window of 10 s, for
 * both kinds together: tpd_peer_log_ok()). Each used to be logged, a line for every read the
 * peer cared to send.
 */
#define READS 200
#define PEER_LOG_BURST 20 /* TPD_PEER_LOG_BURST (daemon/peer/peer.h) */

START_TEST(test_peer_reads_of_unknown_messages_are_logged_at_a_bounded_rate)
{
	struct tpt_raw c = { .fd = -1 }, data = { .fd = -1 };
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerReadReq rr = TPW__V1__PEER_READ_REQ__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT, *in = NULL;
	struct tp_listener *l;
	struct tp_context *ctx;
	unsigned ended = 0;
	uint64_t pipe_id = 0;
	int lines;

	ck_assert_int_eq(tpt_ctx_new(&host, 0, "reader", &ctx), 0);
	ck_assert_int_eq(tp_listen(ctx, "lst", &lo, &l), 0);
	peer_dial(&c, &data);
	pc.pipe_id = 7;
	pc.name = "lst";
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &pc;
	ck_assert_int_eq(tpt_raw_send_peer(&c, &m), 0);
	while (!pipe_id && tpt_raw_recv_peer(&c, T_MS, &in) == 0) {
		if (in->body_case == TPW__V1__PEER_MSG__BODY_CONNECT_REPLY) {
			ck_assert_int_eq(in->connect_reply->status, TPW__V1__STATUS__STATUS_OK);
			pipe_id = in->connect_reply->peer_pipe_id;
		}
		tpw_peer_msg_free(in);
	}
	ck_assert_uint_ne(pipe_id, 0);
	m.body_case = TPW__V1__PEER_MSG__BODY_READ_REQ;
	m.read_req = &rr;
	rr.pipe_id = pipe_id;
	for (unsigned i = 0; i < 2 * READS; i++) {
		rr.msg_id = 1000 + i;
		rr.xfer_id = i + 1;
		rr.bcast = i >= READS;
		ck_assert_int_eq(tpt_raw_send_peer(&c, &m), 0);
	}
	setsockopt(c.fd, SOL_SOCKET, SO_RCVBUF, &(int){ 1 << 20 }, sizeof(int));
	while (ended < 2 * READS && tpt_raw_recv_peer(&c, T_MS, &in) == 0) {
		if (in->body_case == TPW__V1__PEER_MSG__BODY_XFER_END) {
			ck_assert_int_eq(in->xfer_end->status, TPW__V1__STATUS__STATUS_INVALID);
			ended++;
		}
		tpw_peer_msg_free(in);
	}
	ck_assert_uint_eq(ended, 2 * READS);
	/* the link's budget for both kinds; two windows at most on a slow machine */
	lines = tpt_daemon_log_count(&host, "peer asked for message");
	ck_assert_msg(lines >= 1, "no line for %u reads", READS);
	lines += tpt_daemon_log_count(&host, "peer asked for broadcast message");
	ck_assert_msg(lines <= 2 * PEER_LOG_BURST, "%d lines for %u reads", lines, 2 * READS);
	tpt_raw_close(&data);
	tpt_raw_close(&c);
	tp_listener_close(l);
	tp_context_free(ctx);
}
END_TEST

/* ---- waiting connects: one peer's share ---------------------------------------------------- */

#define WAITS_MAX 8 /* --peer-connect-waits-max of the daemon: a quarter, 2, for each peer */
#define WAITS_SHARE (WAITS_MAX / 4)
#define WAITS_SENT 5 /* over each of the flooding peer's two links */

static void waits_setup(void)
{
	char to[16], max[16];
	const char *args[] = { "--peer-insecure", "--peer-timeout", to, "--log-level", "debug",
			       "--peer-connect-waits-max", max, NULL };

	snprintf(to, sizeof(to), "%d", TPT_SCALED_MS(60000));
	snprintf(max, sizeof(max), "%u", WAITS_MAX);
	ck_assert_int_eq(tpt_daemon_start_peer(&host, args), 0);
}

/* A raw peer from @src (stating @instance) with a link up to the daemon. */
static void peer_dial_from(struct tpt_raw *c, struct tpt_raw *data, const char *src,
			   uint64_t instance)
{
	const struct tpt_raw_peer_hello h = { .port = host.peer_port,
					      .boot_base = (uint8_t)instance, .instance = instance,
					      .timeout_ms = T_MS, .src = src };

	ck_assert_int_eq(tpt_raw_peer_dial(&h, c, data), 0);
}

/* Sends a PeerConnect of pipe @pipe_id to listener @name (none is registered) over @c, waiting
 * up to @wait_ms for it. */
static void send_waiting_connect(struct tpt_raw *c, uint64_t pipe_id, const char *name,
				 uint32_t wait_ms)
{
	Tpw__V1__PeerConnect pc = TPW__V1__PEER_CONNECT__INIT;
	Tpw__V1__PeerMsg m = TPW__V1__PEER_MSG__INIT;

	pc.pipe_id = pipe_id;
	pc.name = (char *)name;
	pc.wait_ms = wait_ms;
	m.body_case = TPW__V1__PEER_MSG__BODY_CONNECT;
	m.connect = &pc;
	ck_assert_int_eq(tpt_raw_send_peer(c, &m), 0);
}

/* The next PeerConnectReply on @c (other messages skipped): its status, its text in @why.
 * Return: the status, or -1 if none came within T_MS. */
static int next_connect_reply(struct tpt_raw *c, char *why, size_t wl)
{
	Tpw__V1__PeerMsg *in = NULL;
	int st = -1;

	while (st < 0 && tpt_raw_recv_peer(c, T_MS, &in) == 0) {
		if (in->body_case == TPW__V1__PEER_MSG__BODY_CONNECT_REPLY) {
			st = (int)in->connect_reply->status;
			snprintf(why, wl, "%s", in->connect_reply->message ?
				 in->connect_reply->message : "");
		}
		tpw_peer_msg_free(in);
	}
	return st;
}

/*
 * One peer (two links from 127.0.0.1) sends 10 connects that wait for a listener nobody
 * registers: its share of --peer-connect-waits-max (8 here: a quarter, 2) waits, every one above
 * it is refused at once (STATUS_LIMIT naming --peer-connect-waits-per-peer). Another peer (from
 * 127.0.0.2) still has its connect kept until its own wait_ms passes (STATUS_TIMEOUT). One peer
 * used to keep every place of the daemon-wide bound (its links each kept up to --pipes-max,
 * 4096, the bound's default), and every other peer's waiting connect was refused at once while
 * it held them: a peer group's leaders, which dial before the far listener exists, could not
 * meet.
 */
START_TEST(test_one_peers_waiting_connects_leave_room_for_anothers)
{
	struct tpt_raw a[2] = { { .fd = -1 }, { .fd = -1 } };
	struct tpt_raw ad[2] = { { .fd = -1 }, { .fd = -1 } };
	struct tpt_raw b = { .fd = -1 }, bd = { .fd = -1 };
	uint64_t end = tpt_now_ms() + T_MS;
	unsigned refused = 0;
	char why[512];
	int st;

	peer_dial_from(&a[0], &ad[0], NULL, 0xa1);
	peer_dial_from(&a[1], &ad[1], NULL, 0xa2);
	peer_dial_from(&b, &bd, "127.0.0.2", 0xb1);
	for (unsigned l = 0; l < 2; l++)
		for (unsigned i = 0; i < WAITS_SENT; i++)
			send_waiting_connect(&a[l], 100 + i, "never", (uint32_t)T_MS);
	/* every connect of the flood decided (kept or refused) before the other peer's comes */
	while (tpt_daemon_log_count(&host, "connect to 'never' waits up to") +
	       tpt_daemon_log_count(&host, "connect to 'never' refused") < 2 * WAITS_SENT &&
	       tpt_now_ms() < end)
		usleep(10000); /* polling the log, as tpt_daemon_wait_log() does */
	send_waiting_connect(&b, 1, "other", 500);
	st = next_connect_reply(&b, why, sizeof(why));
	ck_assert_msg(st == TPW__V1__STATUS__STATUS_TIMEOUT, "the other peer's waiting connect: "
		      "status %d: %s", st, why);
	/* the flood: its share waits (no answer), each connect above it was refused at once */
	ck_assert_int_eq(tpt_daemon_log_count(&host, "connect to 'never' waits up to"),
			 WAITS_SHARE);
	for (unsigned l = 0; l < 2; l++) {
		Tpw__V1__PeerMsg *in = NULL;

		while (tpt_raw_recv_peer(&a[l], TPT_SCALED_MS(1000), &in) == 0) {
			if (in->body_case == TPW__V1__PEER_MSG__BODY_CONNECT_REPLY) {
				ck_assert_int_eq(in->connect_reply->status,
						 TPW__V1__STATUS__STATUS_LIMIT);
				ck_assert_msg(in->connect_reply->message &&
					      strstr(in->connect_reply->message,
						     "--peer-connect-waits-per-peer"), "%s",
					      in->connect_reply->message);
				refused++;
			}
			tpw_peer_msg_free(in);
			in = NULL;
		}
	}
	ck_assert_uint_eq(refused, 2 * WAITS_SENT - WAITS_SHARE);
	for (unsigned l = 0; l < 2; l++) {
		tpt_raw_close(&ad[l]);
		tpt_raw_close(&a[l]);
	}
	tpt_raw_close(&bd);
	tpt_raw_close(&b);
	ck_assert(tpt_daemon_alive(&host));
}
END_TEST

/* ---- a peer proven by a certificate is charged under it --------------------------------- */

static char cert_dir[64];

/* Makes @dir/ca.{crt,key} and @dir/NAME.{crt,key} for each of @names (SAN IP:127.0.0.1) with
 * the openssl command. Return: 0, or -1 (printed) where openssl is missing or fails. */
static int make_certs(const char *dir, const char *const *names, size_t n)
{
	char cmd[1024];

	snprintf(cmd, sizeof(cmd), "cd %s && openssl req -x509 -newkey ec -pkeyopt "
		 "ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.crt -subj /CN=ca -days 2 "
		 ">/dev/null 2>&1", dir);
	if (system(cmd) != 0) {
		fprintf(stderr, "skipped: the openssl command cannot make a CA\n");
		return -1;
	}
	for (size_t i = 0; i < n; i++) {
		snprintf(cmd, sizeof(cmd), "cd %s && openssl req -newkey ec -pkeyopt "
			 "ec_paramgen_curve:P-256 -nodes -keyout %s.key -out %s.csr -subj /CN=%s "
			 ">/dev/null 2>&1 && printf 'subjectAltName=IP:127.0.0.1\\n' >%s.ext && "
			 "openssl x509 -req -in %s.csr -CA ca.crt -CAkey ca.key -CAcreateserial "
			 "-out %s.crt -days 2 -extfile %s.ext >/dev/null 2>&1 && chmod 600 %s.key",
			 dir, names[i], names[i], names[i], names[i], names[i], names[i], names[i],
			 names[i]);
		if (system(cmd) != 0) {
			fprintf(stderr, "skipped: the openssl command cannot make a certificate\n");
			return -1;
		}
	}
	return 0;
}

/* Starts @d with certificate @name of cert_dir and @extra (NULL-terminated, at most 6). */
static void start_cert(struct tpt_daemon *d, const char *name, const char *const *extra)
{
	static char crt[2][128], key[2][128], ca[128];
	static unsigned k;
	const char *args[16] = { "--peer-cert", crt[k % 2], "--peer-cert-key", key[k % 2],
				 "--peer-ca", ca };
	size_t n = 6;

	snprintf(crt[k % 2], sizeof(crt[0]), "%s/%s.crt", cert_dir, name);
	snprintf(key[k % 2], sizeof(key[0]), "%s/%s.key", cert_dir, name);
	snprintf(ca, sizeof(ca), "%s/ca.crt", cert_dir);
	k++;
	for (size_t i = 0; extra && extra[i]; i++)
		args[n++] = extra[i];
	args[n] = NULL;
	ck_assert_int_eq(tpt_daemon_start_peer(d, args), 0);
}

/* A persistent channel @name created on @on by a client of @from. Return: tp_chan_open()'s. */
static int xcreate(const struct tpt_daemon *from, const struct tpt_daemon *on, const char *name)
{
	struct tp_chan_options o = { .size = sizeof(o), .flags = TP_CHAN_CREATE |
				     TP_CHAN_PERSISTENT, .owner_uid = -1 };
	struct tp_context *ctx;
	struct tp_chan *ch = NULL;
	int r;

	ck_assert_int_eq(tpt_ctx_new(from, 0, "xcreate", &ctx), 0);
	r = tp_chan_open(ctx, tpt_peer_at(on, name), &o, &ch);
	if (r < 0)
		ck_assert_msg(strstr(tp_last_error(), "chan-remote-create-per-peer"), "%s",
			      tp_last_error());
	if (ch)
		tp_chan_release(ch);
	tp_context_free(ctx);
	return r;
}

/*
 * Daemon a, proven by certificate "a", creates channels on b (--chan-remote-create-per-peer 2):
 * its second is taken, its third refused; restarted stating another host name in its hello
 * (--peer-host-name), its third is still refused, and b charges them all to "cert:CN=a,...".
 * The account used to be "IDENTITY@HOST" whatever proved the identity: each name a certificate
 * holder stated got it another share of chan-remote-create-uid's channels.
 */
START_TEST(test_cert_peer_stating_another_name_keeps_its_share)
{
	static const char *const names[] = { "a", "b" };
	static const char *const bargs[] = { "--chan-remote-create-uid", "4242",
					     "--chan-remote-create-per-peer", "2", NULL };
	static const char *const a1[] = { "--peer-host-name", "ha", NULL };
	static const char *const a2[] = { "--peer-host-name", "hz", NULL };
	struct tpt_daemon a, b;

	if (make_certs(cert_dir, names, 2) < 0)
		return;
	start_cert(&b, "b", bargs);
	start_cert(&a, "a", a1);
	ck_assert_int_eq(xcreate(&a, &b, "one"), 0);
	ck_assert_int_eq(xcreate(&a, &b, "two"), 0);
	ck_assert_int_eq(xcreate(&a, &b, "three"), -ENOBUFS);
	ck_assert_int_eq(tpt_daemon_stop(&a), 0);
	start_cert(&a, "a", a2);
	ck_assert_int_eq(xcreate(&a, &b, "three"), -ENOBUFS);
	ck_assert(tpt_ctl_lists(&b, "channels", "one",
				"\"created_by\": \"cert:CN=a,IP:127.0.0.1\""));
	ck_assert(!tpt_ctl_lists(&b, "channels", "three", NULL));
	ck_assert_int_eq(tpt_daemon_stop(&a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&b), 0);
}
END_TEST

/*
 * The same with the pre-shared key, which proves one identity for every holder: daemon a,
 * stating host name "ha", creates channels on b (--chan-remote-create-per-peer 2): its second
 * is taken, its third refused; restarted stating "hz", its third is still refused, and b
 * charges them all to "psk:tpipd@127.0.0.1", the address its link comes from. The account used
 * to be "psk:tpipd@HOST" with the name the hello states, which a key holder chooses: each name
 * got it another share of chan-remote-create-uid's channels.
 */
START_TEST(test_psk_peer_stating_another_name_keeps_its_share)
{
	static const char *const bargs[] = { "--chan-remote-create-uid", "4242",
					     "--chan-remote-create-per-peer", "2", NULL };
	static const char *const a1[] = { "--peer-host-name", "ha", NULL };
	static const char *const a2[] = { "--peer-host-name", "hz", NULL };
	struct tpt_daemon a, b;

	ck_assert_int_eq(tpt_daemon_start_peer(&b, bargs), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&a, a1), 0);
	ck_assert_int_eq(xcreate(&a, &b, "one"), 0);
	ck_assert_int_eq(xcreate(&a, &b, "two"), 0); /* just below the limit: taken */
	ck_assert_int_eq(xcreate(&a, &b, "three"), -ENOBUFS); /* just above */
	ck_assert_int_eq(tpt_daemon_stop(&a), 0);
	ck_assert_int_eq(tpt_daemon_start_peer(&a, a2), 0);
	ck_assert_int_eq(xcreate(&a, &b, "three"), -ENOBUFS);
	ck_assert(tpt_ctl_lists(&b, "channels", "one",
				"\"created_by\": \"psk:tpipd@127.0.0.1\""));
	ck_assert(!tpt_ctl_lists(&b, "channels", "three", NULL));
	ck_assert_int_eq(tpt_daemon_stop(&a), 0);
	ck_assert_int_eq(tpt_daemon_stop(&b), 0);
}
END_TEST

/* The certificates' directory, made and removed outside the tests (also when one fails). */
static void cert_dir_make(void)
{
	snprintf(cert_dir, sizeof(cert_dir), "/tmp/tpt-peercert.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(cert_dir));
}

static void cert_dir_remove(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", cert_dir);
	ck_assert_int_eq(system(cmd), 0);
}

static Suite *peerlink_suite(void)
{
	Suite *s = suite_create("sec_peerlink");
	TCase *q = tcase_create("control connection");

	tcase_set_timeout(q, 120);
	tcase_add_checked_fixture(q, setup, teardown);
	tcase_add_test(q, test_peer_that_reads_no_answers_below_the_queue_limit_keeps_its_link);
	tcase_add_test(q, test_peer_that_reads_no_answers_above_the_queue_limit_fails_its_link);
	tcase_add_test(q, test_peer_stating_tiny_frames_is_refused);
	tcase_add_test(q, test_peer_group_join_refusals_are_logged_in_bursts);
	tcase_add_test(q, test_peer_reads_of_unknown_messages_are_logged_at_a_bounded_rate);
	suite_add_tcase(s, q);
	TCase *w = tcase_create("connect waits");

	tcase_set_timeout(w, 120);
	tcase_add_checked_fixture(w, waits_setup, teardown);
	tcase_add_test(w, test_one_peers_waiting_connects_leave_room_for_anothers);
	suite_add_tcase(s, w);
	TCase *id = tcase_create("identity");

	tcase_set_timeout(id, 120);
	tcase_add_unchecked_fixture(id, cert_dir_make, cert_dir_remove);
	tcase_add_test(id, test_cert_peer_stating_another_name_keeps_its_share);
	tcase_add_test(id, test_psk_peer_stating_another_name_keeps_its_share);
	suite_add_tcase(s, id);
	return s;
}

int main(void)
{
	return tpt_run_suite(peerlink_suite());
}
