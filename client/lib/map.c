/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * A small hash map from nonzero uint64 ids to pointers (linear probing, backward-shift
 * deletion), for the pipe and request tables of a context. It does no locking.
 */
#include <stdlib.h>
#include "internal.h"

#define MAP_MIN_CAP 16

static size_t map_slot(uint64_t key, size_t cap)
{
	key ^= key >> 33;
	key *= 0xff51afd7ed558ccdull;
	key ^= key >> 33;
	return key & (cap - 1);
}

static int map_grow(struct tpc_map *m)
{
	size_t cap = m->cap ? m->cap * 2 : MAP_MIN_CAP;
	uint64_t *keys = calloc(cap, sizeof(*keys));
	void **vals = calloc(cap, sizeof(*vals));

	if (!keys || !vals) {
		free(keys);
		free(vals);
		return -ENOMEM;
	}
	for (size_t i = 0; i < m->cap; i++) {
		size_t j;

		if (!m->keys[i])
			continue;
		for (j = map_slot(m->keys[i], cap); keys[j]; j = (j + 1) & (cap - 1))
			;
		keys[j] = m->keys[i];
		vals[j] = m->vals[i];
	}
	free(m->keys);
	free(m->vals);
	m->keys = keys;
	m->vals = vals;
	m->cap = cap;
	return 0;
}

int tpc_map_put(struct tpc_map *m, uint64_t key, void *val)
{
	size_t i;

	if ((m->n + 1) * 4 > m->cap * 3) {
		int r = map_grow(m);
		if (r < 0)
			return r;
	}
	for (i = map_slot(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == key)
			return -EEXIST;
	m->keys[i] = key;
	m->vals[i] = val;
	m->n++;
	return 0;
}

static size_t map_find(const struct tpc_map *m, uint64_t key)
{
	if (!m->cap || !key)
		return SIZE_MAX;
	for (size_t i = map_slot(key, m->cap); m->keys[i]; i = (i + 1) & (m->cap - 1))
		if (m->keys[i] == key)
			return i;
	return SIZE_MAX;
}

void *tpc_map_get(const struct tpc_map *m, uint64_t key)
{
	size_t i = map_find(m, key);

	return i == SIZE_MAX ? NULL : m->vals[i];
}

void *tpc_map_del(struct tpc_map *m, uint64_t key)
{
	size_t i = map_find(m, key), j, mask = m->cap - 1;
	void *val;

	if (i == SIZE_MAX)
		return NULL;
	val = m->vals[i];
	/* Backward shift: move later entries of the probe chain into the hole. */
	for (j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
		size_t home = map_slot(m->keys[j], m->cap);

		if (((j - home) & mask) >= ((j - i) & mask)) {
			m->keys[i] = m->keys[j];
			m->vals[i] = m->vals[j];
			i = j;
		}
	}
	m->keys[i] = 0;
	m->vals[i] = NULL;
	m->n--;
	return val;
}

void tpc_map_drain(struct tpc_map *m, void (*fn)(void *val, void *arg), void *arg)
{
	size_t cap = m->cap;
	uint64_t *keys = m->keys;
	void **vals = m->vals;

	*m = (struct tpc_map){ 0 };
	for (size_t i = 0; i < cap; i++)
		if (keys[i])
			fn(vals[i], arg);
	free(keys);
	free(vals);
}

void tpc_map_done(struct tpc_map *m)
{
	free(m->keys);
	free(m->vals);
	*m = (struct tpc_map){ 0 };
}
