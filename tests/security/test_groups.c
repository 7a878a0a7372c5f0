/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: collective groups are per user. A process of another uid (nobody) that joins
 * a victim's group name, with the rank the victim group still waits for, does not complete the
 * victim's group: it waits alone in a group of its own and times out, while the victim's group
 * forms with the victim's own second member and computes undisturbed. A group's arena is a
 * sealed memfd with no name in /dev/shm, out of reach of nobody even through the victim's
 * /proc entries, and `tpipctl groups` shows nobody none of the victim's groups (root sees them).
 * A member that gets hold of its own arena cannot shrink, grow or seal it, and garbage written
 * there does not bring the daemon down; a library too old to take arenas as memfds is refused
 * a join. Needs root (to become other users); skipped otherwise.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "itest.h"
#include "tpt_wire.h"

#define VICTIM 4242
#define ATTACKER 65534
#define T_MS 20000

static struct tpt_daemon d;
static struct tpt_sync victim_waits, attacker_done, arena_seen;

struct shared {
	int attacker_join;
	char attacker_msg[256];
	int victim_join[2];
	float result[2][4];
	int arena_open; /* the attacker's open() of the victim's arena: -errno */
	int ctl_seen;	/* groups `tpipctl groups` showed the attacker; -1: it failed */
	int ctl_seen_root;
	int arena_uid, arena_mode;
	pid_t victim_pid;
	time_t since; /* files older than the test (stale, of another daemon) are not the victim's */
	int map_files; /* the attacker's look into the victim's /proc/PID/map_files: -errno */
};

static struct shared *sh;

/* What the attacker could do to its own group's arena: -errno of each try, 1 when it had
 * nothing to try it on. */
struct shrink_tries {
	int got_fd;	  /* the fd handed over with GroupJoined: 0, or -errno */
	int shrink, grow; /* ftruncate() to 0 and to twice the size, on any fd it held */
	int seal;	  /* F_ADD_SEALS(F_SEAL_WRITE): sealing the others out of writing */
	int reopen;	  /* open("/proc/self/fd/N", O_RDWR): a description of its own */
	int shm_files;	  /* tpipd-group-* files seen in /dev/shm */
	int bad_file;	  /* the first file-level change that worked (path or fd): -1 none */
};

static struct shrink_tries *tries;

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert(sh != MAP_FAILED);
	tries = mmap(NULL, sizeof(*tries), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1,
		     0);
	ck_assert(tries != MAP_FAILED);
	ck_assert_int_eq(tpt_sync_init(&victim_waits), 0);
	ck_assert_int_eq(tpt_sync_init(&attacker_done), 0);
	ck_assert_int_eq(tpt_sync_init(&arena_seen), 0);
	if (geteuid() != 0)
		return;
	ck_assert_int_eq(tpt_daemon_start(&d, NULL), 0);
	ck_assert_int_eq(tpt_daemon_open_to_all(&d), 0);
}

static void teardown(void)
{
	tpt_sync_done(&victim_waits);
	tpt_sync_done(&attacker_done);
	tpt_sync_done(&arena_seen);
	munmap(sh, sizeof(*sh));
	munmap(tries, sizeof(*tries));
	if (geteuid() == 0)
		ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}


static int join_as(uid_t uid, int rank, int timeout_ms, struct tp_context **ctx,
		   struct tp_group **g)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = rank, .nranks = 2,
				      .join_timeout_ms = timeout_ms };
	int r = tpt_become_user(uid);

	if (r == 0)
		r = tpt_ctx_new(&d, 0, NULL, ctx);
	TPT_REQUIRE(r == 0, 2, "context as %u: %s", (unsigned)uid, tp_last_error());
	return tp_group_join(*ctx, "train", &o, g);
}

/* The victim's rank 0: joins first, tells the parent, and all-reduces once formed. */
static int victim(void *arg)
{
	int rank = (int)(intptr_t)arg;
	float in[4] = { 1 + rank, 2, 3, 4 };
	struct tp_context *ctx;
	struct tp_group *g;
	int r;

	if (rank == 0)
		tpt_sync_post(&victim_waits, 0); /* joins next, waits up to T_MS */
	r = join_as(VICTIM, rank, T_MS, &ctx, &g);
	sh->victim_join[rank] = r;
	if (r < 0)
		return 1;
	if (rank == 0)
		tpt_sync_wait(&arena_seen, T_MS); /* keep the group while the attacker looks */
	r = tp_allreduce(g, in, sh->result[rank], 4, TP_DTYPE_F32, TP_OP_SUM);
	tp_group_leave(g);
	tp_context_free(ctx);
	return r < 0;
}

static int attacker(void *arg)
{
	struct tp_context *ctx;
	struct tp_group *g = NULL;

	(void)arg;
	/* rank 1 of "train": what the victim's group waits for */
	sh->attacker_join = join_as(ATTACKER, 1, 1500, &ctx, &g);
	snprintf(sh->attacker_msg, sizeof(sh->attacker_msg), "%s", tp_last_error());
	if (g)
		tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}

/* As nobody: try every group arena file in /dev/shm (there should be none: an older daemon
 * left the victim's there until both its members mapped it), then the victim's mappings
 * through /proc (the only way left to a memfd nobody was handed). */
static int attacker_open_arenas(void *arg)
{
	DIR *dir;
	struct dirent *e;
	char p[300];

	(void)arg;
	sh->arena_open = 1; /* none found */
	if (tpt_become_user(ATTACKER) < 0)
		return 1;
	snprintf(p, sizeof(p), "/proc/%d/map_files", (int)sh->victim_pid);
	dir = opendir(p);
	sh->map_files = dir ? 0 : -errno;
	while (dir && (e = readdir(dir))) {
		char f[600];
		int fd;

		snprintf(f, sizeof(f), "%s/%s", p, e->d_name);
		fd = e->d_name[0] == '.' ? -1 : open(f, O_RDWR | O_CLOEXEC);
		if (fd >= 0) {
			sh->map_files = 1; /* opened one of the victim's mappings */
			close(fd);
		}
	}
	if (dir)
		closedir(dir);
	dir = opendir("/dev/shm");
	while (dir && (e = readdir(dir))) {
		struct stat st;
		int fd;

		if (strncmp(e->d_name, "tpipd-group-", 12))
			continue;
		snprintf(p, sizeof(p), "/dev/shm/%s", e->d_name);
		if (stat(p, &st) < 0 || st.st_uid != VICTIM || st.st_ctime < sh->since)
			continue;
		sh->arena_uid = (int)st.st_uid;
		sh->arena_mode = (int)(st.st_mode & 0777);
		fd = open(p, O_RDWR | O_CLOEXEC);
		sh->arena_open = fd < 0 ? -errno : 0;
		if (fd >= 0)
			close(fd);
	}
	if (dir)
		closedir(dir);
	return 0;
}

START_TEST(test_other_uid_cannot_join_a_victims_group)
{
	pid_t v0, v1, a;

	if (geteuid() != 0)
		return; /* needs root to become other users */
	v0 = tpt_fork(victim, (void *)(intptr_t)0);
	ck_assert_int_eq(tpt_sync_wait(&victim_waits, T_MS), 0);
	a = tpt_fork(attacker, NULL);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker"));
	/* the attacker waited alone: its join timed out, it never met the victim */
	ck_assert_int_eq(sh->attacker_join, -ETIMEDOUT);
	ck_assert_msg(strstr(sh->attacker_msg, "missing ranks 0"), "%s", sh->attacker_msg);
	/* the victim's own second member completes the victim's group */
	v1 = tpt_fork(victim, (void *)(intptr_t)1);
	tpt_sync_post(&arena_seen, 0);
	ck_assert(tpt_wait_ok(v0, T_MS, "victim 0"));
	ck_assert(tpt_wait_ok(v1, T_MS, "victim 1"));
	ck_assert_int_eq(sh->victim_join[0], 0);
	ck_assert_int_eq(sh->victim_join[1], 0);
	for (int r = 0; r < 2; r++) {
		ck_assert(sh->result[r][0] == 3.0f && sh->result[r][1] == 4.0f &&
			  sh->result[r][3] == 8.0f);
	}
}
END_TEST

/* The arena of a group is a memfd: no file in /dev/shm for nobody to find, and the victim's
 * mappings in /proc are closed to it. */
static int victim_alone(void *arg)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;
	int r;

	(void)arg;
	if (tpt_become_user(VICTIM) < 0 || tpt_ctx_new(&d, 0, NULL, &ctx) < 0)
		return 1;
	r = tp_group_join(ctx, "solo", &o, &g);
	if (r < 0)
		return 1;
	tpt_sync_post(&victim_waits, 0);
	tpt_sync_wait(&arena_seen, T_MS);
	tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}

/* Runs `tpipctl groups` as @uid (0: root) and counts the groups it lists. */
static int count_groups_as(uid_t uid)
{
	const char *bin = getenv("TPIPCTL_BIN");
	const char *argv[] = { bin, "--socket", d.socket, "groups", NULL };
	struct tpt_cmd_result res;
	int n = 0;

	if (!bin || (uid && tpt_become_user(uid) < 0) || tpt_run(argv, T_MS, &res) < 0)
		return -1;
	if (!WIFEXITED(res.status) || WEXITSTATUS(res.status) != 0 || !res.out ||
	    (n == 0 && !strstr(res.out, "group ") && !strstr(res.out, "no groups"))) {
		tpt_cmd_result_free(&res);
		return -1;
	}
	for (const char *p = res.out; p && (p = strstr(p, "\ngroup ")); p++)
		n++;
	if (res.out && strncmp(res.out, "group ", 6) == 0)
		n++;
	tpt_cmd_result_free(&res);
	return n;
}

static int attacker_ctl(void *arg)
{
	(void)arg;
	sh->ctl_seen = count_groups_as(ATTACKER);
	return 0;
}

START_TEST(test_arena_is_private_to_its_uid)
{
	pid_t v, a;

	if (geteuid() != 0)
		return;
	sh->since = time(NULL) - 1;
	v = tpt_fork(victim_alone, NULL);
	ck_assert_int_eq(tpt_sync_wait(&victim_waits, T_MS), 0);
	sh->victim_pid = v;
	a = tpt_fork(attacker_open_arenas, NULL);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker"));
	ck_assert_msg(sh->arena_open == 1, "a group arena in /dev/shm: open %d, uid %d, mode %o",
		      sh->arena_open, sh->arena_uid, sh->arena_mode);
	ck_assert_int_eq(sh->map_files, -EACCES);
	/* tpipctl groups: root sees the victim's group, nobody sees none */
	a = tpt_fork(attacker_ctl, NULL);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker tpipctl"));
	ck_assert_int_eq(sh->ctl_seen, 0);
	ck_assert_int_eq(count_groups_as(0), 1);
	tpt_sync_post(&arena_seen, 0);
	ck_assert(tpt_wait_ok(v, T_MS, "victim"));
}
END_TEST

/* ---- a member that shrinks its group's arena ------------------------------------------------ */

/* Tries to grow, shrink (to 0, last: what makes a mapping fault) and write-seal @fd; records
 * the first success. */
static void shrink_try(int fd, uint64_t bytes)
{
	int r;

	r = ftruncate(fd, (off_t)(2 * bytes)) < 0 ? -errno : 0;
	if (tries->grow != 0)
		tries->grow = r;
	r = ftruncate(fd, 0) < 0 ? -errno : 0;
	if (tries->shrink != 0)
		tries->shrink = r;
	r = fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE) < 0 ? -errno : 0;
	if (tries->seal != 0)
		tries->seal = r;
	if ((tries->shrink == 0 || tries->grow == 0 || tries->seal == 0) && tries->bad_file < 0)
		tries->bad_file = fd;
}

/* Every tpipd-group-* file of the attacker's created in /dev/shm since @in started watching
 * (its own group's arena, with an older daemon): opened and tried. */
static void shrink_shm_files(int in, uint64_t bytes)
{
	char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
	ssize_t n;

	while ((n = read(in, buf, sizeof(buf))) > 0) {
		for (char *p = buf; p < buf + n;) {
			struct inotify_event *ev = (struct inotify_event *)p;
			char path[PATH_MAX];
			struct stat st;
			int fd;

			p += sizeof(*ev) + ev->len;
			if (!ev->len || strncmp(ev->name, "tpipd-group-", 12) != 0)
				continue;
			snprintf(path, sizeof(path), "/dev/shm/%s", ev->name);
			fd = open(path, O_RDWR | O_CLOEXEC);
			if (fd >= 0 && (fstat(fd, &st) < 0 || st.st_uid != ATTACKER))
				fd = tpu_close(fd); /* not its group's (another daemon's) */
			if (fd < 0)
				continue;
			tries->shm_files++;
			shrink_try(fd, bytes);
		}
	}
}

/* Joins a group of one as nobody, speaking the protocol itself (so nothing checks what it gets
 * and it never says GroupReady), watching /dev/shm meanwhile. It tries to shrink, grow and seal
 * whatever it gets hold of: the arena fd handed over, the same memfd reopened through /proc, any
 * arena file in /dev/shm (an older daemon's, named in GroupJoined.arena_path too), writes 0xff
 * over the whole arena, and exits without leaving: the daemon, which maps the arena, must
 * neither fault on shrunk pages nor trust what it reads there. */
static int attacker_shrinks_arena(void *arg)
{
	Tpw__V1__GroupJoin j = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw r = { .fd = -1 };
	struct tpt_raw_ring g;
	uint64_t bytes;
	char path[64];
	void *map;
	int in, fd;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(ATTACKER) == 0, 2, "become nobody");
	in = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	TPT_REQUIRE(in >= 0 && inotify_add_watch(in, "/dev/shm", IN_CREATE) >= 0, 2,
		    "inotify: %s", strerror(errno));
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0 && tpt_raw_hello_group(&r, T_MS) == 0, 2,
		    "attach");
	TPT_REQUIRE(tpt_raw_ring_new(&g, 1u << 16) == 0 &&
			    tpt_raw_ring_setup(&r, 1, 1u << 16, g.fd, T_MS, &rep) == 0 &&
			    rep->reply->status == TPW__V1__STATUS__STATUS_OK, 2, "ring setup");
	tpw_daemon_msg_free(rep);
	j.req_id = 2;
	j.name = "shrink";
	j.rank = 0;
	j.size = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	TPT_REQUIRE(tpt_raw_ring_send(&r, &g, &m, NULL, 0, NULL, 0, 0, T_MS) == 0, 2, "join");
	/* The fd rides on a doorbell byte ahead of GroupJoined (an older daemon sends none). */
	fd = tpt_raw_take_fd(&r, 2000);
	tries->got_fd = fd < 0 ? fd : 0;
	TPT_REQUIRE(tpt_raw_ring_expect(&r, &g, TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED, T_MS,
					&rep) == 0 &&
			    rep->group_joined->status == TPW__V1__STATUS__STATUS_OK, 2, "joined");
	bytes = rep->group_joined->arena_bytes;
	tpt_log("attacker: joined, arena of %llu bytes, fd %d, path '%s'",
		(unsigned long long)bytes, fd, rep->group_joined->arena_path);
	if (fd >= 0) {
		int fd2;

		shrink_try(fd, bytes);
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		fd2 = open(path, O_RDWR | O_CLOEXEC);
		tries->reopen = fd2 < 0 ? -errno : 0;
		if (fd2 >= 0)
			shrink_try(fd2, bytes);
		map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		TPT_REQUIRE(map != MAP_FAILED, 2, "map the arena");
		memset(map, 0xff, bytes); /* counters, sizes and words: all garbage */
	}
	if (rep->group_joined->arena_path && *rep->group_joined->arena_path) {
		int f = open(rep->group_joined->arena_path, O_RDWR | O_CLOEXEC);

		if (f >= 0)
			shrink_try(f, bytes);
	}
	shrink_shm_files(in, bytes);
	_exit(0); /* its session ends, the group with it */
}

START_TEST(test_member_shrinking_its_arena_leaves_the_daemon_up)
{
	uint64_t end;
	pid_t a;
	int n;

	if (geteuid() != 0)
		return;
	*tries = (struct shrink_tries){ .got_fd = 1, .shrink = 1, .grow = 1, .seal = 1,
					.reopen = 1, .bad_file = -1 };
	a = tpt_fork(attacker_shrinks_arena, NULL);
	ck_assert(tpt_wait_ok(a, 3 * T_MS, "attacker"));
	/* the daemon sees the session end and frees the group (tpipctl: no group left) */
	end = tpt_now_ms() + T_MS;
	while ((n = count_groups_as(0)) > 0 && tpt_now_ms() < end)
		usleep(20000);
	if (!tpt_daemon_alive(&d)) {
		siginfo_t si = { 0 };

		waitid(P_PID, d.pid, &si, WEXITED | WNOHANG | WNOWAIT);
		ck_abort_msg("tpipd died after a member shrank its group's arena (code %d, "
			     "status/signal %d)", si.si_code, si.si_status);
	}
	ck_assert_int_eq(n, 0);
	/* it was handed a memfd that none of its fds could shrink, grow or seal */
	ck_assert_int_eq(tries->got_fd, 0);
	ck_assert_int_eq(tries->reopen, 0);
	ck_assert_int_eq(tries->shrink, -EPERM);
	ck_assert_int_eq(tries->grow, -EPERM);
	ck_assert_int_eq(tries->seal, -EPERM);
	ck_assert_int_eq(tries->bad_file, -1);
	ck_assert_int_eq(tries->shm_files, 0); /* and no arena has a name */
}
END_TEST

/* The daemon's fds: how many, and how many of them are group arenas (memfd:tpipd-group). */
static int daemon_fds(int *ret_arenas)
{
	char dir[64], link[400], target[256];
	struct dirent *e;
	int n = 0;
	DIR *dp;

	*ret_arenas = 0;
	snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)d.pid);
	dp = opendir(dir);
	if (!dp)
		return -errno;
	while ((e = readdir(dp))) {
		ssize_t k;

		if (e->d_name[0] == '.')
			continue;
		n++;
		snprintf(link, sizeof(link), "%s/%s", dir, e->d_name);
		k = readlink(link, target, sizeof(target) - 1);
		target[k > 0 ? k : 0] = '\0';
		*ret_arenas += strstr(target, "memfd:tpipd-group") != NULL;
	}
	closedir(dp);
	return n;
}

/* The daemon's fd count once it holds still: the same in three reads 50 ms apart (a session
 * of an earlier case may still be closing at load), or the last read after T_MS. */
static int daemon_fds_settled(int *ret_arenas)
{
	uint64_t end = tpt_now_ms() + T_MS;
	int n = daemon_fds(ret_arenas), same = 0;

	while (same < 2 && tpt_now_ms() < end) {
		int m;

		usleep(50000);
		m = daemon_fds(ret_arenas);
		same = m == n ? same + 1 : 0;
		n = m;
	}
	return n;
}

/* Rank 1 of "dying", speaking the protocol on the socket: joins, waits until its GroupJoined
 * (and with it the arena fd) is in its socket, tells the parent, and at the parent's word exits
 * with both unread. */
static int dying_member(void *arg)
{
	Tpw__V1__GroupJoin j = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	struct tpt_raw r = { .fd = -1 };
	struct pollfd pf;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(VICTIM) == 0, 2, "become");
	TPT_REQUIRE(tpt_raw_connect(&r, d.socket) == 0 && tpt_raw_hello_group(&r, T_MS) == 0, 2,
		    "attach");
	j.req_id = 1;
	j.name = "dying";
	j.rank = 1;
	j.size = 2;
	j.timeout_ms = T_MS;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	TPT_REQUIRE(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0) == 0, 2, "join");
	tpt_sync_post(&victim_waits, 0); /* the partner may join */
	pf = (struct pollfd){ .fd = r.fd, .events = POLLIN };
	TPT_REQUIRE(poll(&pf, 1, T_MS) == 1, 2, "no GroupJoined");
	tpt_sync_post(&attacker_done, 0);
	tpt_sync_wait(&arena_seen, T_MS);
	_exit(0);
}

/* Rank 0 of "dying" (a library member): joins; its start barrier waits for rank 1. */
static int dying_partner(void *arg)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 2,
				      .join_timeout_ms = T_MS };
	struct tp_context *ctx;
	struct tp_group *g = NULL;
	int r;

	(void)arg;
	TPT_REQUIRE(tpt_become_user(VICTIM) == 0 && tpt_ctx_new(&d, 0, NULL, &ctx) == 0, 2, "context");
	r = tp_group_join(ctx, "dying", &o, &g);
	snprintf(sh->attacker_msg, sizeof(sh->attacker_msg), "%s", tp_last_error());
	sh->attacker_join = r;
	if (g)
		tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}

/* A member whose session ends with its GroupJoined and arena fd unread (on the socket: the fd
 * waits in its receive queue) leaves nothing behind in the daemon: no arena fd, even while the
 * group lives (the daemon closes its own once every member was sent one), no group, as many
 * fds as before; its partner's join fails naming it. */
START_TEST(test_member_dying_before_taking_its_arena_leaks_nothing)
{
	int before, now, arenas;
	uint64_t end;
	pid_t a, b;

	if (geteuid() != 0)
		return;
	before = daemon_fds_settled(&arenas);
	ck_assert_int_gt(before, 0);
	a = tpt_fork(dying_member, NULL);
	ck_assert_int_eq(tpt_sync_wait(&victim_waits, T_MS), 0);
	b = tpt_fork(dying_partner, NULL);
	ck_assert_int_eq(tpt_sync_wait(&attacker_done, T_MS), 0);
	/* Formed, every member sent its fd (rank 1, the raw one, is answered last), rank 1 has
	 * not read its own: the daemon holds none (it closes its own right after that send). */
	end = tpt_now_ms() + T_MS;
	while (daemon_fds(&arenas) > 0 && arenas > 0 && tpt_now_ms() < end)
		usleep(1000);
	ck_assert_int_eq(arenas, 0);
	ck_assert_int_eq(count_groups_as(0), 1);
	tpt_sync_post(&arena_seen, 0);
	ck_assert(tpt_wait_ok(a, T_MS, "dying member"));
	ck_assert(tpt_wait_ok(b, T_MS, "partner"));
	ck_assert_int_lt(sh->attacker_join, 0);
	ck_assert_msg(strstr(sh->attacker_msg, "rank 1"), "%s", sh->attacker_msg);
	end = tpt_now_ms() + T_MS;
	while (((now = daemon_fds(&arenas)) > before || count_groups_as(0) != 0) &&
	       tpt_now_ms() < end)
		usleep(20000);
	ck_assert_int_le(now, before);
	ck_assert_int_eq(arenas, 0);
	ck_assert_int_eq(count_groups_as(0), 0);
}
END_TEST

/* Joins a group of one named @name as @req and leaves it at once (@gid: the id its GroupJoined
 * will have, never read), on the socket. Return: 0 or -errno. */
static int join_leave(struct tpt_raw *r, uint64_t req, uint64_t gid)
{
	Tpw__V1__GroupJoin j = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__GroupLeave lv = TPW__V1__GROUP_LEAVE__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	int e;

	j.req_id = req;
	j.name = "flood";
	j.rank = 0;
	j.size = 1;
	j.timeout_ms = T_MS;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	e = tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
	if (e < 0 || !gid)
		return e;
	lv.group_id = gid;
	m = (Tpw__V1__ClientMsg)TPW__V1__CLIENT_MSG__INIT;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_LEAVE;
	m.group_leave = &lv;
	return tpt_raw_send(r, &m, NULL, 0, NULL, 0, 0);
}

/*
 * A client on the plain socket (no control ring, so each arena fd waits in the daemon's output
 * queue until the frame's first byte goes) that joins and leaves groups of one and never reads:
 * every GroupJoined holds a dup of an arena memfd in the daemon. Its session fails once 8 wait
 * (TPD_CONN_OUT_FDS_MAX); the daemon's fd table never holds more than that for it (it grew by
 * one a round before, up to RLIMIT_NOFILE: every user's accepts and memfds failed).
 */
START_TEST(test_unread_arena_fds_are_bounded_per_session)
{
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw r = { .fd = -1 };
	int before, arenas, most = 0, now;
	uint64_t gid;
	pid_t pid;

	if (geteuid() != 0)
		return;
	before = daemon_fds(&arenas);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		int rc = 0;

		if (tpt_become_user(ATTACKER) < 0 || tpt_raw_connect(&r, d.socket) < 0 ||
		    tpt_raw_hello_group(&r, T_MS) < 0 || join_leave(&r, 1, 0) < 0 ||
		    tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED, T_MS, &rep) < 0)
			_exit(2);
		gid = rep->group_joined->group_id; /* the next ones follow it */
		tpw_daemon_msg_free(rep);
		for (uint64_t k = 0; k < 2000 && rc == 0; k++)
			rc = join_leave(&r, k + 2, k ? gid + k : gid);
		tpt_sync_post(&attacker_done, 0);
		tpt_sync_wait(&arena_seen, T_MS);
		_exit(0);
	}
	ck_assert_int_eq(tpt_sync_wait(&attacker_done, T_MS), 0);
	for (int i = 0; i < 50; i++) {
		now = daemon_fds(&arenas);
		most = now > most ? now : most;
		usleep(10000);
	}
	tpt_log("daemon fds: %d before, at most %d while the client did not read", before, most);
	tpt_sync_post(&arena_seen, 0);
	ck_assert(tpt_wait_ok(pid, T_MS, "flooding client"));
	ck_assert(tpt_daemon_alive(&d));
	ck_assert_int_le(most, before + 16);
}
END_TEST

/* A library that does not say it takes arenas as memfds (Hello.group_arena_fd) is refused a
 * join, with the cause named, instead of being given an arena it would look for by path. */
START_TEST(test_old_library_is_refused_a_group_join)
{
	Tpw__V1__GroupJoin j = TPW__V1__GROUP_JOIN__INIT;
	Tpw__V1__ClientMsg m = TPW__V1__CLIENT_MSG__INIT;
	Tpw__V1__DaemonMsg *rep = NULL;
	struct tpt_raw r = { .fd = -1 };

	if (geteuid() != 0)
		return;
	ck_assert_int_eq(tpt_raw_connect(&r, d.socket), 0);
	ck_assert_int_eq(tpt_raw_hello(&r, TPW__V1__ROLE__ROLE_CLIENT, T_MS), 0);
	j.req_id = 1;
	j.name = "old";
	j.rank = 0;
	j.size = 1;
	m.body_case = TPW__V1__CLIENT_MSG__BODY_GROUP_JOIN;
	m.group_join = &j;
	ck_assert_int_eq(tpt_raw_send(&r, &m, NULL, 0, NULL, 0, 0), 0);
	ck_assert_int_eq(tpt_raw_expect(&r, TPW__V1__DAEMON_MSG__BODY_GROUP_JOINED, T_MS, &rep),
			 0);
	ck_assert_int_eq(rep->group_joined->status, TPW__V1__STATUS__STATUS_UNSUPPORTED);
	ck_assert_msg(strstr(rep->group_joined->message, "sealed memfds; libtpclient is too old"),
		      "%s", rep->group_joined->message);
	ck_assert(!rep->group_joined->arena_fd && !*rep->group_joined->arena_path);
	tpw_daemon_msg_free(rep);
	tpt_raw_close(&r);
	ck_assert_int_eq(count_groups_as(0), 0);
}
END_TEST

/* ---- one user's group loop and another user's lines ----------------------------------------- */

#define LOOP_FORMS 150 /* groups of one the attacker forms and leaves */
#define LOOP_LATE 100  /* joins of a group of two that time out after 1 ms */
#define GROUP_LOG_BURST 20 /* TPD_GROUP_LOG_BURST (daemon/group/group_int.h), in 10 s */

/* Forms and leaves LOOP_FORMS groups of one, then makes LOOP_LATE joins that time out: each a
 * line or two in the daemon's log on a daemon without a budget. */
static int attacker_loop(void *arg)
{
	struct tp_group_options one = { .size = sizeof(one), .rank = 0, .nranks = 1 };
	struct tp_group_options late = { .size = sizeof(late), .rank = 0, .nranks = 2,
					 .join_timeout_ms = 1 };
	struct tp_context *ctx;
	struct tp_group *g;

	(void)arg;
	if (tpt_become_user(ATTACKER) < 0 || tpt_ctx_new(&d, 0, NULL, &ctx) < 0)
		return 1;
	for (unsigned i = 0; i < LOOP_FORMS; i++) {
		TPT_REQUIRE(tp_group_join(ctx, "loop", &one, &g) == 0, 1, "form %u: %s", i,
			    tp_last_error());
		tp_group_leave(g);
	}
	for (unsigned i = 0; i < LOOP_LATE; i++)
		TPT_REQUIRE(tp_group_join(ctx, "late", &late, &g) == -ETIMEDOUT, 1,
			    "late join %u: %s", i, tp_last_error());
	tp_context_free(ctx);
	return 0;
}

/* Forms one group of one, "mine". */
static int victim_once(void *arg)
{
	struct tp_group_options one = { .size = sizeof(one), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;

	(void)arg;
	if (tpt_become_user(VICTIM) < 0 || tpt_ctx_new(&d, 0, NULL, &ctx) < 0)
		return 1;
	TPT_REQUIRE(tp_group_join(ctx, "mine", &one, &g) == 0, 1, "join: %s", tp_last_error());
	tp_group_leave(g);
	tp_context_free(ctx);
	return 0;
}

/*
 * What one user's joins provoke (groups formed and left, joins timed out or refused) is logged
 * within that uid's budget (20 lines in 10 s, 100 for all uids), and another user's group is
 * still logged: uid 65534 forms and leaves 150 groups of one and makes 100 joins that time
 * out, then uid 4242 forms one group. Each was a line in the log, 250 of the attacker's here,
 * as fast as it could join: one user could fill the log and hide every other user's lines.
 */
START_TEST(test_one_users_group_loop_does_not_hide_anothers_lines)
{
	uint64_t t0, took;
	int lines;
	pid_t a, v;

	if (geteuid() != 0)
		return; /* needs root to become other users */
	t0 = tpt_now_ms();
	a = tpt_fork(attacker_loop, NULL);
	ck_assert(tpt_wait_ok(a, 4 * T_MS, "attacker"));
	took = tpt_now_ms() - t0;
	v = tpt_fork(victim_once, NULL);
	ck_assert(tpt_wait_ok(v, T_MS, "victim"));
	lines = tpt_daemon_log_count(&d, "'loop'") + tpt_daemon_log_count(&d, "'late'");
	printf("%u groups and %u late joins of one user in %llu ms: %d lines in the log\n",
	       LOOP_FORMS, LOOP_LATE, (unsigned long long)took, lines);
	ck_assert_int_gt(lines, 0);
	ck_assert_msg(lines <= GROUP_LOG_BURST * (int)(1 + took / 10000 + 1), "%d lines of one "
		      "user's group loop in %llu ms", lines, (unsigned long long)took);
	ck_assert_msg(tpt_daemon_log_has(&d, "'mine' (uid 4242)"),
		      "the other user's group is not in the log");
	ck_assert(tpt_daemon_log_has(&d, "lines about groups of this uid not logged"));
}
END_TEST

static Suite *groups_suite(void)
{
	Suite *s = suite_create("sec_groups");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_other_uid_cannot_join_a_victims_group);
	tcase_add_test(tc, test_arena_is_private_to_its_uid);
	tcase_add_test(tc, test_member_shrinking_its_arena_leaves_the_daemon_up);
	tcase_add_test(tc, test_old_library_is_refused_a_group_join);
	tcase_add_test(tc, test_member_dying_before_taking_its_arena_leaks_nothing);
	tcase_add_test(tc, test_unread_arena_fds_are_bounded_per_session);
	tcase_add_test(tc, test_one_users_group_loop_does_not_hide_anothers_lines);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(groups_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
