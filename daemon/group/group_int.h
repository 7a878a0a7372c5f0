/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Private to daemon/group/: the registry's structures, shared by the files of the part; the
 * rest of the daemon uses group.h only.
 */
#ifndef TPD_GROUP_INT_H
#define TPD_GROUP_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "group.h"
#include "tpu.h"
#include "tpw.pb-c.h"

struct tpd_session;

struct member {
	struct tpd_group *grp;
	struct tpd_session *s; /* NULL: free slot, or gone after forming */
	uint64_t req_id;
	pid_t pid;
	bool joined;
	bool ready;
	bool gone; /* formed, then left or died */
	uint32_t gone_why; /* TPU_GRPARENA_DIED or _LEFT */
	struct event *ev_timeout;
};

struct tpd_group {
	struct tpu_list node;
	struct tpd_groups *gs;
	uint64_t id;
	uid_t uid;
	gid_t gid;
	char *name;
	uint32_t size;
	uint32_t joined;
	uint32_t ready;
	uint32_t live; /* formed: members not gone */
	bool formed;
	bool linked; /* the arena file still has its name */
	char path[80];
	struct tpu_grparena_hdr *arena;
	uint64_t bytes; /* arena bytes (reserved from the first join) */
	uint64_t chunk;
	uint64_t created_ns;
	char failure[96]; /* the first member gone, for tpipctl */
	struct member m[];
};

struct tpd_groups {
	struct tpd_daemon *d;
	struct tpu_list list;
	uint64_t next_id;
	uint64_t formed, failed, refused; /* since start (metrics) */
};

#endif
