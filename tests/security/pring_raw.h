/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * The pipe ring security suites' attacker and victim helpers (test_pring.c, test_pringpeer.c):
 * a client speaking the raw protocol on a control ring, with pipe rings, that connects a pipe to
 * the victim's listener and takes the ring fds the daemon sends it; a uid change for a forked
 * child; a friendly pipe of the victim's own uid that must still move a message through a ring.
 * Not here: the attacks themselves, each suite's cases.
 */
#ifndef TPT_PRING_RAW_H
#define TPT_PRING_RAW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include "itest.h"
#include "tpt_wire.h"

#define TPT_PRING_MS TPT_SCALED_MS(20000)

struct tpt_pring_raw {
	struct tpt_raw r;
	struct tpt_raw_ring g;
};

/* Drops every group and takes uid and gid @id; stays dumpable (CMA to it). Return: 0 or -errno. */
int tpt_pring_become(uid_t id);

/* Sends @m on @a's control ring. Borrows @m. Return: 0 or -errno. */
int tpt_pring_raw_send(struct tpt_pring_raw *a, Tpw__V1__ClientMsg *m);

/* Attaches to @socket with pipe rings and a control ring, and connects pipe 1 to listener @name.
 * Return: 0, or -1 (logged). */
int tpt_pring_raw_attach(struct tpt_pring_raw *a, const char *socket, const char *name);

/* The ring fd the daemon sends on the socket (one byte + SCM_RIGHTS) ahead of RingXfer.
 * Return: owned fd, or -errno. */
int tpt_pring_raw_take_fd(struct tpt_pring_raw *a);

/* Sends Write @id on pipe 1 of @len bytes at @addr, one payload, its segment a ring_addr
 * (@ring) or a cma_addr. Return: 0 or -errno. */
int tpt_pring_raw_write(struct tpt_pring_raw *a, uint64_t id, void *addr, size_t len, bool ring);

/* Sends Read of message @msg_id on pipe 1 into @len bytes at @addr (a cma_addr). Return: 0 or
 * -errno. */
int tpt_pring_raw_read(struct tpt_pring_raw *a, uint64_t msg_id, void *addr, size_t len);

/*
 * tpt_pring_friendly_message() - a context of this uid connects to @name (listener @l of @cv),
 * and writes a message of just over 1 MiB of private memory, which @cv reads byte-exact within
 * @timeout_ms. Borrows all. Return: 0, or 1 (logged).
 */
int tpt_pring_friendly_message(struct tpt_daemon *dmn, struct tp_context *cv, struct tp_listener *l,
			       const char *name, int timeout_ms);

#endif
