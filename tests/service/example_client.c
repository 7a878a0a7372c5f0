/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A minimal libtpclient program for the service suite. It is built twice: by meson against the
 * build tree, and by install.sh with `cc $(pkg-config --cflags --libs libtpclient)` against a
 * `meson install --destdir` tree, which proves that the installed header, library and .pc work.
 * It connects a context, listens on a name, connects a pipe to that name, writes one message
 * (metadata, a payload and a tensor) on one end, reads it on the accepted end and checks every
 * byte. With --hold it then keeps its session open, prints "holding", and waits (at most
 * HOLD_MAX_MS) until the daemon ends the session, which the admin test does with tpipctl
 * close-session. Only the public API in tpclient.h is used.
 *
 * Usage: example_client SOCKET [--hold]. Exit status 0 ok, 1 failure, 2 usage.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <tpclient.h>

/* Owner-only from this host, and open to pipes from every peer daemon (cross-host runs). */
static const struct tp_listen_options remote_any = {
	.size = sizeof(remote_any), .access = TP_ACCESS_OWNER, .remote = TP_REMOTE_ANY_PEER,
};

#define TIMEOUT_MS 10000
#define HOLD_MAX_MS 60000
#define PAYLOAD_BYTES 100
#define TENSOR_BYTES (256u << 10) /* above the eager limit: the daemon copies it */

static const char meta[] = "service-suite";

/* Write completions reach main() through this pipe; never closed, so a late callback (a write
 * cancelled by tp_pipe_close() on a failure path) cannot hit a reused fd. */
static int done_fd[2] = { -1, -1 };

static int fail(const char *what, int err)
{
	fprintf(stderr, "example_client: %s: %s (%s)\n", what, tp_strerror(err), tp_last_error());
	return 1;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		p[i] = (unsigned char)(i * 31u + seed);
}

static int check_bytes(const unsigned char *p, size_t n, unsigned seed, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] != (unsigned char)(i * 31u + seed)) {
			fprintf(stderr, "example_client: %s: byte %zu differs\n", what, i);
			return 1;
		}
	}
	return 0;
}

/* Write completion, on the library's thread: hands the status to main(). */
static void on_written(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	if (write(done_fd[1], &status, sizeof(status)) != (ssize_t)sizeof(status))
		fprintf(stderr, "example_client: cannot report a write completion\n");
}

static int wait_written(void)
{
	struct pollfd pfd = { .fd = done_fd[0], .events = POLLIN };
	int status;

	if (poll(&pfd, 1, TIMEOUT_MS) != 1)
		return -ETIMEDOUT;
	if (read(done_fd[0], &status, sizeof(status)) != (ssize_t)sizeof(status))
		return -EIO;
	return status;
}

/* Writes one message on @out and reads it back on @in, checking metadata and bytes. */
static int round_trip(struct tp_pipe *out, struct tp_pipe *in)
{
	/* Static: on a failure path a cancelled copy may still be in flight as we return. */
	static unsigned char payload[PAYLOAD_BYTES], got_payload[PAYLOAD_BYTES];
	static unsigned char tensor[TENSOR_BYTES], got_tensor[TENSOR_BYTES];
	struct tp_payload pl = { .data = payload, .length = sizeof(payload) };
	struct tp_tensor tn = { .device = { TP_DEVICE_CPU, 0 }, .data = tensor,
				.length = TENSOR_BYTES };
	struct tp_message msg = { .metadata = meta, .metadata_len = sizeof(meta),
				  .payloads = &pl, .n_payloads = 1, .tensors = &tn, .n_tensors = 1 };
	struct tp_slot ps = { .data = got_payload }, ts = { .data = got_tensor };
	struct tp_allocation alloc = { &ps, 1, &ts, 1 };
	struct tp_descriptor *d = NULL;
	int r;

	fill(payload, sizeof(payload), 1);
	fill(tensor, TENSOR_BYTES, 2);
	if ((r = tp_pipe_write(out, &msg, on_written, NULL)) < 0)
		return fail("write", r);
	if ((r = tp_pipe_read_descriptor_sync(in, TIMEOUT_MS, &d)) < 0)
		return fail("read descriptor", r);
	if (d->metadata_len != sizeof(meta) || memcmp(d->metadata, meta, sizeof(meta)) != 0 ||
	    d->n_payloads != 1 || d->payloads[0].length != PAYLOAD_BYTES || d->n_tensors != 1 ||
	    d->tensors[0].length != TENSOR_BYTES) {
		fprintf(stderr, "example_client: the descriptor does not match the message\n");
		tp_descriptor_free(d);
		return 1;
	}
	if ((r = tp_pipe_read_sync(in, d, &alloc)) < 0)
		return fail("read", r);
	if ((r = wait_written()) < 0)
		return fail("write completion", r);
	return check_bytes(got_payload, PAYLOAD_BYTES, 1, "payload") ||
	       check_bytes(got_tensor, TENSOR_BYTES, 2, "tensor");
}

/* Waits until the daemon ends the session: the pending descriptor request then fails. */
static int hold(struct tp_pipe *p)
{
	struct tp_descriptor *d = NULL;
	int r;

	printf("holding\n");
	fflush(stdout);
	r = tp_pipe_read_descriptor_sync(p, HOLD_MAX_MS, &d);
	if (r == 0) {
		tp_descriptor_free(d);
		fprintf(stderr, "example_client: unexpected message while holding\n");
		return 1;
	}
	if (r == -ETIMEDOUT)
		return fail("holding: the session was not closed", r);
	printf("session ended: %s\n", tp_strerror(r));
	return 0;
}

int main(int argc, char **argv)
{
	struct tp_context_options co = { .size = sizeof(co) };
	struct tp_context *ctx = NULL;
	struct tp_listener *l = NULL;
	struct tp_pipe *out = NULL, *in = NULL;
	char name[64];
	int r;

	if (argc < 2 || argc > 3 || (argc == 3 && strcmp(argv[2], "--hold") != 0)) {
		fprintf(stderr, "usage: example_client SOCKET [--hold]\n");
		return 2;
	}
	if (pipe(done_fd) < 0) {
		perror("example_client: pipe");
		return 1;
	}
	co.socket_path = argv[1];
	snprintf(name, sizeof(name), "example-%ld", (long)getpid());
	if ((r = tp_context_new(&co, &ctx)) < 0)
		return fail("context", r);
	if ((r = tp_listen(ctx, name, &remote_any, &l)) < 0) {
		r = fail("listen", r);
		goto out;
	}
	if ((r = tp_connect(ctx, name, &out)) < 0 ||
	    (r = tp_listener_accept_sync(l, TIMEOUT_MS, &in)) < 0 ||
	    (r = tp_pipe_wait_connected(out, TIMEOUT_MS)) < 0) {
		r = fail("connect", r);
		goto out;
	}
	r = round_trip(out, in);
	if (r == 0)
		printf("moved one message: %zu metadata, %d payload and %u tensor bytes\n",
		       sizeof(meta), PAYLOAD_BYTES, TENSOR_BYTES);
	if (r == 0 && argc == 3)
		r = hold(in);
out:
	tp_pipe_close(in);
	tp_pipe_close(out);
	tp_listener_close(l);
	tp_context_free(ctx);
	return r;
}
