/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Prometheus text exposition of the daemon's gauges, counters and per-channel copy latency
 * histograms. See metrics.h.
 */
#include <arpa/inet.h>
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/listener.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "addr.h"
#include "core.h"
#include "local.h"
#include "rdma/rdma.h"
#include "log.h"
#include "metrics.h"
#include "chan.h"
#include "wq.h"
#include "group.h"
#include "peer.h"
#include "pipe.h"
#include "tpb.h"
#include "tpconfig.h"

struct tpd_metrics {
	struct tpd_daemon *d;
	struct evhttp *http;
	double start_time; /* unix time of the daemon's start, fixed when the endpoint starts */
};

static void put_metric(struct evbuffer *b, const char *name, const char *type, const char *help,
		       uint64_t v)
{
	evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", name, help, name, type, name,
			    (unsigned long long)v);
}

/*
 * Bucket i of tpd_stats_bucket() holds copies shorter than 2^(i+1) us, so its bound is printed
 * exactly from the integer: "0.000002", ..., "33.554432" (a power of two never ends in 0, no
 * zeros to trim). The last bucket also holds everything longer: it is counted in +Inf only.
 */
static void put_channel_hist(struct evbuffer *b, const char *name,
			     const struct tpd_channel_stats *c)
{
	uint64_t cum = 0;

	for (unsigned i = 0; i < TPD_STATS_BUCKETS - 1; i++) {
		unsigned long long us = 2ull << i;

		cum += c->hist[i];
		evbuffer_add_printf(b,
				    "tpipd_channel_copy_seconds_bucket{channel=\"%s\","
				    "le=\"%llu.%06llu\"} %llu\n",
				    name, us / 1000000, us % 1000000, (unsigned long long)cum);
	}
	cum += c->hist[TPD_STATS_BUCKETS - 1];
	evbuffer_add_printf(b, "tpipd_channel_copy_seconds_bucket{channel=\"%s\",le=\"+Inf\"} %llu\n",
			    name, (unsigned long long)cum);
	evbuffer_add_printf(b, "tpipd_channel_copy_seconds_sum{channel=\"%s\"} %.9f\n", name,
			    (double)c->ns_sum / 1e9);
	evbuffer_add_printf(b, "tpipd_channel_copy_seconds_count{channel=\"%s\"} %llu\n", name,
			    (unsigned long long)cum);
}

static void put_channels(struct evbuffer *b, struct tpd_daemon *d)
{
	static const char *fields[] = { "transfers", "bytes", "errors" };
	size_t n;
	const struct tpb_channel_info *ch = tpb_registry_list(&n);

	n = TPU_MIN(n, (size_t)TPD_STATS_CHANNELS);
	for (size_t f = 0; f < 3; f++) {
		evbuffer_add_printf(b, "# HELP tpipd_channel_%s_total Channel %s.\n", fields[f],
				    fields[f]);
		evbuffer_add_printf(b, "# TYPE tpipd_channel_%s_total counter\n", fields[f]);
		for (size_t i = 0; i < n; i++) {
			const struct tpd_channel_stats *c = &tpd_daemon_stats(d)->ch[i];
			uint64_t v = f == 0 ? c->transfers : f == 1 ? c->bytes : c->errors;
			evbuffer_add_printf(b, "tpipd_channel_%s_total{channel=\"%s\"} %llu\n",
					    fields[f], ch[i].ops->name, (unsigned long long)v);
		}
	}
	evbuffer_add_printf(b, "# HELP tpipd_channel_copy_seconds Duration of copies.\n"
			       "# TYPE tpipd_channel_copy_seconds histogram\n");
	for (size_t i = 0; i < n; i++)
		if (ch[i].ops->copy)
			put_channel_hist(b, ch[i].ops->name, &tpd_daemon_stats(d)->ch[i]);
}

/* Writes @s as a label value: backslash, double quote and newline escaped. */
static void put_label(struct evbuffer *b, const char *s)
{
	for (; *s; s++) {
		if (*s == '\\' || *s == '"')
			evbuffer_add_printf(b, "\\%c", *s);
		else if (*s == '\n')
			evbuffer_add(b, "\\n", 2);
		else
			evbuffer_add(b, s, 1);
	}
}

/* One series per link to another host's daemon, labelled by its "HOST:PORT" address. */
static void put_peers(struct evbuffer *b, struct tpd_daemon *d)
{
	static const char *const series[] = { "tpipd_peer_bytes_sent_total",
					      "tpipd_peer_bytes_received_total", "tpipd_peer_up" };
	static const char *const helps[] = {
		"Bytes sent on the link to a peer daemon (control, data and RDMA).",
		"Bytes received on the link from a peer daemon (control, data and RDMA).",
		"1 while the link to a peer daemon is up, 0 while it connects or fails.",
	};
	static const char *const types[] = { "counter", "counter", "gauge" };
	Tpw__V1__CtlPeer **v;
	size_t n;

	if (tpd_peers_ctl(d, &v, &n) < 0)
		return; /* out of memory: the page goes without the peer series */
	for (size_t f = 0; f < 3; f++) {
		evbuffer_add_printf(b, "# HELP %s %s\n# TYPE %s %s\n", series[f], helps[f],
				    series[f], types[f]);
		for (size_t i = 0; i < n; i++) {
			uint64_t val = f == 0 ? v[i]->bytes_sent :
				       f == 1 ? v[i]->bytes_received :
						strcmp(v[i]->state, "up") == 0;

			evbuffer_add_printf(b, "%s{peer=\"", series[f]);
			put_label(b, v[i]->address);
			evbuffer_add_printf(b, "\"} %llu\n", (unsigned long long)val);
		}
	}
	tpd_peers_ctl_free(v, n);
}

static void put_groups(struct evbuffer *b, struct tpd_daemon *d)
{
	uint64_t bytes, formed, failed, refused, act[TPD_GROUP_ACTIVITY_N];
	uint32_t groups, members;

	tpd_group_counts(tpd_daemon_groups(d), &groups, &members, &bytes);
	tpd_group_totals(tpd_daemon_groups(d), &formed, &failed, &refused);
	put_metric(b, "tpipd_groups", "gauge", "Collective groups, joining or formed.", groups);
	put_metric(b, "tpipd_group_members", "gauge", "Members of those groups.", members);
	put_metric(b, "tpipd_group_arena_bytes", "gauge", "Bytes of the groups' arenas.", bytes);
	put_metric(b, "tpipd_groups_formed_total", "counter", "Groups whose members all joined.",
		   formed);
	put_metric(b, "tpipd_groups_failed_total", "counter",
		   "Groups failed by a member that died or left while others remained.", failed);
	put_metric(b, "tpipd_group_joins_refused_total", "counter",
		   "Group joins refused or timed out.", refused);
	tpd_group_activity(tpd_daemon_groups(d), act);
	put_metric(b, "tpipd_group_collectives_total", "counter",
		   "Collectives the members of this host's groups finished (as their libraries "
		   "count them).", act[TPD_GROUP_CALLS]);
	put_metric(b, "tpipd_group_bytes_total", "counter",
		   "Bytes of those collectives' inputs.", act[TPD_GROUP_BYTES]);
	put_metric(b, "tpipd_group_xhost_bytes_sent_total", "counter",
		   "Bytes this host's group leaders sent to other hosts' leaders.",
		   act[TPD_GROUP_XBYTES_OUT]);
	put_metric(b, "tpipd_group_xhost_bytes_received_total", "counter",
		   "Bytes this host's group leaders received from other hosts' leaders.",
		   act[TPD_GROUP_XBYTES_IN]);
}

static void put_chans(struct evbuffer *b, struct tpd_daemon *d)
{
	struct tpd_wq_counts w;
	uint32_t chans, unlinked;
	uint64_t items, bytes;

	tpd_chan_counts(tpd_daemon_chans(d), &chans, &unlinked, &items, &bytes);
	put_metric(b, "tpipd_channels", "gauge", "Named channels (docs/channels.md).", chans);
	put_metric(b, "tpipd_channels_unlinked", "gauge",
		   "Channels unlinked that a handle or a copy still keeps.", unlinked);
	put_metric(b, "tpipd_channel_items", "gauge",
		   "Items held in channels, named or unlinked.", items);
	put_metric(b, "tpipd_channel_bytes", "gauge",
		   "Item bytes held in channels, named or unlinked.", bytes);
	put_metric(b, "tpipd_channel_items_handed_off_total", "counter",
		   "Channel items copied from the writer's shared buffer straight into a waiting "
		   "reader's allocation.", tpd_chan_handed(tpd_daemon_chans(d)));
	tpd_wq_counts(tpd_daemon_wqs(d), &w);
	put_metric(b, "tpipd_work_queues", "gauge",
		   "Work queues alive, with or without their owner (docs/queues.md).", w.queues);
	put_metric(b, "tpipd_work_queues_ownerless", "gauge",
		   "Work queues whose owner is gone that workers' handles still keep.", w.ownerless);
	put_metric(b, "tpipd_work_queue_questions", "gauge",
		   "Questions queued or taken in work queues.", w.questions);
	put_metric(b, "tpipd_work_queue_answers", "gauge",
		   "Answers waiting for their owner.", w.answers);
	put_metric(b, "tpipd_work_queue_bytes", "gauge",
		   "Question and answer bytes work queues hold.", w.bytes);
	put_metric(b, "tpipd_work_queue_answers_dropped_total", "counter",
		   "Answers dropped because their queue's owner went before receiving them.",
		   w.answers_dropped);
}

static void metrics_on_request(struct evhttp_request *req, void *arg)
{
	struct tpd_metrics *m = arg;
	struct tpd_daemon *d = m->d;
	struct tpb_rdma_cache_stats rc;
	struct evbuffer *b;

	if (evhttp_request_get_command(req) != EVHTTP_REQ_GET ||
	    strcmp(evhttp_request_get_uri(req), "/metrics") != 0) {
		evhttp_send_error(req, HTTP_NOTFOUND, "only GET /metrics is served");
		return;
	}
	b = evbuffer_new();
	if (!b) {
		evhttp_send_error(req, HTTP_INTERNAL, NULL);
		return;
	}
	evbuffer_add_printf(b, "# HELP tpipd_build_info The daemon's version.\n"
			       "# TYPE tpipd_build_info gauge\n"
			       "tpipd_build_info{version=\"%s\"} 1\n", TP_VERSION);
	evbuffer_add_printf(b, "# HELP process_start_time_seconds Start time of the process since "
			       "unix epoch in seconds.\n"
			       "# TYPE process_start_time_seconds gauge\n"
			       "process_start_time_seconds %.3f\n", m->start_time);
	put_metric(b, "tpipd_sessions", "gauge", "Attached clients.",
		   tpd_local_session_count(tpd_daemon_local(d)));
	put_metric(b, "tpipd_pipes", "gauge", "Open pipes.",
		   tpd_broker_pipe_count(tpd_daemon_broker(d)));
	put_metric(b, "tpipd_listeners", "gauge", "Registered listeners.",
		   tpd_daemon_registry(d)->count);
	put_metric(b, "tpipd_messages_moved_total", "counter", "Messages delivered.",
		   tpd_broker_messages_moved(tpd_daemon_broker(d)));
	put_metric(b, "tpipd_bytes_moved_total", "counter", "Payload and tensor bytes delivered.",
		   tpd_broker_bytes_moved(tpd_daemon_broker(d)));
	put_metric(b, "tpipd_copies_in_flight", "gauge", "Copies queued or running.",
		   tpb_copier_busy(tpd_daemon_copier(d)));
	tpb_rdma_cache_stats(tpd_daemon_rdma(d), &rc);
	put_metric(b, "tpipd_rdma_registered_bytes", "gauge",
		   "Bytes kept registered for RDMA by the registration cache.", rc.bytes);
	put_metric(b, "tpipd_rdma_registration_hits_total", "counter",
		   "RDMA segments that found a cached registration.", rc.hits);
	put_metric(b, "tpipd_rdma_registration_misses_total", "counter",
		   "RDMA segments that registered memory.", rc.misses);
	put_groups(b, d);
	put_chans(b, d);
	put_channels(b, d);
	put_peers(b, d);
	evhttp_add_header(evhttp_request_get_output_headers(req), "Content-Type",
			  "text/plain; version=0.0.4");
	evhttp_send_reply(req, HTTP_OK, "OK", b);
	evbuffer_free(b);
}

static void metrics_on_accept_resume(evutil_socket_t fd, short what, void *arg)
{
	evconnlistener_enable(arg);
}

/*
 * accept() failed for a reason other than EAGAIN (EMFILE...): the socket stays readable, so
 * pause for a second instead of spinning, and say so at most every 10 s. @arg is evhttp's: the
 * resume is a one-shot timer of the loop, which the metrics endpoint outlives (both go at
 * daemon exit, when the loop runs no more).
 */
static void metrics_on_accept_error(struct evconnlistener *lev, void *arg)
{
	static const struct timeval one = { 1, 0 };
	static struct tpd_ratelog log;
	int err = EVUTIL_SOCKET_ERROR();
	unsigned suppressed;

	if (tpd_quota_ratelog_ok(&log, 10000, &suppressed))
		tpu_log_warn("metrics accept failed: %s; pausing metrics accepts for 1 s (%u more "
			     "pauses since the last such line)", strerror(err), suppressed);
	if (evconnlistener_disable(lev) == 0 &&
	    event_base_once(evconnlistener_get_base(lev), -1, EV_TIMEOUT, metrics_on_accept_resume,
			    lev, &one) < 0)
		evconnlistener_enable(lev);
}

int tpd_metrics_start(struct tpd_daemon *d, const char *listen, bool allow_remote,
		      struct tpd_metrics **ret)
{
	struct evhttp_bound_socket *bs;
	struct tpd_metrics *m;
	struct timespec now;
	char host[64];
	uint16_t port;
	int r = tpd_addr_metrics_listen(listen, allow_remote, host, sizeof(host), &port);

	if (r == -EPERM) {
		tpu_log_err("metrics-listen '%s' is not a loopback address: set "
			    "metrics-allow-remote to serve metrics to other hosts", listen);
		return r;
	}
	if (r < 0) {
		tpu_log_err("metrics-listen '%s': expected ADDR:PORT", listen);
		return -EINVAL;
	}
	m = calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->d = d;
	clock_gettime(CLOCK_REALTIME, &now);
	m->start_time = (double)now.tv_sec + (double)now.tv_nsec / 1e9 -
			(double)tpd_daemon_uptime_ms(d) / 1e3;
	m->http = evhttp_new(tpd_daemon_base(d));
	bs = m->http ? evhttp_bind_socket_with_handle(m->http, host, port) : NULL;
	if (!bs) {
		tpu_log_err("metrics: cannot listen on %s port %u", host, (unsigned)port);
		tpd_metrics_free(m);
		return -EADDRNOTAVAIL;
	}
	evconnlistener_set_error_cb(evhttp_bound_socket_get_listener(bs), metrics_on_accept_error);
	evhttp_set_allowed_methods(m->http, EVHTTP_REQ_GET);
	evhttp_set_gencb(m->http, metrics_on_request, m);
	if (tpd_addr_metrics_listen_check(listen, false) < 0) {
		bool v6 = strchr(host, ':') != NULL;

		tpu_log_notice("metrics on http://%s%s%s:%u/metrics, open to other hosts "
			       "(metrics-allow-remote): anyone who reaches it reads session, pipe, "
			       "listener and peer counts and byte totals", v6 ? "[" : "", host,
			       v6 ? "]" : "", (unsigned)port);
	} else {
		tpu_log_info("metrics on http://%s:%u/metrics", host, (unsigned)port);
	}
	*ret = m;
	return 0;
}

void tpd_metrics_free(struct tpd_metrics *m)
{
	if (!m)
		return;
	if (m->http)
		evhttp_free(m->http);
	free(m);
}
