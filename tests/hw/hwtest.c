/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Helpers of the hw suite: the driver probe and skip decision, client CUDA contexts, device
 * memory with patterns, and the table-driven two-process transfer. See hwtest.h.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "hwtest.h"

#define HWT_DEVS_MAX 16
#define HWT_META_MAGIC 0x48575431u /* "HWT1" */

/* ---- the skip decision ------------------------------------------------------------------- */

struct probe_msg {
	int n_devices;
	char why[256];
};

static int probe_child(void *arg)
{
	int fd = *(int *)arg;
	struct probe_msg m;
	const struct tpcuda_api *api;

	memset(&m, 0, sizeof(m));
	api = tpcuda_api(m.why, sizeof(m.why));
	m.n_devices = api ? api->n_devices : 0;
	return write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m) ? 0 : 1;
}

int hwt_probe(char *why, size_t why_len)
{
	struct probe_msg m = { 0 };
	struct pollfd pfd;
	int fd[2];
	ssize_t k = -1;
	pid_t pid;

	if (pipe2(fd, O_CLOEXEC) < 0) {
		snprintf(why, why_len, "pipe: %s", strerror(errno));
		return 0;
	}
	pid = tpt_fork(probe_child, &fd[1]);
	close(fd[1]);
	pfd = (struct pollfd){ .fd = fd[0], .events = POLLIN };
	if (pid > 0 && poll(&pfd, 1, TPT_SCALED_MS(60000)) == 1)
		k = read(fd[0], &m, sizeof(m));
	close(fd[0]);
	if (pid > 0)
		tpt_wait(pid, TPT_SCALED_MS(10000), NULL);
	if (k != (ssize_t)sizeof(m)) {
		snprintf(why, why_len, "the CUDA probe process failed or hung");
		return 0;
	}
	m.why[sizeof(m.why) - 1] = '\0';
	if (m.n_devices <= 0)
		snprintf(why, why_len, "%s", m.why[0] ? m.why : "no CUDA device");
	return m.n_devices > 0 ? m.n_devices : 0;
}

/* Ends without running @s, freed (a runner frees its suites), with exit code @code. */
static int not_run(Suite *s, int code)
{
	srunner_free(srunner_create(s));
	return code;
}

int hwt_main(Suite *s, int min_devices)
{
	const char *req = getenv("TPT_HW_REQUIRE");
	bool must = req && strcmp(req, "1") == 0;
	char why[300];
	int n = hwt_probe(why, sizeof(why));

	if (n > 0 && n < min_devices) {
		/* A GPU works here; this suite needs more of them: a fact of the machine, not a
		 * failure, even where a missing GPU must fail (a one-GPU device check). */
		printf("SKIP: needs %d CUDA devices, found %d\n", min_devices, n);
		fflush(stdout);
		return not_run(s, HWT_EXIT_SKIP);
	}
	if (n <= 0) {
		printf("%s: %s\n", must ? "FAIL" : "SKIP", why);
		fflush(stdout);
		return not_run(s, must ? EXIT_FAILURE : HWT_EXIT_SKIP);
	}
	printf("CUDA: %d device(s)\n", n);
	fflush(stdout);
	return tpt_run_suite(s);
}

/* ---- contexts and device memory ------------------------------------------------------------ */

void hwt_cu_log(const struct hwt_cuda *c, CUresult r, const char *expr, const char *file,
		int line)
{
	char buf[256];

	tpt_log("%s:%d: %s", file, line, tpcuda_why(c ? c->api : NULL, expr, r, buf, sizeof(buf)));
}

int hwt_cuda_open(int ordinal, struct hwt_cuda *ret)
{
	struct hwt_cuda c = { .ordinal = ordinal };
	char why[256];
	CUresult r;

	c.api = tpcuda_api(why, sizeof(why));
	TPT_REQUIRE(c.api, -ENODEV, "CUDA: %s", why);
	TPT_REQUIRE(ordinal >= 0 && ordinal < c.api->n_devices, -ENODEV,
		    "CUDA device %d, the driver sees %d", ordinal, c.api->n_devices);
	HWT_CU(&c, cuDeviceGet(&c.dev, ordinal), -ENODEV);
	HWT_CU(&c, cuDevicePrimaryCtxRetain(&c.ctx, c.dev), -ENODEV);
	r = c.api->cuCtxSetCurrent(c.ctx);
	if (r != CUDA_SUCCESS) {
		hwt_cu_log(&c, r, "cuCtxSetCurrent", __FILE__, __LINE__);
		c.api->cuDevicePrimaryCtxRelease(c.dev);
		return tpcuda_errno(r);
	}
	*ret = c;
	return 0;
}

void hwt_cuda_close(struct hwt_cuda *c)
{
	if (c->api && c->ctx)
		c->api->cuDevicePrimaryCtxRelease(c->dev);
	memset(c, 0, sizeof(*c));
}

int hwt_dev_put(const struct hwt_cuda *c, CUdeviceptr p, const void *host, size_t len,
		CUstream stream)
{
	if (len == 0)
		return 0;
	if (stream)
		HWT_CU(c, cuMemcpyHtoDAsync(p, host, len, stream), -EIO);
	else
		HWT_CU(c, cuMemcpyHtoD(p, host, len), -EIO);
	return 0;
}

int hwt_dev_alloc_fill(const struct hwt_cuda *c, size_t len, uint64_t seed, CUdeviceptr *ret)
{
	uint8_t *img = malloc(len);
	int r;

	TPT_REQUIRE(img, -ENOMEM, "malloc");
	tpt_fill(img, len, seed);
	HWT_CU(c, cuMemAlloc(ret, len), (free(img), -ENOMEM));
	r = hwt_dev_put(c, *ret, img, len, NULL);
	free(img);
	if (r < 0)
		c->api->cuMemFree(*ret);
	return r;
}

int hwt_dev_get(const struct hwt_cuda *c, CUdeviceptr p, void *host, size_t len)
{
	if (len)
		HWT_CU(c, cuMemcpyDtoH(host, p, len), -EIO);
	return 0;
}

int hwt_dev_set(const struct hwt_cuda *c, CUdeviceptr p, uint8_t value, size_t len)
{
	HWT_CU(c, cuMemsetD8Async(p, value, len, NULL), -EIO);
	HWT_CU(c, cuStreamSynchronize(NULL), -EIO);
	return 0;
}

bool hwt_same(const void *got, const void *want, size_t len, const char *what)
{
	const uint8_t *g = got, *w = want;

	if (memcmp(got, want, len) == 0)
		return true;
	for (size_t i = 0; i < len; i++) {
		if (g[i] != w[i]) {
			tpt_log("%s: byte %zu of %zu is 0x%02x, want 0x%02x", what, i, len, g[i],
				w[i]);
			break;
		}
	}
	return false;
}

int hwt_dev_expect(const struct hwt_cuda *c, CUdeviceptr p, const void *want, size_t len,
		   const char *what)
{
	uint8_t *got = malloc(len ? len : 1);
	int r;

	TPT_REQUIRE(got, -ENOMEM, "malloc(%zu)", len);
	r = hwt_dev_get(c, p, got, len);
	if (r == 0 && !hwt_same(got, want, len, what))
		r = 1;
	free(got);
	return r;
}

int hwt_dev_expect_byte(const struct hwt_cuda *c, CUdeviceptr p, uint8_t value, size_t len,
			const char *what)
{
	uint8_t *want = malloc(len ? len : 1);
	int r;

	TPT_REQUIRE(want, -ENOMEM, "malloc(%zu)", len);
	memset(want, value, len);
	r = hwt_dev_expect(c, p, want, len, what);
	free(want);
	return r;
}

/* ---- one side's memory in a transfer -------------------------------------------------------- */

const char *hwt_mem_name(enum hwt_mem m)
{
	switch (m) {
	case HWT_CPU_SHM: return "cpu/shm";
	case HWT_CPU_PRIVATE: return "cpu/private";
	case HWT_CUDA: return "cuda";
	}
	return "?";
}

const char *hwt_side_name(const struct hwt_side *s, char *buf, size_t len)
{
	char dev[32] = "", off[48] = "";

	if (s->mem == HWT_CUDA)
		snprintf(dev, sizeof(dev), ":%d%s", s->device, s->stream ? " (stream)" : "");
	if (s->pad_before || s->pad_after)
		snprintf(off, sizeof(off), " at +%zu, %zu after", s->pad_before, s->pad_after);
	snprintf(buf, len, "%s%s%s", hwt_mem_name(s->mem), dev, off);
	return buf;
}

/* The CUDA devices one process uses, opened on first use. */
struct proc_cuda {
	struct hwt_cuda dev[HWT_DEVS_MAX];
};

/* Returns device @ordinal's context, made current on this thread, or NULL (printed). */
static const struct hwt_cuda *proc_cuda_get(struct proc_cuda *pc, int ordinal)
{
	struct hwt_cuda *c;

	TPT_REQUIRE(ordinal >= 0 && ordinal < HWT_DEVS_MAX, NULL, "device %d", ordinal);
	c = &pc->dev[ordinal];
	if (!c->api && hwt_cuda_open(ordinal, c) < 0)
		return NULL;
	HWT_CU(c, cuCtxSetCurrent(c->ctx), NULL);
	return c;
}

static void proc_cuda_close(struct proc_cuda *pc)
{
	for (int i = 0; i < HWT_DEVS_MAX; i++)
		hwt_cuda_close(&pc->dev[i]);
}

/* An allocation of one side: pad_before + len + pad_after bytes. */
struct side_mem {
	const struct hwt_side *s;
	const struct hwt_cuda *cu; /* HWT_CUDA */
	size_t len, total;
	uint8_t *host;	  /* CPU memory (HWT_CPU_*) */
	CUdeviceptr dev;  /* HWT_CUDA */
	CUstream stream;  /* HWT_CUDA with s->stream */
	uint8_t *staging; /* what was copied to the device, kept until the operation completed */
};

static int side_alloc(struct tp_context *ctx, struct proc_cuda *pc, const struct hwt_side *s,
		      size_t len, struct side_mem *m)
{
	int r;

	*m = (struct side_mem){ .s = s, .len = len, .total = s->pad_before + len + s->pad_after };
	if (s->mem == HWT_CPU_SHM) {
		r = tp_buffer_alloc(ctx, m->total, (void **)&m->host);
		TPT_REQUIRE(r == 0, r, "tp_buffer_alloc(%zu): %d %s", m->total, r, tp_last_error());
		return 0;
	}
	if (s->mem == HWT_CPU_PRIVATE) {
		m->host = malloc(m->total ? m->total : 1);
		TPT_REQUIRE(m->host, -ENOMEM, "malloc(%zu)", m->total);
		return 0;
	}
	m->cu = proc_cuda_get(pc, s->device);
	TPT_REQUIRE(m->cu, -ENODEV, "no CUDA context for device %d", s->device);
	HWT_CU(m->cu, cuMemAlloc(&m->dev, m->total ? m->total : 1), -ENOMEM);
	if (s->stream)
		HWT_CU(m->cu, cuStreamCreate(&m->stream, CU_STREAM_NON_BLOCKING), -EIO);
	return 0;
}

/* Frees @m; CUDA memory after tp_cuda_release(), as the API asks. */
static void side_free(struct tp_context *ctx, struct side_mem *m)
{
	int r;

	if (m->s && m->s->mem == HWT_CPU_SHM && m->host)
		tp_buffer_free(ctx, m->host);
	else if (m->s && m->s->mem == HWT_CPU_PRIVATE)
		free(m->host);
	if (m->dev) {
		r = tp_cuda_release(ctx, hwt_ptr(m->dev));
		if (r != 0)
			tpt_log("tp_cuda_release: %d %s", r, tp_last_error());
		m->cu->api->cuCtxSetCurrent(m->cu->ctx);
		if (m->stream)
			m->cu->api->cuStreamDestroy(m->stream);
		m->cu->api->cuMemFree(m->dev);
	}
	free(m->staging);
	memset(m, 0, sizeof(*m));
}

/* Writes the whole @image into @m: CPU memcpy, or a copy queued on the side's stream. */
static int side_put(struct side_mem *m, uint8_t *image)
{
	if (m->s->mem != HWT_CUDA) {
		memcpy(m->host, image, m->total);
		free(image);
		return 0;
	}
	free(m->staging);
	m->staging = image; /* an async copy reads it later */
	HWT_CU(m->cu, cuCtxSetCurrent(m->cu->ctx), -EIO);
	return hwt_dev_put(m->cu, m->dev, image, m->total, m->stream);
}

/* Compares the whole of @m with @want, region by region. Return: 0, 1 (printed), -errno. */
static int side_check(struct side_mem *m, const uint8_t *want, const char *what)
{
	static const char *const region[] = { "the bytes before the tensor", "the tensor",
					      "the bytes after the tensor" };
	size_t pb = m->s->pad_before;
	size_t off[3] = { 0, pb, pb + m->len }, len[3] = { pb, m->len, m->s->pad_after };
	uint8_t *got = m->host;
	int r = 0;

	if (m->s->mem == HWT_CUDA) {
		got = malloc(m->total ? m->total : 1);
		TPT_REQUIRE(got, -ENOMEM, "malloc(%zu)", m->total);
		r = hwt_dev_get(m->cu, m->dev, got, m->total);
	}
	for (int k = 0; k < 3 && r == 0; k++) {
		if (!hwt_same(got + off[k], want + off[k], len[k], region[k])) {
			tpt_log("%s: wrong bytes in %s", what, region[k]);
			r = 1;
		}
	}
	if (got != m->host)
		free(got);
	return r;
}

static struct tp_device side_device(const struct hwt_side *s)
{
	if (s->mem == HWT_CUDA)
		return (struct tp_device){ TP_DEVICE_CUDA, s->device };
	return (struct tp_device){ TP_DEVICE_CPU, 0 };
}

/* ---- the transfer ---------------------------------------------------------------------------- */

struct tensor_meta {
	uint32_t magic;
	uint32_t index;
	uint64_t len;
};

struct xfer_run {
	const struct hwt_xfer *x;
	struct tpt_sync ready; /* reader -> writer: listening */
	struct tpt_sync read;  /* reader -> writer: every message read and checked */
};

/* Seeds: the tensor's bytes, the writer's bytes around it, the reader's pre-fill. */
static uint64_t case_seed(const struct hwt_xfer *x, size_t i, unsigned what)
{
	return tpt_seed(1000 + x->seed, (unsigned)i, what);
}

/* The writer's image of case @i: pattern 1 around the tensor, pattern 0 in it. */
static uint8_t *writer_image(const struct hwt_xfer *x, size_t i, const struct side_mem *m)
{
	uint8_t *img = malloc(m->total ? m->total : 1);

	if (!img)
		return NULL;
	tpt_fill(img, m->total, case_seed(x, i, 1));
	tpt_fill(img + m->s->pad_before, m->len, case_seed(x, i, 0));
	return img;
}

static int write_case(struct tp_context *ctx, struct tp_pipe *p, struct proc_cuda *pc,
		      const struct hwt_xfer *x, size_t i)
{
	const struct hwt_case *c = &x->cases[i];
	struct tensor_meta meta = { HWT_META_MAGIC, (uint32_t)i, c->len };
	struct tp_tensor t = { .device = side_device(&c->w), .length = c->len,
			       .metadata = &meta, .metadata_len = sizeof(meta),
			       .has_target = c->has_target, .target = c->target };
	struct tp_message msg = { .tensors = &t, .n_tensors = 1 };
	struct side_mem m;
	uint8_t *img;
	int r = side_alloc(ctx, pc, &c->w, c->len, &m);

	img = r == 0 ? writer_image(x, i, &m) : NULL;
	if (r == 0 && !img)
		r = -ENOMEM;
	if (r == 0)
		r = side_put(&m, img);
	t.data = m.s && m.s->mem == HWT_CUDA ? hwt_ptr(m.dev + c->w.pad_before) :
					       (void *)(m.host + c->w.pad_before);
	t.cuda_stream = m.stream;
	if (r == 0) {
		r = tp_pipe_write_sync(p, &msg);
		if (r != 0)
			tpt_log("writer: case %zu: write: %d %s", i, r, tp_last_error());
	}
	side_free(ctx, &m);
	return r;
}

static int xfer_writer(void *arg)
{
	struct xfer_run *run = arg;
	struct tpt_end e = { .d = run->x->writer_d ? run->x->writer_d : run->x->d,
			     .ctx_name = "hw-writer",
			     .where = run->x->address ? run->x->address : run->x->name,
			     .ready = &run->ready, .timeout_ms = HWT_T_MS };
	struct proc_cuda pc;
	int r = tpt_end_connect(&e);

	memset(&pc, 0, sizeof(pc));
	for (size_t i = 0; r == 0 && i < run->x->n_cases; i++)
		r = write_case(e.ctx, e.p, &pc, run->x, i);
	if (r == 0 && tpt_sync_wait(&run->read, HWT_T_MS) != 0) {
		tpt_log("writer: the reader did not finish");
		r = 1;
	}
	tpt_end_close(&e);
	proc_cuda_close(&pc);
	return r ? 1 : 0;
}

static bool desc_ok(const struct tp_descriptor *d, const struct hwt_case *c, size_t i)
{
	const struct tp_tensor_desc *t = d->n_tensors == 1 ? &d->tensors[0] : NULL;
	struct tp_device want = side_device(&c->w);
	struct tensor_meta meta = { HWT_META_MAGIC, (uint32_t)i, c->len };

	TPT_REQUIRE(t && d->n_payloads == 0, false, "case %zu: %zu payloads, %zu tensors", i,
		    d->n_payloads, d->n_tensors);
	TPT_REQUIRE(t->length == c->len, false, "case %zu: %zu bytes, want %zu", i, t->length,
		    c->len);
	TPT_REQUIRE(t->metadata_len == sizeof(meta) && memcmp(t->metadata, &meta,
							       sizeof(meta)) == 0,
		    false, "case %zu: tensor metadata differs", i);
	TPT_REQUIRE(t->device.type == want.type && t->device.index == want.index, false,
		    "case %zu: the writer's device shows as %d:%d, want %d:%d", i, t->device.type,
		    t->device.index, want.type, want.index);
	TPT_REQUIRE(t->has_target == c->has_target, false, "case %zu: has_target %d, want %d", i,
		    t->has_target, c->has_target);
	TPT_REQUIRE(!c->has_target || (t->target.type == c->target.type &&
				       t->target.index == c->target.index),
		    false, "case %zu: target %d:%d, want %d:%d", i, t->target.type,
		    t->target.index, c->target.type, c->target.index);
	return true;
}

/* The reader's pre-fill of case @i (pattern 2, the tensor's range with the data's complement)
 * into @pre, and what the allocation must hold after the read into @want. */
static int reader_images(const struct hwt_xfer *x, size_t i, const struct side_mem *m,
			 uint8_t **pre, uint8_t **want)
{
	size_t pb = m->s->pad_before;

	*pre = malloc(m->total ? m->total : 1);
	*want = malloc(m->total ? m->total : 1);
	if (!*pre || !*want) {
		free(*pre);
		free(*want);
		return -ENOMEM;
	}
	tpt_fill(*pre, m->total, case_seed(x, i, 2));
	tpt_fill(*pre + pb, m->len, case_seed(x, i, 0));
	for (size_t k = 0; k < m->len; k++)
		(*pre)[pb + k] = (uint8_t)~(*pre)[pb + k];
	memcpy(*want, *pre, m->total);
	tpt_fill(*want + pb, m->len, case_seed(x, i, 0));
	return 0;
}

static int read_into(struct tp_pipe *p, struct tp_descriptor *d, struct side_mem *m,
		     size_t i)
{
	struct tp_slot slot = { .device = side_device(m->s), .cuda_stream = m->stream };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	int r;

	slot.data = m->s->mem == HWT_CUDA ? hwt_ptr(m->dev + m->s->pad_before) :
					    (void *)(m->host + m->s->pad_before);
	if (m->cu)
		m->cu->api->cuCtxSetCurrent(m->cu->ctx);
	r = tp_pipe_read_sync(p, d, &a);
	if (r != 0)
		tpt_log("reader: case %zu: read: %d %s", i, r, tp_last_error());
	return r;
}

static int read_case(struct tp_context *ctx, struct tp_pipe *p, struct proc_cuda *pc,
		     const struct hwt_xfer *x, size_t i)
{
	const struct hwt_case *c = &x->cases[i];
	struct tp_descriptor *d = NULL;
	uint8_t *pre = NULL, *want = NULL;
	char what[160], wn[64], rn[64];
	struct side_mem m = { 0 };
	int r = tp_pipe_read_descriptor_sync(p, HWT_T_MS, &d);

	TPT_REQUIRE(r == 0, r, "reader: case %zu: descriptor: %d %s", i, r, tp_last_error());
	if (!desc_ok(d, c, i)) {
		tp_descriptor_free(d);
		return 1;
	}
	r = side_alloc(ctx, pc, &c->r, c->len, &m);
	if (r == 0)
		r = reader_images(x, i, &m, &pre, &want);
	if (r == 0)
		r = side_put(&m, pre);
	if (r == 0)
		r = read_into(p, d, &m, i);
	else
		tp_descriptor_free(d);
	snprintf(what, sizeof(what), "case %zu: %zu bytes %s -> %s", i, c->len,
		 hwt_side_name(&c->w, wn, sizeof(wn)), hwt_side_name(&c->r, rn, sizeof(rn)));
	if (r == 0)
		r = side_check(&m, want, what);
	free(want);
	side_free(ctx, &m);
	return r;
}

static int xfer_reader(void *arg)
{
	struct xfer_run *run = arg;
	struct tpt_end e = { .d = run->x->d, .ctx_name = "hw-reader", .where = run->x->name,
			     .ready = &run->ready, .timeout_ms = HWT_T_MS };
	struct proc_cuda pc;
	int r = tpt_end_listen(&e, true);

	memset(&pc, 0, sizeof(pc));
	for (size_t i = 0; r == 0 && i < run->x->n_cases; i++)
		r = read_case(e.ctx, e.p, &pc, run->x, i);
	tpt_sync_post(&run->read, (int8_t)(r ? 1 : 0));
	tpt_end_close(&e);
	proc_cuda_close(&pc);
	return r ? 1 : 0;
}

bool hwt_xfer_run(const struct hwt_xfer *x)
{
	struct xfer_run run = { .x = x };
	char wn[64], rn[64];
	uint64_t t0 = tpt_now_ms();
	bool ok;

	if (tpt_sync_init(&run.ready) < 0 || tpt_sync_init(&run.read) < 0)
		return false;
	ok = tpt_run_pair(xfer_reader, xfer_writer, &run, 2 * HWT_T_MS);
	for (size_t i = 0; i < x->n_cases; i++)
		printf("%s: %zu bytes %s -> %s%s\n", x->name, x->cases[i].len,
		       hwt_side_name(&x->cases[i].w, wn, sizeof(wn)),
		       hwt_side_name(&x->cases[i].r, rn, sizeof(rn)),
		       x->cases[i].has_target ? " (with target)" : "");
	printf("%s: %s in %llu ms\n", x->name, ok ? "ok" : "FAILED",
	       (unsigned long long)(tpt_now_ms() - t0));
	tpt_sync_done(&run.ready);
	tpt_sync_done(&run.read);
	return ok;
}

/* ---- tpipctl -------------------------------------------------------------------------------- */

char *hwt_ctl(const struct tpt_daemon *d, const char *cmd, bool json)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[6] = { bin, "--socket", d->socket, cmd, NULL, NULL };
	struct tpt_cmd_result res;
	char *out;
	int r;

	TPT_REQUIRE(bin && *bin, NULL, "TPIPCTL_BIN is not set");
	if (json) {
		argv[3] = "--json";
		argv[4] = cmd;
	}
	r = tpt_run(argv, TPT_SCALED_MS(30000), &res);
	TPT_REQUIRE(r == 0, NULL, "tpipctl %s: %d", cmd, r);
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0) {
		tpt_log("tpipctl %s%s failed (status 0x%x): stdout:\n%s\nstderr:\n%s",
			json ? "--json " : "", cmd, res.status, res.out, res.err);
		tpt_cmd_result_free(&res);
		return NULL;
	}
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}
