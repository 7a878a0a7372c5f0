/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Unit suite for daemon/local/listener.c: the listener registry (unique names, ids, removal)
 * and the access policy decided from peer credentials.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "listener.h"

static struct tpd_registry reg;
static int owner_a, owner_b;

static void setup(void)
{
	tpd_listener_registry_init(&reg);
}

static void teardown(void)
{
	tpd_listener_registry_done(&reg);
}

START_TEST(test_registry_add_and_find)
{
	struct tpd_listener *l = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "trainer0", &owner_a, 1000,
						   TPW__V1__ACCESS__ACCESS_OWNER, 0, &l),
			 0);
	ck_assert_ptr_eq(tpd_listener_registry_find(&reg, "trainer0"), l);
	ck_assert_ptr_eq(tpd_listener_registry_find_id(&reg, l->id), l);
	ck_assert_ptr_null(tpd_listener_registry_find(&reg, "trainer1"));
	ck_assert_uint_eq(reg.count, 1);
}
END_TEST

START_TEST(test_registry_rejects_taken_name)
{
	struct tpd_listener *l = NULL, *l2 = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1, 0, 0, &l), 0);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_b, 1, 0, 0, &l2), -EADDRINUSE);
	ck_assert_ptr_null(l2);
	ck_assert_ptr_eq(tpd_listener_registry_find(&reg, "x")->owner, &owner_a);
}
END_TEST

START_TEST(test_registry_name_free_after_remove)
{
	struct tpd_listener *l = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1, 0, 0, &l), 0);
	tpd_listener_registry_remove(&reg, l);
	ck_assert_uint_eq(reg.count, 0);
	ck_assert_ptr_null(tpd_listener_registry_find(&reg, "x"));
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_b, 1, 0, 0, &l), 0);
	ck_assert_ptr_eq(l->owner, &owner_b);
}
END_TEST

/* 3000 names and ids found, half removed in an order of their own, the rest still found and
 * the removed ones free again (the maps by name and by id against the list of all). */
START_TEST(test_registry_finds_many_names_and_ids_after_removals)
{
	static struct tpd_listener *ls[3000];
	char name[32];

	for (unsigned i = 0; i < 3000; i++) {
		snprintf(name, sizeof(name), "n%u", i);
		ck_assert_int_eq(tpd_listener_registry_add(&reg, name, &owner_a, 1, 0, 0, &ls[i]),
				 0);
	}
	for (unsigned i = 0; i < 3000; i += 2) {
		unsigned k = (i * 7919u) % 3000u; /* a permutation of the even ones (7919 is odd) */

		k -= k % 2;
		if (!ls[k])
			continue;
		tpd_listener_registry_remove(&reg, ls[k]);
		ls[k] = NULL;
	}
	for (unsigned i = 0; i < 3000; i++) {
		snprintf(name, sizeof(name), "n%u", i);
		if (ls[i]) {
			ck_assert_ptr_eq(tpd_listener_registry_find(&reg, name), ls[i]);
			ck_assert_ptr_eq(tpd_listener_registry_find_id(&reg, ls[i]->id), ls[i]);
		} else {
			ck_assert_ptr_null(tpd_listener_registry_find(&reg, name));
			ck_assert_int_eq(tpd_listener_registry_add(&reg, name, &owner_b, 1, 0, 0,
								   &ls[i]), 0);
			ck_assert_ptr_eq(tpd_listener_registry_find(&reg, name), ls[i]);
		}
	}
	ck_assert_uint_eq(reg.count, 3000);
}
END_TEST

START_TEST(test_registry_rejects_bad_names)
{
	struct tpd_listener *l = NULL;
	char longname[300];

	memset(longname, 'a', sizeof(longname));
	longname[256] = '\0';
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "", &owner_a, 1, 0, 0, &l), -EINVAL);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "a/b", &owner_a, 1, 0, 0, &l), -EINVAL);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, longname, &owner_a, 1, 0, 0, &l), -EINVAL);
	longname[255] = '\0';
	ck_assert_int_eq(tpd_listener_registry_add(&reg, longname, &owner_a, 1, 0, 0, &l), 0);
}
END_TEST

START_TEST(test_registry_ids_are_unique)
{
	struct tpd_listener *a = NULL, *b = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "a", &owner_a, 1, 0, 0, &a), 0);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "b", &owner_a, 1, 0, 0, &b), 0);
	ck_assert_uint_ne(a->id, b->id);
}
END_TEST

START_TEST(test_access_owner_only_by_default)
{
	struct tpd_listener *l = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1000,
						   TPW__V1__ACCESS__ACCESS_UNSPECIFIED, 0, &l),
			 0);
	ck_assert(tpd_listener_permits(l, 1000, 1000, NULL, 0));
	ck_assert(tpd_listener_permits(l, 0, 0, NULL, 0)); /* root */
	ck_assert(!tpd_listener_permits(l, 1001, 1000, NULL, 0));
}
END_TEST

START_TEST(test_access_group_checks_primary_and_supplementary)
{
	struct tpd_listener *l = NULL;
	gid_t groups[] = { 5, 77, 9 };

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1000,
						   TPW__V1__ACCESS__ACCESS_GROUP, 77, &l),
			 0);
	ck_assert(tpd_listener_permits(l, 2000, 77, NULL, 0));
	ck_assert(tpd_listener_permits(l, 2000, 1, groups, 3));
	ck_assert(!tpd_listener_permits(l, 2000, 1, groups, 1));
	ck_assert(!tpd_listener_permits(l, 2000, 1, NULL, 0));
}
END_TEST

START_TEST(test_access_anyone)
{
	struct tpd_listener *l = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1000,
						   TPW__V1__ACCESS__ACCESS_ANYONE, 0, &l),
			 0);
	ck_assert(tpd_listener_permits(l, 4242, 4242, NULL, 0));
}
END_TEST

/* The link's identity matcher, as the daemon's would be for a link authenticated as @arg. */
static bool same_text(const char *entry, const void *arg)
{
	return strcmp(entry, arg) == 0;
}

/* Remote access for a link that authenticated as @identity (NULL: an unauthenticated link). */
static bool permits_remote(const struct tpd_listener *l, const char *identity)
{
	return tpd_listener_permits_remote(l, identity ? same_text : NULL, identity);
}

START_TEST(test_remote_access_none_by_default_and_never_by_uid)
{
	struct tpd_listener *l = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "x", &owner_a, 1000,
						   TPW__V1__ACCESS__ACCESS_ANYONE, 0, &l),
			 0);
	ck_assert_int_eq(l->remote, TPW__V1__REMOTE_ACCESS__REMOTE_NONE);
	ck_assert(!permits_remote(l, "psk"));
	ck_assert(!permits_remote(l, NULL));
	ck_assert_int_eq(tpd_listener_set_remote(l, TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED,
						 NULL, 0), 0);
	ck_assert(!permits_remote(l, "psk"));
}
END_TEST

START_TEST(test_remote_access_any_peer_and_named_peers)
{
	char *peers[] = { "hostb", "psk" };
	struct tpd_listener *a = NULL, *n = NULL;

	ck_assert_int_eq(tpd_listener_registry_add(&reg, "a", &owner_a, 1000, 0, 0, &a), 0);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "n", &owner_a, 1000, 0, 0, &n), 0);
	ck_assert_int_eq(
		tpd_listener_set_remote(a, TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER, NULL, 0), 0);
	ck_assert(permits_remote(a, "psk"));
	ck_assert(permits_remote(a, NULL)); /* a link the daemon itself admitted */
	ck_assert_int_eq(tpd_listener_set_remote(n, TPW__V1__REMOTE_ACCESS__REMOTE_PEERS, peers, 2),
			 0);
	peers[1] = "changed"; /* copied */
	ck_assert(permits_remote(n, "psk"));
	ck_assert(permits_remote(n, "hostb"));
	ck_assert(!permits_remote(n, "hostc"));
	ck_assert(!permits_remote(n, "ps"));
	ck_assert(!permits_remote(n, NULL)); /* unauthenticated: never by name */
}
END_TEST

START_TEST(test_uid_name_space_is_the_uids_own)
{
	struct tpd_listener *l = NULL;
	uid_t u = 1;

	ck_assert(tpd_listener_name_uid("@4242:x", &u));
	ck_assert_uint_eq(u, 4242);
	ck_assert(tpd_listener_name_uid("@0:x", &u));
	ck_assert_uint_eq(u, 0);
	ck_assert(tpd_listener_name_uid("@4294967295:x", &u));
	ck_assert_uint_eq(u, 4294967295u);
	ck_assert(!tpd_listener_name_uid("@4294967296:x", &u)); /* above uid_t: no one's */
	ck_assert(!tpd_listener_name_uid("@04242:x", &u));
	ck_assert(!tpd_listener_name_uid("@4242", &u));
	ck_assert(!tpd_listener_name_uid("@:x", &u));
	ck_assert(!tpd_listener_name_uid("4242:x", &u));
	ck_assert(!tpd_listener_name_uid("@42a:x", &u));
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "@4242:x", &owner_a, 4243, 0, 0, &l),
			 -EACCES);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "@4242:x", &owner_a, 0, 0, 0, &l),
			 -EACCES);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "@4242:x", &owner_a, 4242, 0, 0, &l), 0);
	/* Taken or not, another uid hears the same. */
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "@4242:x", &owner_b, 4243, 0, 0, &l),
			 -EACCES);
	ck_assert_int_eq(tpd_listener_registry_add(&reg, "@0:y", &owner_a, 0, 0, 0, &l), 0);
}
END_TEST

static Suite *listener_suite(void)
{
	Suite *s = suite_create("listener");
	TCase *tc = tcase_create("core");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, test_registry_add_and_find);
	tcase_add_test(tc, test_registry_rejects_taken_name);
	tcase_add_test(tc, test_registry_name_free_after_remove);
	tcase_add_test(tc, test_registry_finds_many_names_and_ids_after_removals);
	tcase_add_test(tc, test_registry_rejects_bad_names);
	tcase_add_test(tc, test_registry_ids_are_unique);
	tcase_add_test(tc, test_access_owner_only_by_default);
	tcase_add_test(tc, test_access_group_checks_primary_and_supplementary);
	tcase_add_test(tc, test_access_anyone);
	tcase_add_test(tc, test_remote_access_none_by_default_and_never_by_uid);
	tcase_add_test(tc, test_remote_access_any_peer_and_named_peers);
	tcase_add_test(tc, test_uid_name_space_is_the_uids_own);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	SRunner *sr = srunner_create(listener_suite());
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}
