/* SPDX-License-Identifier: BSD-3-Clause */
/*
 * Dialling a peer: resolving the host of tpip://HOST:PORT/NAME (a literal address, also a
 * link-local IPv6 one with its %zone, or a name, through the daemon's asynchronous resolver) and
 * trying each address it gave in turn until one accepts the control connection, all within
 * --peer-connect-timeout. A name with an IPv6 and an IPv4 address therefore reaches a daemon
 * that listens on only one of them. Each address gets an equal share of the time left, so one
 * that drops packets cannot use up the time of the others. The handshake that follows the
 * connect is peerhs.c's; the link object is peer.c's. Runs on the loop thread.
 */
#include <errno.h>
#include <event2/bufferevent.h>
#include <event2/dns.h>
#include <event2/event.h>
#include <event2/util.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include "core.h"
#include "log.h"
#include "peer_int.h"

/* Below this share an address is still tried, for its refusal to come back at least. */
#define ATTEMPT_MIN_MS 100u

static struct evdns_base *dns_base(struct tpd_peers *ps)
{
	if (!ps->dns) {
		ps->dns = evdns_base_new(ps->base, EVDNS_BASE_INITIALIZE_NAMESERVERS |
							 EVDNS_BASE_NAMESERVERS_NO_DEFAULT);
		if (!ps->dns)
			ps->dns = evdns_base_new(ps->base, 0);
	}
	return ps->dns;
}

static uint32_t ms_left(const struct tpd_peer *pr)
{
	uint64_t now = tpu_now_ns();

	return now >= pr->dial_deadline_ns ? 0
					   : (uint32_t)((pr->dial_deadline_ns - now) / 1000000u);
}

/* Notes that the address being tried failed with @why, for the final error message. */
static void note_failure(struct tpd_peer *pr, const char *why)
{
	char addr[80];
	size_t len = strlen(pr->dial_errs);

	tpd_peer_sockaddr_text(pr->addr->ai_addr, addr, sizeof(addr), true);
	tpd_peer_log(pr, TPU_LOG_INFO, "%s: %s%s", addr, why,
		     pr->addr->ai_next ? "; trying the next address" : "");
	snprintf(pr->dial_errs + len, sizeof(pr->dial_errs) - len, "%s%s: %s", len ? "; " : "",
		 addr, why);
}

/* Fails the dial once every address failed, keeping the error of the last connect. */
static void give_up(struct tpd_peer *pr, int err)
{
	tpd_peer_fail(pr, err, "cannot connect: %s", pr->dial_errs);
}

/* Connects to pr->addr, or to the next address that can be tried, on a new socket each time. */
static void dial_next(struct tpd_peer *pr)
{
	for (; pr->addr; pr->addr = pr->addr->ai_next) {
		unsigned left = 0;
		uint32_t share;

		for (const struct evutil_addrinfo *a = pr->addr; a; a = a->ai_next)
			left++;
		share = TPU_MAX(ms_left(pr) / left, ATTEMPT_MIN_MS);
		if (pr->bev)
			bufferevent_free(pr->bev);
		pr->bev = NULL;
		if (tpd_peer_bev_setup(pr, -1, NULL) < 0) {
			tpd_peer_fail(pr, -ENOMEM, "out of memory");
			return;
		}
		tpd_peer_timer_arm_ms(pr->ev_timer, share);
		if (bufferevent_socket_connect(pr->bev, pr->addr->ai_addr,
					       (int)pr->addr->ai_addrlen) == 0)
			return; /* the bufferevent says how it went */
		note_failure(pr, strerror(errno ? errno : EHOSTUNREACH));
		if (!pr->addr->ai_next) {
			give_up(pr, -EHOSTUNREACH);
			return;
		}
	}
}

/* Moves on to the next address if there is one and time is left. Return: whether it did. */
static bool dial_on(struct tpd_peer *pr)
{
	if (!pr->addr->ai_next || ms_left(pr) == 0)
		return false;
	pr->addr = pr->addr->ai_next;
	dial_next(pr);
	return true;
}

static void on_resolved(int result, struct evutil_addrinfo *res, void *arg)
{
	struct tpd_peer *pr = arg;

	if (result == EVUTIL_EAI_CANCEL)
		return; /* the link is going away: tpd_peerdial_done() */
	pr->dns_req = NULL;
	if (result != 0 || !res) {
		tpd_peer_fail(pr, -EHOSTUNREACH, "cannot resolve the host: %s",
			      result ? evutil_gai_strerror(result) : "no address");
		return;
	}
	pr->addrs = pr->addr = res;
	dial_next(pr);
}

void tpd_peerdial_start(struct tpd_peer *pr, const char *host, uint16_t port)
{
	struct evutil_addrinfo hints = { .ai_family = AF_UNSPEC,
					 .ai_socktype = SOCK_STREAM,
					 .ai_protocol = IPPROTO_TCP };
	uint32_t timeout_ms = pr->peers->cfg->peer_connect_timeout_ms;
	struct evdns_base *dns = dns_base(pr->peers);
	char service[8];

	pr->dial_deadline_ns = tpu_now_ns() + (uint64_t)timeout_ms * 1000000u;
	tpd_peer_timer_arm_ms(pr->ev_timer, timeout_ms);
	if (!dns) {
		tpd_peer_fail(pr, -EHOSTUNREACH, "cannot resolve the host: no resolver");
		return;
	}
	snprintf(service, sizeof(service), "%u", port);
	/* A literal address (a link-local IPv6 one keeps its %zone), or a name in the hosts file
	 * or the cache, may be answered at once, inside this call. */
	pr->dns_req = evdns_getaddrinfo(dns, host, service, &hints, on_resolved, pr);
}

void tpd_peerdial_error(struct tpd_peer *pr, int err)
{
	note_failure(pr, strerror(err ? err : EHOSTUNREACH));
	if (!dial_on(pr))
		give_up(pr, err == ECONNREFUSED ? -ECONNREFUSED : -EHOSTUNREACH);
}

void tpd_peerdial_timeout(struct tpd_peer *pr)
{
	const struct tpd_config *cfg = pr->peers->cfg;
	if (!pr->addr) {
		tpd_peer_fail(pr, -ETIMEDOUT, "no link within %u ms: the host name did not resolve",
			      cfg->peer_connect_timeout_ms);
		return;
	}
	note_failure(pr, "no answer");
	if (!dial_on(pr))
		tpd_peer_fail(pr, -ETIMEDOUT, "no link within %u ms: %s",
			      cfg->peer_connect_timeout_ms, pr->dial_errs);
}

void tpd_peerdial_connected(struct tpd_peer *pr)
{
	/* The handshake has what is left of the connect timeout. */
	tpd_peer_timer_arm_ms(pr->ev_timer, TPU_MAX(ms_left(pr), 1u));
	if (pr->addrs)
		evutil_freeaddrinfo(pr->addrs);
	pr->addrs = pr->addr = NULL;
}

char *tpd_peer_dial_text(const struct tpd_peer *pr, char *buf, size_t len)
{
	char addr[80];

	if (pr->state != PEER_CONNECTING || !pr->outgoing) {
		if (len)
			buf[0] = '\0';
		return buf;
	}
	if (!pr->addr) {
		snprintf(buf, len, "the host name has not resolved yet");
		return buf;
	}
	tpd_peer_sockaddr_text(pr->addr->ai_addr, addr, sizeof(addr), true);
	snprintf(buf, len, "%s%s%s: no answer", pr->dial_errs, pr->dial_errs[0] ? "; " : "", addr);
	return buf;
}

void tpd_peerdial_done(struct tpd_peer *pr)
{
	struct evdns_getaddrinfo_request *req = pr->dns_req;

	pr->dns_req = NULL;
	if (req)
		evdns_getaddrinfo_cancel(req);
	if (pr->addrs)
		evutil_freeaddrinfo(pr->addrs);
	pr->addrs = pr->addr = NULL;
}

void tpd_peer_dial_dns_free(struct tpd_peers *ps)
{
	if (!ps->dns)
		return;
	/* A canceled resolution reports through a callback deferred to the loop, which must run
	 * while the resolver still exists. */
	event_base_loop(ps->base, EVLOOP_NONBLOCK);
	evdns_base_free(ps->dns, 0);
	ps->dns = NULL;
}
