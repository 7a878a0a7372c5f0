/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The pipe ring security suites' attacker and victim helpers (pring_raw.h): the raw client's
 * attach, pipe, Write and Read, the ring fd it takes off the socket, the uid change of a forked
 * child and the victim's friendly pipe. Not here: the attacks, the cases.
 */
#include <errno.h>
#include <grp.h>
#include <poll.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include "pring_raw.h"

#define T_MS TPT_PRING_MS

static uint64_t probe_word = 0x5eed5eed5eedull;

int tpt_pring_become(uid_t id)
{
	if (setgroups(0, NULL) < 0 || setresgid(id, id, id) < 0 || setresuid(id, id, id) < 0)
		return -errno;
	return prctl(PR_SET_DUMPABLE, 1) < 0 ? -errno : 0; /* CMA to us, as before the change */
}

int tpt_pring_raw_send(struct tpt_pring_raw *a, Tpw__V1__ClientMsg *m)
{
	return tpt_raw_ring_send(&a->r, &a->g, m, NULL, 0, NULL, 0, 0, T_MS);
}

int tpt_pring_raw_attach(struct tpt_pring_raw *a, const char *socket, const char *name)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	int e;

	TPT_REQUIRE(tpt_raw_connect(&a->r, socket) == 0, -1, "connect");
	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "attacker";
	h.cma_probe_addr = (uint64_t)(uintptr_t)&probe_word;
	h.cma_probe_value = probe_word;
	h.pipe_ring = true;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	TPT_REQUIRE(tpt_raw_send(&a->r, &m, NULL, 0, NULL, 0, 0) == 0, -1, "hello");
	TPT_REQUIRE(tpt_raw_recv(&a->r, T_MS, &rep, NULL, NULL) == 0 &&
			    rep->body_case == TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY &&
			    rep->hello_reply->cma_ok, -1, "hello reply with CMA");
	tpw_daemon_msg_free(rep);
	TPT_REQUIRE(tpt_raw_ring_new(&a->g, 1u << 16) == 0, -1, "ring");
	e = tpt_raw_ring_setup(&a->r, 1, 1u << 16, a->g.fd, T_MS, &rep);
	TPT_REQUIRE(e == 0 && rep->reply->status == TPW__V1__STATUS__STATUS_OK, -1, "ring setup");
	tpw_daemon_msg_free(rep);
	c.req_id = 2;
	c.pipe_id = 1;
	c.address = (char *)name;
	m = (Tpw__V1__ClientMsg)TPW__V1__CLIENT_MSG__INIT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	TPT_REQUIRE(tpt_pring_raw_send(a, &m) == 0, -1, "send connect");
	TPT_REQUIRE(tpt_raw_ring_expect(&a->r, &a->g, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS,
					&rep) == 0 &&
			    rep->reply->status == TPW__V1__STATUS__STATUS_OK, -1, "connected");
	tpw_daemon_msg_free(rep);
	return 0;
}

int tpt_pring_raw_take_fd(struct tpt_pring_raw *a)
{
	return tpt_raw_take_fd(&a->r, T_MS);
}

int tpt_pring_raw_write(struct tpt_pring_raw *a, uint64_t id, void *addr, size_t len, bool ring)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT, *pls[1] = { &pl };
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT;

	seg.length = len;
	seg.loc_case = ring ? TPW__V1__SEGMENT__LOC_RING_ADDR : TPW__V1__SEGMENT__LOC_CMA_ADDR;
	if (ring)
		seg.ring_addr = (uint64_t)(uintptr_t)addr;
	else
		seg.cma_addr = (uint64_t)(uintptr_t)addr;
	pl.data = &seg;
	w.pipe_id = 1;
	w.write_id = id;
	w.n_payloads = 1;
	w.payloads = pls;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	return tpt_pring_raw_send(a, &m);
}

int tpt_pring_raw_read(struct tpt_pring_raw *a, uint64_t msg_id, void *addr, size_t len)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Segment seg = TPW__V1__SEGMENT__INIT, *segs[1] = { &seg };

	seg.length = len;
	seg.loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	seg.cma_addr = (uint64_t)(uintptr_t)addr;
	rd.pipe_id = 1;
	rd.msg_id = msg_id;
	rd.n_payloads = 1;
	rd.payloads = segs;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	return tpt_pring_raw_send(a, &m);
}

int tpt_pring_friendly_message(struct tpt_daemon *dmn, struct tp_context *cv, struct tp_listener *l,
			       const char *name, int timeout_ms)
{
	struct tp_context *cf;
	struct tp_pipe *pf, *pv;
	struct tpt_msg msg;
	struct tpt_msg_spec spec = { .pipe = 3, .n_tensors = 1, .lens = { (1u << 20) + 7 } };
	struct tpt_done done;
	struct tpt_done_arg arg = { &done, 0 };
	int r = tpt_ctx_new(dmn, 0, "friend", &cf);

	TPT_REQUIRE(r == 0, 1, "friend context");
	TPT_REQUIRE(tp_connect(cf, name, &pf) == 0, 1, "friend connect");
	TPT_REQUIRE(tp_listener_accept_sync(l, timeout_ms, &pv) == 0, 1, "accept friend");
	TPT_REQUIRE(tpt_msg_build(cf, &spec, TPT_MEM_PRIVATE, &msg) == 0, 1, "build");
	tpt_done_init(&done);
	TPT_REQUIRE(tp_pipe_write(pf, &msg.m, tpt_done_cb, &arg) == 0, 1, "friend write");
	r = tpt_msg_read_check(cv, pv, &spec, TPT_MEM_PRIVATE, timeout_ms);
	TPT_REQUIRE(r == 0, 1, "friendly message: %d", r);
	TPT_REQUIRE(tpt_done_wait(&done, 1, timeout_ms) == 0 && done.last_status == 0, 1, "write");
	tpt_msg_free(cf, &msg);
	tp_pipe_close(pf);
	tp_pipe_close(pv);
	tp_context_free(cf);
	return 0;
}
