/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * hw suite: what tpipctl shows on a machine with a GPU. `tpipctl --json backends` lists
 * cuda_ipc as viable and cuda_basic and cuda_gdr with a reason wherever they are not; the table
 * names all three. After a CUDA tensor moved between two processes on an open pipe,
 * `tpipctl pipes` names cuda_ipc among the pipe's channels (table and --json). Skips (77)
 * without a CUDA driver or device.
 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "hwtest.h"

#define LISTENER "hw-ctl"
#define LEN (1u << 20)

static const struct tpt_daemon *D = &tpt_fixture_daemon;
static struct tpt_sync ready, to_parent, release;

static struct json_object *ctl_json(const char *cmd)
{
	char *text = hwt_ctl(D, cmd, true);
	struct json_object *o;

	ck_assert_msg(text, "tpipctl --json %s failed", cmd);
	o = json_tokener_parse(text);
	ck_assert_msg(o, "not JSON:\n%s", text);
	free(text);
	return o;
}

static const char *get_str(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

/* The backend named @name in `tpipctl --json backends`, or NULL. */
static struct json_object *find_backend(struct json_object *o, const char *name)
{
	struct json_object *arr;

	ck_assert_msg(json_object_object_get_ex(o, "backends", &arr) &&
			      json_object_is_type(arr, json_type_array),
		      "no backends array in %s", json_object_to_json_string(o));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *b = json_object_array_get_idx(arr, i);
		const char *n = get_str(b, "name");

		if (n && strcmp(n, name) == 0)
			return b;
	}
	return NULL;
}

START_TEST(test_cuda_ctl_backends_show_cuda_ipc_viable)
{
	static const char *const names[] = { "cuda_ipc", "cuda_basic", "cuda_gdr" };
	struct json_object *o = ctl_json("backends"), *v;
	char *table = hwt_ctl(D, "backends", false);

	ck_assert_msg(table, "tpipctl backends failed");
	printf("%s", table);
	for (size_t i = 0; i < 3; i++) {
		struct json_object *b = find_backend(o, names[i]);
		const char *why;

		ck_assert_msg(b, "%s is not listed: %s", names[i], json_object_to_json_string(o));
		ck_assert_msg(strstr(table, names[i]), "the table lacks %s", names[i]);
		ck_assert_msg(json_object_object_get_ex(b, "viable", &v) &&
				      json_object_is_type(v, json_type_boolean),
			      "%s: no boolean viable", names[i]);
		why = get_str(b, "why");
		if (i == 0)
			ck_assert_msg(json_object_get_boolean(v), "cuda_ipc is not viable: %s",
				      why ? why : "(no reason)");
		else if (!json_object_get_boolean(v))
			ck_assert_msg(why && *why, "%s is not viable and says not why", names[i]);
	}
	json_object_put(o);
	free(table);
}
END_TEST

/* ---- channels of a pipe that moved a CUDA tensor -------------------------------------------- */

static int ctl_writer(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "ctl-writer", .where = LISTENER,
			     .ready = &ready, .timeout_ms = HWT_T_MS };
	struct tp_tensor t = { .device = { TP_DEVICE_CUDA, 0 }, .length = LEN };
	struct tp_message m = { .tensors = &t, .n_tensors = 1 };
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_connect(&e) == 0, 1, "connect");
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	TPT_REQUIRE(hwt_dev_set(&cu, p, 0x42, LEN) == 0, 1, "memset");
	t.data = hwt_ptr(p);
	r = tp_pipe_write_sync(e.p, &m);
	TPT_REQUIRE(r == 0, 1, "write: %d %s", r, tp_last_error());
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, HWT_T_MS);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

static int ctl_reader(void *arg)
{
	struct tpt_end e = { .d = D, .ctx_name = "ctl-reader", .where = LISTENER,
			     .ready = &ready, .timeout_ms = HWT_T_MS };
	struct tp_slot slot = { .device = { TP_DEVICE_CUDA, 0 } };
	struct tp_allocation a = { .tensors = &slot, .n_tensors = 1 };
	struct tp_descriptor *d;
	struct hwt_cuda cu;
	CUdeviceptr p;
	int r;

	TPT_REQUIRE(hwt_cuda_open(0, &cu) == 0, 1, "CUDA");
	TPT_REQUIRE(tpt_end_listen(&e, true) == 0, 1, "listen");
	r = tp_pipe_read_descriptor_sync(e.p, HWT_T_MS, &d);
	TPT_REQUIRE(r == 0, 1, "descriptor: %d %s", r, tp_last_error());
	HWT_CU(&cu, cuMemAlloc(&p, LEN), 1);
	slot.data = hwt_ptr(p);
	r = tp_pipe_read_sync(e.p, d, &a);
	TPT_REQUIRE(r == 0, 1, "read: %d %s", r, tp_last_error());
	TPT_REQUIRE(hwt_dev_expect_byte(&cu, p, 0x42, LEN, "slot") == 0, 1, "contents");
	tpt_sync_post(&to_parent, 0);
	tpt_sync_wait(&release, HWT_T_MS);
	tpt_end_close(&e);
	hwt_cuda_close(&cu);
	return 0;
}

START_TEST(test_cuda_ctl_pipes_name_cuda_ipc)
{
	pid_t rd = tpt_fork(ctl_reader, NULL), wr = tpt_fork(ctl_writer, NULL);
	struct json_object *o, *arr, *chans, *pipe = NULL;
	bool cuda_ipc = false;
	char *table;

	ck_assert_int_gt(rd, 0);
	ck_assert_int_gt(wr, 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, HWT_T_MS), 0);
	ck_assert_int_eq(tpt_sync_wait(&to_parent, HWT_T_MS), 0);
	table = hwt_ctl(D, "pipes", false);
	o = ctl_json("pipes");
	ck_assert_msg(table, "tpipctl pipes failed");
	printf("%s", table);
	ck_assert(json_object_object_get_ex(o, "pipes", &arr));
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *p = json_object_array_get_idx(arr, i);
		const char *l = get_str(p, "listener");

		if (l && strcmp(l, LISTENER) == 0)
			pipe = p;
	}
	ck_assert_msg(pipe, "the pipe is not listed: %s", json_object_to_json_string(o));
	ck_assert_msg(json_object_object_get_ex(pipe, "channels", &chans) &&
			      json_object_is_type(chans, json_type_array),
		      "the pipe's channels are not an array: %s", json_object_to_json_string(o));
	for (size_t i = 0; i < json_object_array_length(chans); i++) {
		const char *n = json_object_get_string(json_object_array_get_idx(chans, i));

		cuda_ipc |= n && strncmp(n, "cuda_ipc", 8) == 0;
	}
	ck_assert_msg(cuda_ipc, "channels %s lack cuda_ipc", json_object_to_json_string(chans));
	ck_assert_msg(strstr(table, "cuda_ipc"), "the pipes table lacks cuda_ipc");
	json_object_put(o);
	free(table);
	tpt_sync_post(&release, 0);
	tpt_sync_post(&release, 0);
	ck_assert(tpt_wait_ok(wr, HWT_T_MS, "writer"));
	ck_assert(tpt_wait_ok(rd, HWT_T_MS, "reader"));
}
END_TEST

static void setup(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_sync_init(&ready), 0);
	ck_assert_int_eq(tpt_sync_init(&to_parent), 0);
	ck_assert_int_eq(tpt_sync_init(&release), 0);
}

static void teardown(void)
{
	tpt_sync_done(&ready);
	tpt_sync_done(&to_parent);
	tpt_sync_done(&release);
	tpt_fixture_stop();
}

static Suite *cuda_ctl_suite(void)
{
	Suite *s = suite_create("cuda_ctl");
	TCase *tc = tcase_create("cuda_ctl");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_cuda_ctl_backends_show_cuda_ipc_viable);
	tcase_add_test(tc, test_cuda_ctl_pipes_name_cuda_ipc);
	tcase_set_timeout(tc, 120);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return hwt_main(cuda_ctl_suite(), 1);
}
