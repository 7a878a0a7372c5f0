/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The listener registry: names registered by sessions, unique per daemon, with their access
 * policy. It decides whether a connecting client (by its peer credentials) may reach a
 * listener. It does not create pipes; that is the session's and pipe's job.
 */
#ifndef TPD_LISTENER_H
#define TPD_LISTENER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_listener {
	struct tpu_list node;	     /* in the registry */
	struct tpu_list session_node; /* in the owning session's list */
	uint64_t id;
	char *name;
	void *owner;		     /* the session, opaque here */
	uid_t uid;
	Tpw__V1__Access access;
	gid_t gid;
	uint64_t accepted;
};

struct tpd_registry {
	struct tpu_list listeners;
	uint64_t next_id;
	unsigned count;
};

void tpd_registry_init(struct tpd_registry *r);
/* Frees every listener left (the owners must not use them afterwards). */
void tpd_registry_done(struct tpd_registry *r);

/*
 * tpd_registry_add() - register @name for @owner.
 * @ret: returns borrowed listener, valid until tpd_registry_remove().
 * Return: 0, -EADDRINUSE if the name is taken, -EINVAL for a bad name, -ENOMEM.
 */
int tpd_registry_add(struct tpd_registry *r, const char *name, void *owner, uid_t uid,
		     Tpw__V1__Access access, gid_t gid, struct tpd_listener **ret);

/* Unregisters and frees @l. Accepts NULL. */
void tpd_registry_remove(struct tpd_registry *r, struct tpd_listener *l);

/* Returns borrowed listener named @name, or NULL. */
struct tpd_listener *tpd_registry_find(const struct tpd_registry *r, const char *name);
/* Returns borrowed listener with @id, or NULL. */
struct tpd_listener *tpd_registry_find_id(const struct tpd_registry *r, uint64_t id);

/*
 * tpd_listener_permits() - may a client with @uid, primary @gid and supplementary @groups
 * connect to @l? Root always may.
 */
bool tpd_listener_permits(const struct tpd_listener *l, uid_t uid, gid_t gid, const gid_t *groups,
			  size_t n_groups);

#endif
