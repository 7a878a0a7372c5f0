/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Per-uid and daemon-wide accounting of sessions and of the bytes the daemon holds for them,
 * and rate-limited logging. See quota.h.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "config.h"
#include "quota.h"

bool tpd_quota_ratelog_ok(struct tpd_ratelog *rl, uint64_t interval_ms, unsigned *ret_suppressed)
{
	uint64_t now = tpu_now_ns();

	if (now < rl->next_ns) {
		rl->suppressed++;
		return false;
	}
	rl->next_ns = now + interval_ms * 1000000ull;
	*ret_suppressed = rl->suppressed;
	rl->suppressed = 0;
	return true;
}

bool tpd_quota_ratelog_burst_ok(struct tpd_ratelog *rl, uint64_t window_ms, unsigned burst,
				unsigned *ret_suppressed)
{
	uint64_t now = tpu_now_ns();

	if (now >= rl->next_ns) {
		rl->next_ns = now + window_ms * 1000000ull;
		rl->logged = 0;
	}
	if (rl->logged >= burst) {
		rl->suppressed++;
		return false;
	}
	rl->logged++;
	*ret_suppressed = rl->suppressed;
	rl->suppressed = 0;
	return true;
}

bool tpd_quota_ratelog_shared_ok(struct tpd_ratelog *own, unsigned own_burst,
				 struct tpd_ratelog *all, unsigned all_burst, uint64_t window_ms,
				 unsigned *ret_suppressed)
{
	uint64_t now = tpu_now_ns();

	if (now >= own->next_ns) {
		own->next_ns = now + window_ms * 1000000ull;
		own->logged = 0;
	}
	if (now >= all->next_ns) {
		all->next_ns = now + window_ms * 1000000ull;
		all->logged = 0;
	}
	if (own->logged >= own_burst || all->logged >= all_burst) {
		own->suppressed++;
		all->suppressed++;
		return false;
	}
	own->logged++;
	all->logged++;
	*ret_suppressed = own->suppressed;
	own->suppressed = 0;
	return true;
}

bool tpd_quota_ratelog_key_ok(struct tpd_ratelog_keys *t, const char *key, size_t key_len,
			      unsigned key_burst, unsigned all_burst, uint64_t window_ms,
			      unsigned *ret_suppressed)
{
	char k[TPD_RATELOG_KEY_LEN];
	unsigned i, lru = 0;

	snprintf(k, sizeof(k), "-%.*s", (int)TPU_MIN(key_len, sizeof(k) - 2), key);
	for (i = 0; i < TPD_RATELOG_KEYS; i++) {
		if (strcmp(t->e[i].key, k) == 0)
			break;
		if (!t->e[i].key[0] || (t->e[lru].key[0] && t->e[i].used_ns < t->e[lru].used_ns))
			lru = i;
	}
	if (i == TPD_RATELOG_KEYS) {
		i = lru;
		memcpy(t->e[i].key, k, sizeof(k));
		t->e[i].rl = (struct tpd_ratelog){ 0 };
	}
	t->e[i].used_ns = tpu_now_ns();
	return tpd_quota_ratelog_shared_ok(&t->e[i].rl, key_burst, &t->all, all_burst, window_ms,
					   ret_suppressed);
}

bool tpd_quota_ratelog_uid_ok(struct tpd_ratelog_keys *t, uid_t uid, unsigned uid_burst,
			      unsigned all_burst, uint64_t window_ms, unsigned *ret_suppressed)
{
	char k[16];
	int n = snprintf(k, sizeof(k), "%u", (unsigned)uid);

	return tpd_quota_ratelog_key_ok(t, k, (size_t)n, uid_burst, all_burst, window_ms,
					ret_suppressed);
}

void tpd_quota_init(struct tpd_quota *q)
{
	*q = (struct tpd_quota){ 0 };
	tpu_hmap_init(&q->uids);
}

void tpd_quota_done(struct tpd_quota *q)
{
	size_t i = 0;
	uint64_t key;
	void *val;

	while (tpu_hmap_next(&q->uids, &i, &key, &val))
		free(val);
	tpu_hmap_done(&q->uids);
}

bool tpd_quota_is_admin(const struct tpd_config *cfg, uid_t uid, gid_t gid, const gid_t *groups,
			size_t n_groups)
{
	gid_t g = (gid_t)cfg->admin_gid;

	if (uid == 0)
		return true;
	if (!g)
		return false;
	if (gid == g)
		return true;
	for (size_t i = 0; i < n_groups; i++)
		if (groups[i] == g)
			return true;
	return false;
}

static struct tpd_uid_acct *acct_get(struct tpd_quota *q, uid_t uid)
{
	struct tpd_uid_acct *a = tpu_hmap_get(&q->uids, (uint64_t)uid + 1);

	if (a)
		return a;
	a = calloc(1, sizeof(*a));
	if (!a)
		return NULL;
	a->uid = uid;
	if (tpu_hmap_put(&q->uids, (uint64_t)uid + 1, a) < 0) {
		free(a);
		return NULL;
	}
	return a;
}

int tpd_quota_admit(struct tpd_quota *q, const struct tpd_config *cfg, uid_t uid, bool admin,
		    unsigned n_others, struct tpd_uid_acct **ret, char *why, size_t wl)
{
	uint32_t open = cfg->sessions_max > cfg->sessions_reserved
				? cfg->sessions_max - cfg->sessions_reserved
				: 0;
	struct tpd_uid_acct *a;

	if (n_others >= cfg->sessions_max) {
		snprintf(why, wl, "session limit of %u reached (tpipd --sessions-max)",
			 cfg->sessions_max);
		goto refuse;
	}
	if (!admin && n_others >= open) {
		snprintf(why, wl, "session limit reached: the last %u of %u sessions are kept "
			 "for root and the admin group (tpipd --sessions-max, --sessions-reserved)",
			 cfg->sessions_reserved, cfg->sessions_max);
		goto refuse;
	}
	a = acct_get(q, uid);
	if (!a) {
		snprintf(why, wl, "out of memory");
		return -ENOMEM;
	}
	if (uid != 0 && a->sessions >= cfg->sessions_per_uid) {
		snprintf(why, wl, "session limit of %u per uid reached for uid %u (tpipd "
			 "--sessions-per-uid)",
			 cfg->sessions_per_uid, (unsigned)uid);
		if (!a->sessions)
			tpd_quota_leave(q, a);
		goto refuse;
	}
	a->sessions++;
	*ret = a;
	return 0;
refuse:
	q->refused++;
	return -ENOBUFS;
}

void tpd_quota_leave(struct tpd_quota *q, struct tpd_uid_acct *a)
{
	if (!a)
		return;
	if (a->sessions)
		a->sessions--;
	if (a->sessions || a->in_bytes || a->out_bytes || a->buffer_bytes || a->waits ||
	    atomic_load(&a->kept_fds))
		return; /* (an account whose last kept fd closes later waits for its uid or the end) */
	tpu_hmap_del(&q->uids, (uint64_t)a->uid + 1);
	free(a);
}

/* Checks @bytes more against one per-uid and one daemon-wide budget. */
static int charge(struct tpd_uid_acct *a, uint64_t *uid_bytes, uint64_t *all_bytes,
		  uint64_t bytes, uint64_t uid_max, uint64_t all_max, const char *what, char *why,
		  size_t wl)
{
	if (a->uid != 0 && *uid_bytes + bytes > uid_max) {
		snprintf(why, wl, "%s of uid %u would exceed %llu bytes (per-uid limit)", what,
			 (unsigned)a->uid, (unsigned long long)uid_max);
		return -EDQUOT;
	}
	if (*all_bytes + bytes > all_max) {
		snprintf(why, wl, "%s of all clients would exceed %llu bytes (daemon-wide limit)",
			 what, (unsigned long long)all_max);
		return -ENOBUFS;
	}
	*uid_bytes += bytes;
	*all_bytes += bytes;
	return 0;
}

int tpd_quota_charge_in(struct tpd_quota *q, const struct tpd_config *cfg, struct tpd_uid_acct *a,
			uint64_t bytes, char *why, size_t wl)
{
	return charge(a, &a->in_bytes, &q->in_bytes, bytes, cfg->input_bytes_per_uid,
		      cfg->input_bytes_max, "partial frames held", why, wl);
}

int tpd_quota_charge_out(struct tpd_quota *q, const struct tpd_config *cfg,
			 struct tpd_uid_acct *a, uint64_t bytes, char *why, size_t wl)
{
	return charge(a, &a->out_bytes, &q->out_bytes, bytes, cfg->outq_per_uid,
		      cfg->outq_total, "frames queued", why, wl);
}

void tpd_quota_release_in(struct tpd_quota *q, struct tpd_uid_acct *a, uint64_t bytes)
{
	a->in_bytes -= bytes;
	q->in_bytes -= bytes;
}

void tpd_quota_release_out(struct tpd_quota *q, struct tpd_uid_acct *a, uint64_t bytes)
{
	a->out_bytes -= bytes;
	q->out_bytes -= bytes;
}

int tpd_quota_charge_fd(struct tpd_quota *q, const struct tpd_config *cfg, struct tpd_uid_acct *a,
			char *why, size_t wl)
{
	/* Only the loop thread raises the counters: a check then an add cannot overshoot. */
	unsigned mine = atomic_load(&a->kept_fds), all = atomic_load(&q->kept_fds);

	if (a->uid != 0 && mine >= cfg->kept_fds_per_uid) {
		snprintf(why, wl, "uid %u has %u fds kept, the limit per uid (tpipd --kept-fds-per-uid "
			 "%u)", (unsigned)a->uid, mine, cfg->kept_fds_per_uid);
		q->kept_fds_refused++;
		return -EMFILE;
	}
	if (all >= cfg->kept_fds_cap) {
		snprintf(why, wl, "the daemon keeps %u fds for clients, its limit (tpipd "
			 "--kept-fds-max%s %u)", all, cfg->kept_fds_max ? "" : ", derived:",
			 cfg->kept_fds_cap);
		q->kept_fds_refused++;
		return -ENFILE;
	}
	atomic_fetch_add(&a->kept_fds, 1);
	atomic_fetch_add(&q->kept_fds, 1);
	return 0;
}

int tpd_quota_charge_parked_fd(struct tpd_quota *q, const struct tpd_config *cfg,
			       struct tpd_uid_acct *a, char *why, size_t wl)
{
	unsigned mine = atomic_load(&a->kept_fds), all = atomic_load(&q->kept_fds);
	int r = 0;

	if (a->uid != 0 && mine >= cfg->kept_fds_per_uid + TPD_QUOTA_FDS_IN_FLIGHT) {
		snprintf(why, wl, "uid %u holds %u fds in the daemon, its limit (tpipd "
			 "--kept-fds-per-uid %u, and %u in flight)", (unsigned)a->uid, mine,
			 cfg->kept_fds_per_uid, TPD_QUOTA_FDS_IN_FLIGHT);
		r = -EMFILE;
	} else if (all >= cfg->kept_fds_cap + TPD_QUOTA_FDS_IN_FLIGHT) {
		snprintf(why, wl, "the daemon holds %u fds for clients, its limit (tpipd "
			 "--kept-fds-max%s %u, and %u in flight)", all,
			 cfg->kept_fds_max ? "" : ", derived:", cfg->kept_fds_cap,
			 TPD_QUOTA_FDS_IN_FLIGHT);
		r = -ENFILE;
	}
	if (r < 0) {
		q->kept_fds_refused++;
		q->parked_fds_refused++;
		return r;
	}
	atomic_fetch_add(&a->kept_fds, 1);
	atomic_fetch_add(&q->kept_fds, 1);
	return 0;
}

void tpd_quota_release_fd(struct tpd_quota *q, struct tpd_uid_acct *a)
{
	atomic_fetch_sub(&a->kept_fds, 1);
	atomic_fetch_sub(&q->kept_fds, 1);
}

int tpd_quota_charge_wait(const struct tpd_config *cfg, struct tpd_uid_acct *a, char *why,
			  size_t wl)
{
	if (a->uid != 0 && a->waits >= cfg->waits_per_uid) {
		snprintf(why, wl, "uid %u has %u channel and work queue calls waiting, the limit "
			 "per uid (tpipd --waits-per-uid)", (unsigned)a->uid, a->waits);
		return -ENOBUFS;
	}
	a->waits++;
	return 0;
}

void tpd_quota_release_wait(struct tpd_uid_acct *a)
{
	a->waits--;
}
