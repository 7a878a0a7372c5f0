/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer-link views for the cross-host suites. See ipeer.h.
 */
#include <check.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include "ipeer.h"
#include "itest.h"

#define CTL_MS 30000

/* Runs tpipctl --socket S [--json] CMD (exit 0 expected); returns owned stdout. */
char *tpt_ctl(const struct tpt_daemon *d, const char *cmd, bool json)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[6] = { bin, "--socket", d->socket, cmd, NULL, NULL };
	struct tpt_cmd_result res;
	char *out;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	if (json) {
		argv[3] = "--json";
		argv[4] = cmd;
	}
	ck_assert_int_eq(tpt_run(argv, TPT_SCALED_MS(CTL_MS), &res), 0);
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0)
		fprintf(stderr, "tpipctl %s: stdout:\n%s\nstderr:\n%s\n", cmd, res.out, res.err);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0,
		      "tpipctl %s failed", cmd);
	out = res.out;
	res.out = NULL;
	tpt_cmd_result_free(&res);
	return out;
}

char *tpt_ctl_peers(const struct tpt_daemon *d, bool json)
{
	return tpt_ctl(d, "peers", json);
}

static void json_copy_str(struct json_object *o, const char *key, char *buf, size_t len)
{
	struct json_object *v;

	buf[0] = '\0';
	if (json_object_object_get_ex(o, key, &v))
		snprintf(buf, len, "%s", json_object_get_string(v));
}

static int64_t json_int(struct json_object *o, const char *key)
{
	struct json_object *v;

	return json_object_object_get_ex(o, key, &v) ? json_object_get_int64(v) : -1;
}

/* Reads `tpipctl --json peers` of @d. Return: the number of links; the first in @ret. */
int tpt_peer_links(const struct tpt_daemon *d, struct tpt_link *ret)
{
	char *out = tpt_ctl_peers(d, true);
	struct json_object *root = json_tokener_parse(out), *arr, *o, *v;
	int n;

	ck_assert_msg(root, "tpipctl --json peers is not JSON: %s", out);
	ck_assert_msg(json_object_object_get_ex(root, "peers", &arr) &&
			      json_object_is_type(arr, json_type_array),
		      "no peers array: %s", out);
	n = (int)json_object_array_length(arr);
	memset(ret, 0, sizeof(*ret));
	if (n > 0) {
		o = json_object_array_get_idx(arr, 0);
		json_copy_str(o, "state", ret->state, sizeof(ret->state));
		json_copy_str(o, "address", ret->address, sizeof(ret->address));
		json_copy_str(o, "last_error", ret->last_error, sizeof(ret->last_error));
		json_copy_str(o, "rdma", ret->rdma, sizeof(ret->rdma));
		ret->outgoing = json_object_object_get_ex(o, "outgoing", &v) &&
				json_object_get_boolean(v);
		ret->authenticated = json_object_object_get_ex(o, "authenticated", &v) &&
				     json_object_get_boolean(v);
		ret->data_conns = (long)json_int(o, "data_conns");
		ret->pipes = (long)json_int(o, "pipes");
		ret->bytes_sent = (uint64_t)json_int(o, "bytes_sent");
		ret->bytes_received = (uint64_t)json_int(o, "bytes_received");
		ret->rdma_bytes_sent = (uint64_t)json_int(o, "rdma_bytes_sent");
		ret->rdma_bytes_received = (uint64_t)json_int(o, "rdma_bytes_received");
	}
	if (getenv("TPT_DAEMON_LOG"))
		fprintf(stderr, "%s peers: %s\n", d->socket, out);
	json_object_put(root);
	free(out);
	return n;
}

uint64_t tpt_channel_bytes(const struct tpt_daemon *d, const char *name)
{
	char *out = tpt_ctl(d, "stats", true);
	struct json_object *o = json_tokener_parse(out), *arr, *v;
	uint64_t bytes = 0;

	ck_assert_msg(o && json_object_object_get_ex(o, "channels", &arr),
		      "tpipctl --json stats: %s", out);
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *c = json_object_array_get_idx(arr, i);

		if (json_object_object_get_ex(c, "name", &v) &&
		    strcmp(json_object_get_string(v), name) == 0 &&
		    json_object_object_get_ex(c, "bytes", &v))
			bytes = (uint64_t)json_object_get_int64(v);
	}
	json_object_put(o);
	free(out);
	return bytes;
}

void tpt_status_u64s(const struct tpt_daemon *d, const char *const *keys, size_t n,
		     uint64_t *ret)
{
	char *out = tpt_ctl(d, "status", true);
	struct json_object *o = json_tokener_parse(out), *v;

	ck_assert_msg(o, "tpipctl --json status is not JSON: %s", out);
	for (size_t i = 0; i < n; i++) {
		ck_assert_msg(json_object_object_get_ex(o, keys[i], &v),
			      "tpipctl --json status lacks %s: %s", keys[i], out);
		ret[i] = (uint64_t)json_object_get_int64(v);
	}
	json_object_put(o);
	free(out);
}

bool tpt_peer_links_gone(const struct tpt_daemon *d, int timeout_ms)
{
	uint64_t deadline = tpt_now_ms() + (uint64_t)timeout_ms;
	struct tpt_link l;

	for (unsigned round = 0;; round++) {
		if (tpt_peer_links(d, &l) == 0)
			return true;
		if (tpt_now_ms() >= deadline) {
			tpt_log("%s still has a peer link: state %s, %ld pipes, last error '%s'",
				d->socket, l.state, l.pipes, l.last_error);
			return false;
		}
		tpt_backoff(round + 4);
	}
}

static unsigned probe_pipe;

static void probe_spec(unsigned index, struct tpt_msg_spec *s)
{
	s->pipe = probe_pipe;
	s->index = index;
	s->n_payloads = 1;
	s->n_tensors = 1;
	s->lens[0] = 100;
	s->lens[1] = (1u << 20) + index;
}

bool tpt_peer_cross_works(const struct tpt_daemon *from, const struct tpt_daemon *to,
			  const char *name, unsigned pipe, int timeout_ms)
{
	char addr[128];
	struct tpt_xfer x = {
		.d = to,
		.writer_d = from,
		.name = name,
		.address = tpt_peer_address(to, name, addr, sizeof(addr)),
		.n_msgs = 2,
		.spec = probe_spec,
		.writer_mem = TPT_MEM_PRIVATE,
		.reader_mem = TPT_MEM_SHM,
		.timeout_ms = timeout_ms,
	};

	probe_pipe = pipe;
	return tpt_xfer_run(&x);
}

bool tpt_ctl_lists(const struct tpt_daemon *d, const char *what, const char *name,
		   const char *field)
{
	char *out = tpt_ctl(d, what, true), want[300], *row, *end;
	bool ok;

	snprintf(want, sizeof(want), "\"name\": \"%s\"", name);
	row = strstr(out, want);
	end = row ? strstr(row, "}") : NULL;
	ok = row && (!field || (strstr(row, field) && (!end || strstr(row, field) < end)));
	free(out);
	return ok;
}

const char *tpt_peer_at(const struct tpt_daemon *d, const char *name)
{
	static char buf[4][256];
	static unsigned k;

	return tpt_peer_address(d, name, buf[k++ % 4], sizeof(buf[0]));
}
