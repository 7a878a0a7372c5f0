/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpu_hmap: a map from non-zero 64-bit keys to pointers (open addressing, linear probing,
 * backward-shift deletion, grows by doubling). Used for per-session tables of pipes and
 * buffers. Not thread safe; the map never owns the values.
 */
#ifndef TPU_HMAP_H
#define TPU_HMAP_H

#include <stddef.h>
#include <stdint.h>

struct tpu_hmap {
	uint64_t *keys; /* 0 = empty slot */
	void **vals;
	size_t cap;	/* power of two, or 0 */
	size_t len;
};

void tpu_hmap_init(struct tpu_hmap *m);
/* Frees the table (not the values). */
void tpu_hmap_done(struct tpu_hmap *m);
/* Returns borrowed value or NULL. */
void *tpu_hmap_get(const struct tpu_hmap *m, uint64_t key);
/* Inserts @key (non-zero, absent). Return: 0, -EEXIST, -EINVAL for key 0, -ENOMEM. */
int tpu_hmap_put(struct tpu_hmap *m, uint64_t key, void *val);
/* Removes @key. Returns the value it had, or NULL. */
void *tpu_hmap_del(struct tpu_hmap *m, uint64_t key);

/* Iteration: for (size_t i = 0; tpu_hmap_next(m, &i, &k, &v);) — do not modify while iterating. */
int tpu_hmap_next(const struct tpu_hmap *m, size_t *iter, uint64_t *ret_key, void **ret_val);

#endif
