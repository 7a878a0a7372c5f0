/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Open-addressing u64 -> pointer map. See hmap.h.
 */
#include <errno.h>
#include <stdlib.h>
#include "hmap.h"

static size_t slot_of(uint64_t key, size_t cap)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return (size_t)key & (cap - 1);
}

void tpu_hmap_init(struct tpu_hmap *m)
{
	m->keys = NULL;
	m->vals = NULL;
	m->cap = 0;
	m->len = 0;
}

void tpu_hmap_done(struct tpu_hmap *m)
{
	free(m->keys);
	free(m->vals);
	tpu_hmap_init(m);
}

static size_t find(const struct tpu_hmap *m, uint64_t key)
{
	size_t i = slot_of(key, m->cap);

	while (m->keys[i] && m->keys[i] != key)
		i = (i + 1) & (m->cap - 1);
	return i;
}

void *tpu_hmap_get(const struct tpu_hmap *m, uint64_t key)
{
	size_t i;

	if (!m->cap || !key)
		return NULL;
	i = find(m, key);
	return m->keys[i] ? m->vals[i] : NULL;
}

static int grow(struct tpu_hmap *m)
{
	struct tpu_hmap n = { .cap = m->cap ? m->cap * 2 : 16 };

	n.keys = calloc(n.cap, sizeof(*n.keys));
	n.vals = calloc(n.cap, sizeof(*n.vals));
	if (!n.keys || !n.vals) {
		free(n.keys);
		free(n.vals);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->cap; i++) {
		if (m->keys[i]) {
			size_t j = find(&n, m->keys[i]);
			n.keys[j] = m->keys[i];
			n.vals[j] = m->vals[i];
			n.len++;
		}
	}
	free(m->keys);
	free(m->vals);
	*m = n;
	return 0;
}

int tpu_hmap_put(struct tpu_hmap *m, uint64_t key, void *val)
{
	size_t i;

	if (!key)
		return -EINVAL;
	if ((m->len + 1) * 4 > m->cap * 3) {
		int r = grow(m);
		if (r < 0)
			return r;
	}
	i = find(m, key);
	if (m->keys[i])
		return -EEXIST;
	m->keys[i] = key;
	m->vals[i] = val;
	m->len++;
	return 0;
}

void *tpu_hmap_del(struct tpu_hmap *m, uint64_t key)
{
	size_t i, j;
	void *val;

	if (!m->cap || !key)
		return NULL;
	i = find(m, key);
	if (!m->keys[i])
		return NULL;
	val = m->vals[i];
	m->keys[i] = 0;
	m->len--;
	/* Backward-shift: move later entries of the probe run into the hole. */
	for (j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
		size_t home = slot_of(m->keys[j], m->cap);
		if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			m->keys[j] = 0;
			i = j;
		}
	}
	return val;
}

int tpu_hmap_next(const struct tpu_hmap *m, size_t *iter, uint64_t *ret_key, void **ret_val)
{
	for (size_t i = *iter; i < m->cap; i++) {
		if (m->keys[i]) {
			*ret_key = m->keys[i];
			*ret_val = m->vals[i];
			*iter = i + 1;
			return 1;
		}
	}
	return 0;
}
