/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The daemon-wide table of client CUDA IPC handles (memory and events) and the per-session
 * holds on them. A handle is mapped at most once per daemon whatever the number of sessions or
 * messages using it (a driver opening one handle again in a process returns the same pointer and
 * counts the opens; older ones refuse), stays mapped while a session holds it or a copy runs on
 * it, and is closed with its last reference (so each open has its one close). Lookups
 * compare the whole 64-byte handle; tables are small (bounded holds per session), so lists do.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "../base/buffer.h"
#include "cuda_int.h"

int tpb_cuda_viable(char *why, size_t why_len)
{
	return tpb_cuda_available(why, why_len);
}

static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static struct tpu_list table = { &table, &table };
static unsigned n_alive;

/* 0 if @m is the allocation a client describes as @bus_id, @size; else -EINVAL with @why. */
static int map_check(const struct tpb_cuda_map *m, const char *bus_id, uint64_t size, char *why,
		     size_t why_len)
{
	if (strcmp(m->bus_id, bus_id ? bus_id : "") == 0 && m->size == size)
		return 0;
	snprintf(why, why_len, "CUDA handle already known on device %s with %llu bytes", m->bus_id,
		 (unsigned long long)m->size);
	return -EINVAL;
}

static struct tpb_cuda_map *table_find(const uint8_t *handle, bool event)
{
	struct tpb_cuda_map *m;

	tpu_list_for_each(m, &table, node)
		if (m->event == event && memcmp(m->handle, handle, sizeof(m->handle)) == 0)
			return m;
	return NULL;
}

static struct tpb_cuda_map *map_new(const uint8_t *handle, bool event, const char *bus_id,
				    uint64_t size)
{
	struct tpb_cuda_map *m = calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	memcpy(m->handle, handle, sizeof(m->handle));
	m->event = event;
	snprintf(m->bus_id, sizeof(m->bus_id), "%s", bus_id ? bus_id : "");
	m->size = size;
	m->refs = 1;
	m->dev = -1;
	pthread_mutex_init(&m->open_lock, NULL);
	return m;
}

const char *tpb_cuda_bus_id(const struct tpb_mem *m)
{
	if (!m || m->loc != TPB_LOC_CUDA || !m->cuda || !m->cuda->bus_id[0])
		return NULL;
	return m->cuda->bus_id;
}

int tpb_cuda_map_get(const uint8_t *handle, bool event, const char *bus_id, uint64_t size,
		     struct tpb_cuda_map **ret, char *why, size_t why_len)
{
	struct tpb_cuda_map *m;
	int r = 0;

	pthread_mutex_lock(&table_lock);
	m = table_find(handle, event);
	if (m) {
		r = map_check(m, bus_id, size, why, why_len);
		m->refs += r == 0;
	} else if ((m = map_new(handle, event, bus_id, size))) {
		tpu_list_insert_tail(&table, &m->node);
		n_alive++;
	} else {
		r = -ENOMEM;
	}
	pthread_mutex_unlock(&table_lock);
	if (r == 0)
		*ret = m;
	return r;
}

int tpb_cuda_map_claim_uuid(struct tpb_cuda_map *m, const uint8_t *uuid, char *why,
			    size_t why_len)
{
	int r = 0;

	pthread_mutex_lock(&m->open_lock);
	if (!m->has_uuid && m->state == 0) { /* not opened yet (by bus id) */
		memcpy(m->uuid, uuid, sizeof(m->uuid));
		m->has_uuid = true;
	} else if (m->has_uuid && memcmp(m->uuid, uuid, sizeof(m->uuid)) != 0) {
		snprintf(why, why_len, "CUDA handle already known on another device with bus id %s",
			 m->bus_id);
		r = -EINVAL;
	}
	pthread_mutex_unlock(&m->open_lock);
	return r;
}

struct tpb_cuda_map *tpb_cuda_map_ref(struct tpb_cuda_map *m)
{
	pthread_mutex_lock(&table_lock);
	m->refs++;
	pthread_mutex_unlock(&table_lock);
	return m;
}

/*
 * The last reference to an open mapping usually goes on the event loop (a message or session
 * freed), but closing it is a driver call that may block for long (cuIpcCloseMemHandle,
 * cuEventDestroy of a dead client's event): a closer thread does it, and frees the mapping.
 * The same thread opens the mappings that the loop needs open (tpb_cuda_map_open_bg()).
 */
static pthread_mutex_t closer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t closer_cond = PTHREAD_COND_INITIALIZER;
static struct tpu_list closer_todo = { &closer_todo, &closer_todo };
static bool closer_started;

struct open_req { /* a tpb_cuda_map_open_bg() request */
	struct tpu_list node;
	struct tpb_cuda_map *map; /* a reference */
};
static struct tpu_list opener_todo = { &opener_todo, &opener_todo };

struct unpin_req { /* a tpb_cuda_buffer_unpin() request */
	struct tpu_list node;
	struct tpb_buffer *buf; /* owned: nothing else references it */
};
static struct tpu_list unpin_todo = { &unpin_todo, &unpin_todo };

struct tpb_cuda_idle { /* a tpb_cuda_maps_idle_bg() or _then() request */
	struct tpu_list node;
	unsigned refs; /* closer_lock: the worker's until it ran, the caller's until put */
	bool done;     /* atomic */
	void (*then)(void *arg); /* run by the worker once idle (tpb_cuda_maps_idle_then()) */
	void *arg;
	size_t n;
	struct tpb_cuda_map *maps[]; /* references */
};
static struct tpu_list idle_todo = { &idle_todo, &idle_todo };

/* Drops a reference to @q (closer_lock held); the last frees it. */
static void idle_unref_locked(struct tpb_cuda_idle *q)
{
	if (--q->refs == 0)
		free(q);
}

static void map_free(struct tpb_cuda_map *m)
{
	if (m->state == 1)
		tpb_cuda_map_close(m);
	pthread_mutex_destroy(&m->open_lock);
	free(m);
}

static void *closer_main(void *arg)
{
	pthread_mutex_lock(&closer_lock);
	for (;;) {
		struct tpb_cuda_map *m;

		while (tpu_list_empty(&closer_todo) && tpu_list_empty(&opener_todo) &&
		       tpu_list_empty(&unpin_todo) && tpu_list_empty(&idle_todo))
			pthread_cond_wait(&closer_cond, &closer_lock);
		if (!tpu_list_empty(&idle_todo)) {
			struct tpb_cuda_idle *q = tpu_list_first(&idle_todo, struct tpb_cuda_idle,
								 node);

			tpu_list_remove(&q->node);
			pthread_mutex_unlock(&closer_lock);
			tpb_cuda_maps_idle(q->maps, q->n);
			for (size_t i = 0; i < q->n; i++)
				tpb_cuda_map_unref(q->maps[i]);
			__atomic_store_n(&q->done, true, __ATOMIC_RELEASE);
			if (q->then)
				q->then(q->arg);
			pthread_mutex_lock(&closer_lock);
			idle_unref_locked(q);
			continue;
		}
		if (!tpu_list_empty(&unpin_todo)) {
			struct unpin_req *q = tpu_list_first(&unpin_todo, struct unpin_req, node);

			tpu_list_remove(&q->node);
			pthread_mutex_unlock(&closer_lock);
			tpb_cuda_buffer_unpin_now(q->buf);
			free(q);
			pthread_mutex_lock(&closer_lock);
			continue;
		}
		if (!tpu_list_empty(&opener_todo)) {
			struct open_req *q = tpu_list_first(&opener_todo, struct open_req, node);
			char why[256];

			tpu_list_remove(&q->node);
			pthread_mutex_unlock(&closer_lock);
			tpb_cuda_map_open(q->map, why, sizeof(why)); /* its state says how it went */
			__atomic_store_n(&q->map->open_queued, false, __ATOMIC_RELEASE);
			tpb_cuda_map_unref(q->map);
			free(q);
			pthread_mutex_lock(&closer_lock);
			continue;
		}
		m = tpu_list_first(&closer_todo, struct tpb_cuda_map, node);
		tpu_list_remove(&m->node);
		pthread_mutex_unlock(&closer_lock);
		map_free(m);
		pthread_mutex_lock(&closer_lock);
	}
	return NULL;
}

/* Locked: starts the worker thread once. Return: whether it runs. */
static bool closer_start(void)
{
	pthread_t th;

	if (!closer_started && pthread_create(&th, NULL, closer_main, NULL) == 0) {
		pthread_detach(th);
		closer_started = true;
	}
	return closer_started;
}

void tpb_cuda_map_open_bg(struct tpb_cuda_map *m)
{
	struct open_req *q;
	bool no = false;

	if (!__atomic_compare_exchange_n(&m->open_queued, &no, true, false, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return; /* queued already */
	q = malloc(sizeof(*q));
	pthread_mutex_lock(&closer_lock);
	if (q && closer_start()) {
		q->map = tpb_cuda_map_ref(m);
		tpu_list_insert_tail(&opener_todo, &q->node);
		pthread_cond_signal(&closer_cond);
		q = NULL;
	}
	pthread_mutex_unlock(&closer_lock);
	if (q || !closer_started) { /* no memory or no thread: the caller's next poll retries */
		free(q);
		__atomic_store_n(&m->open_queued, false, __ATOMIC_RELEASE);
	}
}

/* Queues tpb_cuda_maps_idle() of @maps for the worker, then @then(@arg) there; @refs: 2 for a
 * request the caller keeps, 1 for one it does not. Return: the request, or NULL when it ran
 * here (no memory, no worker). */
static struct tpb_cuda_idle *idle_submit(struct tpb_cuda_map *const *maps, size_t n,
					 void (*then)(void *arg), void *arg, unsigned refs)
{
	struct tpb_cuda_idle *q = calloc(1, sizeof(*q) + (n ? n : 1) * sizeof(q->maps[0]));
	bool queued = false;

	if (!q) { /* no memory: here, then (the close may block) */
		tpb_cuda_maps_idle(maps, n);
		if (then)
			then(arg);
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		q->maps[q->n++] = maps[i] ? tpb_cuda_map_ref(maps[i]) : NULL;
	q->refs = refs;
	q->then = then;
	q->arg = arg;
	pthread_mutex_lock(&closer_lock);
	if (closer_start()) {
		tpu_list_insert_tail(&idle_todo, &q->node);
		pthread_cond_signal(&closer_cond);
		queued = true;
	}
	pthread_mutex_unlock(&closer_lock);
	if (!queued) { /* no worker thread: here */
		tpb_cuda_maps_idle(q->maps, q->n);
		for (size_t i = 0; i < q->n; i++)
			tpb_cuda_map_unref(q->maps[i]);
		free(q);
		if (then)
			then(arg);
		return NULL;
	}
	return q;
}

struct tpb_cuda_idle *tpb_cuda_maps_idle_bg(struct tpb_cuda_map *const *maps, size_t n)
{
	return idle_submit(maps, n, NULL, NULL, 2);
}

void tpb_cuda_maps_idle_then(struct tpb_cuda_map *const *maps, size_t n,
			     void (*then)(void *arg), void *arg)
{
	idle_submit(maps, n, then, arg, 1);
}

bool tpb_cuda_idle_done(const struct tpb_cuda_idle *q)
{
	return !q || __atomic_load_n(&q->done, __ATOMIC_ACQUIRE);
}

void tpb_cuda_idle_put(struct tpb_cuda_idle *q)
{
	if (!q)
		return;
	pthread_mutex_lock(&closer_lock);
	idle_unref_locked(q);
	pthread_mutex_unlock(&closer_lock);
}

void tpb_cuda_buffer_unpin(struct tpb_buffer *b)
{
	struct unpin_req *q = malloc(sizeof(*q));

	pthread_mutex_lock(&closer_lock);
	if (q && closer_start()) {
		q->buf = b;
		tpu_list_insert_tail(&unpin_todo, &q->node);
		pthread_cond_signal(&closer_cond);
		q = NULL;
		b = NULL;
	}
	pthread_mutex_unlock(&closer_lock);
	free(q);
	if (b)
		tpb_cuda_buffer_unpin_now(b);
}

/* Hands @m (open, unreferenced) to the closer thread; closes it here if none can start. */
static void closer_push(struct tpb_cuda_map *m)
{
	bool ok;

	pthread_mutex_lock(&closer_lock);
	ok = closer_start();
	if (ok) {
		tpu_list_insert_tail(&closer_todo, &m->node);
		pthread_cond_signal(&closer_cond);
	}
	pthread_mutex_unlock(&closer_lock);
	if (!ok)
		map_free(m);
}

void tpb_cuda_map_unref(struct tpb_cuda_map *m)
{
	bool last;

	if (!m)
		return;
	pthread_mutex_lock(&table_lock);
	last = --m->refs == 0;
	if (last) {
		tpu_list_remove(&m->node);
		n_alive--;
	}
	pthread_mutex_unlock(&table_lock);
	if (!last)
		return;
	if (__atomic_load_n(&m->state, __ATOMIC_RELAXED) == 1)
		closer_push(m); /* off the caller's thread: the close may block */
	else
		map_free(m);
}

unsigned tpb_cuda_map_refs(const struct tpb_cuda_map *m)
{
	unsigned refs;

	pthread_mutex_lock(&table_lock);
	refs = m->refs;
	pthread_mutex_unlock(&table_lock);
	return refs;
}

bool tpb_cuda_map_held(const struct tpb_cuda_map *m)
{
	unsigned holds;

	pthread_mutex_lock(&table_lock);
	holds = m->holds;
	pthread_mutex_unlock(&table_lock);
	return holds > 0;
}

void tpb_cuda_map_count(unsigned *ret_alive, unsigned *ret_open)
{
	struct tpb_cuda_map *m;
	unsigned open = 0;

	pthread_mutex_lock(&table_lock);
	tpu_list_for_each(m, &table, node)
		open += __atomic_load_n(&m->state, __ATOMIC_RELAXED) == 1;
	*ret_alive = n_alive;
	pthread_mutex_unlock(&table_lock);
	*ret_open = open;
}

void tpb_cuda_maps_busy(struct tpb_cuda_map *const *maps, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (!maps[i])
			continue;
		pthread_mutex_lock(&maps[i]->open_lock);
		maps[i]->users++;
		pthread_mutex_unlock(&maps[i]->open_lock);
	}
}

void tpb_cuda_maps_idle(struct tpb_cuda_map *const *maps, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct tpb_cuda_map *m = maps[i];
		unsigned holds;

		if (!m)
			continue;
		pthread_mutex_lock(&table_lock);
		holds = m->holds;
		pthread_mutex_unlock(&table_lock);
		pthread_mutex_lock(&m->open_lock);
		if (m->users)
			m->users--;
		if (!m->users && !holds && m->state == 1) {
			tpb_cuda_map_close(m);
			__atomic_store_n(&m->state, 0, __ATOMIC_RELAXED); /* the next copy reopens */
		}
		pthread_mutex_unlock(&m->open_lock);
	}
}

/* ---- per-session holds ---- */

struct hold {
	struct tpu_list node; /* most recently used first */
	struct tpb_cuda_map *map;
};

struct tpb_cuda_holds {
	struct tpu_list lru;
	unsigned n, max;
};

struct tpb_cuda_holds *tpb_cuda_holds_new(unsigned max)
{
	struct tpb_cuda_holds *h = calloc(1, sizeof(*h));

	if (!h)
		return NULL;
	tpu_list_init(&h->lru);
	h->max = max ? max : 1;
	return h;
}

static void hold_drop(struct tpb_cuda_holds *h, struct hold *e)
{
	tpu_list_remove(&e->node);
	h->n--;
	pthread_mutex_lock(&table_lock);
	e->map->holds--;
	pthread_mutex_unlock(&table_lock);
	tpb_cuda_map_unref(e->map);
	free(e);
}

void tpb_cuda_holds_free(struct tpb_cuda_holds *h)
{
	if (!h)
		return;
	while (!tpu_list_empty(&h->lru))
		hold_drop(h, tpu_list_first(&h->lru, struct hold, node));
	free(h);
}

static struct hold *holds_find(struct tpb_cuda_holds *h, const uint8_t *handle, bool event)
{
	struct hold *e;

	tpu_list_for_each(e, &h->lru, node)
		if (e->map->event == event &&
		    memcmp(e->map->handle, handle, sizeof(e->map->handle)) == 0)
			return e;
	return NULL;
}

int tpb_cuda_hold(struct tpb_cuda_holds *h, const uint8_t *handle, bool event,
		  const char *bus_id, uint64_t size, struct tpb_cuda_map **ret, char *why,
		  size_t why_len)
{
	struct hold *e = holds_find(h, handle, event);
	int r;

	if (e) {
		r = map_check(e->map, bus_id, size, why, why_len);
		if (r < 0)
			return r;
		tpu_list_remove(&e->node); /* to the front */
	} else {
		e = calloc(1, sizeof(*e));
		if (!e)
			return -ENOMEM;
		r = tpb_cuda_map_get(handle, event, bus_id, size, &e->map, why, why_len);
		if (r < 0) {
			free(e);
			return r;
		}
		pthread_mutex_lock(&table_lock);
		e->map->holds++;
		pthread_mutex_unlock(&table_lock);
		h->n++;
	}
	tpu_list_insert_head(&h->lru, &e->node);
	*ret = e->map;
	while (h->n > h->max) /* never the one just used: it is at the head */
		hold_drop(h, tpu_container_of(h->lru.prev, struct hold, node));
	return 0;
}

int tpb_cuda_unhold(struct tpb_cuda_holds *h, const uint8_t *handle)
{
	struct hold *e = holds_find(h, handle, false);

	if (!e)
		return 0;
	hold_drop(h, e);
	return 1;
}

unsigned tpb_cuda_holds_count(const struct tpb_cuda_holds *h)
{
	return h ? h->n : 0;
}
