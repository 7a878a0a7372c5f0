/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * tpd_quota: what one local user may hold in the daemon, and what all of them together may. It
 * admits sessions (a per-uid quota, and the last slots of sessions-max kept for root and the
 * admin group so that one user filling the table never locks out root's tpipctl) and accounts
 * the bytes the daemon holds on behalf of sessions (partial frames in input buffers, frames
 * queued towards clients) per uid and daemon-wide. It also rate-limits the log lines an attacker
 * could trigger at will. It does not decide what a session does once refused (session.c).
 * Everything here runs on the loop thread.
 */
#ifndef TPD_QUOTA_H
#define TPD_QUOTA_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "hmap.h"

struct tpd_config;

/* At most one log line per interval (or a burst per window); counts the lines held back. */
struct tpd_ratelog {
	uint64_t next_ns;
	unsigned suppressed;
	unsigned logged; /* tpd_quota_ratelog_burst_ok(): lines logged in the current window */
};

/*
 * tpd_quota_ratelog_ok() - may a line be logged now? At most one per @interval_ms.
 * @ret_suppressed: lines refused since the last one that was allowed (written when true).
 * Return: true to log.
 */
bool tpd_quota_ratelog_ok(struct tpd_ratelog *rl, uint64_t interval_ms, unsigned *ret_suppressed);

/*
 * tpd_quota_ratelog_shared_ok() - may a line of one source be logged now, where every source has
 * its own budget @own (at most @own_burst lines in each @window_ms) and all of them together
 * share @all (at most @all_burst lines in each window)? A source over its own budget spends
 * none of the shared one, so one source's flood cannot hide another source's lines, and many
 * sources together still cannot flood the log.
 * @ret_suppressed: the source's lines refused since its last allowed one (written when true).
 * Return: true to log.
 */
bool tpd_quota_ratelog_shared_ok(struct tpd_ratelog *own, unsigned own_burst,
				 struct tpd_ratelog *all, unsigned all_burst, uint64_t window_ms,
				 unsigned *ret_suppressed);

/* Budgets of log lines of one kind by name (a uid, a source address, a peer's principal): each
 * name's, and all names' together, for the TPD_RATELOG_KEYS names logged most recently (the
 * least recently used taken over). Zeroed is empty. */
#define TPD_RATELOG_KEYS 64
#define TPD_RATELOG_KEY_LEN 224
struct tpd_ratelog_keys {
	struct tpd_ratelog all;
	struct {
		char key[TPD_RATELOG_KEY_LEN]; /* "" unused */
		uint64_t used_ns;
		struct tpd_ratelog rl;
	} e[TPD_RATELOG_KEYS];
};

/*
 * tpd_quota_ratelog_key_ok() - tpd_quota_ratelog_shared_ok() with the budget of the name in the
 * first @key_len bytes of @key (at most TPD_RATELOG_KEY_LEN - 2 count; an empty name is one name
 * of its own) in @t, at most @key_burst lines in each @window_ms, and all names' (@all_burst):
 * what one source provokes at will neither fills the log nor hides another source's lines.
 * @ret_suppressed: that name's lines refused since its last one (written when true).
 * Return: true to log.
 */
bool tpd_quota_ratelog_key_ok(struct tpd_ratelog_keys *t, const char *key, size_t key_len,
			      unsigned key_burst, unsigned all_burst, uint64_t window_ms,
			      unsigned *ret_suppressed);

/* tpd_quota_ratelog_key_ok() with @uid as the name. */
bool tpd_quota_ratelog_uid_ok(struct tpd_ratelog_keys *t, uid_t uid, unsigned uid_burst,
			      unsigned all_burst, uint64_t window_ms, unsigned *ret_suppressed);

/*
 * tpd_quota_ratelog_burst_ok() - may a line be logged now? At most @burst per window of @window_ms,
 * so that a few events in a row are all seen while a flood is not. The first line of a new
 * window learns how many were held back in the windows before.
 * @ret_suppressed: lines refused since the last one that was allowed (written when true).
 * Return: true to log.
 */
bool tpd_quota_ratelog_burst_ok(struct tpd_ratelog *rl, uint64_t window_ms, unsigned burst,
				unsigned *ret_suppressed);

/* One local user's share. */
struct tpd_uid_acct {
	uid_t uid;
	unsigned sessions;
	uint64_t in_bytes;  /* input buffer bytes beyond each session's base buffer */
	uint64_t out_bytes; /* frames queued towards this user's sessions */
	uint64_t buffer_bytes; /* shared buffers its sessions registered (sessmsg.c) */
	/* Clients' fds kept for it (tpd_quota_charge_fd()); lowered by whichever thread closes
	 * one. The account outlives its last session while any is kept. */
	atomic_uint kept_fds;
	/* Channel and work queue calls of its sessions waiting in the daemon (tpd_quota_charge_wait()) */
	uint32_t waits;
};

struct tpd_quota {
	struct tpu_hmap uids; /* uid + 1 -> struct tpd_uid_acct */
	uint64_t in_bytes;    /* sums over every uid */
	uint64_t out_bytes;
	uint64_t refused;     /* sessions refused by a quota, since start */
	uint64_t remote_refused; /* peer daemons' messages refused by pipe queue limits */
	uint64_t pipe_bytes;  /* held for unread messages of every pipe: tpd_msg_cost() */
	uint64_t pipe_reserved; /* set aside for pipes resuming after a wait (broker/budget.c) */
	uint64_t pipe_bytes_peak; /* highest pipe_bytes + pipe_reserved since start */
	uint64_t budget_waits; /* writes that started a wait for the budget, since start */
	atomic_uint kept_fds;  /* clients' fds kept, every uid (tpd_quota_charge_fd()) */
	uint64_t kept_fds_refused; /* kept fds refused by kept-fds-per-uid or -max, since start */
	uint64_t parked_fds_refused; /* of those, parked fds (tpd_quota_charge_parked_fd()) */
	/* Lines a client can provoke at will, each uid within a budget of its own
	 * (tpd_quota_ratelog_uid_ok()): */
	struct tpd_ratelog_keys kept_fds_log;
	struct tpd_ratelog_keys parked_fds_log; /* sessions failed for their parked fds */
	struct tpd_ratelog_keys refuse_log;
	struct tpd_ratelog_keys budget_log[2]; /* [0] per-uid, [1] daemon-wide budget hit */
	/* Every line about a session (tpd_session_log()), each uid within a budget of its own
	 * (TPD_SESSION_LOG_*): the lines a client provokes at will that no narrower budget
	 * covers (connects to missing names, listens, refused writes and reads, attaches). */
	struct tpd_ratelog_keys session_log;
};

/* What tpd_session_log() allows: lines about one uid's sessions in each window, about every
 * uid's; lines of level err and above are always logged. Far above what a busy job logs
 * (a line or two for each pipe it opens), far below what a loop of refused calls makes. */
#define TPD_SESSION_LOG_WINDOW_MS 10000
#define TPD_SESSION_LOG_BURST 2000
#define TPD_SESSION_LOG_ALL_BURST 8000

void tpd_quota_init(struct tpd_quota *q);
/* Frees every account. */
void tpd_quota_done(struct tpd_quota *q);

/* True for root and members (primary or supplementary @groups) of the admin group of @cfg.
 * Borrows @cfg and @groups. */
bool tpd_quota_is_admin(const struct tpd_config *cfg, uid_t uid, gid_t gid, const gid_t *groups,
			size_t n_groups);

/*
 * tpd_quota_admit() - may a new session of @uid attach? @n_others: sessions attached besides it.
 * Checks sessions-max, the slots reserved for admins (@admin) and sessions-per-uid (root is
 * exempt from the per-uid quota) of @cfg against @q's accounts. Borrows @q and @cfg.
 * @ret: returns borrowed account, valid until the matching tpd_quota_leave().
 * Return: 0, or -ENOBUFS with the reason in @why (the caller logs, rate-limited).
 */
int tpd_quota_admit(struct tpd_quota *q, const struct tpd_config *cfg, uid_t uid, bool admin,
		    unsigned n_others, struct tpd_uid_acct **ret, char *why, size_t wl);

/* A session of @a ended: its bytes must have been released. Frees @a with its last session.
 * Borrows @q; takes @a with its last session. Accepts a NULL @a. */
void tpd_quota_leave(struct tpd_quota *q, struct tpd_uid_acct *a);

/*
 * tpd_quota_charge_in() / tpd_quota_charge_out() - account @bytes more held for a session of
 * @a: input buffer growth, or output queued. Checks the per-uid and daemon-wide budgets of
 * @cfg; @q holds the daemon-wide totals. Borrows @q, @cfg and @a.
 * Return: 0 (charged), or with the reason in @why (nothing charged) -EDQUOT over the per-uid
 * budget, -ENOBUFS over the daemon-wide one.
 */
int tpd_quota_charge_in(struct tpd_quota *q, const struct tpd_config *cfg, struct tpd_uid_acct *a,
			uint64_t bytes, char *why, size_t wl);
int tpd_quota_charge_out(struct tpd_quota *q, const struct tpd_config *cfg,
			 struct tpd_uid_acct *a, uint64_t bytes, char *why, size_t wl);

/* Releases @bytes charged before to @a and @q's totals. Borrows @q and @a. */
void tpd_quota_release_in(struct tpd_quota *q, struct tpd_uid_acct *a, uint64_t bytes);
void tpd_quota_release_out(struct tpd_quota *q, struct tpd_uid_acct *a, uint64_t bytes);

/*
 * tpd_quota_charge_fd() - may the daemon keep one more fd a client of @a handed over (a
 * channel buffer's for its readers, a CUDA dma-buf)? Checks kept-fds-per-uid (root is exempt)
 * and the daemon-wide kept_fds_cap of @cfg, and counts it in @a and @q. Loop thread only; the
 * fd's holder lowers both counters when it closes the fd (tpd_quota_release_fd(), or through
 * the counters' addresses from any thread). Borrows @q, @cfg and @a.
 * Return: 0 (charged), or with the reason in @why (nothing charged) -EMFILE over the per-uid
 * limit, -ENFILE over the daemon-wide one.
 */
int tpd_quota_charge_fd(struct tpd_quota *q, const struct tpd_config *cfg, struct tpd_uid_acct *a,
			char *why, size_t wl);

/* Releases one fd charged before to @a and @q. Thread safe. Borrows @q and @a. */
void tpd_quota_release_fd(struct tpd_quota *q, struct tpd_uid_acct *a);

/*
 * Room for fds in flight above the kept-fds limits: a uid at kept-fds-per-uid may still hand
 * over (or be handed) one session's worth of fds (16 received ahead of their frames, 8 queued
 * towards it), and all of them together may hold this many beyond kept_fds_cap, which
 * tpd_config_fd_reserve() sets aside.
 */
#define TPD_QUOTA_FDS_IN_FLIGHT 24

/*
 * tpd_quota_charge_parked_fd() - may the daemon hold one more fd for a session of @a outside
 * its handlers: an fd a client sent ahead of the frame that announces it (still in the
 * session's fd queue when a read of it ends), or a duplicate queued towards a client that does
 * not read its socket? Charged like a kept fd, to the same counters, but checked against
 * kept-fds-per-uid (root is exempt) and kept_fds_cap plus TPD_QUOTA_FDS_IN_FLIGHT, so that a
 * uid at its limit still passes the fds a frame carries. The holder releases it with
 * tpd_quota_release_fd() once the fd is closed or claimed by its frame (a handler that then
 * keeps it charges it again with tpd_quota_charge_fd()). Loop thread only. Borrows @q, @cfg
 * and @a.
 * Return: as tpd_quota_charge_fd().
 */
int tpd_quota_charge_parked_fd(struct tpd_quota *q, const struct tpd_config *cfg,
			       struct tpd_uid_acct *a, char *why, size_t wl);

/*
 * tpd_quota_charge_wait() - may one more call of @a's uid wait in the daemon (a channel read or
 * write waiting for an item or room, a work queue take, answer read or drain)? Checks
 * waits-per-uid (root is exempt); each wait holds a little memory and a timer, and a uid's
 * sessions could otherwise hold 64 a handle, 1024 handles a session. Loop thread only.
 * Borrows @a. Return: 0 (charged: tpd_quota_release_wait() when the wait ends) or -ENOBUFS
 * with @why set.
 */
int tpd_quota_charge_wait(const struct tpd_config *cfg, struct tpd_uid_acct *a, char *why,
			  size_t wl);
/* tpd_quota_release_wait() - a wait charged by tpd_quota_charge_wait() ended. Borrows @a. */
void tpd_quota_release_wait(struct tpd_uid_acct *a);

#endif
