/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Security suite: collective groups are per user. A process of another uid (nobody) that joins
 * a victim's group name, with the rank the victim group still waits for, does not complete the
 * victim's group: it waits alone in a group of its own and times out, while the victim's group
 * forms with the victim's own second member and computes undisturbed. The arena file the daemon
 * makes for a group is its uid's, mode 0600 (nobody cannot open it), and `tpipctl groups` shows
 * nobody none of the victim's groups (root sees them). Needs root
 * (to become other users); skipped otherwise.
 */
#include <check.h>
#include <dirent.h>
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
};

static struct shared *sh;

static void setup(void)
{
	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	ck_assert(sh != MAP_FAILED);
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
	if (geteuid() == 0)
		ck_assert_int_eq(tpt_daemon_stop(&d), 0);
}

static int become(uid_t uid)
{
	TPT_REQUIRE(setgroups(0, NULL) == 0, -errno, "setgroups");
	TPT_REQUIRE(setresgid(uid, uid, uid) == 0, -errno, "setresgid");
	TPT_REQUIRE(setresuid(uid, uid, uid) == 0, -errno, "setresuid");
	prctl(PR_SET_DUMPABLE, 1);
	return 0;
}

static int join_as(uid_t uid, int rank, int timeout_ms, struct tp_context **ctx,
		   struct tp_group **g)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = rank, .nranks = 2,
				      .join_timeout_ms = timeout_ms };
	int r = become(uid);

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

/* As nobody: try every group arena file in /dev/shm (the victim's is there until both its
 * members mapped it). */
static int attacker_open_arenas(void *arg)
{
	DIR *dir;
	struct dirent *e;

	(void)arg;
	sh->arena_open = 1; /* none found */
	if (become(ATTACKER) < 0)
		return 1;
	dir = opendir("/dev/shm");
	while (dir && (e = readdir(dir))) {
		char p[300];
		struct stat st;
		int fd;

		if (strncmp(e->d_name, "tpipd-group-", 12))
			continue;
		snprintf(p, sizeof(p), "/dev/shm/%s", e->d_name);
		if (stat(p, &st) == 0) {
			sh->arena_uid = (int)st.st_uid;
			sh->arena_mode = (int)(st.st_mode & 0777);
		}
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

/* The arena of a group: owned by its uid, mode 0600; nobody cannot open it. The daemon unlinks
 * its name once every member said GroupReady, which may or may not have happened when the
 * attacker looks: either it finds no file, or it finds the victim's private one. */
static int victim_alone(void *arg)
{
	struct tp_group_options o = { .size = sizeof(o), .rank = 0, .nranks = 1 };
	struct tp_context *ctx;
	struct tp_group *g;
	int r;

	(void)arg;
	if (become(VICTIM) < 0 || tpt_ctx_new(&d, 0, NULL, &ctx) < 0)
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

	if (!bin || (uid && become(uid) < 0) || tpt_run(argv, T_MS, &res) < 0)
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
	v = tpt_fork(victim_alone, NULL);
	ck_assert_int_eq(tpt_sync_wait(&victim_waits, T_MS), 0);
	a = tpt_fork(attacker_open_arenas, NULL);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker"));
	ck_assert_msg(sh->arena_open == 1 || sh->arena_open == -EACCES, "open: %d",
		      sh->arena_open);
	/* tpipctl groups: root sees the victim's group, nobody sees none */
	a = tpt_fork(attacker_ctl, NULL);
	ck_assert(tpt_wait_ok(a, T_MS, "attacker tpipctl"));
	ck_assert_int_eq(sh->ctl_seen, 0);
	ck_assert_int_eq(count_groups_as(0), 1);
	if (sh->arena_open == -EACCES) {
		ck_assert_int_eq(sh->arena_uid, VICTIM);
		ck_assert_int_eq(sh->arena_mode, 0600);
	}
	tpt_sync_post(&arena_seen, 0);
	ck_assert(tpt_wait_ok(v, T_MS, "victim"));
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
