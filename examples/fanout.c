/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tp-fanout: torch-ipc's client/server example with a pipe set. A server waits for N clients,
 * broadcasts a 4 MiB parameter block to all of them (from a shared buffer: the daemon copies it
 * from that one source into each client's memory), then collects one answer from each with
 * tp_set_read_any() until every client has hung up. Each client checks the block and answers
 * with its sum. Run it with the clients as child processes:
 *     tp-fanout 4
 * The daemon socket follows the library's rules ($TPIPD_SOCKET, ...).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tpclient.h>

#define NAME "tp-fanout"
#define BLOCK ((size_t)4 << 20)

static int client(void)
{
	struct tp_context *ctx = NULL;
	struct tp_pipe *p = NULL;
	struct tp_descriptor *d = NULL;
	uint8_t *buf = malloc(BLOCK);
	uint64_t sum = 0;
	int r = tp_context_new(NULL, &ctx);

	if (r == 0)
		r = tp_connect(ctx, NAME, &p);
	if (r == 0)
		r = tp_pipe_wait_connected(p, 10000);
	if (r == 0)
		r = tp_pipe_read_descriptor_sync(p, 10000, &d);
	if (r == 0 && d->n_payloads == 1 && d->payloads[0].length == BLOCK && buf) {
		struct tp_slot slot = { .data = buf };
		struct tp_allocation a = { .payloads = &slot, .n_payloads = 1 };

		r = tp_pipe_read_sync(p, d, &a);
	} else if (r == 0) {
		tp_descriptor_free(d);
		r = -EBADMSG;
	}
	for (size_t i = 0; r == 0 && i < BLOCK; i++)
		sum += buf[i];
	if (r == 0) {
		struct tp_message m = { .metadata = &sum, .metadata_len = sizeof(sum) };

		r = tp_pipe_write_sync(p, &m);
	}
	if (r < 0)
		fprintf(stderr, "client: %s (%s)\n", tp_strerror(r), tp_last_error());
	free(buf);
	tp_pipe_close(p);
	tp_context_free(ctx);
	return r < 0;
}

static int server(int n, int ready_fd)
{
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe_set *set = NULL;
	uint8_t *block = NULL;
	int status[64], r, answers = 0;

	r = tp_context_new(NULL, &ctx);
	if (r == 0)
		r = tp_listen(ctx, NAME, NULL, &l);
	(void)!write(ready_fd, "x", 1); /* the clients may connect now */
	if (r == 0)
		r = tp_set_new(ctx, (unsigned)n, &set);
	if (r == 0)
		r = tp_set_wait_pipes(set, l, (unsigned)n, 10000);
	if (r == 0)
		r = tp_buffer_alloc(ctx, BLOCK, (void **)&block);
	if (r == 0) {
		struct tp_payload pl = { .data = block, .length = BLOCK };
		struct tp_message m = { .payloads = &pl, .n_payloads = 1 };

		for (size_t i = 0; i < BLOCK; i++)
			block[i] = (uint8_t)i;
		r = tp_set_broadcast(set, &m, 10000, status, (size_t)n);
		printf("broadcast 4 MiB to %d of %d clients\n", r, n);
	}
	while (r >= 0) {
		struct tp_pipe *p = NULL;
		struct tp_descriptor *d = NULL;
		uint64_t sum = 0;

		r = tp_set_read_any(set, 10000, &p, &d);
		if (r == 1) { /* that client hung up: once, and it left the set */
			tp_pipe_close(p);
			continue;
		}
		if (r == 0 && d->metadata_len == sizeof(sum)) {
			memcpy(&sum, d->metadata, sizeof(sum));
			r = tp_pipe_read_sync(p, d, &(struct tp_allocation){ 0 });
			printf("answer %d: sum %llu\n", ++answers, (unsigned long long)sum);
		} else if (r == 0) {
			tp_descriptor_free(d);
		}
	}
	if (r != -ENOENT) /* -ENOENT: every client has hung up */
		fprintf(stderr, "server: %s (%s)\n", tp_strerror(r), tp_last_error());
	tp_set_free(set);
	if (block)
		tp_buffer_free(ctx, block);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r != -ENOENT || answers != n;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 4, fds[2], failed = 0;
	pid_t srv;
	char c;

	if (n < 1 || n > 64 || pipe(fds) < 0) {
		fprintf(stderr, "usage: tp-fanout [N (1..64)]\n");
		return 2;
	}
	/* fork every process before any of them opens a context */
	srv = fork();
	if (srv == 0)
		exit(server(n, fds[1])); /* exit(): stdout is flushed */
	if (read(fds[0], &c, 1) != 1)
		return 1;
	for (int i = 0; i < n; i++)
		if (fork() == 0)
			exit(client());
	for (int i = 0; i <= n; i++) {
		int st = 0;

		if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
			failed++;
	}
	printf("%s\n", failed ? "FAILED" : "ok");
	return failed != 0;
}
