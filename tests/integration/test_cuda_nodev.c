/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Integration suite: CUDA tensors on a machine without a usable CUDA driver (or in a build
 * without CUDA). A write of a CUDA tensor, alone or next to a CPU payload, fails with
 * -EOPNOTSUPP (from tp_pipe_write() or from its callback) and a message that names CUDA,
 * delivers nothing, and the same pipe then moves a CPU message; tp_cuda_release() says
 * -EOPNOTSUPP. A read into a CUDA slot fails the same way, the writer's write completes, and
 * the next message reads fine. A raw client that sends the daemon a CUDA memory reference
 * itself gets STATUS_UNSUPPORTED for that write only. `tpipctl backends` lists cuda_ipc,
 * cuda_basic and cuda_gdr as not viable, each with a reason. The daemon stays up throughout
 * and stops cleanly. Where a CUDA device works, the binary exits 77 (skipped): the hw suite
 * (tests/hw) covers CUDA there.
 */
#include <check.h>
#include <errno.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"
#if TPT_HAVE_CUDA
#include "tpcuda.h"
#endif

#define T_MS TPT_SCALED_MS(30000)
#define FAKE_DEV_PTR ((void *)0x1000) /* never dereferenced: nothing can map it here */

static const struct tpt_daemon *D = &tpt_fixture_daemon;
static struct tpt_sync ready, to_writer;
static size_t read_len; /* the tensor the reader is asked to read into CUDA memory */

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&to_writer), 0);
}

static void teardown(void)
{
	ck_assert_msg(tpt_daemon_alive(D), "tpipd died");
	tpt_sync_done(&ready);
	tpt_sync_done(&to_writer);
	tpt_fixture_stop();
}

/* The CPU message that must arrive after the refused ones. */
static void cpu_spec(unsigned index, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 90;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->lens[0] = 100;
	s->lens[1] = (64u << 10) + 1;
	s->meta_len = 8;
	s->seg_meta_len = 8;
}

/* ---- refusals ------------------------------------------------------------------------------ */

/* An operation that must be refused, either by the call or through its callback. */
struct refusal {
	struct tpt_done done;
	struct tpt_done_arg da;
	char msg[512];
};

static void refusal_init(struct refusal *f)
{
	memset(f, 0, sizeof(*f));
	tpt_done_init(&f->done);
	f->da.done = &f->done;
}

static void refusal_cb(void *arg, struct tp_pipe *p, int status, const char *errmsg)
{
	struct refusal *f = arg;

	snprintf(f->msg, sizeof(f->msg), "%s", errmsg ? errmsg : "");
	tpt_done_cb(&f->da, p, status, errmsg);
}

/*
 * Checks the refusal of a call that returned @r (call it right after, on the same thread, so
 * that tp_last_error() is the call's). Return: 0 or 1 (printed).
 */
static int refusal_check(struct refusal *f, int r, const char *what)
{
	const char *msg = f->msg;
	int status = r;

	if (r < 0) {
		msg = tp_last_error();
	} else {
		TPT_REQUIRE(tpt_done_wait(&f->done, 1, T_MS) == 0, 1, "%s: no callback", what);
		status = f->done.last_status;
	}
	TPT_REQUIRE(status == -EOPNOTSUPP, 1, "%s: %d (%s), want -EOPNOTSUPP", what, status, msg);
	TPT_REQUIRE(msg && strcasestr(msg, "cuda"), 1,
		    "%s: the message \"%s\" does not mention CUDA", what, msg ? msg : "");
	tpt_log("%s: refused %s: %s", what, r < 0 ? "by the call" : "in its callback", msg);
	return 0;
}

/* ---- writes of CUDA tensors ----------------------------------------------------------------- */

static int refuse_write(struct tp_pipe *p, const struct tp_message *m, const char *what)
{
	struct refusal f;

	refusal_init(&f);
	return refusal_check(&f, tp_pipe_write(p, m, refusal_cb, &f), what);
}

static int cuda_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "nodev-writer", .where = "nodev",
			     .ready = &ready, .timeout_ms = T_MS };
	uint8_t cpu[16] = "cpu payload";
	struct tp_payload pl = { .data = cpu, .length = sizeof(cpu) };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .data = FAKE_DEV_PTR,
			       .length = 4096 };
	struct tp_message alone = { .tensors = &t, .n_tensors = 1 };
	struct tp_message mixed = { .payloads = &pl, .n_payloads = 1, .tensors = &t,
				    .n_tensors = 1 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r;

	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	r = tp_cuda_release(e.ctx, FAKE_DEV_PTR);
	TPT_REQUIRE(r == -EOPNOTSUPP, 1, "tp_cuda_release: %d (%s), want -EOPNOTSUPP", r,
		    tp_last_error());
	TPT_REQUIRE(refuse_write(e.p, &alone, "a CUDA tensor") == 0, 1, "write");
	TPT_REQUIRE(refuse_write(e.p, &mixed, "a CPU payload and a CUDA tensor") == 0, 1, "write");
	cpu_spec(0, &s);
	TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &m) == 0, 1, "build");
	r = tp_pipe_write_sync(e.p, &m.m);
	tpt_msg_free(e.ctx, &m);
	TPT_REQUIRE(r == 0, 1, "a CPU write after the refused ones: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "the reader did not finish");
	tpt_end_close(&e);
	return 0;
}

/* Reads the CPU message, and nothing else. */
static int cpu_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "nodev-reader", .where = "nodev",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_descriptor *d = NULL;
	struct tpt_msg_spec s;
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	cpu_spec(0, &s);
	r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_SHM, T_MS);
	TPT_REQUIRE(r == 0, 1, "the first message is not the CPU one: %d", r);
	r = tp_pipe_read_descriptor_sync(e.p, 300, &d);
	TPT_REQUIRE(r == -ETIMEDOUT, 1, "a refused write was delivered (%d)", r);
	tpt_sync_post(&to_writer, 0);
	tpt_end_close(&e);
	return 0;
}

START_TEST(test_cuda_nodev_write_is_refused_and_the_pipe_goes_on)
{
	ck_assert(tpt_run_pair(cpu_reader, cuda_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- reads into CUDA slots ---------------------------------------------------------------- */

static int two_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "nodev-writer", .where = "nodev",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CPU, 0 }, .length = read_len };
	struct tp_message first = { .tensors = &t, .n_tensors = 1 };
	struct tpt_done d1, d2;
	struct tpt_done_arg a1 = { &d1, 0 }, a2 = { &d2, 0 };
	struct tpt_msg_spec s;
	struct tpt_msg m;
	int r;

	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	t.data = malloc(read_len);
	TPT_REQUIRE(t.data, 1, "malloc");
	tpt_fill(t.data, read_len, 92);
	cpu_spec(1, &s);
	TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_SHM, &m) == 0, 1, "build");
	tpt_done_init(&d1);
	tpt_done_init(&d2);
	r = tp_pipe_write(e.p, &first, tpt_done_cb, &a1);
	TPT_REQUIRE(r == 0, 1, "first write: %d %s", r, tp_last_error());
	r = tp_pipe_write(e.p, &m.m, tpt_done_cb, &a2);
	TPT_REQUIRE(r == 0, 1, "second write: %d %s", r, tp_last_error());
	TPT_REQUIRE(tpt_done_wait(&d1, 1, T_MS) == 0, 1,
		    "the write the reader failed to read into CUDA memory never completed");
	tpt_log("the write read into a CUDA slot completed with %d", d1.last_status);
	TPT_REQUIRE(tpt_done_wait(&d2, 1, T_MS) == 0, 1, "the second write never completed");
	TPT_REQUIRE(d2.last_status == 0, 1, "the second write: %d", d2.last_status);
	TPT_REQUIRE(tpt_sync_wait(&to_writer, T_MS) == 0, 1, "the reader did not finish");
	tpt_msg_free(e.ctx, &m);
	free(t.data);
	tpt_end_close(&e);
	return 0;
}

static int cuda_slot_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "nodev-reader", .where = "nodev",
			     .ready = &ready, .timeout_ms = T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 }, .data = FAKE_DEV_PTR };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d = NULL;
	struct tpt_msg_spec s;
	struct refusal f;
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	TPT_REQUIRE(d->n_tensors == 1 && d->tensors[0].length == read_len, 1,
		    "unexpected descriptor");
	refusal_init(&f);
	r = tp_pipe_read(e.p, d, &a, refusal_cb, &f);
	TPT_REQUIRE(refusal_check(&f, r, "a read into a CUDA slot") == 0, 1, "read");
	cpu_spec(1, &s);
	r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r == 0, 1, "the message after the refused read: %d", r);
	tpt_sync_post(&to_writer, 0);
	tpt_end_close(&e);
	return 0;
}

/* _i: 0 an eager message (4 KiB, travels with its descriptor), 1 a rendezvous one (4 MiB). */
START_TEST(test_cuda_nodev_read_into_cuda_is_refused_and_the_pipe_goes_on)
{
	read_len = _i ? 4u << 20 : 4096;
	ck_assert(tpt_run_pair(cuda_slot_reader, two_writer, NULL, 2 * T_MS));
}
END_TEST

/* ---- the daemon refuses a CUDA reference from a raw client ---------------------------------- */

/* Accepts and expects exactly one message: an 8-byte CPU tensor "inline!!", metadata "good". */
static int raw_listener(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "nodev-listener", .where = "nodev-raw",
			     .ready = &ready, .timeout_ms = T_MS };
	uint8_t buf[8];
	struct tp_slot slot = { .device = { TP_DEVICE_CPU, 0 }, .data = buf };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d = NULL;
	int r;

	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d", r);
	TPT_REQUIRE(d->n_tensors == 1 && d->tensors[0].length == 8 && d->metadata_len == 4 &&
			    memcmp(d->metadata, "good", 4) == 0,
		    1, "the first message is not the CPU write");
	r = tp_pipe_read_sync(e.p, d, &a);
	TPT_REQUIRE(r == 0 && memcmp(buf, "inline!!", 8) == 0, 1, "read: %d", r);
	r = tp_pipe_read_descriptor_sync(e.p, 300, &d);
	TPT_REQUIRE(r == -ETIMEDOUT || r == -EPIPE || r == -ECONNRESET, 1,
		    "the CUDA write was delivered (%d)", r);
	tpt_end_close(&e);
	return 0;
}

/* A Write of one tensor on pipe 1: CUDA memory on device 0, or 8 inline bytes on the CPU. */
static Tpw__V1__Status raw_write(struct tpt_raw *raw, uint64_t write_id, bool cuda,
				 char *ret_msg, size_t msg_len)
{
	static uint8_t handle[TPW_CUDA_HANDLE_BYTES];
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Tensor t = TPW__V1__TENSOR__INIT, *ts[] = { &t };
	Tpw__V1__Device dev = TPW__V1__DEVICE__INIT;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;
	Tpw__V1__CudaRef ref = TPW__V1__CUDA_REF__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	Tpw__V1__Status st;

	ref.mem_handle = (ProtobufCBinaryData){ sizeof(handle), handle };
	ref.alloc_size = 1u << 20;
	ref.offset = 4096;
	ref.pci_bus_id = "0000:01:00.0";
	seg.length = cuda ? 4096 : 8;
	seg.loc_case = cuda ? TPW__V1__SEGMENT__LOC_CUDA : TPW__V1__SEGMENT__LOC_INLINE_OFF;
	if (cuda)
		seg.cuda = &ref;
	dev.type = cuda ? TPW__V1__DEVICE_TYPE__DEVICE_CUDA : TPW__V1__DEVICE_TYPE__DEVICE_CPU;
	t.data = &seg;
	t.device = &dev;
	w.pipe_id = 1;
	w.write_id = write_id;
	w.metadata = (ProtobufCBinaryData){ 4, (uint8_t *)(cuda ? "evil" : "good") };
	w.n_tensors = 1;
	w.tensors = ts;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	ck_assert_int_eq(tpt_raw_send(raw, &m, cuda ? NULL : "inline!!", cuda ? 0 : 8, NULL, 0, 0),
			 0);
	ck_assert_int_eq(tpt_raw_expect(raw, TPW__V1__DAEMON_MSG__BODY_WRITE_DONE, T_MS, &rep), 0);
	ck_assert_uint_eq(rep->write_done->write_id, write_id);
	st = rep->write_done->status;
	snprintf(ret_msg, msg_len, "%s", rep->write_done->message ? rep->write_done->message : "");
	tpw_daemon_msg_free(rep);
	return st;
}

START_TEST(test_cuda_nodev_daemon_refuses_a_raw_cuda_reference)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	pid_t lis = tpt_fork(raw_listener, NULL);
	struct tpt_raw raw;
	char msg[512];

	ck_assert_int_gt(lis, 0);
	ck_assert_int_eq(tpt_sync_wait(&ready, T_MS), 0);
	ck_assert_int_eq(tpt_raw_connect(&raw, D->socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&raw, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	c.req_id = 1;
	c.pipe_id = 1;
	c.address = "nodev-raw";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	ck_assert_int_eq(tpt_raw_send(&raw, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(&raw, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep), 0);
	ck_assert_int_eq(rep->reply->status, TPW__V1__STATUS__STATUS_OK);
	tpw_daemon_msg_free(rep);

	ck_assert_int_eq(raw_write(&raw, 1, true, msg, sizeof(msg)),
			 TPW__V1__STATUS__STATUS_UNSUPPORTED);
	printf("the daemon refused a CUDA reference: %s\n", msg);
	ck_assert_msg(strcasestr(msg, "cuda"), "the refusal \"%s\" does not mention CUDA", msg);
	ck_assert_int_eq(raw_write(&raw, 2, false, msg, sizeof(msg)), TPW__V1__STATUS__STATUS_OK);
	ck_assert(tpt_wait_ok(lis, 2 * T_MS, "listener"));
	tpt_raw_close(&raw);
}
END_TEST

/* ---- tpipctl backends ----------------------------------------------------------------------- */

/* Runs tpipctl --socket S [--json] backends; returns its stdout (owned) after exit status 0. */
static char *ctl_backends(bool json)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", D->socket, json ? "--json" : "backends",
			       json ? "backends" : NULL, NULL };
	struct tpt_cmd_result res;
	char *out;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0)
		fprintf(stderr, "tpipctl backends: stdout:\n%s\nstderr:\n%s\n", res.out, res.err);
	ck_assert(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0);
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

static struct json_object *find_backend(struct json_object *o, const char *name)
{
	struct json_object *arr, *v;

	ck_assert_msg(json_object_object_get_ex(o, "backends", &arr) &&
			      json_object_is_type(arr, json_type_array),
		      "no backends array: %s", json_object_to_json_string(o));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *b = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(b, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0)
			return b;
	}
	return NULL;
}

START_TEST(test_cuda_nodev_backends_say_why_cuda_is_not_viable)
{
	static const char *const names[] = { "cuda_ipc", "cuda_basic", "cuda_gdr" };
	char *table = ctl_backends(false), *text = ctl_backends(true);
	struct json_object *o = json_tokener_parse(text), *v;

	ck_assert_msg(o, "not JSON:\n%s", text);
	printf("%s", table);
	for (size_t i = 0; i < 3; i++) {
		struct json_object *b = find_backend(o, names[i]);
		const char *why;

		/* A build without CUDA may leave them out; one with CUDA lists them all. */
		ck_assert_msg(b || !TPT_HAVE_CUDA, "%s is not listed: %s", names[i], text);
		if (!b)
			continue;
		ck_assert_msg(strstr(table, names[i]), "the table lacks %s", names[i]);
		ck_assert_msg(json_object_object_get_ex(b, "viable", &v) &&
				      json_object_is_type(v, json_type_boolean),
			      "%s: no boolean viable", names[i]);
		ck_assert_msg(!json_object_get_boolean(v), "%s is viable without a GPU", names[i]);
		ck_assert_msg(json_object_object_get_ex(b, "why", &v), "%s: no why", names[i]);
		why = json_object_get_string(v);
		ck_assert_msg(why && *why, "%s is not viable and says not why", names[i]);
		printf("%s: %s\n", names[i], why);
	}
	json_object_put(o);
	free(text);
	free(table);
}
END_TEST

static Suite *cuda_nodev_suite(void)
{
	Suite *s = suite_create("cuda_nodev");
	TCase *tc = tcase_create("cuda_nodev");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_cuda_nodev_write_is_refused_and_the_pipe_goes_on);
	tcase_add_loop_test(tc, test_cuda_nodev_read_into_cuda_is_refused_and_the_pipe_goes_on, 0,
			    2);
	tcase_add_test(tc, test_cuda_nodev_daemon_refuses_a_raw_cuda_reference);
	tcase_add_test(tc, test_cuda_nodev_backends_say_why_cuda_is_not_viable);
	tcase_set_timeout(tc, 90);
	suite_add_tcase(s, tc);
	return s;
}

#if TPT_HAVE_CUDA
/* In a child (this process must stay free of CUDA state for its forks): does CUDA work? */
static int probe_child(void *arg)
{
	char why[256];
	const struct tpcuda_api *api = tpcuda_api(why, sizeof(why));

	if (api)
		printf("SKIP: %d CUDA device(s) work here: the hw suite covers CUDA tensors\n",
		       api->n_devices);
	else
		printf("no usable CUDA driver here (%s): testing the refusals\n", why);
	return api ? 0 : 1;
}
#endif

int main(void)
{
#if TPT_HAVE_CUDA
	pid_t pid = tpt_fork(probe_child, NULL);
	int status = 0;

	if (pid < 0 || tpt_wait(pid, TPT_SCALED_MS(60000), &status) < 0) {
		fprintf(stderr, "cannot probe the CUDA driver\n");
		return EXIT_FAILURE;
	}
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 77;
#else
	printf("built without CUDA: testing the refusals\n");
#endif
	return tpt_run_suite(cuda_nodev_suite());
}
