/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_handix: the index of the channel or work queue handles of a registry (chan.c, wq.c): each
 * handle by its id, how many each session or peer link holds, and how many calls the handles of
 * each peer link have waiting. Every op names its handle by id, every open counts its caller's
 * handles, and every waiting call of a peer counts that peer's waits (chan-peer-ops-max); walking
 * the list of all handles (of every user, up to 1024 per session) for each made one user's
 * handles slow every other user's calls, and every peer's.
 * Not thread safe (the daemon's loop only); it never owns the handles.
 */
#ifndef TPD_HANDIX_H
#define TPD_HANDIX_H

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "hmap.h"

struct tpd_peer;

struct tpd_handix {
	struct tpu_hmap ids;	/* handle id -> handle */
	struct tpu_hmap owners; /* session or peer link (its address) -> handles it holds */
	struct tpu_hmap waits;	/* peer link (its address) -> its handles' waiting calls */
};

static inline void tpd_handix_init(struct tpd_handix *x)
{
	tpu_hmap_init(&x->ids);
	tpu_hmap_init(&x->owners);
	tpu_hmap_init(&x->waits);
}

static inline void tpd_handix_done(struct tpd_handix *x)
{
	tpu_hmap_done(&x->ids);
	tpu_hmap_done(&x->owners);
	tpu_hmap_done(&x->waits);
}

/* One more call of a handle of peer link @link (borrowed: only its address is kept) waits.
 * Return: 0 or -ENOMEM (not counted). */
static inline int tpd_handix_wait_add(struct tpd_handix *x, const struct tpd_peer *link)
{
	uint64_t k = (uint64_t)(uintptr_t)link;
	uintptr_t n = (uintptr_t)tpu_hmap_get(&x->waits, k);

	tpu_hmap_del(&x->waits, k);
	return tpu_hmap_put(&x->waits, k, (void *)(n + 1));
}

/* A waiting call counted by tpd_handix_wait_add() for @link ended. */
static inline void tpd_handix_wait_del(struct tpd_handix *x, const struct tpd_peer *link)
{
	uint64_t k = (uint64_t)(uintptr_t)link;
	uintptr_t n = (uintptr_t)tpu_hmap_get(&x->waits, k);

	tpu_hmap_del(&x->waits, k);
	if (n > 1) /* (shrinks: cannot fail) */
		(void)tpu_hmap_put(&x->waits, k, (void *)(n - 1));
}

/*
 * tpd_handix_peer_waits() - the calls the handles of @pr's peer wait with, over every link of
 * that peer that has some (@same: tpd_peer_same(), which says which links are one peer's; the
 * keys are links with waits, each alive while it has them). A walk of those links, never of the
 * handles. Borrows all.
 */
static inline uint32_t tpd_handix_peer_waits(const struct tpd_handix *x, const struct tpd_peer *pr,
					     bool (*same)(const struct tpd_peer *,
							  const struct tpd_peer *))
{
	uint64_t k;
	void *v;
	size_t it = 0;
	uint32_t n = 0;

	while (tpu_hmap_next(&x->waits, &it, &k, &v))
		if (same((const struct tpd_peer *)(uintptr_t)k, pr))
			n += (uint32_t)(uintptr_t)v;
	return n;
}

/* Handles @owner (a session or peer link; borrowed, only its address is used) holds. */
static inline unsigned tpd_handix_count(const struct tpd_handix *x, const void *owner)
{
	return (unsigned)(uintptr_t)tpu_hmap_get(&x->owners, (uint64_t)(uintptr_t)owner);
}

/* Sets @owner's count to @n (0 removes its entry). Return: 0 or -ENOMEM. */
static inline int tpd_handix_set_count(struct tpd_handix *x, const void *owner, unsigned n)
{
	uint64_t k = (uint64_t)(uintptr_t)owner;

	tpu_hmap_del(&x->owners, k);
	return n ? tpu_hmap_put(&x->owners, k, (void *)(uintptr_t)n) : 0;
}

/*
 * tpd_handix_add() - index handle @h (borrowed, until tpd_handix_del()) as @id (unique,
 * non-zero) of @owner. Return: 0 or -ENOMEM (nothing indexed).
 */
static inline int tpd_handix_add(struct tpd_handix *x, uint64_t id, const void *owner, void *h)
{
	unsigned n = tpd_handix_count(x, owner);
	int r = tpu_hmap_put(&x->ids, id, h);

	if (r < 0)
		return r;
	r = tpd_handix_set_count(x, owner, n + 1);
	if (r < 0) {
		tpu_hmap_del(&x->ids, id);
		(void)tpd_handix_set_count(x, owner, n); /* the table had room for it */
	}
	return r;
}

/* Removes handle @id of @owner (added by tpd_handix_add()). */
static inline void tpd_handix_del(struct tpd_handix *x, uint64_t id, const void *owner)
{
	unsigned n = tpd_handix_count(x, owner);

	tpu_hmap_del(&x->ids, id);
	(void)tpd_handix_set_count(x, owner, n ? n - 1 : 0); /* shrinks: cannot fail */
}

/* Returns borrowed handle @id, or NULL. */
static inline void *tpd_handix_get(const struct tpd_handix *x, uint64_t id)
{
	return tpu_hmap_get(&x->ids, id);
}

#endif
