/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: a shared buffer the daemon maps must be sealed against shrinking for as long
 * as it is mapped. A client (uid 65534, raw protocol) registers memfds of 1 MiB and, right
 * after sending each BufferRegister, truncates its memfd to 0 bytes and only then seals it
 * F_SEAL_SHRINK. If the daemon looked at the size before it looked at the seals, one of these
 * registrations is accepted for a file that is by then empty: the daemon holds 1 MiB mapped
 * beyond the end of the file. The client then writes a message from that buffer on a pipe to
 * itself and reads it into a good buffer of its own: the daemon's copy touches the pages past
 * the end (SIGBUS). The daemon must refuse every such registration and stay up. Needs root (to act as another uid); prints why it skips otherwise.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS TPT_SCALED_MS(20000)
#define NOBODY 65534
#define SIZE (1u << 20) /* above the eager size: the Read has the daemon copy it */
#define TRIES 40000
#define RACE_MS 60000

static struct tpt_daemon dmn;


static void spin_ns(uint64_t ns)
{
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	do
		clock_gettime(CLOCK_MONOTONIC, &b);
	while ((uint64_t)(b.tv_sec - a.tv_sec) * 1000000000ull + (uint64_t)(b.tv_nsec - a.tv_nsec) <
	       ns);
}

/* Sends @m with @fd (or none). */
static int send_msg(struct tpt_raw *r, Tpw__V1__ClientMsg *m, int fd)
{
	return tpt_raw_send(r, m, NULL, 0, fd >= 0 ? &fd : NULL, fd >= 0 ? 1 : 0, fd >= 0 ? 1 : 0);
}

static void seg_shm(Tpw__V1__Segment *s, Tpw__V1__ShmRef *ref, uint64_t buf_id)
{
	tpw__v1__segment__init(s);
	tpw__v1__shm_ref__init(ref);
	ref->buf_id = buf_id;
	ref->gen = 1;
	s->length = SIZE;
	s->loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s->shm = ref;
}

/* Has the daemon copy out of buffer @bad: a pipe to itself, a Write from @bad, a Read into a
 * good buffer. Return: 0 once sent and the daemon answered or went away. */
static int touch(struct tpt_raw *r, uint64_t bad)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;
	Tpw__V1__Payload pl = TPW__V1__PAYLOAD__INIT, *pls[1] = { &pl };
	Tpw__V1__Segment src, dst, *dsts[1] = { &dst };
	Tpw__V1__ShmRef rs, rdst;
	uint64_t accepted = 0, msg = 0, end = tpt_now_ms() + T_MS;
	int fd = memfd_create("good", MFD_CLOEXEC | MFD_ALLOW_SEALING), e;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, SIZE) == 0 &&
			    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1, "good memfd");
	br.req_id = 1000001;
	br.buf_id = 1000001;
	br.gen = 1;
	br.size = SIZE;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &br;
	TPT_REQUIRE(send_msg(r, &m, fd) == 0, 1, "register the good buffer");
	close(fd);
	l.req_id = 1000002;
	l.name = "bufseal";
	l.access = TPW__V1__ACCESS__ACCESS_ANYONE;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	TPT_REQUIRE(send_msg(r, &m, -1) == 0, 1, "listen");
	c.req_id = 1000003;
	c.pipe_id = 1;
	c.address = "bufseal";
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	TPT_REQUIRE(send_msg(r, &m, -1) == 0, 1, "connect");
	seg_shm(&src, &rs, bad);
	pl.data = &src;
	w.pipe_id = 1;
	w.write_id = 1;
	w.n_payloads = 1;
	w.payloads = pls;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	TPT_REQUIRE(send_msg(r, &m, -1) == 0, 1, "write");
	while (!msg || !accepted) {
		Tpw__V1__DaemonMsg *d = NULL;

		e = tpt_raw_recv(r, T_MS, &d, NULL, NULL);
		if (e == -ECONNRESET)
			return 0;
		TPT_REQUIRE(e == 0 && tpt_now_ms() < end, 1, "no descriptor: %d", e);
		if (d->body_case == TPW__V1__DAEMON_MSG__BODY_ACCEPTED)
			accepted = d->accepted->pipe_id;
		else if (d->body_case == TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR)
			msg = d->descriptor->msg_id;
		else if (d->body_case == TPW__V1__DAEMON_MSG__BODY_REPLY &&
			 d->reply->status != TPW__V1__STATUS__STATUS_OK)
			tpt_log("request %llu refused: %s", (unsigned long long)d->reply->req_id,
				d->reply->message);
		tpw_daemon_msg_free(d);
	}
	seg_shm(&dst, &rdst, 1000001);
	rd.pipe_id = accepted;
	rd.msg_id = msg;
	rd.n_payloads = 1;
	rd.payloads = dsts;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	TPT_REQUIRE(send_msg(r, &m, -1) == 0, 1, "read");
	for (;;) {
		Tpw__V1__DaemonMsg *d = NULL;

		e = tpt_raw_recv(r, T_MS, &d, NULL, NULL);
		if (e < 0) {
			tpt_log("the daemon went away after the read (%d)", e);
			return 0;
		}
		if (d->body_case == TPW__V1__DAEMON_MSG__BODY_READ_DONE) {
			tpt_log("read done: %d %s", d->read_done->status, d->read_done->message);
			tpw_daemon_msg_free(d);
			return 0;
		}
		tpw_daemon_msg_free(d);
	}
}

/* Registers memfds that shrink and seal right behind the frame. Exit: 0 when every one was
 * refused, 1 when one was accepted while empty (or on a set-up failure). */
static int racer(void *arg)
{
	struct tpt_raw r;
	uint64_t delay = 2000, end;
	unsigned early = 0, late = 0;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(NOBODY) == 0, 1, "drop to nobody");
	TPT_REQUIRE(tpt_raw_connect(&r, dmn.socket) == 0, 1, "connect");
	TPT_REQUIRE(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS) == 0, 1, "hello");
	end = tpt_now_ms() + RACE_MS;
	for (unsigned i = 1; i <= TRIES && tpt_now_ms() < end; i++) {
		Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
		Tpw__V1__BufferRegister br = TPW__V1__BUFFER_REGISTER__INIT;
		Tpw__V1__DaemonMsg *rep = NULL;
		int fd = memfd_create("bufseal", MFD_CLOEXEC | MFD_ALLOW_SEALING), st;
		struct stat sb;

		TPT_REQUIRE(fd >= 0 && ftruncate(fd, SIZE) == 0, 1, "memfd");
		br.req_id = i;
		br.buf_id = i;
		br.gen = 1;
		br.size = SIZE;
		m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
		m.buffer_register = &br;
		TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, &fd, 1, 1) == 0, 1, "send");
		spin_ns(delay + (uint64_t)(rand() % 400));
		TPT_REQUIRE(ftruncate(fd, 0) == 0 && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0, 1,
			    "shrink and seal: %s", strerror(errno));
		TPT_REQUIRE(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_REPLY, T_MS, &rep) == 0, 1,
			    "reply %u", i);
		st = rep->reply->status;
		if (st == TPW__V1__STATUS__STATUS_OK) {
			fstat(fd, &sb);
			tpt_log("try %u (delay %llu ns, %u early, %u late): buffer of %u bytes "
				"registered for a file of %lld bytes", i, (unsigned long long)delay,
				early, late, SIZE, (long long)sb.st_size);
			tpw_daemon_msg_free(rep);
			close(fd);
			touch(&r, i);
			return 1;
		}
		/* refused: the size was seen after the shrink (early) or no seal yet (late) */
		if (strstr(rep->reply->message, "sealed")) {
			late++;
			delay = delay > 100 ? delay - 100 : 0;
		} else {
			early++;
			delay += 100;
		}
		tpw_daemon_msg_free(rep);
		close(fd);
	}
	tpt_log("every registration refused (%u early, %u late, last delay %llu ns)", early, late,
		(unsigned long long)delay);
	return 0;
}

START_TEST(test_buffer_shrunk_before_its_seal_is_refused)
{
	pid_t p;

	if (geteuid() != 0) {
		printf("bufseal: not root, cannot act as uid %d: skipped\n", NOBODY);
		return;
	}
	ck_assert_int_eq(tpt_daemon_start(&dmn, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&dmn), 0);
	p = tpt_fork(racer, NULL);
	bool ok = tpt_wait_ok(p, RACE_MS + 2 * T_MS, "racer");

	if (!tpt_daemon_alive(&dmn)) {
		siginfo_t si = { 0 };

		waitid(P_PID, dmn.pid, &si, WEXITED | WNOHANG | WNOWAIT);
		ck_abort_msg("tpipd died (code %d, status/signal %d)", si.si_code, si.si_status);
	}
	ck_assert_msg(ok, "a buffer was registered for a file shrunk below its size");
	ck_assert_int_eq(tpt_daemon_stop(&dmn), 0);
}
END_TEST

static Suite *bufseal_suite(void)
{
	Suite *s = suite_create("sec_bufseal");
	TCase *tc = tcase_create("bufseal");

	tcase_set_timeout(tc, 200);
	tcase_add_test(tc, test_buffer_shrunk_before_its_seal_is_refused);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(bufseal_suite());
}
