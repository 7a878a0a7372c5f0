/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The listener registry: names registered by sessions, unique per daemon, with their access
 * policy. It decides whether a connecting client (by its peer credentials) or a peer daemon (by
 * its link's authenticated identity, never by a uid it claims) may reach a listener, and keeps
 * names of the form "@UID:..." to uid UID. It does not create pipes; that is the session's and
 * pipe's job.
 */
#ifndef TPD_LISTENER_H
#define TPD_LISTENER_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include "hmap.h"
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_listener {
	struct tpu_list node;	     /* in the registry */
	struct tpd_listener *hash_next; /* the next of the registry's names of the same hash */
	struct tpu_list session_node; /* in the owning session's list */
	uint64_t id;
	char *name;
	void *owner;		     /* the session, opaque here */
	uid_t uid;
	Tpw__V1__Access access;
	gid_t gid;
	uint64_t accepted;
	Tpw__V1__RemoteAccess remote; /* NONE, ANY_PEER or PEERS (never UNSPECIFIED) */
	char **remote_peers;	       /* REMOTE_PEERS: the identities allowed */
	size_t n_remote_peers;
};

struct tpd_registry {
	struct tpu_list listeners;
	/* By id, and by a keyed hash of the name (the first of those names; hash_next the rest):
	 * every connect, listen and listener close looked its name or id up in the list of all
	 * listeners, 256 a session of every user. */
	struct tpu_hmap ids, names;
	uint64_t seed;
	uint64_t next_id;
	unsigned count;
};

void tpd_listener_registry_init(struct tpd_registry *r);
/* Frees every listener left (the owners must not use them afterwards). */
void tpd_listener_registry_done(struct tpd_registry *r);

/*
 * tpd_listener_registry_add() - register @name for @owner, a session of @uid. A name "@UID:..."
 * (UID in decimal) is reserved to uid UID: any other uid, root included, is refused before the
 * registry is looked at, so the refusal says nothing about whether the name exists.
 * @ret: returns borrowed listener, valid until tpd_listener_registry_remove().
 * Return: 0, -EADDRINUSE if the name is taken, -EACCES for another uid's "@UID:" name, -EINVAL
 * for a bad name, -ENOMEM.
 */
int tpd_listener_registry_add(struct tpd_registry *r, const char *name, void *owner, uid_t uid,
			      Tpw__V1__Access access, gid_t gid, struct tpd_listener **ret);

/*
 * tpd_listener_name_uid() - is @name in a uid's own name space ("@UID:...")?
 * @ret: the uid, written only when it is.
 * Return: true if @name is reserved to *@ret.
 */
bool tpd_listener_name_uid(const char *name, uid_t *ret);

/*
 * tpd_listener_set_remote() - who on other hosts may open pipes to @l: @remote (UNSPECIFIED
 * means NONE) and, for REMOTE_PEERS, the @n peer identities @peers.
 * Borrows @peers (copied).
 * Return: 0 or -ENOMEM (then @l keeps REMOTE_NONE).
 */
int tpd_listener_set_remote(struct tpd_listener *l, Tpw__V1__RemoteAccess remote,
			    char *const *peers, size_t n);

/* Does @entry, one of a listener's remote peers, name the link @arg? (tpd_peer_identity_matches) */
typedef bool (*tpd_remote_match_fn)(const char *entry, const void *arg);

/*
 * tpd_listener_permits_remote() - may the peer daemon of a link open a pipe to @l?
 * REMOTE_ANY_PEER admits every link the daemon accepted; REMOTE_PEERS only a link that @match
 * says one of the listed entries names (@match NULL: an unauthenticated link, which no entry
 * names); REMOTE_NONE nobody. No uid plays a part. Borrows @l and @arg.
 */
bool tpd_listener_permits_remote(const struct tpd_listener *l, tpd_remote_match_fn match,
				 const void *arg);

/* Unregisters and frees @l. Accepts NULL. */
void tpd_listener_registry_remove(struct tpd_registry *r, struct tpd_listener *l);

/* Returns borrowed listener named @name, or NULL. */
struct tpd_listener *tpd_listener_registry_find(const struct tpd_registry *r, const char *name);
/* Returns borrowed listener with @id, or NULL. */
struct tpd_listener *tpd_listener_registry_find_id(const struct tpd_registry *r, uint64_t id);

/*
 * tpd_listener_permits() - may a local client with @uid, primary @gid and supplementary @groups
 * (its kernel-verified credentials) connect to @l? Root always may. Never for peer daemons:
 * see tpd_listener_permits_remote().
 */
bool tpd_listener_permits(const struct tpd_listener *l, uid_t uid, gid_t gid, const gid_t *groups,
			  size_t n_groups);

#endif
