/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The server and the readers fan_xhost.sh starts on each host: a server that accepts N pipes
 * (from this host and from others) into a set and broadcasts three messages fanned out by its
 * daemon (private memory, a shared buffer, a small private one), printing how many pipes each
 * reached; and a reader that checks every message's bytes and order until its pipe ends, or
 * that dies (SIGKILL) on its first descriptor. Output lines are what the script matches.
 *
 *   fan_xhost SOCKET server NAME READERS SIZE
 *   fan_xhost SOCKET reader ADDRESS [die]
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "tpclient.h"

#define T_MS 60000
#define ROUNDS 3

static uint8_t byte_of(unsigned round, size_t i)
{
	return (uint8_t)(round * 131 + i * 13 + (i >> 12));
}

static size_t round_len(unsigned round, size_t size)
{
	return round == 2 ? 100 : size;
}

static int ctx_open(const char *sock, struct tp_context **ret)
{
	struct tp_context_options o = { .size = sizeof(o), .socket_path = sock };

	return tp_context_new(&o, ret);
}

static int server(const char *sock, const char *name, unsigned n, size_t size)
{
	struct tp_listen_options lo = { .size = sizeof(lo), .remote = TP_REMOTE_ANY_PEER };
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *s = NULL;
	uint8_t *priv = malloc(size);
	void *shm = NULL;
	int st[64], r;

	r = ctx_open(sock, &ctx);
	if (r == 0)
		r = tp_listen(ctx, name, &lo, &l);
	if (r == 0)
		r = tp_set_new(ctx, 64, &s);
	if (r == 0)
		r = tp_buffer_alloc(ctx, size, &shm);
	if (r < 0 || !priv || n > 64) {
		printf("error %d: set-up: %s\n", r, tp_last_error());
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	r = tp_set_wait_pipes(s, l, n, T_MS);
	if (r < 0) {
		printf("error %d: wait: %s\n", r, tp_last_error());
		return 1;
	}
	tp_set_set_fanout(s, TP_FANOUT_DAEMON);
	for (unsigned round = 0; round < ROUNDS; round++) {
		uint8_t *mem = round == 1 ? shm : priv, md = (uint8_t)round;
		struct tp_payload pl = { .data = mem, .length = round_len(round, size) };
		struct tp_message m = { .metadata = &md, .metadata_len = 1, .payloads = &pl,
					.n_payloads = 1 };

		for (size_t k = 0; k < pl.length; k++)
			mem[k] = byte_of(round, k);
		r = tp_set_broadcast(s, &m, T_MS, st, n);
		if (r < 0) {
			printf("error %d: broadcast: %s\n", r, tp_last_error());
			return 1;
		}
		printf("round %u: delivered %d fanout %s\n", round, r,
		       tp_set_last_fanout(s) == TP_FANOUT_DAEMON ? "daemon" : "library");
		fflush(stdout);
	}
	tp_set_free(s);
	tp_buffer_free(ctx, shm);
	free(priv);
	tp_listener_close(l);
	tp_context_free(ctx);
	printf("done\n");
	return 0;
}

static int reader(const char *sock, const char *addr, bool die)
{
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	uint8_t *buf = NULL;
	size_t cap = 0;
	int last = -1, r;

	r = ctx_open(sock, &ctx);
	if (r == 0)
		r = tp_connect(ctx, addr, &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, T_MS);
	if (r < 0) {
		printf("error %d: connect: %s\n", r, tp_last_error());
		return 1;
	}
	printf("connected\n");
	fflush(stdout);
	for (;;) {
		struct tp_descriptor *d = NULL;
		struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 } };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };
		unsigned round;
		size_t len;

		r = tp_pipe_read_descriptor_sync(p, T_MS, &d);
		if (r == -EPIPE)
			break;
		if (r < 0) {
			printf("error %d: descriptor: %s\n", r, tp_last_error());
			return 1;
		}
		if (die)
			raise(SIGKILL);
		if (d->metadata_len != 1 || d->n_payloads != 1) {
			printf("error: shape\n");
			return 1;
		}
		round = *(const uint8_t *)d->metadata;
		len = d->payloads[0].length;
		if (len > cap) {
			free(buf);
			buf = malloc(len);
			cap = buf ? len : 0;
		}
		slot.data = buf;
		r = buf ? tp_pipe_read_sync(p, d, &a) : -ENOMEM;
		for (size_t k = 0; r == 0 && k < len; k++)
			if (buf[k] != byte_of(round, k))
				r = -EILSEQ;
		if (r < 0 || (int)round <= last) {
			printf("error %d: round %u after %d\n", r, round, last);
			return 1;
		}
		last = (int)round;
		printf("read %u ok\n", round);
		fflush(stdout);
	}
	printf("end\n");
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 6 && strcmp(argv[2], "server") == 0)
		return server(argv[1], argv[3], (unsigned)atoi(argv[4]),
			      (size_t)strtoull(argv[5], NULL, 0));
	if ((argc == 4 || argc == 5) && strcmp(argv[2], "reader") == 0)
		return reader(argv[1], argv[3], argc == 5 && strcmp(argv[4], "die") == 0);
	fprintf(stderr, "usage: fan_xhost SOCKET server NAME READERS SIZE\n"
			"       fan_xhost SOCKET reader ADDRESS [die]\n");
	return 2;
}
