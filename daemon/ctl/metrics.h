/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Optional Prometheus text endpoint (GET /metrics) served by libevent's evhttp on the daemon's
 * loop. Off unless metrics-listen is set, and only ever bound to a loopback address.
 */
#ifndef TPD_METRICS_H
#define TPD_METRICS_H

struct tpd_daemon;
struct tpd_metrics;

/*
 * tpd_metrics_start() - serve metrics of @d on @listen ("127.0.0.1:9470", "[::1]:9470",
 * "localhost:9470").
 * @ret: returns owned endpoint, free with tpd_metrics_free().
 * Return: 0; -EINVAL for a malformed or non-loopback address; -errno if binding fails.
 */
int tpd_metrics_start(struct tpd_daemon *d, const char *listen, struct tpd_metrics **ret);

/*
 * tpd_metrics_listen_check() - whether @listen is an address tpd_metrics_start() accepts: a
 * loopback ADDR:PORT with a port in 1..65535 (checked when the configuration is read).
 * Return: 0, or -EINVAL.
 */
int tpd_metrics_listen_check(const char *listen);

/* Stops serving. Accepts NULL. */
void tpd_metrics_free(struct tpd_metrics *m);

#endif
