/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Optional Prometheus text endpoint (GET /metrics) served by libevent's evhttp on the daemon's
 * loop. Off unless metrics-listen is set, and bound to a loopback address unless
 * metrics-allow-remote says that other hosts may read it.
 */
#ifndef TPD_METRICS_H
#define TPD_METRICS_H

#include <stdbool.h>

struct tpd_daemon;
struct tpd_metrics;

/*
 * tpd_metrics_start() - serve metrics of @d on @listen ("127.0.0.1:9470", "[::1]:9470",
 * "localhost:9470"; with @allow_remote also any IPv4 or IPv6 address, "0.0.0.0:9470",
 * "[::]:9470").
 * @ret: returns owned endpoint, free with tpd_metrics_free().
 * Return: 0; -EINVAL for a malformed address; -EPERM for a non-loopback one without
 * @allow_remote; -errno if binding fails.
 */
int tpd_metrics_start(struct tpd_daemon *d, const char *listen, bool allow_remote,
		      struct tpd_metrics **ret);

/* Stops serving. Accepts NULL. */
void tpd_metrics_free(struct tpd_metrics *m);

#endif
