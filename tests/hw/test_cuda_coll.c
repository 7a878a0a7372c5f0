/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: collectives on CUDA buffers (tp_group_set_coll_options(), docs/collectives.md).
 * Three processes join a group, each with its buffers in device memory: all-reduce (on a
 * stream of its own, its input written on that stream and not waited for), a user reduction in
 * place on the legacy default stream, a user reduction on the device queued on the call's stream
 * (tp_allreduce_cuda_fn()), uneven steps, broadcast from every root, all-gather and
 * reduce-scatter, all read back from the device and compared with references computed here;
 * options for CPU memory switch back; bad options are refused. Skips (77) without a CUDA driver
 * or device.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hwtest.h"

#define RANKS 3
#define N 300007 /* float32 elements: more than one arena chunk */
#define T_MS 60000

#define D (&tpt_fixture_daemon)

static void sum_fn(void *inout, const void *in, size_t n, enum tp_dtype dt, void *user)
{
	float *a = inout;
	const float *b = in;

	(void)dt;
	(void)user;
	for (size_t i = 0; i < n; i++)
		a[i] += b[i];
}

static float val(int rank, size_t i)
{
	return (float)((i * 7 + (size_t)rank * 13) % 101);
}

static float sum_all(size_t i, int from)
{
	float s = 0;

	for (int r = from; r < RANKS; r++)
		s += val(r, i);
	return s;
}

/* Copies @n floats of device @p back and compares them with @want(i). */
static int expect(const struct hwt_cuda *cu, CUdeviceptr p, size_t n, float (*want)(size_t, int),
		  int arg, const char *what)
{
	float *h = malloc(n * sizeof(*h));
	int r = h ? hwt_dev_get(cu, p, h, n * sizeof(*h)) : -ENOMEM;

	for (size_t i = 0; r == 0 && i < n; i++)
		if (h[i] != want(i, arg)) {
			fprintf(stderr, "%s: element %zu is %g, not %g\n", what, i, h[i],
				want(i, arg));
			r = 1;
		}
	free(h);
	return r;
}

static float want_sum(size_t i, int from)
{
	return sum_all(i, from);
}

static float want_root(size_t i, int root)
{
	return val(root, i) + 1000.0f;
}

static float want_gather(size_t i, int n)
{
	return val((int)(i / (size_t)n), i % (size_t)n);
}

static float want_scatter(size_t i, int rank)
{
	return sum_all(i + (size_t)rank * 1000, 0);
}

/*
 * Fills @n floats at device @p with fn(@rank, i): on @s without waiting (the host copy is kept
 * in *@keep, to be freed once the stream passed the copy), or synchronously with @s NULL.
 */
static int fill(const struct hwt_cuda *cu, CUdeviceptr p, size_t n, float (*fn)(int, size_t),
		int rank, CUstream s, float **keep)
{
	float *h = malloc(n * sizeof(*h));
	int r;

	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++)
		h[i] = fn(rank, i);
	r = hwt_dev_put(cu, p, h, n * sizeof(*h), s);
	if (s && keep)
		*keep = h;
	else
		free(h);
	return r;
}

static float val_root(int rank, size_t i)
{
	return val(rank, i) + 1000.0f;
}

/* A user reduction on the device (tp_allreduce_cuda_fn()): queues on the stream it is given the
 * copies of both operands to host memory, a host function that adds them, and the copy of the
 * sum back into @inout, and returns before any of it runs (fakecuda runs each stream on a
 * thread of its own), so the result is right only if the library waits for that stream. */
struct dev_op {
	struct dev_op *next;
	float *a, *b;
	size_t n;
};

struct dev_fold {
	const struct hwt_cuda *cu;
	CUstream want;
	unsigned calls, other_stream, failed;
	struct dev_op *ops; /* freed once the call returned */
};

static void CUDA_CB host_add(void *arg)
{
	struct dev_op *op = arg;

	for (size_t i = 0; i < op->n; i++)
		op->a[i] += op->b[i];
}

static void dev_fold_fn(void *inout, const void *in, size_t n, enum tp_dtype dt, void *stream,
			void *user)
{
	struct dev_fold *f = user;
	const struct tpcuda_api *api = f->cu->api;
	struct dev_op *op = calloc(1, sizeof(*op));
	CUstream s = (CUstream)stream;

	f->calls++;
	f->other_stream += s != f->want || dt != TP_DTYPE_F32;
	if (!op || !(op->a = malloc(n * 4)) || !(op->b = malloc(n * 4))) {
		f->failed++;
		if (op)
			free(op->a);
		free(op);
		return;
	}
	op->n = n;
	op->next = f->ops;
	f->ops = op;
	if (api->cuMemcpyDtoHAsync(op->a, (CUdeviceptr)(uintptr_t)inout, n * 4, s) ||
	    api->cuMemcpyDtoHAsync(op->b, (CUdeviceptr)(uintptr_t)in, n * 4, s) ||
	    api->cuLaunchHostFunc(s, host_add, op) ||
	    api->cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)inout, op->a, n * 4, s))
		f->failed++;
}

static void dev_fold_free(struct dev_fold *f)
{
	while (f->ops) {
		struct dev_op *op = f->ops;

		f->ops = op->next;
		free(op->a);
		free(op->b);
		free(op);
	}
}

static int member(void *arg)
{
	struct tp_group_options go = { .size = sizeof(go), .rank = (int)(intptr_t)arg,
				       .nranks = RANKS, .join_timeout_ms = T_MS,
				       .op_timeout_ms = T_MS };
	struct tp_coll_options co = { .size = sizeof(co), .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_coll_options cpu = { .size = sizeof(co) };
	struct tp_context *ctx;
	struct tp_group *g;
	struct hwt_cuda cu;
	CUdeviceptr a, b, big;
	CUstream s;
	float *pending = NULL;
	unsigned n = 0;
	int rank = go.rank, r;
	float one[3], out[3];

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	HWT_CU(&cu, cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), 1);
	HWT_CU(&cu, cuMemAlloc(&a, N * sizeof(float)), 1);
	HWT_CU(&cu, cuMemAlloc(&b, N * sizeof(float)), 1);
	HWT_CU(&cu, cuMemAlloc(&big, (size_t)RANKS * N * sizeof(float)), 1);
	TPT_REQUIRE(tpt_ctx_new(D, 0, NULL, &ctx) == 0, 1, "context");
	r = tp_group_join(ctx, "cuda-coll", &go, &g);
	TPT_REQUIRE(r == 0, 1, "join: %s", tp_last_error());

	/* bad options first: nothing changes */
	co.device.index = -1;
	TPT_REQUIRE(tp_group_set_coll_options(g, &co) == -EINVAL, 1, "device -1 taken");
	co.device.index = 0;
	cpu.cuda_stream = (void *)s;
	TPT_REQUIRE(tp_group_set_coll_options(g, &cpu) == -EINVAL, 1, "a CPU stream taken");
	cpu.cuda_stream = NULL;

	/* all-reduce on our stream, its input written on that stream just before, not waited
	 * for: the collective reads it after that copy */
	co.cuda_stream = (void *)s;
	TPT_REQUIRE(tp_group_set_coll_options(g, &co) == 0, 1, "options: %s", tp_last_error());
	TPT_REQUIRE(fill(&cu, a, N, val, rank, s, &pending) == 0, 1, "fill");
	r = tp_allreduce(g, hwt_ptr(a), hwt_ptr(b), N, TP_DTYPE_F32, TP_OP_SUM);
	free(pending); /* the call waited for the stream */
	TPT_REQUIRE(r == 0, 1, "allreduce: %s", tp_last_error());
	TPT_REQUIRE(expect(&cu, b, N, want_sum, 0, "allreduce") == 0, 1, "allreduce result");
	/* in place, on the legacy default stream, a user reduction */
	co.cuda_stream = NULL;
	TPT_REQUIRE(tp_group_set_coll_options(g, &co) == 0, 1, "options");
	r = tp_allreduce_fn(g, hwt_ptr(a), hwt_ptr(a), N, TP_DTYPE_F32, sum_fn, NULL);
	TPT_REQUIRE(r == 0, 1, "allreduce_fn: %s", tp_last_error());
	TPT_REQUIRE(expect(&cu, a, N, want_sum, 0, "allreduce_fn") == 0, 1, "in place");
	/* a user reduction on the device, on our stream, into another buffer */
	{
		struct dev_fold f = { .cu = &cu, .want = s };

		co.cuda_stream = (void *)s;
		TPT_REQUIRE(tp_group_set_coll_options(g, &co) == 0, 1, "options");
		TPT_REQUIRE(fill(&cu, a, N, val, rank, NULL, NULL) == 0, 1, "fill");
		TPT_REQUIRE(hwt_dev_set(&cu, b, 0, N * sizeof(float)) == 0, 1, "clear");
		r = tp_allreduce_cuda_fn(g, hwt_ptr(a), hwt_ptr(b), N, TP_DTYPE_F32, dev_fold_fn,
					 &f);
		dev_fold_free(&f);
		TPT_REQUIRE(r == 0, 1, "allreduce_cuda_fn: %s", tp_last_error());
		TPT_REQUIRE(f.calls > 0 && !f.other_stream && !f.failed, 1, "%u folds, %u on "
			    "another stream, %u failed", f.calls, f.other_stream, f.failed);
		TPT_REQUIRE(expect(&cu, b, N, want_sum, 0, "allreduce_cuda_fn") == 0, 1,
			    "device reduction");
		co.cuda_stream = NULL;
		TPT_REQUIRE(tp_group_set_coll_options(g, &co) == 0, 1, "options");
	}
	/* uneven: rank r takes part in steps 0..r */
	for (int step = 0;; step++) {
		TPT_REQUIRE(fill(&cu, a, 3, val, rank, NULL, NULL) == 0, 1, "fill");
		r = tp_allreduce_uneven(g, step <= rank ? hwt_ptr(a) : NULL, hwt_ptr(b), 3,
					TP_DTYPE_F32, TP_OP_SUM, &n);
		TPT_REQUIRE(r == 0, 1, "uneven: %s", tp_last_error());
		if (n == 0)
			break;
		TPT_REQUIRE(n == (unsigned)(RANKS - step), 1, "step %d: %u contributed", step, n);
		TPT_REQUIRE(expect(&cu, b, 3, want_sum, step, "uneven") == 0, 1, "uneven result");
	}
	/* broadcast from every root */
	for (int root = 0; root < RANKS; root++) {
		TPT_REQUIRE(fill(&cu, a, N, rank == root ? val_root : val, rank, NULL, NULL) == 0, 1,
			    "fill");
		r = tp_broadcast(g, hwt_ptr(a), N, TP_DTYPE_F32, root);
		TPT_REQUIRE(r == 0, 1, "broadcast: %s", tp_last_error());
		TPT_REQUIRE(expect(&cu, a, N, want_root, root, "broadcast") == 0, 1, "root %d",
			    root);
	}
	/* all-gather: rank r's block is val(r, i) */
	TPT_REQUIRE(fill(&cu, a, N, val, rank, NULL, NULL) == 0, 1, "fill");
	r = tp_allgather(g, hwt_ptr(a), hwt_ptr(big), N, TP_DTYPE_F32);
	TPT_REQUIRE(r == 0, 1, "allgather: %s", tp_last_error());
	TPT_REQUIRE(expect(&cu, big, (size_t)RANKS * N, want_gather, N, "allgather") == 0, 1,
		    "allgather result");
	/* reduce-scatter of 3 x 1000: part r of the sum */
	TPT_REQUIRE(fill(&cu, big, (size_t)RANKS * 1000, val, rank, NULL, NULL) == 0, 1, "fill");
	r = tp_reduce_scatter(g, hwt_ptr(big), hwt_ptr(b), 1000, TP_DTYPE_F32, TP_OP_SUM);
	TPT_REQUIRE(r == 0, 1, "reduce_scatter: %s", tp_last_error());
	TPT_REQUIRE(expect(&cu, b, 1000, want_scatter, rank, "reduce_scatter") == 0, 1,
		    "reduce_scatter result");
	/* back to CPU memory: a reduction on the device is refused there */
	TPT_REQUIRE(tp_group_set_coll_options(g, &cpu) == 0, 1, "CPU options");
	r = tp_allreduce_cuda_fn(g, one, out, 3, TP_DTYPE_F32, dev_fold_fn, NULL);
	TPT_REQUIRE(r == -EINVAL && strstr(tp_last_error(), "tp_group_set_coll_options"), 1,
		    "a device reduction on CPU options: %d %s", r, tp_last_error());
	for (int i = 0; i < 3; i++)
		one[i] = (float)(rank + i);
	r = tp_allreduce(g, one, out, 3, TP_DTYPE_F32, TP_OP_SUM);
	TPT_REQUIRE(r == 0 && out[2] == (float)(RANKS * (RANKS - 1) / 2 + 2 * RANKS), 1,
		    "CPU allreduce: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_group_leave(g) == 0, 1, "leave");
	return 0; /* tpt_fork() _exit()s */
}

START_TEST(test_cuda_coll_every_collective_on_device_buffers)
{
	pid_t pid[RANKS];

	for (int r = 0; r < RANKS; r++)
		pid[r] = tpt_fork(member, (void *)(intptr_t)r);
	for (int r = 0; r < RANKS; r++)
		ck_assert(tpt_wait_ok(pid[r], 3 * T_MS, "member"));
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
}
END_TEST

static Suite *cuda_coll_suite(void)
{
	Suite *s = suite_create("cuda_coll");
	TCase *tc = tcase_create("cuda_coll");

	tcase_add_checked_fixture(tc, tpt_fixture_start, tpt_fixture_stop);
	tcase_add_test(tc, test_cuda_coll_every_collective_on_device_buffers);
	tcase_set_timeout(tc, 300);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_coll_suite(), 1);
}
