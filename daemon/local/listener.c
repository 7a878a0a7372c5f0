/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Listener registry and access policy. Listeners are found by id and by name in hash maps: one
 * user may hold 256 a session in each of its sessions, and a walk of all of them for every
 * connect, listen and listener close made one user's names slow every other user's calls.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include "listener.h"
#include "validate.h"

void tpd_listener_registry_init(struct tpd_registry *r)
{
	tpu_list_init(&r->listeners);
	tpu_hmap_init(&r->ids);
	tpu_hmap_init(&r->names);
	/* a key, so that no one chooses names that share a hash (a long chain) without it */
	if (getrandom(&r->seed, sizeof(r->seed), GRND_NONBLOCK) != (ssize_t)sizeof(r->seed))
		r->seed = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
	r->next_id = 1;
	r->count = 0;
}

void tpd_listener_registry_done(struct tpd_registry *r)
{
	struct tpd_listener *l, *tmp;

	tpu_list_for_each_safe(l, tmp, &r->listeners, node)
		tpd_listener_registry_remove(r, l);
	tpu_hmap_done(&r->ids);
	tpu_hmap_done(&r->names);
}

/* @name's key in r->names: FNV-1a over the registry's seed and the name, never 0. */
static uint64_t name_key(const struct tpd_registry *r, const char *name)
{
	uint64_t h = 0xcbf29ce484222325ull;

	for (unsigned i = 0; i < 8; i++)
		h = (h ^ ((r->seed >> (8 * i)) & 0xff)) * 0x100000001b3ull;
	for (const unsigned char *c = (const unsigned char *)name; *c; c++)
		h = (h ^ *c) * 0x100000001b3ull;
	h ^= h >> 29; /* the low bits (the map's slots) depend on every byte */
	return h ? h : 1;
}

struct tpd_listener *tpd_listener_registry_find(const struct tpd_registry *r, const char *name)
{
	struct tpd_listener *l = tpu_hmap_get(&r->names, name_key(r, name));

	while (l && strcmp(l->name, name) != 0)
		l = l->hash_next;
	return l;
}

struct tpd_listener *tpd_listener_registry_find_id(const struct tpd_registry *r, uint64_t id)
{
	return tpu_hmap_get(&r->ids, id);
}

/* Makes @l (not in r->names yet) the first of its hash's names. Return: 0 or -ENOMEM. */
static int names_add(struct tpd_registry *r, struct tpd_listener *l)
{
	uint64_t k = name_key(r, l->name);

	l->hash_next = tpu_hmap_get(&r->names, k);
	if (!l->hash_next)
		return tpu_hmap_put(&r->names, k, l);
	tpu_hmap_del(&r->names, k);
	return tpu_hmap_put(&r->names, k, l); /* as many entries as before: cannot fail */
}

/* Takes @l (added by names_add()) out of r->names. */
static void names_del(struct tpd_registry *r, struct tpd_listener *l)
{
	uint64_t k = name_key(r, l->name);
	struct tpd_listener *p = tpu_hmap_get(&r->names, k);

	if (p != l) {
		while (p && p->hash_next != l)
			p = p->hash_next;
		if (p)
			p->hash_next = l->hash_next;
		return;
	}
	tpu_hmap_del(&r->names, k);
	if (l->hash_next)
		(void)tpu_hmap_put(&r->names, k, l->hash_next); /* one fewer than before */
}

bool tpd_listener_name_uid(const char *name, uid_t *ret)
{
	unsigned long long v = 0;
	const char *c = name + 1;

	if (name[0] != '@' || c[0] < '0' || c[0] > '9' || (c[0] == '0' && c[1] != ':'))
		return false;
	for (; *c >= '0' && *c <= '9'; c++) {
		v = v * 10 + (unsigned)(*c - '0');
		if (v > UINT32_MAX)
			return false;
	}
	if (*c != ':')
		return false;
	*ret = (uid_t)v;
	return true;
}

int tpd_listener_registry_add(struct tpd_registry *r, const char *name, void *owner, uid_t uid,
			      Tpw__V1__Access access, gid_t gid, struct tpd_listener **ret)
{
	struct tpd_listener *l;
	uid_t reserved;

	if (!tpw_name_valid(name))
		return -EINVAL;
	if (tpd_listener_name_uid(name, &reserved) && reserved != uid)
		return -EACCES;
	if (tpd_listener_registry_find(r, name))
		return -EADDRINUSE;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->name = strdup(name);
	if (!l->name) {
		free(l);
		return -ENOMEM;
	}
	l->id = r->next_id++;
	l->owner = owner;
	l->uid = uid;
	l->access = access == TPW__V1__ACCESS__ACCESS_UNSPECIFIED ? TPW__V1__ACCESS__ACCESS_OWNER
								  : access;
	l->gid = gid;
	l->remote = TPW__V1__REMOTE_ACCESS__REMOTE_NONE;
	if (tpu_hmap_put(&r->ids, l->id, l) < 0) {
		free(l->name);
		free(l);
		return -ENOMEM;
	}
	if (names_add(r, l) < 0) {
		tpu_hmap_del(&r->ids, l->id);
		free(l->name);
		free(l);
		return -ENOMEM;
	}
	tpu_list_init(&l->session_node);
	tpu_list_insert_tail(&r->listeners, &l->node);
	r->count++;
	*ret = l;
	return 0;
}

void tpd_listener_registry_remove(struct tpd_registry *r, struct tpd_listener *l)
{
	if (!l)
		return;
	tpu_hmap_del(&r->ids, l->id);
	names_del(r, l);
	tpu_list_remove(&l->node);
	tpu_list_remove(&l->session_node);
	r->count--;
	tpu_strv_free(l->remote_peers, l->n_remote_peers);
	free(l->name);
	free(l);
}

int tpd_listener_set_remote(struct tpd_listener *l, Tpw__V1__RemoteAccess remote,
			    char *const *peers, size_t n)
{
	char **v = NULL;

	if (remote == TPW__V1__REMOTE_ACCESS__REMOTE_PEERS &&
	    tpu_strv_dup(peers, n, TPW_REMOTE_PEERS_MAX, TPW_NAME_MAX, &v) < 0)
		return -ENOMEM;
	l->remote = remote == TPW__V1__REMOTE_ACCESS__REMOTE_UNSPECIFIED
			    ? TPW__V1__REMOTE_ACCESS__REMOTE_NONE
			    : remote;
	l->remote_peers = v;
	l->n_remote_peers = v ? n : 0;
	return 0;
}

bool tpd_listener_permits_remote(const struct tpd_listener *l, tpd_remote_match_fn match,
				 const void *arg)
{
	switch (l->remote) {
	case TPW__V1__REMOTE_ACCESS__REMOTE_ANY_PEER:
		return true;
	case TPW__V1__REMOTE_ACCESS__REMOTE_PEERS:
		if (!match)
			return false;
		for (size_t i = 0; i < l->n_remote_peers; i++)
			if (match(l->remote_peers[i], arg))
				return true;
		return false;
	default:
		return false;
	}
}

bool tpd_listener_permits(const struct tpd_listener *l, uid_t uid, gid_t gid, const gid_t *groups,
			  size_t n_groups)
{
	if (uid == 0 || uid == l->uid || l->access == TPW__V1__ACCESS__ACCESS_ANYONE)
		return true;
	if (l->access != TPW__V1__ACCESS__ACCESS_GROUP)
		return false;
	if (gid == l->gid)
		return true;
	for (size_t i = 0; i < n_groups; i++)
		if (groups[i] == l->gid)
			return true;
	return false;
}
