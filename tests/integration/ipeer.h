/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Peer-link views for the cross-host suites: run `tpipctl peers` (table or --json) against a
 * test daemon and read the first link's fields back with json-c. Runs in the test process (it
 * asserts with Check); needs $TPIPCTL_BIN.
 */
#ifndef TPT_IPEER_H
#define TPT_IPEER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "tpt.h"

/* One row of `tpipctl --json peers`. */
struct tpt_link {
	char state[32], address[128], last_error[256];
	char rdma[200]; /* "ready: ...", "off: ...", "connecting", "" (no RDMA on the link) */
	bool outgoing, authenticated;
	long data_conns, pipes;
	uint64_t bytes_sent, bytes_received;
	uint64_t rdma_bytes_sent, rdma_bytes_received;
};

/*
 * tpt_ctl() - run `$TPIPCTL_BIN --socket S [--json] CMD`; the test fails unless it exits 0.
 * Return: owned stdout, free() it.
 */
char *tpt_ctl(const struct tpt_daemon *d, const char *cmd, bool json);

/* tpt_ctl(@d, "peers", @json). */
char *tpt_ctl_peers(const struct tpt_daemon *d, bool json);

/*
 * tpt_peer_links() - the links of @d from `tpipctl --json peers` (the test fails on bad JSON).
 * @ret: the first link's fields (zeroed when there is none).
 * Return: the number of links.
 */
int tpt_peer_links(const struct tpt_daemon *d, struct tpt_link *ret);

/*
 * tpt_ctl_lists() - does `tpipctl --json @what` of @d ("channels", "queues") list @name, with
 * @field (text such as "\"uid\": 4242"; NULL: any) in that row?
 */
bool tpt_ctl_lists(const struct tpt_daemon *d, const char *what, const char *name,
		   const char *field);

/* tpip:// address of @name on @d (tpt_peer_address()), in one of 4 buffers used in turn. */
const char *tpt_peer_at(const struct tpt_daemon *d, const char *name);

/* Bytes `tpipctl --json stats` of @d counts under channel @name (0 if it is not listed). */
uint64_t tpt_channel_bytes(const struct tpt_daemon *d, const char *name);

/* The numbers @keys[0..@n) of one `tpipctl --json status` of @d into @ret (the test fails if
 * one is missing). */
void tpt_status_u64s(const struct tpt_daemon *d, const char *const *keys, size_t n,
		     uint64_t *ret);

/* Polls tpt_peer_links() until @d has no link, for up to @timeout_ms. Return: true if none. */
bool tpt_peer_links_gone(const struct tpt_daemon *d, int timeout_ms);

/*
 * tpt_peer_cross_works() - does a client of @from still reach listener @name of @to? Two
 * messages (a 100-byte payload and a tensor of 1 MiB + i, private memory into a shared buffer)
 * on pipe @pipe, within @timeout_ms. Return: true if both arrived intact.
 */
bool tpt_peer_cross_works(const struct tpt_daemon *from, const struct tpt_daemon *to,
			  const char *name, unsigned pipe, int timeout_ms);

#endif
