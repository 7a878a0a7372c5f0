/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * xfer_tool: a command-line client for the shell suites (tests/service). One process listens on
 * a name of its daemon and reads; another connects to a name or a tpip:// address through its
 * own daemon and writes. Message i carries one tensor of SIZE[i] bytes and a 100-byte payload
 * with metadata, filled with the test patterns (tpt_fill) and checked byte for byte by the
 * reader; --repeat adds messages of the last size. Each side prints one line per message and a
 * last line "ok: N messages" or "error after N messages: -ERRNO (NAME, strerror): message"
 * with the milliseconds since the previous message, and exits 0 only if every message crossed.
 * A listener takes pipes from any peer daemon, or with --remote-peer ENTRY (repeatable) only from
 * the peers those entries name (TP_REMOTE_PEERS).
 * It does not decide what a failure should be: the scripts check that.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "itest.h"

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define SIZES_MAX 64
#define PEERS_MAX 8

struct opts {
	const char *socket, *where;
	const char *peers[PEERS_MAX]; /* --remote-peer: TP_REMOTE_PEERS entries */
	size_t n_peers;
	bool listen, shm;
	unsigned repeat;
	int timeout_ms;
	size_t n_sizes;
	size_t sizes[SIZES_MAX];
};

static const char *errno_name(int e)
{
	switch (-e) {
	case ECONNRESET: return "ECONNRESET";
	case EPIPE: return "EPIPE";
	case EIO: return "EIO";
	case ETIMEDOUT: return "ETIMEDOUT";
	case ECONNREFUSED: return "ECONNREFUSED";
	case ENOENT: return "ENOENT";
	case EACCES: return "EACCES";
	case ECANCELED: return "ECANCELED";
	case EHOSTUNREACH: return "EHOSTUNREACH";
	case ENOTCONN: return "ENOTCONN";
	}
	return "?";
}

/* Parses "123", "64K", "16M", "1G". Return: 0 or -EINVAL. */
static int parse_size(const char *s, size_t *ret)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	unsigned shift = 0;

	if (end == s)
		return -EINVAL;
	if (*end == 'K' || *end == 'k')
		shift = 10;
	else if (*end == 'M' || *end == 'm')
		shift = 20;
	else if (*end == 'G' || *end == 'g')
		shift = 30;
	if (shift)
		end++;
	if (*end || v > (1ull << (63 - shift)))
		return -EINVAL;
	*ret = (size_t)(v << shift);
	return 0;
}

static size_t msg_size(const struct opts *o, unsigned i)
{
	return o->sizes[i < o->n_sizes ? i : o->n_sizes - 1];
}

static void msg_spec(const struct opts *o, unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 33;
	s->index = i;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->meta_len = 8;
	s->lens[0] = 100;
	s->lens[1] = msg_size(o, i);
}

static int report(const char *side, unsigned n, int r, uint64_t since)
{
	unsigned long long ms = (unsigned long long)(tpt_now_ms() - since);

	if (r == 0) {
		printf("%s: ok: %u messages\n", side, n);
		return 0;
	}
	printf("%s: error after %u messages: %d (%s, %s): %s; %llu ms after the last message\n",
	       side, n, r, errno_name(r), tp_strerror(r), tp_last_error(), ms);
	return 1;
}

static int run_listen(const struct opts *o, struct tp_context *ctx)
{
	struct tp_listener *l = NULL;
	struct tp_pipe *p = NULL;
	struct tpt_msg_spec s;
	unsigned n = 0, total = (unsigned)o->n_sizes + o->repeat;
	uint64_t last = tpt_now_ms();
	struct tp_listen_options named = remote_any;
	int r;

	if (o->n_peers) {
		named.remote = TP_REMOTE_PEERS;
		named.remote_peers = o->peers;
		named.n_remote_peers = o->n_peers;
	}
	r = tp_listen(ctx, o->where, &named, &l);

	if (r == 0) {
		printf("listen: listening on '%s'\n", o->where);
		fflush(stdout);
		r = tp_listener_accept_sync(l, o->timeout_ms, &p);
	}
	for (; r == 0 && n < total; n++) {
		msg_spec(o, n, &s);
		r = tpt_msg_read_check(ctx, p, &s, o->shm ? TPT_MEM_SHM : TPT_MEM_PRIVATE,
				       o->timeout_ms);
		if (r > 0) /* content mismatch, printed by the check */
			r = -EBADMSG;
		if (r == 0) {
			printf("listen: message %u: %zu bytes verified in %llu ms\n", n, s.lens[1],
			       (unsigned long long)(tpt_now_ms() - last));
			fflush(stdout);
			last = tpt_now_ms();
		}
	}
	r = report("listen", n, r, last);
	tp_pipe_close(p);
	tp_listener_close(l);
	return r;
}

static int run_connect(const struct opts *o, struct tp_context *ctx)
{
	struct tp_pipe *p = NULL;
	struct tpt_msg_spec s;
	struct tpt_msg m;
	unsigned n = 0, total = (unsigned)o->n_sizes + o->repeat;
	uint64_t last = tpt_now_ms();
	int r = tp_connect(ctx, o->where, &p);

	if (r == 0)
		r = tp_pipe_wait_connected(p, o->timeout_ms);
	for (; r == 0 && n < total; n++) {
		msg_spec(o, n, &s);
		r = tpt_msg_build(ctx, &s, o->shm ? TPT_MEM_SHM : TPT_MEM_PRIVATE, &m);
		if (r == 0)
			r = tp_pipe_write_sync(p, &m.m);
		tpt_msg_free(ctx, &m);
		if (r == 0) {
			printf("connect: message %u: %zu bytes written in %llu ms\n", n, s.lens[1],
			       (unsigned long long)(tpt_now_ms() - last));
			fflush(stdout);
			last = tpt_now_ms();
		}
	}
	r = report("connect", n, r, last);
	tp_pipe_close(p);
	return r;
}

static int usage(void)
{
	fprintf(stderr, "usage: xfer_tool -s SOCKET [--shm] [-r REPEAT] [-t TIMEOUT_MS] "
			"[--remote-peer ENTRY]... listen NAME|connect ADDRESS SIZE...\n");
	return 2;
}

static int parse(int argc, char **argv, struct opts *o)
{
	static const struct option lo[] = {
		{ "socket", required_argument, NULL, 's' },
		{ "shm", no_argument, NULL, 'S' },
		{ "repeat", required_argument, NULL, 'r' },
		{ "timeout", required_argument, NULL, 't' },
		{ "remote-peer", required_argument, NULL, 'P' },
		{ NULL, 0, NULL, 0 },
	};
	int c;

	o->timeout_ms = 60000;
	while ((c = getopt_long(argc, argv, "s:r:t:", lo, NULL)) != -1) {
		if (c == 's')
			o->socket = optarg;
		else if (c == 'S')
			o->shm = true;
		else if (c == 'r')
			o->repeat = (unsigned)strtoul(optarg, NULL, 10);
		else if (c == 't')
			o->timeout_ms = atoi(optarg);
		else if (c == 'P' && o->n_peers < PEERS_MAX)
			o->peers[o->n_peers++] = optarg;
		else
			return -EINVAL;
	}
	if (argc - optind < 3 || !o->socket)
		return -EINVAL;
	o->listen = strcmp(argv[optind], "listen") == 0;
	if (!o->listen && strcmp(argv[optind], "connect") != 0)
		return -EINVAL;
	o->where = argv[optind + 1];
	for (int i = optind + 2; i < argc; i++)
		if (o->n_sizes == SIZES_MAX || parse_size(argv[i], &o->sizes[o->n_sizes++]) < 0)
			return -EINVAL;
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };
	struct tp_context *ctx = NULL;
	struct tp_context_options co = { .size = sizeof(co) };
	int r;

	if (parse(argc, argv, &o) < 0)
		return usage();
	co.socket_path = o.socket;
	co.name = o.listen ? "xfer-listen" : "xfer-connect";
	r = tp_context_new(&co, &ctx);
	if (r < 0) {
		fprintf(stderr, "xfer_tool: %s: %s\n", o.socket, tp_last_error());
		return 1;
	}
	r = o.listen ? run_listen(&o, ctx) : run_connect(&o, ctx);
	tp_context_free(ctx);
	return r;
}
