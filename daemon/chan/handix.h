/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_handix: the index of the channel or work queue handles of a registry (chan.c, wq.c): each
 * handle by its id, and how many each session or peer link holds. Every op names its handle by
 * id and every open counts its caller's handles; walking the list of all handles (of every user,
 * up to 1024 per session) for each made one user's handles slow every other user's calls.
 * Not thread safe (the daemon's loop only); it never owns the handles.
 */
#ifndef TPD_HANDIX_H
#define TPD_HANDIX_H

#include <errno.h>
#include <stdint.h>
#include "hmap.h"

struct tpd_handix {
	struct tpu_hmap ids;	/* handle id -> handle */
	struct tpu_hmap owners; /* session or peer link (its address) -> handles it holds */
};

static inline void tpd_handix_init(struct tpd_handix *x)
{
	tpu_hmap_init(&x->ids);
	tpu_hmap_init(&x->owners);
}

static inline void tpd_handix_done(struct tpd_handix *x)
{
	tpu_hmap_done(&x->ids);
	tpu_hmap_done(&x->owners);
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
