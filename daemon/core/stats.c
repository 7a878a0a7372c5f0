/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Channel statistics. See stats.h.
 */
#include <stdbool.h>
#include "stats.h"

unsigned tpd_stats_bucket(uint64_t ns)
{
	uint64_t us = ns / 1000;
	unsigned b = 0;

	while (us > 1 && b < TPD_STATS_BUCKETS - 1) {
		us >>= 1;
		b++;
	}
	return b;
}

void tpd_stats_record(struct tpd_stats *st, int idx, uint64_t bytes, uint64_t ns, bool failed)
{
	struct tpd_channel_stats *c;

	if (idx < 0 || idx >= TPD_STATS_CHANNELS)
		return;
	c = &st->ch[idx];
	if (failed) {
		c->errors++;
		return;
	}
	c->transfers++;
	c->bytes += bytes;
	if (ns) {
		c->hist[tpd_stats_bucket(ns)]++;
		c->ns_sum += ns;
	}
}
