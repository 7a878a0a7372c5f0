/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: cross-memory attach follows the process that attached, and the daemon touches
 * it only as that process's own user. An attacker (uid 65534) attaches with CMA, forks a child
 * that keeps the session's socket, and then the attached process is replaced: (a) it exits and
 * a process of another user (uid 4242) is made to own its pid (clone3 with set_tid, or
 * ns_last_pid); (b) it execs a setuid-root binary. The child then asks the daemon to write into
 * and read from memory of that new occupant at an address valid there, with raw frames: both
 * transfers must fail, the reader must get none of the occupant's bytes and the occupant's
 * memory must be unchanged. (c) Processes of two different users still exchange private memory
 * correctly through CMA, as do processes of one user, and `tpipctl stats` counts it as cma;
 * with pipe rings on (the default) the large message goes through the ring instead. (a) to (e)
 * run a daemon with pipe rings off, so that the private memory goes by CMA.
 * (d) A client that drops to another uid after attaching: the transfer in flight fails, the
 * daemon says so (cma_off), and the library stages the next ones, which arrive intact.
 * (e) While a client's memory is copied, that client's user cannot signal any daemon thread
 * (the accesses run in a short-lived child task, not on the daemon's threads).
 * Needs root (to take the other uids); prints why it skips otherwise.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <json-c/json.h>
#include <limits.h>
#include <linux/sched.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define T_MS 20000
#define NOBODY 65534
#define VICTIM 4242
#define LEN 4096 /* = CMA_SUID_BYTES */
#define N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* The victim's bytes: at the same address in every process forked from this one. */
static uint8_t victim_buf[LEN] __attribute__((aligned(4096)));

static uint8_t pattern(size_t i)
{
	return (uint8_t)(0xc3 ^ (i * 13)); /* as cma_suid.c */
}

static bool skip_unless_root(void)
{
	if (geteuid() == 0)
		return false;
	printf("cma: not root, cannot act as uids %d and %d: skipped\n", NOBODY, VICTIM);
	return true;
}

/* The CMA path: a daemon with pipe rings off (they are on by default and would carry the large
 * private->private messages instead). */
static void setup(void)
{
	static const char *const args[] = { "--pipe-ring", "no", NULL };

	ck_assert_int_eq(tpt_daemon_start(&tpt_fixture_daemon, args), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
}

/* The default daemon: pipe rings on. */
static void setup_ring(void)
{
	tpt_fixture_start();
	ck_assert_int_eq(tpt_daemon_open_to_all(&tpt_fixture_daemon), 0);
}

static void teardown(void)
{
	tpt_fixture_stop();
}

/* Waits up to @ms for @fd to be readable, then reads exactly @len bytes. Return: 0 or -errno. */
static int read_full(int fd, void *buf, size_t len, int ms)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	size_t got = 0;

	while (got < len) {
		ssize_t n;
		if (poll(&p, 1, ms) != 1)
			return -ETIMEDOUT;
		n = read(fd, (char *)buf + got, len - got);
		if (n <= 0)
			return n < 0 ? -errno : -EPIPE;
		got += (size_t)n;
	}
	return 0;
}

/* ---- a raw attacker session ------------------------------------------------------------- */

static volatile uint64_t probe_word = 0x70726f6265636d61ull;

/* Hello as a client offering the CMA probe. Return: 1 cma_ok, 0 not, or -errno. */
static int hello_cma(struct tpt_raw *r)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Hello h = TPW__V1__HELLO__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	int e;

	h.major = TPW_PROTO_MAJOR;
	h.minor = TPW_PROTO_MINOR;
	h.role = TPW__V1__ROLE__ROLE_CLIENT;
	h.name = "attacker";
	h.cma_probe_addr = (uint64_t)(uintptr_t)&probe_word;
	h.cma_probe_value = probe_word;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_HELLO;
	m.hello = &h;
	e = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	if (e == 0)
		e = tpt_raw_recv(r, T_MS, &rep, NULL, NULL);
	if (e < 0)
		return e;
	if (rep->body_case != TPW__V1__DAEMON_MSG__BODY_HELLO_REPLY ||
	    rep->hello_reply->status != TPW__V1__STATUS__STATUS_OK)
		e = -EPROTO;
	else
		e = rep->hello_reply->cma_ok ? 1 : 0;
	tpw_daemon_msg_free(rep);
	return e;
}

/* What the session has heard so far. */
struct heard {
	int reply[8];	     /* by req_id: 0 none, 1 OK, -1 error */
	uint64_t accepted;   /* the accepted end's pipe id */
	uint64_t desc[3];    /* by write number: msg_id of its Descriptor */
	int write_done[3];   /* by write_id: 0 none, 1 OK, -1 error */
	int read_done[3];    /* by msg_id */
	char why[3][256];    /* the reader's error by msg_id */
	uint64_t n_desc;
};

/* Receives one frame into @h. Return: 0 or -errno. */
static int hear(struct tpt_raw *r, struct heard *h)
{
	Tpw__V1__DaemonMsg *m = NULL;
	int e = tpt_raw_recv(r, T_MS, &m, NULL, NULL);

	if (e < 0)
		return e;
	switch (m->body_case) {
	case TPW__V1__DAEMON_MSG__BODY_REPLY:
		if (m->reply->req_id < 8)
			h->reply[m->reply->req_id] =
			    m->reply->status == TPW__V1__STATUS__STATUS_OK ? 1 : -1;
		if (m->reply->status != TPW__V1__STATUS__STATUS_OK)
			tpt_log("attacker: request %llu refused: %s",
				(unsigned long long)m->reply->req_id, m->reply->message);
		break;
	case TPW__V1__DAEMON_MSG__BODY_ACCEPTED:
		h->accepted = m->accepted->pipe_id;
		break;
	case TPW__V1__DAEMON_MSG__BODY_DESCRIPTOR:
		if (h->n_desc < 2)
			h->desc[++h->n_desc] = m->descriptor->msg_id;
		break;
	case TPW__V1__DAEMON_MSG__BODY_WRITE_DONE:
		if (m->write_done->write_id < 3)
			h->write_done[m->write_done->write_id] =
			    m->write_done->status == TPW__V1__STATUS__STATUS_OK ? 1 : -1;
		break;
	case TPW__V1__DAEMON_MSG__BODY_READ_DONE:
		if (m->read_done->msg_id < 3) {
			h->read_done[m->read_done->msg_id] =
			    m->read_done->status == TPW__V1__STATUS__STATUS_OK ? 1 : -1;
			snprintf(h->why[m->read_done->msg_id], sizeof(h->why[0]), "%s",
				 m->read_done->message ? m->read_done->message : "");
		}
		break;
	default:
		break;
	}
	tpw_daemon_msg_free(m);
	return 0;
}

static int send_body(struct tpt_raw *r, Tpw__V1__ClientMsg *m, const int *fds, unsigned nfds)
{
	return tpt_raw_send(r, m, NULL, 0, fds, nfds, (uint16_t)nfds);
}

/* One segment of @len bytes at @addr in this process (cma) or at @off of shared buffer 1. */
static void seg_cma(Tpw__V1__Segment *s, uint64_t addr)
{
	tpw__v1__segment__init(s);
	s->length = LEN;
	s->loc_case = TPW__V1__SEGMENT__LOC_CMA_ADDR;
	s->cma_addr = addr;
}

static void seg_shm(Tpw__V1__Segment *s, Tpw__V1__ShmRef *ref, uint64_t off)
{
	tpw__v1__segment__init(s);
	tpw__v1__shm_ref__init(ref);
	ref->buf_id = 1;
	ref->gen = 1;
	ref->offset = off;
	s->length = LEN;
	s->loc_case = TPW__V1__SEGMENT__LOC_SHM;
	s->shm = ref;
}

/* Write{pipe 1, @write_id, one payload @seg}. */
static int send_write(struct tpt_raw *r, uint64_t write_id, Tpw__V1__Segment *seg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Write w = TPW__V1__WRITE__INIT;
	Tpw__V1__Payload p = TPW__V1__PAYLOAD__INIT, *pp = &p;

	p.data = seg;
	w.pipe_id = 1;
	w.write_id = write_id;
	w.n_payloads = 1;
	w.payloads = &pp;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_WRITE;
	m.write = &w;
	return send_body(r, &m, NULL, 0);
}

/* Read{the accepted end, @msg_id, one payload @seg}. */
static int send_read(struct tpt_raw *r, uint64_t pipe_id, uint64_t msg_id, Tpw__V1__Segment *seg)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Read rd = TPW__V1__READ__INIT;

	rd.pipe_id = pipe_id;
	rd.msg_id = msg_id;
	rd.n_payloads = 1;
	rd.payloads = &seg;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_READ;
	m.read = &rd;
	return send_body(r, &m, NULL, 0);
}

/*
 * Sets up a pipe from the session to itself (listener @name) and a shared buffer (memfd of 2 * LEN bytes: the
 * first half the attacker's bytes, the second half where stolen bytes would land).
 * @ret_map: returns the mapping. Return: 0 or 1 (logged).
 */
static int attack_setup(struct tpt_raw *r, const char *name, struct heard *h,
			uint8_t **ret_map)
{
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__Listen l = TPW__V1__LISTEN__INIT;
	Tpw__V1__Connect c = TPW__V1__CONNECT__INIT;
	Tpw__V1__BufferRegister b = TPW__V1__BUFFER_REGISTER__INIT;
	uint64_t deadline = tpt_now_ms() + T_MS;
	int fd = memfd_create("attacker", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	uint8_t *map;

	TPT_REQUIRE(fd >= 0 && ftruncate(fd, 2 * LEN) == 0 &&
			    fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0,
		    1, "memfd: %s", strerror(errno));
	map = mmap(NULL, 2 * LEN, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	TPT_REQUIRE(map != MAP_FAILED, 1, "mmap: %s", strerror(errno));
	memset(map, 0x41, LEN);
	memset(map + LEN, 0, LEN);
	l.req_id = 1;
	l.name = (char *)name;
	l.access = TPW__V1__ACCESS__ACCESS_ANYONE;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_LISTEN;
	m.listen = &l;
	TPT_REQUIRE(send_body(r, &m, NULL, 0) == 0, 1, "send Listen");
	c.req_id = 2;
	c.pipe_id = 1;
	c.address = (char *)name;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_CONNECT;
	m.connect = &c;
	TPT_REQUIRE(send_body(r, &m, NULL, 0) == 0, 1, "send Connect");
	b.req_id = 3;
	b.buf_id = 1;
	b.gen = 1;
	b.size = 2 * LEN;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_BUFFER_REGISTER;
	m.buffer_register = &b;
	TPT_REQUIRE(send_body(r, &m, &fd, 1) == 0, 1, "send BufferRegister");
	close(fd);
	while (!(h->reply[1] && h->reply[2] && h->reply[3] && h->accepted))
		TPT_REQUIRE(tpt_now_ms() < deadline && hear(r, h) == 0, 1, "no pipe to itself");
	TPT_REQUIRE(h->reply[1] == 1 && h->reply[2] == 1 && h->reply[3] == 1, 1, "set-up refused");
	*ret_map = map;
	return 0;
}

/*
 * Reads @addr of the process now at the pid that session @r attached from, into the shared
 * buffer (Write{cma_addr} -> Read{shm}). Return: 0 (refused, nothing stolen), 1 (logged).
 */
static int steal(struct tpt_raw *r, uint64_t addr)
{
	Tpw__V1__Segment src, dst;
	Tpw__V1__ShmRef ref;
	struct heard h = { 0 };
	uint64_t deadline = tpt_now_ms() + T_MS;
	uint8_t *map;
	size_t same = 0;
	int bad = 0;

	if (attack_setup(r, "steal", &h, &map) != 0)
		return 1;
	seg_cma(&src, addr);
	TPT_REQUIRE(send_write(r, 1, &src) == 0, 1, "send Write");
	while (!h.write_done[1] && !h.desc[1])
		TPT_REQUIRE(tpt_now_ms() < deadline && hear(r, &h) == 0, 1, "no answer to Write");
	if (h.desc[1]) { /* taken, to be copied at the Read */
		seg_shm(&dst, &ref, LEN);
		TPT_REQUIRE(send_read(r, h.accepted, h.desc[1], &dst) == 0, 1, "send Read");
		while (!h.read_done[1] || !h.write_done[1])
			TPT_REQUIRE(tpt_now_ms() < deadline && hear(r, &h) == 0, 1, "no ReadDone");
		if (h.read_done[1] != -1) {
			tpt_log("steal: the daemon read the process now at the attached pid");
			bad = 1;
		} else {
			tpt_log("steal: refused: %s", h.why[1]);
		}
	}
	if (h.write_done[1] != -1) {
		tpt_log("steal: the write from another process's memory succeeded");
		bad = 1;
	}
	for (size_t i = 0; i < LEN; i++)
		same += map[LEN + i] == pattern(i);
	if (same >= LEN / 8) {
		tpt_log("steal: %zu of %d bytes of the other process reached the attacker", same,
			LEN);
		bad = 1;
	}
	munmap(map, 2 * LEN);
	return bad;
}

/*
 * Writes the attacker's bytes to @addr of the process now at the pid that session @r attached
 * from (shared buffer -> Read{cma_addr}). Return: 0 (refused), 1 (logged).
 */
static int scribble(struct tpt_raw *r, uint64_t addr)
{
	Tpw__V1__Segment src, dst;
	Tpw__V1__ShmRef ref;
	struct heard h = { 0 };
	uint64_t deadline = tpt_now_ms() + T_MS;
	uint8_t *map;

	if (attack_setup(r, "scribble", &h, &map) != 0)
		return 1;
	seg_shm(&src, &ref, 0);
	TPT_REQUIRE(send_write(r, 1, &src) == 0, 1, "send Write");
	while (!h.desc[1])
		TPT_REQUIRE(tpt_now_ms() < deadline && hear(r, &h) == 0, 1, "no Descriptor");
	seg_cma(&dst, addr);
	TPT_REQUIRE(send_read(r, h.accepted, h.desc[1], &dst) == 0, 1, "send Read");
	while (!h.read_done[1] || !h.write_done[1])
		TPT_REQUIRE(tpt_now_ms() < deadline && hear(r, &h) == 0, 1, "no ReadDone");
	munmap(map, 2 * LEN);
	TPT_REQUIRE(h.read_done[1] == -1 && h.write_done[1] == -1, 1,
		    "scribble: the daemon wrote into the process now at the attached pid");
	tpt_log("scribble: refused: %s", h.why[1]);
	return 0;
}

/* Both attacks, each from its own session (so each reaches the copy). Return: 0 or 1. */
static int attack(struct tpt_raw *r, uint64_t addr)
{
	int bad = steal(&r[0], addr);

	return scribble(&r[1], addr) | bad;
}

/* Attaches twice as uid 65534 with CMA (@r: two sessions). Return: 0 or 1 (logged). */
static int attach_nobody(struct tpt_raw *r)
{
	int e;

	TPT_REQUIRE(tpt_become_user(NOBODY) == 0, 1, "cannot become uid %d", NOBODY);
	for (int i = 0; i < 2; i++) {
		TPT_REQUIRE(tpt_raw_connect(&r[i], tpt_fixture_daemon.socket) == 0, 1, "connect");
		e = hello_cma(&r[i]);
		TPT_REQUIRE(e == 1, 1, "the attacker's session has no CMA to abuse (%d)", e);
	}
	return 0;
}

/* ---- (a) a recycled pid ------------------------------------------------------------------ */

struct recycle {
	int go[2];     /* parent -> attacker's child: 8 bytes, the address (0: give up) */
	int result[2]; /* attacker's child -> parent: one byte, its verdict */
	int ready[2];  /* victim -> parent: one byte once it runs as uid 4242 */
	int done[2];   /* parent -> victim: closed when it may check its bytes */
};

static int recycle_attacker(void *arg)
{
	struct recycle *x = arg;
	struct tpt_raw r[2];
	pid_t c;

	if (attach_nobody(r) != 0)
		return 1;
	c = fork();
	if (c < 0)
		return 1;
	if (c == 0) { /* keeps the session; its parent, the attached process, exits */
		uint64_t addr = 0;
		char verdict = 2;
		if (read_full(x->go[0], &addr, sizeof(addr), 4 * T_MS) == 0)
			verdict = addr ? (char)attack(r, addr) : 2;
		if (write(x->result[1], &verdict, 1) != 1)
			_exit(1);
		_exit(0);
	}
	return 0;
}

static int victim_main(struct recycle *x)
{
	char c = 0;

	close(x->done[1]);
	for (size_t i = 0; i < LEN; i++)
		victim_buf[i] = pattern(i);
	if (tpt_become_user(VICTIM) != 0)
		return 5;
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	if (write(x->ready[1], &c, 1) != 1)
		return 5;
	(void)!read(x->done[0], &c, 1); /* EOF when the parent closes it */
	for (size_t i = 0; i < LEN; i++)
		if (victim_buf[i] != pattern(i))
			return 3;
	return 0;
}

/*
 * Starts victim_main() in a child whose pid is @want: clone3() with set_tid, else a fork after
 * setting ns_last_pid, retried while other processes take the number first.
 * Return: the pid, or -errno with @why set.
 */
static pid_t spawn_at(pid_t want, struct recycle *x, char *why, size_t wl)
{
	struct clone_args ca = { .exit_signal = SIGCHLD, .set_tid = (uint64_t)(uintptr_t)&want,
				 .set_tid_size = 1 };
	pid_t pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
	int e = errno;

	if (pid == 0)
		_exit(victim_main(x)); /* only async-signal-safe calls in there */
	if (pid > 0)
		return pid;
	for (int i = 0; i < 100; i++) {
		char num[16];
		int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
		int n = snprintf(num, sizeof(num), "%d", (int)want - 1);

		if (fd < 0 || write(fd, num, (size_t)n) != n) {
			snprintf(why, wl, "clone3(set_tid) failed (%s) and ns_last_pid is not writable "
				 "(%s)", strerror(e), strerror(errno));
			if (fd >= 0)
				close(fd);
			return -EPERM;
		}
		close(fd);
		pid = fork();
		if (pid == 0)
			_exit(getpid() == want ? victim_main(x) : 99);
		if (pid == want)
			return pid;
		if (pid > 0)
			waitpid(pid, NULL, 0);
	}
	snprintf(why, wl, "pid %d kept being taken by other processes", (int)want);
	return -EAGAIN;
}

START_TEST(test_cma_pid_recycled_to_another_user_is_neither_read_nor_written)
{
	struct recycle x;
	uint64_t addr = (uint64_t)(uintptr_t)victim_buf;
	char why[160], verdict = 1, c;
	pid_t a, v;
	int st;

	if (skip_unless_root())
		return;
	ck_assert_int_eq(pipe(x.go), 0);
	ck_assert_int_eq(pipe(x.result), 0);
	ck_assert_int_eq(pipe(x.ready), 0);
	ck_assert_int_eq(pipe(x.done), 0);
	a = tpt_fork(recycle_attacker, &x);
	ck_assert_int_gt(a, 0);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker")); /* reaped: its pid is free */
	v = spawn_at(a, &x, why, sizeof(why));
	if (v < 0) {
		printf("cma: cannot give pid %d to uid %d (%s): skipped\n", (int)a, VICTIM, why);
		addr = 0;
		ck_assert_int_eq(write(x.go[1], &addr, sizeof(addr)), sizeof(addr));
		return;
	}
	ck_assert_int_eq(v, a);
	close(x.done[0]);
	ck_assert_int_eq(read_full(x.ready[0], &c, 1, T_MS), 0);
	tpt_log("pid %d now belongs to uid %d, which holds its bytes at %p", (int)v, VICTIM,
		(void *)victim_buf);
	ck_assert_int_eq(write(x.go[1], &addr, sizeof(addr)), sizeof(addr));
	ck_assert_int_eq(read_full(x.result[0], &verdict, 1, 3 * T_MS), 0);
	close(x.done[1]);
	ck_assert_int_eq(tpt_wait(v, T_MS, &st), 0);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 3,
		      "the daemon wrote into uid %d's memory", VICTIM);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "victim failed: status %#x", st);
	ck_assert_msg(verdict == 0, "attack from a recycled pid succeeded (see above)");
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
}
END_TEST

/* ---- (b) a setuid exec ------------------------------------------------------------------- */

struct suid {
	char path[PATH_MAX];
	char dir[64];
	int report[2]; /* helper -> attacker's child: the address */
	int done[2];   /* attacker's child -> helper: closed when done */
	int result[2]; /* attacker's child -> parent: the verdict */
};

static int suid_attacker(void *arg)
{
	struct suid *x = arg;
	char a1[16], a2[16];
	struct tpt_raw r[2];
	pid_t c;

	if (attach_nobody(r) != 0)
		return 1;
	c = fork();
	if (c < 0)
		return 1;
	if (c == 0) {
		uint64_t addr = 0;
		char verdict = 2;
		close(x->done[0]);
		close(x->report[1]);
		if (read_full(x->report[0], &addr, sizeof(addr), T_MS) == 0)
			verdict = addr ? (char)attack(r, addr) : 77;
		if (write(x->result[1], &verdict, 1) != 1)
			_exit(1);
		close(x->done[1]); /* the helper checks its bytes and exits */
		_exit(0);
	}
	close(x->done[1]);
	close(x->report[0]);
	snprintf(a1, sizeof(a1), "%d", x->report[1]);
	snprintf(a2, sizeof(a2), "%d", x->done[0]);
	execl(x->path, x->path, a1, a2, (char *)NULL);
	tpt_log("exec %s: %s", x->path, strerror(errno));
	return 1;
}

/* Copies the helper next to this test into a fresh directory as a setuid-root binary. Return:
 * 0, or 1 with the reason for skipping printed. */
static int suid_prepare(struct suid *x)
{
	char self[PATH_MAX], src[PATH_MAX + 16], buf[65536];
	struct statvfs vfs;
	ssize_t n;
	int in, out;

	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	ck_assert_int_gt(n, 0);
	self[n] = '\0';
	*strrchr(self, '/') = '\0';
	snprintf(src, sizeof(src), "%s/sec_cma_suid", self);
	snprintf(x->dir, sizeof(x->dir), "/tmp/tpipd-suid-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(x->dir));
	ck_assert_int_eq(chmod(x->dir, 0755), 0);
	if (statvfs(x->dir, &vfs) == 0 && (vfs.f_flag & ST_NOSUID)) {
		printf("cma: %s is mounted nosuid: setuid case skipped\n", x->dir);
		return 1;
	}
	snprintf(x->path, sizeof(x->path), "%s/cma_suid", x->dir);
	in = open(src, O_RDONLY | O_CLOEXEC);
	ck_assert_msg(in >= 0, "%s: %s", src, strerror(errno));
	out = open(x->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0700);
	ck_assert_int_ge(out, 0);
	while ((n = read(in, buf, sizeof(buf))) > 0)
		ck_assert_int_eq(write(out, buf, (size_t)n), n);
	close(in);
	close(out);
	ck_assert_int_eq(chown(x->path, 0, 0), 0);
	ck_assert_int_eq(chmod(x->path, 04755), 0);
	return 0;
}

static void suid_cleanup(struct suid *x)
{
	unlink(x->path);
	rmdir(x->dir);
}

START_TEST(test_cma_setuid_exec_is_neither_read_nor_written)
{
	struct suid x = { .path = "" };
	char verdict = 1;
	pid_t a;
	int st;

	if (skip_unless_root())
		return;
	if (suid_prepare(&x) != 0) {
		suid_cleanup(&x);
		return;
	}
	ck_assert_int_eq(pipe(x.report), 0);
	ck_assert_int_eq(pipe(x.done), 0);
	ck_assert_int_eq(pipe(x.result), 0);
	a = tpt_fork(suid_attacker, &x);
	ck_assert_int_gt(a, 0);
	close(x.report[0]);
	close(x.report[1]);
	close(x.done[0]);
	close(x.done[1]);
	ck_assert_int_eq(read_full(x.result[0], &verdict, 1, 3 * T_MS), 0);
	ck_assert_int_eq(tpt_wait(a, T_MS, &st), 0);
	suid_cleanup(&x);
	if (verdict == 77) {
		printf("cma: the helper did not run setuid root: skipped\n");
		return;
	}
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) != 3,
		      "the daemon wrote into the setuid process's memory");
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "helper failed: status %#x", st);
	ck_assert_msg(verdict == 0, "attack through a setuid exec succeeded (see above)");
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
}
END_TEST

/* ---- (c) legitimate CMA between users ---------------------------------------------------- */

struct pair {
	uid_t writer_uid, reader_uid;
	struct tpt_sync ready;
};

static const size_t sizes[] = { 100000, 9u << 20 }; /* one copy; chunks on several threads */

static void spec_of(unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 1;
	s->index = i;
	s->n_tensors = 1;
	s->lens[0] = sizes[i];
}

static int pair_reader(void *arg)
{
	struct pair *x = arg;
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "reader", .where = "cmapair",
			     .ready = &x->ready, .timeout_ms = T_MS };
	struct tpt_msg_spec s;
	int r = 0;

	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };

	TPT_REQUIRE(tpt_become_user(x->reader_uid) == 0, 1, "cannot become %u", (unsigned)x->reader_uid);
	r = tpt_ctx_new(e.d, 0, e.ctx_name, &e.ctx);
	if (r == 0)
		r = tp_listen(e.ctx, e.where, &o, &e.l);
	tpt_sync_post(e.ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "reader: listen: %d %s", r, tp_last_error());
	r = tp_listener_accept_sync(e.l, T_MS, &e.p);
	TPT_REQUIRE(r == 0, 1, "reader: accept: %d %s", r, tp_last_error());
	TPT_REQUIRE(tp_context_cma_ok(e.ctx), 1, "reader uid %u has no CMA",
		    (unsigned)x->reader_uid);
	for (unsigned i = 0; r == 0 && i < N_OF(sizes); i++) {
		spec_of(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	}
	tpt_end_close(&e);
	return r ? 1 : 0;
}

static int pair_writer(void *arg)
{
	struct pair *x = arg;
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "writer", .where = "cmapair",
			     .ready = &x->ready, .timeout_ms = T_MS };
	struct tpt_msg msgs[N_OF(sizes)];
	struct tpt_msg_spec s;
	int r;

	TPT_REQUIRE(tpt_become_user(x->writer_uid) == 0, 1, "cannot become %u", (unsigned)x->writer_uid);
	if (tpt_end_connect(&e) != 0)
		return 1;
	TPT_REQUIRE(tp_context_cma_ok(e.ctx), 1, "writer uid %u has no CMA",
		    (unsigned)x->writer_uid);
	for (unsigned i = 0; i < N_OF(sizes); i++) {
		spec_of(i, &s);
		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &msgs[i]) == 0, 1, "build");
	}
	r = tpt_write_all_in_order(e.p, msgs, N_OF(sizes), T_MS);
	for (unsigned i = 0; i < N_OF(sizes); i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	tpt_end_close(&e);
	return r;
}

/* `tpipctl --json status`'s field @key (an unsigned number). */
static uint64_t status_u64(const char *key)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", tpt_fixture_daemon.socket, "--json", "status", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *v;
	uint64_t n;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	o = json_tokener_parse(res.out);
	ck_assert_msg(o && json_object_object_get_ex(o, key, &v), "status has no %s: %s", key,
		      res.out);
	n = json_object_get_uint64(v);
	json_object_put(o);
	tpt_cmd_result_free(&res);
	return n;
}

/* Bytes and errors the cma channel has counted (`tpipctl --json stats`). */
static void cma_stats(uint64_t *ret_bytes, uint64_t *ret_errors)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", tpt_fixture_daemon.socket, "--json", "stats", NULL };
	struct tpt_cmd_result res;
	struct json_object *o, *arr, *v;

	ck_assert_msg(bin && *bin, "TPIPCTL_BIN is not set");
	ck_assert_int_eq(tpt_run(argv, T_MS, &res), 0);
	ck_assert_msg(WIFEXITED(res.status) && WEXITSTATUS(res.status) == 0, "tpipctl: %s",
		      res.err);
	o = json_tokener_parse(res.out);
	ck_assert_ptr_nonnull(o);
	ck_assert(json_object_object_get_ex(o, "channels", &arr));
	*ret_bytes = *ret_errors = 0;
	for (size_t i = 0; i < json_object_array_length(arr); i++) {
		struct json_object *ch = json_object_array_get_idx(arr, i);
		if (!json_object_object_get_ex(ch, "name", &v) ||
		    strcmp(json_object_get_string(v), "cma") != 0)
			continue;
		ck_assert(json_object_object_get_ex(ch, "bytes", &v));
		*ret_bytes = json_object_get_uint64(v);
		ck_assert(json_object_object_get_ex(ch, "errors", &v));
		*ret_errors = json_object_get_uint64(v);
	}
	json_object_put(o);
	tpt_cmd_result_free(&res);
}

static const uid_t pairs[][2] = { { NOBODY, VICTIM }, { VICTIM, NOBODY }, { NOBODY, NOBODY } };

START_TEST(test_cma_between_users_moves_private_memory_as_each_user)
{
	struct pair x = { .writer_uid = pairs[_i][0], .reader_uid = pairs[_i][1] };
	uint64_t b0, e0, b1, e1, total = 0;

	if (skip_unless_root())
		return;
	for (size_t i = 0; i < N_OF(sizes); i++)
		total += sizes[i];
	ck_assert_int_eq(tpt_sync_init(&x.ready), 0);
	cma_stats(&b0, &e0);
	ck_assert_msg(tpt_run_pair(pair_reader, pair_writer, &x, 3 * T_MS),
		      "uid %u -> uid %u failed", (unsigned)x.writer_uid, (unsigned)x.reader_uid);
	cma_stats(&b1, &e1);
	ck_assert_uint_eq(e1, e0);
	ck_assert_uint_eq(b1 - b0, total);
	tpt_sync_done(&x.ready);
}
END_TEST

/* With pipe rings on (the default), the same pairs: both messages (at least pipe-ring-min, 64K)
 * move through the ring the two clients map, none by CMA. */
START_TEST(test_cma_between_users_moves_large_private_memory_by_ring)
{
	struct pair x = { .writer_uid = pairs[_i][0], .reader_uid = pairs[_i][1] };
	uint64_t b0, e0, b1, e1, m0;

	if (skip_unless_root())
		return;
	ck_assert_int_eq(tpt_sync_init(&x.ready), 0);
	cma_stats(&b0, &e0);
	m0 = status_u64("pipe_ring_msgs");
	ck_assert_msg(tpt_run_pair(pair_reader, pair_writer, &x, 3 * T_MS),
		      "uid %u -> uid %u failed", (unsigned)x.writer_uid, (unsigned)x.reader_uid);
	cma_stats(&b1, &e1);
	ck_assert_uint_eq(e1, e0);
	ck_assert_uint_eq(b1 - b0, 0);
	ck_assert_uint_eq(status_u64("pipe_ring_msgs") - m0, N_OF(sizes));
	tpt_sync_done(&x.ready);
}
END_TEST

/* ---- (d) a client that changes its uid after attaching: refused, then staged --------------- */

static void spec_drop(unsigned i, struct tpt_msg_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->pipe = 4;
	s->index = i;
	s->n_tensors = 1;
	s->lens[0] = 300000;
}

static int drop_reader(void *arg)
{
	struct pair *x = arg;
	struct tp_listen_options o = { .size = sizeof(o), .access = TP_ACCESS_ANYONE };
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "reader", .where = "cmadrop" };
	struct tpt_msg_spec s;
	int r = tpt_ctx_new(e.d, 0, e.ctx_name, &e.ctx);

	if (r == 0)
		r = tp_listen(e.ctx, e.where, &o, &e.l);
	tpt_sync_post(&x->ready, (int8_t)(r ? -1 : 0));
	TPT_REQUIRE(r == 0, 1, "reader: listen: %d %s", r, tp_last_error());
	r = tp_listener_accept_sync(e.l, T_MS, &e.p);
	TPT_REQUIRE(r == 0, 1, "reader: accept: %d %s", r, tp_last_error());
	spec_drop(0, &s);
	r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
	TPT_REQUIRE(r < 0, 1, "reader: message 0 from a process CMA may no longer reach: %d", r);
	TPT_REQUIRE(tp_context_cma_ok(e.ctx), 1, "reader lost CMA for the writer's fault");
	for (unsigned i = 1; i < 3; i++) {
		spec_drop(i, &s);
		r = tpt_msg_read_check(e.ctx, e.p, &s, TPT_MEM_PRIVATE, T_MS);
		TPT_REQUIRE(r == 0, 1, "reader: message %u: %d", i, r);
	}
	tpt_end_close(&e);
	return 0;
}

static int drop_writer(void *arg)
{
	struct pair *x = arg;
	struct tpt_end e = { .d = &tpt_fixture_daemon, .ctx_name = "writer", .where = "cmadrop",
			     .ready = &x->ready, .timeout_ms = T_MS };
	struct tpt_msg msgs[3];
	struct tpt_msg_spec s;
	struct tpt_done done;
	struct tpt_done_arg a = { &done, 0 };
	int r;

	if (tpt_end_connect(&e) != 0)
		return 1;
	TPT_REQUIRE(tp_context_cma_ok(e.ctx), 1, "writer has no CMA to lose");
	TPT_REQUIRE(tpt_become_user(NOBODY) == 0, 1, "cannot become %d", NOBODY);
	for (unsigned i = 0; i < 3; i++) {
		spec_drop(i, &s);
		TPT_REQUIRE(tpt_msg_build(e.ctx, &s, TPT_MEM_PRIVATE, &msgs[i]) == 0, 1, "build");
	}
	tpt_done_init(&done);
	r = tp_pipe_write(e.p, &msgs[0].m, tpt_done_cb, &a);
	TPT_REQUIRE(r == 0 && tpt_done_wait(&done, 1, T_MS) == 0, 1, "write 0: %d", r);
	TPT_REQUIRE(done.status[0] < 0, 1, "write 0 from a process that changed its uid: %d",
		    done.status[0]);
	TPT_REQUIRE(!tp_context_cma_ok(e.ctx), 1, "CMA still offered after the refusal");
	r = tpt_write_all_in_order(e.p, msgs + 1, 2, T_MS); /* staged now */
	for (unsigned i = 0; i < 3; i++)
		tpt_msg_free(e.ctx, &msgs[i]);
	tpt_end_close(&e);
	return r;
}

START_TEST(test_cma_refused_midway_fails_that_transfer_then_stages)
{
	struct pair x = { 0 };

	if (skip_unless_root())
		return;
	ck_assert_int_eq(tpt_sync_init(&x.ready), 0);
	ck_assert(tpt_run_pair(drop_reader, drop_writer, &x, 3 * T_MS));
	ck_assert(tpt_daemon_alive(&tpt_fixture_daemon));
	ck_assert(tpt_daemon_log_has(&tpt_fixture_daemon, "refused as uid 0 (EPERM"));
	tpt_sync_done(&x.ready);
}
END_TEST

/* ---- (e) the daemon's threads never take a client's uid ------------------------------------- */

/* As uid 65534: until @stop[0] reads EOF, may we signal (signal 0) any daemon thread? */
static int signal_prober(int stop_fd)
{
	long tries = 0, permitted = 0;
	struct pollfd p = { .fd = stop_fd, .events = POLLIN };
	char path[64];
	int tids[64], n = 0;
	DIR *dir;
	struct dirent *e;

	snprintf(path, sizeof(path), "/proc/%d/task", (int)tpt_fixture_daemon.pid);
	dir = opendir(path);
	while (dir && (e = readdir(dir)) && n < 64)
		if (e->d_name[0] != '.')
			tids[n++] = atoi(e->d_name);
	if (dir)
		closedir(dir);
	TPT_REQUIRE(n > 0 && tpt_become_user(NOBODY) == 0, 1, "no daemon threads, or cannot drop");
	while (poll(&p, 1, 0) == 0) {
		for (int i = 0; i < n; i++, tries++)
			permitted += syscall(SYS_tgkill, (int)tpt_fixture_daemon.pid, tids[i], 0) == 0;
	}
	tpt_log("uid %d could signal daemon threads %ld times in %ld tries", NOBODY, permitted,
		tries);
	return permitted ? 1 : 0;
}

START_TEST(test_cma_copies_never_make_the_daemon_signalable_by_the_client)
{
	struct pair x = { .writer_uid = NOBODY, .reader_uid = NOBODY };
	int stop[2], st;
	pid_t prober;

	if (skip_unless_root())
		return;
	ck_assert_int_eq(pipe(stop), 0);
	prober = fork();
	ck_assert_int_ge(prober, 0);
	if (prober == 0) {
		close(stop[1]);
		_exit(signal_prober(stop[0]));
	}
	close(stop[0]);
	ck_assert_int_eq(tpt_sync_init(&x.ready), 0);
	ck_assert(tpt_run_pair(pair_reader, pair_writer, &x, 3 * T_MS));
	close(stop[1]);
	ck_assert_int_eq(tpt_wait(prober, T_MS, &st), 0);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "a client's user could signal the daemon while its memory was copied");
	tpt_sync_done(&x.ready);
}
END_TEST

static Suite *cma_suite(void)
{
	Suite *s = suite_create("sec_cma");
	TCase *tc = tcase_create("cma");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_cma_pid_recycled_to_another_user_is_neither_read_nor_written);
	tcase_add_test(tc, test_cma_setuid_exec_is_neither_read_nor_written);
	tcase_add_loop_test(tc, test_cma_between_users_moves_private_memory_as_each_user, 0,
			    N_OF(pairs));
	tcase_add_test(tc, test_cma_refused_midway_fails_that_transfer_then_stages);
	tcase_add_test(tc, test_cma_copies_never_make_the_daemon_signalable_by_the_client);
	suite_add_tcase(s, tc);
	tc = tcase_create("ring");
	tcase_add_checked_fixture(tc, setup_ring, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, test_cma_between_users_moves_large_private_memory_by_ring, 0,
			    N_OF(pairs));
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return tpt_run_suite(cma_suite());
}
