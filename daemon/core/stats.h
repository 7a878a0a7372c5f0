/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Per-channel counters and copy-latency histograms, kept on the loop thread and read by
 * tpipctl stats and the metrics endpoint.
 */
#ifndef TPD_STATS_H
#define TPD_STATS_H

#include <stdbool.h>
#include <stdint.h>

#define TPD_STATS_CHANNELS 16
#define TPD_STATS_BUCKETS 26 /* log2 microseconds: 1 us .. ~33 s */

struct tpd_channel_stats {
	uint64_t transfers;
	uint64_t bytes;
	uint64_t errors;
	uint64_t ns_sum; /* total copy time */
	uint64_t hist[TPD_STATS_BUCKETS];
};

struct tpd_stats {
	struct tpd_channel_stats ch[TPD_STATS_CHANNELS];
};

/* Records one transfer on registry channel @idx that moved @bytes in @ns (0: not timed). */
void tpd_stats_record(struct tpd_stats *st, int idx, uint64_t bytes, uint64_t ns, bool failed);

/* Bucket index for a duration of @ns. */
unsigned tpd_stats_bucket(uint64_t ns);

#endif
